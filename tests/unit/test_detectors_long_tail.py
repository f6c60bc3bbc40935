"""long_tail -> WARNING, enable_tracing (seed §2.5).

The seed profile's rule: P99 > 3 × P50 for >= 3 consecutive steps. The default rules: the engine's
live per-token latencies against the replica's peers (or its own past), and the window's finished
requests as an exceedance test; both judged only with enough evidence."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from skewwatch.config import ConfigError
from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.pipeline.detectors.long_tail import LongTailDetector
from skewwatch.pipeline.detectors.long_tail_config import PROFILE_SEED, LongTailConfig
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


def seed_detector(**overrides: Any) -> LongTailDetector:
    return LongTailDetector(LongTailConfig.from_overrides({**PROFILE_SEED, **overrides}))


def fv(t: float, p99: float | None, p50: float | None = 100.0, count: int = 100, **kw: Any) -> FeatureVector:
    return FeatureVector(
        model="m", replica="r1", window_start=t - 60, window_end=t, count=count, latency_p50=p50, latency_p99=p99, **kw
    )


def feed(det: LongTailDetector, p99s: list[float | None], **kw: Any) -> list[list[Any]]:
    return [det.update(fv(60.0 + 5 * i, p, **kw), None, 60.0 + 5 * i).alerts for i, p in enumerate(p99s)]


def test_fires_on_the_seed_rule_after_three_steps() -> None:
    steps = feed(seed_detector(), [301.0, 301.0, 301.0])
    assert [len(s) for s in steps] == [0, 0, 1]
    alert = steps[2][0]
    assert (alert.severity, alert.state, alert.detector) == (Severity.WARNING, "open", "long_tail")
    assert alert.evidence["latency_p99_ms"] == 301.0 and alert.evidence["latency_p50_ms"] == 100.0
    assert alert.evidence["p99_over_p50"] == pytest.approx(3.01)
    assert "3.01 x p50" in alert.message


@pytest.mark.parametrize("p99", [300.0, 299.0, 150.0])
def test_does_not_fire_at_or_just_below_the_threshold(p99: float) -> None:
    det = seed_detector()
    assert not any(feed(det, [p99] * 10))
    assert det.open_alerts() == {}


def test_persistence_needs_consecutive_steps() -> None:
    det = seed_detector()
    assert not any(feed(det, [400.0, 400.0, 200.0, 400.0, 400.0, 200.0]))
    steps = feed(det, [400.0, 400.0, 400.0])
    assert [len(s) for s in steps] == [0, 0, 1]


def test_hysteresis_one_clean_step_keeps_it_open_two_resolve_it() -> None:
    det = seed_detector()
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
    det = seed_detector()
    feed(det, [400.0] * 3)
    for t in (100.0, 105.0):
        (action,) = det.update(fv(t, 400.0), None, t).actions
        assert (action.replica, action.action, action.params) == ("r1", "enable_tracing", {"sample_rate": 1.0})
        assert action.expires_at == t + 60.0


def test_small_windows_are_not_judged_unless_configured() -> None:
    assert not any(feed(seed_detector(), [900.0] * 5, count=19))
    det = seed_detector(min_count="1")
    assert any(feed(det, [900.0] * 5, count=2))


def test_missing_quantiles_make_no_claim_and_resolve_an_open_alert() -> None:
    det = seed_detector()
    feed(det, [400.0] * 3)
    assert det.update(fv(100.0, None), None, 100.0).alerts == []
    out = det.update(fv(105.0, None), None, 105.0)
    assert out.alerts[0].state == "resolved" and "signal missing" in out.alerts[0].message
    assert not any(feed(seed_detector(), [400.0] * 5, p50=None))


def test_thresholds_are_configurable_from_env_strings() -> None:
    config = LongTailConfig.from_overrides({**PROFILE_SEED, "ratio": "4", "persistence": "1", "clear_steps": "3"})
    assert (config.ratio, config.persistence, config.clear_steps) == (4.0, 1, 3)
    det = LongTailDetector(config)
    assert not any(feed(det, [400.0] * 3))
    assert len(det.update(fv(200.0, 401.0), None, 200.0).alerts) == 1


@pytest.mark.parametrize("overrides", [{"ratio": "1"}, {"persistence": "0"}, {"ratio": "x"}, {"sample_rate": 2},
                                       {"alpha": 0}, {"live_z": -1}, {"ttft_span_s": 1}])
def test_bad_config_is_rejected_with_the_setting_named(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="detectors.long_tail"):
        LongTailConfig.from_overrides(overrides)




# --- the default: live per-token latencies against the peers ----------------------------------------

POOL = ("r0", "r1", "r2", "r3")


def tel(end: float, replica: str, mean_ms: float = 25.0, p50_ms: float = 22.0, tokens: int = 800,
        ttft_p50_ms: float = 80.0, ttft_p99_ms: float = 200.0) -> TelemetrySample:
    return TelemetrySample(ts=end, replica=replica, source="vllm", tpot_count=tokens, tpot_mean_s=mean_ms / 1000,
                           tpot_p50_s=p50_ms / 1000, tpot_p99_s=4 * p50_ms / 1000, ttft_count=5,
                           ttft_mean_s=ttft_p50_ms / 1000, ttft_p50_s=ttft_p50_ms / 1000, ttft_p99_s=ttft_p99_ms / 1000)


def pool_vector(end: float, replica: str, count: int = 60, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"tpot_p50": 22.0, "tpot_p90": 24.0, "tpot_p99": 26.0, "tpot_max": 30.0,
                              "ttft_p50": 80.0, **kw}
    return FeatureVector(model="m", replica=replica, window_start=end - 60, window_end=end, count=count, **values)


def run_pool(det: LongTailDetector, steps: int, faulty: dict[str, Any] | None = None, from_step: int = 20,
             wobble: float = 0.0, telemetry: bool = True, vector: dict[str, Any] | None = None) -> list[Alert]:
    """``steps`` steps of a 4-replica pool; from ``from_step`` on r0's telemetry gets ``faulty`` and its
    vector ``vector``. ``wobble`` alternates every replica's mean TPOT by that share (noisy traffic)."""
    alerts: list[Alert] = []
    for i in range(steps):
        end = 1000.0 + 5 * i
        samples: list[TelemetrySample | None] = []
        vectors = []
        for j, replica in enumerate(POOL):
            mean = 25.0 * (1 + wobble * (1 if (i + j) % 2 else -1))
            kw = faulty if (faulty is not None and replica == "r0" and i >= from_step) else {}
            samples.append(tel(end, replica, **{"mean_ms": mean, **kw}) if telemetry else None)
            extra = vector if (vector is not None and replica == "r0" and i >= from_step) else {}
            vectors.append(pool_vector(end, replica, **extra))
        det.update_step(StepColumns(vectors, samples), end, alerts, [])
    return alerts


