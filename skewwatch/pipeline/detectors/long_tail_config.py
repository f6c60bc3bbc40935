"""``[detectors.long_tail]``: the long-tail detector's configuration (:mod:`skewwatch.pipeline.detectors.long_tail`,
whose docstring says what each rule does with it).

>>> LongTailConfig().live_z - LongTailConfig().live_drift
3.5
>>> LongTailConfig.from_overrides(PROFILE_SEED).seed_rule
True
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from skewwatch.config_section import Count, Fraction, NonNegativeInt, Positive
from skewwatch.pipeline.detectors.threshold import DetectorConfig

#: The ``seed`` profile's ``[detectors.long_tail]``: the seed's rule as it stood (P99 > 3 x P50 for
#: 3 steps, windows of 20 requests and more), the evidence-aware rules off.
PROFILE_SEED: dict[str, Any] = {"seed_rule": True, "live_rule": False, "exceedance_rule": False, "horizon_rule": False,
                                "clear_steps": 2, "persistence": 3, "min_count": 20}


class LongTailConfig(DetectorConfig, frozen=True):
    """``[detectors.long_tail]``: the live and exceedance rules (default), the seed's P99/P50 rule."""

    section = "detectors.long_tail"

    persistence: Count = 1  # steps the rule must hold (each rule bounds its own false alarms)
    clear_steps: Count = 6  # 30 s without the rule before it resolves: a tail shows on some scrapes, not all
    min_count: NonNegativeInt = 6  # the evidence floor: fewer finished requests in the window -> no claim
    sample_rate: Fraction = 1.0  # enable_tracing: share of the replica's requests to trace
    min_peers: Count = 2  # peers with enough evidence for a pool baseline; fewer -> the replica's own past
    ttft_ratio: Annotated[float, Meta(gt=1)] = 2.0  # first tokens this x slower than the baseline's: prefill
    # live rule: the engine's per-token latencies over the last scrapes
    live_rule: bool = True
    live_span_s: Positive = 10.0  # scrapes aggregated
    ttft_span_s: Positive = 60.0  # first tokens aggregated (requests start seldom)
    live_min_tokens: Positive = 100.0  # output tokens in the span, on the replica and on each peer
    live_z: Positive = 5.0  # the tail excess above this many of the replica's own standard deviations
    # ... or summed over consecutive steps (CUSUM, this reference in standard deviations) above
    # live_z - live_drift: the reference for a shift of twice it (3 sd), the half of it an optimal CUSUM takes
    live_drift: Positive = 1.5
    live_noise_prior: Positive = 0.2  # the tail excess's standard deviation before any history (log units)
    live_noise_floor: Positive = 0.05  # ... and never less (5 %: a smaller excess is no tail)
    live_noise_tau_s: Positive = 300.0  # time constant of that spread and of the replica's own baseline
    live_history_steps: Count = 12  # steps of own history before the rule judges
    # exceedance rule: the window's finished requests above tail_ratio x the baseline's TPOT P99
    exceedance_rule: bool = True
    defer_to_live: bool = True  # where the live rule judged, the finished requests add nothing
    # the exceedance rule also on end-to-end latency against the peers' (P50, P95, P99): a stall adds
    # time to a request whatever its length, which TPOT dilutes on long outputs and inflates on short
    # ones; each signal is tested at alpha / 2 (Bonferroni), so the rule's bound stays alpha
    latency_signal: bool = True
    tail_ratio: Annotated[float, Meta(ge=1)] = 2.0
    alpha: Annotated[float, Meta(gt=0, lt=1)] = 1e-3  # false-alarm probability bound of the binomial test
    shift_ratio: Annotated[float, Meta(gt=1)] = 1.5  # median TPOT above this x the baseline's: a slow replica
    peer_min_count: Count = 20  # a peer's window needs this many requests to give a P99
    lookback_s: Positive = 60.0  # without peers: the replica's own window this long before
    # horizon rule, where the peers' windows are too thin for a P99: each window's newest step (its
    # requests and the slowest of them) summed over horizon_s against the peers' slowest over the
    # same span (tail_horizon.py): 10 min hold dozens of a pool's requests at one a minute each
    horizon_rule: bool = True
    horizon_s: Positive = 600.0
    horizon_recent_s: Positive = 60.0  # ... held while its newest request above the level is this recent
    # the seed's rule (the seed profile): P99 > ratio x P50 on end-to-end latency
    seed_rule: bool = False
    ratio: Annotated[float, Meta(gt=1)] = 3.0

    def __post_init__(self) -> None:
        self._require(self.seed_rule or self.live_rule or self.exceedance_rule or self.horizon_rule, "seed_rule",
                      "is off, so live_rule, exceedance_rule or horizon_rule must be on")
        self._require(self.ttft_span_s >= self.live_span_s, "ttft_span_s", "must be >= live_span_s")
        self._require(self.live_drift < self.live_z, "live_drift", "must be < live_z")


__all__ = ["PROFILE_SEED", "LongTailConfig"]
