"""Where ``memexporter inspect`` gets its document: a running job's ``/debug/memory`` (with the
job's token), or a file that ``oom_dump_dir`` holds (a pre-mortem, or the ``.json`` of a CUDA
OOM dump). Every failure is a ``ReadError`` whose message is one line that says what to change.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from memexporter.diagnose import token as tokens
from memexporter.diagnose.fetch import MAX_BYTES, Answer, FetchError, get, one_line, too_large

DEFAULT_URL = "http://localhost:9400/debug/memory"
MAX_TOKEN_FILES = 4  # after a failed bind two live processes may name one port; stale pids are skipped
_REQUIRED = {
    "rank": (str, int),
    "pid": (int,),
    "step": (int,),
    "growth": (list,),
    "autograd": (list,),
    "census": (dict, type(None)),
}


class ReadError(RuntimeError):
    """One line: what went wrong, and what to do."""


def memory_url(url: str) -> str:
    """``host:port``, ``http://host:port`` or a ``/metrics`` URL, pointed at ``/debug/memory``."""
    given = url
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"memexporter inspect: not an http(s) URL or a dump file: {given!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise ValueError(f"memexporter inspect: bad port in {given!r}: give host:PORT, e.g. localhost:9400") from None
    path = parts.path if parts.path.rstrip("/").endswith("/debug/memory") else "/debug/memory"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def is_dump(target: str) -> bool:
    """A path (an existing file or folder, or one that names a ``.json``/``.pickle``) rather than a URL."""
    return "://" not in target and (
        os.path.exists(target) or target.endswith((".json", ".pickle")) or target.startswith(("/", "./", "../", "~"))
    )


def check(doc: Any, source: str) -> dict[str, Any]:
    """``doc`` when it has the fields ``inspect`` reads; ``ReadError`` naming the first one missing."""
    if not isinstance(doc, dict):
        raise ReadError(
            f"{source}: not a memexporter /debug/memory document (JSON {type(doc).__name__}, not an object)"
        )
    for key, types in _REQUIRED.items():
        if key not in doc:
            raise ReadError(f"{source}: not a memexporter /debug/memory document (no {key!r})")
        if not isinstance(doc[key], types) or isinstance(doc[key], bool):
            raise ReadError(
                f"{source}: not a memexporter /debug/memory document ({key!r} is a {type(doc[key]).__name__})"
            )
    return doc


def parse(body: bytes, source: str) -> dict[str, Any]:
    """The document in ``body`` (UTF-8 JSON), ``check``-ed; ``ReadError`` naming ``source`` when it is not JSON."""
    try:
        return check(json.loads(body.decode("utf-8")), source)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ReadError(
            f"{source}: not a memexporter /debug/memory document (not JSON: {one_line(str(exc), 80)})"
        ) from None


