"""``bench/decide_bench``: the cost of stage 2's decisions (``ModelDecider.step``) per replica.

In-process and pure: ``R`` replicas (default 1k and 10k) spread over 50 models, one decider per
model, fed realistic per-replica feature vectors every 5 s step (log-normal latencies with a
P99/P50 of about 2.5, batch std around 2.8 and fill around 0.5, a few percent of replicas with a
long tail or a CUDA error now and then, fresh telemetry on every replica), plus the per-model
vector. After ``--warm`` steps (so every detector holds state for every replica), each measured
step times ``ModelDecider.step`` over all models in CPU time (``time.process_time``) and wall time.
Memory: tracemalloc bytes held by the deciders per replica after the warm-up.

``--baseline REV`` runs the same measurement on the package as of git revision ``REV`` (extracted
to a temporary directory, run in a child process) *interleaved* with the working tree's, so the
two columns of the table come from one run on one machine.

Run: ``.venv/bin/python bench/decide_bench.py [--replicas 1000,10000] [--baseline HEAD~3]``;
prints a table and writes ``bench/results/decide.json`` (``--out`` to write elsewhere).
``--quick`` is a seconds-long smoke run.

>>> vectors = feature_vectors(make_fleet(4, 2), 60.0, np.random.default_rng(1))
>>> sorted(vectors), [v.replica for v in vectors["model-00"]]
(['model-00', 'model-01'], ['r000000', 'r000002'])
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path or os.environ.get("DECIDE_BENCH_PACKAGE"):
    # a baseline child puts the old package first; otherwise `python bench/decide_bench.py` needs the repo
    sys.path.insert(0, os.environ.get("DECIDE_BENCH_PACKAGE") or str(REPO))

import numpy as np  # noqa: E402

# a baseline child runs an older package: each name from where its revision kept it
try:
    from skewwatch.pipeline.detector_settings import DetectorSettings
except ImportError:
    from skewwatch.pipeline.decide import DetectorSettings  # type: ignore[no-redef]
try:
    from skewwatch.pipeline.model_decisions import ModelDecider
except ImportError:
    from skewwatch.pipeline.decide import ModelDecider  # type: ignore[no-redef]
try:
    from skewwatch.schemas.feature_vector import FeatureVector
    from skewwatch.schemas.telemetry_sample import TelemetrySample
except ImportError:
    from skewwatch.pipeline.features import FeatureVector  # type: ignore[no-redef]
    from skewwatch.pipeline.telemetry import TelemetrySample  # type: ignore[no-redef]

RESULTS = REPO / "bench" / "results"
STEP_S = 5.0
START = 1_700_000_000.0
MODELS = 50

Fleet = dict[str, list[str]]  # model -> its replicas


def make_fleet(n_replicas: int, models: int) -> Fleet:
    fleet: Fleet = {}
    for i in range(n_replicas):
        fleet.setdefault(f"model-{i % models:02d}", []).append(f"r{i:06d}")
    return fleet


def feature_vectors(fleet: Fleet, t: float, rng: np.random.Generator) -> dict[str, list[FeatureVector]]:
    """One step's per-replica vectors of every model (window ending at ``t``)."""
    n = sum(len(r) for r in fleet.values())
    count = rng.poisson(240, n)
    step_count = rng.poisson(20, n)
    p50 = 800.0 * rng.lognormal(0.0, 0.1, n)
    tail = rng.random(n) < 0.03  # a few replicas with a long tail this step
    p99 = p50 * np.where(tail, 4.0, 2.5) * rng.lognormal(0.0, 0.05, n)
    batch_std = rng.normal(2.8, 0.3, n)
    fill = rng.normal(0.5, 0.05, n)
    prompt_mean = rng.lognormal(6.8, 0.3, n)
    prompt_var = prompt_mean**2 * rng.lognormal(0.0, 0.2, n)
    cuda = rng.random(n) < 0.002
    out: dict[str, list[FeatureVector]] = {}
    i = 0
    for model, replicas in fleet.items():
        vectors = out[model] = []
        for replica in replicas:
            vectors.append(FeatureVector(
                model=model, replica=replica, window_start=t - 60.0, window_end=t, count=int(count[i]),
                rps=count[i] / 60.0, latency_p50=float(p50[i]), latency_p95=float(p50[i] * 2.0),
                latency_p99=float(p99[i]), latency_mean=float(p50[i] * 1.1), ttft_p50=150.0, ttft_p99=300.0,
                batch_size_mean=16.0, batch_size_std=float(batch_std[i]), batch_fill_mean=float(fill[i]),
                prompt_tokens_mean=float(prompt_mean[i]), prompt_tokens_var=float(prompt_var[i]),
                completion_tokens_mean=150.0, completion_tokens_var=900.0, tokens_per_s=count[i] * 2.5,
                error_rate=0.0, queue_length_mean=2.0, kv_cache_hit_rate_mean=0.75, step_count=int(step_count[i]),
                step_cuda_errors={"cudaErrorLaunchTimeout": 1} if cuda[i] else {}, batch_count=int(count[i]),
            ))
            i += 1
    return out


