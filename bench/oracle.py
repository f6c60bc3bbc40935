"""The oracle of the detection-quality benchmark: how early could any detector have raised each fault?

A detector's delay and recall mean little without knowing what the observations allowed: a fault
whose replica finished two requests during it cannot be found by any rule, and a delay of 30 s is
slow where 5 s would have done. The oracle answers, per labelled replica fault, from the same
observations the pipeline gets.

**What it knows.** Where, when and what: the faulty replica, the onset (the label's start) and the
fault's kind, hence its primary signal and, where :mod:`skewwatch.sim.faults` states it, the size
of the change (the label's parameters, else the kind's defaults).

**What it sees.** Only what the pipeline sees, as it arrives: each 5 s chunk's finished requests
(a request is seen at its ``ts``, its finish time) and telemetry samples, and only fields a request
event or a telemetry sample carries. Per kind, its primary signals (:data:`STATISTICS`) and the
fault's distribution of them:

- ``long_tail``: each request's log time per output token after the first, ``(latency - ttft) /
  (completion - 1)`` (``latency / completion`` without a TTFT), a ``share`` of them stalled by
  (k - 1) x the peers' median latency over their tokens, k uniform in ``factor_min``..``factor_max``;
  and the engine's live P99 time per output token, a stalled token's where one of the running
  requests is stalled;
- ``slow_replica``: the same per-request and live (P50) times per token, slower by up to ``factor``
  (prefill, which the fault leaves alone, shares the iterations: 0.5, 0.75 or 1 x ``log(factor)``);
- ``batch_collapse``: each request's batch and the engine's running batch, under a limit of 1-2 for
  a ``stuck_share`` of the time and 4..``max_batch`` otherwise; the live queue (its growth is not
  stated: above every recent peer's value with probability 1/2);
- ``context_burst``: log prompt tokens, log-normal of mean ``factor`` x the trace's P90 prompt and
  coefficient of variation ``cv``;
- ``gpu_fault``: requests with a CUDA error (a ``share`` of them), and the XID in every telemetry
  sample where the fault's class reports one;
- ``kv_pressure``: each request's KV-cache hit rate, at mean ``hit_rate`` with the peers' spread,
  and telemetry fragmentation (``1 - allocated / reserved``) at ``fragmentation``;
- ``replica_silence``: the replica's request count in the step against an equal share of its peers'
  (Poisson, rate 0 under the fault: any request it finishes rules the fault out). A missing
  telemetry sample is not used: a scrape is lost now and then in a real fleet and never in the
  simulator, so no clean data could calibrate a rule on it;
- ``ttft_drift`` (the learned detector's): each request's log TTFT, later by (k - 1) x the peers'
  median TTFT, k rising from 1 to ``factor`` over ``ramp_s`` from the onset, at the request's arrival;
- ``throughput_drop`` (the learned detector's): each request's log output tokens, ``drop`` shorter,
  and its time per output token after the first, slower by up to ``1 / (1 - drop)`` (prefill shares
  the iterations, as for ``slow_replica``), on finished requests and the live P50.

Times per token move with the pool's load (a burst of long prompts slows every replica at once), so
they are taken relative to the other replicas' median over the last ``REF_S``. Where the fault acts
on a request's arrival (its stall, its prompt, its cache hits), the faulty replica's requests that
arrived before the onset (``ts - latency``) are left out: the fault could not have touched them.

**The test.** Each observation of the replica gets a log-likelihood ratio: the fault's
distribution against its peers' (the other replicas of the pool, their observations over the last
``PEER_WINDOW_S``, at least ``PEER_MIN`` and at most ``PEER_MAX`` of them), both as histograms on
the same bins, the fault's built from the peers' by the fault's known change (a mixture where only
a share of requests is touched), each bin smoothed by half an observation. The step's increment is
the sum over the replica's observations of the step (several signals: their sum); a one-sided CUSUM
of the increments, started at the onset, raises the fault at the end of the first step in which it
exceeds ``h``. The oracle's delay is that step's end minus the label's start.

**Calibration.** ``h`` is chosen per calibration group (the benchmark: per shape) and statistic
on the clean pools of the same runs: the same CUSUM run continuously over the scored span on every
replica of every clean pool against its own peers, restarted after each crossing (a fault that
unfolds, a ramp, as if it began anew every fault's length), must cross at
most ``FALSE_PER_HOUR_TARGET`` (1) times per clean pool-hour (a crossing on any replica counts, as
a detector's false alert does). ``h`` is the smallest such threshold (with fewer clean pool-hours
than one, no crossing at all: ``h`` is the largest value the clean CUSUMs reached). Nothing else is
tuned.

**What it is not.** The oracle knows nothing of healthy traffic but the peers' recent observations:
an observation beyond all ``n`` of theirs weighs about ``log(2 n)``, however far beyond. A rule whose
threshold encodes what healthy traffic looks like (tuned on many runs) can be faster on a clear
fault; its delay below the oracle's says so, not that the oracle is wrong.

**Undetectable.** A fault the oracle does not raise by the label's end (within its span) is
*undetectable* on those observations: the benchmark reports it apart and leaves it out of the
"recall of the detectable" denominator.

>>> import numpy as np
>>> crossings(np.array([3.0, -1.0, 4.0, 4.0, -9.0, 6.0, 6.0]), h=5.0)
[2, 5, 6]
>>> trace = FaultTrace("m", "r1", "gpu_fault", 100.0, 160.0, steps=[105.0, 110.0, 115.0],
...                    increments=[2.0, 3.5, 4.0], requests=12, samples=3)
>>> detect(trace, h=5.0)["delay_s"], detect(trace, h=50.0)["detectable"]
(10.0, False)
>>> c = calibrate([[0.5, -1.0, 2.0, 1.0, -3.0] * 100], pool_hours=1.0)
>>> round(c.h, 2), c.crossings, c.false_per_hour <= 1.0
(3.0, 0, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import DEFAULT_PARAMS, Injection

Floats = npt.NDArray[np.float64]

STEP_S = 5.0  # the pipeline's step: the oracle raises at a step's end, as the pipeline does
PEER_WINDOW_S = 300.0  # the peers' observations the null is built on ...
PEER_MIN = 100  # ... reaching further back until there are this many (thin traffic) ...
PEER_MAX = 600  # ... and no more than this many (the newest)
REF_S = 15.0  # RELATIVE fields: the reference is the other replicas' median over this span ...
REF_MIN = 5  # ... reaching back to this many values
MIN_PEER_OBS = 5  # fewer peer observations: the step is not judged (increment 0)
SMOOTH = 0.5  # added to every bin's count: an empty bin is rare, not impossible
FLOOR = -50.0  # the log-likelihood ratio of an observation the fault rules out (log 0)
FALSE_PER_HOUR_TARGET = 1.0  # false alerts per clean pool-hour (bench.scoring's target)
SHIFT_GRID = (0.5, 0.75, 1.0)  # slow_replica: shares of log(factor) the slowdown shows as
STALL_GRID = 6  # long_tail: k at this many points of factor_min..factor_max
BURST_POINTS = 200  # context_burst: the burst's log-normal at this many quantiles
NULL_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)  # bin edges: the null's quantiles ...
ALT_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)  # ... and the fault's

#: fault kind -> its primary statistic, as reports name it
STATISTICS: dict[str, str] = {
    "long_tail": "log TPOT, a share stalled",
    "slow_replica": "log TPOT, shifted",
    "batch_collapse": "batch size under the limit",
    "context_burst": "log prompt tokens",
    "gpu_fault": "CUDA errors + XID",
    "kv_pressure": "KV hit rate + fragmentation",
    "replica_silence": "request count vs peers",
    "ttft_drift": "log TTFT, later by a ramp",
    "throughput_drop": "log output tokens + log TPOT",
}
KINDS: tuple[str, ...] = tuple(STATISTICS)
# per-request and per-sample fields kept per pool (the peers' nulls)
_SAMPLE_FIELDS = ("frag", "xid", "tpot_p99", "tpot_p50", "running", "queue")
_FIELDS = ("tpot", "comp", "outputs", "latency", "ttft", "prompt", "batch", "cuda", "hit", *_SAMPLE_FIELDS)
# Fields the whole pool moves together (a burst of long requests slows every replica's decode): judged
# as the difference from the other replicas' median at the same time, so the null is what a healthy
# replica's difference looks like and the common swings cancel
RELATIVE = ("tpot", "tpot_p50", "tpot_p99", "ttft")


# ----------------------------------------------------------------------------- inputs and records


@dataclass(frozen=True, slots=True)
class Fault:
    """One labelled replica fault: ``[start, end)`` in event-time seconds, its parameters as labelled."""

    model: str
    replica: str
    kind: str
    start: float
    end: float
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_label(cls, label: Mapping[str, Any]) -> Fault:
        return cls(str(label["model"]), str(label["replica"]), str(label["kind"]), float(label["start"]),
                   float(label["end"]), dict(label.get("params") or {}))

    def param(self, name: str) -> Any:
        """The labelled value, or the kind's documented default (what the simulator used)."""
        return self.params.get(name, DEFAULT_PARAMS[self.kind][name])

    def xid(self) -> int | None:
        """The XID telemetry reports during a ``gpu_fault`` (None: none)."""
        return Injection(self.kind, self.replica, 0.0, 1.0, dict(self.params)).xid()


