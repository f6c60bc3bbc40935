"""Failures and scale-out, measured: what is lost, what is counted twice, how long recovery takes.

Each scenario runs ``skewwatch worker`` processes in one consumer group on fresh topics of 12
partitions, against an embedded broker this script starts (the outage scenario stops and restarts it
on the same data directory, so ``KAFKA_BOOTSTRAP`` is not used). Live traffic comes from the
generator (24 replicas over 2 models unless said), with a ledger of every event the broker
acknowledged (tests/integration/live_traffic.py); every per-replica and per-model 60 s count
published is compared with it (tests/integration/output_check.py):

* ``kill``: 3 workers; one is SIGKILLed mid-stream, a replacement joins 15 s later.
* ``rolling``: 3 workers; each in turn gets SIGTERM and a replacement, one after the other.
* ``outage``: 2 workers; the broker is stopped for ``--outage-s`` and started on the same data
  directory. The traffic producer holds its events meanwhile (an inference server's client buffers);
  the workers keep running.
* ``burst``: 3 workers; ``--burst-s`` of event time at 10x the live rate arrives at once.
* ``soak``: 2 workers at a steady rate for ``--soak-s``; the slopes of each worker's RSS and of the
  mean step time, after a warm-up, and the late events counted.
* ``restore``: one worker on one partition holding ``--restore-replicas`` replicas' windows is stopped
  (its last checkpoint written) and a new one started: from its launch to ready (partitions assigned,
  state restored), and from then to the first per-model output of a new step.
* ``horizontal``: the same backlog drained by 1, 2 and 3 workers, side by side: events/s from the
  moment every worker is ready (the group has settled: joining and its rebalances are not counted;
  the whole drain is reported beside it) to the last event read, and each process's CPU seconds in
  that time (the broker's too).

Columns: events produced (acknowledged by the broker), counted (in the per-replica steps published),
lost and duplicated in windows (step counts below / above the ledger), recovery (the longest
wall-clock pause of the per-model outputs from the fault on; for the outage, from the broker answering
again to the first per-model output; for the burst, the time to drain it), peak RSS of any worker.

    .venv/bin/python bench/chaos.py                      # every scenario, ~15 min on 2 cores
    .venv/bin/python bench/chaos.py --only soak --soak-s 1800   # 30 min soak

Prints a table and writes ``bench/results/chaos.json`` (a run with ``--only`` replaces those
scenarios' results in it and keeps the others').
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput.common import machine_info  # noqa: E402
from skewwatch.broker import EmbeddedBroker  # noqa: E402
from skewwatch.config import Settings  # noqa: E402
from skewwatch.schemas.features import decode_features  # noqa: E402
from skewwatch.sim.faults import Injection  # noqa: E402
from skewwatch.sim.generator import GeneratorConfig  # noqa: E402
from skewwatch.topics import delete_topics, ensure_topics  # noqa: E402
from tests.conftest import topic_names, unique_settings  # noqa: E402
from tests.integration.live_traffic import LiveTraffic  # noqa: E402
from tests.integration.output_check import (  # noqa: E402
    check_alerts,
    check_corrections,
    check_windows,
    longest_pause,
    split_outputs,
)
from tests.integration.worker_group import ResourceSampler, WorkerGroup, cpu_seconds  # noqa: E402
from tests.integration.worker_proc import consume_until  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
T0 = 1_700_000_000.0  # a multiple of the 5 s step
PARTITIONS = 12
MODELS = ("llama", "qwen")
REPLICAS_PER_MODEL = 12
SPEED = 3.0  # event seconds per wall second
HEARTBEAT_S = 30.0  # [detectors.corrections] heartbeat_s, the default
LATENESS_S = 5.0
# a killed worker's partitions move to the others once `[kafka] session_timeout_ms` (10 s) has passed
MIB = 2**20


@dataclass
class Run:
    """One scenario's broker, topics, workers, traffic and resource sampler."""

    broker: EmbeddedBroker
    settings: Settings
    workers: WorkerGroup
    traffic: LiveTraffic
    sampler: ResourceSampler
    replicas_per_model: dict[str, int]

    def closed_until(self) -> float:
        """The newest window end every partition has surely closed by now."""
        return (self.traffic.event_time - LATENESS_S) // 5.0 * 5.0 - 5.0


