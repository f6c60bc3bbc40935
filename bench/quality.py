"""Detection quality of the real worker on labelled faults.

Every fault kind of :mod:`skewwatch.sim.faults` x 3 seeds x 2 load levels, plus clean pools, is
sent through ``skewwatch worker`` on a real Kafka broker; the alerts it publishes on
``llm.alerts`` (and the weights on ``llm.routing-corrections``) are matched against the labels.

**Layout.** One *run* per (traffic source, load, seed, profile): fresh topics and consumer
group, a fresh worker, traffic produced at full speed in event time. A run holds nine
independent model pools of four replicas each: seven with one fault each (on replica
``seed % 4`` of the pool, from ``FAULT_AT_S`` for ``FAULT_FOR_S``) and two clean ones. The
pipeline keeps models apart (windows per replica, one decider per model), so this is nine
scenarios per worker start instead of one, which is what keeps the suite at minutes on two
cores; the router is ``round_robin`` so no routing reaction changes what a fault looks like.

**Sources.** ``fleet``: the discrete-event simulator (trace arrivals and lengths, continuous
batching; latency follows completion length). ``generator``: the statistical generator, whose
clean traffic is built to sit inside every rule. Both are reported; they disagree on purpose.

**What counts** (pure functions below, tested in ``tests/unit/test_bench_quality_scoring.py``):

- An *alert* is an episode of one ``(model, replica, detector, rule)``: from an ``open`` record
  to its ``resolved`` (a re-``open`` while open, e.g. a gpu_health severity change, is the same
  episode). The first ``WARMUP_S`` of a run are not scored (windows are not full yet); an
  episode still open when scoring starts counts as an alert *at* that moment, so a rule that
  fires on healthy traffic from the start is not hidden by the warm-up.
- Two signals have no alert of their own and are read from the weights, per correction:
  ``stale`` (weight 0 without a drain/isolate action: the replica stopped reporting) for
  ``replica_silence``, and ``weights`` (0 < weight < ``WEIGHT_DROP`` x an equal share) for
  ``slow_replica``. They open on the first correction that holds and resolve after two that
  do not.
- An alert is a true positive when a label on the same model and replica, of a kind that
  detector is meant for (:data:`DETECTOR_OF`; the weights accept any fault but a silence, see
  :data:`ACCEPTS`), has ``start <= alert <= end + GRACE_S`` (the 60 s window still holds the
  fault's requests after it ends, and slowed requests finish late). Everything else is a false
  positive, including another detector firing on a faulty replica.
- Recall: labels of the detector's own kind with a true positive / those labels. Delay: first
  true positive - label start, in event time. Precision: true / all alerts of the detector.
  False alerts per hour: alerts on the clean pools per simulated hour of one 4-replica pool.

Targets: recall >= 0.95, precision >= 0.95, median delay <= persistence + 10 s, at
most 1 false alert per simulated hour.

    .venv/bin/python bench/quality.py                 # full suite, both profiles (~6 min on 2 cores)
    .venv/bin/python bench/quality.py --quick         # one seed and load per source: a smoke run

Prints tables, writes ``bench/results/quality.json`` and ``bench/results/quality_delays.png``.

>>> labels = [Label("m", "r1", "long_tail", 100.0, 200.0)]
>>> eps = [Episode("m", "r1", "long_tail", "", 130.0), Episode("m", "r2", "long_tail", "", 150.0)]
>>> s = score(eps, labels, clean_models=[], clean_hours=0.0)
>>> s["long_tail"]["recall"], s["long_tail"]["precision"], s["long_tail"]["delays_s"]
(1.0, 0.5, [30.0])
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    EVERY_STEP_ENV,
    RESULTS,
    Worker,
    delete_run_topics,
    detector_settings,
    fresh_settings,
    kafka,
    machine,
    persistence_s,
    quantile,
    read_topics,
)

# fault kind -> the detector (or weights signal) meant to catch it
DETECTOR_OF: dict[str, str] = {
    "long_tail": "long_tail",
    "batch_collapse": "batch_collapse",
    "context_burst": "context_burst",
    "gpu_fault": "gpu_health",
    "kv_pressure": "kv_pressure",
    "slow_replica": "weights",
    "replica_silence": "stale",
}
DETECTORS: tuple[str, ...] = tuple(DETECTOR_OF.values())
FAULT_KINDS: tuple[str, ...] = tuple(DETECTOR_OF)
# detector -> the fault kinds where its alert is right. A detector is right on its own kind; the
# weights are also right to drop on any degraded replica (that is what they are for), so a drop
# during another fault is not a false alert, though only slow_replica counts for their recall.
ACCEPTS: dict[str, frozenset[str]] = {
    detector: frozenset({kind for kind, d in DETECTOR_OF.items() if d == detector}) for detector in DETECTORS}
ACCEPTS["weights"] = frozenset(FAULT_KINDS) - {"replica_silence"}
CLEAN_POOLS: tuple[str, ...] = ("clean-a", "clean-b")
REPLICAS = 4  # per pool
START_TS = 1_700_000_000.0
RUN_S = 360.0  # event time with arrivals
WARMUP_S = 60.0  # one window: not scored
FAULT_AT_S, FAULT_FOR_S = 120.0, 150.0
GRACE_S = 90.0  # after a fault's end, an alert still belongs to it
SCORED_UNTIL_S = RUN_S - 30.0  # every pool's corrections reach at least this step before a run is read
WEIGHT_DROP = 0.8  # `weights` signal: below 80 % of an equal share of the pool
LOADS: dict[str, tuple[float, float]] = {
    "fleet": (0.5, 0.8),  # share of the fleet's estimated capacity
    "generator": (4.0, 8.0),  # requests/s per replica
}
SEEDS = (1, 2, 3)


# ----------------------------------------------------------------------------- scoring (pure)


@dataclass(frozen=True, slots=True)
class Label:
    """One injected fault: ``[start, end)`` in event-time epoch seconds."""

    model: str
    replica: str
    kind: str
    start: float
    end: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Label:
        return cls(str(data["model"]), str(data["replica"]), str(data["kind"]), float(data["start"]),
                   float(data["end"]))


@dataclass(frozen=True, slots=True)
class Episode:
    """One alert: ``detector`` (``rule`` for multi-rule detectors) opened on a replica at ``start``."""

    model: str
    replica: str
    detector: str
    rule: str
    start: float
    carried: bool = False  # already open when scoring began: counted at that moment


def alert_episodes(alerts: Iterable[Mapping[str, Any]], scored_from: float, scored_to: float) -> list[Episode]:
    """Episodes of ``llm.alerts`` records (in the order they were published) that count.

    An episode opens with ``open`` and ends with ``resolved``; an ``open`` while open continues
    it. Episodes that ended before ``scored_from`` are dropped, those still open then are
    counted at ``scored_from`` (``carried``); those starting after ``scored_to`` are dropped.
    Model-level alerts (replica None) are not scored.

    >>> recs = [{"ts": 10.0, "model": "m", "replica": "r0", "detector": "d", "state": "open", "evidence": {}},
    ...         {"ts": 70.0, "model": "m", "replica": "r0", "detector": "d", "state": "open", "evidence": {}},
    ...         {"ts": 90.0, "model": "m", "replica": "r0", "detector": "d", "state": "resolved", "evidence": {}}]
    >>> alert_episodes(recs, scored_from=60.0, scored_to=200.0)
    [Episode(model='m', replica='r0', detector='d', rule='', start=60.0, carried=True)]
    """
    open_since: dict[tuple[str, str, str, str], float] = {}
    spans: list[tuple[tuple[str, str, str, str], float, float]] = []  # key, start, end
    for rec in alerts:
        if rec.get("replica") is None:
            continue
        rule = str((rec.get("evidence") or {}).get("rule") or "")
        key = (str(rec["model"]), str(rec["replica"]), str(rec["detector"]), rule)
        ts = float(rec["ts"])
        if rec["state"] == "open":
            open_since.setdefault(key, ts)
        elif key in open_since:
            spans.append((key, open_since.pop(key), ts))
    spans.extend((key, start, float("inf")) for key, start in open_since.items())
    out = []
    for (model, replica, detector, rule), start, end in spans:
        if end <= scored_from or start > scored_to:
            continue
        carried = start < scored_from
        out.append(Episode(model, replica, detector, rule, scored_from if carried else start, carried))
    return sorted(out, key=lambda e: (e.start, e.model, e.replica, e.detector, e.rule))


def weight_episodes(corrections: Iterable[Mapping[str, Any]], scored_from: float, scored_to: float,
                    drop: float = WEIGHT_DROP, clear: int = 2) -> list[Episode]:
    """``stale`` and ``weights`` episodes from ``llm.routing-corrections`` records.

    Per correction and replica: ``stale`` holds when the weight is 0 and no drain/isolate action
    names the replica; ``weights`` when 0 < weight < ``drop`` / pool size. An episode opens on
    the first record that holds and resolves after ``clear`` consecutive records that do not.

    >>> recs = [{"model": "m", "ts": t, "weights": {"a": wa, "b": 1 - wa}, "actions": []}
    ...         for t, wa in [(60.0, 0.5), (65.0, 0.3), (70.0, 0.5), (75.0, 0.3), (80.0, 0.5), (85.0, 0.5),
    ...                       (90.0, 0.0)]]
    >>> [(e.replica, e.detector, e.start) for e in weight_episodes(recs, 60.0, 100.0)]
    [('a', 'weights', 65.0), ('a', 'stale', 90.0)]
    """
    state: dict[tuple[str, str, str], tuple[float, int] | None] = {}  # key -> (start, misses) while open
    out: list[Episode] = []
    for rec in sorted(corrections, key=lambda r: (str(r["model"]), float(r["ts"]))):
        ts = float(rec["ts"])
        if ts < scored_from or ts > scored_to:
            continue
        model = str(rec["model"])
        weights = {str(k): float(v) for k, v in dict(rec.get("weights") or {}).items()}
        blocked = {str(a.get("replica")) for a in rec.get("actions") or []
                   if a.get("action") in ("drain", "isolate")}
        share = 1.0 / len(weights) if weights else 0.0
        for replica, w in weights.items():
            holds = {"stale": w <= 0.0 and replica not in blocked, "weights": 0.0 < w < drop * share}
            for detector, now in holds.items():
                key = (model, replica, detector)
                current = state.get(key)
                if now:
                    if current is None:
                        out.append(Episode(model, replica, detector, "", ts))
                    state[key] = (current[0] if current else ts, 0)
                elif current is not None:
                    misses = current[1] + 1
                    state[key] = None if misses >= clear else (current[0], misses)
    return sorted(out, key=lambda e: (e.start, e.model, e.replica, e.detector))


def match(episode: Episode, labels: Sequence[Label], grace_s: float = GRACE_S) -> Label | None:
    """The label this alert is right about (same model and replica, a kind its detector accepts, in
    time), preferring a label of the detector's own kind."""
    accepted = ACCEPTS.get(episode.detector, frozenset())
    hits = [label for label in labels
            if label.model == episode.model and label.replica == episode.replica and label.kind in accepted
            and label.start <= episode.start <= label.end + grace_s]
    hits.sort(key=lambda label: DETECTOR_OF.get(label.kind) != episode.detector)
    return hits[0] if hits else None


