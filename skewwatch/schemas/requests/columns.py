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

from skewwatch.schemas.requests.spec import REQUEST_FIELDS, RequestField

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjArray = npt.NDArray[np.object_]
Int8Array = npt.NDArray[np.int8]

_FIELD_NAMES = tuple(f.name for f in REQUEST_FIELDS)

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
    """A batch of already-validated request events (contract v1), one array per field.

    The attributes are :data:`~skewwatch.schemas.requests.spec.REQUEST_FIELDS`' columns, in that order
    and of those dtypes (checked below, when the class is defined), then ``batch_source``.
    """

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
    def from_fields(cls, values: Mapping[str, Any], batch_source: Int8Array | None = None) -> RequestColumns:
        """Columns from one array per contract field, by wire name (``status`` is the ``is_error``
        column); ``batch_source`` as :func:`source_from_size` by default."""
        columns = list(map(values.__getitem__, _FIELD_NAMES))  # positional: attributes in spec order
        if batch_source is not None:
            columns.append(batch_source)
        return cls(*columns)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> RequestColumns:
        """Build columns from already-validated event dicts (the plain-Python path).

        Absent optional fields take their column's "not reported" value (NaN, 0 for the batch fields,
        None); a ``cuda_error`` code sent as an integral float becomes an int. A row may carry
        ``batch_source`` (an int, one of the ``BATCH_*`` values: not a contract field, for tests of
        derived batches); by default it is ``BATCH_REPORTED`` when ``batch_size`` is present.
        """
        rows = list(rows)
        values = {f.name: _column_of(f, [row.get(f.name) for row in rows]) for f in REQUEST_FIELDS}
        source = np.array([r.get("batch_source", BATCH_REPORTED if r.get("batch_size") is not None
                                 else BATCH_UNKNOWN) for r in rows], dtype=np.int8)
        return cls.from_fields(values, source)

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


def _column_of(spec: RequestField, values: list[Any]) -> Any:
    """One field's column from its validated values (None where absent)."""
    if spec.dtype == "float64":
        return np.array(values, dtype=np.float64)  # None -> NaN
    if spec.dtype == "int64":
        return np.array([0 if x is None else int(x) for x in values], dtype=np.int64)  # 12.0 -> 12; absent 0
    if spec.dtype == "bool":  # status: "error" or not
        return np.array([x == "error" for x in values], dtype=np.bool_)
    out = np.empty(len(values), dtype=object)
    out[:] = [int(x) if type(x) is float else x for x in values]  # a cuda_error code sent as 12.0 is 12
    return out


def _check_against_spec() -> None:
    """The class's attributes are the spec's columns, in its order and of its dtypes."""
    declared = [f.name for f in fields(RequestColumns)]
    wanted = [f.column_name for f in REQUEST_FIELDS] + ["batch_source"]
    if declared != wanted:
        raise TypeError(f"RequestColumns declares {declared}, the request field spec makes {wanted}")
    sample = RequestColumns.from_rows([{"status": "error"}])
    for spec in REQUEST_FIELDS:
        dtype = getattr(sample, spec.column_name).dtype
        if dtype != np.dtype(spec.dtype):
            raise TypeError(f"RequestColumns.{spec.column_name} is {dtype}, the spec says {spec.dtype}")


_check_against_spec()
