"""One model's decisions per 5 s step: detectors, health, weights and the routing correction.

The worker (stage 2, partitioned by model) calls :meth:`ModelDecider.step` once per model per
step with that step's per-replica feature vectors, the per-model vector and the latest
telemetry sample of each replica with its age. Everything here is pure: no clock (``now`` is
the step's ``window_end``), no I/O; the whole state is JSON-able (``state_dict`` /
``from_state``) so the worker checkpoints it with the input offset it reflects.

Per step, for every replica known to the model (seen in this step or an earlier one):

1. a replica without a summary this step is given an empty vector (count 0), so its alerts
   resolve and its silence is counted, instead of it being forgotten;
2. every enabled detector updates that replica's state; its telemetry is passed only when
   fresh (age <= ``[detectors.weights] telemetry_max_age_s``, 15 s), else None. A replica whose
   window holds no request is not judged by the detectors that read requests
   (``Detector.needs_traffic``): it has been silent for longer than the window, so their open
   alerts on it resolve with that reason (likewise the model-level alerts of a silent model);
3. health comes from the ``gpu_health`` detector, the formula's scores from
   :mod:`skewwatch.pipeline.weights` (:func:`~skewwatch.pipeline.weights.pool_weights`, the pool
   as columns), and the weights that go out from :mod:`skewwatch.pipeline.pool_evidence`: held
   scores, credibility, staleness and the pool's guards (ejection cap, panic, never all-zero);
4. the routing correction gets ``seq`` from event time and ``mode`` (``normal`` or ``panic``) from
   the guards, and is returned in ``StepDecision.correction`` only when
   :func:`~skewwatch.pipeline.corrections.should_publish` says so (change or 30 s heartbeat). The
   decider assumes that what it returns is published.

A replica silent for ``[detectors.decider] release_after_s`` (600 s) is released: its state is
dropped and it leaves the weights — unless every replica of the pool is that silent: a pool is
never emptied, it stays in panic mode and routes to all. A step whose ``window_end`` is not after
the last one is a duplicate (e.g. re-delivered after a rebalance): it changes nothing and returns
``skipped=True``.

Configuration: ``Settings.detectors`` (``[detectors.<name>]`` in TOML,
``SKEWWATCH_DETECTORS__<NAME>__<KEY>`` in the environment) holds one section per detector plus
``weights``, ``corrections`` and ``decider``:
:class:`~skewwatch.pipeline.detector_settings.DetectorSettings`.

>>> from skewwatch.pipeline.detector_settings import DetectorSettings
>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> decider = ModelDecider(DetectorSettings.from_overrides({"profile": "seed"}))  # the seed's rules: simplest
>>> def fv(r, end, p99=300.0):
...     return FeatureVector(model="m", replica=r, window_start=end - 60, window_end=end, count=100,
...                          step_count=5, latency_p50=100.0, latency_p99=p99, latency_mean=200.0)
>>> d = decider.step("m", 60.0, [fv("a", 60.0), fv("b", 60.0)], None, {})
>>> d.correction.seq, d.correction.weights
(60000, {'a': 0.5, 'b': 0.5})
>>> [decider.step("m", t, [fv("a", t, p99=900.0), fv("b", t)], None, {}).alerts for t in (65.0, 70.0)]
[[], []]
>>> d = decider.step("m", 75.0, [fv("a", 75.0, p99=900.0), fv("b", 75.0)], None, {})
>>> [(a.replica, a.detector, a.state) for a in d.alerts], [x.action for x in d.correction.actions]
([('a', 'long_tail', 'open')], ['enable_tracing'])
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, cast

import numpy as np

from skewwatch.gc_pause import gc_paused
from skewwatch.pipeline.capacity import CAPACITY_FIELDS, CAPACITY_TELEMETRY_FIELDS, capacity_weights, scale_by_speed
from skewwatch.pipeline.corrections import publish_reason, step_seq
from skewwatch.pipeline.demotion import AlertDemotions, demote
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.alerts import Action, Alert, Severity
from skewwatch.pipeline.detectors.base import Detector
from skewwatch.pipeline.detectors.gpu_health import GpuHealthDetector
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.failstatic import DETECTOR as POOL_DETECTOR
from skewwatch.pipeline.health import HEALTHY
from skewwatch.pipeline.pool_evidence import EJECTING_ACTIONS, STALE_DETECTOR, PoolEvidence
from skewwatch.pipeline.relative_speed import RelativeSpeed
from skewwatch.pipeline.weights import POOL_WEIGHT_FIELDS, POOL_WEIGHT_TELEMETRY_FIELDS, ReplicaWeight, pool_weights
from skewwatch.schemas.corrections import RoutingCorrection
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

DECIDER_STATE_VERSION = 1
_REPLICA, _MODEL, _WEIGHT = attrgetter("replica"), attrgetter("model"), attrgetter("weight")
_HEALTHY: tuple[float, str | None, str | None] = (1.0, None, None)  # a replica without a health note


@dataclass(slots=True)
class StepDecision:
    """What one model's step produced."""

    model: str
    window_end: float
    alerts: list[Alert]  # open/resolve transitions this step -> llm.alerts (pool-level ones: replica None)
    correction: RoutingCorrection | None  # publish this on llm.routing-corrections; None: nothing new
    current: RoutingCorrection | None  # the correction as of this step, published or not (GET /weights)
    weights: dict[str, ReplicaWeight]  # per replica, with reasons and components
    health: dict[str, float]  # per replica, 1.0 .. 0.0
    publish_reason: str | None = None  # first | replicas changed | weights changed | actions changed | ...
    skipped: bool = False  # a duplicate or out-of-order step: nothing was changed


