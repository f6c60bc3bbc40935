"""Field specs, the scalar checks every decoder words its reasons with, and the tolerant parse.

A rejected input carries a reason a person can act on, naming the field and the value ("latency_ms:
must be ≥ 0, got -3"). The request and the telemetry decoders describe their fields as
:class:`FieldSpec` rows and share these checks, so the same mistake reads the same everywhere.
Integers accept integral floats (12.0, as JSON Schema's "integer" does) and reject booleans and
12.5; numbers must be finite.

>>> spec = FieldSpec("latency_ms", "number", True)
>>> check_number(spec, -3)
('out_of_range', 'latency_ms: must be ≥ 0, got -3')
>>> check_integer(FieldSpec("prompt_tokens", "integer", True), True)
('wrong_type', 'prompt_tokens: must be an integer, got true')
>>> check_integer(FieldSpec("prompt_tokens", "integer", True), 12.0) is None
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from skewwatch.schemas.rejection import Rejection, show_value

KNOWN_VERSIONS: Final = frozenset({1})  # schema versions the v1 decoders understand
INT64_LIMIT: Final = 2**63  # integer fields must fit numpy's int64 (exclusive bound)
TS_MAX_S: Final = 1e11  # a ts at or above this is not epoch seconds (year 5138): it is milliseconds

Problem = tuple[str, str]  # (reason_code, text naming the field and the value)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    kind: str  # "string" | "number" | "integer", or a decoder's own kind ("status", "cuda_error")
    required: bool
    minimum: float = 0.0
    maximum: float | None = None  # inclusive; None = no bound beyond finiteness / int64
    exclusive_maximum: float | None = None
    tokens: bool = False  # bounded above by limits.max_tokens (too_many_tokens)


def missing_problem(name: str, event: Mapping[str, Any]) -> Problem:
    if name in event:
        return ("missing_field", f"{name}: required, got null")
    return ("missing_field", f"{name}: required field is missing")


def check_version(name: str, value: Any, known_versions: frozenset[int] = KNOWN_VERSIONS) -> Problem | None:
    kind = type(value)
    if kind is int or (kind is float and math.isfinite(value) and value.is_integer()):
        if value in known_versions:
            return None
        known = ", ".join(str(v) for v in sorted(known_versions))
        return ("unsupported_version",
                f"{name}: unsupported schema version {show_value(value)} (this decoder knows {known})")
    return ("wrong_type", f"{name}: must be an integer schema version, got {show_value(value)}")


def check_string(name: str, value: Any, *, allow_empty: bool = False) -> Problem | None:
    if type(value) is not str:
        return ("wrong_type", f"{name}: must be a string, got {show_value(value)}")
    if not value and not allow_empty:
        return ("out_of_range", f'{name}: must be a non-empty string, got ""')
    return None


def check_number(spec: FieldSpec, value: Any) -> Problem | None:
    name, kind = spec.name, type(value)
    if kind is not float and kind is not int:
        return ("wrong_type", f"{name}: must be a number, got {show_value(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range (only the stdlib fallback parser makes those)
        number = math.inf
    if not math.isfinite(number):
        return ("out_of_range", f"{name}: must be a finite number, got {show_value(value)}")
    if number < spec.minimum:
        return ("out_of_range", f"{name}: must be ≥ {spec.minimum:g}, got {show_value(value)}")
    if spec.maximum is not None and number > spec.maximum:
        return ("out_of_range", f"{name}: must be ≤ {spec.maximum:g}, got {show_value(value)}")
    if spec.exclusive_maximum is not None and number >= spec.exclusive_maximum:
        return ("out_of_range", f"{name}: {show_value(value)} is not epoch seconds "
                                "(must be < 1e11; milliseconds?)")
    return None


def check_integer(spec: FieldSpec, value: Any, max_tokens: int = 0) -> Problem | None:
    name, kind = spec.name, type(value)
    if kind is float:
        if not math.isfinite(value):
            return ("out_of_range", f"{name}: must be a finite integer, got {show_value(value)}")
        if not value.is_integer():
            return ("wrong_type", f"{name}: must be an integer, got {show_value(value)}")
    elif kind is not int:
        return ("wrong_type", f"{name}: must be an integer, got {show_value(value)}")
    if value < spec.minimum:
        return ("out_of_range", f"{name}: must be ≥ {spec.minimum:g}, got {show_value(value)}")
    if spec.tokens and value > max_tokens:
        return ("too_many_tokens", f"{name}: {show_value(value)} > limit {max_tokens} (limits.max_tokens)")
    if value >= INT64_LIMIT:
        return ("out_of_range", f"{name}: must be < 2^63, got {show_value(value)}")
    return None


def parse_json(value: bytes) -> tuple[Any, Rejection | None]:
    """(document, None) or (None, a message-level rejection: empty or malformed_json)."""
    try:
        return orjson.loads(value), None
    except orjson.JSONDecodeError as exc:
        first_error = exc
    if not bytes(value).strip():
        return None, Rejection.message_level("empty", "value holds only whitespace")
    # Why a second parser: orjson rejects the whole message for the non-standard NaN/Infinity
    # literals (Python's json.dumps writes them) and for numbers that overflow to infinity (1e999).
    # The stdlib parser reads those as floats, so only the events holding them are rejected
    # (out_of_range) and the good events of the batch survive. Anything else it accepts but orjson
    # cannot write back (lone surrogates) would break every downstream encoder: still malformed.
    try:
        doc = json.loads(bytes(value).decode("utf-8"))
        orjson.dumps(doc)
    except Exception:  # ValueError, UnicodeError, RecursionError, orjson.JSONEncodeError: all malformed
        return None, Rejection.message_level("malformed_json", f"malformed JSON: {first_error}")
    return doc, None
