"""Detectors made of named rules, each with its own hysteresis per key.

A :class:`ThresholdDetector` evaluates its rules for a key each step (:meth:`~ThresholdDetector.evaluate`
returns a :class:`Finding` per rule) and turns "does the rule hold now?" into alerts through a
:class:`~skewwatch.pipeline.detectors.hysteresis.Hysteresis` per key and rule. While an alert is
open the detector returns its action on *every* step, with ``expires_at`` set ``action_ttl_s``
ahead, so a router keeps it in force while the worker lives and drops it by itself if the worker
dies. :class:`DetectorConfig` holds what every such detector has: ``persistence``,
``clear_steps`` and ``action_ttl_s``.

>>> from skewwatch.pipeline.detectors.long_tail import LongTailDetector
>>> from skewwatch.pipeline.detectors.long_tail_config import PROFILE_SEED, LongTailConfig
>>> det = LongTailDetector(LongTailConfig.from_overrides({**PROFILE_SEED, "persistence": 1}))  # the seed's rule
>>> fv = FeatureVector(model="m", replica="a", window_start=0.0, window_end=60.0, count=100,
...                    latency_p50=100.0, latency_p99=900.0)
>>> [a.state for a in det.update(fv, None, 60.0).alerts], det.open_alerts()
(['open'], {'m/a': <Severity.WARNING: 'WARNING'>})
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from skewwatch.config_section import Count, FrozenConfigSection, Positive
from skewwatch.pipeline.detectors.alerts import Action, Alert, AlertState, DetectorOutput, Evidence, Severity
from skewwatch.pipeline.detectors.base import STATE_VERSION, Detector
from skewwatch.pipeline.detectors.hysteresis import Hysteresis
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


class DetectorConfig(FrozenConfigSection, frozen=True):
    """Fields every hysteresis detector has; subclasses add their thresholds (seed defaults)."""

    section = "detectors.detector"

    persistence: Count = 1  # consecutive steps the rule must hold before the alert opens
    clear_steps: Count = 2  # consecutive steps the rule must not hold before it resolves
    action_ttl_s: Positive = 60.0  # actions expire this long after the last step that re-sent them


@dataclass(slots=True)
class Finding:
    """One evaluation of one rule (a detector may have several, e.g. kv_pressure's two)."""

    holds: bool | None  # None: a signal is missing, no claim either way
    message: str = ""
    evidence: Evidence = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)  # the action's params when it holds
    # the consecutive steps whose evidence a holding finding sums (a rule that accumulates evidence
    # across scrapes): the hysteresis counts them as that many holding steps in a row
    steps: int = 1


_NOT_EVALUATED = Finding(holds=None)  # a rule missing from evaluate()'s answer (read only, shared)


class _RuleState:
    """One rule's live state for one key: its hysteresis and what its last holding step said."""

    __slots__ = ("hysteresis", "message", "params")

    def __init__(self) -> None:
        self.hysteresis = Hysteresis()
        self.message: str | None = None  # message of the last step where the rule held
        self.params: dict[str, Any] | None = None  # its action params; None once resolved

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"h": self.hysteresis.to_dict()}
        if self.message is not None:
            data["message"] = self.message
        if self.params is not None:
            data["params"] = _plain(self.params)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> _RuleState:
        rule_state = cls()
        rule_state.hysteresis = Hysteresis.from_dict(data.get("h", {}))
        rule_state.message = data.get("message")
        params = data.get("params")
        rule_state.params = None if params is None else _plain(params)
        return rule_state


class _KeyState:
    """One key's live state: a :class:`_RuleState` per rule (in ``rules`` order) and the memory."""

    __slots__ = ("rules", "memory")

    def __init__(self, n_rules: int) -> None:
        self.rules = [_RuleState() for _ in range(n_rules)]
        self.memory: dict[str, Any] = {}

    def rules_idle(self) -> bool:
        """No rule counting towards opening or open: observing "does not hold" changes nothing.
        (A kept ``message``/``params`` only matters once the rule holds again, which resets them.)"""
        for rule_state in self.rules:
            h = rule_state.hysteresis
            if h.hits or h.is_open:
                return False
        return True


