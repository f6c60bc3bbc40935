"""KeyedPublisher (skewwatch.agents.publish) on a real broker: every record arrives once, in order, on the
partition aiokafka's send() puts its key on."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from skewwatch.agents.publish import MIN_BATCH_RECORDS, KeyedPublisher
from skewwatch.config import Settings

pytestmark = pytest.mark.kafka


async def _publish_and_read(bootstrap: str, topic: str) -> list[tuple[bytes, bytes, int]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=True)
    await producer.start()
    try:
        records = [(f"model-{i % 40 % 3}/r{i % 40:03d}".encode(), b"batch-%04d" % i + b"." * 100) for i in range(400)]
        publisher = KeyedPublisher(producer, batch_bytes=2048)  # small: a call fills several per partition
        # many records per partition (own batches, several per partition at this batch size), then a
        # few (under MIN_BATCH_RECORDS per partition: sent one by one on the cached partition)
        assert MIN_BATCH_RECORDS > 10
        for start, end in ((0, 200), (200, 390), (390, 400)):
            await asyncio.gather(*await publisher.publish(topic, records[start:end]))
        # and once per key with send(), aiokafka's default partitioner choosing
        await asyncio.gather(*[await producer.send(topic, key=key, value=b"send") for key in dict(records)])
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    got: list[tuple[bytes, bytes, int]] = []
    try:
        while len(got) < 440:
            for messages in (await consumer.getmany(timeout_ms=2000)).values():
                got.extend((m.key, m.value, m.partition) for m in messages)
    finally:
        await consumer.stop()
    return got


def test_records_land_once_in_order_on_the_partition_send_would_choose(kafka_bootstrap: str,
                                                                       kafka_settings: Settings) -> None:
    got = asyncio.run(asyncio.wait_for(_publish_and_read(kafka_bootstrap, kafka_settings.topics.features), 60))
    batched = [(key, value, partition) for key, value, partition in got if value != b"send"]
    sent = {key: partition for key, value, partition in got if value == b"send"}
    assert len(batched) == 400 and len({value for _, value, _ in batched}) == 400 and len(sent) == 40
    assert {key: partition for key, _, partition in batched} == sent
    assert len(set(sent.values())) == kafka_settings.kafka.partitions  # the keys spread over every partition
    for key in sent:  # in the order published, per key
        values = [value for k, value, _ in batched if k == key]
        assert values == sorted(values)
