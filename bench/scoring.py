"""Pure scoring of the detection-quality benchmark: what the pipeline published against the labels.

Input: the records the worker publishes (``llm.alerts`` and ``llm.routing-corrections``, as dicts)
and the scenario's labels. Nothing here knows how they were produced (the real worker or the
in-process pipeline); ``tests/unit/test_bench_quality_scoring.py`` checks every rule on runs whose
answer is known.

**Episodes.** An *alert* is an episode of one ``(model, replica, detector, rule)``: from an
``open`` record to the next record that is not ``open`` (``resolved``, or ``stale`` where alerts
expire without evidence); a re-``open`` while open (a severity change) is the same episode. The
warm-up is not scored, but an episode still open when scoring starts counts as an alert *at* that
moment, so a rule that fires on healthy traffic from the start is not hidden by it. Model-level
alerts (``replica`` null) are *pool alerts* (:func:`pool_alert_episodes`, detector ``pool``).

Two signals have no alert of their own and are read from the weights, per correction:
``stale`` (weight 0 without a drain/isolate action naming the replica: the replica stopped
reporting) for ``replica_silence``, and ``weights`` (0 < weight < ``WEIGHT_DROP`` x an equal
share), reported beside the ``slow_replica`` alert for ``slow_replica`` (:data:`ALSO_RECALLS`).
They open on the first correction that holds and resolve after two that do not.

**Matching.** An episode is right when a label on the same model and replica (a pool label, for a
pool alert), of a kind its detector is meant for (:data:`DETECTOR_OF`; the weights accept any
replica fault but a silence), has ``start <= episode <= end + GRACE_S``. Everything else is a false
alert, including another detector firing on a faulty replica, and any replica alert on a quiet
pool's replicas. Recall: labels of the detector's kind with a right episode; delay: first right
episode - label start (event time); precision: right / all episodes of the detector; false alerts
per hour: episodes on clean pools per clean pool-hour.

**Corrections** (:func:`correction_report`), per correction record in the scored span:

- *healthy at weight 0*: a replica with weight 0 (for any reason, drains included) that has not
  had a fault so far in the run (no replica label on it has started; a quiet pool's replicas are
  healthy; after its own fault a replica may stay drained or stale until it proves itself again):
  counted as episodes like ``stale``;
- *all-zero pool*: a correction in which no replica has a positive weight;
- *faulty below every healthy replica*: per label of a replica fault, the first correction from
  its start from which the faulty replica's weight stays below every other replica's of the pool
  in every correction until the fault's end (a replica below by chance for one step does not
  count), and its delay; met when that delay is within the detector's delay target.

>>> labels = [Label("m", "r1", "long_tail", 100.0, 200.0)]
>>> eps = [Episode("m", "r1", "long_tail", "", 130.0), Episode("m", "r2", "long_tail", "", 150.0)]
>>> s = score(eps, labels, clean_models=[], clean_hours=0.0)
>>> s["long_tail"]["recall"], s["long_tail"]["precision"], s["long_tail"]["delays_s"]
(1.0, 0.5, [30.0])
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import quantile

# fault kind -> the detector (or weights signal, or pool alert) meant to catch it
DETECTOR_OF: dict[str, str] = {
    "long_tail": "long_tail",
    "batch_collapse": "batch_collapse",
    "context_burst": "context_burst",
    "gpu_fault": "gpu_health",
    "kv_pressure": "kv_pressure",
    "slow_replica": "slow_replica",
    "replica_silence": "stale",
    "quiet_pool": "pool",
    "ttft_drift": "learned",
    "throughput_drop": "learned",
}
# signals scored for recall and delay on a kind another detector owns, reported beside it: the
# weights dropping under a slow replica (what a router following them does about it)
ALSO_RECALLS: dict[str, frozenset[str]] = {"weights": frozenset({"slow_replica"})}
DETECTORS: tuple[str, ...] = tuple(dict.fromkeys(
    d for owner in DETECTOR_OF.values()
    for d in (owner, *(a for a, kinds in ALSO_RECALLS.items() if any(DETECTOR_OF[k] == owner for k in kinds)))))
# detector -> the fault kinds its recall and delay count: its own, and the ones it also recalls
RECALLS: dict[str, frozenset[str]] = {
    detector: frozenset({kind for kind, d in DETECTOR_OF.items() if d == detector}) | ALSO_RECALLS.get(detector,
                                                                                                      frozenset())
    for detector in DETECTORS}
FAULT_KINDS: tuple[str, ...] = tuple(DETECTOR_OF)
REPLICA_FAULT_KINDS: tuple[str, ...] = tuple(k for k in FAULT_KINDS if k != "quiet_pool")
# detector -> the fault kinds where its alert is right. A detector is right on its own kind; the
# weights are also right to drop on any degraded replica (that is what they are for), so a drop
# during another replica fault is not a false alert, though only slow_replica counts for their recall.
ACCEPTS: dict[str, frozenset[str]] = {
    detector: frozenset({kind for kind, d in DETECTOR_OF.items() if d == detector}) for detector in DETECTORS}
ACCEPTS["weights"] = frozenset(REPLICA_FAULT_KINDS) - {"replica_silence"}
# the learned detector may also see the faults the rules own: not a false alert, reported beside them
# (the confusion table: which detector fired on which kind)
ACCEPTS["learned"] = frozenset(REPLICA_FAULT_KINDS)
GRACE_S = 90.0  # after a fault's end, an alert still belongs to it (the 60 s window still holds it)
WEIGHT_DROP = 0.8  # `weights` signal: below 80 % of an equal share of the pool
RECALL_TARGET = PRECISION_TARGET = 0.95
RECALL_TARGETS: dict[str, float] = {"learned": 0.9}  # a detector whose recall target is not RECALL_TARGET
FALSE_PER_HOUR_TARGET = 1.0
DELAY_SLACK_S = 10.0  # delay target: persistence + 10 s


# ----------------------------------------------------------------------------- episodes


@dataclass(frozen=True, slots=True)
class Label:
    """One injected fault: ``[start, end)`` in event-time epoch seconds; ``replica`` None for a pool fault."""

    model: str
    replica: str | None
    kind: str
    start: float
    end: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Label:
        replica = data.get("replica")
        return cls(str(data["model"]), None if replica is None else str(replica), str(data["kind"]),
                   float(data["start"]), float(data["end"]))

    def covers(self, model: str, replica: str, ts: float, grace_s: float = GRACE_S) -> bool:
        """Whether this fault is on ``replica`` of ``model`` at ``ts`` (a pool fault: any replica of it)."""
        return (self.model == model and (self.replica is None or self.replica == replica)
                and self.start <= ts <= self.end + grace_s)


@dataclass(frozen=True, slots=True)
class Episode:
    """One alert: ``detector`` (``rule`` for multi-rule detectors) opened on a replica at ``start``
    (``replica`` "" for a pool alert)."""

    model: str
    replica: str
    detector: str
    rule: str
    start: float
    carried: bool = False  # already open when scoring began: counted at that moment


def _spans(alerts: Iterable[Mapping[str, Any]], pool: bool) -> list[tuple[tuple[str, str, str, str], float, float]]:
    open_since: dict[tuple[str, str, str, str], float] = {}
    spans: list[tuple[tuple[str, str, str, str], float, float]] = []  # key, start, end
    for rec in alerts:
        if (rec.get("replica") is None) is not pool:
            continue
        rule = str((rec.get("evidence") or {}).get("rule") or "")
        if pool:  # the pool row keeps which detector spoke in the rule
            key = (str(rec["model"]), "", "pool", f"{rec['detector']}:{rule}" if rule else str(rec["detector"]))
        else:
            key = (str(rec["model"]), str(rec["replica"]), str(rec["detector"]), rule)
        ts = float(rec["ts"])
        if rec["state"] == "open":
            open_since.setdefault(key, ts)
        elif key in open_since:
            spans.append((key, open_since.pop(key), ts))
    spans.extend((key, start, float("inf")) for key, start in open_since.items())
    return spans


def _episodes(spans: list[tuple[tuple[str, str, str, str], float, float]], scored_from: float,
              scored_to: float) -> list[Episode]:
    out = []
    for (model, replica, detector, rule), start, end in spans:
        if end <= scored_from or start > scored_to:
            continue
        carried = start < scored_from
        out.append(Episode(model, replica, detector, rule, scored_from if carried else start, carried))
    return sorted(out, key=lambda e: (e.start, e.model, e.replica, e.detector, e.rule))


def alert_episodes(alerts: Iterable[Mapping[str, Any]], scored_from: float, scored_to: float) -> list[Episode]:
    """Episodes of replica alerts (``llm.alerts`` records in publishing order) that count.

    Episodes that ended before ``scored_from`` are dropped, those still open then are counted at
    ``scored_from`` (``carried``); those starting after ``scored_to`` are dropped.

    >>> recs = [{"ts": 10.0, "model": "m", "replica": "r0", "detector": "d", "state": "open", "evidence": {}},
    ...         {"ts": 70.0, "model": "m", "replica": "r0", "detector": "d", "state": "open", "evidence": {}},
    ...         {"ts": 90.0, "model": "m", "replica": "r0", "detector": "d", "state": "resolved", "evidence": {}}]
    >>> alert_episodes(recs, scored_from=60.0, scored_to=200.0)
    [Episode(model='m', replica='r0', detector='d', rule='', start=60.0, carried=True)]
    """
    return _episodes(_spans(alerts, pool=False), scored_from, scored_to)


def pool_alert_episodes(alerts: Iterable[Mapping[str, Any]], scored_from: float, scored_to: float) -> list[Episode]:
    """Episodes of model-level alerts (``replica`` null), as detector ``pool`` (rule: which detector).

    >>> recs = [{"ts": 130.0, "model": "q", "replica": None, "detector": "weights", "state": "open",
    ...          "evidence": {"rule": "all_zero"}}]
    >>> pool_alert_episodes(recs, 60.0, 300.0)
    [Episode(model='q', replica='', detector='pool', rule='weights:all_zero', start=130.0, carried=False)]
    """
    return _episodes(_spans(alerts, pool=True), scored_from, scored_to)


def _weights_of(rec: Mapping[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in dict(rec.get("weights") or {}).items()}


def _blocked(rec: Mapping[str, Any]) -> set[str]:
    return {str(a.get("replica")) for a in rec.get("actions") or [] if a.get("action") in ("drain", "isolate")}


def _in_span(corrections: Iterable[Mapping[str, Any]], scored_from: float,
             scored_to: float) -> list[Mapping[str, Any]]:
    return [rec for rec in sorted(corrections, key=lambda r: (str(r["model"]), float(r["ts"])))
            if scored_from <= float(rec["ts"]) <= scored_to]


def _open_close(state: dict[tuple[str, str, str], tuple[float, int] | None], key: tuple[str, str, str],
                holds: bool, ts: float, clear: int) -> bool:
    """Advance one signal's episode state; True when an episode opens now."""
    current = state.get(key)
    if holds:
        state[key] = (current[0] if current else ts, 0)
        return current is None
    if current is not None:
        misses = current[1] + 1
        state[key] = None if misses >= clear else (current[0], misses)
    return False


