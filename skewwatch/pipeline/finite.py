"""A number, or None where there is none: the one rule for values that may be missing.

JSON has no NaN or infinity, and a feature may be absent, ``None``, a flag or not a number at all:
every such value becomes ``None``, every finite number a ``float``. States written as JSON (the
novelty scorer's ``None`` for "no extreme yet") and samples read from dicts use the same rule.

>>> [finite_or_none(v) for v in (1, 2.5, "3", None, True, float("nan"), float("-inf"), "fast")]
[1.0, 2.5, 3.0, None, None, None, None, None]
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
