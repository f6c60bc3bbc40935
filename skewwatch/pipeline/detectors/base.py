"""What every detector shares: alerts, actions, configuration, hysteresis and JSON-able state.

Seed §2.5 gives each detector a rule, a severity and an action; the issue adds that a condition
on the threshold's edge must not flap. The shared machinery here turns a per-step boolean
("does the rule hold for this key now?") into alerts:

* an alert **opens** (one ``open`` alert) once the rule has held for ``persistence``
  consecutive steps;
* it **stays open** while the rule holds, and a step where it does not hold (or cannot be
  evaluated because a signal is missing) only starts the clear count;
* it **resolves** (one ``resolved`` alert) after the rule has not held for ``clear_steps``
  consecutive steps (default 2, i.e. 10 s at the 5 s step).

While an alert is open the detector returns its action on *every* step, with ``expires_at``
set ``action_ttl_s`` ahead, so a router keeps it in force while the worker lives and drops it
by itself if the worker dies. State is kept per key (``FeatureVector.key``: ``model/replica``
or ``model``) as live objects between steps, and turned into plain JSON-able data only when a
checkpoint asks for it: ``state_dict()`` / ``load_state()``.

Every threshold is a field of the detector's ``Config`` (a msgspec Struct beside the detector),
default = the seed's value, overridable from ``[detectors.<name>]`` in the TOML file or
``SKEWWATCH_DETECTORS__<NAME>__<KEY>``; the settings loader checks it when the settings load.

>>> h = Hysteresis()
>>> [h.observe(x, persistence=2, clear_steps=2) for x in (True, True, False, True, False, False)]
['none', 'open', 'hold', 'hold', 'hold', 'resolve']
>>> Hysteresis.from_dict(h.to_dict()) == h
True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from skewwatch.config_section import Count, FrozenConfigSection, Positive
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.telemetry import TelemetrySample

STATE_VERSION = 1

Evidence = dict[str, float | int | str | None]


class Severity(StrEnum):
    INFO = "INFO"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


AlertState = Literal["open", "resolved"]


@dataclass(frozen=True, slots=True)
class Alert:
    """One record on ``llm.alerts``: a detection opening or resolving for a model/replica."""

    ts: float  # event time of the step (window_end) that opened / resolved it
    model: str
    replica: str | None  # None for a model-level alert
    detector: str
    severity: Severity
    state: AlertState
    message: str
    evidence: Evidence = field(default_factory=dict)  # the numbers that triggered it

    @property
    def key(self) -> str:
        """Identity of the alert: one open alert per (model, replica, detector[, rule]).

        Detectors with several rules (kv_pressure) name the rule in ``evidence["rule"]``.
        """
        rule = self.evidence.get("rule")
        base = f"{self.model}/{self.replica or '*'}/{self.detector}"
        return base if rule is None else f"{base}#{rule}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "model": self.model,
            "replica": self.replica,
            "detector": self.detector,
            "severity": str(self.severity),
            "state": self.state,
            "message": self.message,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        state = data["state"]
        if state not in ("open", "resolved"):
            raise ValueError(f"alert state must be open or resolved, got {state!r}")
        return cls(
            ts=float(data["ts"]),
            model=data["model"],
            replica=data.get("replica"),
            detector=data["detector"],
            severity=Severity(data["severity"]),
            state=state,
            message=data["message"],
            evidence=dict(data.get("evidence") or {}),
        )


@dataclass(frozen=True, slots=True)
class Action:
    """What the router should do for one replica; in force until ``expires_at`` (epoch s)."""

    replica: str
    action: str  # enable_tracing | adjust_batch_policy | prewarm_tokenizer_cache | throttle | isolate | drain
    severity: Severity
    reason: str  # stable text (numbers live in the alert's evidence), so re-sending is a no-op
    params: dict[str, Any] = field(default_factory=dict)
    expires_at: float | None = None  # None: until withdrawn

    @property
    def identity(self) -> tuple[str, str, str, str, tuple[tuple[str, Any], ...]]:
        """Everything but ``expires_at``: two steps that keep the same action in force agree here."""
        return (
            self.replica,
            self.action,
            str(self.severity),
            self.reason,
            tuple(sorted(self.params.items())),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "action": self.action,
            "severity": str(self.severity),
            "reason": self.reason,
            "params": dict(self.params),
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        expires = data.get("expires_at")
        return cls(
            replica=data["replica"],
            action=data["action"],
            severity=Severity(data["severity"]),
            reason=data.get("reason", ""),
            params=dict(data.get("params") or {}),
            expires_at=None if expires is None else float(expires),
        )


@dataclass(slots=True)
class DetectorOutput:
    """What one ``update`` produced: alert transitions and the actions in force."""

    alerts: list[Alert] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)

    def extend(self, other: DetectorOutput) -> None:
        self.alerts.extend(other.alerts)
        self.actions.extend(other.actions)


# --------------------------------------------------------------------------- configuration


class DetectorConfig(FrozenConfigSection, frozen=True):
    """Fields every hysteresis detector has; subclasses add their thresholds (seed defaults)."""

    section = "detectors.detector"

    persistence: Count = 1  # consecutive steps the rule must hold before the alert opens
    clear_steps: Count = 2  # consecutive steps the rule must not hold before it resolves
    action_ttl_s: Positive = 60.0  # actions expire this long after the last step that re-sent them


# --------------------------------------------------------------------------- hysteresis

Transition = Literal["none", "open", "hold", "resolve"]


@dataclass(slots=True)
class Hysteresis:
    """Open after ``persistence`` steps that hold, resolve after ``clear_steps`` that do not.

    ``observe`` takes ``True`` (holds), ``False`` (does not) or ``None`` (cannot be evaluated,
    e.g. a missing signal): ``None`` counts as not holding, so an alert whose evidence vanished
    resolves rather than staying open forever, and a persistence count never spans a gap.
    """

    hits: int = 0  # consecutive steps the condition held
    misses: int = 0  # consecutive steps it did not, while open
    is_open: bool = False
    opened_at: float | None = None

    def observe(self, holds: bool | None, *, persistence: int, clear_steps: int, now: float = 0.0) -> Transition:
        if holds:
            self.hits += 1
            self.misses = 0
            if self.is_open:
                return "hold"
            if self.hits >= persistence:
                self.is_open = True
                self.opened_at = now
                return "open"
            return "none"
        self.hits = 0
        if not self.is_open:
            return "none"
        self.misses += 1
        if self.misses >= clear_steps:
            self.is_open = False
            self.misses = 0
            self.opened_at = None
            return "resolve"
        return "hold"

    def to_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "open": self.is_open, "opened_at": self.opened_at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hysteresis:
        return cls(
            hits=int(data.get("hits", 0)),
            misses=int(data.get("misses", 0)),
            is_open=bool(data.get("open", False)),
            opened_at=data.get("opened_at"),
        )


# --------------------------------------------------------------------------- detectors


class StepColumns:
    """One model's step as seen by its detectors: the per-replica inputs in one order, and any
    numeric field of them as a column (float64, NaN for None), built on first use and shared.

    >>> fv = FeatureVector(model="m", replica="a", window_start=0.0, window_end=60.0, count=5, latency_p50=10.0)
    >>> cols = StepColumns([fv, FeatureVector(model="m", replica="b", window_start=0.0, window_end=60.0, count=0)],
    ...                    [None, None])
    >>> cols.keys, cols.column("count").tolist(), cols.column("latency_p50").tolist()
    (['m/a', 'm/b'], [5.0, 0.0], [10.0, nan])
    """

    __slots__ = ("vectors", "telemetry", "keys", "_columns", "_telemetry_columns", "_row_of")

    def __init__(
        self,
        vectors: Sequence[FeatureVector],
        telemetry: Sequence[TelemetrySample | None],
        keys: Sequence[str] | None = None,
    ) -> None:
        self.vectors = vectors
        self.telemetry = telemetry  # the fresh sample per replica, None when absent or stale
        self.keys = list(keys) if keys is not None else [fv.key for fv in vectors]
        self._columns: dict[str, npt.NDArray[np.float64]] = {}
        self._telemetry_columns: dict[str, npt.NDArray[np.float64]] = {}
        self._row_of: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.vectors)

    @property
    def row_of(self) -> dict[str, int]:
        """Key -> its row (built on first use)."""
        if self._row_of is None:
            self._row_of = {key: row for row, key in enumerate(self.keys)}
        return self._row_of

    def column(self, name: str) -> npt.NDArray[np.float64]:
        """``FeatureVector.<name>`` of every replica."""
        found = self._columns.get(name)
        if found is None:
            found = self._columns[name] = _floats(map(attrgetter(name), self.vectors), len(self.vectors))
        return found

    def telemetry_column(self, name: str) -> npt.NDArray[np.float64]:
        """``TelemetrySample.<name>`` of every replica's fresh sample (NaN without one)."""
        found = self._telemetry_columns.get(name)
        if found is None:
            get = attrgetter(name)
            found = self._telemetry_columns[name] = _floats(
                (None if sample is None else get(sample) for sample in self.telemetry), len(self.telemetry)
            )
        return found


