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
from collections.abc import Hashable, Mapping
from typing import Any

from river import base

STATE_VERSION = 1

_LOG_EPS = math.log(1e-10)  # the likelihood's log scale: p = 1e-10 scores 1 (NAB's HTM uses the same)
_SD_FLOOR = 1e-4  # the short mean's spread is never taken below this (a flat past is not infinitely sure)


def _tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


class _Range:
    """One feature at one scale: the EW mean and the extremes it reached, per block of samples."""

    __slots__ = ("mean", "cur_hi", "cur_lo", "count", "his", "los", "ring_hi", "ring_lo")

    def __init__(self) -> None:
        self.mean: float | None = None
        self.cur_hi = -math.inf  # extremes of the block being filled
        self.cur_lo = math.inf
        self.count = 0  # samples in that block
        self.his: list[float] = []  # extremes of the completed blocks, oldest first
        self.los: list[float] = []
        self.ring_hi = -math.inf  # max(his), min(los): kept so a sample does not scan the blocks
        self.ring_lo = math.inf

    def moved(self, x: float, k: int) -> float:
        """The scale's mean once ``x`` is in it (not stored)."""
        return x if self.mean is None else self.mean + (x - self.mean) / k

    def novelty(self, m: float) -> float:
        """How far ``m`` lies outside the range seen so far, in units of that range (0 inside)."""
        hi = max(self.ring_hi, self.cur_hi)
        lo = min(self.ring_lo, self.cur_lo)
        span = hi - lo
        if not span > 0.0:  # one value seen (or none): no range to be outside of
            return 0.0
        if m > hi:
            return (m - hi) / span
        if m < lo:
            return (lo - m) / span
        return 0.0

    def learn(self, m: float, block: int, blocks: int) -> None:
        self.mean = m
        if m > self.cur_hi:
            self.cur_hi = m
        if m < self.cur_lo:
            self.cur_lo = m
        self.count += 1
        if self.count >= block:
            self.his.append(self.cur_hi)
            self.los.append(self.cur_lo)
            if len(self.his) > blocks:
                del self.his[0], self.los[0]
            self.ring_hi, self.ring_lo = max(self.his), min(self.los)
            self.cur_hi, self.cur_lo, self.count = -math.inf, math.inf, 0

    def to_list(self) -> list[Any]:
        return [self.mean, _finite(self.cur_hi), _finite(self.cur_lo), self.count, list(self.his), list(self.los)]

    @classmethod
    def from_list(cls, data: list[Any]) -> _Range:
        r = cls()
        mean, cur_hi, cur_lo, count, his, los = data
        r.mean = None if mean is None else float(mean)
        r.cur_hi = -math.inf if cur_hi is None else float(cur_hi)
        r.cur_lo = math.inf if cur_lo is None else float(cur_lo)
        r.count = int(count)
        r.his = [float(v) for v in his]
        r.los = [float(v) for v in los]
        if len(r.his) != len(r.los):
            raise ValueError("novelty state: block extremes of different lengths")
        if r.his:
            r.ring_hi, r.ring_lo = max(r.his), min(r.los)
        return r


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


