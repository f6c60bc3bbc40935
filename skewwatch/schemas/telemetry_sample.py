"""One GPU / engine telemetry sample (contract ``gpu-telemetry.v1``), as plain data.

Every measurement is optional: ``None`` means the source did not report it (unknown),
never zero. Field names follow what NVML, DCGM exporter and the engines expose; units are
in the names (bytes, watts, degrees Celsius) or 0..1 ratios.

>>> s = TelemetrySample(ts=1.0, replica="r1", source="nvml", memory_used_bytes=8e9, memory_total_bytes=16e9)
>>> s.memory_ratio
0.5
>>> s.fragmentation is None
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

TELEMETRY_SCHEMA_VERSION = 1
TELEMETRY_SOURCES = ("nvml", "dcgm", "vllm", "sglang", "tgi", "llamacpp", "simulated")


@dataclass(slots=True)
class TelemetrySample:
    ts: float  # epoch seconds when sampled
    replica: str
    source: str  # one of TELEMETRY_SOURCES
    node: str | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    utilization_gpu: float | None = None  # 0..1
    power_w: float | None = None
    temperature_c: float | None = None
    throttle_reasons: int | None = None  # NVML clocks-event-reasons bitmask
    ecc_uncorrected_total: int | None = None  # volatile uncorrected (DBE) ECC errors, counter
    xid_last: int | None = None  # most recent XID error code
    xid_count_5m: int | None = None  # XID errors in the last 5 minutes
    queue_length: int | None = None  # waiting requests (engine)
    running_requests: int | None = None  # running batch (engine)
    kv_cache_usage: float | None = None  # 0..1
    kv_cache_hit_rate: float | None = None  # 0..1
    preemptions_total: int | None = None  # counter
    memory_reserved_bytes: float | None = None  # torch caching allocator, reserved
    memory_allocated_bytes: float | None = None  # torch caching allocator, allocated
    batch_capacity: int | None = None  # engine's max running batch (vLLM --max-num-seqs), v1.1
    # v1.3, live per-token latencies since the previous sample (the delta of the engine's histograms,
    # skewwatch.collect.histogram): output tokens after the first (vllm:time_per_output_token_seconds) ...
    tpot_count: int | None = None
    tpot_mean_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    # ... and first tokens (vllm:time_to_first_token_seconds), seen as they are produced, not at finish
    ttft_count: int | None = None
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    v: int = TELEMETRY_SCHEMA_VERSION

    @property
    def memory_ratio(self) -> float | None:
        """memory_used / memory_total clamped to [0, 1]; None when either is unknown."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return min(max(self.memory_used_bytes / self.memory_total_bytes, 0.0), 1.0)

    @property
    def fragmentation(self) -> float | None:
        """1 - allocated / reserved (seed §2.4); None when the source gives not both."""
        if self.memory_allocated_bytes is None or not self.memory_reserved_bytes:
            return None
        return min(max(1.0 - self.memory_allocated_bytes / self.memory_reserved_bytes, 0.0), 1.0)

    def to_dict(self) -> dict[str, Any]:
        """Wire form: fields that are unknown are left out rather than sent as null."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TelemetrySample:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
