"""ModelDecider (one model's step), DetectorSettings and routing corrections."""

from __future__ import annotations

import json
import random
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from skewwatch.config import ConfigError, load_settings
from skewwatch.pipeline.corrections import (
    publish_reason,
    should_publish,
    step_seq,
)
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.alerts import Action, Severity
from skewwatch.pipeline.detectors.registry import DETECTORS
from skewwatch.pipeline.model_decisions import ModelDecider, StepDecision
from skewwatch.schemas.corrections import RoutingCorrection
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

T0 = 1_700_000_000.0
REPLICAS = ("r1", "r2", "r3")
# the seed's rules (a fault they see in one step's vector): the decider's own behaviour, not a rule's
SEED = DetectorSettings.from_overrides({"profile": "seed"})


def fv(replica: str, t: float, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {
        "count": 200,
        "step_count": 15,
        "latency_p50": 100.0,
        "latency_p95": 150.0,
        "latency_p99": 200.0,
        "latency_mean": 120.0,
        "batch_size_std": 1.0,
        "batch_fill_mean": 0.6,
        "batch_size_mean": 8.0,
        "prompt_tokens_mean": 500.0,
        "prompt_tokens_var": 10_000.0,
        "tokens_per_s": 400.0,
        "kv_cache_hit_rate_mean": 0.75,
        "queue_length_mean": 4.0,
    }
    values.update(kw)
    return FeatureVector(model="m", replica=replica, window_start=t - 60, window_end=t, **values)


def model_fv(t: float, **kw: Any) -> FeatureVector:
    vector = fv("x", t, **kw)
    vector.replica = None
    return vector


def step(
    decider: ModelDecider,
    i: int,
    faults: dict[str, dict[str, Any]] | None = None,
    replicas: tuple[str, ...] = REPLICAS,
    telemetry: dict[str, tuple[TelemetrySample, float]] | None = None,
) -> StepDecision:
    t = T0 + 5.0 * i
    faults = faults or {}
    vectors = [fv(r, t, **faults.get(r, {})) for r in replicas]
    return decider.step("m", t, vectors, model_fv(t), telemetry or {})


def test_a_fault_on_one_replica_alerts_and_acts_on_that_replica_only() -> None:
    decider = ModelDecider(SEED)
    alerts, actions = [], []
    for i in range(10):
        d = step(decider, i, {"r2": {"latency_p99": 900.0}})
        alerts += d.alerts
        actions += d.current.actions if d.current else []
    assert {(a.replica, a.detector, a.state) for a in alerts} == {("r2", "long_tail", "open")}
    assert {(a.replica, a.action) for a in actions} == {("r2", "enable_tracing")}
    assert decider.open_alerts() == {("long_tail", "WARNING"): 1}


def test_gpu_fault_drains_and_drops_the_weight() -> None:
    decider = ModelDecider()
    step(decider, 0)
    d = step(decider, 1, {"r3": {"step_cuda_errors": {"cudaErrorIllegalAddress": 2}}})
    assert d.health == {"r1": 1.0, "r2": 1.0, "r3": 0.0}
    assert d.weights["r3"].weight == 0.0 and "drain: cudaErrorIllegalAddress" in d.weights["r3"].reason
    assert d.weights["r1"].weight == pytest.approx(0.5)
    assert d.correction is not None and d.publish_reason == "weights changed"
    (action,) = d.correction.actions
    assert (action.replica, action.action, action.severity) == ("r3", "drain", Severity.CRITICAL)
    assert [a.severity for a in d.alerts] == [Severity.CRITICAL]


def test_seq_is_event_time_and_strictly_increasing_across_forced_publishes() -> None:
    decider = ModelDecider()
    assert decider.publish_now() is None
    d = step(decider, 0)
    assert d.correction is not None and d.correction.seq == round(T0 * 1000)
    # published already: the same record again, never a new seq for the same step
    assert decider.publish_now() == d.correction
    seqs = []
    for i in range(1, 20):
        d = step(decider, i, {"r1": {"latency_mean": 100.0 if i % 2 else 1500.0}})  # weights move every step
        assert d.correction is not None
        seqs.append(d.correction.seq)
    assert seqs == [round((T0 + 5.0 * i) * 1000) for i in range(1, 20)]


def test_publish_now_publishes_the_latest_step_with_its_own_seq() -> None:
    decider = ModelDecider()
    first = step(decider, 0).correction
    quiet = step(decider, 1)  # nothing changed: not published
    assert quiet.correction is None and quiet.current is not None and quiet.current.seq == round((T0 + 5) * 1000)
    assert decider.last_published == first
    forced = decider.publish_now()
    # the step's own correction (its weights, its ts, its seq), not the previous one with seq + 1
    assert forced == quiet.current and decider.last_published == quiet.current
    assert decider.publish_now() == forced  # twice: the same record
    later = step(decider, 2, {"r1": {"latency_mean": 1500.0}}).correction
    assert later is not None and later.seq == round((T0 + 10) * 1000) > forced.seq


def test_a_forced_publish_keeps_the_event_time_heartbeat() -> None:
    decider = ModelDecider()
    step(decider, 0)
    step(decider, 1)
    decider.publish_now()  # the step at T0 + 5 goes out: the heartbeat counts from there
    reasons = [step(decider, i).publish_reason for i in range(2, 9)]
    assert reasons == [None] * 5 + ["heartbeat", None]


def test_publishes_on_change_and_heartbeat_only() -> None:
    decider = ModelDecider(SEED)
    reasons = [step(decider, i).publish_reason for i in range(14)]
    # first, then nothing changes: a heartbeat every 30 s (6 steps)
    assert reasons == ["first"] + [None] * 5 + ["heartbeat"] + [None] * 5 + ["heartbeat", None]
    d = step(decider, 14, {"r1": {"batch_size_std": 5.0, "batch_fill_mean": 0.1}})
    assert d.publish_reason == "actions changed"
    assert [a.action for a in d.correction.actions] == ["adjust_batch_policy"]  # type: ignore[union-attr]


def test_silent_replica_is_held_then_stale_then_back_then_released() -> None:
    settings = DetectorSettings.from_overrides({"decider": {"release_after_s": "60"}})
    decider = ModelDecider(settings)
    step(decider, 0)
    weights = []
    for i in range(1, 16):
        d = step(decider, i, replicas=("r1", "r2"))
        weights.append(d.weights.get("r3"))
        assert sum(w.weight for w in d.weights.values()) == pytest.approx(1.0)
    # 200 requests a minute: its weight is held while the silence is plausible (not "fully loaded")
    assert all(w is not None and w.weight == pytest.approx(1 / 3) and w.reason.startswith("held")
               for w in weights[:2])
    # at 15 s a silence is improbable at its rate: stale, ejected for the base ejection time (30 s)
    assert all(w is not None and w.weight == 0.0 for w in weights[2:8])
    assert weights[2] is not None and "stale: no request for 15 s" in weights[2].reason
    assert "ejected (stale) until" in weights[2].reason
    # then routed again (its silence while out says nothing), on probation: a probing share below its
    # peers until a request shows it serves ...
    assert weights[8] is not None and 0.0 < weights[8].weight < 1 / 3
    assert "demoted: back from an ejection, no request since" in weights[8].reason
    # ... and released 60 s after its last request
    assert weights[10] is not None
    assert weights[11] is None and "r3" not in decider.replicas


def test_a_replica_back_from_an_ejection_is_on_probation_until_a_request_of_its_own() -> None:
    """A silent replica (its events lost, say) is ejected; when the ejection ends it gets a probing
    share, below every healthy replica, for as long as it shows no request, and its full share on
    the step after one."""
    decider = ModelDecider()
    weights: list[float] = []
    peers: list[float] = []
    for i in range(14):
        silent = 1 <= i < 11
        d = step(decider, i, {"r3": {"step_count": 0}} if silent else {})
        weights.append(d.weights["r3"].weight)
        peers.append(min(d.weights["r1"].weight, d.weights["r2"].weight))
    assert all(w == 0.0 for w in weights[3:9])  # stale at 15 s, ejected for 30 s
    assert all(0.0 < weights[i] < peers[i] for i in (9, 10))  # back, silent still: probing share
    assert weights[11] == pytest.approx(1 / 3) and weights[13] == pytest.approx(1 / 3)  # it served


def test_a_replica_back_from_an_ejection_after_stage_1_let_it_go_is_judged_on_its_requests() -> None:
    # r3's engine hangs: no request and no telemetry; stage 1 reports it without requests, then (no
    # request for 90 s) not at all, and its telemetry with it. Once its ejection ends it must be routed
    # again, or a replica whose engine came back while it was out would be ejected again at once,
    # forever (it is sent nothing, so it can never show a request)
    decider = ModelDecider()

    def engines(names: tuple[str, ...], t: float) -> dict[str, tuple[TelemetrySample, float]]:
        return {r: (TelemetrySample(ts=t, replica=r, source="vllm", queue_length=1), 0.0) for r in names}

    weights: list[float | None] = []
    for i in range(80):
        t = T0 + 5.0 * i
        if i < 6:
            d = step(decider, i, telemetry=engines(REPLICAS, t))
        elif i < 24:  # silent and its engine quiet, still reported
            d = step(decider, i, {"r3": {"step_count": 0}}, telemetry=engines(("r1", "r2"), t))
        else:  # no longer reported at all
            d = step(decider, i, replicas=("r1", "r2"), telemetry=engines(("r1", "r2"), t))
        w = d.weights.get("r3")
        weights.append(None if w is None else w.weight)
    assert any(w == 0.0 for w in weights[6:24])  # stale: its engine went quiet with its requests
    # after stage 1 let it go, the next ejection's end routes it again, for more than one step
    back = [i for i in range(25, 80) if weights[i] and weights[i - 1] == 0.0]
    assert back and weights[back[0] + 1], weights


def test_a_replica_with_empty_steps_is_held_then_stale() -> None:
    decider = ModelDecider()
    for i in range(4):
        d = step(decider, i, {"r1": {"step_count": 0}} if i else {})
    assert d.weights["r1"].weight == 0.0 and "stale" in d.weights["r1"].reason
    assert d.current is not None and d.current.mode == "normal"


def test_a_stale_replica_is_an_alert_until_it_serves_again_and_is_not_demoted_by_it() -> None:
    decider = ModelDecider()
    opened, resolved, weights = [], [], []
    for i in range(60):
        silent = 1 <= i < 40  # r1 finishes nothing for 195 s while its peers go on
        d = step(decider, i, {"r1": {"step_count": 0}} if silent else {})
        opened += [(i, a) for a in d.alerts if a.detector == "stale" and a.state == "open"]
        resolved += [(i, a) for a in d.alerts if a.detector == "stale" and a.state == "resolved"]
        weights.append(d.weights["r1"].weight)
    # one alert on r1 through its ejections and the probations between them, not one per ejection
    assert [(i, a.replica, str(a.severity)) for i, a in opened] == [(opened[0][0], "r1", "WARNING")]
    assert opened[0][0] <= 4 and "stale" in opened[0][1].message
    assert weights[opened[0][0]] == 0.0  # ejected on the step it opened
    # resolved on its first request once its ejection is over (on probation until then, a probing
    # share), and it gets its share back at once: the alert held no demotion of its own
    assert [(a.replica, a.message) for _, a in resolved] == [("r1", "resolved: it finishes requests again")]
    back = resolved[0][0]
    assert back >= 40 and 0.0 < weights[back - 1] < weights[back]
    assert weights[-1] > 0.25
    assert decider.open_alerts() == {}
    restored = ModelDecider.from_state(decider.state_dict())
    assert restored.state_dict() == decider.state_dict()


def test_alerts_of_a_vanished_replica_resolve() -> None:
    decider = ModelDecider(SEED)
    for i in range(3):
        step(decider, i, {"r2": {"latency_p99": 900.0}})
    assert decider.open_alerts()
    alerts = [a for i in range(3, 6) for a in step(decider, i, replicas=("r1", "r3")).alerts]
    others = [(a.replica, a.detector, a.state) for a in alerts if a.detector != "stale"]
    assert others == [("r2", "long_tail", "resolved")]
    # its requests stopped while its peers' went on: stale, an alert of its own
    assert [(a.replica, a.state) for a in alerts if a.detector == "stale"] == [("r2", "open")]


def test_stale_telemetry_is_not_given_to_the_detectors() -> None:
    def frag(age: float) -> dict[str, tuple[TelemetrySample, float]]:
        sample = TelemetrySample(
            ts=T0, replica="r1", source="vllm", memory_reserved_bytes=10.0, memory_allocated_bytes=4.0
        )
        return {"r1": (sample, age)}

    faults = {"r1": {"kv_cache_hit_rate_mean": 0.5}}
    assert step(ModelDecider(SEED), 0, faults, telemetry=frag(20.0)).alerts == []
    (alert,) = step(ModelDecider(SEED), 0, faults, telemetry=frag(5.0)).alerts
    assert (alert.detector, alert.evidence["rule"]) == ("kv_pressure", "fragmentation")


def test_duplicate_steps_are_skipped() -> None:
    decider = ModelDecider()
    first = step(decider, 0)
    again = step(decider, 0, {"r1": {"step_cuda_errors": {"700": 1}}})
    assert again.skipped and again.alerts == [] and again.correction is None
    assert again.current == first.current and again.health == first.health


def test_a_decider_belongs_to_one_model() -> None:
    decider = ModelDecider()
    step(decider, 0)
    with pytest.raises(ValueError, match="belongs to model"):
        decider.step("other", T0 + 5, [], None, {})
    with pytest.raises(ValueError, match="got the vector"):
        ModelDecider().step("other", T0, [fv("r1", T0)], None, {})


def test_model_level_detection_is_opt_in() -> None:
    settings = DetectorSettings.from_overrides({"profile": "seed", "decider": {"model_level": "long_tail"}})
    decider = ModelDecider(settings)
    alerts = []
    for i in range(4):
        t = T0 + 5.0 * i
        d = decider.step("m", t, [fv("r1", t)], model_fv(t, latency_p99=900.0), {})
        alerts += d.alerts
    assert [(a.replica, a.detector) for a in alerts] == [(None, "long_tail")]
    assert d.current is not None and d.current.actions == []  # a model-level alert has no replica to act on


def test_disabled_detectors_do_not_run() -> None:
    decider = ModelDecider(DetectorSettings.from_overrides({"decider": {"disabled": "long_tail,gpu_health"}}))
    assert set(decider.detectors) == {"batch_collapse", "context_burst", "kv_pressure", "learned", "slow_replica"}
    d = step(decider, 0, {"r1": {"step_cuda_errors": {"700": 1}}})
    assert d.health["r1"] == 1.0 and d.alerts == []


def scripted(i: int) -> dict[str, dict[str, Any]]:
    """A run with every kind of trouble, to compare interrupted and uninterrupted deciders."""
    faults: dict[str, dict[str, Any]] = {}
    if 2 <= i < 12:
        faults["r1"] = {"latency_p99": 900.0}
    if i in (5, 6):
        faults["r2"] = {"batch_size_std": 4.0, "batch_fill_mean": 0.1, "step_cuda_errors": {"2": 1}}
    if i == 8:
        faults["r3"] = {"step_cuda_errors": {"cudaErrorLaunchTimeout": 3}}
    return faults


def decisions(decider: ModelDecider, steps: range) -> list[Any]:
    out = []
    for i in steps:
        replicas = REPLICAS if not 20 <= i < 26 else ("r1", "r2")
        d = step(decider, i, scripted(i), replicas=replicas)
        out.append(
            (
                [a.to_dict() for a in d.alerts],
                None if d.correction is None else d.correction.to_dict(),
                {r: w.to_dict() for r, w in d.weights.items()},
                d.health,
            )
        )
    return out


@pytest.mark.parametrize("split", [1, 7, 13, 22])
def test_state_survives_a_restart_through_json(split: int) -> None:
    expected = decisions(ModelDecider(), range(40))
    before = ModelDecider()
    head = decisions(before, range(split))
    state = json.loads(json.dumps(before.state_dict()))
    restored = ModelDecider.from_state(state)
    assert restored.state_dict() == before.state_dict()
    assert head + decisions(restored, range(split, 40)) == expected


def _random_fleet_decisions(decider: ModelDecider, steps: range, rng: random.Random) -> list[Any]:
    """Decisions on a random fleet: faults flip on and off, replicas join and fall silent,
    telemetry comes and goes (some of it stale)."""
    replicas = [f"r{i:02d}" for i in range(24)]
    out = []
    for i in steps:
        t = T0 + 5.0 * i
        vectors, telemetry = [], {}
        for k, r in enumerate(replicas):
            if (k + i) % 17 == 0 or (k > 20 and i < 10):
                continue  # silent this step, or not there yet
            kw: dict[str, Any] = {}
            if rng.random() < 0.3:
                kw["latency_p99"] = rng.choice([290.0, 310.0, 900.0])
            if rng.random() < 0.2:
                kw.update(batch_size_std=rng.uniform(1, 4), batch_fill_mean=rng.uniform(0.1, 0.5))
            if rng.random() < 0.2:
                kw.update(tokens_per_s=rng.uniform(50, 200), kv_cache_hit_rate_mean=rng.uniform(0.5, 0.95))
            if rng.random() < 0.1:
                kw.update(prompt_tokens_mean=3000.0, prompt_tokens_var=rng.choice([1e4, 1e6]))
            if rng.random() < 0.03:
                kw["step_cuda_errors"] = {rng.choice(["cudaErrorLaunchTimeout", "700"]): 1}
            if rng.random() < 0.1:
                kw["count"] = rng.choice([0, 10])
            vectors.append(fv(r, t, **kw))
            if rng.random() < 0.7:
                sample = TelemetrySample(ts=t - 1, replica=r, source="simulated", memory_reserved_bytes=1e10,
                                         memory_allocated_bytes=1e10 * rng.uniform(0.4, 1.0),
                                         kv_cache_hit_rate=rng.uniform(0.5, 0.9), queue_length=rng.randint(0, 9))
                telemetry[r] = (sample, rng.choice([1.0, 1.0, 30.0]))
        d = decider.step("m", t, vectors, model_fv(t), telemetry)
        out.append(([a.to_dict() for a in d.alerts], None if d.correction is None else d.correction.to_dict(),
                     {r: w.to_dict() for r, w in d.weights.items()}, d.health, decider.open_alerts()))
    return out


@pytest.mark.parametrize("profile", ["seed", "default", "tuned"])
def test_column_screens_change_no_decision(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The detectors' column screens (``quiet``) only skip work: with them off, every alert,
    correction, weight and health is the same, and so is a restart from a checkpoint."""
    overrides: dict[str, Any] = {"profile": profile}
    if profile == "tuned":  # a thin alias of the default, kept for commands that name it
        path = Path(__file__).parents[2] / "bench/profiles/tuned.toml"
        overrides = tomllib.loads(path.read_text())["detectors"]
    settings = DetectorSettings.from_overrides(overrides)
    screened = _random_fleet_decisions(ModelDecider(settings), range(60), random.Random(3))
    assert sum(len(alerts) for alerts, *_ in screened) > 10  # the fleet does alert
    rng = random.Random(3)
    half = ModelDecider(settings)
    head = _random_fleet_decisions(half, range(30), rng)
    restored = ModelDecider.from_state(json.loads(json.dumps(half.state_dict())), settings)
    assert head + _random_fleet_decisions(restored, range(30, 60), rng) == screened
    for cls in DETECTORS.values():
        monkeypatch.setattr(cls, "quiet", lambda self, step: None, raising=False)
    assert _random_fleet_decisions(ModelDecider(settings), range(60), random.Random(3)) == screened


def test_replaying_a_step_after_restore_gives_the_same_seq() -> None:
    decider = ModelDecider()
    step(decider, 0)
    checkpoint = json.loads(json.dumps(decider.state_dict()))
    first = step(decider, 1, {"r1": {"latency_mean": 900.0}})
    replayed = step(ModelDecider.from_state(checkpoint), 1, {"r1": {"latency_mean": 900.0}})
    assert first.correction is not None and replayed.correction == first.correction


# ---------------------------------------------------------------- settings


def test_settings_from_env_and_toml(tmp_path: Path) -> None:
    toml = tmp_path / "skewwatch.toml"
    toml.write_text(
        "[detectors.long_tail]\nratio = 3.5\npersistence = 4\n[detectors.weights]\npanic_threshold = 0.25\n"
        '[detectors.gpu_health]\nreclassify = ["cudaErrorLaunchTimeout=hardware"]\nhardware_xids = [79, 48]\n'
    )
    settings = load_settings(
        toml, env={"SKEWWATCH_DETECTORS__LONG_TAIL__RATIO": "4", "SKEWWATCH_DETECTORS__GPU_HEALTH__ISOLATE_S": "120"}
    )
    ds = settings.detectors
    assert ds.long_tail.ratio == 4.0 and ds.long_tail.persistence == 4
    assert ds.gpu_health.isolate_s == 120.0 and ds.weights.panic_threshold == 0.25
    assert ds.gpu_health.reclassify == ("cudaErrorLaunchTimeout=hardware",)
    assert ds.gpu_health.hardware_xids == (79, 48)
    assert ModelDecider(ds).detectors["long_tail"].config.to_dict()["ratio"] == 4.0
    env_only = load_settings(env={"SKEWWATCH_DETECTORS__DECIDER__DISABLED": "kv_pressure,context_burst"})
    assert env_only.detectors.decider.disabled == ("kv_pressure", "context_burst")



def test_the_seed_profile_holds_the_seeds_values() -> None:
    ds = SEED
    lt, bc, cb, kv, gh = (
        ds.detector_configs()[n] for n in ("long_tail", "batch_collapse", "context_burst", "kv_pressure", "gpu_health")
    )
    assert (lt.ratio, lt.persistence, lt.seed_rule, lt.live_rule, lt.exceedance_rule) == (3.0, 3, True, False, False)
    assert (bc.seed_rule, bc.stuck_rule, cb.seed_rule, cb.burst_rule, kv.relative_hit_rate) == (
        True, False, True, False, False)
    assert (bc.std_threshold, bc.fill_threshold, bc.queue_cap, bc.max_batch_size) == (2.0, 0.3, 32.0, 64.0)
    assert (bc.low_util, bc.high_p95_ms, bc.shrink, bc.high_util, bc.low_p95_ms, bc.grow) == (
        0.4,
        120.0,
        0.7,
        0.85,
        80.0,
        1.3,
    )
    assert (cb.growth, cb.zero_prev_variance, cb.min_mean_tokens) == (4.0, 1000.0, 2048.0)
    assert (kv.fragmentation_threshold, kv.low_hit_rate, kv.throughput_threshold, kv.high_hit_rate) == (
        0.4,
        0.65,
        120.0,
        0.85,
    )
    assert (gh.transient_score, gh.configuration_score, gh.hardware_score, gh.isolate_s) == (0.9, 0.4, 0.0, 300.0)
    w = ds.weights
    assert (w.mem_coef, w.queue_coef, w.latency_coef, w.queue_cap, w.latency_ref_ms) == (0.4, 0.3, 0.3, 32.0, 2000.0)
    assert ds.corrections.heartbeat_s == 30.0


def test_the_default_profile_is_the_evidence_aware_rules_and_keys_still_win() -> None:
    ds = DetectorSettings.from_overrides({})
    lt, bc, cb, kv = (ds.detector_configs()[n] for n in ("long_tail", "batch_collapse", "context_burst", "kv_pressure"))
    assert (lt.seed_rule, lt.live_rule, lt.exceedance_rule, bc.seed_rule, bc.stuck_rule) == (False, True, True, False,
                                                                                            True)
    assert (cb.seed_rule, cb.burst_rule, kv.relative_hit_rate, kv.require_waiting) == (False, True, True, True)
    assert all(ds.detector_configs()[n].min_count == 6 for n in ("long_tail", "batch_collapse", "context_burst",
                                                                  "kv_pressure"))
    mixed = DetectorSettings.from_overrides({"profile": "seed", "long_tail": {"persistence": "5"}})
    assert (mixed.long_tail.seed_rule, mixed.long_tail.persistence) == (True, 5)
    env = load_settings(env={"SKEWWATCH_DETECTORS__PROFILE": "seed"})
    assert env.detectors.long_tail.seed_rule
    with pytest.raises(ConfigError, match="profile"):
        DetectorSettings.from_overrides({"profile": "tuned"})


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"long_tial": {"ratio": 3}}, "unknown section"),
        ({"long_tail": {"ratoi": 3}}, "unknown setting"),
        ({"decider": {"disabled": "nope"}}, "does not exist"),
        ({"weights": {"min_denominator": "0"}}, "min_denominator"),
    ],
)
def test_bad_settings_are_rejected(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DetectorSettings.from_overrides(overrides)


# ---------------------------------------------------------------- corrections


def correction(ts: float, weights: dict[str, float], actions: list[Action] | None = None) -> RoutingCorrection:
    return RoutingCorrection("m", ts, step_seq(ts, None), weights, actions or [])


def action(expires: float | None, **kw: Any) -> Action:
    values: dict[str, Any] = {"replica": "a", "action": "isolate", "severity": Severity.WARNING, "reason": "r"}
    values.update(kw)
    return Action(expires_at=expires, **values)


def test_correction_round_trips_through_json() -> None:
    c = correction(60.0, {"a": 0.25, "b": 0.75}, [action(360.0, params={"health": 0.4})])
    assert RoutingCorrection.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_seq_helpers() -> None:
    assert step_seq(60.0, None) == 60_000 and step_seq(65.0, 60_000) == 65_000
    assert step_seq(65.0, 70_000) == 70_001  # never backwards


@pytest.mark.parametrize(
    ("new_weights", "new_actions", "now", "reason"),
    [
        ({"a": 0.5, "b": 0.5}, [action(400.0)], 65.0, None),
        ({"a": 0.509, "b": 0.491}, [action(400.0)], 65.0, None),  # below epsilon
        ({"a": 0.52, "b": 0.48}, [action(400.0)], 65.0, "weights changed"),
        ({"a": 0.5, "c": 0.5}, [action(400.0)], 65.0, "replicas changed"),
        ({"a": 0.5, "b": 0.5}, [], 65.0, "actions changed"),
        ({"a": 0.5, "b": 0.5}, [action(400.0, action="drain")], 65.0, "actions changed"),
        ({"a": 0.5, "b": 0.5}, [action(450.0)], 65.0, None),  # renewal far from expiry: not news
        ({"a": 0.5, "b": 0.5}, [action(None)], 65.0, "actions changed"),
        ({"a": 0.5, "b": 0.5}, [action(400.0)], 90.0, "heartbeat"),
    ],
)
def test_publish_rules(
    new_weights: dict[str, float], new_actions: list[Action], now: float, reason: str | None
) -> None:
    prev = correction(60.0, {"a": 0.5, "b": 0.5}, [action(400.0)])
    new = correction(now, new_weights, new_actions)
    assert publish_reason(prev, new, now) == reason
    assert should_publish(prev, new, now) is (reason is not None)
    assert publish_reason(None, new, now) == "first"


def test_renewal_is_published_before_the_published_expiry() -> None:
    prev = correction(60.0, {"a": 1.0}, [action(80.0)])
    assert publish_reason(prev, correction(65.0, {"a": 1.0}, [action(125.0)]), 65.0) == "action renewal due"


# ---------------------------------------------------------------- detections and weights agree

SEED_DEMOTING = DetectorSettings.from_overrides({"profile": "seed", "weights": {"demote_on_alert": True}})


def test_an_open_warning_demotes_its_replica_below_every_healthy_one_until_it_resolves() -> None:
    decider = ModelDecider(SEED_DEMOTING)
    weights, reasons = [], []
    for i in range(12):
        d = step(decider, i, {"r2": {"latency_p99": 900.0}} if i < 6 else {})
        weights.append(d.current.weights if d.current else {})
        reasons.append(d.weights["r2"].reason)
    # the seed's long tail opens on the third step (persistence 3) and resolves two clean steps after
    opened, resolved = 2, 7
    for i, w in enumerate(weights):
        if opened <= i < resolved:
            assert w["r2"] < min(w["r1"], w["r3"]) * 0.51, (i, w)
            assert w["r2"] >= 0.1 / 3 * 0.99  # the probing floor
        else:
            assert w["r2"] == pytest.approx(w["r1"]), (i, w)
    assert reasons[opened].endswith("demoted: long_tail open") and "demoted" not in reasons[resolved]
    restored = ModelDecider.from_state(json.loads(json.dumps(decider.state_dict())), SEED_DEMOTING)
    assert restored._demotions.alerted == decider._demotions.alerted


def test_a_repeat_demotion_is_held_after_its_alert_resolves_and_the_first_is_not() -> None:
    decider = ModelDecider(SEED_DEMOTING)
    demoted, reasons = [], []
    # the seed's long tail on r2 twice: steps 0-5 and 20-25 (each opens on its third step and
    # resolves two clean steps after it ends, at steps 7 and 27)
    for i in range(40):
        d = step(decider, i, {"r2": {"latency_p99": 900.0}} if i < 6 or 20 <= i < 26 else {})
        assert d.current is not None
        demoted.append(d.current.weights["r2"] < d.current.weights["r1"] * 0.51)
        reasons.append(d.weights["r2"].reason)
    first = [i for i in range(20) if demoted[i]]
    assert first == list(range(2, 7))  # lifted on the first correction after the resolution
    second = [i for i in range(20, 40) if demoted[i]]
    # held base_ejection_s (30 s: 6 steps) after the second one resolves
    assert second == list(range(22, 27 + 6)), second
    assert reasons[30].endswith("demoted: held after a repeat demotion") and "demoted" not in reasons[33]


def test_a_replica_warming_up_is_not_demoted_until_it_has_the_credibility_rules_requests() -> None:
    decider = ModelDecider(SEED_DEMOTING)
    reasons, demoted = [], []
    for i in range(14):  # r2 is new: 8 requests in its window, 1 more per step, and a long tail from the start
        faults = {"r2": {"latency_p99": 900.0, "count": 20 if i else 8, "step_count": 1 if i else 8}}
        d = step(decider, i, faults)
        assert d.current is not None
        reasons.append(d.weights["r2"].reason)
        demoted.append(d.current.weights["r2"] < d.current.weights["r1"] * 0.51)
    warming = [i for i, r in enumerate(reasons) if "not demoted: warming up" in r]
    assert warming and not any(demoted[i] for i in warming)
    assert demoted[-1] and "demoted: long_tail open" in reasons[-1]  # 16 requests (credibility_k) on, it is
    assert re.search(r"not demoted: warming up \(\d+ of 16 requests\)", reasons[warming[0]])


def test_a_low_rate_pool_is_not_warming_up_its_alerted_replica_is_demoted_at_once() -> None:
    """Every replica of the pool has served as few requests as the others (fewer than a credibility_k
    of 100): none is newer than its pool, and the long tail's alert demotes r2 as soon as it opens."""
    decider = ModelDecider(DetectorSettings.from_overrides(
        {"profile": "seed", "weights": {"demote_on_alert": True, "credibility_k": 100.0}}))
    thin = {"count": 20, "step_count": 1}
    for i in range(6):
        d = step(decider, i, {r: {**thin, **({"latency_p99": 900.0} if r == "r2" else {})} for r in REPLICAS})
        assert d.current is not None
        reason = d.weights["r2"].reason
        if "long_tail open" in reason:
            break
    assert "warming up" not in reason and d.current.weights["r2"] < d.current.weights["r1"] * 0.51
    evidence = decider._evidence.replicas["r2"]
    assert evidence.arrivals.n < decider.settings.weights.credibility_k  # thin, yet not new


def test_demotion_is_off_in_the_seed_profile_and_held_back_past_the_ejection_cap() -> None:
    seed = ModelDecider(SEED)
    for i in range(5):
        d = step(seed, i, {"r2": {"latency_p99": 900.0}})
    assert d.current is not None and d.current.weights["r2"] == pytest.approx(d.current.weights["r1"])
    both = ModelDecider(SEED_DEMOTING)
    for i in range(5):
        d = step(both, i, {"r2": {"latency_p99": 900.0}, "r3": {"latency_p99": 900.0}})
    assert d.current is not None and d.current.weights["r2"] == pytest.approx(d.current.weights["r1"])
    assert "not demoted: 2 of 3 replicas have an open alert" in d.weights["r2"].reason


def test_every_correction_says_how_long_it_is_valid() -> None:
    d = step(ModelDecider(), 0)
    assert d.correction is not None and d.correction.valid_for_s == 90.0
    assert d.correction.to_dict()["valid_for_s"] == 90.0
    with pytest.raises(ConfigError, match="valid_for_s"):
        DetectorSettings.from_overrides({"corrections": {"valid_for_s": 30}})


def test_the_default_weights_carry_a_slower_replicas_speed_and_the_seed_profile_does_not() -> None:
    """relative_speed: r3's tokens come 1.67 x slower than its peers' for ten minutes, with nothing
    else different (no alert: a slower GPU is no fault). The default profile gives it less than its
    peers; the seed profile, its formula alone, the same."""
    slower = {"r3": {"tpot_p50": 50.0}}
    default, seed = ModelDecider(DetectorSettings()), ModelDecider(SEED)
    for i in range(120):
        faults = {r: {"tpot_p50": 30.0, **slower.get(r, {})} for r in REPLICAS}
        last, last_seed = step(default, i, faults), step(seed, i, faults)
    weights = last.current.weights if last.current else {}
    assert weights["r3"] < 0.75 * min(weights["r1"], weights["r2"])
    assert "relative speed" in last.weights["r3"].reason and not last.alerts
    seed_weights = last_seed.current.weights if last_seed.current else {}
    assert seed_weights["r3"] == pytest.approx(seed_weights["r1"])
