"""What the scale-out and failure tests check on the worker's output topics, against a ledger of input.

* **Windows** (:func:`check_windows`): every ``llm.features`` record is keyed by ``model/replica`` (or
  ``model``) and ``window_end``; a step replayed after a crash is published again, an idempotent
  duplicate, so records are first grouped by that key. Two records of one key whose counts differ are
  *inconsistent*. Then each 60 s count is compared with the ledger's (events with
  ``window_end - 60 <= ts < window_end``), and each newest-step count (``step_count``) with the
  ledger's 5 s step: summed over the steps, the events *counted*, *lost* (fewer than produced) and
  *duplicated* (more: counted twice). A per-model vector must merge every replica of its model
  (``replicas``): fewer is a *partial merge*. A key missing a step between its first and ``until``
  is a *missing* window (an output lost).
* **Corrections** (:func:`check_corrections`): per model, in topic order, ``seq`` never decreases;
  consecutive distinct corrections are at most the heartbeat apart in event time (a longer gap: a
  step's decision was lost); the wall-clock gap between their Kafka timestamps is measured too.
* **Pauses** (:func:`longest_pause`): the longest wall-clock time between two consecutive steps of a
  model's per-model feature vector (published every step): how long the pipeline stood still.
* **Alerts** (:func:`check_alerts`): per ``model/replica/detector``, after dropping identical
  re-publications (same ``ts`` and ``state``: a replayed step), opens and resolves alternate: an open
  while one is open is a *reopen*, an episode alerted twice.

>>> import orjson

from tests.integration.live_traffic import Ledger
>>> ledger = Ledger()
>>> ledger.add(["m/a"] * 3, [1.0, 2.0, 7.0])
>>> def fv(key, end, count, step_count, replicas=None):
...     return {"key": key, "window_end": end, "count": count, "step_count": step_count, "replicas": replicas}
>>> out = check_windows([fv("m/a", 5.0, 2, 2), fv("m/a", 10.0, 3, 1), fv("m/a", 10.0, 3, 1),
...                      fv("m", 10.0, 3, 1, replicas=1)], ledger, {"m": 1}, until=10.0)
>>> out.counted, out.lost, out.duplicated, out.replayed, out.problems()
(3, 0, 0, 1, [])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.integration.live_traffic import Ledger

WINDOW_S = 60.0
STEP_S = 5.0


@dataclass
class WindowCheck:
    """The outcome of :func:`check_windows` (see the module docstring)."""

    windows: int = 0  # distinct (key, window_end) checked
    counted: int = 0  # events in the per-replica steps checked
    lost: int = 0
    duplicated: int = 0
    replayed: int = 0  # identical re-publications of a window (dropped before comparing)
    produced: int = 0  # events the ledger holds in the steps checked
    inconsistent: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    partial_merges: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every failed check, one line each (at most 20 per kind)."""
        out = []
        for name in ("inconsistent", "mismatched", "missing", "partial_merges"):
            items = getattr(self, name)
            if items:
                out.append(f"{len(items)} {name}: " + "; ".join(items[:20]))
        return out


def split_outputs(records: Iterable[Any], features_topic: str, alerts_topic: str) -> dict[str, list[Any]]:
    """The records of the three output topics as the checks below read them: feature vectors with their
    key and Kafka timestamp, alerts, and (Kafka timestamp, correction) pairs (every other record)."""
    out: dict[str, list[Any]] = {"features": [], "alerts": [], "corrections": []}
    for r in records:
        value = orjson.loads(r.value)
        if r.topic == features_topic:
            out["features"].append({**value, "key": r.key.decode(), "timestamp": r.timestamp})
        elif r.topic == alerts_topic:
            out["alerts"].append(value)
        else:
            out["corrections"].append((r.timestamp, value))
    return out


