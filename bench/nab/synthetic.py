"""``python -m bench.nab.synthetic``: labelled synthetic streams, scored with the same NAB code.

A fair extra check that costs no real data, reported apart from NAB and never tuned on: nothing in
the scorer or in ``bench/nab`` was chosen by these numbers. Each stream is ``LENGTH`` rows at a
5-minute cadence (a NAB file's usual size and step), made by a seeded numpy generator, so the corpus
is the same on every machine; its one anomaly starts at a row drawn in the second half (after NAB's
probation) and is labelled as NAB labels: one window of 10 % of the file's rows, centred on the start.

Kinds (noise is AR(1), ``phi`` 0.5, around a random level and scale; ``sd`` is the noise's sd):

* ``level_shift``: the level moves by 4 sd and stays;
* ``variance``: the noise's sd is multiplied by 4;
* ``drift``: the level starts to climb, 6 sd over the next 200 rows, and goes on climbing;
* ``spike``: one value 12 sd away, among ordinary spikes of 4 sd every few hundred rows;
* ``seasonal``: a daily cycle (288 rows) of 5 sd; for 150 rows the cycle stops (the level stays at
  its mean, which the cycle crosses every day: a change of pattern, not of range);
* ``counts``: Poisson counts whose rate (2 to 20 a row) is multiplied by 2.5;
* ``clean``: a daily cycle and noise, no anomaly (no window: any detection is a false positive).

>>> a, b = make_stream("level_shift", 3), make_stream("level_shift", 3)
>>> bool((a.values == b.values).all()), a.windows == b.windows, a.name
(True, True, 'synthetic_level_shift/seed3.csv')
>>> first, last = a.windows[0]
>>> last - first + 1, (first + last + 1) // 2 == anomaly_start(a)
(400, True)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.nab.corpus import NabFile, load_corpus, load_profiles  # noqa: E402
from bench.nab.detectors import bank_scores, windowed_gaussian  # noqa: E402
from bench.nab.heldout import category_folds, held_out, normalised  # noqa: E402
from bench.nab.scoring import best_threshold, nab_score, score_at  # noqa: E402
from bench.throughput.common import RESULTS, machine_info, write_result  # noqa: E402

LENGTH = 4000
WINDOW_FRACTION = 0.1  # NAB: the windows of a file share 10 % of its rows
DAY = 288  # rows of a day at a 5-minute cadence
KINDS = ("level_shift", "variance", "drift", "spike", "seasonal", "counts", "clean")
SEEDS = (1, 2, 3, 4)
START = np.datetime64("2020-01-01T00:00:00", "s")
STEP = np.timedelta64(300, "s")

Series = npt.NDArray[np.float64]


def _ar1(rng: np.random.Generator, n: int, phi: float = 0.5) -> Series:
    """Unit-variance AR(1) noise."""
    shocks = rng.normal(0.0, np.sqrt(1.0 - phi * phi), n)
    out = np.empty(n)
    out[0] = rng.normal()
    for i in range(1, n):
        out[i] = phi * out[i - 1] + shocks[i]
    return out


def _values(kind: str, rng: np.random.Generator, n: int, start: int, magnitude: float) -> Series:
    level, sd = rng.uniform(10.0, 100.0), rng.uniform(0.5, 5.0)
    noise = _ar1(rng, n)
    t = np.arange(n)
    after = t >= start
    if kind == "level_shift":
        return level + sd * (noise + magnitude * 4.0 * after)
    if kind == "variance":
        return level + sd * noise * np.where(after, 1.0 + magnitude * 3.0, 1.0)
    if kind == "drift":
        return level + sd * (noise + magnitude * 6.0 * np.maximum(t - start + 1, 0) / 200.0)
    if kind == "spike":
        spikes = np.zeros(n)
        every = rng.integers(200, 400)
        ordinary = np.arange(int(rng.integers(0, every)), n, int(every))
        spikes[ordinary] = 4.0 * rng.choice((-1.0, 1.0), size=len(ordinary))
        spikes[start] = magnitude * 12.0
        return level + sd * (noise + spikes)
    if kind in ("seasonal", "clean"):
        cycle = 5.0 * np.sin(2.0 * np.pi * (t + rng.integers(0, DAY)) / DAY)
        if kind == "seasonal":
            cycle[start:start + 150] *= 1.0 - magnitude
        return level + sd * (noise + cycle)
    if kind == "counts":
        rate = rng.uniform(2.0, 20.0)
        return rng.poisson(np.where(after, rate * (1.0 + magnitude * 1.5), rate)).astype(np.float64)
    raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")


def make_stream(kind: str, seed: int, magnitude: float = 1.0, n: int = LENGTH) -> NabFile:
    """One labelled stream: the same ``(kind, seed, magnitude, n)`` gives the same stream.

    ``magnitude`` scales the anomaly (1: the sizes in the module's docstring; 0: none)."""
    rng = np.random.default_rng([KINDS.index(kind), seed])
    start = int(rng.integers(n // 2, int(0.85 * n)))
    values = _values(kind, rng, n, start, magnitude)
    half = int(WINDOW_FRACTION * n) // 2
    windows = () if kind == "clean" else ((start - half, start + half - 1),)
    return NabFile(f"synthetic_{kind}/seed{seed}.csv", START + STEP * np.arange(n), values, windows)


def anomaly_start(stream: NabFile) -> int:
    """The row the anomaly starts at: the middle of its window."""
    first, last = stream.windows[0]
    return (first + last + 1) // 2


def make_corpus(kinds: Sequence[str] = KINDS, seeds: Sequence[int] = SEEDS, magnitude: float = 1.0) -> list[NabFile]:
    return [make_stream(k, s, magnitude) for k in kinds for s in seeds]


DETECTORS: dict[str, Callable[[Sequence[Series]], list[Series]]] = {
    "ours": bank_scores,
    "windowed-gaussian": lambda series: [windowed_gaussian(v) for v in series],
}


def evaluate(files: list[NabFile], scores: list[Series], real_thresholds: dict[str, float],
             profiles: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A detector's synthetic row: its own threshold (in-sample), the threshold chosen on the real NAB
    corpus (untouched by these streams), kinds held out, and per kind at its own in-sample threshold."""
    row: dict[str, Any] = {}
    both = nab_score(files, scores, profiles)
    for p, cost in profiles.items():
        real_raw, _, _ = score_at(files, scores, cost, real_thresholds[p])
        row[p] = {"in_sample": round(both[p]["score"], 2),
                  "nab_threshold": round(normalised(files, real_raw, cost), 2),
                  "loco_kinds": held_out(files, [scores], cost, category_folds(files))["score"]}
    standard = profiles["standard"]
    row["per_kind_standard"] = per_kind(files, scores, standard, both["standard"]["threshold"])
    row["per_kind_nab_threshold"] = per_kind(files, scores, standard, real_thresholds["standard"])
    return row


def per_kind(files: list[NabFile], scores: list[Series], cost: dict[str, float], threshold: float) -> dict[str, Any]:
    """Each kind at one threshold: its normalised score, windows found, false-positive rows."""
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(f.category for f in files):
        idx = [i for i, f in enumerate(files) if f.category == kind]
        sub, sub_scores = [files[i] for i in idx], [scores[i] for i in idx]
        raw, counts, _ = score_at(sub, sub_scores, cost, threshold)
        hits = sum(1 for f, s in zip(sub, sub_scores, strict=True) for first, last in f.windows
                   if (s[first:last + 1] >= threshold).any())
        out[kind.removeprefix("synthetic_")] = {
            "score": round(normalised(sub, raw, cost), 2) if any(f.windows for f in sub) else None,
            "found": hits, "windows": sum(len(f.windows) for f in sub), "false_rows": counts["fp"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "nab_synthetic.json")
    args = parser.parse_args(argv)
    files = make_corpus()
    real = load_corpus()
    profiles = load_profiles()
    before = machine_info()
    rows = {}
    for name, run in DETECTORS.items():
        started = time.perf_counter()
        real_scores = run([f.values for f in real])
        real_thresholds = {p: best_threshold(real, real_scores, cost).threshold for p, cost in profiles.items()}
        rows[name] = evaluate(files, run([f.values for f in files]), real_thresholds, profiles)
        rows[name]["seconds"] = round(time.perf_counter() - started, 1)
    labels = {"standard": "standard", "reward_low_FP_rate": "low FP", "reward_low_FN_rate": "low FN"}
    print("synthetic streams (in-sample / threshold from real NAB / kinds held out)")
    for name, row in rows.items():
        print(f"{name:<20} " + "  ".join(
            f"{labels[p]} {row[p]['in_sample']:.1f} / {row[p]['nab_threshold']:.1f} / {row[p]['loco_kinds']:.1f}"
            for p in profiles))
    for key, what in (("per_kind_standard", "its in-sample threshold"),
                      ("per_kind_nab_threshold", "the threshold chosen on real NAB")):
        print(f"per kind, standard, {what}: score, windows found, false rows")
        for kind in rows["ours"][key]:
            print(f"{kind:<14} " + "  ".join(
                f"{name} {row[key][kind]['score']} {row[key][kind]['found']}/{row[key][kind]['windows']} "
                f"fp {row[key][kind]['false_rows']}" for name, row in rows.items()))
    result = {"machine": before, "length": LENGTH, "kinds": list(KINDS), "seeds": list(SEEDS),
              "files": len(files), "windows": sum(len(f.windows) for f in files), "detectors": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
