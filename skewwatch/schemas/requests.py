"""Decode ``llm.requests`` messages (contract request-message.v1) into columns, fast and safely.

Seed rules implemented (issue 2, "Wire contract v1" and "Bad input"): a message is one event
object or ``{"events": [...]}`` (optionally with ``"v": 1``); every malformed message or event is
rejected with a stable reason code and a sentence naming the field and the value, the valid
events of the same batch are still decoded, and no input ever raises. The hot path must not pay a
per-event Python cost (DESIGN.md, issue 6, measured numbers), so a message goes down one of two
paths:

- typed (fast): msgspec parses straight into structs generated from EVENT_FIELDS, checking every
  type and every integer and string range in C; it is strict, so it accepts a subset of the
  contract (no 12.0 for an int). :func:`decode_typed_runs` takes a poll in runs of messages, each
  run one C-level ``map`` with no per-message Python (a clean poll is one run; a refused message
  ends a run and the next goes on after it), and :func:`columns_from_typed_events` turns the
  structs into columns with C passes only (astuple, a zip transpose, struct's packer per number
  field, np.fromiter per string field). The numbers' ranges are checked on the poll's columns
  (a few numpy operations per poll instead of ~40 ns per event in msgspec); a message with a
  number out of range goes to the general path, which words it;
- general (the reference): anything msgspec refuses is parsed by orjson and each field checked as
  one numpy column; per-event Python only runs to word the reasons of the bad rows.

Both give the same result for any input (tests/unit/test_decode_requests.py checks it, on
generated valid and invalid polls). Not done, by measurement (bench/decode_bench.py, and one-off
timings on the same events, 2026-12-03): joining a poll's messages into one JSON array and decoding
it in one msgspec call is slower than the map (~0.86 against ~0.61 µs per event: the copy costs
more than the calls saved) and would let crafted messages merge or split across message
boundaries; columnar JSON readers parse slower than msgspec's typed decode before making a single
column (pyarrow.json.read_json ~1.7-2.1 µs per event, polars.read_ndjson ~1.2 µs, single-threaded,
against ~0.6 µs), so neither is a dependency.

Contract decisions (docs/contracts.md says the same):

- integer fields accept integral floats (``12.0`` is 12, as JSON Schema's "integer" does) and
  reject ``12.5`` (wrong_type) and booleans (``true`` is not a token count);
- numbers must be finite: ``NaN``/``Infinity`` literals (Python's ``json.dumps`` writes them) and
  overflowing numbers (``1e999``) reject only the event that holds them (out_of_range);
- ``ts`` must be epoch *seconds* below 1e11: a millisecond timestamp is rejected with a hint;
- ``null`` on an optional field means "not reported"; on a required field it is missing_field;
- unknown fields are ignored (forward compatible); ``"events"`` is reserved for the batch form;
- v1.1 (backward compatible): ``batch_size`` and ``batch_capacity`` are optional (still integers
  ≥ 1 when present); ``batch_over_capacity`` applies only when both are present. In the columns an
  absent batch field is 0 and ``batch_source`` says whether the row's batch size is known.

>>> from skewwatch.schemas.limits import DEFAULT_LIMITS
>>> ok = {"request_id": "a", "ts": 1.7e9, "model": "m", "replica": "r1", "latency_ms": 120.0,
...       "prompt_tokens": 10, "completion_tokens": 20, "batch_size": 4, "batch_capacity": 16}
>>> bad = dict(ok, latency_ms=-3)
>>> out = decode_request_message(encode_request_events([ok, bad]), DEFAULT_LIMITS)
>>> len(out.columns), [(r.reason_code, r.reason) for r in out.rejects]
(1, [('out_of_range', 'events[1].latency_ms: must be ≥ 0, got -3')])
>>> decode_request_message(b"{oops", DEFAULT_LIMITS).rejects[0].reason_code
'malformed_json'
"""

from __future__ import annotations

import functools
import math
import operator
import struct
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Annotated, Any, Final, Literal, overload

import msgspec
import numpy as np
import orjson

from skewwatch.gc_pause import gc_paused
from skewwatch.schemas.fields import (
    INT64_LIMIT,
    TS_MAX_S,
    FieldSpec,
    Problem,
    check_integer,
    check_number,
    check_string,
    check_version,
    missing_problem,
    parse_json,
)
from skewwatch.schemas.limits import DEFAULT_LIMITS, InputLimits
from skewwatch.schemas.rejection import Rejection, show_value
from skewwatch.schemas.request_columns import BoolArray, FloatArray, IntArray, ObjArray, RequestColumns

REQUEST_SCHEMA_VERSION: Final = 1
SCALAR_MAX_EVENTS: Final = 8  # up to this many events per decode, per-row Python beats numpy's fixed costs
_MAX_PROBLEMS_SHOWN = 5  # an event with many problems: name the first few, count the rest

_NoneType = type(None)


# --- the contract as data: one row per event field, in the order problems are reported ----------

EVENT_FIELDS: Final[tuple[FieldSpec, ...]] = (
    FieldSpec("request_id", "string", True),
    FieldSpec("ts", "number", True, exclusive_maximum=TS_MAX_S),
    FieldSpec("model", "string", True),
    FieldSpec("replica", "string", True),
    FieldSpec("latency_ms", "number", True),
    FieldSpec("prompt_tokens", "integer", True, tokens=True),
    FieldSpec("completion_tokens", "integer", True, tokens=True),
    # v1.1: optional (OTLP spans carry no batch size); the worker may derive them from telemetry
    FieldSpec("batch_size", "integer", False, minimum=1),
    FieldSpec("batch_capacity", "integer", False, minimum=1),
    FieldSpec("ttft_ms", "number", False),
    FieldSpec("queue_length", "integer", False),
    FieldSpec("kv_cache_hit_rate", "number", False, maximum=1.0),
    FieldSpec("status", "status", False),
    FieldSpec("cuda_error", "cuda_error", False),
)
REQUIRED_FIELDS: Final = tuple(f.name for f in EVENT_FIELDS if f.required)
_get_required = operator.itemgetter(*REQUIRED_FIELDS)
_OPTIONAL_READ_FIELDS: Final = ("v", *(f.name for f in EVENT_FIELDS if not f.required))
# Integer fields kept as int64 columns. The optional ones (batch fields, minimum 1) hold 0 for
# "not reported": 0 is never a valid value, and a float column would lose precision above 2**53.
INT64_COLUMNS: Final = frozenset({"prompt_tokens", "completion_tokens", "batch_size", "batch_capacity"})
BATCH_FIELDS: Final = ("batch_size", "batch_capacity")
STATUS_VALUES: Final = ("ok", "error")


