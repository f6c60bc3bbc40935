"""The general path: messages parsed to dicts (orjson; the stdlib for NaN/inf), then checked as columns.

It takes every message the typed path refused, and is the reference the typed path must match:
message-level problems (not an object, a bad ``v``, ``events`` not an array, too many events) reject
the message; each event is then judged alone, a few row by row with the rules, more column by column
(``column_checks.py``), and per-event Python runs only to word the reasons of the bad rows.

>>> from collections import defaultdict
>>> from skewwatch.schemas.limits import DEFAULT_LIMITS
>>> rejects = defaultdict(list)
>>> columns, index = decode_dicts([b'[1]', b'{"events": 3}'], [0, 1], DEFAULT_LIMITS, rejects)
>>> len(columns), [rejects[m][0].reason_code for m in (0, 1)]
(0, ['not_an_object', 'wrong_type'])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from skewwatch.schemas.fields import Problem, check_version, parse_json
from skewwatch.schemas.limits import InputLimits
from skewwatch.schemas.rejection import Rejection, show_value
from skewwatch.schemas.requests.column_checks import validate_columns
from skewwatch.schemas.requests.columns import IntArray, RequestColumns
from skewwatch.schemas.requests.rules import SCALAR_MAX_EVENTS, event_problems, event_rejection

_NoneType = type(None)



def _json_kind(doc: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", _NoneType: "null"}
    return names.get(type(doc), type(doc).__name__)


def decode_dicts(values: Sequence[bytes | None], message_ids: Sequence[int], limits: InputLimits,
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
        columns = RequestColumns.from_rows([e for e, p in zip(events, problems_by_row, strict=True) if not p])
        if bad_rows:
            message_index = message_index[[not p for p in problems_by_row]]
    else:
        columns, bad = validate_columns(events, limits.max_tokens)
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
        rejects[m].append(event_rejection(problems, f"events[{k}]." if batch_form[m] else "", k))
    if bad_rows:
        for message_rejects in rejects.values():  # not_an_object elements were listed first: event order
            if len(message_rejects) > 1:
                message_rejects.sort(key=lambda r: -1 if r.event_index is None else r.event_index)
    return columns, message_index
