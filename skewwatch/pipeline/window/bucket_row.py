"""The bucket row: every number a bucket (or a merged window) of one key keeps, in ONE float64 row.

A partition keeps its buckets as ``(rows, STATS_LEN)`` arrays (``partition.py``), a step hands the
merged window on in the same layout (``steps.py``), a checkpoint stores it (``partition_state.py``,
``snapshot.py``) and :class:`~skewwatch.pipeline.window.summary.WindowSummary` is one such row spelled
out. The column names below are that layout, and :func:`merge_stats` / :func:`window_stats` the only
ways rows are combined.

>>> STATS_LEN, MEAN, OPT_N
(26, slice(3, 8, None), slice(13, 18, None))
>>> MOMENT_FIELDS[MOMENT_COUNT_COLUMNS.index(BATCH_N)]
'batch_size'
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline import moments
from skewwatch.schemas.requests.columns import RequestColumns

FloatArray = npt.NDArray[np.float64]

# Kept as Welford moments. The first three are on every event (their count is the bucket's event
# count); batch_size is over the events with a known batch size (count BATCH_N) and batch_fill
# over those with a known size and capacity (count FILL_N): v1.1 batch fields are optional.
MOMENT_FIELDS: tuple[str, ...] = (
    "latency_ms", "prompt_tokens", "completion_tokens", "batch_size", "batch_fill",
)
EVENT_MOMENTS = 3  # MOMENT_FIELDS[:3] are counted by COUNT
# Optional fields (NaN = not reported): kept as (reported count, sum), so missing never reads as 0.
# The last two are derived per event, over the events with ttft_ms > 0 and prompt_tokens > 0:
# log(ttft_ms / prompt_tokens) and log(prompt_tokens) (their means are the logs of the geometric means
# of TTFT per prompt token and of those events' prompts: see ``optional_values``).
OPTIONAL_FIELDS: tuple[str, ...] = ("ttft_ms", "queue_length", "kv_cache_hit_rate", "log_ttft_per_prompt_token",
                                    "log_ttft_prompt_tokens")
# absent from older summaries (contract v1.6 and v1.8), read as not reported
ADDED_OPTIONAL = frozenset({"log_ttft_per_prompt_token", "log_ttft_prompt_tokens"})
_M, _O = len(MOMENT_FIELDS), len(OPTIONAL_FIELDS)
# All numbers of a bucket live in ONE float64 row: one numpy object per bucket instead of several
# (each array costs ~100 bytes of header and memory per replica matters); counts are exact in
# float64 up to 2**53. Layout of a row:
COUNT, ERRORS, COMPLETION = 0, 1, 2  # events; events with status "error"; completion tokens
MEAN = slice(3, 3 + _M)  # mean of each MOMENT_FIELDS
M2 = slice(3 + _M, 3 + 2 * _M)  # sum of squared deviations of each MOMENT_FIELDS
OPT_N = slice(3 + 2 * _M, 3 + 2 * _M + _O)  # events that reported each OPTIONAL_FIELDS
OPT_SUM = slice(3 + 2 * _M + _O, 3 + 2 * _M + 2 * _O)  # their sum
# the batch counts (contract v1.1: a batch size may be unknown)
BATCH_N = 3 + 2 * _M + 2 * _O  # events with a known batch_size (reported or derived)
FILL_N = BATCH_N + 1  # events with a known batch_size and batch_capacity
DERIVED_N = BATCH_N + 2  # events whose batch_size was derived from telemetry
STATS_LEN = BATCH_N + 3
# the count column of each MOMENT_FIELDS, for merging moments (each field with its own count)
MOMENT_COUNT_COLUMNS: tuple[int, ...] = (COUNT,) * EVENT_MOMENTS + (BATCH_N, FILL_N)


def optional_values(columns: RequestColumns) -> list[FloatArray]:
    """Each OPTIONAL_FIELDS' value per event of ``columns`` (request columns), NaN where not reported.

    ``log_ttft_per_prompt_token``: a request's time to its first token grows with its prompt
    (prefill), so a window's TTFT moves with the mix of prompt lengths it happened to serve; per
    prompt token it does not, and a replica whose first tokens come later shows at any mix. Its log,
    so that the window's mean is the geometric mean (one very short prompt cannot dominate it).
    ``log_ttft_prompt_tokens``: the log prompt of the same events. Prefill is not all of a TTFT (a
    request also waits for a step of the engine), so per prompt token a short prompt takes longer than
    a long one; with the prompts' own mean beside it, a reader can judge TTFT per prompt token at a
    given prompt length (the learned detector does: ``pipeline.detectors.pool_slope``).

    >>> event = {"request_id": "a", "ts": 1.0, "model": "m", "replica": "r1", "latency_ms": 900.0,
    ...          "completion_tokens": 20}
    >>> cols = RequestColumns.from_rows([{**event, "prompt_tokens": 100, "ttft_ms": 200.0},
    ...                                  {**event, "prompt_tokens": 50}, {**event, "prompt_tokens": 0, "ttft_ms": 5.0}])
    >>> [round(float(v), 3) for v in optional_values(cols)[3]]
    [0.693, nan, nan]
    >>> [round(float(v), 3) for v in optional_values(cols)[4]]
    [4.605, nan, nan]
    """
    ttft = columns.ttft_ms
    prompt = columns.prompt_tokens
    per_token = np.full(len(ttft), np.nan)
    usable = (ttft > 0.0) & (prompt > 0)  # NaN compares False: not reported
    log_prompt = np.full(len(ttft), np.nan)
    log_prompt[usable] = np.log(prompt[usable])
    per_token[usable] = np.log(ttft[usable] / prompt[usable])
    return [ttft, columns.queue_length, columns.kv_cache_hit_rate, per_token, log_prompt]


def merge_stats(a: FloatArray, b: FloatArray) -> FloatArray:
    """Merge bucket rows ``a[i]`` and ``b[i]`` (each ``(g, STATS_LEN)``): sums added, moments by Chan,
    each MOMENT_FIELDS with its own count."""
    out = a + b  # right for the counts and sums; the moments are replaced below
    merged = moments.merge(moments.Moments(a[:, MOMENT_COUNT_COLUMNS], a[:, MEAN], a[:, M2]),
                           moments.Moments(b[:, MOMENT_COUNT_COLUMNS], b[:, MEAN], b[:, M2]))
    out[:, MEAN] = merged.mean
    out[:, M2] = merged.m2
    return out


def window_stats(ring: FloatArray) -> FloatArray:
    """Merge each row's ``n_buckets`` bucket rows (``(n_buckets, rows, STATS_LEN)``) into one row:
    the k-way form of Chan's formula (moments.merge_many), vectorised over rows and fields."""
    out = ring.sum(axis=0)  # right for the counts and sums (and the m2 part within buckets)
    count = ring[:, :, MOMENT_COUNT_COLUMNS]  # (buckets, rows, fields): each field's own count
    n = out[:, MOMENT_COUNT_COLUMNS]
    bucket_mean = ring[:, :, MEAN]
    mean = (count * bucket_mean).sum(axis=0) / np.where(n > 0, n, 1.0)
    between = bucket_mean - mean
    between *= between
    between *= count
    out[:, MEAN] = mean
    out[:, M2] += between.sum(axis=0)
    return out
