"""``memexporter inspect [URL | DUMP]``: ``/debug/memory`` as tables, for a terminal on the node.

Growth first (what grows, how fast, and what holds it), then graphs kept across steps, the OOM
view, and the largest census groups. ``--json`` prints the document as served. Reads a running
job (``reading.read_url``: the job's token found for a local URL, one deadline for the whole
request, at most 32 MiB) or a file from ``oom_dump_dir`` (``reading.read_dump``). Reads only
JSON (no torch needed). Exit status: 0 shown, 1 when the document cannot be read (one line: the
reason and what to change), 2 for a bad URL or option.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from memexporter.diagnose import token as tokens
from memexporter.diagnose.reading import DEFAULT_URL, ReadError, is_dump, memory_url, read_dump, read_url
from memexporter.diagnose.words import fmt_group, fmt_rate
from memexporter.units import fmt_bytes, fmt_eta

__all__ = ["DEFAULT_URL", "add_arguments", "memory_url", "render", "run"]


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [headers, *rows]
    ]


def what_would_fit(levers: list[dict[str, Any]]) -> list[str]:
    """The levers, largest first, each an estimate with its basis (``oom/levers.py``), as served."""
    if not levers:
        return []
    rows = [
        [
            v["device"],
            v["kind"],
            "track() the model to see this" if v["freed_bytes"] is None else "~" + fmt_bytes(v["freed_bytes"]),
            f"{int(v['capacity_elements']):,}" if v.get("capacity_elements") is not None else "-",
            v["action"],
        ]
        for v in levers
    ]
    head = ["device", "lever", "frees at the peak", "input that fits", "what to do"]
    basis = [f"    {v['kind']}: {v['basis']}" for v in levers if v["freed_bytes"] is not None]
    title = "What would fit (estimates from the job's own rows, largest first)"
    return ["", title, *table(head, rows), *(["  each an estimate, from:", *basis] if basis else [])]


def render(doc: dict[str, Any], top: int, dump: str | None = None) -> str:
    """The document as text: header, growth, graphs, OOM view, census. ``dump``: the file it came
    from (a pre-mortem or an OOM dump), whose time and reason head the text."""
    census = doc.get("census")
    lines = [f"rank {doc['rank']}, pid {doc['pid']}, step {doc['step']}"]
    if dump is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc["unix_time"])) if "unix_time" in doc else "?"
        lines[0] += f", written {when} to {os.path.basename(dump)}"
        if doc.get("reason"):
            lines.append(f"why: {doc['reason']}")
    lines += [f"advice: {a['text']}" for a in doc.get("advice", [])]
    lines += [f"input: {device}: {c['text']}" for device, c in ((doc.get("input") or {}).get("capacity") or {}).items()]
    ago = "before the dump" if dump is not None else "ago"
    if census is None:
        lines.append(
            f"no census yet: the first comes at step {doc['next_census_step']} (every {doc['census_every']} steps)"
        )
    else:
        lines.append(
            f"census at step {census['step']} ({census.get('age_seconds', 0):.0f} s {ago}, took "
            f"{census['duration_ms']:.0f} ms)" + ("" if dump else f"; next at step {doc['next_census_step']}")
        )
    lines += what_would_fit(doc.get("levers") or [])  # what to change, before what is growing
    lines += ["", "Growing, fastest first"]
    rows = [
        [
            g["device"],
            fmt_group(g["dtype"], g["shape"]),
            g["kind"],
            str(g["count"]),
            fmt_rate(g["count_per_step"]),
            fmt_bytes(g["bytes_per_step"]),
            fmt_bytes(g["bytes"]),
            str(g["since_step"]),
            "; ".join(g["held_by"]) or "(no Python holder found)",
        ]
        for g in doc["growth"]
    ]
    lines += (
        table(["device", "tensor", "kind", "count", "count/step", "bytes/step", "bytes", "since", "held by"], rows)
        if rows
        else ["  nothing grows" + ("" if census else " (no census yet)")]
    )
    if doc["autograd"]:
        lines += ["", "Autograd graphs kept alive from step to step (their saved tensors are not in the census)"]
        lines += table(
            ["device", "tensor", "grad_fn", "count", "graph nodes", "held by"],
            [
                [
                    g["device"],
                    fmt_group(g["dtype"], g["shape"]),
                    g["grad_fn"],
                    str(g["count"]),
                    f"{'>=' if g['graph_nodes_capped'] else ''}{g['graph_nodes']}",
                    "; ".join(g["held_by"]) or "?",
                ]
                for g in doc["autograd"]
            ],
        )
    oom = doc.get("oom", {})
    if oom and "error" not in oom:
        lines += ["", "OOM view"]
        lines += table(
            ["device", "used", "committed", "limit", "full", "leak/step", "leak/s", "OOM ETA"],
            [
                [
                    d,
                    fmt_bytes(v["used_bytes"]),
                    fmt_bytes(v.get("committed_bytes", v["used_bytes"])),
                    fmt_bytes(v["limit_bytes"]) + (f" ({v['limit_source']})" if v.get("limit_source") else "")
                    if v["limit_bytes"] is not None
                    else "unknown",
                    f"{100 * v['utilisation']:.1f}%" if v["utilisation"] is not None else "-",
                    fmt_bytes(v["leak_bytes_per_step"]),
                    fmt_bytes(v["leak_bytes_per_second"]) + "/s",
                    fmt_eta(v["oom_eta_seconds"]),
                ]
                for d, v in oom.items()
            ],
        )
    if census is not None:
        groups = census["groups"][:top]
        more = census["groups_left_out"] + len(census["groups"]) - len(groups)
        lines += [
            "",
            f"Census: {census['storages']} storages, {fmt_bytes(census['bytes'])} in {census['tensors']} "
            f"tensors" + (f" (largest {len(groups)} groups; {more} more)" if more else ""),
        ]
        lines += table(
            ["device", "tensor", "kind", "count", "bytes"],
            [
                [g["device"], fmt_group(g["dtype"], g["shape"]), g["kind"], str(g["count"]), fmt_bytes(g["bytes"])]
                for g in groups
            ],
        )
        kinds = ", ".join(f"{k['device']} {k['kind']} {fmt_bytes(k['bytes'])}" for k in census["by_kind"])
        lines += ["", f"By kind: {kinds}"]
    return "\n".join(lines)


def seconds(text: str) -> float:
    """``--timeout``: a finite number of seconds above 0."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return x


