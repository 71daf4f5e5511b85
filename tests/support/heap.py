"""The test process's heap, settled before a test reads its RSS as a baseline.

A pytest worker runs hundreds of tests one after another: what an earlier test freed may still sit
in unreachable cycles or in the C heap's free pages, counted in the RSS until a collection or glibc
hands it back, which can happen in the middle of the next test. A budget set above an unsettled RSS
then moves under the test's feet: a Lightning run leaking 288 MiB never passed a budget 192 MiB above
its start (a run of 2026-11-28, once the suite's order changed which tests share a worker)."""

from __future__ import annotations

import contextlib
import ctypes
import gc


def settle() -> None:
    """Collect the garbage and hand the C heap's free pages back to the OS (glibc's ``malloc_trim``)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
