"""Per-module tracking on real CPU models: partition, activations, folding, hooks, training features.

Every figure here is measured on CPU tensors by torch itself; nothing is synthetic except the
hand-written snapshots of the pure fold tests.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from memexporter.collectors.modules import ModulesCollector
from memexporter.scrape import Scrape
from memexporter.tracking import hooks as tracking_hooks
from memexporter.tracking import ledger
from memexporter.tracking import optimizer as tracking_optimizer
from memexporter.tracking.snapshots import FAMILIES, Layout, Snapshot, fold
from memexporter.tracking.modules import ROOT_LABEL, TrackHandle, active_handles, hook_errors, track
from tests.unit.fakes import sources

V, D = 512, 64


class Block(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class TiedNet(nn.Module):
    """Tied embedding/head, a block called twice per forward, and a checkpointed block."""

    def __init__(self, reentrant: bool | None = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.shared = Block()
        self.ckpt = Block()
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight
        self.scale = nn.Parameter(torch.ones(D))  # a direct parameter of the root
        self.reentrant = reentrant

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.shared(self.emb(idx))
        h = self.ckpt(h) if self.reentrant is None else checkpoint(self.ckpt, h, use_reentrant=self.reentrant)
        return self.head(self.shared(h) * self.scale)


def batch(n: int = 4, t: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, V, (n, t), generator=g), torch.randint(0, V, (n, t), generator=g)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    x, y = data
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def unique_param_bytes(model: nn.Module) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():
        s = p.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class OuterCounter:
    """A user's saved_tensors_hooks pair counting unique storages saved, excluding parameters."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: set[int] = set()
        self.bytes = self.packs = self.unpacks = 0

    def pack(self, t: torch.Tensor) -> Any:
        self.packs += 1
        s = t.untyped_storage()
        if s.data_ptr() not in self.params and s.data_ptr() not in self.seen:
            self.seen.add(s.data_ptr())
            self.bytes += s.nbytes()
        return ("packed", t.detach())  # a wrapper only our unpack understands

    def unpack(self, packed: Any) -> torch.Tensor:
        self.unpacks += 1
        tag, t = packed
        assert tag == "packed"
        return t  # type: ignore[no-any-return]

    def hooks(self) -> saved_tensors_hooks:
        return saved_tensors_hooks(self.pack, self.unpack)


def totals(handle: TrackHandle) -> dict[str, int]:
    snap = handle.snapshot()
    return {
        "parameter": sum(snap.parameter),
        "gradient": sum(snap.gradient),
        "optimizer_state": sum(snap.optimizer_state),
        "activation": sum(snap.activation),
    }


def row(handle: TrackHandle, family: str, name: str) -> int:
    snap = handle.snapshot()
    return int(getattr(snap, family)[snap.layout.names.index(name)])


@pytest.fixture(autouse=True)
def _untrack_all() -> Iterator[None]:
    yield
    for h in list(active_handles()):
        assert isinstance(h, TrackHandle)
        h.remove()


# --- Acceptance: the partition and the activation figure ------------------------------------------


