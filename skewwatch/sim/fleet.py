"""Discrete-event fleet simulator: continuous batching per replica, a router in front.

Where :mod:`skewwatch.sim.generator` draws latencies from distributions, this module derives
them: requests from a real trace (arrival times and token lengths, scaled to a target share of
the fleet's capacity) are routed to replicas that serve them the way vLLM-style engines do.

The engine model, per replica (every constant in :class:`~skewwatch.sim.fleet_config.FleetConfig`,
defaults for a 70B-class model with FP8 weights and KV cache on one 80 GB H100-class GPU):

- **Iterations.** The engine runs one iteration after another while it has work. At the start
  of an iteration it admits waiting requests (FIFO) while the running batch is below
  ``max_batch`` and the KV cache can hold the request's prompt and completion (reserved at
  admission, so KV usage never exceeds capacity and nothing is preempted). The iteration takes
  ``prefill_ms_per_token`` x the admitted prompts' uncached tokens (prefix-cache hits skip
  prefill) plus one decode step of ``decode_base_ms + decode_per_seq_ms x batch +
  decode_per_context_token_ms x context tokens`` (weights read once per step, KV read per
  token). Every running request gains one token per iteration; an admitted request has its first
  token at the end of its first iteration (TTFT) and finishes after ``completion_tokens``
  iterations.
- **Events.** A finished request becomes one contract-v1 event: ``ts`` the finish time,
  ``batch_size`` the running batch right after it was admitted, ``queue_length`` the waiting
  queue at its finish, ``kv_cache_hit_rate`` its prefix-cache hit share.
- **Telemetry** every 5 s of event time per replica: an SM-activity-like GPU utilisation
  (prefill time counts fully, decode steps in proportion to batch fill), KV usage, memory =
  weights + runtime + KV in use, power and temperature from utilisation, queue and running batch,
  and what a vLLM engine exports live (``live_signals``): the interval's time per output token
  (every decode step gives each running request a token; its latency is the step's duration)
  and time to first token (at the end of the admitting iteration), as vLLM's histograms would
  show them between two scrapes (:mod:`skewwatch.collect.histogram`, contract v1.2).
- **Faults** (:mod:`skewwatch.sim.faults`), relative to the trace and the replica:
  ``slow_replica`` multiplies the replica's decode step, ``batch_collapse`` makes the scheduler
  admit only while the running batch is under 1-2 (a ``stuck_share`` of ``phase_s`` phases) or
  under 4..``max_batch`` (the other phases), ``context_burst`` gives requests routed to the
  replica prompts of ``factor`` x the trace's P90, ``gpu_fault`` fails a ``share`` of its requests
  with CUDA errors (XID in telemetry for hardware faults), ``kv_pressure`` lowers the
  prefix-cache hit rate (more prefill) and shrinks the usable KV cache by the fragmentation,
  ``replica_silence`` keeps the replica serving but hides its events and telemetry,
  ``long_tail`` stalls a ``share`` of its requests by (k - 1) x the replica's own median latency
  (over its last finished requests), spread over their output tokens, ``quiet_pool`` stops every
  arrival of a model (its engines idle; their telemetry goes on unless ``telemetry=0``).

**Traffic.** One arrival stream for the fleet, time-scaled to ``rate`` (or ``load`` x capacity),
each arrival picking a model uniformly; or, with ``model_rates``, one stream per model at its own
rate (each replays the trace from its own seeded offset, so every pool sees the trace's shape).

Runs are deterministic under a seed and as fast as the machine allows (an hour of 4 replicas in
seconds). :meth:`FleetSimulator.chunks` yields one :class:`~skewwatch.sim.generator.TrafficChunk`
per 5 s step, the same type the generator yields, so producing to Kafka is shared. Between two
chunks a caller may apply routing corrections (``simulator.router``): the generator does not run
past the next step before it is asked to, which is the lockstep a closed loop needs.

>>> sim = FleetSimulator(FleetConfig(replicas=2, load=0.5, seed=1), start_ts=1_700_000_000.0, duration_s=30)
>>> chunks = list(sim.chunks())
>>> s = sim.stats()
>>> s["arrivals"] == s["finished"] + s["failed"] and s["in_flight"] == 0
True
>>> bool(max(c.requests.batch_size.max() for c in chunks if len(c.requests)) <= 32)
True
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from skewwatch.collect.histogram import TPOT_BUCKETS_S, TTFT_BUCKETS_S, IntervalHistogram
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import CUDA_ERRORS, Injection, applies_to, target_model
from skewwatch.sim.fleet_config import GIB, FleetConfig, replica_capacity_rps, unloaded_latency_s
from skewwatch.sim.generator import STEP_S, TrafficChunk, replica_ids
from skewwatch.sim.router import DynamicWeightRouter, make_router
from skewwatch.sim.trace import load_trace

# the configuration lives in skewwatch.sim.fleet_config; it is named here too, beside the simulator
# it configures (callers build one and run the other)
__all__ = ["GIB", "LIVE_ENGINE_FIELDS", "FleetConfig", "FleetSimulator", "replica_capacity_rps",
           "unloaded_latency_s"]

# Event kinds, in the order they are handled at equal times: a step closes before anything
# that happens at its boundary, so a chunk holds exactly the requests with ts < its end.
_STEP, _ITER_END, _ARRIVAL = 0, 1, 2
# Telemetry fields an engine exports live (its scrape bridge); FleetConfig.live_signals=False leaves them out.
LIVE_ENGINE_FIELDS: tuple[str, ...] = (
    "queue_length", "running_requests", "kv_cache_usage", "tpot_count", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s",
    "ttft_count", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s")
# long_tail: a replica's median latency is taken over its last this many finished requests (not stalled ones)
MEDIAN_OVER = 101
MEDIAN_MIN = 5  # fewer finished so far: the engine's unloaded latency of the trace's median request


class _Request:
    __slots__ = ("rid", "model", "arrival", "prompt", "completion", "hit", "kv", "ctx",
                 "first_token", "batch", "finish_iter", "stall_s", "ttft_extra_s")

    def __init__(self, rid: int, model: str, arrival: float, prompt: int, completion: int) -> None:
        self.rid = rid
        self.model = model
        self.arrival = arrival
        self.prompt = prompt
        self.completion = max(completion, 1)  # an engine always produces at least one token
        self.hit = 0.0
        self.kv = prompt + self.completion  # KV tokens reserved at admission
        self.ctx = prompt + self.completion // 2  # mean context over its decode, for step cost
        self.first_token = math.nan
        self.batch = 0
        self.finish_iter = 0
        self.stall_s = 0.0  # long_tail: how much later than its engine time this request finishes
        self.ttft_extra_s = 0.0  # ttft_drift: how much later its first token (and so its end) comes


class _Replica:
    def __init__(self, index: int, model: str, name: str, injections: list[Injection], start_ts: float,
                 seed: int) -> None:
        self.index, self.model, self.name = index, model, name
        self.waiting: deque[_Request] = deque()
        self.finishing: list[tuple[int, int, _Request]] = []  # (finish_iter, rid, request)
        self.prefilling: list[_Request] = []
        self.running = 0
        self.iteration = 0
        self.kv_used = 0
        self.ctx_tokens = 0
        self.busy = False
        self.busy_s = 0.0  # busy seconds inside the current telemetry interval
        self.busy_carry_s = 0.0  # of an iteration that runs past the interval's end
        self.faults = [(inj, *inj.window(start_ts)) for inj in injections]
        self.recent_latency: deque[float] = deque(maxlen=MEDIAN_OVER)  # seconds, finished and not stalled
        self.recent_ttft: deque[float] = deque(maxlen=MEDIAN_OVER)  # seconds, of the same requests
        self.stalled: dict[int, float] = {}  # rid -> extra seconds per output token, while running
        self.tpot = IntervalHistogram(TPOT_BUCKETS_S)  # this telemetry interval's live latencies
        self.ttft = IntervalHistogram(TTFT_BUCKETS_S)
        self.iteration_s = 0.0  # the running iteration's duration and how many requests decode in it
        self.decoding = 0
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(10, index)))
        self.fault_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(11, index)))
        self.telemetry_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(12, index)))
        self.xid_count = 0
        self.collapse_phase = -1  # batch_collapse: the phase whose batch limit is collapse_cap
        self.collapse_cap = 1
        # invariants and totals, for tests and reports
        self.arrivals = self.finished = self.failed = 0
        self.max_running = 0
        self.max_kv = 0

    @property
    def inflight(self) -> int:
        return len(self.waiting) + self.running

    def active(self, kind: str, t: float) -> Injection | None:
        for inj, start, end in self.faults:
            if inj.kind == kind and start <= t < end:
                return inj
        return None

    def overlapping(self, t0: float, t1: float) -> list[Injection]:
        return [inj for inj, start, end in self.faults if start < t1 and end > t0]


class FleetSimulator:
    """One simulated run; iterate :meth:`chunks` to advance it 5 s of event time at a time."""

    def __init__(self, config: FleetConfig, start_ts: float, duration_s: float,
                 on_step: Callable[[FleetSimulator, TrafficChunk], None] | None = None) -> None:
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        self.config = config
        self.start_ts = float(start_ts)
        self.end_ts = self.start_ts + float(duration_s)
        self.trace = config.trace if config.trace is not None else load_trace()
        self.router = make_router(config.policy)
        self.on_step = on_step  # called after each chunk is built, before it is yielded
        pairs = replica_ids(config)
        targets = [target_model(inj, pairs) for inj in config.injections]
        self.replicas = [
            _Replica(i, model, name, [inj for inj, target in zip(config.injections, targets, strict=True)
                                      if applies_to(inj, model, name, target)],
                     self.start_ts, config.seed)
            for i, (model, name) in enumerate(pairs)
        ]
        self.pools: dict[str, list[_Replica]] = {}
        for r in self.replicas:
            self.pools.setdefault(r.model, []).append(r)
        per_replica = replica_capacity_rps(config, self.trace)
        self.capacity_rps = per_replica * len(self.replicas)
        if config.model_rates is not None:
            self.rate = float(sum(config.model_rates))
        else:
            self.rate = config.rate if config.rate is not None else config.load * self.capacity_rps
        self._prompt_p90 = self.trace.prompt_quantile(0.9)  # context_burst is relative to it
        # long_tail before a replica has finished enough requests: the trace's median request, unloaded
        self._median_fallback_s = unloaded_latency_s(config, float(np.median(self.trace.prompt_tokens)),
                                                     float(np.median(self.trace.completion_tokens)))
        # ttft_drift before the replica has finished MEDIAN_MIN requests: the median prompt's prefill
        self._ttft_fallback_s = float(np.median(self.trace.prompt_tokens)) * config.prefill_ms_per_token / 1000.0
        self._arrival_rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(13,)))
        self._events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, replica index or stream)
        self._seq = 0
        self._done: list[dict[str, Any]] = []  # finished rows not yet released in a chunk
        self._rid = 0
        self.quiet_dropped = 0  # arrivals that never came: their model's pool was quiet
        # arrival streams: one for the fleet (a model picked per arrival), or one per model
        if config.model_rates is None:
            self._streams = [self._arrival_times(self.rate, self._arrival_rng)]
        else:
            self._streams = [self._arrival_times(rate, np.random.default_rng(
                np.random.SeedSequence(config.seed, spawn_key=(13, m + 1))))
                for m, rate in enumerate(config.model_rates)]
        self._step_end = self.start_ts + STEP_S  # end of the telemetry interval being accumulated

    # -- traffic -------------------------------------------------------------------------------
    def _arrival_times(self, rate: float, rng: np.random.Generator) -> Iterator[tuple[float, int]]:
        """Trace arrivals (time-scaled to ``rate``, looping) as (event time, trace row)."""
        trace = self.trace
        span = trace.duration_s
        n = len(trace)
        if n < 2 or span <= 0:  # no usable timing: Poisson at the target rate over the rows
            t = self.start_ts
            while True:
                t += float(rng.exponential(1.0 / rate))
                yield t, int(rng.integers(0, n))
        scale = trace.mean_rate / rate  # trace seconds -> event seconds
        period = span * n / (n - 1)  # one lap of the trace, keeping its mean gap at the seam
        first = int(rng.integers(0, n))  # start somewhere in the trace, per seed
        base = float(trace.offset_s[first])
        lap, i = 0, first
        while True:
            offset = float(trace.offset_s[i]) - base + lap * period
            yield self.start_ts + offset * scale, i
            i += 1
            if i == n:  # wrap: the next lap continues after this one, keeping time increasing
                i, lap = 0, lap + 1

    def _push(self, t: float, kind: int, replica: int = -1) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, replica))

    # -- engine --------------------------------------------------------------------------------
    def _admit_and_run(self, r: _Replica, t: float) -> None:
        """Start an iteration on ``r`` at ``t``: admit what fits, schedule its end."""
        cfg = self.config
        cap = cfg.max_batch
        collapse = r.active("batch_collapse", t)
        if collapse is not None:
            cap = self._collapsed_cap(r, collapse, t)
        kv_cap = cfg.kv_capacity_tokens
        pressure = r.active("kv_pressure", t)
        if pressure is not None and pressure.param("mode") == "fragmentation":
            kv_cap = int(kv_cap * (1.0 - float(pressure.param("fragmentation"))))
        prefill_tokens = 0.0
        decoding = r.running  # requests that get an output token after their first from this iteration
        while r.waiting and r.running < cap:
            req = r.waiting[0]
            if req.kv > kv_cap:  # can never fit: fail it rather than block the queue forever
                r.waiting.popleft()
                self._finish(r, req, t, failed=True)
                continue
            if r.kv_used + req.kv > kv_cap:
                break
            r.waiting.popleft()
            r.running += 1
            r.kv_used += req.kv
            r.ctx_tokens += req.ctx
            req.batch = r.running
            req.finish_iter = r.iteration + req.completion
            if req.stall_s:
                r.stalled[req.rid] = req.stall_s / req.completion  # extra seconds per output token
            heapq.heappush(r.finishing, (req.finish_iter, req.rid, req))
            r.prefilling.append(req)
            prefill_tokens += req.prompt * (1.0 - req.hit)
        r.max_running = max(r.max_running, r.running)
        r.max_kv = max(r.max_kv, r.kv_used)
        if r.running == 0:
            r.busy = False
            return
        step_ms = (cfg.decode_base_ms + cfg.decode_per_seq_ms * r.running
                   + cfg.decode_per_context_token_ms * r.ctx_tokens)
        slow = r.active("slow_replica", t)
        if slow is not None:
            step_ms *= float(slow.param("factor"))
        drop = r.active("throughput_drop", t)
        if drop is not None:  # shorter requests (at arrival) that take as long: each step slower
            step_ms /= 1.0 - float(drop.param("drop"))
        prefill_ms = prefill_tokens * cfg.prefill_ms_per_token
        duration_s = (prefill_ms + step_ms) / 1000.0
        r.busy = True
        # SM-activity-like utilisation: prefill keeps the GPU's compute busy; a decode step is
        # memory-bound and busy in proportion to its batch fill. (NVML's utilization.gpu would
        # read ~100 % whenever anything runs, which says nothing about spread across replicas.)
        active_ms = prefill_ms + step_ms * min(r.running / cfg.max_batch, 1.0)
        self._account_busy(r, t, duration_s, active_ms / 1000.0)
        r.iteration_s, r.decoding = duration_s, decoding  # for the live histograms, at its end
        self._push(t + duration_s, _ITER_END, r.index)

    def _collapsed_cap(self, r: _Replica, collapse: Injection, t: float) -> int:
        """The stuck scheduler's batch limit at ``t``: drawn once per ``phase_s`` of the fault.

        A limit only stops admissions (nothing is preempted), so it must last long enough for
        the running batch to drain to it: drawn per iteration, the 4..``max_batch`` draws would
        refill the batch every few iterations and it would sit near ``max_batch``, never at 1-2.
        """
        start = collapse.window(self.start_ts)[0]
        phase = int((t - start) // float(collapse.param("phase_s")))
        if r.collapse_phase != phase:
            top = max(min(int(collapse.param("max_batch")), self.config.max_batch), 1)
            if r.fault_rng.random() < float(collapse.param("stuck_share")):
                r.collapse_cap = int(r.fault_rng.integers(1, 3))
            else:
                r.collapse_cap = int(r.fault_rng.integers(min(4, top), top + 1))
            r.collapse_phase = phase
        return r.collapse_cap

    def _account_busy(self, r: _Replica, t: float, duration_s: float, active_s: float) -> None:
        """Add the iteration's active time to this interval, the part past its end to the next."""
        share = active_s / duration_s if duration_s > 0 else 0.0
        inside = max(min(t + duration_s, self._step_end) - t, 0.0)
        r.busy_s += inside * share
        r.busy_carry_s += (duration_s - inside) * share

    def _iteration_end(self, r: _Replica, t: float) -> None:
        r.iteration += 1
        self._observe_tokens(r, t)
        for req in r.prefilling:
            req.first_token = t + req.ttft_extra_s
        r.prefilling.clear()
        while r.finishing and r.finishing[0][0] <= r.iteration:
            _, _, req = heapq.heappop(r.finishing)
            r.running -= 1
            r.kv_used -= req.kv
            r.ctx_tokens -= req.ctx
            r.stalled.pop(req.rid, None)
            # long_tail: a stalled request finishes its stall later; the live histograms spread the
            # stall over its tokens (_observe_tokens), its batch slot and KV are freed at engine time
            self._finish(r, req, t + req.stall_s + req.ttft_extra_s)
        self._admit_and_run(r, t)

    def _observe_tokens(self, r: _Replica, t: float) -> None:
        """The live histograms of the iteration ending at ``t`` (counted in the telemetry interval it
        ends in, as an engine observes a token when it is produced): each request that was decoding
        got a token one iteration after its previous one (a stalled request its stall's share of
        the iteration more), each admitted one its first token."""
        duration, decoding = r.iteration_s, r.decoding
        if r.stalled:
            admitted = {req.rid for req in r.prefilling}
            extras = [extra for rid, extra in r.stalled.items() if rid not in admitted]
            r.tpot.observe(duration, decoding - len(extras))
            for extra in extras:
                r.tpot.observe(duration + extra)
        else:
            r.tpot.observe(duration, decoding)
        for req in r.prefilling:
            r.ttft.observe(t + req.ttft_extra_s - req.arrival)

    def _finish(self, r: _Replica, req: _Request, t: float, failed: bool = False) -> None:
        cfg = self.config
        status, cuda_error = "ok", None
        if failed:
            status = "error"
            r.failed += 1
        else:
            r.finished += 1
            fault = r.active("gpu_fault", t)
            if fault is not None and r.fault_rng.random() < float(fault.param("share")):
                status = "error"
                names = fault.cuda_error_choices()
                name = names[int(r.fault_rng.integers(0, len(names)))]
                cuda_error = CUDA_ERRORS[name] if float(fault.param("codes")) else name
        latency_ms = max((t - req.arrival) * 1000.0, 0.001)
        ttft_ms = latency_ms if math.isnan(req.first_token) else (req.first_token - req.arrival) * 1000.0
        if status == "ok" and req.stall_s == 0.0 and req.ttft_extra_s == 0.0:
            r.recent_latency.append(latency_ms / 1000.0)
            r.recent_ttft.append(min(ttft_ms, latency_ms) / 1000.0)
        row: dict[str, Any] = {
            "request_id": f"s{cfg.seed}-{r.name}-{req.rid}", "ts": round(t, 6), "model": r.model,
            "replica": r.name, "latency_ms": round(latency_ms, 3), "prompt_tokens": req.prompt,
            "completion_tokens": req.completion if not failed else 0,
            "batch_size": max(req.batch, 1), "batch_capacity": cfg.max_batch,
            "ttft_ms": round(min(ttft_ms, latency_ms), 3), "queue_length": len(r.waiting),
            "kv_cache_hit_rate": round(req.hit, 4), "status": status,
        }
        if cuda_error is not None:
            row["cuda_error"] = cuda_error
        if not self._silenced(r, req.arrival, t):
            self._done.append(row)

    def _silenced(self, r: _Replica, arrival: float, t: float) -> bool:
        for inj, start, end in r.faults:
            if inj.kind == "replica_silence" and (start <= arrival < end or start <= t < end):
                return True
        return False

    def _arrive(self, t: float, row: int, stream: int) -> None:
        cfg = self.config
        if cfg.model_rates is not None:
            model = cfg.models[stream]
        else:
            model = cfg.models[int(self._arrival_rng.integers(0, len(cfg.models)))] if len(cfg.models) > 1 \
                else cfg.models[0]
        pool = self.pools[model]
        if pool[0].active("quiet_pool", t) is not None:  # nobody sends this model anything now
            self.quiet_dropped += 1
            return
        pick = self.router.choose(model, [r.name for r in pool], [r.inflight for r in pool], t)
        r = pool[pick]
        self._rid += 1
        req = _Request(self._rid, model, t, int(self.trace.prompt_tokens[row]),
                       int(self.trace.completion_tokens[row]))
        burst = r.active("context_burst", t)
        if burst is not None:
            mean, cv = burst.burst_mean_tokens(self._prompt_p90), float(burst.param("cv"))
            sigma = math.sqrt(math.log1p(cv * cv))
            prompt = r.fault_rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma)
            req.prompt = int(min(max(round(prompt), 1), burst.burst_max_tokens(self._prompt_p90)))
            req.kv = req.prompt + req.completion
            req.ctx = req.prompt + req.completion // 2
        target = cfg.kv_hit_rate_mean
        pressure = r.active("kv_pressure", t)
        if pressure is not None:
            target = float(pressure.param("hit_rate")) if pressure.param("mode") == "fragmentation" else 0.95
        conc = cfg.kv_hit_rate_concentration
        req.hit = float(r.rng.beta(target * conc, (1.0 - target) * conc))
        tail = r.active("long_tail", t)
        if tail is not None and r.fault_rng.random() < float(tail.param("share")):
            k = float(r.fault_rng.uniform(float(tail.param("factor_min")), float(tail.param("factor_max"))))
            median = (float(np.median(r.recent_latency)) if len(r.recent_latency) >= MEDIAN_MIN
                      else self._median_fallback_s)
            req.stall_s = (k - 1.0) * median  # a request of median length then takes k x the median
        drift = r.active("ttft_drift", t)
        if drift is not None:  # its first token k x later than the replica's own median TTFT would have it
            usual = (float(np.median(r.recent_ttft)) if len(r.recent_ttft) >= MEDIAN_MIN
                     else self._ttft_fallback_s)
            req.ttft_extra_s = (drift.ttft_factor(t, self.start_ts) - 1.0) * usual
        drop = r.active("throughput_drop", t)
        if drop is not None:
            req.completion = max(int(round(req.completion * (1.0 - float(drop.param("drop"))))), 1)
            req.kv = req.prompt + req.completion
            req.ctx = req.prompt + req.completion // 2
        r.arrivals += 1
        r.waiting.append(req)
        if not r.busy:
            self._admit_and_run(r, t)

    # -- telemetry -----------------------------------------------------------------------------
    def _telemetry(self, r: _Replica, t: float) -> TelemetrySample | None:
        cfg = self.config
        noise = r.telemetry_rng.standard_normal(2).tolist()
        frag = float(r.telemetry_rng.uniform(0.05, 0.15))
        overlapping = r.overlapping(t - STEP_S, t)
        if any(inj.kind == "replica_silence" or (inj.kind == "quiet_pool" and not float(inj.param("telemetry")))
               for inj in overlapping):
            return None
        xid: int | None = None
        for inj in overlapping:
            if inj.kind == "kv_pressure" and inj.param("mode") == "fragmentation":
                frag = float(inj.param("fragmentation"))
            if inj.xid() is not None:
                xid = inj.xid()
                r.xid_count += 1
        util = min(r.busy_s / STEP_S, 1.0)
        kv_used_bytes = r.kv_used * cfg.kv_bytes_per_token
        used = min(cfg.model_memory_bytes + cfg.runtime_memory_bytes + kv_used_bytes, cfg.gpu_memory_total_bytes)
        kv_bytes = cfg.kv_capacity_tokens * cfg.kv_bytes_per_token
        reserved = cfg.runtime_memory_bytes + kv_bytes  # torch allocator: what it holds beyond weights
        return TelemetrySample(
            ts=round(t, 6), replica=r.name, source="simulated", node=f"sim-node-{r.index}", gpu_index=0,
            memory_used_bytes=float(round(used)), memory_total_bytes=cfg.gpu_memory_total_bytes,
            utilization_gpu=round(util, 4),
            power_w=round(cfg.idle_power_w + (cfg.max_power_w - cfg.idle_power_w) * util + 5.0 * noise[0], 1),
            temperature_c=round(35.0 + 40.0 * util + noise[1], 1),
            xid_last=xid, xid_count_5m=r.xid_count if xid is not None else None,
            kv_cache_hit_rate=None,
            memory_reserved_bytes=float(round(reserved)),
            memory_allocated_bytes=float(round(reserved * (1.0 - frag))),
            **(self._live_signals(r) if cfg.live_signals else {}),
        )

    def _live_signals(self, r: _Replica) -> dict[str, Any]:
        """What the engine's scrape bridge reports live: gauges now, the latency histograms' deltas
        since the previous sample (quantiles as Prometheus interpolates them; None without tokens)."""
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 6)

        return {
            "queue_length": len(r.waiting), "running_requests": r.running,
            "kv_cache_usage": round(r.kv_used / self.config.kv_capacity_tokens, 4),
            "tpot_count": r.tpot.count, "tpot_mean_s": rounded(r.tpot.mean()),
            "tpot_p50_s": rounded(r.tpot.quantile(0.5)), "tpot_p99_s": rounded(r.tpot.quantile(0.99)),
            "ttft_count": r.ttft.count, "ttft_mean_s": rounded(r.ttft.mean()),
            "ttft_p50_s": rounded(r.ttft.quantile(0.5)), "ttft_p99_s": rounded(r.ttft.quantile(0.99)),
        }

    # -- the run -------------------------------------------------------------------------------
    def chunks(self) -> Iterator[TrafficChunk]:
        self._step_end = self.start_ts + STEP_S
        self._push(self._step_end, _STEP)
        rows = [0] * len(self._streams)  # each stream's next arrival's trace row
        for stream in range(len(self._streams)):
            self._next_arrival(stream, rows)
        hard_stop = self.end_ts + self.config.drain_s
        while self._events:
            t, kind, _, data = heapq.heappop(self._events)
            if kind == _ARRIVAL:
                self._arrive(t, rows[data], data)
                self._next_arrival(data, rows)
            elif kind == _ITER_END:
                self._iteration_end(self.replicas[data], t)
            else:
                chunk = self._close_step(t)
                idle = all(not r.busy and not r.waiting for r in self.replicas)
                last = t >= self.end_ts and (idle or t >= hard_stop)
                if last:
                    self._fail_in_flight(t)
                    chunk.requests = RequestColumns.concat([chunk.requests, self._release(math.inf)])
                if self.on_step is not None:
                    self.on_step(self, chunk)
                yield chunk
                if last:
                    return
                self._step_end = t + STEP_S
                self._push(self._step_end, _STEP)

    def _next_arrival(self, stream: int, rows: list[int]) -> None:
        """Schedule ``stream``'s next arrival (none at or past the end)."""
        t, rows[stream] = next(self._streams[stream])
        if t < self.end_ts:
            self._push(t, _ARRIVAL, stream)

    def _release(self, before: float) -> RequestColumns:
        ready = [row for row in self._done if row["ts"] < before]
        self._done = [row for row in self._done if row["ts"] >= before]
        ready.sort(key=lambda row: row["ts"])
        return RequestColumns.from_rows(ready)

    def _close_step(self, t: float) -> TrafficChunk:
        telemetry: list[TelemetrySample] = []
        for r in self.replicas:
            if self.config.telemetry:
                sample = self._telemetry(r, t)
                if sample is not None:
                    telemetry.append(sample)
            r.busy_s, r.busy_carry_s = min(r.busy_carry_s, STEP_S), max(r.busy_carry_s - STEP_S, 0.0)
            r.tpot.reset()  # the next sample reports the next interval's tokens
            r.ttft.reset()
        return TrafficChunk(end_ts=t, requests=self._release(t), telemetry=telemetry)

    def _fail_in_flight(self, t: float) -> None:
        """Past the drain limit: whatever is still queued or running fails (conservation holds)."""
        for r in self.replicas:
            while r.waiting:
                self._finish(r, r.waiting.popleft(), t, failed=True)
            while r.finishing:
                _, _, req = heapq.heappop(r.finishing)
                r.running -= 1
                r.kv_used -= req.kv
                self._finish(r, req, t, failed=True)
            r.busy = False
        self._events = [e for e in self._events if e[1] != _ITER_END]
        heapq.heapify(self._events)

    # -- reports -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Totals and invariants: arrivals, finished, failed, in flight, max batch and KV seen."""
        per = {r.name: {"arrivals": r.arrivals, "finished": r.finished, "failed": r.failed,
                        "in_flight": r.inflight, "max_running": r.max_running, "max_kv_tokens": r.max_kv}
               for r in self.replicas}
        total = {k: sum(int(p[k]) for p in per.values()) for k in ("arrivals", "finished", "failed", "in_flight")}
        router = self.router
        return {**total, "replicas": per, "capacity_rps": self.capacity_rps, "rate_rps": self.rate,
                "fallbacks": router.fallbacks if isinstance(router, DynamicWeightRouter) else 0}

    def apply_correction(self, record: Mapping[str, Any], now: float) -> None:
        """Hand a routing-corrections record to the router (the ``dynamic`` policies only)."""
        if not isinstance(self.router, DynamicWeightRouter):
            raise ValueError(f"routing corrections need policy 'dynamic' or 'dynamic_least_request', "
                             f"not {self.config.policy!r}")
        self.router.apply_correction(record, now)