@dataclass(slots=True)
class FaultTrace:
    """What the oracle saw of one fault: per step from the onset to the label's end, its end time and
    the CUSUM increment; the replica's requests and telemetry samples seen in ``[start, end)``."""

    model: str
    replica: str
    kind: str
    start: float
    end: float
    steps: list[float] = field(default_factory=list)
    increments: list[float] = field(default_factory=list)
    requests: int = 0
    samples: int = 0


@dataclass(slots=True)
class OracleRecord:
    """One run's: its faults' traces, and per statistic the clean replicas' increments over the
    scored span (one list per replica), with the clean pool-hours they cover."""

    faults: list[FaultTrace]
    clean: dict[str, list[list[float]]]
    clean_pool_hours: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OracleRecord:
        return cls([FaultTrace(**f) for f in data["faults"]],
                   {k: [list(s) for s in v] for k, v in data["clean"].items()}, float(data["clean_pool_hours"]))


# ----------------------------------------------------------------------------- the log-likelihood ratios


def _edges(null: Floats, alt: Floats, discrete: bool) -> Floats:
    if discrete:  # one bin per value either side holds
        return np.unique(np.concatenate([null, alt.ravel()])) + 0.5
    qs = [np.quantile(null, NULL_QUANTILES), np.quantile(alt, ALT_QUANTILES)]
    return np.unique(np.concatenate(qs))


