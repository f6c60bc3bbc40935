"""A partition's buckets as they are stored: an open bucket still collecting events, a sealed
bucket's sketch entries, and the ``(row, slot, count)`` entry arrays both are made of.

An open bucket keeps every row of the partition at once: a dense ``(rows, STATS_LEN)`` bucket row
array (``bucket_row.py``), its sketch as ``(row, slot, count)`` parts in one slot space (latency at
``slot``, TTFT at ``n_slots + slot``, TPOT at ``2 * n_slots + slot``: one ``np.unique`` per apply
bins all three) and the CUDA error counts of the rows that had any. Sealing splits the sketch into
its three slot spaces (:func:`split_entries`), which is what the ring of a partition holds.

>>> a = np.array([[0, 0, 1], [5, 7, 5], [1, 2, 3]], dtype=np.int32)
>>> consolidate([a, a[:, :1]], 100).tolist()
[[0, 0, 1], [5, 7, 5], [2, 2, 3]]
>>> [part.tolist() for part in split_entries(np.array([[0, 0], [3, 12]], dtype=np.int32), 10)]
[[[0], [3]], [[0], [2]], [[], []]]
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.window.bucket_row import STATS_LEN

FloatArray = npt.NDArray[np.float64]
Entries = npt.NDArray[np.int32]  # (3, k): row, slot, count; sorted by (row, slot), pairs unique
EMPTY_ENTRIES: Entries = np.zeros((3, 0), dtype=np.int32)
EMPTY_ENTRIES.flags.writeable = False
_INT32_MAX = int(np.iinfo(np.int32).max)

# Merge an open bucket's sketch parts (one per apply that touched it) once this many piled up.
_MAX_OPEN_PARTS = 8
# Sketches per event, one slot space each in an open bucket: latency, TTFT, TPOT.
N_SKETCHES = 3


# unique_codes counts every possible code (np.bincount) rather than sorting the codes (np.unique)
# while there are at most this many possible codes per code given: a count per possible value and a
# scan of them are each much cheaper per element than a sort's passes
_DENSE_CODES_PER_VALUE = 8


def unique_codes(codes: npt.NDArray[np.int64], *, inverse: bool = False, counts: bool = False,
                 ) -> tuple[npt.NDArray[Any], npt.NDArray[np.intp]]:
    """``np.unique(codes, return_inverse=inverse, return_counts=counts)`` of non-negative codes: the
    sorted distinct codes and either each code's index among them or each distinct code's count, the
    same arrays either way; by a count of every possible code where the codes span a range small next
    to their number (a group per key and bucket, a sketch slot per group), by a sort otherwise.

    >>> codes = np.array([7, 2, 7, 5], dtype=np.int64)
    >>> [a.tolist() for a in unique_codes(codes, inverse=True)], [a.tolist() for a in unique_codes(codes, counts=True)]
    ([[2, 5, 7], [2, 0, 2, 1]], [[2, 5, 7], [1, 1, 2]])
    """
    if inverse == counts:
        raise ValueError("unique_codes: ask for the inverse or the counts")
    bound = int(codes.max()) + 1 if codes.size else 0
    if not codes.size or bound > _DENSE_CODES_PER_VALUE * codes.size:
        # a sort of 32-bit integers moves half the bytes of one of 64-bit integers
        narrow = codes.astype(np.int32) if bound <= _INT32_MAX else codes
        if inverse:
            distinct, per = np.unique(narrow, return_inverse=True)
        else:
            distinct, per = np.unique(narrow, return_counts=True)
        return distinct.astype(np.int64, copy=False), per
    tally = np.bincount(codes, minlength=bound)
    present = np.flatnonzero(tally)
    distinct = present.astype(np.int64, copy=False)
    if counts:
        return distinct, tally[present]
    rank = np.zeros(bound, dtype=np.intp)
    rank[present] = np.arange(present.size)
    return distinct, rank[codes]


def consolidate(parts: list[Entries], n_codes: int) -> Entries:
    """Sum several ``(row, slot, count)`` arrays into one with unique pairs, sorted by (row, slot)."""
    parts = [p for p in parts if p.shape[1]]
    if not parts:
        return EMPTY_ENTRIES
    both = np.concatenate(parts, axis=1)
    code = both[0].astype(np.int64) * n_codes + both[1]
    pairs, where = unique_codes(code, inverse=True)
    counts = np.bincount(where, weights=both[2], minlength=pairs.size)
    if counts.size and counts.max() > _INT32_MAX:
        raise OverflowError("sketch count exceeds int32")
    return np.stack([pairs // n_codes, pairs % n_codes, counts.astype(np.int64)]).astype(np.int32)


class OpenBucket:
    """A bucket still collecting events, for every row of the partition at once."""

    __slots__ = ("stats", "parts", "cuda_errors")

    def __init__(self, capacity: int) -> None:
        self.stats: FloatArray = np.zeros((capacity, STATS_LEN))
        self.parts: list[Entries] = []  # sketch entries, one part per apply (pairs unique within a part)
        self.cuda_errors: dict[int, Counter[str]] = {}  # row -> cuda_error value -> count

    def add_entries(self, entries: Entries, n_codes: int) -> None:
        self.parts.append(entries)
        if len(self.parts) >= _MAX_OPEN_PARTS:
            self.sketch(n_codes)

    def sketch(self, n_codes: int) -> Entries:
        """The merged sketch entries; kept as the only part (so asking twice is free)."""
        if len(self.parts) != 1:
            self.parts = [consolidate(self.parts, n_codes)]
        return self.parts[0]


class Sealed(NamedTuple):
    """A sealed bucket's sketch entries, latency, TTFT and TPOT apart (each in its own slot space)."""

    latency: Entries
    ttft: Entries
    tpot: Entries = EMPTY_ENTRIES


EMPTY_SEALED = Sealed(EMPTY_ENTRIES, EMPTY_ENTRIES, EMPTY_ENTRIES)


def split_entries(entries: Entries, n_slots: int) -> Sealed:
    """Combined-slot entries (TTFT at ``n_slots + slot``, TPOT at ``2 * n_slots + slot``) as a
    :class:`Sealed` triple. Entries sorted by (row, combined slot) stay sorted by (row, slot)."""
    slots = entries[1]
    is_latency = slots < n_slots  # comparisons, not slots // n_slots: this runs on every step
    if is_latency.all():
        return Sealed(entries, EMPTY_ENTRIES, EMPTY_ENTRIES)
    is_tpot = slots >= 2 * n_slots
    ttft = entries[:, ~(is_latency | is_tpot)]
    ttft[1] -= n_slots
    tpot = entries[:, is_tpot]
    tpot[1] -= 2 * n_slots
    return Sealed(entries[:, is_latency], ttft, tpot)
