"""``python -m bench.nab.sensitivity``: how the held-out NAB score moves with each of the scorer's constants.

One constant at a time moves over a few values around its default (``SWEEP``), the others at their
defaults; for each setting: the in-sample standard score (NAB's: threshold chosen on all 24 files),
leave-one-category-out and leave-one-file-out (threshold chosen without the held-out part,
``bench/nab/heldout.py``). Then the held-out *choice* of each constant: its value and the threshold
chosen together on the other category (LOCO) or the other files (LOFO), the held-out part scored with
them, so a reader sees which value the held-out evidence picks and what picking costs. A constant
whose row barely moves is one the score does not depend on (a candidate to fix or remove); the spread
of a row is what choosing that constant can win or lose.

Writes ``bench/results/nab_sensitivity.json``; about a minute on 2 shared cores (a scorer pass over
the corpus per setting, ``bank_scores``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.nab.corpus import NabFile, load_corpus, load_profiles  # noqa: E402
from bench.nab.detectors import bank_scores  # noqa: E402
from bench.nab.heldout import category_folds, file_folds, held_out, normalised  # noqa: E402
from bench.nab.scoring import Cost, sweep  # noqa: E402
from bench.throughput.common import RESULTS, machine_info, write_result  # noqa: E402
from skewwatch.pipeline.detectors.novelty import NoveltyParams  # noqa: E402

# the main constants and a few values around each default (the default is added where missing)
SWEEP: dict[str, tuple[Any, ...]] = {
    "scales": ((1, 8), (1, 4, 16, 64), (1, 16, 128), (1, 8, 64, 512)),
    "memory": (1000, 4000, 8000),
    "blocks": (4, 16),
    "warmup": (25, 400),
    "short": (1, 5, 20, 40),
    "fading": (0.0001, 0.001, 0.003),
    "rearm": (6, 24, 48),
    "escalation": (1.5, 3.0, 4.0),
}


def defaults() -> dict[str, Any]:
    """NoveltyParams' defaults: the values ``make_scorer()`` runs with."""
    base = NoveltyParams()
    return {f.name: getattr(base, f.name) for f in fields(NoveltyParams)}


def in_sample(files: list[NabFile], scores: Any, cost: Cost) -> float:
    return round(normalised(files, float(sweep(files, scores, cost)[1].max()), cost), 2)


def sweep_constant(files: list[NabFile], cost: Cost, name: str, values: tuple[Any, ...],
                   default_scores: Any) -> dict[str, Any]:
    """One constant's row: each value's in-sample / LOCO / LOFO score, and the held-out choice."""
    default = defaults()[name]
    ordered = (default,) + tuple(v for v in values if v != default)  # the default first: ties keep it
    per_value = [default_scores] + [bank_scores([f.values for f in files], {name: v}) for v in ordered[1:]]
    points = []
    for value, scores in zip(ordered, per_value, strict=True):
        points.append({"value": value, "in_sample": in_sample(files, scores, cost),
                       "loco": held_out(files, [scores], cost, category_folds(files))["score"],
                       "lofo": held_out(files, [scores], cost, file_folds(files))["score"]})
    choice: dict[str, Any] = {}
    for label, folds in (("loco", category_folds(files)), ("lofo", file_folds(files))):
        result = held_out(files, per_value, cost, folds)
        picked = [ordered[c["candidate"]] for c in result["chosen"]]
        choice[label] = {"score": result["score"],
                         "picked": {json.dumps(v): picked.count(v) for v in ordered if v in picked}}
    return {"default": default, "points": sorted(points, key=lambda p: str(p["value"])), "choice": choice}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--constants", default=",".join(SWEEP), help="comma-separated, from: " + ", ".join(SWEEP))
    parser.add_argument("--out", type=Path, default=RESULTS / "nab_sensitivity.json")
    args = parser.parse_args(argv)
    wanted = [c.strip() for c in args.constants.split(",") if c.strip()]
    if unknown := [c for c in wanted if c not in SWEEP]:
        parser.error(f"unknown constants {unknown}; known: {', '.join(SWEEP)}")

    files = load_corpus()
    cost = load_profiles()["standard"]
    before = machine_info()
    started = time.perf_counter()
    default_scores = bank_scores([f.values for f in files])
    rows = {}
    for name in wanted:
        rows[name] = sweep_constant(files, cost, name, SWEEP[name], default_scores)
        row = rows[name]
        print(f"{name} (default {row['default']}): " + "; ".join(
            f"{p['value']}: {p['in_sample']:.1f} / {p['loco']:.1f} / {p['lofo']:.1f}" for p in row["points"])
            + f"  | chosen held out: LOCO {row['choice']['loco']['score']:.1f} {row['choice']['loco']['picked']}, "
            f"LOFO {row['choice']['lofo']['score']:.1f} {row['choice']['lofo']['picked']}", flush=True)
    result = {"machine": before, "seconds": round(time.perf_counter() - started, 1), "profile": "standard",
              "columns": "in-sample / leave-one-category-out / leave-one-file-out (threshold held out)",
              "defaults": {k: v for k, v in defaults().items() if k in SWEEP}, "constants": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
