"""One model's step as its detectors see it: the replicas' inputs in one order, and columns of them.

Detectors that judge a step as columns (``quiet`` screens, the weights) read numeric fields of
every replica's feature vector or telemetry sample as float64 arrays, built once per field and
shared by every detector of the step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import attrgetter, is_not
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


class StepColumns:
    """One model's step as seen by its detectors: the per-replica inputs in one order, and any
    numeric field of them as a column (float64, NaN for None), built on first use and shared.

    >>> fv = FeatureVector(model="m", replica="a", window_start=0.0, window_end=60.0, count=5, latency_p50=10.0)
    >>> cols = StepColumns([fv, FeatureVector(model="m", replica="b", window_start=0.0, window_end=60.0, count=0)],
    ...                    [None, None])
    >>> cols.keys, cols.column("count").tolist(), cols.column("latency_p50").tolist()
    (['m/a', 'm/b'], [5.0, 0.0], [10.0, nan])
    """

    __slots__ = ("vectors", "telemetry", "keys", "_columns", "_telemetry_columns", "_row_of")

    def __init__(
        self,
        vectors: Sequence[FeatureVector],
        telemetry: Sequence[TelemetrySample | None],
        keys: Sequence[str] | None = None,
    ) -> None:
        self.vectors = vectors
        self.telemetry = telemetry  # the fresh sample per replica, None when absent or stale
        self.keys = list(keys) if keys is not None else [fv.key for fv in vectors]
        self._columns: dict[str, npt.NDArray[np.float64]] = {}
        self._telemetry_columns: dict[str, npt.NDArray[np.float64]] = {}
        self._row_of: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.vectors)

    @property
    def row_of(self) -> dict[str, int]:
        """Key -> its row (built on first use)."""
        if self._row_of is None:
            self._row_of = {key: row for row, key in enumerate(self.keys)}
        return self._row_of

    def column(self, name: str) -> npt.NDArray[np.float64]:
        """``FeatureVector.<name>`` of every replica."""
        found = self._columns.get(name)
        if found is None:
            found = self._columns[name] = _floats(map(attrgetter(name), self.vectors), len(self.vectors))
        return found

    def prefetch(self, names: Sequence[str], telemetry_names: Sequence[str] = ()) -> None:
        """Build the columns of ``names`` (vector fields) and ``telemetry_names`` (sample fields)
        not built yet, each kind in one pass over its objects.

        Each vector (sample) is then visited once rather than once per field: at thousands of
        replicas, whose objects are far apart in memory, that is much cheaper than field by field.

        >>> fv = FeatureVector(model="m", replica="a", window_start=0.0, window_end=60.0, count=5)
        >>> cols = StepColumns([fv, fv], [None, TelemetrySample(ts=55.0, replica="a", source="nvml",
        ...                                                     memory_used_bytes=4.0, memory_total_bytes=8.0)])
        >>> cols.prefetch(["count", "latency_p50"], ["memory_used_bytes", "memory_total_bytes"])
        >>> cols.column("latency_p50").tolist(), cols.telemetry_column("memory_used_bytes").tolist()
        ([nan, nan], [nan, 4.0])
        """
        wanted = [name for name in dict.fromkeys(names) if name not in self._columns]
        if len(wanted) < 2:
            for name in wanted:
                self.column(name)
        else:
            self._columns.update(zip(wanted, _table(self.vectors, wanted), strict=True))
        wanted = [name for name in dict.fromkeys(telemetry_names) if name not in self._telemetry_columns]
        present = [row for row, sample in enumerate(self.telemetry) if sample is not None]
        if len(wanted) < 2 or not present:  # (without a sample, each column is NaN at once)
            for name in wanted:
                self.telemetry_column(name)
            return
        table = np.full((len(wanted), len(self.telemetry)), np.nan)
        table[:, present] = _table([self.telemetry[row] for row in present], wanted)
        self._telemetry_columns.update(zip(wanted, table, strict=True))

    def take(self, rows: Sequence[int]) -> StepColumns:
        """The step of these ``rows`` only, with the columns built so far (not read again).

        >>> fv = FeatureVector(model="m", replica="a", window_start=0.0, window_end=60.0, count=5)
        >>> cols = StepColumns([fv, FeatureVector(model="m", replica="b", window_start=0.0, window_end=60.0, count=7)],
        ...                    [None, None])
        >>> cols.column("count").tolist(), cols.take([1]).column("count").tolist(), cols.take([1]).keys
        ([5.0, 7.0], [7.0], ['m/b'])
        """
        part = StepColumns([self.vectors[row] for row in rows], [self.telemetry[row] for row in rows],
                           [self.keys[row] for row in rows])
        index = np.asarray(rows, dtype=np.int64)
        part._columns = {name: values[index] for name, values in self._columns.items()}
        part._telemetry_columns = {name: values[index] for name, values in self._telemetry_columns.items()}
        return part

    def telemetry_column(self, name: str) -> npt.NDArray[np.float64]:
        """``TelemetrySample.<name>`` of every replica's fresh sample (NaN without one)."""
        found = self._telemetry_columns.get(name)
        if found is None and not any(map(is_not, self.telemetry, repeat(None))):
            # no fresh sample at all (by identity: a sample's __eq__ is not asked): all unknown
            found = self._telemetry_columns[name] = np.full(len(self.telemetry), np.nan)
        if found is None:
            get = attrgetter(name)
            found = self._telemetry_columns[name] = _floats(
                (None if sample is None else get(sample) for sample in self.telemetry), len(self.telemetry)
            )
        return found


def _table(objects: Sequence[Any], names: Sequence[str]) -> npt.NDArray[np.float64]:
    """Fields ``names`` (two or more) of ``objects``, one row per field (None -> NaN), read in one
    pass: every object's fields at once, then transposed into contiguous rows."""
    n = len(objects)
    flat = np.fromiter(chain.from_iterable(map(attrgetter(*names), objects)), np.float64, n * len(names))
    return flat.reshape(n, len(names)).T.copy()


def _floats(values: Iterable[Any], n: int) -> npt.NDArray[np.float64]:
    # None becomes NaN; fromiter is cheaper per value than np.array(list) (most with None), no list built
    return np.fromiter(values, np.float64, n)


__all__ = ["StepColumns"]
