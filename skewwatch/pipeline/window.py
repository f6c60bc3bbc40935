"""Sliding 60 s / 5 s event-time windows per (model, replica), kept as 12 five-second buckets.

Implements issue 2 "Windows" and DESIGN.md "Topology, state and recovery" (stage 1):

* **Event time, watermark, lateness.** Each Kafka partition has one :class:`PartitionWindows`.
  Its watermark is ``max event ts seen - allowed_lateness_s`` (never moving back). A bucket
  ``[b*step, (b+1)*step)`` is *sealed* when the step ending at ``(b+1)*step`` is closed, which
  happens once that end is <= the watermark. An event whose bucket is already sealed is **late**:
  counted (:attr:`PartitionWindows.late_total`), not folded in. Events far in the future are
  accepted and simply push the watermark ahead (a producer with a fast clock therefore closes
  steps early for the whole partition; the events themselves are not rejected here).
* **Buckets, not Faust windowed tables.** Per key: a ring of ``length_s / step_s`` (= 12) sealed
  buckets plus the few *open* buckets still collecting events (usually 1-2: the watermark trails by
  the allowed lateness). Each bucket holds counts, Welford moments, sums and sparse sketches.
  The window keeps a dense running :class:`~skewwatch.pipeline.sketch.SketchTotal` per sketch: a
  step *adds* the newly sealed bucket and *subtracts* the one that fell out, instead of
  re-merging 12 buckets. (Buckets enter the total when sealed, not on insert, so a bucket still
  open for late-ish events never leaks into an earlier window's quantiles.)
* **Silence is visible.** Every closed step emits one :class:`ReplicaStep` for *every* known key,
  with ``count == 0`` for a silent replica; a key is released once it has had no event for
  ``max(idle_release_s, length_s)`` seconds (never while it still has data in the window).
* **Vectorised hot path.** :meth:`PartitionWindows.apply` groups a whole decoded batch by
  (key, bucket) once and computes every per-group statistic with ``np.bincount``/``np.unique``;
  only the merge into each touched bucket is a Python loop, over groups, not events.
* **State survives restarts.** :meth:`PartitionWindows.snapshot` / :meth:`PartitionWindows.restore`
  give compact bytes (zlib-compressed JSON, numpy arrays as base64; never pickle: it is read back
  from Kafka) that the worker stores with the input offset it covers.

* **Unknown batch sizes** (contract v1.1: OTLP spans carry none). The batch moments are kept over
  the rows that *have* a batch size only (``batch_fill`` over rows with size and capacity), with
  their own counts, so an unknown batch never reads as 0; a window where no row had one reports
  ``batch_size_mean``/``batch_size_std``/``batch_fill_mean`` as None and the batch detectors stay
  silent. Rows whose size the worker derived from telemetry are counted (``batch_derived_count``).

The feature definitions live in exactly one place, :meth:`WindowSummary.features`; per-model
vectors (``model_merge.py``) merge summaries and call the same method.

>>> from skewwatch.config import WindowSettings
>>> from skewwatch.pipeline.events import RequestColumns
>>> ev = dict(model="m", replica="r1", prompt_tokens=10, completion_tokens=20, batch_size=4,
...           batch_capacity=16)
>>> windows = PartitionWindows(WindowSettings())
>>> windows.apply(RequestColumns.from_rows([dict(ev, request_id="a", ts=101.0, latency_ms=100.0),
...                                        dict(ev, request_id="b", ts=103.0, latency_ms=300.0)]))
ApplyResult(accepted=2, late=0)
>>> windows.advance_watermark(110.0)
>>> [(s.features.window_end, s.features.count, s.features.step_count) for s in windows.close_steps()]
[(105.0, 2, 2), (110.0, 2, 0)]
>>> windows.apply(RequestColumns.from_rows([dict(ev, request_id="c", ts=104.0, latency_ms=1.0)]))
ApplyResult(accepted=0, late=1)
"""

from __future__ import annotations

import base64
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from skewwatch.config import WindowSettings
from skewwatch.pipeline import moments
from skewwatch.pipeline.events import BATCH_DERIVED, RequestColumns
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.sketch import EMPTY_SPARSE, SketchTotal, SparseCounts, add_sparse, log_bins

FloatArray = npt.NDArray[np.float64]