def mixture_llr(x: Floats, null: Floats, alt: Floats, share: float = 1.0, alt_weights: Floats | None = None,
                discrete: bool = False) -> Floats:
    """Per observation ``x_i``, ``log(((1 - share) f0 + share f1_i) / f0)`` with ``f0`` the histogram of
    ``null`` and ``f1_i`` that of ``alt`` (one sample for all, shape ``(a,)``, or one per observation,
    ``(n, a)``), both on the same bins and smoothed by ``SMOOTH`` per bin.

    >>> null = np.arange(100.0)
    >>> llr = mixture_llr(np.array([50.0, 300.0]), null, null + 200.0)
    >>> bool(llr[0] < 0 < llr[1])
    True
    """
    if len(x) == 0:
        return np.zeros(0)
    edges = _edges(null, alt, discrete)
    bins = len(edges) + 1
    c0 = np.bincount(np.searchsorted(edges, null), minlength=bins)
    p0 = (c0 + SMOOTH) / (len(null) + SMOOTH * bins)
    where = np.searchsorted(edges, x)
    rows = alt if alt.ndim == 2 else alt[None, :]
    weights = np.ones(rows.shape[1]) if alt_weights is None else alt_weights
    idx = np.searchsorted(edges, rows)
    counts = np.zeros((rows.shape[0], bins))
    np.add.at(counts, (np.repeat(np.arange(rows.shape[0]), rows.shape[1]), idx.ravel()),
              np.tile(weights, rows.shape[0]))
    total = weights.sum()
    p1 = (counts + SMOOTH) / (total + SMOOTH * bins)
    mine = p1[np.arange(len(x)), where] if alt.ndim == 2 else p1[0, where]
    return np.log((1.0 - share) + share * mine / p0[where])


def bernoulli_llr(hits: int, n: int, peer_hits: int, peer_n: int, p1_of: Any, smooth: bool = True) -> float:
    """Log-likelihood ratio of ``hits`` in ``n`` against the peers' rate (Jeffreys-smoothed unless
    ``smooth`` is false), the fault's rate being ``p1_of(p0)``.

    >>> round(bernoulli_llr(1, 4, 0, 400, lambda p0: p0 + 0.25 * (1 - p0)), 2)
    4.44
    """
    if n == 0:
        return 0.0
    p0 = (peer_hits + SMOOTH) / (peer_n + 2 * SMOOTH) if smooth else (peer_hits + 1.0) / peer_n
    p1 = min(float(p1_of(p0)), 1.0)
    pos = math.log(p1 / p0)
    neg = FLOOR if p1 >= 1.0 else math.log((1.0 - p1) / (1.0 - p0))
    return max(hits * pos + (n - hits) * neg, FLOOR)


def _lognormal_quantiles(mean: float, cv: float, points: int) -> Floats:
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2.0
    z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / points) for i in range(points)])
    return mu + sigma * z


# ----------------------------------------------------------------------------- the stream of observations


@dataclass(slots=True)
class _Obs:
    """One replica's observations in one step, by field; ``arrival``: per request field, when each
    row's request arrived (``ts - latency``); ``ref``: per field in :data:`RELATIVE`, the reference
    its values are taken relative to (set when the step is pushed)."""

    n: int
    samples: int
    values: dict[str, Floats]
    arrival: dict[str, Floats]
    ref: dict[str, float] = field(default_factory=dict)