def check_windows(vectors: Iterable[Mapping[str, Any]], ledger: Ledger, replicas_per_model: Mapping[str, int],
                  until: float, since: float | None = None) -> WindowCheck:
    """Feature vectors (dicts with ``key``, ``window_end``, ``count``, ``step_count``, ``replicas``)
    against ``ledger``, for window ends up to ``until`` (and from ``since``)."""
    out = WindowCheck()
    seen: dict[tuple[str, float], Mapping[str, Any]] = {}
    for fv in vectors:
        end = float(fv["window_end"])
        if end > until or (since is not None and end < since):
            continue
        key = (str(fv["key"]), end)
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = fv
            continue
        out.replayed += 1
        if (earlier["count"], earlier["step_count"]) != (fv["count"], fv["step_count"]):
            out.inconsistent.append(f"{key[0]}@{end:.0f}: count {earlier['count']} then {fv['count']}")
    ends_by_key: dict[str, set[float]] = defaultdict(set)
    for (key, end), fv in sorted(seen.items()):
        out.windows += 1
        ends_by_key[key].add(end)
        expected = ledger.count(key, end - WINDOW_S, end)
        if fv["count"] != expected:
            out.mismatched.append(f"{key}@{end:.0f}: count {fv['count']}, produced {expected}")
        if "/" in key:
            step = ledger.count(key, end - STEP_S, end)
            out.produced += step
            out.counted += min(int(fv["step_count"]), step)
            out.lost += max(step - int(fv["step_count"]), 0)
            out.duplicated += max(int(fv["step_count"]) - step, 0)
        else:
            want = replicas_per_model.get(key)
            if want is not None and fv.get("replicas") != want:
                out.partial_merges.append(f"{key}@{end:.0f}: {fv.get('replicas')} of {want} replicas")
    for key, ends in ends_by_key.items():
        first = ledger.first(key)
        if first is None:
            continue
        start = max(min(ends), (first // STEP_S + 1) * STEP_S)
        expected_ends = {start + STEP_S * i for i in range(int(round((until - start) / STEP_S)) + 1)}
        for end in sorted(expected_ends - ends):
            out.missing.append(f"{key}@{end:.0f}")
    return out


@dataclass
class CorrectionCheck:
    """The outcome of :func:`check_corrections`."""

    records: int = 0
    republished: int = 0  # a correction published again with the same seq (a replayed step)
    regressions: list[str] = field(default_factory=list)  # seq lower than one before it on the topic
    max_gap_event_s: float = 0.0  # between consecutive distinct seqs of a model, in event time
    max_gap_wall_s: float = 0.0  # between their Kafka timestamps (when they were published)
    gaps: list[str] = field(default_factory=list)  # event-time gaps longer than the heartbeat


def check_corrections(records: Iterable[tuple[int, Mapping[str, Any]]], heartbeat_s: float,
                      wall_since: float | None = None) -> CorrectionCheck:
    """``(Kafka timestamp ms, correction)`` pairs in topic order (one partition per model, so per model
    in publication order). Gaps are measured up to each correction published after ``wall_since``
    (epoch seconds; None: every one)."""
    out = CorrectionCheck()
    last: dict[str, tuple[int, float, float]] = {}  # model -> (seq, ts, wall) of its newest distinct correction
    for timestamp_ms, c in records:
        out.records += 1
        model, seq, ts, wall = str(c["model"]), int(c["seq"]), float(c["ts"]), timestamp_ms / 1000.0
        before = last.get(model)
        if before is not None:
            if seq < before[0]:
                out.regressions.append(f"{model}: seq {seq} after {before[0]}")
                continue
            if seq == before[0]:
                out.republished += 1
                continue
            if wall_since is None or wall >= wall_since:
                gap_event, gap_wall = ts - before[1], wall - before[2]
                out.max_gap_event_s = max(out.max_gap_event_s, gap_event)
                out.max_gap_wall_s = max(out.max_gap_wall_s, gap_wall)
                if gap_event > heartbeat_s:
                    out.gaps.append(f"{model}: {gap_event:.0f} s of event time ({gap_wall:.1f} s of wall "
                                    f"time) before seq {seq}")
        last[model] = (seq, ts, wall)
    return out


@dataclass
class AlertCheck:
    """The outcome of :func:`check_alerts`."""

    opens: int = 0  # distinct opens
    resolves: int = 0
    republished: int = 0  # identical re-publications (same ts and state)
    reopens: list[str] = field(default_factory=list)


def check_alerts(alerts: Iterable[Mapping[str, Any]]) -> AlertCheck:
    """Alert events in topic order (per ``model/replica`` key one partition, so in publication order)."""
    out = AlertCheck()
    seen: set[tuple[str, str, str, float, str]] = set()
    open_since: dict[tuple[str, str, str], float] = {}
    for alert in alerts:
        episode = (str(alert["model"]), str(alert.get("replica")), str(alert["detector"]))
        ident = (*episode, float(alert["ts"]), str(alert["state"]))
        if ident in seen:
            out.republished += 1
            continue
        seen.add(ident)
        if alert["state"] == "open":
            out.opens += 1
            if episode in open_since:
                out.reopens.append(f"{'/'.join(episode)}: open at {alert['ts']:.0f} while open since "
                                   f"{open_since[episode]:.0f}")
            open_since[episode] = float(alert["ts"])
        else:
            out.resolves += 1
            open_since.pop(episode, None)
    return out


def longest_pause(vectors: Iterable[Mapping[str, Any]], since_ms: int = 0) -> tuple[float, str]:
    """The longest wall-clock gap (seconds) between the first publications of consecutive steps of a
    per-model vector (dicts with ``key``, ``window_end`` and the record's ``timestamp`` in ms), among the
    steps first published after ``since_ms``; and which model and step it came before."""
    first: dict[tuple[str, float], int] = {}
    for fv in vectors:
        key = str(fv["key"])
        if "/" in key:
            continue
        step = (key, float(fv["window_end"]))
        first[step] = min(int(fv["timestamp"]), first.get(step, int(fv["timestamp"])))
    longest, where = 0.0, ""
    previous: dict[str, int] = {}
    for (key, end), ms in sorted(first.items()):
        before = previous.get(key)
        if before is not None and ms >= since_ms and (ms - before) / 1000.0 > longest:
            longest, where = (ms - before) / 1000.0, f"{key}@{end:.0f}"
        previous[key] = max(ms, before or ms)
    return longest, where
