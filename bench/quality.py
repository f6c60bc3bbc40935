"""Detection quality across traffic shapes, with a fit / holdout split (benchmark 1).

Every run is one :class:`~bench.scenarios.Scenario`: a shape (conv, code or mooncake at 1x, 0.1x or
3x its rate, :mod:`skewwatch.sim.shapes`) x a seed, simulated by the fleet simulator with a dozen
independent 4-replica pools (one per fault kind, a quiet pool, two clean pools and a low-rate clean
pool). What the pipeline publishes (alerts, routing corrections) is scored against the labels by
:mod:`bench.scoring`, per detector, per shape and per split, for each detector profile side by side.

**Two families of runs** (``--family``): the rules' runs (faults from 2 min, ~7 min each), and the
learned detector's (:meth:`~bench.scenarios.Scenario.learned`: its two faults, ``ttft_drift`` and
``throughput_drop``, and every rule's fault, from 20 min, once it has learned the replicas; ~37 min
each, so they also give the clean pools most of their hours). A shape's tables count both.
``--learned-fault-at MINUTES`` starts the learned runs' faults later: how much of a replica's history
the learned detector needs before a fault, on the same traffic.

**Modes.**

- ``--mode fast`` (default): the worker's two stages in-process
  (:class:`~skewwatch.sim.local_pipeline.LocalPipeline`): one simulation per shape and seed feeds
  every profile's pipeline at once. The whole matrix takes minutes: this is the mode to tune in.
- ``--mode worker``: the real ``skewwatch worker`` as a child process on a real broker (one fresh
  worker, topics and consumer group per run and profile), traffic produced at full speed in event
  time: the mode of the published table. Both modes give the same alerts on the simulator's
  traffic (``tests/integration/test_quality_modes.py``; why, in the LocalPipeline docstring).

**Profiles** (``--profile``, repeatable; default ``default`` and ``seed``): ``default`` = no
configuration file (whatever the worker's defaults are), ``seed`` = ``bench/profiles/seed.toml``,
``tuned`` = ``bench/profiles/tuned.toml``, or ``NAME=PATH`` for any configuration file.

**Fit and holdout.** Thresholds may be chosen on the FIT runs only: shapes ``conv@1x`` and
``code@1x`` with seeds 1 and 2 (``--fit-shapes``, ``--fit-seeds``). Everything else (mooncake, every
0.1x and 3x shape, seeds 3+) is HOLDOUT. The JSON and the printed tables keep them apart.

**Pool size** (``--pool-size``, default 4 replicas per pool): the same runs with larger pools, every
pool at the same rate per replica (nothing was chosen on them: all of it is a holdout in kind, the
split names only say which shape and seed it is).

**Targets** (✗ marks a miss): per detector recall >= 0.95 (learned: >= 0.9), precision >= 0.95, median
delay <= persistence + 10 s (learned: none; its faults unfold over minutes); <= 1 false alert per clean
pool-hour over all detectors; the learned detector firing on a rule's fault is not a false alert (the
confusion table reports it beside the rule's); corrections: no
healthy replica at weight 0, no all-zero pool, and the faulty replica below every healthy one
within its detector's delay target (>= 0.95 of the faults).

**The oracle** (:mod:`bench.oracle`, one more consumer of the same chunks): per replica fault, the
earliest step at which a test that knows the faulty replica, the onset and the fault's size could
raise it from the same observations, at <= 1 false alert per clean pool-hour (thresholds calibrated
per shape on the clean pools of the same runs). Each scope gets a table of its recall and delay beside
each profile's (targets: recall >= 0.95 x the oracle's, median delay <= 2 x the oracle's + 5 s); a
fault it cannot raise within its span is undetectable: listed apart, and left out of the denominator
of the "of the detectable" recall column.

``--no-live-signals`` drops the engines' live gauges and latency histograms from the simulated
telemetry (``--live-signals both`` runs with and without, and prints the delays side by side).

    .venv/bin/python bench/quality.py                   # the full matrix, fast mode (~5 min on 2 cores)
    .venv/bin/python bench/quality.py --quick           # one fit and one holdout run (< 60 s)
    .venv/bin/python bench/quality.py --mode worker     # the published table (real worker and broker)
    .venv/bin/python bench/quality.py --shape mooncake@1x --profile default --profile mine=my.toml

Prints the tables, writes ``bench/results/quality.json`` (``--out``) and a delay plot (``--plot``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import oracle  # noqa: E402
from bench.common import (  # noqa: E402
    EVERY_STEP_ENV,
    RESULTS,
    Worker,
    delete_run_topics,
    fresh_settings,
    kafka,
    machine,
    parse_profile,
    persistence_s,
    profile_settings,
    read_topics,
)
from bench.scenarios import (  # noqa: E402
    LEARNED_FAULT_AT_S,
    LOW_RATE_POOL,
    QUIET_POOL,
    REPLICAS,
    START_TS,
    WARMUP_S,
    Scenario,
)
from bench.scoring import (  # noqa: E402
    DETECTOR_OF,
    DETECTORS,
    FALSE_PER_HOUR_TARGET,
    RECALL_TARGET,
    RECALLS,
    REPLICA_FAULT_KINDS,
    Episode,
    Label,
    alert_episodes,
    confusion,
    correction_report,
    judge,
    match,
    pool_alert_episodes,
    score,
    weight_episodes,
)
from skewwatch.schemas.alerts import decode_alert  # noqa: E402
from skewwatch.schemas.corrections import decode_correction  # noqa: E402
from skewwatch.schemas.telemetry_sample import TelemetrySample  # noqa: E402
from skewwatch.sim.generator import TrafficChunk  # noqa: E402
from skewwatch.sim.shapes import SHAPES, make_shape  # noqa: E402

FIT_SHAPES: tuple[str, ...] = ("conv@1x", "code@1x")
FIT_SEEDS: tuple[int, ...] = (1, 2)
SEEDS: tuple[int, ...] = (1, 2, 3)
QUICK: tuple[tuple[str, int], ...] = (("conv@1x", 1), ("mooncake@1x", 3))  # one fit run, one holdout run
PROFILES_DEFAULT: tuple[str, ...] = ("default", "seed")
# the oracle's targets: recall >= this share of the oracle's, median delay <= factor x the oracle's + slack
ORACLE_RECALL_SHARE = 0.95
ORACLE_DELAY_FACTOR = 2.0
ORACLE_DELAY_SLACK_S = 5.0
BELOW_OF_DETECTABLE_TARGET = 0.9  # the faulty replica below every healthy one in time, of the faults the oracle finds
RUNAWAY_ZERO_SHARE = 0.05  # a clean pool whose queue is empty in fewer samples than this never drains


# ----------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One scenario's outputs under one profile, raw (alerts, corrections) until scored."""

    scenario: Scenario
    profile: str
    split: str  # FIT | HOLDOUT
    mode: str
    alerts: list[dict[str, Any]]
    corrections: list[dict[str, Any]]
    stats: dict[str, Any] = field(default_factory=dict)
    oracle: oracle.OracleRecord | None = None  # what the oracle saw of the run (bench/oracle.py)

    @property
    def key(self) -> str:
        return f"{self.profile}|{self.scenario.name}"


