"""The request event's fields, defined once: the one specification the decoder, the columns and the
JSON Schema are made from.

One :class:`RequestField` row per field of contract ``request-event.v1`` (v1.1), in the order problems
are reported: its wire name and JSON type (``kind``), required or optional, range, unit, and the
column it becomes in :class:`~skewwatch.schemas.requests.columns.RequestColumns` (attribute, dtype and
the value that stands for "not reported"). From these rows:

- the decoder checks every value (``rules.py`` per event, ``column_checks.py`` per column) and
  generates its msgspec structs (``structs.py``);
- ``RequestColumns`` declares its attributes in the same order and dtypes (checked when it is
  defined), and every builder of columns loops over the rows;
- :func:`event_schema` renders the JSON Schema; the shipped ``request-event.v1.json`` must equal it
  (a test checks; ``python -m skewwatch.schemas.requests.spec`` prints it).

>>> [f.name for f in REQUEST_FIELDS if f.required]
['request_id', 'ts', 'model', 'replica', 'latency_ms', 'prompt_tokens', 'completion_tokens']
>>> FIELDS_BY_NAME["status"].column, FIELDS_BY_NAME["batch_size"].absent
('is_error', 0)
>>> event_schema()["properties"]["latency_ms"]["minimum"]
0.0
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from skewwatch.schemas.fields import INT64_LIMIT, TS_MAX_S, FieldSpec
from skewwatch.schemas.limits import MAX_TOKENS

REQUEST_SCHEMA_VERSION: Final = 1
STATUS_VALUES: Final = ("ok", "error")
ColumnType = Literal["object", "float64", "int64", "bool"]


@dataclass(frozen=True, slots=True)
class RequestField(FieldSpec):
    """One field of the request event: the wire rule (:class:`FieldSpec`: name, JSON kind, required,
    range) plus its unit, its description and the column it becomes.

    ``kind`` is "string", "number", "integer", or one of this contract's own kinds: "status" (an enum,
    the column ``is_error``) and "cuda_error" (a name or an integer code).
    """

    unit: str = ""  # "" for names and enums
    description: str = ""
    column: str = ""  # RequestColumns attribute; "" = the field's name
    dtype: ColumnType = "object"
    # the column's value for "not reported" (an optional field absent or null): NaN for floats, 0 for the
    # batch counts (0 is never valid: their minimum is 1; int64 stays exact), None for objects
    absent: Any = None

    @property
    def column_name(self) -> str:
        return self.column or self.name


_NAN = math.nan
REQUEST_FIELDS: Final[tuple[RequestField, ...]] = (
    RequestField("request_id", "string", True,
                 description="Producer's id of the request (for tracing; not de-duplicated)."),
    RequestField("ts", "number", True, exclusive_maximum=TS_MAX_S, unit="s", dtype="float64",
                 description="Event time: epoch seconds (float) when the request finished. "
                             "Values >= 1e11 are rejected as milliseconds."),
    RequestField("model", "string", True, description="Model served (the per-model pool the router balances)."),
    RequestField("replica", "string", True,
                 description="Replica (server instance) that served the request; also the Kafka key."),
    RequestField("latency_ms", "number", True, unit="ms", dtype="float64",
                 description="End-to-end latency in milliseconds."),
    RequestField("prompt_tokens", "integer", True, tokens=True, unit="tokens", dtype="int64",
                 description="Input tokens."),
    RequestField("completion_tokens", "integer", True, tokens=True, unit="tokens", dtype="int64",
                 description="Generated tokens."),
    # v1.1: optional (OTLP spans carry no batch size); the worker may derive them from telemetry
    RequestField("batch_size", "integer", False, minimum=1, unit="requests", dtype="int64", absent=0,
                 description="Running batch size when the request was scheduled. Must be <= batch_capacity "
                             "when both are present. Optional since v1.1: null/absent means not reported."),
    RequestField("batch_capacity", "integer", False, minimum=1, unit="requests", dtype="int64", absent=0,
                 description="The replica's maximum batch size. Optional since v1.1: null/absent means not "
                             "reported."),
    RequestField("ttft_ms", "number", False, unit="ms", dtype="float64", absent=_NAN,
                 description="Time to first token, milliseconds. null/absent: not reported."),
    # an integer on the wire, a float64 column: NaN says "not reported"
    RequestField("queue_length", "integer", False, unit="requests", dtype="float64", absent=_NAN,
                 description="Requests waiting at the replica when this one was scheduled. null/absent: not "
                             "reported."),
    RequestField("kv_cache_hit_rate", "number", False, maximum=1.0, unit="ratio", dtype="float64", absent=_NAN,
                 description="Prefix/KV-cache hit rate, 0..1. null/absent: not reported."),
    RequestField("status", "status", False, column="is_error", dtype="bool", absent=False,
                 description='Outcome; absent or null means "ok".'),
    RequestField("cuda_error", "cuda_error", False,
                 description='CUDA runtime error seen while serving: a cudaError_t name (e.g. '
                             '"cudaErrorMemoryAllocation") or its integer code. null/absent: none.'),
)
FIELDS_BY_NAME: Final = {f.name: f for f in REQUEST_FIELDS}
REQUIRED_FIELDS: Final = tuple(f.name for f in REQUEST_FIELDS if f.required)
OPTIONAL_FIELDS: Final = tuple(f.name for f in REQUEST_FIELDS if not f.required)
BATCH_FIELDS: Final = ("batch_size", "batch_capacity")  # batch_over_capacity: size <= capacity when both are sent
# Integer fields kept as int64 columns (absent optional ones 0: a float column would lose precision above 2**53)
INT64_COLUMNS: Final = frozenset(f.name for f in REQUEST_FIELDS if f.dtype == "int64")


# --- the JSON Schema -------------------------------------------------------------------------------

SCHEMA_ID: Final = "urn:skewwatch:schema:request-event:v1"
_SCHEMA_DESCRIPTION: Final = (
    "One finished inference request. v1.1: batch fields optional (batch_size and batch_capacity may be absent "
    "or null, e.g. for OTLP spans; the worker then derives the batch size from the replica's telemetry or "
    "leaves it unknown); backward compatible, every v1 event is a valid v1.1 event and \"v\" stays 1. Unknown "
    "extra fields are allowed and ignored (forward compatible). Numbers must be finite. Not expressible here "
    "and enforced by the decoder: batch_size <= batch_capacity when both are present (batch_over_capacity), "
    "the message size limit (limits.max_message_bytes) and the configured token limit (limits.max_tokens; "
    "the maximum below is its default).")


def field_schema(field: RequestField) -> dict[str, Any]:
    """The JSON Schema of one field's value (null allowed when the field is optional)."""
    def typed(json_type: str) -> Any:
        return json_type if field.required else [json_type, "null"]

    out: dict[str, Any]
    if field.kind == "string":
        out = {"type": typed("string"), "minLength": 1}
    elif field.kind == "number":
        out = {"type": typed("number"), "minimum": field.minimum}
        if field.maximum is not None:
            out["maximum"] = field.maximum
        if field.exclusive_maximum is not None:
            out["exclusiveMaximum"] = field.exclusive_maximum
    elif field.kind == "integer":
        out = {"type": typed("integer"), "minimum": int(field.minimum),
               "maximum": MAX_TOKENS if field.tokens else INT64_LIMIT - 1}
    elif field.kind == "status":
        out = {"enum": [*STATUS_VALUES, *([] if field.required else [None])]}
    elif field.kind == "cuda_error":
        out = {"anyOf": [{"type": "string", "minLength": 1},
                         {"type": "integer", "minimum": 0, "maximum": INT64_LIMIT - 1},
                         *([] if field.required else [{"type": "null"}])]}
    else:
        raise ValueError(f"{field.name}: no JSON Schema for kind {field.kind!r}")
    out["description"] = field.description
    return out


def event_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one request event, made from :data:`REQUEST_FIELDS`."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "llm.requests event, v1 (v1.1)",
        "description": _SCHEMA_DESCRIPTION,
        "type": "object",
        "required": list(REQUIRED_FIELDS),
        "properties": {
            "v": {"description": "Schema version of this event. Absent or null means 1; any other value is "
                                 "rejected (unsupported_version).",
                  "enum": [REQUEST_SCHEMA_VERSION, None]},
            **{f.name: field_schema(f) for f in REQUEST_FIELDS},
        },
        "additionalProperties": True,
    }


if __name__ == "__main__":  # regenerate the shipped file: python -m skewwatch.schemas.requests.spec > ...json
    print(json.dumps(event_schema(), indent=2, ensure_ascii=False))