@pytest.mark.parametrize("reentrant", [False, True])
def test_rows_partition_parameters_gradients_and_adamw_state(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = TiedNet(reentrant)
    opt = torch.optim.AdamW(model.parameters())
    handle = track(model, opt)
    for _ in range(2):
        train_step(model, opt, batch())
    expected = unique_param_bytes(model)
    got = totals(handle)
    assert got["parameter"] == pytest.approx(expected, rel=1e-3)
    assert got["gradient"] == pytest.approx(expected, rel=1e-3)
    # exp_avg + exp_avg_sq per parameter (+ a 4-byte step tensor each: far below 0.1 %)
    assert got["optimizer_state"] == pytest.approx(2 * expected, rel=1e-3)
    # The tied weight is counted once, in the row of its first owner.
    assert row(handle, "parameter", "emb") == V * D * 4
    assert row(handle, "parameter", "head") == 0
    assert row(handle, "parameter", ROOT_LABEL) == D * 4  # the root's direct parameter
    # The exported rows (after folding) add up to the same totals.
    folded = fold(handle.snapshot())
    assert sum(v[0] for _, v in folded) == got["parameter"]
    assert sum(v[2] for _, v in folded) == got["optimizer_state"]


@pytest.mark.parametrize("reentrant", [False, True, None])
def test_activations_match_an_outer_saved_tensors_hook(reentrant: bool | None) -> None:
    torch.manual_seed(0)
    model = TiedNet(reentrant)
    x, y = batch()
    baseline = OuterCounter(model)  # what the same forward saves without tracking
    with baseline.hooks():
        out = model(x)
    F.cross_entropy(out.flatten(0, 1), y.flatten()).backward()
    handle = track(model, torch.optim.SGD(model.parameters(), lr=0.1))
    outer = OuterCounter(model)
    with outer.hooks():
        out = model(x)
    ours = totals(handle)["activation"]
    # The loss is outside the model's forward: the outer hook sees the same forward only.
    assert outer.bytes > 0
    assert ours == pytest.approx(outer.bytes, rel=0.10)
    assert ours == pytest.approx(baseline.bytes, rel=0.10)
    out.sum().backward()  # the chain unpacks through the outer pair
    assert outer.unpacks == outer.packs
    print(f"activation bytes: ours={ours} outer={outer.bytes} error={abs(ours - outer.bytes) / outer.bytes:.4%}")


def test_module_called_twice_counts_both_calls_and_its_parameters_once() -> None:
    model = TiedNet(None)
    handle = track(model)
    model(batch()[0])
    once = Block()
    h2 = track(once, prefix="single")
    once(torch.randn(4, 32, D))
    # gelu saves fc1's output on every call: two calls, two distinct storages
    assert row(handle, "activation", "shared") == 2 * row(h2, "activation", "single")
    assert row(handle, "parameter", "shared.fc1") == row(h2, "parameter", "single.fc1")


# --- Folding ----------------------------------------------------------------------------------------


def snapshot(parents: tuple[int, ...], values: list[int], max_modules: int) -> Snapshot:
    names = tuple(f"m{i}" for i in range(len(parents)))
    v = tuple(values)
    zeros = (0,) * len(values)
    return Snapshot(Layout(names, parents), max_modules, v, zeros, v, zeros)


@pytest.mark.parametrize(
    ("parents", "values", "max_modules", "expected"),
    [
        # root -> a(1) -> a.x(5); root -> b(2). Cap 1: the smallest leaf (b) folds first, then a.x.
        ((-1, 0, 1, 0), [0, 1, 5, 2], 1, {"m0": 2, "m1": 6}),
        ((-1, 0, 1, 0), [0, 1, 5, 2], 2, {"m0": 2, "m1": 1, "m2": 5}),
        ((-1, 0, 1, 0), [0, 1, 5, 2], 3, {"m0": 0, "m1": 1, "m2": 5, "m3": 2}),
        # zero rows are left out, the root never is
        ((-1, 0, 0), [0, 0, 3], 5, {"m0": 0, "m2": 3}),
        ((-1,), [7], 1, {"m0": 7}),
    ],
)
def test_fold(parents: tuple[int, ...], values: list[int], max_modules: int, expected: dict[str, int]) -> None:
    rows = fold(snapshot(parents, values, max_modules))
    assert {name: v[0] for name, v in rows} == expected
    assert all(v[0] == v[2] for _, v in rows)  # columns fold together


class Deep(nn.Module):
    def __init__(self, layers: int = 12) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(16) for _ in range(layers))
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.out(x)


@pytest.mark.parametrize(("depth", "max_modules"), [(1, 100), (2, 5), (3, 7), (3, 100), (5, 1)])
def test_depth_and_max_modules_keep_totals(depth: int, max_modules: int) -> None:
    model = Deep()
    opt = torch.optim.Adam(model.parameters())
    full = track(model, opt, depth=8, max_modules=1000)
    data = torch.randn(2, 5, 16)
    model(data).sum().backward()
    opt.step()
    full_totals = [sum(col) for col in zip(*(v for _, v in fold(full.snapshot())), strict=True)]
    full.remove()
    handle = track(model, opt, depth=depth, max_modules=max_modules)
    model(data).sum().backward()
    opt.step()
    rows = fold(handle.snapshot())
    assert len(rows) <= max_modules + 1
    assert all(name.count(".") < depth for name, _ in rows)
    assert [sum(col) for col in zip(*(v for _, v in rows), strict=True)] == pytest.approx(full_totals, rel=1e-9)