def _floats(values: Iterable[Any], n: int) -> npt.NDArray[np.float64]:
    # None becomes NaN; fromiter is ~1.5-3x np.array(list) per value (most with None), no list built
    return np.fromiter(values, np.float64, n)


class Detector(ABC):
    """A pure, stateful detector: ``update`` once per key per step, state as plain data on request.

    Live state is kept as objects between steps; ``state_dict`` serialises it only when a
    checkpoint is taken, and ``load_state`` rebuilds the objects.
    """

    name: ClassVar[str]
    Config: ClassVar[type[FrozenConfigSection]] = DetectorConfig

    def __init__(self, config: FrozenConfigSection | None = None) -> None:
        self.config = config if config is not None else self.Config()
        if not isinstance(self.config, self.Config):
            raise TypeError(f"{self.name}: config must be {self.Config.__name__}, got {type(config).__name__}")

    @abstractmethod
    def update(self, fv: FeatureVector, telemetry: TelemetrySample | None, now: float) -> DetectorOutput:
        """Fold one step of one key (``fv.key``) in; return alert transitions and actions in force.

        ``telemetry`` is the replica's latest *fresh* sample (None when absent or stale);
        ``now`` is the step's event time (``fv.window_end``), never the wall clock.
        """

    def update_into(
        self,
        fv: FeatureVector,
        telemetry: TelemetrySample | None,
        now: float,
        alerts: list[Alert],
        actions: list[Action],
    ) -> None:
        """``update``, appending to the caller's lists (the decider's hot path: no output object
        per key and step). Detectors on that path override it and implement ``update`` with it."""
        out = self.update(fv, telemetry, now)
        alerts.extend(out.alerts)
        actions.extend(out.actions)

    def update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
        """``update`` every replica of one model's step (the decider's entry point), in ``step``
        order. Detectors that can judge the step as columns override it."""
        update_into = self.update_into
        for fv, telemetry in zip(step.vectors, step.telemetry, strict=True):
            update_into(fv, telemetry, now, alerts, actions)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """All per-key state as JSON-able data."""

    @abstractmethod
    def load_state(self, state: Mapping[str, Any]) -> None:
        """Replace all state with one produced by ``state_dict`` (of this detector's version)."""

    @abstractmethod
    def forget(self, key: str) -> None:
        """Drop a key's state (a replica released by the windows)."""

    @abstractmethod
    def open_alerts(self) -> dict[str, Severity]:
        """Keys with an open alert and its severity (for the open-alerts metric)."""


