"""Real CPU models and measuring helpers shared by the per-module tracking tests.

``TiedNet`` has a tied embedding/head, a block called twice per forward and a checkpointed block;
``Deep`` is a stack of blocks for depth and folding. ``OuterCounter`` is a user's own
``saved_tensors_hooks`` pair: the independent measure the activation figure is checked against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from memexporter.tracking.modules import TrackHandle

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


class Deep(nn.Module):
    def __init__(self, layers: int = 12) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(16) for _ in range(layers))
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.out(x)


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
        self.bytes = self.packs = self.unpacks = self.activation_packs = 0

    def pack(self, t: torch.Tensor) -> Any:
        self.packs += 1
        s = t.untyped_storage()
        self.activation_packs += s.data_ptr() not in self.params
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


def all_hooks(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._forward_hooks_always_called) for m in model.modules()
    )


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]