# --- Hooks never raise, remove() removes everything -----------------------------------------------


def test_failing_internals_are_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    before = hook_errors()

    def boom(*args: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(ledger, "count_step", boom)
    monkeypatch.setattr(tracking_hooks, "_top_hooks", boom)
    loss = train_step(model, opt, batch())
    assert torch.isfinite(torch.tensor(loss))  # the step completed
    assert hook_errors() >= before + 2
    assert sum(handle.snapshot().gradient) == 0  # nothing half-published

    # A pack-hook failure (a storage that cannot be read) is counted, the forward still runs.
    monkeypatch.undo()
    handle.remove()
    model = TiedNet(None)
    track(model)
    monkeypatch.setattr(tracking_hooks, "storage", boom)
    monkeypatch.setattr(torch.Tensor, "untyped_storage", boom)
    before = hook_errors()
    out = model(batch()[0])
    monkeypatch.undo()
    out.sum().backward()
    assert hook_errors() > before


def all_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._forward_hooks_always_called)
               for m in model.modules())


def test_remove_and_context_manager_remove_every_hook() -> None:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    global_before = len(_global_optimizer_post_hooks)
    with track(model) as handle:  # no optimizer: the global step hook
        assert all_hooks(model) > 0
        assert len(_global_optimizer_post_hooks) == global_before + 1
        train_step(model, opt, batch())
        assert totals(handle)["gradient"] > 0
    assert all_hooks(model) == 0
    assert len(_global_optimizer_post_hooks) == global_before
    assert handle not in active_handles()
    frozen = handle.snapshot()
    train_step(model, opt, batch())
    assert handle.snapshot() is frozen  # nothing updates any more

    handle = track(model, opt)
    assert len(opt._optimizer_step_post_hooks) == 1
    handle.remove()
    handle.remove()  # idempotent
    assert all_hooks(model) == 0
    assert len(opt._optimizer_step_post_hooks) == 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None


def test_a_forward_that_raises_leaves_no_hooks_pushed() -> None:
    model = Deep(2)
    handle = track(model)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 15))  # wrong width: fails inside blocks.0
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert handle._stack == [] and handle._depth == 0
    model(torch.randn(2, 16))
    assert totals(handle)["activation"] > 0


def test_gradients_and_state_are_recounted_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Deep(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x = torch.randn(2, 16)
    model(x).sum().backward()
    opt.step()
    first = totals(handle)["gradient"]
    assert first == unique_param_bytes(model)
    model.out.weight.grad = None  # fewer gradients at the next step...
    opt.step()
    assert totals(handle)["gradient"] == first  # ...not seen: within the interval
    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)
    opt.step()
    assert totals(handle)["gradient"] == first - model.out.weight.numel() * 4


@pytest.mark.parametrize("from_other_thread", [False, True])
def test_remove_during_a_forward(from_other_thread: bool) -> None:
    model = Deep(2)
    handle = track(model)

    def remove_now(m: nn.Module, args: Any, out: Any) -> None:
        if from_other_thread:  # e.g. exporter.stop() from a signal-handling thread
            t = threading.Thread(target=handle.remove)
            t.start()
            t.join()
        else:
            handle.remove()

    user_hook = model.blocks[0].register_forward_hook(remove_now)
    model(torch.randn(2, 16)).sum().backward()
    user_hook.remove()
    # our saved-tensor hooks are never left pushed, whichever thread removed us
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert handle not in active_handles()
    model(torch.randn(2, 16))  # the next forward takes off whatever was left
    assert all_hooks(model) == 0
    assert totals(handle)["activation"] == 0  # the interrupted forward was not published