# --- results ---------------------------------------------------------------------------------------

@dataclass(slots=True)
class DecodedMessage:
    """One ``llm.requests`` message: its valid events as columns, and why the others were rejected."""

    columns: RequestColumns
    rejects: list[Rejection]

    @property
    def rejected_whole_message(self) -> bool:
        return any(r.is_message_level for r in self.rejects)


class MessageRejects(Sequence[list[Rejection]]):
    """The rejections of each message of a poll (read-only): ``rejects[m]`` is message ``m``'s
    list, empty when it was clean. Lists are stored for the rejected messages only: a clean poll
    of 20,000 messages allocating 20,000 lists that outlive the decode made the garbage collector
    scan the whole heap (~0.5 µs per message with a worker-sized heap, bench/decode_bench.py).

    >>> rejects = MessageRejects(3, {1: [Rejection("empty", "value is null or zero bytes")]})
    >>> [[r.reason_code for r in rs] for rs in rejects], rejects == [[], rejects[1], []]
    ([[], ['empty'], []], True)
    """

    __slots__ = ("_by_message", "_count")

    def __init__(self, count: int, by_message: Mapping[int, list[Rejection]] | None = None) -> None:
        self._count = count
        self._by_message = {m: rs for m, rs in (by_message or {}).items() if rs}

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> list[Rejection]: ...

    @overload
    def __getitem__(self, index: slice) -> list[list[Rejection]]: ...

    def __getitem__(self, index: int | slice) -> list[Rejection] | list[list[Rejection]]:
        if isinstance(index, slice):
            return [self[m] for m in range(*index.indices(self._count))]
        m = index + self._count if index < 0 else index
        if not 0 <= m < self._count:
            raise IndexError(f"message {index} of {self._count}")
        return self._by_message.get(m) or []  # a fresh empty list: a clean message's is nobody's

    def __iter__(self) -> Iterator[list[Rejection]]:
        get = self._by_message.get
        return (get(m) or [] for m in range(self._count))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageRejects):
            return self._count == other._count and self._by_message == other._by_message
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable lists inside: not hashable, like a list

    def __repr__(self) -> str:
        return f"MessageRejects({self._count}, {self._by_message!r})"

    @property
    def rejected(self) -> dict[int, list[Rejection]]:
        """Message index -> its rejections, for the rejected messages only (ascending)."""
        return dict(sorted(self._by_message.items()))


@dataclass(slots=True)
class DecodedMessages:
    """Many messages decoded together (one poll): one column batch, rejects per message.

    ``message_index[i]`` is the input position of the message that row ``i`` of ``columns`` came
    from; ``rejects[m]`` lists message ``m``'s rejections (empty when it was clean).
    """

    columns: RequestColumns
    message_index: IntArray
    rejects: MessageRejects


# --- scalar checks: the single source of the reasons' wording --------------------------------------

def _check_status(value: Any) -> Problem | None:
    if type(value) is not str:
        return ("wrong_type", f'status: must be "ok" or "error", got {show_value(value)}')
    if value not in STATUS_VALUES:
        return ("out_of_range", f'status: must be "ok" or "error", got {show_value(value)}')
    return None


def _check_cuda_error(value: Any) -> Problem | None:
    kind = type(value)
    if kind is str:
        return None if value else ("out_of_range", 'cuda_error: must be a non-empty cudaError_t name, got ""')
    if kind is int or (kind is float and math.isfinite(value) and value.is_integer()):
        if 0 <= value < INT64_LIMIT:
            return None
        return ("out_of_range", f"cuda_error: code must be ≥ 0, got {show_value(value)}")
    return ("wrong_type",
            f"cuda_error: must be a cudaError_t name (string) or code (integer), got {show_value(value)}")


def _check_field(spec: FieldSpec, value: Any, event: Mapping[str, Any], max_tokens: int) -> Problem | None:
    """The problem with one field's value (None = fine). Absent and null are the same."""
    if value is None:
        return missing_problem(spec.name, event) if spec.required else None
    kind = spec.kind
    if kind == "string":
        return check_string(spec.name, value)
    if kind == "number":
        return check_number(spec, value)
    if kind == "integer":
        return check_integer(spec, value, max_tokens)
    if kind == "status":
        return _check_status(value)
    return _check_cuda_error(value)


def event_problems(event: Mapping[str, Any], max_tokens: int) -> list[Problem]:
    """Every problem of one event, in field order (the reference the vectorised path must match)."""
    version = event.get("v")
    if version is not None:
        problem = check_version("v", version)
        if problem is not None:  # a newer version may mean other things: do not judge its fields
            return [problem]
    problems: list[Problem] = []
    batch_fields_ok = True
    for spec in EVENT_FIELDS:
        problem = _check_field(spec, event.get(spec.name), event, max_tokens)
        if problem is not None:
            problems.append(problem)
            batch_fields_ok &= spec.name not in ("batch_size", "batch_capacity")
    size, capacity = event.get("batch_size"), event.get("batch_capacity")
    if batch_fields_ok and size is not None and capacity is not None and size > capacity:
        problems.append(("batch_over_capacity",
                         f"batch_size: {show_value(size)} > batch_capacity {show_value(capacity)}"))
    return problems


