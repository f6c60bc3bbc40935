"""The seed's routing table, reproduced on the fleet simulator, on every traffic shape (benchmark 2).

Seed claim (seed §1), P99 latency deviation / GPU-utilisation spread: round robin
±380 ms / ±22 %, least connections ±290 ms / ±18 %, multi-signal dynamic weights ±65 ms / ±5 %.
Targets (:func:`verdict`): ``dynamic_least_request``'s P99 deviation at most 0.8 x least
connections' and at least 3x tighter than round robin's, its fleet P99 at most least connections',
its throughput within 2 % of theirs; ``dynamic`` at least 3x tighter than round robin.

**Scenario** (one for every policy, so only the router differs), on each trace of ``--trace``
(default all: ``conv``, the Azure conversation trace, ``code``, the Azure code trace, and
``mooncake``, the long-context FAST'25 synthetic trace, on the engine its prompts need:
:mod:`skewwatch.sim.shapes`), in each variant of ``--variant`` (``faults``, the default; ``hetero``:
r2 on a GPU at ``HETERO_SPEED`` of the others' speed for the whole run and no fault; ``high``: the
faults at ``HIGH_LOAD``; ``all``): ``REPLICAS``
replicas of one 70B-class model, ``LOAD`` of the fleet's estimated capacity, ``RUN_S`` of
arrivals, seed ``SEED``, and the faults of :data:`FAULTS` — a thermally throttled replica for
most of the run, KV-cache fragmentation and a batch-scheduler collapse, each on another replica.
(No context burst: in the simulator a burst belongs to the replica — whatever is routed there
gets long prompts — so it says nothing about a router.) The first ``WARMUP_S`` are not measured.

**Policies** (the simulator's ``--policy`` list, :mod:`skewwatch.sim.router`). ``round_robin``
and ``least_connections`` route on their own. ``dynamic`` and ``dynamic_least_request`` are the
pipeline in the loop: the real ``skewwatch worker`` on a real broker reads the
simulator's events and telemetry and publishes ``llm.routing-corrections``; the simulator
applies each step's correction before simulating the next step (lockstep on event time,
:func:`skewwatch.sim.loop.run_kafka_loop`, two steps of lag for the allowed lateness). It runs
once per detector profile (``default``: the worker's defaults; ``tuned``:
``bench/profiles/tuned.toml``; ``seed``: the seed's rules, ``bench/common.py``). ``dynamic`` applies
the weights by smooth weighted round robin
(the seed's reading: traffic in proportion to the weights); ``dynamic_least_request`` applies the
same corrections as weighted least request, each request to ``argmin (in_flight + 1) / weight``
(as Envoy and nginx do it), so between two corrections the router also sees its own in-flight
counts. Extra rows ``... (in-process)`` close the same loops with the worker's stages in-process
(:class:`~skewwatch.sim.local_pipeline.LocalPipeline`: detectors, actions and weights, no Kafka, the
same two steps of lag), for comparison; ``--in-process`` runs only those (no broker: seconds).

**Oracle** (:class:`OracleRouter`, the row ``oracle``): the corrections told the truth. It routes by
weighted least request, as ``dynamic_least_request``, with weights it is told rather than
estimates: each replica's true decode speed (``1 / factor`` while a ``slow_replica`` injection, the
slower GPU of ``hetero`` included, is active) and each other fault's replica demoted to
``demote_factor`` of the others exactly while its fault lasts, as an alert that opened and resolved
with no delay would. It is a reference, not a bound (a demotion that outlasts a fault, or a weight
other than the true speed, can do better on one run); each target line says how it did, so a
target the oracle misses is one that knowing the truth did not meet either.

**Definitions** (:func:`routing_metrics`; requests that *arrived* in the measured span):

- *P99 latency deviation* = population standard deviation, across replicas, of each replica's
  P99 end-to-end latency over the whole measured span (successful requests), in ms — the
  seed's "±" figure. Its *variation over 5 s steps*: at every step end t, each replica's P99
  over the requests that finished in [t − 60 s, t) (replicas with at least ``MIN_STEP_COUNT``),
  the std across replicas; reported as mean and P95 over the steps.
- *GPU-utilisation spread* = population std across replicas of each replica's mean utilisation
  (simulated SM activity, telemetry every 5 s), in percentage points; per step: the std across
  replicas of that step's samples, mean and P95.
- Fleet P99 (all successful requests), throughput (successful requests per second of the
  measured span), CUDA-failed requests, and dropped requests (never served: could not fit the
  KV cache, or still in flight when the drain limit passed).

    .venv/bin/python bench/routing.py                 # every trace, ~5 min on 2 cores
    .venv/bin/python bench/routing.py --quick         # 5 simulated minutes each
    .venv/bin/python bench/routing.py --in-process    # no broker: the loops in-process only

Prints one table per run (with each fault's time to restore: from its end until the router
applies a weight of at least ``RESTORED_SHARE`` x an equal share to its replica), writes
``bench/results/routing.json`` and ``bench/results/routing.png`` (``routing_<run>.png`` for the others).

>>> import numpy as np
>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> rows = [dict(request_id=f"{r}{i}", ts=100.0 + i, model="m", replica=r, latency_ms=lat, prompt_tokens=1,
...              completion_tokens=1) for r, lat in (("a", 100.0), ("b", 300.0)) for i in range(10)]
>>> m = routing_metrics(RequestColumns.from_rows(rows), [], t0=90.0, t1=120.0)
>>> m["p99_deviation_ms"], m["replicas"]["a"]["share"], m["fleet_latency_p99_ms"]
(100.0, 0.5, 300.0)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    EVERY_STEP_ENV,
    PROFILES,
    RESULTS,
    Worker,
    delete_run_topics,
    fresh_settings,
    kafka,
    machine,
    parse_profile,
    profile_settings,
)
from skewwatch.schemas.requests.columns import RequestColumns  # noqa: E402
from skewwatch.schemas.telemetry_sample import TelemetrySample  # noqa: E402
from skewwatch.sim.faults import Injection  # noqa: E402
from skewwatch.sim.router import CORRECTION_POLICIES, WeightedLeastRequestRouter  # noqa: E402

START_TS = 1_700_000_000.0
REPLICAS = 8
LOAD = 0.7
SEED = 1
RUN_S = 1200.0
WARMUP_S = 60.0
WINDOW_S, STEP_S = 60.0, 5.0
MIN_STEP_COUNT = 10  # a replica's P99 over fewer requests in a 60 s window is its maximum: not used
# (kind, replica, at_s, for_s, params): what goes wrong, the same under every policy
FAULTS: tuple[tuple[str, str, float, float, dict[str, Any]], ...] = (
    ("slow_replica", "r1", 120.0, 960.0, {"factor": 1.5}),  # thermal throttling for most of the run
    ("kv_pressure", "r3", 300.0, 400.0, {}),  # fragmentation: less usable KV, lower hit rate
    ("batch_collapse", "r5", 600.0, 180.0, {}),  # scheduler stuck at small batches
)
HETERO_SPEED = 0.6  # the heterogeneous pool: one replica on a GPU this fast relative to the others, no fault
HIGH_LOAD = 0.9  # the high-load run: queue-bound (the default LOAD is already the quality bench's 3x)
#: the runs of each trace: the faults at LOAD; one slower GPU and no fault; the faults at HIGH_LOAD
VARIANTS: tuple[str, ...] = ("faults", "hetero", "high")
RESTORED_SHARE = 0.8  # a replica is restored once its weight is back at this x an equal share
SEED_TABLE: dict[str, tuple[float, float]] = {  # the seed's claim: P99 deviation (ms), utilisation spread (%)
    "round_robin": (380.0, 22.0),
    "least_connections": (290.0, 18.0),
    "dynamic": (65.0, 5.0),
}


TRACES: tuple[str, ...] = ("conv", "code", "mooncake")


@dataclass(frozen=True, slots=True)
class Scenario:
    trace: str = "conv"
    replicas: int = REPLICAS
    load: float = LOAD
    seed: int = SEED
    run_s: float = RUN_S
    warmup_s: float = WARMUP_S
    variant: str = "faults"

    @classmethod
    def of(cls, trace: str, variant: str, run_s: float = RUN_S, seed: int = SEED) -> Scenario:
        """``variant`` of ``trace`` (:data:`VARIANTS`): ``high`` runs at :data:`HIGH_LOAD`."""
        return cls(trace=trace, run_s=run_s, variant=variant, load=HIGH_LOAD if variant == "high" else LOAD,
                   seed=seed)

    @property
    def name(self) -> str:
        return self.trace if self.variant == "faults" else f"{self.trace}/{self.variant}"

    def faults(self) -> tuple[tuple[str, str, float, float, dict[str, Any]], ...]:
        """What goes wrong: :data:`FAULTS`; the heterogeneous pool has none (its slow GPU is no fault)."""
        if self.variant == "hetero":
            return ()
        return tuple(f for f in FAULTS if int(f[1][1:]) < self.replicas and f[2] < self.run_s)

    def injections(self) -> tuple[Injection, ...]:
        made = [Injection(kind, replica, at, min(dur, max(self.run_s - at, 1.0)), params)
                for kind, replica, at, dur, params in self.faults()]
        if self.variant == "hetero":  # r2's GPU serves at HETERO_SPEED of the others' for the whole run
            made.append(Injection("slow_replica", "r2", 0.0, self.run_s + 60.0, {"factor": 1.0 / HETERO_SPEED}))
        return tuple(made)

    def watched(self) -> list[str]:
        """The replicas the tables follow: the faulty ones, or the slower GPU."""
        return sorted({inj.replica for inj in self.injections()}, key=lambda r: int(r[1:]))


# ----------------------------------------------------------------------------- metrics (pure)


def _p99(values: np.ndarray) -> float | None:
    return float(np.percentile(values, 99)) if len(values) else None


def _std(values: Sequence[float]) -> float | None:
    return float(np.std(values)) if len(values) > 1 else None


def _series_stats(series: Sequence[float]) -> dict[str, float | None]:
    if not series:
        return {"mean": None, "p95": None, "std": None}
    arr = np.asarray(series, dtype=float)
    return {"mean": float(arr.mean()), "p95": float(np.percentile(arr, 95)), "std": float(arr.std())}


def routing_metrics(requests: RequestColumns, telemetry: Sequence[TelemetrySample], t0: float, t1: float,
                    dropped: int = 0) -> dict[str, Any]:
    """The table's numbers for requests that arrived in ``[t0, t1)`` (see the module docstring)."""
    arrival = requests.ts - requests.latency_ms / 1000.0
    cols = requests.take((arrival >= t0) & (arrival < t1))
    ok = ~cols.is_error
    names = sorted(set(cols.replica.tolist()) | {s.replica for s in telemetry})
    per: dict[str, dict[str, Any]] = {}
    for name in names:
        mine = cols.replica == name
        util = [s.utilization_gpu for s in telemetry
                if s.replica == name and s.utilization_gpu is not None and t0 < s.ts <= t1]
        per[name] = {"requests": int(mine.sum()), "share": float(mine.mean()) if len(cols) else 0.0,
                     "latency_p99_ms": _p99(cols.latency_ms[mine & ok]),
                     "utilization_mean_pct": 100.0 * float(np.mean(util)) if util else None}
    p99s = [p["latency_p99_ms"] for p in per.values() if p["latency_p99_ms"] is not None]
    utils = [p["utilization_mean_pct"] for p in per.values() if p["utilization_mean_pct"] is not None]
    # per 5 s step: P99 per replica over the 60 s window ending there (the pipeline's view)
    step_p99_spread: list[float] = []
    done = requests.take(~requests.is_error)
    for t in np.arange(t0 + WINDOW_S, t1 + 1e-9, STEP_S):
        in_window = (done.ts >= t - WINDOW_S) & (done.ts < t)
        values = []
        for name in names:
            lat = done.latency_ms[in_window & (done.replica == name)]
            if len(lat) >= MIN_STEP_COUNT:
                values.append(float(np.percentile(lat, 99)))
        spread = _std(values)
        if spread is not None:
            step_p99_spread.append(spread)
    by_step: dict[float, list[float]] = {}
    for s in telemetry:
        if t0 < s.ts <= t1 and s.utilization_gpu is not None:
            by_step.setdefault(round(s.ts, 3), []).append(100.0 * s.utilization_gpu)
    step_util_spread = [float(np.std(v)) for v in by_step.values() if len(v) > 1]
    return {
        "requests": len(cols),
        "p99_deviation_ms": _std(p99s),
        "p99_range_ms": (max(p99s) - min(p99s)) if p99s else None,
        # which replica the deviation comes from: the same std with each replica left out
        "p99_deviation_without_ms": {name: _std([p["latency_p99_ms"] for other, p in per.items()
                                                 if other != name and p["latency_p99_ms"] is not None])
                                     for name in names},
        "p99_deviation_per_step_ms": _series_stats(step_p99_spread),
        "utilization_spread_pp": _std(utils),
        "utilization_spread_per_step_pp": _series_stats(step_util_spread),
        "fleet_latency_p99_ms": _p99(cols.latency_ms[ok]),
        "fleet_latency_p50_ms": float(np.percentile(cols.latency_ms[ok], 50)) if ok.any() else None,
        "throughput_rps": float(ok.sum()) / (t1 - t0),
        "cuda_failed": int((cols.is_error & (cols.cuda_error != None)).sum()),  # noqa: E711 - numpy elementwise
        "dropped": dropped,
        "replicas": per,
        "series": {"p99_spread_ms": step_p99_spread, "utilization_spread_pp": step_util_spread},
    }