# --- The user's own saved-tensor hooks keep working -----------------------------------------------


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_save_on_cpu_keeps_working_under_tracking() -> None:
    torch.manual_seed(0)
    model = TiedNet()
    ref = copy.deepcopy(model)
    x, y = batch()
    with save_on_cpu(pin_memory=False):
        F.cross_entropy(ref(x).flatten(0, 1), y.flatten()).backward()
    handle = track(model)
    with save_on_cpu(pin_memory=False):
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    assert totals(handle)["activation"] > 0
    for a, b in zip(grads_of(model), grads_of(ref), strict=True):
        torch.testing.assert_close(a, b)


def test_a_user_counting_hook_pair_still_sees_every_save() -> None:
    torch.manual_seed(0)
    model = TiedNet()
    ref = copy.deepcopy(model)
    x, y = batch()
    plain = OuterCounter(ref)
    with plain.hooks():
        F.cross_entropy(ref(x).flatten(0, 1), y.flatten()).backward()
    track(model)
    user = OuterCounter(model)
    with user.hooks():
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    assert (user.packs, user.unpacks, user.bytes) == (plain.packs, plain.unpacks, plain.bytes)
    for a, b in zip(grads_of(model), grads_of(ref), strict=True):
        torch.testing.assert_close(a, b)


def test_a_tracked_model_inside_another_counts_its_saves_once() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(D, D)
            self.teacher = Block()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.teacher(self.pre(x) * 2)  # no storage saved on both sides of the boundary

    model = Outer()
    outer_h = track(model, prefix="student")
    inner_h = track(model.teacher, prefix="teacher")
    counter = OuterCounter(model)
    with counter.hooks():
        model(torch.randn(4, 8, D))
    both = totals(outer_h)["activation"] + totals(inner_h)["activation"]
    assert totals(inner_h)["activation"] > 0
    assert both == counter.bytes


