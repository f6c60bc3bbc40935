"""Batch collapse: batch sizes scatter while batches run mostly empty (seed §2.5, §4.2).

Seed rule: "批处理坍塌: batch_size标准差 > 2 且平均填充率 < 30% → CRITICAL; 动态调整batch
scheduler策略" (std(batch_size) > 2 and mean fill < 30 % → CRITICAL; change the batch
scheduler's policy). The seed gives no persistence, so the alert opens on the first step the rule
holds (the seed profile: ``persistence = 1``) and resolves after ``clear_steps`` steps without it.

**The default rule (``stuck_rule``): a stuck scheduler.** The seed's signature (std > 2 with
fill < 30 %) describes batches that scatter; it does not fit a scheduler stuck at batch 1-2 while
the queue grows (its batches barely vary), and it holds on healthy replicas at low load and on long
prompts (the ``seed`` profile keeps it: ``seed_rule``). A healthy continuous-batching engine admits
waiting requests at every iteration while it has a free batch slot and free KV cache, so the
requests waiting that it *could* admit arrived within the current iteration. From the replica's
fresh telemetry, ``k = min(queue_length, free slots, requests the free KV cache holds)`` (capacity
from ``batch_capacity``, else the window's ``batch_size_mean / batch_fill_mean``; the KV room in
requests of the running ones' mean size, ``(1 - kv_cache_usage) / (kv_cache_usage /
running_requests)``). Under the null ``k ~ Poisson(mu)``, ``mu`` = twice the replica's request rate
x one iteration (the engine's live mean time per output token, else ``iteration_s``); the rule
holds when ``P(K >= k) <= alpha`` (1e-4 per scrape,
:func:`~skewwatch.pipeline.detectors.evidence.poisson_tail_bound`) on ``persistence`` (2) scrapes in
a row, with KV room for at least ``stuck_kv_room`` requests and allocator fragmentation under
``stuck_fragmentation_max`` (else long prompts or kv_pressure explain the small batch). No constant
is a queue length: what is stuck is relative to the replica's own arrival rate. Without telemetry it
falls back to the window's events, which lag by a request's latency: ``queue_length_mean >=
stuck_queue_min`` with ``batch_fill_mean < stuck_fill_max``. Every rule needs at least ``min_count``
(6) finished requests in the window.

**``throttle``** (on by default, off in the seed profile): while the alert is open, a ``throttle``
action for the router goes beside ``adjust_batch_policy``. A collapsed scheduler serves a fraction
of its share, and until the engine takes the new batch policy what it cannot admit only waits in
its queue; weights from 60 s windows of *finished* requests notice that a window late.

The action ``adjust_batch_policy`` sends ``params.max_batch_size`` from the seed's §4.2
controller (:mod:`skewwatch.pipeline.batch_controller`): queue length from the window's mean
``queue_length`` (else the engine's telemetry, else the window's mean batch size, so the
recommendation keeps the current batches rather than inventing one), GPU utilisation from telemetry,
P95 from the window.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=50,
...                    batch_size_mean=4.0, batch_size_std=3.0, batch_fill_mean=0.2,
...                    queue_length_mean=10.0, latency_p95=150.0)
>>> seed = BatchCollapseDetector(BatchCollapseConfig.from_overrides(PROFILE_SEED))
>>> out = seed.update(fv, None, now=60.0)
>>> str(out.alerts[0].severity), out.actions[0].action, out.actions[0].params
('CRITICAL', 'adjust_batch_policy', {'max_batch_size': 10})
>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> stuck = BatchCollapseDetector()  # the default: a stuck scheduler, two scrapes in a row
>>> def scrape(end):
...     return (FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=50, rps=0.8,
...                           batch_size_mean=8.0, batch_size_std=1.0, batch_fill_mean=0.25),
...             TelemetrySample(ts=end, replica="r1", source="vllm", queue_length=40, running_requests=2,
...                             kv_cache_usage=0.1, batch_capacity=32, tpot_count=300, tpot_mean_s=0.03))
>>> [a.evidence["stuck"] for end in (60.0, 65.0) for a in stuck.update(*scrape(end), now=end).alerts]
[1]
"""

from __future__ import annotations