class NoveltyScorer(base.AnomalyDetector):
    """Multi-scale range novelty -> likelihood -> onsets; see the module docstring.

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
    ) -> None:
        if not scales or any(int(k) < 1 for k in scales):
            raise ValueError(f"scales must be >= 1 samples each, got {scales!r}")
        if blocks < 1 or memory < blocks:
            raise ValueError(f"need memory >= blocks >= 1, got memory={memory!r} blocks={blocks!r}")
        if short < 1 or not 0.0 < fading < 1.0 or rearm < 1 or escalation < 1.0 or grace < 0 or warmup < 0:
            raise ValueError("need short >= 1, 0 < fading < 1, rearm >= 1, escalation >= 1, grace and warmup >= 0")
        self.scales = tuple(int(k) for k in scales)
        self.memory = memory
        self.blocks = blocks
        self.grace = grace
        self.short = short
        self.fading = fading
        self.warmup = warmup
        self.onset = onset
        self.rearm = rearm
        self.escalation = escalation
        self._block = max(1, memory // blocks)
        self._reset()

    def _reset(self) -> None:
        self._features: dict[Hashable, list[_Range]] = {}  # feature name -> one range per scale
        self._seen: dict[Hashable, int] = {}  # samples learned per feature
        self._n = 0  # samples learned
        self._recent: list[float] = []  # the last `short` raw scores
        self._lik_n = 0
        self._lik_mean = 0.0
        self._lik_var = 0.0
        self._episode_max = 0.0  # highest score reported in the current episode
        self._quiet = 0  # samples in a row at likelihood 0

    # --- river's interface

    def learn_one(self, x: dict[Hashable, Any]) -> None:
        raw, moved = self._raw(x)
        recent, short_mean = self._short(raw)
        level = self._level(short_mean)
        self._report(level, commit=True)
        for name, means in moved.items():
            ranges = self._features.get(name)
            if ranges is None:
                ranges = self._features[name] = [_Range() for _ in self.scales]
            for r, m in zip(ranges, means, strict=True):
                r.learn(m, self._block, self.blocks)
            self._seen[name] = self._seen.get(name, 0) + 1
        self._n += 1
        self._recent = recent
        # the long-run distribution of the short mean: EW mean and variance (1/n at first, so the
        # first samples are not dominated by the zero start)
        self._lik_n += 1
        a = max(self.fading, 1.0 / self._lik_n)
        d = short_mean - self._lik_mean
        self._lik_mean += a * d
        self._lik_var = (1.0 - a) * (self._lik_var + a * d * d)

    def score_one(self, x: dict[Hashable, Any]) -> float:
        raw, _ = self._raw(x)
        _, short_mean = self._short(raw)
        return self._report(self._level(short_mean), commit=False)

    def novelty_one(self, x: dict[Hashable, Any]) -> dict[Hashable, float]:
        """Each feature's range novelty for ``x`` (the most novel scale), before the likelihood."""
        out: dict[Hashable, float] = {}
        for name, value in x.items():
            v = _number(value)
            ranges = self._features.get(name)
            if v is None or ranges is None:
                continue
            seen = self._seen.get(name, 0) >= self.grace
            out[name] = max((r.novelty(r.moved(v, k)) for r, k in zip(ranges, self.scales, strict=True)),
                            default=0.0) if seen else 0.0
        return out

    # --- the three layers

    def _raw(self, x: Mapping[Hashable, Any]) -> tuple[float, dict[Hashable, list[float]]]:
        best = 0.0
        moved: dict[Hashable, list[float]] = {}
        for name, value in x.items():
            v = _number(value)
            if v is None:  # missing or not a number: this feature sits the sample out
                continue
            ranges = self._features.get(name)
            if ranges is None:
                moved[name] = [v] * len(self.scales)
                continue
            means = [r.moved(v, k) for r, k in zip(ranges, self.scales, strict=True)]
            moved[name] = means
            if self._seen.get(name, 0) >= self.grace:
                for r, m in zip(ranges, means, strict=True):
                    e = r.novelty(m)
                    if e > best:
                        best = e
        return best / (1.0 + best), moved

    def _short(self, raw: float) -> tuple[list[float], float]:
        recent = self._recent[1:] + [raw] if len(self._recent) >= self.short else self._recent + [raw]
        return recent, sum(recent) / len(recent)

    def _level(self, short_mean: float) -> float:
        if self._n < self.warmup or self._lik_n == 0:
            return 0.0
        sd = max(math.sqrt(self._lik_var), _SD_FLOOR)
        z = (short_mean - self._lik_mean) / sd
        if z <= 0.0:
            return 0.0
        return min(1.0, math.log(_tail(z) + 1e-10) / _LOG_EPS)

    def _report(self, level: float, *, commit: bool) -> float:
        if not self.onset:
            return level
        if level <= 0.0:
            if commit:
                self._quiet += 1
                if self._quiet >= self.rearm:
                    self._episode_max = 0.0
            return 0.0
        reported = level if level > self.escalation * self._episode_max else 0.0
        if commit:
            self._quiet = 0
            if reported:
                self._episode_max = reported
        return reported

    # --- state

    def state_dict(self) -> dict[str, Any]:
        """Everything learned, as plain JSON data (lists, floats, ints; None for "not yet"); feature
        names become strings (JSON object keys)."""
        return {
            "v": STATE_VERSION,
            "params": self._params_key(),
            "n": self._n,
            "features": {str(name): [r.to_list() for r in ranges] for name, ranges in self._features.items()},
            "seen": {str(name): n for name, n in self._seen.items()},
            "recent": list(self._recent),
            "lik": [self._lik_n, self._lik_mean, self._lik_var],
            "episode": [self._episode_max, self._quiet],
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (ValueError if it is another version or configuration)."""
        if state.get("v") != STATE_VERSION:
            raise ValueError(f"novelty scorer state v{state.get('v')!r}, expected v{STATE_VERSION}")
        if state.get("params") != self._params_key():
            raise ValueError("novelty scorer state was learned with other parameters")
        features: dict[Hashable, list[_Range]] = {
            str(name): [_Range.from_list(r) for r in ranges] for name, ranges in state["features"].items()
        }
        if any(len(ranges) != len(self.scales) for ranges in features.values()):
            raise ValueError("novelty scorer state: a feature has the wrong number of scales")
        self._reset()
        self._features = features
        self._seen = {str(k): int(v) for k, v in state["seen"].items()}
        self._n = int(state["n"])
        self._recent = [float(v) for v in state["recent"]][-self.short:]
        lik_n, lik_mean, lik_var = state["lik"]
        self._lik_n, self._lik_mean, self._lik_var = int(lik_n), float(lik_mean), float(lik_var)
        episode_max, quiet = state["episode"]
        self._episode_max, self._quiet = float(episode_max), int(quiet)

    def _params_key(self) -> list[Any]:
        return [list(self.scales), self.memory, self.blocks, self.grace, self.short, self.fading, self.warmup,
                self.onset, self.rearm, self.escalation]

    @property
    def samples(self) -> int:
        """Samples learned so far."""
        return self._n


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def make_scorer(**params: Any) -> NoveltyScorer:
    """A :class:`NoveltyScorer` with ``params`` (its defaults otherwise): the scorer the ``learned``
    detector runs on each replica, and the one ``bench/nab`` evaluates."""
    return NoveltyScorer(**params)
