"""What :meth:`PartitionWindows.close_steps` returns: one :class:`StepBatch` (columns) per closed step.

A step of a partition covers every known key at once, so it is computed and kept as columns: one
row per (model, replica), the window's merged statistics in one ``(rows, STATS_LEN)`` array, the
quantiles in ``(rows, k)`` arrays and the sketches as dense per-row count matrices. The per-row
Python objects the rest of the pipeline reads (:class:`ReplicaStep` = :class:`FeatureVector` +
:class:`WindowSummary`) are built only when someone iterates, all rows of a batch at once, from
``tolist()`` columns (:meth:`StepBatch.replica_steps`). The vectors come from
``feature_columns.py``, as :meth:`WindowSummary.features` does, so a row's vector equals its own
summary's features to the bit (the tests check it on every step).

>>> from skewwatch.pipeline.window_settings import WindowSettings
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
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt

from skewwatch.gc_pause import gc_paused
from skewwatch.pipeline import moments
from skewwatch.pipeline.sketch import SparseCounts
from skewwatch.pipeline.window.bucket_row import (
    BATCH_N,
    COMPLETION,
    COUNT,
    DERIVED_N,
    ERRORS,
    FILL_N,
    M2,
    MEAN,
    MOMENT_COUNT_COLUMNS,
    OPT_N,
    OPT_SUM,
)
from skewwatch.pipeline.window.feature_columns import feature_vectors
from skewwatch.pipeline.window.summary import WindowSummary
from skewwatch.schemas.feature_vector import FeatureVector

FloatArray = npt.NDArray[np.float64]
CountMatrix = npt.NDArray[np.int32]

# WindowSummary is built positionally too: this is the order the builder passes its columns in
_SUMMARY_ORDER: tuple[str, ...] = (
    "model", "replica", "window_end", "length_s", "relative_accuracy", "count", "errors", "completion_tokens",
    "mean", "m2", "optional_count", "optional_sum", "latency", "ttft", "step_count", "step_cuda_errors",
    "replicas", "batch_count", "fill_count", "derived_count", "tpot", "recent_count", "recent_prompt_mean",
    "recent_prompt_m2", "step_tpot_max")
if tuple(f.name for f in dataclasses.fields(WindowSummary)) != _SUMMARY_ORDER:  # pragma: no cover
    raise ImportError("WindowSummary's fields changed: update StepBatch._build")


class ReplicaStep(NamedTuple):
    """One closed step of one (model, replica): its feature vector and its mergeable summary."""

    features: FeatureVector
    summary: WindowSummary


def _sparse_rows(counts: CountMatrix, offset: int) -> list[SparseCounts]:
    """Each row of a dense count matrix as a ``(2, k)`` sparse array (views of one array)."""
    mask = counts != 0
    bounds = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.count_nonzero(mask, axis=1), out=bounds[1:])
    slots = np.broadcast_to(np.arange(offset, offset + counts.shape[1], dtype=np.int32), counts.shape)[mask]
    both = np.stack([slots, counts[mask].astype(np.int32)])
    edges = bounds.tolist()
    return [both[:, lo:hi] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _group_counts(counts: CountMatrix, starts: npt.NDArray[np.int64]) -> CountMatrix:
    """Sketch count rows summed per run of rows; int32 like every sketch (refused past its range)."""
    if not counts.shape[1]:
        return np.zeros((len(starts), 0), dtype=np.int32)
    total = np.add.reduceat(counts, starts, axis=0, dtype=np.int64)
    if total.size and total.max() > np.iinfo(np.int32).max:
        raise OverflowError("sketch count exceeds int32")
    return total.astype(np.int32)


@dataclass(slots=True, eq=False)
class StepBatch:
    """One closed step of every key of a partition: row ``i`` is ``keys[i]``."""

    window_end: float
    length_s: float
    relative_accuracy: float
    keys: list[tuple[str, str]]
    stats: FloatArray  # (rows, STATS_LEN): the window's merged bucket row per key (layout in bucket_row.py)
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
    step_tpot_max: FloatArray  # (rows,) the newest step's largest TPOT (a sketch bin's value); NaN: none
    _vectors: list[FeatureVector] | None = field(default=None, repr=False)
    _steps: list[ReplicaStep] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def count(self) -> npt.NDArray[np.int64]:
        """Events in each row's window."""
        return self.stats[:, COUNT].astype(np.int64)

    def feature_vectors(self) -> list[FeatureVector]:
        """Every row's :class:`FeatureVector`, built once (column-wise, then one object per row).

        What stage 1 publishes and hands to stage 2; a model's summaries travel merged
        (:meth:`merged`), so the hot path builds no per-row :class:`WindowSummary`."""
        if self._vectors is None:
            # ~5 objects per row and none of them in a reference cycle: pausing the cyclic GC while
            # they are made saves it from scanning the growing young generation over and over, a
            # cost that grows with the rows; the collector is back on right after
            with gc_paused():
                self._vectors = self._build_vectors()
        return self._vectors

    def replica_steps(self) -> list[ReplicaStep]:
        """Every row as a :class:`ReplicaStep` (its vector and its own summary), built once."""
        if self._steps is None:
            vectors = self.feature_vectors()
            with gc_paused():
                self._steps = [ReplicaStep(fv, summary)
                               for fv, summary in zip(vectors, self._build_summaries(), strict=True)]
        return self._steps

    def model_rows(self) -> dict[str, npt.NDArray[np.int64]]:
        """Each model's rows, in the order its keys come (models in order of their first row)."""
        rows: dict[str, list[int]] = {}
        for i, (model, _) in enumerate(self.keys):
            rows.setdefault(model, []).append(i)
        return {model: np.array(at, dtype=np.int64) for model, at in rows.items()}

    def merged(self, groups: Sequence[npt.NDArray[np.int64]]) -> list[WindowSummary]:
        """One merged summary per group of rows (``groups[g]``: row indices of one model), as
        :func:`~skewwatch.pipeline.model_merge.merge_summaries` would merge those rows' summaries
        (``replica=None``, ``replicas`` = rows merged), computed on the columns: sums by
        ``np.add.reduceat`` over the rows sorted by group, moments by the k-way form of Chan's
        formula, sketches as integer sums of the dense count rows (exact). A stage 2 merge of
        these partials equals the merge of every row's own summary (means and variances to the
        last few bits: the sums are associated differently).
        """
        lengths = np.fromiter((len(g) for g in groups), np.int64, len(groups))
        if not len(groups):
            return []
        if (lengths == 0).any():
            raise ValueError("StepBatch.merged: a group holds no row")
        order = np.concatenate(groups)
        starts = np.zeros(len(groups), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        st = self.stats[order]
        total = np.add.reduceat(st, starts, axis=0)
        fields = moments.merge_runs(moments.Moments(st[:, MOMENT_COUNT_COLUMNS], st[:, MEAN], st[:, M2]), starts)
        recent = self.recent[order]
        prompt = moments.merge_runs(moments.Moments(recent[:, :1], recent[:, 1:2], recent[:, 2:3]), starts)
        step_count = np.add.reduceat(self.step_count[order], starts).tolist()
        step_top = np.fmax.reduceat(self.step_tpot_max[order], starts).tolist()  # (fmax: NaN only where all are)
        sketches = [_sparse_rows(_group_counts(counts[order], starts), offset) for counts, offset in (
            (self.latency_counts, self.latency_offset), (self.ttft_counts, self.ttft_offset),
            (self.tpot_counts, self.tpot_offset))]
        cuda: list[dict[str, int]] = [{} for _ in groups]
        if self.step_cuda_errors:
            for group, row in zip(np.repeat(np.arange(len(groups)), lengths).tolist(), order.tolist(), strict=True):
                for error, n in self.step_cuda_errors.get(row, {}).items():
                    cuda[group][error] = cuda[group].get(error, 0) + n
        ints = np.rint(total).astype(np.int64)
        models = [self.keys[int(g[0])][0] for g in groups]
        return [
            WindowSummary(
                model=model, replica=None, window_end=self.window_end, length_s=self.length_s,
                relative_accuracy=self.relative_accuracy, count=int(ints[g, COUNT]), errors=int(ints[g, ERRORS]),
                completion_tokens=int(ints[g, COMPLETION]), mean=fields.mean[g], m2=fields.m2[g],
                optional_count=ints[g, OPT_N].copy(), optional_sum=total[g, OPT_SUM].copy(),
                latency=sketches[0][g], ttft=sketches[1][g], step_count=step_count[g], step_cuda_errors=cuda[g],
                replicas=int(lengths[g]), batch_count=int(ints[g, BATCH_N]), fill_count=int(ints[g, FILL_N]),
                derived_count=int(ints[g, DERIVED_N]), tpot=sketches[2][g], recent_count=int(recent_n),
                recent_prompt_mean=float(prompt.mean[g, 0]), recent_prompt_m2=float(prompt.m2[g, 0]),
                step_tpot_max=None if math.isnan(step_top[g]) else step_top[g])
            for g, (model, recent_n) in enumerate(zip(models, np.add.reduceat(
                np.rint(recent[:, 0]).astype(np.int64), starts).tolist(), strict=True))
        ]

    def _build_vectors(self) -> list[FeatureVector]:
        rows = len(self.keys)
        cuda = self.step_cuda_errors
        step_cuda = [dict(cuda[i]) if i in cuda else {} for i in range(rows)] if cuda else [{} for _ in range(rows)]
        return feature_vectors(self.keys, self.window_end, self.length_s, self.stats, self.step_count.tolist(),
                               step_cuda, self.latency_q, self.ttft_q, self.tpot_q, self.recent, [None] * rows,
                               self.step_tpot_max)

    def _build_summaries(self) -> list[WindowSummary]:
        rows = len(self.keys)
        st = self.stats
        count = st[:, COUNT].astype(np.int64).tolist()
        errors = st[:, ERRORS].astype(np.int64).tolist()
        completion = st[:, COMPLETION].astype(np.int64).tolist()
        batch_count = np.rint(st[:, BATCH_N]).astype(np.int64).tolist()
        fill_count = np.rint(st[:, FILL_N]).astype(np.int64).tolist()
        derived_count = np.rint(st[:, DERIVED_N]).astype(np.int64).tolist()
        optional_count = st[:, OPT_N].round().astype(np.int64)
        step_count = self.step_count.tolist()
        recent_count = self.recent[:, 0].astype(np.int64).tolist()
        cuda = self.step_cuda_errors
        step_cuda = [dict(cuda.get(i, {})) for i in range(rows)]
        return [
            WindowSummary(*values) for values in zip(
                [model for model, _ in self.keys], [replica for _, replica in self.keys], [self.window_end] * rows,
                [self.length_s] * rows, [self.relative_accuracy] * rows, count, errors, completion, st[:, MEAN],
                st[:, M2], optional_count, st[:, OPT_SUM], _sparse_rows(self.latency_counts, self.latency_offset),
                _sparse_rows(self.ttft_counts, self.ttft_offset), step_count, step_cuda, [None] * rows,
                batch_count, fill_count, derived_count, _sparse_rows(self.tpot_counts, self.tpot_offset),
                recent_count, self.recent[:, 1].tolist(), self.recent[:, 2].tolist(),
                [None if math.isnan(v) else v for v in self.step_tpot_max.tolist()], strict=True)
        ]


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