import math
from functools import partial
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from skewwatch.config_section import Count, Fraction, NonNegative, NonNegativeInt, Positive
from skewwatch.pipeline.batch_controller import BatchControllerConfig, recommend_batch_size
from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.evidence import poisson_tail_bound
from skewwatch.pipeline.detectors.peers import others_median, others_medians
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import DetectorConfig, Finding, ThresholdDetector
from skewwatch.pipeline.finite import nan_as_none
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

#: The ``seed`` profile's section (skewwatch.pipeline.detectors.profiles): the seed's rule as written.
PROFILE_SEED: dict[str, Any] = {"seed_rule": True, "stuck_rule": False, "peer_rule": False, "throttle": False,
                                "persistence": 1, "min_count": 1}


STUCK_RUN = "stuck_run"  # memory: -log P(K >= k) of the consecutive scrapes the stuck rule sums


class BatchCollapseConfig(DetectorConfig, frozen=True):
    """``[detectors.batch_collapse]``: the stuck-scheduler test (default) and the seed's signature."""

    section = "detectors.batch_collapse"

    std_threshold: NonNegative = 2.0  # seed: std(batch_size) > 2
    fill_threshold: Fraction = 0.30  # seed: mean fill < 30 %
    persistence: Count = 2  # two scrapes in a row: a burst of arrivals clears within one
    min_count: NonNegativeInt = 6  # the evidence floor: fewer finished requests in the window -> no claim
    # seed §4.2 controller
    queue_cap: Annotated[float, Meta(ge=1)] = 32.0
    max_batch_size: Annotated[float, Meta(ge=1)] = 64.0
    low_util: float = 0.4
    high_p95_ms: float = 120.0
    shrink: float = 0.7
    high_util: float = 0.85
    low_p95_ms: float = 80.0
    grow: float = 1.3
    seed_rule: bool = False  # the seed's std/fill signature above (the seed profile)
    # a stuck scheduler: requests wait that a free batch slot and free KV cache could take
    stuck_rule: bool = True
    alpha: Annotated[float, Meta(gt=0, lt=1)] = 1e-4  # false-alarm probability bound per scrape
    # the evidence of up to this many consecutive scrapes, each with a request it could have admitted
    # and worth at most alpha, is summed: a product <= alpha ** persistence holds (three at 1.5e-4 do)
    stuck_span: Count = 3
    iteration_s: Positive = 1.0  # a scheduler iteration when the engine reports no per-token latency
    stuck_kv_room: NonNegative = 1.0  # free KV for at least this many requests (of the running ones' mean size)
    stuck_fragmentation_max: Fraction = 0.4  # above: fragmentation limits the batch (kv_pressure's seed bound)
    # without engine telemetry, the window's events (they lag): waiting requests and batch fill
    stuck_queue_min: Positive = 8.0  # mean queue length at finish
    stuck_fill_max: Fraction = 0.4  # mean batch fill
    # where the engine reports no queue, from the events against the peers (each replica of a pool sees
    # the same traffic, so no constant is a queue length or a fill): batches at most
    # peer_fill_ratio x the peers' fill while its requests wait (first tokens peer_wait_ratio x the peers'
    # median, or a queue that much longer) and its prompts are not longer (those fill KV with fewer requests)
    peer_rule: bool = True
    min_peers: Count = 2  # peers with min_count requests for a pool baseline
    peer_fill_ratio: Annotated[float, Meta(gt=0, lt=1)] = 0.5
    peer_wait_ratio: Annotated[float, Meta(gt=1)] = 2.0
    peer_prompt_ratio: Annotated[float, Meta(gt=1)] = 1.5
    # while the alert is open also ask the router to ``throttle`` the replica
    throttle: bool = True

    def __post_init__(self) -> None:
        self._require(self.seed_rule or self.stuck_rule or self.peer_rule, "seed_rule",
                      "is off, so stuck_rule or peer_rule must be on")

    @property
    def controller(self) -> BatchControllerConfig:
        return BatchControllerConfig(
            queue_cap=self.queue_cap,
            max_batch_size=self.max_batch_size,
            low_util=self.low_util,
            high_p95_ms=self.high_p95_ms,
            shrink=self.shrink,
            high_util=self.high_util,
            low_p95_ms=self.low_p95_ms,
            grow=self.grow,
        )