def test_live_a_tail_on_one_replica_opens_on_it_within_a_step() -> None:
    alerts = run_pool(LongTailDetector(), 24, faulty={"mean_ms": 60.0})
    assert [(a.replica, a.state, a.ts) for a in alerts] == [("r0", "open", 1000.0 + 5 * 20)]
    assert "live" in alerts[0].message and alerts[0].evidence["baseline"] == "peers"
    assert alerts[0].evidence["tail_excess"] > alerts[0].evidence["threshold"]


def test_live_a_replica_slowed_as_a_whole_is_not_a_tail() -> None:
    assert run_pool(LongTailDetector(), 30, faulty={"mean_ms": 75.0, "p50_ms": 66.0}) == []


def test_live_slow_first_tokens_mean_prefill_explains_the_slow_tokens() -> None:
    assert run_pool(LongTailDetector(), 30, faulty={"mean_ms": 60.0, "ttft_p99_ms": 4000.0}) == []
    assert run_pool(LongTailDetector(), 30, faulty={"mean_ms": 60.0, "ttft_p50_ms": 400.0, "ttft_p99_ms": 800.0}) == []


def test_live_slow_first_tokens_do_not_explain_away_an_open_tail() -> None:
    """A tail opens at step 20; from step 24 the requests behind its stalled ones queue (first tokens
    20 x the peers'): the alert stays open, where the same first tokens from the start stand the
    rule down (prefill)."""
    det, alerts = LongTailDetector(), []
    for i in range(36):
        end = 1000.0 + 5 * i
        slow = {"mean_ms": 60.0} if i >= 20 else {}
        queued = {"ttft_p50_ms": 1600.0, "ttft_p99_ms": 4000.0} if i >= 24 else {}
        samples: list[TelemetrySample | None] = [tel(end, r, **({**slow, **queued} if r == "r0" else {})) for r in POOL]
        det.update_step(StepColumns([pool_vector(end, r) for r in POOL], samples), end, alerts, [])
    assert [(a.replica, a.state) for a in alerts] == [("r0", "open")]
    assert det.open_alerts() and "queue behind the stalled ones" in det._state["m/r0"].rules[0].message
    queued_from_the_start = {"mean_ms": 60.0, "ttft_p50_ms": 1600.0, "ttft_p99_ms": 4000.0}
    assert run_pool(LongTailDetector(), 36, faulty=queued_from_the_start) == []


