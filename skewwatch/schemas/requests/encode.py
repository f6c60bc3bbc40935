"""Encode request events as ``llm.requests`` values (for producers; the decoder's inverse).

Encoding does not validate: :func:`~skewwatch.schemas.requests.rules.check_request_event` does,
at the producer's call site.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from skewwatch.schemas.requests.spec import REQUEST_SCHEMA_VERSION

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

