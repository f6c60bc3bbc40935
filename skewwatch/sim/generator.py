"""The statistical traffic generator behind ``skewwatch generate`` (faults in skewwatch.sim.faults).

N replicas of one or two models receive Poisson arrivals at ``rate`` requests/s each. Every
request draws its prompt and completion lengths jointly from a real trace row (the bundled
Azure LLM inference trace by default), and log-normal latencies that grow gently with the
token counts. Each finished request becomes one event of contract v1 (see the README and
``skewwatch/schemas``): ``ts`` is the finish time in event-time epoch seconds, and events come
out in nondecreasing ``ts``. Every 5 s of event time each replica also yields one simulated
``gpu-telemetry.v1`` sample (:class:`~skewwatch.schemas.telemetry_sample.TelemetrySample`).

Pure: no clock, no I/O. The run is a function of ``(config, start_ts, duration_s)``; a seed
gives the same events on any machine. Each replica draws from its own random stream (and its
faults from another), so injecting a fault on one replica does not change what any other
replica produces, and a shorter run is a prefix of a longer one.

Clean traffic is kept clearly inside every detector's rule (seed §2.4, §2.5), so alerts
come only from injected faults: latency log-sigma 0.2 and token exponent 0.15 give
P99/P50 ~ 1.8 (rule: > 3); batch fill 0.5 (rule: < 0.3); KV hit rate ~ 0.75 (rules: < 0.65,
> 0.85); no CUDA errors.

>>> cfg = GeneratorConfig(replicas=2, rate=5.0, seed=1)
>>> events = list(generate_events(cfg, start_ts=1_700_000_000.0, duration_s=10.0))
>>> sorted({e["replica"] for e in events})
['r0', 'r1']
>>> all(a["ts"] <= b["ts"] for a, b in zip(events, events[1:]))
True
>>> events == list(generate_events(cfg, start_ts=1_700_000_000.0, duration_s=10.0))
True
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import CUDA_ERRORS, Injection, applies_to, check_targets, target_model
from skewwatch.sim.trace import Trace, load_trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

STEP_S = 5.0  # generation chunk and telemetry interval: the pipeline's 5 s step (seed §2.5)
GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    """Every constant of the generated fleet. Defaults: a plausible 70B-class model on H100s."""

    models: tuple[str, ...] = ("llama-3-70b",)
    replicas: int = 4  # per model
    rate: float = 5.0  # requests/s per replica (Poisson)
    replica_prefix: str = "r"  # replicas are r0, r1, ... across all models, in model order
    # End-to-end latency = TTFT + decode. Median ~ latency_median_ms at the trace's median lengths;
    # decode ~ (completion / median completion)^latency_token_exponent x lognormal(latency_sigma).
    latency_median_ms: float = 800.0
    latency_sigma: float = 0.2
    latency_token_exponent: float = 0.15
    ttft_median_ms: float = 150.0
    ttft_sigma: float = 0.2
    ttft_token_exponent: float = 0.25
    batch_capacity: int = 32
    batch_fill_mean: float = 0.5  # batch_size ~ Binomial(capacity, fill), at least 1
    queue_mean: float = 2.0  # queue_length ~ Poisson(queue_mean)
    kv_hit_rate_mean: float = 0.75  # ~ Beta with this mean
    kv_hit_rate_concentration: float = 40.0  # Beta's a + b: higher is steadier
    error_rate: float = 0.0  # plain failures (status error, no cuda_error); gpu_fault adds CUDA errors
    seed: int = 0
    injections: tuple[Injection, ...] = ()
    telemetry: bool = True
    trace: Trace | None = field(default=None, compare=False)  # None: the bundled "conv" trace
    gpu_memory_total_bytes: float = 80.0 * GIB  # H100 80 GB
    model_memory_bytes: float = 40.0 * GIB  # weights (70B at 8 bits)
    kv_pool_bytes: float = 30.0 * GIB

    def __post_init__(self) -> None:
        if not self.models or len(set(self.models)) != len(self.models):
            raise ValueError(f"models: give one or more distinct names, got {self.models!r}")
        if self.replicas < 1 or self.rate <= 0 or self.batch_capacity < 1:
            raise ValueError("replicas, rate and batch_capacity must be positive")
        if not 0 < self.batch_fill_mean <= 1 or not 0 < self.kv_hit_rate_mean < 1:
            raise ValueError("batch_fill_mean must be in (0, 1], kv_hit_rate_mean in (0, 1)")
        if self.latency_median_ms <= self.ttft_median_ms:
            raise ValueError("latency_median_ms must exceed ttft_median_ms")
        check_targets(self.injections, replica_ids(self))


class ReplicaNaming(Protocol):
    """How a simulated fleet names its replicas (the generator's and the fleet simulator's configs)."""

    @property
    def models(self) -> tuple[str, ...]: ...
    @property
    def replicas(self) -> int: ...
    @property
    def replica_prefix(self) -> str: ...


def replica_ids(config: ReplicaNaming) -> list[tuple[str, str]]:
    """``(model, replica)`` pairs: ``replicas`` per model, numbered across models (the same names in
    the generator and the fleet simulator, so labels and scenarios mean the same replica in both)."""
    return [(model, f"{config.replica_prefix}{m * config.replicas + i}")
            for m, model in enumerate(config.models) for i in range(config.replicas)]


def labels(config: GeneratorConfig, start_ts: float) -> list[dict[str, Any]]:
    """Ground truth of the run's injections (the labels file's content)."""
    pairs = replica_ids(config)
    return [inj.label(start_ts, target_model(inj, pairs)) for inj in config.injections]


@dataclass(slots=True)
class TrafficChunk:
    """What one 5 s step of generation releases: requests finished before ``end_ts`` (the last
    chunk also holds everything still in flight) and telemetry sampled at ``end_ts``."""

    end_ts: float
    requests: RequestColumns
    telemetry: list[TelemetrySample]


@dataclass(slots=True)
class _Drawn:
    """One replica's requests arriving in one chunk, as they are being built."""

    arrival: FloatArray
    prompt: IntArray
    completion: IntArray
    z_latency: FloatArray
    z_ttft: FloatArray
    batch: IntArray
    queue: FloatArray
    hit_rate: FloatArray
    is_error: BoolArray
    cuda_error: npt.NDArray[np.object_]
    decode_factor: FloatArray  # slow_replica
    latency_factor: FloatArray  # long_tail
    wait_ms: FloatArray  # batch_collapse queueing
    dropped: BoolArray  # replica_silence
    ttft_factor: FloatArray  # ttft_drift


