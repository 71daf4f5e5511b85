"""A Prometheus TSDB block written directly from series models: hours of history for thousands of targets.

``promtool tsdb create-blocks-from openmetrics`` parses one text line per sample (about 340,000 samples
a second here): six hours of 1,024 ranks at 15 s is 566 million samples, half an hour and 80 GB of text.
Most of those series are constant (module rows, info rows, limits) or share one shape across ranks
(the step counter), so their chunks are built once and shared: a block's index may point any number
of series at the same chunk. Only what differs is encoded: XOR chunks as Prometheus' ``xorAppender``
writes them (``tsdb_chunks.py``), the index in format v2 (``tsdb/docs/format/index.md``), chunk
segments (``chunks.md``) and ``meta.json``. ``promtool tsdb dump`` reads them back in the unit test.

A series is its sorted label pairs and a ``Model``: anything hashable with ``at(t)`` (value at Unix
second ``t``) and ``constant(t0, t1)`` (its value if it holds still over ``[t0, t1]``, else None).
Equal models share chunks.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from tests.support.tsdb_chunks import constant_chunk, crc32c, f64_bits, uvarint, varint, xor_chunk

SAMPLES_PER_CHUNK = 120  # what the head cuts at (tsdb/head_append.go samplesPerChunk)
SEGMENT_BYTES = 512 << 20  # the chunk segment size promtool and compaction use
Labels = tuple[tuple[str, str], ...]


class Model(Hashable, Protocol):
    def at(self, t: float) -> float: ...

    def constant(self, t0: float, t1: float) -> float | None: ...


def ulid(ms: int) -> str:
    """A ULID (the block's name): 48 bits of milliseconds and 80 random bits, Crockford base32."""
    n = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    return "".join(alphabet[(n >> (5 * i)) & 31] for i in reversed(range(26)))


class _Chunks:
    """Chunk segment files (``chunks/000001``...); a ref is ``segment index << 32 | offset``."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.segments = folder, [bytearray()]
        self._start(self.segments[0])

    @staticmethod
    def _start(seg: bytearray) -> None:
        seg += struct.pack(">IB3x", 0x85BD40DD, 1)

    def add(self, data: bytes) -> int:
        seg = self.segments[-1]
        # len counts the data only; encoding 1 is XOR; the CRC covers the encoding byte and the data.
        record = uvarint(len(data)) + b"\x01" + data + struct.pack(">I", crc32c(b"\x01" + data))
        if len(seg) + len(record) > SEGMENT_BYTES:
            seg = bytearray()
            self._start(seg)
            self.segments.append(seg)
        ref = (len(self.segments) - 1) << 32 | len(seg)
        seg += record
        return ref

    def close(self) -> None:
        for i, seg in enumerate(self.segments):
            (self.folder / f"{i + 1:06d}").write_bytes(seg)


def _section(body: bytes | bytearray) -> bytes:
    """``len <4b>`` + body + ``CRC32 <4b>`` of the body: the shape of most index sections."""
    return struct.pack(">I", len(body)) + bytes(body) + struct.pack(">I", crc32c(body))


def _string(text: str) -> bytes:
    raw = text.encode()
    return uvarint(len(raw)) + raw


class _Index:
    """The index file (format v2): symbols, then series in label order, then the tables."""

    def __init__(self, symbols: Iterable[str]) -> None:
        self.symbols = sorted(symbols)
        self.sym = {s: i for i, s in enumerate(self.symbols)}
        self.buf = bytearray(struct.pack(">IB", 0xBAAAD700, 2))
        self.toc = [len(self.buf)]
        self.buf += _section(struct.pack(">I", len(self.symbols)) + b"".join(_string(s) for s in self.symbols))
        self.toc.append(len(self.buf))
        self.postings: dict[tuple[str, str], list[int]] = {}
        self.every: list[int] = []

    def _pad(self, align: int) -> None:
        self.buf += bytes(-len(self.buf) % align)

    def add(self, labels: Labels, metas: bytes, chunk_count: int) -> None:
        """One series (added in label order): 16-byte aligned, its id its offset / 16."""
        self._pad(16)
        ref = len(self.buf) // 16
        self.every.append(ref)
        body = uvarint(len(labels)) + b"".join(uvarint(self.sym[n]) + uvarint(self.sym[v]) for n, v in labels)
        body += uvarint(chunk_count) + metas
        self.buf += uvarint(len(body)) + body + struct.pack(">I", crc32c(body))
        for pair in labels:
            self.postings.setdefault(pair, []).append(ref)

    def finish(self) -> bytes:
        """Label indices, postings (the all-series list first, keyed ``("", "")``), their offset
        tables and the table of contents."""
        keys = sorted(self.postings)
        self.toc.append(len(self.buf))
        values: dict[str, list[int]] = {}
        for n, v in keys:
            values.setdefault(n, []).append(self.sym[v])
        label_offsets = []
        for label, refs in values.items():  # one label index per name: no longer read, still written
            self._pad(4)
            label_offsets.append((label, len(self.buf)))
            self.buf += _section(struct.pack(f">II{len(refs)}I", 1, len(refs), *refs))
        self.toc.append(len(self.buf))
        offsets = []
        for key, refs in [(("", ""), self.every)] + [(k, self.postings[k]) for k in keys]:
            self._pad(4)
            offsets.append((key, len(self.buf)))
            self.buf += _section(struct.pack(f">I{len(refs)}I", len(refs), *refs))
        self.toc.insert(3, len(self.buf))
        self.buf += _section(
            struct.pack(">I", len(label_offsets))
            + b"".join(b"\x01" + _string(n) + uvarint(off) for n, off in label_offsets)
        )
        self.toc.append(len(self.buf))
        self.buf += _section(
            struct.pack(">I", len(offsets))
            + b"".join(b"\x02" + _string(n) + _string(v) + uvarint(off) for (n, v), off in offsets)
        )
        toc = struct.pack(">6Q", *self.toc)
        return bytes(self.buf + toc + struct.pack(">I", crc32c(toc)))


def write_block(parent: Path, series: Iterable[tuple[Labels, Model]], ts: Sequence[int]) -> Path:
    """Write one block with a sample of every series at each of the timestamps ``ts`` (ms, increasing)
    into ``parent/<ULID>/``; returns that folder. Labels must include ``__name__``; sorted here."""
    spans = [(a, min(a + SAMPLES_PER_CHUNK, len(ts))) for a in range(0, len(ts), SAMPLES_PER_CHUNK)]
    # A span at a fixed step takes the constant-chunk shortcut; any other goes through the encoder.
    steps = [
        ts[a + 1] - ts[a]
        if b - a > 1 and all(ts[i + 1] - ts[i] == ts[a + 1] - ts[a] for i in range(a, b - 1))
        else None
        for a, b in spans
    ]
    name = ulid(int(time.time() * 1000))
    folder = parent / name
    (folder / "chunks").mkdir(parents=True)
    chunks, cache = _Chunks(folder / "chunks"), dict[Hashable, int]()
    entries = sorted(((tuple(sorted(labels)), model) for labels, model in series), key=lambda e: e[0])
    index = _Index({s for labels, _ in entries for pair in labels for s in pair})
    for labels, model in entries:
        metas, last_t, last_ref = bytearray(), 0, 0
        for ci, (a, b) in enumerate(spans):
            still = model.constant(ts[a] / 1000, ts[b - 1] / 1000)
            key: Hashable = ("c", f64_bits(still), ci) if still is not None else (model, ci)
            cref = cache.get(key)
            if cref is None:
                step = steps[ci]
                data = (
                    constant_chunk(ts[a], step, b - a, still)
                    if still is not None and step is not None
                    else xor_chunk(ts[a:b], [model.at(t / 1000) for t in ts[a:b]])
                )
                cref = cache[key] = chunks.add(data)
            # The first chunk's times and ref in full, the others as deltas to the previous one.
            if ci == 0:
                metas += varint(ts[a]) + uvarint(ts[b - 1] - ts[a]) + uvarint(cref)
            else:
                metas += uvarint(ts[a] - last_t) + uvarint(ts[b - 1] - ts[a]) + varint(cref - last_ref)
            last_t, last_ref = ts[b - 1], cref
        index.add(labels, bytes(metas), len(spans))
    chunks.close()
    (folder / "index").write_bytes(index.finish())
    meta = {
        "ulid": name,
        "minTime": ts[0],
        "maxTime": ts[-1] + 1,
        "stats": {
            "numSamples": len(ts) * len(entries),
            "numSeries": len(entries),
            "numChunks": len(spans) * len(entries),
        },
        "compaction": {"level": 1, "sources": [name]},
        "version": 1,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return folder
