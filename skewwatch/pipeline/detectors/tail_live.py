"""long_tail's live rule: the engine's per-token latencies over the last scrapes against a baseline.

Statistic: the *tail excess* ``x = ln(mean TPOT / baseline mean TPOT) - max(0, ln(median TPOT /
baseline median))`` (:func:`~skewwatch.pipeline.detectors.live.tail_excess`): how much slower the
replica's tokens are on average than its baseline's, beyond what a shift of its median explains.
It holds when ``x > live_z`` standard deviations of the replica's own ``x`` over its past steps
(:class:`~skewwatch.pipeline.detectors.live.Noise`), with ``live_min_tokens`` output tokens on the
replica and, for a pool baseline, on each peer (else its own past after ``live_history_steps``
steps), and not where its first tokens are slow too (prefill explains it; not once its alert is
open: then requests queue behind the stalled ones). Weaker steps add up: a one-sided CUSUM of
``z = live_z x x / threshold`` (the step's excess in standard deviations, the threshold's peak
guard included) with reference ``live_drift``, ``S = max(0, S + z - live_drift)`` over judged
steps whose spans do not overlap (``live_span_s`` apart; capped at ``live_z``), also holds when
``S > live_z - live_drift`` on a step whose own ``z`` adds to it (``z > live_drift``: once the
tail ends the alert clears as before): one step beyond ``live_z`` holds as before, two at 3.25 or
three at 2.7 hold together. A step that prefill explains, or a gap of more than
``2 x live_span_s`` without one summed, ends the sum. The constants are
:class:`~skewwatch.pipeline.detectors.long_tail_config.LongTailConfig`'s (what each does:
:mod:`~skewwatch.pipeline.detectors.long_tail`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from skewwatch.pipeline.detectors.alerts import fmt
from skewwatch.pipeline.detectors.live import LiveAggregate, Noise, SlowBaseline, aggregate, record, tail_excess
from skewwatch.pipeline.detectors.threshold import Finding
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

#: The rule's judgement: the aggregate, baseline, its source, tail excess, noise, threshold,
#: history steps, first tokens' ratio, prefill, holds.
LiveJudgement = tuple[LiveAggregate, LiveAggregate, str, float, float, float, int, float | None, bool, bool]

LIVE_SUM = "live_sum"  # memory: the CUSUM of the steps' excess in standard deviations, and its time


class LiveSettings(Protocol):
    """The constants the rule reads (``[detectors.long_tail]``)."""

    @property
    def live_span_s(self) -> float: ...
    @property
    def ttft_span_s(self) -> float: ...
    @property
    def live_min_tokens(self) -> float: ...
    @property
    def live_z(self) -> float: ...
    @property
    def live_drift(self) -> float: ...
    @property
    def live_noise_prior(self) -> float: ...
    @property
    def live_noise_floor(self) -> float: ...
    @property
    def live_noise_tau_s(self) -> float: ...
    @property
    def live_history_steps(self) -> int: ...
    @property
    def min_count(self) -> int: ...
    @property
    def ttft_ratio(self) -> float: ...
    @property
    def sample_rate(self) -> float: ...


class LiveRule:
    """The rule over a replica's detector memory (its recorded samples, noise and own baseline)."""

    def __init__(self, config: LiveSettings) -> None:
        self.config = config

    def finding(self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any],
                peer_live: LiveAggregate | None, evidence: dict[str, Any], is_open: bool = False) -> Finding:
        """The rule on ``fv``'s replica (``is_open``: its alert is); keeps its samples, noise and own
        baseline in ``memory``."""
        cfg = self.config
        record(memory, telemetry, cfg.ttft_span_s)
        agg = self.aggregate(memory, fv.window_end)
        judged = self.learn(fv, memory, agg, peer_live, is_open)
        if judged is None:
            return Finding(holds=None, evidence=evidence)
        agg, baseline, source, excess, sigma, threshold, steps, ttft_ratio, prefill, holds = judged
        evidence.update({"live_tokens": agg.tokens, "live_tpot_mean_ms": 1000 * agg.tpot_mean_s,
                         "baseline_tpot_mean_ms": 1000 * baseline.tpot_mean_s, "baseline": source,
                         "tail_excess": excess, "noise": sigma, "threshold": threshold, "history_steps": steps,
                         "ttft_over_baseline": ttft_ratio})
        summed = float(memory[LIVE_SUM][0]) if LIVE_SUM in memory else 0.0
        evidence.update({"live_sum": summed, "live_sum_threshold": cfg.live_z - cfg.live_drift})
        why = (f"{excess:.2f} > {threshold:.2f}, {excess / sigma:.1f} standard deviations" if excess > threshold else
               f"{excess:.2f}, {excess / sigma:.1f} standard deviations; summed over the last steps "
               f"{summed:.1f} > {cfg.live_z - cfg.live_drift:g}")
        message = (
            f"long tail (live): tokens took {fmt(1000 * agg.tpot_mean_s, 1)} ms on average, "
            f"the {source}' {fmt(1000 * baseline.tpot_mean_s, 1)} ms: {math.exp(excess):.2f} x beyond "
            f"its median's shift ({why}; {agg.tokens:.0f} tokens in {cfg.live_span_s:g} s)"
        )
        if prefill and not is_open:
            message += f"; first tokens {ttft_ratio:.1f} x slower: prefill explains it"
        elif prefill:
            message += f"; first tokens {ttft_ratio:.1f} x slower: requests queue behind the stalled ones"
        return Finding(holds=holds, message=message, evidence=evidence, params={"sample_rate": cfg.sample_rate})

    def learn(self, fv: FeatureVector, memory: dict[str, Any], agg: LiveAggregate | None,
              peer_live: LiveAggregate | None, is_open: bool = False) -> LiveJudgement | None:
        """The live rule's judgement of ``agg`` (the replica's recorded samples, aggregated at its
        window end), None where it makes no claim; the noise and the own baseline learn from a
        step where the rule does not hold. Slow first tokens explain slow tokens before the alert
        opens, not while it is open (``is_open``): on a busy replica the stalled requests hold
        batch slots, and the requests behind them wait."""
        cfg = self.config
        if agg is None or agg.tokens < cfg.live_min_tokens:
            return None  # nothing learnt: the baseline and noise are made on first use (as they start)
        alpha = min(5.0 / cfg.live_noise_tau_s, 1.0)  # one step of 5 s
        own = SlowBaseline(memory, "live_base", alpha)
        noise = Noise(memory, "live_noise", alpha, cfg.live_noise_prior, 1.0, cfg.live_noise_floor)
        baseline, source = (peer_live, "peers") if peer_live is not None else \
            (own.get(cfg.live_history_steps), "own past")
        if baseline is None or baseline.tpot_mean_s <= 0 or fv.count < cfg.min_count:
            own.update(agg)
            return None
        excess = tail_excess(memory, fv.window_end, cfg.live_span_s, baseline)
        if excess is None:
            return None
        sigma = noise.sigma
        threshold = noise.threshold(cfg.live_z)
        steps = noise.steps
        ttft_ratio = None  # the larger of the median's and the slowest first tokens' ratio to the baseline's
        if agg.ttft_p50_s and baseline.ttft_p50_s:
            ttft_ratio = agg.ttft_p50_s / baseline.ttft_p50_s
        if agg.ttft_p99_s and baseline.ttft_p99_s:
            ttft_ratio = max(ttft_ratio or 0.0, agg.ttft_p99_s / baseline.ttft_p99_s)
        prefill = ttft_ratio is not None and ttft_ratio > cfg.ttft_ratio
        judging = not (prefill and not is_open) and steps >= cfg.live_history_steps
        z = cfg.live_z * excess / threshold if judging and threshold > 0 else None
        summed = self._sum(memory, fv.window_end, z)
        # the sum holds on a step that adds to it: once the tail ends, the alert clears as before
        holds = judging and (excess > threshold or (summed > cfg.live_z - cfg.live_drift
                                                    and z is not None and z > cfg.live_drift))
        if not holds:
            noise.update(excess)
            own.update(agg)
        return agg, baseline, source, excess, sigma, threshold, steps, ttft_ratio, prefill, holds

    def _sum(self, memory: dict[str, Any], now: float, z: float | None) -> float:
        """The CUSUM after this step's ``z`` (None: the sum ends), kept in ``memory`` while positive.
        It sums steps whose spans do not overlap (``live_span_s`` apart: consecutive steps share
        scrapes, and their excesses move together); a gap of more than twice that ends it. Capped at
        ``live_z`` (one step's proof): a long tail that ended does not argue for the next minutes."""
        cfg = self.config
        last = memory.get(LIVE_SUM)
        if z is not None and last is not None and now - float(last[1]) < cfg.live_span_s:
            return float(last[0])  # the step's span overlaps the last one summed: no new evidence
        before = float(last[0]) if last is not None and now - float(last[1]) <= 2.0 * cfg.live_span_s else 0.0
        total = 0.0 if z is None else min(max(0.0, before + z - cfg.live_drift), cfg.live_z)
        if total > 0.0:
            memory[LIVE_SUM] = [total, now]
        else:
            memory.pop(LIVE_SUM, None)
        return total

    def aggregate(self, memory: dict[str, Any], now: float) -> LiveAggregate | None:
        """The live aggregate of the last ``live_span_s``, its TTFT over the last ``ttft_span_s``
        (requests start seldom, and a stuck queue starts none)."""
        cfg = self.config
        agg = aggregate(memory, now, cfg.live_span_s)
        if agg is None:
            return None
        slow_start = aggregate(memory, now, cfg.ttft_span_s)
        ttft = slow_start.ttft_p50_s if slow_start is not None else None
        return LiveAggregate(agg.tokens, agg.tpot_mean_s, agg.tpot_p50_s, ttft, agg.ttft_p99_s, agg.tpot_top_s)


__all__ = ["LIVE_SUM", "LiveJudgement", "LiveRule", "LiveSettings"]
