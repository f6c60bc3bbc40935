"""A streaming anomaly scorer with river's interface: multi-scale range novelty, its likelihood, onsets.

``NoveltyScorer`` is a :class:`river.base.AnomalyDetector`: ``learn_one(x)`` and ``score_one(x)``
over a dict of numeric features, a score in [0, 1], composable with river (pipelines, its
``ThresholdFilter`` / ``QuantileFilter``, ``clone``). It works on one series (``x = {"value": v}``)
and on a feature vector (each feature judged against its own past, the most novel one counts).
It is pure (no I/O, no clock, no randomness) and its whole state is plain JSON data:
:meth:`NoveltyScorer.state_dict` / :meth:`NoveltyScorer.load_state` (exact round trip, no pickle).

How it scores a sample, in three layers (every length is counted in samples):

1. **Range novelty, per feature and time scale.** For each scale ``k`` in ``scales`` an
   exponentially weighted mean (weight ``1/k``; ``k = 1`` is the value itself) is compared with the
   range it spanned over the last ``memory`` samples (kept as the extremes of ``blocks`` blocks, so a
   feature costs ``2 * blocks`` numbers per scale, not ``memory``). The novelty is how far the mean lies
   outside that range, in units of the range: ``0`` inside it, ``0.5`` half a range beyond. Because
   it is relative to the feature's own range, it needs no scaling and treats a spike that recurs
   (already in the range) as normal, while a new level, a new extreme or a slow drift of the long
   mean is novel. The sample's raw score is ``e / (1 + e)`` of the most novel (feature, scale).
2. **Likelihood.** As NAB's HTM detector does with its raw anomaly scores, the mean raw score of the
   last ``short`` samples is compared with the distribution of that mean over the past
   (exponentially weighted mean and variance, weight ``fading``): its Gaussian tail probability ``p``
   becomes ``log(p + 1e-10) / log(1e-10)``: 0 for an ordinary amount of novelty, 0.5 at p = 1e-5, 1 at
   p <= 1e-10. A series where new extremes are common needs much more novelty than a flat one.
3. **Onsets** (``onset=True``, the default). An anomaly is reported when it starts: within an episode
   (the likelihood above 0, until ``rearm`` samples in a row at 0) a sample scores only if it is more
   than ``escalation`` times the episode's highest score so far; otherwise 0. With ``onset=False``
   the likelihood is returned as is (a level: a caller with its own hysteresis wants that).

Nothing scores before a feature has been seen ``grace`` times, nor before ``warmup`` samples.

One implementation, :class:`NoveltyBank`: many independent streams as the rows of a few numpy arrays,
scored and learned a batch of rows at once (the ``learned`` detector keeps one row per replica).
``NoveltyScorer`` is river's interface over a one-row bank, so what ``bench/nab`` measures is what
the detector runs. ``tests/novelty_reference.py`` writes the same arithmetic out in plain Python,
one value at a time: the tests hold the bank to it.

>>> scorer = make_scorer()
>>> series = [10.0 + (i % 7) * 0.5 for i in range(400)] + [25.0] + [10.0 + (i % 7) * 0.5 for i in range(20)]
>>> scores = []
>>> for v in series:
...     x = {"value": v}
...     scores.append(scorer.score_one(x))
...     scorer.learn_one(x)
>>> round(max(scores[:400]), 2), round(scores[400], 3), max(scores[401:])
(0.03, 1.0, 0.0)

Multivariate, and the state round trip (a JSON-able dict, exact):

>>> import json
>>> scorer = make_scorer(scales=(1, 8), memory=200)
>>> for i in range(300):
...     scorer.learn_one({"ttft": 100.0 + i % 5, "tps": 50.0 - i % 3})
>>> twin = make_scorer(scales=(1, 8), memory=200)
>>> twin.load_state(json.loads(json.dumps(scorer.state_dict())))
>>> x = {"ttft": 180.0, "tps": 50.0}
>>> scorer.score_one(x) == twin.score_one(x) > 0.5, scorer.novelty_one(x)["ttft"] > 1
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from river import base
from scipy.special import erfc

from skewwatch.pipeline.detectors import row_arrays
from skewwatch.pipeline.finite import finite_or_none

STATE_VERSION = 1

_LOG_EPS = math.log(1e-10)  # the likelihood's log scale: p = 1e-10 scores 1 (NAB's HTM uses the same)
_SD_FLOOR = 1e-4  # the short mean's spread is never taken below this (a flat past is not infinitely sure)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class NoveltyParams:
    """The scorer's parameters (see :class:`NoveltyScorer`), checked."""

    scales: tuple[int, ...] = (1, 8, 64)
    memory: int = 2000
    blocks: int = 8
    grace: int = 50
    short: int = 10
    fading: float = 0.0003
    warmup: int = 100
    onset: bool = True
    rearm: int = 12
    escalation: float = 2.0
    settle: int = 0
    drift: bool = False
    span_floor: float = 0.0

    def __post_init__(self) -> None:
        if not self.scales or any(int(k) < 1 for k in self.scales):
            raise ValueError(f"scales must be >= 1 sample each, got {self.scales!r}")
        if self.blocks < 1 or self.memory < self.blocks:
            raise ValueError(f"need memory >= blocks >= 1, got memory={self.memory!r} blocks={self.blocks!r}")
        if self.short < 1 or not 0.0 < self.fading < 1.0 or self.rearm < 1 or self.escalation < 1.0:
            raise ValueError("need short >= 1, 0 < fading < 1, rearm >= 1, escalation >= 1")
        if self.grace < 0 or self.warmup < 0 or self.settle < 0 or self.span_floor < 0:
            raise ValueError("need grace >= 0, warmup >= 0, settle >= 0 and span_floor >= 0")

    @property
    def block(self) -> int:
        """Samples per block."""
        return max(1, self.memory // self.blocks)

    def key(self) -> list[Any]:
        """What a saved state must have been learned with."""
        return [list(self.scales), self.memory, self.blocks, self.grace, self.short, self.fading, self.warmup,
                self.onset, self.rearm, self.escalation, self.settle, self.drift, self.span_floor]


@dataclass(slots=True)
class Batch:
    """One sample of some rows, scored but not yet learned (``NoveltyBank.evaluate``)."""

    rows: Ints
    valid: npt.NDArray[np.bool_]  # (r, F): the feature has a number this sample
    moved: Floats  # (r, F, S): each scale's mean with the sample in it
    novelty: Floats  # (r, F): the most novel scale's novelty (0 before grace)
    raw: Floats  # (r,): e / (1 + e) of the most novel feature
    short_mean: Floats  # (r,): mean raw score of the last `short` samples, this one included
    level: Floats  # (r,): the likelihood score
    score: Floats  # (r,): what is reported (level, or onsets)


class NoveltyBank:
    """Many independent novelty scorers over the same features, one per row, as numpy columns.

    >>> bank = NoveltyBank(["a", "b"], NoveltyParams(scales=(1, 4), memory=40, grace=5, warmup=5))
    >>> rows = bank.add_rows(3)
    >>> for i in range(60):
    ...     _ = bank.learn(rows, np.array([[1.0 + i % 3, 2.0], [5.0, 5.0 + i % 2], [0.0, 0.0]]))
    >>> batch = bank.evaluate(rows, np.array([[9.0, 2.0], [5.0, 5.5], [np.nan, 0.0]]))
    >>> [round(float(v), 1) for v in batch.novelty[:, 0]], float(batch.score[1])
    ([5.7, 0.0, 0.0], 0.0)
    """

    def __init__(self, features: Sequence[str], params: NoveltyParams | None = None) -> None:
        self.params = params or NoveltyParams()
        self.features: list[str] = list(features)
        self._k = np.asarray(self.params.scales, dtype=np.float64)
        self._k_max = int(max(self.params.scales))
        self._alloc(0, len(self.features))

    # --- storage

    def _alloc(self, rows: int, features: int) -> None:
        p = self.params
        s, b = len(p.scales), p.blocks
        self.mean = np.full((rows, features, s), np.nan)  # each scale's EW mean (NaN: none yet)
        self.cur_hi = np.full((rows, features, s), -np.inf)  # extremes of the block being filled
        self.cur_lo = np.full((rows, features, s), np.inf)
        self.ring_hi = np.full((rows, features, s, b), -np.inf)  # extremes of the last `blocks` blocks
        self.ring_lo = np.full((rows, features, s, b), np.inf)
        self.ring_max = np.full((rows, features, s), -np.inf)  # max(ring_hi), min(ring_lo): cached
        self.ring_min = np.full((rows, features, s), np.inf)
        self.count = np.zeros((rows, features), dtype=np.int64)  # samples in the block being filled
        self.head = np.zeros((rows, features), dtype=np.int64)  # the ring slot the next block goes to
        self.seen = np.zeros((rows, features), dtype=np.int64)  # samples learned per feature
        self.n = np.zeros(rows, dtype=np.int64)  # samples learned
        self.recent = np.zeros((rows, p.short))  # the last `short` raw scores (a ring)
        self.recent_n = np.zeros(rows, dtype=np.int64)
        self.lik = np.zeros((rows, 3))  # EW of the short mean: samples, mean, variance
        self.episode = np.zeros((rows, 2))  # highest score reported in the episode, samples at level 0

    _ROW_ARRAYS = ("mean", "cur_hi", "cur_lo", "ring_hi", "ring_lo", "ring_max", "ring_min", "count", "head",
                   "seen", "n", "recent", "recent_n", "lik", "episode")
    _FEATURE_ARRAYS = ("mean", "cur_hi", "cur_lo", "ring_hi", "ring_lo", "ring_max", "ring_min", "count", "head",
                       "seen")

    def __len__(self) -> int:
        return len(self.n)

    def add_rows(self, count: int) -> Ints:
        """``count`` fresh scorers; their row numbers."""
        start = len(self)
        fresh = NoveltyBank(self.features, self.params)
        fresh._alloc(count, len(self.features))
        for name in self._ROW_ARRAYS:
            setattr(self, name, np.concatenate((getattr(self, name), getattr(fresh, name))))
        return np.arange(start, start + count, dtype=np.int64)

    def add_features(self, names: Sequence[str]) -> None:
        """New features for every row (never seen yet)."""
        new = [name for name in names if name not in self.features]
        if not new:
            return
        fresh = NoveltyBank(new, self.params)
        fresh._alloc(len(self), len(new))
        for name in self._FEATURE_ARRAYS:
            setattr(self, name, np.concatenate((getattr(self, name), getattr(fresh, name)), axis=1))
        self.features.extend(new)

    def reset_rows(self, rows: Sequence[int] | Ints) -> None:
        """Forget what ``rows`` learned: they start over as fresh scorers (their warm-up again)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return
        fresh = NoveltyBank(self.features, self.params)
        fresh._alloc(1, len(self.features))
        for name in self._ROW_ARRAYS:
            getattr(self, name)[rows] = getattr(fresh, name)[0]

    def drop_rows(self, rows: Sequence[int] | Ints) -> None:
        """Remove rows; the rows after them move up (callers renumber)."""
        keep = np.ones(len(self), dtype=bool)
        keep[np.asarray(rows, dtype=np.int64)] = False
        for name in self._ROW_ARRAYS:
            setattr(self, name, getattr(self, name)[keep])

    # --- scoring and learning

    def evaluate(self, rows: Ints, x: Floats) -> Batch:
        """Score one sample ``x`` (shape (len(rows), len(features)), NaN = missing) of each row; pure."""
        p = self.params
        ix = _index(rows)
        valid = np.isfinite(x)
        xs = x[:, :, None]
        mean = self.mean[ix]
        moved = mean + (xs - mean) / self._k
        first = np.isnan(mean)  # a feature's first sample: its means start at it
        if first.any():
            moved = np.where(first, xs, moved)
        if p.drift:  # the past blocks only: a slow drift cannot drag the range along with it
            # (until the first block is complete, the block being filled: warm-up is not prolonged)
            past = self.ring_max[ix] > -np.inf
            hi = np.where(past, self.ring_max[ix], self.cur_hi[ix])
            lo = np.where(past, self.ring_min[ix], self.cur_lo[ix])
        else:
            hi = np.maximum(self.ring_max[ix], self.cur_hi[ix])
            lo = np.minimum(self.ring_min[ix], self.cur_lo[ix])
        span = hi - lo  # -inf while nothing is in range (never inf - inf: no invalid operation)
        if p.span_floor:  # a flat range (span 0: every past value equal) is as wide as the floor too
            span = np.where(span >= 0.0, np.maximum(span, p.span_floor), span)
        outside = np.maximum(moved - hi, lo - moved)  # NaN where the sample has no value
        e = np.zeros_like(outside)
        np.divide(outside, span, out=e, where=(span > 0.0) & (outside > 0.0) & (span < np.inf))
        if p.settle:  # a scale's novelty counts once it has settle x k samples
            e[self.seen[ix][:, :, None] < p.settle * self._k] = 0.0
        novelty = e.max(axis=2)
        novelty[~valid | (self.seen[ix] < p.grace)] = 0.0
        best = novelty.max(axis=1) if novelty.shape[1] else np.zeros(len(rows))
        raw = best / (1.0 + best)
        if p.short > 1:
            filled = np.minimum(self.recent_n[ix], p.short)
            slot = self.recent_n[ix] % p.short  # the oldest sample, which this one replaces when full
            kept = self.recent[ix].sum(axis=1) - np.where(filled >= p.short, self.recent[rows, slot], 0.0)
            short_mean = (kept + raw) / np.minimum(filled + 1, p.short)
        else:
            short_mean = raw
        lik = self.lik[ix]
        sd = np.maximum(np.sqrt(lik[:, 2]), _SD_FLOOR)
        z = (short_mean - lik[:, 1]) / sd
        ready = (self.n[ix] >= p.warmup) & (lik[:, 0] > 0) & (z > 0.0)
        tail = 0.5 * erfc(np.where(ready, z, 0.0) / math.sqrt(2.0))
        level = np.where(ready, np.minimum(1.0, np.log(tail + 1e-10) / _LOG_EPS), 0.0)
        if p.onset:
            episode_max = self.episode[ix, 0]
            score = np.where((level > 0.0) & (level > p.escalation * episode_max), level, 0.0)
        else:
            score = level
        return Batch(rows, valid, moved, novelty, raw, short_mean, level, score)

    def commit(self, batch: Batch, hold_out: npt.NDArray[np.bool_] | None = None) -> None:
        """Learn the sample ``batch`` was evaluated on (the state then moves on by one sample).

        ``hold_out`` (per row of the batch): rows whose sample is an anomaly the caller does not want
        learned as normal (yet): the sample is counted but changes nothing else (means, ranges, the
        likelihood's distribution), so it stays novel while it lasts and leaves no trace once over.
        """
        if hold_out is not None and hold_out.any():
            self.n[batch.rows[hold_out]] += 1
            keep = ~hold_out
            if keep.any():
                self._learn(Batch(batch.rows[keep], batch.valid[keep], batch.moved[keep], batch.novelty[keep],
                                  batch.raw[keep], batch.short_mean[keep], batch.level[keep], batch.score[keep]))
            return
        self._learn(batch)

    def _learn(self, batch: Batch) -> None:
        p = self.params
        rows, valid = batch.rows, batch.valid
        ix = _index(rows)
        moved = batch.moved
        # with `settle`, a scale's mean joins its range once it has settled: after k samples of the
        # feature (before, it still leans on its first value, and a range that remembers for `memory`
        # samples would keep those first swings)
        settled_all = not p.settle or bool((self.seen[ix] + 1 >= self._k_max).all())
        if valid.all() and settled_all:  # the usual batch: every feature has a value, every scale settled
            self.mean[ix] = moved
            self.cur_hi[ix] = np.maximum(self.cur_hi[ix], moved)
            self.cur_lo[ix] = np.minimum(self.cur_lo[ix], moved)
            self.count[ix] += 1
            self.seen[ix] += 1
        else:
            v3 = valid[:, :, None]
            self.mean[ix] = np.where(v3, moved, self.mean[ix])
            self.seen[ix] += valid
            joins = v3 & (self.seen[ix][:, :, None] >= self._k) if p.settle else v3
            self.cur_hi[ix] = np.where(joins, np.maximum(self.cur_hi[ix], moved), self.cur_hi[ix])
            self.cur_lo[ix] = np.where(joins, np.minimum(self.cur_lo[ix], moved), self.cur_lo[ix])
            self.count[ix] += valid
        self.n[ix] += 1
        full_r, full_f = np.nonzero(self.count[ix] >= p.block)
        if len(full_r):
            r, f = rows[full_r], full_f
            slot = self.head[r, f]
            self.ring_hi[r, f, :, slot] = self.cur_hi[r, f]
            self.ring_lo[r, f, :, slot] = self.cur_lo[r, f]
            self.head[r, f] = (slot + 1) % p.blocks
            self.ring_max[r, f] = self.ring_hi[r, f].max(axis=-1)
            self.ring_min[r, f] = self.ring_lo[r, f].min(axis=-1)
            self.cur_hi[r, f] = -np.inf
            self.cur_lo[r, f] = np.inf
            self.count[r, f] = 0
        if p.short > 1:  # (with one sample the short mean is the raw score itself)
            self.recent[rows, self.recent_n[ix] % p.short] = batch.raw
        self.recent_n[ix] += 1
        lik = self.lik[ix]
        lik[:, 0] += 1.0
        a = np.maximum(p.fading, 1.0 / lik[:, 0])
        d = batch.short_mean - lik[:, 1]
        lik[:, 1] += a * d
        lik[:, 2] = (1.0 - a) * (lik[:, 2] + a * d * d)
        self.lik[ix] = lik
        if not p.onset:  # the episode only gates onsets
            return
        episode = self.episode[ix]
        at_zero = batch.level <= 0.0
        episode[:, 1] = np.where(at_zero, episode[:, 1] + 1.0, 0.0)
        episode[:, 0] = np.where(batch.score > 0.0, batch.score,
                                 np.where(at_zero & (episode[:, 1] >= p.rearm), 0.0, episode[:, 0]))
        self.episode[ix] = episode

    def learn(self, rows: Ints, x: Floats) -> Floats:
        """Score and learn one sample of each row; the scores."""
        batch = self.evaluate(rows, x)
        self.commit(batch)
        return batch.score

    # --- state

    def pack_rows(self) -> Floats:
        """Every row's whole state as one float64 vector per row (:func:`~.row_arrays.pack`, in a
        fixed order for these features and parameters)."""
        return row_arrays.pack(self, self._ROW_ARRAYS)

    def unpack_rows(self, rows: Ints, data: Floats) -> None:
        """Restore rows from :meth:`pack_rows` vectors (of a bank with these features and parameters)."""
        row_arrays.unpack(self, self._ROW_ARRAYS, rows, data, "novelty")

    def row_state(self, row: int) -> dict[str, Any]:
        """One row's whole state as plain JSON data (None for the infinities and NaN of "not yet")."""
        return {
            "n": int(self.n[row]),
            "features": {
                name: {
                    "mean": _plain(self.mean[row, f]),
                    "cur": [_plain(self.cur_hi[row, f]), _plain(self.cur_lo[row, f])],
                    "ring": [_plain(self.ring_hi[row, f].ravel()), _plain(self.ring_lo[row, f].ravel())],
                    "count": int(self.count[row, f]),
                    "head": int(self.head[row, f]),
                    "seen": int(self.seen[row, f]),
                }
                for f, name in enumerate(self.features)
                if self.seen[row, f] or not np.isnan(self.mean[row, f]).all()
            },
            "recent": [float(v) for v in self.recent[row]],
            "recent_n": int(self.recent_n[row]),
            "lik": [float(v) for v in self.lik[row]],
            "episode": [float(v) for v in self.episode[row]],
        }

    def load_row(self, row: int, state: Mapping[str, Any]) -> None:
        """Restore :meth:`row_state`'s output into ``row`` (features it names are added if new)."""
        p = self.params
        s, b = len(p.scales), p.blocks
        features = state["features"]
        self.add_features([str(name) for name in features])
        for name, data in features.items():
            f = self.features.index(str(name))
            self.mean[row, f] = _floats(data["mean"], (s,), np.nan)
            cur_hi, cur_lo = data["cur"]
            self.cur_hi[row, f] = _floats(cur_hi, (s,), -np.inf)
            self.cur_lo[row, f] = _floats(cur_lo, (s,), np.inf)
            ring_hi, ring_lo = data["ring"]
            self.ring_hi[row, f] = _floats(ring_hi, (s * b,), -np.inf).reshape(s, b)
            self.ring_lo[row, f] = _floats(ring_lo, (s * b,), np.inf).reshape(s, b)
            self.ring_max[row, f] = self.ring_hi[row, f].max(axis=-1)
            self.ring_min[row, f] = self.ring_lo[row, f].min(axis=-1)
            self.count[row, f] = int(data["count"])
            self.head[row, f] = int(data["head"]) % b
            self.seen[row, f] = int(data["seen"])
        self.n[row] = int(state["n"])
        self.recent[row] = _floats(state["recent"], (p.short,), 0.0)
        self.recent_n[row] = int(state["recent_n"])
        self.lik[row] = _floats(state["lik"], (3,), 0.0)
        self.episode[row] = _floats(state["episode"], (2,), 0.0)


def _index(rows: Ints) -> Ints | slice:
    """``rows`` as a slice when they are consecutive and in order (the usual batch: every row of the
    bank): numpy then reads and writes views instead of gathering and scattering copies."""
    n = len(rows)
    if n and int(rows[-1]) - int(rows[0]) == n - 1 and (n < 3 or bool((np.diff(rows) == 1).all())):
        return slice(int(rows[0]), int(rows[0]) + n)
    return rows


def _plain(values: Floats) -> list[float | None]:
    return [finite_or_none(v) for v in values.ravel().tolist()]


def _floats(values: Sequence[float | None], shape: tuple[int, ...], missing: float) -> Floats:
    out = np.array([missing if v is None else float(v) for v in values], dtype=np.float64)
    if out.shape != shape:
        raise ValueError(f"novelty state: expected {shape[0]} numbers, got {len(values)}")
    return out


class NoveltyScorer(base.AnomalyDetector):
    """Multi-scale range novelty -> likelihood -> onsets on one stream; see the module docstring.

    river's interface over a one-row :class:`NoveltyBank`: the arithmetic the ``learned`` detector
    runs on every replica, not a copy of it. Features are told apart by ``str(name)`` (the state's
    JSON keys); a value that is not a finite number leaves its feature out of the sample.

    Parameters
    ----------
    scales
        Time scales, in samples, of the exponentially weighted means judged (1 = the value itself).
    memory
        Samples a range remembers.
    blocks
        Blocks the memory is kept in (the range forgets a block at a time).
    grace
        Samples of a feature before its novelty counts.
    short
        Samples in the short mean of the raw score.
    fading
        Weight of a new short mean in the long-run mean and variance it is compared with.
    warmup
        Samples before any score (the likelihood's distribution needs them).
    onset
        Report an anomaly's onset (and escalations) only, else the likelihood as a level.
    rearm
        Samples at likelihood 0 that end an episode.
    escalation
        Within an episode a sample scores again only above this multiple of its highest score.
    settle
        0: off. Else a scale's mean joins its range only after ``k`` samples of the feature (its first
        values lean on the first sample, and a long memory would keep their swings), and its novelty
        counts only after ``settle x k`` (a range of few independent values is too narrow).
    drift
        Compare with the range of the past blocks only, not the block being filled: a slow drift
        then stays novel (the default follows a new level at once: each sample extends the range).
        Until the first block is complete, the block being filled (the warm-up is not prolonged).
    span_floor
        A range narrower than this counts as this wide (in the features' units): a feature that
        hardly moves, or moves in quantised steps, is not novel by one step.
    """

    def __init__(
        self,
        scales: tuple[int, ...] = (1, 8, 64),
        memory: int = 2000,
        blocks: int = 8,
        grace: int = 50,
        short: int = 10,
        fading: float = 0.0003,
        warmup: int = 100,
        onset: bool = True,
        rearm: int = 12,
        escalation: float = 2.0,
        settle: int = 0,
        drift: bool = False,
        span_floor: float = 0.0,
    ) -> None:
        self.scales = tuple(scales)
        self.memory = memory
        self.blocks = blocks
        self.grace = grace
        self.short = short
        self.fading = fading
        self.warmup = warmup
        self.onset = onset
        self.rearm = rearm
        self.escalation = escalation
        self.settle = settle
        self.drift = drift
        self.span_floor = span_floor
        self._params = NoveltyParams(tuple(int(k) for k in scales), memory, blocks, grace, short, fading, warmup,
                                     onset, rearm, escalation, settle, drift, span_floor)
        self._bank = NoveltyBank([], self._params)
        self._row = self._bank.add_rows(1)
        self._columns: dict[str, int] = {}
        # river's idiom is score_one(x) then learn_one(x): the evaluation of the last sample scored is
        # kept, so learning it does not evaluate it again (it is a pure function of the state and x)
        self._scored: tuple[Floats, Batch] | None = None

    # --- river's interface

    def learn_one(self, x: dict[Hashable, Any]) -> None:
        new = [str(name) for name, value in x.items() if finite_or_none(value) is not None]
        if any(name not in self._columns for name in new):
            self._bank.add_features(list(dict.fromkeys(new)))
            self._columns = {name: f for f, name in enumerate(self._bank.features)}
        self._bank.commit(self._evaluate(self._sample(x)))
        self._scored = None

    def score_one(self, x: dict[Hashable, Any]) -> float:
        return float(self._evaluate(self._sample(x)).score[0])

    def novelty_one(self, x: dict[Hashable, Any]) -> dict[Hashable, float]:
        """Each known feature's range novelty for ``x`` (the most novel scale), before the likelihood."""
        batch = self._evaluate(self._sample(x))
        bank = self._bank
        out: dict[Hashable, float] = {}
        for name, value in x.items():
            f = self._columns.get(str(name))
            if f is not None and finite_or_none(value) is not None and (
                    bank.seen[0, f] or not np.isnan(bank.mean[0, f]).all()):
                out[name] = float(batch.novelty[0, f])
        return out

    def _sample(self, x: Mapping[Hashable, Any]) -> Floats:
        """``x`` as the bank's one-row sample: NaN for a feature it lacks (a feature never learned
        sits the sample out: its novelty would be 0 before ``grace`` anyway)."""
        sample = np.full((1, len(self._columns)), np.nan)
        for name, value in x.items():
            f = self._columns.get(str(name))
            v = finite_or_none(value)
            if f is not None and v is not None:
                sample[0, f] = v
        return sample

    def _evaluate(self, sample: Floats) -> Batch:
        scored = self._scored
        if scored is not None and scored[0].shape == sample.shape and np.array_equal(scored[0], sample,
                                                                                       equal_nan=True):
            return scored[1]
        batch = self._bank.evaluate(self._row, sample)
        self._scored = (sample, batch)
        return batch

    # --- state

    def state_dict(self) -> dict[str, Any]:
        """Everything learned, as plain JSON data: the bank row's state (``row_state``), with the
        version and parameters; feature names are strings (JSON object keys)."""
        return {"v": STATE_VERSION, "params": self._params.key(), **self._bank.row_state(0)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (ValueError if it is another version or configuration)."""
        if state.get("v") != STATE_VERSION:
            raise ValueError(f"novelty scorer state v{state.get('v')!r}, expected v{STATE_VERSION}")
        if state.get("params") != self._params.key():
            raise ValueError("novelty scorer state was learned with other parameters")
        bank = NoveltyBank([], self._params)
        bank.add_rows(1)
        bank.load_row(0, state)
        self._bank = bank
        self._columns = {name: f for f, name in enumerate(bank.features)}
        self._scored = None

    @property
    def samples(self) -> int:
        """Samples learned so far."""
        return int(self._bank.n[0])


def make_scorer(**params: Any) -> NoveltyScorer:
    """A :class:`NoveltyScorer` with ``params`` (its defaults otherwise): the scorer the ``learned``
    detector runs on each replica (as a :class:`NoveltyBank` row), and the one ``bench/nab`` evaluates."""
    return NoveltyScorer(**params)