class LoadMeter:
    """The clean pools' load as the simulator reports it: queue, utilisation, requests per replica."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.clean = {scenario.replica(p, i) for p in scenario.clean for i in range(scenario.replicas)}
        self.low_rate = ({scenario.replica(LOW_RATE_POOL, i) for i in range(scenario.replicas)} if scenario.low_rate
                         else set())
        self.end = START_TS + scenario.run_s
        self.last_ts = START_TS  # the newest request event time seen
        self.queue: list[float] = []
        self.util: list[float] = []
        self.requests = {"clean": 0, "low-rate": 0}

    def add(self, chunk: TrafficChunk) -> None:
        for sample in chunk.telemetry:
            if sample.replica in self.clean and sample.ts <= self.end:
                self._sample(sample)
        if len(chunk.requests):
            self.last_ts = max(self.last_ts, float(chunk.requests.ts.max()))
        replicas = chunk.requests.replica
        self.requests["clean"] += int(np.isin(replicas, list(self.clean)).sum()) if len(replicas) else 0
        self.requests["low-rate"] += int(np.isin(replicas, list(self.low_rate)).sum()) if len(replicas) else 0

    def _sample(self, sample: TelemetrySample) -> None:
        if sample.queue_length is not None:
            self.queue.append(float(sample.queue_length))
        if sample.utilization_gpu is not None:
            self.util.append(float(sample.utilization_gpu))

    def report(self) -> dict[str, Any]:
        q = np.asarray(self.queue or [np.nan])
        zero_share = float((q == 0).mean()) if self.queue else None
        return {
            "clean_rate_per_replica": self.requests["clean"] / (max(len(self.clean), 1) * self.scenario.run_s),
            "low_rate_per_replica": self.requests["low-rate"] / (max(len(self.low_rate), 1) * self.scenario.run_s),
            "clean_queue_mean": float(np.nanmean(q)) if self.queue else None,
            "clean_queue_p95": float(np.nanpercentile(q, 95)) if self.queue else None,
            "clean_queue_max": float(np.nanmax(q)) if self.queue else None,
            "clean_queue_zero_share": zero_share,
            "clean_utilization_mean": float(np.mean(self.util)) if self.util else None,
            "runaway": None if zero_share is None else zero_share < RUNAWAY_ZERO_SHARE,
        }


def split_of(scenario: Scenario, fit_shapes: Sequence[str], fit_seeds: Sequence[int]) -> str:
    """FIT when both the shape and the seed are in the fit set, else HOLDOUT (runs without live signals
    are grouped apart, ``|no-live``).

    >>> [split_of(Scenario(SHAPES[s], seed), FIT_SHAPES, FIT_SEEDS) for s, seed in
    ...  [("conv@1x", 1), ("conv@1x", 3), ("mooncake@1x", 1), ("code@3x", 2)]]
    ['FIT', 'HOLDOUT', 'HOLDOUT', 'HOLDOUT']
    """
    fit = scenario.shape.name in fit_shapes and scenario.seed in fit_seeds
    return "FIT" if fit else "HOLDOUT"


def simulate(scenario: Scenario, *also: Any) -> tuple[Any, Iterator[TrafficChunk], LoadMeter]:
    """The scenario's simulator, its chunks (lazy) and the meter they pass through (and ``also``: more
    consumers with an ``add(chunk)``, each chunk handed to them before the pipeline gets it)."""
    from skewwatch.sim.fleet import FleetSimulator

    sim = FleetSimulator(scenario.fleet_config(), START_TS, scenario.run_s)
    meter = LoadMeter(scenario)

    def chunks() -> Iterator[TrafficChunk]:
        for chunk in sim.chunks():
            meter.add(chunk)
            for consumer in also:
                consumer.add(chunk)
            yield chunk

    return sim, chunks(), meter


def oracle_feed(scenario: Scenario) -> oracle.OracleFeed:
    """The oracle's consumer of the scenario's chunks: its replica faults, calibrated on its clean pools
    at the shape's rate (``clean-a``, ``clean-b``; the low-rate pool is at a rate no fault pool has)."""
    pools = {p: [scenario.replica(p, i) for i in range(scenario.replicas)] for p in scenario.pools()}
    faults = [oracle.Fault.from_label(lb) for lb in scenario.labels(START_TS) if lb.get("replica") is not None]
    lo, hi = (START_TS + s for s in scenario.scored)
    return oracle.OracleFeed(pools, faults, scenario.clean, (lo, hi), scenario.shape.trace.prompt_quantile(0.9))


def run_fast(scenario: Scenario, profiles: Sequence[str], split: str) -> list[Run]:
    """One simulation through every profile's in-process pipeline at once (and the oracle)."""
    from skewwatch.sim.local_pipeline import LocalPipeline

    began = time.monotonic()
    pipes = {p: LocalPipeline(profile_settings(p, EVERY_STEP_ENV)) for p in profiles}
    feed = oracle_feed(scenario)
    sim, chunks, meter = simulate(scenario, feed)
    for chunk in chunks:
        for pipe in pipes.values():
            pipe.feed(chunk)
    stats = {"wall_s": round(time.monotonic() - began, 2), **_sim_stats(sim), "load": meter.report()}
    seen = feed.record()
    return [Run(scenario, p, split, "fast", pipe.alerts, pipe.corrections, stats, seen) for p, pipe in pipes.items()]


def _run_fast_job(job: tuple[Scenario, Sequence[str], str]) -> list[Run]:
    """One scenario in fast mode, the profiles named as the report names them (a process pool's task)."""
    made = run_fast(*job)
    for run in made:
        run.profile = parse_profile(run.profile)[0]
    return made


def _sim_stats(sim: Any) -> dict[str, Any]:
    s = sim.stats()
    return {"arrivals": s["arrivals"], "finished": s["finished"], "failed": s["failed"],
            "quiet_dropped": sim.quiet_dropped}