class TrafficGenerator:
    """Stateful generation of one run; use :func:`generate_chunks` unless you need the object."""

    def __init__(self, config: GeneratorConfig, start_ts: float, duration_s: float | None) -> None:
        if duration_s is not None and duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        self.config = config
        self.start_ts = float(start_ts)
        self.end_ts = math.inf if duration_s is None else self.start_ts + float(duration_s)
        self.trace = config.trace if config.trace is not None else load_trace()
        if len(self.trace) == 0:
            raise ValueError("the trace has no rows")
        self.replicas = replica_ids(config)
        # Independent streams per replica (requests, faults, telemetry): see the module docstring.
        self._rng = [np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(0, i)))
                     for i in range(len(self.replicas))]
        self._fault_rng = [np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(1, i)))
                           for i in range(len(self.replicas))]
        self._telemetry_rng = [np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(2, i)))
                               for i in range(len(self.replicas))]
        self._seq = [0] * len(self.replicas)
        self._prompt_ref = max(float(np.median(self.trace.prompt_tokens)), 1.0)
        self._completion_ref = max(float(np.median(self.trace.completion_tokens)), 1.0)
        self._prompt_p90 = self.trace.prompt_quantile(0.9)  # context_burst is relative to it
        self._pending = RequestColumns.empty()
        self._xid_count = [0] * len(self.replicas)
        # per replica, the injections acting on it (a pool-level fault acts on every replica of its model)
        self._faults = [[inj for inj in config.injections
                         if applies_to(inj, model, replica, target_model(inj, self.replicas))]
                        for model, replica in self.replicas]

    # -- one replica, one chunk ------------------------------------------------------------
    def _draw(self, i: int, t0: float, t1: float) -> _Drawn:
        cfg, rng = self.config, self._rng[i]
        n = int(rng.poisson(cfg.rate * (t1 - t0)))
        arrival = t0 + np.sort(rng.uniform(0.0, t1 - t0, n))
        row = rng.integers(0, len(self.trace), n)
        a = cfg.kv_hit_rate_mean * cfg.kv_hit_rate_concentration
        b = (1.0 - cfg.kv_hit_rate_mean) * cfg.kv_hit_rate_concentration
        return _Drawn(
            arrival=arrival,
            prompt=self.trace.prompt_tokens[row].copy(),
            completion=self.trace.completion_tokens[row].copy(),
            z_latency=rng.standard_normal(n),
            z_ttft=rng.standard_normal(n),
            batch=np.maximum(rng.binomial(cfg.batch_capacity, cfg.batch_fill_mean, n), 1).astype(np.int64),
            queue=rng.poisson(cfg.queue_mean, n).astype(np.float64),
            hit_rate=rng.beta(a, b, n),
            is_error=rng.random(n) < cfg.error_rate,
            cuda_error=np.full(n, None, dtype=object),
            decode_factor=np.ones(n),
            latency_factor=np.ones(n),
            wait_ms=np.zeros(n),
            dropped=np.zeros(n, dtype=bool),
            ttft_factor=np.ones(n),
        )

    def _inject(self, i: int, d: _Drawn, inj: Injection) -> None:
        """Realise one fault on the requests of replica ``i`` that arrive inside its window."""
        start, end = inj.window(self.start_ts)
        hit = (d.arrival >= start) & (d.arrival < end)
        k = int(hit.sum())
        if k == 0:
            return
        rng, cfg = self._fault_rng[i], self.config
        if inj.kind == "long_tail":
            chosen = rng.random(k) < float(inj.param("share"))
            factor = rng.uniform(float(inj.param("factor_min")), float(inj.param("factor_max")), k)
            d.latency_factor[hit] *= np.where(chosen, factor, 1.0)
        elif inj.kind == "slow_replica":
            d.decode_factor[hit] *= float(inj.param("factor"))
        elif inj.kind == "batch_collapse":
            # Stuck at 1-2 with occasional larger batches: low fill *and* std > 2, as the seed's
            # rule describes a collapse (a batch pinned at 1 would have std 0 and not match it).
            top = max(min(int(inj.param("max_batch")), cfg.batch_capacity), 1)
            stuck = rng.random(k) < float(inj.param("stuck_share"))
            d.batch[hit] = np.where(stuck, rng.integers(1, 3, k), rng.integers(min(4, top), top + 1, k))
            queue = np.minimum(float(inj.param("queue_growth_per_s")) * (d.arrival[hit] - start),
                               float(inj.param("queue_max")))
            d.queue[hit] += np.round(queue)
            d.wait_ms[hit] += d.queue[hit] * float(inj.param("wait_ms_per_queued"))
        elif inj.kind == "context_burst":
            mean, cv = inj.burst_mean_tokens(self._prompt_p90), float(inj.param("cv"))
            sigma = math.sqrt(math.log1p(cv * cv))
            prompts = rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma, k)
            cap = inj.burst_max_tokens(self._prompt_p90)
            d.prompt[hit] = np.clip(np.round(prompts), 1, cap).astype(np.int64)
        elif inj.kind == "gpu_fault":
            chosen = rng.random(k) < float(inj.param("share"))
            names = inj.cuda_error_choices()
            picked = np.asarray(names, dtype=object)[rng.integers(0, len(names), k)]
            if float(inj.param("codes")):
                picked = np.asarray([CUDA_ERRORS[str(n)] for n in picked], dtype=object)
            idx = np.flatnonzero(hit)[chosen]
            d.is_error[idx] = True
            d.cuda_error[idx] = picked[chosen]
        elif inj.kind == "kv_pressure":
            if inj.param("mode") == "fragmentation":
                target = float(inj.param("hit_rate"))
            else:
                target = 0.95
                # Cut completions so the replica decodes ~tokens_per_s: mean = tokens_per_s / rate.
                top = max(int(round(2.0 * float(inj.param("tokens_per_s")) / cfg.rate)) - 1, 1)
                d.completion[hit] = rng.integers(1, top + 1, k)
            conc = cfg.kv_hit_rate_concentration
            d.hit_rate[hit] = rng.beta(target * conc, (1.0 - target) * conc, k)
        elif inj.kind == "ttft_drift":
            d.ttft_factor[hit] *= [inj.ttft_factor(t, self.start_ts) for t in d.arrival[hit].tolist()]
        elif inj.kind == "throughput_drop":
            # shorter outputs whose decode takes as long: decode time goes as completion ** exponent
            before = np.maximum(d.completion[hit], 1)
            after = np.maximum(np.round(before * (1.0 - float(inj.param("drop")))), 1).astype(np.int64)
            d.completion[hit] = after
            d.decode_factor[hit] *= (before / after) ** cfg.latency_token_exponent
        elif inj.kind in ("replica_silence", "quiet_pool"):
            d.dropped[hit] = True  # silence: served but not reported; quiet pool: never arrived

    def _columns(self, i: int, d: _Drawn) -> RequestColumns:
        """Latencies from tokens and noise, then the v1 event columns (dropping silenced ones)."""
        cfg = self.config
        model, replica = self.replicas[i]
        ttft = (cfg.ttft_median_ms * (np.maximum(d.prompt, 1) / self._prompt_ref) ** cfg.ttft_token_exponent
                * np.exp(cfg.ttft_sigma * d.z_ttft) * d.ttft_factor)
        decode = ((cfg.latency_median_ms - cfg.ttft_median_ms)
                  * (np.maximum(d.completion, 1) / self._completion_ref) ** cfg.latency_token_exponent
                  * np.exp(cfg.latency_sigma * d.z_latency) * d.decode_factor)
        latency = (ttft + decode) * d.latency_factor + d.wait_ms
        ttft = ttft + d.wait_ms
        ts = d.arrival + latency / 1000.0
        keep = ~d.dropped
        for inj in self._faults[i]:  # silence also hides requests that finish inside the window
            if inj.kind == "replica_silence":
                start, end = inj.window(self.start_ts)
                keep &= ~((ts >= start) & (ts < end))
        n = int(keep.sum())
        first = self._seq[i]
        self._seq[i] += n
        request_id = np.empty(n, dtype=object)
        request_id[:] = [f"s{cfg.seed}-{replica}-{k}" for k in range(first, first + n)]
        return RequestColumns(
            request_id=request_id,
            ts=np.round(ts[keep], 6),
            model=np.full(n, model, dtype=object),
            replica=np.full(n, replica, dtype=object),
            latency_ms=np.round(latency[keep], 3),
            prompt_tokens=d.prompt[keep],
            completion_tokens=d.completion[keep],
            batch_size=d.batch[keep],
            batch_capacity=np.full(n, cfg.batch_capacity, dtype=np.int64),
            ttft_ms=np.round(ttft[keep], 3),
            queue_length=d.queue[keep],
            kv_cache_hit_rate=np.round(d.hit_rate[keep], 4),
            is_error=d.is_error[keep],
            cuda_error=d.cuda_error[keep],
        )

    def _telemetry(self, i: int, d: _Drawn, ts: float) -> TelemetrySample | None:
        """One simulated sample describing the chunk that ends at ``ts``."""
        cfg, rng = self.config, self._telemetry_rng[i]
        noise = rng.standard_normal(4).tolist()  # fixed draw count: determinism does not depend on faults
        frag_base = float(rng.uniform(0.05, 0.15))
        # Faults whose window overlaps the interval [ts - STEP_S, ts) this sample describes.
        active = [inj for inj in self._faults[i]
                  if inj.window(self.start_ts)[0] < ts and inj.window(self.start_ts)[1] > ts - STEP_S]
        if any(inj.kind == "replica_silence" for inj in active):
            return None
        quiet = [inj for inj in active if inj.kind == "quiet_pool"]
        if quiet and not all(float(inj.param("telemetry")) for inj in quiet):
            return None
        if quiet:  # an idle engine: nothing running, nothing waiting
            d = dataclasses.replace(d, batch=d.batch[:0], queue=d.queue[:0], hit_rate=d.hit_rate[:0])
        fill = float(d.batch.mean()) / cfg.batch_capacity if len(d.batch) else 0.0
        kv_usage = float(np.clip(0.9 * fill + 0.03 * noise[0], 0.0, 1.0))
        fragmentation = frag_base
        xid: int | None = None
        for inj in active:
            if inj.kind == "kv_pressure" and inj.param("mode") == "fragmentation":
                kv_usage = float(np.clip(0.97 + 0.01 * noise[0], 0.0, 1.0))
                fragmentation = float(inj.param("fragmentation"))
            if inj.xid() is not None:
                xid = inj.xid()
                self._xid_count[i] += 1
        utilization = float(np.clip(0.25 + 0.7 * fill + 0.03 * noise[1], 0.0, 1.0))
        used = cfg.model_memory_bytes + kv_usage * cfg.kv_pool_bytes + 1.5 * GIB
        model, replica = self.replicas[i]
        return TelemetrySample(
            ts=round(ts, 6),
            replica=replica,
            source="simulated",
            node=f"sim-node-{i}",
            gpu_index=0,
            memory_used_bytes=float(round(used)),
            memory_total_bytes=cfg.gpu_memory_total_bytes,
            utilization_gpu=round(utilization, 4),
            power_w=round(150.0 + 500.0 * utilization + 5.0 * float(noise[2]), 1),
            temperature_c=round(40.0 + 35.0 * utilization + float(noise[3]), 1),
            xid_last=xid,
            xid_count_5m=self._xid_count[i] if xid is not None else None,
            queue_length=int(d.queue[-1]) if len(d.queue) else 0,
            running_requests=int(round(float(d.batch.mean()))) if len(d.batch) else 0,
            kv_cache_usage=round(kv_usage, 4),
            kv_cache_hit_rate=round(float(d.hit_rate.mean()), 4) if len(d.hit_rate) else None,
            memory_reserved_bytes=float(round(used)),
            memory_allocated_bytes=float(round(used * (1.0 - fragmentation))),
        )

    # -- the run -----------------------------------------------------------------------------
    def chunks(self) -> Iterator[TrafficChunk]:
        cfg = self.config
        for k in itertools.count():
            t0, t1 = self.start_ts + k * STEP_S, self.start_ts + (k + 1) * STEP_S
            last = t1 >= self.end_ts
            new = [self._pending]
            telemetry: list[TelemetrySample] = []
            for i in range(len(self.replicas)):
                # Always draw the whole chunk, then cut at the end: a shorter run is a prefix.
                d = self._draw(i, t0, t1)
                for inj in self._faults[i]:
                    self._inject(i, d, inj)
                if last:
                    d.dropped |= d.arrival >= self.end_ts
                new.append(self._columns(i, d))
                if cfg.telemetry and t1 <= self.end_ts:
                    sample = self._telemetry(i, d, t1)
                    if sample is not None:
                        telemetry.append(sample)
            merged = RequestColumns.concat(new)
            merged = merged.take(np.argsort(merged.ts, kind="stable"))
            if last:
                yield TrafficChunk(end_ts=t1, requests=merged, telemetry=telemetry)
                return
            # Requests finishing at or after t1 wait: one arriving later may finish before them.
            ready = merged.ts < t1
            self._pending = merged.take(~ready)
            yield TrafficChunk(end_ts=t1, requests=merged.take(ready), telemetry=telemetry)


