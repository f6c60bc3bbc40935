"""Long tail: P99 latency above 3 × P50 for 3 consecutive steps (seed §2.5).

Seed rule: "长尾请求: P99延迟 > 3×P50 且持续≥3个周期 → WARNING; 启用请求采样链路追踪注入"
(P99 > 3 × P50 lasting at least 3 periods → WARNING; turn on request sampling / tracing).

The rule is evaluated on the replica's 60 s window every 5 s step. A window with fewer than
``min_count`` requests cannot be judged: its P99 is simply its maximum (guard added by us; the
seed gives no minimum, set ``min_count = 1`` to evaluate every non-empty window). The action
``enable_tracing`` carries ``params.sample_rate`` (share of the replica's requests to trace).

**Option ``length_normalized``** (ours, off by default; on in ``bench/profiles/tuned.toml``):
an LLM request's latency follows its output length, so on real traffic P99/P50 is mostly the
spread of output lengths (3.7-7.5 on healthy replicas of the fleet simulator) and the seed's
rule holds everywhere. With the option the rule compares P99 with what the window's output
lengths explain instead: ``expected P99 = (latency_mean / completion_tokens_mean) x P99 of the
output length``, that P99 from a log-normal fit of the window's ``completion_tokens_mean`` and
``completion_tokens_var`` (lengths are heavy-tailed; a normal fit under-reads them). The rule
holds when ``latency_p99 > length_ratio x expected P99`` (healthy windows of the fleet
simulator: about 0.7, at most 1.1 on the conv trace and 1.26 on the code trace, whose P99/P50
reaches 43). It needs no history and no per-trace ratio, but it still sees
a slowed request only when it *finishes*: a tail of slow long requests shows a minute or more
after it starts (see docs/detectors.md).

**Option ``tpot_rule``** (ours, off by default; on in the tuned profile): also judge time per
output token (TPOT, decode time / output tokens, the window's ``tpot_*`` features). In an engine
that decodes a batch one token per step, every running request gets about the same TPOT, so a
request slowed by a factor shows that factor in its TPOT as soon as it finishes, short or long,
while its end-to-end latency hides among longer outputs. The rule holds when the window's largest
TPOT exceeds ``tpot_ratio`` x its TPOT median, and it is judged only on a replica whose TPOT was
*tight* ``tpot_lookback_s`` earlier (that window's TPOT P99 <= ``tpot_spread`` x its P50, both with
``min_count`` requests): where latency does not follow output length per token (TPOT spread over
decades), a TPOT outlier means nothing and the rule makes no claim. The alert holds when this rule
or the latency rule above (the seed's, or ``length_normalized``) holds.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> det = LongTailDetector()
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=100,
...                    latency_p50=100.0, latency_p99=450.0)
>>> [len(det.update(fv, None, now=60.0 + 5 * i).alerts) for i in range(4)]
[0, 0, 1, 0]
>>> det.update(fv, None, now=80.0).actions[0].action
'enable_tracing'
>>> norm = LongTailDetector(LongTailConfig(length_normalized=True, persistence=1))
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=100,
...                    latency_p50=3000.0, latency_p99=40000.0, latency_mean=6000.0,
...                    completion_tokens_mean=200.0, completion_tokens_var=200.0 ** 2)
>>> round(norm.update(fv, None, now=60.0).alerts[0].evidence["p99_over_expected"], 2)
1.36
>>> tpot = LongTailDetector(LongTailConfig(tpot_rule=True, persistence=1))
>>> def tv(end, p50, p99, top):
...     return FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=100,
...                          latency_p50=3000.0, latency_p99=8000.0, tpot_p50=p50, tpot_p99=p99, tpot_max=top)
>>> tpot.update(tv(60.0, 30.0, 40.0, 45.0), None, now=60.0).alerts
[]
>>> out = tpot.update(tv(120.0, 30.0, 40.0, 200.0), None, now=120.0)
>>> out.alerts[0].evidence["tpot_max_over_p50"], out.actions[0].action
(6.666666666666667, 'enable_tracing')
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from skewwatch.config_section import Count, Fraction, NonNegativeInt, Positive
from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import DetectorConfig, Finding, ThresholdDetector
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

Z99 = 2.3263478740408408  # standard normal 99th percentile


class LongTailConfig(DetectorConfig, frozen=True):
    """``[detectors.long_tail]``: the seed's P99/P50 rule, and our options (off by default)."""

    section = "detectors.long_tail"

    ratio: Annotated[float, Meta(gt=1)] = 3.0  # seed: P99 > 3 × P50
    persistence: Count = 3  # seed: for >= 3 consecutive steps
    min_count: NonNegativeInt = 20  # ours: fewer requests than this in the window -> not evaluated
    sample_rate: Fraction = 1.0  # enable_tracing: share of the replica's requests to trace
    # ours, off by default: judge P99 against what the window's output lengths explain, not P50
    length_normalized: bool = False
    length_ratio: Positive = 1.3  # P99 > this x (latency per output token x P99 output length)
    # ours, off by default: also fire on one request decoded tpot_ratio x slower per token than
    # the window's median, on a replica whose TPOT was tight (P99 <= tpot_spread x P50) a lookback ago
    tpot_rule: bool = False
    tpot_ratio: Annotated[float, Meta(gt=1)] = 5.0
    tpot_spread: Annotated[float, Meta(ge=1)] = 1.5
    tpot_lookback_s: Positive = 60.0


