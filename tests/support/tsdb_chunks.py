"""Prometheus TSDB chunk encoding in Python: CRC-32C, varints and XOR chunks, byte for byte.

``xor_chunk`` writes what Prometheus' ``xorAppender`` writes (``tsdb/chunkenc/xor.go`` and
``bstream.go``: Gorilla's delta-of-delta timestamps and XOR-ed values, big-end bits first);
``constant_chunk`` the same bytes for a value that holds still, without the loop. Used by
``tsdb_blocks.py``; ``promtool tsdb dump`` reads them back in ``tests/integration/harness/test_tsdb_blocks.py``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli), the checksum of every TSDB section; pure Python (~10 MB/s)."""
    crc, table = 0xFFFFFFFF, _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@functools.lru_cache(maxsize=1 << 16)  # the same deltas, refs and symbol numbers recur in every series
def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63) if n < 0 else n << 1)


class _Bits:
    """Prometheus' ``bstream``: bits big-end first; a whole-byte write that ends on a byte
    boundary leaves one empty byte behind, as ``writeByte`` does (kept for byte-identical chunks)."""

    def __init__(self) -> None:
        self.acc, self.n, self.byte_last = 0, 0, False

    def put(self, value: int, nbits: int) -> None:
        self.acc = (self.acc << nbits) | (value & ((1 << nbits) - 1))
        self.n += nbits
        self.byte_last = nbits >= 8 and nbits % 8 == 0

    def bytes(self) -> bytes:
        pad = -self.n % 8
        out = (self.acc << pad).to_bytes((self.n + pad) // 8, "big")
        return out + b"\x00" if self.byte_last and pad == 0 else out


_DOD_SIZES = ((0, 1, 0), (0b10, 2, 14), (0b110, 3, 17), (0b1110, 4, 20), (0b1111, 4, 64))


def f64_bits(v: float) -> int:
    """The IEEE 754 bits of ``v`` as an integer (Go's math.Float64bits)."""
    return int(struct.unpack(">Q", struct.pack(">d", v))[0])


def xor_chunk(ts: Sequence[int], vs: Sequence[float]) -> bytes:
    """An XOR chunk's data (``num_samples`` header included) for timestamps ``ts`` (ms) and ``vs``."""
    b = _Bits()
    for byte in varint(ts[0]):
        b.put(byte, 8)
    b.put(f64_bits(vs[0]), 64)
    prev_t, prev_v, delta, lead, trail = ts[0], f64_bits(vs[0]), 0, 0xFF, 0
    for i in range(1, len(ts)):
        t, v = ts[i], f64_bits(vs[i])
        if i == 1:
            delta = t - prev_t
            for byte in uvarint(delta):
                b.put(byte, 8)
        else:
            dod, delta = (t - prev_t) - delta, t - prev_t
            # A size code, then the delta of deltas in as few bits as fit (xor.go bitRange).
            for code, code_bits, bits in _DOD_SIZES:
                if bits == 0 and dod == 0:
                    b.put(0, 1)
                    break
                if bits and -((1 << (bits - 1)) - 1) <= dod <= 1 << (bits - 1):
                    b.put(code, code_bits)
                    b.put(dod, bits)
                    break
        x = v ^ prev_v
        if x == 0:
            b.put(0, 1)
        else:
            new_lead, new_trail = min(64 - x.bit_length(), 31), (x & -x).bit_length() - 1
            if lead != 0xFF and new_lead >= lead and new_trail >= trail:  # fits the last window
                b.put(0b10, 2)
                b.put(x >> trail, 64 - lead - trail)
            else:
                lead, trail = new_lead, new_trail
                sig = 64 - lead - trail
                b.put(0b11, 2)
                b.put(lead, 5)
                b.put(sig & 0x3F, 6)  # 64 significant bits are written as 0
                b.put(x >> trail, sig)
        prev_t, prev_v = t, v
    return struct.pack(">H", len(ts)) + b.bytes()


def constant_chunk(t0: int, step: int, n: int, v: float) -> bytes:
    """``xor_chunk`` of ``n`` >= 2 equal values at a fixed step, without the loop: after the second sample
    every sample is two zero bits (no change of step, no change of value)."""
    head = struct.pack(">H", n) + varint(t0) + struct.pack(">d", v)
    bits = 1 + 2 * (n - 2)
    return head + uvarint(step) + bytes((bits + 7) // 8)