def generate_chunks(config: GeneratorConfig, start_ts: float,
                    duration_s: float | None = None) -> Iterator[TrafficChunk]:
    """The run as 5 s chunks of columns and telemetry; ``duration_s=None`` never ends."""
    return TrafficGenerator(config, start_ts, duration_s).chunks()


def event_rows(cols: RequestColumns) -> list[dict[str, Any]]:
    """Request columns as contract-v1 event dicts (optional fields present; cuda_error only on errors)."""
    rows: list[dict[str, Any]] = []
    cuda = cols.cuda_error.tolist()
    for rid, ts, model, replica, lat, p, c, bs, cap, ttft, q, hit, err, ce in zip(
        cols.request_id.tolist(), cols.ts.tolist(), cols.model.tolist(), cols.replica.tolist(),
        cols.latency_ms.tolist(), cols.prompt_tokens.tolist(), cols.completion_tokens.tolist(),
        cols.batch_size.tolist(), cols.batch_capacity.tolist(), cols.ttft_ms.tolist(),
        cols.queue_length.tolist(), cols.kv_cache_hit_rate.tolist(), cols.is_error.tolist(), cuda,
        strict=True,
    ):
        event: dict[str, Any] = {
            "request_id": rid, "ts": ts, "model": model, "replica": replica, "latency_ms": lat,
            "prompt_tokens": p, "completion_tokens": c, "batch_size": bs, "batch_capacity": cap,
            "ttft_ms": ttft, "queue_length": int(q), "kv_cache_hit_rate": hit,
            "status": "error" if err else "ok",
        }
        if ce is not None:
            event["cuda_error"] = ce
        rows.append(event)
    return rows


def generate_events(config: GeneratorConfig, start_ts: float,
                    duration_s: float | None = None) -> Iterator[dict[str, Any]]:
    """Request events (contract v1 dicts) in nondecreasing ``ts``; ``duration_s=None`` never ends.

    Requests arrive in ``[start_ts, start_ts + duration_s)``; all of them are reported, so the
    last few finish (``ts``) slightly after the end.
    """
    for chunk in generate_chunks(config, start_ts, duration_s):
        yield from event_rows(chunk.requests)


def generate_telemetry(config: GeneratorConfig, start_ts: float,
                       duration_s: float | None = None) -> Iterator[TelemetrySample]:
    """Only the telemetry samples of the same run (one per replica every 5 s of event time)."""
    for chunk in generate_chunks(config, start_ts, duration_s):
        yield from chunk.telemetry