def run_worker(scenario: Scenario, profile: str, split: str, bootstrap: str, workdir: Path) -> Run:
    """One scenario through the real worker: produce, read alerts and corrections back."""

    from skewwatch.sim.emit import produce_traffic

    settings = fresh_settings(bootstrap)
    topics = settings.topics
    feed = oracle_feed(scenario)
    sim, chunks, meter = simulate(scenario, feed)
    began = time.monotonic()
    rundir = workdir / f"{profile}_{scenario.name}".replace("/", "_").replace("=", "").replace("@", "_")
    worker = Worker(settings, rundir, profile, extra_env=EVERY_STEP_ENV)
    try:
        worker.start()
        produced = asyncio.run(produce_traffic(bootstrap, chunks, requests_topic=topics.requests,
                                               telemetry_topic=topics.gpu_telemetry, batch=50))
        # the last step the worker can close: its watermark is the newest event time minus the lateness
        # (a bursty trace may fall silent before the scored span ends: no step after its last event closes)
        step, lateness = settings.window.step_s, settings.window.allowed_lateness_s
        last = math.floor((meter.last_ts - lateness) / step) * step
        wanted = min(START_TS + scenario.scored[1], last)
        models = set(scenario.pools())
        settled: list[float] = []
        seen = [0, time.monotonic()]  # records read, when that count last grew

        def done(records: list[Any]) -> bool:
            if len(records) != seen[0]:
                seen[:] = [len(records), time.monotonic()]
            reached = {m for m in models if any(
                r.topic == topics.routing_corrections and r.key == m.encode()
                and decode_correction(r.value).ts >= wanted for r in records)}
            # every model there, or some and nothing new for 15 s (a pool whose replicas all went idle
            # and were released gets no correction for the last steps)
            if reached != models and not (reached and time.monotonic() - seen[1] >= 15.0):
                return False
            settled.append(time.monotonic())
            return time.monotonic() - settled[0] >= 2.0  # alerts of the same steps: give them 2 s

        records = read_topics(bootstrap, [topics.alerts, topics.routing_corrections], done, timeout_s=300)
        if not settled:
            raise RuntimeError(f"{scenario.name}: corrections never reached step {scenario.scored[1]:.0f} s\n"
                               f"{worker.log_tail()}")
    finally:
        worker.stop()
        delete_run_topics(bootstrap, settings)
    # as plain data, read by the records' one decoder each (the scoring takes dicts)
    alerts = [decode_alert(r.value).to_dict() for r in records if r.topic == topics.alerts]
    corrections = [decode_correction(r.value).to_dict() for r in records if r.topic == topics.routing_corrections]
    stats = {"wall_s": round(time.monotonic() - began, 1), "events": produced.events, **_sim_stats(sim),
             "load": meter.report()}
    return Run(scenario, profile, split, "worker", alerts, corrections, stats, feed.record())


# ----------------------------------------------------------------------------- scoring a group


def run_labels(run: Run) -> list[Label]:
    return [Label.from_dict(lb) for lb in run.scenario.labels(START_TS)]


def run_episodes(run: Run) -> list[Episode]:
    lo, hi = (START_TS + s for s in run.scenario.scored)
    return (alert_episodes(run.alerts, lo, hi) + pool_alert_episodes(run.alerts, lo, hi)
            + weight_episodes(run.corrections, lo, hi))


def run_corrections(run: Run) -> dict[str, Any]:
    lo, hi = (START_TS + s for s in run.scenario.scored)
    return correction_report(run.corrections, run_labels(run), lo, hi)


def delay_targets(profile: str) -> dict[str, float | None]:
    """Per detector, the delay target (persistence + 10 s); the pool alert has none."""
    settings = profile_settings(profile).detectors
    # the learned detector has no delay target: its faults unfold over minutes (a 10 min ramp)
    return {d: (None if d in ("pool", "learned") else persistence_s(settings, d)) for d in DETECTORS}


def summarize(runs: Sequence[Run], persistence: Mapping[str, float | None]) -> dict[str, Any]:
    """Score a group of runs (one profile) and judge every target."""
    episodes: list[Episode] = []
    labels: list[Label] = []
    clean_models: list[str] = []
    low_rate_models: list[str] = []
    clean_hours = low_hours = 0.0
    reports: list[tuple[int, dict[str, Any]]] = []
    for i, run in enumerate(runs):
        # runs share model names: tell them apart so a label only matches alerts of its own run
        episodes += [Episode(f"{i}:{e.model}", e.replica, e.detector, e.rule, e.start, e.carried)
                     for e in run_episodes(run)]
        labels += [Label(f"{i}:{lb.model}", lb.replica, lb.kind, lb.start, lb.end) for lb in run_labels(run)]
        span_h = (run.scenario.scored[1] - run.scenario.scored[0]) / 3600.0
        clean_models += [f"{i}:{m}" for m in run.scenario.clean_pools()]
        clean_hours += span_h * len(run.scenario.clean_pools())
        if run.scenario.low_rate:
            low_rate_models.append(f"{i}:{LOW_RATE_POOL}")
            low_hours += span_h
        reports.append((i, run_corrections(run)))
    per = score(episodes, labels, clean_models, clean_hours)
    for detector, summary in per.items():
        summary["persistence_s"] = persistence.get(detector)
        summary["targets_met"] = judge(summary, summary["persistence_s"], detector)
    false_total = sum(s["clean_false"] for s in per.values())
    low_false = sum(1 for e in episodes if e.model in low_rate_models)
    quiet_false = sum(1 for e in episodes if e.model.endswith(f":{QUIET_POOL}") and e.replica)
    return {
        "runs": len(runs),
        "clean_pool_hours": round(clean_hours, 3),
        "clean_false_total": false_total,
        "clean_false_per_hour": false_total / clean_hours if clean_hours else None,
        "low_rate_false_per_hour": low_false / low_hours if low_hours else None,
        "quiet_pool_replica_alerts": quiet_false,
        "detectors": per,
        "corrections": _corrections_summary(reports, persistence),
        "confusion": confusion(episodes, labels),
        "recall_by_kind": recall_by_kind(episodes, labels),
        "carried_alerts": sum(e.carried for e in episodes),
    }