def context(episode: Episode, labels: Sequence[Label], grace_s: float = GRACE_S) -> str:
    """What was going on where the alert fired: a fault kind on that replica, or ``clean``."""
    for label in labels:
        if (label.model == episode.model and label.replica == episode.replica
                and label.start <= episode.start <= label.end + grace_s):
            return label.kind
    return "clean"


def score(episodes: Sequence[Episode], labels: Sequence[Label], clean_models: Sequence[str],
          clean_hours: float, grace_s: float = GRACE_S) -> dict[str, dict[str, Any]]:
    """Per detector: labels, detected, recall, alerts, true, precision, delays, clean false alerts.

    ``clean_models``: pools without any fault; ``clean_hours``: their simulated hours (summed
    over pools), the denominator of ``false_per_hour``.

    >>> labels = [Label("m", "r1", "gpu_fault", 100.0, 200.0)]
    >>> eps = [Episode("m", "r1", "gpu_health", "", 105.0), Episode("c", "r0", "gpu_health", "", 50.0)]
    >>> s = score(eps, labels, clean_models=["c"], clean_hours=0.5)["gpu_health"]
    >>> s["recall"], s["precision"], s["clean_false"], s["false_per_hour"]
    (1.0, 0.5, 1, 2.0)
    """
    out: dict[str, dict[str, Any]] = {}
    for detector in DETECTORS:
        mine = [e for e in episodes if e.detector == detector]
        targets = [lb for lb in labels if DETECTOR_OF.get(lb.kind) == detector]
        first: dict[Label, float] = {}
        true = 0
        for e in mine:
            lb = match(e, labels, grace_s)
            if lb is not None:
                true += 1
                if DETECTOR_OF.get(lb.kind) == detector:  # recall and delay: on its own kind only
                    first[lb] = min(first.get(lb, e.start), e.start)
        delays = sorted(round(first[lb] - lb.start, 3) for lb in targets if lb in first)
        clean_false = sum(1 for e in mine if e.model in clean_models)
        out[detector] = {
            "labels": len(targets),
            "detected": len(delays),
            "recall": len(delays) / len(targets) if targets else None,
            "alerts": len(mine),
            "true": true,
            "precision": true / len(mine) if mine else None,
            "delays_s": delays,
            "delay_median_s": statistics.median(delays) if delays else None,
            "delay_p95_s": quantile(delays, 0.95),
            "clean_false": clean_false,
            "false_per_hour": clean_false / clean_hours if clean_hours > 0 else None,
        }
    return out


