"""The worker-side telemetry join: many samples per replica -> one merged view per step.

Telemetry joins the request windows by replica (the latest sample, with its age; docs/design.md,
"GPU telemetry"); a sample older than 3 intervals (15 s) counts as stale, and the weight uses
what is fresh and says which signal was missing. One replica has several producers, so "the latest
sample" is not one message:

* **several GPUs** (tensor parallel; a DCGM bridge covering a node) publish one sample each, with
  the same replica and different ``gpu_uuid`` / ``gpu_index``;
* **several sources**: GPU samples (``nvml``, ``dcgm``: memory, power, XID, ECC) and engine samples
  (``vllm``, ``sglang``, ``tgi``, ``llamacpp``: queue, running batch, KV cache) share the replica id.

So the join keeps the latest samples per **(replica, source, GPU)** and merges them when a step
asks (:meth:`TelemetryJoin.view`), field by field:

1. *As of event time.* Per (source, GPU) the *current* sample is the newest with ``ts <= at``
   (a short history per key serves steps that close after newer samples arrived; a sample from
   the future of a step is never used for it). The current sample is a complete statement of its
   producer: a field it leaves out is unknown *now* (e.g. ``xid_last`` left out because no XID is
   inside the 5-minute window), never filled in from its older samples — except held counters (4).
2. *Fresh or nothing.* A current sample older than ``stale_after_s`` (3 intervals, 15 s) gives
   nothing; each field keeps the timestamp of the sample it came from, so a stale GPU sample does
   not hide a fresh engine sample and vice versa (staleness is per signal).
3. *Several GPUs of one source -> the worst GPU*: memory from the GPU with the highest
   used/total (the pair stays together, so ``memory_ratio`` is the worst GPU's); allocator
   reserved/allocated from the GPU with the highest fragmentation; utilisation, power,
   temperature and KV-cache usage the maximum; throttle reasons OR-ed; KV hit rate the minimum;
   queue and running requests the sum; XID: ``xid_count_5m`` the sum, ``xid_last`` the code of
   the GPU whose XID is the most recent (the GPU's last change of its XID fields; ties: the
   larger count, then the larger code). A fresh subset of the GPUs gives the worst of those.
4. *Counters are held* (``ecc_uncorrected_total``, ``preemptions_total``): summed over the
   source's GPUs, each GPU counting with its last reported value (at or before ``at``, within the
   history) even when that sample is stale or a newer one left the counter out. A counter's last
   value stays true, and holding it keeps the sum continuous: a GPU that drops out for a few
   intervals does not look like a counter reset, nor its return like ECC growth (which drains).
   The sum is reported while at least one of its GPUs reported it freshly.
5. *Several sources -> one per field group.* Gauges come from the source whose contribution is the
   newest (ties: :data:`SOURCE_PRIORITY`); counters and the XID pair come from the first source
   in :data:`SOURCE_PRIORITY` that has them, so a counter never alternates between two
   producers' slightly different readings.

The merged :class:`~skewwatch.schemas.telemetry_sample.TelemetrySample` has ``ts`` = the oldest
timestamp among the fields it carries (so its age bounds every field's age, and every field is
fresh when the sample is), ``source`` = the best engine source that contributed (so "a fresh
engine sample" still means the engine answered), else the best GPU source; ``gpu_index`` /
``gpu_uuid`` only when one GPU contributed, ``node`` the contributing nodes joined by ``,``.

State is bounded: per key the newest ``history`` samples, sized from the window settings by
:func:`history_for` (23 with the defaults: 110 s at the 5 s interval, see there). The history is
what lets a step find its sample when the worker reads telemetry ahead of requests (catching up
on a backlog, telemetry can run tens of seconds of event time ahead of the requests whose steps
close; :mod:`~skewwatch.pipeline.telemetry_pacing` bounds how far); a step
whose samples have all been pushed out of the history sees no telemetry (stale), as during an
outage, and never a sample from its future. Keys of a replica not heard from for
``retain_s`` are dropped when the replica's next sample comes, at most ``max_keys_per_replica``
keys per replica (the key heard from least recently goes first), :meth:`TelemetryJoin.forget`
drops a replica, and :meth:`TelemetryJoin.release_idle` drops every replica with no sample within a
horizon of event time (``retain_s`` by default), so replicas that left the fleet do not stay forever.
A GPU that *joins* a replica after its counter was seen adds its whole counter
to the sum once (the health rule reads that as ECC growth if it is not 0): a replica map change
is rare and a worker restart re-baselines.

>>> join = TelemetryJoin()
>>> gib = float(1 << 30)
>>> join.add(TelemetrySample(ts=100.0, replica="r1", source="nvml", gpu_index=0,
...                          memory_used_bytes=40 * gib, memory_total_bytes=80 * gib, xid_count_5m=0))
>>> join.add(TelemetrySample(ts=101.0, replica="r1", source="nvml", gpu_index=1,
...                          memory_used_bytes=76 * gib, memory_total_bytes=80 * gib, xid_count_5m=0))
>>> join.add(TelemetrySample(ts=103.0, replica="r1", source="vllm", queue_length=7, kv_cache_usage=0.8))
>>> merged, age, stale = join.view("r1", at=105.0, stale_after_s=15.0)
>>> merged.memory_ratio, merged.queue_length, merged.source, age, stale
(0.95, 7, 'vllm', 5.0, [])
>>> merged, age, stale = join.view("r1", at=117.0, stale_after_s=15.0)  # GPU samples now 16-17 s old
>>> merged.memory_ratio, merged.queue_length, age, stale
(None, 7, 14.0, ['memory_total_bytes', 'memory_used_bytes', 'xid_count_5m'])
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from sys import intern
from typing import Any, Literal

from skewwatch.pipeline.weights import ENGINE_SOURCES
from skewwatch.pipeline.window_settings import WindowSettings
from skewwatch.schemas.telemetry_sample import TELEMETRY_SOURCES, TelemetrySample

# Which producer's reading wins when two give the same counter (and which names the merged sample).
SOURCE_PRIORITY: tuple[str, ...] = ("nvml", "dcgm", "vllm", "sglang", "tgi", "llamacpp", "simulated")
IDENTITY_FIELDS = frozenset({"ts", "replica", "source", "node", "gpu_index", "gpu_uuid", "v"})
MEASUREMENT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(TelemetrySample) if f.name not in IDENTITY_FIELDS
)

Key = tuple[str, str]  # (source, GPU id: uuid, else index, else "" for engine samples)
Values = dict[str, Any]
# one GPU's input to a combiner: (its current fresh sample, its samples at or before `at`, oldest first)
GpuInput = tuple[TelemetrySample, Sequence[TelemetrySample]]


def _source_rank(source: str) -> tuple[int, str]:
    return (SOURCE_PRIORITY.index(source) if source in SOURCE_PRIORITY else len(SOURCE_PRIORITY), source)


def _gpu_id(sample: TelemetrySample) -> str:
    if sample.gpu_uuid:
        return sample.gpu_uuid
    return "" if sample.gpu_index is None else str(sample.gpu_index)


# ---------------------------------------------------------------- combining several GPUs of one source


def _worst_memory(gpus: Sequence[GpuInput]) -> Values:
    samples = [s for s, _ in gpus]
    paired = [s for s in samples if s.memory_ratio is not None]
    if paired:  # the pair stays together: memory_ratio is the worst GPU's
        worst = max(paired, key=lambda s: s.memory_ratio or 0.0)
        return {"memory_used_bytes": worst.memory_used_bytes, "memory_total_bytes": worst.memory_total_bytes}
    return {name: _max(samples, name) for name in ("memory_used_bytes", "memory_total_bytes")}


def _worst_allocator(gpus: Sequence[GpuInput]) -> Values:
    samples = [s for s, _ in gpus]
    paired = [s for s in samples if s.fragmentation is not None]
    if paired:
        worst = max(paired, key=lambda s: s.fragmentation or 0.0)
        return {"memory_reserved_bytes": worst.memory_reserved_bytes,
                "memory_allocated_bytes": worst.memory_allocated_bytes}
    return {name: _max(samples, name) for name in ("memory_reserved_bytes", "memory_allocated_bytes")}


def _max(samples: Sequence[TelemetrySample], name: str) -> Any:
    values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    return max(values) if values else None


def _scalar(name: str, how: Callable[[list[Any]], Any]) -> Callable[[Sequence[GpuInput]], Values]:
    def combine(gpus: Sequence[GpuInput]) -> Values:
        values = [getattr(s, name) for s, _ in gpus if getattr(s, name) is not None]
        return {name: how(values) if values else None}
    return combine


def _or(values: list[int]) -> int:
    result = 0
    for value in values:
        result |= int(value)
    return result


def _xid_since(history: Sequence[TelemetrySample]) -> float:
    """When this GPU's XID fields took their current values (walking back over equal samples)."""
    current = history[-1]
    since = current.ts
    for sample in reversed(history[:-1]):
        if (sample.xid_last, sample.xid_count_5m) != (current.xid_last, current.xid_count_5m):
            break
        since = sample.ts
    return since