def weight_episodes(corrections: Iterable[Mapping[str, Any]], scored_from: float, scored_to: float,
                    drop: float = WEIGHT_DROP, clear: int = 2) -> list[Episode]:
    """``stale`` and ``weights`` episodes from ``llm.routing-corrections`` records.

    Per correction and replica: ``stale`` holds when the weight is 0 and no drain/isolate action
    names the replica; ``weights`` when 0 < weight < ``drop`` / pool size. An episode opens on
    the first record that holds and resolves after ``clear`` consecutive records that do not.

    >>> recs = [{"model": "m", "ts": t, "weights": {"a": wa, "b": 1 - wa}, "actions": []}
    ...         for t, wa in [(60.0, 0.5), (65.0, 0.3), (70.0, 0.5), (75.0, 0.3), (80.0, 0.5), (85.0, 0.5),
    ...                       (90.0, 0.0)]]
    >>> [(e.replica, e.detector, e.start) for e in weight_episodes(recs, 60.0, 100.0)]
    [('a', 'weights', 65.0), ('a', 'stale', 90.0)]
    """
    state: dict[tuple[str, str, str], tuple[float, int] | None] = {}  # key -> (start, misses) while open
    out: list[Episode] = []
    for rec in _in_span(corrections, scored_from, scored_to):
        ts, model = float(rec["ts"]), str(rec["model"])
        weights, blocked = _weights_of(rec), _blocked(rec)
        share = 1.0 / len(weights) if weights else 0.0
        for replica, w in weights.items():
            holds = {"stale": w <= 0.0 and replica not in blocked, "weights": 0.0 < w < drop * share}
            for detector, now in holds.items():
                if _open_close(state, (model, replica, detector), now, ts, clear):
                    out.append(Episode(model, replica, detector, "", ts))
    return sorted(out, key=lambda e: (e.start, e.model, e.replica, e.detector))


