"""Held-out NAB scores: the threshold (and, given a grid, the scorer's constants) chosen on some files,
the others scored with that choice.

NAB's own score chooses one threshold per detector on the very files it then scores, so it is an
in-sample number. Here the files are split into folds; for each fold the choice that maximises the
raw NAB total of the *other* folds is applied to the fold, and the folds' raw parts are summed and
normalised like a corpus score (null detector 0, perfect 100):

* leave-one-category-out (LOCO): a fold per category (with two categories: the choice made on one is
  scored on the other, both ways, summed);
* leave-one-file-out (LOFO): a fold per file.

A choice is an index into ``grid_scores`` (one list of per-file scores per candidate setting of the
constants) and a threshold; with one candidate only the threshold is chosen.

A toy corpus of two files in two categories, each with one window at rows 10-14 and a detector that
fires there; held out, each file gets the threshold the other one chose, and the score stays perfect:

>>> from bench.nab.corpus import NabFile
>>> def toy(name):
...     return NabFile(name, np.arange(20).astype("datetime64[s]"), np.zeros(20), ((10, 14),))
>>> files = [toy("a/x.csv"), toy("b/y.csv")]
>>> hit = np.zeros(20); hit[10] = 1.0
>>> cost = {"tpWeight": 1.0, "fpWeight": 0.11, "fnWeight": 1.0}
>>> held_out(files, [[hit, hit]], cost, category_folds(files))["score"]
100.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.nab.corpus import NabFile
from bench.nab.scoring import Cost, score_at, sweep

Scores = Sequence[npt.NDArray[np.float64]]


def normalised(files: Sequence[NabFile], raw: float, cost: Cost) -> float:
    """NAB's normalisation of a raw total over ``files`` (the null detector misses every window)."""
    n_windows = sum(len(f.windows) for f in files)
    null = -cost["fnWeight"] * n_windows
    perfect = n_windows * cost["tpWeight"]
    # a corpus without windows (clean streams only) has no scale: report its raw total's sign only
    return 100.0 * (raw - null) / (perfect - null) if perfect > null else raw


def category_folds(files: Sequence[NabFile]) -> list[list[int]]:
    """One fold per category, in the order the categories first appear."""
    folds: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        folds.setdefault(f.category, []).append(i)
    return list(folds.values())


def file_folds(files: Sequence[NabFile]) -> list[list[int]]:
    """One fold per file."""
    return [[i] for i in range(len(files))]


def held_out(files: Sequence[NabFile], grid_scores: Sequence[Scores], cost: Cost,
             folds: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Each fold scored with the (candidate, threshold) that is best on the other folds.

    Ties go to the earlier candidate and, within one, to the higher threshold (NAB's optimizer's
    order), so a grid that lists the defaults first keeps them unless another setting is better.
    """
    total = 0.0
    chosen = []
    for fold in folds:
        inside = set(fold)
        rest = [i for i in range(len(files)) if i not in inside]
        best: tuple[float, int, float] | None = None
        for g, per_file in enumerate(grid_scores):
            thresholds, totals = sweep([files[i] for i in rest], [per_file[i] for i in rest], cost)
            j = int(np.argmax(totals))
            if best is None or totals[j] > best[0]:
                best = (float(totals[j]), g, float(thresholds[j]))
        assert best is not None, "need at least one candidate"
        _, g, threshold = best
        part, _, _ = score_at([files[i] for i in fold], [grid_scores[g][i] for i in fold], cost, threshold)
        total += part
        chosen.append({"held_out": sorted({files[i].category for i in fold}) if len(fold) > 1 else files[fold[0]].name,
                       "candidate": g, "threshold": threshold, "part": round(part, 4)})
    return {"score": round(normalised(files, total, cost), 2), "chosen": chosen}


def held_out_profiles(files: Sequence[NabFile], scores: Scores,
                      profiles: Mapping[str, Cost]) -> dict[str, dict[str, float]]:
    """One detector's threshold-only LOCO and LOFO scores, per profile."""
    out: dict[str, dict[str, float]] = {}
    for name, cost in profiles.items():
        out[name] = {"loco": held_out(files, [scores], cost, category_folds(files))["score"],
                     "lofo": held_out(files, [scores], cost, file_folds(files))["score"]}
    return out
