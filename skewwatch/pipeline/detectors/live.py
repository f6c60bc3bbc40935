"""Live engine signals: what a replica's engine reported over its last few scrapes, and its baselines.

A request event exists only once the request has finished, so a replica that slows down shows in
the windows of finished requests only when its slowed requests finish (tens of seconds later on a
conversation trace). Engines export per-token latencies *as tokens are produced*: vLLM's
``vllm:time_per_output_token_seconds`` and ``vllm:time_to_first_token_seconds`` histograms (and
SGLang's equivalents), which the scrape bridge turns into each sample's ``tpot_*`` and ``ttft_*``
fields: the output tokens produced since the previous sample, their mean and median time per
token, and the first tokens with their mean time to first token (contract gpu-telemetry v1.3).

:func:`record` keeps the samples of the last ``span_s`` in a replica's detector memory (plain JSON
data, checkpointed with it; the same sample read twice counts once) and :func:`aggregate` sums
them: tokens, their mean time per token, the median of the samples' medians, and the median of
the samples' median TTFT. :func:`peer_baselines` pools the *other* replicas' aggregates per replica (tokens
weighted), and :class:`SlowBaseline` is a replica's own past (an exponentially weighted mean),
for a replica without enough peers.

>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> memory = {}
>>> for ts in (5.0, 10.0, 10.0, 15.0):  # the sample at 10 s read twice
...     record(memory, TelemetrySample(ts=ts, replica="r", source="vllm", tpot_count=100,
...            tpot_mean_s=0.02, tpot_p50_s=0.018, ttft_count=2, ttft_p50_s=0.1), span_s=20.0)
>>> agg = aggregate(memory, now=15.0, span_s=20.0)
>>> agg.tokens, round(agg.tpot_mean_s, 3), agg.tpot_p50_s, agg.ttft_p50_s
(300.0, 0.02, 0.018, 0.1)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from skewwatch.pipeline.detectors.peers import others_count, others_median, others_sum
from skewwatch.schemas.telemetry_sample import TelemetrySample

LIVE_KEY = "live"  # the memory entry: [[ts, tokens, tpot sum s, tpot p50 s, ttft count, ttft p50 s, ttft p99 s], ...]


@dataclass(frozen=True, slots=True)
class LiveAggregate:
    """A replica's live per-token latencies over a span (or a baseline of them)."""

    tokens: float  # output tokens (after each request's first) behind the numbers
    tpot_mean_s: float  # their mean time per output token
    tpot_p50_s: float | None  # median of the samples' medians
    ttft_p50_s: float | None = None  # median time to first token of the requests that started (median of
    # the samples' medians: one long prompt's prefill moves a mean, not this)
    ttft_p99_s: float | None = None  # the slowest first tokens: the largest of the samples' P99s (a long
    # prefill, which stalls every running request's next token, shows here)
    tpot_top_s: float | None = None  # the slowest sample's mean time per token (of those with tokens and
    # time): no token-weighted mean of the samples' ratios to a baseline is above its ratio


def record(memory: dict[str, Any], sample: TelemetrySample | None, span_s: float) -> None:
    """Keep ``sample``'s live latencies (if it has any and is newer than the last one kept), and
    only the samples of the last ``span_s`` before it."""
    if sample is None or not sample.tpot_count or sample.tpot_mean_s is None:
        return
    rows: list[list[float]] = memory.setdefault(LIVE_KEY, [])
    if rows and sample.ts <= rows[-1][0]:
        return  # the same sample again (its age < the scrape interval), or an older one
    ttft_n = float(sample.ttft_count or 0) if sample.ttft_p50_s is not None else 0.0
    rows.append([float(sample.ts), float(sample.tpot_count), sample.tpot_count * sample.tpot_mean_s,
                 math.nan if sample.tpot_p50_s is None else float(sample.tpot_p50_s),
                 ttft_n, float(sample.ttft_p50_s) if ttft_n and sample.ttft_p50_s is not None else math.nan,
                 float(sample.ttft_p99_s) if ttft_n and sample.ttft_p99_s is not None else math.nan])
    cutoff = sample.ts - span_s
    while rows and rows[0][0] <= cutoff:
        rows.pop(0)


def aggregate(memory: Mapping[str, Any], now: float, span_s: float) -> LiveAggregate | None:
    """The samples of ``(now - span_s, now]`` summed; None without any."""
    rows = [row for row in memory.get(LIVE_KEY, ()) if now - span_s < row[0] <= now]
    tokens = sum(row[1] for row in rows)
    if tokens <= 0:
        return None
    medians = [row[3] for row in rows if row[1] > 0 and not math.isnan(row[3])]
    ttft = [row[5] for row in rows if row[4] > 0 and not math.isnan(row[5])]
    ttft_top = [row[6] for row in rows if row[4] > 0 and len(row) > 6 and not math.isnan(row[6])]
    means = [row[2] / row[1] for row in rows if row[1] > 0 and row[2] > 0]  # tail_excess's samples
    return LiveAggregate(
        tokens=tokens,
        tpot_mean_s=sum(row[2] for row in rows) / tokens,
        tpot_p50_s=float(np.median(medians)) if medians else None,
        ttft_p50_s=float(np.median(ttft)) if ttft else None,
        ttft_p99_s=max(ttft_top) if ttft_top else None,
        tpot_top_s=max(means) if means else None,
    )