def confusion(episodes: Sequence[Episode], labels: Sequence[Label],
              grace_s: float = GRACE_S) -> dict[str, dict[str, int]]:
    """Alerts per detector and per context (the fault on that replica then, or ``clean``).

    >>> confusion([Episode("m", "r1", "long_tail", "", 150.0)], [Label("m", "r1", "batch_collapse", 100.0, 200.0)])
    {'long_tail': {'batch_collapse': 1}}
    """
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in episodes:
        table[e.detector][context(e, labels, grace_s)] += 1
    return {d: dict(row) for d, row in table.items()}


def judge(summary: Mapping[str, Any], persistence: float) -> dict[str, bool | None]:
    """Which of the quality targets a detector's summary meets (None: nothing to judge).

    >>> judge({"recall": 1.0, "precision": 0.9, "delay_median_s": 12.0, "false_per_hour": 0.0}, persistence=5.0)
    {'recall': True, 'precision': False, 'delay': True, 'false_per_hour': True}
    """
    def at_least(value: float | None, target: float) -> bool | None:
        return None if value is None else value >= target

    def at_most(value: float | None, target: float) -> bool | None:
        return None if value is None else value <= target

    return {"recall": at_least(summary.get("recall"), 0.95),
            "precision": at_least(summary.get("precision"), 0.95),
            "delay": at_most(summary.get("delay_median_s"), persistence + 10.0),
            "false_per_hour": at_most(summary.get("false_per_hour"), 1.0)}


