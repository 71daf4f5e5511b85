"""Who this process is: torchrun's variables, then Slurm's and Open MPI's, then torch.distributed's
initialised group (Lightning's own DDP launcher sets LOCAL_RANK but not RANK), then one process."""

from __future__ import annotations

import time
from pathlib import Path

import torch.multiprocessing as torch_mp

from memexporter.collectors.fleet import identity


def test_torchrun_variables_win_over_slurm_and_the_group() -> None:
    ident = identity({"RANK": "3", "SLURM_PROCID": "7", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, group=lambda: (5, 6))
    assert (ident.rank, ident.local_rank, ident.world_size) == ("3", "1", "8")


def test_slurm_then_open_mpi() -> None:
    assert identity({"SLURM_PROCID": "7", "SLURM_NTASKS": "16"}, group=lambda: None).rank == "7"
    ident = identity({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, group=lambda: None)
    assert (ident.rank, ident.world_size) == ("2", "4")


def test_an_initialised_group_names_the_rank_when_no_variable_does() -> None:
    ident = identity({"LOCAL_RANK": "1"}, group=lambda: (1, 2))
    assert (ident.rank, ident.local_rank, ident.world_size) == ("1", "1", "2")
    assert (identity({}, group=lambda: None).rank, identity({}, group=lambda: None).world_size) == ("0", "1")


def _rank_seen(rank: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        ident = identity({"LOCAL_RANK": str(rank)})  # as Lightning's launcher leaves it: no RANK
        Path(folder, f"rank{rank}").write_text(f"{ident.rank} {ident.world_size}")
    finally:
        dist.destroy_process_group()


def test_two_real_gloo_ranks_without_rank_variables_are_told_apart(tmp_path: Path) -> None:
    # torch.multiprocessing: a child that fails raises here with its traceback.
    ctx = torch_mp.spawn(_rank_seen, args=(str(tmp_path),), nprocs=2, join=False)  # type: ignore[attr-defined,no-untyped-call]
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=5):
        assert time.monotonic() < deadline, "two gloo ranks did not finish in 180 s"
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["0 2", "1 2"]
