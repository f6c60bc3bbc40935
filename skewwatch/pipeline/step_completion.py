"""Stage 2's completion rule: when is a model's 5 s step complete?

Stage 1 (partitioned by replica) sends, for every closed step, one record per (input partition,
model) holding a summary of every replica of that model there, silent replicas included
(:mod:`skewwatch.pipeline.replica_step_record`); stage 2 (partitioned by model) must have *all* of a model's
replicas for a step before it merges them and normalises weights. The replicas of a model are spread
over stage 1's input partitions, and those partitions progress at different speeds (one may be
replaying a backlog while another is live), so "every replica I know of has reported" is not
enough: a replica not yet seen would be left out, and a backlog replay would complete steps
with only the fastest partition's replicas.

The rule is the min-watermark rule of Flink and Kafka Streams: after closing steps, every
stage 1 partition announces its progress ("I have closed every step up to E") to every stage 2
partition. A step ending at E is complete once *every* input partition has announced
progress >= E: then every record for E that will ever come has come (a partition's records
precede its progress marker on the same stage 2 partition). Idle input partitions follow the
others in stage 1, so they do not stall the rule; a replica missing from a complete step is
simply silent, which the weights treat as a signal. Records for an already completed step
(a replay after a rebalance) are counted as late and dropped.

**A model without summaries.** Stage 1 stops reporting a replica long without requests, so a
model whose whole pool is silent gets no record at all, and would never be decided again. Given
the step length, :meth:`StepAssembler.complete` also releases an *empty* step for every model it
knows at every step end the min-watermark has passed (while other models move event time on), and
the worker uses the same to let time pass when no input arrives at all (``force_until``).

Memory: the worker holds each pending record as its bytes (~2 KB per replica step with a telemetry
sample), decoded when the step completes and embedded in a checkpoint as they are (base64), and the
number of replica steps held is bounded (``max_pending``): past it, the oldest pending steps are
released incomplete (``forced``), so one input partition far behind the others cannot make stage 2
hold its whole backlog.

>>> a = StepAssembler()
>>> a.add_chunk("m", 10.0, source=0, replicas=2, payload=b"r1 r2")
>>> a.progress(source=0, closed_end=10.0, sources=2)
>>> a.complete()  # partition 1 has not closed step 10 yet: its replicas may still come
[]
>>> a.add_chunk("m", 10.0, source=1, replicas=1, payload=b"r3")
>>> a.progress(source=1, closed_end=15.0, sources=2)
>>> [(s.model, s.window_end, s.chunks) for s in a.complete()]
[('m', 10.0, {(0, 0): b'r1 r2', (1, 0): b'r3'})]

A chunk counts the replica steps it holds; a re-sent chunk of the same input partition replaces it:

>>> a.add_chunk("m", 15.0, source=0, replicas=3, payload=b"first")
>>> a.add_chunk("m", 15.0, source=0, replicas=3, payload=b"again")
>>> a.add_chunk("m", 15.0, source=1, replicas=2, payload=b"other")
>>> a.pending, a.complete(force_until=15.0)[0].chunks
(5, {(0, 0): b'again', (1, 0): b'other'})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Replica steps held per assembler before the oldest pending steps are released incomplete:
# the worker holds them as the records' bytes (~2 KB each), so about 40 MB; live operation holds one
# or two steps of a partition's replicas, only a far-behind input partition gets near it.
DEFAULT_MAX_PENDING = 20_000


@dataclass(slots=True)
class ModelStep:
    """A released step of one model: the records that came for it."""

    model: str
    window_end: float
    # (input partition, part) -> the record of the model's replicas that partition closed this step (one
    # record per input partition, model and step, split in parts past a size; pipeline/replica_step_record.py)
    chunks: dict[tuple[int, int], Any] = field(default_factory=dict)
    complete: bool = True  # False: released by the memory bound before every input partition reported


@dataclass(slots=True)
class _PendingStep:
    chunks: dict[tuple[int, int], tuple[int, Any]] = field(default_factory=dict)  # -> (replica steps, payload)

    @property
    def size(self) -> int:
        return sum(n for n, _ in self.chunks.values())


@dataclass(slots=True)
class _ModelPending:
    steps: dict[float, _PendingStep] = field(default_factory=dict)
    completed_until: float = float("-inf")  # newest window_end released


class StepAssembler:
    """Pending replica steps per model until the min-watermark completes them.

    A step arrives as one chunk per input partition (and part) holding all of the model's replicas
    there (:meth:`add_chunk`), each counting its replica steps for ``max_pending``.
    ``max_pending`` bounds memory: when more replica steps than that are held, the oldest
    pending steps (of any model) are released as they are (``ModelStep.complete`` False,
    counted in ``forced``), as if their missing replicas were silent.
    """

    def __init__(self, max_pending: int | None = None) -> None:
        self.models: dict[str, _ModelPending] = {}
        self.source_progress: dict[int, float] = {}  # input partition -> newest closed step end
        self.sources = 0  # number of input partitions
        self.late = 0  # replica steps that came after their step was released
        self.forced = 0  # steps released incomplete by the memory bound
        self.pending = 0  # replica steps held
        self.max_pending = max_pending

    def _pending_step(self, model: str, window_end: float, replicas: int) -> _PendingStep | None:
        pending = self.models.setdefault(model, _ModelPending())
        if window_end <= pending.completed_until:
            self.late += replicas
            return None
        step = pending.steps.get(window_end)
        if step is None:
            step = pending.steps[window_end] = _PendingStep()
        return step

    def add_chunk(self, model: str, window_end: float, source: int, replicas: int, payload: Any,
                  part: int = 0) -> None:
        """The replicas of ``model`` that input partition ``source`` closed at ``window_end`` (part
        ``part`` of them), as one payload holding ``replicas`` replica steps."""
        step = self._pending_step(model, window_end, replicas)
        if step is None:
            return
        earlier = step.chunks.get((source, part))
        self.pending += replicas - (earlier[0] if earlier is not None else 0)
        step.chunks[(source, part)] = (replicas, payload)  # a re-sent chunk (a replay) replaces the earlier one

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

    def complete(self, force_until: float | None = None, step_s: float | None = None) -> list[ModelStep]:
        """Release every complete step, oldest first; ``force_until`` also releases steps ending at or
        before it (the worker uses it when its input has gone quiet on the wall clock). With
        ``step_s``, a model with no record for a step end up to there gets an empty step (no
        chunks: none of its replicas reported). Then, while more than ``max_pending`` replica steps
        are held, the oldest pending steps.

        >>> a = StepAssembler()
        >>> a.add_chunk("quiet", 5.0, source=0, replicas=1, payload=b"q"); a.add_chunk("busy", 5.0, 0, 1, b"b")
        >>> [(s.model, s.window_end) for s in a.complete(force_until=5.0)]
        [('quiet', 5.0), ('busy', 5.0)]
        >>> a.add_chunk("busy", 15.0, source=0, replicas=1, payload=b"b")
        >>> [(s.model, s.window_end, len(s.chunks)) for s in a.complete(force_until=15.0, step_s=5.0)]
        [('quiet', 10.0, 0), ('quiet', 15.0, 0), ('busy', 10.0, 0), ('busy', 15.0, 1)]
        """
        limit = self.complete_until
        if force_until is not None:
            limit = force_until if limit is None else max(limit, force_until)
        done: list[ModelStep] = []
        if limit is not None:
            for model, pending in self.models.items():
                ends = {e for e in pending.steps if e <= limit}
                if step_s is not None and pending.completed_until != float("-inf"):
                    first = pending.completed_until
                    k = 1
                    while first + k * step_s <= limit + 1e-9:
                        ends.add(first + k * step_s)
                        k += 1
                for end in sorted(ends):
                    if end in pending.steps:
                        done.append(self._release(model, pending, end, complete=True))
                    else:
                        pending.completed_until = end
                        done.append(ModelStep(model, end, {}))
        while self.max_pending is not None and self.pending > self.max_pending:
            end, model = min((min(p.steps), m) for m, p in self.models.items() if p.steps)
            done.append(self._release(model, self.models[model], end, complete=False))
            self.forced += 1
        return done

    def _release(self, model: str, pending: _ModelPending, end: float, complete: bool) -> ModelStep:
        step = pending.steps.pop(end)
        self.pending -= step.size
        pending.completed_until = end
        return ModelStep(model, end, {key: payload for key, (_, payload) in step.chunks.items()}, complete)

    def newest_end(self) -> float | None:
        """The newest step end released or pending, over every model (None before any)."""
        ends = [max([p.completed_until, *p.steps]) for p in self.models.values()]
        ends = [e for e in ends if e != float("-inf")]
        return max(ends) if ends else None

    def oldest_pending(self) -> float | None:
        """The end of the oldest step still pending, of any model (None when nothing is)."""
        ends = [min(p.steps) for p in self.models.values() if p.steps]
        return min(ends) if ends else None

    def state_dict(self, encode: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        """JSON-able state; ``encode`` turns a chunk's payload into JSON-able data (default: as is).

        A pending step is ``[end, [[source, part, replica steps, chunk], ...]]``.
        """
        enc = encode or (lambda payload: payload)
        return {
            "late": self.late,
            "forced": self.forced,
            "sources": self.sources,
            "source_progress": {str(k): v for k, v in self.source_progress.items()},
            "models": {
                model: {
                    "steps": [[end, [[source, part, n, enc(x)] for (source, part), (n, x) in step.chunks.items()]]
                              for end, step in sorted(p.steps.items())],
                    "completed_until": p.completed_until if p.completed_until != float("-inf") else None,
                }
                for model, p in self.models.items()
            },
        }

    def load_state(self, state: dict[str, Any], decode: Callable[[Any], Any] | None = None) -> None:
        """Inverse of :meth:`state_dict`; ``decode`` inverts its encoder. ValueError when ``state`` is not
        in that layout."""
        dec = decode or (lambda payload: payload)
        try:
            late, forced, sources = int(state["late"]), int(state["forced"]), int(state["sources"])
            progress = {int(k): float(v) for k, v in state["source_progress"].items()}
            models: dict[str, _ModelPending] = {}
            pending = 0
            for model, p in state["models"].items():
                until = p["completed_until"]
                steps: dict[float, _PendingStep] = {}
                for end, chunks in p["steps"]:
                    step = steps[float(end)] = _PendingStep(
                        chunks={(int(source), int(part)): (int(n), dec(x)) for source, part, n, x in chunks})
                    pending += step.size
                models[str(model)] = _ModelPending(steps=steps,
                                                   completed_until=float(until) if until is not None else float("-inf"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"step assembler state: malformed ({exc!r})") from exc
        self.late, self.forced, self.sources, self.source_progress = late, forced, sources, progress
        self.models, self.pending = models, pending