@contextmanager
def scenario(broker: EmbeddedBroker, workdir: Path, name: str, *, workers: int, partitions: int = PARTITIONS,
             models: tuple[str, ...] = MODELS, replicas: int = REPLICAS_PER_MODEL, rate: float = 4.0,
             speed: float = SPEED, start_workers: bool = True, telemetry: bool = True) -> Iterator[Run]:
    """Fresh topics, a paused-or-live traffic source and ``workers`` workers (started unless told)."""
    bootstrap = broker.bootstrap
    settings = unique_settings(bootstrap, partitions=partitions)
    asyncio.run(ensure_topics(bootstrap, settings))
    config = GeneratorConfig(models=models, replicas=replicas, rate=rate, seed=16, telemetry=telemetry,
                             injections=(Injection("context_burst", "r5", at_s=40.0, for_s=240.0),))
    group = WorkerGroup(settings, workdir / name, size=workers)
    (workdir / name).mkdir(parents=True, exist_ok=True)
    traffic = LiveTraffic(bootstrap, settings.topics.requests, settings.topics.gpu_telemetry, config, T0,
                          speed=speed)
    sampler = ResourceSampler(group.pids)
    try:
        if start_workers:
            group.start()
        else:
            traffic.pause()
        traffic.start()
        sampler.start()
        yield Run(broker, settings, group, traffic, sampler, dict.fromkeys(models, replicas))
    finally:
        sampler.stop()
        try:
            traffic.stop()
        finally:
            group.stop()
            try:
                asyncio.run(delete_topics(bootstrap, topic_names(settings)))
            except Exception as exc:  # noqa: BLE001 - tidying the broker is not the measurement
                print(f"  (could not delete the topics: {exc})", file=sys.stderr)


def read_outputs(run: Run, until: float, timeout: float = 180.0) -> dict[str, list[Any]]:
    """Every output record so far, once every replica and model has a feature vector for ``until``."""
    topics = run.settings.topics
    want = {f"{m}/{r}" for r, m in run.traffic.models.items()} | set(run.replicas_per_model)
    have: set[str] = set()
    looked = [0]

    def done(records: list[Any]) -> bool:
        for r in records[looked[0]:]:
            if r.topic == topics.features and decode_features(r.value).window_end >= until:
                have.add(r.key.decode())
        looked[0] = len(records)
        return have >= want

    records = asyncio.run(consume_until(run.broker.bootstrap, [topics.features, topics.alerts,
                                                               topics.routing_corrections], done, timeout))
    if not have >= want:
        raise RuntimeError(f"no feature vector for {until} from {sorted(want - have)[:5]} after {timeout:.0f} s\n"
                           + run.workers.log_tails(10))
    return split_outputs(records, topics.features, topics.alerts)


def ledger_row(run: Run, name: str, until: float, *, since_wall: float, fault_start: float,
               recovery_s: float | None = None, **extra: Any) -> dict[str, Any]:
    """The scenario's row: the outputs up to ``until`` against the ledger, peak RSS from ``fault_start``."""
    outputs = read_outputs(run, until)
    windows = check_windows(outputs["features"], run.traffic.ledger, run.replicas_per_model, until=until)
    corrections = check_corrections(outputs["corrections"], HEARTBEAT_S)
    alerts = check_alerts(outputs["alerts"])
    pause, where = longest_pause(outputs["features"], since_ms=int(since_wall * 1000))
    row = {
        "scenario": name,
        "produced": windows.produced,
        "counted": windows.counted,
        "lost": windows.lost,
        "duplicated": windows.duplicated,
        "windows": windows.windows,
        "problems": windows.problems(),
        "replayed_windows": windows.replayed,
        "seq_regressions": len(corrections.regressions),
        "alert_reopens": len(alerts.reopens),
        "alerts_republished": alerts.republished,
        "longest_pause_s": round(pause, 1),
        "pause_before": where,
        "recovery_s": round(pause if recovery_s is None else recovery_s, 1),
        "peak_rss_mib": round(run.sampler.peak_between(fault_start, time.monotonic()) / MIB, 1),
        **extra,
    }
    print(f"  {name}: {row['produced']} produced, lost {row['lost']}, duplicated {row['duplicated']}, "
          f"recovery {row['recovery_s']} s, peak RSS {row['peak_rss_mib']} MiB", flush=True)
    return row


