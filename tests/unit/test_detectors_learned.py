"""The learned detector: relative to the pool, warm-up aware, models taking turns, state that continues."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import random
import statistics
from typing import Any

import numpy as np
import pytest

from skewwatch.config_section import ConfigError
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.alerts import Alert
from skewwatch.pipeline.detectors.learned import LearnedDetector
from skewwatch.pipeline.detectors.learned_config import LearnedConfig
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.model_decisions import ModelDecider
from skewwatch.schemas.feature_vector import FeatureVector

STEP = 5.0
T0 = 1_000_000.0
FAST = {"cadence_steps": 1, "warmup": 40, "grace": 40, "memory": 120}  # samples: a few minutes of steps


def replica_fv(replica: str, end: float, rng: random.Random, ttft: float = 200.0, tps: float = 400.0,
               count: int = 120) -> FeatureVector:
    fv = FeatureVector(model="m", replica=replica, window_start=end - 60, window_end=end, count=count,
                         ttft_p50=ttft * rng.uniform(0.95, 1.05),
                         ttft_per_prompt_token=ttft / 1500.0 * rng.uniform(0.95, 1.05),
                         latency_p50=2000.0 * rng.uniform(0.95, 1.05),
                         tpot_p50=20.0 * rng.uniform(0.95, 1.05), tokens_per_s=tps * rng.uniform(0.95, 1.05),
                         completion_tokens_mean=200.0 * rng.uniform(0.95, 1.05),
                         prompt_tokens_mean=1500.0 * rng.uniform(0.95, 1.05))
    # the prompts of its TTFT per prompt token: the window's, a little shorter than their mean
    return dataclasses.replace(fv, ttft_prompt_tokens_gmean=0.8 * (fv.prompt_tokens_mean or 0.0))


def pool_fv(vectors: list[FeatureVector], end: float) -> FeatureVector:
    """The model's vector, for the decider (the learned detector does not read it)."""
    return FeatureVector(model="m", replica=None, window_start=end - 60, window_end=end,
                         count=sum(fv.count for fv in vectors), replicas=len(vectors),
                         ttft_p50=statistics.median(fv.ttft_p50 or 0.0 for fv in vectors))


def run(detector: LearnedDetector, steps: int, make: Any, seed: int = 3, start: int = 0) -> list[Alert]:
    """``make(i, replica, end, rng) -> FeatureVector`` for replicas r0..r3 at step i; the alerts. The draws
    of step i depend on (seed, i) only, so a run split in two sees what one run sees."""
    alerts: list[Alert] = []
    for i in range(start, start + steps):
        rng = random.Random(seed * 1_000_003 + i)
        end = T0 + STEP * i
        vectors = [make(i, f"r{k}", end, rng) for k in range(4)]
        detector.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
    return alerts


def steady(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
    return replica_fv(replica, end, rng)


def test_one_replica_unlike_its_pool_alerts_a_pool_wide_change_does_not() -> None:
    detector = LearnedDetector(LearnedConfig(**FAST))
    assert run(detector, 80, steady) == []

    def pool_wide(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=600.0, tps=1200.0)  # every replica: 3x TTFT, 3x tokens/s

    assert run(detector, 30, pool_wide, start=80) == []

    def one_slow(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=1800.0 if replica == "r2" else 600.0, tps=1200.0)

    alerts = run(detector, 10, one_slow, start=110)
    assert [(a.replica, a.state, a.evidence["feature"]) for a in alerts] == [("r2", "open", "ttft_per_prompt_token")]
    assert alerts[0].evidence["ratio"] > 2.0 and alerts[0].ts == T0 + STEP * 115  # persistence 6


def test_a_share_is_judged_against_the_pool_per_replica() -> None:
    detector = LearnedDetector(LearnedConfig(**FAST))
    run(detector, 80, steady)

    def low_throughput(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, tps=240.0 if replica == "r1" else 400.0)  # -40 % tokens/s

    alerts = run(detector, 10, low_throughput, start=80)
    assert [(a.replica, a.evidence["feature"]) for a in alerts] == [("r1", "tokens_per_s")]
    assert alerts[0].evidence["ratio"] == pytest.approx(0.6, rel=0.1)


def test_no_alert_before_warmup_and_no_sample_below_min_count() -> None:
    detector = LearnedDetector(LearnedConfig(**FAST, min_count=20))

    def early_fault(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=2000.0 if replica == "r0" and 20 <= i < 30 else 200.0)

    assert run(detector, 40, early_fault) == []  # warmup is 40 samples

    def thin(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, count=5)

    before = detector.state_dict()
    run(detector, 5, thin, start=40)
    assert detector.state_dict() == before  # 5 requests < min_count 20: not a sample, nothing learned


@pytest.mark.parametrize("count", [120, 10])
def test_few_requests_per_window_need_more_samples_to_open(count: int) -> None:
    """The holding samples must span min_requests (20) distinct requests: a window of 120 does at
    once (persistence, 6 samples, decides); with 10, each later sample adds the 5 s of its 60 s
    window that are new (10 x 5 / 60 requests), so it takes 1 + 12 samples."""
    detector = LearnedDetector(LearnedConfig(**FAST))

    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, count=count, ttft=900.0 if replica == "r1" and i >= 80 else 200.0)

    alerts = run(detector, 100, story)
    assert [(a.replica, a.state) for a in alerts] == [("r1", "open")]
    assert alerts[0].ts == T0 + STEP * (80 + (5 if count == 120 else 12))
    assert alerts[0].evidence["requests"] >= 20.0


