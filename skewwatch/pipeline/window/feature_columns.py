"""THE feature definitions: every feature of a window, computed from its merged bucket row, its
quantiles and its newest prompt moments, for many rows at once.

Both ways to a :class:`FeatureVector` come here: a closed step's columns, every key of a partition at
once (:meth:`StepBatch.feature_vectors <skewwatch.pipeline.window.steps.StepBatch.feature_vectors>`),
and one :class:`~skewwatch.pipeline.window.summary.WindowSummary` (the per-model vectors of stage 2),
as a batch of one row. The columns are named by
:data:`~skewwatch.schemas.feature_spec.FEATURE_NAMES` and a vector is built from them in that order.

>>> import numpy as np
>>> from skewwatch.pipeline.window.bucket_row import COUNT, COMPLETION, MEAN, STATS_LEN
>>> stats = np.zeros((2, STATS_LEN))
>>> stats[0, [COUNT, COMPLETION]] = 3, 60
>>> stats[0, MEAN.start] = 120.0
>>> nan = np.full((2, 4), np.nan)
>>> a, b = feature_vectors([("m", "r1"), ("m", "r2")], 60.0, 60.0, stats, [3, 0], [{}, {}], nan[:, :3],
...                        nan[:, :2], nan, np.zeros((2, 3)), [None, None])
>>> a.latency_mean, a.tokens_per_s, a.error_rate, b.latency_mean, b.error_rate
(120.0, 1.0, 0.0, None, None)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.window.bucket_row import (
    BATCH_N,
    COMPLETION,
    COUNT,
    DERIVED_N,
    ERRORS,
    M2,
    MEAN,
    MOMENT_COUNT_COLUMNS,
    OPT_N,
    OPT_SUM,
)
from skewwatch.schemas.feature_spec import FEATURE_NAMES, FEATURES_SCHEMA_VERSION
from skewwatch.schemas.feature_vector import FeatureVector

FloatArray = npt.NDArray[np.float64]

# quantiles: sketch, rank floor(q*(n-1)) (numpy "lower"), <= the sketch's relative accuracy error
LATENCY_QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
TTFT_QUANTILES: tuple[float, ...] = (0.5, 0.99)
TPOT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99, 1.0)  # P50, P90, P99, max


def _exp_or_none(values: FloatArray, known: npt.NDArray[np.bool_]) -> list[float | None]:
    # math.exp per value, not np.exp: the geometric means are the floats math.exp gives
    return [math.exp(v) if k else None for v, k in zip(values.tolist(), known.tolist(), strict=True)]


def feature_vectors(
    keys: Sequence[tuple[str, str | None]],
    window_end: float,
    length_s: float,
    stats: FloatArray,
    step_count: list[int],
    step_cuda_errors: list[dict[str, int]],
    latency_q: FloatArray,
    ttft_q: FloatArray,
    tpot_q: FloatArray,
    recent: FloatArray,
    replicas: list[int | None],
    step_tpot_max: FloatArray | None = None,
) -> list[FeatureVector]:
    """One :class:`FeatureVector` per row: ``keys[i]`` = (model, replica) and the window
    ``[window_end - length_s, window_end)`` whose merged bucket row is ``stats[i]``
    (``bucket_row.py``).

    ``latency_q``, ``ttft_q``, ``tpot_q``: ``(rows, len(*_QUANTILES))``, NaN where the sketch is
    empty; ``recent``: ``(rows, 3)``, count, prompt-length mean and m2 over the newest RECENT_S;
    ``step_count``, ``step_cuda_errors`` and ``replicas`` as the vectors carry them (each row's dict
    is the vector's own); ``step_tpot_max``: ``(rows,)``, NaN where the newest step had no TPOT (None:
    unknown on every row).
    """
    rows = len(keys)
    if not rows:
        return []
    st = stats
    count_f = st[:, COUNT]
    field_count = st[:, MOMENT_COUNT_COLUMNS]  # (rows, 5) each MOMENT_FIELDS' own count
    known = field_count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        var = st[:, M2] / field_count  # population variance; NaN/inf where unknown (masked below)
        optional_mean = st[:, OPT_SUM] / st[:, OPT_N]
        error_rate = st[:, ERRORS] / count_f
        recent_var = recent[:, 2] / recent[:, 0]
    mean = st[:, MEAN]
    optional_known = st[:, OPT_N].round().astype(np.int64) > 0
    recent_known = recent[:, 0] > 0
    batch_std = np.sqrt(np.maximum(np.where(known[:, 3], var[:, 3], 0.0), 0.0))
    # Every statistic that may be unknown, side by side with whether it is known: one (rows, k) matrix
    # made Python objects at once, None where unknown (never 0), then split into columns: a few numpy
    # calls for all of them, not a dozen per column, since a summary's features (one row) pay each
    # call's fixed cost for a single value.
    nullable = ("latency_p50", "latency_p95", "latency_p99", "ttft_p50", "ttft_p99",
                "tpot_p50", "tpot_p90", "tpot_p99", "tpot_max",
                "latency_mean", "prompt_tokens_mean", "completion_tokens_mean", "batch_size_mean", "batch_fill_mean",
                "prompt_tokens_var", "completion_tokens_var", "batch_size_std", "error_rate",
                "queue_length_mean", "kv_cache_hit_rate_mean", "recent_prompt_tokens_mean", "recent_prompt_tokens_var",
                "step_tpot_max")
    step_top = np.full((rows, 1), np.nan) if step_tpot_max is None else np.asarray(step_tpot_max)[:, None]
    values = np.concatenate([latency_q, ttft_q, tpot_q, mean, var[:, 1:3], batch_std[:, None], error_rate[:, None],
                             optional_mean[:, 1:3], recent[:, 1:2], recent_var[:, None], step_top], axis=1)
    is_known = np.concatenate([~np.isnan(latency_q), ~np.isnan(ttft_q), ~np.isnan(tpot_q), known, known[:, 1:3],
                               known[:, 3:4], (count_f > 0)[:, None], optional_known[:, 1:3],
                               recent_known[:, None], recent_known[:, None], ~np.isnan(step_top)], axis=1)
    objects = values.astype(object)
    objects[~is_known] = None
    columns: dict[str, list[Any]] = dict(zip(nullable, objects.T.tolist(), strict=True))
    columns.update({
        "model": [model for model, _ in keys],
        "replica": [replica for _, replica in keys],
        "window_start": [window_end - length_s] * rows,
        "window_end": [window_end] * rows,
        "count": count_f.astype(np.int64).tolist(),
        "rps": (count_f / length_s).tolist(),
        "tokens_per_s": (st[:, COMPLETION].astype(np.int64) / length_s).tolist(),
        "step_count": step_count,
        "step_cuda_errors": step_cuda_errors,
        "replicas": replicas,
        "batch_count": np.rint(st[:, BATCH_N]).astype(np.int64).tolist(),
        "batch_derived_count": np.rint(st[:, DERIVED_N]).astype(np.int64).tolist(),
        # the optional means of the logs: exp gives the geometric means
        "ttft_per_prompt_token": _exp_or_none(optional_mean[:, 3], optional_known[:, 3]),
        "ttft_prompt_tokens_gmean": _exp_or_none(optional_mean[:, 4], optional_known[:, 4]),
        "recent_count": recent[:, 0].astype(np.int64).tolist(),
        "v": [FEATURES_SCHEMA_VERSION] * rows,
    })
    if len(columns) != len(FEATURE_NAMES):  # a column the spec does not declare would never be published
        raise KeyError(f"feature columns {sorted(set(columns) - set(FEATURE_NAMES))} are not in the feature spec")
    # positionally, in the declared field order: keyword arguments would be matched by name, per
    # field of every row
    return [FeatureVector(*values) for values in zip(*(columns[name] for name in FEATURE_NAMES), strict=True)]
