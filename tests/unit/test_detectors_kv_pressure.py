"""kv_pressure (seed §2.4): fragmentation > 0.4 with a KV hit rate below its baseline (seed profile:
< 0.65) -> "fragmentation forces KV reloads"; tokens/s < 120 and hit > 0.85 while requests wait (seed
profile: waiting or not) -> "compute not saturated, check prefill scheduling"; silent when a signal
is missing, and on a window of fewer than 6 requests."""

from __future__ import annotations

from typing import Any

import pytest

from skewwatch.pipeline.detectors.alerts import Severity
from skewwatch.pipeline.detectors.kv_pressure import (
    FRAGMENTATION_MESSAGE,
    PREFILL_MESSAGE,
    PROFILE_SEED,
    KvPressureConfig,
    KvPressureDetector,
)
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


def seed_detector(**overrides: Any) -> KvPressureDetector:
    return KvPressureDetector(KvPressureConfig.from_overrides({**PROFILE_SEED, **overrides}))


def fv(t: float = 60.0, hit: float | None = 0.75, tps: float = 500.0, count: int = 100, replica: str = "r1",
       queue: float | None = None) -> FeatureVector:
    return FeatureVector(
        model="m",
        replica=replica,
        window_start=t - 60,
        window_end=t,
        count=count,
        tokens_per_s=tps,
        kv_cache_hit_rate_mean=hit,
        queue_length_mean=queue,
    )


def tel(frag: float | None = None, hit: float | None = None) -> TelemetrySample:
    kw: dict[str, Any] = {}
    if frag is not None:
        kw = {"memory_reserved_bytes": 100.0, "memory_allocated_bytes": 100.0 * (1.0 - frag)}
    return TelemetrySample(ts=60.0, replica="r1", source="vllm", kv_cache_hit_rate=hit, **kw)


def test_fragmentation_rule() -> None:
    out = seed_detector().update(fv(hit=0.64), tel(frag=0.41), 60.0)
    (alert,) = out.alerts
    assert alert.severity == Severity.WARNING and alert.evidence["rule"] == "fragmentation"
    assert alert.message.startswith(FRAGMENTATION_MESSAGE)
    assert alert.evidence["fragmentation"] == pytest.approx(0.41)
    assert out.actions == []  # a diagnosis: the seed names no action


@pytest.mark.parametrize(("frag", "hit"), [(0.4, 0.5), (0.39, 0.5), (0.6, 0.65), (0.6, 0.7)])
def test_fragmentation_rule_not_at_or_below_thresholds(frag: float, hit: float) -> None:
    assert seed_detector().update(fv(hit=hit), tel(frag=frag), 60.0).alerts == []


def test_prefill_rule() -> None:
    (alert,) = seed_detector().update(fv(hit=0.86, tps=119.0), None, 60.0).alerts
    assert alert.severity == Severity.INFO and alert.evidence["rule"] == "prefill"
    assert alert.message.startswith(PREFILL_MESSAGE)


@pytest.mark.parametrize(("tps", "hit"), [(120.0, 0.9), (119.0, 0.85), (500.0, 0.99)])
def test_prefill_rule_not_at_thresholds(tps: float, hit: float) -> None:
    assert seed_detector().update(fv(hit=hit, tps=tps), None, 60.0).alerts == []


def test_hit_rate_from_telemetry_when_events_lack_it_events_preferred() -> None:
    (alert,) = seed_detector().update(fv(hit=None), tel(frag=0.5, hit=0.5), 60.0).alerts
    assert alert.evidence["hit_rate_source"] == "telemetry"
    assert seed_detector().update(fv(hit=0.9), tel(frag=0.5, hit=0.5), 60.0).alerts == []


def test_silent_when_a_signal_is_missing() -> None:
    det = seed_detector()
    assert det.update(fv(hit=0.3), None, 60.0).alerts == []  # no fragmentation without telemetry
    assert det.update(fv(hit=0.3), tel(frag=None), 65.0).alerts == []  # telemetry without allocator fields
    assert det.update(fv(hit=None, tps=10.0), tel(frag=0.9), 70.0).alerts == []  # no hit rate at all


def test_no_alert_on_an_empty_window() -> None:
    det = seed_detector()
    assert det.update(fv(hit=None, tps=0.0, count=0), tel(frag=0.9, hit=0.95), 60.0).alerts == []


def test_rules_have_independent_hysteresis() -> None:
    det = seed_detector()
    assert [a.evidence["rule"] for a in det.update(fv(hit=0.5), tel(frag=0.6), 60.0).alerts] == ["fragmentation"]
    out = det.update(fv(hit=0.9, tps=50.0), tel(frag=0.6), 65.0)
    assert [(a.evidence["rule"], a.state) for a in out.alerts] == [("prefill", "open")]
    out = det.update(fv(hit=0.9, tps=50.0), tel(frag=0.6), 70.0)
    assert [(a.evidence["rule"], a.state) for a in out.alerts] == [("fragmentation", "resolved")]
    assert set(det.open_alerts()) == {"m/r1#prefill"}


def test_thresholds_are_configurable() -> None:
    det = seed_detector(throughput_threshold="1000")
    assert len(det.update(fv(hit=0.9, tps=500.0), None, 60.0).alerts) == 1


