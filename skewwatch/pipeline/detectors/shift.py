"""A shift test per stream: the mean of the last few disjoint windows against the stream's own past.

Range novelty (:mod:`skewwatch.pipeline.detectors.novelty`) asks whether a value lies outside what a
stream did before. On a stream of few requests a window each value is noisy, the ranges of the past
are wide, and a level that moved by a few times the noise of a *mean* stays inside them for as long
as it lasts. :class:`ShiftBank` asks the other question, with the evidence counted: is the mean of
the last ``window`` values, taken from windows that share no request (one value per window length),
different from the mean of everything older than them, by ``z`` standard errors?

    z = (mean(recent) - mean(past)) / (sd(past) * sqrt(1 / n_recent + 1 / n_past))

(a two-sample z statistic, the past's spread standing for both: the recent few are too few to
estimate their own.) The past is an exponentially weighted mean and variance (weight ``1 / memory`` once
``memory`` values are in, so it follows the stream over hours); a value joins it when it leaves the
recent ring, unless the caller quarantines it (a stream whose anomaly is under way does not learn
it as its past). Nothing is scored before ``min_past`` values of the past and ``min_recent`` recent
ones; a spread below ``sd_floor`` counts as that (a past that never moved is not infinitely sure).
A recent value counts at most ``clip`` standard deviations from the past's mean (one window of a
heavy-tailed stream, a single huge request, does not make a shift), and a difference of means
below ``min_effect`` scores 0 however sure it is (a real change of a few percent is no news).

Many independent streams are the rows of a few numpy arrays, observed a batch of rows at once; the
whole state packs into one float64 vector per row (:meth:`ShiftBank.pack_rows`).

>>> import numpy as np
>>> bank = ShiftBank(features=1, params=ShiftParams(window=4, min_recent=2, min_past=8, memory=50))
>>> rows = bank.add_rows(1)
>>> def window(t, level):  # one value a minute: the level, +-0.3 in turn
...     return bank.observe(rows, np.array([[level + (0.3 if t % 2 else -0.3)]]), now=60.0 * t,
...                         span=np.array([60.0]))
>>> [round(float(window(t, 0.0)[0, 0]), 1) for t in range(40)][-3:]
[-0.0, 0.1, -0.0]
>>> [round(float(window(t, 0.6)[0, 0]), 1) for t in range(40, 44)]  # the level moves by two sd
[1.0, 1.9, 2.9, 3.8]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors import row_arrays

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ShiftParams:
    """The test's lengths, in values (one per window length of a stream)."""

    window: int = 10  # recent values (disjoint windows): 10 min of 60 s windows
    min_recent: int = 5  # recent values with a number before a z is given
    min_past: int = 10  # past values before a z is given
    memory: int = 60  # a new value's weight in the past never falls below 1 / memory (60 windows: an hour)
    sd_floor: float = 0.05  # the past's spread counts as at least this (log ratio: 5 %)
    min_effect: float = 0.0  # a difference of means smaller than this scores 0, however sure
    clip: float = 3.0  # a recent value counts at most this many sd from the past's mean (0: as it is)

    def __post_init__(self) -> None:
        if not 1 <= self.min_recent <= self.window:
            raise ValueError(f"need 1 <= min_recent <= window, got {self.min_recent!r} and {self.window!r}")
        if self.min_past < 2 or self.memory < self.min_past or self.sd_floor <= 0.0 or self.min_effect < 0.0 \
                or self.clip < 0.0:
            raise ValueError("need min_past >= 2, memory >= min_past, sd_floor > 0, min_effect >= 0, clip >= 0")

    def key(self) -> list[Any]:
        """What a saved state must have been kept with."""
        return [self.window, self.memory]


