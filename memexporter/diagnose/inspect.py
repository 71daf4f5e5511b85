"""``memexporter inspect [URL]``: ``/debug/memory`` as tables, for a terminal on the node.

Growth first (what grows, how fast, and what holds it), then graphs kept across steps, the OOM
view, and the largest census groups. ``--json`` prints the document as served. Reads only the
JSON (no torch needed). Exit status: 0 shown, 1 when the endpoint cannot be read (with the reason
and the knob to change it), 2 for a bad URL.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from memexporter.diagnose.words import fmt_bytes, fmt_eta, fmt_group, fmt_rate

DEFAULT_URL = "http://localhost:9400/debug/memory"


def memory_url(url: str) -> str:
    """``host:port``, ``http://host:port`` or a ``/metrics`` URL, pointed at ``/debug/memory``."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"memexporter inspect: not an http(s) URL: {url!r}")
    path = parts.path if parts.path.rstrip("/").endswith("/debug/memory") else "/debug/memory"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def fetch(url: str, timeout: float) -> dict[str, Any]:
    """The JSON document; raises ``RuntimeError`` with a message that says what to do."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # http(s) only: memory_url() checked
            doc: dict[str, Any] = json.load(resp)
            return doc
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise RuntimeError(f"{url}: 404, the job serves no debug endpoints. Start it with debug=True "
                               "(or MEMEXPORTER_DEBUG=1)") from None
        if exc.code == 403:
            raise RuntimeError(f"{url}: 403, the debug endpoints answer loopback clients only. Run inspect on the "
                               "job's node, or start the job with debug_allow=<your network>") from None
        raise RuntimeError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeError(f"cannot reach {url} ({reason}): is the job running, and is this its port? "
                           "Each rank serves port + LOCAL_RANK") from None
    except ValueError as exc:
        raise RuntimeError(f"{url}: not a memexporter /debug/memory document ({exc})") from None


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            for line in [headers, *rows]]


def render(doc: dict[str, Any], top: int) -> str:
    """The document as text: header, growth, graphs, OOM view, census."""
    census = doc.get("census")
    lines = [f"rank {doc['rank']}, pid {doc['pid']}, step {doc['step']}"]
    if census is None:
        lines.append(f"no census yet: the first comes at step {doc['next_census_step']} (every {doc['census_every']} steps)")
    else:
        lines.append(f"census at step {census['step']} ({census.get('age_seconds', 0):.0f} s ago, took "
                     f"{census['duration_ms']:.0f} ms); next at step {doc['next_census_step']}")
    lines += ["", "Growing, fastest first"]
    rows = [[g["device"], fmt_group(g["dtype"], g["shape"]), g["kind"], str(g["count"]), fmt_rate(g["count_per_step"]),
             fmt_bytes(g["bytes_per_step"]), fmt_bytes(g["bytes"]), str(g["since_step"]),
             "; ".join(g["held_by"]) or "(no Python holder found)"] for g in doc["growth"]]
    lines += table(["device", "tensor", "kind", "count", "count/step", "bytes/step", "bytes", "since", "held by"], rows) \
        if rows else ["  nothing grows" + ("" if census else " (no census yet)")]
    if doc["autograd"]:
        lines += ["", "Autograd graphs kept alive from step to step (their saved tensors are not in the census)"]
        lines += table(["device", "tensor", "grad_fn", "count", "graph nodes", "held by"], [
            [g["device"], fmt_group(g["dtype"], g["shape"]), g["grad_fn"], str(g["count"]),
             f"{'>=' if g['graph_nodes_capped'] else ''}{g['graph_nodes']}", "; ".join(g["held_by"]) or "?"]
            for g in doc["autograd"]])
    oom = doc.get("oom", {})
    if oom and "error" not in oom:
        lines += ["", "OOM view"]
        lines += table(["device", "used", "limit", "use", "leak/step", "leak/s", "OOM ETA"], [
            [d, fmt_bytes(v["used_bytes"]), fmt_bytes(v["limit_bytes"]) if v["limit_bytes"] is not None else "unknown",
             f"{100 * v['utilisation']:.1f}%" if v["utilisation"] is not None else "-",
             fmt_bytes(v["leak_bytes_per_step"]), fmt_bytes(v["leak_bytes_per_second"]) + "/s",
             fmt_eta(v["oom_eta_seconds"])] for d, v in oom.items()])
    if census is not None:
        groups = census["groups"][:top]
        more = census["groups_left_out"] + len(census["groups"]) - len(groups)
        lines += ["", f"Census: {census['storages']} storages, {fmt_bytes(census['bytes'])} in {census['tensors']} "
                      f"tensors" + (f" (largest {len(groups)} groups; {more} more)" if more else "")]
        lines += table(["device", "tensor", "kind", "count", "bytes"], [
            [g["device"], fmt_group(g["dtype"], g["shape"]), g["kind"], str(g["count"]), fmt_bytes(g["bytes"])]
            for g in groups])
        kinds = ", ".join(f"{k['device']} {k['kind']} {fmt_bytes(k['bytes'])}" for k in census["by_kind"])
        lines += ["", f"By kind: {kinds}"]
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    """Add ``inspect`` to the ``memexporter`` subcommands."""
    p = sub.add_parser("inspect", help="print a running job's /debug/memory as tables (growth first)")
    p.add_argument("url", nargs="?", default=DEFAULT_URL, help=f"the job's address (default {DEFAULT_URL})")
    p.add_argument("--top", type=int, default=20, help="census groups to show (default 20)")
    p.add_argument("--json", action="store_true", help="print the JSON document as served")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the job (default 10)")


def run(args: argparse.Namespace) -> int:
    try:
        url = memory_url(args.url)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        doc = fetch(f"{url}?top={max(1, args.top)}", args.timeout)
    except RuntimeError as exc:
        print(f"memexporter inspect: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(render(doc, max(1, args.top)))
    return 0
