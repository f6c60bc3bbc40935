"""The peers, each run in a child process of its own: ceiling, Quix Streams, Faust.

Each reads one topic of the :mod:`~bench.throughput.dataset` from the beginning with a fresh
consumer group until it has counted every event, then writes one JSON result. The clocks start
when the first poll (or message) with records is handed to user code, before it is processed, so
consumer start-up and group joins, which differ a lot between them, are not counted; every event
counts. CPU is the process's CPU time over the same interval (all its threads,
librdkafka's included); peak RSS is the process's high-water mark (``ru_maxrss``).

- ``ceiling``: aiokafka ``getmany`` (the worker's fetch settings) and one JSON decode per message
  (:data:`DECODERS`: the fastest decoder we ship, chosen by measurement), nothing else;
- ``quix``: Quix Streams ``Application`` + ``StreamingDataFrame`` with the JSON deserializer
  (given orjson's ``loads``) and one ``update`` that counts: the same stateless decode;
- ``faust-decode``: a plain Faust agent ``async for value in stream`` that decodes (orjson) and
  counts: Faust's own per-event cost;
- ``faust``: the same agent, ``async for value in stream``, that decodes the event (orjson),
  builds a one-row :class:`~skewwatch.schemas.requests.columns.RequestColumns` and calls the worker's
  :meth:`PartitionWindows.apply` then ``close_steps()`` on the partition's windows: the same window
  update and step computation as ours, paid per event (it does not validate and does not publish,
  so it does less than ours).

Run one by hand: ``python -m bench.throughput.contenders '{"case": "ceiling", ...}'`` (see
:func:`main` for the keys).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import orjson

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "orjson.loads": orjson.loads,
    "msgspec.json.decode": msgspec.json.Decoder().decode,
}


def fastest_decoder(samples: list[bytes], rounds: int = 5) -> tuple[str, dict[str, float]]:
    """The name of the fastest of :data:`DECODERS` on these messages, and each one's messages/s.

    >>> name, rates = fastest_decoder([b'{"a": 1}'] * 100, rounds=1)
    >>> name in DECODERS and set(rates) == set(DECODERS)
    True
    """
    rates: dict[str, float] = {}
    for name, loads in DECODERS.items():
        best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter()
            for value in samples:
                loads(value)
            best = min(best, time.perf_counter() - t)
        rates[name] = len(samples) / max(best, 1e-9)
    return max(rates, key=lambda k: rates[k]), rates


@dataclass(slots=True)
class Spec:
    case: str  # ceiling | quix | faust
    bootstrap: str
    topic: str
    partitions: int
    events: int  # stop once this many events were counted
    batched: bool  # messages are {"events": [...]}
    result: str  # where to write the JSON result
    decoder: str = "orjson.loads"


@dataclass(slots=True)
class Meter:
    """Counts events; remembers the clocks when the first records arrived and at the last event.

    >>> m = Meter(total=3)
    >>> m.start(); m.add(2), m.add(1), m.add(1)
    (False, True, False)
    >>> m.result()["events"]
    3
    """

    total: int
    seen: int = 0
    mark: tuple[float, float] | None = None  # (wall, cpu) when the first records were handed over
    end: tuple[float, float, int] | None = None  # (wall, cpu, events) at completion

    def start(self) -> None:
        """Call when records first arrive, before processing them (later calls do nothing)."""
        if self.mark is None:
            self.mark = (time.time(), time.process_time())

    def add(self, n: int) -> bool:
        """Count ``n`` events; True on the call that completes the expected count (only that one)."""
        self.seen += n
        if self.seen >= self.total and self.end is None:
            self.end = (time.time(), time.process_time(), self.seen)
            return True
        return False

    def result(self) -> dict[str, Any]:
        assert self.mark is not None and self.end is not None
        wall0, cpu0 = self.mark
        return {"events": self.end[2], "seconds": self.end[0] - wall0, "cpu_s": self.end[1] - cpu0,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _count(doc: Any, batched: bool) -> int:
    return len(doc["events"]) if batched else 1


async def run_ceiling(spec: Spec) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    loads = DECODERS[spec.decoder]
    consumer = AIOKafkaConsumer(bootstrap_servers=spec.bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=2 * 1024 * 1024)
    await consumer.start()
    try:
        partitions = [TopicPartition(spec.topic, p) for p in range(spec.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        meter = Meter(spec.events)
        batched = spec.batched
        done = False
        while not done:
            polled = await consumer.getmany(timeout_ms=200, max_records=20_000)  # as the worker's stage 1
            if polled:
                meter.start()
            n = 0
            for messages in polled.values():
                for message in messages:
                    n += _count(loads(message.value), batched)
            if n:
                done = meter.add(n)
        return meter.result()
    finally:
        await consumer.stop()


def run_quix(spec: Spec) -> dict[str, Any]:
    warnings.simplefilter("ignore")  # quixstreams' optional schema-registry imports warn on import
    from quixstreams import Application
    from quixstreams.models.serializers.json import JSONDeserializer

    app = Application(broker_address=spec.bootstrap, consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
                      auto_offset_reset="earliest", loglevel="WARNING", use_changelog_topics=False,
                      auto_create_topics=False)
    topic = app.topic(spec.topic, value_deserializer=JSONDeserializer(loads=orjson.loads))
    meter = Meter(spec.events)
    batched = spec.batched

    def count(value: Any) -> None:
        meter.start()  # the first call: the first message was just handed over (and deserialized)
        if meter.add(_count(value, batched)):
            app.stop()

    sdf = app.dataframe(topic)
    sdf = sdf.update(count)
    app.run()
    return meter.result()


def run_faust(spec: Spec, window: bool) -> None:
    import faust

    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.schemas.requests.columns import RequestColumns

    app = faust.App(f"bench-faust-{uuid.uuid4().hex[:8]}", broker=f"kafka://{spec.bootstrap}",
                    store="memory://", web_enabled=False, autodiscover=False, topic_replication_factor=1,
                    consumer_auto_offset_reset="earliest")
    topic = app.topic(spec.topic, value_serializer="raw")
    meter = Meter(spec.events)
    windows: dict[int, PartitionWindows] = {}
    settings = WindowSettings()

    @app.agent(topic)
    async def window_update(stream: Any) -> None:
        async for value in stream:
            meter.start()
            partition = stream.current_event.message.partition
            state = windows.get(partition)
            if state is None:
                state = windows[partition] = PartitionWindows(settings)
            event = orjson.loads(value)
            rows = event["events"] if spec.batched else [event]
            if window:
                state.apply(RequestColumns.from_rows(rows))
                state.close_steps()
            if meter.add(len(rows)):
                Path(spec.result).write_text(json.dumps(meter.result()))
                os.kill(os.getpid(), signal.SIGTERM)  # the Faust worker stops gracefully

    worker = faust.Worker(app, loglevel="warning", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = Spec(**json.loads(args[0]))
    if spec.case == "ceiling":
        out = asyncio.run(run_ceiling(spec))
    elif spec.case == "quix":
        out = run_quix(spec)
    elif spec.case in ("faust", "faust-decode"):
        run_faust(spec, window=spec.case == "faust")  # writes its own result, then stops the worker
        return
    else:
        raise SystemExit(f"unknown case {spec.case!r}")
    Path(spec.result).write_text(json.dumps(out))


__all__ = ["DECODERS", "Meter", "Spec", "fastest_decoder", "main"]

if __name__ == "__main__":
    main()
