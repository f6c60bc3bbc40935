"""Long tail: some of a replica's requests are much slower than its peers' (seed §2.5).

Seed rule: "长尾请求: P99延迟 > 3×P50 且持续≥3个周期 → WARNING; 启用请求采样链路追踪注入"
(P99 > 3 × P50 lasting at least 3 periods → WARNING; turn on request sampling / tracing). The
action ``enable_tracing`` carries ``params.sample_rate`` (share of the replica's requests to trace).

The seed's ratio is a point value on one replica's end-to-end latency, which follows each
request's output length: healthy replicas of any real trace have P99/P50 of 3 to 40, so it holds
on all of them (the ``seed`` profile keeps it: ``seed_rule``). The default judges a replica
against its **peers** (the other replicas of its model in the same step, which see the same
traffic) or, without enough peers, against **its own past**, on time per output token (TPOT:
decode time / output tokens, which a request's length does not move), with two rules; the alert
holds when either holds:

* **live** (``live_rule``): the engine's own per-token latencies over the last ``live_span_s``
  (20 s) of scrapes (telemetry ``tpot_*``, ``ttft_*``; :mod:`~skewwatch.pipeline.detectors.live`),
  seen as tokens are produced rather than when requests finish. Statistic: the *tail excess*
  ``x = ln(mean TPOT / baseline mean TPOT) - max(0, ln(median TPOT / baseline median))``: how
  much slower the replica's tokens are on average than its baseline's, beyond what a shift of its
  median explains (a replica slowed as a whole is a slow replica, for the weights, not a tail).
  Threshold: ``x > live_z`` (5) standard deviations of the replica's own ``x`` over its past
  steps (:class:`~skewwatch.pipeline.detectors.live.Noise`: its spread on *this* traffic, started
  at ``live_noise_prior`` and never below ``live_noise_floor``); under a normal null that is a
  false-alarm probability of 3e-7 per step, and it stays small under the heavier tails of real
  prefill interference. Weaker steps add up: a CUSUM of the steps' excess in standard deviations,
  reference ``live_drift`` (1.5), holds above ``live_z - live_drift`` (two steps at 3.25, three
  at 2.7; :mod:`~skewwatch.pipeline.detectors.tail_live`). Evidence minimum: ``live_min_tokens``
  output tokens on the replica and on each of at least ``min_peers`` peers (else its own past,
  after ``live_history_steps`` steps).
  Not claimed when the replica's first tokens are slow too (mean TTFT above ``ttft_ratio`` x the
  baseline's): long prompts, KV reloads and queues slow every token of a batch through prefill,
  and are context_burst's, kv_pressure's and batch_collapse's to report.
* **exceedance** (``exceedance_rule``): the window's finished requests. The level is
  ``tail_ratio`` (2) x the peers' TPOT P99 (the median of the peers' P99s; without peers the
  replica's own P99 ``lookback_s`` earlier); a request of the baseline is above it with
  probability at most 1 %. The window's TPOT P50, P90, P99 and max prove how many of its ``n``
  requests are above it (at least half, a tenth, ...: :func:`~skewwatch.pipeline.detectors.evidence.min_exceeding`),
  and the rule holds when that count has probability below ``alpha`` (1e-3) under
  ``Binomial(n, 0.01)`` (:func:`~skewwatch.pipeline.detectors.evidence.binomial_tail_bound`).
  The evidence minimum follows from ``alpha``: a tenth of the requests above the level needs
  ``n >= 48`` to count. Not claimed when the median TPOT is above ``shift_ratio`` x the baseline's
  (a slow replica). Where the median TTFT is above ``ttft_ratio`` x the peers' (long prompts, KV
  reloads or a queue, which slow the decode of the batch they share by as much at most), the level
  rises by that ratio: what the traffic explains is taken out, and a stall beyond it still counts.
* **the same on end-to-end latency** (``latency_signal``): the window's latency P50, P95 and P99
  against ``tail_ratio`` x the peers' latency P99, peers only. A stall adds time to a request
  whatever its length, which TPOT dilutes on long outputs and inflates on short ones. Each signal
  is tested at ``alpha`` / 2. Beyond the peers' P99, how often a baseline request is above the level
  follows the slope of the peers' tail from their P95 to their P99 (a power law: it overstates a
  log-normal's rate there), never below one request in all the peers' requests of the window.

* **horizon** (``horizon_rule``), where the peers' windows are too thin for a P99: each window's
  newest step, its requests and its slowest (``step_count``, ``step_tpot_max``), summed over
  ``horizon_s`` (600 s) against ``tail_ratio`` x the slowest of the peers' ``M`` requests over the
  same span, which a request like theirs exceeds with probability at most ``1 / (M + 1)``; held
  while the replica's newest request above it is recent and its bulk is not slow
  (:class:`~skewwatch.pipeline.detectors.tail_horizon.HorizonRule`).

Every window rule needs at least ``min_count`` (6) finished requests in the window: a window of
1-5 requests says nothing about a share of them; the horizon rule's evidence is its span's.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> det = LongTailDetector()
>>> def fv(end, p90, p99, top, n=200):
...     return FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=n,
...                          tpot_p50=20.0, tpot_p90=p90, tpot_p99=p99, tpot_max=top, ttft_p50=100.0)
>>> det.update(fv(60.0, 22.0, 25.0, 30.0), None, now=60.0).alerts  # its own past, a minute later:
[]
>>> out = det.update(fv(120.0, 90.0, 150.0, 200.0), None, now=120.0)  # a tenth above 2 x 25 ms
>>> out.alerts[0].evidence["exceeding"], out.actions[0].action
(21, 'enable_tracing')
>>> from skewwatch.pipeline.detectors.long_tail_config import PROFILE_SEED
>>> seed = LongTailDetector(LongTailConfig.from_overrides(PROFILE_SEED))
>>> v = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=100,
...                   latency_p50=100.0, latency_p99=450.0)
>>> [len(seed.update(v, None, now=60.0 + 5 * i).alerts) for i in range(4)]
[0, 0, 1, 0]
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.key_columns import KeyColumns
from skewwatch.pipeline.detectors.live import (
    LIVE_KEY,
    LiveAggregate,
    peer_baselines,
    record,
)
from skewwatch.pipeline.detectors.long_tail_config import LongTailConfig
from skewwatch.pipeline.detectors.peers import others_median, others_medians, others_sum
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.tail_exceedance import (
    LATENCY_LOWER_TAIL,
    LATENCY_QUANTILES,
    TPOT_QUANTILES,
    ExceedanceTest,
)
from skewwatch.pipeline.detectors.tail_horizon import HorizonRule
from skewwatch.pipeline.detectors.tail_live import LIVE_SUM, LiveRule
from skewwatch.pipeline.detectors.threshold import Finding, ThresholdDetector
from skewwatch.pipeline.finite import nan_as_none
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

TPOT_KEY = "tpot_by_end_ms"  # the memory entry: window end (ms) -> [TPOT p50, p99, count] of a window

@dataclass(slots=True)
class _Peers:
    """One replica's peers in the current step."""

    live: LiveAggregate | None  # pooled live aggregate of the peers with enough tokens
    tpot_p50: float | None  # medians over the peers whose window has peer_min_count requests
    tpot_p99: float | None
    ttft_p50: float | None
    count: float | None  # the median request count behind those peers' quantiles
    latency_p50: float | None = None  # medians over the peers with peer_min_count requests, of latency
    latency_p99: float | None = None
    latency_count: float | None = None
    latency_p95: float | None = None  # (its slope to their P99 continues beyond it)
    latency_total: float = 0.0  # requests behind the peers' latency quantiles, all peers together


