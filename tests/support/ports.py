"""Free TCP ports on the loopback interface, for servers a test starts and for dead endpoints.

Ports come from below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``). The kernel
hands ephemeral ports to outgoing connections, and a busy test machine makes many (scrapes, polls,
gloo): a port picked there can be taken by a client socket in the seconds before a slow starter
(a demo importing torch, say) binds it. Below the range only another test picking the same random
port can collide, and the process helpers fail fast with the port named when that happens.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Not the global generator: a framework under test seeds it (transformers.set_seed), and xdist
# workers seeded alike would all pick the same "random" port.
_random = random.SystemRandom()

_LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as servers set it: a port whose old connections linger in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(count: int, attempts: int = 200) -> int:
    """The first of ``count`` consecutive free ports (for ``port + LOCAL_RANK`` under torchrun)."""
    high = _ephemeral_start() - count
    for _ in range(attempts):
        base = _random.randint(_LOWEST, high) if high > _LOWEST else _LOWEST
        if all(bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no block of {count} consecutive free ports found in {attempts} attempts")


def free_port() -> int:
    """A port that was free a moment ago. Another process may still take it before the caller
    binds: ``start_on_free_port`` retries on "address already in use"."""
    return free_port_block(1)


def closed_port() -> int:
    """A loopback port that refuses connections: an endpoint nobody listens on (an OTLP collector, a
    rank), picked below the ephemeral range like the servers' ports. Not from that range: a client
    retrying a dead port there for a whole test (an OTLP exporter pushes every interval) reaches
    whatever the kernel hands the port to next, and the kernel hands ephemeral ports to listeners
    that bind port 0 (gloo's ranks among them)."""
    return free_port()
