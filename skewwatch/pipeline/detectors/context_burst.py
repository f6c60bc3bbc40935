"""Context burst: a replica's newest prompts are far longer than its baseline's (seed §2.5).

Seed rule: "上下文突变: token_length方差环比增长 > 400% → INFO; 触发tokenizer缓存预热", with
the seed's code::

    func detectContextBurst(prev, curr float64) bool {
        if prev == 0 { return curr > 1000 }      // first jump threshold
        delta := (curr - prev) / prev
        return delta > 4.0 && curr > 2048         // "absolute length" backstop
    }

The INFO alert's action ``prewarm_tokenizer_cache`` carries the mean and standard deviation of
the burst's lengths (``params.tokens_mean``, ``params.tokens_std``).

**The default rule (``burst_rule``).** The seed's variance growth reads a change of the length
*mix* as a burst and needs a lookback full of requests. The default asks how likely it is that the
replica's newest 20 s (``recent_*`` features: count ``n``, mean, variance) could have come from the
replica's baseline, with each baseline that has enough evidence:

* its **peers**' newest 20 s (the other replicas of the model, moments merged, leaving the
  replica out; at least ``min_peers`` peers and ``baseline_min_count`` prompts): the same
  period, so a change of traffic that reaches the whole pool is not one replica's burst;
* its **own past**: its 60 s window that ended where the newest 20 s begin (at least
  ``baseline_min_count`` prompts).

Statistic: the probability that ``n`` prompts drawn from the baseline have a mean at least the
observed one, with prompt lengths log-normal at the baseline's mean and variance (lengths are
heavy-tailed; the mean of ``n`` by Fenton-Wilkinson,
:func:`~skewwatch.pipeline.detectors.evidence.lognormal_mean_tail`). The rule holds when that
probability is at most ``alpha`` (1e-4) against every baseline available, and the mean is at
least ``mean_ratio`` (2) x each baseline's mean: a burst is prompts twice as long, not a
significant 5 %. Evidence minimum: ``min_count`` (6) prompts in the newest 20 s and one baseline.
Where prompts arrive seldom (fewer than ``min_count`` in the newest 20 s) the whole 60 s window is
judged the same way against the peers' window and the window that ended 60 s before; where only
one of those two baselines has the evidence (a replica's own past of a few prompts), it must clear
``alpha`` squared, what the two together would. No constant here is a token count: what is long is
relative to the traffic.

**The seed's rule (``seed_rule``, the seed profile)**, with the two readings it needs: the
growth test runs on the variance (tokens², including ``> 1000`` after a previous variance of 0)
and the seed's "2048" is the window's *mean* length in tokens (a variance of 2048 tokens² is a
standard deviation of 45 tokens: no floor at all); "the previous window" is the one that ended
``lookback_s`` (60 s) earlier, the non-overlapping period before this one (环比). Both windows
must hold ``min_count`` requests: a window of one request has variance 0, and the next of two
would "grow" past 1000 tokens² on any two prompts.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> det = ContextBurstDetector()
>>> def fv(end, mean, recent_mean, n=60):
...     return FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=n,
...                          prompt_tokens_mean=mean, prompt_tokens_var=(0.8 * mean) ** 2, recent_count=n // 3,
...                          recent_prompt_tokens_mean=recent_mean, recent_prompt_tokens_var=(0.5 * recent_mean) ** 2)
>>> [det.update(fv(60.0 + 5 * i, 1000.0, 1000.0), None, now=60.0 + 5 * i).alerts for i in range(5)]
[[], [], [], [], []]
>>> out = det.update(fv(85.0, 1000.0, 8000.0), None, now=85.0)  # 20 prompts of 8k where 1k is usual
>>> out.alerts[0].state, out.actions[0].action, out.actions[0].params["tokens_mean"]
('open', 'prewarm_tokenizer_cache', 8000)
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from skewwatch.config_section import Count, Positive
from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.burst_horizon import SPANS, BurstHorizon, Moments
from skewwatch.pipeline.detectors.evidence import lognormal_mean_tail
from skewwatch.pipeline.detectors.key_columns import KeyColumns
from skewwatch.pipeline.detectors.peers import others_count, others_sum
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import DetectorConfig, Finding, ThresholdDetector
from skewwatch.schemas.feature_vector import RECENT_S, FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

#: The ``seed`` profile's section (skewwatch.pipeline.detectors.profiles): the seed's rule as written,
#: with the evidence floor on both windows.
PROFILE_SEED: dict[str, Any] = {"seed_rule": True, "burst_rule": False, "horizon_rule": False}

HISTORY_KEY = "moments_by_end_ms"  # window_end (ms) -> [count, mean, variance] of the tokens judged


class ContextBurstConfig(DetectorConfig, frozen=True):
    """``[detectors.context_burst]``: the newest prompts against peers and own past (default), the seed's rule."""

    section = "detectors.context_burst"

    persistence: Count = 1
    min_count: Count = 6  # the evidence floor: prompts in the span judged (seed rule: in each window)
    # the default rule: the newest 20 s (or the window) against the peers' and the replica's own past
    burst_rule: bool = True
    alpha: Annotated[float, Meta(gt=0, lt=1)] = 1e-4  # false-alarm probability bound per baseline
    mean_ratio: Annotated[float, Meta(ge=1)] = 2.0  # and a mean at least this x each baseline's
    baseline_min_count: Count = 20  # prompts behind a baseline
    min_peers: Count = 2  # peers with prompts for a pool baseline
    # where the window holds fewer than min_count prompts: 2, 4 and 8 minutes of windows merged
    # (burst_horizon.py), against the peers' same minutes at alpha^2 / 3, kept over horizon_s (the
    # 8 windows the longest span reads)
    horizon_rule: bool = True
    horizon_s: Positive = 480.0
    # the seed's rule (the seed profile)
    seed_rule: bool = False
    growth: Positive = 4.0  # seed: (curr - prev) / prev > 4.0, i.e. > 400 %
    zero_prev_variance: float = 1000.0  # seed: previous variance 0 -> current variance > 1000 (tokens²)
    min_mean_tokens: float = 2048.0  # seed's "2048", read as the window's mean length (tokens)
    lookback_s: Positive = 60.0  # the previous window ended this long before the current one
    tokens: Literal["prompt", "completion"] = "prompt"  # the seed rule's length

    def __post_init__(self) -> None:
        self._require(self.burst_rule or self.seed_rule, "burst_rule", "is off, so seed_rule must be on")
        self._require(self.tokens == "prompt" or not self.burst_rule, "tokens",
                      "must be prompt with burst_rule (the window keeps recent moments of prompt lengths only)")
        self._require(self.horizon_s >= self.lookback_s, "horizon_s", "must be >= lookback_s (a window)")
        self._require(self.lookback_s >= RECENT_S, "lookback_s",
                      f"must be >= {RECENT_S:g} (the history reaches back to where the newest 20 s begin)")


