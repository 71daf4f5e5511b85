"""Two real gloo ranks (torch.multiprocessing children), started without RANK, as Lightning's own
DDP launcher leaves them: each names its rank from the initialised group (the order of the
variables and the group: tests/unit/collectors/test_fleet_identity.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch.multiprocessing as torch_mp

from memexporter.collectors.fleet import identity

pytestmark = pytest.mark.integration


def _rank_seen(rank: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    ident = identity({"LOCAL_RANK": str(rank)})  # as Lightning's launcher leaves it: no RANK
    Path(folder, f"rank{rank}").write_text(f"{ident.rank} {ident.world_size}")
    # Both ranks past their init before either leaves, as any job's first collective ensures. Without
    # it, the rank whose side of gloo's connectFullMesh finished first destroyed the group and exited,
    # and its peer, still finishing its own side, read the closed socket: "connectFullMesh failed ...
    # Connection closed by peer" (6 in 100 runs, four loops of two ranks on 2 cores; 0 in 100 with it).
    dist.barrier()
    dist.destroy_process_group()


def _two_ranks(folder: Path) -> None:
    """Both ranks, to the end (torch.multiprocessing: a child that fails raises here with its traceback)."""
    folder.mkdir()
    ctx = torch_mp.spawn(_rank_seen, args=(str(folder),), nprocs=2, join=False)  # type: ignore[attr-defined,no-untyped-call]
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=5):
        assert time.monotonic() < deadline, "two gloo ranks did not finish in 180 s"


def test_two_real_gloo_ranks_without_rank_variables_are_told_apart(tmp_path: Path) -> None:
    _two_ranks(folder := tmp_path / "ranks")
    assert [(folder / f"rank{r}").read_text() for r in range(2)] == ["0 2", "1 2"]