def test_a_change_is_reported_before_it_becomes_the_new_normal() -> None:
    """At 3 requests a window each sample adds 3 x 5 / 60 requests: spanning min_requests (20) takes
    ~70 holding samples, more than `adapt` (40). The change is not learned as the new normal before
    its alert has opened (else it never would)."""
    detector = LearnedDetector(LearnedConfig(**FAST))

    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, count=3, ttft=900.0 if replica == "r1" and i >= 80 else 200.0)

    alerts = run(detector, 200, story)
    opened = [a for a in alerts if a.state == "open"]
    assert [a.replica for a in opened[:1]] == ["r1"]
    assert opened[0].ts > T0 + STEP * (80 + 40) and opened[0].evidence["requests"] >= 20.0


@pytest.mark.parametrize(("empty", "opens"), [((2,), True), ((2, 3, 4, 5, 6, 7), False)])
def test_a_window_without_requests_pauses_the_run(empty: tuple[int, ...], opens: bool) -> None:
    """r1 serves 10 requests a window (each sample adds 10 x 5 / 60 new ones: 24 samples to span
    min_requests) and some windows none: the decider forgets it there (and ends an open alert). A
    window without evidence is none against the run, which waits (one empty window in three: it
    opens); a pause longer than clear_steps (4) samples' time starts the run over (six in nine: it
    never spans 20 requests)."""
    detector = LearnedDetector(LearnedConfig(**FAST))
    alerts: list[Alert] = []
    for i in range(160):
        rng = random.Random(i)
        end = T0 + STEP * i
        quiet = i >= 80 and i % (3 if len(empty) == 1 else 9) in empty
        vectors = [replica_fv(f"r{k}", end, rng, count=0 if k == 1 and quiet else 10,
                              ttft=900.0 if k == 1 and i >= 80 else 200.0) for k in range(4)]
        if quiet:
            detector.forget("m/r1")
        detector.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
    opened = [a for a in alerts if a.state == "open"]
    assert [a.replica for a in opened[:1]] == (["r1"] if opens else [])
    assert all(a.evidence["requests"] >= 20.0 for a in opened)
    # an alert the decider ended for an empty window reopens on new evidence (a new run), not at once
    assert all(b.ts - a.ts >= STEP * 12 for a, b in zip(opened, opened[1:], strict=False))


@pytest.mark.parametrize(("silent", "opens"), [((2,), True), ((2, 3, 4, 5, 6, 7), False)])
def test_a_sample_without_the_runs_feature_pauses_the_run(silent: tuple[int, ...], opens: bool) -> None:
    """r1's decode slows 2x (TPOT) at 10 requests a window (24 samples to span min_requests), and in
    some windows it has no TPOT at all (every output one token long): such a sample says nothing
    about the feature the run holds on, and the run waits as for an empty window (one in three: it
    opens; six in nine, longer than clear_steps samples' time: it never does). Ending the run there
    (the other features are as usual) would never let it span 20 requests."""
    detector = LearnedDetector(LearnedConfig(**FAST))
    alerts: list[Alert] = []
    for i in range(160):
        rng = random.Random(i)
        end = T0 + STEP * i
        vectors = [replica_fv(f"r{k}", end, rng, count=10) for k in range(4)]
        if i >= 80:
            none = i % (3 if len(silent) == 1 else 9) in silent
            tpot = vectors[1].tpot_p50
            vectors[1].tpot_p50 = None if none else 2.0 * (tpot or 0.0)
        detector.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
    opened = [a for a in alerts if a.state == "open"]
    assert [(a.replica, a.evidence["feature"]) for a in opened[:1]] == ([("r1", "tpot_p50")] if opens else [])
    assert all(a.evidence["requests"] >= 20.0 for a in opened)