class LongTailDetector(ThresholdDetector):
    name = "long_tail"
    Config = LongTailConfig
    config: LongTailConfig

    def __init__(self, config: LongTailConfig | None = None) -> None:
        super().__init__(config)
        # the current step's peers as columns, read per replica by its row (empty outside a step)
        self._row_of: dict[str, int] = {}
        self._peer_live: list[LiveAggregate | None] = []
        self._peer_columns: tuple[npt.NDArray[np.float64], ...] = ()
        self._prepared: StepColumns | None = None  # the step they are of
        self._live_top_over_base: npt.NDArray[np.float64] = np.zeros(0)  # per row (see prepare)
        self._live_now = 0.0  # the window end prepare aggregated the live samples at
        self._live_none = True  # no replica of the prepared step has a live aggregate
        self._live_aggregates: list[LiveAggregate | None] = []  # per row, once its sample is recorded
        # each replica's windows' TPOT for its own-past reference (the memory's TPOT_KEY: window
        # end in ms -> [p50, p99, count]) as columns [count, p50, p99], kept for a step's replicas at once
        self._tpot = KeyColumns(width=3)
        # the horizon rule: the pool's newest steps over horizon_s, and its judgement of the step
        cfg = self.config
        self._live = LiveRule(cfg)
        self._test = ExceedanceTest(cfg.tail_ratio, cfg.shift_ratio, self._signal_alpha(), cfg.sample_rate)
        self._horizon = HorizonRule(cfg.horizon_s, cfg.horizon_recent_s, cfg.tail_ratio, self._signal_alpha(),
                                    cfg.shift_ratio, cfg.min_peers)
        self._horizon_step: StepColumns | None = None  # the step it judged
        self._open: set[str] = set()  # replicas whose alert was open after the last step
        self._summing: set[str] = set()  # replicas whose live rule has a sum under way (never screened)

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        cfg = self.config
        rules = []
        if cfg.live_rule:
            rules.append("tokens slower than the baseline's beyond its median")
        if cfg.exceedance_rule:
            rules.append(f"requests above {cfg.tail_ratio:g} x the baseline's TPOT P99")
        if cfg.horizon_rule:
            rules.append(f"requests above {cfg.tail_ratio:g} x the peers' slowest over {cfg.horizon_s:g} s")
        if cfg.seed_rule:
            rules.append(f"p99 > {cfg.ratio:g} x p50")
        return Severity.WARNING, "enable_tracing", "long tail: " + ", or ".join(rules)

    def step_fields(self) -> tuple[str, ...]:
        cfg = self.config
        fields: tuple[str, ...] = ("count", "window_end", "tpot_p50", "tpot_p90", "tpot_p99", "tpot_max", "ttft_p50")
        if cfg.exceedance_rule and cfg.latency_signal:
            fields = (*fields, "latency_p50", "latency_p95", "latency_p99")
        if cfg.horizon_rule:
            fields = (*fields, "step_count", "step_tpot_max")
        return (*fields, "latency_p50", "latency_p99") if cfg.seed_rule else fields

    # ------------------------------------------------------------------ the pool

    def prepare(self, step: StepColumns | None) -> None:
        """The peers of every replica of the step: live aggregates (each replica's memory is
        brought up to date with its fresh sample first) and the finished requests' TPOT."""
        self._row_of, self._peer_live, self._peer_columns = {}, [], ()
        self._peer_latency: tuple[npt.NDArray[np.float64], ...] = ()
        self._prepared, self._live_aggregates = None, []
        self._horizon_step = None
        cfg = self.config
        if step is None or len(step) < 2 or not (cfg.live_rule or cfg.exceedance_rule):
            if step is not None and len(step) >= 2:
                self._prepare_horizon(step)
            return
        now = step.vectors[0].window_end
        live: list[LiveAggregate | None] = [None] * len(step)
        if cfg.live_rule:
            state, keys, samples = self._state, step.keys, step.telemetry
            if any(map(operator.is_not, samples, repeat(None))):
                rows: Iterable[int] = range(len(step))
            else:  # no fresh sample (by identity): only the replicas with samples kept can aggregate
                row_of = step.row_of
                rows = sorted(row_of[key] for key, key_state in state.items()
                              if key in row_of and key_state.memory.get(LIVE_KEY))
            for row in rows:
                key, sample = keys[row], samples[row]
                if sample is None or not sample.tpot_count or sample.tpot_mean_s is None:
                    # no new live sample (record() keeps none: NVML alone has no per-token latencies)
                    # and none kept: no aggregate (aggregate() of no samples is None)
                    key_state = state.get(key)
                    if key_state is None or not key_state.memory.get(LIVE_KEY):
                        continue
                memory = self.key_memory(key)
                record(memory, sample, cfg.ttft_span_s)
                live[row] = self._live.aggregate(memory, now)
        peer_live = peer_baselines(live, cfg.live_min_tokens, cfg.min_peers)
        count = step.column("count")
        p50, p99, ttft = step.column("tpot_p50"), step.column("tpot_p99"), step.column("ttft_p50")
        valid = (count >= cfg.peer_min_count) & ~np.isnan(p50) & ~np.isnan(p99)
        ttft_valid = valid & ~np.isnan(ttft)
        latency = cfg.exceedance_rule and cfg.latency_signal
        if latency:
            lat50, lat95, lat99 = step.column("latency_p50"), step.column("latency_p95"), step.column("latency_p99")
            lat_valid = (count >= cfg.peer_min_count) & ~np.isnan(lat50) & ~np.isnan(lat95) & ~np.isnan(lat99)
        if (ttft_valid == valid).all() and (not latency or (lat_valid == valid).all()):
            # the usual step: one sort for all of them
            stacked = [p50, p99, ttft, count, *((lat50, lat95, lat99) if latency else ())]
            medians = others_medians(np.stack(stacked), valid, cfg.min_peers)
            peer_p50, peer_p99, peer_ttft, peer_count = medians[:4]
            if latency:
                self._peer_latency = (medians[4], medians[6], peer_count, medians[5], others_sum(count, valid))
        else:
            peer_p50, peer_p99, peer_count = others_medians(np.stack([p50, p99, count]), valid, cfg.min_peers)
            peer_ttft = others_median(ttft, ttft_valid, cfg.min_peers)
            if latency:
                peer_lat50, peer_lat95, peer_lat99, peer_lat_count = others_medians(
                    np.stack([lat50, lat95, lat99, count]), lat_valid, cfg.min_peers)
                self._peer_latency = (peer_lat50, peer_lat99, peer_lat_count, peer_lat95,
                                      others_sum(count, lat_valid))
        self._row_of, self._peer_live, self._live_aggregates = step.row_of, peer_live, live
        self._peer_columns = (peer_p50, peer_p99, peer_ttft, peer_count)
        self._prepared = step
        self._live_none = not any(map(operator.is_not, live, repeat(None)))
        if cfg.live_rule and self._live_none:
            # no replica has live samples: no claim possible anywhere (what the general case gives)
            self._live_top_over_base = np.full(len(step), np.nan)
            self._live_now = now
        elif cfg.live_rule:
            # the slowest sample of the span against the pool's mean (NaN: no claim possible; inf: the
            # replica's own past judges, which the screen does not read)
            top = np.array([math.nan if a is None or a.tokens < cfg.live_min_tokens or a.tpot_top_s is None
                             else a.tpot_top_s for a in live])
            base = np.array([math.inf if b is None else b.tpot_mean_s for b in peer_live])
            self._live_top_over_base = np.where(np.isinf(base), np.where(np.isnan(top), np.nan, np.inf),
                                                np.where(base > 0, top / np.where(base > 0, base, 1.0), np.nan))
            self._live_now = now
        self._prepare_horizon(step)

    def _prepare_horizon(self, step: StepColumns) -> None:
        """The horizon rule's step: every step of the pool is recorded (a pool whose windows judge
        now may run thin later), each replica's evidence forgotten when its alert resolved."""
        if not self.config.horizon_rule:
            return
        state = self._state
        now_open = {key for key in self._active if any(r.hysteresis.is_open for r in state[key].rules)}
        self._horizon.step(step.vectors[0].window_end, step.keys, step.column("step_count"),
                           step.column("step_tpot_max"), self._open - now_open)
        self._open, self._horizon_step = now_open, step

    def _peers_of(self, key: str) -> _Peers | None:
        """``key``'s peers in the current step (None outside one, or for a replica not in it)."""
        row = self._row_of.get(key)
        if row is None:
            return None
        p50, p99, ttft, count = self._peer_columns
        peers = _Peers(live=self._peer_live[row], tpot_p50=nan_as_none(p50[row]), tpot_p99=nan_as_none(p99[row]),
                       ttft_p50=nan_as_none(ttft[row]), count=nan_as_none(count[row]))
        if self._peer_latency:
            lat50, lat99, lat_count, lat95, lat_total = self._peer_latency
            if not math.isnan(lat_count[row]):
                peers.latency_p50, peers.latency_p99 = nan_as_none(lat50[row]), nan_as_none(lat99[row])
                peers.latency_count, peers.latency_p95 = nan_as_none(lat_count[row]), nan_as_none(lat95[row])
                peers.latency_total = float(lat_total[row])
        return peers

    # ------------------------------------------------------------------ the rules

    remembers = True  # the live samples, the replica's own baseline and its TPOT history move every step

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_]:
        """Replicas no rule can hold on (their memory still moves: remember). The evidence-aware
        rules: below ``min_count`` requests; or, where the pool is the baseline (after
        :meth:`prepare` of this step), the live rule's tail excess, a token-weighted mean of
        per-sample log ratios to the pool's mean TPOT, cannot reach ``live_z`` x
        ``live_noise_floor`` (its least threshold) when the slowest sample's ratio does not, and
        the exceedance rule proves no request above ``tail_ratio`` x the pool's P99 when none of
        the window's TPOT quantiles is there (nor any without its TPOT median and maximum). A
        replica judged against its own past is not screened. The seed's rule: where P99 is not
        above ``ratio`` x P50."""
        cfg = self.config
        count = step.column("count")
        can = np.zeros(len(step), dtype=bool)
        if cfg.live_rule or cfg.exceedance_rule:
            floor = count >= cfg.min_count
            if self._prepared is not step:
                can |= floor
            else:
                rules = np.zeros(len(step), dtype=bool)
                if cfg.live_rule:
                    rules |= step.column("window_end") != self._live_now
                    if self._summing:  # a sum under way may hold on a step the bound below clears
                        row_of = step.row_of
                        rows = [row_of[k] for k in self._summing if k in row_of]
                        rules[rows] = True
                    if not self._live_none:  # (else every ratio is NaN: no claim)
                        ratio = self._live_top_over_base  # NaN: no claim; inf: own past judges
                        with np.errstate(divide="ignore", invalid="ignore"):
                            excess_bound = np.log(ratio)
                        rules |= excess_bound > cfg.live_z * cfg.live_noise_floor * (1.0 - 1e-9)
                if cfg.exceedance_rule:
                    p50, p99, _, peer_count = self._peer_columns
                    pooled = ~np.isnan(p50) & ~np.isnan(p99) & ~np.isnan(peer_count) & (peer_count != 0)
                    own = ~np.isnan(step.column("tpot_p50")) & ~np.isnan(step.column("tpot_max"))
                    tpot_q = np.stack([step.column("tpot_p50"), step.column("tpot_p90"), step.column("tpot_p99"),
                                       step.column("tpot_max")])
                    # TPOT: the rate at the peers' P99 (no slope beyond it: under queueing the replicas'
                    # TPOT differ by more than their tails' slope allows)
                    rules |= own & (~pooled | self._test.possible(count, tpot_q, TPOT_QUANTILES, p99, peer_count))
                    if cfg.latency_signal and self._peer_latency:
                        _, lat99, lat_count, lat95, lat_total = self._peer_latency
                        lat_q = np.stack([step.column("latency_p50"), step.column("latency_p95"),
                                          step.column("latency_p99")])
                        own_lat = ~np.isnan(lat_q[0]) & ~np.isnan(lat_q[2])
                        rules |= own_lat & self._test.possible(
                            count, lat_q, LATENCY_QUANTILES, lat99, lat_count, (lat95, LATENCY_LOWER_TAIL, lat_total))
                can |= floor & rules
        if cfg.horizon_rule and self._horizon_step is step:
            peer_p99 = self._peer_columns[1] if self._prepared is step else np.full(len(step), np.nan)
            can |= self._horizon.holds(len(step)) & np.isnan(peer_p99)  # where the window has no reference
        if cfg.seed_rule:
            p50, p99 = step.column("latency_p50"), step.column("latency_p99")
            can |= (count >= max(cfg.min_count, 1)) & (p50 > 0) & (p99 > cfg.ratio * p50)
        return ~can

    def remember_step(self, step: StepColumns, rows: npt.NDArray[np.int64]) -> None:
        """:meth:`remember` of the step's ``rows``: the TPOT history of all at once; the live rule
        only learns on the replicas :meth:`prepare` found samples for (without, it learns nothing)."""
        if self._prepared is not step:  # a lone replica, or a step without peers: one at a time
            super().remember_step(step, rows)
            return
        cfg = self.config
        if cfg.live_rule and not self._live_none:
            aggregates, peer_live = self._live_aggregates, self._peer_live
            vectors, keys = step.vectors, step.keys
            for row in rows.tolist():
                agg = aggregates[row]
                if agg is not None and agg.tokens >= cfg.live_min_tokens:
                    memory = self.key_memory(keys[row])
                    self._live.learn(vectors[row], memory, agg, peer_live[row])
                    self._note_sum(keys[row], memory)
        if cfg.exceedance_rule and len(rows):
            keys = step.keys
            own = self._tpot.rows(keys if len(rows) == len(keys) else [keys[row] for row in rows.tolist()])
            count = step.column("count")[rows]
            entries = np.empty((len(rows), 3))
            entries[:, 1] = step.column("tpot_p50")[rows]
            entries[:, 2] = step.column("tpot_p99")[rows]
            entries[:, 0] = count
            kept = (count >= cfg.peer_min_count) & ~np.isnan(entries[:, 1]) & ~np.isnan(entries[:, 2])
            ends = step.column("window_end")[rows]
            if (ends == ends[0]).all():  # a decider's step: one window end
                every = kept.all()
                self._record_tpot(own if every else own[kept], entries if every else entries[kept], own,
                                  float(ends[0]))
                return
            for end in np.unique(ends).tolist():
                same = ends == end
                self._record_tpot(own[same & kept], entries[same & kept], own[same], end)

    def _record_tpot(self, kept: npt.NDArray[np.int64], entries: npt.NDArray[np.float64],
                     rows: npt.NDArray[np.int64], window_end: float) -> None:
        """Keep the windows of ``kept`` that end at ``window_end``; drop those of ``rows`` that
        ended more than ``lookback_s`` before it."""
        end_ms = round(window_end * 1000)
        self._tpot.put(kept, end_ms, entries)
        self._tpot.drop_before(rows, end_ms - round(self.config.lookback_s * 1000))

    def column_memory(self) -> dict[str, dict[str, Any]]:
        tpot = self._tpot
        return {key: {TPOT_KEY: {str(end): [p50, p99, int(n)] for end, (n, p50, p99) in tpot.records(key).items()}}
                for key in tpot.held_keys()}

    def load_column_memory(self, key: str, memory: dict[str, Any]) -> None:
        self._note_sum(key, memory)
        entries = memory.pop(TPOT_KEY, None) or {}
        own = np.array([self._tpot.add(key)])
        for end, (p50, p99, n) in entries.items():
            self._tpot.put(own, int(end), np.array([[float(n), float(p50), float(p99)]]))

    def clear_column_memory(self) -> None:
        self._tpot.clear()
        self._summing.clear()

    def forget(self, key: str) -> None:
        super().forget(key)
        self._summing.discard(key)
        self._tpot.forget(key)
        self._horizon.horizon.forget(key)

    def remember(self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]) -> None:
        """What :meth:`evaluate` does to the memory of a replica none of its rules holds on, with
        nothing described: the live aggregate :meth:`prepare` took of this very sample, in this
        very memory, at this window end is reused (recording the sample again changes nothing),
        and no _Peers is built."""
        cfg = self.config
        if cfg.live_rule:
            key = fv.key
            row = self._row_of.get(key)
            step = self._prepared
            key_state = self._state.get(key)
            if (row is not None and step is not None and step.vectors[row] is fv and step.telemetry[row] is telemetry
                    and fv.window_end == self._live_now and key_state is not None and key_state.memory is memory):
                agg = self._live_aggregates[row]
            else:
                record(memory, telemetry, cfg.ttft_span_s)
                agg = self._live.aggregate(memory, fv.window_end)
            self._live.learn(fv, memory, agg, None if row is None else self._peer_live[row])
            self._note_sum(key, memory)
        if cfg.exceedance_rule:
            self._keep_tpot(fv)

    def _note_sum(self, key: str, memory: dict[str, Any]) -> None:
        if LIVE_SUM in memory:
            self._summing.add(key)
        else:
            self._summing.discard(key)

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        peers = self._peers_of(fv.key)
        evidence: dict[str, float | int | str | None] = {"count": fv.count, "min_count": cfg.min_count}
        findings: list[Finding] = []
        if cfg.live_rule:
            key_state = self._state.get(fv.key)
            is_open = key_state is not None and any(r.hysteresis.is_open for r in key_state.rules)
            findings.append(self._live.finding(fv, telemetry, memory, None if peers is None else peers.live, evidence,
                                               is_open))
            self._note_sum(fv.key, memory)
        if cfg.exceedance_rule:
            exceedance = self._exceedance(fv, memory, peers, evidence)
            if findings and findings[0].holds is not None and cfg.defer_to_live:
                # the live rule judged the same requests while they ran: the finished ones add nothing
                exceedance = Finding(holds=None, evidence=exceedance.evidence)
            findings.append(exceedance)
        if cfg.horizon_rule and (peers is None or peers.tpot_p99 is None):
            # where the window has no peers' reference (their windows too thin): the steps summed over
            # the horizon, which neither the live span nor the window holds (not deferred to the live rule)
            findings.append(self._horizon_finding(fv, evidence))
        if cfg.seed_rule:
            findings.append(self._seed(fv, evidence))
        holding = [f for f in findings if f.holds]
        if holding:
            return {"main": holding[0]}
        judged = [f for f in findings if f.holds is False]
        return {"main": judged[0] if judged else Finding(holds=None, evidence=evidence)}

    def _keep_tpot(self, fv: FeatureVector) -> list[float] | None:
        """Keep the window's TPOT (with ``peer_min_count`` requests) for the own-past reference,
        and only the windows that ended at most ``lookback_s`` before; return the one that ended
        exactly that long before, as [p50, p99, count] (None without it)."""
        cfg = self.config
        n, p50, p99 = fv.count, fv.tpot_p50, fv.tpot_p99
        own = self._tpot.add(fv.key)
        end_ms = round(fv.window_end * 1000)
        before = self._tpot.get(own, end_ms - round(cfg.lookback_s * 1000))
        rows = np.array([own])
        if n >= cfg.peer_min_count and p50 is not None and p99 is not None:
            self._record_tpot(rows, np.array([[float(n), p50, p99]]), rows, fv.window_end)
        else:
            self._record_tpot(rows[:0], np.zeros((0, 3)), rows, fv.window_end)
        return None if before is None else [before[1], before[2], before[0]]

    def _signal_alpha(self) -> float:
        """Each signal's share of ``alpha``: half of it when latency is tested beside TPOT."""
        cfg = self.config
        return cfg.alpha / 2.0 if cfg.latency_signal else cfg.alpha

    def _exceedance(self, fv: FeatureVector, memory: dict[str, Any], peers: _Peers | None,
                    evidence: dict[str, Any]) -> Finding:
        """The exceedance rule (module docstring) on TPOT and, against the peers, on end-to-end
        latency; keeps the window's TPOT for the own-past reference."""
        cfg = self.config
        n, p50, p90, p99, top = fv.count, fv.tpot_p50, fv.tpot_p90, fv.tpot_p99, fv.tpot_max
        before = self._keep_tpot(fv)
        ttft_peers = peers.ttft_p50 if peers is not None else None
        # first tokens slower than the peers' (long prompts, KV reloads, a queue) slow the decode of
        # the batch they share by as much at most: above ttft_ratio x theirs, the level rises by that ratio
        prefill = (fv.ttft_p50 / ttft_peers if ttft_peers and fv.ttft_p50 is not None
                   and fv.ttft_p50 > cfg.ttft_ratio * ttft_peers else 1.0)
        tpot: Finding | None = None
        if peers is not None and peers.tpot_p99 is not None and peers.tpot_p50 is not None and peers.count:
            ref = (peers.tpot_p50, peers.tpot_p99, peers.count, "peers")
            tail: tuple[float | None, float, float] | None = None  # no slope beyond the P99 (as the screen)
        elif before is not None and len(before) > 2:
            ref = (before[0], before[1], before[2], "own past")
            tail = None
        else:
            ref = None
        if ref is not None and n >= cfg.min_count and p50 is not None and top is not None and ref[1] > 0:
            tpot = self._test.judge(n, ((0.5, p50), (0.9, p90), (0.99, p99), (1.0, top)), ref, tail, prefill,
                                         "TPOT", "decoded slower than", "ms per token", evidence, "tpot")
        latency: Finding | None = None
        if (cfg.latency_signal and peers is not None and peers.latency_p50 is not None
                and peers.latency_p99 is not None and peers.latency_count and peers.latency_p99 > 0
                and n >= cfg.min_count and fv.latency_p50 is not None and fv.latency_p99 is not None):
            ref = (peers.latency_p50, peers.latency_p99, peers.latency_count, "peers")
            latency = self._test.judge(
                n, ((0.5, fv.latency_p50), (0.95, fv.latency_p95), (0.99, fv.latency_p99)), ref,
                (peers.latency_p95, LATENCY_LOWER_TAIL, peers.latency_total), prefill,
                "latency", "took longer than", "ms", evidence, "latency")
        found = [f for f in (tpot, latency) if f is not None]
        if not found:
            return Finding(holds=None, evidence=evidence)
        holding = [f for f in found if f.holds]
        return holding[0] if holding else found[0]

    def _horizon_finding(self, fv: FeatureVector, evidence: dict[str, Any]) -> Finding:
        """The horizon rule (module docstring) on ``fv``'s replica, as :meth:`prepare` judged its step."""
        step = self._horizon_step
        row = None if step is None else step.row_of.get(fv.key)
        if row is None or step is None or step.vectors[row] is not fv:
            return Finding(holds=None, evidence=evidence)
        holds, found, message = self._horizon.finding(row, self.config.horizon_s)
        return Finding(holds=holds, message=message, evidence={**evidence, **found},
                       params={"sample_rate": self.config.sample_rate})

    def _seed(self, fv: FeatureVector, evidence: dict[str, Any]) -> Finding:
        """The seed's rule: end-to-end P99 > ratio x P50."""
        cfg = self.config
        p50, p99 = fv.latency_p50, fv.latency_p99
        evidence.update({"latency_p50_ms": p50, "latency_p99_ms": p99, "ratio_threshold": cfg.ratio})
        if p50 is None or p99 is None or p50 <= 0 or fv.count < max(cfg.min_count, 1):
            return Finding(holds=None, evidence=evidence)
        ratio = p99 / p50
        evidence["p99_over_p50"] = ratio
        message = (
            f"long tail: p99 {fmt(p99)} ms is {ratio:.2f} x p50 {fmt(p50)} ms "
            f"(> {cfg.ratio:g} x for >= {cfg.persistence} steps)"
        )
        return Finding(holds=p99 > cfg.ratio * p50, message=message, evidence=evidence,
                       params={"sample_rate": cfg.sample_rate})
