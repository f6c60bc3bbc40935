"""Reference features: the window features computed directly from event dicts, exactly.

The oracle for tests (unit, property and integration): no buckets, no sketches, no merging,
just "take the events in ``[window_end - length_s, window_end)`` and compute". It must agree
with :meth:`skewwatch.pipeline.window.WindowSummary.features` exactly for counts and sums, to
float rounding for means/variances, and within the sketch's relative accuracy for quantiles
(which are exact here, with the same rank definition: ``numpy.quantile(method="lower")``).

Events are validated contract-v1 dicts (``status`` defaults to ``"ok"``; optional fields may be
absent or ``None``, the v1.1 batch fields included: batch statistics cover the events that have
them; an event may carry ``"batch_source": 2`` to say its batch size was derived). Lateness is
not modelled: pass only the events the windows accepted.

>>> from skewwatch.config import WindowSettings
>>> ev = dict(model="m", replica="r1", prompt_tokens=10, completion_tokens=20, batch_size=4,
...           batch_capacity=16)
>>> events = [dict(ev, ts=101.0, latency_ms=100.0), dict(ev, ts=103.0, latency_ms=300.0)]
>>> fv = reference_features(events, "m", "r1", 105.0, WindowSettings())
>>> fv.count, fv.latency_p50, fv.latency_p99, fv.batch_fill_mean, fv.step_count
(2, 100.0, 100.0, 0.25, 2)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from skewwatch.config import WindowSettings
from skewwatch.schemas.feature_vector import RECENT_S, FeatureVector
from skewwatch.schemas.requests.columns import BATCH_DERIVED


def _tpot(events: Sequence[Mapping[str, Any]]) -> list[float]:
    """Time per output token: decode time / the tokens after the first, (latency - ttft) / (completion
    - 1) (none for a one-token output); without a ttft, latency / completion tokens."""
    return [max(float(e["latency_ms"]) - float(e["ttft_ms"]), 0.0) / (int(e["completion_tokens"]) - 1)
            if e.get("ttft_ms") is not None else float(e["latency_ms"]) / int(e["completion_tokens"])
            for e in events
            if int(e["completion_tokens"]) > (1 if e.get("ttft_ms") is not None else 0)]


def _exact_quantiles(values: list[float], qs: Sequence[float]) -> list[float | None]:
    if not values:
        return [None] * len(qs)
    return [float(v) for v in np.quantile(np.asarray(values, dtype=np.float64), qs, method="lower")]


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _var(values: list[float]) -> float | None:
    return float(np.var(values)) if values else None  # population variance (ddof=0)


def reference_features(events: Sequence[Mapping[str, Any]], model: str, replica: str | None,
                       window_end: float, settings: WindowSettings,
                       replicas: int | None = None) -> FeatureVector:
    """Features of ``model`` (and ``replica``, or all replicas when None) for one window.

    ``replicas`` (per-model only) defaults to the number of distinct replicas with an event in
    the window; the streaming side counts every *known* replica, silent ones included, so
    callers that know better pass it.
    """
    start, length, step = window_end - settings.length_s, settings.length_s, settings.step_s
    # "ts in [start, end)" stated on bucket numbers, exactly as the windows do (no float edge cases)
    last_bucket = round(window_end / step) - 1
    first_bucket = last_bucket - round(length / step) + 1

    def bucket(e: Mapping[str, Any]) -> int:
        return math.floor(float(e["ts"]) / step)

    window = [e for e in events
              if e["model"] == model and (replica is None or e["replica"] == replica)
              and first_bucket <= bucket(e) <= last_bucket]
    newest = [e for e in window if bucket(e) == last_bucket]
    recent_buckets = min(max(round(RECENT_S / step), 1), last_bucket - first_bucket + 1)
    recent_prompt = [float(e["prompt_tokens"]) for e in window if bucket(e) > last_bucket - recent_buckets]
    tpot = _tpot(window)
    tpot_p50, tpot_p90, tpot_p99, tpot_max = _exact_quantiles(tpot, [0.5, 0.9, 0.99, 1.0])
    newest_tpot = _tpot(newest)

    def column(name: str) -> list[float]:
        return [float(e[name]) for e in window if e.get(name) is not None]

    latency = column("latency_ms")
    batch_size = column("batch_size")
    batch_fill = [e["batch_size"] / e["batch_capacity"] for e in window
                  if e.get("batch_size") is not None and e.get("batch_capacity") is not None]
    completion = column("completion_tokens")
    p50, p95, p99 = _exact_quantiles(latency, [0.5, 0.95, 0.99])
    ttft_p50, ttft_p99 = _exact_quantiles(column("ttft_ms"), [0.5, 0.99])
    # TTFT per prompt token: the geometric mean over the events with both positive
    per_token = [math.log(float(e["ttft_ms"]) / int(e["prompt_tokens"])) for e in window
                 if e.get("ttft_ms") is not None and float(e["ttft_ms"]) > 0 and int(e["prompt_tokens"]) > 0]
    # and the geometric mean prompt of those events
    log_prompt = [math.log(int(e["prompt_tokens"])) for e in window
                  if e.get("ttft_ms") is not None and float(e["ttft_ms"]) > 0 and int(e["prompt_tokens"]) > 0]
    n = len(window)
    if replica is None and replicas is None:
        replicas = len({e["replica"] for e in window})
    return FeatureVector(
        model=model,
        replica=replica,
        window_start=start,
        window_end=window_end,
        count=n,
        rps=n / length,
        latency_p50=p50,
        latency_p95=p95,
        latency_p99=p99,
        latency_mean=_mean(latency),
        ttft_p50=ttft_p50,
        ttft_p99=ttft_p99,
        batch_size_mean=_mean(batch_size),
        batch_size_std=float(np.std(batch_size)) if batch_size else None,
        batch_fill_mean=_mean(batch_fill),
        prompt_tokens_mean=_mean(column("prompt_tokens")),
        prompt_tokens_var=_var(column("prompt_tokens")),
        completion_tokens_mean=_mean(completion),
        completion_tokens_var=_var(completion),
        tokens_per_s=sum(completion) / length,
        error_rate=sum(e.get("status", "ok") == "error" for e in window) / n if n else None,
        queue_length_mean=_mean(column("queue_length")),
        kv_cache_hit_rate_mean=_mean(column("kv_cache_hit_rate")),
        ttft_per_prompt_token=math.exp(sum(per_token) / len(per_token)) if per_token else None,
        ttft_prompt_tokens_gmean=math.exp(sum(log_prompt) / len(log_prompt)) if log_prompt else None,
        step_count=len(newest),
        step_cuda_errors=dict(Counter(str(e["cuda_error"]) for e in newest
                                      if e.get("cuda_error") is not None)),
        replicas=None if replica is not None else replicas,
        batch_count=len(batch_size),
        batch_derived_count=sum(1 for e in window if e.get("batch_source") == BATCH_DERIVED),
        tpot_p50=tpot_p50,
        tpot_p99=tpot_p99,
        tpot_max=tpot_max,
        tpot_p90=tpot_p90,
        recent_count=len(recent_prompt),
        recent_prompt_tokens_mean=_mean(recent_prompt),
        recent_prompt_tokens_var=_var(recent_prompt),
        step_tpot_max=max(newest_tpot) if newest_tpot else None,
    )
