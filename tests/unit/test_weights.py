"""Dynamic weights (seed §1): the formula on hand-computed cases, health, stale, guards."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewwatch.pipeline.weights import ReplicaWeight, WeightConfig, WeightInput, compute_weights, load_denominator
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

GB = 1e9


def fv(
    replica: str = "a", latency: float | None = 1000.0, queue: float | None = 16.0, step_count: int = 5
) -> FeatureVector:
    return FeatureVector(
        model="m",
        replica=replica,
        window_start=0.0,
        window_end=60.0,
        count=50 if latency is not None else 0,
        step_count=step_count,
        latency_mean=latency,
        queue_length_mean=queue,
    )


def tel(replica: str = "a", used: float = 40 * GB, total: float = 80 * GB, **kw: Any) -> TelemetrySample:
    return TelemetrySample(
        ts=59.0, replica=replica, source="nvml", memory_used_bytes=used, memory_total_bytes=total, **kw
    )


def inp(
    replica: str = "a", *, age: float | None = 1.0, telemetry: TelemetrySample | None = None, **kw: Any
) -> WeightInput:
    features = kw.pop("features", None) or fv(
        replica, **{k: kw.pop(k) for k in list(kw) if k in ("latency", "queue", "step_count")}
    )
    return WeightInput(replica=replica, features=features, telemetry=telemetry, telemetry_age_s=age, **kw)


def one(w: WeightInput, config: WeightConfig | None = None) -> ReplicaWeight:
    return compute_weights([w], config)[w.replica]


@pytest.mark.parametrize(
    ("used", "latency", "queue", "denominator"),
    [
        (40 * GB, 1000.0, 16.0, 0.5),  # 0.4*0.5 + 0.3*0.5 + 0.3*0.5
        (80 * GB, 2000.0, 32.0, 1.0),  # everything at its reference
        (64 * GB, 500.0, 8.0, 0.47),  # 0.4*0.8 + 0.3*0.25 + 0.3*0.25
        (100 * GB, 5000.0, 100.0, 1.0),  # every term capped at 1
        (8 * GB, 200.0, 3.2, 0.1),  # 0.4*0.1 + 0.3*0.1 + 0.3*0.1
    ],
)
def test_seed_formula_on_hand_computed_cases(used: float, latency: float, queue: float, denominator: float) -> None:
    w = one(inp(telemetry=tel(used=used), latency=latency, queue=queue))
    assert w.components["denominator"] == pytest.approx(denominator)
    assert w.raw_score == pytest.approx(1.0 / denominator)
    assert w.weight == 1.0 and w.reason == "ok" and w.health == 1.0


def test_normalisation_within_the_pool() -> None:
    weights = compute_weights(
        [
            inp("a", telemetry=tel("a", used=40 * GB), latency=1000.0, queue=16.0),  # raw 2
            inp("b", telemetry=tel("b", used=80 * GB), latency=2000.0, queue=32.0),
        ]  # raw 1
    )
    assert weights["a"].weight == pytest.approx(2 / 3) and weights["b"].weight == pytest.approx(1 / 3)
    assert sum(w.weight for w in weights.values()) == pytest.approx(1.0)


def test_health_multiplies_before_normalisation() -> None:
    weights = compute_weights(
        [
            inp("a", telemetry=tel("a"), health=0.4, health_note="isolate: cudaErrorMemoryAllocation"),
            inp("b", telemetry=tel("b")),
        ]
    )
    # raw 2 and 2; effective 0.8 and 2
    assert weights["a"].weight == pytest.approx(0.8 / 2.8) and weights["b"].weight == pytest.approx(2 / 2.8)
    assert weights["a"].raw_score == pytest.approx(2.0)
    assert "health 0.4 (isolate: cudaErrorMemoryAllocation)" in weights["a"].reason


def test_drained_replica_gets_zero() -> None:
    weights = compute_weights([inp("a", telemetry=tel("a"), health=0.0), inp("b", telemetry=tel("b"))])
    assert weights["a"].weight == 0.0 and weights["b"].weight == 1.0


def test_all_idle_pool_is_guarded_and_equal() -> None:
    weights = compute_weights([inp(r, telemetry=tel(r, used=0.0), latency=0.0, queue=0.0) for r in ("a", "b", "c")])
    for w in weights.values():
        assert w.raw_score == pytest.approx(20.0)  # 1 / 0.05
        assert w.weight == pytest.approx(1 / 3)
        assert "floored at 0.05" in w.reason


def test_no_healthy_replica_gives_all_zero_without_dividing_by_zero() -> None:
    weights = compute_weights([inp("a", telemetry=tel("a"), health=0.0), inp("b", health=0.0)])
    assert {r: w.weight for r, w in weights.items()} == {"a": 0.0, "b": 0.0}
    assert "pool has no replica with a positive weight" in weights["a"].reason
    assert compute_weights([]) == {}


def test_missing_telemetry_renormalises_the_coefficients() -> None:
    w = one(inp("a", telemetry=None, latency=1000.0, queue=8.0))
    # (0.3*0.25 + 0.3*0.5) / 0.6 * 1.0 = 0.375
    assert w.components["denominator"] == pytest.approx(0.375)
    assert w.components["mem"] is None
    assert "mem missing (no telemetry)" in w.reason


def test_stale_telemetry_is_not_used() -> None:
    w = one(inp("a", telemetry=tel("a", queue_length=32), age=20.0, queue=None, latency=1000.0))
    assert w.components["mem"] is None and w.components["queue"] is None
    assert "telemetry stale, age 20 s" in w.reason and "queue missing" in w.reason
    assert w.components["denominator"] == pytest.approx(0.5)  # latency alone, rescaled


def test_queue_from_telemetry_when_events_lack_it() -> None:
    w = one(inp("a", telemetry=tel("a", queue_length=32), queue=None))
    assert w.components["queue"] == 1.0


def test_no_signal_at_all_counts_as_fully_loaded() -> None:
    d, _, notes = load_denominator(WeightInput("a", None), WeightConfig())
    assert d == 1.0 and "treated as fully loaded" in notes[-1]


def test_coefficients_are_configurable() -> None:
    config = WeightConfig.from_overrides({"mem_coef": "1", "queue_coef": "0", "latency_coef": "0"})
    assert one(inp(telemetry=tel(used=20 * GB)), config).components["denominator"] == pytest.approx(0.25)


signal = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e5, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(signal, signal, st.one_of(st.none(), st.floats(0.0, 2.0)), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=6,
    )
)
def test_weights_are_a_distribution_or_all_zero(rows: list[tuple[Any, ...]]) -> None:
    inputs = []
    for i, (latency, queue, mem_ratio, health) in enumerate(rows):
        telemetry = None if mem_ratio is None else tel(str(i), used=mem_ratio * 80 * GB)
        features = fv(str(i), latency=latency, queue=queue)
        inputs.append(WeightInput(str(i), features, telemetry, 1.0, health=health))
    weights = compute_weights(inputs)
    total = sum(w.weight for w in weights.values())
    assert total == pytest.approx(1.0) or total == 0.0
    assert all(0.0 <= w.weight <= 1.0 and w.raw_score <= 20.0 + 1e-9 for w in weights.values())


_maybe_float = st.one_of(st.none(), st.floats(0.0, 5000.0))


@st.composite
def _pool_row(draw: st.DrawFn, replica: str) -> tuple[WeightInput, FeatureVector]:
    has_summary = draw(st.booleans())
    features = FeatureVector(
        model="m", replica=replica, window_start=0.0, window_end=60.0, count=draw(st.integers(0, 100)),
        latency_mean=draw(st.one_of(_maybe_float, st.just(float("nan")))),
        queue_length_mean=draw(st.one_of(st.none(), st.floats(-1.0, 64.0), st.just(float("nan")))),
    ) if has_summary else None
    sample = draw(st.one_of(st.none(), st.builds(
        TelemetrySample, ts=st.just(59.0), replica=st.just(replica), source=st.sampled_from(["nvml", "vllm"]),
        memory_used_bytes=st.one_of(st.none(), st.floats(0.0, 100 * GB)),
        memory_total_bytes=st.one_of(st.none(), st.just(0.0), st.just(80 * GB)),
        queue_length=st.one_of(st.none(), st.integers(0, 64)),
    )))
    weight_input = WeightInput(
        replica=replica, features=features, telemetry=sample,
        telemetry_age_s=draw(st.one_of(st.none(), st.sampled_from([0.0, 5.0, 15.0, 30.0]))),
        health=draw(st.sampled_from([1.0, 1.0, 1.0, 0.9, 0.4, 0.0])), health_note=draw(st.sampled_from([None, "x"])),
    )
    empty = FeatureVector(model="m", replica=replica, window_start=0.0, window_end=60.0, count=0)
    return weight_input, features or empty


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 8), min_denominator=st.sampled_from([0.05, 0.5]))
def test_pool_weights_are_the_reference_bit_for_bit(data: st.DataObject, n: int, min_denominator: float) -> None:
    """The columnar path (the decider's) against the per-replica reference, on random pools."""
    from skewwatch.pipeline.detectors.step_columns import StepColumns
    from skewwatch.pipeline.weights import pool_weights

    config = WeightConfig(min_denominator=min_denominator)
    rows = [data.draw(_pool_row(f"r{i}")) for i in range(n)]
    inputs = [row for row, _ in rows]
    fresh = [i.telemetry if i.telemetry_age_s is not None and i.telemetry_age_s <= config.telemetry_max_age_s
             else None for i in inputs]
    step = StepColumns([vector for _, vector in rows], fresh)
    telemetry = {i.replica: (i.telemetry, i.telemetry_age_s) for i in inputs if i.telemetry is not None}
    got = pool_weights(step, [i.replica for i in inputs], telemetry,  # type: ignore[arg-type]
                       [(i.health, i.health_note) for i in inputs], config)
    # repr: NaN (a NaN queue mean is taken as a queue) equals NaN, and -0.0 differs from 0.0
    assert repr({r: w.to_dict() for r, w in got.items()}) == repr(
        {r: w.to_dict() for r, w in compute_weights(inputs, config).items()}
    )


def test_pool_weights_of_a_pool_of_usual_replicas_are_the_reference() -> None:
    """The all-columns path: every replica with fresh telemetry, every signal, healthy."""
    import random

    from skewwatch.pipeline.detectors.step_columns import StepColumns
    from skewwatch.pipeline.weights import pool_weights

    rng = random.Random(11)
    config = WeightConfig()
    for _ in range(200):
        n = rng.randint(1, 12)
        inputs = [inp(f"r{i}", telemetry=tel(f"r{i}", used=rng.uniform(0, 90) * GB), age=rng.uniform(0, 15),
                      latency=rng.uniform(0, 3000), queue=rng.uniform(0, 40)) for i in range(n)]
        step = StepColumns([i.features for i in inputs if i.features is not None], [i.telemetry for i in inputs])
        telemetry = {i.replica: (i.telemetry, i.telemetry_age_s) for i in inputs}
        got = pool_weights(step, [i.replica for i in inputs], telemetry,  # type: ignore[arg-type]
                           [(1.0, None)] * n, config)
        want = compute_weights(inputs, config)
        assert {r: w.to_dict() for r, w in got.items()} == {r: w.to_dict() for r, w in want.items()}


def test_pool_weights_without_telemetry_are_the_reference() -> None:
    """Pools with no telemetry at all (mem missing everywhere), some without queue or latency, a
    few unhealthy or idle replicas among them: columns and reference rows mixed."""
    import random

    from skewwatch.pipeline.detectors.step_columns import StepColumns
    from skewwatch.pipeline.weights import pool_weights

    rng = random.Random(12)
    config = WeightConfig()
    for trial in range(200):
        n = rng.randint(1, 40)
        inputs = [
            WeightInput(
                f"r{i}",
                fv(f"r{i}", latency=rng.choice([None, rng.uniform(0, 3000), rng.uniform(0, 30)]),
                   queue=rng.choice([None, rng.uniform(0, 40), 0.0])),
                None,
                None,
                health=1.0 if trial % 2 or rng.random() < 0.9 else rng.choice([0.0, 0.4, 0.9]),
                health_note=None,
            )
            for i in range(n)
        ]
        step = StepColumns([i.features for i in inputs if i.features is not None], [None] * n)
        got = pool_weights(step, [i.replica for i in inputs], {}, [(i.health, i.health_note) for i in inputs],
                           config)
        want = compute_weights(inputs, config)
        assert repr({r: w.to_dict() for r, w in got.items()}) == repr({r: w.to_dict() for r, w in want.items()})
    reasons = {w.reason for w in got.values()}
    assert reasons  # the last pool produced weights with reasons
    sample = pool_weights(StepColumns([fv("a")], [None]), ["a"], {}, [(1.0, None)], config)["a"]
    assert sample.reason == "mem missing (no telemetry)" and sample.components["mem"] is None
    assert sample.weight == 1.0 and sample.raw_score == pytest.approx(1 / 0.5)  # (0.3*0.5 + 0.3*0.5) / 0.6


def test_a_queue_of_minus_zero_is_zero_on_both_paths() -> None:
    """The property above found it: a window whose queue mean is -0.0 read -0.0 as columns, 0.0 as the reference."""
    from skewwatch.pipeline.detectors.step_columns import StepColumns
    from skewwatch.pipeline.weights import pool_weights

    vector = FeatureVector(model="m", replica="r0", window_start=0.0, window_end=60.0, count=0,
                           queue_length_mean=-0.0, latency_mean=200.0)
    config = WeightConfig()
    got = pool_weights(StepColumns([vector], [None]), ["r0"], {}, [(1.0, None)], config)
    want = compute_weights([WeightInput("r0", vector, None, None)], config)
    assert repr(got["r0"].to_dict()) == repr(want["r0"].to_dict())
    assert repr(got["r0"].components["queue"]) == "0.0"
