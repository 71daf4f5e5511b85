"""One torchrun rank of tests/integration/distributed/test_sharded_modules.py.

    torchrun --standalone --nproc-per-node=2 sharded_worker.py OUT_DIR CONFIG[,CONFIG...]

Starts the exporter (port 0, loopback), then runs each configuration in turn: builds the same small
MLP model, wraps it (DDP, FSDP2 ``fully_shard``, tensor parallel), tracks it with
``memexporter.track()`` before or after the wrapping, trains a few AdamW steps, scrapes its own
``/metrics`` and records next to the scrape what the rows should say, computed here from the live
tensors by element counts (never from storages, which is what memexporter reads). Writes
``OUT_DIR/rank<R>.json``: ``{config: result}``, where a configuration that raised has ``error``
and ``traceback`` instead of figures. Nothing is asserted here: the test reads both ranks' files.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from prometheus_client.parser import text_string_to_metric_families
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

import memexporter
import memexporter.tracking.errors as mx_errors
import memexporter.tracking.gradients as mx_optimizer
import memexporter.tracking.schedule as mx_schedule

STEPS = 3
BATCH, D_IN, D, D_OUT, BLOCKS = 8, 16, 32, 8, 2  # every dim 0 even: FSDP2 shards without padding
FAMILIES = ("parameter", "parameter_unsharded", "gradient", "optimizer_state", "activation")


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(D_IN, D)
        self.blocks = nn.ModuleList(Block(D) for _ in range(BLOCKS))
        self.head = nn.Linear(D, D_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def new_model() -> Net:
    torch.manual_seed(0)  # the same weights on every rank
    return Net()


def batches(same_on_all_ranks: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + (0 if same_on_all_ranks else dist.get_rank()))
    return [(torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)) for _ in range(STEPS)]


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(x), y).backward()
    opt.step()


# --- reading /metrics -----------------------------------------------------------------------------


def scrape(url: str) -> dict[str, Any]:
    """This rank's series of interest: per-family module rows, steps, hook errors, collectors."""
    rank = str(dist.get_rank())
    running = memexporter.exporter.running()
    if running is not None:
        running.flush()  # a snapshot with what this rank just did (they are a second apart otherwise)
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, Any] = {
        "rows": {f: {} for f in FAMILIES},
        "steps": None,
        "hook_errors": None,
        "collector_success": {},
    }
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("rank", rank) != rank:
                continue
            if s.name.startswith("memexporter_module_") and s.name.endswith("_bytes") and "module" in s.labels:
                family = s.name[len("memexporter_module_") : -len("_bytes")]
                if family in FAMILIES:
                    out["rows"][family][s.labels["module"]] = s.value
            elif s.name == "memexporter_steps_total":
                out["steps"] = s.value
            elif s.name == "memexporter_hook_errors_total":
                out["hook_errors"] = s.value
            elif s.name == "memexporter_collector_success":
                out["collector_success"][s.labels.get("collector", "?")] = s.value
    return out


# --- what the rows should say, from element counts ------------------------------------------------


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def replicated(t: torch.Tensor) -> bool:
    """Every rank holds all of ``t`` (a plain tensor, or a DTensor replicated on every mesh dim)."""
    return not isinstance(t, DTensor) or all(isinstance(p, Replicate) for p in t.placements)


