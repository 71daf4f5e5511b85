"""Storage-following accounting on real distributed wrappers, in one process (a gloo group of one):
DDP's gradient bucket views are charged to their own parameters, and FSDP2's DTensor parameters,
gradients and state are counted (as the local shard) whether tracked before or after
``fully_shard``. Two real ranks are in tests/integration/distributed/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memexporter.tracking import gradients as tracking_optimizer
from memexporter.tracking.modules import hook_errors, track
from memexporter.tracking.snapshots import fold
from tests.support.models import Deep, unique_param_bytes


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this test process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 5, 16)).sum().backward()
    opt.step()


@pytest.mark.usefixtures("group")
def test_ddp_bucket_view_gradients_are_charged_to_their_own_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)
    ddp = DistributedDataParallel(Deep(3), gradient_as_bucket_view=True, bucket_cap_mb=25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    handle = track(ddp, opt)
    _step(ddp, opt)
    snap = handle.snapshot()
    grads = [p.grad for p in ddp.parameters() if p.grad is not None]
    assert len({g.untyped_storage().data_ptr() for g in grads}) < len(grads), "gradients should share a bucket"
    # Each row's gradient bytes are its parameters' bytes: before, the whole bucket sat in one row.
    assert snap.gradient == snap.parameter
    assert not [n for n in snap.layout.names if n.startswith("module")]


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_rows_count_dtensors_tracked_before_or_after_sharding(
    monkeypatch: pytest.MonkeyPatch, when: str, reshard: bool
) -> None:
    # Imported here, not at collection: torch.distributed.fsdp (with the DTensor package it loads) took
    # 0.7 to 1.0 CPU-s of each pytest worker's collection.
    from torch.distributed.fsdp import fully_shard

    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)
    torch.manual_seed(0)
    model = Deep(3)
    full = unique_param_bytes(model)
    handle = track(model) if when == "before" else None
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    opt = torch.optim.AdamW(model.parameters())
    if handle is None:
        handle = track(model, opt)  # used to raise: "invalid python storage"
    errors = hook_errors()
    for _ in range(2):
        _step(model, opt)
        opt.zero_grad()
    _step(model, opt)
    snap = handle.snapshot()
    assert hook_errors() == errors
    # One rank holds everything: local shard bytes are the model's bytes, and the unsharded
    # family is there (the model has DTensor parameters) with the same figures.
    assert sum(snap.parameter) == full
    assert snap.unsharded is not None and sum(snap.unsharded) == full
    assert sum(snap.gradient) == full
    assert sum(snap.optimizer_state) == pytest.approx(2 * full, rel=0.01)
    rows = dict(fold(snap))
    assert all(len(values) == 5 for values in rows.values())
    # The unsharded parameters FSDP2 saves for backward are parameters, not activations: the
    # activation rows are those of the same model unsharded.
    plain = Deep(3)
    with track(plain, prefix="plain") as ref:
        plain(torch.randn(2, 5, 16))
        assert sum(snap.activation) == sum(ref.snapshot().activation)
