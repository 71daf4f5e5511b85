"""``memexporter top``: the ranks' memory in a terminal, refreshing, like ``top`` or ``nvitop``.

Each rank's ``/live.json`` (the live page's data: the same figures as ``/metrics``) is read every
``--interval`` seconds, all ranks at once, each with a deadline: a rank that does not answer is a
row that says so, and comes back when it answers again. One row per rank and device, worst first
(soonest OOM, then the highest share of the limit), below it the largest input that fits of each
rank and device that has one (a line each), and the module rows of the selected rank (up/down or j/k to select; q or Ctrl-C to quit). Given no URL it reads the local ranks: the
base port (``MEMEXPORTER_PORT``, else 9400) and the next ``LOCAL_WORLD_SIZE - 1`` ports (8 ranks
when that is unset). Needs ``rich`` (``pip install memexporter[top]``).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from memexporter.units import fmt_bytes, fmt_eta

DEFAULT_PORT, LOCAL_RANKS = 9400, 8
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local ranks: never through a proxy


def targets(urls: list[str], environ: dict[str, str]) -> list[str]:
    """``/live.json`` URLs: each URL given (a base, ``host:port`` or a ``/metrics`` URL), else the local ranks."""
    if not urls:
        base = int(environ.get("MEMEXPORTER_PORT") or DEFAULT_PORT)
        urls = [f"127.0.0.1:{base + r}" for r in range(int(environ.get("LOCAL_WORLD_SIZE") or LOCAL_RANKS))]
    full = (url if "://" in url else f"http://{url}" for url in urls)
    return [url.removesuffix("/").removesuffix("/metrics").removesuffix("/live.json") + "/live.json" for url in full]


@dataclass
class Rank:
    """One target's last answer, or why there is none."""

    url: str
    explicit: bool = True  # named by the user: listed even before it ever answers
    doc: dict[str, Any] | None = None
    error: str = ""
    seen: float = 0.0  # monotonic time of the last answer
    ended: float | None = None  # Unix time the job ended, as its exporter's helper says


@dataclass
class Board:
    """The targets and the selected row; ``lock`` guards the selection between drawing and the key thread."""

    ranks: list[Rank]
    selected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def fetch(rank: Rank, timeout: float) -> None:
    """Read ``rank.url`` (its ``/live.json``) within ``timeout`` seconds into ``rank``: the document and when
    it came, else ``rank.error`` saying why (the last document is kept). Never raises."""
    try:
        with _OPENER.open(rank.url, timeout=timeout) as resp:
            doc = json.loads(resp.read())
        if isinstance(end := doc.get("job_end"), dict):  # its helper serves the last figures, for a while
            rank.doc, rank.error, rank.ended = doc, f"ended: {end.get('how') or end.get('cause')}", end.get("at")
        else:
            rank.doc, rank.error, rank.seen, rank.ended = doc, "", time.monotonic(), None
    except Exception as exc:  # refused, timed out, not a memexporter: a marked row, never a traceback
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            rank.error = "not answering (connection refused)"
        elif isinstance(reason, TimeoutError) or "timed out" in str(reason):
            rank.error = f"timed out after {timeout:g} s"
        else:
            rank.error = f"unreachable ({reason})"


def rows(board: Board) -> list[tuple[tuple[float, float], list[str], int]]:
    """``(sort key, cells, rank index)`` per rank and device, worst first."""
    out = []
    for i, rank in enumerate(board.ranks):
        if rank.error:
            if rank.doc is not None:  # it answered before: a rank that went away, ended or hangs, marked
                if rank.ended is not None:
                    ago = f"{max(0.0, time.time() - rank.ended):.0f} s ago"
                else:
                    ago = f"no answer for {time.monotonic() - rank.seen:.0f} s"
                out.append(
                    ((-math.inf, 0.0), [f"rank {rank.doc['rank']}", "-", f"{rank.error}; {ago}", "", "", "", ""], i)
                )
            elif rank.explicit:
                out.append(
                    ((-math.inf, 0.0), [rank.url.removesuffix("/live.json"), "-", rank.error, "", "", "", ""], i)
                )
            continue  # a local port where no rank ever ran: nothing to show
        doc = rank.doc
        if doc is None:
            continue
        for dev in doc["devices"]:
            # What fills the limit: committed (an exporter from before it: used).
            held = dev.get("memory_committed_bytes", dev.get("memory_used_bytes")) or 0.0
            limit = dev.get("memory_limit_bytes")
            share = held / limit if limit else 0.0
            eta = dev.get("oom_eta_seconds")
            key = (eta if eta is not None else math.inf, -share)  # soonest OOM first, then the fullest
            bar = "#" * round(share * 20)
            out.append(
                (
                    key,
                    [
                        f"rank {doc['rank']}",
                        dev["device"],
                        f"|{bar:<20}| {share:4.0%} of {fmt_bytes(limit or 0)}",
                        fmt_bytes(dev.get("memory_peak_bytes") or 0),
                        fmt_bytes(dev.get("memory_baseline_bytes") or 0),
                        f"{fmt_bytes(dev.get('leak_rate_bytes_per_second') or 0)}/s",
                        fmt_eta(eta),
                    ],
                    i,
                )
            )
    return sorted(out, key=lambda r: r[0])


