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
  give a compact JSON envelope (numpy arrays as base64, never pickle: it is read back from Kafka)
  that the worker stores with the input offset it covers.

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
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from skewwatch.config import WindowSettings
from skewwatch.pipeline import moments
from skewwatch.pipeline.events import RequestColumns
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.sketch import EMPTY_SPARSE, SketchTotal, SparseCounts, add_sparse, log_bins

FloatArray = npt.NDArray[np.float64]

# Fields every event has: kept as Welford moments (count is the bucket's event count).
MOMENT_FIELDS: tuple[str, ...] = (
    "latency_ms", "prompt_tokens", "completion_tokens", "batch_size", "batch_fill",
)
# Optional fields (NaN = not reported): kept as (reported count, sum), so missing never reads as 0.
OPTIONAL_FIELDS: tuple[str, ...] = ("ttft_ms", "queue_length", "kv_cache_hit_rate")
_M, _O = len(MOMENT_FIELDS), len(OPTIONAL_FIELDS)
# A bucket's float statistics live in ONE small array (one numpy object per bucket, not four:
# each numpy array costs ~100 bytes of header, and memory per replica matters). Layout:
_MEAN = slice(0, _M)
_M2 = slice(_M, 2 * _M)
_OPT_N = slice(2 * _M, 2 * _M + _O)
_OPT_SUM = slice(2 * _M + _O, 2 * _M + 2 * _O)
_STATS_LEN = 2 * _M + 2 * _O

