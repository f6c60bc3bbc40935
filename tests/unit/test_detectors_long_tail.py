"""long_tail: P99 > 3 × P50 for >= 3 consecutive steps -> WARNING, enable_tracing (seed §2.5)."""

from __future__ import annotations

from typing import Any

import pytest

from skewwatch.config import ConfigError
from skewwatch.pipeline.detectors.base import Severity
from skewwatch.pipeline.detectors.long_tail import LongTailConfig, LongTailDetector
from skewwatch.pipeline.features import FeatureVector


def fv(t: float, p99: float | None, p50: float | None = 100.0, count: int = 100, **kw: Any) -> FeatureVector:
    return FeatureVector(
        model="m", replica="r1", window_start=t - 60, window_end=t, count=count, latency_p50=p50, latency_p99=p99, **kw
    )


def feed(det: LongTailDetector, p99s: list[float | None], **kw: Any) -> list[list[Any]]:
    return [det.update(fv(60.0 + 5 * i, p, **kw), None, 60.0 + 5 * i).alerts for i, p in enumerate(p99s)]


def test_fires_on_the_seed_rule_after_three_steps() -> None:
    steps = feed(LongTailDetector(), [301.0, 301.0, 301.0])
    assert [len(s) for s in steps] == [0, 0, 1]
    alert = steps[2][0]
    assert (alert.severity, alert.state, alert.detector) == (Severity.WARNING, "open", "long_tail")
    assert alert.evidence["latency_p99_ms"] == 301.0 and alert.evidence["latency_p50_ms"] == 100.0
    assert alert.evidence["p99_over_p50"] == pytest.approx(3.01)
    assert "3.01 x p50" in alert.message


@pytest.mark.parametrize("p99", [300.0, 299.0, 150.0])
def test_does_not_fire_at_or_just_below_the_threshold(p99: float) -> None:
    det = LongTailDetector()
    assert not any(feed(det, [p99] * 10))
    assert det.open_alerts() == {}


def test_persistence_needs_consecutive_steps() -> None:
    det = LongTailDetector()
    assert not any(feed(det, [400.0, 400.0, 200.0, 400.0, 400.0, 200.0]))
    steps = feed(det, [400.0, 400.0, 400.0])
    assert [len(s) for s in steps] == [0, 0, 1]


def test_hysteresis_one_clean_step_keeps_it_open_two_resolve_it() -> None:
    det = LongTailDetector()
    feed(det, [400.0] * 3)
    out = det.update(fv(100.0, 200.0), None, 100.0)  # one clean step
    assert out.alerts == [] and [a.action for a in out.actions] == ["enable_tracing"]
    out = det.update(fv(105.0, 400.0), None, 105.0)  # holds again: no new open alert
    assert out.alerts == []
    assert det.update(fv(110.0, 200.0), None, 110.0).alerts == []
    out = det.update(fv(115.0, 200.0), None, 115.0)
    assert [(a.state, a.severity) for a in out.alerts] == [("resolved", Severity.WARNING)]
    assert "condition cleared" in out.alerts[0].message
    assert out.actions == []


def test_action_is_resent_every_step_with_expiry_ahead() -> None:
    det = LongTailDetector()
    feed(det, [400.0] * 3)
    for t in (100.0, 105.0):
        (action,) = det.update(fv(t, 400.0), None, t).actions
        assert (action.replica, action.action, action.params) == ("r1", "enable_tracing", {"sample_rate": 1.0})
        assert action.expires_at == t + 60.0


def test_small_windows_are_not_judged_unless_configured() -> None:
    assert not any(feed(LongTailDetector(), [900.0] * 5, count=19))
    det = LongTailDetector(LongTailConfig.from_overrides({"min_count": "1"}))
    assert any(feed(det, [900.0] * 5, count=2))


def test_missing_quantiles_make_no_claim_and_resolve_an_open_alert() -> None:
    det = LongTailDetector()
    feed(det, [400.0] * 3)
    assert det.update(fv(100.0, None), None, 100.0).alerts == []
    out = det.update(fv(105.0, None), None, 105.0)
    assert out.alerts[0].state == "resolved" and "signal missing" in out.alerts[0].message
    assert not any(feed(LongTailDetector(), [400.0] * 5, p50=None))


def test_thresholds_are_configurable_from_env_strings() -> None:
    config = LongTailConfig.from_overrides({"ratio": "4", "persistence": "1", "clear_steps": "3"})
    assert (config.ratio, config.persistence, config.clear_steps) == (4.0, 1, 3)
    det = LongTailDetector(config)
    assert not any(feed(det, [400.0] * 3))
    assert len(det.update(fv(200.0, 401.0), None, 200.0).alerts) == 1


@pytest.mark.parametrize("overrides", [{"ratio": "1"}, {"persistence": "0"}, {"ratio": "x"}, {"sample_rate": 2}])
def test_bad_config_is_rejected_with_the_setting_named(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="detectors.long_tail"):
        LongTailConfig.from_overrides(overrides)