class _Buffer:
    """Recent values of one field in one pool (value, replica index, time), newest last."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.vals, self.who, self.ts = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0)

    def extend(self, parts: Sequence[tuple[Floats, int]], end_ts: float) -> None:
        if parts:
            self.vals = np.concatenate([self.vals, *(v for v, _ in parts)])[-self.keep:]
            self.who = np.concatenate([self.who, *(np.full(len(v), i) for v, i in parts)])[-self.keep:]
            self.ts = np.concatenate([self.ts, np.full(sum(len(v) for v, _ in parts), end_ts)])[-self.keep:]

    def others(self, index: int, now: float, span_s: float, least: int, most: int) -> Floats:
        """The other replicas' values of the last ``span_s``, reaching back to ``least`` values, at most
        ``most`` (the newest)."""
        mine = self.who != index
        vals, ts = self.vals[mine], self.ts[mine]
        recent = int((ts > now - span_s).sum())
        return vals[max(len(vals) - min(max(recent, least), most), 0):]


class _Pool:
    """A pool's recent observations per field; the fields in :data:`RELATIVE` also as differences
    from their same-time reference."""

    def __init__(self, replicas: Sequence[str]) -> None:
        self.replicas = list(replicas)
        self.index = {r: i for i, r in enumerate(self.replicas)}
        keep = PEER_MAX * 2 * max(len(self.replicas), 2)
        self.raw = {f: _Buffer(keep) for f in _FIELDS}
        self.relative = {f: _Buffer(keep) for f in RELATIVE}

    def push(self, end_ts: float, obs: Mapping[str, _Obs]) -> None:
        for f in _FIELDS:
            self.raw[f].extend([(o.values[f], self.index[r]) for r, o in obs.items() if len(o.values[f])], end_ts)
        for f in RELATIVE:
            parts = []
            for r, o in obs.items():
                ref = self.raw[f].others(self.index[r], end_ts, REF_S, REF_MIN, PEER_MAX)
                o.ref[f] = float(np.median(ref)) if len(ref) else math.nan
                if len(o.values[f]) and len(ref):
                    parts.append((o.values[f] - o.ref[f], self.index[r]))
            self.relative[f].extend(parts, end_ts)

    def peers(self, replica: str, f: str, now: float) -> Floats:
        """The other replicas' values of ``f`` (relative, for :data:`RELATIVE`) over the last
        PEER_WINDOW_S (PEER_MIN..PEER_MAX of them, the newest)."""
        buf = self.relative[f] if f in RELATIVE else self.raw[f]
        return buf.others(self.index[replica], now, PEER_WINDOW_S, PEER_MIN, PEER_MAX)


def _sample_values(sample: TelemetrySample | None) -> dict[str, list[float]]:
    """A telemetry sample's fields the oracle reads (none where the sample or the field is missing)."""
    if sample is None:
        return {f: [] for f in _SAMPLE_FIELDS}
    live = bool(sample.tpot_count)

    def log_of(v: float | None) -> list[float]:
        return [math.log(v)] if live and v is not None and v > 0 else []

    def plain(v: float | None) -> list[float]:
        return [] if v is None else [float(v)]

    return {"frag": plain(sample.fragmentation), "xid": [float(sample.xid_last is not None)],
            "tpot_p99": log_of(sample.tpot_p99_s), "tpot_p50": log_of(sample.tpot_p50_s),
            "running": plain(sample.running_requests), "queue": plain(sample.queue_length)}


def _observations(cols: RequestColumns, samples: Iterable[TelemetrySample], replicas: Sequence[str]) -> dict[str, _Obs]:
    out: dict[str, _Obs] = {}
    by_replica = {s.replica: s for s in samples}
    for r in replicas:
        mask = cols.replica == r
        lat, ttft = cols.latency_ms[mask], cols.ttft_ms[mask]
        comp = cols.completion_tokens[mask].astype(float)
        arrival = cols.ts[mask] - lat / 1000.0
        ok = ~cols.is_error[mask]
        no_ttft = np.isnan(ttft)
        decode = np.where(no_ttft, lat, lat - ttft)  # the output tokens after the first (all, without a TTFT)
        per = np.where(no_ttft, comp, comp - 1.0)
        rows = ok & (per >= 1.0) & (decode > 0)
        batch = cols.batch_size[mask].astype(float)
        hit = cols.kv_cache_hit_rate[mask]
        has_hit = ~np.isnan(hit)
        sample = by_replica.get(r)
        comp_ok = ok & (comp >= 1.0)
        first = ok & ~no_ttft & (ttft > 0)
        values = {"tpot": np.log(decode[rows] / per[rows]), "comp": per[rows], "latency": lat[ok],
                  "outputs": np.log(comp[comp_ok]), "ttft": np.log(ttft[first]),
                  "prompt": np.log(np.maximum(cols.prompt_tokens[mask].astype(float), 1.0)),
                  "batch": batch[batch > 0],
                  "cuda": np.array([e is not None for e in cols.cuda_error[mask]], dtype=float),
                  "hit": hit[has_hit],
                  **{f: np.asarray(v, dtype=float) for f, v in _sample_values(sample).items()}}
        arrivals = {"tpot": arrival[rows], "comp": arrival[rows], "prompt": arrival, "batch": arrival[batch > 0],
                    "hit": arrival[has_hit], "outputs": arrival[comp_ok], "ttft": arrival[first]}
        out[r] = _Obs(n=int(mask.sum()), samples=int(sample is not None), values=values, arrival=arrivals)
    return out


