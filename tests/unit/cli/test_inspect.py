"""``memexporter inspect``'s tables from a ``/debug/memory`` document (``cli.inspect.render``): what fills
the limit, and the remedy for stranded memory, as an OOM dump of the H200's native job would carry them.
The CLI against a live job and dump files: tests/integration/test_inspect_cli.py."""

from __future__ import annotations

from typing import Any

from memexporter.cli.inspect import render

GiB = float(1 << 30)
ADVICE = (
    "cuda:0: 1.2 GiB (20% of the 6.0 GiB limit) is stranded in partly used segments of the native caching "
    "allocator, and growing; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would likely recover it"
)


def dump() -> dict[str, Any]:
    view = {
        "used_bytes": 4.8 * GiB,
        "committed_bytes": 6.0 * GiB,
        "stranded_bytes": 1.2 * GiB,
        "limit_bytes": 6.0 * GiB,
        "limit_source": "memory fraction 0.043",
        "utilisation": 1.0,
        "leak_bytes_per_step": 8.0 * (1 << 20),
        "leak_bytes_per_second": 240.0 * (1 << 20),
        "oom_eta_seconds": 0.0,
    }
    return {
        "rank": "0",
        "pid": 472,
        "step": 598,
        "census_every": 100,
        "next_census_step": 600,
        "census": None,
        "growth": [],
        "autograd": [],
        "oom": {"cuda:0": view},
        "advice": [{"device": "cuda:0", "recoverable_bytes": 1.2 * GiB, "text": ADVICE}],
    }


def test_the_advice_heads_the_text_and_the_oom_view_shows_what_fills_the_limit() -> None:
    lines = render(dump(), 5).splitlines()
    assert lines[1] == f"advice: {ADVICE}"
    header = next(line for line in lines if line.strip().startswith("device") and "committed" in line)
    row = lines[lines.index(header) + 1]
    assert row.split() == [
        "cuda:0",
        "4.8",
        "GiB",
        "6.0",
        "GiB",
        "6.0",
        "GiB",
        "(memory",
        "fraction",
        "0.043)",
        "100.0%",
        "8.0",
        "MiB",
        "240.0",
        "MiB/s",
        "0m00s",
    ]


def test_a_document_from_before_the_committed_figures_still_reads() -> None:
    doc = dump()
    del doc["advice"]
    for key in ("committed_bytes", "stranded_bytes", "limit_source"):
        del doc["oom"]["cuda:0"][key]
    text = render(doc, 5)
    assert "advice:" not in text and "4.8 GiB  4.8 GiB" in " ".join(text.split("\n"))


def test_the_largest_input_that_fits_is_one_line_beside_the_advice() -> None:
    doc = dump()
    line = "the largest input that fits: 2,668 elements (667 long at batch 4); seen 1,280; declared 4,096: will not fit"
    doc["input"] = {"largest_elements": 1280, "capacity": {"cuda:0": {"elements": 2668.0, "text": line}}}
    lines = render(doc, 5).splitlines()
    assert lines[1:3] == [f"advice: {ADVICE}", f"input: cuda:0: {line}"]
    doc["input"] = None  # no input measured (an exporter from before it, or no step yet): nothing said
    assert "input:" not in render(doc, 5)


LEVERS = [
    {
        "kind": "checkpointing",
        "device": "cuda:0",
        "action": "checkpoint blocks.* (4 x Block, 12.0 GiB saved for backward)",
        "freed_bytes": 11.2 * GiB,
        "estimate": True,
        "basis": "saved-for-backward bytes less inputs and one recompute",
        "capacity_elements": 5400.0,
        "text": "-",
    },
    {
        "kind": "precision",
        "device": "cuda:0",
        "action": "needs the per-module rows",
        "freed_bytes": None,
        "estimate": True,
        "basis": "track() the model to see this",
        "capacity_elements": None,
        "text": "-",
    },
]


def test_what_would_fit_leads_with_the_levers_largest_first() -> None:
    text = render({**dump(), "levers": LEVERS}, top=5)
    lines = text.splitlines()
    head = lines.index("What would fit (estimates from the job's own rows, largest first)")
    assert head < next(i for i, line in enumerate(lines) if line.startswith("Growing"))
    first, second = lines[head + 2], lines[head + 3]
    assert "checkpointing" in first and "~11.2 GiB" in first and "5,400" in first and "checkpoint blocks.*" in first
    assert "precision" in second and "track() the model to see this" in second
    assert "    checkpointing: saved-for-backward bytes less inputs and one recompute" in lines
    assert "What would fit" not in render(dump(), top=5)  # a document from before the levers
