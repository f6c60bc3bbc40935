"""The simulated fleet's configuration: every constant of its engines and traffic, and what follows
from them alone (a replica's capacity on a trace, a request's latency on an idle replica).

:mod:`skewwatch.sim.fleet` runs the engine model these constants describe; the capacity estimate
turns a ``load`` into an arrival rate, and the unloaded latency is the ``long_tail`` fault's median
before a replica has finished enough requests of its own.

>>> config = FleetConfig(replicas=2, load=0.5)
>>> replica_ids(config), round(unloaded_latency_s(config, 1020, 129), 2)
([('llama-3-70b', 'r0'), ('llama-3-70b', 'r1')], 2.92)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skewwatch.sim.faults import Injection, check_targets
from skewwatch.sim.generator import replica_ids
from skewwatch.sim.router import POLICIES
from skewwatch.sim.trace import Trace

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Every constant of the simulated fleet; defaults: a 70B-class model, FP8, one H100 80 GB each."""

    models: tuple[str, ...] = ("llama-3-70b",)
    replicas: int = 4  # per model
    replica_prefix: str = "r"
    policy: str = "round_robin"  # round_robin | least_connections | dynamic | dynamic_least_request
    # -- engine (per replica)
    max_batch: int = 32  # batch_capacity: max running sequences
    kv_capacity_tokens: int = 52_000  # ~8 GiB of FP8 KV at 160 KiB/token (80 layers x 8 KV heads x 128 x 2)
    kv_bytes_per_token: float = 160.0 * 1024
    prefill_ms_per_token: float = 0.2  # ~5k prompt tokens/s: 140 GFLOP/token at ~700 TFLOP/s effective
    decode_base_ms: float = 22.0  # one pass over ~66 GiB of weights at ~3.3 TB/s
    decode_per_seq_ms: float = 0.15  # per running sequence (sampling, scheduling, small GEMM growth)
    decode_per_context_token_ms: float = 5e-5  # KV read: 160 KiB per context token at ~3.3 TB/s
    kv_hit_rate_mean: float = 0.75  # prefix-cache hit share of prompt tokens ~ Beta(mean, concentration)
    kv_hit_rate_concentration: float = 40.0
    gpu_memory_total_bytes: float = 80.0 * GIB
    model_memory_bytes: float = 66.0 * GIB
    runtime_memory_bytes: float = 4.0 * GIB  # activations, CUDA graphs, allocator slack
    idle_power_w: float = 90.0
    max_power_w: float = 700.0
    # -- traffic
    load: float = 0.8  # target share of the fleet's estimated capacity (ignored when rate is set)
    rate: float | None = None  # fleet requests/s; None: load x capacity
    model_rates: tuple[float, ...] | None = None  # requests/s per model (in models order); overrides both
    trace: Trace | None = field(default=None, compare=False)  # None: the bundled "conv" trace
    seed: int = 0
    injections: tuple[Injection, ...] = ()
    telemetry: bool = True
    live_signals: bool = True  # telemetry carries the engine's live gauges and latency histograms
    drain_s: float = 600.0  # after the end, in-flight requests get this long to finish, then fail

    def __post_init__(self) -> None:
        if not self.models or len(set(self.models)) != len(self.models):
            raise ValueError(f"models: give one or more distinct names, got {self.models!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r} (known: {', '.join(POLICIES)})")
        if self.replicas < 1 or self.max_batch < 1 or self.kv_capacity_tokens < 1:
            raise ValueError("replicas, max_batch and kv_capacity_tokens must be positive")
        if self.rate is None and not self.load > 0:
            raise ValueError(f"load must be > 0, got {self.load}")
        if self.model_rates is not None and (len(self.model_rates) != len(self.models)
                                             or not all(r > 0 for r in self.model_rates)):
            raise ValueError(f"model_rates: one rate > 0 per model ({len(self.models)}), got {self.model_rates!r}")
        check_targets(self.injections, replica_ids(self))


def replica_capacity_rps(config: FleetConfig, trace: Trace) -> float:
    """Requests/s one replica sustains on this trace's mean lengths with a full batch (estimate).

    >>> from skewwatch.sim.trace import load_trace
    >>> round(replica_capacity_rps(FleetConfig(), load_trace("conv")), 2)
    4.03
    """
    prompt = float(trace.prompt_tokens.mean())
    completion = max(float(trace.completion_tokens.mean()), 1.0)
    batch = max(min(float(config.max_batch), config.kv_capacity_tokens / max(prompt + completion, 1.0)), 1.0)
    step_ms = (config.decode_base_ms + config.decode_per_seq_ms * batch
               + config.decode_per_context_token_ms * batch * (prompt + completion / 2))
    service_ms = prompt * (1 - config.kv_hit_rate_mean) * config.prefill_ms_per_token + completion * step_ms / batch
    return 1000.0 / service_ms


def unloaded_latency_s(config: FleetConfig, prompt: float, completion: float) -> float:
    """Seconds one request of these lengths takes alone on an idle replica (prefill of its uncached
    share, then one decode step per token at batch 1).

    >>> round(unloaded_latency_s(FleetConfig(), 1020, 129), 2)
    2.92
    """
    prefill_ms = prompt * (1.0 - config.kv_hit_rate_mean) * config.prefill_ms_per_token
    step_ms = (config.decode_base_ms + config.decode_per_seq_ms
               + config.decode_per_context_token_ms * (prompt + completion / 2.0))
    return (prefill_ms + max(completion, 1.0) * step_ms) / 1000.0