# ----------------------------------------------------------------------------- runs


def _simulator(scenario: Scenario, policy: str, on_step: Callable[..., None] | None) -> Any:
    from skewwatch.sim.fleet import FleetSimulator
    from skewwatch.sim.shapes import make_shape

    config = make_shape(scenario.trace).fleet_config(replicas=scenario.replicas, policy=policy, load=scenario.load,
                                                      seed=scenario.seed, injections=scenario.injections())
    return FleetSimulator(config, START_TS, scenario.run_s, on_step=on_step)


def _finish(sim: Any, requests: list[RequestColumns], telemetry: list[TelemetrySample], scenario: Scenario,
            extra: dict[str, Any], applied: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    stats = sim.stats()  # "failed": never served (could not fit the KV cache, or past the drain limit)
    metrics = routing_metrics(RequestColumns.concat(requests), telemetry, START_TS + scenario.warmup_s,
                              START_TS + scenario.run_s, dropped=int(stats["failed"]))
    restore = {} if applied is None else {"restore_s": restore_times(applied, scenario)}
    return {**metrics, "arrivals": stats["arrivals"], "fallback_picks": stats["fallbacks"], **restore, **extra}


def run_local(scenario: Scenario, policy: str, profile: str | None = None) -> dict[str, Any]:
    """A policy without Kafka; the dynamic policies with the worker's stages in-process, lag 2 steps."""
    from skewwatch.sim.local_pipeline import LocalPipeline

    loop = None
    if policy in CORRECTION_POLICIES:
        loop = LocalPipeline(profile_settings(profile or "default", EVERY_STEP_ENV), apply=True, lag_steps=2)
    requests: list[RequestColumns] = []
    telemetry: list[TelemetrySample] = []

    def keep(sim: Any, chunk: Any) -> None:
        if loop is not None:
            loop(sim, chunk)
        requests.append(chunk.requests)
        telemetry.extend(chunk.telemetry)

    began = time.monotonic()
    sim = _simulator(scenario, policy, keep)
    applied = _record_corrections(sim)
    for _ in sim.chunks():
        pass
    return _finish(sim, requests, telemetry, scenario, {"wall_s": round(time.monotonic() - began, 1)}, applied)


class OracleRouter(WeightedLeastRequestRouter):
    """Weighted least request with the weights the faults imply (the module docstring's *Oracle*).

    >>> slow = Injection("slow_replica", "b", 10.0, 100.0, {"factor": 2.0})
    >>> stuck = Injection("batch_collapse", "c", 50.0, 10.0, {})
    >>> r = OracleRouter([slow, stuck], start_ts=0.0, demote_factor=0.5)
    >>> r.weights("m", ["a", "b", "c"], now=5.0), r.weights("m", ["a", "b", "c"], now=55.0)
    ([1.0, 1.0, 1.0], [1.0, 0.5, 0.5])
    """

    def __init__(self, injections: Sequence[Injection], start_ts: float, demote_factor: float) -> None:
        super().__init__()
        # (replica, start, end, speed factor or None: demoted)
        self._spans = [(inj.replica, *inj.window(start_ts),
                        float(inj.param("factor")) if inj.kind == "slow_replica" else None) for inj in injections]
        self._demote_factor = demote_factor

    def weights(self, model: str, pool: Sequence[str], now: float) -> list[float]:
        out = []
        for replica in pool:
            weight = 1.0
            for target, start, end, factor in self._spans:
                if target == replica and start <= now < end:
                    weight *= 1.0 / factor if factor else self._demote_factor
            out.append(weight)
        return out


def run_oracle(scenario: Scenario) -> dict[str, Any]:
    """The ``oracle`` row: :class:`OracleRouter` on the scenario's own injections."""
    from skewwatch.pipeline.weights import WeightConfig

    requests: list[RequestColumns] = []
    telemetry: list[TelemetrySample] = []

    def keep(sim: Any, chunk: Any) -> None:
        requests.append(chunk.requests)
        telemetry.extend(chunk.telemetry)

    began = time.monotonic()
    sim = _simulator(scenario, "dynamic_least_request", keep)
    sim.router = OracleRouter(scenario.injections(), START_TS, WeightConfig().demote_factor)
    for _ in sim.chunks():
        pass
    return _finish(sim, requests, telemetry, scenario, {"wall_s": round(time.monotonic() - began, 1)})


def _record_corrections(sim: Any) -> list[dict[str, Any]]:
    """Every correction the simulator's router applies: its ``ts``, when it was applied (``now``),
    its weights (4 decimals) and actions."""
    applied: list[dict[str, Any]] = []
    original_apply = sim.apply_correction

    def apply_and_record(record: Any, now: float) -> None:
        weights = {str(r): round(float(w), 4) for r, w in dict(record.get("weights") or {}).items()}
        applied.append({"ts": record["ts"], "now": now, "weights": weights,
                        "actions": [(a.get("replica"), a.get("action")) for a in record.get("actions") or []]})
        original_apply(record, now)

    sim.apply_correction = apply_and_record
    return applied


def restore_times(applied: Sequence[Mapping[str, Any]], scenario: Scenario) -> dict[str, float | None]:
    """Per fault that ends before the run does (``kind@replica``): seconds from its end until the
    router applies a weight of at least :data:`RESTORED_SHARE` x an equal share to its replica
    (None: not by the run's end); ``applied``: the corrections as :func:`_record_corrections` keeps them.

    >>> s = Scenario(run_s=1200.0)
    >>> w = [{"now": START_TS + 700.0, "weights": {"r3": 0.02, "r0": 0.98}},
    ...      {"now": START_TS + 745.0, "weights": {"r3": 0.45, "r0": 0.55}}]
    >>> restore_times(w, s)["kv_pressure@r3"], restore_times(w, s)["batch_collapse@r5"]
    (45.0, None)
    """
    out: dict[str, float | None] = {}
    for kind, replica, at, dur, _ in scenario.faults():
        end = START_TS + at + dur
        if at + dur >= scenario.run_s:
            continue
        out[f"{kind}@{replica}"] = next(
            (round(a["now"] - end, 1) for a in applied
             if a["now"] >= end and replica in a["weights"]
             and a["weights"][replica] >= RESTORED_SHARE * sum(a["weights"].values()) / len(a["weights"])), None)
    return out


def run_worker_loop(scenario: Scenario, bootstrap: str, workdir: Path, profile: str,
                    policy: str = "dynamic") -> dict[str, Any]:
    """A dynamic policy through the real worker: lockstep on its ``llm.routing-corrections``."""
    from skewwatch.sim.emit import TrafficProducer
    from skewwatch.sim.loop import KafkaCorrections, run_kafka_loop

    settings = fresh_settings(bootstrap)
    topics = settings.topics
    requests: list[RequestColumns] = []
    telemetry: list[TelemetrySample] = []

    def keep(sim: Any, chunk: Any) -> None:
        requests.append(chunk.requests)
        telemetry.extend(chunk.telemetry)

    sim = _simulator(scenario, policy, keep)
    applied = _record_corrections(sim)
    corrections = KafkaCorrections(bootstrap, topics.routing_corrections)
    began = time.monotonic()

    async def loop() -> None:
        await corrections.start()
        try:
            async with TrafficProducer(bootstrap, requests_topic=topics.requests,
                                       telemetry_topic=topics.gpu_telemetry, batch=100) as producer:
                await run_kafka_loop(sim, producer, corrections, lag_steps=2, timeout_s=30.0)
        finally:
            await corrections.stop()

    run_name = f"routing-{scenario.name.replace('/', '-')}-{policy}-{profile.partition('=')[0]}"
    worker = Worker(settings, workdir / run_name, profile, extra_env=EVERY_STEP_ENV)
    try:
        worker.start()
        asyncio.run(loop())
    finally:
        worker.stop()
        delete_run_topics(bootstrap, settings)
    return _finish(sim, requests, telemetry, scenario,
                   {"wall_s": round(time.monotonic() - began, 1), "lockstep_misses": corrections.misses,
                    "corrections_applied": len(applied),
                    "weights_applied": [{"ts": a["ts"], "weights": a["weights"], "actions": a["actions"]}
                                        for a in applied]},
                   applied)


# ----------------------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "—" if value is None else f"±{value:,.0f}"


def _pp(value: float | None) -> str:
    return "—" if value is None else f"±{value:.1f}"


def table(rows: dict[str, dict[str, Any]], faulty: Sequence[str]) -> str:
    lines = ["| policy | P99 deviation (ms) | per 5 s step: mean / P95 (ms) | GPU util spread (pp) | "
             "per step: mean / P95 (pp) | fleet P99 (ms) | throughput (req/s) | dropped / CUDA-failed | "
             f"share of {', '.join(faulty)} | seed's claim |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        step, ustep = r["p99_deviation_per_step_ms"], r["utilization_spread_per_step_pp"]
        seed = SEED_TABLE.get(name)
        share = sum(r["replicas"].get(f, {}).get("share", 0.0) for f in faulty)
        lines.append(
            f"| {name} | {_ms(r['p99_deviation_ms'])} | {_ms(step['mean'])} / {_ms(step['p95'])} | "
            f"{_pp(r['utilization_spread_pp'])} | {_pp(ustep['mean'])} / {_pp(ustep['p95'])} | "
            f"{r['fleet_latency_p99_ms']:,.0f} | {r['throughput_rps']:.2f} | {r['dropped']} / {r['cuda_failed']} | "
            f"{share:.3f} | {'—' if seed is None else f'±{seed[0]:.0f} ms / ±{seed[1]:.0f} %'} |")
    return "\n".join(lines)


def breakdown(rows: dict[str, dict[str, Any]], faulty: Sequence[str]) -> str:
    """Where each row's P99 deviation comes from: each faulty replica's P99, and the deviation without it."""
    lines = ["| policy | " + " | ".join(f"{f}: P99 (ms) / deviation without it" for f in faulty) + " |",
             "|---|" + "---:|" * len(faulty)]
    for name, r in rows.items():
        cells = [f"{r['replicas'][f]['latency_p99_ms']:,.0f} / {_ms(r['p99_deviation_without_ms'].get(f))}"
                 if r["replicas"].get(f, {}).get("latency_p99_ms") is not None else "—" for f in faulty]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: dict[str, dict[str, Any]], scenario: Scenario, path: Path) -> None:
    """Per-step P99 spread and utilisation spread over time, one line per policy."""
    try:
        import matplotlib
    except ImportError:  # the bench extra is not installed: the tables and JSON are the result
        print(f"(no plot {path}: matplotlib is not installed; pip install -e '.[bench]')", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    for name, r in rows.items():
        p99 = r["series"]["p99_spread_ms"]
        util = r["series"]["utilization_spread_pp"]
        if name.endswith("in-process)"):
            continue  # the plot shows what was measured through the real pipeline
        axes[0].plot(scenario.warmup_s + WINDOW_S + STEP_S * np.arange(len(p99)), np.asarray(p99) / 1000.0,
                     label=name, lw=1.1)
        axes[1].plot(scenario.warmup_s + STEP_S * (1 + np.arange(len(util))), util, label=name, lw=1.1)
    for kind, replica, at, dur, _ in scenario.faults():
        if at < scenario.run_s:
            for ax in axes:
                ax.axvspan(at, min(at + dur, scenario.run_s), alpha=0.06, color="gray")
            axes[1].text(at + 3, 0.97, f"{kind} {replica}", fontsize=7, va="top",
                         transform=axes[1].get_xaxis_transform())
    axes[0].set_ylabel("std across replicas of\n60 s P99 latency (s)")
    axes[1].set_ylabel("std across replicas of\nGPU utilisation (pp)")
    axes[1].set_xlabel("event time (s)")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    what = (f"r2 at {HETERO_SPEED:g} x the others' speed, no fault" if scenario.variant == "hetero"
            else "gray: injected faults")
    axes[0].set_title(f"Routing policies, {scenario.replicas} replicas, load {scenario.load:g}, {scenario.trace} "
                      f"trace ({what})", fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()  # keeps the legend on the right inside the figure
    fig.savefig(path, dpi=110)
    plt.close(fig)


def row_name(policy: str, profile: str, in_process: bool = False) -> str:
    """``dynamic``, ``dynamic (tuned)``, ``dynamic_least_request (tuned, in-process)``, ...

    >>> row_name("dynamic", "default"), row_name("dynamic_least_request", "tuned", in_process=True)
    ('dynamic', 'dynamic_least_request (tuned, in-process)')
    """
    profile = profile.partition("=")[0]
    notes = [n for n in (None if profile == "default" else profile, "in-process" if in_process else None) if n]
    return f"{policy} ({', '.join(notes)})" if notes else policy


def verdict(rows: dict[str, dict[str, Any]], profile: str, in_process: bool = False) -> dict[str, Any] | None:
    """The targets (:data:`TARGETS`): ``dynamic_least_request``'s P99 deviation at most 0.8 x least
    connections' and at least 3x tighter than round robin's; its fleet P99 at most least connections';
    its throughput within 2 % of least connections'; ``dynamic`` (the weights alone) at least 3x
    tighter than round robin.

    >>> base = {"fleet_latency_p99_ms": 1000.0, "throughput_rps": 10.0}
    >>> rows = {"round_robin": {**base, "p99_deviation_ms": 900.0},
    ...         "least_connections": {**base, "p99_deviation_ms": 400.0},
    ...         "dynamic": {**base, "p99_deviation_ms": 280.0},
    ...         "dynamic_least_request": {**base, "p99_deviation_ms": 250.0}}
    >>> v = verdict(rows, "default"); v["met"], v["checks"]["deviation_vs_least_connections"]
    (True, True)
    >>> rows["dynamic_least_request"]["throughput_rps"] = 9.7
    >>> verdict(rows, "default")["checks"]["throughput_vs_least_connections"]
    False
    """
    row = rows.get(row_name("dynamic_least_request", profile, in_process))
    if row is None or row.get("p99_deviation_ms") is None:
        return None
    rr, lc = rows["round_robin"], rows["least_connections"]
    dyn = rows.get(row_name("dynamic", profile, in_process)) or {}
    dlr = row["p99_deviation_ms"]

    def tighter(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (a / b if b else float("inf"))

    ratios = {"vs_round_robin": tighter(rr["p99_deviation_ms"], dlr),
              "vs_least_connections": tighter(lc["p99_deviation_ms"], dlr),
              "fleet_p99_vs_least_connections": tighter(row["fleet_latency_p99_ms"], lc["fleet_latency_p99_ms"]),
              "throughput_vs_least_connections": tighter(row["throughput_rps"], lc["throughput_rps"]),
              "dynamic_vs_round_robin": tighter(rr["p99_deviation_ms"], dyn.get("p99_deviation_ms")),
              "oracle_vs_least_connections": tighter(lc["p99_deviation_ms"],
                                                     (rows.get("oracle") or {}).get("p99_deviation_ms"))}
    checks = {"deviation_vs_least_connections": (ratios["vs_least_connections"] or 0.0) >= 1.0 / TARGETS["dlr_vs_lc"],
              "deviation_vs_round_robin": (ratios["vs_round_robin"] or 0.0) >= TARGETS["vs_rr"],
              "fleet_p99_vs_least_connections": (ratios["fleet_p99_vs_least_connections"] or math.inf) <= 1.0,
              "throughput_vs_least_connections": (ratios["throughput_vs_least_connections"] or 0.0)
              >= 1.0 - TARGETS["throughput_slack"],
              "dynamic_vs_round_robin": (ratios["dynamic_vs_round_robin"] or 0.0) >= TARGETS["vs_rr"]}
    return {**ratios, "checks": checks, "met": all(checks.values())}


TARGETS: dict[str, float] = {"dlr_vs_lc": 0.8, "vs_rr": 3.0, "throughput_slack": 0.02}


def targets_line(name: str, v: dict[str, Any]) -> str:
    """One line per looped profile: each target's ratio, ✗ where missed."""
    def mark(check: str) -> str:
        return "" if v["checks"][check] else " ✗"

    def num(value: float | None, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    parts = [
        f"P99 deviation {num(v['vs_round_robin'], 1)}x tighter than round robin (>= 3)"
        + mark("deviation_vs_round_robin"),
        f"least connections' / its {num(v['vs_least_connections'])} (>= 1.25)"
        + mark("deviation_vs_least_connections"),
        f"fleet P99 / least connections' {num(v['fleet_p99_vs_least_connections'], 3)} (<= 1)"
        + mark("fleet_p99_vs_least_connections"),
        f"throughput / least connections' {num(v['throughput_vs_least_connections'], 3)} (>= 0.98)"
        + mark("throughput_vs_least_connections"),
        f"dynamic {num(v['dynamic_vs_round_robin'], 1)}x tighter than round robin (>= 3)"
        + mark("dynamic_vs_round_robin"),
    ]
    if v.get("oracle_vs_least_connections") is not None:
        parts.append(f"the oracle: least connections' / its {num(v['oracle_vs_least_connections'])}")
    return f"{name}: " + "; ".join(parts)


def restore_table(rows: dict[str, dict[str, Any]]) -> str:
    """Seconds from each fault's end until its replica's weight is back at 80 % of an equal share."""
    faults = sorted({f for r in rows.values() for f in r.get("restore_s", {})})
    if not faults:
        return ""
    lines = ["| policy | " + " | ".join(f"{f}: restored after (s)" for f in faults) + " |",
             "|---|" + "---:|" * len(faults)]
    for name, r in rows.items():
        if "restore_s" not in r or not any(f in r["restore_s"] for f in faults):
            continue
        cells = ["—" if r["restore_s"].get(f) is None else f"{r['restore_s'][f]:g}" for f in faults]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_trace(scenario: Scenario, profiles: Sequence[str], bootstrap: str | None, workdir: Path) -> dict[str, Any]:
    """Every policy on one trace: the fixed routers, the loops through the worker (with a broker) and
    in-process."""
    rows: dict[str, dict[str, Any]] = {}
    for policy in ("round_robin", "least_connections"):
        rows[policy] = run_local(scenario, policy)
        print(f"{scenario.name} {policy}: {rows[policy]['wall_s']} s", file=sys.stderr)
    rows["oracle"] = run_oracle(scenario)
    looped = [(policy, profile) for policy in CORRECTION_POLICIES for profile in profiles]
    if bootstrap is not None:
        for policy, profile in looped:
            name = row_name(policy, profile)
            rows[name] = run_worker_loop(scenario, bootstrap, workdir, profile, policy)
            print(f"{scenario.name} {name}: {rows[name]['wall_s']} s, lockstep misses "
                  f"{rows[name]['lockstep_misses']}", file=sys.stderr)
    for policy, profile in looped:
        rows[row_name(policy, profile, in_process=True)] = run_local(scenario, policy, profile)
    targets = {row_name("dynamic_least_request", p, local): verdict(rows, p, local)
               for p in profiles for local in (False, True)}
    return {"scenario": {"trace": scenario.trace, "variant": scenario.variant, "replicas": scenario.replicas,
                         "load": scenario.load, "seed": scenario.seed, "run_s": scenario.run_s,
                         "warmup_s": scenario.warmup_s,
                         "faults": [{"kind": k, "replica": r, "at_s": a, "for_s": d, "params": p}
                                    for k, r, a, d, p in scenario.faults()],
                         "slower_gpu": {"replica": "r2", "speed": HETERO_SPEED} if scenario.variant == "hetero"
                         else None},
            "target": {k: v for k, v in targets.items() if v is not None}, "rows": rows}


def _profile(spec: str) -> str:
    """``--profile``: a known profile or NAME=PATH (bench/common.py ``parse_profile``)."""
    try:
        parse_profile(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 simulated seconds (smoke run)")
    parser.add_argument("--trace", action="append", choices=list(TRACES), help="trace(s) (default: all)")
    parser.add_argument("--variant", action="append", choices=[*VARIANTS, "all"],
                        help="run(s) of each trace: faults (default), hetero (r2 on a GPU at 0.6 x the "
                             "others' speed, no fault), high (the faults at load 0.9), all")
    parser.add_argument("--profile", action="append", type=_profile,
                        help=f"detector profile(s) for the dynamic policies: {', '.join(PROFILES)}, or NAME=PATH "
                             "of a configuration file (default: default and tuned)")
    parser.add_argument("--seed", type=int, default=SEED,
                        help="the simulator's seed: arrivals, lengths and faults' draws (one run is one draw: "
                             "repeat with others before reading a ratio)")
    parser.add_argument("--in-process", action="store_true",
                        help="close the dynamic loops in-process only (no broker, no worker)")
    parser.add_argument("--out", type=Path, default=RESULTS / "routing.json")
    parser.add_argument("--plot", type=Path, help="default: beside --out, .png (one per trace after the first)")
    args = parser.parse_args(argv)
    traces = args.trace or list(TRACES)
    variants = list(VARIANTS) if "all" in (args.variant or []) else (args.variant or ["faults"])
    profiles = args.profile or ["default", "tuned"]
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="skewwatch-routing-"))
    results: dict[str, dict[str, Any]] = {}
    scenarios: dict[str, Scenario] = {}
    with contextlib.ExitStack() as stack:
        bootstrap = None if args.in_process else stack.enter_context(kafka(workdir))
        for trace in traces:
            for variant in variants:
                scenario = Scenario.of(trace, variant, run_s=300.0 if args.quick else RUN_S, seed=args.seed)
                scenarios[scenario.name] = scenario
                results[scenario.name] = run_trace(scenario, profiles, bootstrap, workdir)
    plots = []
    for name, result in results.items():
        scenario = scenarios[name]
        watched = scenario.watched()
        print(f"\n## {name}: {scenario.replicas} replicas, load {scenario.load:g}"
              + (f", r2 at {HETERO_SPEED:g} x the others' speed, no fault" if scenario.variant == "hetero" else "")
              + "\n")
        print(table(result["rows"], watched))
        print()
        print(breakdown(result["rows"], watched))
        restored = restore_table(result["rows"])
        if restored:
            print()
            print(restored)
        for row, v in result["target"].items():
            print("\n" + targets_line(row, v))
        base = args.plot or args.out.with_suffix(".png")
        path = base if name == next(iter(results)) else base.with_name(
            f"{base.stem}_{name.replace('/', '_')}{base.suffix}")
        plot(result["rows"], scenario, path)
        plots.append(str(path))
    out = {"machine": machine(), "wall_s": round(time.monotonic() - began, 1), "quick": args.quick,
           "profiles": profiles, "variants": variants, "in_process_only": args.in_process,
           "seed_claim": {k: {"p99_deviation_ms": v[0], "utilization_spread_pct": v[1]} for k, v in SEED_TABLE.items()},
           "traces": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)  # broker data and worker logs (a failure raised before this)
    print(f"wrote {args.out} and {', '.join(plots)} in {out['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
