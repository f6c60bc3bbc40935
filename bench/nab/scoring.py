"""NAB's scoring method, re-implemented: windows, the scaled sigmoid, profiles, the threshold sweep and
the normalisation against the null detector.

What NAB does (Lavin & Ahmad 2015; NAB's ``sweeper.py``, ``optimizer.py`` and ``runner.py``):

* Each row after the file's probation (:func:`~bench.nab.corpus.probation_rows`) has a weight. A row
  inside a window of ``w`` rows ending at row ``b`` is worth ``S(-(b - i + 1) / w) / S(-1)`` times the
  profile's ``tpWeight``, where ``S(x) = 2 sigmoid(-5 x) - 1`` (``-1`` for ``x >= 3``): ~1 at the
  window's start, falling to ~0 at its end. A row outside every window is a false positive worth
  ``S(d) * fpWeight`` with ``d`` its distance past the end of the preceding window in units of that
  window's length minus one (just after a window: a small penalty; far away or before any window: the
  full ``-fpWeight``).
* A detector's output is a score per row; at a threshold ``t`` every row scoring ``>= t`` is a
  detection. A window counts once, by its best (earliest) detection, or ``-fnWeight`` when none falls
  in it; every detection outside windows adds its (negative) weight.
* The threshold is swept exhaustively over every distinct score of the whole corpus at once (one
  threshold per detector and profile, not per file) and the best total is kept.
* The total is normalised: ``100 (raw - null) / (perfect - null)``, where ``null`` is the null
  detector's best total (a constant score: it detects nothing, every window is a miss) and
  ``perfect`` is the number of windows times ``tpWeight``.

>>> round(scaled_sigmoid(-1.0), 5), scaled_sigmoid(0.0), scaled_sigmoid(3.0)
(0.98661, 0.0, -1.0)

A toy file of 20 rows (no probation at this size: floor(0.15 * 20) = 3 rows) with one window at rows
10-14; a detector that fires exactly at the window's first row scores the perfect 100:

>>> from bench.nab.corpus import NabFile
>>> toy = NabFile("toy/a.csv", np.arange(20).astype("datetime64[s]"), np.zeros(20), ((10, 14),))
>>> hit = np.zeros(20); hit[10] = 1.0
>>> result = nab_score([toy], [hit], {"standard": {"tpWeight": 1.0, "fpWeight": 0.11, "fnWeight": 1.0}})
>>> result["standard"]["score"], result["standard"]["threshold"], result["standard"]["counts"]["tp"]
(100.0, 1.0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.nab.corpus import NabFile

Cost = Mapping[str, float]


def scaled_sigmoid(position: float) -> float:
    """NAB's weight of a detection at ``position`` relative to a window (see the module docstring)."""
    if position >= 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


@dataclass(frozen=True)
class RowWeights:
    """One file's scored rows (after probation): their weight and window (-1: outside every window)."""

    rows: npt.NDArray[np.int64]
    weight: npt.NDArray[np.float64]
    window: npt.NDArray[np.int64]  # index into the file's windows, -1 outside
    scored_windows: tuple[int, ...]  # windows with at least one scored row


_WEIGHTS: dict[tuple[Any, ...], RowWeights] = {}  # they depend on the file's shape and the profile only


def row_weights(nab_file: NabFile, cost: Cost) -> RowWeights:
    """Every scored row's weight under ``cost``, as NAB's sweeper computes it."""
    key = (nab_file.name, len(nab_file.values), nab_file.windows, cost["tpWeight"], cost["fpWeight"])
    found = _WEIGHTS.get(key)
    if found is None:
        found = _WEIGHTS[key] = _row_weights(nab_file, cost)
    return found


def _row_weights(nab_file: NabFile, cost: Cost) -> RowWeights:
    n = len(nab_file.values)
    weight = np.empty(n)
    window_of = np.full(n, -1, dtype=np.int64)
    max_tp = scaled_sigmoid(-1.0)
    tp_w, fp_w = cost["tpWeight"], cost["fpWeight"]
    previous: tuple[int, int] | None = None  # (last row, width) of the window before the row
    edges = list(nab_file.windows)
    i = 0
    while i < n:
        if edges and i == edges[0][0]:
            first, last = edges.pop(0)
            width = last - first + 1
            if width < 2:
                raise ValueError(f"{nab_file.name}: a window of {width} row cannot be scored")
            for j in range(first, last + 1):
                weight[j] = scaled_sigmoid(-(last - j + 1) / width) * tp_w / max_tp
                window_of[j] = len(nab_file.windows) - len(edges) - 1
            previous = (last, width)
            i = last + 1
            continue
        if previous is None:
            weight[i] = scaled_sigmoid(3.0) * fp_w
        else:
            weight[i] = scaled_sigmoid(abs(i - previous[0]) / (previous[1] - 1)) * fp_w
        i += 1
    start = nab_file.probation
    window = window_of[start:]
    return RowWeights(
        rows=np.arange(start, n),
        weight=weight[start:],
        window=window,
        scored_windows=tuple(sorted(set(window[window >= 0].tolist()))),
    )


