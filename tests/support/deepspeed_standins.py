"""SYNTHETIC stand-ins of what DeepSpeed 0.19 puts on tensors and optimizers, for the unit tests of
``memexporter/tracking/storage`` (the real DeepSpeed runs in tests/integration/frameworks/test_deepspeed_*.py).

- ``loaded``: a ``deepspeed`` entry in ``sys.modules`` (memexporter reads DeepSpeed's marks only when it is imported);
- ``zero12``: one rank's flat fp32 partition of a model, each parameter's ``_hp_mapping`` a
  fragment of it (``hp_fragment``: a narrow view; ``hp_fragment_address.numel``), as
  ``deepspeed/utils/tensor_fragment.py`` lays them out, with ``padding`` elements at the end;
- ``zero3``: a ZeRO-3 optimizer's ``grad_position`` map into its ``fp32_partitioned_groups_flat``.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch
from torch import nn


def loaded(monkeypatch: pytest.MonkeyPatch, version: str = "0.19.8") -> ModuleType:
    ds = ModuleType("deepspeed")
    ds.__version__ = version  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", ds)
    return ds


def zero12(model: nn.Module, padding: int = 3) -> torch.Tensor:
    """The flat fp32 partition (a leaf, as ``single_partition_of_fp32_groups[i]``) of ``model``'s parameters."""
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params) + padding, requires_grad=True)
    offset = 0
    with torch.no_grad():
        for p in params:
            address = SimpleNamespace(numel=p.numel(), start=offset)
            p._hp_mapping = SimpleNamespace(hp_fragment=flat.narrow(0, offset, p.numel()), hp_fragment_address=address)  # type: ignore[attr-defined]
            offset += p.numel()
    return flat


def zero3(model: nn.Module) -> torch.Tensor:
    """One sub-group's flat fp32 partition; each parameter gets ``ds_id`` and ``_z3_optimizer``, whose
    ``grad_position[param_id] = [sub-group, offset, numel]``. Parameters keep their data (no gather here)."""
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), requires_grad=True)
    z3 = SimpleNamespace(grad_position={}, fp32_partitioned_groups_flat=[flat], get_param_id=lambda p: p.ds_id)
    offset = 0
    for i, p in enumerate(params):
        p.ds_id, p._z3_optimizer = i, z3  # type: ignore[attr-defined]
        p.ds_tensor, p.ds_numel = p.data, p.numel()  # type: ignore[attr-defined]
        z3.grad_position[i] = [0, offset, p.numel()]
        offset += p.numel()
    return flat
