"""The general path's checks, column by column: many event dicts judged with a few numpy operations.

:func:`validate_columns` returns full-length columns (placeholders on bad rows) and the bad-row mask;
the reasons of the bad rows are then worded by the per-event rules (``rules.py``). Two shapes:

- the common one (every required field present with its JSON type, optional fields absent or
  well-typed): a handful of numpy operations stacked across fields (:func:`validate_common_shape`);
- any other: field by field, each with a fast path for a column of one JSON type and the scalar rule
  per element otherwise (:func:`validate_any_shape`), so the two can only disagree on the fast paths
  (tests/unit/test_decode_requests.py checks that they never do).

>>> columns, bad = validate_columns([{"request_id": "a", "ts": 1.7e9, "model": "m", "replica": "r",
...     "latency_ms": 5, "prompt_tokens": 1, "completion_tokens": "1"}], max_tokens=100)
>>> bad.tolist(), columns.latency_ms.tolist()
([True], [5.0])
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from typing import Any, Final

import numpy as np

from skewwatch.schemas.fields import INT64_LIMIT, FieldSpec, Problem, check_version
from skewwatch.schemas.requests.columns import BoolArray, FloatArray, IntArray, RequestColumns
from skewwatch.schemas.requests.rules import check_cuda_error, check_field, check_status
from skewwatch.schemas.requests.spec import (
    INT64_COLUMNS,
    OPTIONAL_FIELDS,
    REQUEST_FIELDS,
    REQUIRED_FIELDS,
    STATUS_VALUES,
    RequestField,
)

_NoneType = type(None)
_get_required = operator.itemgetter(*REQUIRED_FIELDS)
_OPTIONAL_READ_FIELDS: Final = ("v", *OPTIONAL_FIELDS)


# --- one column at a time: values (placeholders on bad rows) and a bad-row mask -------------------
# Each has a fast path for the common shape of a column (every value present and of one JSON type),
# checked with C-speed `set(map(type, col))`, and falls back to the scalar check per element otherwise.

ColumnCheck = tuple[Any, BoolArray | None]  # (values array, bad mask or None when no row is bad)
_BIG = sys.float_info.max


def _slow_mask(col: Sequence[Any], check: Callable[[Any], Problem | None]) -> BoolArray:
    return np.fromiter((check(x) is not None for x in col), dtype=np.bool_, count=len(col))


def _any(mask: BoolArray) -> BoolArray | None:
    return mask if mask.any() else None


def _vec_string(spec: FieldSpec, col: Sequence[Any]) -> ColumnCheck:
    out = np.empty(len(col), dtype=object)
    if set(map(type, col)) <= {str}:
        out[:] = col
        return out, (np.array([not x for x in col], dtype=np.bool_) if "" in col else None)
    out[:] = [x if type(x) is str else None for x in col]
    return out, _slow_mask(col, lambda x: check_field(spec, x, {}, 0))


def _vec_number(spec: FieldSpec, col: Sequence[Any]) -> ColumnCheck:
    n = len(col)
    types = set(map(type, col))
    if types <= {int, float, _NoneType}:
        try:
            values = np.array(col, dtype=np.float64)  # None -> NaN
        except OverflowError:  # an int beyond float range: let the scalar check word it
            values = None
        if values is not None:
            low, high = spec.minimum, _BIG if spec.maximum is None else spec.maximum
            if spec.exclusive_maximum is not None:
                high = float(np.nextafter(spec.exclusive_maximum, -np.inf))
            ok = (values >= low) & (values <= high)  # NaN and inf fail both: not finite = bad
            if _NoneType in types:
                absent = np.fromiter((x is None for x in col), dtype=np.bool_, count=n)
                bad = ~ok if spec.required else ~ok & ~absent
                values[absent] = np.nan
            else:
                bad = ~ok
            return values, _any(bad)
    if not spec.required and types == {_NoneType}:
        return np.full(n, np.nan), None
    values = np.full(n, np.nan)
    bad = np.zeros(n, dtype=np.bool_)
    for i, x in enumerate(col):
        if check_field(spec, x, {}, 0) is not None:
            bad[i] = True
        elif x is not None:
            values[i] = float(x)
    return values, _any(bad)


def _vec_integer(spec: FieldSpec, col: Sequence[Any], max_tokens: int) -> ColumnCheck:
    """int64 for INT64_COLUMNS (absent optional values are 0), else float64 with NaN for absent."""
    n = len(col)
    types = set(map(type, col))
    high = max_tokens if spec.tokens else None
    as_ints = spec.name in INT64_COLUMNS
    if types == {int}:
        try:
            ints = np.array(col, dtype=np.int64)
        except OverflowError:  # beyond int64: the per-element path words it
            ints = None
        if ints is not None:
            ok = ints >= spec.minimum
            if high is not None:
                ok &= ints <= high
            bad = _any(~ok)
            return (ints if as_ints else ints.astype(np.float64)), bad
    elif types == {float}:
        floats = np.array(col, dtype=np.float64)
        ok = (floats == np.trunc(floats)) & (floats >= spec.minimum) & (floats < INT64_LIMIT)
        if high is not None:
            ok &= floats <= high
        ints = np.where(ok, floats, 0.0).astype(np.int64)
        return (ints if as_ints else np.where(ok, floats, np.nan)), _any(~ok)
    elif not spec.required and types == {_NoneType}:
        return (np.zeros(n, dtype=np.int64) if as_ints else np.full(n, np.nan)), None
    values = np.full(n, np.nan)
    bad = np.zeros(n, dtype=np.bool_)
    for i, x in enumerate(col):
        if check_field(spec, x, {}, max_tokens) is not None:
            bad[i] = True
        elif x is not None:
            values[i] = x
    if as_ints:
        ints = np.zeros(n, dtype=np.int64)
        ints[~bad] = [0 if x is None else int(x) for x, b in zip(col, bad, strict=True) if not b]
        return ints, _any(bad)
    return values, _any(bad)


def _vec_status(col: Sequence[Any]) -> ColumnCheck:
    types = set(map(type, col))
    if types == {_NoneType}:
        return np.zeros(len(col), dtype=np.bool_), None
    if types <= {str, _NoneType} and set(col) <= {"ok", "error", None}:
        return np.array([x == "error" for x in col], dtype=np.bool_), None
    bad = _slow_mask(col, lambda x: None if x is None else check_status(x))
    return np.array([x == "error" for x in col], dtype=np.bool_) & ~bad, _any(bad)


def _vec_cuda_error(col: Sequence[Any]) -> ColumnCheck:
    n = len(col)
    out = np.empty(n, dtype=object)  # filled with None
    types = set(map(type, col))
    if types == {_NoneType}:
        return out, None
    if types <= {str, _NoneType} and "" not in col:
        out[:] = col
        return out, None
    bad = _slow_mask(col, lambda x: None if x is None else check_cuda_error(x))
    # normalise integral floats to int codes, as the contract promises
    out[:] = [None if b else (int(x) if type(x) is float else x) for x, b in zip(col, bad, strict=True)]
    return out, _any(bad)


_getter_cache: dict[tuple[str, ...], Callable[[dict[str, Any]], tuple[Any, ...]]] = {}


def _extract_columns(events: list[dict[str, Any]]) -> dict[str, Sequence[Any]]:
    """Field name -> the events' values (None where absent): the largest per-event cost, kept in C.

    Events of one producer nearly always carry the same keys: when every event has exactly the
    first event's keys, one C-level itemgetter per event plus a zip transposes them all (~3x
    faster than a comprehension per field). Otherwise, one ``dict.get`` pass per field we read.
    """
    keys = tuple(events[0])
    if len(keys) > 1 and set(map(len, events)) == {len(keys)}:
        getter = _getter_cache.get(keys)
        if getter is None:
            if len(_getter_cache) > 256:  # producers with ever-changing key orders: stay bounded
                _getter_cache.clear()
            getter = _getter_cache[keys] = operator.itemgetter(*keys)
        try:
            return dict(zip(keys, zip(*map(getter, events), strict=True), strict=True))
        except KeyError:  # same key count, other keys: fall through
            pass
    # Mixed shapes (an optional field on some events only): the required fields still in one C
    # pass when every event has them, the optional ones field by field.
    columns: dict[str, Sequence[Any]]
    try:
        columns = dict(zip(REQUIRED_FIELDS, zip(*map(_get_required, events), strict=True), strict=True))
    except KeyError:
        columns = {name: list(map(dict.get, events, repeat(name))) for name in REQUIRED_FIELDS}
    for name in _OPTIONAL_READ_FIELDS:
        columns[name] = list(map(dict.get, events, repeat(name)))
    return columns


def validate_columns(events: list[dict[str, Any]], max_tokens: int, *,
                      fast: bool = True) -> tuple[RequestColumns, BoolArray]:
    """All events checked column by column; returns full-length columns and the bad-row mask
    (bad rows hold placeholders). ``fast=False`` forces the per-column path (tests compare them)."""
    columns_in = _extract_columns(events)
    if fast:
        result = validate_common_shape(columns_in, len(events), max_tokens)
        if result is not None:
            return result
    return validate_any_shape(columns_in, len(events), max_tokens)


def _upper_bound(spec: FieldSpec) -> float:
    """The largest value a number field accepts (a finite float: NaN and inf fail every bound)."""
    if spec.exclusive_maximum is not None:
        return float(np.nextafter(spec.exclusive_maximum, -np.inf))
    return _BIG if spec.maximum is None else spec.maximum


# The common shape's required fields, stacked by JSON type (one numpy call per group), and the bounds
# of each stacked row, from the spec.
_STACKED_STRINGS: Final = tuple(f.name for f in REQUEST_FIELDS if f.required and f.kind == "string")
_REQUIRED_NUMBERS: Final = tuple(f for f in REQUEST_FIELDS if f.required and f.kind == "number")
_REQUIRED_INTEGERS: Final = tuple(f for f in REQUEST_FIELDS if f.required and f.kind == "integer")
_STACKED_FLOATS: Final = tuple(f.name for f in _REQUIRED_NUMBERS)
_STACKED_INTS: Final = tuple(f.name for f in _REQUIRED_INTEGERS)
_FLOATS_LOW: Final = np.array([[f.minimum] for f in _REQUIRED_NUMBERS])
_FLOATS_HIGH: Final = np.array([[_upper_bound(f)] for f in _REQUIRED_NUMBERS])
_INTS_LOW: Final = np.array([[int(f.minimum)] for f in _REQUIRED_INTEGERS], dtype=np.int64)
_INTS_TOKENS: Final = np.array([[f.tokens] for f in _REQUIRED_INTEGERS], dtype=np.bool_)  # bounded by max_tokens
_OPTIONAL_SPECS: Final = tuple(f for f in REQUEST_FIELDS if not f.required)
_STATUS_SET: Final = frozenset({*STATUS_VALUES, None})


def _optional_floats(col: Sequence[Any] | None, n: int, low: float, high: float
                     ) -> tuple[FloatArray, BoolArray] | None:
    """Fast path of an optional number column: (values, ok) or None for an unusual shape."""
    if col is None or col.count(None) == n:
        return np.full(n, np.nan), np.ones(n, dtype=np.bool_)
    types = set(map(type, col))
    if not types <= {int, float, _NoneType}:
        return None
    try:
        values = np.array(col, dtype=np.float64)  # None -> NaN
    except OverflowError:
        return None
    ok = (values >= low) & (values <= high)
    if _NoneType in types:  # absent is fine; NaN that was *sent* (stdlib fallback) is not
        absent = np.fromiter(map(operator.is_, col, repeat(None)), dtype=np.bool_, count=n)
        ok |= absent
        values[absent] = np.nan
    return values, ok


def _optional_ints(col: Sequence[Any] | None, n: int, low: int, as_ints: bool
                   ) -> tuple[IntArray | FloatArray, BoolArray | None] | None:
    """Fast path of an optional integer column: (values, ok or None when every row is), or None for an
    unusual shape. ``as_ints``: an int64 column with 0 for absent (the batch fields), else float64 with
    NaN for absent."""
    if col is None or col.count(None) == n:
        return (np.zeros(n, dtype=np.int64) if as_ints else np.full(n, np.nan)), None
    types = set(map(type, col))
    if types == {int}:
        present = None
    elif types == {int, _NoneType}:
        present = np.fromiter(map(operator.is_not, col, repeat(None)), dtype=np.bool_, count=n)
        col = [0 if x is None else x for x in col]
    else:
        return None
    try:
        ints = np.array(col, dtype=np.int64)
    except OverflowError:
        return None
    ok = ints >= low if present is None else (ints >= low) | ~present
    if as_ints:
        return ints, ok
    floats = ints.astype(np.float64)
    if present is not None:
        floats[~present] = np.nan
    return floats, ok


def _optional_column(spec: RequestField, col: Sequence[Any] | None, n: int
                     ) -> tuple[Any, BoolArray | None] | None:
    """The common shape's check of one optional field: (column, ok or None), None for an unusual shape."""
    if spec.kind == "number":
        return _optional_floats(col, n, spec.minimum, _upper_bound(spec))
    if spec.kind == "integer":
        return _optional_ints(col, n, int(spec.minimum), spec.dtype == "int64")
    if spec.kind == "status":
        if col is None:
            return np.zeros(n, dtype=np.bool_), None
        try:
            if not set(col) <= _STATUS_SET:  # True == 1 hashes alike, but neither is in the set
                return None
        except TypeError:  # an unhashable value (list, object)
            return None
        return np.fromiter(map(operator.eq, col, repeat("error")), dtype=np.bool_, count=n), None
    # cuda_error: names only here (an integer code takes the per-column path, which normalises 12.0)
    out = np.empty(n, dtype=object)  # None-filled
    if col is not None and col.count(None) != n:
        if not set(map(type, col)) <= {str, _NoneType} or "" in col:
            return None
        out[:] = col
    return out, None


