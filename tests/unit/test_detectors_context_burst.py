"""context_burst.

The seed profile's rule: token-length variance grows > 400 % against the window 60 s earlier
(previous variance 0: current > 1000) and the mean prompt length is > 2048 tokens -> INFO, prewarm;
both windows need the evidence floor. The default rule: the newest prompts against the replica's
peers and its own past, judged only with enough of them."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.pipeline.detectors.context_burst import (
    HISTORY_KEY,
    PROFILE_SEED,
    ContextBurstConfig,
    ContextBurstDetector,
)
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector

SEED = ContextBurstConfig.from_overrides(PROFILE_SEED)


def seed_detector(**overrides: Any) -> ContextBurstDetector:
    return ContextBurstDetector(ContextBurstConfig.from_overrides({**PROFILE_SEED, **overrides}))


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
    det = seed_detector()
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
    det = seed_detector()
    assert not any(run(det, [60_000.0] + [10_000.0] * 11 + [60_000.0]))
    # no change against 5 s earlier but 6x against 60 s earlier: burst
    det = seed_detector()
    alerts = run(det, [10_000.0] + [60_000.0] * 12)
    assert [i for i, a in enumerate(alerts) if a] == [12]


def test_missing_previous_window_makes_no_claim() -> None:
    det = seed_detector()
    det.update(fv(0.0, 10.0), None, 0.0)
    assert det.update(fv(65.0, 1e9), None, 65.0).alerts == []  # 60 s earlier (5.0) was never seen
    assert det.update(fv(120.0, 1e9), None, 120.0).alerts == []  # nor was 60.0
    det2 = seed_detector()
    det2.update(fv(0.0, None, count=0), None, 0.0)  # empty window 60 s earlier
    assert det2.update(fv(60.0, 1e9), None, 60.0).alerts == []


def test_resolves_once_the_burst_is_the_new_normal() -> None:
    det = seed_detector()
    alerts = run(det, [10_000.0] * 12 + [100_000.0] * 20)
    states = [(i, a.state) for i, step in enumerate(alerts) for a in step]
    # opens when the burst starts; 60 s later the previous window holds the burst too
    assert states == [(12, "open"), (25, "resolved")]


def test_history_is_bounded() -> None:
    for det in (seed_detector(), ContextBurstDetector()):
        run(det, [10_000.0] * 200)
        history = det.state_dict()["keys"]["m/r1"]["memory"][HISTORY_KEY]
        assert len(history) == 13


def test_completion_tokens_and_thresholds_are_configurable() -> None:
    det = seed_detector(tokens="completion", min_mean_tokens="0")
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


# -- the evidence floor ----------------------------------------------------------------------------


def test_one_request_then_two_is_no_variance_growth() -> None:
    """The seed's "previous variance 0 -> current > 1000" branch compared a window of one request
    (variance 0) with the next of two (any two prompts): both windows need the evidence floor."""
    for det in (seed_detector(), ContextBurstDetector()):
        out = [det.update(fv(5.0 * i, 0.0, 3000.0, count=1, recent_count=1, recent_prompt_tokens_mean=3000.0,
                             recent_prompt_tokens_var=0.0), None, 5.0 * i).alerts for i in range(12)]
        out.append(det.update(fv(60.0, 4_000_000.0, 5000.0, count=2, recent_count=2,
                                 recent_prompt_tokens_mean=5000.0, recent_prompt_tokens_var=4_000_000.0),
                              None, 60.0).alerts)
        assert not any(out)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_a_window_of_one_to_five_requests_alerts_on_nothing(n: int) -> None:
    for det in (seed_detector(), ContextBurstDetector()):
        for i in range(12):  # a long quiet past, then a handful of enormous prompts
            det.update(fv(5.0 * i, 10_000.0, 1000.0, **_recent(40, 1000.0)), None, 5.0 * i)
        assert det.update(fv(60.0, 1e10, 1e6, count=n, **_recent(n, 1e6)), None, 60.0).alerts == []


# -- the default rule: the newest 20 s against the peers and the replica's own past -----------------


def _recent(n: int, mean: float, cv: float = 0.8) -> dict[str, Any]:
    return {"recent_count": n, "recent_prompt_tokens_mean": mean, "recent_prompt_tokens_var": (cv * mean) ** 2}


def own_past_run(recent_mean: float, n: int = 20, base_mean: float = 1000.0) -> list[Alert]:
    """13 steps of ordinary prompts, then the newest 20 s at ``recent_mean``: the alerts of that step."""
    det = ContextBurstDetector()
    for i in range(13):
        assert det.update(fv(5.0 * i, (0.8 * base_mean) ** 2, base_mean, count=60, **_recent(20, base_mean)),
                          None, 5.0 * i).alerts == []
    return det.update(fv(65.0, (0.8 * base_mean) ** 2, base_mean, count=60, **_recent(n, recent_mean)),
                      None, 65.0).alerts


def test_prompts_far_longer_than_its_own_past_open_a_burst() -> None:
    (alert,) = own_past_run(8000.0)
    assert alert.state == "open" and alert.evidence["own_probability"] < 1e-4
    assert alert.evidence["own_mean_ratio"] == pytest.approx(8.0) and "own past" in alert.message


@pytest.mark.parametrize("base", [200.0, 15_000.0])
def test_the_rule_is_relative_to_the_traffic_not_a_token_count(base: float) -> None:
    assert own_past_run(8 * base, base_mean=base)  # 8x longer: a burst, short or long prompts
    assert not own_past_run(1.3 * base, base_mean=base)  # 30 % longer: no burst on any traffic


def test_a_significant_but_small_change_is_no_burst() -> None:
    # 200 newest prompts 50 % longer are improbable under the baseline, but not twice as long
    assert own_past_run(1500.0, n=200) == []


def step_with_peers(means: list[float], recent_means: list[float]) -> tuple[ContextBurstDetector, list[Alert]]:
    """One replica per mean; 13 quiet steps, then one step with ``recent_means``."""
    det = ContextBurstDetector()
    alerts: list[Alert] = []
    for i in range(14):
        end = 5.0 * i
        recent = recent_means if i == 13 else means
        vectors = [FeatureVector(model="m", replica=f"r{j}", window_start=end - 60, window_end=end, count=60,
                                 prompt_tokens_mean=m, prompt_tokens_var=(0.8 * m) ** 2, **_recent(20, r))
                   for j, (m, r) in enumerate(zip(means, recent, strict=True))]
        actions: list[Any] = []
        det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, actions)
    return det, alerts


def test_one_replica_bursting_in_its_pool_opens_on_it_alone() -> None:
    _, alerts = step_with_peers([1000.0] * 4, [8000.0, 1000.0, 1000.0, 1000.0])
    assert [(a.replica, a.state) for a in alerts] == [("r0", "open")]
    assert alerts[0].evidence["peers_mean_ratio"] == pytest.approx(8.0)


def test_the_whole_pool_getting_longer_prompts_is_traffic_not_a_burst() -> None:
    _, alerts = step_with_peers([1000.0] * 4, [8000.0] * 4)
    assert alerts == []


def thin_pool_step(r0_mean: float, n: int = 12) -> list[Alert]:
    """A pool whose prompts arrive seldom: ``n`` prompts a window on each replica (never the floor in
    the newest 20 s), no own past of ``baseline_min_count`` prompts; r0's window at ``r0_mean``."""
    det = ContextBurstDetector()
    alerts: list[Alert] = []
    vectors = [FeatureVector(model="m", replica=f"r{j}", window_start=0.0, window_end=60.0, count=n,
                             prompt_tokens_mean=r0_mean if j == 0 else 1000.0,
                             prompt_tokens_var=(0.8 * (r0_mean if j == 0 else 1000.0)) ** 2, **_recent(3, 1000.0))
               for j in range(4)]
    det.update_step(StepColumns(vectors, [None] * len(vectors)), 60.0, alerts, [])
    return alerts


