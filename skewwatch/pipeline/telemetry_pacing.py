"""Telemetry paced by the requests' watermark: samples too far ahead wait, their partition paused.

Stage 1 reads ``llm.gpu-telemetry`` and ``llm.requests`` in the same consumer. In steady state both
move together, but after a restart or an outage the worker catches up on a backlog, and telemetry
(a few small samples per replica per interval) is fetched far faster than requests: the join's
bounded history (:class:`~skewwatch.pipeline.telemetry_join.TelemetryJoin`, 23 samples per key,
110 s at the 5 s interval, sized for this flow control) would then hold only samples from minutes
*after* the steps being closed, and those steps would see their telemetry as stale.

:class:`TelemetryPacer` sits between the fetch and the join. A sample more than ``ahead_s`` of event
time past the requests' watermark is *held* (in partition order) instead of joined, and its
partition is paused while it holds anything, so at most one fetch per partition waits in memory;
held samples are released to the join as the watermark comes within reach, and the partition is
resumed once it holds nothing. Telemetry and requests are both keyed by replica, so telemetry
partition p carries the replicas of request partition p, and p's samples wait for p's watermark.
Until a request has been seen (no watermark) nothing is held: telemetry alone must not stall.

Pure: the caller applies the pause/resume sets with the consumer's ``pause``/``resume``.

>>> flow = TelemetryPacer[str](ahead_s=60.0)
>>> flow.offer(0, [(1_000.0, "a"), (1_050.0, "b")], watermark=950.0)
['a']
>>> flow.pause_resume()
(frozenset({0}), frozenset())
>>> flow.release(0, watermark=995.0)
['b']
>>> flow.pause_resume()
(frozenset(), frozenset({0}))
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

Sample = TypeVar("Sample")


class TelemetryPacer(Generic[Sample]):
    """Holds telemetry that runs more than ``ahead_s`` ahead of the requests' watermark."""

    def __init__(self, ahead_s: float = 60.0) -> None:
        if not ahead_s > 0 or math.isinf(ahead_s):
            raise ValueError(f"ahead_s must be a positive number of seconds, got {ahead_s}")
        self.ahead_s = ahead_s
        self.held: dict[int, deque[tuple[float, Sample]]] = {}  # partition -> samples in read order
        self._paused: set[int] = set()

    def __len__(self) -> int:
        return sum(len(q) for q in self.held.values())

    def offer(self, partition: int, samples: Iterable[tuple[float, Sample]], watermark: float | None) -> list[Sample]:
        """Samples ``(ts, sample)`` read from ``partition``: returns those to join now, holds the rest.

        Order within a partition is kept: once one sample is held, the ones after it wait too.
        """
        queue = self.held.get(partition)
        if queue is None:
            queue = self.held[partition] = deque()
        queue.extend(samples)
        return self._drain(partition, queue, watermark)

    def release(self, partition: int, watermark: float | None) -> list[Sample]:
        """Samples held for ``partition`` that are now within ``ahead_s`` of ``watermark``, in read order."""
        queue = self.held.get(partition)
        return self._drain(partition, queue, watermark) if queue is not None else []

    def forget(self, partition: int) -> None:
        """The partition was revoked: what it held goes with it (re-read wherever it is assigned)."""
        self.held.pop(partition, None)
        self._paused.discard(partition)

    def pause_resume(self) -> tuple[frozenset[int], frozenset[int]]:
        """Partitions to pause now (they hold samples) and to resume now (they no longer do)."""
        want = {p for p, q in self.held.items() if q}
        pause, resume = frozenset(want - self._paused), frozenset(self._paused - want)
        self._paused = want
        return pause, resume

    def _drain(self, partition: int, queue: deque[tuple[float, Sample]], watermark: float | None) -> list[Sample]:
        limit = math.inf if watermark is None else watermark + self.ahead_s
        out: list[Sample] = []
        while queue and queue[0][0] <= limit:
            out.append(queue.popleft()[1])
        if not queue:
            del self.held[partition]
        return out