def test_column_screen_without_any_telemetry() -> None:
    """A pool with no fresh sample (the screen skips the telemetry columns): quiet exactly where
    evaluate() finds no rule holding, with rows on both sides of the prefill rule."""
    import random

    from skewwatch.pipeline.detectors.step_columns import StepColumns

    rng = random.Random(3)
    detector = KvPressureDetector(KvPressureConfig(require_waiting=False))
    vectors = [FeatureVector(model="m", replica=f"r{i}", window_start=0.0, window_end=60.0,
                             count=rng.choice([0, 1, 100]), tokens_per_s=rng.uniform(0, 300),
                             kv_cache_hit_rate_mean=rng.choice([None, rng.uniform(0.4, 1.0)])) for i in range(200)]
    quiet = detector.quiet(StepColumns(vectors, [None] * len(vectors))).tolist()
    holds = [any(f.holds for f in detector.evaluate(v, None, {}).values()) for v in vectors]
    assert quiet == [not h for h in holds] and 0 < sum(holds) < len(holds)


# --- the default: relative to the replica's peers or its own past, with the evidence floor ------------


def pool_step(det: KvPressureDetector, end: float, hits: list[float], frags: list[float],
              queues: list[float | None] | None = None, tps: float = 500.0) -> list[Any]:
    queues = queues or [None] * len(hits)
    vectors = [fv(end, hit=h, replica=f"r{i}", tps=tps, queue=q) for i, (h, q) in enumerate(zip(hits, queues,
                                                                                                  strict=True))]
    samples = [TelemetrySample(ts=end, replica=f"r{i}", source="vllm", memory_reserved_bytes=100.0,
                               memory_allocated_bytes=100.0 * (1 - f)) for i, f in enumerate(frags)]
    alerts: list[Any] = []
    det.update_step(StepColumns(vectors, samples), end, alerts, [])
    return alerts


def test_fragmentation_with_a_hit_rate_below_the_peers_opens_on_two_scrapes() -> None:
    det = KvPressureDetector()
    # the pool's traffic reuses prefixes well (0.9): 0.85 is low for it, however high the seed's 0.65 says
    assert pool_step(det, 60.0, [0.85, 0.9, 0.9, 0.9], [0.6, 0.1, 0.1, 0.1]) == []
    (alert,) = pool_step(det, 65.0, [0.85, 0.9, 0.9, 0.9], [0.6, 0.1, 0.1, 0.1])
    assert (alert.replica, alert.evidence["rule"], alert.evidence["baseline"]) == ("r0", "fragmentation", "peers")
    assert alert.evidence["baseline_hit_rate"] == pytest.approx(0.9)


def test_fragmentation_with_the_pools_own_hit_rate_is_no_reload() -> None:
    det = KvPressureDetector()
    for end in (60.0, 65.0, 70.0):  # 0.3 is this traffic's hit rate everywhere: not a reload (seed: < 0.65)
        assert pool_step(det, end, [0.31, 0.3, 0.3, 0.3], [0.6, 0.1, 0.1, 0.1]) == []


def test_prefill_needs_requests_waiting() -> None:
    det = KvPressureDetector()
    for end in (60.0, 65.0, 70.0):  # a replica sent little generates little: no diagnosis
        assert pool_step(det, end, [0.9] * 4, [0.1] * 4, queues=[0.0] * 4, tps=50.0) == []
    det = KvPressureDetector()
    alerts = [a for end in (60.0, 65.0) for a in pool_step(det, end, [0.9] * 4, [0.1] * 4,
                                                           queues=[3.0, 0.0, 0.0, 0.0], tps=50.0)]
    assert [(a.replica, a.evidence["rule"]) for a in alerts] == [("r0", "prefill")]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_a_window_of_one_to_five_requests_alerts_on_nothing(n: int) -> None:
    det = KvPressureDetector()
    for i in range(4):
        end = 60.0 + 5 * i
        out = det.update(fv(end, hit=0.1, tps=1.0, count=n, queue=5.0), tel(frag=0.9, hit=0.1), end)
        assert out.alerts == [], n


def test_fragmentation_on_a_thin_window_is_judged_against_the_peers() -> None:
    """The allocator's numbers do not thin out with the request rate: two requests a window are
    enough to say which way the hit rate went, against peers of as few; the prefill rule still
    needs ``min_count`` requests."""
    def thin_step(det: KvPressureDetector, end: float, hits: list[float], frags: list[float]) -> list[Any]:
        vectors = [fv(end, hit=h, replica=f"r{i}", tps=5.0, count=2, queue=3.0) for i, h in enumerate(hits)]
        samples = [TelemetrySample(ts=end, replica=f"r{i}", source="vllm", memory_reserved_bytes=100.0,
                                   memory_allocated_bytes=100.0 * (1 - f)) for i, f in enumerate(frags)]
        alerts: list[Any] = []
        det.update_step(StepColumns(vectors, samples), end, alerts, [])
        return alerts

    det = KvPressureDetector()
    alerts = [a for end in (60.0, 65.0) for a in thin_step(det, end, [0.3, 0.75, 0.74, 0.76], [0.6, 0.1, 0.1, 0.1])]
    assert [(a.replica, a.evidence["rule"]) for a in alerts] == [("r0", "fragmentation")]
    # the same thin windows at the pool's own hit rate (or without the fragmentation): nothing
    det = KvPressureDetector()
    assert [a for end in (60.0, 65.0) for a in thin_step(det, end, [0.76, 0.75, 0.74, 0.76],
                                                         [0.6, 0.1, 0.1, 0.1])] == []
    assert KvPressureDetector(KvPressureConfig(fragmentation_min_count=6)).config.fragmentation_min_count == 6
    det = KvPressureDetector(KvPressureConfig(fragmentation_min_count=6))
    assert [a for end in (60.0, 65.0) for a in thin_step(det, end, [0.3, 0.75, 0.74, 0.76],
                                                         [0.6, 0.1, 0.1, 0.1])] == []