class ContextBurstDetector(ThresholdDetector):
    name = "context_burst"
    Config = ContextBurstConfig
    config: ContextBurstConfig

    def __init__(self, config: ContextBurstConfig | None = None) -> None:
        super().__init__(config)
        # the current step's peers' merged prompt moments (of their newest 20 s, of their window) as
        # columns, and the step's key -> row (empty outside a step)
        self._peers: tuple[_Merged, _Merged] | None = None
        self._row_of: dict[str, int] = {}
        self._prepared: StepColumns | None = None  # the step they are of
        # each replica's window history (the memory's HISTORY_KEY: window end in ms -> [count, mean,
        # variance]) as columns, kept for every replica of a step at once
        self._history = KeyColumns(width=3)
        # the horizon rule: the pool's windows over horizon_s, merged per span for the step's replicas
        self._horizon = BurstHorizon(self.config.horizon_s, self.config.lookback_s)
        self._spans: dict[int, tuple[Moments, Moments]] = {}

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        cfg = self.config
        rules = []
        if cfg.burst_rule:
            rules.append(f"prompts of the last {RECENT_S:g} s >= {cfg.mean_ratio:g} x the baseline's, improbably")
        if cfg.seed_rule:
            rules.append(f"{cfg.tokens} length variance up > {cfg.growth:.0%} on long contexts")
        return Severity.INFO, "prewarm_tokenizer_cache", "context burst: " + ", or ".join(rules)

    remembers = True  # the window history is kept every step, whether the rule can hold or not

    def step_fields(self) -> tuple[str, ...]:
        tokens = self.config.tokens
        return ("count", "window_end", "recent_count", "recent_prompt_tokens_mean", "recent_prompt_tokens_var",
                "prompt_tokens_mean", "prompt_tokens_var", f"{tokens}_tokens_mean", f"{tokens}_tokens_var")

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_]:
        """Replicas that cannot burst whatever their own past says: too few newest prompts, or a
        pool baseline (which every judgement with it must clear) whose mean theirs is not
        ``mean_ratio`` times. For the seed rule, a window that is not long. Only their history
        moves on."""
        cfg = self.config
        can = np.zeros(len(step), dtype=bool)
        if cfg.burst_rule:
            prepared = self._peers is not None and self._prepared is step
            recent, window = self._peers if prepared and self._peers is not None else _pool(step, cfg.min_peers)
            for n_name, mean_name, var_name, peers in (
                    ("recent_count", "recent_prompt_tokens_mean", "recent_prompt_tokens_var", recent),
                    ("count", "prompt_tokens_mean", "prompt_tokens_var", window)):
                own_mean = step.column(mean_name)
                judged = (step.column(n_name) >= cfg.min_count) & ~np.isnan(own_mean)
                judged &= ~np.isnan(step.column(var_name))
                judged &= own_mean > 0
                base = peers.baseline_mean(cfg.baseline_min_count)  # NaN: no pool baseline
                # ratio = mean / base (inf where base <= 0) must reach mean_ratio; a hair of slack
                # for the rounding of the product against the quotient
                below = (base > 0) & (own_mean < cfg.mean_ratio * base * (1.0 - 1e-9))
                can |= judged & ~below
        if cfg.seed_rule:
            mean = step.column(f"{cfg.tokens}_tokens_mean")
            var = step.column(f"{cfg.tokens}_tokens_var")
            can |= (step.column("count") >= cfg.min_count) & ~np.isnan(var) & (mean > cfg.min_mean_tokens)
        if self._spans and self._prepared is step:  # the horizon, where the window is too thin
            thin = step.column("count") < cfg.min_count
            for span_own, span_peers in self._spans.values():
                can |= thin & (span_own.count >= cfg.min_count) & (span_peers.count >= cfg.baseline_min_count) & (
                    span_own.mean >= cfg.mean_ratio * span_peers.mean * (1.0 - 1e-9))
        return ~can

    def prepare(self, step: StepColumns | None) -> None:
        """Each replica's peers' prompt moments (newest 20 s, and whole window), merged without it."""
        self._peers = None
        self._row_of = {}
        self._prepared = step
        self._spans = {}
        cfg = self.config
        if step is None or not cfg.burst_rule or len(step) < 2:
            return
        self._peers = _pool(step, cfg.min_peers)
        self._row_of = step.row_of
        if cfg.horizon_rule:
            self._horizon.update(step.vectors[0].window_end, step.keys, step.column("count"),
                                 step.column("prompt_tokens_mean"), step.column("prompt_tokens_var"))
            # merged only where some window holds too few prompts (the only rows the spans judge), and
            # not on the horizon's first step (the steps' length is not known yet)
            if self._horizon.cells and (step.column("count") < cfg.min_count).any():
                self._spans = dict(zip(SPANS, self._horizon.merged_spans(SPANS), strict=True))

    def remember(self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]) -> None:
        self._remember(fv)

    def remember_step(self, step: StepColumns, rows: npt.NDArray[np.int64]) -> None:
        """:meth:`remember` of the step's ``rows`` at once (by window end: a step has one)."""
        if len(rows) == 0:
            return
        cfg = self.config
        prompt = cfg.tokens == "prompt"
        count = step.column("count")[rows]
        mean = step.column("prompt_tokens_mean" if prompt else "completion_tokens_mean")[rows]
        var = step.column("prompt_tokens_var" if prompt else "completion_tokens_var")[rows]
        keys = step.keys
        own = self._history.rows(keys if len(rows) == len(keys) else [keys[row] for row in rows.tolist()])
        entries = np.empty((len(rows), 3))
        # a window without moments is kept as none (the dict kept None: read back, the same)
        entries[:, 0] = np.where(np.isnan(mean) | np.isnan(var), np.nan, count)
        entries[:, 1] = mean
        entries[:, 2] = var
        ends = step.column("window_end")[rows]
        first = float(ends[0])
        if (ends == first).all():
            self._record(own, first, entries)
            return
        for end in np.unique(ends).tolist():
            same = ends == end
            self._record(own[same], end, entries[same])

    def _record(self, own: npt.NDArray[np.int64], window_end: float, entries: npt.NDArray[np.float64]) -> None:
        """Keep the windows of these rows that end at ``window_end``; drop theirs that ended more
        than ``lookback_s`` before it (the history holds exactly the windows within it)."""
        end = round(window_end * 1000)
        self._history.put(own, end, entries)
        self._history.drop_before(own, end - round(self.config.lookback_s * 1000))

    def _remember(self, fv: FeatureVector) -> int:
        """Record this window's count and moments; return the key's row in the history."""
        cfg = self.config
        prompt = cfg.tokens == "prompt"
        mean = fv.prompt_tokens_mean if prompt else fv.completion_tokens_mean
        var = fv.prompt_tokens_var if prompt else fv.completion_tokens_var
        own = self._history.add(fv.key)
        entry = [math.nan, math.nan, math.nan] if mean is None or var is None else [float(fv.count), mean, var]
        self._record(np.array([own]), fv.window_end, np.array([entry]))
        return own

    def column_memory(self) -> dict[str, dict[str, Any]]:
        history = self._history
        return {key: {HISTORY_KEY: {str(end): entry for end, entry in history.records(key).items()}}
                for key in history.held_keys()}

    def load_column_memory(self, key: str, memory: dict[str, Any]) -> None:
        entries = memory.pop(HISTORY_KEY, None) or {}
        own = np.array([self._history.add(key)])
        for end, entry in entries.items():
            if entry is not None:
                self._history.put(own, int(end), np.array([[float(x) for x in entry]]))

    def clear_column_memory(self) -> None:
        self._history.clear()

    def forget(self, key: str) -> None:
        super().forget(key)
        self._history.forget(key)
        self._horizon.forget(key)

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        own = self._remember(fv)
        history = self._history
        end_ms = round(fv.window_end * 1000)
        findings = []
        if cfg.burst_rule:
            row = self._row_of.get(fv.key)
            peers = (None, None) if row is None or self._peers is None else (
                self._peers[0].at(row), self._peers[1].at(row))
            # the newest 20 s (soonest), and the whole window (more prompts, where they arrive seldom)
            recent = self._burst(fv.recent_count, fv.recent_prompt_tokens_mean, fv.recent_prompt_tokens_var,
                                 f"the last {RECENT_S:g} s's", history.get(own, end_ms - round(RECENT_S * 1000)),
                                 peers[0])
            window = recent if recent.holds is not None else self._burst(
                fv.count, fv.prompt_tokens_mean, fv.prompt_tokens_var, "the window's",
                history.get(own, end_ms - round(cfg.lookback_s * 1000)), peers[1], single_window=True)
            # the whole window only where the newest 20 s hold too few prompts to judge, and minutes of
            # windows where the window holds too few
            chosen = recent if recent.holds is not None else window
            if chosen.holds is None and fv.count < cfg.min_count and row is not None and self._spans:
                chosen = self._over_horizon(row, chosen)
            findings.append(chosen)
        if cfg.seed_rule:
            findings.append(self._seed(fv, history.get(own, end_ms - round(cfg.lookback_s * 1000))))
        holding = [f for f in findings if f.holds]
        if holding:
            return {"main": holding[0]}
        judged = [f for f in findings if f.holds is False]
        return {"main": judged[0] if judged else findings[0]}

    def _burst(self, n: int | None, mean: float | None, var: float | None, span: str, before: list[float] | None,
               peers: tuple[float, float, float] | None, single_window: bool = False) -> Finding:
        """The default rule (module docstring) on one span's prompts (``n``, ``mean``, ``var``)
        against the replica's window that ended where the span begins and its peers' same span
        (``single_window``: the whole window, where one baseline alone must clear ``alpha`` squared)."""
        cfg = self.config
        evidence: dict[str, float | int | str | None] = {
            "span": span, "count": n, "mean_tokens": mean, "min_count": cfg.min_count, "alpha": cfg.alpha,
            "mean_ratio_threshold": cfg.mean_ratio}
        if n is None or n < cfg.min_count or mean is None or var is None or mean <= 0:
            return Finding(holds=None, evidence=evidence)
        baselines = []
        if peers is not None and peers[0] >= cfg.baseline_min_count:
            baselines.append(("peers", peers))
        if before is not None and before[0] >= cfg.baseline_min_count:
            baselines.append(("own past", (before[0], before[1], before[2])))
        if not baselines:
            return Finding(holds=None, evidence=evidence)
        holds = True
        parts = []
        # the whole window judged against one baseline alone (its own past too short: prompts that
        # arrive seldom) must clear what both together would: alpha squared
        alpha = cfg.alpha ** 2 if single_window and len(baselines) < 2 else cfg.alpha
        evidence["alpha"] = alpha
        for name, (count, base_mean, base_var) in baselines:
            probability = lognormal_mean_tail(mean, base_mean, base_var, n)
            ratio = mean / base_mean if base_mean > 0 else math.inf
            tag = "peers" if name == "peers" else "own"
            evidence.update({f"{tag}_mean_tokens": base_mean, f"{tag}_count": count,
                             f"{tag}_probability": probability, f"{tag}_mean_ratio": ratio})
            holds = holds and probability <= alpha and ratio >= cfg.mean_ratio
            parts.append(f"{ratio:.1f} x the {name}' {fmt(base_mean, 0)} (probability {probability:.1e})")
        message = (
            f"context burst: {span} {n} prompts average {fmt(mean, 0)} tokens, "
            + ", ".join(parts)
            + f" (>= {cfg.mean_ratio:g} x, <= {alpha:g})"
        )
        params = {"tokens_mean": round(mean), "tokens_std": round(math.sqrt(max(var, 0.0)))}
        return Finding(holds=holds, message=message, evidence=evidence, params=params)

    def _over_horizon(self, row: int, thin: Finding) -> Finding:
        """The horizon rule: the span of :data:`~skewwatch.pipeline.detectors.burst_horizon.SPANS`
        whose prompts are least probable under the peers' same minutes; it holds at ``alpha`` over
        the number of spans (Bonferroni) with a mean ``mean_ratio`` x the peers'. ``thin``: the
        window's finding (no claim), returned where no span has the evidence."""
        cfg = self.config
        # against the peers alone, as the window against one baseline: what both would clear, alpha
        # squared, shared by the spans tried (Bonferroni)
        alpha = cfg.alpha ** 2 / len(SPANS)
        best: tuple[float, int, float, float, float, float, float] | None = None
        for k, (own, peers) in self._spans.items():
            n, mean, var = float(own.count[row]), float(own.mean[row]), float(own.var[row])
            base_n, base_mean, base_var = float(peers.count[row]), float(peers.mean[row]), float(peers.var[row])
            if n < cfg.min_count or base_n < cfg.baseline_min_count or not mean > 0 or not base_mean > 0:
                continue
            probability = lognormal_mean_tail(mean, base_mean, base_var, int(n))
            if best is None or probability < best[0]:
                best = (probability, k, n, mean, var, base_mean, base_n)
        if best is None:
            return thin
        probability, k, n, mean, var, base_mean, base_n = best
        ratio = mean / base_mean
        minutes = k * cfg.lookback_s / 60.0
        evidence: dict[str, float | int | str | None] = {
            "span": f"the last {minutes:g} min", "count": int(n), "mean_tokens": mean, "min_count": cfg.min_count,
            "alpha": alpha, "mean_ratio_threshold": cfg.mean_ratio, "peers_mean_tokens": base_mean,
            "peers_count": int(base_n), "peers_probability": probability, "peers_mean_ratio": ratio}
        message = (
            f"context burst: the last {minutes:g} min's {int(n)} prompts average {fmt(mean, 0)} tokens, {ratio:.1f} x "
            f"the peers' {fmt(base_mean, 0)} over the same minutes (probability {probability:.1e}; >= "
            f"{cfg.mean_ratio:g} x, <= {alpha:g})")
        params = {"tokens_mean": round(mean), "tokens_std": round(math.sqrt(max(var, 0.0)))}
        return Finding(holds=probability <= alpha and ratio >= cfg.mean_ratio, message=message, evidence=evidence,
                       params=params)

    def _seed(self, fv: FeatureVector, previous: list[float] | None) -> Finding:
        """The seed's rule: variance growth against the window ``lookback_s`` earlier, on long windows."""
        cfg = self.config
        prompt = cfg.tokens == "prompt"
        mean = fv.prompt_tokens_mean if prompt else fv.completion_tokens_mean
        var = fv.prompt_tokens_var if prompt else fv.completion_tokens_var
        prev = None if previous is None else previous[2]
        evidence: dict[str, float | int | str | None] = {
            "tokens": cfg.tokens,
            "variance": var,
            "previous_variance": prev,
            "previous_count": None if previous is None else previous[0],
            "mean_tokens": mean,
            "growth_threshold": cfg.growth,
            "min_mean_tokens": cfg.min_mean_tokens,
        }
        if (fv.count < cfg.min_count or var is None or mean is None or previous is None or prev is None
                or previous[0] < cfg.min_count):
            return Finding(holds=None, evidence=evidence)  # both windows need the evidence floor
        if prev == 0:
            grew = var > cfg.zero_prev_variance
            growth_text = f"from 0 to {fmt(var, 0)} (> {cfg.zero_prev_variance:g})"
        else:
            growth = (var - prev) / prev
            evidence["growth"] = growth
            grew = growth > cfg.growth
            growth_text = f"{growth:+.0%} ({fmt(prev, 0)} -> {fmt(var, 0)} tokens²)"
        long_enough = mean > cfg.min_mean_tokens
        message = (
            f"context burst: {cfg.tokens} length variance {growth_text} against the window {cfg.lookback_s:g} s "
            f"earlier, mean length {fmt(mean, 0)} tokens (> {cfg.min_mean_tokens:g})"
        )
        params = {"tokens_mean": round(mean), "tokens_std": round(math.sqrt(max(var, 0.0)))}
        return Finding(holds=grew and long_enough, message=message, evidence=evidence, params=params)


