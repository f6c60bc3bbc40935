"""context_burst: token-length variance grows > 400 % against the window 60 s earlier (previous
variance 0: current > 1000) and the mean prompt length is > 2048 tokens -> INFO, prewarm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.pipeline.detectors.context_burst import ContextBurstConfig, ContextBurstDetector
from skewwatch.schemas.feature_vector import FeatureVector


def fv(t: float, var: float | None, mean: float | None = 3000.0, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"count": 100}
    values.update(kw)
    return FeatureVector(
        model="m",
        replica="r1",
        window_start=t - 60,
        window_end=t,
        prompt_tokens_mean=mean,
        prompt_tokens_var=var,
        **values,
    )


def run(
    det: ContextBurstDetector, variances: Sequence[float | None], means: list[float] | None = None
) -> list[list[Alert]]:
    means = means or [3000.0] * len(variances)
    return [
        det.update(fv(5.0 * i, v, m), None, 5.0 * i).alerts
        for i, (v, m) in enumerate(zip(variances, means, strict=True))
    ]


def burst(prev: float, curr: float, mean: float = 3000.0) -> list[Alert]:
    """Steps 0..12 where step 12 is compared with step 0 (60 s earlier)."""
    det = ContextBurstDetector()
    alerts = run(det, [prev] * 12 + [curr], [3000.0] * 12 + [mean])
    assert not any(alerts[:12])
    return alerts[12]


def test_fires_on_growth_above_400_percent_on_long_contexts() -> None:
    (alert,) = burst(10_000.0, 50_001.0)
    assert (alert.severity, alert.state, alert.detector) == (Severity.INFO, "open", "context_burst")
    assert alert.evidence["previous_variance"] == 10_000.0 and alert.evidence["variance"] == 50_001.0
    assert alert.evidence["growth"] == pytest.approx(4.0001)


def test_does_not_fire_at_exactly_400_percent() -> None:
    assert burst(10_000.0, 50_000.0) == []


@pytest.mark.parametrize(("mean", "fires"), [(2048.0, False), (2049.0, True), (500.0, False)])
def test_the_window_must_be_long(mean: float, fires: bool) -> None:
    assert bool(burst(10_000.0, 100_000.0, mean=mean)) is fires


@pytest.mark.parametrize(("curr", "fires"), [(1000.0, False), (1001.0, True)])
def test_previous_variance_zero_uses_the_absolute_threshold(curr: float, fires: bool) -> None:
    assert bool(burst(0.0, curr)) is fires


def test_previous_window_is_the_one_60_s_earlier_not_5_s() -> None:
    # a jump against the window 5 s earlier but not against the one 60 s earlier: no burst
    det = ContextBurstDetector()
    assert not any(run(det, [60_000.0] + [10_000.0] * 11 + [60_000.0]))
    # no change against 5 s earlier but 6x against 60 s earlier: burst
    det = ContextBurstDetector()
    alerts = run(det, [10_000.0] + [60_000.0] * 12)
    assert [i for i, a in enumerate(alerts) if a] == [12]


def test_missing_previous_window_makes_no_claim() -> None:
    det = ContextBurstDetector()
    det.update(fv(0.0, 10.0), None, 0.0)
    assert det.update(fv(65.0, 1e9), None, 65.0).alerts == []  # 60 s earlier (5.0) was never seen
    assert det.update(fv(120.0, 1e9), None, 120.0).alerts == []  # nor was 60.0
    det2 = ContextBurstDetector()
    det2.update(fv(0.0, None, count=0), None, 0.0)  # empty window 60 s earlier
    assert det2.update(fv(60.0, 1e9), None, 60.0).alerts == []


def test_resolves_once_the_burst_is_the_new_normal() -> None:
    det = ContextBurstDetector()
    alerts = run(det, [10_000.0] * 12 + [100_000.0] * 20)
    states = [(i, a.state) for i, step in enumerate(alerts) for a in step]
    # opens when the burst starts; 60 s later the previous window holds the burst too
    assert states == [(12, "open"), (25, "resolved")]


def test_history_is_bounded() -> None:
    det = ContextBurstDetector()
    run(det, [10_000.0] * 200)
    history = det.state_dict()["keys"]["m/r1"]["memory"]["var_by_end_ms"]
    assert len(history) == 13


def test_completion_tokens_and_thresholds_are_configurable() -> None:
    det = ContextBurstDetector(ContextBurstConfig.from_overrides({"tokens": "completion", "min_mean_tokens": "0"}))
    for i in range(12):
        det.update(
            FeatureVector(
                model="m",
                replica="r1",
                window_start=0,
                window_end=5.0 * i,
                count=10,
                completion_tokens_mean=100.0,
                completion_tokens_var=100.0,
            ),
            None,
            5.0 * i,
        )
    out = det.update(
        FeatureVector(
            model="m",
            replica="r1",
            window_start=0,
            window_end=60.0,
            count=10,
            completion_tokens_mean=100.0,
            completion_tokens_var=600.0,
        ),
        None,
        60.0,
    )
    assert [a.state for a in out.alerts] == ["open"]
    assert out.actions[0].action == "prewarm_tokenizer_cache"
    assert out.actions[0].params == {"tokens_mean": 100, "tokens_std": 24}


# -- recent_window (ours, off by default) -----------------------------------------------------------

RECENT = ContextBurstConfig(recent_window=True)


def rv(t: float, var: float, recent_var: float, recent_mean: float, recent_count: int = 40,
       mean: float = 1000.0) -> FeatureVector:
    return fv(t, var, mean, recent_count=recent_count, recent_prompt_tokens_mean=recent_mean,
              recent_prompt_tokens_var=recent_var)


def test_recent_window_fires_on_the_last_20_s_against_the_window_that_ended_then() -> None:
    det = ContextBurstDetector(RECENT)
    quiet = [rv(5.0 * i, 10_000.0, 10_000.0, 800.0) for i in range(12)]
    assert not any(det.update(w, None, w.window_end).alerts for w in quiet)
    # the 60 s window itself is still short on average (the seed's rule would not fire) ...
    (alert,) = det.update(rv(60.0, 30_000.0, 50_001.0, 2100.0), None, 60.0).alerts
    assert alert.state == "open" and alert.evidence["previous_variance"] == 10_000.0  # the window ending at 40
    assert alert.evidence["recent_count"] == 40 and "last 20 s" in alert.message
    assert not ContextBurstDetector().update(rv(60.0, 30_000.0, 50_001.0, 2100.0), None, 60.0).alerts


def test_recent_window_keeps_the_seed_thresholds_and_needs_enough_requests() -> None:
    def last(window: FeatureVector) -> list[Alert]:
        det = ContextBurstDetector(RECENT)
        for i in range(12):
            det.update(rv(5.0 * i, 10_000.0, 10_000.0, 800.0), None, 5.0 * i)
        return det.update(window, None, 60.0).alerts

    assert last(rv(60.0, 10_000.0, 50_000.0, 3000.0)) == []  # growth exactly 400 %
    assert last(rv(60.0, 10_000.0, 90_000.0, 2048.0)) == []  # mean exactly 2048
    assert last(rv(60.0, 10_000.0, 90_000.0, 3000.0, recent_count=14)) == []  # too few recent requests
    assert len(last(rv(60.0, 10_000.0, 90_000.0, 3000.0, recent_count=15))) == 1


def test_recent_window_needs_prompt_tokens() -> None:
    from skewwatch.config import ConfigError

    with pytest.raises(ConfigError, match="recent_window"):
        ContextBurstConfig.from_overrides({"recent_window": True, "tokens": "completion"})
