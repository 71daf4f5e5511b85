"""torch's ``MemTracker`` as an oracle for the per-module rows (issue 22, DESIGN.md §7).

``torch.distributed._tools.mem_tracker.MemTracker`` is a ``TorchDispatchMode``: it sees every
tensor created in its context, files each storage under one category (``PARAM``, ``BUFFER``,
``GRAD``, ``ACT``, ``TEMP``, ``OPT``, ``OTH``), sized as bytes of the storage (rounded up to 512 B
on CUDA only: exact here, on CPU), and takes a device-wide snapshot of the categories at each
module's pre- and post-forward (``memory_tracking[module].snapshots``). Per module it also keeps
``parameter_mem``: the bytes of ``module.parameters()``, recursive, each ``Parameter`` once.

How its figures map to the rows, as checked here after one warm-up step and one step under it:

- parameters: ``parameter_mem`` of a module == the sum of memexporter's parameter rows of its
  subtree, exactly. Tied weights differ by design: MemTracker counts the tied weight in every
  module that holds it (the embedding *and* the LM head); memexporter counts it once, in the
  module that registers it first (the head's subtree is short by exactly that weight).
- gradients / optimizer state: the storages of each row's own parameters' ``.grad`` and
  ``optimizer.state[p]`` tensors are filed by MemTracker as ``GRAD`` / ``OPT``; their bytes as
  MemTracker sizes them == memexporter's row; the device-wide ``GRAD`` / ``OPT`` totals == the sums
  of the rows. Tolerance: 0 bytes on CPU (on CUDA, MemTracker's 512-byte rounding per storage).
- activations: MemTracker's per-module figure is ``ACT`` after the module's forward minus ``ACT``
  before it: the storages the forward *allocated* that are still alive at its end (what it saved
  for backward, its output, anything else kept, e.g. a cache). memexporter's is the storages the
  forward *saved for backward*, charged to the innermost module running at the save, parameters
  excluded, each storage once. So ``memexporter(M) = MemTracker(M) - bytes alive at M's end that
  nothing in M saved (its output, when only a later module saves it) + bytes saved in M but
  allocated before it (its inputs)``. For a residual block whose input and output have the same
  shape (a transformer block) the two corrections cancel: the block's subtree of activation rows ==
  MemTracker's block figure, exactly (tolerance 0). For the whole model, the corrections are the
  model's output (not saved inside it) and its input (saved by the first layer). Leaves differ
  (a ``Linear`` saves its input, which MemTracker charges to the module that made it, and is
  charged its output, which the next module saves): no per-leaf comparison.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import memexporter
from tests.support.frameworks import check_common, first_owners, nbytes, scrape

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch", reason="needs torch")
nn = torch.nn
F = torch.nn.functional

TOLERANCE = 0  # bytes: on CPU MemTracker sizes each storage exactly as memexporter does
DEPTH = 10  # every module its own row: subtrees can be summed for any module MemTracker reports
CPU = torch.device("cpu")


class Block(nn.Module):
    """Pre-norm residual MLP block: input and output of the same shape."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: Any) -> Any:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d_in: int = 16, d: int = 32, d_out: int = 8, blocks: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = nn.Linear(d, d_out)

    def forward(self, x: Any) -> Any:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@functools.cache
def mem_tracker() -> Any:
    """``torch.distributed._tools.mem_tracker``, imported by the first test that builds an ``Oracle``,
    not at collection: the package's ``__init__`` loads FSDP, DTensor, torch._dynamo and torch._inductor,
    1.4 to 1.9 CPU-s of each pytest worker's collection (six workers in a parallel run). Without it
    (torch < 2.5), each test skips there, with the reason the module-level skip gave."""
    return pytest.importorskip(
        "torch.distributed._tools.mem_tracker",
        reason="needs torch's MemTracker (torch.distributed._tools, torch >= 2.5)",
    )


def subtree(rows: dict[str, float], name: str) -> float:
    """Sum of the rows at ``name`` and below (``""``: the whole model)."""
    if not name:
        return sum(rows.values())
    return sum(v for k, v in rows.items() if k == name or k.startswith(name + "."))


class Oracle:
    """One training step under ``MemTracker`` and what it says, keyed by module name."""

    def __init__(self, model: Any, opt: Any, step: Callable[[], Any], *external: Any) -> None:
        self.mt = mem_tracker().MemTracker()
        self.mt.track_external(model, opt, *external)
        with self.mt:
            self.output = step()
            self.current = self.mt.get_tracker_snapshot("current").get(CPU, {})
        names = {mod: name for name, mod in model.named_modules()}
        self.stats = {names[mod]: st for mod, st in self.mt.memory_tracking.items()}

    def category(self, name: str) -> int:
        return int(self.current.get(mem_tracker()._MemRefType[name], 0))

    def act_delta(self, name: str) -> int:
        """ACT bytes after the module's (first) forward minus before it."""
        snaps = self.stats[name].snapshots
        before = snaps[mem_tracker()._ModState.PRE_FW][0].get(CPU, {})
        after = snaps[mem_tracker()._ModState.POST_FW][0].get(CPU, {})
        act = mem_tracker()._MemRefType.ACT
        return int(after.get(act, 0) - before.get(act, 0))

    def filed(self, t: Any) -> tuple[str, int]:
        """How MemTracker filed ``t``'s storage: (category, bytes)."""
        winfo, _ = self.mt._WINFO.get(t.untyped_storage(), (None, None))
        assert winfo is not None, f"MemTracker does not know a storage of {tuple(t.shape)}"
        return winfo.reftype.name, int(winfo.mem_consumed)