# ----------------------------------------------------------------------------- matching and scores


def match(episode: Episode, labels: Sequence[Label], grace_s: float = GRACE_S) -> Label | None:
    """The label this alert is right about (same model and replica, or the pool for a pool alert; a
    kind its detector accepts; in time), preferring a label of the detector's own kind."""
    accepted = ACCEPTS.get(episode.detector, frozenset())
    hits = [label for label in labels
            if label.model == episode.model and (label.replica or "") == episode.replica
            and label.kind in accepted and label.start <= episode.start <= label.end + grace_s]
    hits.sort(key=lambda label: DETECTOR_OF.get(label.kind) != episode.detector)
    return hits[0] if hits else None


def context(episode: Episode, labels: Sequence[Label], grace_s: float = GRACE_S) -> str:
    """What was going on where the alert fired: a fault kind on that replica (or its pool), or ``clean``."""
    for label in labels:
        if label.covers(episode.model, episode.replica, episode.start, grace_s):
            return label.kind
    return "clean"


def score(episodes: Sequence[Episode], labels: Sequence[Label], clean_models: Sequence[str],
          clean_hours: float, grace_s: float = GRACE_S) -> dict[str, dict[str, Any]]:
    """Per detector: labels, detected, recall, alerts, true, precision, delays, clean false alerts.

    ``clean_models``: pools without any fault; ``clean_hours``: their scored hours (summed over
    pools), the denominator of ``false_per_hour``.

    >>> labels = [Label("m", "r1", "gpu_fault", 100.0, 200.0)]
    >>> eps = [Episode("m", "r1", "gpu_health", "", 105.0), Episode("c", "r0", "gpu_health", "", 50.0)]
    >>> s = score(eps, labels, clean_models=["c"], clean_hours=0.5)["gpu_health"]
    >>> s["recall"], s["precision"], s["clean_false"], s["false_per_hour"]
    (1.0, 0.5, 1, 2.0)
    """
    clean = set(clean_models)
    out: dict[str, dict[str, Any]] = {}
    for detector in DETECTORS:
        mine = [e for e in episodes if e.detector == detector]
        recalls = RECALLS[detector]
        targets = [lb for lb in labels if lb.kind in recalls]
        first: dict[Label, float] = {}
        true = 0
        for e in mine:
            lb = match(e, labels, grace_s)
            if lb is not None:
                true += 1
                if lb.kind in recalls:  # recall and delay: on its own kind only
                    first[lb] = min(first.get(lb, e.start), e.start)
        delays = sorted(round(first[lb] - lb.start, 3) for lb in targets if lb in first)
        clean_false = sum(1 for e in mine if e.model in clean)
        out[detector] = {
            "labels": len(targets),
            "detected": len(delays),
            "recall": len(delays) / len(targets) if targets else None,
            "alerts": len(mine),
            "true": true,
            "precision": true / len(mine) if mine else None,
            "delays_s": delays,
            "delay_median_s": statistics.median(delays) if delays else None,
            "delay_p95_s": quantile(delays, 0.95),
            "clean_false": clean_false,
            "false_per_hour": clean_false / clean_hours if clean_hours > 0 else None,
        }
    return out


