"""Latency histograms as engines export them, and the per-interval summary telemetry carries.

vLLM exports per-token latencies live, as Prometheus histograms observed when a token is
produced (not when its request finishes): ``vllm:time_to_first_token_seconds`` (one observation
per request, at its first token) and ``vllm:time_per_output_token_seconds`` (renamed
``vllm:inter_token_latency_seconds`` in later versions: one observation per output token after
the first, the time since the previous one). Between two scrapes the delta of a histogram's
buckets, ``_sum`` and ``_count`` says how the tokens of that interval went. Contract
gpu-telemetry v1.3 carries that delta as a few numbers per sample (``tpot_count``,
``tpot_mean_s``, ``tpot_p50_s``, ``tpot_p99_s`` and the same for ``ttft_``), so a slowed replica
shows in the next sample instead of when its slow requests finish.

:class:`IntervalHistogram` accumulates one interval's observations in an engine's buckets (the
fleet simulator's engines use it); :func:`histogram_quantile` reads a quantile from bucket
counts the way Prometheus' ``histogram_quantile`` does (linear within the bucket; the last
finite bound for the ``+Inf`` bucket), so a bridge that takes the delta of a scraped histogram
and the simulator report the same thing.

>>> h = IntervalHistogram(TPOT_BUCKETS_S)
>>> h.observe(0.03, 90)
>>> h.observe(0.3, 10)
>>> h.count, round(h.mean(), 3), round(h.quantile(0.5), 4), round(h.quantile(0.99), 3)
(100, 0.057, 0.0389, 0.29)
>>> histogram_quantile((1.0, 2.0), [0, 0, 0], 0.5) is None
True
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

#: vLLM's bucket upper bounds (seconds) of ``vllm:time_per_output_token_seconds``.
TPOT_BUCKETS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                     5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
#: vLLM's bucket upper bounds (seconds) of ``vllm:time_to_first_token_seconds``.
TTFT_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                     5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


def histogram_quantile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram with finite upper ``bounds`` and ``len(bounds) + 1``
    per-bucket (not cumulative) ``counts``, the last for ``+Inf``; None when it holds nothing.

    As Prometheus' ``histogram_quantile``: the rank ``q x total`` is located in its bucket and
    interpolated linearly between the bucket's bounds (the first bucket starts at 0); a rank in
    the ``+Inf`` bucket gives the largest finite bound.

    >>> histogram_quantile((1.0, 2.0, 4.0), [0, 10, 10, 0], 0.75)
    3.0
    >>> histogram_quantile((1.0, 2.0), [0, 0, 5], 0.5)
    2.0
    """
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"need {len(bounds) + 1} bucket counts for {len(bounds)} bounds, got {len(counts)}")
    total = float(sum(counts))
    if total <= 0:
        return None
    rank = min(max(q, 0.0), 1.0) * total
    seen = 0.0
    for i, count in enumerate(counts):
        if count > 0 and seen + count >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            lower = 0.0 if i == 0 else float(bounds[i - 1])
            return lower + (float(bounds[i]) - lower) * (rank - seen) / float(count)
        seen += count
    return float(bounds[-1])


class IntervalHistogram:
    """One interval's observations: bucket counts (engine bounds), count and sum; :meth:`reset` per sample."""

    __slots__ = ("bounds", "buckets", "count", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``times`` observations of ``value`` (seconds)."""
        if times <= 0:
            return
        # Prometheus buckets are "le": a value equal to a bound belongs to that bound's bucket
        self.buckets[bisect.bisect_left(self.bounds, value)] += times
        self.count += times
        self.total += value * times

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(self.bounds, self.buckets, q)

    def reset(self) -> None:
        self.buckets = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0