def expected(inner: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Per row (the module that registers the parameter; every module here is within the default
    depth 3): this rank's local bytes of parameters, gradients, optimizer state; the global
    (unsharded) parameter bytes; the global bytes of parameters every rank holds whole; the
    parameter count (AdamW keeps one 4-byte ``step`` tensor per parameter on every rank)."""
    rows: dict[str, dict[str, int]] = {}
    for name, mod in inner.named_modules():
        # FSDP1 wraps each unit: its wrapper's attribute is no part of the row's name.
        label = ".".join(part for part in name.split(".") if part != "_fsdp_wrapped_module") or "(root)"
        for p in mod.parameters(recurse=False):
            r = rows.setdefault(
                label, dict.fromkeys(("parameter", "gradient", "optimizer_state", "global", "replicated", "count"), 0)
            )
            r["parameter"] += nbytes(local(p))
            r["global"] += nbytes(p)
            r["replicated"] += nbytes(p) if replicated(p) else 0
            r["count"] += 1
            if p.grad is not None:
                r["gradient"] += nbytes(local(p.grad))
            for v in opt.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    r["optimizer_state"] += nbytes(local(v))
    kinds = {type(p).__name__ for p in inner.parameters()}
    grads = {type(p.grad).__name__ for p in inner.parameters() if p.grad is not None}
    return {"rows": rows, "param_types": sorted(kinds), "grad_types": sorted(grads)}


class SavedBytes:
    """An independent count of the bytes saved for backward in one forward: each storage once,
    parameters' storages excluded (what memexporter's activation rows sum to on a plain model)."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: set[int] = set()
        self.total = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in self.params and st.data_ptr() not in self.seen:
            self.seen.add(st.data_ptr())
            self.total += st.nbytes()
        return t


def levers() -> list[dict[str, Any]]:
    """The levers this rank's exporter gives now (issue 44), as ``/debug/memory`` serves them."""
    from memexporter.collectors.levers import gather

    running = memexporter.exporter.running()
    return [lever.to_json() for lever in gather(running.sources)] if running is not None else []


