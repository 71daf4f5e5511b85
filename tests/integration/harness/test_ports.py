"""The suite's ports: servers' and dead endpoints' ports come from below the kernel's ephemeral range,
where no listener that binds port 0 (gloo's ranks, an exporter started with ``port=0``) can be handed
a port that a test's client still dials (tests/support/ports.py)."""

from __future__ import annotations

import socket

import pytest

from tests.support.ports import _ephemeral_start, closed_port, free_port, free_port_block

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("pick", [closed_port, free_port, lambda: free_port_block(4)], ids=["closed", "free", "block"])
def test_ports_lie_below_the_ephemeral_range(pick: object) -> None:
    start = _ephemeral_start()
    picked = [pick() for _ in range(50)]  # type: ignore[operator]
    assert all(1024 < p < start for p in picked), (start, sorted(picked))


def test_a_closed_port_refuses_connections() -> None:
    port = closed_port()
    with socket.socket() as s:
        s.settimeout(5)
        with pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