# ----------------------------------------------------------------------------- scenarios


@dataclass(frozen=True, slots=True)
class RunSpec:
    source: str  # fleet | generator
    load: float
    seed: int
    profile: str

    @property
    def name(self) -> str:
        return f"{self.profile}/{self.source}/load={self.load:g}/seed={self.seed}"


def pools() -> list[str]:
    """Model names of a run: one pool per fault kind, then the clean ones."""
    return [*FAULT_KINDS, *CLEAN_POOLS]


def run_traffic(spec: RunSpec, start_ts: float = START_TS) -> tuple[Iterator[Any], list[Label]]:
    """The run's traffic chunks (lazy) and its labels."""
    from skewwatch.sim.faults import Injection

    models = pools()
    injections = []
    for m, kind in enumerate(FAULT_KINDS):
        replica = f"r{m * REPLICAS + spec.seed % REPLICAS}"
        injections.append(Injection(kind, replica, FAULT_AT_S, FAULT_FOR_S))
    model_of = {f"r{m * REPLICAS + i}": model for m, model in enumerate(models) for i in range(REPLICAS)}
    labels = [Label.from_dict(inj.label(start_ts, model_of[inj.replica])) for inj in injections]
    chunks: Iterator[Any]
    if spec.source == "fleet":
        from skewwatch.sim.fleet import FleetConfig, FleetSimulator

        config = FleetConfig(models=tuple(models), replicas=REPLICAS, policy="round_robin", load=spec.load,
                             seed=spec.seed, injections=tuple(injections))
        chunks = FleetSimulator(config, start_ts, RUN_S).chunks()
    elif spec.source == "generator":
        from skewwatch.sim.generator import GeneratorConfig, generate_chunks

        gen = GeneratorConfig(models=tuple(models), replicas=REPLICAS, rate=spec.load, seed=spec.seed,
                              injections=tuple(injections))
        chunks = iter(generate_chunks(gen, start_ts, RUN_S))
    else:
        raise ValueError(f"unknown source {spec.source!r}")
    return chunks, labels


