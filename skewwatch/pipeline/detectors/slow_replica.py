"""Slow replica: a replica alive but slower as a whole than its peers (a throttled or slower GPU, a
starved process: every request's time per output token up by half or more).

long_tail looks for a *share* of requests far slower than the baseline's P99; a replica whose
every token is 1.5-2 x slower has no such tail, its bulk is shifted. This rule compares the
bulk: the replica's window TPOT P50 (ms per output token, ``tpot_p50``) against its **peers**
(the other replicas of its model in the same step, which see the same traffic), or, with fewer
than ``min_peers`` peers of ``min_count`` requests, against **its own past**.

* The level ``L``: the peers' TPOT P90 (the median of the other replicas' window P90s): a request
  of a replica like its peers is above it with probability about 0.1.
* The rule holds when the replica's P50 is above ``L``, so at least half of its ``n`` requests are
  (:func:`~skewwatch.pipeline.detectors.evidence.min_exceeding`; the sketches' quantiles are
  bucket values, so "above" is a bucket higher), and that count has probability below ``alpha``
  (1e-3) under ``Binomial(n, 0.1)`` (:func:`~skewwatch.pipeline.detectors.evidence.binomial_tail_bound`):
  the evidence minimum follows, 10 requests; and when the P50 is at least ``min_ratio`` (1.25) x
  ``L``: the shift must clear the peers' own spread (their P90 over their P50) by a quarter, so a
  pool whose tokens swing (long prompts' prefill stalls) does not make its slowest moment news.
* **Beyond its swings**: and the shift, ``log(P50 / baseline P50)``, is more than ``swing_z`` (3)
  x the replica's swings: the sd of its log P50 over its own past (an exponentially weighted mean
  and variance, ``baseline_tau_s``, of the steps where the rule did not hold), or its peers'
  (the median of theirs) where that is larger or it has no past of ``baseline_steps``. A throttled
  GPU's tokens jump far beyond a stable past; a replica of a queue-bound pool, whose window TPOT
  swings 3-30 x with the long prompts it prefills, makes no claim from one more swing. A window
  joins the swings ``swing_lag_steps`` (12, a window length) steps after it, and only if the rule
  has not held since: the rising windows of a fault's onset are not its past. No claim against
  peers while no swing is known (a pool's first two minutes).
* Where the pool's events carry no TPOT (no first-token time), the same on end-to-end latency:
  its P50 against the peers' latency P95 (a baseline request is above it with probability 0.05).
  A request's latency follows its output length, which the peers' traffic shares.
* Without peers, the baseline is the replica's own past: an exponentially weighted mean of its
  window P50 and P90 (P95) over the steps where the rule did not hold (time constant
  ``baseline_tau_s``, known after ``baseline_steps`` steps of ``min_count`` requests).

It holds ``persistence`` (2) steps before it opens and clears after ``clear_steps`` (4) steps
without it. No claim (None) where the traffic explains the slowness:

* **prefill work**: the replica's prefill per request (``prompt_tokens_mean x (1 -
  kv_cache_hit_rate_mean)``, the prompt tokens its KV cache did not hold) at least ``prompt_ratio``
  (2) x its baseline's: prefilling them slows every token of the batch (context_burst and
  kv_pressure report it);
* **a backlog** (peers only): its TTFT P50, against the peers', slowed more than ``ttft_ratio`` (2)
  x its TPOT P50: the requests wait for a batch slot (a collapsed scheduler, a queue of long
  prompts), and the backlog's prefills slow the tokens; a slower GPU slows first tokens and the
  tokens after alike.

Severity WARNING and no action of its own: the open alert demotes the replica's routing weight
(:mod:`skewwatch.pipeline.demotion`), as every WARNING does; it serves a probing share until it
is as fast as its peers again.

**Off by default** (``enabled = false``; the seed had no such rule either): on pools where every
replica queues (the quality benchmark's mooncake@3x), prefill stalls move a healthy replica's
window TPOT 3-30 x for tens of seconds with its first tokens no slower than its peers'; the swings
hold most of them, but where the past is a few minutes young its sd is still small beside them
and the rule fires (holdout precision 0.67, bench/README.md). Turn it on with
``[detectors.slow_replica] enabled = true``.

>>> from skewwatch.pipeline.detectors.step_columns import StepColumns
>>> def fv(replica, p50, p90, end=60.0, n=35):
...     return FeatureVector(model="m", replica=replica, window_start=end - 60, window_end=end, count=n,
...                          tpot_p50=p50, tpot_p90=p90, prompt_tokens_mean=800.0)
>>> det = SlowReplicaDetector(SlowReplicaConfig(enabled=True))
>>> def step(end, slow):
...     vectors = [fv("r0", 11.0, 14.0, end), fv("r1", slow, 1.3 * slow, end), fv("r2", 10.5, 13.5, end),
...                fv("r3", 11.5, 14.5, end)]
...     alerts: list = []
...     det.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
...     for alert in alerts:
...         print(alert.message)
>>> step(60.0, 23.0); step(65.0, 23.0)  # a new pool: no swing known yet, no claim
>>> for i in range(26):  # two minutes of a calm past: 12 steps on the ring, 14 in the swings
...     step(70.0 + 5 * i, 11.2)
>>> step(200.0, 23.0)  # P50 twice the peers': one step, then the second
>>> step(205.0, 23.0)
r1 decodes 2.1 x slower than its peers (TPOT P50 23 ms vs 11 ms, 18 of 35 requests above the peers' P90 14 ms)

A replica whose tokens swing 2 x from window to window (an sd of log 0.35) is not judged on a
shift of 2.1 x: it needs 3 sd, 2.8 x its peers' P50.

>>> det = SlowReplicaDetector(SlowReplicaConfig(enabled=True))
>>> for i in range(40):
...     step(60.0 + 5 * i, 8.0 if i % 2 else 16.0)
>>> step(260.0, 23.0); step(265.0, 23.0)
>>> step(270.0, 40.0); step(275.0, 40.0)
r1 decodes 3.6 x slower than its peers (TPOT P50 40 ms vs 11 ms, 18 of 35 requests above the peers' P90 14 ms)
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from skewwatch.config_section import Count, Positive
from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.evidence import binomial_tail_bound, min_exceeding
from skewwatch.pipeline.detectors.key_columns import KeyColumns
from skewwatch.pipeline.detectors.peers import others_median, others_medians
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import DetectorConfig, Finding, ThresholdDetector
from skewwatch.pipeline.finite import nan_as_none
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

REASON = "slow replica: its requests' time per output token above its peers'"

#: The ``seed`` profile's section: the seed had no such rule.
PROFILE_SEED: dict[str, Any] = {"enabled": False}

# the signals, in the order a baseline is looked for: (name, P50 field, upper field, share of a
# baseline's requests above its upper quantile, what the message calls it, the verb, the unit)
_TPOT = ("tpot", "tpot_p50", "tpot_p90", 0.10, "TPOT", "decodes", "P90")
_LATENCY = ("latency", "latency_p50", "latency_p95", 0.05, "latency", "answers", "P95")
_SIGNALS = (_TPOT, _LATENCY)
_SLOT = {"tpot": 0, "latency": 1}  # own past per signal: [weight, mean P50, mean upper]
_PROMPT_SLOT = 2  # own past prompt length: [weight, mean prompt_tokens_mean, unused]
_SWING = {"tpot": 3, "latency": 4}  # own swings per signal: [weight, mean log P50, variance of log P50]
_SIGNAL_FIELDS = (("tpot", "tpot_p50"), ("latency", "latency_p50"))
# the values on their way into the swings, a window length behind: [1, TPOT P50, latency P50] (0: none;
# a checkpoint holds no NaN) per ring position from _RING, and the next position to write ([1, position, 0])
_HEAD = 5
_RING = 8


class SlowReplicaConfig(DetectorConfig, frozen=True):
    """``[detectors.slow_replica]``: a replica's TPOT P50 above its peers' P90, with evidence."""

    section = "detectors.slow_replica"

    # off by default: on the quality benchmark's queue-bound holdout pools (mooncake@3x) it raises
    # false alerts (bench/README.md); on: enabled = true
    enabled: bool = False
    persistence: Count = 2  # steps the rule holds before it opens (a window moves 5 s a step)
    clear_steps: Count = 4  # 20 s without it before it resolves
    min_count: Count = 6  # the evidence floor: fewer finished requests in the window -> no claim
    min_peers: Count = 2  # peers with min_count requests for a pool baseline; fewer -> own past
    alpha: Annotated[float, Meta(gt=0, lt=1)] = 1e-3  # false-alarm bound of the binomial test
    min_ratio: Annotated[float, Meta(ge=1)] = 1.25  # P50 at least this x the baseline's P50
    # prefill work per request (uncached prompt tokens) this x the baseline's: no claim
    prompt_ratio: Annotated[float, Meta(gt=1)] = 2.0
    # the peers' first tokens: the replica's TTFT P50 slowed by more than ttft_ratio x its tokens'
    # shift is a backlog (requests waiting for a slot), not a slower GPU, which slows both alike
    ttft_ratio: Annotated[float, Meta(gt=1)] = 2.0
    baseline_tau_s: Positive = 300.0  # the replica's own past (level and swings): time constant
    baseline_steps: Count = 12  # ... and the steps of it needed before it judges
    # the shift of its log TPOT P50 from its own past mean must be this many of its swings (the
    # sd of that log over its past, or its peers' where theirs is larger or it has none): a
    # replica whose tokens swing with its prompts makes no claim from one more swing
    swing_z: Annotated[float, Meta(ge=0)] = 3.0
    # a window length of steps (60 s / 5 s): a value joins the swings that many steps later, if
    # the rule has not held since; the rising windows of a fault's onset are not its past
    swing_lag_steps: Count = 12


class SlowReplicaDetector(ThresholdDetector):
    name = "slow_replica"
    Config = SlowReplicaConfig
    config: SlowReplicaConfig

    remembers = True  # the own past moves every step

    def __init__(self, config: SlowReplicaConfig | None = None) -> None:
        super().__init__(config)
        # per row of the current step: the peers' P50 and upper quantile per signal, and their
        # prompt length (NaN: fewer than min_peers peers); key -> row
        self._peer: dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = {}
        self._peer_prompt: npt.NDArray[np.float64] = np.zeros(0)
        self._peer_ttft: npt.NDArray[np.float64] = np.zeros(0)
        self._row_of: dict[str, int] = {}
        # per row of the current step and signal: the peers' swings (the median of the sds of their
        # log P50 over their own pasts; NaN: fewer than min_peers peers with a past)
        self._pool_swing: dict[str, npt.NDArray[np.float64]] = {}
        self._past = KeyColumns(width=3)

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        return Severity.WARNING, None, REASON

    def step_fields(self) -> tuple[str, ...]:
        if not self.config.enabled:
            return ()
        return ("count", "tpot_p50", "tpot_p90", "latency_p50", "latency_p95", "prompt_tokens_mean",
                "kv_cache_hit_rate_mean", "ttft_p50")

    # ------------------------------------------------------------------ the pool

    def prepare(self, step: StepColumns | None) -> None:
        """Each replica's peers: the medians of the other replicas' windows of ``min_count`` requests."""
        self._peer, self._peer_prompt, self._row_of = {}, np.zeros(0), {}
        self._peer_ttft = np.zeros(0)
        self._pool_swing = {}
        cfg = self.config
        if step is None or not cfg.enabled or len(step) < 2:
            return
        enough = step.column("count") >= cfg.min_count
        for signal in _SIGNALS:
            name, low_field, high_field = signal[:3]
            low, high = step.column(low_field), step.column(high_field)
            valid = enough & ~np.isnan(low) & ~np.isnan(high)
            medians = others_medians(np.stack([low, high]), valid, cfg.min_peers)
            self._peer[name] = (medians[0], medians[1])
        prefill = _prefill_column(step)
        self._peer_prompt = others_median(prefill, enough & ~np.isnan(prefill), cfg.min_peers)
        ttft = step.column("ttft_p50")
        self._peer_ttft = others_median(ttft, enough & ~np.isnan(ttft), cfg.min_peers)
        own = self._past.rows(step.keys)
        for name, slot in _SWING.items():
            swings = self._past.read(own, slot)
            known = swings[:, 0] >= cfg.baseline_steps  # NaN (no past) compares False
            sd = np.sqrt(np.where(known, swings[:, 2], np.nan))
            self._pool_swing[name] = others_median(sd, known, cfg.min_peers)
        self._row_of = step.row_of

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_]:
        """Replicas the rule cannot hold on: fewer than ``min_count`` requests, or, where the peers
        judge (the first signal with a pool baseline, as :meth:`evaluate` picks it), a P50 below the
        peers' upper quantile or below ``min_ratio`` x their P50. A replica its own past would judge
        is not screened."""
        cfg = self.config
        if not cfg.enabled:
            return np.ones(len(step), dtype=bool)
        can = step.column("count") >= cfg.min_count
        if not self._peer or self._row_of is not step.row_of:
            return ~can  # no pool baseline of this step: evaluate decides
        undecided = np.ones(len(step), dtype=bool)  # no signal has judged the row yet
        holds = np.zeros(len(step), dtype=bool)
        for signal in _SIGNALS:
            name, low_field, high_field = signal[:3]
            low, high = step.column(low_field), step.column(high_field)
            peer_low, peer_high = self._peer[name]
            judged = undecided & ~np.isnan(low) & ~np.isnan(high) & ~np.isnan(peer_high)
            holds |= judged & (low > peer_high) & (low >= cfg.min_ratio * peer_high)
            undecided &= ~judged
        # undecided: no pool baseline for any signal, the own past may judge
        return ~(can & (holds | undecided))

    # ------------------------------------------------------------------ the own past

    def remember(self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]) -> None:
        self._remember(fv)

    def remember_step(self, step: StepColumns, rows: npt.NDArray[np.int64]) -> None:
        """:meth:`remember` of the step's ``rows`` as columns: the same arithmetic, element-wise."""
        cfg = self.config
        if not cfg.enabled or len(rows) == 0:
            return
        count = step.column("count")[rows]
        keys = step.keys
        alpha = self._alpha()
        enough = count >= cfg.min_count
        for slot, fields in ((_SLOT["tpot"], ("tpot_p50", "tpot_p90")),
                             (_SLOT["latency"], ("latency_p50", "latency_p95")),
                             (_PROMPT_SLOT, ("prompt_tokens_mean", "prompt_tokens_mean"))):
            if slot == _PROMPT_SLOT:
                low = high = _prefill_column(step)[rows]
            else:
                low, high = step.column(fields[0])[rows], step.column(fields[1])[rows]
            folded = enough & ~np.isnan(low) & ~np.isnan(high)
            if not folded.any():
                continue
            chosen = rows[folded]
            own = self._past.rows([keys[row] for row in chosen.tolist()])
            before = self._past.read(own, slot)
            absent = np.isnan(before[:, 0])  # no past yet: [0, 0, 0], as _remember starts it
            weight_before = np.where(absent, 0.0, before[:, 0])
            weight = (1.0 - alpha) * weight_before + 1.0
            updated = np.empty((len(own), 3))
            updated[:, 0] = weight
            for col, values in ((1, low[folded]), (2, high[folded])):
                mean_before = np.where(absent, 0.0, before[:, col])
                updated[:, col] = mean_before + (values - mean_before) / weight
            self._past.put(own, slot, updated)
        values = np.stack([step.column(field)[rows] for _, field in _SIGNAL_FIELDS], axis=1)
        pushed = enough & (values > 0).any(axis=1)  # NaN compares False
        if pushed.any():
            self._push(self._past.rows([keys[row] for row in rows[pushed].tolist()]), values[pushed])

    def _alpha(self) -> float:
        return min(5.0 / self.config.baseline_tau_s, 1.0)  # one step of 5 s

    def _remember(self, fv: FeatureVector) -> None:
        """Fold this window (with ``min_count`` requests) into the replica's own past, per signal."""
        cfg = self.config
        if not cfg.enabled or fv.count < cfg.min_count:
            return
        alpha = self._alpha()
        for slot, low, high in ((_SLOT["tpot"], fv.tpot_p50, fv.tpot_p90),
                                (_SLOT["latency"], fv.latency_p50, fv.latency_p95),
                                (_PROMPT_SLOT, _prefill(fv), _prefill(fv))):
            if low is None or high is None or math.isnan(low) or math.isnan(high):
                continue
            own = self._past.add(fv.key)
            row = self._past.get(own, slot) or [0.0, 0.0, 0.0]
            weight = (1.0 - alpha) * row[0] + 1.0
            record = [weight, row[1] + (low - row[1]) / weight, row[2] + (high - row[2]) / weight]
            self._past.put(np.array([own]), slot, np.array([record]))
        values = np.array([[math.nan if v is None else v for v in (fv.tpot_p50, fv.latency_p50)]])
        if (values > 0).any():
            self._push(np.array([self._past.add(fv.key)]), values)

    def _push(self, own: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> None:
        """Put the replicas' (rows ``own``) window P50s (``values``: one column per signal, NaN or 0
        where it has none) on their ring, and fold the values a window length old that it gives
        back into their swings: an exponentially weighted mean and variance of the log P50 (West's
        weighted update; the same weights as the own past). One arithmetic for :meth:`evaluate`
        and :meth:`remember_step`, so the screen and the rule keep the same memory."""
        cfg, past = self.config, self._past
        fresh = np.where(values > 0, values, 0.0)  # NaN compares False
        written = past.read(own, _HEAD)[:, 1]
        head = np.where(np.isnan(written), 0.0, written).astype(np.int64) % cfg.swing_lag_steps
        alpha = self._alpha()
        for position in np.unique(head).tolist():
            at = head == position
            rows = own[at]
            oldest = past.read(rows, _RING + position)
            for col, slot in ((1, _SWING["tpot"]), (2, _SWING["latency"])):
                value = oldest[:, col]
                folded = value > 0  # absent records are NaN throughout, none is 0
                if not folded.any():
                    continue
                before = past.read(rows[folded], slot)
                absent = np.isnan(before[:, 0])
                weight_before = np.where(absent, 0.0, before[:, 0])
                mean_before = np.where(absent, 0.0, before[:, 1])
                var_before = np.where(absent, 0.0, before[:, 2])
                x = np.log(value[folded])
                weight = (1.0 - alpha) * weight_before + 1.0
                mean = mean_before + (x - mean_before) / weight
                var = ((1.0 - alpha) * weight_before * var_before + (x - mean_before) * (x - mean)) / weight
                past.put(rows[folded], slot, np.stack([weight, mean, var], axis=1))
            past.put(rows, _RING + position, np.column_stack([np.ones(len(rows)), fresh[at]]))
            nxt = np.column_stack([np.ones(len(rows)), np.full(len(rows), float((position + 1) % cfg.swing_lag_steps)),
                                   np.zeros(len(rows))])
            past.put(rows, _HEAD, nxt)

    def _quarantine(self, key: str) -> None:
        """The rule holds: the values on the replica's ring (its windows since a window length
        before) never join its swings (a fault's onset is not its past)."""
        own = self._past.row(key)
        if own is None:
            return
        rows = np.array([own])
        gone = np.full((1, 3), np.nan)
        for position in range(self.config.swing_lag_steps):
            self._past.put(rows, _RING + position, gone)

    def _own_past(self, key: str, slot: int) -> tuple[float, float] | None:
        """The replica's own past (P50, upper) of a signal, once it has ``baseline_steps`` behind it."""
        row = self._past.get(self._past.row(key), slot)
        return None if row is None or row[0] < self.config.baseline_steps else (row[1], row[2])

    def column_memory(self) -> dict[str, dict[str, Any]]:
        past = self._past
        return {key: {f"past_{slot}": record for slot, record in past.records(key).items()}
                for key in past.held_keys()}

    def load_column_memory(self, key: str, memory: dict[str, Any]) -> None:
        for slot in self._slots():
            record = memory.pop(f"past_{slot}", None)
            if record is not None:
                self._past.put(np.array([self._past.add(key)]), slot, np.array([[float(v) for v in record]]))

    def _slots(self) -> tuple[int, ...]:
        """Every slot of the replica's memory."""
        return (_SLOT["tpot"], _SLOT["latency"], _PROMPT_SLOT, _SWING["tpot"], _SWING["latency"], _HEAD,
                *(_RING + position for position in range(self.config.swing_lag_steps)))

    def clear_column_memory(self) -> None:
        self._past.clear()

    def forget(self, key: str) -> None:
        super().forget(key)
        self._past.forget(key)

    # ------------------------------------------------------------------ the rule

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        finding = self._judge(fv)
        if not finding.holds:  # the own past learns only from steps without the fault
            self._remember(fv)
        else:
            self._quarantine(fv.key)
        return {"main": finding}

    def _baseline(self, fv: FeatureVector) -> tuple[tuple[Any, ...], float, float, float, float | None, str] | None:
        """The first signal with a baseline: (signal, own P50, baseline P50, baseline upper,
        baseline prompt length, its source), the peers' before the own past."""
        row = self._row_of.get(fv.key)
        for source in ("peers", "own past"):
            for signal in _SIGNALS:
                name, low_field, high_field = signal[:3]
                low, high = getattr(fv, low_field), getattr(fv, high_field)
                if low is None or high is None or math.isnan(low) or math.isnan(high):
                    continue
                if source == "peers":
                    if row is None:
                        continue
                    peer_low, peer_high = (float(v[row]) for v in self._peer[name])
                    if math.isnan(peer_high):
                        continue
                    prompt = float(self._peer_prompt[row])
                    return signal, low, peer_low, peer_high, None if math.isnan(prompt) else prompt, source
                past = self._own_past(fv.key, _SLOT[name])
                if past is not None:
                    prompt_past = self._own_past(fv.key, _PROMPT_SLOT)
                    return signal, low, past[0], past[1], None if prompt_past is None else prompt_past[0], source
        return None

    def _backlog(self, fv: FeatureVector, shift: float) -> str | None:
        """Why the replica's slowness is a backlog, not a slower GPU (None: it is not): its first
        tokens slowed, against the peers' TTFT P50, more than ``ttft_ratio`` x its tokens (the requests
        wait for a batch slot behind a backlog whose prefills slow every token). A slower GPU slows
        the prefill of first tokens as much as the tokens after."""
        cfg = self.config
        row = self._row_of.get(fv.key)
        if row is None:
            return None
        peer_ttft, ttft = nan_as_none(self._peer_ttft[row]), nan_as_none(fv.ttft_p50)
        if peer_ttft is not None and ttft is not None and peer_ttft > 0 and ttft > cfg.ttft_ratio * shift * peer_ttft:
            return "first tokens"
        return None

    def _beyond_swings(self, fv: FeatureVector, name: str, ratio: float,
                       evidence: dict[str, float | int | str | None], source: str) -> bool | None:
        """Whether the replica's shift from its baseline (``log(ratio)``, the log of its P50 over the
        baseline's) is more than ``swing_z`` x its swings (and at least ``log(min_ratio)``): the sd
        of its log P50 over its own past of ``baseline_steps``, or the peers' (the median of theirs)
        where that is larger or it has no such past. A throttled GPU's tokens jump far beyond a
        stable past; a replica whose tokens swing 3-30 x with its prompts (long prefills in a
        queue-bound pool) makes no claim from one more swing. None (no claim) where no swing is
        known against peers (a pool's first two minutes: a window length on the ring and
        ``baseline_steps`` in the swings); against its own past, which has a past of its own, the
        rule without it."""
        cfg = self.config
        past = self._past.get(self._past.row(fv.key), _SWING[name])
        own = math.sqrt(max(past[2], 0.0)) if past is not None and past[0] >= cfg.baseline_steps else math.nan
        row = self._row_of.get(fv.key)
        pool = math.nan if row is None else float(self._pool_swing[name][row])
        sd = max((v for v in (own, pool) if not math.isnan(v)), default=math.nan)
        if math.isnan(sd):
            return None if source == "peers" else True
        shift = math.log(ratio)  # ratio > 1: the rule held before this test
        need = max(math.log(cfg.min_ratio), cfg.swing_z * sd)
        evidence.update({"swing_sd": sd, "swing_from": "own past" if own >= pool or math.isnan(pool) else "peers",
                         "swing_shift": None if math.isinf(shift) else shift, "swing_need": need})
        return shift > need

    def _judge(self, fv: FeatureVector) -> Finding:
        cfg = self.config
        if not cfg.enabled or fv.count < cfg.min_count:
            return Finding(None)
        found = self._baseline(fv)
        if found is None:
            return Finding(None, evidence={"count": fv.count})
        signal, p50, base_p50, level, base_prompt, source = found
        name, _, _, share, label, verb, upper = signal
        n = fv.count
        above = min_exceeding(n, 0.5) if p50 > level else 0
        bound = binomial_tail_bound(above, n, share)
        ratio = p50 / base_p50 if base_p50 > 0 else math.inf
        prompt = _prefill(fv)
        evidence: dict[str, float | int | str | None] = {
            "signal": name, "baseline": source, "p50": p50, "baseline_p50": base_p50, "level": level,
            "level_quantile": upper, "ratio": None if math.isinf(ratio) else ratio, "count": n, "exceeding": above,
            "tail_bound": bound, "alpha": cfg.alpha, "prefill_tokens": prompt, "baseline_prefill_tokens": base_prompt,
        }
        if prompt is not None and base_prompt is not None and prompt >= cfg.prompt_ratio * base_prompt:
            evidence["stand_down"] = "prefill"  # long or uncached prompts: context_burst's, kv_pressure's
            return Finding(None, evidence=evidence)
        if source == "peers" and (backlog := self._backlog(fv, ratio)) is not None:
            evidence["stand_down"] = backlog
            return Finding(None, evidence=evidence)
        holds = p50 > level and bound < cfg.alpha and p50 >= cfg.min_ratio * level
        if holds:
            beyond = self._beyond_swings(fv, name, ratio, evidence, source)
            if beyond is None:
                evidence["stand_down"] = "no swings known"
                return Finding(None, evidence=evidence)
            holds = beyond
        whose = "its peers" if source == "peers" else "its own past"
        message = (
            f"{fv.replica} {verb} {fmt(ratio)} x slower than {whose} ({label} P50 {fmt(p50, 0)} ms vs "
            f"{fmt(base_p50, 0)} ms, {above} of {n} requests above the {'peers' if source == 'peers' else 'past'}"
            f"' {upper} {fmt(level, 0)} ms)"
        )
        return Finding(holds, message=message, evidence=evidence)


def _prefill(fv: FeatureVector) -> float | None:
    """The window's prefill work per request: its mean prompt tokens the KV cache did not hold
    (``prompt_tokens_mean x (1 - kv_cache_hit_rate_mean)``; the prompt alone without a hit rate)."""
    prompt, hit = fv.prompt_tokens_mean, fv.kv_cache_hit_rate_mean
    if prompt is None or math.isnan(prompt):
        return None
    return prompt if hit is None or math.isnan(hit) else prompt * (1.0 - hit)


def _prefill_column(step: StepColumns) -> npt.NDArray[np.float64]:
    """:func:`_prefill` of every replica of the step."""
    prompt, hit = step.column("prompt_tokens_mean"), step.column("kv_cache_hit_rate_mean")
    return np.where(np.isnan(hit), prompt, prompt * (1.0 - hit))


__all__ = ["PROFILE_SEED", "SlowReplicaConfig", "SlowReplicaDetector"]
