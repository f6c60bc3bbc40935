"""batch_collapse -> CRITICAL, adjust_batch_policy with the seed §4.2 controller's max_batch_size.

The seed profile's rule: std(batch_size) > 2 and mean fill < 30 %. The default: a stuck scheduler,
requests waiting that free batch slots and KV cache could take, improbable for arrivals within
one iteration, on two scrapes in a row."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from skewwatch.pipeline.batch_controller import BatchControllerConfig, recommend_batch_size
from skewwatch.pipeline.detectors.alerts import Severity
from skewwatch.pipeline.detectors.batch_collapse import PROFILE_SEED, BatchCollapseConfig, BatchCollapseDetector
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


def fv(t: float, std: float | None, fill: float | None, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"count": 100, "batch_size_mean": 6.0, "latency_p95": 100.0, "queue_length_mean": 12.0}
    values.update(kw)
    return FeatureVector(
        model="m", replica="r1", window_start=t - 60, window_end=t, batch_size_std=std, batch_fill_mean=fill, **values
    )


def seed_detector(**overrides: Any) -> BatchCollapseDetector:
    return BatchCollapseDetector(BatchCollapseConfig.from_overrides({**PROFILE_SEED, **overrides}))


def test_fires_on_the_seed_rule_immediately() -> None:
    out = seed_detector().update(fv(60.0, 2.01, 0.29), None, 60.0)
    (alert,) = out.alerts
    assert (alert.severity, alert.state, alert.detector) == (Severity.CRITICAL, "open", "batch_collapse")
    assert alert.evidence["batch_size_std"] == 2.01 and alert.evidence["batch_fill_mean"] == 0.29
    (action,) = out.actions
    assert action.action == "adjust_batch_policy" and action.params == {"max_batch_size": 12}


@pytest.mark.parametrize(("std", "fill"), [(2.0, 0.2), (1.0, 0.1), (3.0, 0.30), (3.0, 0.5), (None, 0.1), (3.0, None)])
def test_does_not_fire_at_or_just_outside_the_thresholds(std: float | None, fill: float | None) -> None:
    det = seed_detector()
    assert not any(det.update(fv(60.0 + 5 * i, std, fill), None, 60.0 + 5 * i).alerts for i in range(5))


def test_empty_window_is_not_judged() -> None:
    assert seed_detector().update(fv(60.0, 5.0, 0.1, count=0), None, 60.0).alerts == []


def test_resolves_after_two_clean_steps_and_params_follow_the_controller() -> None:
    det = seed_detector()
    det.update(fv(60.0, 3.0, 0.1), None, 60.0)
    out = det.update(fv(65.0, 3.0, 0.1, queue_length_mean=20.0), None, 65.0)
    assert out.actions[0].params == {"max_batch_size": 20}
    out = det.update(fv(70.0, 1.0, 0.5), None, 70.0)  # clearing: last recommendation stays in force
    assert out.alerts == [] and out.actions[0].params == {"max_batch_size": 20}
    out = det.update(fv(75.0, 1.0, 0.5), None, 75.0)
    assert [a.state for a in out.alerts] == ["resolved"] and out.actions == []


def test_gpu_utilisation_comes_from_telemetry() -> None:
    tel = TelemetrySample(ts=60.0, replica="r1", source="nvml", utilization_gpu=0.3)
    out = seed_detector().update(fv(60.0, 3.0, 0.1, queue_length_mean=20.0, latency_p95=150.0), tel, 60.0)
    assert out.actions[0].params == {"max_batch_size": 14}  # int(20 * 0.7)
    assert out.alerts[0].evidence["gpu_utilization"] == 0.3


def test_queue_length_falls_back_to_telemetry_then_batch_size() -> None:
    tel = TelemetrySample(ts=60.0, replica="r1", source="vllm", queue_length=7)
    out = seed_detector().update(fv(60.0, 3.0, 0.1, queue_length_mean=None), tel, 60.0)
    assert out.actions[0].params == {"max_batch_size": 7}
    assert out.alerts[0].evidence["queue_source"] == "telemetry"
    out = seed_detector().update(fv(60.0, 3.0, 0.1, queue_length_mean=None), None, 60.0)
    assert out.actions[0].params == {"max_batch_size": 6}
    assert out.alerts[0].evidence["queue_source"] == "batch_size_mean"


@pytest.mark.parametrize(
    ("queue", "util", "p95", "expected"),
    [
        (10, 0.3, 150.0, 7),  # shrink: int(10 * 0.7)
        (10, 0.3, 120.0, 10),  # P95 not > 120: base
        (10, 0.4, 150.0, 10),  # util not < 0.4: base
        (10, 0.9, 60.0, 13),  # grow: int(10 * 1.3)
        (10, 0.85, 60.0, 10),  # util not > 0.85
        (10, 0.9, 80.0, 10),  # P95 not < 80
        (50, 0.9, 60.0, 41),  # base clamped to 32, int(32 * 1.3)
        (0, 0.5, 100.0, 1),  # base clamped to 1
        (1, 0.3, 150.0, 1),  # the seed's int(0.7) = 0, guarded to 1
        (10.9, None, None, 10),  # unknown util / P95: base (truncated like the seed)
    ],
)
def test_seed_controller(queue: float, util: float | None, p95: float | None, expected: int) -> None:
    assert recommend_batch_size(queue, util, p95) == expected


def test_controller_growth_is_capped_at_64() -> None:
    config = BatchControllerConfig(queue_cap=60.0)
    assert recommend_batch_size(60, 0.9, 50.0, config) == 64
    assert BatchCollapseConfig.from_overrides({"queue_cap": "60"}).controller == config


def test_thresholds_are_configurable() -> None:
    det = seed_detector(std_threshold="1", fill_threshold="0.5")
    assert len(det.update(fv(60.0, 1.5, 0.4), None, 60.0).alerts) == 1


def test_silent_when_no_event_had_a_batch_size_contract_v1_1() -> None:
    """OTLP events without batch fields and no telemetry to derive them: the window's batch
    statistics are None, so the detector makes no claim rather than guess (no alert, no action)."""
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.schemas.requests.columns import RequestColumns

    windows = PartitionWindows(WindowSettings())
    rows = [{"request_id": f"q{i}", "ts": 100.0 + i * 0.5, "model": "m", "replica": "r1", "latency_ms": 50.0 + i,
             "prompt_tokens": 10, "completion_tokens": 5} for i in range(200)]  # no batch_size/batch_capacity
    windows.apply(RequestColumns.from_rows(rows))
    windows.advance_watermark(300.0)
    det = seed_detector()
    vectors = [step.features for step in windows.close_steps()]
    judged = [v for v in vectors if v.count > 0]
    assert len(judged) > 10 and all(v.batch_size_std is None and v.batch_fill_mean is None for v in judged)
    for v in vectors:
        out = det.update(v, None, v.window_end)
        assert out.alerts == [] and out.actions == []


# --- the default: a stuck scheduler (requests wait that a free slot and free KV could take)

STUCK = BatchCollapseConfig()


def tel(t: float, queue: int, running: int, kv_usage: float = 0.1, frag: float = 0.1,
        capacity: int | None = 32, tpot_s: float | None = 0.03) -> TelemetrySample:
    return TelemetrySample(ts=t, replica="r1", source="vllm", queue_length=queue, running_requests=running,
                           kv_cache_usage=kv_usage, batch_capacity=capacity, memory_reserved_bytes=10e9,
                           memory_allocated_bytes=10e9 * (1 - frag), tpot_count=None if tpot_s is None else 500,
                           tpot_mean_s=tpot_s)


def scrapes(det: BatchCollapseDetector, n: int, **kw: Any) -> list[Any]:
    """``n`` steps of the same telemetry (``tel`` keywords); the window: 100 requests a minute."""
    window = {k: kw.pop(k) for k in ("std", "fill") if k in kw}
    return [det.update(fv(60.0 + 5 * i, window.get("std", 0.5), window.get("fill", 0.3), rps=100 / 60),
                       tel(60.0 + 5 * i, **kw), 60.0 + 5 * i) for i in range(n)]


def test_stuck_rule_fires_on_requests_waiting_beside_free_slots_on_two_scrapes() -> None:
    first, second = scrapes(BatchCollapseDetector(STUCK), 2, queue=30, running=2)
    assert first.alerts == []  # one scrape: could be a burst that arrived within the iteration
    (alert,) = second.alerts
    assert alert.state == "open" and alert.evidence["stuck"] == 1 and alert.evidence["stuck_source"] == "telemetry"
    # 30 wait; 2 running hold 10 % of the KV cache: room for 18 more of their size
    assert alert.evidence["stuck_admissible"] == 18 and alert.evidence["stuck_probability"] < 1e-4
    assert "stuck scheduler" in alert.message and alert.evidence["stuck_fill"] == 2 / 32
    assert [a.action for a in second.actions] == ["adjust_batch_policy", "throttle"]


def test_stuck_rule_expects_as_many_waiting_as_arrive_within_an_iteration() -> None:
    # 100 requests a minute and 30 ms iterations: 0.1 expected (x 2); one waiting: 0.1 a scrape, never
    assert not any(o.alerts for o in scrapes(BatchCollapseDetector(STUCK), 6, queue=1, running=2))
    # 4 waiting: 1.9e-5 a scrape, two in a row (3.6e-10 <= 1e-8)
    assert [bool(o.alerts) for o in scrapes(BatchCollapseDetector(STUCK), 2, queue=4, running=2)] == [False, True]
    # an engine without per-token latency: a one-second iteration is assumed, 4 waiting are ordinary
    assert not any(o.alerts for o in scrapes(BatchCollapseDetector(STUCK), 4, queue=4, running=2, tpot_s=None))


def test_stuck_rule_sums_the_evidence_of_consecutive_scrapes() -> None:
    # 3 waiting: 6.7e-4 a scrape; two in a row are 4.5e-7 (> 1e-8), three 3e-10: the alert opens on the
    # third, carrying its evidence
    out = scrapes(BatchCollapseDetector(STUCK), 4, queue=3, running=2)
    assert [bool(o.alerts) for o in out] == [False, False, True, False]
    evidence = out[2].alerts[0].evidence
    assert evidence["stuck_scrapes"] == 3 and evidence["stuck_run_probability"] <= 1e-8 < evidence["stuck_probability"]
    assert "3 scrapes in a row" in out[2].alerts[0].message
    first, second = scrapes(BatchCollapseDetector(STUCK), 2, queue=30, running=2)  # each scrape at alpha
    assert "scrapes in a row" not in second.alerts[0].message and "<= 0.0001" in second.alerts[0].message
    # a scrape with nothing waiting ends the run: what came before it no longer counts
    det = BatchCollapseDetector(STUCK)
    seen = [det.update(fv(t, 0.5, 0.3, rps=100 / 60), tel(t, queue=q, running=2), t).alerts
            for t, q in zip((60.0, 65.0, 70.0, 75.0, 80.0, 85.0), (3, 3, 0, 3, 3, 3), strict=True)]
    assert [bool(a) for a in seen] == [False, False, False, False, False, True]


@pytest.mark.parametrize(("prompt", "opens"), [(1000.0, True), (4000.0, False)])
def test_summed_scrapes_prove_nothing_where_long_prompts_hold_admission(prompt: float, opens: bool) -> None:
    """Three scrapes of 3 waiting beside free slots (6.7e-4 each) in a pool whose engines report their
    queues: summed they open the alert, unless the replica's prompts are 4 x its peers' (a long
    prefill admits over several iterations)."""
    from skewwatch.pipeline.detectors.step_columns import StepColumns

    det, alerts = BatchCollapseDetector(STUCK), []
    for i in range(4):
        t = 60.0 + 5 * i
        vectors = [dataclasses.replace(fv(t, 0.5, 0.3, rps=100 / 60,
                                          prompt_tokens_mean=prompt if r == "r1" else 1000.0), replica=r)
                   for r in ("r1", "r2", "r3", "r4")]
        samples = [dataclasses.replace(tel(t, queue=3 if r == "r1" else 0, running=2), replica=r)
                   for r in ("r1", "r2", "r3", "r4")]
        det.update_step(StepColumns(vectors, samples), t, alerts, [])
    assert [(a.replica, a.ts) for a in alerts if a.state == "open"] == ([("r1", 70.0)] if opens else [])


def test_throttle_asks_the_router_to_throttle_while_the_alert_is_open() -> None:
    quiet = BatchCollapseDetector(msgspec.structs.replace(STUCK, throttle=False))
    assert [a.action for a in scrapes(quiet, 2, queue=30, running=2)[-1].actions] == ["adjust_batch_policy"]
    det = BatchCollapseDetector(STUCK)
    out = scrapes(det, 2, queue=30, running=2)[-1]
    throttle = out.actions[1]
    assert throttle.replica == "r1" and throttle.params == {} and throttle.severity == out.alerts[0].severity
    # the scheduler recovers: once the alert resolves, neither action is sent
    t = 65.0
    while det.open_alerts():
        t += 5.0
        out = det.update(fv(t, 0.5, 0.3), tel(t, queue=0, running=20), t)
    assert out.alerts[-1].state == "resolved" and out.actions == []


def test_the_seed_rule_is_off_by_default_and_judges_in_the_seed_profile() -> None:
    assert not any(o.alerts for o in scrapes(BatchCollapseDetector(), 3, queue=0, running=20, std=3.0, fill=0.1))
    assert scrapes(seed_detector(), 1, queue=0, running=20, std=3.0, fill=0.1)[0].alerts


@pytest.mark.parametrize(
    ("queue", "running", "kv_usage", "frag", "why"),
    [
        (30, 32, 0.9, 0.1, "full batch: a healthy engine under load"),
        (30, 2, 0.9, 0.1, "two long prompts hold 90 % of the KV cache: no room for another (context_burst)"),
        (30, 8, 0.35, 0.6, "fragmented allocator (kv_pressure)"),
        (0, 2, 0.1, 0.1, "nothing waits"),
    ],
)
def test_stuck_rule_stays_quiet_when_something_else_explains_the_small_batch(
        queue: int, running: int, kv_usage: float, frag: float, why: str) -> None:
    det = BatchCollapseDetector(STUCK)
    assert not any(o.alerts for o in scrapes(det, 5, queue=queue, running=running, kv_usage=kv_usage,
                                              frag=frag)), why


def test_stuck_rule_without_telemetry_reads_the_window_and_capacity_from_events() -> None:
    det = BatchCollapseDetector(STUCK)
    outs = [det.update(fv(60.0 + 5 * i, 1.0, 0.1, queue_length_mean=20.0), None, 60.0 + 5 * i) for i in range(2)]
    assert outs[-1].alerts[0].evidence["stuck_source"] == "events"
    quiet = BatchCollapseDetector(STUCK)
    assert not any(quiet.update(fv(60.0 + 5 * i, 1.0, 0.1, queue_length_mean=2.0), None, 60.0 + 5 * i).alerts
                   for i in range(3))
    # telemetry without batch_capacity: capacity = batch_size_mean / batch_fill_mean = 6 / 0.1875 = 32
    derived = BatchCollapseDetector(STUCK)
    outs = [derived.update(fv(60.0 + 5 * i, 1.0, 0.1875), tel(60.0 + 5 * i, queue=30, running=2, capacity=None),
                           60.0 + 5 * i) for i in range(2)]
    assert outs[-1].alerts[0].evidence["stuck_fill"] == pytest.approx(2 / 32)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_a_window_of_one_to_five_requests_alerts_on_nothing(n: int) -> None:
    det = BatchCollapseDetector()
    assert not any(det.update(fv(60.0 + 5 * i, 3.0, 0.05, count=n), tel(60.0 + 5 * i, queue=30, running=1),
                              60.0 + 5 * i).alerts for i in range(5))


def test_stuck_rule_config_is_validated() -> None:
    from skewwatch.config import ConfigError

    with pytest.raises(ConfigError, match="seed_rule"):
        BatchCollapseConfig.from_overrides({"stuck_rule": "false", "peer_rule": "false"})
    assert BatchCollapseConfig.from_overrides({"stuck_rule": "false"}).peer_rule  # one rule is enough
    with pytest.raises(ConfigError, match="stuck_fill_max"):
        BatchCollapseConfig.from_overrides({"stuck_fill_max": "0"})
    with pytest.raises(ConfigError, match="alpha"):
        BatchCollapseConfig.from_overrides({"alpha": "1"})


def _fleet_steps(injections: tuple[Any, ...], load: float, seed: int) -> list[tuple[FeatureVector, Any]]:
    """Per-replica feature vectors and the step's telemetry of a short fleet-simulator run."""
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.sim.fleet import FleetConfig, FleetSimulator

    sim = FleetSimulator(FleetConfig(replicas=4, load=load, seed=seed, injections=injections), 1_700_000_000.0, 240)
    windows = PartitionWindows(WindowSettings())
    steps = []
    for chunk in sim.chunks():
        windows.apply(chunk.requests)
        windows.advance_watermark(chunk.end_ts)
        samples = {s.replica: s for s in chunk.telemetry}
        steps += [(s.features, samples.get(s.features.replica or "")) for s in windows.close_steps()]
    return steps


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_stuck_rule_on_the_fleet_simulator_catches_the_fault_and_nothing_else(load: float) -> None:
    from skewwatch.sim.faults import Injection

    t0 = 1_700_000_000.0
    faults = (Injection("batch_collapse", "r1", 120, 90), Injection("context_burst", "r2", 120, 90),
              Injection("kv_pressure", "r3", 120, 90))
    det = BatchCollapseDetector(STUCK)
    opened: dict[str, float] = {}
    for features, sample in _fleet_steps(faults, load, seed=4):
        for alert in det.update(features, sample, features.window_end).alerts:
            if alert.state == "open":
                opened.setdefault(alert.replica or "", alert.ts - t0)
    assert set(opened) == {"r1"}, opened  # not r0 (clean), r2 (long prompts), r3 (fragmented KV)
    assert 120 < opened["r1"] <= 150


