"""Corrections that fail static: staleness from a replica's own rate, credibility, held weights, the
pool's guards (ejection cap, repeat ejections, panic, never all-zero) and alerts that need evidence.

The first tests reproduce what a quiet fleet got before these rules: four healthy replicas at
~0.08 requests/s with 9 s requests all had weight 0 while they served (their ordinary gaps passed a
fixed 3 x 5 s rule), and once the pool went quiet every correction sent its traffic nowhere.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from skewwatch.config import WindowSettings
from skewwatch.pipeline.credibility import Shrunk, credibilities, shrink
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.failstatic import HARDWARE, STALE, GuardConfig, PoolGuard, ejection_cap
from skewwatch.pipeline.model_decisions import ModelDecider, StepDecision
from skewwatch.pipeline.staleness import ArrivalEvidence
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample
from tests.reference import reference_features

T0 = 1_700_000_000.0
STEP = 5.0
WINDOW = WindowSettings()
# the seed's long_tail rule sees a fault in one step's vector: what these tests resolve is the decider's
SEED = DetectorSettings.from_overrides({"profile": "seed"})


def poisson_events(rng: random.Random, replicas: list[str], rate: float, start: float, end: float,
                   latency_ms: float = 9000.0, model: str = "m") -> list[dict[str, Any]]:
    """Finished requests of each replica at ``rate`` per second (Poisson), ``latency_ms`` each."""
    events = []
    for replica in replicas:
        t = start + rng.expovariate(rate)
        while t < end:
            events.append({"model": model, "replica": replica, "ts": t,
                           "latency_ms": latency_ms * rng.uniform(0.8, 1.2), "prompt_tokens": rng.randint(200, 2000),
                           "completion_tokens": rng.randint(50, 400)})
            t += rng.expovariate(rate)
    return sorted(events, key=lambda e: e["ts"])


def run_decider(decider: ModelDecider, events: list[dict[str, Any]], replicas: list[str], start: float,
                end: float, release_s: float = 90.0, model: str = "m",
                telemetry: dict[str, list[float]] | None = None) -> list[StepDecision]:
    """Step ``decider`` every 5 s as stage 2 would: a replica's summary comes while stage 1 still
    knows it (it had a request in the last ``release_s``), with its telemetry when ``telemetry``
    lists sample times for it."""
    decisions = []
    last_request: dict[str, float] = {}
    index = 0
    t = start + STEP
    while t <= end + 1e-9:
        while index < len(events) and events[index]["ts"] < t:
            last_request[events[index]["replica"]] = events[index]["ts"]
            index += 1
        vectors, tel = [], {}
        for replica in replicas:
            seen = last_request.get(replica)
            if seen is None or t - seen > release_s:
                continue
            vectors.append(reference_features(events[:index], model, replica, t, WINDOW))
            times = [ts for ts in (telemetry or {}).get(replica, []) if ts <= t]
            if times:
                tel[replica] = (TelemetrySample(ts=times[-1], replica=replica, source="vllm", queue_length=0),
                                t - times[-1])
        decisions.append(decider.step(model, t, vectors, None, tel))
        t += STEP
    return decisions


REPLICAS = ["r0", "r1", "r2", "r3"]


def quiet_pool_run(seed: int) -> tuple[list[StepDecision], float]:
    rng = random.Random(seed)
    serve_until = T0 + 1200.0
    events = poisson_events(rng, REPLICAS, 0.08, T0, serve_until)
    decisions = run_decider(ModelDecider(), events, REPLICAS, T0, serve_until + 400.0)
    return decisions, serve_until


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_low_rate_healthy_replicas_are_never_weighted_zero_while_they_serve(seed: int) -> None:
    decisions, serve_until = quiet_pool_run(seed)
    serving = [d for d in decisions if T0 + 60 <= d.window_end <= serve_until]
    zeros = [(d.window_end - T0, r, w.reason) for d in serving for r, w in d.weights.items() if w.weight == 0.0]
    assert zeros == []
    # and their weights do not swing on a handful of requests: within 2x of an equal share
    assert all(0.125 <= w.weight <= 0.5 for d in serving for w in d.weights.values())
    assert all(d.current is not None and d.current.mode == "normal" for d in serving)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_quiet_pool_is_never_routed_to_nowhere(seed: int) -> None:
    decisions, serve_until = quiet_pool_run(seed)
    quiet = [d for d in decisions if d.window_end > serve_until]
    for d in quiet:
        assert d.current is not None and sum(d.current.weights.values()) == pytest.approx(1.0)
        assert all(w > 0 for w in d.current.weights.values())
    # no replica is to blame (each one's silence is its peers' too): none is stale, their weights
    # are held; once the pool's own silence is improbable at its rate, the correction says so
    assert not any("stale" in w.reason for d in quiet for w in d.weights.values())
    panic = [d for d in quiet if d.current is not None and d.current.mode == "panic"]
    assert panic and panic[0].window_end <= serve_until + 60 and panic[-1] is quiet[-1]
    reason = panic[-1].current.mode_reason or ""  # type: ignore[union-attr]
    assert reason.startswith("fail static: the whole pool is silent: no request for") and "the pool's rate" in reason
    assert "weights held, routing to all" in reason
    pool_alerts = [a for d in quiet for a in d.alerts if a.replica is None]
    assert [(a.detector, a.evidence["rule"], str(a.severity), a.state) for a in pool_alerts] == [
        ("fail_static", "pool_silent", "WARNING", "open")]
    # and every replica-level alert opened on it has resolved
    opened = {a.key for d in decisions for a in d.alerts if a.replica and a.state == "open"}
    resolved = {a.key for d in decisions for a in d.alerts if a.replica and a.state == "resolved"}
    assert opened <= resolved


def test_the_pool_leaves_panic_when_traffic_returns() -> None:
    rng = random.Random(7)
    events = poisson_events(rng, REPLICAS, 0.5, T0, T0 + 300) + poisson_events(rng, REPLICAS, 0.5, T0 + 700, T0 + 900)
    events.sort(key=lambda e: e["ts"])
    decisions = run_decider(ModelDecider(), events, REPLICAS, T0, T0 + 900)
    modes = [d.current.mode for d in decisions]  # type: ignore[union-attr]
    assert modes[-1] == "normal" and "panic" in modes
    pool = [(a.evidence["rule"], a.state) for d in decisions for a in d.alerts if a.replica is None]
    assert pool == [("pool_silent", "open"), ("pool_silent", "resolved")]


def test_engine_telemetry_keeps_a_silent_replica_alive() -> None:
    rng = random.Random(4)
    events = poisson_events(rng, ["r0", "r1"], 1.0, T0, T0 + 400) + poisson_events(rng, ["r2"], 1.0, T0, T0 + 120)
    events.sort(key=lambda e: e["ts"])
    scrape = {r: [T0 + 2.0 + 5 * i for i in range(80)] for r in ("r0", "r1", "r2")}
    decisions = run_decider(ModelDecider(), events, ["r0", "r1", "r2"], T0, T0 + 400, telemetry=scrape)
    # its engine answers while it gets no request, and after stage 1 stops reporting it (90 s): held
    late = [d.weights["r2"] for d in decisions if d.window_end > T0 + 125]
    assert late and all(w.weight > 0.2 and "stale" not in w.reason for w in late)
    # without it, its silence at 1 request/s is stale within 15-20 s
    decisions = run_decider(ModelDecider(), events, ["r0", "r1", "r2"], T0, T0 + 200)
    assert decisions[-1].weights["r2"].weight == 0.0


def test_lost_engine_telemetry_and_silence_make_a_replica_stale_fast() -> None:
    rng = random.Random(5)
    events = poisson_events(rng, ["r0", "r1", "r2"], 0.05, T0, T0 + 600)
    # r2 dies at T0 + 300: no scrape after it, no request after it
    events = [e for e in events if not (e["replica"] == "r2" and e["ts"] >= T0 + 300)]
    scrape = {r: [T0 + 2.0 + 5 * i for i in range(120) if r != "r2" or T0 + 2.0 + 5 * i < T0 + 300]
              for r in ("r0", "r1", "r2")}
    decisions = run_decider(ModelDecider(), events, ["r0", "r1", "r2"], T0, T0 + 380, release_s=600,
                            telemetry=scrape)
    stale_at = next(d.window_end for d in decisions if "r2" in d.weights and d.weights["r2"].weight == 0.0)
    # at 0.05 requests/s its silence alone would take minutes; with its engine gone: ~15-30 s
    assert T0 + 300 < stale_at <= T0 + 335
    assert "engine telemetry lost" in next(d for d in decisions if d.window_end == stale_at).weights["r2"].reason


def test_every_engine_going_quiet_at_once_is_the_pool_not_its_replicas() -> None:
    rng = random.Random(6)
    events = poisson_events(rng, ["r0", "r1", "r2"], 0.05, T0, T0 + 300)
    # every scrape stops within 10 s of the others, around T0 + 300
    scrape = {r: [T0 + 2.0 + 5 * i for i in range(60 + k)] for k, r in enumerate(("r0", "r1", "r2"))}
    decisions = run_decider(ModelDecider(), events, ["r0", "r1", "r2"], T0, T0 + 400, release_s=600,
                            telemetry=scrape)
    assert all(w.weight > 0 for d in decisions for w in d.weights.values())


# ---------------------------------------------------------------- staleness


def test_the_stale_threshold_is_exact_under_poisson_arrivals() -> None:
    """P(gap >= T (p^(-1/n) - 1)) = p for n requests watched over T, whatever n."""
    rng = random.Random(1)
    for n in (10, 40):
        hits = 0
        trials = 40_000
        for _ in range(trials):
            rate = rng.uniform(0.01, 2.0)
            exposure = sum(rng.expovariate(rate) for _ in range(n))
            evidence = ArrivalEvidence(n=float(n), exposure_s=exposure, since=0.0, horizon_s=math.inf)
            threshold = evidence.stale_after(1e-2, min_requests=1)
            assert threshold is not None
            hits += rng.expovariate(rate) >= threshold
        assert hits / trials == pytest.approx(1e-2, rel=0.15)


def test_staleness_needs_evidence_and_a_minimum_silence() -> None:
    few = ArrivalEvidence.first(now=0.0, window_count=5, window_s=60.0)
    assert few.stale_after(1e-4, min_requests=10) is None
    assert not few.judge(10_000.0, 1e-4, 10, 15.0).stale  # unknown rate: no silence is judged
    busy = ArrivalEvidence.first(now=0.0, window_count=600, window_s=60.0)
    assert busy.stale_after(1e-4, 10) == pytest.approx(60 * math.expm1(math.log(1e4) / 600))  # ~0.9 s
    assert not busy.judge(10.0, 1e-4, 10, 15.0).stale and busy.judge(15.0, 1e-4, 10, 15.0).stale


def test_engine_telemetry_decides_liveness_both_ways() -> None:
    evidence = ArrivalEvidence.first(now=0.0, window_count=600, window_s=60.0)
    assert not evidence.judge(1000.0, 1e-4, 10, 15.0, engine_alive=True).stale
    few = ArrivalEvidence.first(now=0.0, window_count=2, window_s=60.0)
    assert not few.judge(14.0, 1e-4, 10, 15.0, engine_lost=True).stale
    verdict = few.judge(15.0, 1e-4, 10, 15.0, engine_lost=True)
    assert verdict.stale and "engine telemetry lost" in verdict.reason


def test_the_rate_estimate_follows_the_traffic_and_restarts_after_an_ejection() -> None:
    evidence = ArrivalEvidence.first(now=0.0, window_count=60, window_s=60.0, horizon_s=300.0)
    for t in range(5, 3600, 5):
        evidence.observe(float(t), 1 if t % 50 == 0 else 0)  # 1 request / 50 s after a start at 1/s
    assert evidence.rate() == pytest.approx(0.02, rel=0.1)
    evidence.restart(5000.0)
    assert evidence.silence(5000.0) == 0.0 and evidence.silence(5010.0) == 10.0
    state = json.loads(json.dumps(evidence.to_dict()))
    assert ArrivalEvidence.from_dict(state, 300.0) == evidence


# ---------------------------------------------------------------- credibility


def test_credibility_shrinks_thin_evidence_toward_the_pool() -> None:
    assert credibilities([16, 0, 5], 16.0) == [0.5, 0.0, 5 / 21]
    # k = 0: shrinking off; a replica with requests keeps its score, one without still has none
    assert credibilities([5, 0], 0.0) == [1.0, 0.0]
    # no evidence anywhere: no pool score, the formula's scores stand (the guards make them equal)
    assert shrink([1.0, 5.0], credibilities([0, 0], 16.0)) == Shrunk(None, [1.0, 5.0])
    # one request cannot make a replica 5x the others
    shrunk = shrink([1.0, 1.0, 1.0, 5.0], credibilities([300, 300, 300, 1], 16.0)).scores
    assert shrunk[3] / shrunk[0] < 1.35
    # with plenty of evidence the formula stands
    plenty = shrink([1.0, 5.0], credibilities([10_000, 10_000], 16.0)).scores
    assert plenty[1] / plenty[0] == pytest.approx(5.0, rel=0.01)
    assert shrink([1.0, 5.0], credibilities([1, 1], 0.0)).scores == [1.0, 5.0]  # k = 0: off
    # a replica without a request is shrunk all the way to the pool's mean (the decider holds its
    # last score first)
    assert shrink([1.0, 5.0], credibilities([4, 0], 0.0)) == Shrunk(1.0, [1.0, 1.0])


def test_the_decider_shrinks_by_the_credibility_module() -> None:
    """pool_evidence's scores are credibility.shrink's, k = 0 included (one formula, not two)."""
    from skewwatch.pipeline.pool_evidence import PoolEvidence
    from skewwatch.pipeline.weights import WeightConfig, WeightInput, compute_weights
    from skewwatch.schemas.feature_vector import FeatureVector

    for k in (0.0, 16.0):
        cfg, pool = WeightConfig(credibility_k=k), PoolEvidence()
        vectors = [FeatureVector(model="m", replica=r, window_start=0.0, window_end=60.0, count=n,
                                 step_count=1, latency_mean=latency)
                   for r, n, latency in (("a", 3, 500.0), ("b", 300, 2000.0), ("c", 40, 900.0))]
        pool.observe(60.0, ["a", "b", "c"], vectors, [None] * 3, cfg)
        raw = compute_weights([WeightInput(v.replica, v) for v in vectors])
        formula = [raw[r].raw_score for r in "abc"]
        pool.settle("m", 60.0, ["a", "b", "c"], vectors, raw, [None] * 3, cfg)
        z = credibilities([3, 300, 40], k)
        assert [raw[r].components["credibility"] for r in "abc"] == z
        assert [raw[r].components["score"] for r in "abc"] == shrink(formula, z).scores


# ---------------------------------------------------------------- the pool's guards


def apply(guard: PoolGuard, now: float, evidence: list[str | None], config: GuardConfig | None = None,
          health: list[float] | None = None) -> Any:
    n = len(evidence)
    names = [f"r{i}" for i in range(n)]
    return guard.apply("m", now, names, [1.0] * n, health or [0.0 if e == HARDWARE else 1.0 for e in evidence],
                       evidence, config or GuardConfig())


@pytest.mark.parametrize(("pool", "share", "cap"), [(1, 0.5, 1), (2, 0.5, 1), (4, 0.5, 2), (5, 0.5, 2),
                                                    (10, 0.1, 1), (20, 0.1, 2), (4, 0.0, 1), (4, 1.0, 4)])
def test_the_ejection_cap(pool: int, share: float, cap: int) -> None:
    assert ejection_cap(pool, share) == cap


def test_worst_evidence_goes_first_and_the_cap_alert_names_who_was_held_back() -> None:
    guard = PoolGuard()
    config = GuardConfig(max_ejection_share=0.2)  # one of six
    out = apply(guard, 100.0, [STALE, None, None, None, None, None], config)
    assert out.ejected == {"r0": STALE} and out.weights[0] == 0.0
    out = apply(guard, 105.0, [STALE, HARDWARE, None, None, None, None], config)
    # the hardware fault displaces the stale replica, which routes again (held back)
    assert out.ejected == {"r1": HARDWARE} and out.held_back == {"r0": STALE}
    assert out.weights[1] == 0.0 and out.weights[0] == pytest.approx(0.2) and out.withdrawn == {"r0"}
    (alert,) = out.alerts
    assert (alert.detector, alert.evidence["rule"], alert.state, alert.replica) == (
        "fail_static", "ejection_cap", "open", None)
    assert "held back: r0 (stale)" in alert.message
    out = apply(guard, 110.0, [STALE, HARDWARE, HARDWARE, None, None, None], config)
    assert out.ejected == {"r1": HARDWARE} and set(out.held_back) == {"r0", "r2"}  # the first one stays
    assert out.alerts == [] and out.mode == "normal"  # one episode; 3 of 6 healthy is no panic
    out = apply(guard, 115.0, [None, HARDWARE, None, None, None, None], config)
    assert [(a.evidence["rule"], a.state) for a in out.alerts] == [("ejection_cap", "resolved")]


def test_repeat_ejections_last_longer_up_to_a_bound_and_are_forgiven() -> None:
    guard = PoolGuard()
    config = GuardConfig()
    durations = []
    now = 0.0
    for _ in range(6):
        out = apply(guard, now, [STALE, None, None, None], config)
        assert out.ejected == {"r0": STALE}
        start = now
        while guard.due_restarts(now) != ["r0"]:
            now += 5.0
        durations.append(now - start)
        apply(guard, now, [None] * 4, config)  # it came back
        now += 5.0
    assert durations == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0]
    now += config.max_ejection_s  # healthy for the longest ejection: forgiven
    apply(guard, now, [STALE, None, None, None], config)
    while guard.due_restarts(now) != ["r0"]:
        now += 5.0
    assert guard.state_dict()["records"]["r0"]["count"] == 1


def test_panic_below_the_threshold_routes_to_all_but_hardware() -> None:
    guard = PoolGuard()
    out = apply(guard, 0.0, [STALE, STALE, None, None])  # 2 of 4 healthy: not below 50 %
    assert out.mode == "normal" and out.weights == [0.0, 0.0, 0.5, 0.5]
    out = apply(guard, 5.0, [STALE, STALE, HARDWARE, None])  # 1 of 4 healthy
    assert out.mode == "panic" and out.weights[2] == 0.0 and all(w > 0 for i, w in enumerate(out.weights) if i != 2)
    assert "panic: 1 of 4 replicas healthy" in (out.mode_reason or "")
    assert out.withdrawn == {"r0", "r1"}
    assert [(a.evidence["rule"], str(a.severity), a.state) for a in out.alerts] == [("panic", "CRITICAL", "open")]
    out = apply(guard, 10.0, [None, None, HARDWARE, None])
    assert out.mode == "normal" and [(a.evidence["rule"], a.state) for a in out.alerts] == [("panic", "resolved")]


def test_never_all_zero() -> None:
    # one replica, drained: the only one there is
    out = apply(PoolGuard(), 0.0, [HARDWARE])
    assert out.weights == [1.0] and out.mode == "panic" and "routing to all replicas" in (out.mode_reason or "")
    # every replica drained and no cap or panic to stop it: still routed
    config = GuardConfig(panic_threshold=0.0, max_ejection_share=1.0)
    out = apply(PoolGuard(), 0.0, [HARDWARE, HARDWARE, HARDWARE], config)
    assert out.weights == pytest.approx([1 / 3] * 3) and out.mode == "panic"
    out = apply(PoolGuard(), 0.0, [STALE, STALE, HARDWARE], config)
    assert out.weights == [0.5, 0.5, 0.0] and "not drained for a hardware fault" in (out.mode_reason or "")
    assert apply(PoolGuard(), 0.0, []).weights == []


def test_the_guard_state_round_trips() -> None:
    guard = PoolGuard()
    apply(guard, 0.0, [STALE, HARDWARE, None, None])
    apply(guard, 5.0, [STALE, STALE, STALE, None])
    restored = PoolGuard()
    restored.load_state(json.loads(json.dumps(guard.state_dict())))
    assert restored.state_dict() == guard.state_dict()
    assert apply(restored, 10.0, [None, HARDWARE, None, None]) == apply(guard, 10.0, [None, HARDWARE, None, None])


# ---------------------------------------------------------------- the decider


def vector(replica: str, t: float, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"count": 200, "step_count": 15, "latency_p50": 100.0, "latency_p95": 150.0,
                              "latency_p99": 200.0, "latency_mean": 120.0, "queue_length_mean": 4.0}
    values.update(kw)
    return FeatureVector(model="m", replica=replica, window_start=t - 60, window_end=t, **values)


def test_alerts_of_a_replica_without_traffic_for_a_window_resolve_with_that_reason() -> None:
    decider = ModelDecider(SEED)
    for i in range(4):
        t = T0 + STEP * i
        decider.step("m", t, [vector("a", t, latency_p99=900.0), vector("b", t)], None, {})
    assert decider.open_alerts() == {("long_tail", "WARNING"): 1}
    # a's requests dry up: its window empties, and with it the evidence
    resolved = []
    for i in range(4, 20):
        t = T0 + STEP * i
        count = max(200 - 20 * (i - 4), 0)
        a = vector("a", t, latency_p99=900.0 if count >= 20 else None, count=count, step_count=0)
        resolved += decider.step("m", t, [a, vector("b", t)], None, {}).alerts
    tail = [x for x in resolved if x.detector == "long_tail"]
    assert [(x.replica, x.state) for x in tail] == [("a", "resolved")]
    assert tail[0].message == "resolved (no evidence: no request in its 60 s window)"
    # while b goes on serving, a's silence is improbable: it is stale, and that is an alert of its own
    assert [(x.replica, x.detector, x.state) for x in resolved if x.detector != "long_tail"] == [("a", "stale", "open")]
    assert decider.open_alerts() == {("stale", "WARNING"): 1}


def test_model_level_alerts_of_a_silent_model_resolve() -> None:
    settings = DetectorSettings.from_overrides({"profile": "seed", "decider": {"model_level": "long_tail"}})
    decider = ModelDecider(settings)
    for i in range(4):
        t = T0 + STEP * i
        model = vector("x", t, latency_p99=900.0)
        model.replica = None
        decider.step("m", t, [vector("a", t)], model, {})
    assert decider.open_alerts() == {("long_tail", "WARNING"): 1}
    d = decider.step("m", T0 + 20, [], None, {})
    assert [(a.replica, a.state) for a in d.alerts] == [(None, "resolved")]


def test_a_silent_pool_is_never_released_whole() -> None:
    decider = ModelDecider(DetectorSettings.from_overrides({"decider": {"release_after_s": "60"}}))
    decider.step("m", T0, [vector("a", T0), vector("b", T0)], None, {})
    for i in range(1, 40):
        d = decider.step("m", T0 + STEP * i, [], None, {})
    assert decider.replicas == ["a", "b"]
    assert d.current is not None and d.current.mode == "panic" and d.current.weights == {"a": 0.5, "b": 0.5}


def test_decider_state_with_guards_survives_a_restart() -> None:
    rng = random.Random(9)
    events = poisson_events(rng, REPLICAS, 0.2, T0, T0 + 400)
    full = run_decider(ModelDecider(), events, REPLICAS, T0, T0 + 700)
    first = ModelDecider()
    head = run_decider(first, [e for e in events if e["ts"] < T0 + 350], REPLICAS, T0, T0 + 345)
    restored = ModelDecider.from_state(json.loads(json.dumps(first.state_dict())))
    tail = run_decider(restored, events, REPLICAS, T0 + 345, T0 + 700)
    def key(d: StepDecision) -> Any:
        return ([a.to_dict() for a in d.alerts], None if d.current is None else d.current.to_dict())
    assert [key(d) for d in head + tail] == [key(d) for d in full]
