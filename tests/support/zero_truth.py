"""What DeepSpeed holds, read with torch's API only, for the DeepSpeed tests' scripts
(tests/integration/frameworks/scripts/zero_worker.py and deepspeed_script.py), and the model they train.

``Truth`` is a global optimizer step post-hook: at each step it records every tensor the stepping
torch optimizer holds (the flat fp32 partition under ZeRO 1-3, the parameter under stage 0), its
``.grad`` and ``optimizer.state`` sizes and devices. ``held()`` adds ZeRO-3's parameter partitions
(``ds_tensor``, ``ds_numel``). None of it reads memexporter's code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Net(nn.Module):
    """The issue's five-layer MLP, with LayerNorms; odd sizes, so ZeRO pads its partitions."""

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


def groups(model: nn.Module) -> list[dict[str, Any]]:
    """Two parameter groups (decay, no decay), as the HF Trainer makes."""
    return [
        {"params": [p for n, p in model.named_parameters() if not n.endswith("bias")], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0},
    ]


def config(stage: int, offload: bool, accumulate: int, batch: int) -> dict[str, Any]:
    """A DeepSpeed config that runs on its CPU accelerator: torch's AdamW, no C++ op."""
    zero: dict[str, Any] = {"stage": stage}
    if offload:  # ZeRO-3 offloads its parameter partitions too
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": accumulate,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,  # torch's AdamW over offloaded partitions
        "steps_per_print": 10**6,
    }


class Truth:
    """Per stepped tensor ``[gradient bytes, master bytes, state bytes, gradient device, state device]``,
    as of its last step."""

    def __init__(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

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

    def held(self, model: nn.Module, stage: int) -> dict[str, Any]:
        """This rank's truth per family (``families``), and what the tests check beside it."""
        params = list(model.parameters())
        held = [getattr(p, "ds_tensor", p) for p in params]
        flats = list(self.flats.values())
        masters = sum(f[1] for f in flats) if stage else 0  # stage 0: the optimizer steps the parameters
        families = {
            "parameter": sum(t.numel() * t.element_size() for t in held),
            "gradient": sum(f[0] for f in flats),
            "optimizer_state": masters + sum(f[2] for f in flats),
        }
        if stage == 3:
            families["parameter_unsharded"] = sum(
                int(p.ds_numel) * t.element_size() for p, t in zip(params, held, strict=True)
            )
        return {
            "families": families,
            "devices": {
                "gradient": sorted({f[3] for f in flats}),
                "optimizer_state": sorted({f[4] for f in flats}),
                "parameter": sorted({str(t.device) for t in held}),
            },
            "modules": rows(model),
        }


def rows(model: nn.Module, depth: int = 3) -> list[str]:
    """The row labels that must hold parameters: each module that registers a parameter first (a
    tied weight belongs to its first owner), cut at ``depth`` dotted parts (the default module depth)."""
    seen: set[int] = set()
    out: set[str] = set()
    for name, m in model.named_modules():
        own = [p for p in m.parameters(recurse=False) if id(p) not in seen]
        seen |= {id(p) for p in own}
        if own:
            out.add(".".join(name.split(".")[:depth]) or "(root)")
    return sorted(out)
