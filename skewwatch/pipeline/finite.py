"""A number, or None where there is none: the one rule for values that may be missing.

JSON has no NaN or infinity, and a feature may be absent, ``None``, a flag or not a number at all:
every such value becomes ``None``, every finite number a ``float``. States written as JSON (the
novelty scorer's ``None`` for "no extreme yet") and samples read from dicts use the same rule.

>>> [finite_or_none(v) for v in (1, 2.5, "3", None, True, float("nan"), float("-inf"), "fast")]
[1.0, 2.5, 3.0, None, None, None, None, None]

A value already a number takes the narrower rule of the detectors' step columns, which hold NaN where
a replica has no value: :func:`nan_as_none` turns that NaN back into None and keeps every other
number as it is, infinities included (a comparison against them still holds).

>>> [nan_as_none(v) for v in (2.5, None, float("nan"), float("inf"))]
[2.5, None, None, inf]
"""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float when ``float()`` makes a finite number of it, else None (a ``bool`` is a
    flag, not a number: None)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def nan_as_none(value: float | None) -> float | None:
    """A column's value as a ``float``, None where the column holds NaN (no value) or there is none."""
    return None if value is None or math.isnan(value) else float(value)
