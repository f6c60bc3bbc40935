"""The detectors the NAB benchmark runs: NAB's windowed Gaussian (the scoring's check), river's
HalfSpaceTrees as NAB's river example sets it up, and ours (``make_scorer``). Each maps a file's values
to one anomaly score per row in [0, 1], seeing the rows one at a time and in order, as NAB runs them.

>>> values = np.array([10.0, 10.5, 9.5, 10.0, 10.2, 50.0])
>>> [round(s, 3) for s in windowed_gaussian(values)]
[0.0, 1.0, 0.683, 0.0, 0.353, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

Series = npt.NDArray[np.float64]

# NAB's windowedGaussian: a Gaussian over the last 6400 values, moved every 100 values
GAUSSIAN_WINDOW = 6400
GAUSSIAN_STEP = 100


def windowed_gaussian(values: Series, window: int = GAUSSIAN_WINDOW, step: int = GAUSSIAN_STEP) -> Series:
    """NAB's ``windowedGaussian`` detector: ``1 - Q(|x - mean| / std)`` of each value against the mean and
    (population) standard deviation of the window before it; the window grows to ``window`` values, then
    slides by ``step`` values at a time; 0 for the first value; a zero deviation counts as 1e-6."""
    n = len(values)
    scores = np.zeros(n)
    data: list[float] = []
    pending: list[float] = []
    # while the window grows its mean/std move with every value: Welford's update, one value at a time
    count, mean, m2 = 0, 0.0, 0.0
    std = 1.0
    for i, x in enumerate(values.tolist()):
        if data:
            z = abs(x - mean) / std
            scores[i] = 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0))
        if len(data) < window:
            data.append(x)
            count += 1
            d = x - mean
            mean += d / count
            m2 += d * (x - mean)
            std = math.sqrt(m2 / count) or 1e-6
        else:
            pending.append(x)
            if len(pending) == step:
                data = data[step:] + pending
                pending = []
                arr = np.asarray(data)
                mean = float(arr.mean())
                std = float(arr.std()) or 1e-6
    return scores


def river_halfspace_trees(values: Series, seed: int = 42) -> Series:
    """river's HalfSpaceTrees behind a MinMaxScaler, river's defaults otherwise: the "out of the box"
    row of the table (learn after score, as NAB's river detector does)."""
    from river import anomaly, preprocessing

    model = preprocessing.MinMaxScaler() | anomaly.HalfSpaceTrees(seed=seed)
    scores = np.empty(len(values))
    for i, v in enumerate(values.tolist()):
        x = {"value": v}
        scores[i] = model.score_one(x)
        model.learn_one(x)
    return scores


def run_scorer(values: Series, make: Callable[..., Any], params: Mapping[str, Any] | None = None) -> Series:
    """Any river-style scorer (``score_one`` then ``learn_one`` per value, ``x = {"value": v}``)."""
    scorer = make(**dict(params or {}))
    scores = np.empty(len(values))
    for i, v in enumerate(values.tolist()):
        x = {"value": v}
        scores[i] = scorer.score_one(x)
        scorer.learn_one(x)
    return scores