def run_kill(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with scenario(broker, workdir, "kill", workers=3) as run:
        run.traffic.wait_event_time(T0 + 75, timeout=120)
        since, fault = time.time(), time.monotonic()
        run.workers.kill(0)
        run.traffic.wait_event_time(run.traffic.event_time + 15 * SPEED, timeout=120)
        run.workers.replace(0)
        run.traffic.wait_event_time(run.traffic.event_time + 10 * SPEED, timeout=120)
        return ledger_row(run, "kill + replacement", run.closed_until(), since_wall=since, fault_start=fault)


def run_rolling(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with scenario(broker, workdir, "rolling", workers=3) as run:
        run.traffic.wait_event_time(T0 + 75, timeout=120)
        since, fault = time.time(), time.monotonic()
        for index in range(len(run.workers.workers)):
            run.workers.terminate(index)
            run.workers.replace(index)
        run.traffic.wait_event_time(run.traffic.event_time + 10 * SPEED, timeout=120)
        return ledger_row(run, "rolling restart", run.closed_until(), since_wall=since, fault_start=fault)


def run_outage(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with scenario(broker, workdir, "outage", workers=2) as run:
        run.traffic.wait_event_time(T0 + 75, timeout=120)
        run.traffic.pause()
        since, fault = time.time(), time.monotonic()
        broker.stop()
        time.sleep(args.outage_s)
        alive = len(run.workers.pids())
        rss_during = run.sampler.peak_between(fault, time.monotonic())
        broker.start(timeout=180)
        back = time.time()
        restart_s = time.monotonic() - fault - args.outage_s
        run.traffic.resume()
        run.traffic.wait_event_time(run.traffic.event_time + 20 * SPEED, timeout=180)
        until = run.closed_until()
        outputs = read_outputs(run, until)
        after = [fv["timestamp"] / 1000.0 for fv in outputs["features"]
                 if fv["key"] in run.replicas_per_model and fv["timestamp"] / 1000.0 >= back]
        return ledger_row(run, f"broker outage {args.outage_s:.0f} s", until, since_wall=since,
                          fault_start=fault, recovery_s=min(after) - back if after else float("nan"),
                          workers_alive_during=alive, broker_restart_s=round(restart_s, 1),
                          peak_rss_during_outage_mib=round(rss_during / MIB, 1))


def run_burst(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with scenario(broker, workdir, "burst", workers=3) as run:
        run.traffic.wait_event_time(T0 + 30, timeout=120)
        before = run.workers.metrics()
        since, fault = time.time(), time.monotonic()
        events, _, send_s = run.traffic.burst(duration_s=args.burst_s, factor=10.0)
        until = run.closed_until()
        read_outputs(run, until)
        drained = time.monotonic() - fault
        after = run.workers.metrics()
        counted_in = after.get("skewwatch_events_in_total", 0.0) - before.get("skewwatch_events_in_total", 0.0)
        return ledger_row(run, f"burst {args.burst_s:.0f} s x10", until, since_wall=since, fault_start=fault,
                          recovery_s=drained, burst_events=events, burst_send_s=round(send_s, 1),
                          drain_events_per_s=round(counted_in / drained, 0),
                          telemetry_held=after.get("skewwatch_telemetry_held", 0.0))


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (monotonic seconds, value) points, per minute."""
    if len(points) < 3:
        return float("nan")
    t, v = np.array(points).T
    return float(np.polyfit(t, v, 1)[0] * 60.0)


def run_soak(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    with scenario(broker, workdir, "soak", workers=2, speed=1.0) as run:
        warm_until = time.monotonic() + min(60.0, args.soak_s / 3)
        end = warm_until + args.soak_s
        steps: list[tuple[float, float]] = []
        last = None
        while time.monotonic() < end:
            time.sleep(10.0)
            m = run.workers.metrics()
            total = (m.get("skewwatch_step_duration_seconds_sum", 0.0),
                     m.get("skewwatch_step_duration_seconds_count", 0.0))
            if last is not None and time.monotonic() > warm_until and total[1] > last[1]:
                steps.append((time.monotonic(), (total[0] - last[0]) / (total[1] - last[1]) * 1000.0))
            last = total
        rss_slopes = {}
        for name in {n for _, n, _ in run.sampler.samples}:
            points = [(t, rss / MIB) for t, n, rss in run.sampler.samples if n == name and t >= warm_until]
            rss_slopes[name] = round(slope_per_min(points), 3)
        late = run.workers.metrics().get("skewwatch_late_events_total", 0.0)
        mean_step = float(np.mean([v for _, v in steps])) if steps else float("nan")
        return ledger_row(run, f"soak {args.soak_s / 60:.0f} min, 2 workers", run.closed_until(),
                          since_wall=time.time() - args.soak_s, fault_start=warm_until,
                          recovery_s=0.0, rss_slope_mib_per_min=rss_slopes,
                          step_ms_mean=round(mean_step, 2), step_ms_slope_per_min=round(slope_per_min(steps), 4),
                          late_events=late)


def run_restore(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    replicas = args.restore_replicas
    with scenario(broker, workdir, "restore", workers=1, partitions=1, models=("m",), replicas=replicas,
                  rate=0.05, start_workers=False, telemetry=False) as run:
        run.traffic.burst(duration_s=70.0, factor=1.0)
        run.workers.start(timeout=300)
        consume_first_model_vector(run, run.closed_until())  # the state is built (idle replicas publish nothing)
        run.workers.terminate(0)  # a clean stop: the partition's last checkpoint is written
        launched = time.monotonic()
        run.workers.replace(0, timeout=300)
        ready = time.monotonic()
        run.traffic.burst(duration_s=10.0, factor=1.0)
        want = run.closed_until()
        first = consume_first_model_vector(run, want)
        return {"scenario": f"restore {replicas} replicas", "replicas": replicas,
                "launch_to_ready_s": round(ready - launched, 1), "ready_to_first_output_s": round(first - ready, 1),
                "recovery_s": round(first - launched, 1),
                "peak_rss_mib": round(run.sampler.peak_between(launched, time.monotonic()) / MIB, 1)}


def consume_first_model_vector(run: Run, until: float) -> float:
    """Monotonic time at which the per-model vector for ``until`` was seen on the features topic."""
    topics = run.settings.topics
    seen: list[float] = []

    def done(records: list[Any]) -> bool:
        if not seen and any(r.key.decode() in run.replicas_per_model and decode_features(r.value).window_end >= until
                            for r in records if r.topic == topics.features):
            seen.append(time.monotonic())
        return bool(seen)

    asyncio.run(consume_until(run.broker.bootstrap, [topics.features], done, 600))
    if not seen:
        raise RuntimeError("no per-model output after the restore")
    return seen[0]


def run_horizontal(broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in (1, 2, 3):
        with scenario(broker, workdir, f"horizontal-{n}", workers=n, start_workers=False, telemetry=False) as run:
            events, _, _ = run.traffic.burst(duration_s=args.horizontal_s, factor=10.0)
            for worker in run.workers.workers:
                worker.launch()
            cpu_at: dict[str, float] = {}  # CPU seconds of each process when the group had settled
            first = joined = done_at = None
            got_at_join = 0.0
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                got = run.workers.metrics().get("skewwatch_events_in_total", 0.0)
                now = time.monotonic()
                if got > 0 and first is None:
                    first = now
                if joined is None and all(is_ready(w) for w in run.workers.workers):
                    joined, got_at_join = now, got
                    cpu_at = process_cpu(run, broker)
                if got >= events:
                    done_at = now
                    break
                time.sleep(0.1)
            if first is None or joined is None or done_at is None or done_at - joined < 2.0:
                raise RuntimeError(f"{n} workers: no measurable drain of {events} events after the group "
                                   f"settled (raise --horizontal-s)\n" + run.workers.log_tails(10))
            cpu = {name: round(v - cpu_at.get(name, 0.0), 1) for name, v in process_cpu(run, broker).items()}
            elapsed = done_at - joined
            row: dict[str, Any] = {
                "workers": n, "events": events, "events_after_join": int(events - got_at_join),
                "seconds": round(elapsed, 1), "events_per_s": round((events - got_at_join) / elapsed, 0),
                "whole_drain_s": round(done_at - first, 1), "cpu_s": cpu,
                "worker_cpu_total_s": round(sum(v for k, v in cpu.items() if k != "broker"), 1),
                "broker_cpu_s": cpu.get("broker")}
            print(f"  horizontal {n}: {row['events_after_join']} events after every worker was ready, in "
                  f"{elapsed:.1f} s = {row['events_per_s']:.0f}/s (whole drain {row['whole_drain_s']} s), "
                  f"worker CPU {row['worker_cpu_total_s']} s, broker CPU {row['broker_cpu_s']} s", flush=True)
            rows.append(row)
    base = float(rows[0]["events_per_s"])
    for row in rows:
        row["speedup"] = round(float(row["events_per_s"]) / base, 2)
    return rows


def is_ready(worker: Any) -> bool:
    """Whether the worker's ``/readyz`` answers 200 (its partitions assigned and restored)."""
    try:
        worker.get("/readyz")
    except (OSError, ValueError):
        return False
    return True


def process_cpu(run: Run, broker: EmbeddedBroker) -> dict[str, float]:
    """CPU seconds (user + system) so far of each worker and of the broker."""
    pids = {**run.workers.pids(), **({"broker": broker.pid} if broker.pid else {})}
    found = {name: cpu_seconds(pid) for name, pid in pids.items()}
    return {name: cpu for name, cpu in found.items() if cpu is not None}


SCENARIOS: dict[str, Callable[[EmbeddedBroker, Path, argparse.Namespace], Any]] = {
    "kill": run_kill, "rolling": run_rolling, "outage": run_outage, "burst": run_burst, "soak": run_soak,
    "restore": run_restore, "horizontal": run_horizontal,
}


def print_tables(rows: list[dict[str, Any]], horizontal: list[dict[str, Any]]) -> None:
    if rows:
        print(f"\n{'scenario':<28} {'produced':>9} {'counted':>9} {'lost':>5} {'dup':>5} {'recovery s':>10} "
              f"{'peak RSS MiB':>12}")
        for r in rows:
            print(f"{r['scenario']:<28} {r.get('produced', '-'):>9} {r.get('counted', '-'):>9} {r.get('lost', '-'):>5} "
                  f"{r.get('duplicated', '-'):>5} {r['recovery_s']:>10} {r['peak_rss_mib']:>12}")
    if horizontal:
        print(f"\n{'workers':>7} {'events':>8} {'seconds':>8} {'events/s':>9} {'speedup':>7} {'worker CPU s':>12} "
              f"{'broker CPU s':>12}")
        for h in horizontal:
            print(f"{h['workers']:>7} {h['events_after_join']:>8} {h['seconds']:>8} {h['events_per_s']:>9.0f} "
                  f"{h['speedup']:>7} {h['worker_cpu_total_s']:>12} {h['broker_cpu_s']!s:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run only these (repeatable)")
    parser.add_argument("--outage-s", type=float, default=60.0, help="how long the broker is down")
    parser.add_argument("--burst-s", type=float, default=120.0, help="event time of the 10x backlog")
    parser.add_argument("--soak-s", type=float, default=180.0, help="soak length after warm-up (1800: 30 min)")
    parser.add_argument("--restore-replicas", type=int, default=10_000, help="replicas in the restored partition")
    parser.add_argument("--horizontal-s", type=float, default=2400.0,
                        help="event time of the horizontal backlog (at 10x the live rate)")
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = parser.parse_args()
    chosen = args.only or list(SCENARIOS)
    rows: list[dict[str, Any]] = []
    horizontal: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="skewwatch-chaos-") as tmp:
        workdir = Path(tmp)
        broker = EmbeddedBroker(workdir / "kafka", port=0)
        broker.start(timeout=180)
        try:
            for name in chosen:
                print(f"{name} ...", flush=True)
                try:
                    result = SCENARIOS[name](broker, workdir, args)
                except Exception as exc:  # noqa: BLE001 - a failed scenario is reported, the others still run
                    failures[name] = f"{type(exc).__name__}: {exc}"[:2000]
                    print(f"  {name} FAILED: {failures[name]}", flush=True)
                    if not broker.running:
                        broker.start(timeout=180)
                    continue
                if name == "horizontal":
                    horizontal = result
                else:
                    rows.append({"key": name, **result})
        finally:
            broker.stop()
    if args.only and args.out.is_file():  # a partial run replaces its scenarios' results, keeps the others'
        before = json.loads(args.out.read_text())
        ran = {row["key"] for row in rows} | set(failures)
        rows = [row for row in before.get("scenarios", []) if row.get("key") not in ran] + rows
        order = list(SCENARIOS)
        rows.sort(key=lambda row: order.index(row["key"]) if row.get("key") in order else len(order))
        horizontal = horizontal or ([] if "horizontal" in chosen else before.get("horizontal", []))
    print_tables(rows, horizontal)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                                    "scenarios": rows, "horizontal": horizontal, "failures": failures},
                                   indent=2) + "\n")
    print(f"\nwrote {args.out}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
