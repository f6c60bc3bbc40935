"""slow_replica: a replica whose every token is slower than its peers' alerts; a pool like itself,
thin windows, long prompts and a backlog do not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.pipeline.detectors.slow_replica import SlowReplicaConfig, SlowReplicaDetector
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector

PEERS = ("r0", "r2", "r3")


def on(**overrides: Any) -> SlowReplicaDetector:
    """The detector turned on (it is off by default)."""
    return SlowReplicaDetector(SlowReplicaConfig.from_overrides({"enabled": True, **overrides}))


def window(replica: str, end: float, p50: float | None, p90: float | None, n: int = 35,
           **fields: Any) -> FeatureVector:
    values: dict[str, Any] = {"model": "m", "replica": replica, "window_start": end - 60.0, "window_end": end,
                              "count": n, "tpot_p50": p50, "tpot_p90": p90, "prompt_tokens_mean": 800.0,
                              "ttft_p50": 200.0, "latency_p50": None if p50 is None else 300.0 * p50,
                              "latency_p95": None if p90 is None else 300.0 * p90}
    values.update(fields)
    return FeatureVector(**values)


def pool_step(det: SlowReplicaDetector, end: float, r1: FeatureVector,
              peers: tuple[str, ...] = PEERS, **peer_fields: Any) -> list[Alert]:
    """One step of a pool: r1 as given, its peers at a TPOT P50 of 10.5-11.5 ms and P90 13.5-14.5 ms."""
    vectors = [r1, *(window(r, end, 10.5 + 0.5 * i, 13.5 + 0.5 * i, **peer_fields) for i, r in enumerate(peers))]
    alerts: list[Alert] = []
    det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, [])
    return alerts


#: the steps a pool needs before its replicas' swings are known (a window length on the ring,
#: then a weight of baseline_steps in them, 14 steps): before, the peers' rule makes no claim
WARM = 12 + 14
START = 60.0 + 5 * WARM  # the first step after the warm-up


def warm(det: SlowReplicaDetector, **peer_fields: Any) -> None:
    """The pool's calm past: r1 like its peers, long enough for their swings to be known."""
    for i in range(WARM):
        assert not pool_step(det, 60.0 + 5 * i, window("r1", 60.0 + 5 * i, 11.0, 14.0), **peer_fields)


def run(det: SlowReplicaDetector, r1: Any, steps: int = 6, **peer_fields: Any) -> list[list[Alert]]:
    """``r1(end)`` gives the replica's window at each step, after the pool's calm past."""
    warm(det, **peer_fields)
    return [pool_step(det, START + 5 * i, r1(START + 5 * i), **peer_fields) for i in range(steps)]


def test_a_replica_twice_as_slow_as_its_peers_alerts_after_persistence() -> None:
    # the llama.cpp throttle: TPOT P50 23 ms against 10-12 ms, 35 requests a window
    det = on()
    steps = run(det, lambda end: window("r1", end, 23.0, 30.0))
    assert [len(a) for a in steps] == [0, 1, 0, 0, 0, 0]
    alert = steps[1][0]
    assert (alert.replica, alert.severity, alert.state) == ("r1", Severity.WARNING, "open")
    assert alert.evidence["baseline"] == "peers" and alert.evidence["signal"] == "tpot"
    assert alert.evidence["exceeding"] == 18 and alert.evidence["tail_bound"] < 1e-3
    assert alert.message.startswith("r1 decodes 2.1 x slower than its peers")
    assert det.open_alerts() == {"m/r1": Severity.WARNING}


def test_it_resolves_after_clear_steps() -> None:
    det = on()
    run(det, lambda end: window("r1", end, 23.0, 30.0), steps=3)
    resolved = [pool_step(det, START + 15 + 5 * i, window("r1", START + 15 + 5 * i, 11.0, 14.0)) for i in range(4)]
    assert [len(a) for a in resolved] == [0, 0, 0, 1] and resolved[-1][0].state == "resolved"


def test_the_number_that_fails_without_the_rule() -> None:
    # what the rule adds: the long tail's test does not see this replica (no request above 2 x the
    # peers' P99), and a replica a bucket or two above its peers' P90 is not news
    det = on()
    assert not any(run(det, lambda end: window("r1", end, 15.5, 19.0)))  # above P90, below 1.25 x it
    assert any(run(on(), lambda end: window("r1", end, 18.5, 24.0)))  # 1.25 x 14 ms