def test_live_the_threshold_follows_the_replicas_own_noise() -> None:
    # tokens 50 % slower than the peers on average (the live span's two scrapes both from step 31): on
    # steady traffic one step proves it; on traffic that swings +-40 % one step is ordinary, and only
    # the sum with the step a span before (half of its span slow) proves it
    steady = run_pool(LongTailDetector(), 40, faulty={"mean_ms": 25.0 * 1.5}, from_step=30)
    assert [a.ts for a in steady] == [1000.0 + 5 * 31]
    assert steady[0].evidence["tail_excess"] > steady[0].evidence["threshold"]
    noisy = run_pool(LongTailDetector(), 40, faulty={"mean_ms": 25.0 * 1.5}, from_step=30, wobble=0.4)
    assert [a.ts for a in noisy] == [1000.0 + 5 * 32]
    evidence = noisy[0].evidence
    assert evidence["tail_excess"] < evidence["threshold"] and evidence["live_sum"] > evidence["live_sum_threshold"]
    assert "summed over the last steps" in noisy[0].message
    # the same swings without the tail: nothing adds up
    assert run_pool(LongTailDetector(), 40, wobble=0.4) == []


def test_live_weak_steps_add_up_and_a_strong_one_alone_still_holds() -> None:
    det, cfg = LongTailDetector(), LongTailConfig()
    assert cfg.live_z - cfg.live_drift == pytest.approx(3.5)  # two steps at 3.25 sd, three at 2.7
    memory: dict[str, Any] = {}
    rule, span = det._live, cfg.live_span_s  # steps whose spans do not overlap are summed
    assert [rule._sum(memory, span * i, z) for i, z in enumerate((3.0, 3.0, 3.0))] == pytest.approx([1.5, 3.0, 4.5])
    assert rule._sum(memory, 2.5 * span, 9.0) == pytest.approx(4.5)  # overlaps the last one summed: nothing new
    assert rule._sum(memory, 3 * span, 0.0) == pytest.approx(3.0)  # a quiet step takes the drift off
    assert rule._sum(memory, 5.5 * span, 2.0) == pytest.approx(0.5)  # a gap of more than two spans ends the sum
    assert rule._sum(memory, 6.5 * span, 9.0) == cfg.live_z  # capped at one step's proof
    assert rule._sum(memory, 7 * span, None) == 0.0 and memory == {}  # prefill explains: the sum ends


def test_live_needs_evidence_tokens_history_and_finished_requests() -> None:
    assert run_pool(LongTailDetector(), 30, faulty={"mean_ms": 60.0, "tokens": 20}) == []  # < live_min_tokens
    # no history yet: nothing before live_history_steps judged steps (the tail still there after them adds up)
    assert all(a.ts >= 1000.0 + 5 * LongTailConfig().live_history_steps
               for a in run_pool(LongTailDetector(), 30, faulty={"mean_ms": 60.0}, from_step=5))
    assert run_pool(LongTailDetector(), 30, faulty={"mean_ms": 60.0}, vector={"count": 5}) == []


def test_live_without_peers_judges_against_its_own_past() -> None:
    det = LongTailDetector()
    alerts = []
    for i in range(45):  # its baseline and its noise need a minute of history each
        end = 1000.0 + 5 * i
        out = det.update(pool_vector(end, "r0"), tel(end, "r0", mean_ms=60.0 if i >= 40 else 25.0), end)
        alerts += out.alerts
    assert [(a.state, a.evidence["baseline"]) for a in alerts] == [("open", "own past")]


# --- the default without live signals: the exceedance test on finished requests -----------------------


def test_exceedance_a_tenth_of_many_requests_above_twice_the_peers_p99() -> None:
    alerts = run_pool(LongTailDetector(), 22, telemetry=False, vector={"count": 200, "tpot_p90": 60.0,
                                                                       "tpot_p99": 150.0, "tpot_max": 300.0})
    assert [(a.replica, a.state) for a in alerts] == [("r0", "open")]
    evidence = alerts[0].evidence
    assert evidence["exceeding"] == 21 and evidence["level_ms"] == pytest.approx(52.0)
    assert evidence["probability"] <= 1e-3 and evidence["reference"] == "peers"


