"""``bench/scale``: step cost against replicas, memory per replica, and reaction time.

Three parts, each selectable with ``--parts``:

``step``
    Pure step cost. ``R`` active replicas (default 1k, 10k, 50k) across 50 models, spread over the
    worker's 8 partitions, each receiving ``--rate`` requests/s (a few per second: a 1,000-GPU
    fleet). After 13 warm-up steps (windows full), each measured 5 s step times, in-process:
    ``PartitionWindows.close_steps`` on all 8 partitions (every replica's window moments and
    quantiles, as columns: one ``StepBatch`` per partition and step), what stage 1 builds from those
    columns (every replica's ``FeatureVector``, what publishing and stage 2 read, and per model and
    partition the replicas' summaries merged on the columns, one per hand-off record: column
    ``build``), ``merge_model_features`` of those partial summaries per model and
    ``ModelDecider.step`` per model (every detector, health, weights, correction). The stage 1 -> 2
    hand-off the worker also pays per replica (one record per partition, model and step, encoded in
    stage 1 and decoded in stage 2: ``skewwatch.pipeline.replica_step_record``) is timed separately.
    Target: <= 250 ms at 10k, linear in replicas. ``--learned both`` (the default) decides every
    measured step twice, with the worker's default detectors (the ``learned`` detector on: the
    totals and the targets) and without the learned detector, and prints the two side by side
    (``--learned on`` / ``off``: one of them only). The deciders see the last two warm-up steps only
    (``--decide-warm N``: the last ``N``; 130 lets the learned detector warm up and its shift test
    run, its steady cost).
``memory``
    Window state per active replica (tracemalloc: bytes still allocated after building 8
    partitions of full windows, and the checkpoint snapshot's bytes and CPU time), the same for the deciders'
    state; then half the replicas fall silent and the windows must release them after
    ``max(idle_release_s, length_s)``; and the RSS of the real worker holding ``--rss-replicas``
    replicas (generator traffic for 80 s of event time on a real broker, pre-produced: the worker
    drains it as a backlog), read right after the last step is published and again 20 s later, at
    rest (the worker hands freed heap back every ``limits.memory_trim_s``); the target is judged at
    rest, the reading after the backlog is reported beside it. Targets: <= 16 KiB per replica,
    <= 500 MB RSS at 10k.
``reaction``
    Wall-clock reaction time on a real broker and worker: a producer sends ``--reaction-replicas``
    replicas' traffic at a steady rate with ``ts`` = now; once per step, one replica (a new one
    each trial) reports a CUDA hardware error (``cudaErrorIllegalAddress``), which the
    ``gpu_health`` detector turns into a CRITICAL alert on the step that contains it. Measured from
    the moment that event is produced to the moment a consumer reads the alert on ``llm.alerts``,
    and also relative to the end of the step holding it (a step can close only once the
    watermark, ``max ts - allowed_lateness_s``, passes its end, so the earliest possible alert is
    ``step end + allowed_lateness_s``: that is the boundary the target is judged against).

Run: ``.venv/bin/python bench/scale.py [--parts step,memory,reaction]``; prints tables and writes
``bench/results/scale.json``. ``--quick`` is a seconds-long smoke run (used by the unit test).

>>> cols = synthetic_columns([("m0", "r0"), ("m1", "r1")], 100.0, 105.0, rate=4.0, rng=np.random.default_rng(1))
>>> sorted(set(cols.replica.tolist())), bool((cols.ts >= 100.0).all() and (cols.ts < 105.0).all())
(['r0', 'r1'], True)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/scale.py` from anywhere

import numpy as np  # noqa: E402

from bench.throughput.common import (  # noqa: E402
    RESULTS,
    broker_bootstrap,
    fresh_settings,
    machine_info,
    percentile,
    spread,
)
from skewwatch.config import WindowSettings  # noqa: E402
from skewwatch.pipeline.detector_settings import DetectorSettings  # noqa: E402
from skewwatch.pipeline.model_decisions import ModelDecider  # noqa: E402
from skewwatch.pipeline.model_merge import merge_model_features  # noqa: E402
from skewwatch.pipeline.replica_step_record import (  # noqa: E402
    RecordPart,
    decode_model_step,
    encode_model_step,
    read_step_header,
    record_parts,
    step_header,
)
from skewwatch.pipeline.window import ClosedSteps, PartitionWindows  # noqa: E402
from skewwatch.schemas.alerts import decode_alert  # noqa: E402
from skewwatch.schemas.requests.columns import RequestColumns  # noqa: E402

PARTITIONS = 8
STEP_S = 5.0
START = 1_700_000_000.0  # a multiple of the 5 s step
KIB = 1024


# ---------------------------------------------------------------------------------------------
# Synthetic steady traffic, straight into columns (the generator's per-replica Python loop is
# too slow to fill 50k replicas' windows in a benchmark; the distributions are the generator's)
# ---------------------------------------------------------------------------------------------

def synthetic_columns(replicas: list[tuple[str, str]], t0: float, t1: float, rate: float,
                      rng: np.random.Generator) -> RequestColumns:
    """Poisson(rate) requests per replica in ``[t0, t1)``; log-normal latencies, batch fill ~0.5."""
    counts = rng.poisson(rate * (t1 - t0), len(replicas))
    owner = np.repeat(np.arange(len(replicas)), counts)
    n = int(owner.size)
    models = np.array([m for m, _ in replicas], dtype=object)
    names = np.array([r for _, r in replicas], dtype=object)
    prompt = np.maximum(rng.lognormal(6.5, 1.0, n).astype(np.int64), 1)
    completion = np.maximum(rng.lognormal(5.0, 0.8, n).astype(np.int64), 1)
    cuda = np.empty(n, dtype=object)
    request_id = np.empty(n, dtype=object)
    request_id[:] = "bench"
    return RequestColumns(
        request_id=request_id,
        ts=rng.uniform(t0, t1, n),
        model=models[owner],
        replica=names[owner],
        latency_ms=800.0 * rng.lognormal(0.0, 0.2, n) * (completion / 150.0) ** 0.15,
        prompt_tokens=prompt,
        completion_tokens=completion,
        batch_size=np.maximum(rng.binomial(32, 0.5, n), 1).astype(np.int64),
        batch_capacity=np.full(n, 32, dtype=np.int64),
        ttft_ms=150.0 * rng.lognormal(0.0, 0.2, n),
        queue_length=rng.poisson(2.0, n).astype(np.float64),
        kv_cache_hit_rate=rng.beta(30.0, 10.0, n),
        is_error=np.zeros(n, dtype=bool),
        cuda_error=cuda,
    )


@dataclasses.dataclass
class Fleet:
    """8 partitions of windows and one decider per model, fed step by step."""

    replicas: list[tuple[str, str]]
    rate: float
    settings: WindowSettings = dataclasses.field(default_factory=WindowSettings)
    seed: int = 1
    variants: tuple[str, ...] = ("on",)  # decider variants fed the same steps: learned detector on / off

    def __post_init__(self) -> None:
        self.windows = [PartitionWindows(self.settings) for _ in range(PARTITIONS)]
        self.partition_of = np.arange(len(self.replicas)) % PARTITIONS  # the worker hashes keys; uniform here
        self.models = sorted({m for m, _ in self.replicas})
        self.decider_sets = {variant: {m: ModelDecider(variant_settings(variant), model=m) for m in self.models}
                             for variant in self.variants}
        self.deciders = self.decider_sets[self.variants[0]]
        self.rng = np.random.default_rng(self.seed)
        self.t = START

    def feed(self, active: np.ndarray | None = None) -> float:
        """Apply the next 5 s of traffic (of the ``active`` replicas) and move the watermark to its
        end; returns that end (the step now ready to close)."""
        chosen = self.replicas if active is None else [self.replicas[i] for i in np.flatnonzero(active)]
        where = self.partition_of if active is None else self.partition_of[active]
        cols = synthetic_columns(chosen, self.t, self.t + STEP_S, self.rate, self.rng)
        # rows of replica i go to partition where[i]; map rows via the replica's index in `chosen`
        index = {r: k for k, (_, r) in enumerate(chosen)}
        row_partition = where[np.fromiter((index[r] for r in cols.replica.tolist()), dtype=np.int64,
                                          count=len(cols))]
        for p, windows in enumerate(self.windows):
            windows.apply(cols.take(row_partition == p))
        self.t += STEP_S
        for windows in self.windows:
            windows.advance_watermark(self.t)
        return self.t

    def close(self) -> list[ClosedSteps]:
        """Close the ready steps of every partition: columns only, no per-replica objects yet."""
        return [windows.close_steps() for windows in self.windows]

    @staticmethod
    def build(closed: list[ClosedSteps]) -> list[RecordPart]:
        """What stage 1 makes of the columns: every replica's vector (published, and handed to stage 2)
        and, per model and partition, their summaries merged on the columns (one per record)."""
        return [part for steps in closed for batch in steps.batches for part in record_parts(batch)]

    def decide(self, parts: list[RecordPart]) -> dict[str, float]:
        """Stage 2 for these steps, once per variant (the same merged inputs); returns the seconds of
        its parts: merge, and decide (the first variant) and ``decide:<variant>`` for every variant."""
        by_model: dict[tuple[str, float], list[RecordPart]] = {}
        for part in parts:
            by_model.setdefault((part.model, part.summary.window_end), []).append(part)
        merge_s = 0.0
        decide_s = dict.fromkeys(self.variants, 0.0)
        decide_cpu = dict.fromkeys(self.variants, 0.0)
        for n, ((model, end), group) in enumerate(sorted(by_model.items(), key=lambda kv: kv[0][1])):
            t0 = time.perf_counter()
            model_fv = merge_model_features(model, end, [p.summary for p in group], self.settings)
            merge_s += time.perf_counter() - t0
            vectors = [fv for p in group for fv in p.features]
            # the variant that goes first reads the replicas' vectors from memory, the next one from the
            # cache: every other model the other order, so neither variant carries that for the other
            order = list(self.decider_sets.items())
            for variant, deciders in (order if n % 2 == 0 else order[::-1]):
                c1, t1 = time.process_time(), time.perf_counter()
                deciders[model].step(model, end, vectors, model_fv, {})
                decide_s[variant] += time.perf_counter() - t1
                decide_cpu[variant] += time.process_time() - c1
        return {"merge": merge_s, "decide": decide_s[self.variants[0]],
                **{f"decide:{v}": seconds for v, seconds in decide_s.items()},
                **{f"decide_cpu:{v}": seconds for v, seconds in decide_cpu.items()}}


def variant_settings(variant: str) -> DetectorSettings:
    """The worker's default detectors (``on``), or without the learned detector (``off``)."""
    if variant == "on":
        return DetectorSettings()
    if variant == "off":
        return DetectorSettings.from_overrides({"decider": {"disabled": ["learned"]}})
    raise ValueError(f"unknown variant {variant!r} (on, off)")


