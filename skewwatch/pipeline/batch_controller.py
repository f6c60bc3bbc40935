"""The seed's request-level dynamic batch-size controller (seed §4.2).

Seed (Go)::

    base := int(math.Max(1, math.Min(32, float64(queueLen))))
    if gpuUtil < 0.4 && p95LatencyMs > 120 { return int(float64(base) * 0.7) }        // cut latency
    if gpuUtil > 0.85 && p95LatencyMs < 80 { return int(math.Min(64, float64(base)*1.3)) } // push throughput
    return base

Reproduced exactly (truncation included) with one guard: the result is never below 1 (the
seed's ``int(1 * 0.7)`` is 0, a batch size no scheduler accepts). When GPU utilisation or P95
is unknown neither adjustment applies (no claim without the signal): the answer is ``base``.

>>> recommend_batch_size(queue_length=10, gpu_util=0.3, latency_p95_ms=150.0)
7
>>> recommend_batch_size(queue_length=50, gpu_util=0.9, latency_p95_ms=60.0)
41
>>> recommend_batch_size(queue_length=0, gpu_util=None, latency_p95_ms=None)
1
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchControllerConfig:
    queue_cap: float = 32.0  # base = clamp(queue_len, 1, 32)
    max_batch_size: float = 64.0  # growth is capped here
    low_util: float = 0.4  # shrink when util < 0.4 ...
    high_p95_ms: float = 120.0  # ... and P95 > 120 ms
    shrink: float = 0.7
    high_util: float = 0.85  # grow when util > 0.85 ...
    low_p95_ms: float = 80.0  # ... and P95 < 80 ms
    grow: float = 1.3


def recommend_batch_size(
    queue_length: float,
    gpu_util: float | None,
    latency_p95_ms: float | None,
    config: BatchControllerConfig | None = None,
) -> int:
    """The recommended max batch size for a replica (seed §4.2)."""
    cfg = config or BatchControllerConfig()
    if math.isnan(queue_length):
        queue_length = 1.0
    base = int(max(1.0, min(cfg.queue_cap, queue_length)))
    if gpu_util is None or latency_p95_ms is None:
        return base
    if gpu_util < cfg.low_util and latency_p95_ms > cfg.high_p95_ms:
        return max(1, int(base * cfg.shrink))
    if gpu_util > cfg.high_util and latency_p95_ms < cfg.low_p95_ms:
        return max(1, int(min(cfg.max_batch_size, base * cfg.grow)))
    return base
