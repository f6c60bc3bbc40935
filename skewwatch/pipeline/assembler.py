"""Stage 2's completion rule: when is a model's 5 s step complete?

Stage 1 (partitioned by replica) sends one summary per replica per closed step, silent
replicas included; stage 2 (partitioned by model) must have *all* of a model's replicas for a
step before it merges them and normalises weights. The replicas of a model are spread over
stage 1's input partitions, and those partitions progress at different speeds (one may be
replaying a backlog while another is live), so "every replica I know of has reported" is not
enough: a replica not yet seen would be left out, and a backlog replay would complete steps
with only the fastest partition's replicas.

The rule is the min-watermark rule of Flink and Kafka Streams: after closing steps, every
stage 1 partition announces its progress ("I have closed every step up to E") to every stage 2
partition. A step ending at E is complete once *every* input partition has announced
progress >= E: then every summary for E that will ever come has come (a partition's summaries
precede its progress marker on the same stage 2 partition). Idle input partitions follow the
others in stage 1, so they do not stall the rule; a replica missing from a complete step is
simply silent, which the weights treat as a signal. Summaries for an already completed step
(a replay after a rebalance) are counted as late and dropped.

>>> a = StepAssembler()
>>> a.add("m", 10.0, "r1", {"n": 1})
>>> a.progress(source=0, closed_end=10.0, sources=2)
>>> a.complete()  # partition 1 has not closed step 10 yet: r2 may still come
[]
>>> a.add("m", 10.0, "r2", {"n": 2})
>>> a.progress(source=1, closed_end=15.0, sources=2)
>>> [(s.model, s.window_end, sorted(s.payloads)) for s in a.complete()]
[('m', 10.0, ['r1', 'r2'])]
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
    completed_until: float = float("-inf")  # newest window_end released


class StepAssembler:
    def __init__(self) -> None:
        self.models: dict[str, _ModelPending] = {}
        self.source_progress: dict[int, float] = {}  # input partition -> newest closed step end
        self.sources = 0  # number of input partitions
        self.late = 0

    def add(self, model: str, window_end: float, replica: str, payload: dict[str, Any]) -> None:
        pending = self.models.setdefault(model, _ModelPending())
        if window_end <= pending.completed_until:
            self.late += 1
            return
        pending.steps.setdefault(window_end, {})[replica] = payload

    def progress(self, source: int, closed_end: float, sources: int) -> None:
        """Input partition ``source`` (of ``sources``) has closed every step ending <= ``closed_end``."""
        self.sources = max(self.sources, sources)
        if closed_end > self.source_progress.get(source, float("-inf")):
            self.source_progress[source] = closed_end

    @property
    def complete_until(self) -> float | None:
        """Every step ending at or before this is complete; None until every input reported."""
        if self.sources == 0 or len(self.source_progress) < self.sources:
            return None
        return min(self.source_progress.values())

    def complete(self, force_until: float | None = None) -> list[ModelStep]:
        """Release every complete step, oldest first; ``force_until`` also releases steps ending at or
        before it (the worker uses it when its input has gone quiet on the wall clock)."""
        limit = self.complete_until
        if force_until is not None:
            limit = force_until if limit is None else max(limit, force_until)
        if limit is None:
            return []
        done: list[ModelStep] = []
        for model, pending in self.models.items():
            for end in sorted(e for e in pending.steps if e <= limit):
                done.append(ModelStep(model, end, pending.steps.pop(end)))
                pending.completed_until = end
        return done

    def oldest_pending(self) -> float | None:
        ends = [min(p.steps) for p in self.models.values() if p.steps]
        return min(ends) if ends else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "late": self.late,
            "sources": self.sources,
            "source_progress": {str(k): v for k, v in self.source_progress.items()},
            "models": {
                model: {
                    "steps": [[end, payloads] for end, payloads in sorted(p.steps.items())],
                    "completed_until": p.completed_until if p.completed_until != float("-inf") else None,
                }
                for model, p in self.models.items()
            },
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.late = int(state.get("late", 0))
        self.sources = int(state.get("sources", 0))
        self.source_progress = {int(k): float(v) for k, v in state.get("source_progress", {}).items()}
        self.models = {}
        for model, p in state.get("models", {}).items():
            until = p.get("completed_until")
            self.models[model] = _ModelPending(
                steps={float(end): dict(payloads) for end, payloads in p["steps"]},
                completed_until=float(until) if until is not None else float("-inf"),
            )