# ---------------------------------------------------------------- the peer rule (events without the engine's queue)

def run_pool_events(r0: dict[str, Any], steps: int = 4, telemetry: TelemetrySample | None = None) -> list[Any]:
    """A 4-replica pool of event windows (no queue in them) whose r0 has ``r0`` from the first step."""
    from skewwatch.pipeline.detectors.step_columns import StepColumns

    det, alerts = BatchCollapseDetector(), []
    base = {"batch_size_mean": 16.0, "batch_size_std": 2.0, "batch_fill_mean": 0.5, "ttft_p50": 150.0,
            "prompt_tokens_mean": 1000.0, "count": 300}
    for i in range(steps):
        end = 60.0 + 5 * i
        vectors = [FeatureVector(model="m", replica=r, window_start=end - 60, window_end=end,
                                 **{**base, **(r0 if r == "r0" else {})}) for r in ("r0", "r1", "r2", "r3")]
        samples = [telemetry if r == "r0" else None for r in ("r0", "r1", "r2", "r3")]
        det.update_step(StepColumns(vectors, samples), end, alerts, [])
    return alerts


def test_peer_rule_a_replica_whose_batches_empty_while_its_requests_wait() -> None:
    alerts = run_pool_events({"batch_size_mean": 3.0, "batch_fill_mean": 0.1, "ttft_p50": 600.0})
    assert [(a.replica, a.state, a.ts) for a in alerts] == [("r0", "open", 65.0)]  # persistence 2
    assert "against its peers" in alerts[0].message and alerts[0].evidence["peer_fill"] == pytest.approx(0.5)


@pytest.mark.parametrize("r0", [
    {"batch_size_mean": 3.0, "batch_fill_mean": 0.1},  # emptier batches, nothing waits: less traffic
    {"batch_size_mean": 3.0, "batch_fill_mean": 0.1, "ttft_p50": 600.0, "prompt_tokens_mean": 4000.0},  # long prompts
    {"batch_size_mean": 10.0, "batch_fill_mean": 0.3, "ttft_p50": 600.0},  # batches only somewhat smaller
])
def test_peer_rule_stays_quiet_when_the_pool_explains_it(r0: dict[str, Any]) -> None:
    assert run_pool_events(r0) == []


def test_peer_rule_leaves_an_engine_reporting_its_queue_to_the_stuck_rule() -> None:
    # the engine says nothing waits beside free slots: the events' small batches are not judged again
    engine = tel(60.0, queue=0, running=3)
    assert run_pool_events({"batch_size_mean": 3.0, "batch_fill_mean": 0.1, "ttft_p50": 600.0}, telemetry=engine) == []
