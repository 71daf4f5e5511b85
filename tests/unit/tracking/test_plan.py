"""The row plan (tracking/plan.py) on real modules: wrappers are transparent, a container at the
depth cut hooks its children with its own row, a compiled submodule is one row."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from memexporter.tracking.modules import track
from memexporter.tracking.plan import Plan, unwrap
from tests.support.models import Block, Deep, row, totals


class Wrapped(nn.Module):
    """Blocks behind the wrappers frameworks put in module paths."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([checkpoint_wrapper(Block(16)), torch.compile(Block(16)), Block(16)])
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_wrapper_parts_never_show_in_a_row_name_or_spend_depth() -> None:
    plan = Plan(Wrapped(), depth=3)
    names = plan.layout("").names
    assert not [n for n in names if "_checkpoint_wrapped_module" in n or "_orig_mod" in n], names
    # The checkpointed block's children are rows at depth 3, as an unwrapped block's are.
    assert {"blocks.0.ln", "blocks.0.fc1", "blocks.2.fc1"} <= set(names)
    # The compiled block is a leaf row: its children would be traced, not hooked.
    assert "blocks.1" in names and not [n for n in names if n.startswith("blocks.1.")]


def test_a_compiled_or_ddp_root_is_unwrapped() -> None:
    inner = Deep(2)
    assert unwrap(torch.compile(inner)) == (inner, True)
    assert unwrap(inner) == (inner, False)


def test_a_modulelist_at_the_depth_cut_keeps_each_layers_parameters_and_activations_together() -> None:
    # depth 1: `blocks` (a ModuleList, never called) is the row of every block. Before, its
    # blocks' parameters went to `blocks` and their activations to the root.
    model = Deep(4)
    handle = track(model, depth=1)
    model(torch.randn(2, 5, 16))
    assert row(handle, "activation", "blocks") > 0
    assert row(handle, "parameter", "blocks") > 0
    # What the root's own forward saves (nothing: it only calls children) stays 0.
    assert row(handle, "activation", "(root)") == 0
    assert totals(handle)["activation"] > row(handle, "activation", "out")


def test_a_module_shared_in_two_places_belongs_to_its_first_path() -> None:
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    plan = Plan(model, depth=2)
    assert plan.layout("").names == ("(root)", "0", "1")
    assert [r for _, _, r in plan.params] == [1, 1]


def test_repeated_blocks_are_numbered_siblings_of_one_class_with_layers_of_their_own() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block(16) for _ in range(3))
            self.mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))  # layers, not blocks

    plan = Plan(Net(), depth=3)
    layout = plan.layout("")
    assert {layout.names[i] for i in plan.repeated} == {"blocks.0", "blocks.1", "blocks.2"}
    assert layout.repeated == plan.repeated and {layout.classes[i] for i in plan.repeated} == {"Block"}
    assert layout.classes[0] == "Net" and layout.classes[layout.names.index("mlp.0")] == "Linear"
