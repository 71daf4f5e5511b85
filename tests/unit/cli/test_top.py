"""``memexporter top``'s targets and row order (memexporter/cli/top.py), on answers shaped as /live.json's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from memexporter.cli.top import Board, Rank, rows, run, targets
from tests.support.ports import closed_port


def test_targets_default_to_the_local_ranks_and_take_any_url_form() -> None:
    assert targets([], {"LOCAL_WORLD_SIZE": "2"}) == [
        "http://127.0.0.1:9400/live.json",
        "http://127.0.0.1:9401/live.json",
    ]
    assert len(targets([], {"MEMEXPORTER_PORT": "9500"})) == 8 and targets([], {"MEMEXPORTER_PORT": "9500"})[
        0
    ].endswith(":9500/live.json")
    assert targets(["node1:9400", "https://node2:9400/metrics", "http://node3:9400/"], {}) == [
        "http://node1:9400/live.json",
        "https://node2:9400/live.json",
        "http://node3:9400/live.json",
    ]


def doc(rank: str, used: float, limit: float, eta: float | None) -> dict[str, Any]:
    return {
        "rank": rank,
        "devices": [
            {"device": "cuda:0", "memory_used_bytes": used, "memory_limit_bytes": limit, "oom_eta_seconds": eta}
        ],
        "modules": [],
    }


def test_rows_put_the_soonest_oom_first_then_the_fullest_and_mark_a_rank_gone() -> None:
    board = Board(
        [
            Rank("a", doc=doc("0", 10, 100, None)),
            Rank("b", doc=doc("1", 90, 100, None)),
            Rank("c", doc=doc("2", 20, 100, 3600.0)),
            Rank("d", doc=doc("3", 10, 100, None), error="timed out after 1.5 s"),
            Rank("e", explicit=False, error="not answering (connection refused)"),
        ]
    )
    listed = [cells[0] for _, cells, _ in rows(board)]
    assert listed == ["rank 3", "rank 2", "rank 1", "rank 0"]  # the silent rank, then the ETA, then by share
    gone = rows(board)[0][1]
    assert gone[2].startswith("timed out after 1.5 s; no answer for ")


def test_svg_into_a_folder_that_is_not_there_is_one_line_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("rich", reason="rich is not installed (the [top] extra has it)")
    args = argparse.Namespace(
        urls=[f"127.0.0.1:{closed_port()}"],
        timeout=0.5,
        interval=1.0,
        once=False,
        svg=str(tmp_path / "missing" / "top.svg"),
        width=80,
    )
    assert run(args) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"memexporter top: cannot write '{tmp_path / 'missing' / 'top.svg'}': No such file or directory"
    ]


def test_svg_writes_the_snapshot_with_the_rank_that_does_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("rich", reason="rich is not installed (the [top] extra has it)")
    port = closed_port()
    args = argparse.Namespace(
        urls=[f"127.0.0.1:{port}"], timeout=0.5, interval=1.0, once=False, svg=str(tmp_path / "top.svg"), width=100
    )
    assert run(args) == 0
    assert capsys.readouterr().out == f"memexporter top: wrote {tmp_path / 'top.svg'}\n"
    svg = (tmp_path / "top.svg").read_text()
    assert svg.startswith("<svg") and "not&#160;answering" in svg


def test_the_largest_input_that_fits_is_one_line_per_rank_and_device_red_when_it_warns() -> None:
    from rich.console import Console

    from memexporter.cli.top import input_lines, render

    fits = doc("0", 10, 100, None)
    fits["devices"][0].update(input="the largest input that fits: 9,000 elements; seen 1,280", input_warn=False)
    over = doc("1", 10, 100, None)
    line = "the largest input that fits: 2,668 elements (667 long at batch 4); seen 1,280; declared 4,096: will not fit"
    over["devices"][0].update(input=line, input_warn=True)
    board = Board([Rank("a", doc=fits), Rank("b", doc=over), Rank("c", doc=doc("2", 10, 100, None))])
    assert input_lines(board) == [
        ("rank 0 cuda:0: the largest input that fits: 9,000 elements; seen 1,280", False),
        (f"rank 1 cuda:0: {line}", True),
    ]
    console = Console(record=True, width=200)
    console.print(render(board))
    assert f"rank 1 cuda:0: {line}" in console.export_text()