def noisy_fv(replica: str, end: float, rng: random.Random, level: float) -> FeatureVector:
    """A replica of 3 requests a window: its TTFT per prompt token swings by a factor of e^0.4 from
    one window to the next (the window's requests differ); the rest is steady."""
    return FeatureVector(model="m", replica=replica, window_start=end - 60, window_end=end, count=3,
                         ttft_per_prompt_token=0.2 * level * math.exp(rng.gauss(0.0, 0.4)),
                         tpot_p50=20.0 * rng.uniform(0.97, 1.03), tokens_per_s=50.0 * rng.uniform(0.9, 1.1),
                         completion_tokens_mean=200.0 * rng.uniform(0.9, 1.1))


@pytest.mark.parametrize("seed", [0, 1, 4])
@pytest.mark.parametrize("shift_z", [LearnedConfig().shift_z, 0.0])
def test_a_level_shift_within_the_ranges_is_found_by_the_shift_test(seed: int, shift_z: float) -> None:
    """r1's TTFT doubles at step 450 on a replica whose windows swing by e^0.4: every window after it
    lies within the ranges single windows spanned before, and the range test never holds. The mean
    of its last ten windows (one a minute, sharing no request) is four standard errors and more
    above its own past (the bar for the furthest of four replicas): the shift test opens the alert,
    naming it; with the test off, nothing. A healthy pool the same (no change) raises nothing either
    way."""
    def run_pool(change: float) -> list[Alert]:
        detector = LearnedDetector(LearnedConfig(**FAST, shift_z=shift_z))
        alerts: list[Alert] = []
        for i in range(700):
            end = T0 + STEP * i
            # a window's requests change once a minute (its value holds between)
            vectors = [noisy_fv(f"r{k}", end, random.Random(seed * 7919 + (i // 12) * 10 + k),
                                change if k == 1 and i >= 450 else 1.0) for k in range(4)]
            detector.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
        return [a for a in alerts if a.state == "open"]

    opened = run_pool(2.0)
    if shift_z:
        assert [(a.replica, a.evidence["feature"]) for a in opened[:1]] == [("r1", "ttft_per_prompt_token")]
        assert opened[0].ts > T0 + STEP * 450 and opened[0].evidence["shift_z"] >= 4.0
        assert "shift" in str(opened[0].evidence["tests"]).split("+")
        assert "standard errors from its own past" in opened[0].message
    else:
        assert opened == []
    assert run_pool(1.0) == []


def mixed_fv(replica: str, end: float, rng: random.Random, slower: float) -> FeatureVector:
    """A replica of 3 requests a window with prompts of 40 to 40,000 tokens: each TTFT a step's 20 ms
    plus 0.05 ms a prompt token (x ``slower``, +-10 %), so per prompt token a short prompt takes up to
    twenty times a long one's and the window's value swings with the prompts it served."""
    prompts = [math.exp(rng.uniform(math.log(40.0), math.log(40_000.0))) for _ in range(3)]
    per_token = [math.log(slower * (20.0 + 0.05 * p) / p) + rng.gauss(0.0, 0.1) for p in prompts]
    return FeatureVector(model="m", replica=replica, window_start=end - 60, window_end=end, count=3,
                         ttft_per_prompt_token=math.exp(sum(per_token) / 3),
                         ttft_prompt_tokens_gmean=math.exp(sum(map(math.log, prompts)) / 3),
                         tpot_p50=20.0 * rng.uniform(0.97, 1.03), tokens_per_s=50.0 * rng.uniform(0.9, 1.1),
                         completion_tokens_mean=200.0 * rng.uniform(0.9, 1.1))


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_ttft_per_prompt_token_is_judged_at_the_pools_typical_prompt(seed: int) -> None:
    """r1's TTFT rises by half at step 450, on windows whose prompts differ a thousandfold. Judged at
    the pool's typical prompt (the slope learned from the windows' prompts), the shift test finds it;
    as given, the prompts' swing hides it. A healthy pool raises nothing either way. The alert opens
    once the shift holds `persistence` samples: its z is over the recent windows' 30 requests, which
    are the run's evidence (the run's own samples add a quarter request each, and would take 69 to
    span `min_requests`)."""
    def run_pool(change: float, prompt_slope: bool) -> tuple[list[Alert], int]:
        detector = LearnedDetector(LearnedConfig(**FAST, prompt_slope=prompt_slope))
        alerts: list[Alert] = []
        hits = -1
        for i in range(700):
            end = T0 + STEP * i
            vectors = [mixed_fv(f"r{k}", end, random.Random(seed * 7919 + (i // 12) * 10 + k),
                                change if k == 1 and i >= 450 else 1.0) for k in range(4)]
            detector.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
            if hits < 0 and alerts:
                hits = int(detector._hits[detector._row["m/r1"]])
        return [a for a in alerts if a.state == "open"], hits

    opened, hits = run_pool(1.5, True)
    assert [(a.replica, a.evidence["feature"]) for a in opened] == [("r1", "ttft_per_prompt_token")]
    assert opened[0].ts > T0 + STEP * 450 and "shift" in str(opened[0].evidence["tests"]).split("+")
    assert opened[0].evidence["requests"] >= 20.0 and hits < 20
    assert run_pool(1.5, False)[0] == []
    assert run_pool(1.0, True)[0] == [] and run_pool(1.0, False)[0] == []


@pytest.mark.parametrize("pool_range", [True, False])
def test_a_level_the_pool_has_been_at_is_not_novel(pool_range: bool) -> None:
    """r0 takes turns at 1.5x the pool's TTFT (its normal); r1 then moves to 1.4x for a while: new for
    r1, but within the range the pool's replicas spanned, so (with pool_range) not an alert."""
    detector = LearnedDetector(LearnedConfig(**FAST, pool_range=pool_range))

    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        ttft = 200.0
        if replica == "r0" and (i // 10) % 2:
            ttft = 300.0
        if replica == "r1" and i >= 100:
            ttft = 280.0
        return replica_fv(replica, end, rng, ttft=ttft)

    alerts = run(detector, 130, story)
    opened = [(a.replica, a.state) for a in alerts if a.state == "open"]
    assert opened[:1] == ([] if pool_range else [("r1", "open")])


def test_models_take_turns() -> None:
    detector = LearnedDetector(LearnedConfig(cadence_steps=3))
    rng = random.Random(1)
    learned_at = []
    for i in range(9):
        end = T0 + STEP * i
        vectors = [replica_fv(f"r{k}", end, rng) for k in range(4)]
        before = detector.state_dict()
        detector.update_step(StepColumns(vectors, [None] * 4), end, [], [])
        if detector.state_dict() != before:
            learned_at.append(i)
    assert len(learned_at) == 3 and learned_at[1] - learned_at[0] == 3


def test_a_lasting_change_becomes_the_new_normal() -> None:
    detector = LearnedDetector(LearnedConfig(**FAST, adapt=20, clear_steps=3))
    run(detector, 80, steady)

    def shifted(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=800.0 if replica == "r3" else 200.0)

    # opens after persistence (6), starts over at adapt (20 holding samples), resolves clear_steps (3)
    # later, and after its new warm-up the new level is its normal: nothing more
    alerts = run(detector, 120, shifted, start=80)
    assert [(a.replica, a.state) for a in alerts] == [("r3", "open"), ("r3", "resolved")]
    assert alerts[1].ts - alerts[0].ts == STEP * (20 - 6 + 3)


@pytest.mark.parametrize("split", [50, 83, 95])
def test_state_round_trips_through_json_and_continues_identically(split: int) -> None:
    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=900.0 if replica == "r1" and 82 <= i < 90 else 200.0)

    reference = LearnedDetector(LearnedConfig(**FAST))
    expected = run(reference, 110, story)
    assert [a.state for a in expected] == ["open", "resolved"]
    before = LearnedDetector(LearnedConfig(**FAST))
    head = run(before, split, story)
    restored = LearnedDetector(LearnedConfig(**FAST))
    restored.load_state(json.loads(json.dumps(before.state_dict())))
    assert restored.state_dict() == before.state_dict()
    tail = run(restored, 110 - split, story, start=split)
    assert [a.to_dict() for a in head + tail] == [a.to_dict() for a in expected]
    assert restored.state_dict() == reference.state_dict()


def test_state_of_other_features_restarts_the_scorers_and_keeps_the_alerts() -> None:
    detector = LearnedDetector(LearnedConfig(**FAST))

    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=900.0 if replica == "r1" and i >= 82 else 200.0)

    run(detector, 90, story)
    assert detector.open_alerts() == {"m/r1": "INFO"}
    other = LearnedDetector(LearnedConfig(**{**FAST, "features": ("ttft_p50",)}))
    other.load_state(detector.state_dict())
    assert other.open_alerts() == {"m/r1": "INFO"}
    assert all(int(other._bank.n[row]) == 0 for row in other._row.values())


def test_a_shift_test_of_another_layout_starts_over_and_the_scorers_are_kept() -> None:
    """A checkpoint whose shift tests weighed each window as one (their key without "requests", a
    row of 58 numbers): the scorers and the alerts restore, the shift tests start fresh."""
    detector = LearnedDetector(LearnedConfig(**FAST))

    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=900.0 if replica == "r1" and i >= 82 else 200.0)

    run(detector, 90, story)
    state = detector.state_dict()
    state["layout"][2] = [10, 60]
    for entry in state["keys"].values():
        entry["z"] = base64.b64encode(np.zeros(58).tobytes()).decode("ascii")
    restored = LearnedDetector(LearnedConfig(**FAST))
    restored.load_state(state)
    assert restored.open_alerts() == {"m/r1": "INFO"}
    assert all(int(restored._bank.n[row]) > 0 for row in restored._row.values())
    assert not restored._shift.past.any() and len(restored._shift) == len(restored._row)


def test_a_state_that_judged_ttft_per_prompt_token_as_given_restarts_the_scorers() -> None:
    """A checkpoint of a version that judged TTFT per prompt token as given (no prompt slope): its
    scorers and shift tests learned another feature and start over; the alerts and the pool's slope
    (none saved) restore; a checkpoint of this version restores its slopes."""
    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=900.0 if replica == "r1" and i >= 82 else 200.0)

    detector = LearnedDetector(LearnedConfig(**FAST))
    run(detector, 90, story)
    state = detector.state_dict()
    assert state["prompt_slopes"]["m"][0] > 0.0 and state["layout"][0][0] == "ttft_per_prompt_token@prompt@load"
    older = {k: v for k, v in state.items() if k != "prompt_slopes"}
    older["layout"] = [["ttft_per_prompt_token", *state["layout"][0][1:]], *state["layout"][1:]]
    restored = LearnedDetector(LearnedConfig(**FAST))
    restored.load_state(older)
    assert restored.open_alerts() == {"m/r1": "INFO"}
    assert all(int(restored._bank.n[row]) == 0 for row in restored._row.values())
    assert restored.state_dict()["prompt_slopes"] == {}
    again = LearnedDetector(LearnedConfig(**FAST))
    again.load_state(json.loads(json.dumps(state)))
    assert again.state_dict() == state


def test_forget_ends_the_alert_and_keeps_what_was_learned() -> None:
    """The decider forgets a replica whose window is empty (and one released): its alert goes, its
    learned normal stays (a quiet minute does not restart the warm-up); one not sampled for `memory`
    samples' time is dropped, the others keep their state."""
    detector = LearnedDetector(LearnedConfig(**FAST))

    def story(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, ttft=900.0 if replica == "r1" and i >= 82 else 200.0)

    run(detector, 90, story)
    assert detector.open_alerts() == {"m/r1": "INFO"}
    before = detector.state_dict()["keys"]["m/r1"]
    detector.forget("m/r1")
    detector.forget("m/nobody")
    assert detector.open_alerts() == {}
    learned = {"s": before["s"], "z": before["z"], "t": T0 + STEP * 89}
    assert detector.state_dict()["keys"]["m/r1"] == learned  # what it learned stays, its run starts over

    def without_r1(i: int, replica: str, end: float, rng: random.Random) -> FeatureVector:
        return replica_fv(replica, end, rng, count=0 if replica == "r1" else 120)

    others = {k: v for k, v in detector.state_dict()["keys"].items() if k != "m/r1"}
    run(detector, FAST["memory"] + 1, without_r1, start=90)  # r1's windows empty: not a sample
    keys = detector.state_dict()["keys"]
    assert "m/r1" not in keys and sorted(keys) == sorted(others)


def test_in_the_decider() -> None:
    """Through ModelDecider (the worker's stage 2 path), and its state through JSON."""
    settings = DetectorSettings.from_overrides({"learned": {**FAST}, "decider": {"disabled": "long_tail"}})
    decider = ModelDecider(settings)
    rng = random.Random(2)
    opened = []
    for i in range(100):
        end = T0 + STEP * i
        vectors = [replica_fv(f"r{k}", end, rng, ttft=1500.0 if k == 0 and i >= 85 else 200.0) for k in range(4)]
        opened += [a for a in decider.step("m", end, vectors, pool_fv(vectors, end), {}).alerts
                   if a.detector == "learned"]
    assert [(a.replica, a.state) for a in opened] == [("r0", "open")]
    restored = ModelDecider.from_state(json.loads(json.dumps(decider.state_dict())), settings)
    assert restored.state_dict() == decider.state_dict()


@pytest.mark.parametrize("bad", [{"features": "ttft_p50,no_such_field"}, {"features": ""}, {"threshold": "1.5"},
                                 {"min_replicas": "1"}, {"cadence_steps": "0"}, {"memory": "2", "blocks": "4"},
                                 {"fading": "1.5"}])
def test_bad_settings_are_refused_with_the_setting_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="learned"):
        LearnedConfig.from_overrides(bad)


