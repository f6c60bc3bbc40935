"""The per-event rules of contract ``request-event.v1``: every problem of one event, worded once.

This is the reference every faster path must match: the column checks and the typed decoder only
find the bad rows, and the reasons of those rows are always worded here, so a mistake reads the same
whichever path found it. Rules beyond the fields' own (:mod:`skewwatch.schemas.fields`):

- ``status`` is "ok" or "error"; ``cuda_error`` a non-empty name or an integer code ≥ 0;
- ``batch_size`` ≤ ``batch_capacity`` when both are present (batch_over_capacity);
- a ``v`` other than 1 makes the event unsupported_version, and its fields are not judged;
- one rejection per event: the first problem's code, the first five problems in its text.

>>> check_request_event({"request_id": "a", "ts": 1.7e9, "model": "m", "replica": "r", "latency_ms": -3,
...     "prompt_tokens": 1, "completion_tokens": 1}).reason
'latency_ms: must be ≥ 0, got -3'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from skewwatch.schemas.fields import (
    INT64_LIMIT,
    FieldSpec,
    Problem,
    check_integer,
    check_number,
    check_string,
    check_version,
    missing_problem,
)
from skewwatch.schemas.limits import DEFAULT_LIMITS, InputLimits
from skewwatch.schemas.rejection import Rejection, show_value
from skewwatch.schemas.requests.spec import BATCH_FIELDS, REQUEST_FIELDS, STATUS_VALUES

SCALAR_MAX_EVENTS: Final = 8  # up to this many events per decode, per-row Python beats numpy's fixed costs
_MAX_PROBLEMS_SHOWN = 5  # an event with many problems: name the first few, count the rest


def check_status(value: Any) -> Problem | None:
    """``status``: "ok" or "error" (None = fine)."""
    if type(value) is not str:
        return ("wrong_type", f'status: must be "ok" or "error", got {show_value(value)}')
    if value not in STATUS_VALUES:
        return ("out_of_range", f'status: must be "ok" or "error", got {show_value(value)}')
    return None


def check_cuda_error(value: Any) -> Problem | None:
    """``cuda_error``: a non-empty cudaError_t name, or an integer code (12.0 is 12) in 0..2^63 (None = fine)."""
    kind = type(value)
    if kind is str:
        return None if value else ("out_of_range", 'cuda_error: must be a non-empty cudaError_t name, got ""')
    if kind is int or (kind is float and math.isfinite(value) and value.is_integer()):
        if 0 <= value < INT64_LIMIT:
            return None
        return ("out_of_range", f"cuda_error: code must be ≥ 0, got {show_value(value)}")
    return ("wrong_type",
            f"cuda_error: must be a cudaError_t name (string) or code (integer), got {show_value(value)}")


def check_field(spec: FieldSpec, value: Any, event: Mapping[str, Any], max_tokens: int) -> Problem | None:
    """The problem with one field's value (None = fine). Absent and null are the same."""
    if value is None:
        return missing_problem(spec.name, event) if spec.required else None
    kind = spec.kind
    if kind == "string":
        return check_string(spec.name, value)
    if kind == "number":
        return check_number(spec, value)
    if kind == "integer":
        return check_integer(spec, value, max_tokens)
    if kind == "status":
        return check_status(value)
    return check_cuda_error(value)


def event_problems(event: Mapping[str, Any], max_tokens: int) -> list[Problem]:
    """Every problem of one event, in field order (the reference the vectorised path must match)."""
    version = event.get("v")
    if version is not None:
        problem = check_version("v", version)
        if problem is not None:  # a newer version may mean other things: do not judge its fields
            return [problem]
    problems: list[Problem] = []
    batch_fields_ok = True
    for spec in REQUEST_FIELDS:
        problem = check_field(spec, event.get(spec.name), event, max_tokens)
        if problem is not None:
            problems.append(problem)
            batch_fields_ok &= spec.name not in BATCH_FIELDS
    size, capacity = event.get("batch_size"), event.get("batch_capacity")
    if batch_fields_ok and size is not None and capacity is not None and size > capacity:
        problems.append(("batch_over_capacity",
                         f"batch_size: {show_value(size)} > batch_capacity {show_value(capacity)}"))
    return problems


def check_request_event(event: Mapping[str, Any], limits: InputLimits | None = None) -> Rejection | None:
    """Validate one event as the worker will (for producers: learn about bad fields at the call site).

    >>> check_request_event({"request_id": "a", "ts": 1.7e9, "model": "m", "replica": "r", "latency_ms": 5,
    ...     "prompt_tokens": 1, "completion_tokens": 1, "batch_size": 40, "batch_capacity": 32}).reason
    'batch_size: 40 > batch_capacity 32'
    >>> check_request_event({"request_id": "a"}).reason_code
    'missing_field'
    """
    if not isinstance(event, Mapping):
        return Rejection("not_an_object", f"event must be a JSON object, got {show_value(event)}", 0)
    problems = event_problems(event, (limits or DEFAULT_LIMITS).max_tokens)
    return event_rejection(problems, "", 0) if problems else None


_MISSING_SUFFIX = ": required field is missing"


def event_rejection(problems: list[Problem], prefix: str, event_index: int) -> Rejection:
    """One rejection per event: the first problem's code, every problem in the text."""
    texts: list[str] = []
    missing = [t[: -len(_MISSING_SUFFIX)] for _, t in problems if t.endswith(_MISSING_SUFFIX)]
    for _, text in problems:
        if not text.endswith(_MISSING_SUFFIX) or len(missing) == 1:
            texts.append(prefix + text)
        elif text.startswith(missing[0] + ":"):  # several absent fields: one phrase, at the first
            texts.append(f"{prefix.rstrip('.') or 'event'}: required fields are missing: {', '.join(missing)}")
    shown = texts[:_MAX_PROBLEMS_SHOWN]
    text = "; ".join(shown)
    if len(texts) > len(shown):
        text += f"; ...(+{len(texts) - len(shown)} more)"
    return Rejection(problems[0][0], text, event_index)
