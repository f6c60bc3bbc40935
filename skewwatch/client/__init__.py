"""What runs in the fleet's own processes: publishing request events to the worker, and reading its
routing corrections.

* :class:`RequestEventProducer` (``request_producer.py``): an inference server records one event per
  finished request, from synchronous or asyncio code, without ever blocking its serving loop;
* :class:`BoundedProducer` (``bounded_producer.py``): the Kafka producer under it (and under the
  telemetry collectors of :mod:`skewwatch.collect`), with a bounded buffer and reconnects;
* :class:`CorrectionsSubscriber` (``corrections.py``): a scheduler's view of the routing corrections,
  fail-static. Imported on first use, so a producer does not load what the subscriber needs.

>>> from skewwatch.client import RequestEventProducer
>>> RequestEventProducer.__module__
'skewwatch.client.request_producer'
>>> from skewwatch.client import CorrectionsSubscriber
>>> CorrectionsSubscriber.__module__
'skewwatch.client.corrections'
"""

from __future__ import annotations

import importlib
from typing import Any

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.client.request_producer import RequestEventProducer

_LAZY = {
    "Change": "skewwatch.client.corrections",
    "ChangeStream": "skewwatch.client.corrections",
    "CorrectionsError": "skewwatch.client.corrections",
    "CorrectionsSubscriber": "skewwatch.client.corrections",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skewwatch.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["BoundedProducer", "RequestEventProducer", *sorted(_LAZY)]