def model_vector(model: str, t: float) -> FeatureVector:
    return FeatureVector(model=model, replica=None, window_start=t - 60.0, window_end=t, count=1000,
                         latency_p50=800.0, latency_p99=2000.0, latency_mean=900.0, step_count=100)


def telemetry_of(fleet: Fleet, t: float) -> dict[str, dict[str, tuple[TelemetrySample, float]]]:
    return {
        model: {r: (TelemetrySample(ts=t - 2.0, replica=r, source="nvml", memory_used_bytes=40e9,
                                    memory_total_bytes=80e9, utilization_gpu=0.7), 2.0) for r in replicas}
        for model, replicas in fleet.items()
    }


def measure(n_replicas: int, steps: int, warm: int, seed: int = 1) -> dict[str, Any]:
    """Median CPU and wall ms of one step of every model's decider, and decider bytes per replica."""
    fleet = make_fleet(n_replicas, MODELS)
    rng = np.random.default_rng(seed)
    settings = DetectorSettings()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    deciders = {m: ModelDecider(settings, model=m) for m in fleet}
    t = START
    for _ in range(warm):
        t += STEP_S
        vectors, telemetry = feature_vectors(fleet, t, rng), telemetry_of(fleet, t)
        for m, d in deciders.items():
            d.step(m, t, vectors[m], model_vector(m, t), telemetry[m])
        del vectors, telemetry
    gc.collect()
    state_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    cpu: list[float] = []
    wall: list[float] = []
    alerts = 0
    for _ in range(steps):
        t += STEP_S
        vectors, telemetry = feature_vectors(fleet, t, rng), telemetry_of(fleet, t)
        models = {m: model_vector(m, t) for m in fleet}
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        for m, d in deciders.items():
            alerts += len(d.step(m, t, vectors[m], models[m], telemetry[m]).alerts)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    cpu_ms, wall_ms = statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3
    return {
        "replicas": n_replicas,
        "models": MODELS,
        "steps_measured": steps,
        "cpu_ms": round(cpu_ms, 2),
        "wall_ms": round(wall_ms, 2),
        "cpu_us_per_replica": round(cpu_ms * 1e3 / n_replicas, 2),
        "cpu_ms_spread": [round(min(cpu) * 1e3, 2), round(max(cpu) * 1e3, 2)],
        "state_bytes_per_replica": round(state_bytes / n_replicas),
        "alerts_in_measured_steps": alerts,
    }


def measure_in_child(package: Path, n_replicas: int, steps: int, warm: int) -> dict[str, Any]:
    env = dict(os.environ, DECIDE_BENCH_PACKAGE=str(package))
    cmd = [sys.executable, __file__, "--child", str(n_replicas), "--steps", str(steps), "--warm", str(warm)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="1000,10000", help="comma-separated replica counts")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per size")
    parser.add_argument("--warm", type=int, default=14, help="warm-up steps before measuring")
    parser.add_argument("--baseline", metavar="REV", help="also measure the package at this git revision")
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run (not written)")
    parser.add_argument("--out", type=Path, default=RESULTS / "decide.json")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.steps, args.warm)))
        return 0
    sizes = [int(s) for s in args.replicas.split(",")]
    if args.quick:
        sizes, args.steps, args.warm = [200], 2, 3
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        from bench.revision import baseline_package  # the parent only: a child may lack the repo

        package = baseline_package(args.baseline, Path(tmp)) if args.baseline else None
        for n in sizes:
            row: dict[str, Any] = {"replicas": n, "current": measure_in_child(REPO, n, args.steps, args.warm)}
            if package is not None:
                row["baseline"] = measure_in_child(package, n, args.steps, args.warm)
            rows.append(row)
    print("ModelDecider.step, one 5 s step over all models (median CPU ms; us per replica; decider B/replica)")
    header = f"{'replicas':>9} {'cpu ms':>9} {'us/rep':>8} {'B/rep':>7}"
    print(header + (f"   | baseline {args.baseline}: {'cpu ms':>9} {'us/rep':>8} {'B/rep':>7}" if package else ""))
    for row in rows:
        cur = row["current"]
        line = f"{row['replicas']:>9,} {cur['cpu_ms']:>9.1f} {cur['cpu_us_per_replica']:>8.1f} " \
               f"{cur['state_bytes_per_replica']:>7,}"
        if "baseline" in row:
            b = row["baseline"]
            line += f"   | {'':>{len(args.baseline) + 10}} {b['cpu_ms']:>9.1f} {b['cpu_us_per_replica']:>8.1f} " \
                    f"{b['state_bytes_per_replica']:>7,}"
        print(line)
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"baseline_rev": args.baseline, "rows": rows,
                                        "command": " ".join(["bench/decide_bench.py", *(argv or sys.argv[1:])])},
                                       indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
