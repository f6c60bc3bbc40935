"""The worker's Prometheus metrics, in one registry per worker (so tests can run several)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from skewwatch.agents.replica_gauges import ReplicaGauges


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events_in = Counter("skewwatch_events_in_total", "Request events accepted into the windows",
                                 registry=r)
        self.messages_in = Counter("skewwatch_messages_in_total", "Kafka messages consumed", ["topic"],
                                   registry=r)
        self.rejected = Counter("skewwatch_rejected_total",
                                "Rejected input (events or whole messages), sent to the dead-letter topic",
                                ["reason"], registry=r)
        self.late = Counter("skewwatch_late_events_total",
                            "Events whose 5 s bucket had already closed (counted, not applied)", registry=r)
        self.telemetry_in = Counter("skewwatch_telemetry_samples_total", "GPU telemetry samples accepted",
                                    registry=r)
        self.telemetry_held = Gauge("skewwatch_telemetry_held",
                                    "Telemetry samples held back (more than [window] telemetry_ahead_s ahead of "
                                    "the requests' watermark; their partitions are paused)", registry=r)
        self.steps_forced = Counter("skewwatch_model_steps_forced_total",
                                    "Per-model steps stage 2 released before every input partition reported, "
                                    "because it held too many replica steps (memory bound)", registry=r)
        self.consumer_lag = Gauge("skewwatch_consumer_lag", "Messages behind the end of the partition",
                                  ["topic", "partition"], registry=r)
        self.step_duration = Histogram("skewwatch_step_duration_seconds",
                                       "Wall time to compute and publish one 5 s step", ["stage"],
                                       buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                                       registry=r)
        self.features_out = Counter("skewwatch_features_published_total", "Feature vectors published",
                                    ["scope"], registry=r)
        self.alerts_out = Counter("skewwatch_alerts_published_total", "Alert events published",
                                  ["detector", "severity", "state"], registry=r)
        self.open_alerts = Gauge("skewwatch_open_alerts", "Alerts currently open",
                                 ["detector", "severity"], registry=r)
        self.weight = Gauge("skewwatch_weight", "Current routing weight", ["model", "replica"], registry=r)
        self.corrections_out = Counter("skewwatch_corrections_published_total",
                                       "Routing corrections published", registry=r)
        self.checkpoints = Counter("skewwatch_checkpoints_total", "State snapshots written", ["stage"],
                                   registry=r)
        self.batch_derived = Counter("skewwatch_batch_derived_total",
                                     "Request events whose batch size was derived from telemetry "
                                     "(contract v1.1: the event had none)", registry=r)
        self.batch_unknown = Counter("skewwatch_batch_unknown_total",
                                     "Request events left without a batch size (none reported, no fresh "
                                     "running_requests telemetry): skipped by the batch statistics", registry=r)
        self.otlp_spans_skipped = Counter("skewwatch_otlp_spans_skipped_total",
                                          "OTLP spans that are not inference requests, by reason (span_kind, "
                                          "not_inference, incomplete_tokens, no_model)", ["reason"], registry=r)
        self.otlp_spans_in = Counter("skewwatch_otlp_spans_total", "OTLP spans read from topics.otlp_spans",
                                     registry=r)
        self.otlp_events_out = Counter("skewwatch_otlp_events_published_total",
                                       "Request events decoded from OTLP spans and published on the requests topic",
                                       registry=r)
        self.republish_skipped = Counter("skewwatch_republish_skipped_total",
                                         "Decisions of a step replayed after a restore that were on their topic "
                                         "already (not published again), by kind (correction, alert)", ["kind"],
                                         registry=r)
        self.watermark = Gauge("skewwatch_watermark_seconds", "Event-time watermark per input partition",
                               ["partition"], registry=r)
        self.ready = Gauge("skewwatch_worker_ready",
                           "1 while the worker is ready (GET /readyz: broker, partitions, lag)", registry=r)
        self.replicas = ReplicaGauges(r)  # per-replica and per-model series, from each model's last decided step

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
