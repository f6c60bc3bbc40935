"""Columnar request events: what the decoder hands the windows.

A batch of request events is kept as one numpy array per field (struct of arrays), so that
a Kafka message holding 100 events is applied to the windows in one vectorised step instead
of 100 Python objects. Optional fields use NaN (floats) or ``None`` (object columns) for
"not reported": missing means unknown, never zero.

Batch fields (contract v1.1, optional): ``batch_size`` and ``batch_capacity`` stay int64 columns
(exact, cheap) where **0 means unknown** (a reported value is always >= 1), and the int8 column
``batch_source`` says where the row's batch size came from: ``BATCH_UNKNOWN`` (0, no batch size),
``BATCH_REPORTED`` (1, sent by the server) or ``BATCH_DERIVED`` (2, filled in by the worker from the
replica's telemetry, see :mod:`skewwatch.pipeline.derived_batch`). A capacity may be unknown
while the size is known; ``batch_fill`` is NaN unless both are known (never a division by 0).

>>> import numpy as np
>>> cols = RequestColumns.from_rows([
...     {"request_id": "a", "ts": 10.0, "model": "m", "replica": "r1", "latency_ms": 120.0,
...      "prompt_tokens": 10, "completion_tokens": 20, "batch_size": 4, "batch_capacity": 16},
... ])
>>> len(cols), float(cols.batch_fill[0])
(1, 0.25)
>>> bool(np.isnan(cols.ttft_ms[0]))
True
>>> no_batch = RequestColumns.from_rows([{"request_id": "b", "ts": 10.0, "model": "m", "replica": "r1",
...     "latency_ms": 1.0, "prompt_tokens": 1, "completion_tokens": 1}])
>>> int(no_batch.batch_size[0]), int(no_batch.batch_source[0]), bool(np.isnan(no_batch.batch_fill[0]))
(0, 0, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjArray = npt.NDArray[np.object_]
Int8Array = npt.NDArray[np.int8]

# batch_source values
BATCH_UNKNOWN = 0  # no batch size: batch statistics skip the row
BATCH_REPORTED = 1  # the event carried batch_size
BATCH_DERIVED = 2  # batch_size filled in from the replica's telemetry (running requests)

# Default of batch_source, replaced in __post_init__: a column-builder that does not know about
# batch sources (older code, the simulator) gets "reported wherever batch_size is known".
_SOURCE_FROM_SIZE: Int8Array = np.zeros(0, dtype=np.int8)


def _source_from_size() -> Int8Array:
    return _SOURCE_FROM_SIZE


def source_from_size(batch_size: IntArray) -> Int8Array:
    """``BATCH_REPORTED`` where the size is known (> 0), else ``BATCH_UNKNOWN``."""
    return (batch_size > 0).view(np.int8)  # BATCH_REPORTED == 1 (a bool is one byte: no copy)


@dataclass(slots=True)
class RequestColumns:
    """A batch of already-validated request events (contract v1), one array per field."""

    request_id: ObjArray
    ts: FloatArray  # epoch seconds, time the request finished (event time)
    model: ObjArray
    replica: ObjArray
    latency_ms: FloatArray
    prompt_tokens: IntArray
    completion_tokens: IntArray
    batch_size: IntArray  # 0 = unknown (v1.1: optional)
    batch_capacity: IntArray  # 0 = unknown
    ttft_ms: FloatArray  # NaN = not reported
    queue_length: FloatArray  # NaN = not reported
    kv_cache_hit_rate: FloatArray  # NaN = not reported
    is_error: BoolArray  # status == "error"
    cuda_error: ObjArray  # None, or the cudaError_t name (str) / code (int) as sent
    batch_source: Int8Array = field(default_factory=_source_from_size)  # BATCH_* per row

    def __post_init__(self) -> None:
        if self.batch_source is _SOURCE_FROM_SIZE:
            self.batch_source = source_from_size(self.batch_size)

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def batch_known(self) -> BoolArray:
        """Rows with a batch size (reported or derived)."""
        return self.batch_size > 0

    @property
    def batch_fill(self) -> FloatArray:
        """batch_size / batch_capacity, in [0, 1] for valid events; NaN where either is unknown."""
        known = (self.batch_size > 0) & (self.batch_capacity > 0)
        out = np.full(self.batch_size.shape, np.nan)
        np.divide(self.batch_size, self.batch_capacity, out=out, where=known)
        return out

    @classmethod
    def empty(cls) -> RequestColumns:
        return cls.from_rows([])

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> RequestColumns:
        """Build columns from already-validated event dicts (the plain-Python reference path).

        Absent batch fields become 0 (unknown). A row may carry ``batch_source`` (an int, one of
        the ``BATCH_*`` values: not a contract field, for tests of derived batches); by default
        it is ``BATCH_REPORTED`` when ``batch_size`` is present.
        """
        rows = list(rows)

        def obj(name: str, default: Any = None) -> ObjArray:
            out = np.empty(len(rows), dtype=object)
            out[:] = [r.get(name, default) for r in rows]
            return out

        def flt(name: str) -> FloatArray:
            return np.array([float(r[name]) if r.get(name) is not None else np.nan for r in rows],
                            dtype=np.float64)

        def i64(name: str) -> IntArray:
            return np.array([int(r.get(name) or 0) for r in rows], dtype=np.int64)

        batch_size = i64("batch_size")
        source = np.array([r.get("batch_source", BATCH_REPORTED if r.get("batch_size") is not None
                                 else BATCH_UNKNOWN) for r in rows], dtype=np.int8)

        return cls(
            request_id=obj("request_id"),
            ts=flt("ts"),
            model=obj("model"),
            replica=obj("replica"),
            latency_ms=flt("latency_ms"),
            prompt_tokens=i64("prompt_tokens"),
            completion_tokens=i64("completion_tokens"),
            batch_size=batch_size,
            batch_capacity=i64("batch_capacity"),
            ttft_ms=flt("ttft_ms"),
            queue_length=flt("queue_length"),
            kv_cache_hit_rate=flt("kv_cache_hit_rate"),
            is_error=np.array([r.get("status", "ok") == "error" for r in rows], dtype=bool),
            cuda_error=obj("cuda_error"),
            batch_source=source,
        )

    def take(self, index: npt.NDArray[np.intp] | BoolArray) -> RequestColumns:
        """The rows selected by an index or mask, as a new batch."""
        return RequestColumns(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def time_slices(self, span_s: float) -> list[RequestColumns]:
        """The rows in event-time order, cut into consecutive slices of at most ``span_s`` each.

        One slice (this batch, unsorted) when the whole batch spans ``span_s`` or less. Stage 1
        cuts a catch-up poll that covers minutes of event time this way, so that the telemetry and
        the steps of each slice are joined in turn rather than all at once.

        >>> cols = RequestColumns.from_rows([dict(model="m", replica="r", ts=t, latency_ms=1.0,
        ...     prompt_tokens=1, completion_tokens=1) for t in (70.0, 10.0, 30.0, 12.0)])
        >>> [part.ts.tolist() for part in cols.time_slices(30.0)]
        [[10.0, 12.0, 30.0], [70.0]]
        """
        if len(self) == 0 or float(self.ts.max() - self.ts.min()) <= span_s:
            return [self]
        order = np.argsort(self.ts, kind="stable")
        ts = self.ts[order]
        cuts = []
        start = float(ts[0])
        while True:
            cut = int(np.searchsorted(ts, start + span_s, side="right"))
            if cut >= len(ts):
                break
            cuts.append(cut)
            start = float(ts[cut])
        return [self.take(part) for part in np.split(order, cuts)]

    @staticmethod
    def concat(parts: list[RequestColumns]) -> RequestColumns:
        if not parts:
            return RequestColumns.empty()
        if len(parts) == 1:
            return parts[0]
        return RequestColumns(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(RequestColumns)}
        )