# --- Training features -------------------------------------------------------------------------------


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recompute_is_not_a_new_forward(reentrant: bool) -> None:
    model = TiedNet(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x, y = batch()
    out = model(x)
    after_forward = handle.snapshot().activation
    F.cross_entropy(out.flatten(0, 1), y.flatten()).backward()  # recomputes ckpt
    assert handle.snapshot().activation == after_forward
    opt.step()
    assert sum(after_forward) > 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_the_whole_model(reentrant: bool) -> None:
    model = Deep(2)
    handle = track(model)
    x = torch.randn(4, 16, requires_grad=True)  # reentrant checkpoint needs an input that requires grad
    out = checkpoint(model, x, use_reentrant=reentrant)
    figure = handle.snapshot().activation
    out.sum().backward()  # the root's forward runs again, inside backward
    assert handle.snapshot().activation == figure
    assert all(p.grad is not None for p in model.parameters())


def test_no_grad_evaluation_keeps_the_last_training_figure() -> None:
    model = TiedNet()
    handle = track(model)
    x = batch()[0]
    model(x)
    trained = handle.snapshot().activation
    assert sum(trained) > 0
    with torch.no_grad():
        model(x)
    with torch.inference_mode():
        model(x)
    assert handle.snapshot().activation == trained


def test_autocast_bf16() -> None:
    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    fp32 = totals(handle)
    loss.backward()
    opt.step()
    assert fp32["activation"] > 0
    # Parameters stay fp32; the bf16 casts autocast saves for backward are activations.
    assert totals(handle)["parameter"] == unique_param_bytes(model)
    assert totals(handle)["gradient"] == unique_param_bytes(model)


@pytest.mark.parametrize(("convert", "factor"), [(lambda m: m.to(torch.float64), 2.0), (lambda m: m.half(), 0.5)])
def test_moved_or_converted_parameters_are_recounted(convert: Any, factor: float) -> None:
    model = TiedNet(None)
    handle = track(model)
    before = totals(handle)["parameter"]
    convert(model)
    dtype = next(model.parameters()).dtype
    outer = OuterCounter(model)
    with outer.hooks():
        model(batch()[0])  # the next forward sees the new storages
    assert totals(handle)["parameter"] == pytest.approx(before * factor)
    # the converted parameters are not mistaken for activations
    assert totals(handle)["activation"] == pytest.approx(outer.bytes, rel=0.10)
    assert dtype in (torch.float64, torch.float16)


def compile_or_skip(model: nn.Module, backend: str) -> nn.Module:
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is not available in this torch build")
    return torch.compile(model, backend=backend)  # type: ignore[return-value]


@pytest.mark.parametrize("style", ["wrapper", "in_place"])
def test_torch_compile_smoke(style: str) -> None:
    # aot_eager runs Dynamo and AOTAutograd (what decides the saved tensors) without code
    # generation, so the test stays a few seconds on CPU. Inductor: see the test below.
    torch._dynamo.reset()
    errors = hook_errors()
    model = Deep(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if style == "wrapper":
        run = compile_or_skip(model, "aot_eager")
        handle = track(run, opt)
    else:
        model.compile(backend="aot_eager")
        run = model
        handle = track(model, opt)
    for _ in range(2):
        run(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    got = totals(handle)
    assert got["parameter"] == unique_param_bytes(model)
    assert got["gradient"] == unique_param_bytes(model)
    assert got["activation"] > 0
    assert row(handle, "activation", ROOT_LABEL) == got["activation"]  # compiled: all in the root row
    assert hook_errors() == errors


@pytest.mark.skipif(os.environ.get("MEMEXPORTER_TEST_INDUCTOR") != "1",
                    reason="inductor compiles C++ (20-60 s on a 2-core CPU box); set MEMEXPORTER_TEST_INDUCTOR=1 to run")
def test_torch_compile_inductor() -> None:
    torch._dynamo.reset()
    model = Deep(2)
    run = compile_or_skip(model, "inductor")
    handle = track(run)
    run(torch.randn(4, 16)).sum().backward()
    assert totals(handle)["activation"] > 0
    assert row(handle, "activation", ROOT_LABEL) == totals(handle)["activation"]
    assert totals(handle)["parameter"] == unique_param_bytes(model)


# --- Several models, arguments, the collector -------------------------------------------------------


def test_two_models_get_distinct_rows() -> None:
    class Generator(nn.Sequential):
        pass

    class Discriminator(nn.Sequential):
        pass

    g = Generator(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    d = Discriminator(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    hg, hd = track(g), track(d)
    assert (hg.prefix, hd.prefix) == ("", "Discriminator")
    third = track(Generator(nn.Linear(8, 8)))
    assert third.prefix == "Generator"
    fourth = track(Generator(nn.Linear(8, 8)))
    assert fourth.prefix == "model1"
    names = [set(h.snapshot().layout.names) for h in (hg, hd, third, fourth)]
    assert sum(len(n) for n in names) == len(set().union(*names))
    with pytest.raises(ValueError, match="already tracked"):
        track(g)
    with pytest.raises(ValueError, match="collide"):
        track(nn.Linear(2, 2), prefix="Discriminator")


def test_the_global_step_hook_keeps_only_optimizers_of_the_model() -> None:
    g, d = Deep(1), Deep(1)
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    hg = track(g, prefix="G")
    x = torch.randn(2, 16)
    g(x).sum().backward()
    d(x).sum().backward()
    opt_d.step()
    assert totals(hg)["optimizer_state"] == 0
    opt_g.step()
    steps = 4 * len(list(g.parameters()))  # Adam's scalar `step` tensors
    assert totals(hg)["optimizer_state"] == 2 * unique_param_bytes(g) + steps


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"model": "not a module"}, TypeError),
        ({"optimizer": 3}, TypeError),
        ({"optimizer": ["sgd"]}, TypeError),
        ({"prefix": 7}, TypeError),
        ({"depth": 0}, ValueError),
        ({"max_modules": -1}, ValueError),
    ],
)
def test_bad_arguments_fail_fast(kwargs: dict[str, Any], error: type[Exception]) -> None:
    args: dict[str, Any] = {"model": nn.Linear(2, 2), **kwargs}
    with pytest.raises(error):
        track(**args)


def test_forward_deltas_with_an_injected_reading() -> None:
    # CPU stand-in for torch.cuda.memory_allocated: a counter that grows 100 per read.
    reads = iter(range(0, 10**9, 100))
    model = Deep(2)
    handle = track(model, cuda_forward_delta=True, allocated=lambda: next(reads), depth=2)
    assert handle.forward_deltas() == {}
    model(torch.randn(2, 16))
    deltas = handle.forward_deltas()
    assert set(deltas) == set(handle.snapshot().layout.names)
    assert deltas["blocks.0"] == 100  # one read before and one after, nothing else in between
    assert deltas[ROOT_LABEL] > deltas["blocks.0"]
    with torch.no_grad():
        model(torch.randn(2, 16))
    assert handle.forward_deltas() == deltas  # only grad-enabled forwards update


def test_collector_exports_four_families_per_rank_and_module() -> None:
    model = TiedNet()
    opt = torch.optim.AdamW(model.parameters())
    track(model, opt, max_modules=3)
    collector = ModulesCollector()
    assert list(collector.collect(Scrape(sources()))) != []
    train_step(model, opt, batch())
    fams = {f.name: f for f in collector.collect(Scrape(sources()))}
    assert set(fams) == set(FAMILIES)
    param = fams["memexporter_module_parameter_bytes"]
    assert {s.labels["rank"] for s in param.samples} == {"3"}
    assert len(param.samples) <= 4
    assert sum(s.value for s in param.samples) == unique_param_bytes(model)


def test_collector_without_tracked_models_yields_nothing() -> None:
    assert list(ModulesCollector(lambda: ()).collect(Scrape(sources()))) == []


# --- Stress: scrapes racing a training loop ---------------------------------------------------------


def test_scrapes_race_training_without_errors() -> None:
    seconds = float(os.environ.get("MEMEXPORTER_STRESS_SECONDS", "20"))
    torch.manual_seed(0)
    model = TiedNet(False)
    opt = torch.optim.AdamW(model.parameters())
    track(model, opt)
    collector, scrape_src = ModulesCollector(), sources()
    stop = threading.Event()
    failures: list[BaseException] = []
    scrapes = [0, 0]

    def scraper(i: int) -> None:
        try:
            while not stop.is_set():
                names = {f.name for f in collector.collect(Scrape(scrape_src))}
                if names != set(FAMILIES):
                    raise AssertionError(f"scrape returned {sorted(names)}")
                scrapes[i] += 1
                time.sleep(0)  # back to back, but let the training thread take the GIL
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=scraper, args=(i,), daemon=True) for i in range(2)]
    errors_before = hook_errors()
    for t in threads:
        t.start()
    steps, deadline, data = 0, time.monotonic() + seconds, batch()
    try:
        while time.monotonic() < deadline:
            train_step(model, opt, data)
            with torch.no_grad():
                model(data[0])
            steps += 1
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not failures, failures
    assert hook_errors() == errors_before
    assert steps > 0 and min(scrapes) > 0
    print(f"stress: {seconds:.0f}s, {steps} steps, {sum(scrapes)} scrapes, no errors")


def test_forward_deltas_are_exported_when_recorded() -> None:
    """SYNTHETIC allocation counter standing in for torch.cuda (the real one runs in tests/cuda)."""
    from memexporter.collectors.modules import ModulesCollector
    from memexporter.scrape import Scrape
    from tests.unit.fakes import sources

    counter = iter(range(0, 10**9, 4096))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with track(model, cuda_forward_delta=True, allocated=lambda: next(counter), prefix="d") as handle:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
        deltas = handle.forward_deltas()
        assert deltas, "the synthetic counter moved during the forward"
        fams = {f.name: f for f in ModulesCollector().collect(Scrape(sources()))}
        got = {s.labels["module"]: s.value for s in fams["memexporter_module_forward_delta_bytes"].samples}
        assert got == {k: float(v) for k, v in deltas.items()}


def test_track_ignores_unrelated_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_PORT", "not-a-port")
    monkeypatch.setenv("MEMEXPORTER_MODULE_DEPTH", "1")
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with track(model, prefix="s") as handle:
        assert max(n.count(".") for n in handle.snapshot().layout.names) <= 1
