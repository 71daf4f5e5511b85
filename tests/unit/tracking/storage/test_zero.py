"""DeepSpeed's fragment map read back (memexporter/tracking/storage/zero.py), over stand-ins of
DeepSpeed's marks: rows own their fragments' elements, padding and scalar state go to the root, and
marks that are not as 0.19 lays them out raise ``Unsupported`` (never anything else)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from memexporter.tracking.storage import zero
from memexporter.tracking.storage.deepspeed import Unsupported
from tests.support.deepspeed_standins import zero3, zero12


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))


def rows_of(net: nn.Module) -> list[tuple[torch.Tensor, int]]:
    return [(p, 1 if i < 2 else 2) for i, p in enumerate(net.parameters())]  # row 1: net[0], row 2: net[2]


def test_no_marks_no_map() -> None:
    assert zero.build(rows_of(model())) is None


@pytest.mark.parametrize("layout", [zero12, zero3])
def test_each_row_owns_its_fragments_and_the_root_the_rest(layout: object) -> None:
    net = model()
    flat = layout(net)  # type: ignore[operator]
    m = zero.build(rows_of(net))
    assert m is not None and set(m.shares) == {id(flat)}
    share = m.shares[id(flat)]
    assert share.rows == ((1, 30), (2, 14)) and share.elements == flat.numel()
    flat.grad = torch.ones_like(flat)
    state = {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
    c = zero.count(share, flat, state)
    pad = flat.numel() - 44
    assert dict(c.gradient) == {1: 120, 2: 56, 0: 4 * pad}
    assert dict(c.optimizer_state) == {1: 360, 2: 168, 0: 12 * pad + 4}  # master + 2 states; step in the root
    assert sum(n for _, n in c.optimizer_state) == sum(t.numel() * t.element_size() for t in (flat, *state.values()))
    assert (c.gradient_device, c.state_device) == ("cpu", "cpu")


def test_a_parameter_with_no_element_on_this_rank_has_no_fragment() -> None:
    net = model()
    flat = zero12(net)
    net[2].bias._hp_mapping = None  # type: ignore[union-attr]
    m = zero.build(rows_of(net))
    assert m is not None and m.shares[id(flat)].rows == ((1, 30), (2, 12))


def test_a_rebuild_changes_the_fingerprint() -> None:
    net = model()
    zero12(net)
    params = list(net.parameters())
    before = zero.fingerprint(params)
    zero12(net)  # DeepSpeed re-links its fragments (a checkpoint load, reload_states)
    assert zero.fingerprint(params) != before


@pytest.mark.parametrize(
    "break_it",
    [
        lambda net, flat: setattr(net[0].weight, "_hp_mapping", object()),
        lambda net, flat: setattr(net[0].weight._hp_mapping, "hp_fragment_address", SimpleNamespace(numel=999)),
    ],
    ids=["no_fragment", "more_than_the_partition"],
)
def test_marks_not_as_expected_raise_unsupported(break_it: object) -> None:
    net = model()
    flat = zero12(net)
    break_it(net, flat)  # type: ignore[operator]
    with pytest.raises(Unsupported):
        zero.build(rows_of(net))


def test_zero3_frozen_parameters_are_left_out_and_a_missing_map_is_unsupported() -> None:
    net = model()
    zero3(net)
    z3 = net[0].weight._z3_optimizer  # type: ignore[union-attr]
    del z3.grad_position[3]  # net[2].bias
    net[2].bias.requires_grad_(False)  # type: ignore[union-attr]
    m = zero.build(rows_of(net))
    assert m is not None and next(iter(m.shares.values())).rows == ((1, 30), (2, 12))
    net[2].bias.requires_grad_(True)  # type: ignore[union-attr]
    with pytest.raises(Unsupported, match="grad_position"):
        zero.build(rows_of(net))
    del z3.grad_position
    with pytest.raises(Unsupported, match="grad_position"):
        zero.build(rows_of(net))