def check_request_event(event: Mapping[str, Any], limits: InputLimits | None = None) -> Rejection | None:
    """Validate one event as the worker will (for producers: learn about bad fields at the call site).

    >>> check_request_event({"request_id": "a", "ts": 1.7e9, "model": "m", "replica": "r", "latency_ms": 5,
    ...     "prompt_tokens": 1, "completion_tokens": 1, "batch_size": 40, "batch_capacity": 32}).reason
    'batch_size: 40 > batch_capacity 32'
    >>> check_request_event({"request_id": "a"}).reason_code
    'missing_field'
    """
    if not isinstance(event, Mapping):
        return Rejection("not_an_object", f"event must be a JSON object, got {show_value(event)}", 0)
    problems = event_problems(event, (limits or DEFAULT_LIMITS).max_tokens)
    return _rejection(problems, "", 0) if problems else None


_MISSING_SUFFIX = ": required field is missing"


def _rejection(problems: list[Problem], prefix: str, event_index: int) -> Rejection:
    """One rejection per event: the first problem's code, every problem in the text."""
    texts: list[str] = []
    missing = [t[: -len(_MISSING_SUFFIX)] for _, t in problems if t.endswith(_MISSING_SUFFIX)]
    for _, text in problems:
        if not text.endswith(_MISSING_SUFFIX) or len(missing) == 1:
            texts.append(prefix + text)
        elif text.startswith(missing[0] + ":"):  # several absent fields: one phrase, at the first
            texts.append(f"{prefix.rstrip('.') or 'event'}: required fields are missing: {', '.join(missing)}")
    shown = texts[:_MAX_PROBLEMS_SHOWN]
    text = "; ".join(shown)
    if len(texts) > len(shown):
        text += f"; ...(+{len(texts) - len(shown)} more)"
    return Rejection(problems[0][0], text, event_index)


# --- vectorised column checks: values (placeholders on bad rows) and a bad-row mask ----------------
# Each has a fast path for the common shape of a column (every value present and of one JSON type),
# checked with C-speed `set(map(type, col))`, and falls back to the scalar check per element
# otherwise, so the two can only disagree on the fast paths (tests/unit/test_decode_requests.py
# checks that they never do).

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
    return out, _slow_mask(col, lambda x: _check_field(spec, x, {}, 0))


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
        if _check_field(spec, x, {}, 0) is not None:
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
        if _check_field(spec, x, {}, max_tokens) is not None:
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
    bad = _slow_mask(col, lambda x: None if x is None else _check_status(x))
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
    bad = _slow_mask(col, lambda x: None if x is None else _check_cuda_error(x))
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


def _validate_columns(events: list[dict[str, Any]], max_tokens: int, *,
                      fast: bool = True) -> tuple[RequestColumns, BoolArray]:
    """All events checked column by column; returns full-length columns and the bad-row mask
    (bad rows hold placeholders). ``fast=False`` forces the per-column path (tests compare them)."""
    columns_in = _extract_columns(events)
    if fast:
        result = _validate_common_shape(columns_in, len(events), max_tokens)
        if result is not None:
            return result
    return _validate_any_shape(columns_in, len(events), max_tokens)


# Bounds of the fast path's stacked columns, one row per field (see EVENT_FIELDS).
_STACKED_STRINGS: Final = ("request_id", "model", "replica")
_STACKED_FLOATS: Final = ("ts", "latency_ms")
_STACKED_INTS: Final = ("prompt_tokens", "completion_tokens")
_FLOATS_LOW: Final = np.array([[0.0], [0.0]])
_FLOATS_HIGH: Final = np.array([[float(np.nextafter(TS_MAX_S, -np.inf))], [_BIG]])
_INTS_LOW: Final = np.array([[0], [0]], dtype=np.int64)
_STATUS_SET: Final = frozenset({"ok", "error", None})


def _optional_floats(col: Sequence[Any] | None, n: int, high: float) -> tuple[FloatArray, BoolArray] | None:
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
    ok = (values >= 0.0) & (values <= high)
    if _NoneType in types:  # absent is fine; NaN that was *sent* (stdlib fallback) is not
        absent = np.fromiter(map(operator.is_, col, repeat(None)), dtype=np.bool_, count=n)
        ok |= absent
        values[absent] = np.nan
    return values, ok


def _optional_batch_ints(col: Sequence[Any] | None, n: int) -> tuple[IntArray, BoolArray | None] | None:
    """Fast path of an optional batch column: (int64 values with 0 where absent, the rows where
    it was present or None when all were / none was), or None for an unusual shape."""
    if col is None or col.count(None) == n:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_)
    types = set(map(type, col))
    if types == {int}:
        present = None
    elif types == {int, _NoneType}:
        present = np.fromiter(map(operator.is_not, col, repeat(None)), dtype=np.bool_, count=n)
        col = [0 if x is None else x for x in col]
    else:
        return None
    try:
        return np.array(col, dtype=np.int64), present
    except OverflowError:
        return None


