"""The memory cgroup of this process: its tightest limit and the usage in that cgroup.

cgroup v2 (``memory.max``, ``memory.current``) or v1 (``memory.limit_in_bytes``,
``memory.usage_in_bytes``), walking up the hierarchy for the tightest limit. A file that does not
parse (binary bytes, a truncated number) means "no cgroup limit known from it", said once per
file: never a failed read, so only that figure is lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memexporter.backends.base import LogOnce

_log = LogOnce()

# cgroup v1 reports "no limit" as a huge page-aligned number rather than "max".
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class CgroupMemory:
    """The tightest cgroup limit and the reclaim-adjusted usage in that cgroup, in bytes."""

    limit: int
    usage: int


def _read_text(path: Path) -> str | None:
    """The file as ASCII text; None when it cannot be read, or holds bytes no cgroup file has
    (said once per file: the limit it would give is unknown, nothing else is lost)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        _log.warning(
            f"cgroup:{path}",
            "memexporter: %s holds non-text bytes (%r...): no cgroup memory limit is known from it",
            path,
            data[:16],
        )
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    text = text.strip()
    if text in ("max", "-1"):  # no limit (v2; v1 as some kernels print it)
        return None
    if not text.isdigit():
        _log.warning(
            f"cgroup:{path}",
            "memexporter: %s does not hold a byte count (%r): no cgroup memory limit is known from it",
            path,
            text[:32],
        )
        return None
    value = int(text)
    return None if value >= _V1_UNLIMITED else value


def _inactive_file(stat: Path) -> int:
    # Page cache on the inactive list is reclaimed before the OOM killer acts; subtracting it
    # gives the "working set" that cAdvisor and the kubelet use for eviction.
    for line in (_read_text(stat) or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file") and value.strip().isdigit():
            return int(value)
    return 0


def read_cgroup(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> CgroupMemory | None:
    """The memory cgroup limit of this process, or ``None`` when no limit is set or readable."""
    text = _read_text(proc_cgroup)
    if text is None:
        return None
    lines = text.splitlines()
    best: CgroupMemory | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # cgroup v2 unified hierarchy
            base, limit_f, usage_f, stat_f = root, "memory.max", "memory.current", "memory.stat"
        elif "memory" in controllers.split(","):  # cgroup v1
            base, limit_f, usage_f, stat_f = (
                root / "memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "memory.stat",
            )
        else:
            continue
        # Inside a container the path in /proc/self/cgroup may not exist under the mount (the
        # namespace root is mounted at the root), so try the path and each ancestor, then the root.
        rel_path = Path(rel.lstrip("/"))
        for candidate in [base / rel_path, *(base / p for p in rel_path.parents)]:
            limit = _read_int(candidate / limit_f)
            usage = _read_int(candidate / usage_f)
            if limit is None or usage is None:
                continue
            usage = max(0, usage - _inactive_file(candidate / stat_f))
            if best is None or limit < best.limit:
                best = CgroupMemory(limit=limit, usage=usage)
    return best