def fleet_replicas(n: int, models: int) -> list[tuple[str, str]]:
    return [(f"model-{i % models:02d}", f"r{i:06d}") for i in range(n)]


def handoff_seconds(closed: list[ClosedSteps]) -> float:
    """What the worker adds per replica step between the stages: per input partition, model and step one
    record out of stage 1 (``encode_model_step``: the replicas' vectors and their merged summary), its
    header read and the record decoded back in stage 2 (``decode_model_step``). No telemetry here."""
    t0 = time.perf_counter()
    for source, steps in enumerate(closed):
        for batch in steps.batches:
            for model, part, features, summary in record_parts(batch):
                none = [None] * len(features)
                record = encode_model_step(model, batch.window_end, source, features, summary, none,
                                           [[] for _ in features])
                read_step_header(step_header(batch.window_end, source, len(features), part))
                decode_model_step(record)
    return time.perf_counter() - t0


def measure_step_cost(n_replicas: int, models: int, rate: float, steps: int, warm: int,
                      variants: tuple[str, ...] = ("on",), decide_warm: int = 2) -> dict[str, Any]:
    """The step's cost with the worker's default detectors; with ``variants=("on", "off")`` also the
    same steps decided without the learned detector (side by side: the same closed steps, one after the
    other), ``learned`` = the two totals and the decide parts. ``decide_warm``: the steps the deciders
    see before the measured ones (the learned detector judges a replica only after its warm-up, and
    runs its shift test only once the replica has a past: a few steps measure its cold path)."""
    fleet = Fleet(fleet_replicas(n_replicas, models), rate, variants=variants)
    for k in range(warm + max(decide_warm - 2, 0)):  # fill every window (60 s = 12 buckets), then the deciders'
        fleet.feed()
        warm_columns = fleet.close()
        if k >= warm - 2:
            fleet.decide(fleet.build(warm_columns))
    parts: dict[str, list[float]] = {"close_steps": [], "build": [], "merge": [], "decide": [], "total": [],
                                     "handoff": [], **{f"decide:{v}": [] for v in variants},
                                     **{f"decide_cpu:{v}": [] for v in variants}}
    cpu: list[float] = []  # the step's CPU time: what the other jobs on a shared machine move least
    for _ in range(steps):
        fleet.feed()
        gc.collect()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        columns = fleet.close()
        t1 = time.perf_counter()
        closed = fleet.build(columns)
        t2 = time.perf_counter()
        stage2 = fleet.decide(closed)
        # the other variants' decide time is not part of this step: count the first variant's only
        total = time.perf_counter() - t0 - sum(stage2[f"decide:{v}"] for v in variants[1:])
        cpu.append(time.process_time() - cpu0 - sum(stage2[f"decide_cpu:{v}"] for v in variants[1:]))
        if sum(len(part.features) for part in closed) != n_replicas:
            raise AssertionError(f"{len(closed)} replica steps closed, expected {n_replicas}")
        parts["close_steps"].append(t1 - t0)
        parts["build"].append(t2 - t1)
        parts["merge"].append(stage2["merge"])
        parts["decide"].append(stage2["decide"])
        parts["total"].append(total)
        for v in variants:
            parts[f"decide:{v}"].append(stage2[f"decide:{v}"])
            parts[f"decide_cpu:{v}"].append(stage2[f"decide_cpu:{v}"])
        parts["handoff"].append(handoff_seconds(columns))
    med = {k: statistics.median(v) for k, v in parts.items()}
    learned: dict[str, Any] = {}
    if len(variants) > 1:
        shared = [t - d for t, d in zip(parts["total"], parts["decide"], strict=True)]
        learned = {v: {"decide_ms": round(med[f"decide:{v}"] * 1000, 1),
                       "decide_cpu_ms": spread([round(c * 1000, 1) for c in parts[f"decide_cpu:{v}"]]),
                       "total_ms": spread([round((x + d) * 1000, 1)
                                           for x, d in zip(shared, parts[f"decide:{v}"], strict=True)])}
                   for v in variants}
    return {
        "replicas": n_replicas,
        "models": models,
        "steps_measured": steps,
        "ms": {k: round(v * 1000, 1) for k, v in med.items()},
        "total_ms": spread([round(v * 1000, 1) for v in parts["total"]]),
        "cpu_ms": spread([round(v * 1000, 1) for v in cpu]),
        "us_per_replica": round(med["total"] / n_replicas * 1e6, 2),
        "close_us_per_replica": round(med["close_steps"] / n_replicas * 1e6, 2),
        "build_us_per_replica": round(med["build"] / n_replicas * 1e6, 2),
        "handoff_us_per_replica": round(med["handoff"] / n_replicas * 1e6, 2),
        **({"learned": learned} if learned else {}),
    }


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

