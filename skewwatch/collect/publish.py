"""Telemetry samples onto ``llm.gpu-telemetry``: encoding, keying, and stopping on signals.

Topic ``llm.gpu-telemetry``, key = replica id (so a replica's telemetry shares the
partition of its request events), published through
:class:`~skewwatch.client.bounded_producer.BoundedProducer` so a broker outage never stalls sampling.

The wire encoding is the contract's one encoder, :func:`skewwatch.schemas.telemetry.encode_telemetry`
(:func:`encode_sample` is its name here).

>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> import orjson
>>> sample = TelemetrySample(ts=1.0, replica="r1", source="nvml", power_w=300.0)
>>> orjson.loads(encode_sample(sample))["power_w"]
300.0
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.errors import NothingSent
from skewwatch.schemas.telemetry import encode_telemetry as encode_sample
from skewwatch.schemas.telemetry_sample import TelemetrySample


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
