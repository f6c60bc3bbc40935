"""A shift test per stream: the mean of the last few disjoint windows against the stream's own past.

Range novelty (:mod:`skewwatch.pipeline.detectors.novelty`) asks whether a value lies outside what a
stream did before. On a stream of few requests a window each value is noisy, the ranges of the past
are wide, and a level that moved by a few times the noise of a *mean* stays inside them for as long
as it lasts. :class:`ShiftBank` asks the other question, with the evidence counted: is the mean of
the last ``window`` values, taken from windows that share no request (one value per window length),
different from the mean of everything older than them, by ``z`` standard errors?

A window's value is a mean over its requests, so a window of twenty requests carries twenty times
the evidence of a window of one: each value comes with its window's requests as its weight, and the
test is on requests, not windows (no weight: each window counts as one)::

    z = (mean_w(recent) - mean_w(past)) / (sd * sqrt(1 / requests(recent) + 1 / requests(past)))

where ``sd`` is one request's spread, estimated from the past's windows (``sum w (x - mean)^2 / (k -
1)`` over its ``k`` windows: a spread between windows beyond what their requests explain, a queue
that moves a whole window, is in it too). A recent window counts at most as many requests as the
past's typical window (its mean): a replica that is suddenly sent more traffic is no surer of its
level than its past was per window, and a busy minute's requests are not independent of each other.
The past is an exponentially weighted mean and spread (weight ``1 / memory`` per window once
``memory`` windows are in, so it follows the stream over hours); a value joins it when it leaves
the recent ring, unless the caller quarantines it (a stream whose anomaly is under way does not
learn it as its past). Nothing is scored before ``min_past`` windows of the past and ``min_recent``
recent ones; a spread below ``sd_floor`` counts as that (a past that never moved is not infinitely
sure). A recent value counts at most ``clip`` of its own standard errors (``sd / sqrt(w)``) from
the past's mean (one window of a heavy-tailed stream, a single huge request, does not make a shift),
and a difference of means below ``min_effect`` scores 0 however sure it is (a real change of a few
percent is no news).

Many independent streams are the rows of a few numpy arrays, observed a batch of rows at once; the
whole state packs into one float64 vector per row (:meth:`ShiftBank.pack_rows`).

>>> import numpy as np
>>> bank = ShiftBank(features=1, params=ShiftParams(window=4, min_recent=2, min_past=8, memory=50))
>>> rows = bank.add_rows(1)
>>> def window(t, level, requests=1.0):  # one value a minute: the level, +-0.3 / sqrt(requests) in turn
...     swing = 0.3 / requests ** 0.5
...     return bank.observe(rows, np.array([[level + (swing if t % 2 else -swing)]]), now=60.0 * t,
...                         span=np.array([60.0]), weight=np.array([requests]))
>>> [round(float(window(t, 0.0)[0, 0]), 1) for t in range(40)][-3:]
[0.0, 0.1, 0.0]
>>> [round(float(window(t, 0.6)[0, 0]), 1) for t in range(40, 44)]  # the level moves by two sd
[1.0, 1.9, 2.9, 3.8]

Four times the requests in every window: each value is half as noisy, and a move of half the size
is as sure:

>>> bank = ShiftBank(features=1, params=ShiftParams(window=4, min_recent=2, min_past=8, memory=50))
>>> rows = bank.add_rows(1)
>>> _ = [window(t, 0.0, requests=4.0) for t in range(40)]
>>> [round(float(window(t, 0.3, requests=4.0)[0, 0]), 1) for t in range(40, 44)]
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
    sd_floor: float = 0.05  # one request's spread counts as at least this (log ratio: 5 %)
    min_effect: float = 0.0  # a difference of means smaller than this scores 0, however sure
    clip: float = 3.0  # a recent value counts at most this many of its standard errors from the past's mean (0: off)

    def __post_init__(self) -> None:
        if not 1 <= self.min_recent <= self.window:
            raise ValueError(f"need 1 <= min_recent <= window, got {self.min_recent!r} and {self.window!r}")
        if self.min_past < 2 or self.memory < self.min_past or self.sd_floor <= 0.0 or self.min_effect < 0.0 \
                or self.clip < 0.0:
            raise ValueError("need min_past >= 2, memory >= min_past, sd_floor > 0, min_effect >= 0, clip >= 0")

    def key(self) -> list[Any]:
        """What a saved state must have been kept with (``"requests"``: its past is weighed in requests)."""
        return [self.window, self.memory, "requests"]


class ShiftBank:
    """One shift test per row over ``features`` streams each; see the module."""

    def __init__(self, features: int, params: ShiftParams | None = None) -> None:
        self.params = params or ShiftParams()
        self.features = features
        self._alloc(0)

    _ARRAYS = ("ring", "weight", "head", "past", "taken", "z")

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
        self.weight = np.zeros((n, w))  # each recent value's requests
        self.head = np.zeros(n, dtype=np.int64)  # the slot the next value goes to
        self.past = np.zeros((n, f, 4))  # the past's windows, requests, mean, and sum of w (x - mean)^2
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
                quarantine: npt.NDArray[np.bool_] | None = None, weight: Floats | None = None) -> Floats:
        """Each row's statistic per feature after this sample (``x``: rows x features, NaN: none).

        A row takes the sample only once ``span`` (its window's length) has passed since the last it
        took, so no two values share a request; otherwise its last statistic stands. ``weight``: each
        row's requests in its window (at least one counts; none given: one each). The value that
        leaves the recent ring joins the past, unless the row is in ``quarantine``."""
        p = self.params
        last = self.taken[rows]
        take = np.isnan(last) | (now - last >= span)
        if take.any():
            r, xs = rows[take], x[take]
            slot = self.head[r]
            joins = np.isfinite(self.ring[r, :, slot])  # (t, F): the oldest recent value
            if quarantine is not None:
                joins &= ~quarantine[take][:, None]
            self._learn_past(r, self.ring[r, :, slot], self.weight[r, slot], joins)
            self.ring[r, :, slot] = xs
            self.weight[r, slot] = 1.0 if weight is None else np.maximum(weight[take], 1.0)
            self.head[r] = (slot + 1) % p.window
            self.taken[r] = now
            self.z[r] = self._statistic(r)
        return self.z[rows]

    def _learn_past(self, rows: Ints, values: Floats, weight: Floats, joins: npt.NDArray[np.bool_]) -> None:
        """A weighted mean and sum of squares, updated one window at a time (West's update), the older
        windows fading by ``1 - 1 / memory`` once ``memory`` are in."""
        past = self.past[rows]
        fade = np.where(joins & (past[:, :, 0] >= self.params.memory), 1.0 - 1.0 / self.params.memory, 1.0)
        past[:, :, 0] *= fade
        past[:, :, 1] *= fade
        past[:, :, 3] *= fade
        w = np.where(joins, weight[:, None], 0.0)
        past[:, :, 0] += joins
        past[:, :, 1] += w
        d = np.where(joins, values - past[:, :, 2], 0.0)
        past[:, :, 2] += np.divide(w * d, past[:, :, 1], out=np.zeros_like(d), where=joins)
        past[:, :, 3] += w * d * np.where(joins, values - past[:, :, 2], 0.0)
        self.past[rows] = past

    def _recent_weights(self, rows: Ints) -> Floats:
        """Each recent value's requests as the statistic counts them (rows x features x window; 0: no
        value): a recent window counts at most the past's typical window's requests (at least one)."""
        past = self.past[rows]
        windows, requests = past[:, :, 0], past[:, :, 1]
        typical = np.maximum(np.divide(requests, windows, out=np.ones_like(requests), where=windows > 0.0), 1.0)
        return np.where(np.isfinite(self.ring[rows]),
                        np.minimum(self.weight[rows][:, None, :], typical[:, :, None]), 0.0)

    def recent_requests(self, rows: Ints) -> Floats:
        """The requests each row's recent mean is over, per feature, as the statistic counts them: the
        evidence behind its last z."""
        return self._recent_weights(rows).sum(axis=2)

    def _statistic(self, rows: Ints) -> Floats:
        p = self.params
        ring = self.ring[rows]
        past = self.past[rows]
        windows, requests, mean = past[:, :, 0], past[:, :, 1], past[:, :, 2]
        sd = np.maximum(np.sqrt(np.maximum(past[:, :, 3], 0.0) / np.maximum(windows - 1.0, 1.0)), p.sd_floor)
        w = self._recent_weights(rows)
        n_recent = (w > 0.0).sum(axis=2)
        values = np.where(w > 0.0, ring, 0.0)
        if p.clip > 0.0:
            bound = p.clip * sd[:, :, None] / np.sqrt(np.maximum(w, 1.0))
            values = np.clip(values, mean[:, :, None] - bound, mean[:, :, None] + bound)
        in_recent = w.sum(axis=2)
        diff = np.divide((w * values).sum(axis=2), in_recent, out=np.zeros_like(in_recent), where=in_recent > 0.0) \
            - mean
        ok = (n_recent >= p.min_recent) & (windows >= p.min_past) & (np.abs(diff) >= p.min_effect)
        z = np.zeros_like(diff)
        se = sd * np.sqrt(1.0 / np.maximum(in_recent, 1.0) + 1.0 / np.maximum(requests, 1.0))
        np.divide(diff, se, out=z, where=ok)
        return z

    # --- state

    def pack_rows(self) -> Floats:
        """Every row's state as one float64 vector: rows x (features x (window + 4) + window + 2)."""
        return row_arrays.pack(self, self._ARRAYS)

    def unpack_rows(self, rows: Ints, data: Floats) -> None:
        """Load packed rows (:meth:`pack_rows`) into ``rows``."""
        row_arrays.unpack(self, self._ARRAYS, rows, data, "shift test")
