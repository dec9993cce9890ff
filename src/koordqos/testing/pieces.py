"""A byte stream cut where a test says, as a socket may deliver it (for feeding sans-I/O decoders)."""

from __future__ import annotations


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` in pieces, cut at each of `cuts` (taken modulo `len(data) + 1`, so any integers will do;
    empty pieces included)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces
