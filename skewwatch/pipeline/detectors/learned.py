"""Learned: a replica unlike its own past relative to its pool, for the shapes no rule names.

The five rules each watch a shape someone wrote down. This detector watches what none of them
names (a replica whose TTFT drifts up over ten minutes, tokens/s falling while latency holds, a mix
shift on one replica) by learning each replica's normal, online, with the novelty scorer of
:mod:`skewwatch.pipeline.detectors.novelty` (``make_scorer``: range novelty at several time scales,
its likelihood; the one evaluated on NAB by ``bench/nab``).

**What it sees.** Per replica and step, for each field in ``features``: the log of the replica's
value over the pool's typical replica (the median over the model's replicas of the same step), so
that a change of the whole pool (more traffic, longer prompts everywhere) moves no replica. The
median and not the model's merged vector: in a pool of four, one replica whose tokens/s fell 40 %
moves the merged per-replica share by 10 %, which made its three healthy peers look shifted too;
the median of the replicas does not move. Every window with ``min_count`` requests is a sample (how
much evidence it carries is weighed when an alert opens), a feature counts only when
``min_replicas`` replicas have it; each replica's scorer is one row of a
:class:`~skewwatch.pipeline.detectors.novelty.NoveltyBank`. TTFT per prompt token is judged at the
pool's typical prompt (``prompt_slope``, :mod:`~skewwatch.pipeline.detectors.pool_slope`): a TTFT is
prefill plus a wait for a step, so per prompt token a short prompt takes longer than a long one, and
the pool's slope on the windows' prompts (``ttft_prompt_tokens_gmean``) is learned and taken out.
Times per token and to first token are judged at the pool's typical load (``load_slope``): in a pool
near its capacity, a replica that takes a stopped or slowed peer's share serves larger batches and
longer queues, and its decode steps and first tokens take longer for it, not for a fault of its own.
The pool's slopes of the log time per token on the windows' log batch and log prompt, and of the
log TTFT on log(1 + queue), are learned the same way and taken out (:data:`LOAD_OF`).

**When it fires.** A sample holds when its most novel feature lies outside its own range (the
scorer's, at some time scale) and outside the union of the ranges the pool's replicas spanned at
that scale (``pool_range``: in a healthy pool replicas take turns above and below the median, and
one replica's own hour is too little evidence to call a level new that a peer has been at), by at
least ``min_novelty`` of the range; with ``threshold`` > 0 the scorer's level (the likelihood of the
step's novelty, 0..1) must also reach it (river's ``ThresholdFilter`` semantics). It also holds on
the shift test (:mod:`skewwatch.pipeline.detectors.shift`, ``shift_z`` > 0): the mean of the
replica's last ``shift_window`` windows that share no request lies ``shift_z`` standard errors or
more from the mean of its own past, by ``shift_min`` or more, for the pool's furthest replica on
that feature (each window weighed by its requests: a window of twenty is more evidence than one).
The range test sees a new extreme at once; the shift test sees a level that moved by a few times the
noise of a mean, which on a replica of few requests a window stays inside ranges whose extremes are
single noisy windows. The alert opens after ``persistence`` holding samples in a row that span
``min_requests`` distinct requests (windows overlap: each sample after the first adds the part of
its window newer than the previous sample), so a replica with few requests a window needs more
samples; a sample the shift test holds spans at least the requests of the recent windows its z is
over (that evidence is already counted in the z). A sample that does not hold ends the run; a window
without one (no request: no evidence either way) does not, nor a sample without a value for the
feature the run holds on, for up to
``clear_steps`` samples' time. It resolves after ``clear_steps`` that do not hold (hysteresis as
every detector has, counted in samples). Nothing holds before a replica has given ``warmup`` samples
(and each feature ``grace``): no alert on a replica it does not know yet. A run of ``adapt`` holding
samples, once its alert is open, is a lasting change: the replica's scorer and shift test start over
(its warm-up again). The alert is INFO and carries no action: it says *which* feature is unlike the
replica's past and the pool's by how much, for a person to look at.

**What it costs.** The scorers of a model's replicas are updated together, as numpy columns, once
every ``cadence_steps`` steps (models take turns: a model's turn is fixed by its name, so every
step carries about ``1 / cadence_steps`` of the fleet); ``bench/scale.py --learned both`` measures it.
All lengths of the scorer (``scales``, ``memory``, ``grace``, ``warmup``) and the hysteresis are
counted in samples, one per ``cadence_steps`` steps.

``update`` (one vector alone: the per-model vector with ``[detectors.decider] model_level``, or a
replica outside a step) judges the vector's own values (log), with no pool to relate them to.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> det = LearnedDetector(LearnedConfig(cadence_steps=1, warmup=20, grace=10, memory=60))
>>> def fv(end, ttft):
...     return FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=100,
...                          ttft_p50=ttft, ttft_per_prompt_token=ttft / 1000, latency_p50=900.0, tokens_per_s=50.0)
>>> opened = []
>>> for i in range(60):
...     opened += det.update(fv(5.0 * i, 200.0 + 10 * (i % 3)), None, now=5.0 * i).alerts
>>> for i in range(60, 66):
...     opened += det.update(fv(5.0 * i, 800.0), None, now=5.0 * i).alerts
>>> [(a.state, a.severity, a.evidence["feature"]) for a in opened]
[('open', <Severity.INFO: 'INFO'>, 'ttft_per_prompt_token')]
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

from skewwatch.pipeline.detectors.alerts import Action, Alert, DetectorOutput, Severity
from skewwatch.pipeline.detectors.base import Detector
from skewwatch.pipeline.detectors.learned_config import LearnedConfig
from skewwatch.pipeline.detectors.novelty import NoveltyBank, make_scorer
from skewwatch.pipeline.detectors.pool_slope import PoolSlope
from skewwatch.pipeline.detectors.shift import ShiftBank
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

STATE_VERSION = 1
STEP_S = 5.0  # the windows' step: a model's turn is counted in steps of event time

PER_TOKEN = "ttft_per_prompt_token"  # the feature judged at the pool's typical prompt (``prompt_slope``)
PROMPTS = "ttft_prompt_tokens_gmean"  # the prompts it is over (contract v1.8)
# feature -> the replica's load that explains it (``load_slope``): a decode step's time grows with the
# batch it serves, a first token waits behind the queue (log(1 + queue): an empty queue is common)
LOAD_OF: dict[str, tuple[str, ...]] = {
    "tpot_p50": ("batch_size_mean", "prompt_tokens_mean"), "tpot_p99": ("batch_size_mean", "prompt_tokens_mean"),
    "ttft_per_prompt_token": ("queue_length_mean",), "ttft_p50": ("queue_length_mean",),
    "ttft_p99": ("queue_length_mean",)}

__all__ = ["LearnedDetector", "make_scorer"]


class LearnedDetector(Detector):
    """Per replica, a novelty scorer over its log ratios to the pool's median; INFO alerts with hysteresis."""

    name: ClassVar[str] = "learned"
    Config = LearnedConfig
    config: LearnedConfig

    def __init__(self, config: LearnedConfig | None = None) -> None:
        super().__init__(config)
        self._params = self.config.scorer_params()
        self._bank = NoveltyBank(list(self.config.features), self._params)
        self._shift = ShiftBank(len(self.config.features), self.config.shift_params())
        # the feature judged at the pool's typical prompt, and each pool's slope (-1: none)
        self._per_token = (self.config.features.index(PER_TOKEN)
                           if self.config.prompt_slope and PER_TOKEN in self.config.features else -1)
        self._slope = PoolSlope(self.config.memory, self.config.min_requests)
        # (feature index, its load's field) for the features judged at the pool's typical load
        self._loaded = [(f, load) for f, name in enumerate(self.config.features)
                        if self.config.load_slope and name in LOAD_OF for load in LOAD_OF[name]]
        self._load = PoolSlope(self.config.memory, self.config.min_requests)
        self._row: dict[str, int] = {}  # key -> its row in the bank and the hysteresis arrays
        self._keys: list[str] = []  # row -> key
        self._hits = np.zeros(0, dtype=np.int64)  # hysteresis, one entry per row (see base.Hysteresis)
        self._misses = np.zeros(0, dtype=np.int64)
        self._open = np.zeros(0, dtype=bool)
        self._held = np.zeros(0)  # requests the row's current run of holding samples spans
        self._feature = np.zeros(0, dtype=np.int64)  # the feature the run last held on (-1: no run)
        self._last = np.zeros(0)  # event time of the row's last sample (NaN: none yet)
        self._opened: dict[str, dict[str, Any]] = {}  # key -> evidence of the step that opened its alert

    # ------------------------------------------------------------------ rows

    def _rows_for(self, keys: Sequence[str]) -> npt.NDArray[np.int64]:
        """Each key's row, new keys given fresh rows."""
        row = self._row
        if len(keys) == len(row) and keys == self._keys:  # the usual step: the same replicas as ever
            return np.arange(len(keys), dtype=np.int64)
        new = [key for key in dict.fromkeys(keys) if key not in row]
        if new:
            start = len(self._keys)
            self._bank.add_rows(len(new))
            self._shift.add_rows(len(new))
            for i, key in enumerate(new):
                self._row[key] = start + i
            self._keys.extend(new)
            grow = len(new)
            self._hits = np.concatenate((self._hits, np.zeros(grow, dtype=np.int64)))
            self._misses = np.concatenate((self._misses, np.zeros(grow, dtype=np.int64)))
            self._open = np.concatenate((self._open, np.zeros(grow, dtype=bool)))
            self._held = np.concatenate((self._held, np.zeros(grow)))
            self._feature = np.concatenate((self._feature, np.full(grow, -1, dtype=np.int64)))
            self._last = np.concatenate((self._last, np.full(grow, np.nan)))
        return np.fromiter((row[key] for key in keys), np.int64, len(keys))

    def forget(self, key: str) -> None:
        """The decider's "no evidence here" (a window without a request, or a replica released): the
        key's alert goes (the decider resolves it), what its scorer learned stays, and so does a run of
        holding samples that has not opened an alert yet, which waits (see ``_judge``). A replica with
        a quiet minute is still the same replica: a learned normal would take `warmup` samples to come
        back, and on a replica with a request or two a minute a run cut by every empty window never
        spans `min_requests`. The run of an alert that was open starts over: the alert reopens on new
        evidence, not on what opened it. A key not sampled for `memory` samples' time is dropped (its
        ranges would have forgotten it)."""
        self._opened.pop(key, None)
        row = self._row.get(key)
        if row is None:
            return
        if self._open[row]:
            self._hits[row] = 0
            self._held[row] = 0.0
            self._feature[row] = -1
        self._misses[row] = 0
        self._open[row] = False

    def _drop_stale(self, now: float) -> None:
        """Drop the rows not sampled for `memory` samples' time (`cadence_steps` steps each), and the
        prompt and load slopes of pools that learned nothing for as long."""
        horizon = self.config.memory * self.config.cadence_steps * STEP_S
        self._slope.drop_before(now - horizon)
        self._load.drop_before(now - horizon)
        with np.errstate(invalid="ignore"):
            stale = np.flatnonzero(self._last < now - horizon)
        if not len(stale):
            return
        keep = np.ones(len(self._keys), dtype=bool)
        keep[stale] = False
        self._bank.drop_rows(stale)
        self._shift.drop_rows(stale)
        self._keys = [key for key, k in zip(self._keys, keep.tolist(), strict=True) if k]
        self._row = {key: row for row, key in enumerate(self._keys)}
        for name in ("_hits", "_misses", "_open", "_held", "_feature", "_last"):
            setattr(self, name, getattr(self, name)[keep])
        for key in [key for key in self._opened if key not in self._row]:
            del self._opened[key]

    # ------------------------------------------------------------------ the step

    def _turn(self, model: str, now: float) -> bool:
        """Is ``now`` this model's step to learn and score (models take turns, by name)?"""
        cadence = self.config.cadence_steps
        if cadence == 1:
            return True
        return (round(now / STEP_S) + zlib.crc32(model.encode())) % cadence == 0

    def step_fields(self) -> tuple[str, ...]:
        loads = tuple(dict.fromkeys(load for _, load in self._loaded))
        return ("count", "window_start", "window_end", *self.config.features,
                *((PROMPTS,) if self._per_token >= 0 else ()), *loads)

    def update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
        if not len(step) or not self._turn(step.vectors[0].model, now):
            return
        self._drop_stale(now)
        cfg = self.config
        sampled = step.column("count") >= cfg.min_count
        values = np.column_stack([step.column(name) for name in cfg.features])
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(values)  # <= 0 and NaN (missing) become NaN or -inf: not a number to judge
        logs[~np.isfinite(logs) | ~sampled[:, None]] = np.nan
        if self._per_token >= 0:
            logs[:, self._per_token] = self._at_typical_prompt(step.vectors[0].model, logs[:, self._per_token],
                                                               step.column(PROMPTS), step.column("count"), now)
        for f, load in self._loaded:
            logs[:, f] = self._at_typical_load(step.vectors[0].model, f, load, logs[:, f], step.column(load),
                                               step.column("count"), now)
        # the pool's typical replica: the median over the replicas with a sample, per feature
        x = np.full_like(logs, np.nan)
        have = np.isfinite(logs).sum(axis=0)
        enough = have >= cfg.min_replicas
        if enough.any():
            x[:, enough] = logs[:, enough] - _median(logs[:, enough], have[enough])
        sampled &= np.isfinite(x).any(axis=1)
        spans = np.maximum(step.column("window_end") - step.column("window_start"), STEP_S)
        self._judge(step.keys, step.vectors, x, sampled, spans, step.column("count"), now, alerts, pool=True)

    def update(self, fv: FeatureVector, telemetry: TelemetrySample | None, now: float) -> DetectorOutput:
        out = DetectorOutput()
        x = np.full((1, len(self.config.features)), np.nan)
        for f, name in enumerate(self.config.features):
            value = getattr(fv, name)
            if value is not None and value > 0.0:
                x[0, f] = math.log(value)
        sampled = np.array([fv.count >= self.config.min_count and bool(np.isfinite(x).any())])
        if self._per_token >= 0 and sampled[0]:
            prompts = fv.ttft_prompt_tokens_gmean
            x[:, self._per_token] = self._at_typical_prompt(
                fv.model, x[:, self._per_token], np.array([math.nan if prompts is None else prompts]),
                np.array([float(fv.count)]), now)
        if sampled[0]:
            for f, load in self._loaded:
                value = getattr(fv, load)
                x[:, f] = self._at_typical_load(fv.model, f, load, x[:, f],
                                                np.array([math.nan if value is None else value]),
                                                np.array([float(fv.count)]), now)
        spans = np.array([max(fv.window_end - fv.window_start, STEP_S)])
        self._judge([fv.key], [fv], x, sampled, spans, np.array([float(fv.count)]), now, out.alerts)
        return out

    def _at_typical_load(self, model: str, f: int, load: str, logs: npt.NDArray[np.float64],
                         loads: npt.NDArray[np.float64], requests: npt.NDArray[np.float64],
                         now: float) -> npt.NDArray[np.float64]:
        """The windows' log feature ``f`` at the pool's typical ``load`` (NaN: not sampled)."""
        if load == "queue_length_mean":
            loads = loads + 1.0  # a queue: 1 + its length
        return self._load.adjust(f"{model}\x1f{self.config.features[f]}\x1f{load}", logs, _log_or_nan(loads),
                                 requests.astype(np.float64), now)

    def _at_typical_prompt(self, model: str, logs: npt.NDArray[np.float64], prompts: npt.NDArray[np.float64],
                           requests: npt.NDArray[np.float64], now: float) -> npt.NDArray[np.float64]:
        """The windows' log TTFT per prompt token at the pool's typical prompt (NaN: not sampled)."""
        return self._slope.adjust(model, logs, _log_or_nan(prompts), requests.astype(np.float64), now)

    def _judge(self, keys: Sequence[str], vectors: Sequence[FeatureVector], x: npt.NDArray[np.float64],
               sampled: npt.NDArray[np.bool_], spans: npt.NDArray[np.float64], requests: npt.NDArray[np.float64],
               now: float, alerts: list[Alert], pool: bool = False) -> None:
        """Score and learn the sampled rows; hysteresis on every row that has something to count.
        ``spans``: each window's length (at least a step), ``requests``: its requests.

        ``pool``: the rows are one pool's replicas, judged against its median. A replica's value must
        also lie outside the range the pool's replicas spanned (``pool_range``). When one replica
        moves, the median moves a little with it and its peers' ratios move the other way, steadily
        (in a pool of four, by a fifth of the spread between replicas): on a feature, only the pool's
        most novel replica can hold. So on the shift test: only the replica furthest from its own past."""
        cfg = self.config
        where = np.flatnonzero(sampled)
        holds = np.zeros(len(keys), dtype=bool)
        novelty = level = shifted = chosen = None
        previous = behind = np.zeros(0)
        bar = _pool_bar(cfg.shift_z, len(keys) if pool else 1) if cfg.shift_z > 0.0 else math.inf
        if len(where):
            rows = self._rows_for([keys[i] for i in where.tolist()])
            xs = x[where]
            batch = self._bank.evaluate(rows, xs)
            novelty = batch.novelty
            if pool and len(where) > 1:
                if cfg.pool_range:
                    novelty = np.minimum(novelty, self._pool_novelty(rows, batch.moved))
                novelty = np.where(novelty >= novelty.max(axis=0), novelty, 0.0)
            # material (outside its range, and the pool's, by min_novelty of it), known (warm-up) and,
            # with a threshold, unusual for this replica (the scorer's level)
            holding = novelty.max(axis=1) >= cfg.min_novelty
            if cfg.threshold > 0.0:
                holding &= batch.level >= cfg.threshold
            chosen = np.argmax(novelty, axis=1)  # the feature a holding sample holds on
            shifted = np.zeros_like(novelty)
            behind = np.zeros(len(where))  # the requests a shift that holds is over (0: none holds)
            if cfg.shift_z > 0.0:
                # the shift test: the replica's last disjoint windows against its own past (a replica whose
                # run or alert is under way does not learn what it shows as its past)
                quarantine = self._open[rows] | (self._hits[rows] > 0)
                # a replica's first minutes (until its longest mean has settled) are its start, not its
                # past: in a pool that has just started, queues and batches are still filling
                ready = self._bank.n[rows] >= max(cfg.scales)
                if ready.any():
                    # each window weighs its requests: one of twenty is twenty times the evidence of one
                    shifted[ready] = np.abs(self._shift.observe(rows[ready], xs[ready], now, spans[where][ready],
                                                                quarantine[ready], requests[where][ready]))
                if pool and len(where) > 1:
                    shifted = np.where(shifted >= shifted.max(axis=0), shifted, 0.0)
                by_shift = ~holding & (shifted.max(axis=1) >= bar)
                chosen = np.where(by_shift, np.argmax(shifted, axis=1), chosen)
                holding |= by_shift
                # a shift's z is already over its recent windows' requests: they are the run's evidence
                on = np.flatnonzero(ready & (shifted[np.arange(len(where)), chosen] >= bar))
                if len(on):
                    behind[on] = self._shift.recent_requests(rows[on])[np.arange(len(on)), chosen[on]]
            holding &= self._bank.n[rows] >= cfg.warmup
            # an anomaly is not learned as the replica's normal: it stays novel (and the alert open) while
            # it lasts and leaves no trace once over. One that holds `adapt` samples in a row, its alert
            # open, is a lasting change: the replica's scorer starts over from it (its warm-up again; the
            # alert resolves). Not before the alert opened: on a replica with a request or two a window
            # the run spans `min_requests` only after more than `adapt` samples, and a change learned as
            # normal before it was reported would never be
            lasting = holding & self._open[rows] & (self._hits[rows] + 1 >= cfg.adapt)
            self._bank.commit(batch, hold_out=holding)
            self._bank.reset_rows(rows[lasting])
            self._shift.reset_rows(rows[lasting])
            holds[where] = holding
            level = batch.level
            previous = self._last[rows]
            # a sample without a value for the feature its run holds on (a window whose outputs are all
            # one token long has no TPOT) is no evidence about it either way: for the run it is as a
            # window without requests (it waits, and its wait counts from the run's last evidence)
            feature = self._feature[rows]
            silent = ~holding & (feature >= 0)
            if silent.any():
                silent[silent] = np.isnan(x[where[silent], feature[silent]])
                sampled = sampled.copy()
                sampled[where[silent]] = False
            self._last[rows] = np.where(silent, previous, now)
        # hysteresis: only rows that hold, count towards opening or are open change anything
        if len(keys) == len(self._keys) and keys == self._keys:
            known = np.arange(len(keys), dtype=np.int64)
        else:
            known = np.fromiter((self._row.get(key, -1) for key in keys), np.int64, len(keys))
        active = holds.copy()
        has_row = known >= 0
        active[has_row] |= (self._hits[known[has_row]] > 0) | self._open[known[has_row]]
        if not active.any():
            return
        position = {int(i): j for j, i in enumerate(where.tolist())}  # step index -> batch index
        for i in np.flatnonzero(active).tolist():
            row = int(known[i])
            key = keys[i]
            fv = vectors[i]
            if holds[i]:
                # a row holds only when scored
                assert novelty is not None and level is not None and shifted is not None and chosen is not None
                self._misses[row] = 0
                j = position[i]
                # the requests this sample adds to the run: its whole window on the run's first sample,
                # else the share of the window that is newer than the row's previous sample
                span = float(spans[i])
                since = now - float(previous[j])
                if since > cfg.clear_steps * cfg.cadence_steps * STEP_S:
                    # a run waits through windows without evidence, for as long as an open alert
                    # waits for samples that do not hold (`clear_steps`); after longer it starts over
                    self._hits[row] = 0
                fresh = fv.count if self._hits[row] == 0 or not since < span else fv.count * since / span
                self._held[row] = max(fresh if self._hits[row] == 0 else self._held[row] + fresh, behind[j])
                self._hits[row] += 1
                self._feature[row] = int(chosen[j])
                if self._open[row] or self._hits[row] < cfg.persistence or self._held[row] < cfg.min_requests:
                    continue
                self._open[row] = True
                evidence = self._evidence(int(chosen[j]), novelty[j], shifted[j], bar, float(level[j]), x[i],
                                          int(self._bank.n[row]), float(self._held[row]))
                self._opened[key] = evidence
                alerts.append(self._alert(fv, now, "open", self._message(fv, evidence), evidence))
                continue
            if sampled[i]:  # a sample that does not hold ends the run; without one, no evidence either way
                self._hits[row] = 0
                self._held[row] = 0.0
                self._feature[row] = -1
            if not self._open[row]:
                continue
            self._misses[row] += 1
            if self._misses[row] < cfg.clear_steps:
                continue
            self._open[row] = False
            self._misses[row] = 0
            opened = self._opened.pop(key, {})
            why = "condition cleared" if sampled[i] else "no sample (too few requests or no pool), not observed"
            message = f"resolved ({why}): {self._message(fv, opened)}" if opened else f"resolved ({why})"
            alerts.append(self._alert(fv, now, "resolved", message, dict(opened)))

    def _pool_novelty(self, rows: npt.NDArray[np.int64], moved: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Per row and feature, how far each time scale's mean lies outside the union of the ranges the
        pool's replicas (``rows``) spanned at that scale, in units of that union: the most novel scale.
        The ranges are those the scorer judges against (past blocks, once one is complete)."""
        bank = self._bank
        past = bank.ring_max[rows] > -np.inf
        hi = np.where(past, bank.ring_max[rows], bank.cur_hi[rows]).max(axis=0)  # (features, scales)
        lo = np.where(past, bank.ring_min[rows], bank.cur_lo[rows]).min(axis=0)
        span = hi - lo  # -inf where no replica has a range yet (never inf - inf)
        span = np.where(span >= 0.0, np.maximum(span, self._params.span_floor), span)
        outside = np.maximum(moved - hi, lo - moved)
        e = np.zeros_like(outside)
        np.divide(outside, span, out=e, where=(span > 0.0) & (outside > 0.0) & (span < np.inf))
        return np.asarray(e.max(axis=2))

    def _evidence(self, f: int, novelty: npt.NDArray[np.float64], shifted: npt.NDArray[np.float64], bar: float,
                  level: float, x: npt.NDArray[np.float64], samples: int, requests: float) -> dict[str, Any]:
        log_ratio = float(x[f])
        cfg = self.config
        ranged = float(novelty[f]) >= cfg.min_novelty and (cfg.threshold <= 0.0 or level >= cfg.threshold)
        held = "+".join(name for name, ok in (("range", ranged), ("shift", float(shifted[f]) >= bar)) if ok)
        return {"feature": cfg.features[f], "ratio": round(math.exp(log_ratio), 4),
                "novelty": round(float(novelty[f]), 4), "shift_z": round(float(shifted[f]), 2),
                "score": round(level, 4), "samples": samples, "requests": round(requests, 1), "tests": held}

    def _message(self, fv: FeatureVector, evidence: Mapping[str, Any]) -> str:
        why = []
        tests = str(evidence.get("tests", "range")).split("+")  # (a version without the shift test: range)
        if "range" in tests:
            why.append(f"outside its range of the last {self.config.memory} samples by {evidence['novelty']:.2f} "
                       "of that range")
        if "shift" in tests:
            why.append(f"its last {self.config.shift_window} windows {evidence['shift_z']:.1f} standard errors "
                       "from its own past")
        return (f"{fv.key}: {evidence['feature']} at {evidence['ratio']:.2f}x the pool, "
                f"{' and '.join(why) or 'unlike its own past'} "
                f"(score {evidence['score']:.2f})")

    def _alert(self, fv: FeatureVector, now: float, state: str, message: str, evidence: dict[str, Any]) -> Alert:
        return Alert(ts=now, model=fv.model, replica=fv.replica, detector=self.name, severity=Severity.INFO,
                     state="open" if state == "open" else "resolved", message=message, evidence=evidence)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        packed = self._bank.pack_rows()
        shift = self._shift.pack_rows()
        keys = {}
        for key, row in self._row.items():
            entry: dict[str, Any] = {"s": base64.b64encode(packed[row].tobytes()).decode("ascii"),
                                     "z": base64.b64encode(shift[row].tobytes()).decode("ascii")}
            if self._hits[row] or self._misses[row] or self._open[row]:
                entry["h"] = [int(self._hits[row]), int(self._misses[row]), bool(self._open[row]),
                              float(self._held[row]), int(self._feature[row])]
            if math.isfinite(self._last[row]):
                entry["t"] = float(self._last[row])
            if key in self._opened:
                entry["opened"] = dict(self._opened[key])
            keys[key] = entry
        return {"v": STATE_VERSION, "detector": self.name, "layout": self._layout(), "keys": keys,
                "prompt_slopes": self._slope.state(), "load_slopes": self._load.state()}

    def _layout(self) -> list[Any]:
        # a feature at the pool's typical prompt or load is another feature than as given
        loaded = {f for f, _ in self._loaded}
        features = [name + ("@prompt" if f == self._per_token else "") + ("@load" if f in loaded else "")
                    for f, name in enumerate(self.config.features)]
        return [features, self._params.key(), self._shift.params.key()]

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("v") != STATE_VERSION or state.get("detector") != self.name:
            raise ValueError(f"{self.name}: cannot load state {state.get('detector')!r} v{state.get('v')!r}")
        fresh = LearnedDetector(self.config)
        entries = state.get("keys", {})
        layout, mine = state.get("layout"), self._layout()
        # learned with other features or lengths: the scorers start over (the alerts' state is kept); a
        # state of a version without the shift test keeps its scorers, the shift tests start over
        stale = set()
        if not isinstance(layout, list) or layout[:2] != mine[:2]:
            stale = {"s", "z"}
        elif layout != mine:
            stale = {"z"}
        if stale:
            entries = {key: {k: v for k, v in entry.items() if k not in stale} for key, entry in entries.items()}
        keys = list(entries)
        rows = fresh._rows_for(keys)
        for name, bank in (("s", fresh._bank), ("z", fresh._shift)):  # each bank's packed rows, base64
            packed = [entry.get(name) for entry in entries.values()]
            have = [i for i, p in enumerate(packed) if p is not None]
            if have:
                data = np.stack([np.frombuffer(base64.b64decode(packed[i]), dtype=np.float64) for i in have])
                bank.unpack_rows(rows[have], data)
        for key, row, entry in zip(keys, rows.tolist(), entries.values(), strict=True):
            # (a state without `held` or the run's feature: 0 and none)
            hits, misses, is_open, *run = entry.get("h", [0, 0, False])
            fresh._hits[row], fresh._misses[row], fresh._open[row] = int(hits), int(misses), bool(is_open)
            fresh._held[row] = float(run[0]) if run else 0.0
            fresh._feature[row] = int(run[1]) if len(run) > 1 else -1
            fresh._last[row] = float(entry["t"]) if entry.get("t") is not None else math.nan
            if "opened" in entry:
                fresh._opened[key] = dict(entry["opened"])
        if "s" not in stale:  # the pools' slopes, as the scorers that learned with them (none: learned anew)
            fresh._slope.load(dict(state.get("prompt_slopes", {})))
            fresh._load.load(dict(state.get("load_slopes", {})))
        self.__dict__.update(fresh.__dict__)

    def open_alerts(self) -> dict[str, Severity]:
        return {key: Severity.INFO for key, row in self._row.items() if self._open[row]}


def _pool_bar(z: float, replicas: int) -> float:
    """The bar for the furthest of ``replicas`` streams, each judged at ``z``: the one whose Gaussian
    tail is ``1 / replicas`` of ``z``'s (Bonferroni: the pool's chance of a false alert stays that of
    one stream at ``z``, whatever its size).

    >>> [round(_pool_bar(3.66, n), 2) for n in (1, 4, 32)]
    [3.66, 4.0, 4.47]
    """
    if replicas <= 1:
        return z
    return float(-ndtri(ndtr(-z) / replicas))


def _log_or_nan(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Each value's log, NaN where it has none (a missing, zero or negative value).

    >>> _log_or_nan(np.array([1.0, 0.0, np.nan, -2.0])).tolist()
    [0.0, nan, nan, nan]
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(values)
    logs[~np.isfinite(logs)] = np.nan
    return logs


def _median(values: npt.NDArray[np.float64], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Each column's median over its finite values (``counts`` of them, NaN elsewhere): NaN sorts last.

    >>> _median(np.array([[1.0, 5.0], [3.0, np.nan], [2.0, 4.0], [9.0, np.nan]]), np.array([4, 2]))
    array([2.5, 4.5])
    """
    ordered = np.sort(values, axis=0)
    columns = np.arange(values.shape[1])
    return 0.5 * (ordered[(counts - 1) // 2, columns] + ordered[counts // 2, columns])
