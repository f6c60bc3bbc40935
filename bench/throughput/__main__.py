"""``python -m bench.throughput``: produce the dataset, run every contender, print and save the table."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.throughput.common import REPO, RESULTS, broker_bootstrap, machine_info
from bench.throughput.contenders import DECODERS, Spec, fastest_decoder
from bench.throughput.dataset import Dataset, produce_dataset
from bench.throughput.profile import format_summary
from bench.throughput.profile import summarise as summarise_profile
from bench.throughput.report import CASES, summarise, table, targets, targets_table
from bench.throughput.worker import run_worker_case

CHILD_CASES: dict[str, tuple[str, bool]] = {  # case -> (child kind, batched topic)
    "ceiling": ("ceiling", False),
    "ceiling-batch": ("ceiling", True),
    "quix": ("quix", False),
    "faust-decode": ("faust-decode", False),
    "faust-window": ("faust", False),
}
# case -> (batched topic, limits.checkpoint_interval_s; None: the worker's default)
WORKER_CASES: dict[str, tuple[bool, float | None]] = {
    "ours": (False, None), "ours-batch": (True, None),
    # what checkpointing costs: a checkpoint at every step close (checkpoint_interval_s = 0)
    "ours-batch-ckpt": (True, 0.0),
}


async def sample_messages(dataset: Dataset, n: int = 20_000) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=dataset.bootstrap, group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(dataset.single_topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        while len(values) < n:
            polled = await consumer.getmany(timeout_ms=1000, max_records=n)
            if not polled:
                break
            values += [m.value for msgs in polled.values() for m in msgs]
        return values[:n]
    finally:
        await consumer.stop()


def run_child(spec: Spec, timeout_s: float) -> dict[str, Any]:
    """Run one contender in its own process (see contenders.py) and read its JSON result."""
    result = Path(spec.result)
    result.unlink(missing_ok=True)
    log = result.with_suffix(".log")
    with log.open("wb") as out:
        command = [sys.executable, "-m", "bench.throughput.contenders", json.dumps(dataclasses.asdict(spec))]
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if result.exists():  # the Faust child stops itself after writing; give it a moment
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not result.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        return {"error": f"{spec.case}: no result (exit {proc.returncode}):\n{tail}"}
    return dict(json.loads(result.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="generator events per topic")
    parser.add_argument("--runs", type=int, default=3, help="runs of each contender (median reported)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of: {', '.join(CASES)}")
    parser.add_argument("--faust-events", type=int, default=50_000,
                        help="the Faust cases read this many events from the start of the same topic")
    parser.add_argument("--replicas-per-model", type=int, default=64)
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--rate", type=float, default=40.0, help="requests/s per replica (event time)")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--bootstrap", help="an existing Kafka (default: KAFKA_BOOTSTRAP, else the embedded broker)")
    parser.add_argument("--profile", action="store_true",
                        help="after the measured runs, one py-spy-sampled run of each worker case")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run at most")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds of rest before each run, so the broker is idle when a contender starts")
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput.json")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)}")

    workdir = Path(tempfile.mkdtemp(prefix="skewwatch-throughput-"))
    models = ("llama-3-70b", "mixtral-8x7b", "qwen-2-72b", "mistral-7b")[: args.models]
    started = time.perf_counter()
    machine_before = machine_info()
    runs: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    with broker_bootstrap(workdir, args.bootstrap) as bootstrap:
        print(f"producing {args.events:,} events twice (single and batches of {args.batch}) to {bootstrap} ...",
              flush=True)
        dataset = asyncio.run(produce_dataset(
            bootstrap, events=args.events, models=models, replicas_per_model=args.replicas_per_model,
            rate=args.rate, batch=args.batch, partitions=args.partitions))
        print(f"  {dataset.events:,} events, {dataset.single_messages:,} + {dataset.batched_messages:,} messages, "
              f"{dataset.event_bytes_mean:.0f} B/event, {dataset.produce_seconds:.0f} s", flush=True)
        decoder, decoder_rates = fastest_decoder(asyncio.run(sample_messages(dataset)))
        rates_text = ", ".join(f"{k} {v / 1000:.0f}k msg/s" for k, v in decoder_rates.items())
        print(f"  ceiling decoder: {decoder} ({rates_text})")
        for round_ in range(args.runs):
            for case in cases:
                time.sleep(args.settle)
                t = time.perf_counter()
                if case in WORKER_CASES:
                    try:
                        batched, interval = WORKER_CASES[case]
                        run = asyncio.run(run_worker_case(dataset, batched, workdir, timeout_s=args.timeout,
                                                          checkpoint_interval_s=interval))
                    except Exception as exc:  # keep the other contenders' numbers
                        run = {"error": f"{case}: {exc}"}
                else:
                    kind, batched = CHILD_CASES[case]
                    events = min(args.faust_events, dataset.events) if kind.startswith("faust") else dataset.events
                    spec = Spec(case=kind, bootstrap=bootstrap, topic=dataset.topic(batched),
                                partitions=dataset.partitions, events=events, batched=batched,
                                result=str(workdir / f"{case}-{round_}.json"), decoder=decoder)
                    run = run_child(spec, args.timeout)
                run.update(case=case, round=round_)
                runs.append(run)
                if "error" in run:
                    print(f"  round {round_ + 1} {case:13s} ERROR {run['error']}", flush=True)
                else:
                    print(f"  round {round_ + 1} {case:13s} {run['events'] / run['seconds']:>10,.0f} events/s "
                          f"({run['events']:,} events in {run['seconds']:.2f} s; {time.perf_counter() - t:.0f} s "
                          "with start-up)", flush=True)
        if args.profile:
            for case in [c for c in cases if c in WORKER_CASES and WORKER_CASES[c][1] is None]:
                path = workdir / f"profile-{case}.txt"
                run = asyncio.run(run_worker_case(dataset, WORKER_CASES[case][0], workdir, timeout_s=args.timeout,
                                                  profile_path=path))
                profile = summarise_profile(path.read_text() if path.exists() else "")
                profiles[case] = {"events_per_s_under_profiler": round(run["events"] / run["seconds"]),
                                  "step_seconds_stage1": run["step_seconds_stage1"],
                                  "step_seconds_stage2": run["step_seconds_stage2"], **profile}
    summary = summarise(runs)
    judged = targets(summary)
    print()
    print(table(summary))
    print()
    print(targets_table(judged))
    for case, profile in profiles.items():
        print()
        print(format_summary(profile, f"py-spy profile of {case} ({profile['events_per_s_under_profiler']:,} "
                                      "events/s under the profiler)"))
    out = {
        "machine": machine_before,
        "load_average_after": machine_info()["load_average"],
        "seconds": round(time.perf_counter() - started),
        "dataset": dataset.to_dict(),
        "ceiling_decoder": {"chosen": decoder, "messages_per_s": {k: round(v) for k, v in decoder_rates.items()},
                            "candidates": list(DECODERS)},
        "cases": {c: CASES[c] for c in cases},
        "faust_events": min(args.faust_events, dataset.events),
        "summary": summary,
        "targets": judged,
        "runs": runs,
        "profiles": profiles,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