# Kept as Welford moments. The first three are on every event (their count is the bucket's event
# count); batch_size is over the events with a known batch size (count _BATCH_N) and batch_fill
# over those with a known size and capacity (count _FILL_N): v1.1 batch fields are optional.
MOMENT_FIELDS: tuple[str, ...] = (
    "latency_ms", "prompt_tokens", "completion_tokens", "batch_size", "batch_fill",
)
_EVENT_MOMENTS = 3  # MOMENT_FIELDS[:3] are counted by _COUNT
# Optional fields (NaN = not reported): kept as (reported count, sum), so missing never reads as 0.
OPTIONAL_FIELDS: tuple[str, ...] = ("ttft_ms", "queue_length", "kv_cache_hit_rate")
_M, _O = len(MOMENT_FIELDS), len(OPTIONAL_FIELDS)
# All numbers of a bucket live in ONE float64 row: one numpy object per bucket instead of several
# (each array costs ~100 bytes of header and memory per replica matters); counts are exact in
# float64 up to 2**53. Layout of a row:
_COUNT, _ERRORS, _COMPLETION = 0, 1, 2  # events; events with status "error"; completion tokens
_MEAN = slice(3, 3 + _M)  # mean of each MOMENT_FIELDS
_M2 = slice(3 + _M, 3 + 2 * _M)  # sum of squared deviations of each MOMENT_FIELDS
_OPT_N = slice(3 + 2 * _M, 3 + 2 * _M + _O)  # events that reported each OPTIONAL_FIELDS
_OPT_SUM = slice(3 + 2 * _M + _O, 3 + 2 * _M + 2 * _O)  # their sum
# appended in snapshot v2 (a v1 row is read as "every event had a reported batch"):
_BATCH_N = 3 + 2 * _M + 2 * _O  # events with a known batch_size (reported or derived)
_FILL_N = _BATCH_N + 1  # events with a known batch_size and batch_capacity
_DERIVED_N = _BATCH_N + 2  # events whose batch_size was derived from telemetry
_STATS_LEN_V1 = _BATCH_N
_STATS_LEN = _BATCH_N + 3
# (count column, MOMENT_FIELDS indices it counts), for merging moments
_MOMENT_COUNTS: tuple[tuple[int, slice], ...] = (
    (_COUNT, slice(0, _EVENT_MOMENTS)), (_BATCH_N, slice(3, 4)), (_FILL_N, slice(4, 5)))
# Merge an open bucket's parts once this many have piled up (bounds memory for a key that
# shows up in every small poll).
_MAX_OPEN_PARTS = 4

SUMMARY_VERSION = 1
SNAPSHOT_FORMAT = "skewwatch.partition-windows"
SNAPSHOT_VERSION = 2  # v2: stats rows gained _BATCH_N, _FILL_N, _DERIVED_N; v1 is still read
# snapshot bytes = magic + zlib(JSON); zlib level 1 shrinks them ~3x for ~10 % more time
_SNAPSHOT_MAGIC = b"SWW1"
_SNAPSHOT_MAX_BYTES = 512 << 20  # refuse to inflate past this (a corrupt or hostile record)


