"""From the weight formula's scores to the weights a correction carries, with their evidence.

The decider computes each replica's score with the weight formula (:mod:`skewwatch.pipeline.weights`)
and its health (:mod:`skewwatch.pipeline.health`); :class:`PoolEvidence` then, per model and step:

1. **holds** the score of a replica whose window holds no request (its silence still plausible):
   its last score, not the formula's "no signal, fully loaded";
2. **shrinks** every other score toward the pool's by its credibility ``z = n / (n + k)``, ``n`` the
   requests in its window (:mod:`skewwatch.pipeline.credibility`);
3. judges **staleness** from each replica's own arrival rate, its peers' requests meanwhile and its
   engine telemetry, and the whole pool's silence from the pool's arrivals
   (:mod:`skewwatch.pipeline.staleness`);
4. applies the pool's **guards** — ejection cap, repeat ejections, panic threshold, never all-zero
   (:mod:`skewwatch.pipeline.failstatic`);
5. says so when a replica is judged **stale**: a WARNING alert on it (detector ``stale``) from the
   step its silence is judged improbable until it finishes a request again (the probation after its
   ejection ends) or is no longer reported. A hung or dead engine is then an alert, not only a
   weight of 0; the alert does not demote (the ejection and the probation already do).

All of it is event time and plain data (``state_dict`` / ``load_state``).

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> from skewwatch.pipeline.weights import WeightConfig, compute_weights, WeightInput
>>> cfg, pool = WeightConfig(), PoolEvidence()
>>> def vec(r, end, count, latency):
...     return FeatureVector(model="m", replica=r, window_start=end - 60, window_end=end, count=count,
...                          step_count=min(count, 1), latency_mean=latency)
>>> vectors = [vec("a", 60.0, 3, 500.0), vec("b", 60.0, 300, 2000.0)]
>>> pool.observe(60.0, ["a", "b"], vectors, [None, None], cfg)
>>> raw = compute_weights([WeightInput(v.replica, v) for v in vectors])
>>> [round(raw[r].weight, 2) for r in "ab"]  # the formula alone: 3 requests make a look 4x as good
[0.8, 0.2]
>>> settled = pool.settle("m", 60.0, ["a", "b"], vectors, raw, [None, None], cfg)
>>> [round(raw[r].weight, 2) for r in "ab"], settled.mode
([0.64, 0.36], 'normal')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skewwatch.pipeline.credibility import credibilities, shrink
from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.pipeline.failstatic import CONFIGURATION, HARDWARE, NORMAL, STALE, PoolGuard
from skewwatch.pipeline.staleness import ArrivalEvidence, Verdict
from skewwatch.pipeline.weights import ENGINE_SOURCES, ReplicaWeight, WeightConfig
from skewwatch.schemas.corrections import Mode
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

STALE_DETECTOR = "stale"  # the detector name of a stale replica's alert

# the health action that makes a replica's health an ejection, and of which class
EJECTING_ACTIONS: Mapping[str, str] = {"drain": HARDWARE, "isolate": CONFIGURATION}


@dataclass(slots=True)
class ReplicaEvidence:
    """What one replica's weight rests on beyond its window: its arrivals, its held score and when
    its engine last answered."""

    arrivals: ArrivalEvidence
    held: float | None = None  # the score of its last step with requests in its window
    engine_seen: float | None = None  # event time of its latest engine sample
    engine_alive: bool = False  # a fresh engine sample came with this step
    engine_lost: bool = False  # its engine telemetry stopped while it was still reported (until a new sample)
    weight: float | None = None  # the weight it was given at the last step
    verdict: Verdict | None = None  # this step's staleness (not kept across a checkpoint)
    # back from an ejection and no request seen since: routed a probing share (the decider demotes
    # it) until a request shows it serves, not its full share on a score from before it went out
    probation: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"arrivals": self.arrivals.to_dict(), "held": self.held, "engine_seen": self.engine_seen,
                "engine_lost": self.engine_lost, "weight": self.weight, "probation": self.probation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], horizon_s: float) -> ReplicaEvidence:
        """Inverse of :meth:`to_dict`."""
        return cls(ArrivalEvidence.from_dict(data["arrivals"], horizon_s), held=data.get("held"),
                   engine_seen=data.get("engine_seen"), engine_lost=bool(data.get("engine_lost", False)),
                   weight=data.get("weight"), probation=bool(data.get("probation", False)))


@dataclass(slots=True)
class Settled:
    """A pool's weights as they go out, and what the guards did."""

    mode: Mode = NORMAL
    mode_reason: str | None = None
    withdrawn: set[str] = field(default_factory=set)  # replicas whose drain / isolate must not go out
    alerts: list[Alert] = field(default_factory=list)  # pool-level (replica None), and the stale replicas'


