"""A mergeable relative-error quantile sketch (DDSketch-style log bins) in numpy.

Latency and TTFT quantiles come from a mergeable relative-error sketch (log buckets, <= 1 %
relative error at P50/P95/P99), so that a window step can *subtract* the expired bucket and
stage 2 can *add* replicas' sketches into a per-model one.

Why hand-written rather than the ``ddsketch`` package: ``ddsketch`` adds values one at a time
in Python (``sketch.add(v)``), a Python call per value on the hot path, and it has no
subtraction. Here a whole batch is binned with one vectorised ``np.log`` + ``np.unique``.

The layout is **fixed and global** for a given relative accuracy alpha: every sketch built
with the same :class:`LogBins` shares the same slots, so merging is plain addition of counts
and removing a bucket is plain subtraction.

* ``gamma = (1 + alpha) / (1 - alpha)``; log bin ``i`` holds values in ``(gamma**(i-1), gamma**i]``
  and answers ``2 * gamma**i / (gamma + 1)``, within ``alpha`` of every value in the bin.
* Slot 0 is the *zero bin*: values <= ``min_value`` (default 1e-3 ms), answered as 0.
* Values above ``max_value`` (default 1e8 ms, ~28 hours) are clamped into the top slot: the
  ``alpha`` guarantee holds for values in ``[min_value, max_value]`` only.

Rank definition (the one place it is chosen): the q-quantile of ``n`` values is the order
statistic ``x[floor(q * (n - 1))]`` (0-based), i.e. ``numpy.quantile(x, q, method="lower")``.
The sketch returns the representative value of the bin holding that order statistic, so the
result is within ``alpha`` (relative) of the exact ``method="lower"`` quantile.

Counts are kept either *dense* (an array over a contiguous slot range) or *sparse* (a ``(2, k)``
int32 array: row 0 the sorted slots, row 1 their counts); :class:`SketchTotal` is the dense,
add/subtract running total that a window keeps.

>>> import numpy as np
>>> bins = LogBins(0.01)
>>> values = np.array([0.0, 10.0, 100.0, 1000.0])
>>> sparse = bins.sparse_counts(values)
>>> sparse[1].tolist()
[1, 1, 1, 1]
>>> q = bins.quantile(sparse[1], [0.0, 0.5, 1.0], slots=sparse[0])
>>> [round(v, 1) for v in q]
[0.0, 10.1, 1002.4]
>>> total = SketchTotal()
>>> total.add(sparse); total.subtract(bins.sparse_counts(np.array([0.0])))
>>> int(total.count), total.offset == int(sparse[0, 1])
(3, True)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
SlotArray = npt.NDArray[np.int32]
CountArray = npt.NDArray[np.int32]
SparseCounts = npt.NDArray[np.int32]  # shape (2, k): row 0 sorted slots, row 1 counts (> 0)

EMPTY_SPARSE: SparseCounts = np.zeros((2, 0), dtype=np.int32)
EMPTY_SPARSE.flags.writeable = False
_INT32_MAX = int(np.iinfo(np.int32).max)


class LogBins:
    """The fixed log-bin layout for one relative accuracy: value <-> slot, and quantiles."""

    def __init__(self, relative_accuracy: float = 0.01, min_value: float = 1e-3, max_value: float = 1e8):
        if not 0.0 < relative_accuracy < 1.0:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy}")
        if not 0.0 < min_value < max_value:
            raise ValueError(f"need 0 < min_value < max_value, got {min_value}, {max_value}")
        self.relative_accuracy = relative_accuracy
        self.min_value = min_value
        self.max_value = max_value
        self.gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy)
        self._ln_gamma = math.log(self.gamma)
        # Log bin i maps to slot i - _offset; chosen so that any value > min_value lands in slot >= 1.
        self._offset = math.floor(math.log(min_value) / self._ln_gamma)
        self.n_slots = math.ceil(math.log(max_value) / self._ln_gamma) - self._offset + 1
        if self.n_slots > _INT32_MAX:
            raise ValueError("too many bins for int32 slots; use a coarser accuracy or range")
        self._top_slot = self.n_slots - 1
        self._scale = 2.0 / (self.gamma + 1.0)  # slot value = 2 gamma**i / (gamma + 1)
        # every slot's answer, computed once by one scalar expression and read by both the
        # per-sketch and the vectorised (per-row) quantiles, so they return bit-identical floats
        self.slot_values: FloatArray = np.array(
            [0.0] + [self._scale * math.exp((slot + self._offset) * self._ln_gamma)
                     for slot in range(1, self.n_slots)])
        self.slot_values.flags.writeable = False

    def index(self, values: npt.ArrayLike) -> SlotArray:
        """The slot of each value: 0 for values <= min_value, clamped to the top slot above max_value."""
        v = np.asarray(values, dtype=np.float64)
        slots = np.zeros(v.shape, dtype=np.int32)
        positive = v > self.min_value
        logs = np.log(np.minimum(v[positive], self.max_value)) / self._ln_gamma
        slots[positive] = np.clip(np.ceil(logs) - self._offset, 1, self._top_slot).astype(np.int32)
        return slots

    @overload
    def value(self, slot: int) -> float: ...
    @overload
    def value(self, slot: npt.NDArray[np.integer]) -> FloatArray: ...

    def value(self, slot: int | npt.NDArray[np.integer]) -> float | FloatArray:
        """The value a slot answers: ``2 * gamma**i / (gamma + 1)`` (DDSketch), 0 for the zero bin."""
        s = np.asarray(slot, dtype=np.float64)
        out = np.where(s == 0, 0.0, self._scale * np.exp((s + self._offset) * self._ln_gamma))
        return float(out) if out.ndim == 0 else out

    def sparse_counts(self, values: npt.ArrayLike) -> SparseCounts:
        """Bin a batch of values at once: a ``(2, k)`` array of sorted distinct slots and their counts."""
        slots, counts = np.unique(self.index(values), return_counts=True)
        return np.stack([slots.astype(np.int32), counts.astype(np.int32)])

    @overload
    def quantile(self, counts: npt.NDArray[np.integer], q: float,
                 slots: npt.NDArray[np.integer] | None = None) -> float | None: ...
    @overload
    def quantile(self, counts: npt.NDArray[np.integer], q: Sequence[float],
                 slots: npt.NDArray[np.integer] | None = None) -> list[float] | None: ...

    def quantile(
        self,
        counts: npt.NDArray[np.integer],
        q: float | Sequence[float],
        slots: npt.NDArray[np.integer] | None = None,
    ) -> float | list[float] | None:
        """Quantile(s) of a sketch; ``None`` when it is empty.

        ``counts[j]`` is the count of slot ``slots[j]`` (``slots`` ascending; default ``j`` itself,
        i.e. ``counts`` is a dense array over all slots). Rank: ``floor(q * (n - 1))``, the same
        as ``numpy.quantile(..., method="lower")``.
        """
        cumulative = np.cumsum(counts, dtype=np.int64)
        n = int(cumulative[-1]) if cumulative.size else 0
        if n == 0:
            return None
        qs = [float(q)] if isinstance(q, (int, float)) else [float(x) for x in q]
        if any(not 0.0 <= x <= 1.0 for x in qs):
            raise ValueError(f"quantiles must be in [0, 1], got {q}")
        # numpy's "lower" virtual index, verbatim: floor((n - 1) * q) in float64
        ranks = [math.floor((n - 1) * x) for x in qs]
        positions = np.searchsorted(cumulative, ranks, side="right")  # first slot whose cumsum > rank
        chosen = positions if slots is None else np.asarray(slots)[positions]
        answers: list[float] = self.slot_values[chosen].tolist()
        return answers[0] if isinstance(q, (int, float)) else answers

    def row_quantiles(self, counts: npt.NDArray[np.integer], offset: int, qs: Sequence[float]) -> FloatArray:
        """Quantiles of many sketches at once: row ``r`` of ``counts`` is a dense sketch over slots
        ``[offset, offset + counts.shape[1])``. Returns ``(rows, len(qs))``, NaN for an empty row.

        The same rank rule and answers as :meth:`quantile` (bit-identical), with one cumulative
        sum over the whole matrix and one binary search per row and quantile: the rows' cumulative
        counts, each shifted past the previous row's largest, form one sorted array.
        """
        rows, width = counts.shape
        out = np.full((rows, len(qs)), np.nan)
        if not rows or not width:
            return out
        if any(not 0.0 <= q <= 1.0 for q in qs):
            raise ValueError(f"quantiles must be in [0, 1], got {qs}")
        n = counts.sum(axis=1, dtype=np.int64)
        has = n > 0
        top = int(n.max()) + 1
        # the shifted cumulative counts stay below rows * top: 32-bit integers where that fits, half
        # the bytes of the (rows, width) passes below; the same integers either way
        wide: type[np.signedinteger[Any]] = np.int32 if rows * top <= _INT32_MAX else np.int64
        shift = np.arange(rows, dtype=np.int64) * top
        cumulative: npt.NDArray[np.signedinteger[Any]] = np.cumsum(counts, axis=1, dtype=wide)
        np.add(cumulative, shift.astype(wide)[:, None], out=cumulative)
        flat = cumulative.ravel()
        row_start = np.arange(rows, dtype=np.int64) * width
        n_minus_1 = (n - 1).astype(np.float64)
        for j, q in enumerate(qs):
            rank = np.floor(n_minus_1 * q).astype(np.int64)  # numpy's "lower": floor((n - 1) * q)
            # first slot whose cumulative count > rank, i.e. how many of the row's counts are <= rank
            # (the keys in the array's own integer type: another would convert the whole array)
            position = np.searchsorted(flat, (rank + shift).astype(wide), side="right") - row_start
            out[:, j] = self.slot_values[np.clip(position, 0, width - 1) + offset]
        out[~has] = np.nan
        return out


@functools.lru_cache(maxsize=8)
def log_bins(relative_accuracy: float) -> LogBins:
    """The shared :class:`LogBins` for an accuracy (with the default value range), built once."""
    return LogBins(relative_accuracy)


def add_sparse(parts: Sequence[SparseCounts]) -> SparseCounts:
    """Sum several sparse count arrays into one (slots sorted, zero counts dropped)."""
    parts = [p for p in parts if p.shape[1]]
    if not parts:
        return EMPTY_SPARSE
    if len(parts) == 1:
        return parts[0]
    stacked = np.concatenate(parts, axis=1)
    # a dense bincount over the (few hundred) slots beats sorting; float64 counts are exact here
    dense = np.bincount(stacked[0], weights=stacked[1])
    slots = np.flatnonzero(dense)
    counts = dense[slots]
    if counts.max() > _INT32_MAX:  # a per-model merge of many replicas must not wrap int32
        raise OverflowError("sketch count exceeds int32")
    return np.stack([slots.astype(np.int32), counts.astype(np.int32)])


class SketchTotal:
    """A dense running total of sparse sketches, over just the slot range it has touched.

    A window adds a bucket's sparse counts when the bucket enters the window and subtracts them
    when it leaves, so a step costs O(bucket) instead of re-merging 12 buckets. The dense array
    covers ``[offset, offset + len)`` only (typically a few hundred slots, not all ~1300), and is
    trimmed back when its edges empty out.
    """

    __slots__ = ("offset", "counts")

    def __init__(self) -> None:
        self.offset = 0
        self.counts: CountArray = np.zeros(0, dtype=np.int32)

    @property
    def count(self) -> int:
        return int(self.counts.sum(dtype=np.int64))

    def add(self, sparse: SparseCounts) -> None:
        if not sparse.shape[1]:
            return
        lo, hi = int(sparse[0, 0]), int(sparse[0, -1]) + 1
        if not self.counts.size:
            self.offset, self.counts = lo, np.zeros(hi - lo, dtype=np.int32)
        elif lo < self.offset or hi > self.offset + self.counts.size:
            new_lo, new_hi = min(lo, self.offset), max(hi, self.offset + self.counts.size)
            grown = np.zeros(new_hi - new_lo, dtype=np.int32)
            grown[self.offset - new_lo: self.offset - new_lo + self.counts.size] = self.counts
            self.offset, self.counts = new_lo, grown
        self.counts[sparse[0] - self.offset] += sparse[1]

    def subtract(self, sparse: SparseCounts) -> None:
        """Remove counts previously added (a window's expired bucket)."""
        if not sparse.shape[1]:
            return
        at = sparse[0] - self.offset
        if at[0] < 0 or at[-1] >= self.counts.size:
            raise ValueError("subtracting slots that were never added")
        self.counts[at] -= sparse[1]
        if self.counts[0] == 0 or self.counts[-1] == 0:
            self._trim()

    def _trim(self) -> None:
        nonzero = np.flatnonzero(self.counts)
        if not nonzero.size:
            self.offset, self.counts = 0, np.zeros(0, dtype=np.int32)
        else:
            first, last = int(nonzero[0]), int(nonzero[-1])
            self.offset += first
            self.counts = self.counts[first: last + 1].copy()

    def sparse(self) -> SparseCounts:
        """The total as sparse counts (what travels to stage 2)."""
        at = np.flatnonzero(self.counts)
        return np.stack([(at + self.offset).astype(np.int32), self.counts[at]])