def tail_excess(memory: Mapping[str, Any], now: float, span_s: float, baseline: LiveAggregate) -> float | None:
    """How much slower than ``baseline`` the replica's tokens were, beyond a shift of its median:
    per sample ``ln(mean / baseline mean) - max(0, ln(median / baseline median))``, averaged over
    the samples of the span weighted by their tokens. Per sample, so that a replica slowing down as
    a whole (its mean and its median move together) reads 0 from its first slowed sample on.

    >>> memory = {LIVE_KEY: [[5.0, 100, 100 * 0.02, 0.02, 0, 0.0], [10.0, 100, 100 * 0.06, 0.06, 0, 0.0]]}
    >>> base = LiveAggregate(1000, 0.02, 0.02)
    >>> round(tail_excess(memory, 10.0, 20.0, base), 6)  # the second sample 3 x slower, all of it
    0.0
    >>> memory[LIVE_KEY][1][3] = 0.02  # ... its median as before: a tail
    >>> round(tail_excess(memory, 10.0, 20.0, base), 3)
    0.549
    """
    if baseline.tpot_mean_s <= 0:
        return None
    weight = total = 0.0
    for ts, tokens, tpot_sum, p50, *_ in memory.get(LIVE_KEY, ()):
        if not (now - span_s < ts <= now) or tokens <= 0 or tpot_sum <= 0:
            continue
        x = math.log(tpot_sum / tokens / baseline.tpot_mean_s)
        if baseline.tpot_p50_s and not math.isnan(p50) and p50 > 0:
            # a shift of the median explains at most all of the mean's (a sample where slow tokens
            # are the majority says nothing either way, rather than the opposite)
            x -= min(max(0.0, math.log(p50 / baseline.tpot_p50_s)), max(0.0, x))
        weight += tokens
        total += tokens * x
    return total / weight if weight > 0 else None


def peer_baselines(aggregates: Sequence[LiveAggregate | None], min_tokens: float,
                   min_peers: int) -> list[LiveAggregate | None]:
    """Per replica, its peers' pooled aggregate: the replicas with at least ``min_tokens`` tokens
    other than itself (token-weighted mean TPOT, median of their TPOT and TTFT medians); None
    with fewer than ``min_peers`` of them.

    >>> a = [LiveAggregate(100, 0.02, 0.02, 0.1), LiveAggregate(300, 0.04, 0.02, 0.1), None]
    >>> [None if b is None else round(b.tpot_mean_s, 3) for b in peer_baselines(a, 50, 1)]
    [0.04, 0.02, 0.035]
    """
    n = len(aggregates)
    if not any(map(operator.is_not, aggregates, repeat(None))):
        return [None] * n  # no replica has an aggregate: no peers anywhere
    valid = np.array([a is not None and a.tokens >= min_tokens for a in aggregates], dtype=bool)
    tokens = np.array([a.tokens if a is not None else 0.0 for a in aggregates])
    total = np.array([a.tokens * a.tpot_mean_s if a is not None else 0.0 for a in aggregates])
    p50 = np.array([a.tpot_p50_s if a is not None and a.tpot_p50_s is not None else math.nan for a in aggregates])
    ttft = np.array([a.ttft_p50_s if a is not None and a.ttft_p50_s is not None else math.nan for a in aggregates])
    ttft_top = np.array([a.ttft_p99_s if a is not None and a.ttft_p99_s is not None else math.nan for a in aggregates])
    peers = others_count(valid)
    peer_tokens = others_sum(tokens, valid)
    peer_total = others_sum(total, valid)
    peer_p50 = others_median(p50, valid & ~np.isnan(p50))
    peer_ttft = others_median(ttft, valid & ~np.isnan(ttft))
    peer_ttft_top = others_median(ttft_top, valid & ~np.isnan(ttft_top))
    out: list[LiveAggregate | None] = []
    for i in range(n):
        if peers[i] < max(min_peers, 1) or peer_tokens[i] <= 0:
            out.append(None)
            continue
        out.append(LiveAggregate(
            tokens=float(peer_tokens[i]),
            tpot_mean_s=float(peer_total[i] / peer_tokens[i]),
            tpot_p50_s=None if math.isnan(peer_p50[i]) else float(peer_p50[i]),
            ttft_p50_s=None if math.isnan(peer_ttft[i]) else float(peer_ttft[i]),
            ttft_p99_s=None if math.isnan(peer_ttft_top[i]) else float(peer_ttft_top[i]),
        ))
    return out


