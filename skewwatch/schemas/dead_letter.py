"""``llm.dead-letter`` records (contract dead-letter.v1): the rejected message, untouched, and why.

Every rejected message goes to the dead-letter topic with its original bytes, its
topic/partition/offset, and a reason a person can act on. One record per input message that had at
least one rejection; the original value is kept whole (valid events included), so a fixed copy can
be replayed (docs/design.md, "Nothing lost on bad input").

Size policy (docs/contracts.md): base64 grows bytes by 4/3, so even a valid-sized 1 MiB request
message does not fit a default (1 MiB) topic once wrapped. The original value is kept whole up to
``DEAD_LETTER_MAX_VALUE_BYTES`` (4 MiB: what ``llm.requests`` itself accepts, 4 x the 1 MiB
request limit, so every message the broker took is kept whole, too_large ones included); longer
values keep their first 4 MiB with ``value_truncated: true``; keys are capped at 64 KiB the same
way; at most 100 rejections are listed (``rejects_total`` counts all, ``rejects_by_code`` sums
the rest). A record is then at most ~5.6 MiB: the dead-letter topic is created with
``max.message.bytes = DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES`` (8 MiB) and its producer needs
``max_request_size`` at least that.

>>> from skewwatch.schemas.rejection import Rejection
>>> record = dead_letter_record(source_topic="llm.requests", partition=3, offset=42, key=b"r1",
...     value=b'{"latency_ms": -3}', ts=1.7e9,
...     rejects=[Rejection("out_of_range", "latency_ms: must be ≥ 0, got -3", 0)])
>>> decoded = decode_dead_letter(record)
>>> decoded["value"], decoded["rejects"][0]["reason_code"], decoded["offset"]
(b'{"latency_ms": -3}', 'out_of_range', 42)
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from skewwatch.schemas.rejection import Rejection

DEAD_LETTER_SCHEMA_VERSION: Final = 1
DEAD_LETTER_MAX_VALUE_BYTES: Final = 4 << 20  # original values kept whole up to 4 MiB (llm.requests' max)
DEAD_LETTER_MAX_KEY_BYTES: Final = 64 << 10
DEAD_LETTER_MAX_REJECTS: Final = 100
DEAD_LETTER_MAX_REASON_CHARS: Final = 1000
DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES: Final = 8 << 20  # the topic's max.message.bytes (> 4/3 x 4 MiB + rest)


def _b64(data: bytes | None, cap: int) -> tuple[str | None, bool]:
    if data is None:
        return None, False
    truncated = len(data) > cap
    return base64.b64encode(data[:cap] if truncated else data).decode("ascii"), truncated


def dead_letter_record(*, source_topic: str, partition: int, offset: int, key: bytes | None,
                       value: bytes | None, rejects: Sequence[Rejection], ts: float,
                       max_value_bytes: int = DEAD_LETTER_MAX_VALUE_BYTES,
                       origin: Mapping[str, Any] | None = None) -> bytes:
    """The ``llm.dead-letter`` value for one rejected input message (``rejects`` non-empty).

    ``ts`` is the wall-clock time of the rejection (epoch seconds). Produce it with the original
    key so a replica's rejects stay together. ``origin`` (optional, additive to v1) describes an
    input that was not read from Kafka, e.g. an OTLP/HTTP request the receiver refused: then
    ``source_topic`` names the endpoint and ``partition`` / ``offset`` are 0.
    """
    key_b64, key_truncated = _b64(key, DEAD_LETTER_MAX_KEY_BYTES)
    value_b64, value_truncated = _b64(value, max_value_bytes)
    listed = [
        {"reason_code": r.reason_code, "reason": r.reason[:DEAD_LETTER_MAX_REASON_CHARS],
         "event_index": r.event_index}
        for r in rejects[:DEAD_LETTER_MAX_REJECTS]
    ]
    record: dict[str, Any] = {
        "v": DEAD_LETTER_SCHEMA_VERSION,
        "source_topic": source_topic,
        "partition": partition,
        "offset": offset,
        "key_b64": key_b64,
        "value_b64": value_b64,
        "value_bytes": 0 if value is None else len(value),
        "value_truncated": value_truncated,
        "rejects": listed,
        "rejects_total": len(rejects),
        "rejected_at": ts,
    }
    if key_truncated:
        record["key_truncated"] = True
    if origin is not None:
        record["origin"] = dict(origin)
    if len(rejects) > len(listed):  # what the unlisted ones were, by code
        record["rejects_by_code"] = dict(Counter(r.reason_code for r in rejects))
    return orjson.dumps(record)


def decode_dead_letter(record: bytes) -> dict[str, Any]:
    """A dead-letter record as a dict: the wire fields plus ``key`` and ``value`` as bytes (or None).

    Raises ValueError when the record is not a dead-letter.v1 object.
    """
    data = orjson.loads(record)
    if not isinstance(data, dict) or data.get("v") != DEAD_LETTER_SCHEMA_VERSION:
        raise ValueError("not a dead-letter.v1 record")
    try:
        for name in ("key", "value"):
            encoded = data.get(f"{name}_b64")
            data[name] = None if encoded is None else base64.b64decode(encoded, validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise ValueError(f"dead-letter record: bad base64: {exc}") from exc
    return data


def rejections_of(record: dict[str, Any]) -> list[Rejection]:
    """The listed rejections of a decoded dead-letter record, as Rejection objects."""
    return [Rejection.from_dict(r) for r in record.get("rejects", [])]


__all__ = [
    "DEAD_LETTER_MAX_VALUE_BYTES",
    "DEAD_LETTER_SCHEMA_VERSION",
    "DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES",
    "dead_letter_record",
    "decode_dead_letter",
    "rejections_of",
]
