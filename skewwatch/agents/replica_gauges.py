"""Per-replica and per-model gauges for dashboards and alerting rules, read from the last decided step.

The Grafana dashboard (``docker/grafana/skewwatch.json``) and the Prometheus rules
(``docker/prometheus/rules.yml``) read these; the feature vectors on Kafka stay the full record.
Stage 2 hands each decided model step over (:meth:`ReplicaGauges.observe_step`: it keeps a reference,
nothing per replica), and the series are built when Prometheus scrapes (a custom collector), so
the hot path pays nothing per replica and a step of 10k replicas costs no more than one of 10.
Cardinality follows the fleet: a replica appears while it is in its model's last step, and a
model whose steps stopped for ``expire_s`` (90 s of wall clock: it moved to another worker, or its
traffic stopped) drops its per-replica series and its panic flag. The last-correction timestamp
stays, so a rule can see how long ago it was.

>>> from prometheus_client import CollectorRegistry
>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> registry = CollectorRegistry()
>>> gauges = ReplicaGauges(registry)
>>> gauges.observe_step("m", [FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=3,
...                                         latency_p99=900.0)], {}, mode="normal", published_at=None)
>>> registry.get_sample_value("skewwatch_replica_latency_ms", {"model": "m", "replica": "r1", "quantile": "0.99"})
900.0
>>> gauges.observe_step("m", [], {}, mode="panic", published_at=None)  # r1 left: its series go
>>> registry.get_sample_value("skewwatch_replica_latency_ms", {"model": "m", "replica": "r1", "quantile": "0.99"})
>>> registry.get_sample_value("skewwatch_model_panic", {"model": "m"})
1.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

DEFAULT_EXPIRE_S = 90.0

# name, help, quantile label or None, where the value comes from ("fv" feature vector, "tel" telemetry), field
_SERIES: list[tuple[str, str, str | None, str, str]] = [
    ("skewwatch_replica_latency_ms", "End-to-end latency quantile over the 60 s window (ms)", "0.5", "fv",
     "latency_p50"),
    ("skewwatch_replica_latency_ms", "", "0.99", "fv", "latency_p99"),
    ("skewwatch_replica_tpot_ms", "Time per output token quantile over the 60 s window (ms/token)", "0.5", "fv",
     "tpot_p50"),
    ("skewwatch_replica_tpot_ms", "", "0.99", "fv", "tpot_p99"),
    ("skewwatch_replica_requests_per_second", "Requests finished per second over the window", None, "fv", "rps"),
    ("skewwatch_replica_batch_fill", "Mean batch_size / batch_capacity over the window", None, "fv",
     "batch_fill_mean"),
    ("skewwatch_replica_gpu_utilization", "GPU utilisation of the replica's newest telemetry sample (0..1)", None,
     "tel", "utilization_gpu"),
    ("skewwatch_replica_kv_cache_usage", "KV-cache usage of the replica's newest engine sample (0..1)", None, "tel",
     "kv_cache_usage"),
]


@dataclass(slots=True)
class _ModelStep:
    replicas: Sequence[FeatureVector]
    telemetry: Mapping[str, tuple[TelemetrySample, float]]
    panic: bool
    seen: float  # monotonic


class ReplicaGauges(Collector):
    """The dashboard's per-replica series and the rules' per-model ones (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None, expire_s: float = DEFAULT_EXPIRE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.expire_s = expire_s
        self.clock = clock
        self._steps: dict[str, _ModelStep] = {}
        self._last_correction: dict[str, float] = {}
        if registry is not None:
            registry.register(self)

    def observe_step(self, model: str, replicas: Sequence[FeatureVector],
                     telemetry: Mapping[str, tuple[TelemetrySample, float]], mode: str,
                     published_at: float | None) -> None:
        """Keep the model's newest decided step (references only; read at the next scrape)."""
        self._steps[model] = _ModelStep(replicas, telemetry, mode == "panic", self.clock())
        if published_at is not None:
            self._last_correction[model] = published_at

    def describe(self) -> list[Any]:
        return []  # series appear with the fleet; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for name, help_text, quantile, _, _ in _SERIES:
            if name not in families:
                labels = ["model", "replica", "quantile"] if quantile else ["model", "replica"]
                families[name] = GaugeMetricFamily(name, help_text, labels=labels)
        panic = GaugeMetricFamily("skewwatch_model_panic", "1 while the model's corrections are in panic mode",
                                  labels=["model"])
        last = GaugeMetricFamily("skewwatch_model_last_correction_timestamp_seconds",
                                 "Wall-clock time the model's latest routing correction was published",
                                 labels=["model"])
        now = self.clock()
        for model, step in list(self._steps.items()):
            if now - step.seen > self.expire_s:
                del self._steps[model]
                continue
            panic.add_metric([model], 1.0 if step.panic else 0.0)
            for fv in step.replicas:
                replica = str(fv.replica)
                found = step.telemetry.get(replica)
                for name, _, quantile, source, field in _SERIES:
                    holder: Any = fv if source == "fv" else (found[0] if found is not None else None)
                    value = getattr(holder, field, None) if holder is not None else None
                    if value is None or value != value:  # unknown, or NaN
                        continue
                    labels = [model, replica, quantile] if quantile else [model, replica]
                    families[name].add_metric(labels, float(value))
        for model, ts in self._last_correction.items():
            last.add_metric([model], ts)
        yield from families.values()
        yield panic
        yield last


__all__ = ["ReplicaGauges"]
