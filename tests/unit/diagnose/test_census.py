"""The tensor census on real CPU tensors: kinds, each storage once, views, new-tensor samples.

The census sees every tensor of the test process, so each test looks only at groups with shapes
no other test uses."""

from __future__ import annotations

import torch
from torch import nn

from memexporter.diagnose import census
from memexporter.diagnose.census import Census, Group


def groups_with(c: Census, *shapes: tuple[int, ...]) -> dict[tuple[tuple[int, ...], str], Group]:
    return {(g.shape, g.kind): g for g in c.groups if g.shape in shapes}


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(113, 17)
        self.inner = nn.Linear(17, 19)
        self.head = nn.Linear(17, 113, bias=False)
        self.head.weight = self.embed.weight  # one storage, two modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(self.embed(x))[..., :17])


def test_kinds_each_storage_once_and_exact_bytes() -> None:
    model = Tied()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 113, (2, 5))).sum().backward()
    opt.step()
    c = census.take(7, None).census
    got = groups_with(c, (113, 17), (19, 17), (19,))
    f32 = 4
    # The tied weight is one parameter storage, not two; its gradient and AdamW's two moments too.
    assert got[((113, 17), "parameter")].count == 1
    assert got[((113, 17), "parameter")].bytes == 113 * 17 * f32
    assert got[((113, 17), "gradient")].bytes == 113 * 17 * f32
    assert got[((113, 17), "optimizer_state")].count == 2
    assert got[((113, 17), "optimizer_state")].bytes == 2 * 113 * 17 * f32
    assert got[((19, 17), "parameter")].bytes == 19 * 17 * f32
    assert got[((19,), "optimizer_state")].count == 2
    assert c.step == 7 and c.storages >= 10 and c.bytes >= sum(g.bytes for g in got.values())
    kinds = {(d, k) for d, k, _ in c.by_kind}
    assert {("cpu", "parameter"), ("cpu", "gradient"), ("cpu", "optimizer_state")} <= kinds


def test_a_view_keeps_its_base_and_the_census_reports_the_base() -> None:
    big = torch.ones(31, 1009)
    view = big[3]  # the view holds its base (view._base): all 31 rows stay alive
    del big
    got = groups_with(census.take(1, None).census, (1009,), (31, 1009))
    assert list(got) == [((31, 1009), "other")]
    assert (got[((31, 1009), "other")].count, got[((31, 1009), "other")].bytes) == (1, 31 * 1009 * 4)
    del view


def test_a_tensor_smaller_than_its_storage_reports_the_storage_bytes() -> None:
    storage = torch.ones(29 * 1013).untyped_storage()
    small = torch.empty(0).set_(storage, 0, (1013,))  # no base tensor: only the storage is shared
    del storage
    row = groups_with(census.take(1, None).census, (1013,))[((1013,), "other")]
    assert (row.count, row.bytes, row.views) == (1, 29 * 1013 * 4, 1)
    del small


def test_views_and_aliases_of_a_live_tensor_count_once_under_the_largest_shape() -> None:
    base = torch.zeros(37, 41)
    aliases = [base.view(41, 37), base[1:], base.t(), base]
    got = groups_with(census.take(1, None).census, (37, 41), (41, 37), (36, 41))
    assert list(got) == [((37, 41), "other")]
    assert (got[((37, 41), "other")].count, got[((37, 41), "other")].bytes) == (1, 37 * 41 * 4)
    del aliases


def test_samples_are_the_tensors_new_since_the_previous_census() -> None:
    kept = [torch.full((3, 43), float(i)) for i in range(3)]
    first = census.take(1, None)
    key = ("cpu", "float32", (3, 43), "other")
    assert len(first.samples[key]) == 3  # no previous census: any tensor will do
    kept.append(torch.full((3, 43), 9.0))
    second = census.take(2, first.keys)
    assert [t[0, 0].item() for t in second.samples[key]] == [9.0]
    assert second.census.counts()[key] == (4, 4 * 3 * 43 * 4)


def test_a_new_storage_at_a_freed_storage_address_is_still_new() -> None:
    # The allocator hands a freed address back (CI once named no holder because every new tensor of a
    # leaking group sat where a smaller, freed one had been). frombuffer pins the address here.
    buffer = bytearray(4 * 3 * 61)
    small = torch.frombuffer(buffer, dtype=torch.uint8, count=64)
    keys = census.take(1, None).keys  # the scan's samples would keep `small` alive
    del small
    grown = torch.frombuffer(buffer, dtype=torch.float32)
    second = census.take(2, keys)
    assert [t is grown for t in second.samples[("cpu", "float32", (183,), "other")]] == [True]


def test_tensors_with_a_grad_fn_are_handed_to_the_graph_check() -> None:
    w = torch.ones(47, requires_grad=True)
    out = (w * 2).sum()
    scan = census.take(1, None)
    assert any(t is out for t in scan.graph_roots)
    assert not any(t is w for t in scan.graph_roots)