def validate_common_shape(cols: dict[str, Sequence[Any]], n: int,
                          max_tokens: int) -> tuple[RequestColumns, BoolArray] | None:
    """The common case in a handful of numpy operations: every required field present with its
    JSON type, optional fields absent or well-typed. Range problems (negative, non-finite, over
    a limit, batch over capacity) are found here too; any type anomaly returns None and the
    per-column path takes over. The numpy calls are stacked across fields because each one has a
    fixed cost that dominates at 100 events per message."""
    get = cols.get
    versions = get("v")
    if versions is not None and versions.count(None) != n:
        return None
    try:
        strings, floats, ints = ([cols[name] for name in names]
                                 for names in (_STACKED_STRINGS, _STACKED_FLOATS, _STACKED_INTS))
    except KeyError:  # a required field absent from every event
        return None
    if (set(map(type, chain(*strings))) != {str} or not set(map(type, chain(*floats))) <= {int, float}
            or set(map(type, chain(*ints))) != {int}):
        return None
    values: dict[str, Any] = {}
    optional_ok: list[BoolArray] = []
    for spec in _OPTIONAL_SPECS:
        checked = _optional_column(spec, get(spec.name), n)
        if checked is None:
            return None
        values[spec.name], ok_rows = checked
        if ok_rows is not None:
            optional_ok.append(ok_rows)
    try:
        stacked_floats = np.array(floats, dtype=np.float64)
        stacked_ints = np.array(ints, dtype=np.int64)
    except OverflowError:
        return None
    ok = ((stacked_floats >= _FLOATS_LOW) & (stacked_floats <= _FLOATS_HIGH)).all(axis=0)
    ok &= ((stacked_ints >= _INTS_LOW) & ((stacked_ints <= max_tokens) | ~_INTS_TOKENS)).all(axis=0)
    for ok_rows in optional_ok:
        ok &= ok_rows
    # over capacity only when both are present (an absent batch field is 0)
    size, capacity = values["batch_size"], values["batch_capacity"]
    ok &= (size <= capacity) | (capacity == 0)
    values.update(zip(_STACKED_FLOATS, stacked_floats, strict=True))
    values.update(zip(_STACKED_INTS, stacked_ints, strict=True))
    for name, col in zip(_STACKED_STRINGS, strings, strict=True):
        out = np.empty(n, dtype=object)
        out[:] = col
        if "" in col:
            ok &= out != ""
        values[name] = out
    return RequestColumns.from_fields(values), ~ok


