"""Per-replica and per-model gauges for dashboards and alerting rules, set once per model step.

The Grafana dashboard (``docker/grafana/skewwatch.json``) and the Prometheus rules
(``docker/prometheus/rules.yml``) read these; the feature vectors on Kafka stay the full record.
They are set by stage 2 when a model's step is decided (every 5 s of event time), never per
request event, so the hot path does not pay for them. Cardinality is bounded by the fleet: one
series per (model, replica) and gauge, and a replica that leaves a model's steps has its series
removed at that model's next step.

>>> from prometheus_client import CollectorRegistry
>>> from skewwatch.pipeline.features import FeatureVector
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

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.telemetry import TelemetrySample

# (gauge attribute, quantile label or None, how to read the value from (features, telemetry sample))
_Reader = tuple[str, str | None, Any]


def _fv(name: str) -> Any:
    return lambda fv, sample: getattr(fv, name, None)


def _sample(name: str) -> Any:
    return lambda fv, sample: None if sample is None else getattr(sample, name, None)


_READERS: list[_Reader] = [
    ("latency", "0.5", _fv("latency_p50")),
    ("latency", "0.99", _fv("latency_p99")),
    ("tpot", "0.5", _fv("tpot_p50")),
    ("tpot", "0.99", _fv("tpot_p99")),
    ("rps", None, _fv("rps")),
    ("batch_fill", None, _fv("batch_fill_mean")),
    ("gpu_utilization", None, _sample("utilization_gpu")),
    ("kv_cache_usage", None, _sample("kv_cache_usage")),
]


class ReplicaGauges:
    """The dashboard's per-replica series and the rules' per-model ones (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "replica"]
        self.latency = Gauge("skewwatch_replica_latency_ms", "End-to-end latency quantile over the 60 s window",
                             [*labels, "quantile"], registry=registry)
        self.tpot = Gauge("skewwatch_replica_tpot_ms", "Time per output token quantile over the 60 s window",
                          [*labels, "quantile"], registry=registry)
        self.rps = Gauge("skewwatch_replica_requests_per_second", "Requests finished per second over the window",
                         labels, registry=registry)
        self.batch_fill = Gauge("skewwatch_replica_batch_fill", "Mean batch_size / batch_capacity over the window",
                                labels, registry=registry)
        self.gpu_utilization = Gauge("skewwatch_replica_gpu_utilization",
                                     "GPU utilisation of the replica's newest telemetry sample (0..1)", labels,
                                     registry=registry)
        self.kv_cache_usage = Gauge("skewwatch_replica_kv_cache_usage",
                                    "KV-cache usage of the replica's newest engine sample (0..1)", labels,
                                    registry=registry)
        self.panic = Gauge("skewwatch_model_panic", "1 while the model's corrections are in panic mode", ["model"],
                           registry=registry)
        self.last_correction = Gauge("skewwatch_model_last_correction_timestamp_seconds",
                                     "Wall-clock time the model's latest routing correction was published",
                                     ["model"], registry=registry)
        self._series: dict[str, set[tuple[str, str, str | None]]] = {}  # model -> (gauge, replica, quantile)

    def observe_step(self, model: str, replicas: Iterable[FeatureVector],
                     telemetry: Mapping[str, tuple[TelemetrySample, float]], mode: str,
                     published_at: float | None) -> None:
        """Set the model's gauges from one decided step; remove the series of replicas no longer in it."""
        current: set[tuple[str, str, str | None]] = set()
        for fv in replicas:
            replica = str(fv.replica)
            found = telemetry.get(replica)
            sample = found[0] if found is not None else None
            for attr, quantile, read in _READERS:
                value = read(fv, sample)
                if value is None:
                    continue
                gauge: Gauge = getattr(self, attr)
                child = gauge.labels(model, replica, quantile) if quantile else gauge.labels(model, replica)
                child.set(float(value))
                current.add((attr, replica, quantile))
        for attr, replica, quantile in self._series.get(model, set()) - current:
            gauge = getattr(self, attr)
            labels = (model, replica, quantile) if quantile else (model, replica)
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
        self._series[model] = current
        self.panic.labels(model).set(1.0 if mode == "panic" else 0.0)
        if published_at is not None:
            self.last_correction.labels(model).set(published_at)


__all__ = ["ReplicaGauges"]
