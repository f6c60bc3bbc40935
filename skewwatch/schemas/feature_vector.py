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

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from skewwatch.schemas.feature_spec import FEATURE_FIELDS, FEATURES_SCHEMA_VERSION, RECENT_S


@dataclass(slots=True)
class FeatureVector:
    """One feature vector. Each attribute is a row of
    :data:`~skewwatch.schemas.feature_spec.FEATURE_FIELDS` (its unit and meaning are there), in that
    order, of the type and with the default the row implies: checked below, when the class is defined.
    """

    model: str
    replica: str | None
    window_start: float
    window_end: float
    count: int
    rps: float = 0.0
    latency_p50: float | None = None
    latency_p95: float | None = None
    latency_p99: float | None = None
    latency_mean: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    batch_size_mean: float | None = None
    batch_size_std: float | None = None
    batch_fill_mean: float | None = None
    prompt_tokens_mean: float | None = None
    prompt_tokens_var: float | None = None
    completion_tokens_mean: float | None = None
    completion_tokens_var: float | None = None
    tokens_per_s: float = 0.0
    error_rate: float | None = None
    queue_length_mean: float | None = None
    kv_cache_hit_rate_mean: float | None = None
    step_count: int = 0
    step_cuda_errors: dict[str, int] = field(default_factory=dict)
    replicas: int | None = None
    batch_count: int = 0
    batch_derived_count: int = 0
    tpot_p50: float | None = None
    tpot_p99: float | None = None
    tpot_max: float | None = None
    tpot_p90: float | None = None
    ttft_per_prompt_token: float | None = None
    ttft_prompt_tokens_gmean: float | None = None
    recent_count: int | None = None
    recent_prompt_tokens_mean: float | None = None
    recent_prompt_tokens_var: float | None = None
    step_tpot_max: float | None = None
    v: int = FEATURES_SCHEMA_VERSION

    @property
    def key(self) -> str:
        """Kafka key: ``model`` for per-model vectors, ``model/replica`` for per-replica ones."""
        return self.model if self.replica is None else f"{self.model}/{self.replica}"

    def to_dict(self) -> dict[str, Any]:
        # not dataclasses.asdict: it deep-copies recursively, per vector on the hot path, where only
        # step_cuda_errors is a container (copied below)
        out = {name: getattr(self, name) for name in _FIELD_NAMES}
        out["step_cuda_errors"] = dict(self.step_cuda_errors)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureVector:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FeatureVector))


def _check_against_the_spec() -> None:
    """FeatureVector says what FEATURE_FIELDS say: names in order, types, defaults."""
    wanted = tuple(f.name for f in FEATURE_FIELDS)
    if wanted != _FIELD_NAMES:
        raise TypeError(f"FeatureVector declares {_FIELD_NAMES}, the feature spec makes {wanted}")
    for spec, declared in zip(FEATURE_FIELDS, fields(FeatureVector), strict=True):
        if declared.type != spec.annotation:
            raise TypeError(f"FeatureVector.{spec.name} is {declared.type}, the spec says {spec.annotation}")
        if declared.default is not MISSING:
            default: Any = declared.default
        elif declared.default_factory is not MISSING:
            default = declared.default_factory()
        else:
            default = MISSING
        if (default is not MISSING) != spec.has_default or (spec.has_default and default != spec.default()):
            raise TypeError(f"FeatureVector.{spec.name} defaults to {default!r}, the spec says "
                            f"{spec.default() if spec.has_default else 'no default'!r}")


_check_against_the_spec()

__all__ = ["FEATURES_SCHEMA_VERSION", "RECENT_S", "FeatureVector"]
