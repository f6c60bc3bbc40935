"""Traffic shapes: a bundled trace at a multiple of its base rate, on the engine that can serve it.

Detectors and weights must hold on traffic nobody tuned them for, so the benchmarks run every
scenario on several *shapes*: the Azure 2023 ``conv`` and ``code`` traces and the long-context
``mooncake`` synthetic trace, each at 1x, 0.1x and 3x its base rate. A shape keeps the trace's
lengths and the form of its arrivals (the trace's own inter-arrival times, time-scaled); only
the rate changes.

**Rate.** A trace's absolute rate belongs to a fleet of unknown size; what a replica sees is its
share. A shape's 1x rate per replica is :data:`BASE_LOAD` (0.25) of what one simulated replica
sustains on that trace (:func:`~skewwatch.sim.fleet.replica_capacity_rps`): conv 1.0, code 1.9
and mooncake 0.25 requests/s per replica. 3x triples it (load 0.75: queues stay bounded on
clean replicas), 0.1x divides it by ten (load 0.025: a few requests per replica per minute on
conv, one every 40 s on mooncake, where every rule runs on thin evidence). Pools keep their size,
so 3x means three times the requests/s per replica, not more replicas.

**Engine.** conv and code run on the simulator's default engine (a 70B-class model, FP8, one
80 GB H100-class GPU: 52k tokens of KV cache). Mooncake's prompts (mean 15k, P99 66k, max 191k
tokens) do not fit that cache: its shape runs on :data:`LONG_CONTEXT_ENGINE`, the same model and
per-token costs on a 141 GB H200-class GPU, whose 68 GiB left after weights, runtime and margin
hold 440k tokens at 160 KiB each (docs/simulator.md).

>>> [s.name for s in SHAPES.values()][:3]
['conv@1x', 'conv@0.1x', 'conv@3x']
>>> conv = SHAPES["conv@1x"]
>>> round(conv.rate_per_replica, 2), round(SHAPES["conv@3x"].load, 2)
(1.01, 0.75)
>>> round(SHAPES["mooncake@1x"].rate_per_replica, 3), SHAPES["mooncake@1x"].engine["kv_capacity_tokens"]
(0.245, 440000)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skewwatch.sim.fleet import GIB, FleetConfig, replica_capacity_rps
from skewwatch.sim.trace import Trace, load_trace

BASE_LOAD = 0.25  # a shape's 1x rate: this share of a replica's capacity on its trace
SCALES: tuple[float, ...] = (1.0, 0.1, 3.0)
#: A 141 GB H200-class GPU with the default engine's model and per-token costs: 140 GiB usable,
#: minus 66 GiB of weights, 4 GiB runtime and 2 GiB margin = 68 GiB of KV at 160 KiB a token.
LONG_CONTEXT_ENGINE: Mapping[str, Any] = {"kv_capacity_tokens": 440_000, "gpu_memory_total_bytes": 140.0 * GIB}
TRACE_ENGINES: Mapping[str, Mapping[str, Any]] = {"conv": {}, "code": {}, "mooncake": LONG_CONTEXT_ENGINE}


@functools.lru_cache(maxsize=16)
def _capacity(trace: str, engine: tuple[tuple[str, Any], ...]) -> float:
    return replica_capacity_rps(FleetConfig(**dict(engine)), load_trace(trace))


@dataclass(frozen=True, slots=True)
class Shape:
    """A bundled trace at ``scale`` x its 1x rate, on the engine its lengths need."""

    trace_name: str
    scale: float = 1.0
    engine: Mapping[str, Any] = field(default_factory=dict)  # FleetConfig fields that differ from the defaults

    @property
    def name(self) -> str:
        return f"{self.trace_name}@{self.scale:g}x"

    @property
    def trace(self) -> Trace:
        return load_trace(self.trace_name)

    @property
    def capacity_rps(self) -> float:
        """Requests/s one replica sustains on this trace and engine (full batch, mean lengths)."""
        return _capacity(self.trace_name, tuple(sorted(self.engine.items())))

    @property
    def rate_per_replica(self) -> float:
        """Requests/s each replica receives at this shape."""
        return self.scale * BASE_LOAD * self.capacity_rps

    @property
    def load(self) -> float:
        """Share of a replica's estimated capacity this rate uses."""
        return self.scale * BASE_LOAD

    def fleet_config(self, **fields: Any) -> FleetConfig:
        """A :class:`FleetConfig` with this shape's trace and engine; ``fields`` set the rest."""
        return FleetConfig(trace=self.trace, **{**dict(self.engine), **fields})

    def describe(self) -> dict[str, Any]:
        """The shape's numbers, for reports."""
        trace = self.trace
        return {"trace": self.trace_name, "scale": self.scale, "load": round(self.load, 4),
                "rate_per_replica": round(self.rate_per_replica, 4), "capacity_rps": round(self.capacity_rps, 4),
                "prompt_p50": trace.prompt_quantile(0.5), "prompt_p90": trace.prompt_quantile(0.9),
                "engine": {k: v for k, v in self.engine.items()}}


def make_shape(name: str) -> Shape:
    """``TRACE@SCALEx`` (e.g. ``mooncake@0.1x``; ``TRACE`` alone is 1x) for a bundled trace.

    >>> make_shape("code@3x").rate_per_replica == 3 * make_shape("code").rate_per_replica
    True
    """
    trace, _, scale = name.partition("@")
    if trace not in TRACE_ENGINES:
        raise ValueError(f"shape {name!r}: unknown trace {trace!r} (known: {', '.join(TRACE_ENGINES)})")
    try:
        factor = float(scale.rstrip("x")) if scale else 1.0
    except ValueError as exc:
        raise ValueError(f"shape {name!r}: the scale is a number followed by x, e.g. {trace}@0.1x") from exc
    if not factor > 0:
        raise ValueError(f"shape {name!r}: the scale must be > 0")
    return Shape(trace, factor, dict(TRACE_ENGINES[trace]))


#: Every shape of the benchmarks: each trace at each of :data:`SCALES`.
SHAPES: dict[str, Shape] = {s.name: s for s in (make_shape(f"{t}@{k:g}x") for t in TRACE_ENGINES for k in SCALES)}