def run_once(spec: RunSpec, bootstrap: str, workdir: Path) -> dict[str, Any]:
    """One run through the real worker: produce, read alerts and corrections back, keep them raw."""
    import orjson

    from skewwatch.sim.emit import produce_traffic

    settings = fresh_settings(bootstrap)
    topics = settings.topics
    chunks, labels = run_traffic(spec)
    began = time.monotonic()
    rundir = workdir / spec.name.replace("/", "_").replace("=", "")
    worker = Worker(settings, rundir, spec.profile, extra_env=EVERY_STEP_ENV)
    try:
        worker.start()
        stats = asyncio.run(produce_traffic(bootstrap, chunks, requests_topic=topics.requests,
                                            telemetry_topic=topics.gpu_telemetry, batch=50))
        produced_s = time.monotonic() - began
        wanted = START_TS + SCORED_UNTIL_S
        models = set(pools())
        settled: list[float] = []

        def done(records: list[Any]) -> bool:
            reached = {m for m in models if any(
                r.topic == topics.routing_corrections and r.key == m.encode()
                and orjson.loads(r.value)["ts"] >= wanted for r in records)}
            if reached != models:
                return False
            settled.append(time.monotonic())
            return time.monotonic() - settled[0] >= 2.0  # alerts of the same steps: give them 2 s

        records = read_topics(bootstrap, [topics.alerts, topics.routing_corrections], done, timeout_s=300)
        if not settled:
            raise RuntimeError(f"{spec.name}: corrections never reached step {SCORED_UNTIL_S:.0f} s\n"
                               f"{worker.log_tail()}")
    finally:
        worker.stop()
        delete_run_topics(bootstrap, settings)
    alerts = [orjson.loads(r.value) for r in records if r.topic == topics.alerts]
    corrections = [orjson.loads(r.value) for r in records if r.topic == topics.routing_corrections]
    return {"spec": asdict(spec), "events": stats.events, "produce_s": round(produced_s, 1),
            "wall_s": round(time.monotonic() - began, 1), "labels": [asdict(lb) for lb in labels],
            "alerts": alerts, "corrections": corrections}


def episodes_of(run: Mapping[str, Any]) -> list[Episode]:
    scored_from, scored_to = START_TS + WARMUP_S, START_TS + SCORED_UNTIL_S
    return (alert_episodes(run["alerts"], scored_from, scored_to)
            + weight_episodes(run["corrections"], scored_from, scored_to))


def summarize(runs: Sequence[Mapping[str, Any]], profile: str) -> dict[str, Any]:
    """Score a group of runs (one profile and source) and judge each detector against the targets."""
    # Runs share model names: tell them apart so a label only matches alerts of its own run.
    episodes: list[Episode] = []
    labels: list[Label] = []
    for i, run in enumerate(runs):
        episodes += [Episode(f"{i}:{e.model}", e.replica, e.detector, e.rule, e.start, e.carried)
                     for e in episodes_of(run)]
        labels += [Label(f"{i}:{lb['model']}", lb["replica"], lb["kind"], lb["start"], lb["end"])
                   for lb in run["labels"]]
    clean_models = [f"{i}:{m}" for i in range(len(runs)) for m in CLEAN_POOLS]
    clean_hours = len(clean_models) * (SCORED_UNTIL_S - WARMUP_S) / 3600.0
    per = score(episodes, labels, clean_models, clean_hours)
    settings = detector_settings(profile)
    for detector, summary in per.items():
        summary["persistence_s"] = persistence_s(settings, detector)
        summary["targets_met"] = judge(summary, summary["persistence_s"])
    false_total = sum(s["clean_false"] for s in per.values())
    return {"runs": len(runs), "clean_pool_hours": round(clean_hours, 3),
            "clean_false_total": false_total, "clean_false_per_hour": false_total / clean_hours,
            "detectors": per, "confusion": confusion(episodes, labels),
            "carried_alerts": sum(e.carried for e in episodes)}