class _Merged:
    """Per replica, the other replicas' moments of one span merged (count, mean, population
    variance), as columns; a replica with fewer than ``min_peers`` of them has none."""

    __slots__ = ("has", "total", "first", "second")

    def __init__(self, step: StepColumns, count: str, mean: str, var: str, min_peers: int) -> None:
        n = step.column(count)  # NaN (no count) is not > 0: not valid, and zeroed below
        m, v = step.column(mean), step.column(var)
        valid = (n > 0) & ~np.isnan(m) & ~np.isnan(v)
        n, m, v = np.where(valid, n, 0.0), np.where(valid, m, 0.0), np.where(valid, v, 0.0)
        self.total = others_sum(n, valid)
        self.has = (others_count(valid) >= min_peers) & (self.total > 0)
        self.first = others_sum(n * m, valid)
        self.second = others_sum(n * (v + m * m), valid)

    def at(self, row: int) -> tuple[float, float, float] | None:
        """The merged (count, mean, variance) of ``row``'s peers; None without enough of them."""
        if not self.has[row]:
            return None
        total = self.total[row]
        merged_mean = self.first[row] / total
        variance = max(self.second[row] / total - merged_mean ** 2, 0.0)
        return (float(total), float(merged_mean), float(variance))

    def baseline_mean(self, min_count: float) -> npt.NDArray[np.float64]:
        """The merged mean where it is a baseline (peers with at least ``min_count`` values), else NaN."""
        usable = self.has & (self.total >= min_count)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(usable, self.first / self.total, np.nan)


def _pool(step: StepColumns, min_peers: int) -> tuple[_Merged, _Merged]:
    """The peers' moments of the newest 20 s and of the window."""
    return (_Merged(step, "recent_count", "recent_prompt_tokens_mean", "recent_prompt_tokens_var", min_peers),
            _Merged(step, "count", "prompt_tokens_mean", "prompt_tokens_var", min_peers))