def measure_memory(n_replicas: int, models: int, rate: float, warm: int) -> dict[str, Any]:
    """tracemalloc bytes per replica of full windows, then of the deciders; then idle release."""
    replicas = fleet_replicas(n_replicas, models)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fleet = Fleet(replicas, rate)
        for _ in range(warm):  # windows only: full 60 s windows, every bucket sealed or open as in the worker
            fleet.feed()
            fleet.close()
        gc.collect()
        windows_bytes = tracemalloc.get_traced_memory()[0] - base
        for _ in range(3):  # the deciders' state (detectors, tracks, last weights) for every replica
            fleet.feed()
            fleet.decide(fleet.build(fleet.close()))
        gc.collect()
        deciders_bytes = tracemalloc.get_traced_memory()[0] - base - windows_bytes
        cpu = time.process_time()
        snapshot_bytes = sum(len(w.snapshot()) for w in fleet.windows)
        snapshot_s = time.process_time() - cpu
        # half the fleet falls silent: their window state must go after max(idle_release_s, length_s)
        active = np.arange(n_replicas) % 2 == 0
        idle_s = max(fleet.settings.idle_release_s, fleet.settings.length_s)
        kept_over_time: list[tuple[float, int]] = []
        silent_since = fleet.t
        while fleet.t - silent_since <= idle_s + 2 * STEP_S:
            fleet.feed(active)
            fleet.close()  # windows only: the deciders keep a silent replica for release_after_s (600 s)
            kept_over_time.append((fleet.t - silent_since, sum(len(w.keys) for w in fleet.windows)))
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    released_at = next((t for t, kept in kept_over_time if kept <= active.sum()), None)
    return {
        "replicas": n_replicas,
        "window_bytes_per_replica": round(windows_bytes / n_replicas),
        "decider_bytes_per_replica": round(deciders_bytes / n_replicas),
        "snapshot_bytes_per_replica": round(snapshot_bytes / n_replicas),
        "snapshot_cpu_ms_all_partitions": round(snapshot_s * 1000, 1),  # stage 1 writes one per partition per step
        "traced_bytes_windows_and_deciders": windows_bytes + deciders_bytes,
        "idle_release_after_s": idle_s,
        "silent_replicas": int(n_replicas - active.sum()),
        "window_keys_after_silence": kept_over_time[-1][1],
        "released_after_s": released_at,
        "traced_bytes_after_release": after,
        "note": "traced bytes after release include the deciders' state, which keeps a silent replica for "
                "[detectors.decider] release_after_s (600 s) so its alerts resolve and its weight goes to 0",
    }


