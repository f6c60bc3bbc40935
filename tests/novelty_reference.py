"""The novelty scorer computed directly, one stream, one sample at a time, in plain Python.

The oracle for tests: the arithmetic of
:class:`~skewwatch.pipeline.detectors.novelty.NoveltyBank` (which the ``learned`` detector and
``make_scorer`` run) written out value by value, with no arrays, no batches and no row bookkeeping.
The two agree to float rounding (``math.erfc`` here, scipy's there: they may differ in the last
bit), and a state moves from one to the other and goes on identically
(``tests/unit/test_novelty_scorer.py``).

>>> scorer = ReferenceScorer(scales=(1, 4), memory=40, grace=5, warmup=5)
>>> for i in range(60):
...     scorer.learn_one({"a": 1.0 + i % 3})
>>> round(scorer.novelty_one({"a": 9.0})["a"], 1), scorer.score_one({"a": 2.0})
(5.7, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from skewwatch.pipeline.detectors.novelty import _LOG_EPS, _SD_FLOOR, STATE_VERSION, NoveltyParams
from skewwatch.pipeline.finite import finite_or_none


class _Feature:
    """One feature of a one-stream scorer: a bank row's arrays for that feature, as Python lists."""

    __slots__ = ("mean", "cur_hi", "cur_lo", "ring_hi", "ring_lo", "ring_max", "ring_min", "count", "head", "seen")

    def __init__(self, scales: int, blocks: int) -> None:
        self.mean = [math.nan] * scales
        self.cur_hi = [-math.inf] * scales
        self.cur_lo = [math.inf] * scales
        self.ring_hi = [[-math.inf] * blocks for _ in range(scales)]
        self.ring_lo = [[math.inf] * blocks for _ in range(scales)]
        self.ring_max = [-math.inf] * scales
        self.ring_min = [math.inf] * scales
        self.count = 0
        self.head = 0
        self.seen = 0