def confusion(episodes: Sequence[Episode], labels: Sequence[Label],
              grace_s: float = GRACE_S) -> dict[str, dict[str, int]]:
    """Alerts per detector and per context (the fault on that replica then, or ``clean``).

    >>> confusion([Episode("m", "r1", "long_tail", "", 150.0)], [Label("m", "r1", "batch_collapse", 100.0, 200.0)])
    {'long_tail': {'batch_collapse': 1}}
    """
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in episodes:
        table[e.detector][context(e, labels, grace_s)] += 1
    return {d: dict(row) for d, row in table.items()}


def judge(summary: Mapping[str, Any], persistence: float | None, detector: str = "") -> dict[str, bool | None]:
    """Which targets a detector's summary meets (None: nothing to judge, or no delay target).

    >>> judge({"recall": 1.0, "precision": 0.9, "delay_median_s": 12.0, "false_per_hour": 0.0}, persistence=5.0)
    {'recall': True, 'precision': False, 'delay': True, 'false_per_hour': True}
    >>> judge({"recall": 0.92}, persistence=None, detector="learned")["recall"]
    True
    """
    def at_least(value: float | None, target: float) -> bool | None:
        return None if value is None else value >= target

    def at_most(value: float | None, target: float | None) -> bool | None:
        return None if value is None or target is None else value <= target

    return {"recall": at_least(summary.get("recall"), RECALL_TARGETS.get(detector, RECALL_TARGET)),
            "precision": at_least(summary.get("precision"), PRECISION_TARGET),
            "delay": at_most(summary.get("delay_median_s"),
                             None if persistence is None else persistence + DELAY_SLACK_S),
            "false_per_hour": at_most(summary.get("false_per_hour"), FALSE_PER_HOUR_TARGET)}