def test_a_thin_replica_bursts_against_its_peers_alone_at_alpha_squared() -> None:
    (alert,) = thin_pool_step(8000.0)  # 12 prompts 8 x the peers' 36: far beyond alpha squared
    assert alert.replica == "r0" and alert.evidence["alpha"] == pytest.approx(1e-8)
    assert alert.evidence["peers_probability"] <= 1e-8 and "own_probability" not in alert.evidence
    # 3 x longer on 12 prompts clears alpha (1e-4) but not what two baselines together would
    from skewwatch.pipeline.detectors.evidence import lognormal_mean_tail

    assert 1e-8 < lognormal_mean_tail(3000.0, 1000.0, 800.0 ** 2, 12) <= 1e-4
    assert thin_pool_step(3000.0) == []


# ---------------------------------------------------------------- the horizon rule (prompts arrive seldom)

def run_seldom_pool(minutes: float, burst_from: float | None = None, seed: int = 1) -> list[Alert]:
    """An 8-replica pool sent ~1.2 prompts a minute each (windows of 0-4 prompts: below the window
    rules' floor), log-normal lengths around 1,500 tokens (cv 1.3); from ``burst_from`` minutes
    r0's prompts are 8 x longer."""
    rng = random.Random(seed)
    det = ContextBurstDetector()
    alerts: list[Alert] = []
    window: dict[str, list[tuple[float, float]]] = {f"r{i}": [] for i in range(8)}
    sigma = math.sqrt(math.log(1 + 1.3 ** 2))
    for i in range(int(minutes * 12)):
        end = 20_000.0 + 5 * i
        vectors = []
        for replica, held in window.items():
            if rng.random() < 0.1:
                length = 1500.0 * math.exp(rng.gauss(-sigma ** 2 / 2, sigma))
                if burst_from is not None and replica == "r0" and i >= burst_from * 12:
                    length *= 8.0
                held.append((end, length))
            held[:] = [(t, v) for t, v in held if t > end - 60]
            values = [v for _, v in held]
            mean = sum(values) / len(values) if values else None
            var = sum((v - mean) ** 2 for v in values) / len(values) if mean is not None else None
            vectors.append(FeatureVector(model="m", replica=replica, window_start=end - 60, window_end=end,
                                         count=len(values), prompt_tokens_mean=mean, prompt_tokens_var=var,
                                         recent_count=0))
        det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, [])
    return alerts


def test_horizon_prompts_eight_times_longer_at_a_prompt_a_minute_open_on_the_replica_in_minutes() -> None:
    alerts = [a for a in run_seldom_pool(20, burst_from=10) if a.state == "open"]
    assert alerts and {a.replica for a in alerts} == {"r0"}
    first = alerts[0]
    assert first.ts - (20_000.0 + 600) <= 420  # within seven minutes of the burst (a handful of prompts)
    assert first.evidence["span"].startswith("the last") and first.evidence["peers_mean_ratio"] >= 2.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_horizon_a_healthy_pool_sent_seldom_prompts_raises_nothing_in_two_hours(seed: int) -> None:
    assert run_seldom_pool(120, seed=seed) == []
