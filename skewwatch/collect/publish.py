"""Telemetry samples onto ``llm.gpu-telemetry``: encoding, keying, and stopping on signals.

Topic ``llm.gpu-telemetry``, key = replica id (so a replica's telemetry shares the
partition of its request events), published through
:class:`~skewwatch.client.bounded_producer.BoundedProducer` so a broker outage never stalls sampling.

The wire encoding is ``skewwatch.schemas.telemetry.encode_telemetry`` (the JSON Schema
contract) when that module is present; until then ``orjson`` of ``sample.to_dict()``, the
same JSON without the schema check.

>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> import orjson
>>> sample = TelemetrySample(ts=1.0, replica="r1", source="nvml", power_w=300.0)
>>> orjson.loads(encode_sample(sample))["power_w"]
300.0
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable

import orjson

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.errors import NothingSent
from skewwatch.schemas.telemetry_sample import TelemetrySample

Encoder = Callable[[TelemetrySample], bytes]


def _orjson_encode(sample: TelemetrySample) -> bytes:
    return orjson.dumps(sample.to_dict())


@functools.cache
def _encoder() -> Encoder:
    try:
        from skewwatch.schemas.telemetry import encode_telemetry
    except ImportError:
        return _orjson_encode
    encoder: Encoder = encode_telemetry
    return encoder


def encode_sample(sample: TelemetrySample) -> bytes:
    """The wire bytes of one sample (the schema module's encoder when available)."""
    return _encoder()(sample)


def publish_sample(producer: BoundedProducer, sample: TelemetrySample) -> None:
    """Offer one sample, keyed by its replica; never blocks."""
    producer.offer(sample.replica.encode(), encode_sample(sample))


def require_delivered(producer: BoundedProducer, bootstrap: str) -> None:
    """After a bounded run (``--rounds``): NothingSent (exit 7) when samples were offered and the broker
    acknowledged none of them."""
    if producer.sent_total == 0 and producer.dropped_total > 0:
        reason = f" (last error: {producer.last_error})" if producer.last_error else ""
        raise NothingSent(f"none of {producer.dropped_total} samples reached Kafka at {bootstrap}{reason}")


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGINT / SIGTERM set ``stop`` so the loops end, flush the producer and exit cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread, or Windows
            loop.add_signal_handler(sig, stop.set)
