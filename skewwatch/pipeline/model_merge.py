"""Per-model features: merge the replicas' window summaries for one window end (stage 2).

Quantiles cannot be merged (docs/design.md, "Two stages, two keys"), so stage 1 ships each replica's
mergeable :class:`~skewwatch.pipeline.window.WindowSummary` (sparse sketch counts, Welford
moments, counts and sums) and stage 2 merges them here: sketches are added slot by slot (all
share the same log-bin layout; the latency, TTFT and time-per-output-token sketches alike),
moments are merged with Chan's formula (the window's and the newest 20 s's prompt moments),
counts and sums are summed. The result is a per-model summary (``replica=None``, ``replicas`` = how many summaries
were merged) whose features come from the same :meth:`WindowSummary.features` as per-replica ones.

>>> from skewwatch.pipeline.window_settings import WindowSettings
>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> from skewwatch.pipeline.window import PartitionWindows
>>> ev = dict(model="m", prompt_tokens=10, completion_tokens=20, batch_size=4, batch_capacity=16)
>>> windows = PartitionWindows(WindowSettings())
>>> _ = windows.apply(RequestColumns.from_rows([
...     dict(ev, request_id="a", replica="r1", ts=101.0, latency_ms=100.0),
...     dict(ev, request_id="b", replica="r2", ts=102.0, latency_ms=300.0)]))
>>> windows.advance_watermark(105.0)
>>> summaries = [step.summary for step in windows.close_steps()]
>>> fv = merge_model_features("m", 105.0, summaries, WindowSettings())
>>> fv.key, fv.count, fv.replicas, fv.latency_mean
('m', 2, 2, 200.0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from skewwatch.pipeline import moments
from skewwatch.pipeline.sketch import EMPTY_SPARSE, add_sparse
from skewwatch.pipeline.window import MOMENT_FIELDS, OPTIONAL_FIELDS, WindowSummary
from skewwatch.pipeline.window_settings import WindowSettings
from skewwatch.schemas.feature_vector import FeatureVector


def merge_summaries(model: str, window_end: float, summaries: Sequence[WindowSummary],
                    settings: WindowSettings) -> WindowSummary:
    """One per-model summary from the replicas' summaries of the same model and window end.

    Raises ValueError when a summary belongs to another model or window end, or was built with
    another window length or sketch accuracy (those cannot be merged meaningfully).
    """
    for s in summaries:
        if s.model != model or s.window_end != window_end:
            raise ValueError(f"summary {s.model}/{s.replica}@{s.window_end} does not belong to "
                             f"{model}@{window_end}")
        if s.length_s != settings.length_s or s.relative_accuracy != settings.sketch_relative_accuracy:
            raise ValueError(f"summary {s.model}/{s.replica} was built with length_s={s.length_s}, "
                             f"relative_accuracy={s.relative_accuracy}; settings differ")
    k = len(MOMENT_FIELDS)
    # A model has hundreds of replicas and this runs per model and step: each per-summary count is
    # read by one list comprehension and summed by sum() over that list (cheaper per value than one
    # array of tuples, and a sum over a generator is costlier still)
    counts = [s.count for s in summaries]
    batch_counts = [s.batch_count for s in summaries]
    fill_counts = [s.fill_count for s in summaries]
    if summaries:
        # each MOMENT_FIELDS' own count per summary (as WindowSummary.moments): events, batch, fill
        field_counts = np.array([counts, counts, counts, batch_counts, fill_counts], dtype=np.float64).T
        merged = moments.merge_many(moments.Moments(field_counts, np.array([s.mean for s in summaries]),
                                                    np.array([s.m2 for s in summaries])))
        mean, m2 = merged.mean, merged.m2
        optional_count = np.array([s.optional_count for s in summaries]).sum(axis=0, dtype=np.int64)
        optional_sum = np.array([s.optional_sum for s in summaries]).sum(axis=0)
    else:
        mean, m2 = np.zeros(k), np.zeros(k)
        optional_count, optional_sum = np.zeros(len(OPTIONAL_FIELDS), np.int64), np.zeros(len(OPTIONAL_FIELDS))
    # the newest RECENT_S's prompt moments (contract v1.2), one count per summary
    recent_counts = [s.recent_count for s in summaries]
    recent = moments.merge_many(moments.Moments(
        np.array(recent_counts, dtype=np.float64), np.array([s.recent_prompt_mean for s in summaries]),
        np.array([s.recent_prompt_m2 for s in summaries]))) if summaries else moments.empty()
    cuda: Counter[str] = Counter()
    for s in summaries:
        if s.step_cuda_errors:
            cuda.update(s.step_cuda_errors)
    return WindowSummary(
        model=model,
        replica=None,
        window_end=window_end,
        length_s=settings.length_s,
        relative_accuracy=settings.sketch_relative_accuracy,
        count=sum(counts),
        errors=sum([s.errors for s in summaries]),
        completion_tokens=sum([s.completion_tokens for s in summaries]),
        mean=mean,
        m2=m2,
        optional_count=optional_count,
        optional_sum=optional_sum,
        latency=add_sparse([s.latency for s in summaries]) if summaries else EMPTY_SPARSE,
        ttft=add_sparse([s.ttft for s in summaries]) if summaries else EMPTY_SPARSE,
        step_count=sum([s.step_count for s in summaries]),
        step_cuda_errors=dict(cuda),
        # a summary already merged in stage 1 (one input partition's replicas of the model) counts its replicas
        replicas=sum([1 if s.replica is not None else s.replicas or 0 for s in summaries]),
        batch_count=sum(batch_counts),
        fill_count=sum(fill_counts),
        derived_count=sum([s.derived_count for s in summaries]),
        tpot=add_sparse([s.tpot for s in summaries]) if summaries else EMPTY_SPARSE,
        recent_count=sum(recent_counts),
        recent_prompt_mean=float(recent.mean),
        recent_prompt_m2=float(recent.m2),
        step_tpot_max=max((s.step_tpot_max for s in summaries if s.step_tpot_max is not None), default=None),
    )


def merge_model_features(model: str, window_end: float, summaries: Sequence[WindowSummary],
                         settings: WindowSettings) -> FeatureVector:
    """The per-model feature vector (``replica=None``, ``replicas=len(summaries)``)."""
    return merge_summaries(model, window_end, summaries, settings).features()
