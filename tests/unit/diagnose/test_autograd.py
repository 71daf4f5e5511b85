"""Graphs kept alive from step to step, told apart from the current step's graph."""

from __future__ import annotations

import torch
from torch import nn

from memexporter.diagnose.autograd import Graph, inspect_graphs
from memexporter.diagnose.census import take


def run(steps: int, keep: str) -> list[list[Graph]]:
    """A real training loop; at each boundary the census's graph roots go to the check."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[torch.Tensor] = []
    total: torch.Tensor | float = 0.0
    marks: frozenset[tuple[int, str]] = frozenset()
    seen = []
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if keep == "list":
            losses.append(loss)
        elif keep == "total":
            total = total + loss  # no .item(): every step's graph hangs off the next
        found, samples, marks = inspect_graphs(take(0, None).graph_roots, marks)
        seen.append([g for g in found if g.grad_fn in ("MeanBackward0", "AddBackward0")])
        samples.clear()
    return seen


def test_a_healthy_loop_keeps_no_graph_across_steps() -> None:
    assert run(4, keep="none") == [[], [], [], []]


def test_losses_kept_in_a_list_are_found_with_their_count() -> None:
    seen = run(4, keep="list")
    assert seen[0] == []
    (g,) = seen[-1]
    assert (g.device, g.dtype, g.shape, g.grad_fn) == ("cpu", "float32", (), "MeanBackward0")
    assert g.count == 3  # the three losses of earlier steps; this step's is not (yet) a survivor


def test_a_running_total_without_item_chains_the_graphs() -> None:
    seen = run(4, keep="total")
    assert seen[0] == []
    assert [g.grad_fn for g in seen[-1]] == ["AddBackward0"]
    assert seen[-1][0].nodes > seen[1][0].nodes  # the chain grows by one step's graph a step