def _xid(gpus: Sequence[GpuInput]) -> Values:
    counts = [s.xid_count_5m for s, _ in gpus if s.xid_count_5m is not None]
    with_code = [(s, history) for s, history in gpus if s.xid_last is not None]
    last = None
    if with_code:
        # the most recent XID: the GPU whose XID fields changed last (the collector publishes at once)
        latest, _ = max(with_code, key=lambda g: (_xid_since(g[1]), g[0].xid_count_5m or 0, g[0].xid_last or 0))
        last = latest.xid_last
    return {"xid_last": last, "xid_count_5m": sum(counts) if counts else None}


@dataclass(frozen=True, slots=True)
class FieldGroup:
    """Fields that travel together from one producer, and how several GPUs combine."""

    fields: tuple[str, ...]
    combine: Callable[[Sequence[GpuInput]], Values]
    kind: Literal["gauge", "counter", "xid"]  # gauge: newest source wins; xid/counter: by priority


FIELD_GROUPS: tuple[FieldGroup, ...] = (
    FieldGroup(("memory_used_bytes", "memory_total_bytes"), _worst_memory, "gauge"),
    FieldGroup(("memory_reserved_bytes", "memory_allocated_bytes"), _worst_allocator, "gauge"),
    FieldGroup(("utilization_gpu",), _scalar("utilization_gpu", max), "gauge"),
    FieldGroup(("power_w",), _scalar("power_w", max), "gauge"),
    FieldGroup(("temperature_c",), _scalar("temperature_c", max), "gauge"),
    FieldGroup(("throttle_reasons",), _scalar("throttle_reasons", _or), "gauge"),
    FieldGroup(("queue_length",), _scalar("queue_length", sum), "gauge"),
    FieldGroup(("running_requests",), _scalar("running_requests", sum), "gauge"),
    FieldGroup(("kv_cache_usage",), _scalar("kv_cache_usage", max), "gauge"),
    FieldGroup(("kv_cache_hit_rate",), _scalar("kv_cache_hit_rate", min), "gauge"),
    FieldGroup(("xid_last", "xid_count_5m"), _xid, "xid"),
    FieldGroup(("ecc_uncorrected_total",), _scalar("ecc_uncorrected_total", sum), "counter"),
    FieldGroup(("preemptions_total",), _scalar("preemptions_total", sum), "counter"),
)
# A field added to the schema without a rule above is joined as a gauge, the maximum over GPUs, so
# the join never drops a new field nor breaks on it (tests check that every field is covered).
FIELD_GROUPS += tuple(FieldGroup((name,), _scalar(name, max), "gauge") for name in MEASUREMENT_FIELDS
                      if not any(name in g.fields for g in FIELD_GROUPS))