@dataclass(slots=True)
class Finding:
    """One evaluation of one rule (a detector may have several, e.g. kv_pressure's two)."""

    holds: bool | None  # None: a signal is missing, no claim either way
    message: str = ""
    evidence: Evidence = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)  # the action's params when it holds


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

    # --- the machinery

    def update(self, fv: FeatureVector, telemetry: TelemetrySample | None, now: float) -> DetectorOutput:
        out = DetectorOutput()
        self.update_into(fv, telemetry, now, out.alerts, out.actions)
        return out

    def update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
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
        # a detector with a history: every replica records it, the screened ones only that
        for fv, key, telemetry, is_quiet in zip(step.vectors, step.keys, step.telemetry, quiet.tolist(), strict=True):
            if is_quiet:
                found = state.get(key)
                if found is None:
                    found = state[key] = _KeyState(len(self.rules))
                if found.rules_idle():
                    self.remember(fv, telemetry, found.memory)
                    continue
            update_into(fv, telemetry, now, alerts, actions)

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
        for rule, rule_state in zip(self.rules, key_state.rules, strict=True):
            finding = findings.get(rule, _NOT_EVALUATED)
            hysteresis = rule_state.hysteresis
            transition = hysteresis.observe(
                finding.holds, persistence=cfg.persistence, clear_steps=cfg.clear_steps, now=now
            )
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

    def state_dict(self) -> dict[str, Any]:
        # serialised on request only (a checkpoint): fresh plain containers the caller may keep
        keys = {
            key: {
                "rules": {rule: rs.to_dict() for rule, rs in zip(self.rules, ks.rules, strict=True)},
                "memory": _plain(ks.memory),
            }
            for key, ks in self._state.items()
        }
        return {"v": STATE_VERSION, "detector": self.name, "keys": keys}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("v") != STATE_VERSION or state.get("detector") != self.name:
            raise ValueError(f"{self.name}: cannot load state {state.get('detector')!r} v{state.get('v')!r}")
        loaded: dict[str, _KeyState] = {}
        for key, data in state.get("keys", {}).items():
            key_state = _KeyState(0)
            rules = data.get("rules", {})
            key_state.rules = [
                _RuleState.from_dict(rules[rule]) if rule in rules else _RuleState() for rule in self.rules
            ]
            key_state.memory = _plain(dict(data.get("memory", {})))
            loaded[str(key)] = key_state
        self._state = loaded

    def forget(self, key: str) -> None:
        self._state.pop(key, None)

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


def fmt(value: float | None, digits: int = 1) -> str:
    """A number for a message: fixed digits, 'n/a' when unknown."""
    return "n/a" if value is None else f"{value:.{digits}f}"
