"""A partition's windows as plain columns: what a checkpoint stores, between the live state and its bytes.

:meth:`PartitionWindows.export_state <skewwatch.pipeline.window.partition.PartitionWindows.export_state>`
makes one, :meth:`PartitionWindows.from_state <skewwatch.pipeline.window.partition.PartitionWindows.from_state>`
rebuilds the windows from one (checking it), and ``snapshot.py`` turns one into bytes and back. Nothing
derived is stored: the running sketch totals are the sum of the sealed buckets and are rebuilt.

Every non-empty bucket, sealed or open, is one row of the bucket columns, ordered by (bucket id, key);
its sketch entries follow the previous row's in ``sketch``, sorted by slot, in one slot space: latency
at ``slot``, TTFT at ``n_slots + slot``, TPOT at ``2 * n_slots + slot``.

>>> state = PartitionState.empty(60.0, 5.0, 0.01)
>>> state.keys, state.bucket_id.size, state.sketch.shape
([], 0, (2, 0))
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.window.bucket_row import STATS_LEN


class PartitionState(NamedTuple):
    """Everything a :class:`PartitionWindows` holds, as plain data."""

    length_s: float  # the settings the state was taken with (a restore under others is refused)
    step_s: float
    relative_accuracy: float
    watermark: float | None
    closed_through: int | None  # id of the newest sealed bucket
    late_total: int
    keys: list[tuple[str, str, float]]  # (model, replica, last event ts), in first-seen order
    bucket_key: npt.NDArray[np.int32]  # per bucket row: the index of its key in ``keys``
    bucket_id: npt.NDArray[np.int64]
    bucket_stats: npt.NDArray[np.float64]  # (rows, STATS_LEN), layout in bucket_row.py
    sketch_lengths: npt.NDArray[np.int64]  # per bucket row: its entries in ``sketch``
    sketch: npt.NDArray[np.int32]  # (2, entries): combined slot, count
    cuda_errors: list[tuple[int, dict[str, int]]]  # (bucket row, cuda_error value -> count), open buckets

    @classmethod
    def empty(cls, length_s: float, step_s: float, relative_accuracy: float) -> PartitionState:
        """The state of windows that have seen nothing."""
        return cls(length_s, step_s, relative_accuracy, None, None, 0, [], np.zeros(0, np.int32),
                   np.zeros(0, np.int64), np.zeros((0, STATS_LEN)), np.zeros(0, np.int64),
                   np.zeros((2, 0), np.int32), [])