@dataclass(frozen=True)
class SweepResult:
    """The best threshold of a sweep, its raw score and the row counts (NAB's tp/fp/tn/fn rows)."""

    threshold: float
    raw: float
    counts: dict[str, int]
    per_file: dict[str, float]


def sweep(
    files: Sequence[NabFile], scores: Sequence[npt.NDArray[np.float64]], cost: Cost
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """NAB's exhaustive sweep over the corpus: (thresholds descending, raw total at each).

    The first threshold is above every score (nothing detected: every scored window a miss).
    """
    weights, windows, values = [], [], []
    n_windows = 0
    for nab_file, score in zip(files, scores, strict=True):
        if len(score) != len(nab_file.values):
            raise ValueError(f"{nab_file.name}: {len(score)} scores for {len(nab_file.values)} rows")
        rw = row_weights(nab_file, cost)
        gid = np.where(rw.window >= 0, rw.window + n_windows, -1)
        n_windows += len(nab_file.windows)
        weights.append(rw.weight)
        windows.append(gid)
        values.append(np.asarray(score, dtype=np.float64)[rw.rows])
    weight = np.concatenate(weights)
    window = np.concatenate(windows)
    value = np.concatenate(values)
    if np.isnan(value).any():
        raise ValueError("anomaly scores must not be NaN")
    scored = np.unique(window[window >= 0])
    fn_w = cost["fnWeight"]

    order = np.argsort(-value, kind="stable")
    value, weight, window = value[order], weight[order], window[order]
    # change of the total when each row (in sweep order) becomes a detection: a false positive adds
    # its weight; a row of a window raises the window's best detection (from -fnWeight) if better
    delta = np.where(window < 0, weight, 0.0)
    for gid in scored.tolist():
        at = np.flatnonzero(window == gid)
        best = np.maximum.accumulate(np.concatenate(([-fn_w], weight[at])))
        delta[at] = np.diff(best)
    total = -fn_w * len(scored) + np.cumsum(delta)
    # one threshold per distinct score: the total once every row scoring at least that is detected
    last_of_group = np.flatnonzero(np.append(value[1:] != value[:-1], True))
    start = max(1.1, float(value[0]) + 1.0) if len(value) else 1.1
    thresholds = np.concatenate(([start], value[last_of_group]))
    totals = np.concatenate(([-fn_w * len(scored)], total[last_of_group]))
    return thresholds, totals


def score_at(
    files: Sequence[NabFile], scores: Sequence[npt.NDArray[np.float64]], cost: Cost, threshold: float
) -> tuple[float, dict[str, int], dict[str, float]]:
    """The raw score at one threshold (detections: score >= threshold), its counts and each file's part."""
    total = 0.0
    counts = {"tp": 0, "fp": 0, "tn": 0, "fn": 0}
    per_file: dict[str, float] = {}
    for nab_file, score in zip(files, scores, strict=True):
        rw = row_weights(nab_file, cost)
        detected = np.asarray(score, dtype=np.float64)[rw.rows] >= threshold
        inside = rw.window >= 0
        part = float(rw.weight[detected & ~inside].sum())
        for w in rw.scored_windows:
            hits = detected & (rw.window == w)
            part += float(rw.weight[hits].max()) if hits.any() else -cost["fnWeight"]
        counts["tp"] += int((detected & inside).sum())
        counts["fn"] += int((~detected & inside).sum())
        counts["fp"] += int((detected & ~inside).sum())
        counts["tn"] += int((~detected & ~inside).sum())
        per_file[nab_file.name] = part
        total += part
    return total, counts, per_file


def best_threshold(files: Sequence[NabFile], scores: Sequence[npt.NDArray[np.float64]], cost: Cost) -> SweepResult:
    """NAB's optimizer: the threshold with the best corpus total (the highest one among ties)."""
    thresholds, totals = sweep(files, scores, cost)
    best = int(np.argmax(totals))
    raw, counts, per_file = score_at(files, scores, cost, float(thresholds[best]))
    return SweepResult(threshold=float(thresholds[best]), raw=raw, counts=counts, per_file=per_file)


def nab_score(
    files: Sequence[NabFile], scores: Sequence[npt.NDArray[np.float64]], profiles: Mapping[str, Cost]
) -> dict[str, dict[str, Any]]:
    """Per profile: the normalised NAB score (null detector 0, perfect 100), raw, null, threshold, counts."""
    null_scores = [np.full(len(f.values), 0.5) for f in files]
    n_windows = sum(len(f.windows) for f in files)
    out: dict[str, dict[str, Any]] = {}
    for name, cost in profiles.items():
        result = best_threshold(files, scores, cost)
        null = best_threshold(files, null_scores, cost).raw
        perfect = n_windows * cost["tpWeight"]
        out[name] = {
            "score": 100.0 * (result.raw - null) / (perfect - null),
            "raw": result.raw,
            "null": null,
            "perfect": perfect,
            "threshold": result.threshold,
            "counts": result.counts,
            "per_file": result.per_file,
        }
    return out