def _cpu(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """A MemTracker snapshot's categories on the CPU device, keyed by category name."""
    for dev, cats in snapshot.items():
        if torch.device(dev).type == "cpu":
            return {getattr(k, "value", k): int(v) for k, v in cats.items()}
    return {}


# --- configurations -------------------------------------------------------------------------------


class Run:
    def __init__(self, url: str) -> None:
        self.url = url

    def common(
        self,
        model: nn.Module,
        inner: nn.Module,
        opt: torch.optim.Optimizer,
        handle: Any,
        before: dict[str, Any],
        steps: int,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        after = scrape(self.url)
        result = {
            "before": before,
            "after": after,
            "steps_taken": steps,
            "expected": expected(inner, opt),
            "hook_errors_fn": mx_errors.hook_errors(),
            "levers": levers(),
            **(extra or {}),
        }
        handle.remove()
        return result

    def plain(self) -> dict[str, Any]:
        """No wrapper: the activation reference (each rank: one batch of the shared shape)."""
        before = scrape(self.url)
        model = new_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        handle = memexporter.track(model, opt)
        data = batches(same_on_all_ranks=False)
        for x, y in data[:-1]:
            train_step(model, opt, x, y)
        oracle = SavedBytes(model)
        x, y = data[-1]
        opt.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(oracle.pack, lambda t: t):  # the model's saves only
            out = model(x)
        F.mse_loss(out, y).backward()
        opt.step()
        return self.common(model, model, opt, handle, before, STEPS, {"saved_bytes_oracle": oracle.total})

    def ddp(self, bucket_view: bool) -> dict[str, Any]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        before = scrape(self.url)
        model = DDP(new_model(), gradient_as_bucket_view=bucket_view)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        handle = memexporter.track(model, opt)
        for x, y in batches(same_on_all_ranks=False):
            train_step(model, opt, x, y)
        views = sum(p.grad._base is not None for p in model.parameters() if p.grad is not None)
        return self.common(model, model.module, opt, handle, before, STEPS, {"grads_that_are_views": views})

    def fsdp2(self, track_before: bool, reshard_after_forward: bool, oracle: bool = False) -> dict[str, Any]:
        from torch.distributed.fsdp import fully_shard

        before = scrape(self.url)
        model = new_model()
        handle = memexporter.track(model) if track_before else None  # the optimizer does not exist yet
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=reshard_after_forward)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if handle is None:
            handle = memexporter.track(model, opt)
        data = batches(same_on_all_ranks=False)
        for x, y in data:
            train_step(model, opt, x, y)
        steps, extra = STEPS, {}
        if oracle:
            extra["memtracker"] = self.memtracker_step(model, opt, *data[-1])
            steps += 1
        return self.common(model, model, opt, handle, before, steps, extra)

    def memtracker_step(
        self, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> dict[str, Any]:
        """One more step under torch's FSDPMemTracker: its category totals after the step and, per
        FSDP module, the categories just before its pre-forward, after it, and after its post-forward."""
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState

        mt = FSDPMemTracker(model, opt)
        mt.track_inputs((x,))  # the batch is "Inputs", whatever touches it in the forward
        with mt:
            train_step(model, opt, x, y)
            current = mt.get_tracker_snapshot("current")
        names = {mod: name or "(root)" for name, mod in model.named_modules()}
        per_module: dict[str, Any] = {}
        for mod, stats in mt.memory_tracking.items():
            per_module[names.get(mod, stats.mod_fqn)] = {
                state.name: _cpu(stats.snapshots[state][0])
                for state in (_FSDPModState.BEF_PRE_FW, _FSDPModState.AFT_PRE_FW, _FSDPModState.AFT_POST_FW)
                if stats.snapshots.get(state)
            }
        return {"current": _cpu(current), "modules": per_module}

    def fsdp1(self, use_orig_params: bool) -> dict[str, Any]:
        """FSDP1 (``FullyShardedDataParallel``), each block its own unit. With ``use_orig_params``
        the modules keep their parameters as views into the local flat shard; without, each unit
        holds one flat parameter and the modules none."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        before = scrape(self.url)
        inner = new_model()
        whole = sum(nbytes(p) for p in inner.parameters())
        model = FSDP(
            inner,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            device_id=torch.device("cpu"),
            use_orig_params=use_orig_params,
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        handle = memexporter.track(model, opt)
        for x, y in batches(same_on_all_ranks=False):
            train_step(model, opt, x, y)
        # The wrappers too: without use_orig_params each unit's flat parameter is the wrapper's own.
        return self.common(model, model, opt, handle, before, STEPS, {"model_param_bytes": whole})

    def tp(self) -> dict[str, Any]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        before = scrape(self.url)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        model = new_model()
        plan: dict[str, Any] = {}
        for i in range(BLOCKS):
            plan[f"blocks.{i}.fc1"] = ColwiseParallel()
            plan[f"blocks.{i}.fc2"] = RowwiseParallel()
        parallelize_module(model, mesh, plan)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        handle = memexporter.track(model, opt)
        for x, y in batches(same_on_all_ranks=True):  # tensor parallel: every rank sees the same batch
            train_step(model, opt, x, y)
        return self.common(model, model, opt, handle, before, STEPS)


CONFIGS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "plain": Run.plain,
    "ddp_bucket_view": lambda r: r.ddp(bucket_view=True),
    "ddp_no_bucket_view": lambda r: r.ddp(bucket_view=False),
    "fsdp2_after_reshard": lambda r: r.fsdp2(track_before=False, reshard_after_forward=True, oracle=True),
    "fsdp2_before_reshard": lambda r: r.fsdp2(track_before=True, reshard_after_forward=True),
    "fsdp2_after_noreshard": lambda r: r.fsdp2(track_before=False, reshard_after_forward=False),
    "fsdp2_before_noreshard": lambda r: r.fsdp2(track_before=True, reshard_after_forward=False),
    "fsdp1_orig_params": lambda r: r.fsdp1(use_orig_params=True),
    "fsdp1_flat_params": lambda r: r.fsdp1(use_orig_params=False),
    "tp": Run.tp,
}


def main() -> None:
    out_dir, names = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)
    # A rank stuck in a collective (its peer failed) gives up after this instead of gloo's 30 min.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mx_optimizer.STEP_COUNT_INTERVAL_S = 0.0  # count gradients and state at every step
    # ... and record every forward's activations.
    mx_schedule.RECORD_INTERVAL_S, mx_schedule.RECORD_EVERY = 0.0, 1
    exp = memexporter.start(port=0, addr="127.0.0.1")
    run = Run(exp.url)
    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = CONFIGS[name](run)
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        gc.collect()  # the config's optimizer dies: the next one's is the step counter's primary
        dist.barrier()
    exp.stop()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
