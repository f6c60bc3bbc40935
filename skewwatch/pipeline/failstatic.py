"""Corrections that fail static: a pool is never routed to nowhere, and never emptied by weak evidence.

The weight formula scores each replica; health and staleness take some out of the pool. What is
taken out, and when the pool stops trusting that evidence, is decided here for the whole pool at
once, after Envoy's outlier detection (``max_ejection_percent``, ``base_ejection_time``, the panic
threshold). These guards apply whatever the weight profile: they are safety, not tuning.

**Ejections.** A replica is *ejected* when its evidence says so: drained for a hardware / driver
fault (weight 0), isolated for a configuration error (the health factor, 0.4), or stale (weight 0,
:mod:`skewwatch.pipeline.staleness`). Transient errors (throttle, 0.9) are not ejections.

* **Cap.** At most ``max(1, ⌊max_ejection_share × pool⌋)`` replicas are ejected at once (default
  share 0.5: two of four). Worst evidence goes first — hardware, then configuration, then stale;
  within a class, the replica ejected first stays ejected. A replica the cap holds back keeps
  routing (its drain / isolate action is withdrawn, its weight is its score) and a pool-level
  WARNING alert (``fail_static``, rule ``ejection_cap``) names it.
* **Repeat ejections last longer.** An ejection lasts at least ``base_ejection_s`` ×
  ``ejection_multiplier`` ^ (ejections − 1), at most ``max_ejection_s`` (30 s, ×2, 300 s by
  default). The count is forgiven after ``max_ejection_s`` without an ejection. A stale replica
  comes back when its ejection time is over (its silence while out says nothing: it got no
  traffic), so a replica wrongly judged stale is out for 30 s, not for good.
* **Panic.** When fewer than ``panic_threshold`` (0.5) of the pool's replicas are healthy (no
  ejection evidence, before the cap), the evidence is more likely wrong than the pool broken: the
  correction has ``mode: "panic"`` and routes to every replica not drained for a hardware fault
  (stale ones at their held weight, isolated ones without their isolate action), as Envoy routes
  to all hosts below its panic threshold; hardware faults stay out because their evidence (an XID,
  an ECC error, an illegal address) is direct. A pool-level CRITICAL alert (``fail_static``, rule
  ``panic``) says why.
* **Never all-zero.** If the weights still sum to 0 (every replica drained, or a one-replica pool
  ejected), the correction routes to every replica not drained for a hardware fault, else to all,
  with ``mode: "panic"`` and the same alert.
* **A silent pool.** When the whole pool had no request in its window and that silence is
  improbable at its own rate (its traffic stopped: :mod:`skewwatch.pipeline.staleness` judges the
  pool's arrivals), no replica is to blame
  and their weights are held; the correction says so with ``mode: "panic"`` and the reason, and a
  pool-level WARNING alert (rule ``pool_silent``) opens until requests come back.

>>> cfg = GuardConfig()
>>> guard = PoolGuard()
>>> out = guard.apply("m", 100.0, ["a", "b", "c", "d"], [1.0] * 4, [1.0] * 4, [STALE] * 4, cfg)
>>> out.mode, [round(w, 2) for w in out.weights]
('panic', [0.25, 0.25, 0.25, 0.25])
>>> [(a.detector, a.evidence["rule"], str(a.severity), a.state) for a in out.alerts]
[('fail_static', 'panic', 'CRITICAL', 'open')]
>>> out = guard.apply("m", 105.0, ["a", "b", "c", "d"], [1.0] * 4, [1.0, 0.0, 1.0, 1.0],
...                   [STALE, HARDWARE, None, None], GuardConfig(max_ejection_share=0.25))
>>> out.mode, [round(w, 2) for w in out.weights], out.ejected, out.held_back
('normal', [0.33, 0.0, 0.33, 0.33], {'b': 'hardware'}, {'a': 'stale'})
>>> [(a.evidence["rule"], a.state) for a in out.alerts]
[('ejection_cap', 'open'), ('panic', 'resolved')]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.schemas.corrections import Mode

HARDWARE = "hardware"
CONFIGURATION = "configuration"
STALE = "stale"
RANK: Mapping[str, int] = {HARDWARE: 3, CONFIGURATION: 2, STALE: 1}  # worst evidence first
DETECTOR = "fail_static"  # the pool-level alerts' detector name (rules: panic, ejection_cap, pool_silent)

NORMAL: Final[Mode] = "normal"
PANIC: Final[Mode] = "panic"


class GuardSettings(Protocol):
    """The settings :meth:`PoolGuard.apply` reads (:class:`GuardConfig`, or the weights' section)."""

    @property
    def panic_threshold(self) -> float: ...
    @property
    def max_ejection_share(self) -> float: ...
    @property
    def base_ejection_s(self) -> float: ...
    @property
    def ejection_multiplier(self) -> float: ...
    @property
    def max_ejection_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """The guards' settings (fields of ``[detectors.weights]``; defaults as the module says)."""

    panic_threshold: float = 0.5  # Envoy's default healthy_panic_threshold: 50 %
    max_ejection_share: float = 0.5  # at most max(1, floor(share x pool)) ejected at once
    base_ejection_s: float = 30.0  # Envoy's default base_ejection_time
    ejection_multiplier: float = 2.0  # each repeat ejection lasts this much longer
    max_ejection_s: float = 300.0  # Envoy's default max_ejection_time


def ejection_time(count: int, config: GuardSettings) -> float:
    """How long the ``count``-th repeat ejection lasts (s): ``base_ejection_s`` x
    ``ejection_multiplier`` ^ (count - 1), at most ``max_ejection_s`` (Envoy's ejection times).

    >>> [ejection_time(k, GuardConfig()) for k in (1, 2, 3, 5, 6)]
    [30.0, 60.0, 120.0, 300.0, 300.0]
    """
    return min(config.base_ejection_s * config.ejection_multiplier ** (count - 1), config.max_ejection_s)


@dataclass(slots=True)
class _Ejection:
    cause: str
    since: float
    until: float  # the earliest end


@dataclass(slots=True)
class _Record:
    """One replica's ejection history."""

    count: int = 0  # ejections not yet forgiven
    last_end: float | None = None
    current: _Ejection | None = None

    def to_dict(self) -> dict[str, Any]:
        cur = self.current
        return {"count": self.count, "last_end": self.last_end,
                "current": None if cur is None else [cur.cause, cur.since, cur.until]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> _Record:
        cur = data.get("current")
        return cls(int(data.get("count", 0)), data.get("last_end"),
                   None if cur is None else _Ejection(str(cur[0]), float(cur[1]), float(cur[2])))


@dataclass(slots=True)
class PoolOutcome:
    """The guarded weights of one pool at one step."""

    weights: list[float]  # in the order of the replicas given, summing to 1 (0 only for an empty pool)
    mode: Mode = NORMAL
    mode_reason: str | None = None
    ejected: dict[str, str] = field(default_factory=dict)  # replica -> cause
    held_back: dict[str, str] = field(default_factory=dict)  # replica -> cause the cap did not act on
    routed_anyway: set[str] = field(default_factory=set)  # ejected, but routed by panic / fail static
    ended: list[str] = field(default_factory=list)  # ejections that ended this step (their silence restarts)
    notes: dict[int, str] = field(default_factory=dict)  # row -> what the guard did to it
    alerts: list[Alert] = field(default_factory=list)

    @property
    def withdrawn(self) -> set[str]:
        """Replicas whose drain / isolate actions must not go out: held back or routed anyway."""
        return set(self.held_back) | self.routed_anyway


def ejection_cap(pool: int, share: float) -> int:
    """``max(1, ⌊share × pool⌋)``: the most replicas ejected at once.

    >>> ejection_cap(4, 0.5), ejection_cap(3, 0.5), ejection_cap(10, 0.1), ejection_cap(1, 0.0)
    (2, 1, 1, 1)
    """
    return max(1, math.floor(share * pool + 1e-9))


class PoolGuard:
    """One model's ejection book and pool-level alerts; JSON-able state (``state_dict``)."""

    def __init__(self) -> None:
        self._records: dict[str, _Record] = {}
        self._open: dict[str, str] = {}  # rule -> severity, for the open pool-level alerts

    def due_restarts(self, now: float) -> list[str]:
        """Replicas ejected as stale whose ejection time is over: their silence must start again
        (they got no traffic while out), so they come back unless new evidence says otherwise."""
        return [r for r, rec in self._records.items()
                if rec.current is not None and rec.current.cause == STALE and now >= rec.current.until]

    def forget(self, replica: str) -> None:
        """Drop a released replica's history."""
        self._records.pop(replica, None)

    def open_alerts(self) -> dict[str, str]:
        """rule -> severity of the pool-level alerts open now."""
        return dict(self._open)

    def apply(
        self,
        model: str,
        now: float,
        replicas: Sequence[str],
        scores: Sequence[float],
        health: Sequence[float],
        evidence: Sequence[str | None],
        config: GuardSettings,
        notes: Sequence[str | None] | None = None,
        pool_silent: str | None = None,
    ) -> PoolOutcome:
        """Weights of the pool from each replica's score (> 0, before health), health factor and
        ejection evidence (:data:`HARDWARE`, :data:`CONFIGURATION`, :data:`STALE` or None);
        ``notes`` say why (for the alerts); ``pool_silent``: why the whole pool is silent, if it is."""
        n = len(replicas)
        out = PoolOutcome(weights=[0.0] * n)
        if n == 0:
            return out
        records = self._records
        if (not self._open and pool_silent is None and not any(evidence)
                and all(rec.current is None for rec in records.values())):
            # the usual step: no evidence, no ejection in force, no pool alert open (health in [0, 1])
            effective = [s * h for s, h in zip(scores, health, strict=True)]
            total = sum(effective)
            if total > 0:
                out.weights = [e / total for e in effective]
                return out
        # candidates: evidence now, or an ejection whose earliest end has not come
        candidates: list[tuple[int, int, float, str, int, str]] = []
        for row, (replica, cause) in enumerate(zip(replicas, evidence, strict=True)):
            rec = records.get(replica)
            current = rec.current if rec is not None else None
            if cause is None and current is not None and now >= current.until:
                rec.current, rec.last_end = None, now  # type: ignore[union-attr]
                current = None
                out.ended.append(replica)
            if cause is None and current is None:
                continue
            if current is not None and (cause is None or RANK[current.cause] > RANK[cause]):
                cause = current.cause
            assert cause is not None
            candidates.append((-RANK[cause], 0 if current is not None else 1,
                               current.since if current is not None else now, replica, row, cause))
        candidates.sort()
        healthy = n - len(candidates)
        panic = healthy < config.panic_threshold * n
        cap = ejection_cap(n, config.max_ejection_share)
        ejected_rows: dict[int, str] = {}
        position = 0
        for _, _, _, replica, row, cause in candidates:
            rec = records.get(replica)
            if panic and cause != HARDWARE:
                # panic suspends the soft evidence: no ejection starts or runs on it (a stale
                # replica is not cycled in and out while its whole pool is quiet)
                if rec is not None and rec.current is not None:
                    rec.current, rec.last_end = None, now
                    out.ended.append(replica)
                continue
            position += 1
            if position > cap:
                out.held_back[replica] = cause
                if rec is not None and rec.current is not None:  # displaced by worse evidence
                    rec.current, rec.last_end = None, now
                    out.ended.append(replica)
                continue
            if rec is None:
                rec = records[replica] = _Record()
            if rec.current is None:
                if rec.last_end is not None and now - rec.last_end >= config.max_ejection_s:
                    rec.count = 0  # forgiven
                rec.count += 1
                duration = ejection_time(rec.count, config)
                rec.current = _Ejection(cause, now, now + duration)
            else:
                rec.current.cause = cause
            ejected_rows[row] = cause
            out.ejected[replica] = cause
        effective = [s * max(min(h, 1.0), 0.0) for s, h in zip(scores, health, strict=True)]
        for replica, cause in out.held_back.items():
            row = replicas.index(replica)
            effective[row] = scores[row]
            out.notes[row] = f"ejection cap held back ({cause}): at most {cap} of {n} ejected at once"
        for row, cause in ejected_rows.items():
            if cause != CONFIGURATION:
                effective[row] = 0.0
            until = records[replicas[row]].current.until  # type: ignore[union-attr]
            out.notes[row] = f"ejected ({cause}) until {until:.0f}"
        mode_reason = None
        suspended = [(replica, cause) for *_, replica, _, cause in candidates
                     if replica not in out.ejected and replica not in out.held_back]
        if panic:
            mode_reason = (f"panic: {healthy} of {n} replicas healthy (below {config.panic_threshold:.0%}): "
                           f"{_census(candidates)}")
        elif sum(effective) <= 0:
            mode_reason = f"fail static: no replica has a positive weight ({_census(candidates)})"
        evidence_panic = mode_reason is not None
        if mode_reason is None and pool_silent is not None:
            out.mode, out.mode_reason = PANIC, f"fail static: {pool_silent}; weights held, routing to all"
        if mode_reason is not None:
            keep_out = [row for row, cause in ejected_rows.items() if cause == HARDWARE]
            routed = [row for row in range(n) if row not in keep_out]
            if not routed or sum(scores[row] for row in routed) <= 0:
                routed = list(range(n))
                mode_reason += "; routing to all replicas"
            else:
                mode_reason += "; routing to every replica not drained for a hardware fault"
            for replica, cause in suspended:
                row = replicas.index(replica)
                effective[row] = scores[row]
                out.routed_anyway.add(replica)
                out.notes[row] = f"routed anyway ({cause}): {PANIC}"
            for row in routed:
                if row in ejected_rows or effective[row] <= 0:
                    effective[row] = scores[row]
                    out.routed_anyway.add(replicas[row])
                    out.notes[row] = f"routed anyway ({out.ejected.get(replicas[row], 'no weight')}): {PANIC}"
            out.mode, out.mode_reason = PANIC, mode_reason
        total = sum(effective)
        out.weights = [e / total for e in effective] if total > 0 else [1.0 / n] * n
        out.alerts = self._alerts(model, now, out, cap, candidates, notes, pool_silent, evidence_panic)
        return out

    def _alerts(self, model: str, now: float, out: PoolOutcome, cap: int,
                candidates: list[tuple[int, int, float, str, int, str]],
                notes: Sequence[str | None] | None, pool_silent: str | None, evidence_panic: bool) -> list[Alert]:
        alerts: list[Alert] = []
        why = {replica: (notes[row] if notes is not None and notes[row] else cause)
               for _, _, _, replica, row, cause in candidates}
        wanted: dict[str, tuple[Severity, str, dict[str, Any]]] = {}
        if evidence_panic:
            wanted["panic"] = (Severity.CRITICAL, out.mode_reason or PANIC,
                               {"replicas": len(out.weights), "unhealthy": len(candidates),
                                "evidence": "; ".join(f"{r}: {w}" for r, w in sorted(why.items()))})
        if pool_silent is not None:
            wanted["pool_silent"] = (Severity.WARNING, f"pool silent: {pool_silent}", {})
        if out.held_back:
            held = "; ".join(f"{r} ({why.get(r, c)})" for r, c in sorted(out.held_back.items()))
            wanted["ejection_cap"] = (Severity.WARNING,
                                      f"ejection cap: at most {cap} of {len(out.weights)} replicas ejected at "
                                      f"once; held back: {held}",
                                      {"cap": cap, "held_back": ",".join(sorted(out.held_back))})
        for rule, (severity, message, evidence) in wanted.items():
            if rule not in self._open:
                self._open[rule] = str(severity)
                alerts.append(Alert(now, model, None, DETECTOR, severity, "open", message,
                                    {"rule": rule, **evidence}))
        for rule in [r for r in self._open if r not in wanted]:
            severity = Severity(self._open.pop(rule))
            alerts.append(Alert(now, model, None, DETECTOR, severity, "resolved", _RESOLVED[rule], {"rule": rule}))
        return alerts

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"records": {r: rec.to_dict() for r, rec in self._records.items()}, "open": dict(self._open)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self._records = {str(r): _Record.from_dict(d) for r, d in state.get("records", {}).items()}
        self._open = {str(k): str(v) for k, v in state.get("open", {}).items()}


_RESOLVED = {
    "panic": f"resolved: the pool is back to {NORMAL}",
    "ejection_cap": "resolved: no replica held back by the ejection cap",
    "pool_silent": "resolved: the pool finishes requests again",
}


def _census(candidates: Sequence[tuple[int, int, float, str, int, str]]) -> str:
    counts: dict[str, int] = {}
    for *_, cause in candidates:
        counts[cause] = counts.get(cause, 0) + 1
    words = {HARDWARE: "drained (hardware)", CONFIGURATION: "isolated (configuration)", STALE: "stale"}
    return ", ".join(f"{counts[c]} {words[c]}" for c in (HARDWARE, CONFIGURATION, STALE) if c in counts) or "none"
