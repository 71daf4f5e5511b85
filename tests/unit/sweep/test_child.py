"""What a sweep child is started with, and how its step time is read from polls."""

from __future__ import annotations

import os

import pytest

from memexporter.bootstrap import path as bootstrap_path
from memexporter.sweep.child import STEP_TIME_WAIT_SECONDS, StepClock, enough
from memexporter.sweep.spawn import child_env, free_port


def test_child_env_starts_the_exporter_on_the_sweeps_port_whatever_the_user_set() -> None:
    user = {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "MEMEXPORTER_PORT": "9400",
        "MEMEXPORTER_HTTP": "0",
        "MEMEXPORTER_OTEL": "1",
        "MEMEXPORTER_CERTFILE": "/etc/cert.pem",
        "MEMEXPORTER_KEYFILE": "/etc/key.pem",
        "MEMEXPORTER_WARMUP_STEPS": "5",
    }
    env = child_env(23456, user)
    assert env["PYTHONPATH"] == f"{bootstrap_path()}{os.pathsep}/src"  # the user's path kept, after the bootstrap
    assert env["MEMEXPORTER_AUTOSTART"] == "1" and env["MEMEXPORTER_PORT"] == "23456"
    assert (
        env["MEMEXPORTER_ADDR"] == "127.0.0.1" and env["MEMEXPORTER_HTTP"] == "1" and env["MEMEXPORTER_STRICT"] == "1"
    )
    assert env["MEMEXPORTER_CERTFILE"] == env["MEMEXPORTER_KEYFILE"] == ""  # plain HTTP on loopback
    assert env["MEMEXPORTER_OTEL"] == "0"  # planning runs do not push to the user's collector
    assert env["MEMEXPORTER_WARMUP_STEPS"] == "5" and env["PATH"] == "/usr/bin"  # the rest is the user's
    assert user["MEMEXPORTER_PORT"] == "9400"  # not modified in place


def test_free_port_is_below_the_ephemeral_range() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
        low = int(fh.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports)


@pytest.mark.parametrize(("poll", "step"), [(0.05, 0.25), (0.05, 0.013), (0.5, 3.0)])
def test_step_clock(poll: float, step: float) -> None:
    clock = StepClock()
    # Polls every `poll` seconds; a step completes every `step` seconds.
    for i in range(1, 400):
        t = i * poll
        clock.observe(t, int(t / step))
    assert clock.first is not None and clock.last is not None
    n = clock.last[1] - clock.first[1]
    assert clock.seconds == pytest.approx(step, abs=poll / n)


def test_step_clock_needs_two_step_changes() -> None:
    clock = StepClock()
    clock.observe(1.0, 5)  # first answer: already at step 5, no lower bound
    clock.observe(1.1, 6)
    assert clock.seconds is None
    clock.observe(1.2, 8)
    assert clock.seconds == pytest.approx(0.05)


def test_a_fast_job_runs_on_until_its_step_time_is_known() -> None:
    # Polled at steps 0 and then 12 (K = 3): one change seen, no step time yet, so not ended...
    clock = StepClock()
    clock.observe(1.0, 0)
    clock.observe(1.1, 12)
    assert clock.seconds is None and not enough(12, 3, clock.seconds, waited=0.0)
    # ...until the next change gives it,
    clock.observe(1.2, 25)
    assert clock.seconds is not None and enough(25, 3, clock.seconds, waited=0.1)
    # or the wait for it runs out (a job stalled at step K), and never before K steps.
    assert enough(3, 3, None, waited=STEP_TIME_WAIT_SECONDS)
    assert not enough(2, 3, 0.1, waited=60.0)