class OracleFeed:
    """One more consumer of a run's chunks (like the benchmark's load meter): :meth:`add` each
    :class:`~skewwatch.sim.generator.TrafficChunk` in order (or :meth:`step` its parts), then
    :meth:`record`.

    ``pools``: model -> its replicas; ``faults``: the replica faults to trace (kinds outside
    :data:`KINDS` are ignored); ``clean``: the clean pools the thresholds are calibrated on;
    ``scored``: the event-time span of the calibration; ``prompt_p90``: the trace's P90 prompt
    (what ``context_burst`` is relative to).
    """

    def __init__(self, pools: Mapping[str, Sequence[str]], faults: Sequence[Fault], clean: Sequence[str],
                 scored: tuple[float, float], prompt_p90: float) -> None:
        self.faults = [f for f in faults if f.kind in STATISTICS]
        self.kinds = sorted({f.kind for f in self.faults}, key=KINDS.index)
        self.clean = list(clean)
        self.scored = scored
        self.prompt_p90 = float(prompt_p90)
        watched = {f.model for f in self.faults} | set(self.clean)
        self.pools = {m: _Pool(pools[m]) for m in pools if m in watched}
        self.traces = [FaultTrace(f.model, f.replica, f.kind, f.start, f.end) for f in self.faults]
        self.clean_streams: dict[str, dict[tuple[str, str], list[float]]] = {
            k: {(m, r): [] for m in self.clean for r in pools[m]} for k in self.kinds}

    def add(self, chunk: Any) -> None:
        """One step: ``chunk.end_ts``, ``chunk.requests``, ``chunk.telemetry``."""
        self.step(float(chunk.end_ts), chunk.requests, chunk.telemetry)

    def step(self, end_ts: float, cols: RequestColumns, samples: Sequence[TelemetrySample]) -> None:
        obs: dict[str, dict[str, _Obs]] = {}
        for model, pool in self.pools.items():
            obs[model] = _observations(cols, [s for s in samples if s.replica in pool.index], pool.replicas)
            pool.push(end_ts, obs[model])
        for fault, trace in zip(self.faults, self.traces, strict=True):
            seen = obs[fault.model][fault.replica]
            if fault.start <= end_ts - STEP_S and end_ts <= fault.end:  # a step inside the fault: its evidence
                trace.requests += seen.n
                trace.samples += seen.samples
            if fault.start < end_ts <= fault.end:
                trace.steps.append(end_ts)
                trace.increments.append(self._increment(fault, fault.model, fault.replica, end_ts, obs, fault.start,
                                                        fault.start))
        lo, hi = self.scored
        if lo < end_ts <= hi:
            for kind in self.kinds:
                as_fault = next(f for f in self.faults if f.kind == kind)
                # a fault that unfolds from its onset (a ramp) is judged on the clean replicas from a
                # virtual onset every fault's length: the same test, at every point of the unfolding
                span = as_fault.end - as_fault.start
                virtual = lo + math.floor((end_ts - STEP_S - lo) / span) * span if span > 0 else lo
                for (model, replica), stream in self.clean_streams[kind].items():
                    stream.append(self._increment(as_fault, model, replica, end_ts, obs, None, virtual))

    def record(self) -> OracleRecord:
        lo, hi = self.scored
        hours = len(self.clean) * (hi - lo) / 3600.0
        return OracleRecord(self.traces, {k: list(v.values()) for k, v in self.clean_streams.items()}, hours)

    def _increment(self, fault: Fault, model: str, replica: str, now: float,
                   obs: Mapping[str, Mapping[str, _Obs]], onset: float | None, since: float) -> float:
        """One replica's step against its peers, as if ``fault`` were on it (from ``onset``: None on
        a clean replica, where every observation counts), having unfolded since ``since``."""
        pool = self.pools[model]
        seen = obs[model][replica]
        if fault.kind == "replica_silence":
            peers = [o.n for r, o in obs[model].items() if r != replica]
            # Poisson, rate 0 under the fault: log P(0 | 0) - log P(0 | its share of the peers' requests)
            return FLOOR if seen.n else float(sum(peers)) / max(len(peers), 1)

        view = _View(pool, seen, replica, now, onset if fault.kind in ARRIVAL_KINDS else None, since)
        total = sum(llr(fault, view, self.prompt_p90) for llr in _SIGNALS[fault.kind])
        return max(float(total), FLOOR)


