"""Derived batch sizes: fill in the batch of request events that carry none, from telemetry.

Where a source does not report per-request batch size (vLLM spans do not), it is taken from the
replica's latest ``running_requests`` / max-batch telemetry and marked derived; if neither exists
the batch detectors stay silent for that replica rather than guess. Contract
v1.1 makes ``batch_size`` / ``batch_capacity`` optional (0 = unknown in the columns); stage 1
calls :func:`derive_batch` on each decoded poll before the windows see it. Pure: the telemetry
comes in through ``lookup`` (stage 1 passes the :class:`~skewwatch.pipeline.telemetry_join.TelemetryJoin`
view as of the event's time, fresh fields only).

Rules, per row:

* **size** (only where the event had none): the replica's ``running_requests`` as of the event's
  ``ts``, at least 1 (the request itself was running when it was scheduled; a sample taken
  between two batches may say 0); ``batch_source`` becomes ``BATCH_DERIVED``. No fresh sample, or
  one without ``running_requests``: the size stays unknown.
* **capacity** (only where the event had none): the sample's ``batch_capacity`` (the engine's
  ``--max-num-seqs``), else ``capacity_for_model(model)`` (setting ``derived_batch``), else unknown.
* **consistency**: a *derived* size above a known capacity is clipped to it (the sample and the
  request saw the batch at different instants); a *reported* size above a derived capacity keeps
  the size and drops the capacity (the event is the better witness), so a fill never exceeds 1.

Rows are looked up per (replica, whole second of ``ts``) — the telemetry interval is seconds, so
this changes nothing about which sample is used and keeps lookups to a few per replica per poll.

>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> row = {"request_id": "a", "ts": 100.5, "model": "m", "latency_ms": 9.0, "prompt_tokens": 1,
...        "completion_tokens": 1}
>>> cols = RequestColumns.from_rows([dict(row, replica="r1"), dict(row, replica="r2"),
...                                  dict(row, replica="r3", batch_size=3, batch_capacity=8)])
>>> latest = {"r1": TelemetrySample(ts=99.0, replica="r1", source="vllm", running_requests=12)}
>>> out = derive_batch(cols, lambda replica, at: latest.get(replica), lambda model: 64)
>>> out.columns.batch_size.tolist(), out.columns.batch_capacity.tolist(), out.columns.batch_source.tolist()
([12, 0, 3], [64, 64, 8], [2, 0, 1])
>>> out.derived, out.unknown
(1, 1)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from skewwatch.schemas.requests.columns import BATCH_DERIVED, RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample

TelemetryLookup = Callable[[str, float], TelemetrySample | None]  # (replica, event time) -> fresh sample
CapacityForModel = Callable[[str], int | None]  # configured capacity of a model, None/0 = unknown


@dataclass(frozen=True, slots=True)
class DerivedBatch:
    columns: RequestColumns  # the input with batch fields filled in where telemetry allowed
    derived: int  # rows whose batch size was derived
    unknown: int  # rows still without a batch size (their batch statistics are skipped)


def derive_batch(cols: RequestColumns, lookup: TelemetryLookup,
                 capacity_for_model: CapacityForModel | None = None) -> DerivedBatch:
    """Fill unknown batch sizes/capacities from telemetry (see the module docstring). Rows with a
    reported size and capacity are never touched; returns the input itself when no row needs it."""
    size_missing = cols.batch_size == 0
    capacity_missing = cols.batch_capacity == 0
    todo = np.flatnonzero(size_missing | capacity_missing)
    if todo.size == 0:
        return DerivedBatch(cols, 0, 0)
    size = cols.batch_size.copy()
    capacity = cols.batch_capacity.copy()
    source = cols.batch_source.copy()
    # one lookup per (replica, second): a Python loop over groups, not rows
    replicas = cols.replica[todo].tolist()
    seconds = np.floor(cols.ts[todo]).astype(np.int64).tolist()
    groups: dict[tuple[str, int], list[int]] = {}
    for row, replica, second in zip(todo.tolist(), replicas, seconds, strict=True):
        groups.setdefault((replica, second), []).append(row)
    model_capacity: dict[str, int] = {}
    for (replica, _), rows_list in groups.items():
        rows = np.array(rows_list, dtype=np.intp)
        sample = lookup(replica, float(cols.ts[rows].max()))
        running = sample.running_requests if sample is not None else None
        if running is not None:
            fill = rows[size_missing[rows]]
            size[fill] = max(int(running), 1)
            source[fill] = BATCH_DERIVED
        need = rows[capacity_missing[rows]]
        if need.size == 0:
            continue
        if sample is not None and sample.batch_capacity:
            capacity[need] = int(sample.batch_capacity)
        elif capacity_for_model is not None:
            for row in need.tolist():
                model = str(cols.model[row])
                if model not in model_capacity:
                    model_capacity[model] = int(capacity_for_model(model) or 0)
                capacity[row] = model_capacity[model]
    over = (size > capacity) & (capacity > 0)
    if over.any():
        derived_size = source == BATCH_DERIVED
        size[over & derived_size] = capacity[over & derived_size]  # derived size: clip to the capacity
        capacity[over & ~derived_size] = 0  # reported size over a derived capacity: trust the event
    derived = int(np.count_nonzero(source[todo] == BATCH_DERIVED))
    unknown = int(np.count_nonzero(size[todo] == 0))
    return DerivedBatch(replace(cols, batch_size=size, batch_capacity=capacity, batch_source=source),
                        derived, unknown)


__all__ = ["CapacityForModel", "DerivedBatch", "TelemetryLookup", "derive_batch"]