def recall_by_kind(episodes: Sequence[Episode], labels: Sequence[Label]) -> dict[str, dict[str, Any]]:
    """Per fault kind: its detector, faults, how many that detector found (an alert matched to the fault).

    >>> labels = [Label("m", "r1", "ttft_drift", 100.0, 200.0), Label("m", "r2", "throughput_drop", 100.0, 200.0)]
    >>> recall_by_kind([Episode("m", "r1", "learned", "", 150.0)], labels)["throughput_drop"]
    {'detector': 'learned', 'labels': 1, 'detected': 0, 'recall': 0.0}
    """
    found = {(match(e, labels), e.detector) for e in episodes}  # (the fault an alert is right about, by whom)
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({lb.kind for lb in labels}):
        detector = DETECTOR_OF.get(kind)
        mine = [lb for lb in labels if lb.kind == kind]
        hit = sum(1 for lb in mine if (lb, detector) in found)
        out[kind] = {"detector": detector, "labels": len(mine), "detected": hit,
                     "recall": hit / len(mine) if mine else None}
    return out


def kind_table(groups: Mapping[str, Mapping[str, Any]], scopes: Sequence[str], profile: str,
               detector: str) -> str:
    """Recall per fault kind of ``detector`` (found / faults), one column per scope."""
    present = [s for s in scopes if f"{profile}|{s}" in groups]
    kinds = sorted({k for s in present for k, v in groups[f"{profile}|{s}"]["recall_by_kind"].items()
                    if v["detector"] == detector})
    lines = ["| fault kind | " + " | ".join(present) + " |", "|---|" + "---:|" * len(present)]
    for kind in kinds:
        cells = []
        for scope in present:
            v = groups[f"{profile}|{scope}"]["recall_by_kind"].get(kind)
            cells.append("—" if v is None else f"{_fmt(v['recall'])} ({v['detected']}/{v['labels']})")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _corrections_summary(reports: Sequence[tuple[int, dict[str, Any]]],
                         persistence: Mapping[str, float | None]) -> dict[str, Any]:
    healthy_zero = [[f"{i}:{m}", r, t] for i, rep in reports for m, r, t in rep["healthy_zero"]]
    zero_pools = sorted({f"{i}:{m}" for i, rep in reports for m, _ in rep["all_zero"]})
    below: dict[str, dict[str, Any]] = {}
    for kind in REPLICA_FAULT_KINDS:
        target = persistence.get(DETECTOR_OF[kind])
        delays = [b["delay_s"] for _, rep in reports for b in rep["below"] if b["kind"] == kind]
        found = sorted(d for d in delays if d is not None)
        met = sum(1 for d in found if target is not None and d <= target + 10.0)
        below[kind] = {"faults": len(delays), "below": len(found), "within_target": met,
                       "target_s": None if target is None else target + 10.0,
                       "share": met / len(delays) if delays else None,
                       "delay_median_s": statistics.median(found) if found else None}
    faults = sum(b["faults"] for b in below.values())
    met = sum(b["within_target"] for b in below.values())
    return {"healthy_zero": len(healthy_zero), "healthy_zero_steps": sum(r["healthy_zero_steps"] for _, r in reports),
            "healthy_zero_where": healthy_zero[:50], "all_zero_pools": len(zero_pools),
            "all_zero_steps": sum(len(r["all_zero"]) for _, r in reports), "all_zero_where": zero_pools[:50],
            "panic_corrections": sum(r["panic"] for _, r in reports), "below": below,
            "below_share": met / faults if faults else None,
            "corrections": sum(r["corrections"] for _, r in reports)}


# ----------------------------------------------------------------------------- the oracle


def calibration_key(scenario: Scenario) -> str:
    """The oracle's thresholds are calibrated per shape (without live signals apart: the telemetry differs)."""
    return scenario.shape.name + ("" if scenario.live_signals else "|no-live")


def run_oracle(runs: Sequence[Run]) -> tuple[dict[str, dict[str, oracle.Calibration]], dict[str, list[dict[str, Any]]]]:
    """Calibrate the oracle per shape on the clean pools of every run of that shape, then its verdict on
    every fault: the calibrations by key and fault kind, the faults' results by scenario name."""
    records: dict[str, dict[str, oracle.OracleRecord]] = {}  # key -> scenario name -> its record (profiles share it)
    for run in runs:
        if run.oracle is not None:
            records.setdefault(calibration_key(run.scenario), {}).setdefault(run.scenario.name, run.oracle)
    calibrations: dict[str, dict[str, oracle.Calibration]] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    for key, by_name in records.items():
        calibrations[key], made = oracle.evaluate(list(by_name.values()))
        results.update(zip(by_name, made, strict=True))
    return calibrations, results


def label_detections(run: Run) -> dict[tuple[str, str, str, str], float]:
    """Per replica fault and detector whose recall counts it ``(model, replica, kind, detector)``,
    the delay of that detector's first right alert (what :func:`bench.scoring.score` counts for
    recall and delay)."""
    labels = run_labels(run)
    first: dict[tuple[str, str, str, str], float] = {}
    for e in run_episodes(run):
        lb = match(e, labels)
        if lb is not None and lb.replica is not None and lb.kind in RECALLS.get(e.detector, ()):
            key = (lb.model, lb.replica, lb.kind, e.detector)
            first[key] = min(first.get(key, math.inf), e.start - lb.start)
    return first


def _also(kind: str) -> list[str]:
    """The signals reported beside ``kind``'s own detector (the weights beside slow_replica)."""
    return [d for d, kinds in RECALLS.items() if kind in kinds and d != DETECTOR_OF[kind]]