def validate_any_shape(columns_in: dict[str, Sequence[Any]], n: int,
                        max_tokens: int) -> tuple[RequestColumns, BoolArray]:
    """Column by column, each with a fast path and a per-element fallback: any input shape."""
    bad = np.zeros(n, dtype=np.bool_)
    versions = columns_in.get("v")
    if versions is not None and versions.count(None) != n:
        bad |= _slow_mask(versions, lambda x: None if x is None else check_version("v", x))
    values: dict[str, Any] = {}
    absent = [None] * n
    for spec in REQUEST_FIELDS:
        col = columns_in.get(spec.name, absent)
        if spec.kind == "string":
            column, col_bad = _vec_string(spec, col)
        elif spec.kind == "number":
            column, col_bad = _vec_number(spec, col)
        elif spec.kind == "integer":
            column, col_bad = _vec_integer(spec, col, max_tokens)
        elif spec.kind == "status":
            column, col_bad = _vec_status(col)
        else:
            column, col_bad = _vec_cuda_error(col)
        values[spec.name] = column
        if col_bad is not None:
            bad |= col_bad
    # over capacity only when both are present (absent and bad values are 0: never flagged)
    bad |= (values["batch_size"] > values["batch_capacity"]) & (values["batch_capacity"] > 0)
    columns = RequestColumns.from_fields(values)
    return columns, bad
