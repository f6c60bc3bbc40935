"""Reading assigned partitions up to the end offsets they had when the read began.

A restore reads a topic back (the checkpoints, the decisions already published) and must stop once it
has everything that was there: every partition is fetched until the consumer's position reaches its
end offset, and a partition that got there is no longer fetched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

READ_TIMEOUT_MS = 1000  # per fetch


async def read_to_end(consumer: AIOKafkaConsumer, pending: set[TopicPartition],
                      ends: Mapping[TopicPartition, int]) -> AsyncIterator[Any]:
    """Every message of the ``pending`` partitions (assigned, positioned) up to their ``ends``; the set
    empties as partitions reach their end."""
    while pending:
        batch = await consumer.getmany(*pending, timeout_ms=READ_TIMEOUT_MS)
        for messages in batch.values():
            for message in messages:
                yield message
        for tp in list(pending):
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