class BatchCollapseDetector(ThresholdDetector):
    name = "batch_collapse"
    Config = BatchCollapseConfig
    config: BatchCollapseConfig

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        cfg = self.config
        rules = []
        if cfg.seed_rule:
            rules.append(f"std(batch_size) > {cfg.std_threshold:g} and fill < {cfg.fill_threshold:.0%}")
        if cfg.stuck_rule:
            rules.append("requests waiting that free batch slots and KV cache could take")
        reason = "batch collapse: " + ", or ".join(rules)
        return Severity.CRITICAL, "adjust_batch_policy", reason

    def routing_actions(self, rule: str) -> tuple[str, ...]:
        return ("throttle",) if self.config.throttle else ()

    def __init__(self, config: BatchCollapseConfig | None = None) -> None:
        super().__init__(config)
        self._peer: tuple[npt.NDArray[np.float64], ...] = ()  # peers' fill, TTFT, queue, prompt (per row)
        self._row_of: dict[str, int] = {}
        self._prepared: StepColumns | None = None  # the step prepare last saw (its peers, if any)

    def step_fields(self) -> tuple[str, ...]:
        fields = ("count", "batch_size_std", "batch_fill_mean", "queue_length_mean", "batch_size_mean")
        if self.config.peer_rule:
            return (*fields, "ttft_p50", "prompt_tokens_mean")
        return (*fields, "prompt_tokens_mean") if self.config.stuck_rule else fields

    def prepare(self, step: StepColumns | None) -> None:
        """Each replica's peers' batch fill, median TTFT, queue and prompt length: the medians of the
        other replicas' windows with ``min_count`` requests (NaN: fewer than ``min_peers``)."""
        self._peer, self._row_of, self._prepared = (), {}, step
        cfg = self.config
        if step is None or not cfg.peer_rule or len(step) < 2:
            return
        if cfg.stuck_rule and not np.isnan(step.telemetry_column("queue_length")).any() and not np.isnan(
                step.telemetry_column("running_requests")).any():
            return  # every engine reports its queue: the stuck rule judges them all
        count_ok = step.column("count") >= max(cfg.min_count, 1)
        fill, ttft, queue, prompt = (step.column(f) for f in ("batch_fill_mean", "ttft_p50", "queue_length_mean",
                                                                "prompt_tokens_mean"))
        valid = count_ok & ~np.isnan(fill) & ~np.isnan(ttft)
        if (~np.isnan(prompt[valid])).all():  # the usual step: one sort for three of them
            peer_fill, peer_ttft, peer_prompt = others_medians(np.stack([fill, ttft, prompt]), valid, cfg.min_peers)
        else:
            peer_fill, peer_ttft = others_medians(np.stack([fill, ttft]), valid, cfg.min_peers)
            peer_prompt = others_median(prompt, count_ok & ~np.isnan(prompt), cfg.min_peers)
        # (events without a queue: none to compare, and the first tokens say whether requests wait)
        peer_queue = (np.full(len(step), np.nan) if np.isnan(queue).all()
                      else others_median(queue, count_ok & ~np.isnan(queue), cfg.min_peers))
        self._peer = (peer_fill, peer_ttft, peer_queue, peer_prompt)
        self._row_of = step.row_of

    def _peer_rule_may_hold(self, step: StepColumns) -> npt.NDArray[np.bool_]:
        """Where the peer rule may hold (see :meth:`_peer_collapse`), as columns."""
        cfg = self.config
        if not self._peer:
            return np.zeros(len(step), dtype=bool)
        fill, ttft, queue, prompt = (step.column(f) for f in ("batch_fill_mean", "ttft_p50", "queue_length_mean",
                                                                "prompt_tokens_mean"))
        peer_fill, peer_ttft, peer_queue, peer_prompt = self._peer
        with np.errstate(invalid="ignore"):
            low = fill <= cfg.peer_fill_ratio * peer_fill * (1.0 + 1e-9)
            waits = (ttft >= cfg.peer_wait_ratio * peer_ttft * (1.0 - 1e-9)) | (
                queue >= cfg.peer_wait_ratio * np.maximum(peer_queue, 1.0) * (1.0 - 1e-9))
            prompts_ok = np.isnan(prompt) | np.isnan(peer_prompt) | (
                prompt <= cfg.peer_prompt_ratio * peer_prompt * (1.0 + 1e-9))
        return low & waits & prompts_ok

    def step_telemetry_fields(self) -> tuple[str, ...]:
        cfg = self.config
        if not cfg.stuck_rule:
            return ("fragmentation",) if cfg.peer_rule else ()
        return ("queue_length", "running_requests", "batch_capacity", "kv_cache_usage", "fragmentation",
                "tpot_mean_s")

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_] | None:
        """The rules' necessary conditions over the step's replicas as columns: the evidence floor,
        then the seed's signature, or for the stuck rule from telemetry a waiting request, a free
        batch slot, KV room and an unfragmented allocator (``P(K >= k) <= alpha`` needs ``k > mu > 0``),
        from the window's events a long queue with a low fill. Conservative: where the iteration
        time is not positive (``mu`` no longer bounds ``k`` from below) the stuck rule evaluates."""
        cfg = self.config
        count = step.column("count")
        std, fill = step.column("batch_size_std"), step.column("batch_fill_mean")
        can = np.zeros(len(step), dtype=bool)
        telemetry = np.zeros(len(step), dtype=bool)  # the engine reports its queue (the stuck rule judges)
        if cfg.seed_rule:
            can |= (std > cfg.std_threshold) & (fill < cfg.fill_threshold)
        if cfg.stuck_rule:
            waiting, running = step.telemetry_column("queue_length"), step.telemetry_column("running_requests")
            telemetry = ~np.isnan(waiting) & ~np.isnan(running)
            if telemetry.any():  # (an engine reporting its queue: NVML alone does not)
                can |= telemetry & self._stuck_may_hold(step, waiting, running, fill)
            queue = step.column("queue_length_mean")
            can |= ~telemetry & (queue >= cfg.stuck_queue_min) & (fill < cfg.stuck_fill_max)
        if cfg.peer_rule:
            if self._prepared is step and not self._peer:
                pass  # no peers' baseline in this step (a lone replica, or every engine reports its queue)
            elif self._prepared is step:
                frag = step.telemetry_column("fragmentation")
                can |= (self._peer_rule_may_hold(step) & ~telemetry
                        & (np.isnan(frag) | (frag < cfg.stuck_fragmentation_max)))
            else:  # not prepared for this step: evaluate (it judges against what prepare left)
                can |= True
        return ~(can & (count >= max(cfg.min_count, 1)))

    def _stuck_may_hold(self, step: StepColumns, waiting: npt.NDArray[np.float64], running: npt.NDArray[np.float64],
                        fill: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        """Where the stuck rule may hold on the engine's telemetry (see :meth:`quiet`)."""
        cfg = self.config
        declared = step.telemetry_column("batch_capacity")
        size = step.column("batch_size_mean")
        with np.errstate(divide="ignore", invalid="ignore"):
            implied = np.where(~np.isnan(size) & ~np.isnan(fill) & (fill != 0), size / fill, np.nan)
            capacity = np.where(~np.isnan(declared) & (declared != 0), declared, implied)
            usage = step.telemetry_column("kv_cache_usage")
            unbounded = (running == 0) | np.isnan(usage) | (usage <= 0)
            room = (1.0 - usage) * running / usage
        kv_ok = unbounded | (room >= cfg.stuck_kv_room * (1.0 - 1e-9))
        frag = step.telemetry_column("fragmentation")
        frag_ok = np.isnan(frag) | (frag < cfg.stuck_fragmentation_max)
        # the iteration is the live TPOT where it is non-zero, else iteration_s (> 0)
        slow_iteration = step.telemetry_column("tpot_mean_s") < 0
        admits = (waiting > 0) & (capacity - running > 0)
        return kv_ok & frag_ok & (admits | slow_iteration)

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        std, fill = fv.batch_size_std, fv.batch_fill_mean
        evidence: dict[str, float | int | str | None] = {
            "batch_size_std": std,
            "batch_fill_mean": fill,
            "batch_size_mean": fv.batch_size_mean,
            "std_threshold": cfg.std_threshold,
            "fill_threshold": cfg.fill_threshold,
        }
        if fv.count < max(cfg.min_count, 1):  # the evidence floor: no claim on a window this thin
            memory.pop(STUCK_RUN, None)  # (the scrapes summed are consecutive)
            return {"main": Finding(holds=None, evidence=evidence)}
        seed_holds = None if not cfg.seed_rule or std is None or fill is None else (
            std > cfg.std_threshold and fill < cfg.fill_threshold)
        stuck_holds = self._stuck(fv, telemetry, evidence, memory) if cfg.stuck_rule else None
        peer_holds = self._peer_collapse(fv, telemetry, evidence) if cfg.peer_rule else None
        if seed_holds is None and stuck_holds is None and peer_holds is None:
            return {"main": Finding(holds=None, evidence=evidence)}
        holds = bool(seed_holds or stuck_holds or peer_holds)
        params: dict[str, Any] = {}
        if holds:
            queue, queue_source = _queue_length(fv, telemetry)
            util = telemetry.utilization_gpu if telemetry is not None else None
            size = recommend_batch_size(queue, util, fv.latency_p95, cfg.controller)
            params = {"max_batch_size": size}
            evidence.update(
                {
                    "queue_length": queue,
                    "queue_source": queue_source,
                    "gpu_utilization": util,
                    "latency_p95_ms": fv.latency_p95,
                    "max_batch_size": size,
                }
            )
        figure = partial(_evidence_number, evidence)
        if peer_holds and not stuck_holds and not seed_holds:
            message = (
                f"batch collapse (against its peers): batches fill {fmt(100 * figure('batch_fill_mean'), 0)} % "
                f"where its peers' fill {fmt(100 * figure('peer_fill'), 0)} %, while its requests wait "
                f"(first tokens {fmt(figure('ttft_p50_ms'), 0)} ms, the peers' "
                f"{fmt(figure('peer_ttft_p50_ms'), 0)} ms; "
                f"queue {fmt(figure('queue_length_mean'), 1)}, "
                f"the peers' {fmt(figure('peer_queue'), 1)}) (events)"
            )
        elif stuck_holds and not seed_holds:
            if evidence.get("stuck_source") == "telemetry":
                message = (
                    f"batch collapse (stuck scheduler): {fmt(figure('stuck_admissible'), 0)} of "
                    f"{fmt(figure('stuck_queue'), 0)} waiting requests fit the free batch slots and KV cache "
                    f"but were not admitted (" + (
                        f"{fmt(figure('stuck_scrapes'), 0)} scrapes in a row: probability "
                        f"{figure('stuck_run_probability'):.1e} <= {cfg.alpha ** cfg.persistence:.0e} together"
                        if figure("stuck_scrapes") > 1 else
                        f"probability {figure('stuck_probability'):.1e} <= {cfg.alpha:g}")
                    + " for arrivals within one iteration)"
                )
            else:
                message = (
                    f"batch collapse (stuck scheduler): {fmt(figure('stuck_queue'), 0)} requests waiting while "
                    f"the running batch fills {fmt(100 * figure('stuck_fill'), 0)} % "
                    f"< {100 * cfg.stuck_fill_max:g} % (events)"
                )
        else:
            message = (
                f"batch collapse: std(batch_size) {fmt(std, 2)} > {cfg.std_threshold:g} and mean fill "
                f"{fmt(None if fill is None else 100 * fill)} % < {100 * cfg.fill_threshold:g} %"
            )
        if params:
            message += f"; recommend max_batch_size {params['max_batch_size']}"
        steps = int(evidence.get("stuck_scrapes", 1) or 1) if stuck_holds else 1
        return {"main": Finding(holds=holds, message=message, evidence=evidence, params=params, steps=steps)}


    def _peer_collapse(self, fv: FeatureVector, telemetry: TelemetrySample | None,
                       evidence: dict[str, Any]) -> bool | None:
        """The peer rule (None: no peers' baseline or no fill): the window's batch fill at most
        ``peer_fill_ratio`` x the peers' while its requests wait (median TTFT ``peer_wait_ratio`` x the
        peers', or a mean queue that much longer, at least one) and its prompts are no more than
        ``peer_prompt_ratio`` x the peers' (long prompts fill the KV cache with fewer requests) and
        the allocator is not fragmented (``stuck_fragmentation_max``: kv_pressure explains that)."""
        cfg = self.config
        row = self._row_of.get(fv.key)
        if row is None or not self._peer or (
                cfg.stuck_rule and telemetry is not None and telemetry.queue_length is not None
                and telemetry.running_requests is not None):
            return None  # (the engine's own queue: the stuck rule judges it, sooner)
        peer_fill, peer_ttft, peer_queue, peer_prompt = (nan_as_none(c[row]) for c in self._peer)
        fill = fv.batch_fill_mean
        if fill is None or peer_fill is None or (peer_ttft is None and peer_queue is None):
            return None
        evidence.update({"peer_fill": peer_fill, "peer_ttft_p50_ms": peer_ttft, "ttft_p50_ms": fv.ttft_p50,
                         "peer_queue": peer_queue, "queue_length_mean": fv.queue_length_mean,
                         "peer_prompt_tokens_mean": peer_prompt})
        low = fill <= cfg.peer_fill_ratio * peer_fill * (1.0 + 1e-9)
        waits = (fv.ttft_p50 is not None and peer_ttft is not None
                 and fv.ttft_p50 >= cfg.peer_wait_ratio * peer_ttft * (1.0 - 1e-9)) or (
                fv.queue_length_mean is not None and peer_queue is not None
                and fv.queue_length_mean >= cfg.peer_wait_ratio * max(peer_queue, 1.0) * (1.0 - 1e-9))
        prompts_ok = (fv.prompt_tokens_mean is None or peer_prompt is None
                      or fv.prompt_tokens_mean <= cfg.peer_prompt_ratio * peer_prompt * (1.0 + 1e-9))
        frag = telemetry.fragmentation if telemetry is not None else None
        holds = bool(low and waits and prompts_ok and (frag is None or frag < cfg.stuck_fragmentation_max))
        evidence["peer_collapse"] = int(holds)
        return holds

    def _stuck(self, fv: FeatureVector, telemetry: TelemetrySample | None, evidence: dict[str, Any],
               memory: dict[str, Any]) -> bool | None:
        """The stuck-scheduler rule (None: not enough signals); its numbers go into ``evidence``.

        From the engine's telemetry: a continuous-batching scheduler admits waiting requests at
        every iteration while it has a free batch slot and free KV cache, so the requests waiting
        that it *could* admit, ``k = min(waiting, free slots, requests the free KV holds)``, arrived
        within the current iteration. Under that null ``k ~ Poisson(mu)`` with ``mu`` = twice the
        replica's request rate x an iteration (the engine's live mean time per output token, else
        ``iteration_s``); the scrapes are independent under it (what waits is admitted within an
        iteration, far shorter than a scrape's interval), so the rule sums the evidence of the last
        ``stuck_span`` consecutive scrapes with such a request (``memory``): it holds on a scrape
        with ``P(K >= k) <= alpha`` (the alert opens on ``persistence`` in a row), and on a run of
        at least ``persistence`` whose product of ``P(K >= k)``, each at least ``alpha`` (a burst
        is admitted over a few iterations: one scrape proves no more than ``alpha``), is at most
        ``alpha ** persistence`` (three at 1.5e-4 each), which opens it at once, unless its prompts
        are longer than ``peer_prompt_ratio`` x its peers' (a long prefill holds admission over
        several iterations); the allocator not fragmented (kv_pressure explains that). Without
        telemetry, the window's events (lagging): ``queue_length_mean >= stuck_queue_min`` with
        ``batch_fill_mean < stuck_fill_max``.
        """
        cfg = self.config
        capacity: float | None = None
        if telemetry is not None and telemetry.batch_capacity:
            capacity = float(telemetry.batch_capacity)
        elif fv.batch_size_mean is not None and fv.batch_fill_mean:
            capacity = fv.batch_size_mean / fv.batch_fill_mean  # events report size and size/capacity
        if telemetry is not None and telemetry.queue_length is not None and telemetry.running_requests is not None:
            waiting, running = float(telemetry.queue_length), float(telemetry.running_requests)
            usage = telemetry.kv_cache_usage
            frag = telemetry.fragmentation
            if capacity is None:
                memory.pop(STUCK_RUN, None)
                evidence.update({"stuck_queue": waiting, "stuck_source": "telemetry"})
                return None
            free = max(capacity - running, 0.0)
            kv_room = math.inf if running == 0 or usage is None or usage <= 0 else (1.0 - usage) * running / usage
            admissible = min(waiting, free, math.floor(kv_room) if math.isfinite(kv_room) else waiting)
            iteration = telemetry.tpot_mean_s if telemetry.tpot_mean_s else cfg.iteration_s
            mu = 2.0 * max(fv.rps, 1.0 / 60.0) * iteration
            probability = poisson_tail_bound(admissible, mu)
            judged = (probability < 1.0 and kv_room >= cfg.stuck_kv_room
                      and (frag is None or frag < cfg.stuck_fragmentation_max))
            run: list[float] = []
            if judged:  # the run of consecutive scrapes goes on (their -log P, newest last), each
                # worth at most alpha: a burst that arrived at once is admitted over a few iterations
                # (a prefill budget per iteration), so one scrape far past alpha proves no more than one
                nats = min(-math.log(max(probability, 1e-300)), -math.log(cfg.alpha))
                run = [*memory.get(STUCK_RUN, ()), nats][-cfg.stuck_span:]
                memory[STUCK_RUN] = run
            else:
                memory.pop(STUCK_RUN, None)
            summed = math.exp(-sum(run)) if run else 1.0
            # the run proves what persistence scrapes at alpha each would; a scrape at alpha holds alone
            proven = (judged and len(run) >= cfg.persistence and summed <= cfg.alpha ** cfg.persistence
                      and not self._prompts_longer(fv))
            holds = proven or (judged and probability <= cfg.alpha)
            evidence.update({"stuck_queue": waiting, "stuck_fill": running / capacity if capacity else None,
                             "stuck_admissible": admissible, "stuck_expected": mu, "stuck_probability": probability,
                             "stuck_scrapes": len(run) if proven else 1,
                             "stuck_run_probability": summed if proven else probability,
                             "stuck_kv_room": min(kv_room, 1e6), "stuck_fragmentation": frag,
                             "stuck_source": "telemetry", "stuck": int(holds)})
            return holds
        memory.pop(STUCK_RUN, None)
        queue, fill = fv.queue_length_mean, fv.batch_fill_mean
        evidence.update({"stuck_queue": queue, "stuck_fill": fill, "stuck_source": "events"})
        if queue is None or fill is None:
            return None
        holds = queue >= cfg.stuck_queue_min and fill < cfg.stuck_fill_max
        evidence["stuck"] = int(holds)
        return holds


    def _prompts_longer(self, fv: FeatureVector) -> bool:
        """The window's prompts longer than ``peer_prompt_ratio`` x the median of the step's other
        replicas with ``min_count`` requests (at least ``min_peers``): a long prefill holds admission
        over several iterations, so the summed scrapes prove nothing there (False: no such peers)."""
        cfg, step = self.config, self._prepared
        if step is None or fv.prompt_tokens_mean is None:
            return False
        row = step.row_of.get(fv.key)
        if row is None:
            return False
        prompt = step.column("prompt_tokens_mean")
        valid = (step.column("count") >= max(cfg.min_count, 1)) & ~np.isnan(prompt)
        valid[row] = False
        if int(valid.sum()) < cfg.min_peers:
            return False
        return fv.prompt_tokens_mean > cfg.peer_prompt_ratio * float(np.median(prompt[valid]))


def _evidence_number(evidence: dict[str, Any], key: str) -> float:
    """An evidence number for the alert's message: NaN (``fmt`` writes n/a) where it is not a number."""
    value = evidence.get(key)
    return float(value) if isinstance(value, int | float) else float("nan")


def _queue_length(fv: FeatureVector, telemetry: TelemetrySample | None) -> tuple[float, str]:
    """The controller's queue length and where it came from."""
    if fv.queue_length_mean is not None:
        return fv.queue_length_mean, "events"
    if telemetry is not None and telemetry.queue_length is not None:
        return float(telemetry.queue_length), "telemetry"
    if fv.batch_size_mean is not None:
        return fv.batch_size_mean, "batch_size_mean"
    return 1.0, "none"
