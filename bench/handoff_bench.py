"""Per replica step: publishing + the stage 1 -> stage 2 hand-off + stage 2's decode.

One process, one real broker (``KAFKA_BOOTSTRAP`` or the embedded one). A fleet of ``R`` replicas over
``M`` models on 8 partitions of windows (``bench/scale.py``'s synthetic traffic, full 60 s windows),
every replica with a telemetry sample; one closed step of every partition is published and handed over,
CPU time (``process_time``) per replica step until the broker acknowledged every record: the features
through ``KeyedPublisher`` (one batch per partition), one ``encode_model_step`` record per (partition,
model, step) with its header; stage 2 reads the header and ``decode_model_step``.

The stage 2 side decodes the bytes it was given (no consumer: fetching is the same per record either
way, and one record per partition and model). One producer, configured as the worker's (``agents/app.py``).

    .venv/bin/python bench/handoff_bench.py [--fleets 128x2,1000x50,10000x50] [--rounds 3] [--no-publish]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

from bench.scale import Fleet, fleet_replicas  # noqa: E402
from skewwatch.agents.publish import KeyedPublisher  # noqa: E402
from skewwatch.broker import EmbeddedBroker  # noqa: E402
from skewwatch.pipeline.replica_step_record import (  # noqa: E402
    decode_model_step,
    encode_model_step,
    read_step_header,
    record_parts,
    step_header,
)
from skewwatch.pipeline.window import StepBatch  # noqa: E402
from skewwatch.schemas.feature_vector import FeatureVector  # noqa: E402
from skewwatch.schemas.features import encode_features  # noqa: E402
from skewwatch.schemas.telemetry_sample import TelemetrySample  # noqa: E402

PARTITIONS = 8


def closed_partitions(replicas: int, models: int) -> list[list[StepBatch]]:
    fleet = Fleet(fleet_replicas(replicas, models), 3.0)
    closed: list[Any] = []
    for _ in range(14):  # full windows
        fleet.feed()
        closed = fleet.close()
    return [list(steps.batches) for steps in closed]


def sample_of(fv: FeatureVector) -> TelemetrySample:
    return TelemetrySample(ts=fv.window_end - 1.0, replica=fv.replica or "", source="nvml",
                           node="node-1", memory_used_bytes=6.1e10, memory_total_bytes=8.0e10, utilization_gpu=0.7,
                           power_w=420.0, temperature_c=61.0, xid_count_5m=0)


async def hand_off(producer: AIOKafkaProducer | None, publisher: KeyedPublisher | None,
                   partitions: list[list[StepBatch]], topics: tuple[str, str]) -> int:
    features_topic, steps_topic = topics
    records: list[tuple[bytes, list[tuple[str, bytes]]]] = []
    futures = []
    for source, batches in enumerate(partitions):
        for batch in batches:
            if publisher is not None:
                futures += await publisher.publish(features_topic, [(fv.key.encode(), encode_features(fv))
                                                                    for fv in batch.feature_vectors()])
            for model, part, group, summary in record_parts(batch):
                value = encode_model_step(model, batch.window_end, source, group, summary,
                                          [sample_of(fv) for fv in group], [[] for _ in group])
                headers = step_header(batch.window_end, source, len(group), part)
                if producer is not None:
                    futures.append(await producer.send(steps_topic, key=model.encode(), value=value,
                                                       headers=headers))
                records.append((value, headers))
    await asyncio.gather(*futures)
    held = [(read_step_header(headers), value) for value, headers in records]
    return sum(len(decode_model_step(value).replicas) for _, value in held)


async def run(bootstrap: str | None, fleets: list[tuple[int, int]], rounds: int) -> None:
    """``bootstrap`` None: the hand-off alone (encode, route, decode), nothing sent."""
    names = [f"handoff-bench-{os.getpid()}-{t}" for t in ("features", "steps")]
    topics = (names[0], names[1])
    producer: AIOKafkaProducer | None = None
    publisher: KeyedPublisher | None = None
    if bootstrap is not None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=True,
                                    max_request_size=16 * 1024 * 1024)
        await producer.start()
        await (await producer.send(names[0], b"warm-up", key=b"warm-up"))
        publisher = KeyedPublisher(producer)
    try:
        for replicas, models in fleets:
            partitions = closed_partitions(replicas, models)
            n = sum(len(batch) for batches in partitions for batch in batches)
            per_chunk = n / len({(source, model) for source, batches in enumerate(partitions) for batch in batches
                                 for model in batch.model_rows()})
            for round_ in range(rounds):
                gc.collect()
                cpu = time.process_time()
                decoded = await hand_off(producer, publisher, partitions, topics)
                spent = time.process_time() - cpu
                assert decoded == n, (decoded, n)
                print(f"{replicas:>6} replicas {models:>3} models ({per_chunk:5.1f} per record)  round {round_}  "
                      f"{spent / n * 1e6:7.2f} µs CPU per replica step", flush=True)
    finally:
        if producer is not None:
            await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleets", default="128x2,1000x50,10000x50", help="REPLICASxMODELS, comma list")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-publish", action="store_true", help="the hand-off alone: no broker, nothing sent")
    args = parser.parse_args()
    fleets = [(int(r), int(m)) for r, m in (f.split("x") for f in args.fleets.split(","))]
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    broker = None
    if args.no_publish:
        asyncio.run(run(None, fleets, args.rounds))
        return
    if not bootstrap:
        broker = EmbeddedBroker(Path(tempfile.mkdtemp(prefix="skewwatch-handoff-")), port=0)
        broker.start(timeout=120)
        bootstrap = broker.bootstrap
    try:
        asyncio.run(run(bootstrap, fleets, args.rounds))
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
