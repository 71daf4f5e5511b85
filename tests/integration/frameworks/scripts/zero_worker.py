"""One torchrun rank of tests/integration/frameworks/test_deepspeed_zero.py (DeepSpeed ZeRO on CPU).

    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node=2 zero_worker.py OUT_DIR CONFIG[,CONFIG...]

CONFIG is ``z<stage>`` or ``z<stage>_offload`` (``offload_optimizer`` to the host; under ZeRO-3
``offload_param`` too), ``z3_unreadable`` (ZeRO-3 without its ``grad_position`` map, as if another
DeepSpeed kept it elsewhere), or ``z2_rebuild`` (the model tracked before ``initialize``, one step on
a first engine, then a second engine over the same model: new partitions to read).
Each rank imports torch and DeepSpeed once, starts the exporter (port 0, loopback), then for each
configuration builds the same small MLP, calls ``deepspeed.initialize`` (two parameter groups, as
the HF Trainer makes, and two micro-batches per optimizer step), ``memexporter.track(engine,
optimizer)``, trains, scrapes its own ``/metrics``, and records beside the scrape the truth read
from DeepSpeed's own partitions with torch's API only: a step post-hook on every optimizer records
each stepped tensor (the flat fp32 partition under ZeRO 1-3, the parameter under stage 0), its
``.grad`` and ``optimizer.state``; ZeRO-3's ``ds_tensor``/``ds_numel`` give the parameters
(tests/support/zero_truth.py).
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

import memexporter
import memexporter.tracking.boundaries as mx_boundaries
import memexporter.tracking.errors as mx_errors
import memexporter.tracking.gradients as mx_optimizer
from tests.support.zero_truth import Net, Truth, config, groups

# DeepSpeed's CPU accelerator builds a shared-memory all-reduce (C++, minutes on 2 cores) unless the
# op is marked not compatible; gloo does the same all-reduce.
deepspeed.ops.__compatible_ops__ = {}

STEPS, ACCUMULATE, BATCH = 3, 2, 4
FAMILIES = ("parameter", "parameter_unsharded", "gradient", "optimizer_state", "device")


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


def train(engine: Any, steps: int) -> None:
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps * ACCUMULATE):
        loss = engine(torch.randn(BATCH, 16, generator=g)).pow(2).mean()
        engine.backward(loss)
        engine.step()


def run(name: str, url: str, truth: Truth) -> dict[str, Any]:
    stage, offload, unreadable = int(name[1]), name.endswith("_offload"), name.endswith("_unreadable")
    torch.manual_seed(0)
    model = Net()
    ds = config(stage, offload, ACCUMULATE, BATCH)
    if name.endswith("_rebuild"):  # tracked before DeepSpeed (as the HF callback does); an engine that dies
        handle = memexporter.track(model)
        first, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups(model), config=ds)
        train(first, 1)
        first.destroy()
        del first
        gc.collect()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=groups(model), config=ds)
    if unreadable:  # as if another DeepSpeed kept its map elsewhere: only its public accessors read it
        del engine.optimizer.grad_position
    before = scrape(url)
    if not name.endswith("_rebuild"):
        handle = memexporter.track(engine, optimizer)
    truth.flats.clear()
    train(engine, STEPS)
    after = scrape(url)
    result = {
        "before": before,
        "after": after,
        "global_steps": engine.global_steps,
        "hook_errors_fn": mx_errors.hook_errors(),
        "truth": truth.held(model, stage),
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
