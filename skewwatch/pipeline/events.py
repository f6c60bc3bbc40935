"""Columnar request events: what the decoder hands the windows.

A batch of request events is kept as one numpy array per field (struct of arrays), so that
a Kafka message holding 100 events is applied to the windows in one vectorised step instead
of 100 Python objects. Optional fields use NaN (floats) or ``None`` (object columns) for
"not reported": missing means unknown, never zero.

>>> import numpy as np
>>> cols = RequestColumns.from_rows([
...     {"request_id": "a", "ts": 10.0, "model": "m", "replica": "r1", "latency_ms": 120.0,
...      "prompt_tokens": 10, "completion_tokens": 20, "batch_size": 4, "batch_capacity": 16},
... ])
>>> len(cols), float(cols.batch_fill[0])
(1, 0.25)
>>> bool(np.isnan(cols.ttft_ms[0]))
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjArray = npt.NDArray[np.object_]


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
    batch_size: IntArray
    batch_capacity: IntArray
    ttft_ms: FloatArray  # NaN = not reported
    queue_length: FloatArray  # NaN = not reported
    kv_cache_hit_rate: FloatArray  # NaN = not reported
    is_error: BoolArray  # status == "error"
    cuda_error: ObjArray  # None, or the cudaError_t name (str) / code (int) as sent

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def batch_fill(self) -> FloatArray:
        """batch_size / batch_capacity, in [0, 1] for valid events."""
        return self.batch_size / self.batch_capacity

    @classmethod
    def empty(cls) -> RequestColumns:
        return cls.from_rows([])

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> RequestColumns:
        """Build columns from already-validated event dicts (the plain-Python reference path)."""
        rows = list(rows)

        def obj(name: str, default: Any = None) -> ObjArray:
            out = np.empty(len(rows), dtype=object)
            out[:] = [r.get(name, default) for r in rows]
            return out

        def flt(name: str) -> FloatArray:
            return np.array([float(r[name]) if r.get(name) is not None else np.nan for r in rows],
                            dtype=np.float64)

        def i64(name: str) -> IntArray:
            return np.array([int(r[name]) for r in rows], dtype=np.int64)

        return cls(
            request_id=obj("request_id"),
            ts=flt("ts"),
            model=obj("model"),
            replica=obj("replica"),
            latency_ms=flt("latency_ms"),
            prompt_tokens=i64("prompt_tokens"),
            completion_tokens=i64("completion_tokens"),
            batch_size=i64("batch_size"),
            batch_capacity=i64("batch_capacity"),
            ttft_ms=flt("ttft_ms"),
            queue_length=flt("queue_length"),
            kv_cache_hit_rate=flt("kv_cache_hit_rate"),
            is_error=np.array([r.get("status", "ok") == "error" for r in rows], dtype=bool),
            cuda_error=obj("cuda_error"),
        )

    def take(self, index: npt.NDArray[np.intp] | BoolArray) -> RequestColumns:
        """The rows selected by an index or mask, as a new batch."""
        return RequestColumns(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concat(parts: list[RequestColumns]) -> RequestColumns:
        if not parts:
            return RequestColumns.empty()
        if len(parts) == 1:
            return parts[0]
        return RequestColumns(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(RequestColumns)}
        )
