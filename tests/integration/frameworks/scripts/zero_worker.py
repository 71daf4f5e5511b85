"""One torchrun rank of tests/integration/frameworks/test_deepspeed_zero.py (DeepSpeed ZeRO on CPU).

    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node=2 zero_worker.py OUT_DIR CONFIG[,CONFIG...]

CONFIG is ``z<stage>`` or ``z<stage>_offload`` (``offload_optimizer`` to the host), or
``z3_unreadable`` (ZeRO-3 without its ``grad_position`` map, as if another DeepSpeed kept it elsewhere).
Each rank imports torch and DeepSpeed once, starts the exporter (port 0, loopback), then for each
configuration builds the same small MLP, calls ``deepspeed.initialize`` (two parameter groups, as
the HF Trainer makes, and two micro-batches per optimizer step), ``memexporter.track(engine,
optimizer)``, trains, scrapes its own ``/metrics``, and records beside the scrape the truth read
from DeepSpeed's own partitions with torch's API only: a step post-hook on every optimizer records
each stepped tensor (the flat fp32 partition under ZeRO 1-3, the parameter under stage 0), its
``.grad`` and ``optimizer.state``; ZeRO-3's ``ds_tensor``/``ds_numel`` give the parameters.
Writes ``OUT_DIR/rank<R>.json``; nothing is asserted here.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
import urllib.request
from datetime import timedelta
from typing import Any

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
from prometheus_client.parser import text_string_to_metric_families
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

import memexporter
import memexporter.tracking.boundaries as mx_boundaries
import memexporter.tracking.errors as mx_errors
import memexporter.tracking.gradients as mx_optimizer

# DeepSpeed's CPU accelerator builds a shared-memory all-reduce (C++, minutes on 2 cores) unless the
# op is marked not compatible; gloo does the same all-reduce.
deepspeed.ops.__compatible_ops__ = {}

STEPS, ACCUMULATE, BATCH = 3, 2, 4
FAMILIES = ("parameter", "parameter_unsharded", "gradient", "optimizer_state", "device")


class Net(nn.Module):
    """The issue's five-layer MLP, with a LayerNorm; odd sizes, so ZeRO pads its partitions."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 33)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(33, 33), nn.LayerNorm(33)) for _ in range(3))
        self.head = nn.Linear(33, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


class Truth:
    """What each optimizer step holds, read with torch's API in a step post-hook: per stepped tensor
    ``[gradient bytes, master bytes, state bytes, gradient device, state device]``, the last step's."""

    def __init__(self) -> None:
        self.flats: dict[int, list[Any]] = {}
        register_optimizer_step_post_hook(self.post)

    def post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for t in group["params"]:
                g = t.grad
                state = [v for v in optimizer.state.get(t, {}).values() if isinstance(v, torch.Tensor)]
                self.flats[id(t)] = [
                    0 if g is None else g.numel() * g.element_size(),
                    t.numel() * t.element_size(),
                    sum(v.numel() * v.element_size() for v in state),
                    str(t.device if g is None else g.device),
                    str(state[0].device if state else t.device),
                ]


def scrape(url: str) -> dict[str, Any]:
    rank = str(dist.get_rank())
    memexporter.exporter.running().flush()  # type: ignore[union-attr]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, Any] = {"rows": {f: {} for f in FAMILIES}, "steps": None, "hook_errors": None, "success": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("rank", rank) != rank:
                continue
            if s.name.startswith("memexporter_module_") and "module" in s.labels:
                family = s.name[len("memexporter_module_") : -len("_bytes")]
                if family == "device":
                    key = f"{s.labels['module']}|{s.labels['family']}|{s.labels['device']}"
                    out["rows"]["device"][key] = s.value
                elif family in FAMILIES:
                    out["rows"][family][s.labels["module"]] = s.value
            elif s.name == "memexporter_steps_total":
                out["steps"] = s.value
            elif s.name == "memexporter_hook_errors_total":
                out["hook_errors"] = s.value
            elif s.name == "memexporter_collector_success":
                out["success"][s.labels.get("collector", "?")] = s.value
    return out


def config(stage: int, offload: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": ACCUMULATE,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,  # torch's AdamW over the offloaded partitions (no C++ op)
        "steps_per_print": 10**6,
    }


def run(name: str, url: str, truth: Truth) -> dict[str, Any]:
    stage, offload, unreadable = int(name[1]), name.endswith("_offload"), name.endswith("_unreadable")
    torch.manual_seed(0)
    model = Net()
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith("bias")], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0},
    ]
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config(stage, offload))
    if unreadable:  # as if another DeepSpeed kept its map elsewhere: only its public accessors read it
        del engine.optimizer.grad_position
    before = scrape(url)
    handle = memexporter.track(engine, optimizer)
    truth.flats.clear()
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(STEPS * ACCUMULATE):
        loss = engine(torch.randn(BATCH, 16, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    after = scrape(url)
    params = list(model.parameters())
    held = [getattr(p, "ds_tensor", p) for p in params]
    result = {
        "before": before,
        "after": after,
        "global_steps": engine.global_steps,
        "hook_errors_fn": mx_errors.hook_errors(),
        "truth": {
            "flats": list(truth.flats.values()),
            "stage0_params": sum(p.numel() * p.element_size() for p in params) if stage == 0 else 0,
            "parameter": sum(t.numel() * t.element_size() for t in held),
            "parameter_device": sorted({str(t.device) for t in held}),
            "unsharded": sum(
                int(getattr(p, "ds_numel", p.numel())) * t.element_size() for p, t in zip(params, held, strict=True)
            ),
        },
        "modules": sorted(n for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))),
    }
    handle.remove()
    engine.destroy()
    return result


def main() -> None:
    out_dir, names = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mx_optimizer.STEP_COUNT_INTERVAL_S = 0.0  # count gradients and state at every step
    exp = memexporter.start(port=0, addr="127.0.0.1")
    truth = Truth()
    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = run(name, exp.url or "", truth)
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        gc.collect()
        # The first optimizer seen stepping is the step counter's primary while it lives, and a ZeRO-3
        # engine's optimizer outlives destroy(): each configuration's steps count from its own.
        mx_boundaries._primary = None
        dist.barrier()
    exp.stop()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
