"""The whole loop on real engines: llama.cpp replicas behind HAProxy, one of them faulted for real,
under HAProxy's ``roundrobin``, ``leastconn``, and ``leastconn`` with skewwatch's corrections applied.

Every run starts its own parts (``bench/real_fleet.py``): ``--replicas`` ``llama-server`` processes
(SmolLM2-135M, one CPU thread and ``--slots`` slots each, from ``scripts/engines.sh``), HAProxy in
front (health checks on ``/health``; it names the serving replica in ``X-Served-By``), the embedded
broker (or ``KAFKA_BOOTSTRAP``), one ``skewwatch worker`` (default profile), one ``skewwatch scrape
--kind llamacpp`` per replica, and, for the corrected policy, ``skewwatch apply haproxy``. The load
generator posts chat completions through HAProxy at Poisson arrivals (lengths from the bundled conv
trace, scaled to the tiny model) and publishes one request event per finished request with
``skewwatch.client``'s producer, as a gateway would. The worker and the scrapers run under every
policy (the same machine load); only the corrected policy applies what they publish.

The faults (on ``r1``, from ``--fault-at`` for ``--fault-for`` seconds):

- ``throttle``: the process stopped and continued on a duty cycle (runs ``--duty``, 50 %, of every 100 ms);
- ``hang``: stopped for good (continued at the fault's end); ``die``: killed (restarted at its end);
- ``starve``: restarted with one slot where its peers have ``--slots`` (restored at its end);
- ``none``: the clean run (every alert is a false one).

Reported per fault and policy: fleet P50 and P99 over the fault (the whole run for ``none``), the
P99 deviation across replicas (std of the replicas' P99s), the faulty replica's share of the traffic
during the fault, failed requests, the time to detect (first alert opened on ``r1``, from the fault's
start), to demote (HAProxy's weight of ``r1`` below 80 % of its peers' mean, sampled every second; the
worker's published weight below 80 % of an equal share for the other policies), to restore (HAProxy's
weight back to 80 % of its peers' mean, from the fault's end), and the alerts on the other replicas.
Targets: with corrections, fleet P99 at least 30 % below ``leastconn``'s under the throttle and no
worse on the clean run; detected and demoted within 30 s; restored within 60 s; no alert on the clean run.

    .venv/bin/python bench/real_loop.py                               # every fault x policy + the clean run
    .venv/bin/python bench/real_loop.py --fault throttle               # one fault, the three policies
    .venv/bin/python bench/real_loop.py --fault none --clean-s 600 --policy leastconn+skewwatch

Writes ``bench/results/real_loop.json`` and ``bench/results/real_loop.png`` (latency and r1's share of
the traffic over time, one row per fault).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Worker, delete_run_topics, fresh_settings, kafka, machine, read_topics  # noqa: E402
from bench.real_fleet import (  # noqa: E402
    BACKEND,
    MODEL,
    Engine,
    Fault,
    Finished,
    HAProxy,
    LoadGenerator,
    scaled_lengths,
    stop_process,
)
from skewwatch.ports import free_port  # noqa: E402
from skewwatch.schemas.alerts import decode_alert  # noqa: E402
from skewwatch.schemas.corrections import decode_correction  # noqa: E402
from skewwatch.sim.trace import load_trace  # noqa: E402
from tests.integration.worker_proc import settings_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
POLICIES = {"roundrobin": ("roundrobin", False), "leastconn": ("leastconn", False),
            "leastconn+skewwatch": ("leastconn", True)}
FAULTS = ("throttle", "hang", "die", "starve", "none")
FAULTY = "r1"
DEMOTED = 0.8  # r1's weight under 80 % of its peers' (HAProxy) or of an equal share (published)
STEP_S = 5.0
CALIBRATE_S = 30.0  # of closed-loop requests, every slot busy, before the first run


def engine_paths() -> tuple[Path, Path, Path]:
    """llama-server, the model (scripts/engines.sh) and HAProxy (scripts/haproxy.sh); exit naming the command."""
    from tests.tools import CACHE, SMOLLM2_FILE, tool_version

    server = CACHE / "tools" / f"llama-server-{tool_version('llama-server')}" / "llama-server"
    model = CACHE / "tools" / f"smollm2-{tool_version('smollm2')}" / SMOLLM2_FILE
    for path in (server, model):
        if not path.is_file():
            raise SystemExit(f"real_loop: {path} is missing: run `bash scripts/engines.sh`")
    found = subprocess.run(["bash", str(ROOT / "scripts" / "haproxy.sh")], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"real_loop: no HAProxy: {found.stderr.strip()}")
    return server, model, Path(found.stdout.strip())


@dataclass(frozen=True)
class RunConfig:
    fault: str
    policy: str
    replicas: int = 3
    slots: int = 2
    rate: float | None = None  # requests per second, the whole fleet; None: ``load`` x the measured capacity
    load: float = 0.5  # of the fleet's capacity, measured before the run (LoadGenerator.calibrate)
    warmup_s: float = 90.0  # before the fault: the worker's windows fill and its detectors warm up
    fault_for_s: float = 180.0
    after_s: float = 60.0
    clean_s: float = 600.0  # the clean run's measured span
    seed: int = 1
    duty: float = 0.5  # ``throttle``: the share of every 100 ms the process runs
    profile: str = "default"  # the worker's (bench/common.py: default, seed, tuned or NAME=PATH)
    # the bundled conv trace's lengths, scaled to what SmolLM2-135M serves from one CPU thread
    prompt_scale: float = 0.02
    output_scale: float = 0.05

    @property
    def duration_s(self) -> float:
        return self.warmup_s + self.clean_s if self.fault == "none" else self.warmup_s + self.fault_for_s + self.after_s


@contextmanager
def _process(command: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        stop_process(proc, 20.0)


def run_once(config: RunConfig, bootstrap: str, paths: tuple[Path, Path, Path], workdir: Path,
             calibrate_s: float = CALIBRATE_S) -> dict[str, Any]:
    """One fault under one policy, every part started and stopped here; the run's measurements."""
    server, model, haproxy_bin = paths
    balance, corrected = POLICIES[config.policy]
    workdir.mkdir(parents=True, exist_ok=True)
    settings = fresh_settings(bootstrap)
    env = {**os.environ, **settings_env(settings)}
    env.pop("KAFKA_BOOTSTRAP", None)
    names = [f"r{i}" for i in range(config.replicas)]
    engines = {name: Engine(name, server, model, free_port(), workdir, slots=config.slots) for name in names}
    trace = load_trace("conv")
    prompts, outputs = scaled_lengths(trace.prompt_tokens.tolist(), trace.completion_tokens.tolist(),
                                      prompt_scale=config.prompt_scale, output_scale=config.output_scale,
                                      max_prompt=128, max_output=32)
    samples: list[tuple[float, dict[str, int]]] = []
    with ExitStack() as stack:
        for engine in engines.values():
            engine.start()
            stack.callback(engine.stop)
        haproxy = HAProxy(haproxy_bin, balance, {n: e.port for n, e in engines.items()}, free_port(), workdir).start()
        stack.callback(haproxy.stop)
        worker = Worker(settings, workdir, config.profile).start()
        stack.callback(worker.stop)
        cli = [sys.executable, "-m", "skewwatch"]
        for name, engine in engines.items():
            stack.enter_context(_process(
                [*cli, "scrape", "--target", f"http://127.0.0.1:{engine.port}/metrics", "--kind", "llamacpp",
                 "--replica", name, "--batch-capacity", str(config.slots), "--loglevel", "warning"],
                workdir / f"scrape-{name}.log", env))
        if corrected:
            backend_map = workdir / "backends.toml"
            backend_map.write_text(f'[models."{MODEL}"]\nbackend = "{BACKEND}"\n')
            stack.enter_context(_process(
                [*cli, "apply", "haproxy", "--socket", haproxy.socket_path, "--backend-map", str(backend_map),
                 "--loglevel", "info"], workdir / "apply.log", env))
        load = LoadGenerator(f"http://127.0.0.1:{haproxy.port}/v1/chat/completions", settings.kafka.bootstrap or "",
                             settings.topics.requests, names, prompts, outputs, config.rate or 0.0,
                             batch_capacity=config.slots, seed=config.seed)
        capacity = None
        if config.rate is None:
            capacity = asyncio.run(load.calibrate(calibrate_s, config.replicas * config.slots))
            load.rate = config.load * capacity
        fault = Fault(config.fault, engines[FAULTY], duty=config.duty) if config.fault != "none" else None
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                with suppress(OSError):
                    samples.append((time.time(), haproxy.weights()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.time()
        fault_start = t0 + config.warmup_s
        fault_end = fault_start + config.fault_for_s

        async def drive() -> None:
            generate = asyncio.create_task(load.run(config.duration_s))
            if fault is not None:
                await asyncio.sleep(config.warmup_s)
                await asyncio.to_thread(fault.begin)
                await asyncio.sleep(config.fault_for_s)
                await asyncio.to_thread(fault.end)
            await generate

        asyncio.run(drive())
        stop.set()
        sampler.join(timeout=5)
        time.sleep(STEP_S * 2)  # the worker's last steps
        messages = read_topics(settings.kafka.bootstrap or "", [settings.topics.alerts,
                                                                  settings.topics.routing_corrections,
                                                                  settings.topics.features],
                               lambda _: False, 10.0)
        alerts = [decode_alert(m.value).to_dict() for m in messages if m.topic == settings.topics.alerts]
        corrections = [decode_correction(m.value).to_dict() for m in messages
                       if m.topic == settings.topics.routing_corrections]
        features = [r for r in (orjson.loads(m.value) for m in messages if m.topic == settings.topics.features)
                    if r.get("replica")]
    delete_run_topics(bootstrap, settings)
    span = (fault_start, fault_end) if fault is not None else (fault_start, t0 + config.duration_s)
    return {"fault": config.fault, "policy": config.policy, "profile": config.profile.split("=")[0],
            "rate": load.rate, "capacity_rps": capacity,
            "t0": t0, "fault_start": fault_start,
            "fault_end": fault_end if fault is not None else None, "published_events": load.published,
            **measure(load.finished, names, span, fault is not None, alerts, corrections, samples),
            "timeline": timeline(load.finished, t0, t0 + config.duration_s),
            "haproxy_weights": [{"t": t - t0, **w} for t, w in samples[::5]],
            "published_weights": [{"t": float(r["ts"]) - t0, **{k: round(float(v), 3) for k, v in r["weights"].items()}}
                                  for r in corrections],
            "features": [{"t": float(f["window_end"]) - t0, "replica": f["replica"], "count": f.get("count"),
                          "latency_p50": f.get("latency_p50"), "latency_p99": f.get("latency_p99"),
                          "tpot_p50": f.get("tpot_p50"), "ttft_p50": f.get("ttft_p50")}
                         for f in features if int(float(f["window_end"])) % 15 == 0]}


def _p(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def measure(finished: Sequence[Finished], names: Sequence[str], span: tuple[float, float], faulted: bool,
            alerts: Sequence[dict[str, Any]], corrections: Sequence[dict[str, Any]],
            samples: Sequence[tuple[float, dict[str, int]]]) -> dict[str, Any]:
    """The run's numbers (module docstring) over ``span`` (the fault, or the clean run after its warm-up).

    >>> f = [Finished(10.0 + i, 10.5 + i, "r1" if i % 4 == 0 else "r0", 500.0 + 100 * (i % 4 == 0), True)
    ...      for i in range(20)]
    >>> m = measure(f, ["r0", "r1"], (10.0, 30.0), True, [], [], [])
    >>> m["fleet_p50_ms"], m["faulty_share"], m["detected_s"]
    (500.0, 0.25, None)
    """
    start, end = span
    during = [f for f in finished if start <= f.start < end]
    ok = [f.latency_ms for f in during if f.ok]
    per = {name: [f.latency_ms for f in during if f.ok and f.replica == name] for name in names}
    p99s = [float(np.percentile(v, 99)) for v in per.values() if len(v) >= 5]
    opened = sorted((float(a["ts"]), str(a.get("replica")), str(a["detector"])) for a in alerts
                    if a.get("state") == "open" and float(a["ts"]) >= start - 30.0)
    on_faulty = [t for t, replica, _ in opened if faulted and replica == FAULTY and start <= t <= end + 30.0]
    elsewhere = [(t, r, d) for t, r, d in opened if not (faulted and r == FAULTY)]
    demoted = restored = published = None
    for t, weights in samples:
        others = [w for name, w in weights.items() if name != FAULTY and name in names]
        if not others or FAULTY not in weights:
            continue
        low = weights[FAULTY] < DEMOTED * float(np.mean(others))
        if faulted and demoted is None and start <= t <= end and low:
            demoted = t - start
        if faulted and restored is None and demoted is not None and t >= end and not low:
            restored = t - end  # back to its peers' weight, once it had been demoted
    for record in sorted(corrections, key=lambda r: float(r["ts"])):
        weights = record.get("weights") or {}
        t = float(record["ts"])
        if (faulted and published is None and start <= t <= end and FAULTY in weights and len(weights) > 1
                and float(weights[FAULTY]) < DEMOTED / len(weights)):
            published = t - start
    return {
        "requests": len(during), "failed": sum(not f.ok for f in during),
        "fleet_p50_ms": _p(ok, 50), "fleet_p99_ms": _p(ok, 99),
        "p99_deviation_ms": float(np.std(p99s)) if len(p99s) > 1 else None,
        "replica_p99_ms": {name: _p(v, 99) for name, v in per.items()},
        "faulty_share": (sum(f.replica == FAULTY for f in during) / len(during)) if during else None,
        "detected_s": (on_faulty[0] - start) if on_faulty else None,
        "detectors": sorted({d for t, r, d in opened if faulted and r == FAULTY and start <= t <= end + 30.0}),
        "demoted_haproxy_s": demoted, "demoted_published_s": published, "restored_s": restored,
        "alerts_elsewhere": [{"t": t - start, "replica": r, "detector": d} for t, r, d in elsewhere],
    }


def timeline(finished: Sequence[Finished], t0: float, t1: float, bucket_s: float = 10.0) -> list[dict[str, Any]]:
    """Per ``bucket_s`` of request starts: fleet P50/P99 and r1's share of the requests."""
    out = []
    for lo in np.arange(t0, t1, bucket_s):
        batch = [f for f in finished if lo <= f.start < lo + bucket_s]
        lat = [f.latency_ms for f in batch if f.ok]
        out.append({"t": float(lo - t0), "requests": len(batch), "p50_ms": _p(lat, 50), "p99_ms": _p(lat, 99),
                    "faulty_share": (sum(f.replica == FAULTY for f in batch) / len(batch)) if batch else None})
    return out


def _fmt(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:,.0f}{unit}"


def table(runs: Sequence[dict[str, Any]]) -> str:
    head = ("| fault | policy | fleet P50 | fleet P99 | P99 dev. | r1 share | failed | detect | demote | restore "
            "| alerts elsewhere |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = [head]
    for r in runs:
        demote = r["demoted_haproxy_s"] if POLICIES[r["policy"]][1] else r["demoted_published_s"]
        share = "—" if r["faulty_share"] is None else f"{r['faulty_share']:.2f}"
        profile = r.get("profile", "default")
        policy = r["policy"] if profile == "default" else f"{r['policy']} ({profile})"
        rows.append(f"| {r['fault']} | {policy} | {_fmt(r['fleet_p50_ms'], ' ms')} | "
                    f"{_fmt(r['fleet_p99_ms'], ' ms')} | {_fmt(r['p99_deviation_ms'], ' ms')} | {share} | "
                    f"{r['failed']}/{r['requests']} | {_fmt(r['detected_s'], ' s')} | {_fmt(demote, ' s')} | "
                    f"{_fmt(r['restored_s'], ' s')} | {len(r['alerts_elsewhere'])} |")
    return "\n".join(rows)


def verdicts(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The targets, per fault, for the corrected policy against leastconn alone."""
    out = []
    by = {(r["fault"], r["policy"]): r for r in runs if r.get("profile", "default") == "default"}
    for fault in FAULTS:
        mine, theirs = by.get((fault, "leastconn+skewwatch")), by.get((fault, "leastconn"))
        if mine is None:
            continue
        if theirs is not None and mine["fleet_p99_ms"] and theirs["fleet_p99_ms"]:
            ratio = mine["fleet_p99_ms"] / theirs["fleet_p99_ms"]
            goal = 0.7 if fault == "throttle" else 1.0
            out.append(f"{fault}: fleet P99 {ratio:.2f} x leastconn's ({'met' if ratio <= goal else 'MISSED'}: "
                       f"<= {goal})")
        if fault == "none":
            n = len(mine["alerts_elsewhere"])
            out.append(f"clean: {n} alerts ({'met' if n == 0 else 'MISSED'}: 0)")
            continue
        for what, key, goal_s in (("detected", "detected_s", 30.0), ("demoted", "demoted_haproxy_s", 30.0),
                                  ("restored", "restored_s", 60.0)):
            value = mine[key]
            ok = value is not None and value <= goal_s
            out.append(f"{fault}: {what} {_fmt(value, ' s')} ({'met' if ok else 'MISSED'}: <= {goal_s:.0f} s)")
    return out


def plot(runs: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = [f for f in FAULTS if any(r["fault"] == f for r in runs)]
    fig, axes = plt.subplots(len(faults), 2, figsize=(12, 3.2 * len(faults)), squeeze=False)
    for row, fault in enumerate(faults):
        for r in (r for r in runs if r["fault"] == fault):
            t = [b["t"] for b in r["timeline"]]
            profile = r.get("profile", "default")
            label = r["policy"] if profile == "default" else f"{r['policy']} ({profile})"
            # one colour per policy in every row (C3 for a profile other than the default)
            color = f"C{list(POLICIES).index(r['policy'])}" if profile == "default" else "C3"
            axes[row][0].plot(t, [b["p99_ms"] for b in r["timeline"]], label=label, color=color)
            axes[row][1].plot(t, [b["faulty_share"] for b in r["timeline"]], label=label, color=color)
            if r["fault_end"] is not None:
                for ax in axes[row]:
                    ax.axvspan(r["fault_start"] - r["t0"], r["fault_end"] - r["t0"], color="0.9")
        axes[row][0].set_title(f"{fault}: fleet P99 per 10 s of request starts (ms)")
        axes[row][1].set_title(f"{fault}: {FAULTY}'s share of the requests")
        axes[row][0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", action="append", choices=FAULTS, help="repeatable; default: all")
    parser.add_argument("--policy", action="append", choices=list(POLICIES), help="repeatable; default: all")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s, the whole fleet (default: --load x the capacity measured first)")
    parser.add_argument("--load", type=float, default=RunConfig.load, help="share of the measured capacity")
    parser.add_argument("--warmup-s", type=float, default=RunConfig.warmup_s)
    parser.add_argument("--fault-for", type=float, default=RunConfig.fault_for_s)
    parser.add_argument("--seed", type=int, default=RunConfig.seed, help="the load generator's")
    parser.add_argument("--duty", type=float, default=RunConfig.duty,
                        help="throttle: the share of every 100 ms r1 runs")
    parser.add_argument("--after-s", type=float, default=RunConfig.after_s)
    parser.add_argument("--clean-s", type=float, default=RunConfig.clean_s)
    parser.add_argument("--profile", default=RunConfig.profile,
                        help="the worker's profile: default, seed, tuned or NAME=PATH (a TOML file)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_loop.json")
    parser.add_argument("--plot", type=Path, default=None, help="default: beside --out, .png")
    parser.add_argument("--update", action="store_true",
                        help="keep the runs already in --out that this invocation does not repeat")
    args = parser.parse_args(argv)
    paths = engine_paths()
    faults = args.fault or list(FAULTS)
    policies = args.policy or list(POLICIES)
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="real-loop-") as tmp, kafka(Path(tmp)) as bootstrap:
        for fault in faults:
            for policy in policies:
                # one rate for every run: the first run measures the capacity, the others reuse its rate
                rate = args.rate if args.rate is not None else (runs[0]["rate"] if runs else None)
                config = RunConfig(fault, policy, args.replicas, args.slots, rate, args.load, args.warmup_s,
                                   args.fault_for, args.after_s, args.clean_s, args.seed, args.duty,
                                   profile=args.profile)
                print(f"{fault} / {policy}: {config.duration_s:.0f} s at "
                      f"{'a measured rate' if rate is None else f'{rate:.2f} requests/s'} ...", file=sys.stderr,
                      flush=True)
                runs.append(run_once(config, bootstrap, paths, Path(tmp) / f"{fault}-{policy}"))
                print(table(runs[-1:]), file=sys.stderr, flush=True)
    if args.update and args.out.exists():
        def key(r: dict[str, Any]) -> tuple[str, str, str]:
            return r["fault"], r["policy"], r.get("profile", "default")

        done = {key(r) for r in runs}
        kept = [r for r in json.loads(args.out.read_text())["runs"] if key(r) not in done]
        for r in kept:  # restored means back from a demotion in HAProxy (files written before that rule)
            if r["demoted_haproxy_s"] is None:
                r["restored_s"] = None
        runs = sorted(kept + runs, key=lambda r: (FAULTS.index(r["fault"]), list(POLICIES).index(r["policy"]),
                                                  r.get("profile", "default") != "default"))
    print(table(runs))
    for line in verdicts(runs):
        print(line)
    result = {"machine": machine(), "wall_s": round(time.monotonic() - started), "config": vars(args) | {
        "out": str(args.out), "plot": str(args.plot)}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    plot(runs, args.plot or args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
