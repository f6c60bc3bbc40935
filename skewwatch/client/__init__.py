"""What runs in the inference fleet's own processes: publishing request events to the worker.

* :class:`RequestEventProducer` (``request_producer.py``): an inference server records one event per
  finished request, from synchronous or asyncio code, without ever blocking its serving loop;
* :class:`BoundedProducer` (``bounded_producer.py``): the Kafka producer under it (and under the
  telemetry collectors of :mod:`skewwatch.collect`), with a bounded buffer and reconnects.

>>> from skewwatch.client import RequestEventProducer
>>> RequestEventProducer.__module__
'skewwatch.client.request_producer'
"""

from __future__ import annotations

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.client.request_producer import RequestEventProducer

__all__ = ["BoundedProducer", "RequestEventProducer"]