class _View:
    """What a signal reads: the judged replica's values this step and its peers' over the window."""

    def __init__(self, pool: _Pool, seen: _Obs, replica: str, now: float, onset: float | None,
                 since: float) -> None:
        self.pool, self.seen, self.replica, self.now, self.onset = pool, seen, replica, now, onset
        self.since = since  # where the fault's unfolding (a ramp) is counted from

    def mine(self, f: str) -> Floats:
        """The replica's values of ``f`` (relative, for :data:`RELATIVE`); a request field only for
        requests that arrived after ``onset`` (where the fault acts on arrival, it could not have
        touched the earlier ones)."""
        return self.mine_arrived(f)[0]

    def mine_arrived(self, f: str) -> tuple[Floats, Floats]:
        """:meth:`mine`, with each value's arrival time (NaN for a telemetry field)."""
        x = self.seen.values[f]
        at = self.seen.arrival.get(f, np.full(len(x), np.nan))
        if self.onset is not None and f in self.seen.arrival:
            keep = at >= self.onset
            x, at = x[keep], at[keep]
        if f in RELATIVE:
            x = x - self.seen.ref[f]
            keep = ~np.isnan(x)
            x, at = x[keep], at[keep]
        return x, at

    def ref(self, f: str) -> float:
        return self.seen.ref[f]

    def peers(self, f: str) -> Floats:
        return self.pool.peers(self.replica, f, self.now)


# Where a fault decides a request's fate on its arrival (its prompt, its stall, its prefix-cache hits)
ARRIVAL_KINDS = frozenset({"long_tail", "context_burst", "kv_pressure", "ttft_drift", "throughput_drop"})


def _judged(x: Floats, null: Floats) -> bool:
    return len(x) > 0 and len(null) >= MIN_PEER_OBS


def _stall_tpot(fault: Fault, v: _View, _p90: float) -> float:
    """long_tail, finished requests: a ``share`` stalled by (k - 1) x the peers' median latency over
    their output tokens."""
    x, null = v.mine("tpot"), v.peers("tpot")
    latency, ref = v.peers("latency"), v.ref("tpot")
    if not _judged(x, null) or not len(latency) or math.isnan(ref):
        return 0.0
    comp = v.mine("comp")
    ks = np.linspace(float(fault.param("factor_min")), float(fault.param("factor_max")), STALL_GRID)
    extra = (ks[None, :] - 1.0) * float(np.median(latency)) / comp[:, None]  # (n, k) ms per token
    base = np.exp(np.quantile(null, np.linspace(0.01, 0.99, 50)) + ref)  # ms per token, as a healthy replica's
    alt = (np.log(base[None, :, None] + extra[:, None, :]) - ref).reshape(len(x), -1)
    return float(mixture_llr(x, null, alt, share=float(fault.param("share"))).sum())


def _stall_live(fault: Fault, v: _View, _p90: float) -> float:
    """long_tail, the engine's live P99 time per output token: where one of the running requests is
    stalled (each is, with probability ``share``), a stalled token's latency: a normal one's plus
    its share of the stall."""
    x, null = v.mine("tpot_p99"), v.peers("tpot_p99")
    latency, comp, ref = v.peers("latency"), v.peers("comp"), v.ref("tpot_p99")
    if not _judged(x, null) or not len(latency) or not len(comp) or math.isnan(ref):
        return 0.0
    running = v.mine("running")
    share = float(fault.param("share"))
    stalled = 1.0 - (1.0 - share) ** max(float(running[0]) if len(running) else 1.0, 1.0)
    ks = np.linspace(float(fault.param("factor_min")), float(fault.param("factor_max")), STALL_GRID)
    tokens = np.quantile(comp, np.linspace(0.05, 0.95, 19))
    extra = ((ks[:, None] - 1.0) * float(np.median(latency)) / 1000.0 / tokens[None, :]).ravel()  # s per token
    base = np.exp(np.quantile(null, np.linspace(0.01, 0.99, 50)) + ref)  # s per token
    alt = (np.log(base[:, None] + extra[None, :]) - ref).ravel()
    return float(mixture_llr(x, null, alt, share=stalled).sum())


def _slow(fault: Fault, v: _View, _p90: float) -> float:
    """slow_replica: every decode step ``factor`` x slower, on finished requests and live tokens. The
    time per token is slower by 1..``factor`` (prefill, which the fault leaves alone, shares the
    iterations): a mixture of shifts up to ``log(factor)``."""
    return _tpot_shifted(v, math.log(float(fault.param("factor"))))


def _tpot_shifted(v: _View, shift: float) -> float:
    """Finished requests' and the live P50 time per token, slower by up to ``shift`` (log): a mixture
    of :data:`SHIFT_GRID` shares of it (prefill, which shares the iterations, is not slowed)."""
    total = 0.0
    for f in ("tpot", "tpot_p50"):
        x, null = v.mine(f), v.peers(f)
        if _judged(x, null):
            alt = (null[:, None] + shift * np.asarray(SHIFT_GRID)[None, :]).ravel()
            total += float(mixture_llr(x, null, alt).sum())
    return total


