"""The run identity from each launcher's variables, and which ranks export the detail (fleet.py)."""

from __future__ import annotations

import pytest

from memexporter.collectors.fleet import FLEET_WORLD_SIZE, RunIdentity, detail_for, identity, run_identity
from memexporter.config import Config


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "TORCHELASTIC_RUN_ID": "llama-7b-0412",
                "SLURM_JOB_ID": "991",
                "MASTER_ADDR": "n1",
                "MASTER_PORT": "29500",
            },
            RunIdentity("llama-7b-0412", "torchelastic"),
        ),
        # torchrun without --rdzv-id sets "none" on every run: not an identity.
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "991"}, RunIdentity("991", "slurm")),
        (
            {"SLURM_JOB_ID": "992", "SLURM_ARRAY_JOB_ID": "990", "SLURM_ARRAY_TASK_ID": "2"},
            RunIdentity("990_2", "slurm"),
        ),
        (
            {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"},
            RunIdentity("10.0.0.5:29500", "master"),
        ),
        ({}, RunIdentity("node17-4242", "process")),
    ],
)
def test_run_identity_from_the_launcher(env: dict[str, str], expected: RunIdentity) -> None:
    assert run_identity("", env, hostname="node17", pid=4242) == expected


def test_the_setting_wins_over_the_launcher() -> None:
    assert run_identity("exp-12", {"TORCHELASTIC_RUN_ID": "abc"}) == RunIdentity("exp-12", "memexporter")
    config = Config.resolve(environ={"MEMEXPORTER_RUN_ID": " exp-13 "})
    assert config.run_id == "exp-13"


def test_every_rank_of_a_torchrun_job_gets_the_same_run_and_its_share() -> None:
    base = {"WORLD_SIZE": "1024", "LOCAL_WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "r1"}
    idents = [identity({**base, "RANK": str(r), "LOCAL_RANK": str(r % 8)}, group=lambda: None) for r in (0, 7, 8, 1023)]
    assert {(i.run_id, i.run_id_source) for i in idents} == {("r1", "torchelastic")}
    assert [i.detail for i in idents] == ["representative", "representative", "core", "core"]


@pytest.mark.parametrize(
    ("setting", "rank", "world", "local_world", "expected"),
    [
        ("auto", 900, FLEET_WORLD_SIZE - 1, 8, "per_rank"),  # below the fleet size: everyone its own rows
        ("auto", 7, FLEET_WORLD_SIZE, 8, "representative"),
        ("auto", 8, FLEET_WORLD_SIZE, 8, "core"),
        ("auto", 0, 256, 0, "representative"),  # local world unknown: rank 0 alone
        ("auto", 1, 256, 0, "core"),
        ("all", 900, 1024, 8, "per_rank"),
        ("none", 0, 1024, 8, "core"),
        ("none", 0, 2, 1, "core"),  # an explicit list applies at any size
        ("0-7,512", 512, 1024, 8, "representative"),
        ("0-7,512", 513, 1024, 8, "core"),
    ],
)
def test_detail_ranks(setting: str, rank: int, world: int, local_world: int, expected: str) -> None:
    assert detail_for(setting, rank, world, local_world) == expected


@pytest.mark.parametrize(("value", "normalised"), [("AUTO", "auto"), (" 0-7, 64 ", "0-7,64"), (5, "5")])
def test_detail_ranks_knob_normalises(value: object, normalised: str) -> None:
    assert Config.resolve({"detail_ranks": value}, environ={}).detail_ranks == normalised


def test_slurm_tasks_per_node_with_a_repeat_count() -> None:
    ident = identity(
        {"SLURM_PROCID": "3", "SLURM_NTASKS": "128", "SLURM_NTASKS_PER_NODE": "8(x16)"}, group=lambda: None
    )
    assert ident.detail == "representative"
