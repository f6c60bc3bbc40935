"""Publishing a step's ``llm.features`` records: ``send()`` per record against ``KeyedPublisher``.

One process, one real broker (``KAFKA_BOOTSTRAP`` or the embedded one), an 8-partition topic, ~1 KB
records keyed ``model/replica``. For each call size (records stage 1 publishes at once: one input
partition's replicas of a step), ``--records`` records go out in calls back to back, each way,
rounds interleaved; CPU (``process_time``) and wall time per record until every record is acknowledged.

    .venv/bin/python bench/publish_bench.py [--per-call 16,160,1250] [--max-batch-bytes 16384]

Prints one line per case and round (the first round warms up).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

from skewwatch.agents.publish import KeyedPublisher  # noqa: E402
from skewwatch.broker import EmbeddedBroker  # noqa: E402

VALUE = orjson.dumps({"model": "m", "replica": "r", **{f"feature_{i}": 1.2345678901 * i for i in range(30)}})


async def run(bootstrap: str, per_call: list[int], records: int, max_batch_bytes: int, rounds: int) -> None:
    topic = f"publish-bench-{os.getpid()}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 8, 1)])
    finally:
        await admin.close()
    # as the worker's producer (agents/app.py), but for the batch size
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=True,
                                max_batch_size=max_batch_bytes)
    await producer.start()
    try:
        await (await producer.send(topic, b"warm-up", key=b"warm-up"))
        publisher = KeyedPublisher(producer)
        for size in per_call:
            keys = [f"model-{i % 50:02d}/r{i:06d}".encode() for i in range(size)]
            calls = max(records // size, 1)

            async def each_send(keys: list[bytes] = keys) -> list[Any]:
                return [await producer.send(topic, key=key, value=VALUE) for key in keys]

            async def batched(keys: list[bytes] = keys) -> list[Any]:
                return await publisher.publish(topic, [(key, VALUE) for key in keys])

            cases: list[tuple[str, Callable[[], Awaitable[list[Any]]]]] = [
                ("send() per record", each_send), ("KeyedPublisher", batched)]
            for round_ in range(rounds):
                for label, publish in cases:
                    gc.collect()
                    cpu, wall = time.process_time(), time.perf_counter()
                    futures: list[Any] = []
                    for _ in range(calls):
                        futures += await publish()
                        await asyncio.sleep(0)
                    await asyncio.gather(*futures)
                    n = calls * size
                    print(f"per call {size:>5}  round {round_}  {label:18}  "
                          f"{(time.process_time() - cpu) / n * 1e6:6.2f} µs CPU/record  "
                          f"{(time.perf_counter() - wall) / n * 1e6:7.2f} µs wall/record", flush=True)
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-call", default="16,160,1250", help="records per call, comma list")
    parser.add_argument("--records", type=int, default=8000, help="records per case and round")
    parser.add_argument("--max-batch-bytes", type=int, default=16384,
                        help="the producer's max_batch_size (the worker's: aiokafka's default, 16 KiB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    per_call = [int(x) for x in args.per_call.split(",")]
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    broker = None
    if not bootstrap:
        broker = EmbeddedBroker(Path(tempfile.mkdtemp(prefix="skewwatch-publish-")), port=0)
        broker.start(timeout=120)
        bootstrap = broker.bootstrap
    try:
        asyncio.run(run(bootstrap, per_call, args.records, args.max_batch_bytes, args.rounds))
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