# ---------------------------------------------------------------------------------------------
# The summary of one window, and THE feature definitions
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

    @property
    def window_start(self) -> float:
        return self.window_end - self.length_s

    def moments(self) -> moments.Moments:
        """The window's moments for MOMENT_FIELDS (each field with its own count)."""
        counts = np.array([self.count] * _EVENT_MOMENTS + [self.batch_count, self.fill_count], dtype=np.float64)
        return moments.Moments(counts, self.mean, self.m2)

    def features(self) -> FeatureVector:
        """The feature vector of this window. Every feature is defined here and only here."""
        n = self.count
        length = self.length_s
        bins = log_bins(self.relative_accuracy)
        # quantiles: sketch, rank floor(q*(n-1)) (numpy "lower"), <= relative_accuracy error
        latency_q: list[float | None] = [None] * 3
        ttft_q: list[float | None] = [None] * 2
        if self.latency.shape[1]:
            latency_q = list(bins.quantile(self.latency[1], [0.5, 0.95, 0.99], slots=self.latency[0]) or [])
        if self.ttft.shape[1]:
            ttft_q = list(bins.quantile(self.ttft[1], [0.5, 0.99], slots=self.ttft[0]) or [])
        mean: dict[str, float | None] = dict.fromkeys(MOMENT_FIELDS)
        var: dict[str, float | None] = dict.fromkeys(MOMENT_FIELDS)
        counts = [n] * _EVENT_MOMENTS + [self.batch_count, self.fill_count]
        for f, count, field_mean, m2 in zip(MOMENT_FIELDS, counts, self.mean.tolist(), self.m2.tolist(),
                                            strict=True):
            if count > 0:  # no event with the field: unknown (None), never 0
                mean[f] = field_mean
                var[f] = m2 / count  # population
        optional_mean = {
            f: (total / reported if reported else None)
            for f, reported, total in zip(OPTIONAL_FIELDS, self.optional_count.tolist(),
                                          self.optional_sum.tolist(), strict=True)
        }
        batch_var = var["batch_size"]
        return FeatureVector(
            model=self.model,
            replica=self.replica,
            window_start=self.window_start,
            window_end=self.window_end,
            count=n,
            rps=n / length,
            latency_p50=latency_q[0],
            latency_p95=latency_q[1],
            latency_p99=latency_q[2],
            latency_mean=mean["latency_ms"],
            ttft_p50=ttft_q[0],
            ttft_p99=ttft_q[1],
            batch_size_mean=mean["batch_size"],
            batch_size_std=None if batch_var is None else math.sqrt(max(batch_var, 0.0)),
            batch_fill_mean=mean["batch_fill"],
            prompt_tokens_mean=mean["prompt_tokens"],
            prompt_tokens_var=var["prompt_tokens"],
            completion_tokens_mean=mean["completion_tokens"],
            completion_tokens_var=var["completion_tokens"],
            tokens_per_s=self.completion_tokens / length,
            error_rate=self.errors / n if n else None,
            queue_length_mean=optional_mean["queue_length"],
            kv_cache_hit_rate_mean=optional_mean["kv_cache_hit_rate"],
            step_count=self.step_count,
            step_cuda_errors=dict(self.step_cuda_errors),
            replicas=self.replicas,
            batch_count=self.batch_count,
            batch_derived_count=self.derived_count,
        )

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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowSummary:
        """Inverse of :meth:`to_dict`; raises ValueError (with the field) on a malformed record."""
        if data.get("v") != SUMMARY_VERSION:
            raise ValueError(f"window summary: unsupported version {data.get('v')!r}")
        try:
            n_slots = log_bins(float(data["relative_accuracy"])).n_slots

            def sparse(name: str) -> SparseCounts:
                arr = np.asarray(data[name], dtype=np.int64).reshape(2, -1)
                if arr.shape[1] and (arr[0].min() < 0 or arr[0].max() >= n_slots or arr[1].min() <= 0
                                     or np.any(np.diff(arr[0]) <= 0)):
                    raise ValueError(f"{name}: slots must be sorted, in range, with positive counts")
                return arr.astype(np.int32)

            def per_field(name: str, names: tuple[str, ...], dtype: type) -> npt.NDArray[Any]:
                return np.array([data[name][f] for f in names], dtype=dtype)

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
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"window summary: malformed ({exc!r})") from exc


class ReplicaStep(NamedTuple):
    """One closed step of one (model, replica): its feature vector and its mergeable summary."""

    features: FeatureVector
    summary: WindowSummary


class ApplyResult(NamedTuple):
    accepted: int  # events folded into open buckets
    late: int  # events whose bucket was already sealed: counted, not applied


# ---------------------------------------------------------------------------------------------
# Buckets and the window of one key
# ---------------------------------------------------------------------------------------------

def _combine(rows: FloatArray) -> FloatArray:
    """Merge p bucket rows (or p parts of one bucket) into one row: sums added, moments by Chan.

    The same function merges an open bucket's parts when it is sealed and a window's 12 sealed
    buckets at every step.
    """
    out = np.add.reduce(rows, axis=0)  # right for the counts and optional sums; moments replaced
    count = rows[:, _COUNT]
    if out[_BATCH_N] == out[_COUNT] and out[_FILL_N] == out[_COUNT]:
        # every event had a batch (the common case): one merge, all fields share the event count
        merged = moments.merge_rows(count, rows[:, _MEAN], rows[:, _M2])
        out[_MEAN] = merged.mean
        out[_M2] = merged.m2
        return out
    mean, m2 = rows[:, _MEAN], rows[:, _M2]
    for count_column, fields in _MOMENT_COUNTS:
        merged = moments.merge_rows(rows[:, count_column], mean[:, fields], m2[:, fields])
        out[_MEAN.start + fields.start:_MEAN.start + fields.stop] = merged.mean
        out[_M2.start + fields.start:_M2.start + fields.stop] = merged.m2
    return out