def test_exceedance_needs_enough_requests_to_be_improbable() -> None:
    # the same shape on 30 requests: 4 above the level proves nothing against peers' P99 of 60 requests
    assert run_pool(LongTailDetector(), 22, telemetry=False, vector={"count": 30, "tpot_p90": 60.0,
                                                                     "tpot_p99": 150.0, "tpot_max": 300.0}) == []


def test_exceedance_a_shifted_median_is_a_slow_replica() -> None:
    assert run_pool(LongTailDetector(), 22, telemetry=False,
                    vector={"count": 200, "tpot_p50": 66.0, "tpot_p90": 70.0, "tpot_p99": 80.0}) == []


def test_exceedance_slow_first_tokens_raise_the_level_by_their_ratio() -> None:
    # first tokens 3 x the peers' (a queue, long prompts): the level is 3 x 2 x their P99 (156 ms);
    # a tenth of the requests at 60-150 ms is within what that explains, stalls at 20 x theirs are not
    queued = {"count": 200, "ttft_p50": 240.0}
    assert run_pool(LongTailDetector(), 22, telemetry=False,
                    vector={**queued, "tpot_p90": 60.0, "tpot_p99": 150.0, "tpot_max": 300.0}) == []
    alerts = run_pool(LongTailDetector(), 22, telemetry=False,
                      vector={**queued, "tpot_p90": 520.0, "tpot_p99": 900.0, "tpot_max": 1200.0})
    assert [(a.replica, a.state) for a in alerts] == [("r0", "open")]
    assert alerts[0].evidence["level_ms"] == pytest.approx(156.0) and alerts[0].evidence["exceeding"] == 21
    assert "first tokens 3.0 x slower than theirs: the level 3.0 x higher" in alerts[0].message


def test_exceedance_defers_to_the_live_rule_when_it_judged() -> None:
    slow_finished = {"count": 200, "tpot_p90": 60.0, "tpot_p99": 150.0, "tpot_max": 300.0}
    assert run_pool(LongTailDetector(), 22, vector=slow_finished) == []  # live says the tokens are fine now
    det = LongTailDetector(LongTailConfig(defer_to_live=False))
    assert [a.replica for a in run_pool(det, 22, vector=slow_finished)] == ["r0"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_a_window_of_one_to_five_requests_alerts_on_nothing(n: int) -> None:
    for det in (LongTailDetector(), seed_detector(min_count=1)):
        alerts = run_pool(det, 30, faulty={"mean_ms": 90.0}, vector={
            "count": n, "tpot_p90": 900.0, "tpot_p99": 900.0, "tpot_max": 900.0, "latency_p50": 100.0,
            "latency_p99": 9000.0}, from_step=0)
        if det.config.seed_rule:  # the seed's rule as written judges any window (min_count 1)
            continue
        assert alerts == [], n


# ---------------------------------------------------------------- the latency signal (request events alone)

_LATENCY = {"latency_p50": 800.0, "latency_p95": 1100.0, "latency_p99": 1250.0}


def run_latency_pool(r0: dict[str, Any], steps: int = 22, count: int = 250,
                     peers: dict[str, Any] | None = None) -> list[Alert]:
    """A 4-replica pool with no telemetry and steady TPOT; from step 20 r0's latency quantiles are ``r0``."""
    alerts: list[Alert] = []
    det = LongTailDetector()
    for i in range(steps):
        end = 1000.0 + 5 * i
        vectors = [pool_vector(end, replica, count=count,
                               **{**_LATENCY, **(peers or {}), **(r0 if replica == "r0" and i >= 20 else {})})
                   for replica in POOL]
        det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, [])
    return alerts


def test_latency_a_stall_the_tpot_does_not_show_opens_from_the_events_alone() -> None:
    # a twentieth of r0's requests stalled for seconds: its latency P95 is 4 x the peers' P99, its TPOT as theirs
    alerts = run_latency_pool({"latency_p95": 5000.0, "latency_p99": 9000.0})
    assert [(a.replica, a.state) for a in alerts] == [("r0", "open")]
    evidence = alerts[0].evidence
    assert evidence["signal"] == "latency" and evidence["exceeding"] == 14
    assert evidence["probability"] <= evidence["alpha"] == pytest.approx(5e-4)


