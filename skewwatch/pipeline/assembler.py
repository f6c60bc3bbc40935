"""Stage 2's completion rule: when is a model's 5 s step complete?

Stage 1 (partitioned by replica) sends one summary per replica per step, silent replicas
included; stage 2 (partitioned by model) needs *all* of a model's replicas for a step before
it merges them and normalises weights. DESIGN.md: a model's step is complete when every
known replica's summary for it has arrived, or when a grace period has passed — measured in
event time (a summary ``grace_steps`` steps newer has arrived), so a replay at any speed
completes the same steps with the same replicas. A replica is *known* while it has reported
within ``forget_after_s`` of event time; its absence is itself a signal (its weight goes
stale downstream). Summaries for a step that was already completed are counted as late.

>>> a = StepAssembler(step_s=5.0, grace_steps=1, forget_after_s=90.0)
>>> a.add("m", 10.0, "r1", {"n": 1}); a.add("m", 10.0, "r2", {"n": 2})
>>> [(s.model, s.window_end, sorted(s.payloads)) for s in a.complete()]
[('m', 10.0, ['r1', 'r2'])]
>>> a.add("m", 15.0, "r1", {"n": 3})  # r2 has not reported step 15 yet: wait
>>> a.complete()
[]
>>> a.add("m", 20.0, "r1", {"n": 4})  # a step newer than the grace: 15 completes without r2
>>> [(s.window_end, sorted(s.payloads)) for s in a.complete()]
[(15.0, ['r1'])]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ModelStep:
    model: str
    window_end: float
    payloads: dict[str, dict[str, Any]]  # replica -> what stage 1 sent for this step


@dataclass(slots=True)
class _ModelPending:
    steps: dict[float, dict[str, dict[str, Any]]] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)  # replica -> newest window_end seen
    completed_until: float = float("-inf")  # newest window_end released


class StepAssembler:
    def __init__(self, step_s: float, grace_steps: int, forget_after_s: float) -> None:
        self.step_s = step_s
        self.grace_steps = grace_steps
        self.forget_after_s = forget_after_s
        self.models: dict[str, _ModelPending] = {}
        self.late = 0

    def add(self, model: str, window_end: float, replica: str, payload: dict[str, Any]) -> None:
        pending = self.models.setdefault(model, _ModelPending())
        if window_end <= pending.completed_until:
            self.late += 1
            return
        pending.steps.setdefault(window_end, {})[replica] = payload
        if window_end > pending.last_seen.get(replica, float("-inf")):
            pending.last_seen[replica] = window_end

    def complete(self, force_until: float | None = None) -> list[ModelStep]:
        """Release every complete step, oldest first; ``force_until`` also releases steps ending at or
        before it (the worker uses it when input has gone quiet on the wall clock)."""
        done: list[ModelStep] = []
        for model, pending in self.models.items():
            while pending.steps:
                end = min(pending.steps)
                newest = max(pending.steps)
                known = {r for r, seen in pending.last_seen.items() if seen > end - self.forget_after_s}
                present = pending.steps[end]
                if not (known <= present.keys() or newest >= end + self.grace_steps * self.step_s
                        or (force_until is not None and end <= force_until)):
                    break
                done.append(ModelStep(model, end, pending.steps.pop(end)))
                pending.completed_until = end
            for replica in [r for r, seen in pending.last_seen.items()
                            if seen <= pending.completed_until - self.forget_after_s]:
                del pending.last_seen[replica]
        return done

    def oldest_pending(self) -> float | None:
        ends = [min(p.steps) for p in self.models.values() if p.steps]
        return min(ends) if ends else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "late": self.late,
            "models": {
                model: {
                    "steps": [[end, payloads] for end, payloads in sorted(p.steps.items())],
                    "last_seen": p.last_seen,
                    "completed_until": p.completed_until if p.completed_until != float("-inf") else None,
                }
                for model, p in self.models.items()
            },
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.late = int(state.get("late", 0))
        self.models = {}
        for model, p in state.get("models", {}).items():
            until = p.get("completed_until")
            self.models[model] = _ModelPending(
                steps={float(end): dict(payloads) for end, payloads in p["steps"]},
                last_seen={r: float(v) for r, v in p["last_seen"].items()},
                completed_until=float(until) if until is not None else float("-inf"),
            )
