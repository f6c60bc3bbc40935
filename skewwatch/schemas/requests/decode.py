"""Decode ``llm.requests`` values into columns: the decoder's entry points.

A poll goes through the typed path first (``typed_path.py``); what it refuses or leaves (empty,
too large, malformed, a number out of range) goes through the general path (``dict_path.py``), and
the two parts are merged back into input order. Never raises on any input.

>>> from skewwatch.schemas.limits import DEFAULT_LIMITS
>>> decoded = decode_request_messages([b"", b'{"request_id": "a"}'], DEFAULT_LIMITS)
>>> len(decoded.columns), [[r.reason_code for r in rs] for rs in decoded.rejects]
(0, [['empty'], ['missing_field']])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from skewwatch.schemas.limits import InputLimits
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests.columns import IntArray, RequestColumns
from skewwatch.schemas.requests.dict_path import decode_dicts
from skewwatch.schemas.requests.results import DecodedMessage, DecodedMessages, MessageRejects
from skewwatch.schemas.requests.typed_path import decode_typed_runs, finish_typed


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
            columns, message_index, rejections, refused = finish_typed(runs.events, runs.message_index,
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
        general_part = decode_dicts(values, general, limits, rejects)
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