async def measure_worker_rss(bootstrap: str, workdir: Path, n_replicas: int, models: int, rate: float,
                             seconds: float, trace: bool = False, settle_s: float = 20.0) -> dict[str, Any]:
    """RSS of the real worker after taking ``seconds`` of event time from ``n_replicas`` replicas.

    ``trace``: run the worker under tracemalloc (slower) and add what live Python data it holds at the
    end, and its peak, next to the RSS."""
    from bench.throughput.worker import BenchWorker, model_steps_published
    from skewwatch.sim.emit import produce_traffic
    from skewwatch.sim.generator import GeneratorConfig, generate_chunks
    from skewwatch.topics import ensure_topics

    settings = fresh_settings(bootstrap, PARTITIONS, "rss")
    await ensure_topics(bootstrap, settings)
    names = tuple(f"model-{i:02d}" for i in range(models))
    config = GeneratorConfig(models=names, replicas=max(n_replicas // models, 1), rate=rate, seed=3, telemetry=True)
    started = time.perf_counter()
    stats = await produce_traffic(bootstrap, generate_chunks(config, START, seconds),
                                  requests_topic=settings.topics.requests,
                                  telemetry_topic=settings.topics.gpu_telemetry, batch=1)
    produce_s = time.perf_counter() - started
    # one more event per partition, well ahead, so every partition closes the last full step
    from bench.throughput.dataset import sentinel_event
    from tests.integration.worker_proc import produce

    assert stats.last_ts is not None
    last_end = (math.floor(stats.last_ts / STEP_S)) * STEP_S
    sentinel_ts = last_end + 2 * STEP_S + settings.window.allowed_lateness_s
    from skewwatch.schemas.requests import encode_request_event

    await produce(bootstrap, settings.topics.requests,
                  [(f"bench-sentinel-{p}".encode(), encode_request_event(sentinel_event(p, sentinel_ts)))
                   for p in range(PARTITIONS * 4)])
    trace_path = workdir / "worker-rss.tracemalloc.json"
    extra_env = {"SKEWWATCH_BENCH_TRACEMALLOC": str(trace_path)} if trace else None
    worker = BenchWorker(settings, workdir / "worker-rss.log", extra_env=extra_env).start()
    traced: dict[str, Any] | None = None
    try:
        published = await model_steps_published(bootstrap, settings.topics.features, names, last_end,
                                                timeout_s=1800 if trace else 600)
        metrics = worker.metrics() or {}
        rss = current_rss_bytes(worker.pid)  # right after draining the backlog: its buffers may still be held
        peak = worker.peak_rss()
        # then the same worker holding the same replicas, idle: the heap's free memory goes back to the OS
        # every limits.memory_trim_s, so wait two of those (RSS at rest is what a live fleet's worker holds)
        await asyncio.sleep(settle_s)
        settled = current_rss_bytes(worker.pid)
        if trace:
            os.kill(worker.pid, signal.SIGUSR1)
            for _ in range(600):
                await asyncio.sleep(0.5)
                if trace_path.exists():
                    traced = json.loads(trace_path.read_text())
                    break
    finally:
        worker.stop()
    return {
        "replicas": len(names) * config.replicas,
        "events": stats.events,
        "telemetry_samples": stats.telemetry,
        "event_time_s": seconds,
        "produce_s": round(produce_s, 1),
        "all_steps_published": published is not None,
        "replica_vectors_published": int(metrics.get("skewwatch_features_published_total{scope=replica}", 0)),
        "rss_mib": round((settled or 0) / 2**20, 1),
        "rss_after_backlog_mib": round((rss or 0) / 2**20, 1),
        "settle_s": settle_s,
        "peak_rss_mib": round((peak or 0) / 2**20, 1),
        "tracemalloc": None if traced is None else {
            "current_mib": round(traced["current"] / 2**20, 1), "peak_mib": round(traced["peak"] / 2**20, 1),
            "top": [dict(t, where=t["where"].split("site-packages/")[-1].split("/work/main/")[-1])
                    for t in traced["top"][:20]]},
    }


def current_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ---------------------------------------------------------------------------------------------
# Reaction time
# ---------------------------------------------------------------------------------------------

def plain_event(replica: str, model: str, ts: float, rng: random.Random, seq: int) -> dict[str, Any]:
    return {"request_id": f"{replica}-{seq}", "ts": ts, "model": model, "replica": replica,
            "latency_ms": 800.0 * rng.lognormvariate(0.0, 0.2), "prompt_tokens": rng.randint(50, 4000),
            "completion_tokens": rng.randint(10, 600), "batch_size": rng.randint(8, 24), "batch_capacity": 32,
            "ttft_ms": 150.0 * rng.lognormvariate(0.0, 0.2), "queue_length": rng.randint(0, 4),
            "kv_cache_hit_rate": min(rng.betavariate(30, 10), 1.0), "status": "ok"}


async def measure_reaction(bootstrap: str, workdir: Path, trials: int, replicas: int, rate: float,
                           warmup_s: float) -> dict[str, Any]:
    """See the module docstring; returns per-trial latencies and their median/P99."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from bench.throughput.worker import BenchWorker
    from skewwatch.schemas.requests import encode_request_event
    from skewwatch.topics import ensure_topics

    if trials > replicas:
        raise ValueError("each trial needs a replica of its own (a drained replica does not alert twice)")
    settings = fresh_settings(bootstrap, PARTITIONS, "react")
    await ensure_topics(bootstrap, settings)
    lateness = settings.window.allowed_lateness_s
    fleet = [("llama-3-70b" if i % 2 else "mixtral-8x7b", f"r{i:03d}") for i in range(replicas)]
    worker = BenchWorker(settings, workdir / "worker-reaction.log").start()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    alerts = AIOKafkaConsumer(settings.topics.alerts, bootstrap_servers=bootstrap, group_id=None,
                              auto_offset_reset="earliest", fetch_max_wait_ms=100)
    await producer.start()
    await alerts.start()
    produced_at: dict[str, float] = {}  # replica -> wall time the fault event was handed to the producer
    fault_ts: dict[str, float] = {}
    seen_at: dict[str, tuple[float, float]] = {}  # replica -> (read time, alert record timestamp)
    stop = asyncio.Event()

    async def traffic() -> None:
        rng = random.Random(7)
        seq = 0
        tick = 0.05
        next_fault = time.time() + warmup_s
        faults = [r for _, r in fleet][:trials]
        while not stop.is_set():
            now = time.time()
            for model, replica in fleet:
                for _ in range(_poisson(rng, rate * tick)):
                    seq += 1
                    await producer.send(settings.topics.requests, encode_request_event(
                        plain_event(replica, model, now, rng, seq)), key=replica.encode())
            if faults and now >= next_fault:
                replica = faults.pop(0)
                model = dict((r, m) for m, r in fleet)[replica]
                event = plain_event(replica, model, now, rng, seq) | {
                    "status": "error", "cuda_error": "cudaErrorIllegalAddress"}
                fault_ts[replica] = now
                produced_at[replica] = time.time()
                await producer.send(settings.topics.requests, encode_request_event(event), key=replica.encode())
                # next trial a step later, at a random offset within the step
                next_fault = (math.floor(now / STEP_S) + 1) * STEP_S + rng.uniform(0.0, STEP_S)
            await asyncio.sleep(max(tick - (time.time() - now), 0.0))

    async def read_alerts() -> None:
        while not stop.is_set():
            polled = await alerts.getmany(timeout_ms=100)
            read = time.time()
            for messages in polled.values():
                for message in messages:
                    alert = decode_alert(message.value)
                    if alert.detector == "gpu_health" and alert.state == "open" \
                            and alert.replica in fault_ts and alert.replica not in seen_at:
                        seen_at[alert.replica] = (read, message.timestamp / 1000.0)

    tasks = [asyncio.ensure_future(traffic()), asyncio.ensure_future(read_alerts())]
    try:
        deadline = time.monotonic() + warmup_s + trials * STEP_S * 2 + 60
        while time.monotonic() < deadline and len(seen_at) < trials:
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.log_tail()}")
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await alerts.stop()
        await producer.stop()
        worker.stop()
    rows: list[dict[str, Any]] = []
    for replica, (read, record_ts) in sorted(seen_at.items(), key=lambda kv: fault_ts[kv[0]]):
        step_end = (math.floor(fault_ts[replica] / STEP_S) + 1) * STEP_S
        rows.append({"replica": replica, "from_produce_s": round(read - produced_at[replica], 3),
                     "after_step_end_s": round(read - step_end, 3),
                     "after_closable_s": round(read - (step_end + lateness), 3),
                     "alert_written_after_closable_s": round(record_ts - (step_end + lateness), 3)})

    def stats(key: str) -> dict[str, float] | None:
        values = [float(r[key]) for r in rows]
        if not values:
            return None
        return {"median": round(statistics.median(values), 3), "p99": round(percentile(values, 99), 3),
                "min": round(min(values), 3), "max": round(max(values), 3)}

    return {"trials": trials, "alerts_seen": len(rows), "replicas": replicas, "rate_per_replica": rate,
            "allowed_lateness_s": lateness, "from_produce_s": stats("from_produce_s"),
            "after_step_end_s": stats("after_step_end_s"), "after_closable_s": stats("after_closable_s"),
            "alert_written_after_closable_s": stats("alert_written_after_closable_s"), "rows": rows}


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method: small means only (the per-tick count of one replica)."""
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def step_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'replicas':>9} {'total ms':>9} {'min..max':>15} {'CPU ms':>8} {'close':>8} {'build':>7} "
             f"{'merge':>7} {'decide':>8} {'us/replica':>10} {'close us/r':>10} {'build us/r':>10} "
             f"{'handoff us/r':>12}"]
    for r in rows:
        ms, tot = r["ms"], r["total_ms"]
        cpu = r.get("cpu_ms", {}).get("median", float("nan"))
        lines.append(f"{r['replicas']:>9,} {ms['total']:>9.1f} {tot['min']:>7.1f}..{tot['max']:<7.1f} {cpu:>8.1f} "
                     f"{ms['close_steps']:>8.1f} {ms['build']:>7.1f} {ms['merge']:>7.1f} {ms['decide']:>8.1f} "
                     f"{r['us_per_replica']:>10.2f} {r['close_us_per_replica']:>10.2f} "
                     f"{r['build_us_per_replica']:>10.2f} {r['handoff_us_per_replica']:>12.2f}")
    return "\n".join(lines)


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The scale targets (bench/README.md) that this run measured."""
    out: list[dict[str, Any]] = []
    for row in result.get("step_cost", []):
        if row["replicas"] == 10_000:
            out.append({"name": "step cost at 10k replicas <= 250 ms", "value": row["ms"]["total"],
                        "target": 250.0, "met": row["ms"]["total"] <= 250.0})
    rows = sorted(result.get("step_cost", []), key=lambda r: r["replicas"])
    if len(rows) >= 3:
        # Linear = a + b x replicas: the marginal cost per replica between successive sizes stays the same.
        # A 5 s step also has a fixed cost per model (50 models whatever the fleet), which the average per
        # replica carries at small sizes, so max/min of the averages is reported too but judges nothing.
        slopes = [(b["ms"]["total"] - a["ms"]["total"]) * 1e3 / (b["replicas"] - a["replicas"])
                  for a, b in zip(rows, rows[1:], strict=False)]
        growth = max(slopes) / min(slopes) if min(slopes) > 0 else float("inf")
        out.append({"name": "step cost linear (marginal us per replica between sizes, max/min <= 1.5)",
                    "value": round(growth, 2), "target": 1.5, "met": growth <= 1.5,
                    "marginal_us_per_replica": [round(x, 2) for x in slopes]})
    if len(rows) >= 2:
        per = [r["us_per_replica"] for r in rows]
        out.append({"name": "average us per replica, max/min (includes the per-model fixed cost)",
                    "value": round(max(per) / min(per), 2), "target": None, "met": None})
    memory = result.get("memory")
    if memory:
        per = memory["window_bytes_per_replica"]
        out.append({"name": "window state <= 16 KiB per replica", "value": per, "target": 16 * KIB,
                    "met": per <= 16 * KIB})
        out.append({"name": "idle replicas' window state released", "value": memory["window_keys_after_silence"],
                    "target": memory["replicas"] - memory["silent_replicas"],
                    "met": memory["window_keys_after_silence"] == memory["replicas"] - memory["silent_replicas"]})
    rss = result.get("worker_rss")
    if rss:
        out.append({"name": f"worker RSS with {rss['replicas']:,} replicas <= 500 MB", "value": rss["rss_mib"],
                    "target": 500e6 / 2**20, "met": rss["rss_mib"] * 2**20 <= 500e6})
    reaction = result.get("reaction")
    if reaction and reaction["after_closable_s"]:
        for q in ("median", "p99"):
            value = reaction["after_closable_s"][q]
            out.append({"name": f"reaction {q} <= 1 s after the step can close", "value": value, "target": 1.0,
                        "met": value <= 1.0})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="step,memory,reaction")
    parser.add_argument("--replicas", default="1000,10000,50000", help="step cost: replica counts")
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s per replica (event time)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per replica count")
    parser.add_argument("--decide-warm", type=int, default=2,
                        help="steps the deciders see before the measured ones (130: the learned detector warm, "
                             "its shift test on: its steady cost)")
    parser.add_argument("--learned", choices=("on", "off", "both"), default="both",
                        help="step cost with the learned detector on (the default config), off, or both side by "
                             "side (the same steps decided twice; the table's totals are 'on')")
    parser.add_argument("--memory-replicas", type=int, default=10_000)
    parser.add_argument("--rss-replicas", type=int, default=10_000, help="0: skip the real worker's RSS")
    parser.add_argument("--rss-rate", type=float, default=1.0)
    parser.add_argument("--rss-seconds", type=float, default=80.0, help="event time produced for the RSS run")
    parser.add_argument("--rss-tracemalloc", action="store_true",
                        help="run the RSS worker under tracemalloc: live Python data vs RSS (slower)")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--reaction-replicas", type=int, default=64)
    parser.add_argument("--reaction-rate", type=float, default=10.0)
    parser.add_argument("--bootstrap")
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run of step and memory")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    args = parser.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    counts = [int(x) for x in args.replicas.split(",")]
    warm = 13  # 12 buckets fill the 60 s window, one more rolls it
    if args.quick:
        counts, args.models, args.steps, args.memory_replicas, warm = [100, 200], 5, 2, 200, 3
        args.rss_replicas = 0
    result: dict[str, Any] = {"machine": machine_info(), "rate_per_replica": args.rate, "models": args.models}
    if "step" in parts:
        result["step_cost"] = []
        variants = {"on": ("on",), "off": ("off",), "both": ("on", "off")}[args.learned]
        result["learned"] = args.learned
        for n in counts:
            row = measure_step_cost(n, args.models, args.rate, args.steps, warm, variants, args.decide_warm)
            row["decide_warm_steps"] = args.decide_warm
            result["step_cost"].append(row)
            print(f"step cost, {n:,} replicas: {row['ms']['total']:.1f} ms ({row['us_per_replica']:.2f} us/replica)",
                  flush=True)
    if "memory" in parts:
        result["memory"] = measure_memory(args.memory_replicas, args.models, args.rate, warm)
        print(f"memory: {result['memory']['window_bytes_per_replica']:,} B/replica of windows", flush=True)
    needs_broker = ("memory" in parts and args.rss_replicas > 0) or "reaction" in parts
    if needs_broker:
        workdir = Path(tempfile.mkdtemp(prefix="skewwatch-scale-"))
        with broker_bootstrap(workdir, args.bootstrap) as bootstrap:
            if "memory" in parts and args.rss_replicas > 0:
                result["worker_rss"] = asyncio.run(measure_worker_rss(
                    bootstrap, workdir, args.rss_replicas, args.models, args.rss_rate, args.rss_seconds,
                    trace=args.rss_tracemalloc))
                print(f"worker RSS: {result['worker_rss']['rss_mib']} MiB", flush=True)
            if "reaction" in parts:
                result["reaction"] = asyncio.run(measure_reaction(
                    bootstrap, workdir, args.trials, args.reaction_replicas, args.reaction_rate, warmup_s=15.0))
    result["targets"] = judge(result)
    print()
    if "step_cost" in result:
        print("Step cost (one 5 s step: close_steps on 8 partitions (columns) + build per-replica objects + "
              "merge + ModelDecider.step per model)")
        print(step_table(result["step_cost"]))
        side = [r for r in result["step_cost"] if "learned" in r]
        if side:
            print("\nThe learned detector, side by side (the same steps decided with it on and off):")
            print(f"{'replicas':>9} {'on: total':>10} {'decide':>7} {'CPU':>6} {'off: total':>11} {'decide':>7} "
                  f"{'CPU':>6} {'on - off: decide':>17} {'CPU':>6}")
            for r in side:
                on, off = r["learned"]["on"], r["learned"]["off"]
                on_cpu, off_cpu = on["decide_cpu_ms"]["median"], off["decide_cpu_ms"]["median"]
                print(f"{r['replicas']:>9,} {on['total_ms']['median']:>10.1f} {on['decide_ms']:>7.1f} {on_cpu:>6.1f} "
                      f"{off['total_ms']['median']:>11.1f} {off['decide_ms']:>7.1f} {off_cpu:>6.1f} "
                      f"{on['decide_ms'] - off['decide_ms']:>17.1f} {on_cpu - off_cpu:>6.1f}")
    if "memory" in result:
        m = result["memory"]
        print(f"\nWindow state: {m['window_bytes_per_replica']:,} B/replica (tracemalloc), "
              f"{m['snapshot_bytes_per_replica']:,} B/replica in the checkpoint "
              f"({m['snapshot_cpu_ms_all_partitions']} ms CPU for all partitions' snapshots); deciders "
              f"{m['decider_bytes_per_replica']:,} B/replica; {m['silent_replicas']:,} silent replicas released "
              f"after {m['released_after_s']} s (rule: {m['idle_release_after_s']:.0f} s)")
    if "worker_rss" in result:
        w = result["worker_rss"]
        print(f"Worker with {w['replicas']:,} replicas: RSS {w['rss_mib']} MiB {w.get('settle_s', 0):g} s after it "
              f"drained the backlog, {w.get('rss_after_backlog_mib')} MiB right after, peak {w['peak_rss_mib']} MiB")
    if "reaction" in result:
        r = result["reaction"]
        print(f"\nReaction time over {r['alerts_seen']}/{r['trials']} trials (s): from produce {r['from_produce_s']}; "
              f"after the step end {r['after_step_end_s']}; after the step can close (end + "
              f"{r['allowed_lateness_s']:g} s lateness) {r['after_closable_s']}")
    print()
    for t in result["targets"]:
        if t["met"] is None:
            print(f"INFO    {t['name']}: {t['value']}")
        else:
            print(f"{'MET   ' if t['met'] else 'MISSED'}  {t['name']}: {t['value']} (target {t['target']:g})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