assert set(TELEMETRY_SOURCES) <= set(SOURCE_PRIORITY), "a source has no priority"


@dataclass(slots=True)
class _Series:
    """One producer's samples for one GPU of one replica, oldest first."""

    samples: list[TelemetrySample]
    stamps: list[float]  # their ts, for bisect
    reported: set[str]  # measurement fields this key has ever reported (for the stale list)


@dataclass(slots=True)
class _Contribution:
    values: Values
    ts: float  # oldest timestamp among the samples the values came from
    samples: list[TelemetrySample]


def history_for(window: WindowSettings, interval_s: float | None = None, spare: int = 2) -> int:
    """Samples per key the join must keep so that every step stage 1 closes still finds its own.

    Stage 1 joins a telemetry sample only once it is at most ``telemetry_ahead_s`` past the
    requests' event time (:mod:`~skewwatch.pipeline.telemetry_pacing`); a catch-up poll is applied
    in slices of ``telemetry_ahead_s / 2`` of event time, each after joining the telemetry up to
    its newest event + ``telemetry_ahead_s``, and closes the steps the slice completes. So when a
    step ending at ``T`` closes, the newest sample held is at most ``ahead + ahead / 2 +
    allowed_lateness`` past the watermark before the slice, ``T`` is past that watermark, and the
    step needs the newest sample at or before ``T``, at most one interval older: a span of
    ``1.5 * ahead + allowed_lateness + interval`` (110 s with the defaults) holds
    ``span / interval + 1`` samples (23) at the telemetry interval (a collector and the bridges
    publish every ``step_s``, 5 s), plus ``spare`` for the extra samples a collector publishes at
    once on an XID. No more than that: each sample held is memory per (replica, source, GPU), and
    older samples only serve ``xid_last``'s tie-break between GPUs (when each GPU's XID fields last
    changed), which then sees at most the history's span.

    >>> history_for(WindowSettings())
    23
    """
    interval = window.step_s if interval_s is None else interval_s
    if not interval > 0 or spare < 0:
        raise ValueError("interval_s must be > 0 and spare >= 0")
    span = 1.5 * window.telemetry_ahead_s + window.allowed_lateness_s + interval
    return math.ceil(span / interval) + 1 + spare


