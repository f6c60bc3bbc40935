"""The running sketch totals of a partition: per row, the dense sum of its window's sealed buckets.

A step *adds* the newly sealed bucket's entries and *subtracts* the leaving one's, instead of
re-merging 12 buckets; the quantiles of every row are then one cumulative sum and rank search over
these counts (:meth:`~skewwatch.pipeline.sketch.LogBins.row_quantiles`). One slot range is shared by
all rows, grown when a value falls outside it and trimmed when its edges empty out.

>>> totals = RowTotals(2, 1000)
>>> totals.add(np.array([1], np.int32), np.array([500], np.int32), np.array([3], np.int32))
>>> totals.offset, totals.counts.shape, int(totals.counts[1, 500 - totals.offset])
(492, (2, 17), 3)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# Slots of margin kept on each side of a running total's range, so a range that wobbles by a
# few slots does not reallocate every step.
_TOTAL_MARGIN = 8


class RowTotals:
    """A dense running total of sketch counts per row, over one slot range shared by all rows."""

    __slots__ = ("counts", "offset", "n_slots")

    def __init__(self, capacity: int, n_slots: int) -> None:
        self.counts: npt.NDArray[np.int32] = np.zeros((capacity, 0), dtype=np.int32)
        self.offset = 0
        self.n_slots = n_slots

    def grow_rows(self, capacity: int) -> None:
        grown = np.zeros((capacity, self.counts.shape[1]), dtype=np.int32)
        grown[:self.counts.shape[0]] = self.counts
        self.counts = grown

    def _cover(self, lo: int, hi: int) -> None:
        width = self.counts.shape[1]
        if width and lo >= self.offset and hi <= self.offset + width:
            return
        new_lo = max(min(lo - _TOTAL_MARGIN, self.offset if width else lo), 0)
        new_hi = min(max(hi + _TOTAL_MARGIN, self.offset + width if width else hi), self.n_slots)
        grown = np.zeros((self.counts.shape[0], new_hi - new_lo), dtype=np.int32)
        if width:
            grown[:, self.offset - new_lo:self.offset - new_lo + width] = self.counts
        self.counts, self.offset = grown, new_lo

    def add(self, rows: npt.NDArray[np.int32], slots: npt.NDArray[np.int32], counts: npt.NDArray[np.int32],
            sign: int = 1) -> None:
        """Add (or with ``sign=-1`` subtract) entries whose (row, slot) pairs are unique."""
        if not rows.size:
            return
        if sign > 0:
            self._cover(int(slots.min()), int(slots.max()) + 1)
        if not self.counts.flags.c_contiguous:
            self.counts = np.ascontiguousarray(self.counts)
        # one index into the flat view rather than a (row, slot) pair of indices: numpy's 2-D fancy
        # indexing costs several times as much per element; the pairs are unique, so += is exact
        at = rows.astype(np.intp) * self.counts.shape[1] + (slots - self.offset)
        flat = self.counts.reshape(-1)
        if sign > 0:
            flat[at] += counts
        else:
            flat[at] -= counts

    def trim(self) -> None:
        """Shrink the range when its edges emptied out (values that left the window)."""
        width = self.counts.shape[1]
        if not width:
            return
        used = np.flatnonzero(self.counts.any(axis=0))
        if not used.size:
            self.counts, self.offset = np.zeros((self.counts.shape[0], 0), dtype=np.int32), 0
            return
        first, last = int(used[0]), int(used[-1])
        if first > 2 * _TOTAL_MARGIN or width - 1 - last > 2 * _TOTAL_MARGIN:
            lo, hi = max(first - _TOTAL_MARGIN, 0), min(last + 1 + _TOTAL_MARGIN, width)
            self.counts, self.offset = self.counts[:, lo:hi].copy(), self.offset + lo
