"""Why an input was rejected: a stable reason code plus a sentence a person can act on.

Every rejected input goes to ``llm.dead-letter`` with a reason and is counted as
``skewwatch_rejected_total{reason=<reason_code>}``. The codes below are that label's only values, so
dashboards and alerts can rely on them; the ``reason`` text names the field and the offending value
("events[4].batch_size: 40 > batch_capacity 32").

>>> r = Rejection("out_of_range", "latency_ms: must be ≥ 0, got -3", event_index=0)
>>> r.to_dict()["reason_code"], r.is_message_level
('out_of_range', False)
>>> Rejection.message_level("empty", "value is empty").event_index is None
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

# Stable label values of skewwatch_rejected_total{reason=...}; never rename, only add.
REASON_CODES: tuple[str, ...] = (
    "empty",  # the Kafka value is null (tombstone), zero bytes or only whitespace
    "too_large",  # the value is larger than limits.max_message_bytes
    "malformed_json",  # not JSON, or not valid UTF-8
    "not_an_object",  # the message (or an element of "events") is not a JSON object
    "too_many_events",  # a batch holds more than limits.max_events_per_message events
    "unsupported_version",  # "v" names a schema version this decoder does not know
    "missing_field",  # a required field is absent or null
    "wrong_type",  # a field has the wrong JSON type (true for an int, "12" for a number, 12.5 for an int)
    "out_of_range",  # negative, non-finite (NaN/inf), outside 0..1, empty string, unknown enum value
    "too_many_tokens",  # prompt/completion tokens above limits.max_tokens
    "batch_over_capacity",  # batch_size > batch_capacity (both present)
    "malformed_otlp",  # an OTLP record/body that is not an ExportTraceServiceRequest (skewwatch.otlp)
)

_SHOW_MAX_CHARS = 64  # reasons quote the offending value, but never a whole megabyte of it


def show_value(value: Any) -> str:
    """The offending value as JSON text for a reason, shortened; NaN and infinities by name.

    >>> show_value(-3), show_value("fail"), show_value(float("inf")), show_value(True)
    ('-3', '"fail"', 'inf', 'true')
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    try:
        text = orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # e.g. an int beyond 64 bits: fall back to repr
        text = repr(value)
    if len(text) > _SHOW_MAX_CHARS:
        text = text[: _SHOW_MAX_CHARS - 1] + "…"
    return text


@dataclass(frozen=True, slots=True)
class Rejection:
    """One rejected input. ``event_index`` is None when the whole message was rejected
    (it could not be parsed, or its envelope is wrong), else the position of the event in
    the message (0 for a single-event message)."""

    reason_code: str  # one of REASON_CODES
    reason: str  # actionable text naming the field and the value
    event_index: int | None = None

    @classmethod
    def message_level(cls, reason_code: str, reason: str) -> Rejection:
        return cls(reason_code, reason, None)

    @property
    def is_message_level(self) -> bool:
        return self.event_index is None

    def to_dict(self) -> dict[str, Any]:
        return {"reason_code": self.reason_code, "reason": self.reason, "event_index": self.event_index}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rejection:
        return cls(str(data["reason_code"]), str(data["reason"]), data.get("event_index"))