def own_rows(model: Any, opt: Any, oracle: Oracle) -> dict[str, dict[str, int]]:
    """Per module, MemTracker's bytes of its own parameters' gradients and optimizer state (each
    checked to be filed as GRAD / OPT), the module that registers a parameter first owning it."""
    rows: dict[str, dict[str, int]] = {}
    for name, p in first_owners(model):
        row = rows.setdefault(name or "(root)", {"gradient": 0, "optimizer_state": 0})
        if p.grad is not None:
            kind, size = oracle.filed(p.grad)
            assert kind == "GRAD", (name, kind)
            row["gradient"] += size
        for v in opt.state[p].values():
            if isinstance(v, torch.Tensor):
                kind, size = oracle.filed(v)
                assert kind == "OPT", (name, kind)
                row["optimizer_state"] += size
    return rows


def check_step_families(got: Any, model: Any, opt: Any, oracle: Oracle) -> None:
    for name, want in own_rows(model, opt, oracle).items():
        for family, size in want.items():
            assert abs(got.rows[family].get(name, 0) - size) <= TOLERANCE, (family, name, got.rows[family], size)
    assert abs(got.total("gradient") - oracle.category("GRAD")) <= TOLERANCE, (got.total("gradient"), oracle.current)
    assert abs(got.total("optimizer_state") - oracle.category("OPT")) <= TOLERANCE, oracle.current
    assert got.total("parameter") == oracle.category("PARAM"), oracle.current


def test_memtracker_agrees_on_a_residual_mlp(start_exporter: Callable[..., Any], errors_before: int) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
    exp = start_exporter()
    memexporter.track(model, opt, depth=DEPTH)  # removed by the fixture

    def step() -> Any:
        out = model(x)
        F.mse_loss(out, y).backward()
        opt.step()
        return out

    step()  # warm-up: the optimizer state exists before MemTracker starts (track_external files it OPT)
    opt.zero_grad(set_to_none=True)
    oracle = Oracle(model, opt, step, x, y)
    got = scrape(exp.url)
    check_common(got, errors_before)
    assert got.steps == 2

    # Parameters: exactly, for every module MemTracker saw run.
    assert set(oracle.stats) == {name for name, _ in model.named_modules()} - {"blocks"}  # a ModuleList never runs
    for name, st in oracle.stats.items():
        assert subtree(got.rows["parameter"], name) == st.parameter_mem, (name, got.rows["parameter"])
    check_step_families(got, model, opt, oracle)

    # Activations: each block exactly; the model up to its output and input.
    acts = got.rows["activation"]
    for i in range(len(model.blocks)):
        name = f"blocks.{i}"
        assert subtree(acts, name) > 0
        assert abs(subtree(acts, name) - oracle.act_delta(name)) <= TOLERANCE, (name, acts, oracle.act_delta(name))
    whole = oracle.act_delta("") - nbytes(oracle.output) + nbytes(x)
    assert abs(sum(acts.values()) - whole) <= TOLERANCE, (acts, oracle.act_delta(""))


def test_memtracker_agrees_on_tiny_gpt2(start_exporter: Callable[..., Any], errors_before: int) -> None:
    """A transformers GPT-2 with tied embeddings: the tied weight is MemTracker's in both modules,
    ours once; each transformer block's activations agree exactly."""
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e .[frameworks])")
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=128,
        n_positions=32,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    exp = start_exporter()
    memexporter.track(model, opt, depth=DEPTH)

    def step() -> Any:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        return out

    step()
    opt.zero_grad(set_to_none=True)
    oracle = Oracle(model, opt, step, ids)
    got = scrape(exp.url)
    check_common(got, errors_before)

    tied = nbytes(model.transformer.wte.weight)
    assert model.lm_head.weight is model.transformer.wte.weight
    params = got.rows["parameter"]
    for name, st in oracle.stats.items():
        want = st.parameter_mem - (tied if name == "lm_head" else 0)  # MemTracker: in both; ours: the embedding's
        assert subtree(params, name) == want, (name, subtree(params, name), st.parameter_mem)
    check_step_families(got, model, opt, oracle)

    acts = got.rows["activation"]
    for i in range(cfg.n_layer):
        name = f"transformer.h.{i}"
        assert subtree(acts, name) > 0
        assert abs(subtree(acts, name) - oracle.act_delta(name)) <= TOLERANCE, (name, oracle.act_delta(name))
