"""Banks of streams kept as the rows of numpy arrays: each row's state as one float64 vector.

A bank (:class:`~skewwatch.pipeline.detectors.novelty.NoveltyBank`,
:class:`~skewwatch.pipeline.detectors.shift.ShiftBank`) names its per-row arrays in a fixed order;
:func:`pack` flattens a row of each, in that order, into one vector (integers are exact in
float64), and :func:`unpack` writes such vectors back, refusing any whose length is not the
layout's (a checkpoint of other features or lengths).

>>> import numpy as np
>>> class Bank:
...     def __init__(self, n):
...         self.mean, self.head = np.zeros((n, 2)), np.zeros(n, dtype=np.int64)
>>> a, b = Bank(2), Bank(3)
>>> a.mean[1], a.head[1] = [0.5, -1.0], 7
>>> b_rows = np.array([2])
>>> unpack(b, ("mean", "head"), b_rows, pack(a, ("mean", "head"))[1:], "demo")
>>> b.mean[2].tolist(), int(b.head[2])
([0.5, -1.0], 7)
>>> unpack(b, ("mean",), b_rows, pack(a, ("mean", "head"))[1:], "demo")
Traceback (most recent call last):
...
ValueError: demo state: 3 numbers per row, the layout has 2
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


def pack(bank: Any, names: Sequence[str]) -> Floats:
    """Every row of ``bank``'s arrays ``names``, flattened in that order: rows x numbers."""
    arrays = [getattr(bank, name) for name in names]
    rows = len(arrays[0])
    return np.concatenate([a.reshape(rows, int(np.prod(a.shape[1:], dtype=np.int64))).astype(np.float64)
                           for a in arrays], axis=1)


def unpack(bank: Any, names: Sequence[str], rows: npt.NDArray[np.int64], data: Floats, what: str) -> None:
    """Write :func:`pack` vectors ``data`` into ``rows`` of ``bank``'s arrays ``names``."""
    start = 0
    for name in names:
        array = getattr(bank, name)
        width = int(np.prod(array.shape[1:], dtype=np.int64))
        if data.shape[1] < start + width:
            raise ValueError(f"{what} state: {data.shape[1]} numbers per row, the layout needs more")
        array[rows] = data[:, start:start + width].reshape((len(rows), *array.shape[1:])).astype(array.dtype)
        start += width
    if data.shape[1] != start:
        raise ValueError(f"{what} state: {data.shape[1]} numbers per row, the layout has {start}")