def _collapse(fault: Fault, v: _View, _p90: float) -> float:
    """batch_collapse: the batch (each request's, and the engine's running batch) under the limit,
    1-2 for a ``stuck_share`` of the time and 4..``max_batch`` otherwise; the queue it leaves behind
    (its size unstated: above every recent peer's with probability 1/2)."""
    stuck = float(fault.param("stuck_share"))
    top = max(int(fault.param("max_batch")), 4)
    caps = np.array([1, 2, *range(4, top + 1)], dtype=float)
    weights = np.array([stuck / 2] * 2 + [(1.0 - stuck) / (len(caps) - 2)] * (len(caps) - 2))
    total = 0.0
    for f in ("batch", "running"):
        x, null = v.mine(f), v.peers(f)
        if _judged(x, null):
            alt = np.minimum(null[:, None], caps[None, :]).ravel()
            total += float(mixture_llr(x, null, alt, alt_weights=np.tile(weights, len(null)), discrete=True).sum())
    x, null = v.mine("queue"), v.peers("queue")
    if _judged(x, null):
        top_q = float(null.max())
        # exchangeable with n peers' values, the replica's is above all of them with probability 1 / (n + 1)
        total += bernoulli_llr(int((x > top_q).sum()), len(x), 0, len(null) + 1, lambda p0: 0.5, smooth=False)
    return total


def _burst(fault: Fault, v: _View, p90: float) -> float:
    """context_burst: prompts log-normal of mean ``factor`` x the trace's P90 and ``cv``, capped."""
    x, null = v.mine("prompt"), v.peers("prompt")
    if not _judged(x, null):
        return 0.0
    mean = Injection(fault.kind, fault.replica, 0.0, 1.0, dict(fault.params)).burst_mean_tokens(p90)
    cap = float(fault.param("max_tokens")) if float(fault.param("max_tokens")) > 0 else 2.0 * mean
    alt = np.clip(_lognormal_quantiles(mean, float(fault.param("cv")), BURST_POINTS), 0.0, math.log(cap))
    return float(mixture_llr(x, null, alt).sum())


def _gpu(fault: Fault, v: _View, _p90: float) -> float:
    """gpu_fault: a ``share`` of requests fail with a CUDA error; the XID in every sample where the
    fault's class reports one."""
    share = float(fault.param("share"))
    total = 0.0
    x, null = v.mine("cuda"), v.peers("cuda")
    if _judged(x, null):
        total += bernoulli_llr(int(x.sum()), len(x), int(null.sum()), len(null), lambda p0: p0 + share * (1.0 - p0))
    x, null = v.mine("xid"), v.peers("xid")
    if fault.xid() is not None and _judged(x, null):
        total += bernoulli_llr(int(x.sum()), len(x), int(null.sum()), len(null), lambda p0: 1.0)
    return total


def _kv(fault: Fault, v: _View, _p90: float) -> float:
    """kv_pressure: hit rates at mean ``hit_rate`` (0.95 underutilized) with the peers' Beta
    concentration; telemetry fragmentation at ``fragmentation`` (fragmentation mode)."""
    fragmentation = fault.param("mode") == "fragmentation"
    target = float(fault.param("hit_rate")) if fragmentation else 0.95
    total = 0.0
    x, null = v.mine("hit"), v.peers("hit")
    if _judged(x, null):
        mu, var = float(null.mean()), float(null.var())
        if var > 0:
            conc = max(mu * (1.0 - mu) / var - 1.0, 1.0)
            alt = np.clip(target + (null - mu) * math.sqrt(target * (1.0 - target) / (conc + 1.0) / var), 0.0, 1.0)
        else:
            alt = np.full(1, target)
        total += float(mixture_llr(x, null, alt).sum())
    x, null = v.mine("frag"), v.peers("frag")
    if fragmentation and _judged(x, null):
        total += float(mixture_llr(x, null, np.array([float(fault.param("fragmentation"))])).sum())
    return total


def _drift(fault: Fault, v: _View, _p90: float) -> float:
    """ttft_drift: each request's first token later by (k - 1) x the replica's usual TTFT (the peers'
    median: the reference), k at its arrival on the ramp from 1 to ``factor`` over ``ramp_s``."""
    (x, at), null, ref = v.mine_arrived("ttft"), v.peers("ttft"), v.ref("ttft")
    if not _judged(x, null) or math.isnan(ref):
        return 0.0
    ramp = float(fault.param("ramp_s"))
    # where on the ramp each request arrived (a clean replica's earlier requests: at its foot)
    done = np.ones(len(x)) if ramp <= 0 else np.clip((np.nan_to_num(at, nan=v.now) - v.since) / ramp, 0.0, 1.0)
    extra = (float(fault.param("factor")) - 1.0) * done  # x the usual TTFT, per request
    base = np.exp(np.quantile(null, np.linspace(0.01, 0.99, 50)))  # a healthy TTFT over the usual one
    alt = np.log(base[None, :] + extra[:, None])
    return float(mixture_llr(x, null, alt).sum())


def _drop(fault: Fault, v: _View, _p90: float) -> float:
    """throughput_drop: outputs ``drop`` shorter (rounded, at least one token), every decode step
    ``1 / (1 - drop)`` slower (a shift of the time per token up to ``-log(1 - drop)``, as
    :func:`_slow`)."""
    keep = 1.0 - float(fault.param("drop"))
    total = 0.0
    x, null = v.mine("outputs"), v.peers("outputs")
    if _judged(x, null):
        alt = np.log(np.maximum(np.round(np.exp(null) * keep), 1.0))
        total += float(mixture_llr(x, null, alt).sum())
    return total + _tpot_shifted(v, -math.log(keep))


