"""The typed decoder's msgspec structs, generated from the request field specification.

msgspec parses straight into these structs, checking every type and every integer and string range
in C while it parses. It is strict (no bool for an int, no 12.0 for an int, no NaN), so it accepts a
subset of what the contract accepts; anything it refuses takes the general path, which words the
reasons. Made from :data:`~skewwatch.schemas.requests.spec.REQUEST_FIELDS`, so the two cannot drift
apart. The numbers' ranges are not in the structs (see :func:`typed_decoders`).

>>> decoders = typed_decoders(100)
>>> event = decoders.single.decode(b'{"request_id": "a", "ts": 1.0, "model": "m", "replica": "r", '
...                                b'"latency_ms": 2.0, "prompt_tokens": 1, "completion_tokens": 1}')
>>> typed_as_event(event)["latency_ms"], event.batch_size
(2.0, 0)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import msgspec

from skewwatch.schemas.fields import INT64_LIMIT
from skewwatch.schemas.requests.spec import BATCH_FIELDS, REQUEST_FIELDS, STATUS_VALUES, RequestField


def _typed_field(spec: RequestField, max_tokens: int) -> Any:
    """The msgspec type of one field: its JSON type and its integer and string ranges."""
    typed: Any
    if spec.kind == "string":
        typed = Annotated[str, msgspec.Meta(min_length=1)]
    elif spec.kind == "number":
        # No range here: msgspec would check it per event, the poll's columns check it once per
        # column (typed_path.py). msgspec refuses non-finite numbers itself.
        typed = float
    elif spec.kind == "integer":
        high = max_tokens if spec.tokens else INT64_LIMIT - 1
        typed = Annotated[int, msgspec.Meta(ge=int(spec.minimum), le=high)]
    elif spec.kind == "status":
        typed = Literal.__getitem__(STATUS_VALUES)
    else:  # cuda_error
        typed = Annotated[str, msgspec.Meta(min_length=1)] | Annotated[int, msgspec.Meta(ge=0, le=INT64_LIMIT - 1)]
    return typed if spec.required else typed | None


# The default of an absent optional number: the float64 column's "not reported" (this very object,
# so that typed_as_event can tell it from a sent value; JSON cannot send NaN).
_ABSENT_NUMBER: Final = float("nan")


def _typed_default(spec: RequestField) -> Any:
    """An absent field is its column's "not reported" (0 for the batch fields' int64 columns, NaN for a
    float64 column: this very NaN object), so that a column of absent values packs as it is."""
    if spec.dtype == "int64":
        return spec.absent
    return _ABSENT_NUMBER if spec.dtype == "float64" else None


def _typed_event_fields(max_tokens: int) -> list[Any]:
    """msgspec field rows, in REQUEST_FIELDS order then ``v``."""
    fields: list[Any] = [(f.name, _typed_field(f, max_tokens)) for f in REQUEST_FIELDS if f.required]
    fields += [(f.name, _typed_field(f, max_tokens), _typed_default(f)) for f in REQUEST_FIELDS if not f.required]
    fields.append(("v", Literal[1] | None, None))
    return fields


@dataclass(frozen=True, slots=True)
class TypedDecoders:
    """The msgspec decoders for one token limit."""

    batch: msgspec.json.Decoder[Any]  # {"events": [...], "v": 1}
    single: msgspec.json.Decoder[Any]  # one event object; refuses any "events" key (the batch form)


@functools.lru_cache(maxsize=8)
def typed_decoders(max_tokens: int) -> TypedDecoders:
    """The batch-form and single-event decoders for a token limit (cached: the limit is a setting)."""
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
TYPED_AT: Final = {name: i for i, (name, *_) in enumerate(_typed_event_fields(0))}


def typed_as_event(event: Any) -> dict[str, Any]:
    """A typed event as the reference path would read it: absent fields (None, the numbers' NaN,
    the batch fields' 0, the single struct's UNSET) left out."""
    return {name: value for name, value in msgspec.structs.asdict(event).items()
            if value is not None and value is not msgspec.UNSET and value is not _ABSENT_NUMBER
            and not (name in BATCH_FIELDS and value == 0)}
