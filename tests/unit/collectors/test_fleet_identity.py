"""Who this process is: torchrun's variables, then Slurm's and Open MPI's, then torch.distributed's
initialised group (Lightning's own DDP launcher sets LOCAL_RANK but not RANK), then one process.
Two real gloo ranks: tests/integration/distributed/test_identity_gloo.py."""

from __future__ import annotations

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
