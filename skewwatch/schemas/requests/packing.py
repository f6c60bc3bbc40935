"""Typed events to columns with C passes only: ``astuple``, a zip transpose, then struct's packer per
number field and ``np.fromiter`` per object field, each column built as its field's spec says.

>>> from skewwatch.schemas.requests.structs import typed_decoders
>>> batch = typed_decoders(100).batch.decode(b'{"events": [{"request_id": "a", "ts": 1.0, "model": "m", '
...     b'"replica": "r", "latency_ms": 2.0, "prompt_tokens": 1, "completion_tokens": 1, "batch_size": 9, '
...     b'"batch_capacity": 8}]}')
>>> columns, over_capacity = columns_from_typed_events(batch.events)
>>> columns.latency_ms.tolist(), over_capacity.tolist()
([2.0], [True])
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any, Final

import msgspec
import numpy as np

from skewwatch.gc_pause import gc_paused
from skewwatch.schemas.requests.columns import BoolArray, FloatArray, IntArray, ObjArray, RequestColumns
from skewwatch.schemas.requests.spec import REQUEST_FIELDS, RequestField
from skewwatch.schemas.requests.structs import TYPED_AT


@functools.lru_cache(maxsize=256)  # polls of a steady stream have a few sizes; others are rebuilt (cheap)
def _packer(code: str, n: int) -> struct.Struct:
    return struct.Struct(f"{n}{code}")


def _packed(values: tuple[Any, ...], n: int, code: str, dtype: type[np.generic], writable: bool) -> Any:
    """``values`` as a numpy array through struct's C packer, cheaper per value than np.fromiter
    (one C call converts them all); None when one value does not pack (a None: an explicit null). Read-only unless
    ``writable`` (a copy): the chunks of a large poll are concatenated, which copies them anyway."""
    try:
        packed = _packer(code, n).pack(*values)
    except struct.error:
        return None
    array = np.frombuffer(packed, dtype=dtype)
    return array.copy() if writable else array


# Below this many values np.fromiter wins: packing has a larger fixed cost per column (bench/decode_bench.py)
_PACK_MIN_VALUES: Final = 32


def _float_column(values: tuple[Any, ...], n: int, writable: bool = True) -> FloatArray:
    """A float64 column (NaN for absent and null)."""
    if n < _PACK_MIN_VALUES:
        try:
            return np.fromiter(values, dtype=np.float64, count=n)
        except TypeError:  # an explicit null: np.array makes it NaN
            return np.array(values, dtype=np.float64)
    if type(values[0]) is int:  # an integer field (queue_length): "q" then one astype is cheaper than "d"
        ints: IntArray | None = _packed(values, n, "q", np.int64, False)
        if ints is not None:
            return ints.astype(np.float64)
    column: FloatArray | None = _packed(values, n, "d", np.float64, writable)
    # an explicit null (absent values are NaN already): np.array makes it NaN
    return np.array(values, dtype=np.float64) if column is None else column


def _int_column(values: tuple[Any, ...], n: int, writable: bool = True) -> IntArray:
    """An int64 column (an explicit null batch field is 0, as an absent one)."""
    column: IntArray | None = None
    if n >= _PACK_MIN_VALUES:
        column = _packed(values, n, "q", np.int64, writable)
    else:
        try:  # noqa: SIM105  # contextlib.suppress adds a context manager per column of every small decode
            column = np.fromiter(values, dtype=np.int64, count=n)
        except TypeError:  # an explicit null
            pass
    if column is None:  # an explicit null batch field: unknown, 0 like an absent one
        return np.fromiter((0 if x is None else x for x in values), dtype=np.int64, count=n)
    return column


_FEW_ERRORS: Final = 16  # up to this many failed requests in a chunk, find them by C scans (tuple.index)


# Events per transpose: bounds the row tuples alive at once (~1 MB per 8,192 events).
_TRANSPOSE_CHUNK: Final = 8192


def columns_from_typed_events(events: list[Any]) -> tuple[RequestColumns, BoolArray]:
    """Columns of msgspec-validated events, and the rows whose batch_size > batch_capacity (both
    present). Per event only C runs: astuple, the zip transpose, then struct's packer per number
    field and np.fromiter per object field.

    The cyclic GC is paused meanwhile: the transpose makes a tuple per event (and per field), none in
    a cycle and all freed by the end, and the collector would otherwise scan the growing young
    generation over and over and promote them (bench/README.md has the measurement)."""
    with gc_paused():
        n = len(events)
        if n <= _TRANSPOSE_CHUNK:
            return _columns_of_chunk(events, writable=True)
        parts = [_columns_of_chunk(events[i:i + _TRANSPOSE_CHUNK], writable=False)
                 for i in range(0, n, _TRANSPOSE_CHUNK)]
        return RequestColumns.concat([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _object_column(values: tuple[Any, ...], n: int, writable: bool = True) -> ObjArray:
    return np.fromiter(values, dtype=object, count=n)


def _optional_object_column(values: tuple[Any, ...], n: int, writable: bool = True) -> ObjArray:
    # count(None) is cheap on None (identity) but a full comparison per string (str == None): optional fields only
    if values.count(None) == n:  # the field nobody sent (cuda_error, mostly)
        return np.empty(n, dtype=object)  # None-filled
    return np.fromiter(values, dtype=object, count=n)


def _error_column(status: tuple[Any, ...], n: int, writable: bool = True) -> BoolArray:
    """status == "error" per row. Failed requests are usually few: count them (a C scan), then find
    each with tuple.index (C scans again), rather than compare every row in Python."""
    errors = status.count("error")
    if errors > _FEW_ERRORS:
        many: BoolArray = np.array(status, dtype=object) == "error"
        return many
    out = np.zeros(n, dtype=np.bool_)
    at = -1
    for _ in range(errors):
        at = status.index("error", at + 1)
        out[at] = True
    return out


ColumnBuilder = Callable[[tuple[Any, ...], int, bool], Any]


def _builder(spec: RequestField) -> ColumnBuilder:
    """How one field's transposed values become its column, by the column's dtype."""
    if spec.dtype == "float64":  # queue_length too: an integer field, float64 with NaN for absent
        return _float_column
    if spec.dtype == "int64":
        return _int_column
    if spec.dtype == "bool":
        return _error_column
    return _object_column if spec.required else _optional_object_column


# (field, position in the struct's tuple, builder) per field, in REQUEST_FIELDS order
_BUILDERS: Final = tuple((f.name, TYPED_AT[f.name], _builder(f)) for f in REQUEST_FIELDS)


def _columns_of_chunk(events: list[Any], writable: bool) -> tuple[RequestColumns, BoolArray]:
    """Columns of up to _TRANSPOSE_CHUNK events; numbers may be read-only views unless ``writable``."""
    n = len(events)
    if n == 0:
        return RequestColumns.empty(), np.zeros(0, dtype=np.bool_)
    # not strict: a single-event struct has one more field, last (UNSET), which zip leaves out
    cols = list(zip(*map(msgspec.structs.astuple, events)))  # noqa: B905
    columns = RequestColumns.from_fields({name: build(cols[at], n, writable) for name, at, build in _BUILDERS})
    size, capacity = columns.batch_size, columns.batch_capacity
    return columns, (size > capacity) & (capacity > 0)
