"""The fast path: a poll through msgspec in runs of messages, then the checks msgspec leaves to the poll.

:func:`decode_typed_runs` takes a poll in runs, each run one C-level ``map`` with no per-message
Python (a clean poll is one run; a refused message ends a run and the next goes on after it).
:func:`finish_typed` turns the structs into columns (``packing.py``) and applies what the structs do
not state: the numbers' ranges, checked on the poll's columns (a few numpy operations per poll instead
of a check per event in msgspec), and batch_size ≤ batch_capacity. A message with a number out of
range goes to the general path, which words it.

>>> from skewwatch.schemas.limits import DEFAULT_LIMITS
>>> runs = decode_typed_runs([b'{"request_id": "a"}', b"{oops"], DEFAULT_LIMITS)
>>> len(runs.events), runs.leftovers
(0, [0, 1])
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final

import numpy as np

from skewwatch.schemas.limits import InputLimits
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests.columns import BoolArray, IntArray, RequestColumns
from skewwatch.schemas.requests.packing import columns_from_typed_events
from skewwatch.schemas.requests.rules import SCALAR_MAX_EVENTS, event_problems, event_rejection
from skewwatch.schemas.requests.spec import REQUEST_FIELDS
from skewwatch.schemas.requests.structs import TypedDecoders, typed_as_event, typed_decoders

_NUMBER_FIELDS: Final = tuple(f for f in REQUEST_FIELDS if f.kind == "number")


def _numbers_out_of_range(columns: RequestColumns) -> BoolArray | None:
    """The rows with a number outside its field's range (None when there is none): the typed
    decoder leaves these ranges to this whole-poll check. Absent optional numbers are NaN, which
    fails every comparison, so they are never flagged; msgspec has refused non-finite numbers."""
    if len(columns) <= SCALAR_MAX_EVENTS:  # a few rows: numpy's fixed cost per operation dominates
        return _numbers_out_of_range_scalar(columns)
    bad: BoolArray | None = None
    for spec in _NUMBER_FIELDS:
        values = getattr(columns, spec.column_name)
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
        for row, value in enumerate(getattr(columns, spec.column_name).tolist()):
            if value < low or (high is not None and value > high) or (below is not None and value >= below):
                bad_rows.add(row)
    if not bad_rows:
        return None
    bad = np.zeros(len(columns), dtype=np.bool_)
    bad[sorted(bad_rows)] = True
    return bad


def finish_typed(events: list[Any], message_index: IntArray, batch_form: BoolArray, limits: InputLimits
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
            problems = event_problems(typed_as_event(events[i]), limits.max_tokens)
            rejections.append((m, event_rejection(problems, f"events[{k}]." if batch_form[m] else "", k)))
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
    except TypeError:  # a None among them (rare; filtering them out costs more, so only then)
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