def oracle_faults(run: Run, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The oracle's verdict on each of the run's replica faults, with this profile's delay beside it
    (``ours_delay_s``, None: not detected; ``also_delay_s``: the same per signal reported beside
    the kind's detector)."""
    ours = label_detections(run)
    out = []
    for r in results.get(run.scenario.name, []):
        kind = r["kind"]
        mine = ours.get((r["model"], r["replica"], kind, DETECTOR_OF[kind]))
        record = {**r, "detector": DETECTOR_OF[kind], "ours_delay_s": None if mine is None else round(mine, 3)}
        also = {d: ours.get((r["model"], r["replica"], kind, d)) for d in _also(kind)}
        if also:
            record["also_delay_s"] = {d: None if v is None else round(v, 3) for d, v in also.items()}
        out.append(record)
    return out


def oracle_key(kind: str, detector: str) -> str:
    """The oracle summary's key of a detector on a fault kind: the detector's name, and the kind beside
    it where the detector owns several of the oracle's kinds (the learned detector's two).

    >>> oracle_key("long_tail", "long_tail"), oracle_key("ttft_drift", "learned")
    ('long_tail', 'learned:ttft_drift')
    """
    owned = [k for k in oracle.KINDS if DETECTOR_OF[k] == detector]
    return f"{detector}:{kind}" if len(owned) > 1 else detector


def oracle_summary(runs: Sequence[Run], results: Mapping[str, Sequence[Mapping[str, Any]]],
                   persistence: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """Per detector of a fault kind the oracle knows: the oracle's recall and median delay, ours beside
    them, the ratios and the targets (recall >= 0.95 x the oracle's, median delay <= 2 x the oracle's
    + 5 s); the faults the oracle found undetectable, apart; and, with ``persistence`` (the delay
    targets), how many of the detectable faults had their replica below every healthy one in time
    (``below_of_detectable``, :func:`_below_of_detectable`)."""
    faults = [(run, f) for run in runs for f in oracle_faults(run, results)]
    per: dict[str, dict[str, Any]] = {}
    for kind, detector in ((k, d) for k in oracle.KINDS for d in (DETECTOR_OF[k], *_also(k))):
        mine = [f for _, f in faults if f["kind"] == kind]
        if not mine:
            continue

        def delay(f: Mapping[str, Any], detector: str = detector) -> float | None:
            return f["ours_delay_s"] if detector == f["detector"] else f.get("also_delay_s", {}).get(detector)

        found = [f for f in mine if f["detectable"]]
        delays = sorted(f["delay_s"] for f in found)
        ours = sorted(d for f in mine if (d := delay(f)) is not None)
        ours_found = sum(1 for f in found if delay(f) is not None)
        recall, ours_recall = len(found) / len(mine), len(ours) / len(mine)
        median = statistics.median(delays) if delays else None
        ours_median = statistics.median(ours) if ours else None
        target = None if median is None else ORACLE_DELAY_FACTOR * median + ORACLE_DELAY_SLACK_S
        per[oracle_key(kind, detector)] = {
            "detector": detector, "kind": kind, "statistic": oracle.STATISTICS[kind], "faults": len(mine),
            "oracle_detected": len(found), "oracle_recall": recall, "oracle_delays_s": delays,
            "oracle_delay_median_s": median, "ours_detected": len(ours), "ours_recall": ours_recall,
            "ours_delay_median_s": ours_median, "ours_detected_of_detectable": ours_found,
            "recall_of_detectable": ours_found / len(found) if found else None,
            "recall_ratio": ours_recall / recall if recall else None, "delay_target_s": target,
            "delay_ratio": ours_median / median if ours_median is not None and median else None,
            "targets_met": {"recall": ours_recall >= ORACLE_RECALL_SHARE * recall - 1e-9,
                            "delay": None if target is None or ours_median is None else ours_median <= target},
        }
    undetectable = [{"run": run.scenario.name, "shape": run.scenario.shape.name, "kind": f["kind"],
                     "replica": f["replica"], "requests": f["requests"], "samples": f["samples"],
                     "max_cusum": f["max_cusum"], "h": f["h"], "why": f["why"]}
                    for run, f in faults if not f["detectable"]]
    return {"detectors": per, "undetectable": undetectable,
            "below_of_detectable": _below_of_detectable(runs, faults, per, persistence)}


def _below_of_detectable(runs: Sequence[Run], faults: Sequence[tuple[Run, Mapping[str, Any]]],
                         per: Mapping[str, Mapping[str, Any]],
                         persistence: Mapping[str, float | None] | None) -> dict[str, Any]:
    """Of the faults the oracle detects, how many had their replica below every healthy one in time:
    within the larger of its detector's own target (persistence + 10 s) and the oracle's delay target
    for that detector (2 x the oracle's median + 5 s: what the evidence allowed)."""
    if persistence is None:
        return {"faults": 0, "within_target": 0, "share": None, "by_kind": {}}
    below = {(id(run), b["model"], b["replica"], b["kind"]): b["delay_s"]
             for run in runs for b in run_corrections(run)["below"]}
    detectable = [(run, f) for run, f in faults
                  if f["detectable"] and (id(run), f["model"], f["replica"], f["kind"]) in below]
    within = 0
    by_kind: dict[str, dict[str, int]] = {}
    for run, f in detectable:
        delay = below[(id(run), f["model"], f["replica"], f["kind"])]
        detector = DETECTOR_OF[f["kind"]]
        own = persistence.get(detector)
        targets = [t for t in ((None if own is None else own + 10.0),
                               (per.get(oracle_key(f["kind"], detector)) or {}).get("delay_target_s"))
                   if t is not None]
        hit = int(delay is not None and bool(targets) and delay <= max(targets))
        within += hit
        kind = by_kind.setdefault(f["kind"], {"faults": 0, "within_target": 0})
        kind["faults"] += 1
        kind["within_target"] += hit
    return {"faults": len(detectable), "within_target": within,
            "share": within / len(detectable) if detectable else None, "by_kind": by_kind}


# ----------------------------------------------------------------------------- report


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _miss(ok: bool | None) -> str:
    return " ✗" if ok is False else ""


def detector_table(groups: Mapping[str, Mapping[str, Any]], scope: str, profiles: Sequence[str]) -> str:
    """Per detector, the profiles side by side (recall, precision, delay, clean false alerts)."""
    present = [p for p in profiles if f"{p}|{scope}" in groups]
    head = "| detector | target delay (s) | " + " | ".join(
        f"{p}: recall | precision | delay median / P95 (s) | false alerts/h" for p in present) + " |"
    lines = [head, "|---|---:|" + "---:|---:|---:|---:|" * len(present)]
    for detector in DETECTORS:
        per = [groups[f"{p}|{scope}"]["detectors"][detector] for p in present]
        targets = sorted({"—" if s["persistence_s"] is None else f"≤ {s['persistence_s'] + 10:.0f}" for s in per})
        cells = []
        for s in per:
            met = s["targets_met"]
            cells.append(f"{_fmt(s['recall'])}{_miss(met['recall'])} | {_fmt(s['precision'])}{_miss(met['precision'])}"
                         f" | {_fmt(s['delay_median_s'], 0)} / {_fmt(s['delay_p95_s'], 0)}{_miss(met['delay'])}"
                         f" | {_fmt(s['false_per_hour'], 1)}{_miss(met['false_per_hour'])}")
        lines.append(f"| {detector} | {' / '.join(targets)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def outcome_table(groups: Mapping[str, Mapping[str, Any]], scope: str, profiles: Sequence[str]) -> str:
    """All detectors and the corrections, the profiles side by side."""
    present = [p for p in profiles if f"{p}|{scope}" in groups]
    lines = ["| outcome | target | " + " | ".join(present) + " |", "|---|---|" + "---:|" * len(present)]

    def row(name: str, target: str, cell: Any) -> None:
        lines.append(f"| {name} | {target} | " + " | ".join(cell(groups[f'{p}|{scope}']) for p in present) + " |")

    def rate(value: float | None) -> str:
        return f"{_fmt(value, 1)}{_miss(None if value is None else value <= FALSE_PER_HOUR_TARGET)}"

    def count(value: int) -> str:
        return f"{value}{_miss(value == 0)}"

    row("false alerts / clean pool-hour, all detectors", "≤ 1", lambda g: rate(g["clean_false_per_hour"]))
    row("… of which on the low-rate pool (per its pool-hour)", "≤ 1", lambda g: rate(g["low_rate_false_per_hour"]))
    row("healthy replicas at weight 0 (episodes)", "0", lambda g: count(g["corrections"]["healthy_zero"]))
    row("all-zero pools", "0", lambda g: count(g["corrections"]["all_zero_pools"]))

    def below(g: Mapping[str, Any]) -> str:
        c = g["corrections"]
        share = c["below_share"]
        met = sum(b["within_target"] for b in c["below"].values())
        faults = sum(b["faults"] for b in c["below"].values())
        return f"{met}/{faults}{_miss(None if share is None else share >= RECALL_TARGET)}"

    row("faulty replica below every healthy one within its delay target", "≥ 0.95", below)

    def below_detectable(g: Mapping[str, Any]) -> str:
        b = (g.get("oracle") or {}).get("below_of_detectable")
        if not b or not b["faults"]:
            return "—"
        return f"{b['within_target']}/{b['faults']}{_miss(b['share'] >= BELOW_OF_DETECTABLE_TARGET)}"

    row("… of the faults the oracle can detect (within the oracle's delay target where longer)",
        f"≥ {BELOW_OF_DETECTABLE_TARGET:g}", below_detectable)
    row("quiet pool: replica alerts on its replicas", "0", lambda g: count(g["quiet_pool_replica_alerts"]))
    row("panic corrections (mode: panic)", "—", lambda g: str(g["corrections"]["panic_corrections"]))
    return "\n".join(lines)


def overview_table(groups: Mapping[str, Mapping[str, Any]], scopes: Sequence[str], profiles: Sequence[str],
                   splits: Mapping[str, str]) -> str:
    """One line per scope: targets missed, false alerts/h, healthy at 0, all-zero pools, per profile."""
    present = [p for p in profiles if any(f"{p}|{s}" in groups for s in scopes)]
    lines = ["| scope | split | " + " | ".join(f"{p}: targets missed | false alerts/h | healthy at 0 | all-zero pools"
                                              for p in present) + " |",
             "|---|---|" + "---:|---:|---:|---:|" * len(present)]
    for scope in scopes:
        cells = []
        for p in present:
            g = groups.get(f"{p}|{scope}")
            if g is None:
                cells.append("— | — | — | —")
                continue
            missed = sum(v is False for s in g["detectors"].values() for v in s["targets_met"].values())
            c = g["corrections"]
            cells.append(f"{missed} | {_fmt(g['clean_false_per_hour'], 1)} | {c['healthy_zero']} | "
                         f"{c['all_zero_pools']}")
        lines.append(f"| {scope} | {splits.get(scope, '')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def live_table(groups: Mapping[str, Mapping[str, Any]], scope: str, profiles: Sequence[str]) -> str:
    """Median / P95 delay per detector with and without the engines' live signals."""
    present = [p for p in profiles if f"{p}|{scope}" in groups and f"{p}|{scope}|no-live" in groups]
    lines = ["| detector | " + " | ".join(f"{p}: live signals | without" for p in present) + " |",
             "|---|" + "---:|---:|" * len(present)]
    for detector in DETECTORS:
        cells = []
        for p in present:
            for key in (f"{p}|{scope}", f"{p}|{scope}|no-live"):
                s = groups[key]["detectors"][detector]
                cells.append(f"{_fmt(s['delay_median_s'], 0)} / {_fmt(s['delay_p95_s'], 0)} "
                             f"({s['detected']}/{s['labels']})")
        lines.append(f"| {detector} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def oracle_table(groups: Mapping[str, Mapping[str, Any]], scope: str, profiles: Sequence[str]) -> str:
    """Per detector, the oracle's recall and median delay and each profile's beside them (✗: below 0.95 x
    the oracle's recall, or a median delay above 2 x the oracle's + 5 s)."""
    present = [p for p in profiles if "oracle" in groups.get(f"{p}|{scope}", {})]
    if not present:
        return "(no oracle)"
    head = ("| detector | fault | oracle: found | delay median (s) | target delay (s) | " + " | ".join(
        f"{p}: found | of the detectable | recall / oracle's | delay median (s)" for p in present) + " |")
    lines = [head, "|---|---|---:|---:|---:|" + "---:|---:|---:|---:|" * len(present)]
    first = groups[f"{present[0]}|{scope}"]["oracle"]["detectors"]
    for detector, o in first.items():
        cells = []
        for p in present:
            s = groups[f"{p}|{scope}"]["oracle"]["detectors"][detector]
            met = s["targets_met"]
            detectable = ("—" if s["recall_of_detectable"] is None else
                          f"{s['ours_detected_of_detectable']}/{s['oracle_detected']}")
            cells.append(f"{s['ours_detected']}/{s['faults']}{_miss(met['recall'])} | {detectable} | "
                         f"{_fmt(s['recall_ratio'])} | {_fmt(s['ours_delay_median_s'], 0)}{_miss(met['delay'])}")
        lines.append(f"| {o.get('detector', detector)} | {o['kind']} | {o['oracle_detected']}/{o['faults']} | "
                     f"{_fmt(o['oracle_delay_median_s'], 0)} | {_fmt(o['delay_target_s'], 0)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_table(calibrations: Mapping[str, Mapping[str, oracle.Calibration]]) -> str:
    """The oracle's threshold h per shape and statistic (its crossings on the clean pools)."""
    kinds = [k for k in oracle.KINDS if any(k in c for c in calibrations.values())]
    lines = ["| shape | clean pool-hours | " + " | ".join(kinds) + " |", "|---|---:|" + "---:|" * len(kinds)]
    for key, per in calibrations.items():
        hours = next(iter(per.values())).pool_hours if per else 0.0
        cells = [f"{c.h:.1f} ({c.crossings})" if (c := per.get(k)) else "—" for k in kinds]
        lines.append(f"| {key} | {hours:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def undetectable_table(calibrations: Mapping[str, Any], results: Mapping[str, Sequence[Mapping[str, Any]]],
                       runs: Sequence[Run]) -> str:
    """Every fault the oracle could not raise within its span, by shape."""
    names = {r.scenario.name: r.scenario for r in runs}
    rows = [(calibration_key(names[name]), name, f) for name, faults in results.items() for f in faults
            if not f["detectable"]]
    if not rows:
        return "(none: the oracle raised every fault within its span)"
    order = list(calibrations)
    rows.sort(key=lambda r: (order.index(r[0]) if r[0] in order else len(order), r[1],
                             oracle.KINDS.index(r[2]["kind"])))
    lines = ["| shape | run | fault | replica | requests during it | why |", "|---|---|---|---|---:|---|"]
    lines += [f"| {key} | {name} | {f['kind']} | {f['replica']} | {f['requests']} | {f['why']} |"
              for key, name, f in rows]
    return "\n".join(lines)


def plot(groups: Mapping[str, Mapping[str, Any]], names: Sequence[str], path: Path) -> None:
    """Detection delay per detector, one panel per group, target marked."""
    try:
        import matplotlib
    except ImportError:  # the bench extra is not installed: the tables and JSON are the result
        print(f"(no plot {path}: matplotlib is not installed; pip install -e '.[bench]')", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in names if n in groups]
    if not names:
        return
    cols = 2 if len(names) > 1 else 1
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.9 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        per = groups[name]["detectors"]
        for i, detector in enumerate(DETECTORS):
            s = per[detector]
            delays = s["delays_s"]
            if delays:
                ax.boxplot([delays], positions=[i], widths=0.5, showfliers=False)
                ax.scatter([i + 0.12 * ((k % 5) - 2) / 2 for k in range(len(delays))], delays, s=8, alpha=0.5)
            if s["persistence_s"] is not None:
                ax.hlines(s["persistence_s"] + 10, i - 0.35, i + 0.35, colors="red", linestyles="dashed")
            ax.text(i, -8, f"{s['detected']}/{s['labels']}", ha="center", fontsize=8)
        ax.set_xticks(range(len(DETECTORS)), DETECTORS, rotation=35, ha="right", fontsize=8)
        ax.set_title(name.replace("|", " / "), fontsize=10)
        ax.set_ylim(bottom=-12)
        ax.grid(axis="y", alpha=0.3)
    for row in axes:
        row[0].set_ylabel("delay from fault start (s)")
    fig.suptitle("Detection delay per detector, event time (red: persistence + 10 s; under each box: "
                 "detected / faults)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def run_record(run: Run, keep_episodes: bool,
               oracle_results: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """What the JSON keeps of a run: its scenario, load check, counts and the oracle's verdict on each
    fault beside ours (``keep_episodes``: everything)."""
    episodes = run_episodes(run)
    report = run_corrections(run)
    record: dict[str, Any] = {
        "profile": run.profile, "split": run.split, "mode": run.mode, "scenario": run.scenario.describe(),
        "stats": run.stats,
        "episodes_per_detector": {d: sum(e.detector == d for e in episodes) for d in DETECTORS},
        "corrections": {"read": report["corrections"], "healthy_zero": len(report["healthy_zero"]),
                        "healthy_zero_steps": report["healthy_zero_steps"], "all_zero_steps": len(report["all_zero"]),
                        "panic": report["panic"], "below": report["below"]},
    }
    if oracle_results is not None:
        record["oracle"] = oracle_faults(run, oracle_results)
    if keep_episodes:
        record["episodes"] = [asdict(e) for e in episodes]
        record["corrections"] = report
    return record


def scenarios_of(args: argparse.Namespace) -> list[Scenario]:
    lives = {"on": (True,), "off": (False,), "both": (True, False)}[args.live_signals]
    families = {"rules": ("rules",), "learned": ("learned",), "both": ("rules", "learned")}[
        args.family or ("rules" if args.quick else "both")]
    if args.quick and not args.shape:
        pairs = list(QUICK)
    else:
        shapes = args.shape or list(SHAPES)
        seeds = args.seeds[:1] if args.quick else args.seeds
        pairs = [(s, seed) for s in shapes for seed in seeds]
    made = []
    for family in families:
        for live in lives:
            for shape, seed in pairs:
                if family == "learned":
                    made.append(Scenario.learned(make_shape(shape), seed, live, replicas=args.pool_size,
                                                 fault_at_s=60.0 * args.learned_fault_at))
                else:
                    made.append(Scenario(make_shape(shape), seed, live, replicas=args.pool_size))
    return made


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by ``profile|scope``: the split (FIT, HOLDOUT) and every shape (``|no-live`` apart)."""
    out: dict[str, list[Run]] = {}
    for run in runs:
        suffix = "" if run.scenario.live_signals else "|no-live"
        for scope in (run.split, run.scenario.shape.name):
            out.setdefault(f"{run.profile}|{scope}{suffix}", []).append(run)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one fit and one holdout run (a smoke run, < 60 s)")
    parser.add_argument("--mode", choices=["fast", "worker"], default="fast",
                        help="fast: the pipeline in-process; worker: the real worker on a real broker")
    parser.add_argument("--profile", action="append", metavar="NAME[=PATH]",
                        help=f"detector profile(s) (default: {', '.join(PROFILES_DEFAULT)})")
    parser.add_argument("--shape", action="append", metavar="TRACE@SCALEx",
                        help=f"shape(s) (default: all: {', '.join(SHAPES)})")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--fit-shapes", nargs="+", default=list(FIT_SHAPES))
    parser.add_argument("--fit-seeds", type=int, nargs="+", default=list(FIT_SEEDS))
    parser.add_argument("--live-signals", choices=["on", "off", "both"], default="on",
                        help="the engines' live gauges and latency histograms in the simulated telemetry")
    parser.add_argument("--no-live-signals", dest="live_signals", action="store_const", const="off",
                        help="same as --live-signals off")
    parser.add_argument("--family", choices=["rules", "learned", "both"],
                        help="rules: the rules' runs (faults at 2 min, ~7 min each); learned: the learned "
                             "detector's runs (its two faults and the rules', at 20 min, ~37 min each); "
                             "default both (--quick: rules)")
    parser.add_argument("--pool-size", type=int, default=REPLICAS,
                        help=f"replicas per pool (default {REPLICAS}; larger: the same faults in larger pools)")
    parser.add_argument("--learned-fault-at", type=float, default=LEARNED_FAULT_AT_S / 60.0, metavar="MINUTES",
                        help=f"the learned runs' faults start after this many minutes (default "
                             f"{LEARNED_FAULT_AT_S / 60.0:g}; later: more history on every replica before them)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="fast mode: scenarios simulated in parallel processes (default 1)")
    parser.add_argument("--keep-episodes", action="store_true",
                        help="write every run's alert episodes and correction lists to the JSON (large)")
    parser.add_argument("--out", type=Path, default=RESULTS / "quality.json")
    parser.add_argument("--plot", type=Path, help="delay plot (default: next to --out, not in --quick runs)")
    args = parser.parse_args(argv)
    profiles = args.profile or list(PROFILES_DEFAULT)
    try:
        names = [parse_profile(p)[0] for p in profiles]
        scenarios = scenarios_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    if len(set(names)) != len(names):
        parser.error(f"profile names must differ: {names}")
    if not 60.0 * args.learned_fault_at > WARMUP_S:
        parser.error(f"--learned-fault-at: must be after the unscored first {WARMUP_S:g} s, "
                     f"got {args.learned_fault_at:g} min")
    began = time.monotonic()
    runs: list[Run] = []
    failures: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="skewwatch-quality-"))
    total = len(scenarios) * (1 if args.mode == "fast" else len(profiles))
    done = 0

    def report(run: Run) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{total}] {run.key} ({run.split}): {run.stats['arrivals']} requests, "
              f"{len(run.alerts)} alert records, {len(run.corrections)} corrections, {run.stats['wall_s']} s",
              file=sys.stderr)

    if args.mode == "fast":
        jobs = [(scenario, profiles, split_of(scenario, args.fit_shapes, args.fit_seeds)) for scenario in scenarios]
        with concurrent.futures.ProcessPoolExecutor(args.jobs) if args.jobs > 1 else contextlib.nullcontext() as pool:
            results = pool.map(_run_fast_job, jobs) if pool is not None else map(_run_fast_job, jobs)
            for made in results:
                runs.extend(made)
                report(made[-1])
    else:
        with kafka(workdir) as bootstrap:
            for scenario in scenarios:
                split = split_of(scenario, args.fit_shapes, args.fit_seeds)
                for profile in profiles:
                    try:
                        run = run_worker(scenario, profile, split, bootstrap, workdir)
                    except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
                        failures.append(f"{profile}|{scenario.name}: {exc}")
                        print(f"{profile}|{scenario.name}: FAILED {str(exc)[:2000]}", file=sys.stderr)
                        continue
                    run.profile = parse_profile(profile)[0]
                    runs.append(run)
                    report(run)
    targets = {name: delay_targets(spec) for name, spec in zip(names, profiles, strict=True)}
    groups = {key: summarize(members, targets[members[0].profile]) for key, members in group_runs(runs).items()}
    calibrations, oracle_results = run_oracle(runs)
    for key, members in group_runs(runs).items():
        groups[key]["oracle"] = oracle_summary(members, oracle_results, targets[members[0].profile])
    splits = {run.scenario.shape.name: "fit" if any(r.split == "FIT" for r in runs
                                                   if r.scenario.shape.name == run.scenario.shape.name)
              else "holdout" for run in runs}
    shape_order = [s for s in SHAPES if s in splits] + [s for s in splits if s not in SHAPES]
    scopes = [s for s in ("FIT", "HOLDOUT") if any(k.endswith(f"|{s}") for k in groups)] + shape_order
    fit_desc = (f"FIT = shapes {', '.join(args.fit_shapes)} x seeds {', '.join(map(str, args.fit_seeds))}; "
                "HOLDOUT = every other run")
    print(f"\n# Detection quality ({args.mode} mode; {fit_desc})\n")
    print(overview_table(groups, scopes, names, {**splits, "FIT": "fit", "HOLDOUT": "holdout"}))
    for scope in scopes:
        members = group_runs(runs).get(f"{names[0]}|{scope}", [])
        seeds = sorted({r.scenario.seed for r in members})
        print(f"\n## {scope} ({len(members)} runs, seeds {', '.join(map(str, seeds))})\n")
        print(detector_table(groups, scope, names))
        print()
        print(outcome_table(groups, scope, names))
        print("\noracle (bench/oracle.py: the earliest any detector could raise each fault at <= 1 false alert per "
              "clean pool-hour) and ours:\n")
        print(oracle_table(groups, scope, names))
        if args.live_signals == "both":
            print("\ndelay median / P95 (s) with and without the engines' live signals:\n")
            print(live_table(groups, scope, names))
    print("\n## oracle: threshold h per shape and statistic (its crossings on the clean pools)\n")
    print(calibration_table(calibrations))
    print("\n## oracle: undetectable faults (left out of the recall of the detectable)\n")
    print(undetectable_table(calibrations, oracle_results, runs))
    if any(r.scenario.family == "learned" for r in runs):
        print(f"\n## learned: recall per fault kind ({names[0]})\n")
        print(kind_table(groups, scopes, names[0], "learned"))
    out = {
        "machine": machine(),
        "mode": args.mode,
        "wall_s": round(time.monotonic() - began, 1),
        "split": {"fit_shapes": args.fit_shapes, "fit_seeds": args.fit_seeds,
                  "runs": {r.key: r.split for r in runs}},
        "setup": {"profiles": dict(zip(names, profiles, strict=True)), "seeds": args.seeds, "quick": args.quick,
                  "live_signals": args.live_signals, "detector_of": DETECTOR_OF,
                  "pool_size": args.pool_size, "learned_fault_at_min": args.learned_fault_at,
                  "shapes": {s: make_shape(s).describe() for s in shape_order},
                  "targets": {"recall": RECALL_TARGET, "precision": RECALL_TARGET, "delay": "persistence + 10 s",
                              "false_per_clean_pool_hour": FALSE_PER_HOUR_TARGET, "healthy_zero": 0,
                              "all_zero_pools": 0, "faulty_below_within_target": RECALL_TARGET}},
        "oracle": {"statistics": oracle.STATISTICS,
                   "targets": {"recall": f">= {ORACLE_RECALL_SHARE} x the oracle's",
                               "delay": (f"median <= {ORACLE_DELAY_FACTOR:g} x the oracle's "
                                         f"+ {ORACLE_DELAY_SLACK_S:g} s")},
                   "calibration": {key: {kind: {**asdict(c), "false_per_hour": c.false_per_hour}
                                         for kind, c in per.items()} for key, per in calibrations.items()}},
        "groups": groups,
        "failures": failures,
        "runs": [run_record(r, args.keep_episodes, oracle_results) for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    plot_path = args.plot or (None if args.quick else args.out.with_name(args.out.stem + "_delays.png"))
    if plot_path is not None:
        plot(groups, [f"{p}|{s}" for s in ("FIT", "HOLDOUT") for p in names], plot_path)
    if not failures:  # broker data and worker logs: kept only when something went wrong
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nwrote {args.out}{' and ' + str(plot_path) if plot_path else ''} in {out['wall_s']:.0f} s",
          file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