def top_count(text: str) -> int:
    """``--top``: 1 to 1000 census groups (what the endpoint serves at most)."""
    if not text.strip().isdecimal() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"must be an integer 1-1000, got {text!r}")
    return int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``memexporter inspect``'s options."""
    p.add_argument(
        "url",
        nargs="?",
        default=DEFAULT_URL,
        metavar="URL|DUMP",
        help=f"the job's address (default {DEFAULT_URL}), or a .json file (or the folder) of oom_dump_dir",
    )
    p.add_argument("--top", type=top_count, default=20, help="census groups to show (default 20)")
    p.add_argument("--json", action="store_true", help="print the JSON document as served")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        help="seconds for the whole request, from name lookup to the last byte (default 10)",
    )
    p.add_argument(
        "--token",
        default=None,
        help=f"the job's debug token (default: ${tokens.TOKEN_ENV}, else the "
        "job's token file, found for a local URL's port; one that starts with '-': --token=TOKEN)",
    )
    p.add_argument(
        "--print-token-file",
        action="store_true",
        help="print the path of the job's token file for the URL's port and exit (for curl)",
    )


def _token_file(url: str) -> int:
    parts = urlsplit(memory_url(url))
    local_port = parts.port or (443 if parts.scheme == "https" else 80)
    found = tokens.find(local_port)
    if not found:
        print(
            f"memexporter inspect: no token file of a running job for port {local_port} in "
            f"{' or '.join(str(d) for d in tokens.runtime_dirs())}",
            file=sys.stderr,
        )
        return 1
    print(found[0])
    return 0


def run(args: argparse.Namespace) -> int:
    """``memexporter inspect``: print the document at ``args.url`` (a job's ``/debug/memory`` or a dump file)
    as tables, or as JSON with ``--json``; ``--print-token-file`` prints the job's token file instead. Exit
    0 shown, 1 unreadable (or no token file), 2 a bad URL, 130 after Ctrl-C."""
    target = str(args.url)
    top = max(1, int(args.top))
    try:
        if getattr(args, "print_token_file", False):
            return _token_file(target)
        if is_dump(target):
            doc, dump = read_dump(target)
        else:
            given = getattr(args, "token", None) or os.environ.get(tokens.TOKEN_ENV) or None
            doc, dump = read_url(target, top, float(args.timeout), given), None
        text = json.dumps(doc, indent=1) if args.json else render(doc, top, dump)
    except ValueError as exc:  # a bad URL
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while waiting on a slow job: no traceback
        return 130
    except ReadError as exc:
        print(f"memexporter inspect: {exc}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, AttributeError, IndexError) as exc:  # parsed, but not the fields render() reads
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else f"{type(exc).__name__}"
        print(
            f"memexporter inspect: {dump or target}: not a memexporter /debug/memory document ({what})", file=sys.stderr
        )
        return 1
    print(text)
    return 0