class ReferenceScorer:
    """One stream's novelty scorer, sample by sample in plain Python: the oracle of the bank.

    The parameters are :class:`~skewwatch.pipeline.detectors.novelty.NoveltyParams`; ``learn_one``,
    ``score_one``, ``novelty_one``, ``state_dict`` and ``load_state`` as the public scorer's.
    """

    def __init__(self, **params: Any) -> None:
        if "scales" in params:
            params["scales"] = tuple(int(k) for k in params["scales"])
        self._params = NoveltyParams(**params)
        self._k = [float(k) for k in self._params.scales]
        self._features: dict[Hashable, _Feature] = {}
        self._n = 0
        self._recent = [0.0] * self._params.short  # the last `short` raw scores (a ring)
        self._recent_n = 0
        self._lik = [0.0, 0.0, 0.0]  # EW of the short mean: samples, mean, variance
        self._episode = [0.0, 0.0]  # highest score reported in the episode, samples at level 0

    # --- the scorer's interface

    def learn_one(self, x: dict[Hashable, Any]) -> None:
        moved, novelty, raw, short_mean, level, score = self._evaluate(x)
        p = self._params
        ks = self._k
        for name, means in moved.items():
            feature = self._features.get(name)
            if feature is None:
                feature = self._features[name] = _Feature(len(self._k), p.blocks)
            feature.seen += 1
            for i, m in enumerate(means):
                feature.mean[i] = m
                if p.settle and feature.seen < ks[i]:  # the scale has not settled: not in its range yet
                    continue
                if m > feature.cur_hi[i]:
                    feature.cur_hi[i] = m
                if m < feature.cur_lo[i]:
                    feature.cur_lo[i] = m
            feature.count += 1
            if feature.count >= p.block:
                slot = feature.head
                for i in range(len(means)):
                    feature.ring_hi[i][slot] = feature.cur_hi[i]
                    feature.ring_lo[i][slot] = feature.cur_lo[i]
                    feature.ring_max[i] = max(feature.ring_hi[i])
                    feature.ring_min[i] = min(feature.ring_lo[i])
                    feature.cur_hi[i], feature.cur_lo[i] = -math.inf, math.inf
                feature.head = (slot + 1) % p.blocks
                feature.count = 0
        self._n += 1
        if p.short > 1:
            self._recent[self._recent_n % p.short] = raw
        self._recent_n += 1
        lik = self._lik
        lik[0] += 1.0
        a = max(p.fading, 1.0 / lik[0])
        d = short_mean - lik[1]
        lik[1] += a * d
        lik[2] = (1.0 - a) * (lik[2] + a * d * d)
        if not p.onset:  # the episode only gates onsets
            return
        episode = self._episode
        at_zero = level <= 0.0
        episode[1] = episode[1] + 1.0 if at_zero else 0.0
        if score > 0.0:
            episode[0] = score
        elif at_zero and episode[1] >= p.rearm:
            episode[0] = 0.0

    def score_one(self, x: dict[Hashable, Any]) -> float:
        return self._evaluate(x)[5]

    def novelty_one(self, x: dict[Hashable, Any]) -> dict[Hashable, float]:
        """Each known feature's range novelty for ``x`` (the most novel scale), before the likelihood."""
        return self._evaluate(x)[1]

    def _evaluate(
        self, x: Mapping[Hashable, Any]
    ) -> tuple[dict[Hashable, list[float]], dict[Hashable, float], float, float, float, float]:
        """(each valid feature's moved means, novelty of the known ones, raw, short mean, level, score)."""
        p = self._params
        ks = self._k
        best = 0.0
        moved: dict[Hashable, list[float]] = {}
        novelty: dict[Hashable, float] = {}
        for name, value in x.items():
            v = finite_or_none(value)
            if v is None:  # missing or not a number: this feature sits the sample out
                continue
            feature = self._features.get(name)
            if feature is None:
                moved[name] = [v] * len(ks)
                continue
            means = [v if math.isnan(m) else m + (v - m) / k for m, k in zip(feature.mean, ks, strict=True)]
            moved[name] = means
            e_max = 0.0
            if feature.seen >= p.grace:
                for i, m in enumerate(means):
                    if feature.seen < p.settle * ks[i]:
                        continue
                    if p.drift and feature.ring_max[i] > -math.inf:
                        hi, lo = feature.ring_max[i], feature.ring_min[i]
                    else:
                        hi = max(feature.ring_max[i], feature.cur_hi[i])
                        lo = min(feature.ring_min[i], feature.cur_lo[i])
                    span = hi - lo
                    if span >= 0.0:
                        span = max(span, p.span_floor)
                    if span > 0.0 and span != math.inf:
                        outside = max(m - hi, lo - m)
                        if outside > 0.0 and outside / span > e_max:
                            e_max = outside / span
            novelty[name] = e_max
            if e_max > best:
                best = e_max
        raw = best / (1.0 + best)
        filled = min(self._recent_n, p.short)
        if p.short > 1:
            kept = sum(self._recent) - (self._recent[self._recent_n % p.short] if filled >= p.short else 0.0)
        else:
            kept = 0.0
        short_mean = (kept + raw) / min(filled + 1, p.short)
        n_lik, lik_mean, lik_var = self._lik
        level = 0.0
        if self._n >= p.warmup and n_lik > 0:
            z = (short_mean - lik_mean) / max(math.sqrt(lik_var), _SD_FLOOR)
            if z > 0.0:
                level = min(1.0, math.log(0.5 * math.erfc(z / math.sqrt(2.0)) + 1e-10) / _LOG_EPS)
        onset = level > 0.0 and level > p.escalation * self._episode[0]
        score = level if not p.onset or onset else 0.0
        return moved, novelty, raw, short_mean, level, score

    # --- state

    def state_dict(self) -> dict[str, Any]:
        """Everything learned, as plain JSON data: a :class:`NoveltyBank` row's state (``row_state``),
        with the version and parameters; feature names become strings (JSON object keys)."""
        return {
            "v": STATE_VERSION,
            "params": self._params.key(),
            "n": self._n,
            "features": {
                str(name): {
                    "mean": _plain_list(f.mean),
                    "cur": [_plain_list(f.cur_hi), _plain_list(f.cur_lo)],
                    "ring": [_plain_list([v for ring in f.ring_hi for v in ring]),
                             _plain_list([v for ring in f.ring_lo for v in ring])],
                    "count": f.count,
                    "head": f.head,
                    "seen": f.seen,
                }
                for name, f in self._features.items()
            },
            "recent": list(self._recent),
            "recent_n": self._recent_n,
            "lik": list(self._lik),
            "episode": list(self._episode),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (ValueError if it is another version or configuration)."""
        if state.get("v") != STATE_VERSION:
            raise ValueError(f"novelty scorer state v{state.get('v')!r}, expected v{STATE_VERSION}")
        if state.get("params") != self._params.key():
            raise ValueError("novelty scorer state was learned with other parameters")
        s, b = len(self._k), self._params.blocks
        features: dict[Hashable, _Feature] = {}
        for name, data in state["features"].items():
            f = features[name] = _Feature(s, b)
            f.mean = _numbers(data["mean"], math.nan)
            f.cur_hi, f.cur_lo = _numbers(data["cur"][0], -math.inf), _numbers(data["cur"][1], math.inf)
            ring_hi, ring_lo = _numbers(data["ring"][0], -math.inf), _numbers(data["ring"][1], math.inf)
            f.ring_hi = [ring_hi[i * b:(i + 1) * b] for i in range(s)]
            f.ring_lo = [ring_lo[i * b:(i + 1) * b] for i in range(s)]
            f.ring_max = [max(ring) for ring in f.ring_hi]
            f.ring_min = [min(ring) for ring in f.ring_lo]
            f.count, f.head, f.seen = int(data["count"]), int(data["head"]) % b, int(data["seen"])
        self._features = features
        self._n = int(state["n"])
        self._recent = [float(v) for v in state["recent"]]
        self._recent_n = int(state["recent_n"])
        self._lik = [float(v) for v in state["lik"]]
        self._episode = [float(v) for v in state["episode"]]

    @property
    def samples(self) -> int:
        """Samples learned so far."""
        return self._n


def _plain_list(values: Sequence[float]) -> list[float | None]:
    return [finite_or_none(v) for v in values]


def _numbers(values: list[float | None], missing: float) -> list[float]:
    return [missing if v is None else float(v) for v in values]
