"""State snapshots aligned with the input offset they cover, on a compacted Kafka topic.

Why not a Faust table: a changelog write per event costs a state-sized write per event, and
Faust acks input offsets independently of table state, so after a crash counts can be lost
or doubled. Instead, once per 5 s step the worker writes, per input partition, a snapshot of
its in-memory state *together with the offset of the first message it does not reflect*
(Kafka Streams/Flink style). On assignment it restores the snapshot and seeks the input to
that offset: a restart then replays exactly what came after, nothing lost, nothing twice.

A snapshot may exceed one Kafka message, so it is written as chunks followed by a marker.
Chunks alternate between two generations (``g0``/``g1``) and the marker is written last, so a
crash in the middle of a write leaves the previous generation, which the marker still points
to, intact on the compacted topic.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from skewwatch.agents.read_to_end import read_to_end
from skewwatch.kafka_client import refresh_metadata

CHUNK_BYTES = 4 * 1024 * 1024  # below the checkpoint topic's max.message.bytes (16 MiB)
_CHUNK_HEADER = struct.Struct(">4sQI")  # magic, generation, chunk index
_MAGIC = b"SWCK"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    offset: int  # next input offset to read: the snapshot reflects everything before it
    generation: int
    state: bytes


def _marker_key(stage: str, topic: str, partition: int) -> bytes:
    return f"{stage}/{topic}/{partition}".encode()


def _chunk_key(stage: str, topic: str, partition: int, generation: int, index: int) -> bytes:
    return f"{stage}/{topic}/{partition}/g{generation % 2}/c{index}".encode()


class CheckpointStore:
    """Writes and reads per-partition snapshots on ``topic`` (compacted)."""

    def __init__(self, producer: AIOKafkaProducer, connection: Mapping[str, Any], topic: str, stage: str) -> None:
        self._producer = producer
        self._connection = dict(connection)  # skewwatch.kafka_client.client_kwargs: how to reach the cluster
        self._topic = topic
        self._stage = stage
        self._generation: dict[tuple[str, int], int] = {}

    async def write(self, input_topic: str, partition: int, offset: int, state: bytes) -> None:
        generation = self._generation.get((input_topic, partition), 0) + 1
        chunks = [state[i:i + CHUNK_BYTES] for i in range(0, len(state), CHUNK_BYTES)] or [b""]
        sends = []
        for index, chunk in enumerate(chunks):
            header = _CHUNK_HEADER.pack(_MAGIC, generation, index)
            key = _chunk_key(self._stage, input_topic, partition, generation, index)
            sends.append(await self._producer.send(self._topic, key=key, value=header + chunk))
        await asyncio.gather(*sends)  # every chunk acknowledged before the marker points at them
        marker = orjson.dumps({"generation": generation, "chunks": len(chunks), "offset": offset})
        await (await self._producer.send(self._topic, key=_marker_key(self._stage, input_topic, partition),
                                         value=marker))
        self._generation[(input_topic, partition)] = generation

    async def read(self, input_topic: str, partitions: list[int]) -> dict[int, Checkpoint]:
        """The latest complete snapshot of each of ``partitions`` (absent when none was written)."""
        latest = await self._read_topic()
        found: dict[int, Checkpoint] = {}
        for partition in partitions:
            raw_marker = latest.get(_marker_key(self._stage, input_topic, partition))
            if raw_marker is None:
                continue
            marker = orjson.loads(raw_marker)
            generation = int(marker["generation"])
            parts = []
            for index in range(int(marker["chunks"])):
                raw = latest.get(_chunk_key(self._stage, input_topic, partition, generation, index))
                if raw is None:
                    raise RuntimeError(f"checkpoint {input_topic}/{partition} generation {generation}: "
                                       f"chunk {index} is missing")
                magic, chunk_generation, chunk_index = _CHUNK_HEADER.unpack_from(raw)
                if magic != _MAGIC or chunk_generation != generation or chunk_index != index:
                    raise RuntimeError(f"checkpoint {input_topic}/{partition}: chunk {index} belongs to "
                                       f"generation {chunk_generation}, marker says {generation}")
                parts.append(raw[_CHUNK_HEADER.size:])
            self._generation[(input_topic, partition)] = generation
            found[partition] = Checkpoint(offset=int(marker["offset"]), generation=generation,
                                          state=b"".join(parts))
        return found

    async def _read_topic(self) -> dict[bytes, bytes]:
        consumer = AIOKafkaConsumer(**self._connection, enable_auto_commit=False,
                                    max_partition_fetch_bytes=32 * 1024 * 1024,
                                    fetch_max_bytes=64 * 1024 * 1024)
        await consumer.start()
        try:
            partitions = consumer.partitions_for_topic(self._topic) or set()
            if not partitions:
                await refresh_metadata(consumer)
                partitions = consumer.partitions_for_topic(self._topic) or set()
            tps = [TopicPartition(self._topic, p) for p in sorted(partitions)]
            if not tps:
                return {}
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            latest: dict[bytes, bytes] = {}
            pending = {tp for tp in tps if end[tp] > 0}
            async for message in read_to_end(consumer, pending, end):
                if message.key is None:
                    continue
                if message.value is None:
                    latest.pop(message.key, None)
                else:
                    latest[message.key] = message.value
            return latest
        finally:
            await consumer.stop()