def test_a_clean_pool_does_not_alert() -> None:
    det = on()
    assert not any(run(det, lambda end: window("r1", end, 11.8, 14.8), steps=30))
    assert det.open_alerts() == {}


@pytest.mark.parametrize("n", [1, 5, 6, 9])
def test_a_thin_window_makes_no_claim(n: int) -> None:
    # half of 9 requests above a level a tenth of the peers' exceed: not improbable enough (1e-3)
    det = on()
    assert not any(run(det, lambda end: window("r1", end, 30.0, 40.0, n=n)))


def test_ten_requests_are_enough() -> None:
    assert any(run(on(), lambda end: window("r1", end, 30.0, 40.0, n=10)))


def test_long_prompts_stand_down() -> None:
    # prompts 2.5 x its peers': prefill slows every token of the batch (context_burst's)
    det = on()
    steps = run(det, lambda end: window("r1", end, 23.0, 30.0, prompt_tokens_mean=2000.0))
    assert not any(steps)
    # uncached prompt tokens: the same prompts with a KV hit rate of 0.2 where its peers' is 0.7
    det = on()
    steps = run(det, lambda end: window("r1", end, 23.0, 30.0, kv_cache_hit_rate_mean=0.2),
                kv_cache_hit_rate_mean=0.7)
    assert not any(steps)


def test_a_backlog_stands_down() -> None:
    # first tokens 10 x its peers' and tokens 2 x: requests waiting for a slot, not a slower GPU
    det = on()
    assert not any(run(det, lambda end: window("r1", end, 23.0, 30.0, ttft_p50=2000.0)))
    # first tokens as much slower as the tokens: a slower GPU
    assert any(run(on(), lambda end: window("r1", end, 23.0, 30.0, ttft_p50=500.0)))


def test_without_tpot_the_latency_judges() -> None:
    # events without a first-token time: no TPOT in the pool, the end-to-end latency instead
    det = on()
    steps = run(det, lambda end: window("r1", end, None, None, latency_p50=7000.0, latency_p95=9000.0),
                tpot_p50=None, tpot_p90=None)
    assert [len(a) for a in steps][:2] == [0, 1]
    assert steps[1][0].evidence["signal"] == "latency" and steps[1][0].message.startswith("r1 answers")


def test_without_peers_its_own_past_judges() -> None:
    det = on()
    alerts = [det.update(window("r1", 60.0 + 5 * i, 11.0, 14.0), None, 60.0 + 5 * i).alerts for i in range(14)]
    assert not any(alerts)  # 14 steps of its own past, like itself
    slow = [det.update(window("r1", 130.0 + 5 * i, 23.0, 30.0), None, 130.0 + 5 * i).alerts for i in range(3)]
    assert [len(a) for a in slow] == [0, 1, 0]
    assert slow[1][0].evidence["baseline"] == "own past"
    assert "than its own past" in slow[1][0].message


def test_without_peers_or_a_past_no_claim() -> None:
    det = on()
    assert not any(det.update(window("r1", 60.0 + 5 * i, 23.0, 30.0), None, 60.0 + 5 * i).alerts for i in range(8))


def test_off_by_default_and_in_the_seed_profile() -> None:
    seed = DetectorSettings.from_overrides({"profile": "seed"})
    assert seed.slow_replica.enabled is False and DetectorSettings().slow_replica.enabled is False
    assert DetectorSettings.from_overrides({"slow_replica": {"enabled": True}}).slow_replica.enabled is True
    for det in (SlowReplicaDetector(), SlowReplicaDetector(seed.slow_replica)):
        assert not any(run(det, lambda end: window("r1", end, 40.0, 50.0)))
        assert det.step_fields() == () and det.state_dict()["keys"] == {}
    det = SlowReplicaDetector(seed.slow_replica)
    assert not any(run(det, lambda end: window("r1", end, 40.0, 50.0)))
    assert det.step_fields() == () and det.state_dict()["keys"] == {}


def test_config_section() -> None:
    config = SlowReplicaConfig.from_overrides({"min_ratio": "1.5", "persistence": "3"})
    assert (config.min_ratio, config.persistence) == (1.5, 3)
    assert DetectorSettings.from_overrides({"slow_replica": {"enabled": "true"}}).slow_replica.enabled is True