class LongTailDetector(ThresholdDetector):
    name = "long_tail"
    Config = LongTailConfig
    config: LongTailConfig

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        cfg = self.config
        if cfg.length_normalized:
            reason = f"long tail: p99 > {cfg.length_ratio:g} x the p99 its output lengths explain"
        else:
            reason = f"long tail: p99 > {cfg.ratio:g} x p50"
        if cfg.tpot_rule:
            reason += f", or a request's time per output token > {cfg.tpot_ratio:g} x the median"
        return Severity.WARNING, "enable_tracing", reason

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_] | None:
        """The seed rule over the step's replicas as columns (None, i.e. evaluate each, for
        ``length_normalized`` and ``tpot_rule``: the latter keeps a TPOT history every step)."""
        cfg = self.config
        if cfg.length_normalized or cfg.tpot_rule:
            return None
        p50, p99 = step.column("latency_p50"), step.column("latency_p99")
        return ~((step.column("count") >= max(cfg.min_count, 1)) & (p50 > 0) & (p99 > cfg.ratio * p50))

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        p50, p99 = fv.latency_p50, fv.latency_p99
        evidence: dict[str, float | int | str | None] = {
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "ratio_threshold": cfg.ratio,
            "count": fv.count,
        }
        if cfg.length_normalized:
            latency = self._length_normalized(fv, evidence)
        elif p50 is None or p99 is None or p50 <= 0 or fv.count < max(cfg.min_count, 1):
            latency = Finding(holds=None, evidence=evidence)
        else:
            ratio = p99 / p50
            evidence["p99_over_p50"] = ratio
            message = (
                f"long tail: p99 {fmt(p99)} ms is {ratio:.2f} x p50 {fmt(p50)} ms "
                f"(> {cfg.ratio:g} x for >= {cfg.persistence} steps)"
            )
            latency = Finding(holds=p99 > cfg.ratio * p50, message=message, evidence=evidence,
                              params={"sample_rate": cfg.sample_rate})
        if not cfg.tpot_rule:
            return {"main": latency}
        tpot = self._tpot(fv, evidence, memory)
        if tpot.holds and not latency.holds:
            return {"main": tpot}
        if latency.holds is None and tpot.holds is False:
            return {"main": tpot}  # the TPOT rule judged (and did not hold): a claim either way
        return {"main": latency}

    def _tpot(self, fv: FeatureVector, evidence: dict[str, Any], memory: dict[str, Any]) -> Finding:
        """The ``tpot_rule``: the window's largest TPOT against its median, judged where the
        replica's TPOT was tight ``tpot_lookback_s`` earlier. Keeps that history in ``memory``."""
        cfg = self.config
        p50, p99, top = fv.tpot_p50, fv.tpot_p99, fv.tpot_max
        enough = fv.count >= max(cfg.min_count, 1) and p50 is not None and p99 is not None and p50 > 0
        # history: window_end (ms, as str) -> [tpot P50, P99] of windows with enough requests, or
        # None; only the last tpot_lookback_s is kept (steps arrive in time order)
        history: dict[str, list[float] | None] = memory.setdefault("tpot_by_end_ms", {})
        end_ms = round(fv.window_end * 1000)
        cutoff = end_ms - round(cfg.tpot_lookback_s * 1000)
        previous = history.get(str(cutoff))
        history[str(end_ms)] = [p50, p99] if enough and p50 is not None and p99 is not None else None
        for stamp in [stamp for stamp in history if int(stamp) < cutoff]:
            del history[stamp]
        evidence.update({"tpot_p50_ms": p50, "tpot_max_ms": top, "tpot_ratio_threshold": cfg.tpot_ratio,
                         "tpot_spread_before": None if previous is None else previous[1] / previous[0]})
        if not enough or top is None or p50 is None or previous is None or previous[1] > cfg.tpot_spread * previous[0]:
            return Finding(holds=None, evidence=evidence)
        ratio = top / p50
        evidence["tpot_max_over_p50"] = ratio
        message = (
            f"long tail: a request took {fmt(top, 1)} ms per output token, {ratio:.1f} x the median "
            f"{fmt(p50, 1)} ms (> {cfg.tpot_ratio:g} x; {cfg.tpot_lookback_s:g} s earlier P99/P50 of TPOT "
            f"{previous[1] / previous[0]:.2f} <= {cfg.tpot_spread:g})"
        )
        return Finding(holds=ratio > cfg.tpot_ratio, message=message, evidence=evidence,
                       params={"sample_rate": cfg.sample_rate})

    def _length_normalized(self, fv: FeatureVector, evidence: dict[str, Any]) -> Finding:
        """The ``length_normalized`` rule: P99 against the P99 the window's output lengths explain."""
        cfg = self.config
        p99, mean, tokens, var = fv.latency_p99, fv.latency_mean, fv.completion_tokens_mean, fv.completion_tokens_var
        evidence["length_ratio_threshold"] = cfg.length_ratio
        if p99 is None or mean is None or tokens is None or var is None or tokens <= 0 or mean <= 0 \
                or fv.count < max(cfg.min_count, 1):
            return Finding(holds=None, evidence=evidence)
        per_token = mean / tokens
        expected = per_token * lognormal_p99(tokens, var)
        ratio = p99 / expected
        evidence.update({"latency_per_token_ms": per_token, "expected_p99_ms": expected, "p99_over_expected": ratio})
        message = (
            f"long tail: p99 {fmt(p99)} ms is {ratio:.2f} x the {fmt(expected)} ms its output lengths explain "
            f"({fmt(per_token, 2)} ms/token; > {cfg.length_ratio:g} x for >= {cfg.persistence} steps)"
        )
        return Finding(holds=ratio > cfg.length_ratio, message=message, evidence=evidence,
                       params={"sample_rate": cfg.sample_rate})


def lognormal_p99(mean: float, var: float) -> float:
    """P99 of a log-normal distribution with this mean and variance (``var = 0``: the mean).

    >>> round(lognormal_p99(200.0, 200.0 ** 2), 1)
    981.0
    """
    sigma2 = math.log1p(var / (mean * mean))
    sigma = math.sqrt(sigma2)
    return mean * math.exp(-sigma2 / 2 + Z99 * sigma)