# ----------------------------------------------------------------------------- corrections


def correction_report(corrections: Iterable[Mapping[str, Any]], labels: Sequence[Label], scored_from: float,
                      scored_to: float, grace_s: float = GRACE_S, clear: int = 2) -> dict[str, Any]:
    """What a scheduler applying these corrections would have done wrong or right (module docstring).

    Returns ``healthy_zero`` (episodes: ``[model, replica, start]``), ``healthy_zero_steps``,
    ``all_zero`` (``[model, ts]`` per correction), ``below`` (per replica-fault label: its kind and
    the delay until the faulty replica was below every other one, or None), ``panic`` (corrections
    whose ``mode`` is ``panic``) and ``corrections`` (how many were read).

    >>> labels = [Label("m", "b", "slow_replica", 100.0, 130.0)]
    >>> recs = [{"model": "m", "ts": t, "weights": w, "actions": []} for t, w in [
    ...     (100.0, {"a": 0.6, "b": 0.4}), (105.0, {"a": 0.5, "b": 0.5}), (110.0, {"a": 0.7, "b": 0.3}),
    ...     (130.0, {"a": 0.7, "b": 0.3}), (140.0, {"a": 0.0, "b": 0.0})]]
    >>> r = correction_report(recs, labels, 60.0, 300.0)
    >>> r["below"], r["healthy_zero"], r["all_zero"]
    ([{'model': 'm', 'replica': 'b', 'kind': 'slow_replica', 'delay_s': 10.0}], [['m', 'a', 140.0]], [['m', 140.0]])
    """
    records = _in_span(corrections, scored_from, scored_to)
    state: dict[tuple[str, str, str], tuple[float, int] | None] = {}
    healthy_zero: list[list[Any]] = []
    steps = 0
    all_zero: list[list[Any]] = []
    panic = 0
    faulty = [lb for lb in labels if lb.replica is not None]
    below_since: dict[Label, float | None] = {lb: None for lb in faulty}  # current unbroken run below
    for rec in records:
        ts, model = float(rec["ts"]), str(rec["model"])
        weights = _weights_of(rec)
        panic += rec.get("mode") == "panic"
        if weights and not any(w > 0.0 for w in weights.values()):
            all_zero.append([model, ts])
        for replica, w in weights.items():
            had_fault = any(lb.model == model and lb.replica == replica and lb.start <= ts for lb in faulty)
            holds = w <= 0.0 and not had_fault
            steps += holds
            if _open_close(state, (model, replica, "zero"), holds, ts, clear):
                healthy_zero.append([model, replica, ts])
        for lb in faulty:
            if lb.model != model or not lb.start <= ts < lb.end:
                continue
            mine = weights.get(lb.replica or "")
            others = [w for r, w in weights.items() if r != lb.replica]
            if mine is not None and others and mine < min(others):
                if below_since[lb] is None:
                    below_since[lb] = ts
            else:
                below_since[lb] = None
    return {"corrections": len(records), "healthy_zero": healthy_zero, "healthy_zero_steps": steps,
            "all_zero": all_zero, "panic": panic,
            "below": [{"model": lb.model, "replica": lb.replica, "kind": lb.kind,
                       "delay_s": _delay(below_since[lb], lb.start)} for lb in faulty]}


def _delay(at: float | None, start: float) -> float | None:
    return None if at is None else round(at - start, 3)
