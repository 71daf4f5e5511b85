"""The levers' predictions against real runs that apply them, on CPU (issue 44): a lever whose
prediction is not checked is not shown.

Each prediction is made by ``oom/levers.py`` from the rows that ``track()`` publishes for a plain run;
then the lever is applied to the same model and measured:

- checkpointing: the blocks wrapped in ``torch.utils.checkpoint`` (reentrant: its recompute runs under
  the saved-tensor hooks of the backward, so the same hooks see it). The measurement is the peak of the
  live saved-for-backward bytes over a step, each storage once and parameters left out, as the rows
  count them; its drop from the plain step is within 15 % of the prediction, on the demo GPT and on a
  residual conv net (a different block: convolutions and batch norms, in a ``Sequential``);
- bf16: the same model cast to bf16, its parameter and gradient bytes within 1 %.

Sharding is checked under torchrun (tests/integration/distributed/test_sharded_modules.py), the input
lever by the capacity's own checks (test_input_capacity_cpu.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the levers are checked on real torch models")

from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from memexporter.cli.demo import TinyGPT  # noqa: E402
from memexporter.oom import levers  # noqa: E402
from memexporter.tracking import schedule  # noqa: E402
from memexporter.tracking.modules import track  # noqa: E402
from memexporter.tracking.snapshots import Snapshot  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=8)]

Step = Callable[[bool], torch.Tensor]  # the model's loss for one batch, its blocks checkpointed or not


class _Held:
    """One saved tensor's hold on its storage, released when autograd frees the saved tensor."""

    __slots__ = ("key", "peak")

    def __init__(self, peak: LivePeak, key: tuple[int, int]) -> None:
        self.peak, self.key = peak, key

    def __del__(self) -> None:
        self.peak.release(self.key)


class LivePeak:
    """The peak of the live saved-for-backward bytes: each storage once, while any saved tensor holds it;
    parameters (and views of them) left out, as ``tracking/saved.py`` counts them."""

    def __init__(self) -> None:
        self.holds: dict[tuple[int, int], int] = {}
        self.live = self.peak = 0

    def pack(self, t: torch.Tensor) -> Any:
        if type(t) is nn.Parameter or type(t._base) is nn.Parameter:
            return None, t
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if not self.holds.get(key):
            self.live += key[1]
            self.peak = max(self.peak, self.live)
        self.holds[key] = self.holds.get(key, 0) + 1
        return _Held(self, key), t

    def release(self, key: tuple[int, int]) -> None:
        self.holds[key] -= 1
        if not self.holds[key]:
            self.live -= key[1]

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed[1]


def saved_peak(loss_of: Step, ckpt: bool) -> int:
    """The model's saves over one step: its forward and backward under the hooks (the loss outside,
    as the rows leave it out)."""
    peak = LivePeak()
    with torch.autograd.graph.saved_tensors_hooks(peak.pack, peak.unpack):
        out = loss_of(ckpt)
    loss = out.float().square().mean()
    with torch.autograd.graph.saved_tensors_hooks(peak.pack, peak.unpack):
        loss.backward()
    return peak.peak


def rows_of(model: nn.Module, loss_of: Step, monkeypatch: pytest.MonkeyPatch, steps: int = 2) -> Snapshot:
    """The rows ``track()`` publishes after ``steps`` plain SGD steps (every forward recorded)."""
    monkeypatch.setattr(schedule, "RECORD_INTERVAL_S", 0.0)
    monkeypatch.setattr(schedule, "RECORD_EVERY", 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with track(model, opt) as handle:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss_of(False).float().square().mean().backward()
            opt.step()
        return handle.snapshot()


def gpt() -> tuple[nn.Module, Step]:
    torch.manual_seed(0)
    model = TinyGPT(layers=4)
    tokens = torch.randint(0, 512, (8, 64))

    def loss_of(ckpt: bool) -> torch.Tensor:
        if not ckpt:
            return model(tokens)
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        x = model.embed(tokens)
        for block in model.blocks:
            x = checkpoint(functools.partial(block, src_mask=mask, is_causal=True), x, use_reentrant=True)
        return model.head(model.norm(x))

    return model, loss_of


class Residual(nn.Module):
    """A residual conv block: two 3x3 convolutions with batch norms (train mode: they save)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class ConvNet(nn.Module):
    def __init__(self, c: int = 16, n: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.layers = nn.Sequential(*(Residual(c) for _ in range(n)))
        self.head = nn.Linear(c, 10)

    def forward(self, images: torch.Tensor, ckpt: bool = False) -> torch.Tensor:
        x = self.stem(images)
        for block in self.layers:
            x = checkpoint(block, x, use_reentrant=True) if ckpt else block(x)
        return self.head(x.mean((2, 3)))


def convnet() -> tuple[nn.Module, Step]:
    torch.manual_seed(0)
    model = ConvNet()
    images = torch.randn(8, 3, 32, 32)

    return model, functools.partial(model, images)


@pytest.mark.parametrize(("make", "group"), [(gpt, "blocks.*"), (convnet, "layers.*")], ids=["gpt", "convnet"])
def test_checkpointing_frees_what_it_predicts_within_15_percent(
    make: Callable[[], tuple[nn.Module, Step]], group: str, monkeypatch: pytest.MonkeyPatch, record_property: Any
) -> None:
    model, loss_of = make()
    snap = rows_of(model, loss_of, monkeypatch)
    lever = levers.checkpointing(snap, "cpu")
    assert lever is not None and lever.freed_bytes is not None
    assert f"checkpoint {group} (" in lever.action
    plain, ckpt = saved_peak(loss_of, False), saved_peak(loss_of, True)
    # The same hooks measure what the rows published: the plain step's peak is every row's saves.
    assert plain == pytest.approx(sum(snap.activation), rel=0.01)
    record_property("predicted_bytes", lever.freed_bytes)
    record_property("measured_bytes", plain - ckpt)
    print(f"{group}: predicted {lever.freed_bytes:,.0f} B, measured {plain - ckpt:,} B")
    assert plain - ckpt > 0.2 * plain  # checkpointing changes something worth predicting
    assert plain - ckpt == pytest.approx(lever.freed_bytes, rel=0.15)


def test_bf16_parameters_and_gradients_within_1_percent(monkeypatch: pytest.MonkeyPatch, record_property: Any) -> None:
    model, loss_of = gpt()
    snap = rows_of(model, loss_of, monkeypatch)
    lever = levers.precision(snap, "cpu")
    assert lever is not None and lever.freed_bytes is not None
    before = sum(snap.parameter) + sum(snap.gradient)
    model.to(torch.bfloat16)
    model.zero_grad(set_to_none=True)
    loss_of(False).float().square().mean().backward()
    params = {p.untyped_storage().data_ptr(): p for p in model.parameters()}.values()  # the tied weight once
    after = sum(p.nbytes + (p.grad.nbytes if p.grad is not None else 0) for p in params)
    record_property("predicted_bytes", before - lever.freed_bytes)
    record_property("measured_bytes", after)
    print(f"bf16: predicted {before - lever.freed_bytes:,.0f} B of parameters and gradients, measured {after:,} B")
    assert after < 0.6 * before
    assert after == pytest.approx(before - lever.freed_bytes, rel=0.01)
