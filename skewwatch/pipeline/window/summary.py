"""The stage 1 -> stage 2 hand-off: :class:`WindowSummary`, one window's bucket row spelled out with
its sketches, and its feature vector (:meth:`WindowSummary.features`: the summary as one row of
``feature_columns.py``, where a step's columns go too).

>>> import numpy as np
>>> from skewwatch.pipeline.sketch import EMPTY_SPARSE
>>> s = WindowSummary(model="m", replica="r1", window_end=60.0, length_s=60.0, relative_accuracy=0.01,
...                   count=2, errors=0, completion_tokens=40, mean=np.array([200.0, 10, 20, 4, 0.25]),
...                   m2=np.array([20000.0, 0, 0, 0, 0]), optional_count=np.zeros(5, np.int64),
...                   optional_sum=np.zeros(5), latency=EMPTY_SPARSE, ttft=EMPTY_SPARSE, step_count=2,
...                   step_cuda_errors={}, batch_count=2, fill_count=2)
>>> fv = s.features()
>>> fv.latency_mean, fv.batch_size_std, fv.tokens_per_s
(200.0, 0.0, 0.6666666666666666)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline import moments
from skewwatch.pipeline.sketch import EMPTY_SPARSE, LogBins, SparseCounts, log_bins
from skewwatch.pipeline.window.bucket_row import (
    ADDED_OPTIONAL,
    BATCH_N,
    COMPLETION,
    COUNT,
    DERIVED_N,
    ERRORS,
    EVENT_MOMENTS,
    FILL_N,
    M2,
    MEAN,
    MOMENT_FIELDS,
    OPT_N,
    OPT_SUM,
    OPTIONAL_FIELDS,
    STATS_LEN,
)
from skewwatch.pipeline.window.feature_columns import (
    LATENCY_QUANTILES,
    TPOT_QUANTILES,
    TTFT_QUANTILES,
    feature_vectors,
)
from skewwatch.schemas.feature_vector import FeatureVector

FloatArray = npt.NDArray[np.float64]

SUMMARY_VERSION = 1
# The TPOT sketch is coarser than the latency one: its rules compare ratios of 1.5x and more, and
# 5 % bins keep its memory per replica at a fraction of the latency sketch's.
TPOT_RELATIVE_ACCURACY = 0.05


def _quantiles(bins: LogBins, sketch: SparseCounts, qs: tuple[float, ...]) -> FloatArray:
    """``(1, len(qs))``: the quantiles of one sparse sketch, NaN when it is empty (as
    :meth:`LogBins.row_quantiles` answers for a row of a step)."""
    answers = bins.quantile(sketch[1], qs, slots=sketch[0]) if sketch.shape[1] else None
    return np.array([answers if answers else [math.nan] * len(qs)], dtype=np.float64)


def tpot_accuracy(relative_accuracy: float) -> float:
    """The TPOT sketch's relative accuracy beside a latency sketch of ``relative_accuracy`` (never
    finer than it, so its slots always fit inside the latency slot range)."""
    return max(TPOT_RELATIVE_ACCURACY, relative_accuracy)


# ---------------------------------------------------------------------------------------------
# The summary of one window
# ---------------------------------------------------------------------------------------------

@dataclass(slots=True, eq=False)
class WindowSummary:
    """Everything mergeable about one window ``[window_end - length_s, window_end)`` of one key.

    Stage 1 sends this (as JSON, :meth:`to_dict`) to stage 2, which merges a model's replicas
    (``model_merge.merge_summaries``) for the same ``window_end``. ``replica is None`` marks a
    per-model summary, whose ``replicas`` says how many replica summaries were merged.
    """

    model: str
    replica: str | None
    window_end: float
    length_s: float
    relative_accuracy: float  # of the sketches; summaries merge only with equal accuracy
    count: int
    errors: int  # events with status "error"
    completion_tokens: int  # sum over the window
    mean: FloatArray  # (len(MOMENT_FIELDS),) means over the window's events
    m2: FloatArray  # (len(MOMENT_FIELDS),) sums of squared deviations
    optional_count: npt.NDArray[np.int64]  # (len(OPTIONAL_FIELDS),) events that reported the field
    optional_sum: FloatArray  # (len(OPTIONAL_FIELDS),) sum over those events
    latency: SparseCounts  # latency_ms sketch, (2, k): slots, counts
    ttft: SparseCounts  # ttft_ms sketch (events that reported it)
    step_count: int  # events in the newest step [window_end - step, window_end)
    step_cuda_errors: dict[str, int]  # cuda_error value (as str) -> count, newest step
    replicas: int | None = None
    batch_count: int = 0  # events with a known batch_size: the count of the batch_size moments
    fill_count: int = 0  # events with a known batch_size and batch_capacity: batch_fill's count
    derived_count: int = 0  # events whose batch_size the worker derived from telemetry
    # contract v1.2 (absent from older summaries: empty / 0); merged across replicas like the rest
    # (model_merge), so per-model vectors carry them too.
    # time-per-output-token sketch (events with completion tokens), bins of tpot_accuracy()
    tpot: SparseCounts = field(default_factory=lambda: EMPTY_SPARSE)
    recent_count: int = 0  # events in the newest RECENT_S of the window
    recent_prompt_mean: float = 0.0  # their prompt-length mean ...
    recent_prompt_m2: float = 0.0  # ... and sum of squared deviations
    step_tpot_max: float | None = None  # the newest step's largest TPOT (None: none, or an older summary)

    @property
    def window_start(self) -> float:
        return self.window_end - self.length_s

    def moments(self) -> moments.Moments:
        """The window's moments for MOMENT_FIELDS (each field with its own count)."""
        counts = np.array([self.count] * EVENT_MOMENTS + [self.batch_count, self.fill_count], dtype=np.float64)
        return moments.Moments(counts, self.mean, self.m2)

    def features(self) -> FeatureVector:
        """The feature vector of this window: this summary as a batch of one row of
        :func:`~skewwatch.pipeline.window.feature_columns.feature_vectors`, where every feature is
        defined."""
        stats = np.zeros((1, STATS_LEN))
        row = stats[0]
        row[COUNT], row[ERRORS], row[COMPLETION] = self.count, self.errors, self.completion_tokens
        row[MEAN], row[M2] = self.mean, self.m2
        row[OPT_N], row[OPT_SUM] = self.optional_count, self.optional_sum
        row[BATCH_N], row[FILL_N], row[DERIVED_N] = self.batch_count, self.fill_count, self.derived_count
        bins = log_bins(self.relative_accuracy)
        tpot_bins = log_bins(tpot_accuracy(self.relative_accuracy))
        recent = np.array([[self.recent_count, self.recent_prompt_mean, self.recent_prompt_m2]], dtype=np.float64)
        [vector] = feature_vectors(
            [(self.model, self.replica)], self.window_end, self.length_s, stats, [self.step_count],
            [dict(self.step_cuda_errors)], _quantiles(bins, self.latency, LATENCY_QUANTILES),
            _quantiles(bins, self.ttft, TTFT_QUANTILES), _quantiles(tpot_bins, self.tpot, TPOT_QUANTILES), recent,
            [self.replicas], np.array([math.nan if self.step_tpot_max is None else self.step_tpot_max]))
        return vector

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (internal topic stage 1 -> stage 2); per-field stats as named maps."""
        return {
            "v": SUMMARY_VERSION,
            "model": self.model,
            "replica": self.replica,
            "window_end": self.window_end,
            "length_s": self.length_s,
            "relative_accuracy": self.relative_accuracy,
            "count": self.count,
            "errors": self.errors,
            "completion_tokens": self.completion_tokens,
            "mean": dict(zip(MOMENT_FIELDS, self.mean.tolist(), strict=True)),
            "m2": dict(zip(MOMENT_FIELDS, self.m2.tolist(), strict=True)),
            "optional_count": dict(zip(OPTIONAL_FIELDS, self.optional_count.tolist(), strict=True)),
            "optional_sum": dict(zip(OPTIONAL_FIELDS, self.optional_sum.tolist(), strict=True)),
            "latency": self.latency.tolist(),
            "ttft": self.ttft.tolist(),
            "step_count": self.step_count,
            "step_cuda_errors": dict(self.step_cuda_errors),
            "replicas": self.replicas,
            "batch_count": self.batch_count,
            "fill_count": self.fill_count,
            "derived_count": self.derived_count,
            "tpot": self.tpot.tolist(),
            "recent_count": self.recent_count,
            "recent_prompt_mean": self.recent_prompt_mean,
            "recent_prompt_m2": self.recent_prompt_m2,
            "step_tpot_max": self.step_tpot_max,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowSummary:
        """Inverse of :meth:`to_dict`; raises ValueError (with the field) on a malformed record."""
        if data.get("v") != SUMMARY_VERSION:
            raise ValueError(f"window summary: unsupported version {data.get('v')!r}")
        try:
            accuracy = float(data["relative_accuracy"])

            def sparse(name: str) -> SparseCounts:
                arr = np.asarray(data[name] if name in data or name != "tpot" else [[], []],
                                 dtype=np.int64).reshape(2, -1)
                n_slots = log_bins(tpot_accuracy(accuracy) if name == "tpot" else accuracy).n_slots
                if arr.shape[1] and (arr[0].min() < 0 or arr[0].max() >= n_slots or arr[1].min() <= 0
                                     or np.any(np.diff(arr[0]) <= 0)):
                    raise ValueError(f"{name}: slots must be sorted, in range, with positive counts")
                return arr.astype(np.int32)

            def per_field(name: str, names: tuple[str, ...], dtype: type) -> npt.NDArray[Any]:
                values = data[name]  # a field newer than the sending worker is absent: not reported
                return np.array([values[f] if f in values or f not in ADDED_OPTIONAL else 0 for f in names],
                                dtype=dtype)

            replicas = data.get("replicas")
            count = int(data["count"])
            return cls(
                model=str(data["model"]),
                replica=None if data["replica"] is None else str(data["replica"]),
                window_end=float(data["window_end"]),
                length_s=float(data["length_s"]),
                relative_accuracy=float(data["relative_accuracy"]),
                count=count,
                errors=int(data["errors"]),
                completion_tokens=int(data["completion_tokens"]),
                mean=per_field("mean", MOMENT_FIELDS, np.float64),
                m2=per_field("m2", MOMENT_FIELDS, np.float64),
                optional_count=per_field("optional_count", OPTIONAL_FIELDS, np.int64),
                optional_sum=per_field("optional_sum", OPTIONAL_FIELDS, np.float64),
                latency=sparse("latency"),
                ttft=sparse("ttft"),
                step_count=int(data["step_count"]),
                step_cuda_errors={str(k): int(v) for k, v in data["step_cuda_errors"].items()},
                replicas=None if replicas is None else int(replicas),
                # a summary from a worker before contract v1.1: every event had a reported batch
                batch_count=int(data.get("batch_count", count)),
                fill_count=int(data.get("fill_count", count)),
                derived_count=int(data.get("derived_count", 0)),
                # from a worker before contract v1.2: no TPOT sketch, no recent moments
                tpot=sparse("tpot"),
                recent_count=int(data.get("recent_count", 0)),
                recent_prompt_mean=float(data.get("recent_prompt_mean", 0.0)),
                recent_prompt_m2=float(data.get("recent_prompt_m2", 0.0)),
                # from a worker before contract v1.10: the newest step's slowest request unknown
                step_tpot_max=None if data.get("step_tpot_max") is None else float(data["step_tpot_max"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"window summary: malformed ({exc!r})") from exc

