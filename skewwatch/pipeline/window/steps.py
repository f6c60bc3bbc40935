"""What :meth:`PartitionWindows.close_steps` returns: one :class:`StepBatch` (columns) per closed step.

A step of a partition covers every known key at once, so it is computed and kept as columns: one
row per (model, replica), the window's merged statistics in one ``(rows, _STATS_LEN)`` array, the
quantiles in ``(rows, k)`` arrays and the sketches as dense per-row count matrices. The per-row
Python objects the rest of the pipeline reads (:class:`ReplicaStep` = :class:`FeatureVector` +
:class:`WindowSummary`) are built only when someone iterates, all rows of a batch at once, from
``tolist()`` columns (:meth:`StepBatch.replica_steps`). The numbers are bit-identical to
:meth:`WindowSummary.features` on the same summary (the tests check it on every step).

>>> from skewwatch.config import WindowSettings
>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> from skewwatch.pipeline.window import PartitionWindows
>>> ev = dict(model="m", replica="r1", prompt_tokens=10, completion_tokens=20, batch_size=4,
...           batch_capacity=16)
>>> windows = PartitionWindows(WindowSettings())
>>> _ = windows.apply(RequestColumns.from_rows([dict(ev, request_id="a", ts=101.0, latency_ms=100.0)]))
>>> windows.advance_watermark(110.0)
>>> closed = windows.close_steps()
>>> [(b.window_end, len(b)) for b in closed.batches], len(closed)
([(105.0, 1), (110.0, 1)], 2)
>>> closed[0].features.latency_p50 == closed[0].summary.features().latency_p50
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from skewwatch.gc_pause import gc_paused
from skewwatch.pipeline.sketch import SparseCounts
from skewwatch.pipeline.window.summary import (
    _BATCH_N,
    _COMPLETION,
    _COUNT,
    _DERIVED_N,
    _ERRORS,
    _FILL_N,
    _M2,
    _MEAN,
    _MOMENT_COUNT_COLUMNS,
    _OPT_N,
    _OPT_SUM,
    WindowSummary,
)
from skewwatch.schemas.feature_vector import FEATURES_SCHEMA_VERSION, FeatureVector

FloatArray = npt.NDArray[np.float64]
CountMatrix = npt.NDArray[np.int32]

LATENCY_QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
TTFT_QUANTILES: tuple[float, ...] = (0.5, 0.99)
TPOT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99, 1.0)  # P50, P90, P99, max
_FEATURE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FeatureVector))
# WindowSummary is built positionally too: this is the order the builder passes its columns in
_SUMMARY_ORDER: tuple[str, ...] = (
    "model", "replica", "window_end", "length_s", "relative_accuracy", "count", "errors", "completion_tokens",
    "mean", "m2", "optional_count", "optional_sum", "latency", "ttft", "step_count", "step_cuda_errors",
    "replicas", "batch_count", "fill_count", "derived_count", "tpot", "recent_count", "recent_prompt_mean",
    "recent_prompt_m2")
if tuple(f.name for f in dataclasses.fields(WindowSummary)) != _SUMMARY_ORDER:  # pragma: no cover
    raise ImportError("WindowSummary's fields changed: update StepBatch._build")


class ReplicaStep(NamedTuple):
    """One closed step of one (model, replica): its feature vector and its mergeable summary."""

    features: FeatureVector
    summary: WindowSummary


def _or_none(values: npt.NDArray[Any], known: npt.NDArray[np.bool_]) -> list[Any]:
    """``values`` as Python floats, ``None`` where not ``known`` (unknown is never 0)."""
    out = values.astype(object)
    out[~known] = None
    return out.tolist()


def _sparse_rows(counts: CountMatrix, offset: int) -> list[SparseCounts]:
    """Each row of a dense count matrix as a ``(2, k)`` sparse array (views of one array)."""
    mask = counts != 0
    bounds = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.count_nonzero(mask, axis=1), out=bounds[1:])
    slots = np.broadcast_to(np.arange(offset, offset + counts.shape[1], dtype=np.int32), counts.shape)[mask]
    both = np.stack([slots, counts[mask].astype(np.int32)])
    edges = bounds.tolist()
    return [both[:, lo:hi] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


@dataclass(slots=True, eq=False)
class StepBatch:
    """One closed step of every key of a partition: row ``i`` is ``keys[i]``."""

    window_end: float
    length_s: float
    relative_accuracy: float
    keys: list[tuple[str, str]]
    stats: FloatArray  # (rows, _STATS_LEN): the window's merged bucket row per key (layout in summary.py)
    step_count: npt.NDArray[np.int64]  # (rows,) events in the newest step
    step_cuda_errors: dict[int, dict[str, int]]  # row -> cuda_error value -> count, newest step
    latency_q: FloatArray  # (rows, len(LATENCY_QUANTILES)); NaN: no event
    ttft_q: FloatArray  # (rows, len(TTFT_QUANTILES)); NaN: no event reported ttft_ms
    latency_counts: CountMatrix  # (rows, w) dense latency sketch over slots [latency_offset, +w)
    latency_offset: int
    ttft_counts: CountMatrix
    ttft_offset: int
    tpot_q: FloatArray  # (rows, len(TPOT_QUANTILES)); NaN: no event with completion tokens
    tpot_counts: CountMatrix
    tpot_offset: int
    recent: FloatArray  # (rows, 3): count, prompt-length mean and m2 over the newest RECENT_S
    _steps: list[ReplicaStep] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def count(self) -> npt.NDArray[np.int64]:
        """Events in each row's window."""
        return self.stats[:, _COUNT].astype(np.int64)

    def replica_steps(self) -> list[ReplicaStep]:
        """Every row as a :class:`ReplicaStep`, built once (column-wise, then one object per row)."""
        if self._steps is None:
            # ~10 objects per row and none of them in a reference cycle: pausing the cyclic GC while
            # they are made saves it from scanning the growing young generation over and over
            # (a third of the build time at 10k rows); it runs again, as before, right after
            with gc_paused():
                self._steps = self._build()
        return self._steps

    def _build(self) -> list[ReplicaStep]:
        rows = len(self.keys)
        if not rows:
            return []
        st = self.stats
        length = self.length_s
        count_f = st[:, _COUNT]
        has_events = count_f > 0
        field_count = st[:, _MOMENT_COUNT_COLUMNS]  # (rows, 5) each MOMENT_FIELDS' own count
        known = field_count > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            var = st[:, _M2] / field_count  # population variance; NaN/inf where unknown (masked below)
            optional_mean = st[:, _OPT_SUM] / st[:, _OPT_N]
            error_rate = st[:, _ERRORS] / count_f
        mean = st[:, _MEAN]
        count = count_f.astype(np.int64).tolist()
        errors = st[:, _ERRORS].astype(np.int64).tolist()
        completion = st[:, _COMPLETION].astype(np.int64).tolist()
        batch_count = np.rint(st[:, _BATCH_N]).astype(np.int64).tolist()
        fill_count = np.rint(st[:, _FILL_N]).astype(np.int64).tolist()
        derived_count = np.rint(st[:, _DERIVED_N]).astype(np.int64).tolist()
        optional_count = st[:, _OPT_N].round().astype(np.int64)
        optional_known = optional_count > 0
        step_count = self.step_count.tolist()
        latency_known = ~np.isnan(self.latency_q)
        ttft_known = ~np.isnan(self.ttft_q)
        tpot_known = ~np.isnan(self.tpot_q)
        recent_n = self.recent[:, 0]
        recent_known = recent_n > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            recent_var = self.recent[:, 2] / recent_n
        recent_count = recent_n.astype(np.int64).tolist()
        columns = {
            "rps": (count_f / length).tolist(),
            "latency_p50": _or_none(self.latency_q[:, 0], latency_known[:, 0]),
            "latency_p95": _or_none(self.latency_q[:, 1], latency_known[:, 1]),
            "latency_p99": _or_none(self.latency_q[:, 2], latency_known[:, 2]),
            "latency_mean": _or_none(mean[:, 0], known[:, 0]),
            "ttft_p50": _or_none(self.ttft_q[:, 0], ttft_known[:, 0]),
            "ttft_p99": _or_none(self.ttft_q[:, 1], ttft_known[:, 1]),
            "batch_size_mean": _or_none(mean[:, 3], known[:, 3]),
            "batch_size_std": _or_none(np.sqrt(np.maximum(np.where(known[:, 3], var[:, 3], 0.0), 0.0)),
                                       known[:, 3]),
            "batch_fill_mean": _or_none(mean[:, 4], known[:, 4]),
            "prompt_tokens_mean": _or_none(mean[:, 1], known[:, 1]),
            "prompt_tokens_var": _or_none(var[:, 1], known[:, 1]),
            "completion_tokens_mean": _or_none(mean[:, 2], known[:, 2]),
            "completion_tokens_var": _or_none(var[:, 2], known[:, 2]),
            "tokens_per_s": (st[:, _COMPLETION].astype(np.int64) / length).tolist(),
            "error_rate": _or_none(error_rate, has_events),
            "queue_length_mean": _or_none(optional_mean[:, 1], optional_known[:, 1]),
            "kv_cache_hit_rate_mean": _or_none(optional_mean[:, 2], optional_known[:, 2]),
            "tpot_p50": _or_none(self.tpot_q[:, 0], tpot_known[:, 0]),
            "tpot_p90": _or_none(self.tpot_q[:, 1], tpot_known[:, 1]),
            "tpot_p99": _or_none(self.tpot_q[:, 2], tpot_known[:, 2]),
            "tpot_max": _or_none(self.tpot_q[:, 3], tpot_known[:, 3]),
            "recent_count": recent_count,
            "recent_prompt_tokens_mean": _or_none(self.recent[:, 1], recent_known),
            "recent_prompt_tokens_var": _or_none(recent_var, recent_known),
        }
        cuda = self.step_cuda_errors
        step_cuda = [dict(cuda[i]) if i in cuda else {} for i in range(rows)] if cuda else [{} for _ in range(rows)]
        end, length_col = self.window_end, [length] * rows
        columns.update(
            model=[model for model, _ in self.keys], replica=[replica for _, replica in self.keys],
            window_start=[end - length] * rows, window_end=[end] * rows, count=count, step_count=step_count,
            step_cuda_errors=step_cuda, replicas=[None] * rows, batch_count=batch_count,
            batch_derived_count=derived_count, v=[FEATURES_SCHEMA_VERSION] * rows,
        )
        # positionally, in the dataclass's field order (looked up, not assumed): ~3x faster than kwargs
        vectors = [FeatureVector(*values) for values in zip(*(columns[name] for name in _FEATURE_FIELDS),
                                                             strict=True)]
        summaries = [
            WindowSummary(*values) for values in zip(
                columns["model"], columns["replica"], columns["window_end"], length_col,
                [self.relative_accuracy] * rows, count, errors, completion, st[:, _MEAN], st[:, _M2],
                optional_count, st[:, _OPT_SUM], _sparse_rows(self.latency_counts, self.latency_offset),
                _sparse_rows(self.ttft_counts, self.ttft_offset), step_count,
                [dict(d) for d in step_cuda], [None] * rows, batch_count, fill_count, derived_count,
                _sparse_rows(self.tpot_counts, self.tpot_offset), recent_count, self.recent[:, 1].tolist(),
                self.recent[:, 2].tolist(), strict=True)
        ]
        return [ReplicaStep(fv, summary) for fv, summary in zip(vectors, summaries, strict=True)]


class ClosedSteps(Sequence[ReplicaStep]):
    """The steps one :meth:`PartitionWindows.close_steps` call closed, oldest first.

    ``batches`` is the columnar form (one :class:`StepBatch` per closed step end); as a sequence
    it is every key's :class:`ReplicaStep` of every batch, in that order, built on first use.
    """

    __slots__ = ("batches",)

    def __init__(self, batches: list[StepBatch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return sum(len(batch) for batch in self.batches)

    def __iter__(self) -> Iterator[ReplicaStep]:
        for batch in self.batches:
            yield from batch.replica_steps()

    @overload
    def __getitem__(self, index: int) -> ReplicaStep: ...
    @overload
    def __getitem__(self, index: slice) -> list[ReplicaStep]: ...

    def __getitem__(self, index: int | slice) -> ReplicaStep | list[ReplicaStep]:
        return list(self)[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ClosedSteps({[(b.window_end, len(b)) for b in self.batches]})"