class SlowBaseline:
    """A replica's own past as an exponentially weighted mean of its aggregates, stored in its
    memory as ``[weight, tpot mean, tpot p50, ttft p50]`` (log means: ratios are what rules compare).

    ``alpha`` is the weight of each new step (``step_s / time constant``); the baseline counts as
    known once its weight reaches ``min_weight`` steps.

    >>> memory = {}
    >>> base = SlowBaseline(memory, "base", alpha=0.1)
    >>> for _ in range(5):
    ...     base.update(LiveAggregate(100, 0.02, 0.018, 0.1))
    >>> round(base.get(min_weight=4).tpot_mean_s, 4), base.get(min_weight=10) is None
    (0.02, True)
    """

    __slots__ = ("_row", "alpha")

    def __init__(self, memory: dict[str, Any], key: str, alpha: float) -> None:
        self._row: list[float] = memory.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        self.alpha = alpha

    def update(self, agg: LiveAggregate) -> None:
        row, a = self._row, self.alpha
        if agg.tpot_mean_s <= 0:
            return
        weight = row[0]
        p50 = agg.tpot_p50_s if agg.tpot_p50_s and agg.tpot_p50_s > 0 else agg.tpot_mean_s
        ttft = agg.ttft_p50_s if agg.ttft_p50_s and agg.ttft_p50_s > 0 else None
        new_weight = (1.0 - a) * weight + 1.0
        keep = (1.0 - a) * weight / new_weight
        row[1] = keep * row[1] + (1.0 - keep) * math.log(agg.tpot_mean_s)
        row[2] = keep * row[2] + (1.0 - keep) * math.log(p50)
        if ttft is not None:  # a mean over the steps that had first tokens (0: none yet)
            row[3] = math.log(ttft) if row[3] == 0.0 else (1.0 - a) * row[3] + a * math.log(ttft)
        row[0] = new_weight

    def get(self, min_weight: float) -> LiveAggregate | None:
        row = self._row
        if row[0] < min_weight:
            return None
        return LiveAggregate(tokens=row[0], tpot_mean_s=math.exp(row[1]), tpot_p50_s=math.exp(row[2]),
                             ttft_p50_s=math.exp(row[3]) if row[3] != 0.0 else None)


class Noise:
    """The spread of a statistic that is 0 when nothing is wrong, learned on this replica's own
    traffic, kept in its memory as ``[weight, sum of squares, peak, steps]``:

    * its standard deviation: an exponentially weighted mean of its square (each step weighs
      ``alpha``), started from a ``prior`` standard deviation worth ``prior_weight`` steps, never
      below ``floor``; a step's square counts at most ``clip`` standard deviations, so a fault's
      first steps, still under the threshold, do not raise the bar they are judged against;
    * its recent *peak*: the largest absolute value seen, decaying by ``1 - alpha`` per step. Heavy-
      tailed traffic (one long prefill stalls every token of a batch) has spikes no standard deviation
      of a few minutes predicts; :meth:`threshold` is never below the last ones.

    >>> memory = {}
    >>> noise = Noise(memory, "noise", alpha=0.05, prior=0.2, prior_weight=3.0, floor=0.05)
    >>> round(noise.sigma, 3), noise.steps
    (0.2, 0)
    >>> for _ in range(100):
    ...     noise.update(0.01)
    >>> round(noise.sigma, 3), round(noise.threshold(4.0), 3), noise.steps
    (0.05, 0.2, 100)
    >>> noise.update(1.0)  # a spike: the threshold is at least its decaying peak for a while
    >>> round(noise.threshold(4.0), 3)
    1.0
    """

    __slots__ = ("_row", "alpha", "clip", "floor")

    def __init__(self, memory: dict[str, Any], key: str, alpha: float, prior: float, prior_weight: float,
                 floor: float, clip: float = 2.0) -> None:
        row: list[float] = memory.setdefault(key, [prior_weight, prior_weight * prior * prior, 0.0, 0.0])
        self._row = row
        self.alpha = alpha
        self.floor = floor
        self.clip = clip

    @property
    def sigma(self) -> float:
        weight, total = self._row[0], self._row[1]
        return max(math.sqrt(total / weight) if weight > 0 else 0.0, self.floor)

    @property
    def steps(self) -> int:
        """Steps folded in so far (the history behind the numbers)."""
        return int(self._row[3])

    def threshold(self, z: float) -> float:
        """``z`` standard deviations, and never under the recent peak."""
        return max(z * self.sigma, self._row[2])

    def update(self, x: float) -> None:
        """Fold one step's value in."""
        row, a = self._row, self.alpha
        bound = self.clip * self.sigma
        row[0] = (1.0 - a) * row[0] + 1.0
        row[1] = (1.0 - a) * row[1] + min(x * x, bound * bound)
        row[2] = max(abs(x), (1.0 - a) * row[2])
        row[3] += 1.0


__all__ = ["LIVE_KEY", "LiveAggregate", "Noise", "SlowBaseline", "aggregate", "peer_baselines", "record", "tail_excess"]
