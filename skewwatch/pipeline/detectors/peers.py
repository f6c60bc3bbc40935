"""Each replica's peers: the rest of its model's pool in the same step, as leave-one-out columns.

A replica is judged against the replicas that serve the same model at the same moment: they see
the same traffic (a router spreads one stream over them), so what is ordinary for the pool right
now, a slow model, a burst of long prompts arriving everywhere, is not an anomaly of one of them.
The replica itself is left out of its own baseline, so one bad replica of four does not pull the
baseline towards itself. A baseline needs ``min_peers`` peers with enough evidence (Envoy's
``success_rate_minimum_hosts``); with fewer the result is NaN and a rule falls back to the
replica's own past.

All functions take columns (one value per replica of the step) and a ``valid`` mask (the replicas
with enough evidence to be part of a baseline) and return one value per replica, in O(n log n).

>>> import numpy as np
>>> values = np.array([1.0, 2.0, 3.0, 100.0])
>>> others_median(values, np.ones(4, bool)).tolist()
[3.0, 3.0, 2.0, 2.0]
>>> others_sum(np.array([1.0, 2.0, 4.0]), np.array([True, True, False])).tolist()
[2.0, 1.0, 3.0]
>>> others_count(np.array([True, True, False])).tolist()
[1, 1, 2]
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def others_count(valid: BoolArray) -> npt.NDArray[np.int64]:
    """How many *other* replicas are valid, per replica."""
    total = int(valid.sum())
    return (total - valid.astype(np.int64)).astype(np.int64)


def others_sum(values: FloatArray, valid: BoolArray) -> FloatArray:
    """Sum of ``values`` over the other valid replicas, per replica (0 when there are none)."""
    own = np.where(valid, values, 0.0)
    return float(own.sum()) - own


def others_median(values: FloatArray, valid: BoolArray, min_peers: int = 1) -> FloatArray:
    """Median of ``values`` over the other valid replicas (whose values are numbers, not NaN),
    per replica; NaN with fewer than ``min_peers`` of them.

    >>> import numpy as np
    >>> others_median(np.array([5.0, 1.0, 9.0]), np.array([True, True, True]), min_peers=2).tolist()
    [5.0, 7.0, 3.0]
    >>> others_median(np.array([5.0, 1.0, 9.0]), np.array([True, False, False]), min_peers=1).tolist()
    [nan, 5.0, 5.0]
    """
    return others_medians(values[None, :], valid, min_peers)[0]


def others_medians(values: FloatArray, valid: BoolArray, min_peers: int = 1) -> FloatArray:
    """:func:`others_median` of each row of ``values`` (one column per row, shape ``(k, n)``),
    all over the same ``valid`` replicas (whose values are numbers, not NaN): one sort for the
    ``k`` of them.

    >>> import numpy as np
    >>> others_medians(np.array([[5.0, 1.0, 9.0], [1.0, 1.0, 2.0]]), np.array([True, True, True])).tolist()
    [[5.0, 7.0, 3.0], [1.5, 1.5, 1.0]]
    """
    k, n = values.shape
    out = np.full((k, n), np.nan)
    if n == 0:
        return out
    rows = np.flatnonzero(valid)
    m = len(rows)
    own = values[:, rows]
    ordered = np.sort(own, axis=1)
    if m - 1 >= 1:
        # a valid replica leaves its own value v out: the median of the other m - 1 is read from
        # the sorted m at positions lo and hi, each taken one further on where the value there is
        # not below v (v's own position, or a value tied with it, which leaves the same values)
        lo, hi = (m - 2) // 2, (m - 1) // 2
        low = np.where(ordered[:, lo:lo + 1] < own, ordered[:, lo:lo + 1], ordered[:, lo + 1:lo + 2])
        high = np.where(ordered[:, hi:hi + 1] < own, ordered[:, hi:hi + 1], ordered[:, hi + 1:hi + 2])
        out[:, rows] = (low + high) / 2.0
    others = np.flatnonzero(~valid)
    if len(others) and m >= 1:
        out[:, others] = np.median(ordered, axis=1)[:, None]
    out[:, others_count(valid) < max(min_peers, 1)] = np.nan
    return out


__all__ = ["others_count", "others_median", "others_medians", "others_sum"]