DEFAULT_HISTORY = history_for(WindowSettings())


class TelemetryJoin:
    """Latest samples per (replica, source, GPU); merged per replica as of an event time. Pure.

    ``history``: samples kept per key; :func:`history_for` the worker's window settings.
    """

    def __init__(self, history: int = DEFAULT_HISTORY, retain_s: float = 600.0,
                 max_keys_per_replica: int = 64) -> None:
        if history < 1 or retain_s <= 0 or max_keys_per_replica < 1:
            raise ValueError("history, retain_s and max_keys_per_replica must be positive")
        self.history = history
        self.retain_s = retain_s
        self.max_keys_per_replica = max_keys_per_replica
        # replica -> (source, gpu) -> its newest `history` samples
        self._samples: dict[str, dict[Key, _Series]] = {}

    # ------------------------------------------------------------------ input

    def add(self, sample: TelemetrySample) -> None:
        """Keep ``sample`` (in any order; a repeat of a timestamp replaces it: delivery is at least once).

        The sample's identity strings are replaced by interned equal ones: every decoded message
        brings its own copies of the replica, source and node names, a large share of a sample's
        memory, and the history holds :func:`history_for` samples per key.
        """
        sample.replica = intern(sample.replica)
        sample.source = intern(sample.source)
        if sample.node is not None:
            sample.node = intern(sample.node)
        if sample.gpu_uuid is not None:
            sample.gpu_uuid = intern(sample.gpu_uuid)
        keys = self._samples.setdefault(sample.replica, {})
        key = (sample.source, _gpu_id(sample))
        series = keys.setdefault(key, _Series([], [], set()))
        at = bisect.bisect_left(series.stamps, sample.ts)
        if at < len(series.samples) and series.stamps[at] == sample.ts:
            series.samples[at] = sample
        else:
            series.samples.insert(at, sample)
            series.stamps.insert(at, sample.ts)
        del series.samples[:-self.history], series.stamps[:-self.history]
        series.reported.update(name for name in MEASUREMENT_FIELDS if getattr(sample, name) is not None)
        # keys of this replica gone quiet for retain_s (a GPU moved elsewhere, a bridge stopped)
        for other in [k for k, s in keys.items() if s.stamps[-1] < sample.ts - self.retain_s]:
            del keys[other]
        while len(keys) > self.max_keys_per_replica:
            del keys[min(keys, key=lambda k: keys[k].stamps[-1])]

    def forget(self, replica: str) -> None:
        """Drop everything about ``replica`` (released by the windows, or gone from the fleet)."""
        self._samples.pop(replica, None)

    def release_idle(self, now: float, horizon_s: float | None = None) -> list[str]:
        """Drop the replicas with no sample newer than ``now - horizon_s``; their ids, sorted.

        ``add`` only prunes a replica's keys when that replica's next sample comes, so a replica
        that left the fleet (scaled down, renamed) would otherwise keep its samples forever.
        ``now`` is event time (e.g. the newest telemetry ``ts`` seen), so a replay releases the same
        replicas as the live run did; ``horizon_s`` defaults to ``retain_s``, the age after which a
        key of a live replica is dropped too. Cost: one pass over the keys held.

        >>> join = TelemetryJoin(retain_s=600.0)
        >>> join.add(TelemetrySample(ts=100.0, replica="gone", source="vllm", queue_length=1))
        >>> join.add(TelemetrySample(ts=650.0, replica="live", source="vllm", queue_length=2))
        >>> join.release_idle(now=650.0), join.release_idle(now=701.0), join.replicas
        ([], ['gone'], ['live'])
        """
        horizon = self.retain_s if horizon_s is None else horizon_s
        if horizon < 0:
            raise ValueError(f"horizon_s must be >= 0, got {horizon}")
        cutoff = now - horizon
        idle = sorted(replica for replica, keys in self._samples.items()
                      if max(series.stamps[-1] for series in keys.values()) < cutoff)
        for replica in idle:
            del self._samples[replica]
        return idle

    @property
    def replicas(self) -> list[str]:
        return sorted(self._samples)

    def __len__(self) -> int:
        """Number of samples held (the state's size)."""
        return sum(len(s.samples) for keys in self._samples.values() for s in keys.values())

    # ------------------------------------------------------------------ the merged view

    def view(self, replica: str, at: float,
             stale_after_s: float) -> tuple[TelemetrySample | None, float | None, list[str]]:
        """The replica's merged sample as of event time ``at``, its age, and the stale signals.

        Returns ``(sample, at - sample.ts, stale)``; ``(None, None, stale)`` when nothing is fresh.
        ``stale`` names, sorted, the measurement fields a held key of the replica has reported
        whose signal (field group: the memory pair, the XID pair, ...) the merged sample lacks:
        every sample giving it is stale, left it out, or is from after ``at``. Fields nobody
        reports are not listed (missing means unknown), nor is ``xid_last`` next to a fresh
        ``xid_count_5m`` (no XID in the window is a reading, not a stale signal).
        """
        keys = self._samples.get(replica)
        if not keys:
            return None, None, []
        # per key: samples at or before `at`, and the current one when fresh
        past: dict[Key, list[TelemetrySample]] = {}
        fresh: dict[Key, TelemetrySample] = {}
        for key, series in keys.items():
            upto = bisect.bisect_right(series.stamps, at)
            if upto:
                past[key] = series.samples[:upto]
                if at - series.stamps[upto - 1] <= stale_after_s:
                    fresh[key] = series.samples[upto - 1]
        merged: Values = {}
        used: list[TelemetrySample] = []
        oldest: float | None = None
        reported = set().union(*(series.reported for series in keys.values()))
        stale: list[str] = []
        for group in FIELD_GROUPS:
            if reported.isdisjoint(group.fields):  # nobody gives this signal: unknown, not stale
                continue
            # per source, its GPUs that have ever given this signal
            by_source: dict[str, list[Key]] = {}
            for key in past:
                if not keys[key].reported.isdisjoint(group.fields):
                    by_source.setdefault(key[0], []).append(key)
            chosen = self._choose(group, self._contributions(group, by_source, past, fresh, at, stale_after_s))
            if chosen is None:
                stale.extend(name for name in group.fields if name in reported)
                continue
            merged.update({k: v for k, v in chosen.values.items() if v is not None})
            used.extend(chosen.samples)
            oldest = chosen.ts if oldest is None else min(oldest, chosen.ts)
        stale.sort()
        if oldest is None:
            return None, None, stale
        return self._sample(replica, oldest, merged, used), at - oldest, stale

    @staticmethod
    def _contributions(group: FieldGroup, by_source: dict[str, list[Key]], past: dict[Key, list[TelemetrySample]],
                       fresh: dict[Key, TelemetrySample], at: float, stale_after_s: float) -> dict[str, _Contribution]:
        """What each source gives for ``group``: its GPUs combined."""
        result: dict[str, _Contribution] = {}
        for source, source_keys in by_source.items():
            if group.kind == "counter":
                contribution = _held_counter(group, [past[k] for k in source_keys], at, stale_after_s)
            else:
                gpus = [(fresh[k], past[k]) for k in source_keys if k in fresh
                        and any(getattr(fresh[k], name) is not None for name in group.fields)]
                if not gpus:
                    continue
                values = group.combine(gpus)
                contributors = [s for s, _ in gpus]
                contribution = _Contribution(values, min(s.ts for s in contributors), contributors)
            if contribution is not None and any(v is not None for v in contribution.values.values()):
                result[source] = contribution
        return result

    @staticmethod
    def _choose(group: FieldGroup, contributions: dict[str, _Contribution]) -> _Contribution | None:
        if not contributions:
            return None
        if group.kind == "gauge":  # the newest reading; ties by priority
            source = min(contributions, key=lambda s: (-contributions[s].ts, _source_rank(s)))
        else:  # one producer per counter, so it never alternates between two readings
            source = min(contributions, key=_source_rank)
        return contributions[source]

    @staticmethod
    def _sample(replica: str, ts: float, merged: Values, used: list[TelemetrySample]) -> TelemetrySample:
        sources = sorted({s.source for s in used}, key=_source_rank)
        engines = [s for s in sources if s in ENGINE_SOURCES]
        gpus = {(s.gpu_uuid, s.gpu_index) for s in used if s.gpu_uuid is not None or s.gpu_index is not None}
        nodes = sorted({s.node for s in used if s.node})
        gpu_uuid, gpu_index = next(iter(gpus)) if len(gpus) == 1 else (None, None)
        return TelemetrySample(ts=ts, replica=replica, source=(engines or sources)[0],
                               node=",".join(nodes) or None, gpu_index=gpu_index, gpu_uuid=gpu_uuid, **merged)


def _held_counter(group: FieldGroup, per_gpu: list[list[TelemetrySample]], at: float,
                  stale_after_s: float) -> _Contribution | None:
    """A counter summed over GPUs, each at its last reported value; None unless one is fresh."""
    (name,) = group.fields
    last: list[TelemetrySample] = []
    for samples in per_gpu:
        reported = next((s for s in reversed(samples) if getattr(s, name) is not None), None)
        if reported is not None:
            last.append(reported)
    recent = [s for s in last if at - s.ts <= stale_after_s]
    if not recent:
        return None
    values = group.combine([(s, [s]) for s in last])
    return _Contribution(values, min(s.ts for s in recent), recent)


