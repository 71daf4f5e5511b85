"""The Prometheus text exposition as the helper reshapes it, without the registry: line by line.

The job renders one body, the text format 0.0.4 (``prometheus_client.generate_latest``). The helper
derives the rest from it, so the job pays for one render a second whatever its scrapers ask for:

- ``only(text, names)``: the ``?name[]=a&name[]=b`` filter, prometheus_client's semantics (the samples
  whose name is listed, with their family's ``HELP`` and ``TYPE``; a family with none left goes).
- ``to_openmetrics(text)``: the same families in OpenMetrics 1.0, byte for byte what
  ``prometheus_client.openmetrics.exposition.generate_latest`` writes for our families (a test holds
  the two equal on the golden exposition): a counter's family is named without ``_total``, a gauge
  gets its ``# UNIT`` line from the spec table (``metrics.BY_NAME``: the text format has no units),
  ``"`` in a ``HELP`` is escaped, and ``# EOF`` ends it.
- ``append(text, more)``: families the helper adds (the job's end, ``serving/ending.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from memexporter.metrics import BY_NAME

EOF = "# EOF\n"
_OM_TYPES = {"untyped": "unknown"}


def _blocks(text: str) -> Iterator[list[str]]:
    """The families of ``text``: each its ``# HELP`` line, ``# TYPE`` line and samples."""
    block: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP ") and block:
            yield block
            block = []
        if line and line != EOF.strip():
            block.append(line)
    if block:
        yield block


def sample_name(line: str) -> str:
    """The metric name of a sample line (``name{labels} value`` or ``name value``)."""
    return line.split("{", 1)[0].split(" ", 1)[0]


def only(text: bytes, names: Iterable[str]) -> bytes:
    """``text`` with only the samples named (and their families' header lines)."""
    wanted = frozenset(names)
    out: list[str] = []
    for block in _blocks(text.decode()):
        samples = [line for line in block if not line.startswith("#") and sample_name(line) in wanted]
        if samples:
            out += [line for line in block if line.startswith("#")] + samples
    return "".join(line + "\n" for line in out).encode()


def to_openmetrics(text: bytes) -> bytes:
    """``text`` (the 0.0.4 format) as OpenMetrics 1.0."""
    out: list[str] = []
    for block in _blocks(text.decode()):
        name, kind, help_text, samples = "", "untyped", "", []
        for line in block:
            if line.startswith("# HELP "):
                name, _, help_text = line[7:].partition(" ")
            elif line.startswith("# TYPE "):
                kind = line[7:].partition(" ")[2]
            elif not line.startswith("#"):
                samples.append(line)
        family = name.removesuffix("_total") if kind == "counter" else name
        out.append(f"# HELP {family} {help_text.replace(chr(34), chr(92) + chr(34))}")
        out.append(f"# TYPE {family} {_OM_TYPES.get(kind, kind)}")
        spec = BY_NAME.get(name)
        if kind == "gauge" and spec is not None and spec.unit:
            out.append(f"# UNIT {family} {spec.unit}")
        out += samples
    return "".join(line + "\n" for line in out).encode() + EOF.encode()


def append(text: bytes, more: bytes) -> bytes:
    """``text`` and then ``more``, both in the text format (families of their own: no name shared)."""
    if text and not text.endswith(b"\n"):
        text += b"\n"
    return text + more