class ThresholdDetector(Detector):
    """A detector made of named rules, each with its own hysteresis per key.

    Subclasses set ``severity``, ``action`` (or None), ``reason`` per rule through
    :meth:`rule_meta` and implement :meth:`evaluate`.
    """

    rules: ClassVar[tuple[str, ...]] = ("main",)
    config: DetectorConfig

    def __init__(self, config: DetectorConfig | None = None) -> None:
        super().__init__(config)
        self._state: dict[str, _KeyState] = {}
        # the keys whose rules are not idle (a rule counting towards opening, or open): only these
        # of a step's screened replicas are evaluated, without asking every key's hysteresis
        self._active: set[str] = set()
        # rule_meta depends on the (frozen) config only: computed once per rule, not per key and step
        self._meta: dict[str, tuple[Severity, str | None, str]] = {}
        self._routing: dict[str, tuple[str, ...]] = {}  # rule -> routing_actions(rule), cached likewise

    # --- what subclasses provide

    @abstractmethod
    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        """Evaluate every rule for this step. ``memory`` is per-key JSON-able scratch state
        (e.g. history) that the detector may read and update; it is checkpointed."""

    @abstractmethod
    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        """(severity, action name or None, stable reason) of a rule."""

    def routing_actions(self, rule: str) -> tuple[str, ...]:
        """Router actions (``throttle``, ``isolate``, ``drain``) sent beside the rule's own action
        while its alert is open, without params. Default none: a detector's action is for the
        engine or the operator, and only health moves traffic."""
        return ()

    remembers: ClassVar[bool] = False  # True: evaluate() keeps memory every step (see remember)

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_] | None:
        """Optional: the rules judged over the step's replicas at once, as columns.

        True where :meth:`evaluate` would certainly find no rule holding and would change the
        key's memory exactly as :meth:`remember` does; such a replica whose rules are idle is
        not evaluated at all (without memory, its state is dropped: idle state is as good as
        none). It may be conservative (False where unsure: evaluate decides). Default None:
        evaluate every replica. The detector contract test checks every ``quiet`` against
        ``evaluate`` on random vectors.
        """
        return None

    def remember(self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]) -> None:
        """What :meth:`evaluate` does to ``memory``, alone (detectors with ``remembers``)."""

    def remember_step(self, step: StepColumns, rows: npt.NDArray[np.int64]) -> None:
        """:meth:`remember` for the step's ``rows`` (replicas the screen cleared, rules idle).
        Detectors that keep their history as columns override it to do the whole step at once."""
        state = self._state
        remember = self.remember
        vectors, keys, telemetry_of = step.vectors, step.keys, step.telemetry
        for row in rows.tolist():
            key = keys[row]
            found = state.get(key)
            if found is None:
                found = state[key] = _KeyState(len(self.rules))
            remember(vectors[row], telemetry_of[row], found.memory)

    def prepare(self, step: StepColumns | None) -> None:
        """Optional: read what the rules need from the whole step before any replica of it is
        evaluated (the pool's baselines: each replica's peers); called with None once the step is
        done, so that a lone :meth:`update` (no pool) never sees another step's peers."""

    def key_memory(self, key: str) -> dict[str, Any]:
        """``key``'s memory, created if needed (for :meth:`prepare`, which may keep per-replica
        history of every replica of the step before it is evaluated)."""
        key_state = self._state.get(key)
        if key_state is None:
            key_state = self._state[key] = _KeyState(len(self.rules))
        return key_state.memory

    # --- the machinery

    def update(self, fv: FeatureVector, telemetry: TelemetrySample | None, now: float) -> DetectorOutput:
        out = DetectorOutput()
        self.update_into(fv, telemetry, now, out.alerts, out.actions)
        return out

    def update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
        self.prepare(step)
        try:
            self._update_step(step, now, alerts, actions)
        finally:
            self.prepare(None)

    def _update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
        quiet = self.quiet(step)
        if quiet is None:
            Detector.update_step(self, step, now, alerts, actions)
            return
        state = self._state
        update_into = self.update_into
        remembers = self.remembers
        if not remembers:
            # only the replicas the screen did not clear, and those with state (their alert open
            # or counting: idle state is dropped below), in step order
            rows = set(np.flatnonzero(~quiet).tolist())
            row_of = step.row_of
            rows.update(row_of[key] for key in state if key in row_of)
            vectors, keys, telemetry_of = step.vectors, step.keys, step.telemetry
            for row in sorted(rows):
                key = keys[row]
                if quiet[row]:
                    key_state = state[key]
                    if key_state.rules_idle() and not key_state.memory:
                        del state[key]
                        continue
                update_into(vectors[row], telemetry_of[row], now, alerts, actions)
            return
        # a detector with a history: every replica records it, the screened ones whose rules are
        # idle only that (all at once), the others are evaluated in step order. Each touches its
        # own key's history only, so recording first changes nothing the evaluations see.
        judge = ~quiet
        if self._active:
            row_of = step.row_of
            active = [row_of[key] for key in self._active if key in row_of]
            judge[active] = True
        self.remember_step(step, np.flatnonzero(~judge))
        vectors, telemetry_of = step.vectors, step.telemetry
        for row in np.flatnonzero(judge).tolist():
            update_into(vectors[row], telemetry_of[row], now, alerts, actions)

    def update_into(
        self,
        fv: FeatureVector,
        telemetry: TelemetrySample | None,
        now: float,
        alerts: list[Alert],
        actions: list[Action],
    ) -> None:
        cfg = self.config
        key = fv.key
        key_state = self._state.get(key)
        if key_state is None:
            key_state = self._state[key] = _KeyState(len(self.rules))
        findings = self.evaluate(fv, telemetry, key_state.memory)
        idle = True
        for rule, rule_state in zip(self.rules, key_state.rules, strict=True):
            finding = findings.get(rule, _NOT_EVALUATED)
            hysteresis = rule_state.hysteresis
            transition = hysteresis.observe(
                finding.holds, persistence=cfg.persistence, clear_steps=cfg.clear_steps, now=now,
                steps=finding.steps)
            if hysteresis.hits or hysteresis.is_open:
                idle = False
            if finding.holds:
                # remember what the last holding step said: the action keeps these params while
                # the alert is clearing, and the resolve alert can cite the opening message
                rule_state.message = finding.message
                rule_state.params = dict(finding.params)
            if transition == "none":  # closed and not opening: nothing to say or do
                continue
            meta = self._meta.get(rule)
            if meta is None:
                meta = self._meta[rule] = self.rule_meta(rule)
            severity, action, reason = meta
            routing = self._routing.get(rule)
            if routing is None:
                routing = self._routing[rule] = self.routing_actions(rule)
            if transition == "open":
                alerts.append(self._alert(fv, now, severity, "open", finding.message, finding.evidence, rule))
            elif transition == "resolve":
                why = "condition cleared" if finding.holds is False else "signal missing, condition not observed"
                opened = rule_state.message if rule_state.message is not None else reason
                message = f"resolved ({why}): {opened}"
                alerts.append(self._alert(fv, now, severity, "resolved", message, finding.evidence, rule))
                rule_state.params = None
            if hysteresis.is_open and action is not None and fv.replica is not None:
                actions.append(
                    Action(
                        replica=fv.replica,
                        action=action,
                        severity=severity,
                        reason=reason,
                        params=dict(rule_state.params or {}),
                        expires_at=now + cfg.action_ttl_s,
                    )
                )
            if hysteresis.is_open and routing and fv.replica is not None:
                actions.extend(
                    Action(replica=fv.replica, action=name, severity=severity, reason=reason, params={},
                           expires_at=now + cfg.action_ttl_s)
                    for name in routing
                )
        if idle:
            self._active.discard(key)
        else:
            self._active.add(key)

    def _alert(
        self,
        fv: FeatureVector,
        now: float,
        severity: Severity,
        state: AlertState,
        message: str,
        evidence: Evidence,
        rule: str,
    ) -> Alert:
        evidence = dict(evidence)
        if len(self.rules) > 1:
            evidence["rule"] = rule
        return Alert(
            ts=now,
            model=fv.model,
            replica=fv.replica,
            detector=self.name,
            severity=severity,
            state=state,
            message=message,
            evidence=evidence,
        )

    def column_memory(self) -> dict[str, dict[str, Any]]:
        """Per key, the memory entries a detector keeps as columns rather than in the key's
        memory (its history of the whole step at once), as the memory would hold them: a
        checkpoint stores them there, so its format does not depend on where they live."""
        return {}

    def load_column_memory(self, key: str, memory: dict[str, Any]) -> None:
        """Take the entries :meth:`column_memory` writes out of a loaded key's ``memory`` (after
        :meth:`clear_column_memory`)."""

    def clear_column_memory(self) -> None:
        """Drop every key's column memory (a state is being loaded)."""

    def state_dict(self) -> dict[str, Any]:
        # serialised on request only (a checkpoint): fresh plain containers the caller may keep
        # in key order, and without the keys whose state is the same as none (rules idle with
        # nothing kept, no memory): one state, one checkpoint, whichever replicas were evaluated
        columns = self.column_memory()
        keys: dict[str, Any] = {}
        for key in sorted(self._state.keys() | columns.keys()):
            ks = self._state.get(key)
            if ks is None:
                ks = _KeyState(len(self.rules))
            elif not ks.memory and key not in columns and ks.rules_idle() and all(
                    rs.message is None and rs.params is None for rs in ks.rules):
                continue
            memory = _plain(ks.memory)
            memory.update(columns.get(key, {}))
            keys[key] = {"rules": {rule: rs.to_dict() for rule, rs in zip(self.rules, ks.rules, strict=True)},
                         "memory": memory}
        return {"v": STATE_VERSION, "detector": self.name, "keys": keys}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("v") != STATE_VERSION or state.get("detector") != self.name:
            raise ValueError(f"{self.name}: cannot load state {state.get('detector')!r} v{state.get('v')!r}")
        loaded: dict[str, _KeyState] = {}
        self.clear_column_memory()
        for key, data in state.get("keys", {}).items():
            key_state = _KeyState(0)
            rules = data.get("rules", {})
            key_state.rules = [
                _RuleState.from_dict(rules[rule]) if rule in rules else _RuleState() for rule in self.rules
            ]
            key_state.memory = _plain(dict(data.get("memory", {})))
            self.load_column_memory(str(key), key_state.memory)
            loaded[str(key)] = key_state
        self._state = loaded
        self._active = {key for key, key_state in loaded.items() if not key_state.rules_idle()}

    def forget(self, key: str) -> None:
        self._state.pop(key, None)
        self._active.discard(key)

    def open_alerts(self) -> dict[str, Severity]:
        result: dict[str, Severity] = {}
        for key, key_state in self._state.items():
            for rule, rule_state in zip(self.rules, key_state.rules, strict=True):
                if rule_state.hysteresis.is_open:
                    suffix = f"#{rule}" if len(self.rules) > 1 else ""
                    result[key + suffix] = self.rule_meta(rule)[0]
        return result


_SCALARS = frozenset({float, int, str, bool, type(None)})
_STR = frozenset({str})


def _plain(value: Any) -> Any:
    """A deep copy made of dicts, lists and scalars only (JSON-able as long as the leaves are).

    Checkpoints copy every key's memory, so the usual shapes (scalars, a dict of scalars) are
    recognised by their exact type before the general (abstract base class) checks.
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        if _SCALARS.issuperset(map(type, value.values())) and _STR.issuperset(map(type, value)):
            return dict(value)
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


__all__ = ["DetectorConfig", "Finding", "ThresholdDetector"]