def loaded_fv(replica: str, end: float, rng: random.Random, batch: float, queue: float,
              ttft_factor: float = 1.0) -> FeatureVector:
    """A replica's window whose time per token grows with its batch and whose TTFT grows with its
    queue, as an engine's do (the pool's relation: tpot ~ batch^0.6, TTFT ~ (1 + queue)^0.7)."""
    fv = replica_fv(replica, end, rng)
    noise = rng.uniform(0.95, 1.05)
    return dataclasses.replace(fv, batch_size_mean=batch, queue_length_mean=queue,
                               tpot_p50=5.0 * batch ** 0.6 * noise,
                               ttft_per_prompt_token=0.05 * (1.0 + queue) ** 0.7 * ttft_factor * noise)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_replica_that_takes_a_peers_load_is_judged_at_the_pools_typical_load(seed: int) -> None:
    """From step 300 r2 serves the share of a stopped peer: batches of 24-32 and queues of 30-40 where
    the pool's windows ranged over 4-16 and 0-20. Its time per token and TTFT rise as the pool's
    relation with load says: judged at the pool's typical load, nothing to report; as given, an alert.
    A TTFT twice the pool's at the same load (r1, from step 300) is still found."""
    def run_pool(load_slope: bool, drift: float) -> list[tuple[str | None, str]]:
        detector = LearnedDetector(LearnedConfig(**FAST, load_slope=load_slope))
        alerts: list[Alert] = []
        for i in range(420):
            end = T0 + STEP * i
            rng = random.Random(seed * 7919 + i)
            vectors = []
            for k in range(4):
                batch, queue = rng.uniform(4.0, 16.0), rng.uniform(0.0, 20.0)
                if k == 2 and i >= 300:
                    batch, queue = rng.uniform(24.0, 32.0), rng.uniform(30.0, 40.0)
                vectors.append(loaded_fv(f"r{k}", end, rng, batch, queue, drift if k == 1 and i >= 300 else 1.0))
            detector.update_step(StepColumns(vectors, [None] * 4), end, alerts, [])
        return [(a.replica, a.evidence["feature"]) for a in alerts if a.state == "open"]

    assert run_pool(True, 1.0) == []
    assert ("r2", "tpot_p50") in run_pool(False, 1.0) or ("r2", "ttft_per_prompt_token") in run_pool(False, 1.0)
    assert run_pool(True, 2.0) == [("r1", "ttft_per_prompt_token")]
