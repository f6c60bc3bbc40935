"""The NAB files, their anomaly windows and NAB's cost profiles, read from ``bench/data/nab/``.

A file is its values in time order and its windows as row ranges: NAB names a window by its first and
last timestamp, and a row is in the window when its timestamp lies between them (both ends included).

>>> corpus = load_corpus(categories=("realKnownCause",))
>>> [f.name for f in corpus][:2]
['realKnownCause/ambient_temperature_system_failure.csv', 'realKnownCause/cpu_utilization_asg_misconfiguration.csv']
>>> taxi = next(f for f in corpus if f.name.endswith("nyc_taxi.csv"))
>>> len(taxi.values), taxi.windows[0], taxi.probation
(10320, (5839, 6045), 750)
>>> sorted(load_profiles())
['reward_low_FN_rate', 'reward_low_FP_rate', 'standard']
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

DATA = Path(__file__).resolve().parents[1] / "data" / "nab"
CATEGORIES = ("realAWSCloudwatch", "realKnownCause")

# NAB leaves the first 15 % of a file unscored (the detector's probation), at most 15 % of 5000 rows
PROBATION_FRACTION = 0.15
PROBATION_CAP_ROWS = 5000


def probation_rows(n: int) -> int:
    """Rows at the start of an ``n``-row file that NAB does not score: min(floor(0.15 n), 750).

    >>> probation_rows(4032), probation_rows(22695)
    (604, 750)
    """
    return int(min(math.floor(PROBATION_FRACTION * n), PROBATION_FRACTION * PROBATION_CAP_ROWS))


@dataclass(frozen=True)
class NabFile:
    """One series: ``values`` in time order, ``windows`` as inclusive (first row, last row)."""

    name: str  # "<category>/<file>.csv", NAB's key in its label files
    timestamps: npt.NDArray[np.datetime64]
    values: npt.NDArray[np.float64]
    windows: tuple[tuple[int, int], ...]

    @property
    def category(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def probation(self) -> int:
        return probation_rows(len(self.values))


def _read_series(path: Path) -> tuple[npt.NDArray[np.datetime64], npt.NDArray[np.float64]]:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        if header[:2] != ["timestamp", "value"]:
            raise ValueError(f"{path}: expected a timestamp,value header, got {header!r}")
        rows = [(row[0], float(row[1])) for row in reader if row]
    stamps = np.array([np.datetime64(t.replace(" ", "T")) for t, _ in rows], dtype="datetime64[s]")
    return stamps, np.array([v for _, v in rows], dtype=np.float64)


def _window_rows(
    name: str, stamps: npt.NDArray[np.datetime64], limits: Iterable[list[str]]
) -> tuple[tuple[int, int], ...]:
    windows = []
    for start, end in limits:
        t1 = np.datetime64(start.replace(" ", "T"), "s")
        t2 = np.datetime64(end.replace(" ", "T"), "s")
        inside = np.flatnonzero((stamps >= t1) & (stamps <= t2))
        if len(inside) == 0:
            raise ValueError(f"{name}: window {start} .. {end} holds no row")
        # NAB enters a window on the row whose timestamp equals its start: the windows are cut so
        # that both ends are rows of the file
        if stamps[inside[0]] != t1 or stamps[inside[-1]] != t2:
            raise ValueError(f"{name}: window {start} .. {end} does not start and end on rows")
        windows.append((int(inside[0]), int(inside[-1])))
    return tuple(sorted(windows))


def load_corpus(root: Path = DATA, categories: Iterable[str] = CATEGORIES) -> list[NabFile]:
    """Every file of ``categories`` under ``root``, with its windows, sorted by name."""
    with (root / "labels" / "combined_windows.json").open() as handle:
        all_windows: dict[str, list[list[str]]] = json.load(handle)
    files = []
    for category in categories:
        for path in sorted((root / "data" / category).glob("*.csv")):
            name = f"{category}/{path.name}"
            if name not in all_windows:
                raise ValueError(f"{name}: no entry in combined_windows.json")
            stamps, values = _read_series(path)
            files.append(NabFile(name, stamps, values, _window_rows(name, stamps, all_windows[name])))
    return files


def load_profiles(root: Path = DATA) -> dict[str, dict[str, float]]:
    """NAB's cost profiles: name -> {"tpWeight", "fpWeight", "fnWeight", "tnWeight"}."""
    with (root / "config" / "profiles.json").open() as handle:
        raw = json.load(handle)
    return {name: {k: float(v) for k, v in body["CostMatrix"].items()} for name, body in raw.items()}
