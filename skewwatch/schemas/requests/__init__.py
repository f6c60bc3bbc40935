"""Contract ``request-message.v1`` (``llm.requests``): decode messages into columns, fast and safely.

A message is one event object or ``{"events": [...]}`` (optionally with ``"v": 1``); every malformed
message or event is rejected with a stable reason code and a sentence naming the field and the value,
the valid events of the same batch are still decoded, and no input ever raises. The hot path pays no
per-event Python cost, so a message goes down one of two paths:

- typed (fast, ``typed_path.py``): msgspec parses straight into structs generated from the field
  specification (``structs.py``), checking every type and every integer and string range in C; a poll
  goes in runs of messages, each run one C-level ``map``, and the structs become columns with C passes
  only (``packing.py``); the numbers' ranges are checked on the poll's columns. It is strict, so it
  accepts a subset of the contract (no 12.0 for an int): anything it refuses takes the other path;
- general (the reference, ``dict_path.py``): parsed by orjson and each field checked as one numpy
  column (``column_checks.py``); per-event Python (``rules.py``) only words the reasons of the bad rows.

Both give the same result for any input (tests/unit/test_decode_requests.py checks it on generated
valid and invalid polls). The fields are defined once, in ``spec.py``; the columns they become are
:class:`~skewwatch.schemas.requests.columns.RequestColumns`; ``decode.py`` and ``encode.py`` are the
entry points, ``results.py`` what decoding returns.

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

from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.requests.decode import decode_request_message, decode_request_messages
from skewwatch.schemas.requests.encode import encode_request_event, encode_request_events
from skewwatch.schemas.requests.results import DecodedMessage, DecodedMessages, MessageRejects
from skewwatch.schemas.requests.rules import check_request_event, event_problems
from skewwatch.schemas.requests.spec import REQUEST_FIELDS, REQUEST_SCHEMA_VERSION, REQUIRED_FIELDS

__all__ = [
    "REQUEST_FIELDS",
    "REQUEST_SCHEMA_VERSION",
    "REQUIRED_FIELDS",
    "DecodedMessage",
    "DecodedMessages",
    "MessageRejects",
    "Rejection",
    "RequestColumns",
    "check_request_event",
    "decode_request_message",
    "decode_request_messages",
    "encode_request_event",
    "encode_request_events",
    "event_problems",
]