def test_latency_a_few_slow_requests_prove_a_tail_only_where_the_peers_tail_is_steep() -> None:
    # 1 % of r0's requests above twice the peers' P99: improbable when their tail falls steeply past
    # their P95 (P99 only 14 % above it), not when it is heavy (P99 5 x their P95)
    assert [a.replica for a in run_latency_pool({"latency_p99": 3000.0}, count=600)] == ["r0"]
    heavy = {"latency_p95": 1100.0, "latency_p99": 5500.0}
    assert run_latency_pool({"latency_p99": 12000.0}, count=600, peers=heavy) == []


def test_latency_a_shifted_median_or_slow_first_tokens_is_no_tail() -> None:
    assert run_latency_pool({"latency_p50": 1500.0, "latency_p95": 5000.0, "latency_p99": 9000.0}) == []
    assert run_latency_pool({"latency_p95": 5000.0, "latency_p99": 9000.0, "ttft_p50": 400.0}) == []


def test_latency_signal_off_judges_tpot_alone() -> None:
    alerts: list[Alert] = []
    det = LongTailDetector(LongTailConfig(latency_signal=False))
    for i in range(22):
        end = 1000.0 + 5 * i
        vectors = [pool_vector(end, r, count=250, **{**_LATENCY, **({"latency_p95": 5000.0, "latency_p99": 9000.0}
                                                                  if r == "r0" and i >= 20 else {})}) for r in POOL]
        det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, [])
    assert alerts == []


# ---------------------------------------------------------------- the horizon rule (low rates)

LOW_RATE_POOL = [f"r{i}" for i in range(8)]


def run_low_rate_pool(minutes: float, stall: dict[str, float] | None = None, seed: int = 1,
                      det: LongTailDetector | None = None) -> tuple[list[Alert], LongTailDetector]:
    """An 8-replica pool finishing ~1.8 requests a minute each (windows of 0-4 requests: below every
    window rule's floor), log-normal TPOT around 20 ms. ``stall``: r0's requests stall with
    probability ``share`` by ``factor`` (from the start), or all of them are ``slow`` x slower."""
    rng = random.Random(seed)
    det = det or LongTailDetector()
    alerts: list[Alert] = []
    window: dict[str, list[tuple[float, float]]] = {r: [] for r in LOW_RATE_POOL}
    for i in range(int(minutes * 12)):
        end = 10_000.0 + 5 * i
        vectors = []
        for replica in LOW_RATE_POOL:
            step_tpot = []
            if rng.random() < 0.15:
                tpot = 20.0 * math.exp(rng.gauss(0.0, 0.3))
                if stall and replica == "r0":
                    if rng.random() < stall.get("share", 0.0):
                        tpot *= stall["factor"]
                    tpot *= stall.get("slow", 1.0)
                step_tpot.append(tpot)
            window[replica] = [(t, v) for t, v in window[replica] if t > end - 60] + [(end, v) for v in step_tpot]
            values = sorted(v for _, v in window[replica])
            vectors.append(FeatureVector(
                model="m", replica=replica, window_start=end - 60, window_end=end, count=len(values),
                step_count=len(step_tpot), step_tpot_max=max(step_tpot) if step_tpot else None,
                tpot_p50=values[len(values) // 2] if values else None, tpot_max=values[-1] if values else None))
        det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, [])
    return alerts, det


def test_horizon_a_few_stalled_requests_at_a_request_a_minute_open_on_the_replica() -> None:
    alerts, _ = run_low_rate_pool(15, stall={"share": 0.25, "factor": 10.0})
    opened = [a for a in alerts if a.state == "open"]
    assert opened and {a.replica for a in opened} == {"r0"}
    first = opened[0]
    assert first.evidence["signal"] == "TPOT over the horizon"
    assert first.evidence["horizon_hits"] >= 3 and first.evidence["horizon_probability"] <= 5e-4
    assert "of its peers'" in first.message


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_horizon_a_healthy_low_rate_pool_raises_nothing_in_two_hours(seed: int) -> None:
    alerts, _ = run_low_rate_pool(120, seed=seed)
    assert alerts == []


def test_horizon_a_replica_slower_as_a_whole_is_not_a_tail() -> None:
    alerts, _ = run_low_rate_pool(15, stall={"slow": 3.0})
    assert alerts == []


def test_horizon_off_or_without_the_newest_steps_slowest_makes_no_claim() -> None:
    alerts, _ = run_low_rate_pool(15, stall={"share": 0.25, "factor": 10.0},
                                  det=LongTailDetector(LongTailConfig(horizon_rule=False)))
    assert alerts == []
    assert seed_detector().config.horizon_rule is False  # the seed's rules are as they were