class PoolEvidence:
    """One model's evidence state: each replica's :class:`ReplicaEvidence` and the pool's guard."""

    def __init__(self) -> None:
        self.replicas: dict[str, ReplicaEvidence] = {}
        self.guard = PoolGuard()
        self.pool_total = 0.0  # requests the pool finished (its replicas' step counts, summed)
        self.pool: ArrivalEvidence | None = None  # the pool's own arrivals
        self.window_s = 60.0  # the windows' length (observe)
        self.stale_alerts: set[str] = set()  # the replicas whose stale alert is open

    def observe(
        self,
        now: float,
        order: Sequence[str],
        vectors: Sequence[FeatureVector | None],
        telemetry: Sequence[TelemetrySample | None],
        config: WeightConfig,
        window_s: float = 60.0,
    ) -> None:
        """Fold one step in, before the weights: arrivals (``vectors``: None for a replica without a
        summary), the ejections whose time is over, and which engines answered (``telemetry``: the
        fresh samples)."""
        replicas = self.replicas
        self.window_s = window_s
        for replica in self.guard.due_restarts(now):
            found = replicas.get(replica)
            if found is not None:
                found.arrivals.restart(now, self.pool_total)
        horizon = config.rate_horizon_s
        step_total = sum(fv.step_count for fv in vectors if fv is not None)
        self.pool_total += step_total
        if self.pool is None:
            counts = sum(fv.count for fv in vectors if fv is not None)
            self.pool = ArrivalEvidence.first(now, counts, window_s, horizon)
        else:
            self.pool.observe(now, step_total)
        mark = self.pool_total
        decays: dict[float, float] = {}
        for replica, fv, sample in zip(order, vectors, telemetry, strict=True):
            evidence = replicas.get(replica)
            if evidence is None:
                count = fv.count if fv is not None else 0
                evidence = replicas[replica] = ReplicaEvidence(ArrivalEvidence.first(now, count, window_s, horizon))
                evidence.arrivals.pool_mark = mark
            elif fv is not None and fv.step_count > 0:
                evidence.arrivals.observe(now, fv.step_count, mark, decays)
                evidence.probation = False  # it serves: a request of its own ended the probation
            if sample is not None and sample.source in ENGINE_SOURCES:
                evidence.engine_seen, evidence.engine_lost, evidence.engine_alive = sample.ts, False, True
                continue
            evidence.engine_alive = False
            if (fv is not None and evidence.engine_seen is not None
                    and now - evidence.engine_seen > config.telemetry_max_age_s):
                # it had an engine sample and its step came without one; without a summary its
                # telemetry is unknown (stage 1 stops reporting a replica long without requests), so
                # this stays what was last known until a new sample
                evidence.engine_lost = True

    def settle(
        self,
        model: str,
        now: float,
        order: Sequence[str],
        vectors: Sequence[FeatureVector | None],
        weights: dict[str, ReplicaWeight],
        health_actions: Sequence[str | None],
        config: WeightConfig,
    ) -> Settled:
        """Turn the formula's ``weights`` (one per replica of ``order``, changed in place) into the
        published ones. ``vectors``: the step's vectors (None: no summary); ``health_actions``: each
        replica's health action (drain, isolate, throttle or None)."""
        rows = list(map(weights.__getitem__, order))
        evs = list(map(self.replicas.__getitem__, order))
        counts = [0 if fv is None else fv.count for fv in vectors]
        # 1-2: hold an empty window's score, shrink the others toward the pool's credible mean
        z = credibilities(counts, config.credibility_k)
        shrunk = shrink([w.raw_score for w in rows], z)
        pool_score = shrunk.mean
        # 3: staleness, judged only on a replica silent long enough to be (or whose engine went
        # quiet); against its own rate and, in a pool, against its peers' requests meanwhile (a pool
        # whose traffic stopped has no stale replica: its own silence is judged once, below)
        p, min_requests, min_s = config.stale_probability, config.stale_min_requests, config.stale_min_s
        quiet_since = now - min_s
        scores: list[float] = []
        evidence_of: list[str | None] = [None] * len(order)
        notes: list[str | None] = [None] * len(order)
        rates: list[float] | None = None
        seen: list[float] = []
        for row, (w, evidence, n, zi, own, action) in enumerate(
                zip(rows, evs, counts, z, shrunk.scores, health_actions, strict=True)):
            components = w.components
            if n <= 0:
                # the formula read "no signal: fully loaded"; the weight stays where it was instead
                if evidence.held is not None:
                    score, w.reason = evidence.held, "held: no request in the window"
                elif pool_score is not None:
                    score, w.reason = pool_score, "no request in the window yet: the pool's score"
                else:
                    score, w.reason = w.raw_score, "no request in the pool's windows: equal"
                components["held"] = evidence.held
            else:
                score = evidence.held = own
            components["credibility"] = zi
            components["score"] = score
            scores.append(score)
            evidence.verdict = None
            if action is not None and action in EJECTING_ACTIONS:
                evidence_of[row] = EJECTING_ACTIONS[action]
                continue
            if evidence.arrivals.since > quiet_since and not evidence.engine_lost:
                continue
            if (vectors[row] is None and evidence.engine_seen is not None and not evidence.engine_lost
                    and config.liveness_from_telemetry):
                # its engine answered when it was last reported: stage 1 stops reporting a replica
                # (and its telemetry) 90 s after its last request, so its liveness is unknown, not gone
                continue
            if rates is None:
                rates = [e.arrivals.rate() or 0.0 for e in evs]
                # the two newest engine samples of the pool: a replica's engine counts as lost only if
                # a peer's answered telemetry_max_age_s after its last (every engine going quiet
                # together is the pool, or the scraper, not one replica)
                seen = sorted((e.engine_seen for e in evs if e.engine_seen is not None), reverse=True)[:2]
            pool_rate = sum(rates)
            # stage 1 reports no telemetry of a replica it no longer reports (no request for 90 s): a
            # loss seen before then says nothing of its engine now. Kept, it would hold the replica
            # ejected for good once it is let go (sent nothing, it never shows a request again)
            lost = evidence.engine_lost and vectors[row] is not None
            if lost and evidence.engine_seen is not None:
                newest_other = seen[1:2] if seen and seen[0] == evidence.engine_seen else seen[:1]
                peer_seen = newest_other[0] if newest_other else None
                lost = len(order) == 1 or (peer_seen is not None
                                           and peer_seen >= evidence.engine_seen + config.telemetry_max_age_s)
            alive = config.liveness_from_telemetry and evidence.engine_alive
            peers = self.pool_total - evidence.arrivals.pool_mark if len(order) > 1 else None
            share = rates[row] / pool_rate if pool_rate > 0 else None
            if share is not None and evidence.weight is not None:
                share = min(share, evidence.weight)  # a router following the weights sent it this much
            verdict = evidence.verdict = evidence.arrivals.judge(
                now, p, min_requests, min_s, engine_alive=alive, engine_lost=lost,
                peer_requests=peers, share=share, gap_factor=config.stale_gap_factor)
            if verdict.stale:
                evidence_of[row], notes[row] = STALE, verdict.reason
        # the pool: only once its whole window is empty (no alert on a lull between bursts)
        pool_silent = None
        pool_min_s = max(min_s, self.window_s)
        if self.pool is not None and self.pool.silence(now) >= pool_min_s:
            quiet = self.pool.judge(now, p, min_requests, pool_min_s, gap_factor=config.stale_gap_factor)
            if quiet.stale:
                pool_silent = "the whole pool is silent: " + quiet.reason.removeprefix("stale: ").replace(
                    "its own rate", "the pool's rate")
        # 4: the pool's guards
        outcome = self.guard.apply(model, now, order, scores, [w.health for w in rows], evidence_of, config,
                                   [note or (w.reason if c is not None else None)
                                    for note, w, c in zip(notes, rows, evidence_of, strict=True)],
                                   pool_silent)
        for replica in outcome.ended:  # back from an ejection: its silence while out says nothing
            found = self.replicas.get(replica)
            if found is not None:
                found.arrivals.restart(now, self.pool_total)
                found.probation = True
        guard_notes = outcome.notes
        for row, (w, evidence, weight, n) in enumerate(zip(rows, evs, outcome.weights, counts, strict=True)):
            w.weight = evidence.weight = weight
            if n > 0 and notes[row] is None and row not in guard_notes:
                continue  # the usual replica: nothing to add to its reason
            extra = [text for text in (notes[row], guard_notes.get(row)) if text]
            judged = evidence.verdict
            if n <= 0 and not extra and judged is not None and judged.threshold_s is not None:
                extra.append(f"{judged.silence_s:.0f} s silent, plausible at its own rate until "
                             f"{judged.threshold_s:.0f} s")
            if extra:
                w.reason = "; ".join(extra) if w.reason == "ok" else "; ".join([w.reason, *extra])
        # 5: a stale replica's alert, open until it serves again or is no longer reported
        alerts = outcome.alerts
        stale = {replica: row for row, replica in enumerate(order) if evidence_of[row] == STALE}
        stale.update((replica, order.index(replica)) for replica, c in outcome.ejected.items() if c == STALE)
        for replica, row in sorted(stale.items()):
            if replica not in self.stale_alerts:
                self.stale_alerts.add(replica)
                why = "; ".join(text for text in (notes[row], guard_notes.get(row)) if text) or STALE
                alerts.append(Alert(now, model, replica, STALE_DETECTOR, Severity.WARNING, "open", f"{replica} {why}",
                                    {"rule": STALE}))
        for replica in sorted(r for r in self.stale_alerts if r not in stale):
            found = self.replicas.get(replica)
            if found is not None and found.probation and replica in order:
                continue  # back from its ejection, no request of its own yet
            self.stale_alerts.discard(replica)
            alerts.append(Alert(now, model, replica, STALE_DETECTOR, Severity.WARNING, "resolved",
                                "resolved: it finishes requests again" if replica in order
                                else "resolved (no evidence: no longer reported)", {"rule": STALE}))
        return Settled(outcome.mode, outcome.mode_reason, outcome.withdrawn, alerts)

    def forget(self, replica: str) -> None:
        """Drop a released replica."""
        self.replicas.pop(replica, None)
        self.guard.forget(replica)

    def open_alerts(self) -> dict[str, str]:
        """Pool-level alerts open now: rule -> severity."""
        return self.guard.open_alerts()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"replicas": {r: e.to_dict() for r, e in self.replicas.items()}, "guard": self.guard.state_dict(),
                "pool_total": self.pool_total, "pool": None if self.pool is None else self.pool.to_dict(),
                "stale_alerts": sorted(self.stale_alerts)}

    def load_state(self, state: Mapping[str, Any], config: WeightConfig) -> None:
        """Inverse of :meth:`state_dict`."""
        self.replicas = {str(r): ReplicaEvidence.from_dict(e, config.rate_horizon_s)
                         for r, e in state.get("replicas", {}).items()}
        self.guard.load_state(state.get("guard", {}))
        self.pool_total = float(state.get("pool_total", 0.0))
        pool = state.get("pool")
        self.pool = None if pool is None else ArrivalEvidence.from_dict(pool, config.rate_horizon_s)
        self.stale_alerts = {str(r) for r in state.get("stale_alerts") or ()}

