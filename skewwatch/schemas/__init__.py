"""The wire contracts: versioned JSON Schema files and the Python code that decodes/encodes them.

Every topic's record is described by a JSON Schema (draft 2020-12) shipped in this package, and
decoded by the module beside it; nothing here imports the engine (docs/design.md, "Pure pipeline,
thin agents, contracts at the bottom"). docs/contracts.md documents every field.

>>> sorted(SCHEMA_FILES)[:2]
['dead-letter.v1', 'features.v1']
>>> load_schema("request-event.v1")["$id"]
'urn:skewwatch:schema:request-event:v1'
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from skewwatch.schemas.alerts import decode_alert, encode_alert
from skewwatch.schemas.corrections import decode_correction, encode_correction
from skewwatch.schemas.dead_letter import dead_letter_record, decode_dead_letter
from skewwatch.schemas.features import decode_features, encode_features
from skewwatch.schemas.rejection import REASON_CODES, Rejection
from skewwatch.schemas.requests import (
    DecodedMessage,
    DecodedMessages,
    check_request_event,
    decode_request_message,
    decode_request_messages,
    encode_request_event,
    encode_request_events,
)
from skewwatch.schemas.telemetry import decode_telemetry, encode_telemetry

# schema name -> file; one per topic record, plus the event schema the message schema refers to
SCHEMA_FILES: dict[str, str] = {
    "request-event.v1": "request-event.v1.json",
    "request-message.v1": "request-message.v1.json",
    "features.v1": "features.v1.json",
    "dead-letter.v1": "dead-letter.v1.json",
    "gpu-telemetry.v1": "gpu-telemetry.v1.json",
    "routing-correction.v1": "routing-correction.v1.json",
}


@cache
def _load(name: str) -> str:
    return resources.files("skewwatch.schemas").joinpath(SCHEMA_FILES[name]).read_text(encoding="utf-8")


def load_schema(name: str) -> dict[str, Any]:
    """A JSON Schema of this package by name (see SCHEMA_FILES), as a fresh dict."""
    return json.loads(_load(name))


__all__ = [
    "REASON_CODES",
    "SCHEMA_FILES",
    "DecodedMessage",
    "DecodedMessages",
    "Rejection",
    "check_request_event",
    "dead_letter_record",
    "decode_alert",
    "decode_correction",
    "decode_dead_letter",
    "decode_features",
    "decode_request_message",
    "decode_request_messages",
    "decode_telemetry",
    "encode_alert",
    "encode_correction",
    "encode_features",
    "encode_request_event",
    "encode_request_events",
    "encode_telemetry",
    "load_schema",
]
