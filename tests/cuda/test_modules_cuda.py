"""Per-module tracking on a real CUDA device: forward allocation deltas, partition, device moves.

Skips with a reason on a machine without CUDA (DESIGN.md §2 rule 6).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from memexporter.tracking.modules import ROOT_LABEL, TrackHandle, active_handles, hook_errors, track
from tests.support.models import Block

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

D = 256


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(D), Block(D))
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(x))  # type: ignore[no-any-return]


class Counter:
    """Unique storage bytes saved for backward, parameters excluded (the reference figure)."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: set[int] = set()
        self.bytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.params and ptr not in self.seen:
            self.seen.add(ptr)
            self.bytes += t.untyped_storage().nbytes()
        return t.detach()


def activations(handle: TrackHandle) -> int:
    return sum(handle.snapshot().activation)


@pytest.fixture(autouse=True)
def _untrack_all() -> Iterator[None]:
    yield
    for h in list(active_handles()):
        assert isinstance(h, TrackHandle)
        h.remove()


def test_forward_deltas_follow_the_allocator() -> None:
    model = Net().cuda()
    x = torch.randn(64, D, device="cuda")
    errors = hook_errors()
    handle = track(model, cuda_forward_delta=True)
    out = model(x)
    torch.cuda.synchronize()
    deltas = handle.forward_deltas()
    assert set(deltas) == set(handle.snapshot().layout.names)
    # What the forward leaves allocated: what it saved (less the input, allocated before) and the
    # output. The allocator rounds blocks up to 512 bytes, so allow 10 %.
    expected = activations(handle) - x.untyped_storage().nbytes() + out.untyped_storage().nbytes()
    assert deltas[ROOT_LABEL] == pytest.approx(expected, rel=0.10)
    assert deltas["blocks.0"] > 0 and deltas["blocks.1"] > 0
    assert hook_errors() == errors
    print(f"cuda forward deltas: {dict(deltas)} (device {torch.cuda.get_device_name(0)}, torch {torch.__version__})")


def test_partition_and_activations_on_cuda() -> None:
    model = Net().cuda()
    opt = torch.optim.AdamW(model.parameters())
    handle = track(model, opt)
    x = torch.randn(64, D, device="cuda")
    counter = Counter(model)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        loss = model(x).square().mean()
    loss.backward()
    opt.step()
    snap = handle.snapshot()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(snap.parameter) == param_bytes
    assert sum(snap.gradient) == param_bytes
    assert sum(snap.optimizer_state) == pytest.approx(2 * param_bytes, rel=1e-3)
    assert activations(handle) == pytest.approx(counter.bytes, rel=0.10)


def test_a_model_moved_between_devices_is_recounted() -> None:
    model = Net()
    handle = track(model)
    on_cpu = sum(handle.snapshot().parameter)
    model.cuda()
    x = torch.randn(8, D, device="cuda")
    counter = Counter(model)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        model(x)
    assert sum(handle.snapshot().parameter) == on_cpu
    assert activations(handle) == pytest.approx(counter.bytes, rel=0.10)  # new storages excluded
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    assert activations(handle) > 0
