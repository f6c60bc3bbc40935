"""Sliding 60 s / 5 s event-time windows per (model, replica), kept as 12 five-second buckets.

Stage 1's state (docs/design.md, "Two stages, two keys"): a 60 s window sliding by 5 s (seed §2.5)
per replica, vectorised across a partition's replicas. Modules: ``partition.py`` (the columnar
state, ``apply``, ``close_steps``), ``buckets.py`` (an open bucket and a sealed one's sketch
entries), ``row_totals.py`` (the running sketch totals a step adds to and subtracts from),
``bucket_row.py`` (the one float64 row a bucket or a window keeps: its column layout and how rows
merge), ``steps.py`` (what a step returns: ``StepBatch`` columns, per-replica ``ReplicaStep`` on
demand), ``summary.py`` (``WindowSummary``, the stage 1 -> 2 hand-off, and the feature
definitions), ``partition_state.py`` (``PartitionState``: the partition as plain columns, what
:meth:`PartitionWindows.export_state` gives and :meth:`PartitionWindows.from_state` takes) and
``snapshot.py`` (a ``PartitionState`` as checkpoint bytes and back).

* **Event time, watermark, lateness.** Each Kafka partition has one :class:`PartitionWindows`.
  Its watermark is ``max event ts seen - allowed_lateness_s`` (never moving back). A bucket
  ``[b*step, (b+1)*step)`` is *sealed* when the step ending at ``(b+1)*step`` is closed, which
  happens once that end is <= the watermark. An event whose bucket is already sealed is **late**:
  counted (:attr:`PartitionWindows.late_total`), not folded in. Events far in the future are
  accepted and simply push the watermark ahead (a producer with a fast clock therefore closes
  steps early for the whole partition; the events themselves are not rejected here).
* **Buckets, not Faust windowed tables, as columns.** Per key: a ring of ``length_s / step_s``
  (= 12) sealed buckets plus the few *open* buckets still collecting events (usually 1-2: the
  watermark trails by the allowed lateness). Each bucket holds counts, Welford moments, sums and
  sparse sketches. A partition keeps all its keys' buckets in a few arrays, one row per key
  (``partition.py``), and a dense running sketch total per row: a step *adds* the newly sealed
  bucket and *subtracts* the one that fell out, instead of re-merging 12 buckets. (Buckets enter
  the total when sealed, not on insert, so a bucket still open for late-ish events never leaks
  into an earlier window's quantiles.)
* **Silence is visible.** Every closed step reports *every* known key (one :class:`StepBatch` row,
  one :class:`ReplicaStep` when iterated), with ``count == 0`` for a silent replica; a key is
  released after the step once it has had no event for ``max(idle_release_s, length_s)`` seconds
  (so at most an event exactly at the window's start goes with it; its row is reused clean).
* **Vectorised hot path.** :meth:`PartitionWindows.apply` groups a whole decoded batch by
  (key, bucket) once and computes every per-group statistic with ``np.bincount``/``np.unique``,
  then merges them into the open buckets' rows at once (a loop over the batch's 1-2 bucket ids).
  :meth:`PartitionWindows.close_steps` merges every key's 12 buckets (Chan) and finds every key's
  quantiles in whole-array operations; the per-replica objects are built only when iterated.
* **State survives restarts.** :meth:`PartitionWindows.snapshot` / :meth:`PartitionWindows.restore`
  give compact bytes (zlib-compressed columns; never pickle: they are read back from Kafka) that the
  worker stores with the input offset it covers.

* **Unknown batch sizes** (contract v1.1: OTLP spans carry none). The batch moments are kept over
  the rows that *have* a batch size only (``batch_fill`` over rows with size and capacity), with
  their own counts, so an unknown batch never reads as 0; a window where no row had one reports
  ``batch_size_mean``/``batch_size_std``/``batch_fill_mean`` as None and the batch detectors stay
  silent. Rows whose size the worker derived from telemetry are counted (``batch_derived_count``).

The feature definitions live in exactly one place, ``feature_columns.py``: a step's columns go
through it for every key at once, and :meth:`WindowSummary.features` (what per-model vectors are
made with, ``model_merge.py`` merging the summaries first) sends its one row through the same code.

>>> from skewwatch.pipeline.window_settings import WindowSettings
>>> from skewwatch.schemas.requests.columns import RequestColumns
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

from skewwatch.pipeline.window.bucket_row import MOMENT_FIELDS, OPTIONAL_FIELDS, STATS_LEN
from skewwatch.pipeline.window.partition import ApplyResult, PartitionWindows
from skewwatch.pipeline.window.partition_state import PartitionState
from skewwatch.pipeline.window.snapshot import SNAPSHOT_FORMAT, SNAPSHOT_VERSION
from skewwatch.pipeline.window.steps import ClosedSteps, ReplicaStep, StepBatch
from skewwatch.pipeline.window.summary import SUMMARY_VERSION, WindowSummary

__all__ = [
    "MOMENT_FIELDS",
    "OPTIONAL_FIELDS",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_VERSION",
    "STATS_LEN",
    "SUMMARY_VERSION",
    "ApplyResult",
    "ClosedSteps",
    "PartitionState",
    "PartitionWindows",
    "ReplicaStep",
    "StepBatch",
    "WindowSummary",
]
