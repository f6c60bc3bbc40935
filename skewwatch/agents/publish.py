"""Publishing many keyed records at once, on the partitions aiokafka's ``send()`` would choose.

Stage 1 publishes one ``llm.features`` record per replica and closed step: thousands per step at
fleet scale. ``await producer.send()`` per record pays, each time, a coroutine, the metadata check,
the pure-Python murmur2 of the key (aiokafka's default partitioner) and a future per record.
:class:`KeyedPublisher` computes each key's partition once (the same murmur2 partitioner, cached
per key while the topic's partition count holds) and, where one call has many records for a
partition (``MIN_BATCH_RECORDS``), appends them to a batch of their own (a ``BatchBuilder``, what
:meth:`~aiokafka.AIOKafkaProducer.create_batch` returns, of ``BATCH_BYTES``), submitted with
``send_batch``: one future per batch; fewer go through ``send(partition=...)``. Same partition per key as ``send()``
(the integration test checks it on a broker), one record per key, in order per partition.

>>> partitions = KeyPartitions()
>>> partitions.partition(b"m/r1", [0, 1, 2, 3]) == DefaultPartitioner()(b"m/r1", [0, 1, 2, 3], [0, 1, 2, 3])
True
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import aiokafka
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from skewwatch.kafka_client import new_batch

if TYPE_CHECKING:
    from skewwatch.kafka_client import BatchBuilder  # aiokafka's internal module is named in kafka_client only

log = logging.getLogger(__name__)

# keys remembered before the cache starts over (model/replica keys: one per active replica)
_MAX_CACHED_KEYS = 1 << 18
# A partition's records of one call go out as batches of their own from this many on; fewer are sent
# one by one (on the cached partition) and join the producer's open batch for that partition. Why:
# ``send_batch`` first waits until the partition's previous batch has left (up to linger_ms), and a
# batch of a few records pays a produce request on its own: own batches cost more per record than
# send() below about a dozen records per partition, less above (bench/README.md, "Publishing alone").
MIN_BATCH_RECORDS = 16
# KeyedPublisher's own batches: a partition's records of a step at 10k replicas (~160 KB) in one,
# well under the topics' 1 MiB max.message.bytes
BATCH_BYTES = 256 * 1024


class KeyPartitions:
    """aiokafka's default partition of a key (murmur2), computed once per key."""

    def __init__(self) -> None:
        self._partitioner = DefaultPartitioner()
        self._partitions: tuple[int, ...] = ()
        self._cache: dict[bytes, int] = {}

    def partition(self, key: bytes, partitions: Sequence[int]) -> int:
        """The partition of ``key`` among ``partitions`` (sorted, as the producer lists them)."""
        if tuple(partitions) != self._partitions or len(self._cache) >= _MAX_CACHED_KEYS:
            self._partitions = tuple(partitions)
            self._cache.clear()
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._partitioner(key, list(partitions), list(partitions))
        return found


class KeyedPublisher:
    """Publishes many ``(key, value)`` records to one topic as one batch per partition.

    ``batch_bytes``: the size of the batches it builds itself (None: ``producer.create_batch()``, the
    producer's ``max_batch_size``). Its own batches are what ``create_batch()`` makes for an
    uncompressed, non-transactional producer (the worker's). The worker's producer has 1 MiB batches
    (agents/app.py), so ``None`` would do there too; 256 KiB is kept so that a publisher on another
    producer (aiokafka's default 16 KiB) still sends a partition's records of a step in one batch.
    """

    def __init__(self, producer: AIOKafkaProducer, batch_bytes: int | None = BATCH_BYTES) -> None:
        self.producer = producer
        self.partitions = KeyPartitions()
        self.batch_bytes = batch_bytes

    def _new_batch(self) -> BatchBuilder:
        if self.batch_bytes is not None:
            try:  # BatchBuilder's constructor is not aiokafka's documented API (create_batch() is)
                return new_batch(self.batch_bytes)
            except TypeError:  # another aiokafka's signature: the producer's own size, documented
                log.warning("aiokafka %s: BatchBuilder(size, compression, is_transactional=) refused; "
                            "publishing in create_batch() batches", aiokafka.__version__)
                self.batch_bytes = None
        return self.producer.create_batch()

    async def publish(self, topic: str, records: Iterable[tuple[bytes, bytes]]) -> list[asyncio.Future[Any]]:
        """Queue every record (on its key's partition); returns the futures of their delivery."""
        partitions = sorted(await self.producer.partitions_for(topic))
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        for key, value in records:
            by_partition.setdefault(self.partitions.partition(key, partitions), []).append((key, value))
        futures: list[asyncio.Future[Any]] = []
        for partition, rows in by_partition.items():
            if len(rows) < MIN_BATCH_RECORDS:  # too few for a batch of their own: join the producer's
                futures.extend([await self.producer.send(topic, key=key, value=value, partition=partition)
                                for key, value in rows])
                continue
            batch = self._new_batch()
            for key, value in rows:
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it, start another
                    futures.append(await self.producer.send_batch(batch, topic, partition=partition))
                    batch = self._new_batch()
                    batch.append(key=key, value=value, timestamp=None)
            futures.append(await self.producer.send_batch(batch, topic, partition=partition))
        return futures