def swinging_past(det: SlowReplicaDetector, replicas: tuple[str, ...] = ("r1", *PEERS), steps: int = 40,
                  low: float = 8.0, high: float = 16.0) -> float:
    """``steps`` steps of a pool whose replicas' TPOT P50 swing between ``low`` and ``high`` ms
    (each in its turn, never above its peers' P90 by a quarter): a swing of log 2 is their past.
    The next step's window end."""
    for i in range(steps):
        end = 60.0 + 5 * i
        vectors = [window(r, end, high if (i + j) % 2 else low, 1.3 * (high if (i + j) % 2 else low))
                   for j, r in enumerate(replicas)]
        alerts: list[Alert] = []
        det.update_step(StepColumns(vectors, [None] * len(vectors)), end, alerts, [])
        assert not alerts
    return 60.0 + 5 * steps


def test_a_replica_whose_tokens_swing_makes_no_claim_from_one_more_swing() -> None:
    # its TPOT P50 swings 8-16 ms (an sd of log 0.35): 2.3 x its peers' 11 ms is within 3 sd of
    # it, though 1.25 x above their P90; 3.6 x is not
    for p50, alerts in ((25.0, 0), (40.0, 1)):
        det = on()
        end = swinging_past(det, replicas=("r1",))  # alone: its own past, no peers' swings
        steps = [pool_step(det, end + 5 * i, window("r1", end + 5 * i, p50, 1.3 * p50)) for i in range(4)]
        found = [a for a in steps if a]
        assert len(found) == alerts
    evidence = found[0][0].evidence
    assert evidence["swing_from"] == "own past" and evidence["swing_sd"] == pytest.approx(0.35, abs=0.02)
    # the number that fails without it: no swing allowance, 2.3 x alerts
    det = on(swing_z=0.0)
    end = swinging_past(det, replicas=("r1",))
    assert any(pool_step(det, end + 5 * i, window("r1", end + 5 * i, 25.0, 32.5)) for i in range(4))


def test_a_replica_new_to_a_swinging_pool_is_judged_by_its_peers_swings() -> None:
    det = on()
    end = swinging_past(det, replicas=PEERS)  # r1 joins with no past of its own
    assert not any(pool_step(det, end + 5 * i, window("r1", end + 5 * i, 25.0, 32.5)) for i in range(4))
    alert = [a for i in range(4) for a in pool_step(det, end + 20 + 5 * i, window("r1", end + 20 + 5 * i, 40.0, 52.0))]
    assert len(alert) == 1 and alert[0].evidence["swing_from"] == "peers"


@pytest.mark.parametrize(("lag", "learned"), [(12, False), (1, True)])
def test_the_rising_windows_of_a_fault_are_not_its_past(lag: int, learned: bool) -> None:
    # calm for 40 steps, then its windows rise over 8 steps (below the rule) to 2.3 x its peers':
    # they wait a window length (swing_lag_steps) before they join its swings, and the rule holds
    # first, so its swings are still its calm past's (without the wait, they are in them)
    det = on(swing_lag_steps=lag)
    end = 60.0
    for i in range(48):
        p50 = 11.0 + 0.8 * max(0, i - 40)
        assert not pool_step(det, end, window("r1", end, p50, 1.3 * p50))
        end += 5
    alerts = [a for i in range(3) for a in pool_step(det, end + 5 * i, window("r1", end + 5 * i, 25.0, 32.5))]
    assert len(alerts) == 1 and (alerts[0].evidence["swing_sd"] > 0.01) is learned


def test_its_swings_survive_a_checkpoint() -> None:
    det = on()
    end = swinging_past(det, replicas=("r1",))
    pool_step(det, end, window("r1", end, None, None, latency_p50=3000.0, latency_p95=4000.0))  # no TPOT
    restored = on()
    restored.load_state(json.loads(json.dumps(det.state_dict(), allow_nan=False)))  # a checkpoint: no NaN
    assert restored.state_dict() == det.state_dict()
    for d in (det, restored):
        assert not any(pool_step(d, end + 5 * (i + 1), window("r1", end + 5 * (i + 1), 25.0, 32.5)) for i in range(4))
    assert restored.state_dict() == det.state_dict()
