"""The test process's heap: settled before a test reads its RSS as a baseline, or worn as a long-lived
process wears it.

A pytest worker runs hundreds of tests one after another: what an earlier test freed may still sit
in unreachable cycles or in the C heap's free pages, counted in the RSS until a collection or glibc
hands it back, which can happen in the middle of the next test. A budget set above an unsettled RSS
then moves under the test's feet: a Lightning run leaking 288 MiB never passed a budget 192 MiB above
its start (a run of 2026-11-28, once the suite's order changed which tests share a worker)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator

MiB = 1 << 20


def settle() -> None:
    """Collect the garbage and hand the C heap's free pages back to the OS (glibc's ``malloc_trim``)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@contextlib.contextmanager
def worn(mib: int = 320) -> Iterator[None]:
    """The heap of a pytest worker that ran other tests first, or of any long-lived process: ``mib``
    freed by the C allocator but still resident, in the middle of the heap where glibc never trims
    it. A later allocation of up to that size reuses those pages, so the RSS does not rise by a byte:
    an evaluation's 64 MiB buffer was "missed" in a worker at 750 MiB (issue 40), where it raised the
    RSS of a fresh process by 64 MiB. Settled (handed back) on leaving."""
    import torch

    # glibc's mmap threshold starts at 128 KiB and rises to the size of a freed mapped chunk: free a
    # 16 MiB one, and the 8 MiB chunks below come from the heap (brk), not from mappings of their own.
    torch.ones(16 * MiB // 4)
    chunks = [torch.ones(8 * MiB // 4) for _ in range(mib // 8)]
    guard = torch.ones(1024)  # above them: the freed chunks are not the heap's top, which free() trims
    del chunks
    try:
        yield
    finally:
        del guard
        settle()