_SIGNALS: dict[str, tuple[Any, ...]] = {
    "long_tail": (_stall_tpot, _stall_live), "slow_replica": (_slow,), "batch_collapse": (_collapse,),
    "context_burst": (_burst,), "gpu_fault": (_gpu,), "kv_pressure": (_kv,), "ttft_drift": (_drift,),
    "throughput_drop": (_drop,)}


# ----------------------------------------------------------------------------- CUSUM, calibration, detection


def crossings(increments: Sequence[float] | Floats, h: float) -> list[int]:
    """Indices where a one-sided CUSUM of ``increments`` (from 0) exceeds ``h``, restarted after each."""
    s, out = 0.0, []
    for i, x in enumerate(increments):
        s = max(0.0, s + float(x))
        if s > h:
            out.append(i)
            s = 0.0
    return out


def _count(streams: Floats, h: float) -> int:
    """Crossings over every stream at once (rows, padded with FLOOR)."""
    s = np.zeros(streams.shape[0])
    n = 0
    for col in streams.T:
        s = np.maximum(s + col, 0.0)
        over = s > h
        n += int(over.sum())
        s[over] = 0.0
    return n


@dataclass(frozen=True, slots=True)
class Calibration:
    """A statistic's threshold ``h`` and its crossings at ``h`` on the clean streams it was chosen on."""

    h: float
    crossings: int
    pool_hours: float
    streams: int

    @property
    def false_per_hour(self) -> float | None:
        return self.crossings / self.pool_hours if self.pool_hours > 0 else None


def calibrate(streams: Sequence[Sequence[float]], pool_hours: float,
              target: float = FALSE_PER_HOUR_TARGET) -> Calibration:
    """The smallest ``h`` whose CUSUM crosses at most ``target`` x ``pool_hours`` times on the clean
    ``streams`` (each restarted after a crossing)."""
    rows = [np.asarray(s, dtype=float) for s in streams if len(s)]
    if not rows:
        return Calibration(0.0, 0, pool_hours, 0)
    grid = np.full((len(rows), max(len(r) for r in rows)), FLOOR)
    for i, r in enumerate(rows):
        grid[i, :len(r)] = r
    allowed = math.floor(target * pool_hours + 1e-9)
    lo, hi = 0.0, max(float(np.max(_path(r))) for r in rows)  # nothing crosses the largest value reached
    if _count(grid, lo) <= allowed:
        hi = lo
    while hi - lo > 1e-3 * max(hi, 1.0):  # crossings fall as h grows (restarts aside): bisect
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _count(grid, mid) > allowed else (lo, mid)
    return Calibration(hi, _count(grid, hi), pool_hours, len(rows))


def _path(increments: Floats) -> Floats:
    """The CUSUM path without restarts."""
    out = np.empty(len(increments))
    s = 0.0
    for i, x in enumerate(increments):
        s = max(0.0, s + float(x))
        out[i] = s
    return out


def detect(trace: FaultTrace, h: float) -> dict[str, Any]:
    """The oracle on one fault: its delay (None: undetectable), the largest CUSUM it reached, the evidence."""
    hit = crossings(trace.increments, h)
    top = float(np.max(_path(np.asarray(trace.increments)))) if trace.increments else 0.0
    delay = round(trace.steps[hit[0]] - trace.start, 3) if hit else None
    return {"model": trace.model, "replica": trace.replica, "kind": trace.kind, "start": trace.start,
            "end": trace.end, "delay_s": delay, "detectable": delay is not None, "h": round(h, 3),
            "max_cusum": round(top, 3), "requests": trace.requests, "samples": trace.samples,
            "why": None if delay is not None else _why(trace, top, h)}


def _why(trace: FaultTrace, top: float, h: float) -> str:
    if trace.kind != "replica_silence" and trace.requests == 0:
        return "no request reached the replica during the fault"
    return (f"evidence short of the threshold: the CUSUM reached {top:.1f}, h is {h:.1f} "
            f"({trace.requests} requests, {trace.samples} telemetry samples on the replica during the fault)")


def evaluate(records: Sequence[OracleRecord]) -> tuple[dict[str, Calibration], list[list[dict[str, Any]]]]:
    """Calibrate every statistic on the records' clean streams together (one calibration group), then
    run the oracle on each record's faults: the calibrations by kind, and per record its faults' results."""
    kinds = sorted({k for r in records for k in r.clean}, key=KINDS.index)
    hours = sum(r.clean_pool_hours for r in records)
    calibrations = {k: calibrate([s for r in records for s in r.clean.get(k, [])], hours) for k in kinds}
    results = [[detect(t, calibrations[t.kind].h) for t in r.faults if t.kind in calibrations] for r in records]
    return calibrations, results
