"""XID errors of one GPU within a sliding window: the ``xid_last`` / ``xid_count_5m`` fields.

The collector turns NVML critical-XID events into samples; ``gpu_health`` drains a replica on
XID 48/79/94/95 (hardware faults: health 0, seed §4.3). A count over the last 5 minutes (DCGM exporter's
``DCGM_EXP_XID_ERRORS_COUNT`` default window) keeps one event visible for several sampling
intervals without latching a replica as broken forever, which a bare "last XID" would do.
``xid_last`` is the most recent code still inside the window. Pure: time is passed in.

>>> w = XidWindow(window_s=300.0)
>>> w.record(79, ts=1000.0); w.record(13, ts=1100.0)
>>> w.count(now=1200.0), w.last(now=1200.0)
(2, 13)
>>> w.count(now=1350.0), w.last(now=1350.0)   # the XID 79 at t=1000 left the window
(1, 13)
>>> w.count(now=1500.0), w.last(now=1500.0)
(0, None)
"""

from __future__ import annotations

from collections import deque


class XidWindow:
    """XID codes seen in the last ``window_s`` seconds, oldest first."""

    def __init__(self, window_s: float = 300.0, max_events: int = 10_000) -> None:
        self.window_s = window_s
        # bounded: a GPU storming XIDs must not grow memory; the count saturates at max_events
        self._events: deque[tuple[float, int]] = deque(maxlen=max_events)

    def record(self, xid: int, ts: float) -> None:
        self._events.append((ts, xid))

    def _evict(self, now: float) -> None:
        horizon = now - self.window_s
        while self._events and self._events[0][0] <= horizon:
            self._events.popleft()

    def count(self, now: float) -> int:
        self._evict(now)
        return len(self._events)

    def last(self, now: float) -> int | None:
        self._evict(now)
        return self._events[-1][1] if self._events else None
