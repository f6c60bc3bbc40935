"""The feature vector: one per replica and one per model every 5 s step, covering the last 60 s.

This is the record published on ``llm.features`` (contract ``features.v1``) and what every
detector and the weights read. Statistics of an empty window are ``None`` (unknown), never 0,
except ``count``, ``rps``, ``tokens_per_s`` which are genuinely 0 for a silent replica.

>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=0)
>>> fv.key
'm/r1'
>>> FeatureVector.from_dict(fv.to_dict()) == fv
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

FEATURES_SCHEMA_VERSION = 1
RECENT_S = 20.0  # span of the recent_* fields: the newest 4 steps of 5 s of the window


@dataclass(slots=True)
class FeatureVector:
    model: str
    replica: str | None  # None for the per-model vector
    window_start: float  # epoch seconds, inclusive
    window_end: float  # epoch seconds, exclusive; a multiple of the step
    count: int  # requests finished in the window
    rps: float = 0.0  # count / window length
    latency_p50: float | None = None  # ms, end to end
    latency_p95: float | None = None
    latency_p99: float | None = None
    latency_mean: float | None = None
    ttft_p50: float | None = None  # ms; None when no event in the window reported ttft_ms
    ttft_p99: float | None = None
    batch_size_mean: float | None = None  # over the events with a batch size; None when none had one
    batch_size_std: float | None = None  # population std over the events with a batch size
    batch_fill_mean: float | None = None  # mean of batch_size / batch_capacity (both known), 0..1
    prompt_tokens_mean: float | None = None
    prompt_tokens_var: float | None = None  # population variance
    completion_tokens_mean: float | None = None
    completion_tokens_var: float | None = None
    tokens_per_s: float = 0.0  # generated (completion) tokens per second over the window
    error_rate: float | None = None  # share of events with status "error"
    queue_length_mean: float | None = None  # None when no event reported queue_length
    kv_cache_hit_rate_mean: float | None = None  # None when no event reported it
    step_count: int = 0  # requests in the newest 5 s step only (silence shows here first)
    step_cuda_errors: dict[str, int] = field(default_factory=dict)  # cuda_error value -> count, newest step
    replicas: int | None = None  # per-model vectors: replicas merged; None on per-replica vectors
    # contract v1.1 (batch fields optional): the batch_* statistics above cover only these events;
    # None statistics with batch_count 0 mean no event had a batch size (the batch detectors stay silent)
    batch_count: int = 0  # events in the window with a batch size, reported or derived
    batch_derived_count: int = 0  # of which the worker derived from telemetry (running_requests)
    # contract v1.2 (optional, additive): time per output token, per event (latency_ms - ttft_ms) /
    # (completion_tokens - 1), the tokens after the first (v1.7), or latency_ms / completion_tokens
    # without ttft_ms; events with no token after the first are left out. A slowed decode shows here
    # on the first short request that finishes, where end-to-end latency (dominated by output
    # length) shows it a minute later.
    tpot_p50: float | None = None  # ms per output token; None when no event had one
    tpot_p99: float | None = None
    tpot_max: float | None = None  # the slowest event's (one slowed request shows here first)
    # contract v1.5 (optional, additive): with P50 and P99, how many of the window's requests are
    # slow proves itself (at least a tenth of them are at or above P90: the long tail's exceedance test)
    tpot_p90: float | None = None
    # contract v1.6 (optional, additive): each event's ttft_ms / prompt_tokens (events with both > 0),
    # their geometric mean. Prefill grows with the prompt, so a window's TTFT moves with the prompts
    # it happened to serve; per prompt token it does not, and a replica slow to start shows at any mix
    ttft_per_prompt_token: float | None = None  # ms per prompt token; None when no event had both
    # contract v1.8 (optional, additive): the geometric mean prompt_tokens of the same events. A TTFT
    # is a step's wait plus prefill, so per prompt token a short prompt takes longer than a long one:
    # beside it, TTFT per prompt token can be judged at a given prompt length
    ttft_prompt_tokens_gmean: float | None = None  # tokens; None when ttft_per_prompt_token is
    # the window's newest RECENT_S (20 s, 4 steps) only: prompt-length moments for rules that must
    # not wait for the 60 s window to fill. None on vectors that do not carry them (per-model ones)
    recent_count: int | None = None  # requests finished in the last RECENT_S of the window
    recent_prompt_tokens_mean: float | None = None  # None also when recent_count is 0
    recent_prompt_tokens_var: float | None = None  # population variance, tokens²
    v: int = FEATURES_SCHEMA_VERSION

    @property
    def key(self) -> str:
        """Kafka key: ``model`` for per-model vectors, ``model/replica`` for per-replica ones."""
        return self.model if self.replica is None else f"{self.model}/{self.replica}"

    def to_dict(self) -> dict[str, Any]:
        # not dataclasses.asdict: it deep-copies recursively and cost ~90 µs per vector on the hot path
        out = {name: getattr(self, name) for name in _FIELD_NAMES}
        out["step_cuda_errors"] = dict(self.step_cuda_errors)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureVector:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FeatureVector))
