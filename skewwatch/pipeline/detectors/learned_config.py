"""``[detectors.learned]``: the learned detector's configuration (:mod:`skewwatch.pipeline.detectors.learned`).

>>> LearnedConfig().features
('ttft_per_prompt_token', 'tpot_p50', 'tokens_per_s', 'completion_tokens_mean')
>>> try:
...     LearnedConfig(features=("queue_depth",))
... except ValueError as exc:
...     print(str(exc).partition(";")[0])
detectors.learned.features: names a field it cannot judge ('queue_depth'
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from skewwatch.config_section import Count, NonNegative, NonNegativeInt, Unit
from skewwatch.pipeline.detectors.novelty import NoveltyParams
from skewwatch.pipeline.detectors.shift import ShiftParams
from skewwatch.pipeline.detectors.threshold import DetectorConfig

# the positive numeric FeatureVector fields the detector can judge (as a log ratio to the pool's median)
FIELDS = frozenset({
    "latency_p50", "latency_p95", "latency_p99", "latency_mean", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
    "batch_size_mean", "prompt_tokens_mean", "completion_tokens_mean", "queue_length_mean",
    "kv_cache_hit_rate_mean", "batch_fill_mean", "error_rate", "tokens_per_s", "rps", "ttft_per_prompt_token",
})


class LearnedConfig(DetectorConfig, frozen=True):
    """``[detectors.learned]``: what is compared, when it holds, and the scorer's lengths (in samples)."""

    section = "detectors.learned"

    # TTFT, time per output token and output length make up a request's latency (latency_p50 would
    # repeat them), tokens/s is the replica's throughput; each feature costs a column per step. TTFT
    # per prompt token rather than the window's TTFT: prefill grows with the prompt, and where prompts
    # differ tenfold (long-context traffic, a few requests a window) the window's TTFT swings by more
    # than a drift to 2x, while per prompt token it holds still
    features: tuple[str, ...] = ("ttft_per_prompt_token", "tpot_p50", "tokens_per_s", "completion_tokens_mean")
    # the scorer's level (0..1) that must also be reached; 0: off. The level is the likelihood of the
    # step's most novel (feature, time scale): on a bursty replica the short scales are often novel, and
    # it then hid a slow drift that only the long scale showed (the pool's range below does its work)
    threshold: Unit = 0.0
    min_novelty: NonNegative = 0.2  # the most novel feature outside its range by at least a fifth of that range
    min_count: Count = 1  # requests in the replica's window for a step to be a sample (evidence: min_requests)
    # the requests the holding samples must span before the alert opens: a replica with few requests
    # per window needs more samples (windows overlap: a sample adds only the requests that are new)
    min_requests: NonNegative = 20
    # a value within the range any replica of the pool spanned at that time scale is not novel: in a
    # healthy pool replicas take turns above and below the median, and a range of one replica's own
    # short past is too narrow (the pool's holds a few times the evidence)
    pool_range: bool = True
    min_replicas: Annotated[int, Meta(ge=2)] = 3  # replicas with a sample for the pool's median (2: which moved?)
    cadence_steps: Count = 3  # a model's scorers learn and score once every this many steps: a sample per 15 s
    scales: tuple[Annotated[int, Meta(ge=1)], ...] = (1, 4, 24)  # samples: the window, ~1 min and ~6 min EW
    memory: Count = 240  # samples a range remembers (1 h)
    blocks: Count = 4  # it forgets 15 min at a time
    grace: NonNegativeInt = 40  # samples of a feature before its novelty counts (10 min: the longest scale settles)
    warmup: NonNegativeInt = 40  # samples of a replica before anything holds (10 min)
    fading: Annotated[float, Meta(gt=0, lt=1)] = 0.01  # the likelihood's memory: ~100 samples (25 min)
    settle: Count = 4  # a scale of k samples counts after settle x k (the 6 min mean after 24 min)
    span_floor: NonNegative = 0.2  # a range narrower than this (log ratio: +-10 %) counts as this wide
    adapt: Count = 40  # holding samples (10 min), the alert open, after which a lasting change is the new normal
    persistence: Count = 6  # holding samples (90 s) before the alert opens: a queue's swing is shorter
    clear_steps: Count = 4  # samples (1 min) that do not hold before it resolves
    # the shift test (0: off): a sample also holds when the mean of the replica's last `shift_window`
    # disjoint windows (each weighed by its requests) lies this many standard errors from its own
    # past. A level that moved by a few times the noise of a mean, on a replica of few requests a
    # window, stays inside the ranges above (their extremes are those of single noisy windows) for
    # as long as it lasts. The bar is one replica's; the furthest of a pool's n replicas must pass
    # the bar whose Gaussian tail is 1/n of this one's (4.0 of four, 4.5 of 32), so that a pool's
    # false alerts do not grow with its size
    shift_z: NonNegative = 3.66
    shift_window: Annotated[int, Meta(ge=2)] = 10  # disjoint windows (10 min of 60 s windows)
    shift_min: NonNegative = 0.2  # and by at least this much (log ratio: +22 % / -18 %), however sure
    # TTFT per prompt token judged at the pool's typical prompt (pipeline.detectors.pool_slope): a
    # TTFT is prefill plus a wait for a step, so per prompt token a short prompt takes longer, and on a
    # replica of a request or two a window the prompts it happened to serve were most of the noise.
    # The pool's slope on log prompt (from each window's ttft_prompt_tokens_gmean, contract v1.8) is
    # learned over `memory` samples and counts once it holds `min_requests` requests
    prompt_slope: bool = True
    # each feature of ``learned.LOAD_OF`` judged at the pool's typical load: in a pool near its capacity a replica
    # that takes a stopped or slowed peer's share serves larger batches and longer queues, and its
    # times per token and to first token move with them. The pool's slope of the log feature on its
    # log load (requests' batch sizes; 1 + queue length) is learned as the prompt's slope is, per
    # pool and feature, and taken out
    load_slope: bool = True

    def __post_init__(self) -> None:
        self._require(len(self.features) > 0, "features", "must name at least one field")
        for name in self.features:
            self._require(name in FIELDS, "features",
                          f"names a field it cannot judge ({name!r}; known: {', '.join(sorted(FIELDS))})")
        self._require(len(set(self.features)) == len(self.features), "features", "must not repeat a field")
        self._require(len(self.scales) > 0, "scales", "must name at least one scale")
        self._require(self.memory >= self.blocks, "memory", f"must be >= blocks ({self.blocks})")

    def shift_params(self) -> ShiftParams:
        """The shift test's lengths: the recent windows, at least half of them with a value, against
        at least as many of the past (an hour of them remembered)."""
        return ShiftParams(window=self.shift_window, min_recent=(self.shift_window + 1) // 2,
                           min_past=self.shift_window, memory=max(60, self.shift_window),
                           min_effect=self.shift_min, clip=3.0)

    def scorer_params(self) -> NoveltyParams:
        """The novelty scorer's parameters: a level (no onsets), the step's own novelty (short = 1), each
        scale in its range once settled (a replica's first minutes would widen its ranges for an hour)."""
        return NoveltyParams(scales=tuple(self.scales), memory=self.memory, blocks=self.blocks, grace=self.grace,
                             short=1, fading=self.fading, warmup=self.warmup, onset=False, settle=self.settle,
                             drift=True, span_floor=self.span_floor)