# ----------------------------------------------------------------------------- report


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(summary: Mapping[str, Any]) -> str:
    """One profile/source group as a Markdown table (✗ marks a missed target)."""
    head = ("| detector | faults | recall | alerts | precision | delay median (s) | delay P95 (s) | "
            "target delay (s) | false alerts / h (clean) |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for detector, s in summary["detectors"].items():
        def mark(key: str, met: Mapping[str, bool | None] = s["targets_met"]) -> str:
            return " ✗" if met[key] is False else ""

        lines.append(
            f"| {detector} | {s['labels']} | {_fmt(s['recall'])}{mark('recall')} | {s['alerts']} | "
            f"{_fmt(s['precision'])}{mark('precision')} | {_fmt(s['delay_median_s'], 0)}{mark('delay')} | "
            f"{_fmt(s['delay_p95_s'], 0)} | ≤ {s['persistence_s'] + 10:.0f} | "
            f"{_fmt(s['false_per_hour'], 1)}{mark('false_per_hour')} |")
    lines.append(f"| **all** | | | | | | | | {summary['clean_false_per_hour']:.1f}"
                 f"{' ✗' if summary['clean_false_per_hour'] > 1 else ''} |")
    return "\n".join(lines)


def side_by_side(groups: Mapping[str, Mapping[str, Any]], source: str) -> str:
    """The seed's defaults and the tuned profile on one source, one row per detector (README table)."""
    profiles = [p for p in ("seed", "tuned") if f"{p}/{source}" in groups]
    head = "| detector | target delay (s) | " + " | ".join(
        f"{p}: recall | precision | delay median / P95 (s) | false alerts/h" for p in profiles) + " |"
    lines = [head, "|---|---:|" + "---:|---:|---:|---:|" * len(profiles)]

    def cells(s: Mapping[str, Any]) -> str:
        met = s["targets_met"]

        def mark(key: str) -> str:
            return " ✗" if met[key] is False else ""

        delay = f"{_fmt(s['delay_median_s'], 0)} / {_fmt(s['delay_p95_s'], 0)}"
        return (f"{_fmt(s['recall'])}{mark('recall')} | {_fmt(s['precision'])}{mark('precision')} | "
                f"{delay}{mark('delay')} | {_fmt(s['false_per_hour'], 1)}{mark('false_per_hour')}")

    for detector in DETECTORS:
        per = [groups[f"{p}/{source}"]["detectors"][detector] for p in profiles]
        target = " / ".join(sorted({f"≤ {s['persistence_s'] + 10:.0f}" for s in per}))
        lines.append(f"| {detector} | {target} | " + " | ".join(cells(s) for s in per) + " |")
    totals = ["**all detectors**", ""]
    for p in profiles:
        rate = groups[f"{p}/{source}"]["clean_false_per_hour"]
        totals += ["", "", "", f"{rate:.1f}{' ✗' if rate > 1 else ''}"]
    lines.append("| " + " | ".join(totals) + " |")
    return "\n".join(lines)


def confusion_table(summary: Mapping[str, Any]) -> str:
    kinds = [*FAULT_KINDS, "clean"]
    lines = ["| alerts of \\ where | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
    for detector in DETECTORS:
        row = summary["confusion"].get(detector, {})
        lines.append(f"| {detector} | " + " | ".join(str(row.get(k, 0)) for k in kinds) + " |")
    return "\n".join(lines)


def plot(groups: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Detection delay per detector (one panel per profile/source group), target marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(groups)
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
                jitter = [i + 0.12 * ((k % 5) - 2) / 2 for k in range(len(delays))]
                ax.scatter(jitter, delays, s=10, alpha=0.6)
            ax.hlines(s["persistence_s"] + 10, i - 0.35, i + 0.35, colors="red", linestyles="dashed")
            ax.text(i, -8, f"{s['detected']}/{s['labels']}", ha="center", fontsize=8)
        ax.set_xticks(range(len(DETECTORS)), DETECTORS, rotation=35, ha="right", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_ylim(bottom=-12)
        ax.grid(axis="y", alpha=0.3)
    for row in axes:
        row[0].set_ylabel("delay from fault start (s)")
    fig.suptitle("Detection delay per detector, event time (red: target = persistence + 10 s; "
                 "under each box: detected / faults)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed and one load per source (smoke run)")
    parser.add_argument("--profile", action="append", choices=["seed", "tuned"],
                        help="detector profile(s) (default: both)")
    parser.add_argument("--source", action="append", choices=list(LOADS), help="traffic source(s) (default: both)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--out", type=Path, default=RESULTS / "quality.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "quality_delays.png")
    args = parser.parse_args(argv)
    profiles = args.profile or ["seed", "tuned"]
    sources = args.source or list(LOADS)
    seeds = args.seeds[:1] if args.quick else args.seeds
    specs = [RunSpec(source, load, seed, profile) for profile in profiles for source in sources
             for load in (LOADS[source][-1:] if args.quick else LOADS[source]) for seed in seeds]
    workdir = Path(tempfile.mkdtemp(prefix="skewwatch-quality-"))
    runs: list[dict[str, Any]] = []
    failures: list[str] = []
    began = time.monotonic()
    with kafka(workdir) as bootstrap:
        for i, spec in enumerate(specs, 1):
            try:
                run = run_once(spec, bootstrap, workdir)
            except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
                failures.append(f"{spec.name}: {exc}")
                print(f"[{i}/{len(specs)}] {spec.name}: FAILED {str(exc)[:2000]}", file=sys.stderr)
                continue
            runs.append(run)
            print(f"[{i}/{len(specs)}] {spec.name}: {run['events']} events, {len(run['alerts'])} alert records, "
                  f"{run['wall_s']} s", file=sys.stderr)
    groups: dict[str, dict[str, Any]] = {}
    for profile in profiles:
        for source in sources:
            mine = [r for r in runs if r["spec"]["profile"] == profile and r["spec"]["source"] == source]
            if mine:
                groups[f"{profile}/{source}"] = summarize(mine, profile)
    for name, summary in groups.items():
        print(f"\n## {name}  ({summary['runs']} runs, {summary['clean_pool_hours']:.2f} clean pool-hours)\n")
        print(table(summary))
        print("\nalerts by where they fired:\n")
        print(confusion_table(summary))
    for source in sources:
        if any(name.endswith(f"/{source}") for name in groups):
            print(f"\n## {source}: profiles side by side\n")
            print(side_by_side(groups, source))
    out = {
        "machine": machine(),
        "wall_s": round(time.monotonic() - began, 1),
        "setup": {"replicas_per_pool": REPLICAS, "pools_per_run": pools(), "run_s": RUN_S, "warmup_s": WARMUP_S,
                  "fault_at_s": FAULT_AT_S, "fault_for_s": FAULT_FOR_S, "grace_s": GRACE_S,
                  "scored_until_s": SCORED_UNTIL_S, "weight_drop": WEIGHT_DROP, "loads": LOADS, "seeds": seeds,
                  "router": "round_robin", "detector_of": DETECTOR_OF, "quick": args.quick},
        "groups": groups,
        "failures": failures,
        "runs": [{k: v for k, v in r.items() if k not in ("alerts", "corrections")}
                 | {"episodes": [asdict(e) for e in episodes_of(r)]} for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    if groups:
        plot(groups, args.plot)
    if not failures:  # broker data and worker logs: kept only when something went wrong
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nwrote {args.out} and {args.plot} in {out['wall_s']:.0f} s", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