class _Bucket(NamedTuple):
    """The merged statistics of one key's events in one bucket ``[id*step, (id+1)*step)``."""

    stats: FloatArray  # (_STATS_LEN,) row, layout above
    sketch: SparseCounts  # latency slots s and ttft slots n_slots + s, in one array (see WindowState)
    cuda_errors: dict[str, int]


class _OpenBucket:
    """A bucket still collecting events, as a list of per-batch parts merged when sealed.

    Appending a part is O(1); merging (a sketch addition and Chan's formula) on every batch would
    cost tens of microseconds per (key, bucket) group and dominate a poll that touches many
    replicas. Parts are merged when sealed, or early once ``_MAX_OPEN_PARTS`` pile up.
    """

    __slots__ = ("stats", "sketches", "cuda_errors")

    def __init__(self) -> None:
        self.stats: list[FloatArray] = []
        self.sketches: list[SparseCounts] = []
        self.cuda_errors: Counter[str] | None = None

    def add(self, stats: FloatArray, sketch: SparseCounts, cuda_errors: Counter[str] | None) -> None:
        """Append one part. Copies: a row or slice of a batch-wide array would keep it alive."""
        self.stats.append(stats.copy())
        self.sketches.append(sketch.copy())
        if cuda_errors:
            if self.cuda_errors is None:
                self.cuda_errors = Counter()
            self.cuda_errors.update(cuda_errors)
        if len(self.stats) >= _MAX_OPEN_PARTS:
            self.consolidate()

    def consolidate(self) -> _Bucket:
        """Merge the parts, and keep the merged form as the only part (so merging twice is exact)."""
        stats = self.stats[0] if len(self.stats) == 1 else _combine(np.stack(self.stats))
        bucket = _Bucket(stats, add_sparse(self.sketches), dict(self.cuda_errors or {}))
        self.stats, self.sketches = [bucket.stats], [bucket.sketch]
        return bucket


class WindowState:
    """The window of ONE (model, replica): a ring of sealed buckets, open buckets, sketch totals.

    Sealed bucket ``b`` lives in row ``b % n_buckets`` of ``stats`` (one 2-D array, not 12 row
    objects) and of ``sketches``. To halve the number of small arrays per replica, a bucket keeps
    its latency and TTFT sketches in ONE sparse array: latency in slots ``[0, n_slots)``, TTFT in
    ``[n_slots, 2 * n_slots)``. The two running totals are split apart again.
    """

    __slots__ = ("model", "replica", "n_slots", "stats", "sketches", "open",
                 "latency_total", "ttft_total", "last_event_ts")

    def __init__(self, model: str, replica: str, n_buckets: int, n_slots: int) -> None:
        self.model = model
        self.replica = replica
        self.n_slots = n_slots
        self.stats: FloatArray = np.zeros((n_buckets, _STATS_LEN))
        self.sketches: list[SparseCounts] = [EMPTY_SPARSE] * n_buckets
        self.open: dict[int, _OpenBucket] = {}  # bucket id -> bucket not sealed yet
        self.latency_total = SketchTotal()  # always the sum of the ring's latency sketches
        self.ttft_total = SketchTotal()  # ... and of its TTFT sketches (slots n_slots + s)
        self.last_event_ts = -math.inf

    def open_bucket(self, bucket_id: int) -> _OpenBucket:
        bucket = self.open.get(bucket_id)
        if bucket is None:
            bucket = self.open[bucket_id] = _OpenBucket()
        return bucket

    def _split(self, sketch: SparseCounts) -> tuple[SparseCounts, SparseCounts]:
        cut = int(np.searchsorted(sketch[0], self.n_slots))
        return sketch[:, :cut], sketch[:, cut:]

    def place(self, bucket_id: int, bucket: _Bucket | None) -> None:
        """Put a sealed bucket (or an empty one) in its ring row, replacing bucket ``bucket_id - n``."""
        row = bucket_id % len(self.sketches)
        leaving_latency, leaving_ttft = self._split(self.sketches[row])
        self.latency_total.subtract(leaving_latency)
        self.ttft_total.subtract(leaving_ttft)
        if bucket is None:
            self.stats[row] = 0.0
            self.sketches[row] = EMPTY_SPARSE
        else:
            self.stats[row] = bucket.stats
            self.sketches[row] = bucket.sketch
            entering_latency, entering_ttft = self._split(bucket.sketch)
            self.latency_total.add(entering_latency)
            self.ttft_total.add(entering_ttft)

    def step(self, bucket_id: int, settings: WindowSettings) -> WindowSummary:
        """Seal bucket ``bucket_id`` (it enters, ``bucket_id - n`` leaves) and summarise the window."""
        entering = self.open.pop(bucket_id, None)
        bucket = entering.consolidate() if entering is not None else None
        self.place(bucket_id, bucket)
        window = _combine(self.stats)
        count, errors, completion = window[[_COUNT, _ERRORS, _COMPLETION]].tolist()  # exact in float64
        ttft = self.ttft_total.sparse()
        ttft[0] -= self.n_slots
        return WindowSummary(
            model=self.model,
            replica=self.replica,
            window_end=(bucket_id + 1) * settings.step_s,
            length_s=settings.length_s,
            relative_accuracy=settings.sketch_relative_accuracy,
            count=int(count),
            errors=int(errors),
            completion_tokens=int(completion),
            mean=window[_MEAN],
            m2=window[_M2],
            optional_count=window[_OPT_N].round().astype(np.int64),
            optional_sum=window[_OPT_SUM],
            latency=self.latency_total.sparse(),
            ttft=ttft,
            step_count=int(bucket.stats[_COUNT]) if bucket is not None else 0,
            step_cuda_errors=dict(bucket.cuda_errors) if bucket is not None else {},
            batch_count=int(round(window[_BATCH_N])),
            fill_count=int(round(window[_FILL_N])),
            derived_count=int(round(window[_DERIVED_N])),
        )


