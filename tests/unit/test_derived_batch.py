"""Derived batch sizes (contract v1.1): events without batch fields get them from telemetry, or stay unknown."""

from __future__ import annotations

from typing import Any

import numpy as np

from skewwatch.config import DerivedBatchSettings, load_settings
from skewwatch.pipeline.derived_batch import derive_batch
from skewwatch.pipeline.telemetry_join import TelemetryJoin
from skewwatch.schemas.requests.columns import BATCH_DERIVED, BATCH_REPORTED, BATCH_UNKNOWN, RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample


def row(replica: str, ts: float, model: str = "m", **batch: Any) -> dict[str, Any]:
    return {"request_id": f"{replica}-{ts}", "ts": ts, "model": model, "replica": replica, "latency_ms": 5.0,
            "prompt_tokens": 1, "completion_tokens": 1, **batch}


def engine(replica: str, ts: float, **fields: Any) -> TelemetrySample:
    return TelemetrySample(ts=ts, replica=replica, source="vllm", **fields)


def joined(*samples: TelemetrySample, max_age: float = 30.0):
    join = TelemetryJoin()
    for sample in samples:
        join.add(sample)
    return lambda replica, at: join.view(replica, at, max_age)[0]


def test_reported_rows_are_never_touched_and_nothing_to_do_returns_the_input() -> None:
    cols = RequestColumns.from_rows([row("r1", 100.0, batch_size=3, batch_capacity=8)])
    out = derive_batch(cols, joined(engine("r1", 99.0, running_requests=30, batch_capacity=64)))
    assert out.columns is cols and (out.derived, out.unknown) == (0, 0)


def test_size_from_running_requests_capacity_from_the_sample_then_the_settings() -> None:
    cols = RequestColumns.from_rows([
        row("r1", 100.2), row("r1", 101.7),  # engine reports running + max-num-seqs
        row("r2", 100.5, model="llama"),  # running only: capacity from the per-model setting
        row("r3", 100.5, model="other"),  # running only, no setting for the model: capacity unknown
        row("r4", 100.5),  # no telemetry: unknown
        row("r1", 100.9, batch_size=5),  # reported size, capacity from telemetry; stays "reported"
    ])
    lookup = joined(engine("r1", 99.0, running_requests=12, batch_capacity=48), engine("r1", 101.0, running_requests=0),
                    engine("r2", 95.0, running_requests=7), engine("r3", 96.0, running_requests=9))
    settings = DerivedBatchSettings(capacity_by_model={"llama": 16})
    out = derive_batch(cols, lookup, settings.capacity_for_model)
    c = out.columns
    assert c.batch_size.tolist() == [12, 1, 7, 9, 0, 5]  # running 0 at 101 s: the request itself ran -> 1
    # the sample at 101 s left batch_capacity out: unknown *now*, so the capacity falls to the setting (none)
    assert c.batch_capacity.tolist() == [48, 0, 16, 0, 0, 48]
    assert c.batch_source.tolist() == [BATCH_DERIVED, BATCH_DERIVED, BATCH_DERIVED, BATCH_DERIVED,
                                       BATCH_UNKNOWN, BATCH_REPORTED]
    assert (out.derived, out.unknown) == (4, 1)
    fill = c.batch_fill
    assert fill[0] == 12 / 48 and fill[2] == 7 / 16 and np.isnan(fill[[1, 3, 4]]).all()


def test_stale_or_future_telemetry_is_not_used() -> None:
    cols = RequestColumns.from_rows([row("r1", 100.0), row("r2", 100.0)])
    lookup = joined(engine("r1", 60.0, running_requests=12),  # 40 s before the event: stale
                    engine("r2", 100.5, running_requests=12))  # after the event: its future
    out = derive_batch(cols, lookup)
    assert out.columns.batch_size.tolist() == [0, 0] and out.unknown == 2 and out.derived == 0


def test_sizes_never_exceed_capacities() -> None:
    cols = RequestColumns.from_rows([row("r1", 100.0), row("r1", 100.0, batch_size=40)])
    out = derive_batch(cols, joined(engine("r1", 99.0, running_requests=50, batch_capacity=32)))
    # a derived size is clipped to the capacity; a reported size over a derived capacity drops the capacity
    assert out.columns.batch_size.tolist() == [32, 40]
    assert out.columns.batch_capacity.tolist() == [32, 0]
    assert np.nanmax(out.columns.batch_fill) <= 1.0


def test_settings_from_the_environment() -> None:
    settings = load_settings(env={"SKEWWATCH_DERIVED_BATCH__CAPACITY_BY_MODEL": "llama=256, qwen=128",
                                  "SKEWWATCH_DERIVED_BATCH__DEFAULT_CAPACITY": "64"})
    batch = settings.derived_batch
    assert batch.capacity_for_model("llama") == 256 and batch.capacity_for_model("other") == 64
    assert DerivedBatchSettings().capacity_for_model("llama") is None