SUMMARY_VERSION = 1
SNAPSHOT_FORMAT = "skewwatch.partition-windows"
SNAPSHOT_VERSION = 1


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

    @property
    def window_start(self) -> float:
        return self.window_end - self.length_s

    def moments(self) -> moments.Moments:
        """The window's moments for MOMENT_FIELDS (count broadcast per field)."""
        return moments.Moments(np.full(_M, float(self.count)), self.mean, self.m2)

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
        if n > 0:
            mean = {f: float(v) for f, v in zip(MOMENT_FIELDS, self.mean, strict=True)}
            var = {f: float(v) / n for f, v in zip(MOMENT_FIELDS, self.m2, strict=True)}  # population
        reported = {f: int(c) for f, c in zip(OPTIONAL_FIELDS, self.optional_count, strict=True)}
        optional_mean = {
            f: (float(s) / reported[f] if reported[f] else None)
            for f, s in zip(OPTIONAL_FIELDS, self.optional_sum, strict=True)
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
            return cls(
                model=str(data["model"]),
                replica=None if data["replica"] is None else str(data["replica"]),
                window_end=float(data["window_end"]),
                length_s=float(data["length_s"]),
                relative_accuracy=float(data["relative_accuracy"]),
                count=int(data["count"]),
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
# One bucket, one key
# ---------------------------------------------------------------------------------------------

class _Bucket:
    """Statistics of the events of one key in one step-long bucket ``[id*step, (id+1)*step)``."""

    __slots__ = ("id", "count", "errors", "completion_tokens", "stats", "latency", "ttft", "cuda_errors")

    def __init__(self, bucket_id: int) -> None:
        self.id = bucket_id
        self.count = 0
        self.errors = 0
        self.completion_tokens = 0
        self.stats: FloatArray = np.zeros(_STATS_LEN)  # layout: _MEAN, _M2, _OPT_N, _OPT_SUM
        self.latency: SparseCounts = EMPTY_SPARSE
        self.ttft: SparseCounts = EMPTY_SPARSE
        self.cuda_errors: dict[str, int] | None = None  # None while empty: most buckets have none

    def absorb(self, count: int, errors: int, completion_tokens: int, group_stats: FloatArray,
               latency: SparseCounts, ttft: SparseCounts, cuda_errors: Counter[str] | None) -> None:
        """Fold in the statistics of a group of new events (same layout as ``stats``)."""
        if self.count == 0:
            self.stats = group_stats.copy()
        else:
            old = moments.Moments(np.full(_M, float(self.count)), self.stats[_MEAN], self.stats[_M2])
            new = moments.Moments(np.full(_M, float(count)), group_stats[_MEAN], group_stats[_M2])
            merged = moments.merge(old, new)
            self.stats[_MEAN] = merged.mean
            self.stats[_M2] = merged.m2
            self.stats[_OPT_N] += group_stats[_OPT_N]
            self.stats[_OPT_SUM] += group_stats[_OPT_SUM]
        self.count += count
        self.errors += errors
        self.completion_tokens += completion_tokens
        self.latency = add_sparse([self.latency, latency])
        self.ttft = add_sparse([self.ttft, ttft])
        if cuda_errors:
            merged_errors = Counter(self.cuda_errors or {})
            merged_errors.update(cuda_errors)
            self.cuda_errors = dict(merged_errors)


class WindowState:
    """The window of ONE (model, replica): a ring of sealed buckets, open buckets, sketch totals."""

    __slots__ = ("model", "replica", "ring", "open", "latency_total", "ttft_total", "last_event_ts")

    def __init__(self, model: str, replica: str, n_buckets: int) -> None:
        self.model = model
        self.replica = replica
        self.ring: list[_Bucket | None] = [None] * n_buckets  # sealed bucket b lives at b % n_buckets
        self.open: dict[int, _Bucket] = {}  # bucket id -> bucket not sealed yet
        self.latency_total = SketchTotal()  # sum of the ring's latency sketches
        self.ttft_total = SketchTotal()
        self.last_event_ts = -math.inf

    def open_bucket(self, bucket_id: int) -> _Bucket:
        bucket = self.open.get(bucket_id)
        if bucket is None:
            bucket = self.open[bucket_id] = _Bucket(bucket_id)
        return bucket

    def seal(self, bucket_id: int) -> None:
        """Step: bucket ``bucket_id`` enters the window, bucket ``bucket_id - n`` leaves it."""
        slot = bucket_id % len(self.ring)
        expired = self.ring[slot]
        if expired is not None:
            self.latency_total.subtract(expired.latency)
            self.ttft_total.subtract(expired.ttft)
        entering = self.open.pop(bucket_id, None)
        self.ring[slot] = entering
        if entering is not None:
            self.latency_total.add(entering.latency)
            self.ttft_total.add(entering.ttft)

    def summary(self, newest_bucket: int, settings: WindowSettings) -> WindowSummary:
        """The window ending with (sealed) bucket ``newest_bucket``."""
        present = [b for b in self.ring if b is not None]
        count = sum(b.count for b in present)
        mean, m2 = np.zeros(_M), np.zeros(_M)
        optional_count, optional_sum = np.zeros(_O, dtype=np.int64), np.zeros(_O)
        if present:
            stats = np.stack([b.stats for b in present])
            counts = np.array([[float(b.count)] * _M for b in present])
            merged = moments.merge_many(moments.Moments(counts, stats[:, _MEAN], stats[:, _M2]))
            mean, m2 = merged.mean, merged.m2
            optional_count = stats[:, _OPT_N].sum(axis=0).round().astype(np.int64)
            optional_sum = stats[:, _OPT_SUM].sum(axis=0)
        newest = self.ring[newest_bucket % len(self.ring)]
        return WindowSummary(
            model=self.model,
            replica=self.replica,
            window_end=(newest_bucket + 1) * settings.step_s,
            length_s=settings.length_s,
            relative_accuracy=settings.sketch_relative_accuracy,
            count=count,
            errors=sum(b.errors for b in present),
            completion_tokens=sum(b.completion_tokens for b in present),
            mean=mean,
            m2=m2,
            optional_count=optional_count,
            optional_sum=optional_sum,
            latency=self.latency_total.sparse(),
            ttft=self.ttft_total.sparse(),
            step_count=newest.count if newest is not None else 0,
            step_cuda_errors=dict(newest.cuda_errors or {}) if newest is not None else {},
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

    def apply(self, cols: RequestColumns) -> ApplyResult:
        """Fold a batch of validated events into their open buckets, in one vectorised pass."""
        n = len(cols)
        if n == 0:
            return ApplyResult(0, 0)
        step = self.settings.step_s
        self.advance_watermark(float(cols.ts.max()) - self.settings.allowed_lateness_s)
        bucket = np.floor(cols.ts / step).astype(np.int64)
        if self.closed_through is not None:
            on_time = bucket > self.closed_through
            late = int(n - np.count_nonzero(on_time))
            if late:
                self.late_total += late
                if late == n:
                    return ApplyResult(0, late)
                cols, bucket = cols.take(on_time), bucket[on_time]
        else:
            late = 0
        accepted = n - late

        # group rows by (key, bucket) once; every statistic below is per group
        key_index: dict[tuple[str, str], int] = {}
        key_code = np.fromiter(
            (key_index.setdefault(k, len(key_index)) for k in zip(cols.model.tolist(), cols.replica.tolist(),
                                                                   strict=True)),
            dtype=np.int64, count=accepted)
        bucket_ids, bucket_code = np.unique(bucket, return_inverse=True)
        groups, g = np.unique(key_code * bucket_ids.size + bucket_code, return_inverse=True)
        n_groups = groups.size

        group_stats = np.zeros((n_groups, _STATS_LEN))
        values = np.column_stack([getattr(cols, f) for f in MOMENT_FIELDS]).astype(np.float64)
        group_moments = moments.grouped(values, g, n_groups)
        group_stats[:, _MEAN] = group_moments.mean
        group_stats[:, _M2] = group_moments.m2
        for j, name in enumerate(OPTIONAL_FIELDS):
            x = getattr(cols, name)
            reported = ~np.isnan(x)
            group_stats[:, _OPT_N.start + j] = np.bincount(g[reported], minlength=n_groups)
            group_stats[:, _OPT_SUM.start + j] = np.bincount(g[reported], weights=x[reported],
                                                             minlength=n_groups)
        counts = np.bincount(g, minlength=n_groups)
        errors = np.bincount(g, weights=cols.is_error, minlength=n_groups).astype(np.int64)
        completion = np.bincount(g, weights=cols.completion_tokens, minlength=n_groups).astype(np.int64)
        latency = self._group_sketches(cols.latency_ms, g, n_groups)
        has_ttft = ~np.isnan(cols.ttft_ms)
        ttft = self._group_sketches(cols.ttft_ms[has_ttft], g[has_ttft], n_groups)
        cuda: dict[int, Counter[str]] = {}
        for row, code in enumerate(cols.cuda_error.tolist()):  # object column: no vectorised "is None"
            if code is not None:
                cuda.setdefault(int(g[row]), Counter())[str(code)] += 1
        last_ts = np.full(len(key_index), -math.inf)
        np.maximum.at(last_ts, key_code, cols.ts)

        states = []
        for (model, replica), code in key_index.items():
            state = self.keys.get((model, replica))
            if state is None:
                state = self.keys[(model, replica)] = WindowState(model, replica, self.n_buckets)
            state.last_event_ts = max(state.last_event_ts, float(last_ts[code]))
            states.append(state)
        for j, group in enumerate(groups.tolist()):
            code, b = divmod(group, bucket_ids.size)
            states[code].open_bucket(int(bucket_ids[b])).absorb(
                int(counts[j]), int(errors[j]), int(completion[j]), group_stats[j],
                latency[j], ttft[j], cuda.get(j))
        return ApplyResult(accepted, late)

    def _group_sketches(self, values: FloatArray, g: npt.NDArray[np.intp],
                        n_groups: int) -> list[SparseCounts]:
        """Sparse sketch of ``values`` per group, with one np.unique over (group, slot) pairs."""
        n_slots = self.bins.n_slots
        pairs, counts = np.unique(g.astype(np.int64) * n_slots + self.bins.index(values), return_counts=True)
        group_of_pair = pairs // n_slots
        bounds = np.searchsorted(group_of_pair, np.arange(n_groups + 1))
        slots = (pairs % n_slots).astype(np.int32)
        counts32 = counts.astype(np.int32)
        return [np.stack([slots[lo:hi], counts32[lo:hi]]) if hi > lo else EMPTY_SPARSE
                for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]

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
            first_open = [min(state.open) for state in self.keys.values() if state.open]
            if not first_open:
                return []
            self.closed_through = min(first_open) - 1
        idle = max(self.settings.idle_release_s, self.settings.length_s)
        out: list[ReplicaStep] = []
        while (self.closed_through + 2) * step <= self.watermark:
            if not self.keys:  # nobody to report: jump straight to the watermark
                self.closed_through = math.floor(self.watermark / step) - 1
                break
            bucket_id = self.closed_through + 1
            window_end = (bucket_id + 1) * step
            for state in self.keys.values():
                state.seal(bucket_id)
                summary = state.summary(bucket_id, self.settings)
                out.append(ReplicaStep(summary.features(), summary))
            self.closed_through = bucket_id
            for key in [k for k, s in self.keys.items() if s.last_event_ts <= window_end - idle]:
                del self.keys[key]
        return out

    # -- checkpoint -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The complete state as compact JSON bytes (arrays base64; safe to load from Kafka).

        Sketch totals are not stored: they are by definition the sum of the sealed buckets and are
        rebuilt on restore (smaller, and they cannot disagree with the buckets).
        """
        key_rows: list[list[Any]] = []
        rows: list[tuple[int, _Bucket]] = []
        for code, state in enumerate(self.keys.values()):
            key_rows.append([state.model, state.replica, state.last_event_ts])
            rows.extend((code, b) for b in state.ring if b is not None)
            rows.extend((code, b) for b in state.open.values())
        buckets = [b for _, b in rows]

        def sketch_columns(name: str) -> dict[str, str]:
            parts = [getattr(b, name) for b in buckets]
            return {
                f"{name}_len": _b64(np.array([p.shape[1] for p in parts], dtype=np.int32)),
                name: _b64(np.concatenate([p for p in parts], axis=1) if parts else EMPTY_SPARSE),
            }

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
                "key": _b64(np.array([c for c, _ in rows], dtype=np.int32)),
                "id": _b64(np.array([b.id for b in buckets], dtype=np.int64)),
                "count": _b64(np.array([b.count for b in buckets], dtype=np.int64)),
                "errors": _b64(np.array([b.errors for b in buckets], dtype=np.int64)),
                "completion_tokens": _b64(np.array([b.completion_tokens for b in buckets], dtype=np.int64)),
                "stats": _b64(np.stack([b.stats for b in buckets]) if buckets else np.zeros((0, _STATS_LEN))),
                **sketch_columns("latency"),
                **sketch_columns("ttft"),
            },
            "cuda_errors": [[i, b.cuda_errors] for i, b in enumerate(buckets) if b.cuda_errors],
        }
        return orjson.dumps(doc)

    @classmethod
    def restore(cls, data: bytes, settings: WindowSettings) -> PartitionWindows:
        """Rebuild from :meth:`snapshot`; ValueError if the bytes are not a compatible snapshot."""
        try:
            doc = orjson.loads(data)
            if doc.get("format") != SNAPSHOT_FORMAT or doc.get("v") != SNAPSHOT_VERSION:
                raise ValueError(f"not a v{SNAPSHOT_VERSION} {SNAPSHOT_FORMAT} snapshot")
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
                state = WindowState(str(model), str(replica), self.n_buckets)
                state.last_event_ts = float(last_ts)
                self.keys[(state.model, state.replica)] = state
                states.append(state)
            cols = doc["buckets"]
            key = _unb64(cols["key"], np.int32)
            n = key.size
            ids = _unb64(cols["id"], np.int64, n)
            count = _unb64(cols["count"], np.int64, n)
            errors = _unb64(cols["errors"], np.int64, n)
            completion = _unb64(cols["completion_tokens"], np.int64, n)
            stats = _unb64(cols["stats"], np.float64, n * _STATS_LEN).reshape(n, _STATS_LEN)
            latency = self._split_sketches(cols["latency"], _unb64(cols["latency_len"], np.int32, n))
            ttft = self._split_sketches(cols["ttft"], _unb64(cols["ttft_len"], np.int32, n))
            if n and (key.min() < 0 or key.max() >= len(states)):
                raise ValueError("bucket refers to an unknown key")
            buckets = []
            for i in range(n):
                bucket = _Bucket(int(ids[i]))
                bucket.count, bucket.errors = int(count[i]), int(errors[i])
                bucket.completion_tokens = int(completion[i])
                bucket.stats = stats[i].copy()
                bucket.latency, bucket.ttft = latency[i], ttft[i]
                buckets.append(bucket)
                state = states[int(key[i])]
                if self.closed_through is not None and bucket.id <= self.closed_through:
                    if bucket.id <= self.closed_through - self.n_buckets:
                        raise ValueError(f"bucket {bucket.id} is older than the window")
                    slot = bucket.id % self.n_buckets
                    if state.ring[slot] is not None:
                        raise ValueError(f"two buckets for ring slot {slot}")
                    state.ring[slot] = bucket
                    state.latency_total.add(bucket.latency)
                    state.ttft_total.add(bucket.ttft)
                else:
                    state.open[bucket.id] = bucket
            for i, errs in doc["cuda_errors"]:
                buckets[int(i)].cuda_errors = {str(k): int(v) for k, v in errs.items()}
            return self
        except (KeyError, TypeError, AttributeError, IndexError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"malformed window snapshot: {exc!r}") from exc

    def _split_sketches(self, blob: str, lengths: npt.NDArray[np.int32]) -> list[SparseCounts]:
        total = int(lengths.sum(dtype=np.int64))
        if lengths.size and lengths.min() < 0:
            raise ValueError("negative sketch length")
        flat = _unb64(blob, np.int32, 2 * total).reshape(2, total)
        if total and (flat[0].min() < 0 or flat[0].max() >= self.bins.n_slots or flat[1].min() <= 0):
            raise ValueError("sketch slot out of range or non-positive count")
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        return [flat[:, lo:hi].copy() if hi > lo else EMPTY_SPARSE
                for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True)]


def _b64(arr: npt.NDArray[Any]) -> str:
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def _unb64(text: str, dtype: type, expected: int | None = None) -> npt.NDArray[Any]:
    arr: npt.NDArray[Any] = np.frombuffer(base64.b64decode(text, validate=True), dtype=dtype)
    if expected is not None and arr.size != expected:
        raise ValueError(f"snapshot array has {arr.size} {np.dtype(dtype).name} values, expected {expected}")
    return arr
