"""``python -m bench.throughput.compare NAME=TREE ...``: the worker of several checkouts on one dataset.

Revisions compared from separate ``python -m bench.throughput`` runs each meet their own dataset and
their own moment of a shared machine's load. Here one dataset is produced once; every round runs the
ceiling, then the worker of each checkout (``git worktree add /tmp/base <rev>``; each runs its own code
on ``PYTHONPATH`` with this virtual environment), in alternating order from one round to the next.
Ratios to the round's ceiling and CPU µs per event are printed per run, then their medians per
checkout; the JSON holds every run.

    .venv/bin/python -m bench.throughput.compare base=/tmp/base head=. --events 1000000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.throughput.__main__ import run_child, sample_messages
from bench.throughput.common import RESULTS, broker_bootstrap, machine_info
from bench.throughput.contenders import Spec, fastest_decoder
from bench.throughput.dataset import produce_dataset
from bench.throughput.worker import run_worker_case


def _rate(run: dict[str, Any]) -> float:
    return float(run["events"]) / float(run["seconds"])


def _cpu_us(run: dict[str, Any]) -> float:
    return 1e6 * float(run["cpu_s"]) / float(run["events"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", help="NAME=PATH: a checkout of the repository")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--single", action="store_true", help="single-event messages (default: batches of 100)")
    parser.add_argument("--bootstrap", help="an existing Kafka (default: KAFKA_BOOTSTRAP, else the embedded broker)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of rest before each run")
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput_compare.json")
    args = parser.parse_args(argv)
    pairs = [t.partition("=") for t in args.trees]
    if any(not name or not path for name, _, path in pairs):
        parser.error("each tree is NAME=PATH")
    trees = [(name, Path(path).resolve()) for name, _, path in pairs]
    if any(not (path / "skewwatch").is_dir() for _, path in trees):
        parser.error("each tree's PATH must be a checkout of the repository")
    batched = not args.single
    workdir = Path(tempfile.mkdtemp(prefix="skewwatch-compare-"))
    machine = machine_info()
    runs: list[dict[str, Any]] = []
    with broker_bootstrap(workdir, args.bootstrap) as bootstrap:
        dataset = asyncio.run(produce_dataset(bootstrap, events=args.events, partitions=8))
        decoder, _ = fastest_decoder(asyncio.run(sample_messages(dataset)))
        print(f"{dataset.events:,} events, {'batches of 100' if batched else 'single events'}", flush=True)
        for round_ in range(args.rounds):
            time.sleep(args.settle)
            spec = Spec(case="ceiling", bootstrap=bootstrap, topic=dataset.topic(False), partitions=dataset.partitions,
                        events=dataset.events, batched=False, result=str(workdir / f"ceiling-{round_}.json"),
                        decoder=decoder)
            ceiling = {**run_child(spec, 900.0), "tree": "ceiling", "round": round_}
            runs.append(ceiling)
            if "error" in ceiling:
                raise SystemExit(ceiling["error"])
            print(f"round {round_ + 1} ceiling {_rate(ceiling):>10,.0f} events/s  {_cpu_us(ceiling):.2f} µs/event",
                  flush=True)
            for name, path in trees if round_ % 2 == 0 else trees[::-1]:
                time.sleep(args.settle)
                run = asyncio.run(run_worker_case(dataset, batched, workdir, tree=path))
                run.update(tree=name, round=round_, ratio=_rate(run) / _rate(ceiling))
                runs.append(run)
                print(f"round {round_ + 1} {name:10s} {_rate(run):>10,.0f} events/s  {run['ratio']:.2f} x ceiling  "
                      f"{_cpu_us(run):.2f} µs/event", flush=True)
    print()
    for name, _ in trees:
        mine = [r for r in runs if r["tree"] == name]
        print(f"{name:10s} ratio median {statistics.median(r['ratio'] for r in mine):.2f}  "
              f"CPU µs/event median {statistics.median(_cpu_us(r) for r in mine):.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "load_average_after": machine_info()["load_average"],
                                    "trees": {name: str(path) for name, path in trees}, "runs": runs},
                                   indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