def _validate_common_shape(cols: dict[str, Sequence[Any]], n: int,
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
    ttft = _optional_floats(get("ttft_ms"), n, _BIG)
    kv_rate = _optional_floats(get("kv_cache_hit_rate"), n, 1.0)
    batch_size = _optional_batch_ints(get("batch_size"), n)
    batch_capacity = _optional_batch_ints(get("batch_capacity"), n)
    if ttft is None or kv_rate is None or batch_size is None or batch_capacity is None:
        return None
    queue = get("queue_length")
    if queue is None or queue.count(None) == n:
        queue_values, queue_ok = np.full(n, np.nan), None
    elif set(map(type, queue)) == {int}:
        try:
            queue_ints = np.array(queue, dtype=np.int64)
        except OverflowError:
            return None
        queue_values, queue_ok = queue_ints.astype(np.float64), queue_ints >= 0
    else:
        return None
    status = get("status")
    if status is None:
        is_error = np.zeros(n, dtype=np.bool_)
    else:
        try:
            if not set(status) <= _STATUS_SET:  # True == 1 hashes alike, but neither is in the set
                return None
        except TypeError:  # an unhashable value (list, object)
            return None
        is_error = np.fromiter(map(operator.eq, status, repeat("error")), dtype=np.bool_, count=n)
    cuda_error = np.empty(n, dtype=object)  # None-filled
    cuda = get("cuda_error")
    if cuda is not None and cuda.count(None) != n:
        if not set(map(type, cuda)) <= {str, _NoneType} or "" in cuda:
            return None
        cuda_error[:] = cuda
    try:
        stacked_floats = np.array(floats, dtype=np.float64)
        stacked_ints = np.array(ints, dtype=np.int64)
    except OverflowError:
        return None
    ok = ((stacked_floats >= _FLOATS_LOW) & (stacked_floats <= _FLOATS_HIGH)).all(axis=0)
    ok &= (stacked_ints >= _INTS_LOW).all(axis=0) & (stacked_ints <= max_tokens).all(axis=0)
    size, size_present = batch_size
    capacity, capacity_present = batch_capacity
    # present batch values are >= 1 (absent ones are 0); over capacity only when both are present
    ok &= (size >= 1) if size_present is None else (size >= 1) | ~size_present
    ok &= (capacity >= 1) if capacity_present is None else (capacity >= 1) | ~capacity_present
    ok &= (size <= capacity) | (capacity == 0)
    ok &= ttft[1] & kv_rate[1]
    if queue_ok is not None:
        ok &= queue_ok
    string_columns = []
    for col in strings:
        out = np.empty(n, dtype=object)
        out[:] = col
        if "" in col:
            ok &= out != ""
        string_columns.append(out)
    columns = RequestColumns(
        request_id=string_columns[0],
        ts=stacked_floats[0],
        model=string_columns[1],
        replica=string_columns[2],
        latency_ms=stacked_floats[1],
        prompt_tokens=stacked_ints[0],
        completion_tokens=stacked_ints[1],
        batch_size=size,
        batch_capacity=capacity,
        ttft_ms=ttft[0],
        queue_length=queue_values,
        kv_cache_hit_rate=kv_rate[0],
        is_error=is_error,
        cuda_error=cuda_error,
    )
    return columns, ~ok


def _validate_any_shape(columns_in: dict[str, Sequence[Any]], n: int,
                        max_tokens: int) -> tuple[RequestColumns, BoolArray]:
    """Column by column, each with a fast path and a per-element fallback: any input shape."""
    bad = np.zeros(n, dtype=np.bool_)
    versions = columns_in.get("v")
    if versions is not None and versions.count(None) != n:
        bad |= _slow_mask(versions, lambda x: None if x is None else check_version("v", x))
    values: dict[str, Any] = {}
    absent = [None] * n
    for spec in EVENT_FIELDS:
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
    columns = RequestColumns(
        request_id=values["request_id"],
        ts=values["ts"],
        model=values["model"],
        replica=values["replica"],
        latency_ms=values["latency_ms"],
        prompt_tokens=values["prompt_tokens"],
        completion_tokens=values["completion_tokens"],
        batch_size=values["batch_size"],
        batch_capacity=values["batch_capacity"],
        ttft_ms=values["ttft_ms"],
        queue_length=values["queue_length"],
        kv_cache_hit_rate=values["kv_cache_hit_rate"],
        is_error=values["status"],
        cuda_error=values["cuda_error"],
    )
    return columns, bad


def _columns_from_valid_rows(rows: list[dict[str, Any]]) -> RequestColumns:
    """Columns of events that passed :func:`event_problems` (the scalar path)."""
    n = len(rows)

    def objects(name: str) -> Any:
        out = np.empty(n, dtype=object)
        out[:] = [row[name] for row in rows]
        return out

    def floats(name: str) -> Any:
        return np.array([row.get(name) for row in rows], dtype=np.float64)  # None -> NaN

    def ints(name: str) -> Any:  # int(): 12.0 -> 12; an absent optional batch field is 0
        return np.array([int(row.get(name) or 0) for row in rows], dtype=np.int64)

    cuda_error = np.empty(n, dtype=object)
    cuda_error[:] = [int(x) if type(x) is float else x for x in (row.get("cuda_error") for row in rows)]
    return RequestColumns(
        request_id=objects("request_id"),
        ts=floats("ts"),
        model=objects("model"),
        replica=objects("replica"),
        latency_ms=floats("latency_ms"),
        prompt_tokens=ints("prompt_tokens"),
        completion_tokens=ints("completion_tokens"),
        batch_size=ints("batch_size"),
        batch_capacity=ints("batch_capacity"),
        ttft_ms=floats("ttft_ms"),
        queue_length=floats("queue_length"),
        kv_cache_hit_rate=floats("kv_cache_hit_rate"),
        is_error=np.array([row.get("status") == "error" for row in rows], dtype=np.bool_),
        cuda_error=cuda_error,
    )


# --- the typed fast path: msgspec validates while it parses, numpy takes whole columns -------------
# Why a second decoder: for a valid message, parsing to dicts and then scanning each column's types
# in Python costs ~3x more than letting msgspec check every type in C while it parses
# (bench/decode_bench.py). msgspec is strict (no bool for int, no 12.0 for int, no NaN), so it
# accepts a subset of what the contract accepts; anything it refuses takes the general path, which
# is the reference and words the reasons. Built from EVENT_FIELDS so the two cannot drift apart.
#
# The fast path is three functions: decode_typed_runs (a poll in runs, one C-level map each, no
# per-message Python), columns_from_typed_events (structs to columns: one C pass to tuples, one
# transpose, one struct pack or np.fromiter per field) and _finish_typed (the numbers' ranges on
# the columns, and the one rule msgspec cannot state).

def _typed_field(spec: FieldSpec, max_tokens: int) -> Any:
    typed: Any
    if spec.kind == "string":
        typed = Annotated[str, msgspec.Meta(min_length=1)]
    elif spec.kind == "number":
        # No range here: msgspec's float constraints cost ~40 ns per event, the same checks on the
        # poll's columns a few ns (_numbers_out_of_range). msgspec refuses non-finite numbers itself.
        typed = float
    elif spec.kind == "integer":
        high = max_tokens if spec.tokens else INT64_LIMIT - 1
        typed = Annotated[int, msgspec.Meta(ge=int(spec.minimum), le=high)]
    elif spec.kind == "status":
        typed = Literal["ok", "error"]
    else:  # cuda_error
        typed = Annotated[str, msgspec.Meta(min_length=1)] | Annotated[int, msgspec.Meta(ge=0, le=INT64_LIMIT - 1)]
    return typed if spec.required else typed | None


# The default of an absent optional number: the float64 column's "not reported" (this very object,
# so that _typed_as_event can tell it from a sent value; JSON cannot send NaN).
_ABSENT_NUMBER: Final = float("nan")


def _typed_default(spec: FieldSpec) -> Any:
    """An absent batch field is 0 (the int64 column's "unknown", never a valid value: minimum 1), an
    absent number NaN (the float64 column's), so that a column of absent values packs as it is."""
    if spec.name in BATCH_FIELDS:
        return 0
    return _ABSENT_NUMBER if spec.kind in ("number", "integer") else None


def _typed_event_fields(max_tokens: int) -> list[Any]:
    """msgspec field rows, in EVENT_FIELDS order then ``v``."""
    fields: list[Any] = [(f.name, _typed_field(f, max_tokens)) for f in EVENT_FIELDS if f.required]
    fields += [(f.name, _typed_field(f, max_tokens), _typed_default(f)) for f in EVENT_FIELDS if not f.required]
    fields.append(("v", Literal[1] | None, None))
    return fields


@dataclass(frozen=True, slots=True)
class TypedDecoders:
    """The msgspec decoders for one token limit."""

    batch: msgspec.json.Decoder[Any]  # {"events": [...], "v": 1}
    single: msgspec.json.Decoder[Any]  # one event object; refuses any "events" key (the batch form)


@functools.lru_cache(maxsize=8)
def typed_decoders(max_tokens: int) -> TypedDecoders:
    fields = _typed_event_fields(max_tokens)
    event = msgspec.defstruct("TypedRequestEvent", fields, gc=False)
    # A single-event message with an "events" key is the batch form: UnsetType refuses any value,
    # null included, so such a message never decodes as one event.
    single = msgspec.defstruct("TypedSingleRequestEvent",
                               [*fields, ("events", msgspec.UnsetType, msgspec.UNSET)], gc=False)
    batch = msgspec.defstruct("TypedRequestBatch", [("events", list[event]),  # type: ignore[valid-type]
                                                    ("v", Literal[1] | None, None)], gc=False)
    return TypedDecoders(msgspec.json.Decoder(batch), msgspec.json.Decoder(single))


# Position of each field in msgspec.structs.astuple(event) (both event structs start alike).
_TYPED_AT: Final = {name: i for i, (name, *_) in enumerate(_typed_event_fields(0))}


@functools.lru_cache(maxsize=256)  # polls of a steady stream have a few sizes; others are rebuilt (~1 µs)
def _packer(code: str, n: int) -> struct.Struct:
    return struct.Struct(f"{n}{code}")


def _packed(values: tuple[Any, ...], n: int, code: str, dtype: type[np.generic], writable: bool) -> Any:
    """``values`` as a numpy array through struct's C packer, ~3x faster per value than
    np.fromiter; None when one value does not pack (a None: an explicit null). Read-only unless
    ``writable`` (a copy): the chunks of a large poll are concatenated, which copies them anyway."""
    try:
        packed = _packer(code, n).pack(*values)
    except struct.error:
        return None
    array = np.frombuffer(packed, dtype=dtype)
    return array.copy() if writable else array


# Below this many values np.fromiter wins: packing has ~1 µs more fixed cost per column (bench/decode_bench.py)
_PACK_MIN_VALUES: Final = 32


def _float_column(values: tuple[Any, ...], n: int, writable: bool = True) -> FloatArray:
    if n < _PACK_MIN_VALUES:
        try:
            return np.fromiter(values, dtype=np.float64, count=n)
        except TypeError:  # an explicit null: np.array makes it NaN
            return np.array(values, dtype=np.float64)
    if type(values[0]) is int:  # an integer field (queue_length): packing ints as "d" is 3x slower
        ints: IntArray | None = _packed(values, n, "q", np.int64, False)
        if ints is not None:
            return ints.astype(np.float64)
    column: FloatArray | None = _packed(values, n, "d", np.float64, writable)
    # an explicit null (absent values are NaN already): np.array makes it NaN
    return np.array(values, dtype=np.float64) if column is None else column


def _int_column(values: tuple[Any, ...], n: int, writable: bool = True) -> IntArray:
    column: IntArray | None = None
    if n >= _PACK_MIN_VALUES:
        column = _packed(values, n, "q", np.int64, writable)
    else:
        try:  # noqa: SIM105  # contextlib.suppress costs ~1 µs per call, per column of a small decode
            column = np.fromiter(values, dtype=np.int64, count=n)
        except TypeError:  # an explicit null
            pass
    if column is None:  # an explicit null batch field: unknown, 0 like an absent one
        return np.fromiter((0 if x is None else x for x in values), dtype=np.int64, count=n)
    return column


def _optional_object_column(values: tuple[Any, ...], n: int) -> ObjArray:
    # count(None) is ~1 ns per None (identity), but ~15 ns per string (str == None): optional fields only
    if values.count(None) == n:  # the field nobody sent (cuda_error, mostly)
        return np.empty(n, dtype=object)  # None-filled
    return np.fromiter(values, dtype=object, count=n)


_FEW_ERRORS: Final = 16  # up to this many failed requests in a chunk, find them by C scans (tuple.index)


def _error_column(status: tuple[Any, ...], n: int) -> BoolArray:
    """status == "error" per row. Failed requests are usually few: count them (a C scan), then find
    each with tuple.index (C scans again); comparing every row costs ~3x more."""
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


# Events per transpose: bounds the row tuples alive at once (~1 MB per 8,192 events).
_TRANSPOSE_CHUNK: Final = 8192


def columns_from_typed_events(events: list[Any]) -> tuple[RequestColumns, BoolArray]:
    """Columns of msgspec-validated events, and the rows whose batch_size > batch_capacity (both
    present). Per event only C runs: astuple, the zip transpose, then struct's packer per number
    field and np.fromiter per object field.

    The cyclic GC is paused meanwhile: the transpose makes a tuple per event (and per field), none in
    a cycle and all freed by the end, and the collector would otherwise scan the growing young
    generation over and over and promote them (earlier this was avoided with 512-event chunks;
    pausing instead measured 323 against 422 ns per event on a 3,800-event poll)."""
    with gc_paused():
        n = len(events)
        if n <= _TRANSPOSE_CHUNK:
            return _columns_of_chunk(events, writable=True)
        parts = [_columns_of_chunk(events[i:i + _TRANSPOSE_CHUNK], writable=False)
                 for i in range(0, n, _TRANSPOSE_CHUNK)]
        return RequestColumns.concat([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _columns_of_chunk(events: list[Any], writable: bool) -> tuple[RequestColumns, BoolArray]:
    """Columns of up to _TRANSPOSE_CHUNK events; numbers may be read-only views unless ``writable``."""
    n = len(events)
    if n == 0:
        return RequestColumns.empty(), np.zeros(0, dtype=np.bool_)
    # not strict: a single-event struct has one more field, last (UNSET), which zip leaves out
    cols = list(zip(*map(msgspec.structs.astuple, events)))  # noqa: B905
    at = _TYPED_AT

    def floats(name: str) -> FloatArray:
        return _float_column(cols[at[name]], n, writable)

    def ints(name: str) -> IntArray:
        return _int_column(cols[at[name]], n, writable)

    def objects(name: str) -> ObjArray:
        return np.fromiter(cols[at[name]], dtype=object, count=n)

    columns = RequestColumns(
        request_id=objects("request_id"),
        ts=floats("ts"),
        model=objects("model"),
        replica=objects("replica"),
        latency_ms=floats("latency_ms"),
        prompt_tokens=ints("prompt_tokens"),
        completion_tokens=ints("completion_tokens"),
        batch_size=ints("batch_size"),
        batch_capacity=ints("batch_capacity"),
        ttft_ms=floats("ttft_ms"),
        queue_length=floats("queue_length"),  # an integer field, float64 with NaN for absent
        kv_cache_hit_rate=floats("kv_cache_hit_rate"),
        is_error=_error_column(cols[at["status"]], n),
        cuda_error=_optional_object_column(cols[at["cuda_error"]], n),
    )
    size, capacity = columns.batch_size, columns.batch_capacity
    return columns, (size > capacity) & (capacity > 0)


def _typed_as_event(event: Any) -> dict[str, Any]:
    """A typed event as the reference path would read it: absent fields (None, the numbers' NaN,
    the batch fields' 0, the single struct's UNSET) left out."""
    return {name: value for name, value in msgspec.structs.asdict(event).items()
            if value is not None and value is not msgspec.UNSET and value is not _ABSENT_NUMBER
            and not (name in BATCH_FIELDS and value == 0)}


_NUMBER_FIELDS: Final = tuple(f for f in EVENT_FIELDS if f.kind == "number")


def _numbers_out_of_range(columns: RequestColumns) -> BoolArray | None:
    """The rows with a number outside its field's range (None when there is none): the typed
    decoder leaves these ranges to this whole-poll check. Absent optional numbers are NaN, which
    fails every comparison, so they are never flagged; msgspec has refused non-finite numbers."""
    if len(columns) <= SCALAR_MAX_EVENTS:  # a few rows: numpy's fixed cost per operation dominates
        return _numbers_out_of_range_scalar(columns)
    bad: BoolArray | None = None
    for spec in _NUMBER_FIELDS:
        values = getattr(columns, spec.name)
        checks = [values < spec.minimum]
        if spec.exclusive_maximum is not None:
            checks.append(values >= spec.exclusive_maximum)
        if spec.maximum is not None:
            checks.append(values > spec.maximum)
        for check in checks:
            if bad is None:
                bad = check
            else:
                bad |= check
    return bad if bad is not None and np.count_nonzero(bad) else None


def _numbers_out_of_range_scalar(columns: RequestColumns) -> BoolArray | None:
    """:func:`_numbers_out_of_range` row by row, in Python (NaN fails every comparison here too)."""
    bad_rows: set[int] = set()
    for spec in _NUMBER_FIELDS:
        low, high, below = spec.minimum, spec.maximum, spec.exclusive_maximum
        for row, value in enumerate(getattr(columns, spec.name).tolist()):
            if value < low or (high is not None and value > high) or (below is not None and value >= below):
                bad_rows.add(row)
    if not bad_rows:
        return None
    bad = np.zeros(len(columns), dtype=np.bool_)
    bad[sorted(bad_rows)] = True
    return bad


def _finish_typed(events: list[Any], message_index: IntArray, batch_form: BoolArray, limits: InputLimits
                  ) -> tuple[RequestColumns, IntArray, list[tuple[int, Rejection]], list[int]]:
    """Columns of typed events (``message_index`` sorted: row -> message), less the rows the typed
    decoder could not judge:

    - a number out of range: its whole message is returned (ascending) for the general path to
      word, as it reads the value as sent (msgspec made a sent ``-3`` the float ``-3.0``);
    - batch_size over batch_capacity, the one rule a typed decoder cannot state: the reference words
      those (integers, exact as sent), returned as (message, rejection) pairs.
    """
    columns, over_capacity = columns_from_typed_events(events)
    dropped = over_capacity
    refused: list[int] = []
    out_of_range = _numbers_out_of_range(columns)
    if out_of_range is not None:
        refused = np.unique(message_index[out_of_range]).tolist()
        in_refused = np.isin(message_index, refused)
        over_capacity = over_capacity & ~in_refused
        dropped = over_capacity | in_refused
    rejections: list[tuple[int, Rejection]] = []
    if np.count_nonzero(over_capacity):  # a quarter of .any()'s fixed cost, paid per poll
        for i in np.flatnonzero(over_capacity).tolist():
            m = int(message_index[i])
            k = i - int(np.searchsorted(message_index, m))  # the event's position in its message
            problems = event_problems(_typed_as_event(events[i]), limits.max_tokens)
            rejections.append((m, _rejection(problems, f"events[{k}]." if batch_form[m] else "", k)))
    if refused or rejections:
        columns, message_index = columns.take(~dropped), message_index[~dropped]
    return columns, message_index, rejections, refused


_get_events = operator.attrgetter("events")


@dataclass(slots=True)
class TypedRuns:
    """What msgspec took from a poll: its events in message order, and the messages it left."""

    events: list[Any]  # typed structs
    message_index: IntArray  # row -> message, ascending
    batch_form: BoolArray  # per message of the poll: was it {"events": [...]}
    leftovers: list[int]  # messages for the per-message paths (refused, empty, or too large)
    maps: int  # C-level passes made: 1 for a clean poll, one more after each refused message


def decode_typed_runs(values: Sequence[bytes | None], limits: InputLimits) -> TypedRuns:
    """The poll through msgspec in runs of consecutive messages, each run one C-level ``map`` with
    no per-message Python. A message msgspec refuses ends a run: it is tried alone with the other
    form's decoder, else left to the per-message paths (which word its reasons), and the next run
    goes on after it, so one bad message costs the poll one more pass, not its speed."""
    values = values if isinstance(values, list) else list(values)
    n = len(values)
    decoders = typed_decoders(limits.max_tokens)
    batch_form = np.zeros(n, dtype=np.bool_)
    try:
        longest = max(map(len, values), default=0)
    except TypeError:  # a None among them (filtering them out costs ~20 % more, so only then)
        longest = max(map(len, filter(None, values)), default=0)
    if longest > limits.max_message_bytes:
        return TypedRuns([], np.zeros(0, dtype=np.int64), batch_form, list(range(n)), 0)  # rare: all alone
    events: list[Any] = []
    index_parts: list[IntArray] = []
    leftovers: list[int] = []
    maps = 0

    def take(decoded: list[Any], start: int, is_batch: bool) -> None:
        """Keep the decoded messages ``start``.. (a batch over the event limit is left alone)."""
        if not is_batch:
            events.extend(decoded)
            index_parts.append(np.arange(start, start + len(decoded)))
            return
        batches = list(map(_get_events, decoded))
        counts = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        if counts.max() > limits.max_events_per_message:
            for i in np.flatnonzero(counts > limits.max_events_per_message).tolist():
                leftovers.append(start + i)  # the general path words too_many_events
                batches[i] = []
                counts[i] = 0
        events.extend(chain.from_iterable(batches))
        index_parts.append(np.repeat(np.arange(start, start + len(batches)), counts))
        batch_form[start:start + len(batches)] = True

    remaining = iter(values)  # shared by the runs: each goes on where the last one stopped
    position = 0
    while position < n:
        is_batch = _is_batch_form(values[position])
        decode = decoders.batch.decode if is_batch else decoders.single.decode
        run: list[Any] = []
        maps += 1
        try:
            run.extend(map(decode, remaining))  # type: ignore[arg-type]  # None raises, as wanted
            refused = n
        except Exception:  # msgspec's errors, None: the message the map had just taken
            refused = n - operator.length_hint(remaining) - 1
            if len(run) != refused - position:  # list.extend kept no partial result: decode them again
                run = list(map(decode, values[position:refused]))  # (no None among them)
        if run:
            take(run, position, is_batch)
        if refused < n:
            value = values[refused]
            alone = _decode_alone(value, decoders) if _is_batch_form(value) != is_batch else None
            if alone is None:
                leftovers.append(refused)
            else:
                take([alone], refused, not is_batch)
        position = refused + 1
    message_index = (index_parts[0] if len(index_parts) == 1 else np.concatenate(index_parts) if index_parts
                     else np.zeros(0, dtype=np.int64))
    if len(leftovers) > 1:
        leftovers.sort()
    return TypedRuns(events, message_index, batch_form, leftovers, maps)


def _is_batch_form(value: bytes | None) -> bool:
    return value is not None and b'"events"' in value


def _decode_alone(value: bytes | None, decoders: TypedDecoders) -> Any | None:
    """One message with the decoder of its form, or None when msgspec refuses it."""
    try:
        return (decoders.batch if _is_batch_form(value) else decoders.single).decode(value)  # type: ignore[arg-type]
    except Exception:
        return None


# --- message envelope -------------------------------------------------------------------------------

def _json_kind(doc: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", _NoneType: "null"}
    return names.get(type(doc), type(doc).__name__)


def _decode_dicts(values: Sequence[bytes | None], message_ids: Sequence[int], limits: InputLimits,
                  rejects: defaultdict[int, list[Rejection]]) -> tuple[RequestColumns, IntArray]:
    """The general path: orjson (stdlib for NaN/inf) to dicts, then the column checks; appends each
    message's rejections to ``rejects[m]``; returns the valid events and their message index."""
    events: list[dict[str, Any]] = []
    row_message: list[int] = []
    row_event: list[int] = []
    batch_form: dict[int, bool] = {}
    for m in message_ids:
        value = values[m]
        batch_form[m] = False
        if value is None:  # the caller rejected empty values already; only for the type checker
            continue
        doc, rejection = parse_json(value)
        if rejection is not None:
            rejects[m].append(rejection)
            continue
        if type(doc) is not dict:
            rejects[m].append(Rejection.message_level(
                "not_an_object",
                f'message must be an event object or {{"events": [...]}}, got {_json_kind(doc)}'))
            continue
        if "events" in doc:
            batch_form[m] = True
            version = doc.get("v")
            problem = None if version is None else check_version("v", version)
            if problem is not None:
                rejects[m].append(Rejection.message_level(*problem))
                continue
            batch = doc["events"]
            if type(batch) is not list:
                rejects[m].append(Rejection.message_level(
                    "wrong_type", f"events: must be an array of event objects, got {show_value(batch)}"))
                continue
            if len(batch) > limits.max_events_per_message:
                rejects[m].append(Rejection.message_level(
                    "too_many_events", f"events: {len(batch)} events > limit {limits.max_events_per_message} "
                                       "(limits.max_events_per_message)"))
                continue
        else:
            batch = [doc]
        if set(map(type, batch)) <= {dict}:
            events.extend(batch)
            row_message.extend([m] * len(batch))
            row_event.extend(range(len(batch)))
            continue
        for k, event in enumerate(batch):
            if type(event) is dict:
                events.append(event)
                row_message.append(m)
                row_event.append(k)
            else:
                rejects[m].append(Rejection(
                    "not_an_object", f"events[{k}]: must be an event object, got {show_value(event)}", k))

    if not events:
        return RequestColumns.empty(), np.zeros(0, dtype=np.int64)
    message_index = np.array(row_message, dtype=np.int64)
    bad_rows: list[tuple[int, list[Problem]]] = []
    if len(events) <= SCALAR_MAX_EVENTS:
        # A few events: numpy's fixed per-array cost (~14 columns x several ops) exceeds checking
        # each event in Python, so validate row by row and build the columns from the good rows.
        problems_by_row = [event_problems(event, limits.max_tokens) for event in events]
        bad_rows = [(i, problems) for i, problems in enumerate(problems_by_row) if problems]
        columns = _columns_from_valid_rows([e for e, p in zip(events, problems_by_row, strict=True) if not p])
        if bad_rows:
            message_index = message_index[[not p for p in problems_by_row]]
    else:
        columns, bad = _validate_columns(events, limits.max_tokens)
        if bad.any():
            for i in np.flatnonzero(bad).tolist():
                problems = event_problems(events[i], limits.max_tokens)
                if not problems:  # the vectorised and scalar checks disagree: a decoder bug, never silent
                    problems = [("wrong_type", "event failed validation for a reason the decoder cannot "
                                               "word (decoder inconsistency; please report)")]
                bad_rows.append((i, problems))
            columns = columns.take(~bad)
            message_index = message_index[~bad]
    for i, problems in bad_rows:
        m, k = row_message[i], row_event[i]
        rejects[m].append(_rejection(problems, f"events[{k}]." if batch_form[m] else "", k))
    if bad_rows:
        for message_rejects in rejects.values():  # not_an_object elements were listed first: event order
            if len(message_rejects) > 1:
                message_rejects.sort(key=lambda r: -1 if r.event_index is None else r.event_index)
    return columns, message_index


def decode_request_messages(values: Sequence[bytes | None], limits: InputLimits, *,
                            typed_fast_path: bool = True) -> DecodedMessages:
    """Decode many ``llm.requests`` values (e.g. one poll of a partition) in one vectorised pass.

    Single-event messages are cheap this way: the per-column numpy cost is paid once per poll,
    not once per message, and msgspec takes the poll in runs of messages with no per-message
    Python (:func:`decode_typed_runs`). Never raises on any input. ``typed_fast_path=False``
    skips msgspec: every message takes the general path (tests check both give the same result).
    """
    rejects: defaultdict[int, list[Rejection]] = defaultdict(list)  # only the rejected messages
    parts: list[tuple[RequestColumns, IntArray]] = []
    leftovers: Iterable[int] = range(len(values))
    if typed_fast_path:
        runs = decode_typed_runs(values, limits)
        leftovers = runs.leftovers
        if runs.events:
            columns, message_index, rejections, refused = _finish_typed(runs.events, runs.message_index,
                                                                        runs.batch_form, limits)
            for m, rejection in rejections:
                rejects[m].append(rejection)
            if len(message_index) or not refused:
                parts.append((columns, message_index))
            if refused:  # messages with a number out of range: the general path words them
                leftovers = sorted([*leftovers, *refused])
    general: list[int] = []
    for m in leftovers:
        value = values[m]
        if value is None or len(value) == 0:
            rejects[m].append(Rejection.message_level("empty", "value is null or zero bytes"))
        elif len(value) > limits.max_message_bytes:
            rejects[m].append(Rejection.message_level(
                "too_large", f"value is {len(value)} bytes > limit {limits.max_message_bytes} "
                             "(limits.max_message_bytes)"))
        else:
            general.append(m)
    if general:
        general_part = _decode_dicts(values, general, limits, rejects)
        if len(general_part[1]) or not parts:  # rows to merge; a dead-lettered message adds none
            parts.append(general_part)
    by_message = MessageRejects(len(values), rejects)
    if not parts:
        return DecodedMessages(RequestColumns.empty(), np.zeros(0, dtype=np.int64), by_message)
    if len(parts) == 1:
        return DecodedMessages(parts[0][0], parts[0][1], by_message)
    columns = RequestColumns.concat([p[0] for p in parts])
    message_index = np.concatenate([p[1] for p in parts])
    order = np.argsort(message_index, kind="stable")  # back to input order, events in message order
    return DecodedMessages(columns.take(order), message_index[order], by_message)


def decode_request_message(value: bytes | None, limits: InputLimits) -> DecodedMessage:
    """Decode one ``llm.requests`` value: the valid events as columns plus every rejection.

    Never raises. A message-level rejection (event_index None) means no event was decoded.
    """
    decoded = decode_request_messages([value], limits)
    return DecodedMessage(decoded.columns, decoded.rejects[0])


# --- producers ----------------------------------------------------------------------------------

_ENCODE_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY


def encode_request_event(event: Mapping[str, Any]) -> bytes:
    """One event as an ``llm.requests`` value (single-event form). Does not validate: see
    :func:`check_request_event`. NaN is written as null (then read back as "not reported").

    >>> encode_request_event({"request_id": "a", "latency_ms": 1.5})
    b'{"request_id":"a","latency_ms":1.5}'
    """
    return orjson.dumps(event, option=_ENCODE_OPTIONS)


def encode_request_events(events: Sequence[Mapping[str, Any]]) -> bytes:
    """Many events as one ``llm.requests`` value (batch form ``{"v": 1, "events": [...]}``).

    >>> encode_request_events([{"request_id": "a"}])
    b'{"v":1,"events":[{"request_id":"a"}]}'
    """
    return orjson.dumps({"v": REQUEST_SCHEMA_VERSION, "events": list(events)}, option=_ENCODE_OPTIONS)


__all__ = [
    "EVENT_FIELDS",
    "REQUEST_SCHEMA_VERSION",
    "REQUIRED_FIELDS",
    "DecodedMessage",
    "DecodedMessages",
    "MessageRejects",
    "TypedRuns",
    "Rejection",
    "check_request_event",
    "decode_request_message",
    "decode_request_messages",
    "decode_typed_runs",
    "encode_request_event",
    "encode_request_events",
    "event_problems",
]