def input_lines(board: Board) -> list[tuple[str, bool]]:
    """``(line, warns)`` per rank and device whose largest input that fits is known (``/live.json``'s ``input``)."""
    with board.lock:
        docs = [r.doc for r in board.ranks if r.doc is not None and not r.error]
    return [
        (f"rank {doc['rank']} {dev['device']}: {dev['input']}", bool(dev.get("input_warn")))
        for doc in docs
        for dev in doc["devices"]
        if dev.get("input")
    ]


def render(board: Board) -> Any:
    """One frame for rich: the rank table (the selected row reversed) and, below it, the first ten module
    rows of the selected rank as ``/live.json`` lists them."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"memexporter top: {len(board.ranks)} target(s) · q quits, up/down selects", expand=True)
    for name in ("rank", "device", "committed of the limit", "step peak", "baseline", "leak", "OOM in"):
        table.add_column(name)
    with board.lock:
        listed = rows(board)
        reachable = [i for _, _, i in listed if board.ranks[i].doc is not None and not board.ranks[i].error]
        board.selected = min(board.selected, max(len(listed) - 1, 0))
        for n, (_, cells, _) in enumerate(listed):  # Text: a module or URL in [brackets] is no markup
            table.add_row(*(Text(c) for c in cells), style="reverse" if n == board.selected else None)
        pick = listed[board.selected][2] if listed else None
    parts: list[Any] = [table]
    parts += [Text(line, style="bold red" if warns else "") for line, warns in input_lines(board)]
    if pick is not None and pick in reachable and (doc := board.ranks[pick].doc):
        mods = Table(title=f"modules of rank {doc['rank']} (largest first)", expand=True)
        for name in ("module", "parameters", "gradients", "optimizer state", "activations"):
            mods.add_column(name)
        for m in doc["modules"][:10]:
            mods.add_row(
                Text(m["module"]),
                *(fmt_bytes(m.get(k) or 0) for k in ("parameters", "gradients", "optimizer_state", "activations")),
            )
        parts.append(mods)
    return Group(*parts)


def _keys(board: Board, stop: threading.Event) -> None:
    """q quits; up/down (or k/j) move the selection. Raw keys from a terminal only."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        while not stop.is_set():
            ch = os.read(fd, 3).decode(errors="ignore")
            with board.lock:
                if ch in ("q", "Q"):
                    stop.set()
                elif ch in ("j", "\x1b[B"):
                    board.selected += 1
                elif ch in ("k", "\x1b[A"):
                    board.selected = max(0, board.selected - 1)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run(args: argparse.Namespace) -> int:
    """``memexporter top``: with ``--svg``, one snapshot written as an SVG; with ``--once`` or when stdin is
    no terminal, one snapshot printed; else a live table refreshed every ``--interval`` seconds until q or
    Ctrl-C. Exit 0, 1 when the SVG cannot be written, 2 without ``rich``."""
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        print("memexporter top: needs rich: pip install 'memexporter[top]'", file=sys.stderr)
        return 2
    board = Board([Rank(url, explicit=bool(args.urls)) for url in targets(args.urls, dict(os.environ))])
    pool = ThreadPoolExecutor(max_workers=min(32, len(board.ranks)))

    def refresh() -> None:
        list(pool.map(lambda r: fetch(r, args.timeout), board.ranks))

    if args.svg:  # one snapshot as an SVG picture of the terminal, for an incident ticket (and the docs)
        refresh()
        recorder = Console(record=True, width=args.width, file=io.StringIO())
        recorder.print(render(board))
        try:
            recorder.save_svg(args.svg, title="memexporter top")
        except OSError as exc:
            from memexporter.cli import os_error

            print(f"memexporter top: {os_error(exc)}", file=sys.stderr)
            return 1
        print(f"memexporter top: wrote {args.svg}")
        return 0
    console = Console()
    if args.once or not sys.stdin.isatty():
        refresh()
        console.print(render(board))
        return 0
    stop = threading.Event()
    threading.Thread(target=_keys, args=(board, stop), daemon=True).start()
    try:
        with Live(render(board), console=console, screen=False, auto_refresh=False) as live:
            while not stop.is_set():
                refresh()
                live.update(render(board), refresh=True)
                stop.wait(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return 0


def add_arguments(top: argparse.ArgumentParser) -> None:
    """``memexporter top``'s options."""
    top.add_argument("urls", nargs="*", metavar="URL", help="ranks: host:port or their URL (default: the local ranks)")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default: 2)")
    top.add_argument("--timeout", type=float, default=1.5, help="seconds a rank may take to answer (default: 1.5)")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit (also when stdin is no terminal)")
    top.add_argument(
        "--svg", metavar="FILE", help="write one snapshot to FILE as an SVG picture of the terminal, and exit"
    )
    top.add_argument("--width", type=int, default=120, help="columns of the --svg picture (default: 120)")