class ShiftBank:
    """One shift test per row over ``features`` streams each; see the module."""

    def __init__(self, features: int, params: ShiftParams | None = None) -> None:
        self.params = params or ShiftParams()
        self.features = features
        self._alloc(0)

    _ARRAYS = ("ring", "head", "past", "taken", "z")

    def __len__(self) -> int:
        return len(self.head)

    def add_rows(self, n: int) -> Ints:
        """``n`` fresh rows; their indices."""
        start = len(self)
        fresh = self._fresh(n)
        for name in self._ARRAYS:
            setattr(self, name, np.concatenate((getattr(self, name), getattr(fresh, name))))
        return np.arange(start, start + n, dtype=np.int64)

    def _alloc(self, n: int) -> None:
        """``n`` fresh rows, and nothing else."""
        f, w = self.features, self.params.window
        self.ring = np.full((n, f, w), np.nan)  # the recent values (NaN: none)
        self.head = np.zeros(n, dtype=np.int64)  # the slot the next value goes to
        self.past = np.zeros((n, f, 3))  # the past's weight (values), mean, variance
        self.taken = np.full(n, np.nan)  # when the row's last value was taken (NaN: never)
        self.z = np.zeros((n, f))  # the last statistic (0: none)

    def _fresh(self, n: int) -> ShiftBank:
        fresh = ShiftBank(self.features, self.params)
        fresh._alloc(n)
        return fresh

    def drop_rows(self, rows: Ints) -> None:
        keep = np.ones(len(self), dtype=bool)
        keep[rows] = False
        for name in self._ARRAYS:
            setattr(self, name, getattr(self, name)[keep])

    def reset_rows(self, rows: Ints) -> None:
        """Forget what ``rows`` learned (a lasting change is their new normal)."""
        if not len(rows):
            return
        fresh = self._fresh(1)
        for name in self._ARRAYS:
            getattr(self, name)[rows] = getattr(fresh, name)[0]

    def observe(self, rows: Ints, x: Floats, now: float, span: Floats,
                quarantine: npt.NDArray[np.bool_] | None = None) -> Floats:
        """Each row's statistic per feature after this sample (``x``: rows x features, NaN: none).

        A row takes the sample only once ``span`` (its window's length) has passed since the last it
        took, so no two values share a request; otherwise its last statistic stands. The value that
        leaves the recent ring joins the past, unless the row is in ``quarantine``."""
        p = self.params
        last = self.taken[rows]
        take = np.isnan(last) | (now - last >= span)
        if take.any():
            r, xs = rows[take], x[take]
            slot = self.head[r]
            leaving = self.ring[r, :, slot]  # (t, F): the oldest recent value
            joins = np.isfinite(leaving)
            if quarantine is not None:
                joins &= ~quarantine[take][:, None]
            self._learn_past(r, leaving, joins)
            self.ring[r, :, slot] = xs
            self.head[r] = (slot + 1) % p.window
            self.taken[r] = now
            self.z[r] = self._statistic(r)
        return self.z[rows]

    def _learn_past(self, rows: Ints, values: Floats, joins: npt.NDArray[np.bool_]) -> None:
        past = self.past[rows]
        weight = past[:, :, 0] + joins
        a = np.where(joins, 1.0 / np.maximum(np.minimum(weight, self.params.memory), 1.0), 0.0)
        d = np.where(joins, values - past[:, :, 1], 0.0)
        past[:, :, 1] += a * d
        past[:, :, 2] = (1.0 - a) * (past[:, :, 2] + a * d * d)
        past[:, :, 0] = weight
        self.past[rows] = past

    def _statistic(self, rows: Ints) -> Floats:
        p = self.params
        ring = self.ring[rows]
        n_recent = np.isfinite(ring).sum(axis=2)
        past = self.past[rows]
        n_past = np.minimum(past[:, :, 0], p.memory)  # the weighted past's effective count
        sd = np.maximum(np.sqrt(np.maximum(past[:, :, 2], 0.0)), p.sd_floor)
        if p.clip > 0.0:
            lo = (past[:, :, 1] - p.clip * sd)[:, :, None]
            ring = np.clip(ring, lo, lo + 2.0 * p.clip * sd[:, :, None])
        with np.errstate(invalid="ignore", divide="ignore"):
            recent = np.nansum(ring, axis=2) / n_recent
        diff = recent - past[:, :, 1]
        ok = (n_recent >= p.min_recent) & (n_past >= p.min_past) & (np.abs(diff) >= p.min_effect)
        z = np.zeros_like(recent)
        se = sd * np.sqrt(1.0 / np.maximum(n_recent, 1) + 1.0 / np.maximum(n_past, 1.0))
        np.divide(diff, se, out=z, where=ok)
        return z

    # --- state

    def pack_rows(self) -> Floats:
        """Every row's state as one float64 vector: rows x (features x (window + 4) + 2)."""
        return row_arrays.pack(self, self._ARRAYS)

    def unpack_rows(self, rows: Ints, data: Floats) -> None:
        """Load packed rows (:meth:`pack_rows`) into ``rows``."""
        row_arrays.unpack(self, self._ARRAYS, rows, data, "shift test")
