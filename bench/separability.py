"""``bench/separability.py``: how far a faulty replica stands out, per window statistic.

Before a detector can find the learned family's ``ttft_drift`` or ``throughput_drop``, the statistic
it judges must move further on the faulty replica than healthy replicas move by themselves. This
measures that on the simulator's per-request rows, with no detector in the loop, for a few window
statistics a worker could keep (``STATISTICS``, each for the fault it is meant to show):

1. each scenario of ``bench/quality.py --family learned`` (shape, seed) is simulated; for every
   replica of the fault's pool and of the clean pools, each 1 min window's statistic (non-overlapping
   windows) as a log ratio to the pool's median replica in that window;
2. per replica, the shift of its mean over the fault's last 10 min against its mean over the 15 min
   before the fault, in units of its own spread before the fault over the root of the windows
   compared (a t-statistic; an oracle that knows when the fault was);
3. the faulty replica's statistic (signed: in the direction the fault moves it) against the same
   statistic of every healthy replica of the run's fault pool and clean pools (the null, ``|t|``:
   how far a replica with nothing wrong moves);
4. the same t with each window weighed by its requests, as the learned detector's shift test does
   (weighted means; one request's spread from the windows before, ``sum n (x - mean)^2 / (k - 1)``;
   a window of the fault counted at most as the mean window before it), printed as a second table
   per statistic (``... [by request]``).

A run whose faulty replica lies inside the null's range (its ``t`` at most the null's largest
``|t|``) is one no rule on that statistic can find without false alerts on that shape. Prints a
table per statistic and shape and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.quality import simulate  # noqa: E402
from bench.scenarios import LEARNED_FAULT_AT_S, LEARNED_FAULT_FOR_S, START_TS, Scenario  # noqa: E402
from bench.throughput.common import RESULTS, machine_info  # noqa: E402
from skewwatch.pipeline.detectors.pool_slope import PoolSlope  # noqa: E402
from skewwatch.sim.shapes import SHAPES, make_shape  # noqa: E402

Floats = npt.NDArray[np.float64]
WINDOW_S = 60.0
BEFORE_S = 900.0  # the 15 min before the fault
LAST_S = 600.0  # the fault's last 10 min (its 2x plateau and the end of its ramp)
BY_REQUEST = " [by request]"  # the name of a statistic's t with each window weighed by its requests

# name -> (the fault it shows, the direction the fault moves it, per-request value from the rows,
# how a window summarises the values, as a log)
STATISTICS: dict[str, tuple[str, float, Callable[[dict[str, Floats]], Floats], Callable[[Floats], float]]] = {
    "ttft_p50 (window median TTFT)": (
        "ttft_drift", 1.0, lambda r: np.log(r["ttft"]), lambda v: float(np.median(v))),
    "ttft_per_prompt_token (mean log)": (
        "ttft_drift", 1.0, lambda r: np.log(r["ttft"] / r["prompt"]), lambda v: float(np.mean(v))),
    "ttft_per_prompt_token at the pool's typical prompt (mean log, less the pool's slope on log prompt)": (
        "ttft_drift", 1.0, lambda r: _at_typical_prompt(r), lambda v: float(np.mean(v))),
    "median of TTFT / prompt": (
        "ttft_drift", 1.0, lambda r: np.log(r["ttft"] / r["prompt"]), lambda v: float(np.median(v))),
    "tpot_p50 (window median time per output token after the first)": (
        "throughput_drop", 1.0, lambda r: np.log(r["tpot"]), lambda v: float(np.median(v))),
    "median of (latency - TTFT) / output tokens (the first token counted too)": (
        "throughput_drop", 1.0, lambda r: np.log(r["tpot_all"]), lambda v: float(np.median(v))),
    "completion_tokens_mean (window mean output length)": (
        "throughput_drop", -1.0, lambda r: r["completion"], lambda v: float(np.log(np.mean(v)))),
}


def _at_typical_prompt(rows: dict[str, Floats]) -> Floats:
    """Each request's log TTFT per prompt token less the pool's slope on log prompt times its log
    prompt: the learned detector's fit (``PoolSlope``) on the pool's requests before the fault, one
    request each (the detector fits the windows' means instead)."""
    y, x = np.log(rows["ttft"] / rows["prompt"]), np.log(rows["prompt"])
    before = rows["t"] < LEARNED_FAULT_AT_S
    fit = PoolSlope(memory=1, min_requests=0)
    fit.adjust("pool", y[before], x[before], np.ones(int(before.sum())))
    return np.asarray(y - fit.slope("pool") * x)


def rows_of(scenario: Scenario) -> dict[str, Any]:
    """The run's finished requests without errors, with a first token: time from start, pool,
    replica, TTFT, prompt, output length, time per output token after the first (NaN for a one-token
    output: it has none) and with the first counted too."""
    _sim, chunks, _meter = simulate(scenario)
    parts: dict[str, list[Any]] = defaultdict(list)
    for chunk in chunks:
        r = chunk.requests
        keep = (~r.is_error & (r.ttft_ms > 0) & (r.prompt_tokens > 0) & (r.completion_tokens > 0)
                & (r.latency_ms > r.ttft_ms))
        decode = r.latency_ms[keep] - r.ttft_ms[keep]
        tokens = r.completion_tokens[keep].astype(np.float64)
        parts["t"].append(r.ts[keep] - START_TS)
        parts["model"].append(r.model[keep])
        parts["replica"].append(r.replica[keep])
        parts["ttft"].append(r.ttft_ms[keep])
        parts["prompt"].append(r.prompt_tokens[keep].astype(np.float64))
        parts["completion"].append(tokens)
        parts["tpot"].append(np.where(tokens > 1, decode / np.maximum(tokens - 1, 1), np.nan))
        parts["tpot_all"].append(decode / tokens)
    return {k: np.concatenate(v) for k, v in parts.items()}


def t_statistics(scenario: Scenario) -> dict[str, dict[str, list[float]]]:
    """Per statistic: the faulty replica's t (signed: positive where the fault moves it) and the
    healthy replicas' (the null)."""
    rows = rows_of(scenario)
    at, until = LEARNED_FAULT_AT_S, LEARNED_FAULT_AT_S + LEARNED_FAULT_FOR_S
    ends = np.arange(WINDOW_S, until + WINDOW_S, WINDOW_S)
    before = (ends > at - BEFORE_S) & (ends <= at)
    last = (ends > until - LAST_S) & (ends <= until)
    out: dict[str, dict[str, list[float]]] = {
        name + suffix: {"drift": [], "null": []} for name in STATISTICS for suffix in ("", BY_REQUEST)}
    for name, (fault, sign, value, summarise) in STATISTICS.items():
        faulty = scenario.replica(fault, scenario.faulty_index)
        for pool in (fault, *scenario.clean):
            mine = rows["model"] == pool
            replicas = sorted(set(rows["replica"][mine].tolist()))
            window = np.searchsorted(ends, rows["t"][mine], side="right")  # the window each request ends in
            values = value({k: v[mine] for k, v in rows.items()})
            table = np.full((len(replicas), len(ends)), np.nan)
            requests = np.zeros((len(replicas), len(ends)))
            for i, replica in enumerate(replicas):
                own = (rows["replica"][mine] == replica) & np.isfinite(values)
                for w in np.unique(window[own]).tolist():
                    if w < len(ends):
                        table[i, w] = summarise(values[own & (window == w)])
                        requests[i, w] = np.count_nonzero(own & (window == w))
            ratio = table - np.nanmedian(np.where(np.isfinite(table), table, np.nan), axis=0)
            for i, replica in enumerate(replicas):
                a, b = ratio[i, before], ratio[i, last]
                a, b = a[np.isfinite(a)], b[np.isfinite(b)]
                if len(a) < 5 or len(b) < 3 or a.std() == 0.0:
                    continue  # too few windows to say anything
                t = float((b.mean() - a.mean()) / (a.std() / np.sqrt(len(b))))
                na = requests[i, before][np.isfinite(ratio[i, before])]
                nb = np.minimum(requests[i, last][np.isfinite(ratio[i, last])], na.mean())
                ma, mb = float(np.average(a, weights=na)), float(np.average(b, weights=nb))
                spread = float(np.sqrt(np.sum(na * (a - ma) ** 2) / (len(a) - 1)))
                t_request = float((mb - ma) / (spread / np.sqrt(nb.sum()))) if spread > 0.0 else math.nan
                key = "drift" if (pool, replica) == (fault, faulty) else "null"
                for suffix, stat in (("", t), (BY_REQUEST, t_request)):
                    if math.isfinite(stat):
                        out[name + suffix][key].append(sign * stat if key == "drift" else stat)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", help="shapes (default: all of bench/quality's)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "separability.json")
    args = parser.parse_args(argv)
    shapes = args.shape or list(SHAPES)
    scenarios = [Scenario.learned(make_shape(shape), int(seed)) for shape in shapes for seed in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(t_statistics, scenarios))
    report: dict[str, Any] = {"machine": machine_info(), "statistics": {}}
    for name in (name + suffix for name in STATISTICS for suffix in ("", BY_REQUEST)):
        fault = STATISTICS[name.removesuffix(BY_REQUEST)][0]
        print(f"\n{name} ({fault})\n{'shape':<15} {'faulty replica t (per seed)':<32} "
              f"{'null: p95':>9} {'max':>6} {'inside':>7}")
        per_shape: dict[str, Any] = {}
        for shape in shapes:
            mine = [r[name] for s, r in zip(scenarios, results, strict=True) if s.shape.name == shape]
            drift = [t for r in mine for t in r["drift"]]
            null = np.abs([t for r in mine for t in r["null"]])
            top = float(null.max()) if len(null) else float("nan")
            inside = sum(t <= top for t in drift)  # t is signed: > 0 where the fault moves it
            per_shape[shape] = {"drift": [round(t, 2) for t in drift], "null_max": round(top, 2),
                                "null_p95": round(float(np.percentile(null, 95)), 2), "null_n": len(null),
                                "inside": inside}
            print(f"{shape:<15} {', '.join(f'{t:.1f}' for t in drift):<32} "
                  f"{per_shape[shape]['null_p95']:>9.1f} {top:>6.1f} {inside:>4}/{len(drift)}")
        total = sum(v["inside"] for v in per_shape.values())
        runs = sum(len(v["drift"]) for v in per_shape.values())
        print(f"{'all':<15} {'':<32} {'':>9} {'':>6} {total:>4}/{runs}")
        report["statistics"][name] = {"fault": fault, "shapes": per_shape, "inside": total,
                                      "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
