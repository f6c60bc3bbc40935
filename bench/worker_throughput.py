"""A first figure: events/s of the real worker (both stages, end to end) on the generator's output.

Pre-produces ``--events`` request events from ``skewwatch.sim`` (``--replicas`` replicas, single-event
messages and/or ``{"events": [...]}`` batches of ``--batch``) onto fresh topics, then starts
``skewwatch worker`` as a child process and times, from its first to its last accepted event (read
from ``/metrics``), how fast it drains the topic. Uses ``KAFKA_BOOTSTRAP`` or starts the embedded
broker. This is not the full throughput benchmark, ``bench/throughput`` (no peers, one run per case).

    .venv/bin/python bench/worker_throughput.py [--events 200000] [--batch 1 --batch 100]

Prints a table and writes ``bench/results/worker_throughput.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skewwatch.broker import EmbeddedBroker  # noqa: E402
from skewwatch.sim.emit import produce_traffic  # noqa: E402
from skewwatch.sim.generator import GeneratorConfig, generate_chunks  # noqa: E402
from skewwatch.topics import ensure_topics  # noqa: E402
from tests.conftest import unique_settings  # noqa: E402
from tests.integration.worker_proc import WorkerProcess  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def events_in(worker: WorkerProcess) -> float:
    try:
        text = worker.get("/metrics").decode()
    except OSError:
        return 0.0
    match = re.search(r"^skewwatch_events_in_total ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def run_case(bootstrap: str, events: int, replicas: int, batch: int, workdir: Path) -> dict[str, Any]:
    settings = unique_settings(bootstrap, partitions=8)
    asyncio.run(ensure_topics(bootstrap, settings))
    rate = 10.0
    duration = events / (replicas * rate)
    config = GeneratorConfig(models=("m",), replicas=replicas, rate=rate, seed=1, telemetry=False)
    stats = asyncio.run(produce_traffic(bootstrap, generate_chunks(config, 1_700_000_000.0, duration),
                                        requests_topic=settings.topics.requests, telemetry_topic=None,
                                        batch=batch, max_batch_delay_s=60.0))
    produced = stats.events
    worker = WorkerProcess(settings, workdir / f"worker-b{batch}.log").start()
    try:
        first = last = None
        seen = 0.0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            n = events_in(worker)
            now = time.monotonic()
            if n > 0 and first is None:
                first = (now, n)
            if n > seen:
                seen, last = n, now
            if n >= produced * 0.999:  # late/rejected events are never "in"
                break
            if last is not None and now - last > 15:
                break
            time.sleep(0.2)
        assert first is not None and last is not None, worker.log_tail()
        elapsed = max(last - first[0], 1e-9)
        rate_out = (seen - first[1]) / elapsed
    finally:
        worker.stop()
    return {"batch": batch, "events": produced, "accepted": seen, "seconds": round(elapsed, 2),
            "events_per_s": round(rate_out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--batch", type=int, action="append")
    args = parser.parse_args()
    batches = args.batch or [1, 100]
    workdir = Path(tempfile.mkdtemp(prefix="skewwatch-bench-"))
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        broker = EmbeddedBroker(workdir / "kafka", port=0)
        broker.start()
        bootstrap = broker.bootstrap
    try:
        rows = [run_case(bootstrap, args.events, args.replicas, b, workdir) for b in batches]
    finally:
        if broker is not None:
            broker.stop()
    print(f"{'events/msg':>10} {'events':>9} {'seconds':>8} {'events/s':>9}")
    for row in rows:
        print(f"{row['batch']:>10} {row['events']:>9} {row['seconds']:>8} {row['events_per_s']:>9}")
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rows": rows}
    (RESULTS / "worker_throughput.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