@dataclass(slots=True)
class _Track:
    """A known replica's silence bookkeeping (for its release)."""

    last_seen: float | None = None  # last window_end with a request in its newest step
    first_seen: float = 0.0

    def last_heard(self) -> float:
        """The last step with a request, else the first step it was known in."""
        return self.last_seen if self.last_seen is not None else self.first_seen

    def to_dict(self) -> dict[str, Any]:
        return {"last_seen": self.last_seen, "first_seen": self.first_seen}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> _Track:
        return cls(data.get("last_seen"), float(data["first_seen"]))


class ModelDecider:
    """Everything one model does per step; pure, with JSON-able state."""

    def __init__(self, settings: DetectorSettings | None = None, model: str | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.model = model
        self.detectors = self.settings.build_detectors()
        self._tracks: dict[str, _Track] = {}
        self._order: list[str] | None = None  # sorted(self._tracks), kept between steps
        self._keys: list[str] | None = None  # the detectors' keys (model/replica) in that order
        self._track_list: list[_Track] | None = None  # the tracks in that order
        self._last_seq: int | None = None
        self._last_published: RoutingCorrection | None = None
        # event time of the step the last published correction reflects: the heartbeat counts
        # from here even when a forced publish was stamped with the wall clock
        self._last_published_step: float | None = None
        self._current: RoutingCorrection | None = None
        self._last_window_end: float | None = None
        self._last_weights: dict[str, ReplicaWeight] = {}
        self._last_health: dict[str, float] = {}
        self._open_alerts: dict[tuple[str, str], int] | None = None  # as of the last step (metrics)
        self._evidence = PoolEvidence()  # held scores, arrival rates, ejections, pool alerts
        # the replicas an open WARNING / CRITICAL alert demotes, and the holds of repeat demotions
        self._demotions = AlertDemotions(self.settings.weights)
        self._speed = RelativeSpeed()  # the capacity formula's long-horizon costs
        # the vectors' fields the step reads as columns, read in one pass (StepColumns.prefetch)
        weights_cfg = self.settings.weights
        speed_fields = weights_cfg.formula == "capacity" or weights_cfg.relative_speed
        self._step_fields = tuple(dict.fromkeys(
            ["count", *(POOL_WEIGHT_FIELDS if weights_cfg.formula == "seed" else ()),
             *(CAPACITY_FIELDS if speed_fields else ()),
             *(name for d in self.detectors.values() for name in d.step_fields())]))
        self._step_telemetry_fields = tuple(dict.fromkeys(
            [*POOL_WEIGHT_TELEMETRY_FIELDS, *(CAPACITY_TELEMETRY_FIELDS if speed_fields else ()),
             *(name for d in self.detectors.values() for name in d.step_telemetry_fields())]))

    # ------------------------------------------------------------------ the step

    def step(
        self,
        model: str,
        window_end: float,
        replica_features: Iterable[FeatureVector],
        model_features: FeatureVector | None,
        telemetry: Mapping[str, tuple[TelemetrySample, float]],
    ) -> StepDecision:
        """Run one step of ``model`` ending at ``window_end`` (event time, epoch seconds).

        ``telemetry`` maps replica -> (latest sample, its age in seconds at ``window_end``).
        """
        # A step makes several objects per replica (weights, their components, empty vectors,
        # columns) and none in a reference cycle: with the cyclic GC paused while they are made it
        # does not scan its young generation over and over, nor, at tens of thousands of replicas,
        # the whole heap of window and decider state (a cost per replica that would grow with the
        # fleet); the collector is back on right after the step.
        with gc_paused():
            return self._step(model, window_end, replica_features, model_features, telemetry)

    def _step(
        self,
        model: str,
        window_end: float,
        replica_features: Iterable[FeatureVector],
        model_features: FeatureVector | None,
        telemetry: Mapping[str, tuple[TelemetrySample, float]],
    ) -> StepDecision:
        if self.model is None:
            self.model = model
        elif model != self.model:
            raise ValueError(f"this decider belongs to model {self.model!r}, got {model!r}")
        if self._last_window_end is not None and window_end <= self._last_window_end:
            return StepDecision(
                model,
                window_end,
                [],
                None,
                self._current,
                dict(self._last_weights),
                dict(self._last_health),
                skipped=True,
            )
        self._last_window_end = window_end
        self._open_alerts = None
        now = window_end
        # (map and set operations rather than a Python loop per replica: this runs for every replica)
        features = replica_features if isinstance(replica_features, list) else list(replica_features)
        by_replica = cast(dict[str, FeatureVector], dict(zip(map(_REPLICA, features), features, strict=True)))
        if None in by_replica or set(map(_MODEL, features)) - {model}:
            wrong = next(fv for fv in features if fv.model != model or fv.replica is None)
            raise ValueError(f"step of model {model!r} got the vector of {wrong.key!r}")
        tracks = self._tracks
        if not by_replica.keys() <= tracks.keys():
            for replica in by_replica:  # in the order they came
                if replica not in tracks:
                    tracks[replica] = _Track(first_seen=now)
            self._order = None

        max_age = self.settings.weights.telemetry_max_age_s
        order = self._sorted_replicas()
        track_list = self._tracks_in_order()
        # per replica, in order: its vector (None: no summary this step), silence and fresh telemetry
        found: list[FeatureVector | None] = list(map(by_replica.get, order))
        silent: list[str] = []  # only these can be released below: the others were seen now
        for replica, track, fv_or_none in zip(order, track_list, found, strict=True):
            if fv_or_none is not None and fv_or_none.step_count > 0:
                track.last_seen = now
            else:
                silent.append(replica)
        summaries = list(found)  # None where a replica sent no summary (its telemetry is then unknown)
        if len(by_replica) < len(order):  # the known replicas without a summary get an empty vector
            window_start = now - self.settings.decider.window_s
            for row, (replica, fv_or_none) in enumerate(zip(order, found, strict=True)):
                if fv_or_none is None:
                    found[row] = FeatureVector(model=model, replica=replica, window_start=window_start,
                                                 window_end=now, count=0)
        vectors = cast(list[FeatureVector], found)  # every None replaced
        fresh_telemetry: list[TelemetrySample | None] = [None] * len(order)
        if telemetry:
            no_telemetry: tuple[None, None] = (None, None)
            for row, replica in enumerate(order):
                sample, age = telemetry.get(replica, no_telemetry)
                if sample is not None and age is not None and age <= max_age:
                    fresh_telemetry[row] = sample
        self._evidence.observe(now, order, summaries, fresh_telemetry, self.settings.weights,
                               self.settings.decider.window_s)
        columns = StepColumns(vectors, fresh_telemetry, self._replica_keys())
        columns.prefetch(self._step_fields, self._step_telemetry_fields)
        # detector by detector over the step (columns where a detector can), then back in the
        # order of one replica at a time, detectors in registry order. A replica whose window holds
        # no request is judged only by the detectors that do not read requests (gpu_health), and
        # the others' open alerts on it resolve: no traffic for longer than the window.
        alerts: list[Alert] = []
        actions: list[Action] = []
        empty = np.flatnonzero(columns.column("count") <= 0).tolist()
        judged = columns
        if empty:
            keep = [row for row, fv in enumerate(vectors) if fv.count > 0]
            judged = columns.take(keep)
        for detector in self.detectors.values():
            if empty and detector.needs_traffic:
                self._expire(detector, [(columns.keys[row], order[row], self._no_evidence(summaries[row], row, now))
                                        for row in empty], model, now, alerts)
                detector.update_step(judged, now, alerts, actions)
            else:
                detector.update_step(columns, now, alerts, actions)
        if alerts:
            self._demotions.track(alerts, now)
        if len(self.detectors) > 1 and alerts:
            position = {replica: i for i, replica in enumerate(order)}
            rank = {name: i for i, name in enumerate(self.detectors)}
            alerts.sort(key=lambda a: (position[a.replica or ""], rank[a.detector]))

        model_level = [self.detectors[name] for name in self.settings.decider.model_level if name in self.detectors]
        for detector in model_level:
            if model_features is not None and model_features.count > 0:
                alerts.extend(detector.update(model_features, None, now).alerts)
            elif detector.needs_traffic:
                self._expire(detector, [(model, None, "no request of the model in its window")], model, now,
                             alerts)

        release_after = self.settings.decider.release_after_s
        released = [r for r in silent if now - tracks[r].last_heard() >= release_after]
        if len(released) == len(order):
            released = []  # the whole pool is silent: it is kept (panic, routed to all), never emptied
        for replica in released:
            self.forget_replica(replica)
        if released:
            actions = [a for a in actions if a.replica in tracks]
            kept = [i for i, replica in enumerate(order) if replica in tracks]
            order = [order[i] for i in kept]
            summaries = [summaries[i] for i in kept]
            columns = columns.take(kept)
        health = self._health(now, columns.keys)
        if health.count(_HEALTHY) == len(health):  # the usual step (by identity: no tuple compared)
            score_notes: list[tuple[float, str | None]] = [(1.0, None)] * len(health)
            health_actions: list[str | None] = [None] * len(health)
            self._last_health = dict.fromkeys(order, 1.0)
        else:
            score_notes = [(score, note) for score, note, _ in health]
            health_actions = [action for _, _, action in health]
            self._last_health = dict(zip(order, [score for score, _, _ in health], strict=True))
        if self.settings.weights.formula == "capacity":
            weights = capacity_weights(columns, order, score_notes, self.settings.weights, self._speed, now,
                                       self.settings.decider.window_s)
        else:
            weights = pool_weights(columns, order, telemetry, score_notes, self.settings.weights)
            if self.settings.weights.relative_speed:
                weights = scale_by_speed(weights, columns, order, self.settings.weights, self._speed, now,
                                         self.settings.decider.window_s, phase=zlib.crc32(model.encode()) / 2**32)
        settled = self._evidence.settle(model, now, order, summaries, weights, health_actions,
                                        self.settings.weights)
        alerts.extend(settled.alerts)
        probation = [replica for replica in order if self._evidence.replicas[replica].probation]
        if (self._demotions.any(now) or probation) and settled.mode != "panic":
            self._demote(order, weights, now, set(probation))
        if settled.withdrawn:  # held back by the ejection cap, or routed anyway in panic
            actions = [a for a in actions if not (a.replica in settled.withdrawn and a.action in EJECTING_ACTIONS)]
        correction = RoutingCorrection(
            model=model,
            ts=now,
            seq=step_seq(now, self._last_seq),
            weights=dict(zip(weights, map(_WEIGHT, weights.values()), strict=True)),
            actions=sorted(actions, key=lambda a: (a.replica, a.action)),
            mode=settled.mode,
            mode_reason=settled.mode_reason,
            valid_for_s=self.settings.corrections.valid_for_s,
        )
        self._current = correction
        self._last_weights = weights
        cfg = self.settings.corrections
        prev = self._last_published
        if prev is not None and self._last_published_step is not None:
            prev = replace(prev, ts=self._last_published_step)
        reason = publish_reason(prev, correction, now, cfg.heartbeat_s, cfg.weight_epsilon)
        if reason is not None:
            self._published(correction, now)
        return StepDecision(
            model=model,
            window_end=window_end,
            alerts=alerts,
            correction=correction if reason is not None else None,
            current=correction,
            weights=weights,
            health=dict(self._last_health),
            publish_reason=reason,
        )

    def _no_evidence(self, summary: FeatureVector | None, row: int, now: float) -> str:
        """Why a replica without a request in its window has no evidence (for a resolve message)."""
        window = self.settings.decider.window_s
        if summary is not None:
            return f"no request in its {window:.0f} s window"
        silent = now - self._tracks_in_order()[row].last_heard()
        return f"no report from the replica, {silent:.0f} s since its last request"

    def _expire(self, detector: Detector, targets: list[tuple[str, str | None, str]], model: str, now: float,
                alerts: list[Alert]) -> None:
        """Resolve ``detector``'s open alerts on ``targets`` ((key, replica, why): replicas, or the
        model with replica None, without a request in their window) and drop its state there: no
        evidence, no alert."""
        open_now = detector.open_alerts()
        if open_now:
            wanted = {key: (replica, why) for key, replica, why in targets}
            for alert_key, severity in open_now.items():
                key, _, rule = alert_key.partition("#")
                if key not in wanted:
                    continue
                replica, why = wanted[key]
                evidence: dict[str, float | int | str | None] = {"window_s": self.settings.decider.window_s}
                if rule:
                    evidence["rule"] = rule
                alerts.append(Alert(now, model, replica, detector.name, Severity(severity), "resolved",
                                    f"resolved (no evidence: {why})", evidence))
        for key, _, _ in targets:
            detector.forget(key)

    def publish_now(self) -> RoutingCorrection | None:
        """``POST /api/v1/update_weights``: the correction of the latest step, published now.

        It was computed from the newest windows this decider has (the worker first completes the
        steps it holds); if it went out already it is returned as it was (same ``seq``: sending it
        again is a no-op for a consumer), else it is marked published with its own ``seq`` (its
        step's event time, above every seq published before). None before any step.
        """
        current = self._current
        if current is None:
            return None
        published = self._last_published
        if published is None or published.seq != current.seq:
            self._published(current, current.ts)
        return current

    def _published(self, correction: RoutingCorrection, step_time: float) -> None:
        self._last_published = correction
        self._last_published_step = step_time
        self._last_seq = correction.seq

    def _health(self, now: float, keys: list[str]) -> list[tuple[float, str | None, str | None]]:
        """(score, note, action) of each replica key (``model/replica``), in that order."""
        healthy = _HEALTHY
        detector = self.detectors.get(GpuHealthDetector.name)
        if not isinstance(detector, GpuHealthDetector):
            return [healthy] * len(keys)
        unwell = detector.unwell_keys()
        if not unwell:  # the usual step: no replica of any model has an error class
            return [healthy] * len(keys)
        result: list[tuple[float, str | None, str | None]] = []
        for key in keys:
            if key not in unwell:
                result.append(healthy)
                continue
            assessment = detector.assessment(key, now)
            if assessment is HEALTHY:
                result.append(healthy)
                continue
            note = f"{assessment.action}: {assessment.cause}" if assessment.action else None
            result.append((assessment.score, note, assessment.action))
        return result

    def _sorted_replicas(self) -> list[str]:
        """The known replicas in name order, re-sorted only when the set changed."""
        if self._order is None:
            self._order = sorted(self._tracks)
            self._keys = None
            self._track_list = None
        return self._order

    def _tracks_in_order(self) -> list[_Track]:
        """The tracks of :meth:`_sorted_replicas`, in that order, built when that changes."""
        order = self._sorted_replicas()
        if self._track_list is None:
            self._track_list = [self._tracks[replica] for replica in order]
        return self._track_list

    def _replica_keys(self) -> list[str]:
        """``model/replica`` of :meth:`_sorted_replicas`, built when that changes."""
        order = self._sorted_replicas()
        if self._keys is None:
            self._keys = [f"{self.model}/{replica}" for replica in order]
        return self._keys

    # ------------------------------------------------------------------ inspection

    @property
    def last_published(self) -> RoutingCorrection | None:
        return self._last_published

    @property
    def current(self) -> RoutingCorrection | None:
        return self._current

    @property
    def replicas(self) -> list[str]:
        return sorted(self._tracks)

    def open_alerts(self) -> dict[tuple[str, str], int]:
        """(detector, severity) -> number of open alerts (for the metrics endpoint); counted once
        per step, not per call (the worker asks every model's decider after each batch)."""
        if self._open_alerts is None:
            counts: dict[tuple[str, str], int] = {}
            for name, detector in self.detectors.items():
                for severity in detector.open_alerts().values():
                    key = (name, str(severity))
                    counts[key] = counts.get(key, 0) + 1
            for pool_severity in self._evidence.open_alerts().values():
                key = (POOL_DETECTOR, pool_severity)
                counts[key] = counts.get(key, 0) + 1
            if self._evidence.stale_alerts:
                key = (STALE_DETECTOR, str(Severity.WARNING))
                counts[key] = counts.get(key, 0) + len(self._evidence.stale_alerts)
            self._open_alerts = counts
        return dict(self._open_alerts)

    def _demote(self, order: list[str], weights: dict[str, ReplicaWeight], now: float,
                probation: set[str] | frozenset[str] = frozenset()) -> None:
        """Published weights below every healthy replica's for those with an open alert, held after a
        repeat demotion, or on probation: back from an ejection without a request since (in place)."""
        rows = [weights[replica] for replica in order]
        alerted = [self._demotions.demoted(replica, now) for replica in order]
        on_probation = [replica in probation and not alerted[row] for row, replica in enumerate(order)]
        # warm-up: a replica newer than its pool, with fewer requests than the credibility rule's
        # half-credibility count (credibility_k, decayed over rate_horizon_s) and under half its
        # peers' median, is not demoted yet (its weight is mostly an equal share anyway): a new
        # replica first serves its share and shows what it is. One that has served as long as its
        # peers of a low-rate pool is not new: its alert's detector already asked for its evidence
        k = self.settings.weights.credibility_k
        if k > 0 and any(alerted):
            served = [0.0 if e is None else e.arrivals.n for e in map(self._evidence.replicas.get, order)]
            for row, n in enumerate(served):
                if not (alerted[row] and n < k):
                    continue  # (the usual replica: its peers' median is not needed)
                peers = served[:row] + served[row + 1:]
                if not peers or n < 0.5 * float(np.median(peers)):
                    alerted[row] = False
                    note = f"not demoted: warming up ({n:.0f} of {k:g} requests)"
                    rows[row].reason = note if rows[row].reason == "ok" else f"{rows[row].reason}; {note}"
        # probation is not warming up: the replica served before its ejection
        alerted = [a or p for a, p in zip(alerted, on_probation, strict=True)]
        outcome = demote([w.weight for w in rows], alerted, [w.health >= 1.0 for w in rows], self.settings.weights)
        for row in outcome.demoted:
            labels = self._demotions.alerted.get(order[row])
            note = ("demoted: " + ", ".join(sorted(labels)) + " open" if labels
                    else "demoted: back from an ejection, no request since" if on_probation[row]
                    else "demoted: held after a repeat demotion")
            rows[row].reason = note if rows[row].reason == "ok" else f"{rows[row].reason}; {note}"
        if outcome.demoted:
            for replica, w, new in zip(order, rows, outcome.weights, strict=True):
                w.weight = new
                evidence = self._evidence.replicas.get(replica)
                if evidence is not None:
                    evidence.weight = new  # what a router following the weights sends it (staleness)
        elif outcome.note is not None:
            for row, w in enumerate(rows):
                if alerted[row]:
                    w.reason = outcome.note if w.reason == "ok" else f"{w.reason}; {outcome.note}"

    def forget_replica(self, replica: str) -> None:
        """Drop a replica (released by the windows, or silent for ``release_after_s``)."""
        self._tracks.pop(replica, None)
        self._demotions.forget(replica)
        self._speed.forget(replica)
        self._order = None
        self._open_alerts = None
        for detector in self.detectors.values():
            detector.forget(f"{self.model}/{replica}")
        self._evidence.forget(replica)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically after a restart, as JSON-able data."""
        return {
            "v": DECIDER_STATE_VERSION,
            "model": self.model,
            "detectors": {name: det.state_dict() for name, det in self.detectors.items()},
            "replicas": {r: t.to_dict() for r, t in self._tracks.items()},
            "last_seq": self._last_seq,
            "last_published": None if self._last_published is None else self._last_published.to_dict(),
            "last_published_step": self._last_published_step,
            "current": None if self._current is None else self._current.to_dict(),
            "last_window_end": self._last_window_end,
            "last_weights": {r: w.to_dict() for r, w in self._last_weights.items()},
            "last_health": dict(self._last_health),
            "evidence": self._evidence.state_dict(),
            "demotion_holds": self._demotions.holds.state_dict(),
            "relative_speed": self._speed.state_dict(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], settings: DetectorSettings | None = None) -> ModelDecider:
        """Rebuild a decider from ``state_dict()``; detectors missing from the state start fresh."""
        if state.get("v") != DECIDER_STATE_VERSION:
            raise ValueError(f"unsupported decider state version {state.get('v')!r}")
        decider = cls(settings, model=state.get("model"))
        for name, det_state in state.get("detectors", {}).items():
            if name in decider.detectors:
                decider.detectors[name].load_state(det_state)
        decider._tracks = {r: _Track.from_dict(t) for r, t in state.get("replicas", {}).items()}
        decider._order = None
        decider._last_seq = state.get("last_seq")
        published = state.get("last_published")
        decider._last_published = None if published is None else RoutingCorrection.from_dict(published)
        decider._last_published_step = state.get("last_published_step")
        current = state.get("current")
        decider._current = None if current is None else RoutingCorrection.from_dict(current)
        decider._last_window_end = state.get("last_window_end")
        decider._last_weights = {
            r: ReplicaWeight(
                replica=w["replica"],
                weight=w["weight"],
                raw_score=w["raw_score"],
                health=w["health"],
                reason=w["reason"],
                components=dict(w.get("components", {})),
            )
            for r, w in state.get("last_weights", {}).items()
        }
        decider._last_health = {r: float(h) for r, h in state.get("last_health", {}).items()}
        decider._evidence.load_state(state.get("evidence", {}), decider.settings.weights)
        decider._demotions.rebuild({name: d.open_alerts() for name, d in decider.detectors.items()})
        decider._demotions.holds.load_state(state.get("demotion_holds") or {})
        decider._speed.load_state(state.get("relative_speed") or {})
        return decider