# ---------------------------------------------------------------------------------------------
# All keys of one Kafka partition
# ---------------------------------------------------------------------------------------------

class PartitionWindows:
    """The windows of every (model, replica) of one Kafka partition, with its watermark."""

    def __init__(self, settings: WindowSettings) -> None:
        n = settings.length_s / settings.step_s
        if settings.step_s <= 0 or n < 1 or abs(n - round(n)) > 1e-9:
            raise ValueError(f"window length {settings.length_s} s must be a whole number of "
                             f"{settings.step_s} s steps")
        self.settings = settings
        self.n_buckets = round(n)
        self.bins = log_bins(settings.sketch_relative_accuracy)
        self.keys: dict[tuple[str, str], WindowState] = {}
        self.watermark: float | None = None
        self.closed_through: int | None = None  # id of the newest sealed bucket
        self.late_total = 0

    @property
    def last_closed_end(self) -> float | None:
        """End of the newest closed step: events before it are late."""
        return None if self.closed_through is None else (self.closed_through + 1) * self.settings.step_s

    def advance_watermark(self, watermark: float) -> None:
        """Move the watermark to ``watermark`` if that is ahead (an idle partition following the others)."""
        if self.watermark is None or watermark > self.watermark:
            self.watermark = float(watermark)

    def _new_state(self, model: str, replica: str) -> WindowState:
        state = self.keys[(model, replica)] = WindowState(model, replica, self.n_buckets, self.bins.n_slots)
        return state

    def apply(self, cols: RequestColumns) -> ApplyResult:
        """Fold a batch of validated events into their open buckets, in one vectorised pass."""
        n = len(cols)
        if n == 0:
            return ApplyResult(0, 0)
        step = self.settings.step_s
        self.advance_watermark(float(cols.ts.max()) - self.settings.allowed_lateness_s)
        bucket = np.floor(cols.ts / step).astype(np.int64)
        late = 0
        if self.closed_through is not None:
            on_time = bucket > self.closed_through
            late = int(n - np.count_nonzero(on_time))
            if late:
                self.late_total += late
                if late == n:
                    return ApplyResult(0, late)
                cols, bucket = cols.take(on_time), bucket[on_time]
        accepted = n - late

        # group rows by (key, bucket) once; every statistic below is computed per group
        key_index: dict[tuple[str, str], int] = {}
        key_code = np.fromiter(
            (key_index.setdefault(k, len(key_index))
             for k in zip(cols.model.tolist(), cols.replica.tolist(), strict=True)),
            dtype=np.int64, count=accepted)
        bucket_ids, bucket_code = np.unique(bucket, return_inverse=True)
        groups, g = np.unique(key_code * bucket_ids.size + bucket_code, return_inverse=True)
        n_groups = groups.size

        stats = np.zeros((n_groups, _STATS_LEN))
        stats[:, _COUNT] = np.bincount(g, minlength=n_groups)
        stats[:, _ERRORS] = np.bincount(g, weights=cols.is_error, minlength=n_groups)
        stats[:, _COMPLETION] = np.bincount(g, weights=cols.completion_tokens, minlength=n_groups)
        self._batch_moments(cols, g, n_groups, stats)
        for j, name in enumerate(OPTIONAL_FIELDS):
            x = getattr(cols, name)
            reported = ~np.isnan(x)
            stats[:, _OPT_N.start + j] = np.bincount(g[reported], minlength=n_groups)
            stats[:, _OPT_SUM.start + j] = np.bincount(g[reported], weights=x[reported],
                                                       minlength=n_groups)
        sketches = self._group_sketches(cols, g, n_groups)
        cuda: dict[int, Counter[str]] = {}
        for row, code in enumerate(cols.cuda_error.tolist()):  # object column: no vectorised "is None"
            if code is not None:
                cuda.setdefault(int(g[row]), Counter())[str(code)] += 1
        last_ts = np.full(len(key_index), -math.inf)
        np.maximum.at(last_ts, key_code, cols.ts)

        states = []
        for (model, replica), code in key_index.items():
            state = self.keys.get((model, replica)) or self._new_state(model, replica)
            state.last_event_ts = max(state.last_event_ts, float(last_ts[code]))
            states.append(state)
        ids = bucket_ids.tolist()
        for j, group in enumerate(groups.tolist()):  # a loop over groups, not events: O(1) each
            code, b = divmod(group, len(ids))
            states[code].open_bucket(ids[b]).add(stats[j], sketches[j], cuda.get(j))
        return ApplyResult(accepted, late)

    @staticmethod
    def _batch_moments(cols: RequestColumns, g: npt.NDArray[np.intp], n_groups: int, stats: FloatArray) -> None:
        """Per group, the MOMENT_FIELDS moments and the batch counts, into ``stats``. Batch moments
        are over the rows with a known batch only (v1.1: the batch fields are optional)."""
        fill = cols.batch_fill  # NaN where the size or the capacity is unknown
        size_known = cols.batch_size > 0
        fill_known = ~np.isnan(fill)
        if size_known.all() and fill_known.all():  # every row has a batch: one grouped pass
            values = np.column_stack([cols.latency_ms, cols.prompt_tokens, cols.completion_tokens,
                                      cols.batch_size, fill]).astype(np.float64)
            group_moments = moments.grouped(values, g, n_groups)
            stats[:, _MEAN] = group_moments.mean
            stats[:, _M2] = group_moments.m2
            stats[:, _BATCH_N] = stats[:, _FILL_N] = stats[:, _COUNT]
        else:
            values = np.column_stack([cols.latency_ms, cols.prompt_tokens,
                                      cols.completion_tokens]).astype(np.float64)
            per_event = moments.grouped(values, g, n_groups)
            size = moments.grouped(cols.batch_size[size_known].astype(np.float64), g[size_known], n_groups)
            filled = moments.grouped(fill[fill_known], g[fill_known], n_groups)
            stats[:, _MEAN] = np.column_stack([per_event.mean, size.mean, filled.mean])
            stats[:, _M2] = np.column_stack([per_event.m2, size.m2, filled.m2])
            stats[:, _BATCH_N] = size.count
            stats[:, _FILL_N] = filled.count
        derived = cols.batch_source == BATCH_DERIVED
        if derived.any():
            stats[:, _DERIVED_N] = np.bincount(g[derived], minlength=n_groups)

    def _group_sketches(self, cols: RequestColumns, g: npt.NDArray[np.intp],
                        n_groups: int) -> list[SparseCounts]:
        """Per group, the combined latency + TTFT sparse sketch (views), from one np.unique."""
        n_slots = self.bins.n_slots
        has_ttft = ~np.isnan(cols.ttft_ms)
        slots = np.concatenate([self.bins.index(cols.latency_ms),
                                self.bins.index(cols.ttft_ms[has_ttft]) + n_slots])
        owner = np.concatenate([g, g[has_ttft]]).astype(np.int64)
        pairs, counts = np.unique(owner * (2 * n_slots) + slots, return_counts=True)
        bounds = np.searchsorted(pairs // (2 * n_slots), np.arange(n_groups + 1)).tolist()
        both = np.stack([(pairs % (2 * n_slots)).astype(np.int32), counts.astype(np.int32)])
        return [both[:, lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def close_steps(self) -> list[ReplicaStep]:
        """Close every step whose end is <= the watermark, oldest first, for every known key.

        A step ending at ``E`` seals bucket ``E/step - 1`` and reports ``[E - length_s, E)``.
        After each step, keys without an event in ``(E - idle, E]`` are released, where
        ``idle = max(idle_release_s, length_s)``.
        """
        if self.watermark is None:
            return []
        step = self.settings.step_s
        if self.closed_through is None:
            first_open = min((min(state.open) for state in self.keys.values() if state.open), default=None)
            if first_open is None or (first_open + 1) * step > self.watermark:
                return []  # no step can close yet: declare nothing closed (that would make events late)
            self.closed_through = first_open - 1
        idle = max(self.settings.idle_release_s, self.settings.length_s)
        out: list[ReplicaStep] = []
        while (self.closed_through + 2) * step <= self.watermark:
            if not self.keys:  # nobody to report: jump straight to the watermark
                self.closed_through = math.floor(self.watermark / step) - 1
                break
            bucket_id = self.closed_through + 1
            window_end = (bucket_id + 1) * step
            for state in self.keys.values():
                summary = state.step(bucket_id, self.settings)
                out.append(ReplicaStep(summary.features(), summary))
            self.closed_through = bucket_id
            for key in [k for k, s in self.keys.items() if s.last_event_ts <= window_end - idle]:
                del self.keys[key]
        return out

    # -- checkpoint -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The complete state as compact bytes: zlib-compressed JSON, numpy arrays as base64.

        Safe to load from Kafka (no pickle); :meth:`restore` validates every array's size and range.

        Stored: every non-empty sealed bucket and every open bucket (merged into one part first,
        in place, so the live windows and a restored copy continue bit-identically). Sketch totals
        are not stored: they are by definition the sum of the sealed buckets and are rebuilt on
        restore (smaller, and they cannot disagree with the buckets).
        """
        key_rows: list[list[Any]] = []
        rows: list[tuple[int, int, _Bucket]] = []  # (key index, bucket id, bucket)
        for code, state in enumerate(self.keys.values()):
            key_rows.append([state.model, state.replica, state.last_event_ts])
            if self.closed_through is not None:
                for bucket_id in range(self.closed_through - self.n_buckets + 1, self.closed_through + 1):
                    row = bucket_id % self.n_buckets
                    if state.stats[row, _COUNT]:
                        rows.append((code, bucket_id, _Bucket(state.stats[row], state.sketches[row], {})))
            rows.extend((code, bucket_id, ob.consolidate()) for bucket_id, ob in sorted(state.open.items()))
        buckets = [b for _, _, b in rows]

        doc = {
            "format": SNAPSHOT_FORMAT,
            "v": SNAPSHOT_VERSION,
            "length_s": self.settings.length_s,
            "step_s": self.settings.step_s,
            "relative_accuracy": self.settings.sketch_relative_accuracy,
            "watermark": self.watermark,
            "closed_through": self.closed_through,
            "late_total": self.late_total,
            "keys": key_rows,
            "buckets": {
                "key": _b64(np.array([c for c, _, _ in rows], dtype=np.int32)),
                "id": _b64(np.array([i for _, i, _ in rows], dtype=np.int64)),
                "stats": _b64(np.stack([b.stats for b in buckets]) if buckets else np.zeros((0, _STATS_LEN))),
                # each bucket's (2, k) sketch, concatenated along k, and the k of each
                "sketch_len": _b64(np.array([b.sketch.shape[1] for b in buckets], dtype=np.int32)),
                "sketch": _b64(np.concatenate([b.sketch for b in buckets], axis=1)
                               if buckets else EMPTY_SPARSE),
            },
            "cuda_errors": [[i, b.cuda_errors] for i, b in enumerate(buckets) if b.cuda_errors],
        }
        return _SNAPSHOT_MAGIC + zlib.compress(orjson.dumps(doc), 1)

    @classmethod
    def restore(cls, data: bytes, settings: WindowSettings) -> PartitionWindows:
        """Rebuild from :meth:`snapshot`; ValueError if the bytes are not a compatible snapshot."""
        try:
            if not data.startswith(_SNAPSHOT_MAGIC):
                raise ValueError("not a window snapshot (bad magic)")
            inflate = zlib.decompressobj()
            doc = orjson.loads(inflate.decompress(data[len(_SNAPSHOT_MAGIC):], _SNAPSHOT_MAX_BYTES))
            if inflate.unconsumed_tail:
                raise ValueError(f"snapshot inflates past {_SNAPSHOT_MAX_BYTES} bytes")
            version = doc.get("v")
            if doc.get("format") != SNAPSHOT_FORMAT or version not in (1, SNAPSHOT_VERSION):
                raise ValueError(f"not a v1/v{SNAPSHOT_VERSION} {SNAPSHOT_FORMAT} snapshot")
            for name, have in (("length_s", settings.length_s), ("step_s", settings.step_s),
                               ("relative_accuracy", settings.sketch_relative_accuracy)):
                if doc[name] != have:
                    raise ValueError(f"snapshot was taken with {name}={doc[name]}, settings say {have}")
            self = cls(settings)
            self.watermark = None if doc["watermark"] is None else float(doc["watermark"])
            self.closed_through = None if doc["closed_through"] is None else int(doc["closed_through"])
            self.late_total = int(doc["late_total"])
            states = []
            for model, replica, last_ts in doc["keys"]:
                state = self._new_state(str(model), str(replica))
                state.last_event_ts = float(last_ts)
                states.append(state)
            cols = doc["buckets"]
            key = _unb64(cols["key"], np.int32)
            n = key.size
            ids = _unb64(cols["id"], np.int64, n)
            if version == 1:  # before contract v1.1 every event had a reported batch size and capacity
                stats_v1 = _unb64(cols["stats"], np.float64, n * _STATS_LEN_V1).reshape(n, _STATS_LEN_V1)
                stats = np.zeros((n, _STATS_LEN))
                stats[:, :_STATS_LEN_V1] = stats_v1
                stats[:, _BATCH_N] = stats[:, _FILL_N] = stats_v1[:, _COUNT]
            else:
                stats = _unb64(cols["stats"], np.float64, n * _STATS_LEN).reshape(n, _STATS_LEN)
            sketches = self._split_sketches(cols["sketch"], _unb64(cols["sketch_len"], np.int32, n))
            cuda = {int(i): {str(k): int(v) for k, v in errs.items()} for i, errs in doc["cuda_errors"]}
            if n and (key.min() < 0 or key.max() >= len(states)):
                raise ValueError("bucket refers to an unknown key")
            for i in range(n):
                state, bucket_id = states[int(key[i])], int(ids[i])
                bucket = _Bucket(stats[i].copy(), sketches[i], cuda.get(i, {}))
                if self.closed_through is not None and bucket_id <= self.closed_through:
                    if bucket_id <= self.closed_through - self.n_buckets:
                        raise ValueError(f"bucket {bucket_id} is older than the window")
                    if state.stats[bucket_id % self.n_buckets, _COUNT]:
                        raise ValueError(f"bucket {bucket_id} stored twice")
                    state.place(bucket_id, bucket)
                else:
                    if bucket_id in state.open:
                        raise ValueError(f"open bucket {bucket_id} stored twice")
                    open_bucket = state.open[bucket_id] = _OpenBucket()
                    open_bucket.add(bucket.stats, bucket.sketch, Counter(bucket.cuda_errors))
            return self
        except (KeyError, TypeError, AttributeError, IndexError, orjson.JSONDecodeError, zlib.error) as exc:
            raise ValueError(f"malformed window snapshot: {exc!r}") from exc

    def _split_sketches(self, blob: str, lengths: npt.NDArray[np.int32]) -> list[SparseCounts]:
        if lengths.size and lengths.min() < 0:
            raise ValueError("negative sketch length")
        total = int(lengths.sum(dtype=np.int64))
        flat = _unb64(blob, np.int32, 2 * total).reshape(2, total)
        if total and (flat[0].min() < 0 or flat[0].max() >= 2 * self.bins.n_slots or flat[1].min() <= 0):
            raise ValueError("sketch slot out of range or non-positive count")
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        parts = [flat[:, lo:hi].copy() if hi > lo else EMPTY_SPARSE
                 for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True)]
        if any(np.any(np.diff(part[0]) <= 0) for part in parts):
            raise ValueError("sketch slots not strictly increasing")
        return parts


def _b64(arr: npt.NDArray[Any]) -> str:
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def _unb64(text: str, dtype: type, expected: int | None = None) -> npt.NDArray[Any]:
    arr: npt.NDArray[Any] = np.frombuffer(base64.b64decode(text, validate=True), dtype=dtype)
    if expected is not None and arr.size != expected:
        raise ValueError(f"snapshot array has {arr.size} {np.dtype(dtype).name} values, expected {expected}")
    return arr
