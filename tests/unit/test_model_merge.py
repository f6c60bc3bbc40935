"""Per-model features: merging the replicas' summaries equals the reference on their union."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import orjson
import pytest

from skewwatch.config import WindowSettings
from skewwatch.pipeline.model_merge import merge_model_features, merge_summaries
from skewwatch.pipeline.sketch import log_bins
from skewwatch.pipeline.window import PartitionWindows, WindowSummary
from skewwatch.schemas.requests.columns import RequestColumns
from tests.reference import reference_features
from tests.unit.test_window import assert_features_match, disordered, event, feed, random_events

SETTINGS = WindowSettings()
REPLICAS = [("llama", f"r{i}") for i in range(5)] + [("mistral", "m1"), ("mistral", "m2")]


def summaries_by_model_step(steps) -> dict[tuple[str, float], list[WindowSummary]]:
    out: dict[tuple[str, float], list[WindowSummary]] = defaultdict(list)
    for step in steps:
        # through JSON, as on the internal topic
        out[(step.summary.model, step.summary.window_end)].append(
            WindowSummary.from_dict(orjson.loads(orjson.dumps(step.summary.to_dict()))))
    return out


@pytest.mark.parametrize("batch_missing", [0.0, 0.5])  # v1.1: batches unknown or derived on some events
def test_per_model_merge_equals_the_reference_on_the_union(batch_missing: float) -> None:
    rng = np.random.default_rng(21)
    events = random_events(rng, 4000, 1000.0, 1200.0, REPLICAS, batch_missing=batch_missing)
    # the replicas are spread over two partitions (two stage-1 workers), as in production
    partitions = [PartitionWindows(SETTINGS), PartitionWindows(SETTINGS)]
    steps = []
    for p, windows in enumerate(partitions):
        mine = [e for e in events if int(e["replica"][-1]) % 2 == p]
        steps += feed(windows, disordered(mine, rng, max_delay=4.0), chunk=64)
    grouped = summaries_by_model_step(steps)
    checked = 0
    for (model, window_end), summaries in grouped.items():
        if len(summaries) != sum(m == model for m, _ in REPLICAS):
            continue  # an edge step that only one partition has closed yet
        merged = merge_model_features(model, window_end, summaries, SETTINGS)
        expected = reference_features(events, model, None, window_end, SETTINGS, replicas=len(summaries))
        assert_features_match(merged, expected)
        assert merged.replica is None and merged.key == model
        checked += 1
    assert checked > 60


@pytest.mark.parametrize("batch_missing", [0.0, 0.5])
def test_stage_one_partials_merge_to_the_same_model_vector(batch_missing: float) -> None:
    """Stage 1 merges each partition's rows of a model (``StepBatch.merged``, on columns); stage 2
    merges those partials: the same vector as merging every replica's own summary, counts and
    sketches exactly, means and variances to float rounding, and both equal to the reference."""
    rng = np.random.default_rng(23)
    events = random_events(rng, 4000, 1000.0, 1200.0, REPLICAS, batch_missing=batch_missing)
    events[7]["cuda_error"] = "cudaErrorLaunchTimeout"
    partitions = [PartitionWindows(SETTINGS), PartitionWindows(SETTINGS)]
    partials: dict[tuple[str, float], list[WindowSummary]] = defaultdict(list)
    own: dict[tuple[str, float], list[WindowSummary]] = defaultdict(list)
    for p, windows in enumerate(partitions):
        mine = disordered([e for e in events if int(e["replica"][-1]) % 2 == p], rng, max_delay=4.0)
        for i in range(0, len(mine), 97):
            windows.apply(RequestColumns.from_rows(mine[i:i + 97]))
            for batch in windows.close_steps().batches:
                rows = batch.model_rows()
                for summary in batch.merged(list(rows.values())):
                    partials[(summary.model, batch.window_end)].append(summary)
                for step in batch.replica_steps():
                    own[(step.summary.model, batch.window_end)].append(step.summary)
    checked = 0
    for (model, window_end), summaries in own.items():
        if len(summaries) != sum(m == model for m, _ in REPLICAS):
            continue  # an edge step that only one partition has closed yet
        from_partials = merge_model_features(model, window_end, partials[(model, window_end)], SETTINGS)
        assert from_partials.replicas == len(summaries)
        assert_features_match(from_partials, merge_model_features(model, window_end, summaries, SETTINGS),
                              quantile_rel=0.0)
        expected = reference_features(events, model, None, window_end, SETTINGS, replicas=len(summaries))
        assert_features_match(from_partials, expected)
        checked += 1
    assert checked > 60


def test_a_partial_needs_a_row() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0, replica="r1", latency_ms=50.0)]))
    windows.advance_watermark(105.0)
    batch = windows.close_steps().batches[-1]
    with pytest.raises(ValueError, match="no row"):
        batch.merged([np.zeros(0, dtype=np.int64)])
    assert batch.merged([]) == []


def test_merged_sketch_is_exactly_the_sketch_of_the_union() -> None:
    rng = np.random.default_rng(22)
    events = random_events(rng, 1500, 0.0, 60.0, REPLICAS[:5])
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows(events))
    windows.advance_watermark(60.0)
    summaries = [s.summary for s in windows.close_steps() if s.summary.window_end == 60.0]
    assert len(summaries) == 5
    merged = merge_summaries("llama", 60.0, summaries, SETTINGS)
    union = log_bins(SETTINGS.sketch_relative_accuracy).sparse_counts([e["latency_ms"] for e in events])
    assert np.array_equal(merged.latency, union)
    assert merged.count == 1500 and merged.replicas == 5


def test_silent_replicas_count_as_replicas_and_add_nothing() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows(
        [event(100.0, replica="busy", latency_ms=50.0, cuda_error="cudaErrorLaunchTimeout"),
         event(101.0, replica="busy", latency_ms=150.0), event(30.0, replica="quiet")]))
    windows.advance_watermark(105.0)
    summaries = [s.summary for s in windows.close_steps() if s.summary.window_end == 105.0]
    fv = merge_model_features("m", 105.0, summaries, SETTINGS)
    assert fv.replicas == 2 and fv.count == 2 and fv.step_count == 2
    assert fv.latency_mean == 100.0 and fv.step_cuda_errors == {"cudaErrorLaunchTimeout": 1}
    assert fv.latency_p99 == pytest.approx(50.0, rel=0.01)  # floor(0.99 * 1) = rank 0


def test_no_summaries_is_an_empty_model_window() -> None:
    fv = merge_model_features("m", 60.0, [], SETTINGS)
    assert (fv.count, fv.replicas, fv.rps, fv.latency_p50, fv.error_rate) == (0, 0, 0.0, None, None)


def test_summaries_of_other_windows_or_settings_are_refused() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0), event(101.0, model="other")]))
    windows.advance_watermark(110.0)
    steps = windows.close_steps()
    m105 = [s.summary for s in steps if s.summary.model == "m" and s.summary.window_end == 105.0]
    other = [s.summary for s in steps if s.summary.model == "other"]
    with pytest.raises(ValueError, match="does not belong"):
        merge_model_features("m", 105.0, m105 + other, SETTINGS)
    with pytest.raises(ValueError, match="does not belong"):
        merge_model_features("m", 110.0, m105, SETTINGS)
    with pytest.raises(ValueError, match="relative_accuracy"):
        merge_model_features("m", 105.0, m105, WindowSettings(sketch_relative_accuracy=0.02))


def test_a_summary_from_a_worker_before_ttft_per_prompt_token_merges() -> None:
    """A summary without the contract v1.6 and v1.8 fields (an older stage 1 during an upgrade): it
    decodes with them not reported, and the model's values come from the summaries that have them."""
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0, ttft_ms=40.0),
                                            event(101.0, replica="r2", ttft_ms=10.0, prompt_tokens=10)]))
    windows.advance_watermark(105.0)
    [a, b] = [s.summary for s in windows.close_steps()]
    old = a.to_dict()
    for name in ("optional_count", "optional_sum"):
        del old[name]["log_ttft_per_prompt_token"]
        del old[name]["log_ttft_prompt_tokens"]
    older = WindowSummary.from_dict(orjson.loads(orjson.dumps(old)))
    assert older.features().ttft_per_prompt_token is None and older.features().ttft_prompt_tokens_gmean is None
    assert older.features().ttft_p50 == a.features().ttft_p50
    merged = merge_model_features("m", 105.0, [older, b], SETTINGS)
    assert merged.count == 2 and merged.ttft_per_prompt_token == pytest.approx(1.0)  # b's 10 ms / 10 tokens
    assert merged.ttft_prompt_tokens_gmean == pytest.approx(10.0)
    both = merge_model_features("m", 105.0, [a, b], SETTINGS)
    assert both.ttft_per_prompt_token == pytest.approx(math.sqrt(0.4 * 1.0))
    assert both.ttft_prompt_tokens_gmean == pytest.approx(math.sqrt(100 * 10))
    bad = a.to_dict()
    del bad["optional_count"]["queue_length"]  # a field every version sends is still required
    with pytest.raises(ValueError):
        WindowSummary.from_dict(bad)