def read_dump(target: str) -> tuple[dict[str, Any], str]:
    """The document in a dump file (or the newest ``memexporter-*.json`` in a folder), and its path."""
    path = Path(os.path.expanduser(target))
    if path.is_dir():
        found = sorted(path.glob("memexporter-*.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise ReadError(
                f"{path}: no memexporter-*.json in this folder (the pre-mortems and OOM dumps of oom_dump_dir)"
            )
        path = found[-1]
    if path.suffix == ".pickle":
        raise ReadError(
            f"{path} is the CUDA allocator snapshot: open it at https://pytorch.org/memory_viz; "
            f"inspect reads the .json written beside it ({path.with_suffix('.json').name})"
        )
    try:
        info = path.stat()
        if not path.is_file():
            raise ReadError(f"{path}: not a regular file")
        if info.st_size > MAX_BYTES:
            raise ReadError(f"{path}: {info.st_size >> 20} MiB, {too_large(MAX_BYTES)}")
        with path.open("rb") as f:
            body = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ReadError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse(body, str(path)), str(path)


def _local(host: str) -> bool:
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _candidates(url: str, given: str | None) -> list[tuple[str | None, str]]:
    """``(token, where it came from)`` to try in turn: the one given, else this host's token files
    for the port (a local URL only: a token never goes to another host unasked), else none."""
    if given:
        return [(tokens.checked(given, f"--token or {tokens.TOKEN_ENV}"), "the token given")]
    parts = urlsplit(url)
    if not _local(parts.hostname or ""):
        return [(None, "")]
    out: list[tuple[str | None, str]] = []
    for path in tokens.find(parts.port or (443 if parts.scheme == "https" else 80))[:MAX_TOKEN_FILES]:
        try:
            out.append((tokens.read(path), f"the token in {path}"))
        except (OSError, ValueError):
            continue
    return out or [(None, "")]


def _refused(url: str, answer: Answer, tried: str, port: int | None) -> str:
    said = one_line(answer.body.decode("utf-8", "replace").split("\n", 1)[0], 160)
    if answer.status == 404:
        return f"{url}: 404, the job serves no debug endpoints. Start it with debug=True (or MEMEXPORTER_DEBUG=1)"
    if answer.status == 403 and "www-authenticate" in answer.headers:
        if tried:
            return f"{url}: 403, the job refused {tried}: is that the job's own token?"
        where = " or ".join(str(d) for d in tokens.runtime_dirs())
        return (
            f"{url}: 403, the job wants its debug token and no token file for port {port} was found in {where}: "
            f"run inspect on the job's node as the job's user, or give it with --token or {tokens.TOKEN_ENV}"
        )
    if answer.status == 403:
        return (
            f"{url}: 403, the debug endpoints answer loopback clients only. Run inspect on the job's node, "
            "or start the job with debug_allow=<your network>"
        )
    if 300 <= answer.status < 400:
        return f"{url}: HTTP {answer.status}, a redirect to {one_line(answer.headers.get('location', '?'), 80)}: inspect follows none"
    return f"{url}: HTTP {answer.status} {one_line(answer.reason, 40)}" + (f": {said}" if said else "")


def _busy_for(answer: Answer) -> float | None:
    """Seconds a 429 asks to wait (``Retry-After``), or None for any other answer."""
    if answer.status != 429:
        return None
    try:
        return max(0.1, min(float(answer.headers.get("retry-after", "1")), 60.0))
    except ValueError:
        return 1.0


def _get(url: str, top: int, token: str | None, deadline: float, timeout: float) -> Answer:
    """One answer; a 429 (someone else is reading too) is waited out while the deadline allows."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ReadError(f"{url}: no complete answer within {timeout:g} s (--timeout)")
        try:
            answer = get(
                f"{url}?top={top}", {"Authorization": f"Bearer {token}"} if token else {}, left, budget=timeout
            )
        except FetchError as exc:
            if exc.unreachable:
                raise ReadError(
                    f"cannot reach {url} ({exc}): is the job running, and is this its "
                    "port? Each rank serves port + LOCAL_RANK"
                ) from None
            raise ReadError(f"{url}: {exc}") from None
        wait = _busy_for(answer)
        if wait is None or time.monotonic() + wait >= deadline:
            return answer
        time.sleep(wait)


def read_url(target: str, top: int, timeout: float, given_token: str | None) -> dict[str, Any]:
    """``/debug/memory`` of the job at ``target``, within ``timeout`` seconds in all."""
    url = memory_url(target)
    deadline = time.monotonic() + timeout
    try:
        candidates = _candidates(url, given_token)
    except ValueError as exc:
        raise ReadError(str(exc).removeprefix("memexporter: ")) from None
    answer, tried = None, ""
    for value, source in candidates:
        tried = source
        answer = _get(url, top, value, deadline, timeout)
        if not (answer.status == 403 and "www-authenticate" in answer.headers):
            break  # a token refused: try the next file, if any
    assert answer is not None  # candidates is never empty
    if answer.status != 200:
        raise ReadError(_refused(url, answer, tried, urlsplit(url).port))
    return parse(answer.body, url)
