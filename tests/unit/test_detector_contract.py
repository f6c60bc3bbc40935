"""The contract every detector keeps, checked over all of them (parametrized).

Each detector gets a scenario: a way to build one step's inputs where its rule holds or not,
how many steps it needs to open and to resolve. Then, for every detector: it is pure (same
inputs, same outputs), its state survives a JSON round trip and continues identically, it fires
on a clear case, stays quiet on a clean one, resolves once the condition clears, and an edge
sequence (the rule flipping every step) opens one alert and never flaps.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from skewwatch.config import ConfigError
from skewwatch.pipeline.detectors.alerts import DetectorOutput, Severity
from skewwatch.pipeline.detectors.base import Detector
from skewwatch.pipeline.detectors.registry import DETECTORS
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import ThresholdDetector
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

STEP = 5.0
T0 = 1_000_000.0


def base_fv(end: float, **fields: Any) -> FeatureVector:
    values: dict[str, Any] = {
        "model": "m",
        "replica": "r1",
        "window_start": end - 60.0,
        "window_end": end,
        "count": 200,
        "step_count": 15,
        "latency_p50": 100.0,
        "latency_p95": 150.0,
        "latency_p99": 200.0,
        "latency_mean": 110.0,
        "batch_size_mean": 8.0,
        "batch_size_std": 1.0,
        "batch_fill_mean": 0.6,
        "prompt_tokens_mean": 3000.0,
        "prompt_tokens_var": 10_000.0,
        "tokens_per_s": 500.0,
        "kv_cache_hit_rate_mean": 0.75,
        "queue_length_mean": 4.0,
    }
    values.update(fields)
    return FeatureVector(**values)


Inputs = tuple[FeatureVector, TelemetrySample | None]


@dataclass
class Scenario:
    """Inputs for a pattern of steps: the rule holds at step i iff pattern[i]."""

    build: Callable[[list[bool]], list[Inputs]]
    severity: Severity
    action: str | None
    open_after: int  # consecutive holding steps before the alert opens (persistence)
    clear_after: int  # consecutive clean steps before it resolves
    routing: tuple[str, ...] = ()  # router actions sent beside the detector's own while it is open
    # the settings that turn a detector that is off by default on: the contract checks its rule
    on: dict[str, Any] = dataclasses.field(default_factory=dict)


def _simple(
    holding: Callable[[float], Inputs], clean: Callable[[float], Inputs]
) -> Callable[[list[bool]], list[Inputs]]:
    def build(pattern: list[bool]) -> list[Inputs]:
        return [(holding if h else clean)(T0 + STEP * i) for i, h in enumerate(pattern)]

    return build


def _warmed(warmup: int, holding: Callable[[float], Inputs],
            clean: Callable[[float], Inputs]) -> Callable[[list[bool]], list[Inputs]]:
    """``warmup`` clean steps first (a rule judged against the replica's own past needs one; they
    never fire), then the pattern."""

    def build(pattern: list[bool]) -> list[Inputs]:
        return [(holding if h else clean)(T0 + STEP * i) for i, h in enumerate([False] * warmup + pattern)]

    return build


def _recent(mean: float) -> dict[str, Any]:
    return {"recent_count": 40, "recent_prompt_tokens_mean": mean, "recent_prompt_tokens_var": (0.8 * mean) ** 2}


def _live(end: float, mean_ms: float) -> TelemetrySample:
    # the engine's per-token latencies over the last scrape: tokens 22 ms at the median, mean_ms on average
    return TelemetrySample(ts=end, replica="r1", source="vllm", tpot_count=800, tpot_mean_s=mean_ms / 1000,
                           tpot_p50_s=0.022, tpot_p99_s=0.09, ttft_count=5, ttft_mean_s=0.08, ttft_p50_s=0.08,
                           ttft_p99_s=0.2)


def _engine(end: float, queue: int, frag: float = 0.1) -> TelemetrySample:
    return TelemetrySample(ts=end, replica="r1", source="vllm", queue_length=queue, running_requests=2,
                           kv_cache_usage=0.05, batch_capacity=32, tpot_count=400, tpot_mean_s=0.03,
                           tpot_p50_s=0.028, memory_reserved_bytes=10e9, memory_allocated_bytes=10e9 * (1 - frag))


def _learned(pattern: list[bool]) -> list[Inputs]:
    # 50 warm-up steps (the scorer's default warmup and grace are 40 samples) at the replica's usual
    # TTFT per prompt token (cycling over a small range), then each step at 5x that (holds) or back at it (does not)
    warm = 50
    steps = [False] * warm + pattern
    return [(base_fv(T0 + STEP * i, ttft_per_prompt_token=1.0 if holds else 0.2 + 0.01 * (i % 3)), None)
            for i, holds in enumerate(steps)]


def _kv_tel(end: float, frag: float) -> TelemetrySample:
    # fragmentation = 1 - allocated / reserved
    return TelemetrySample(
        ts=end, replica="r1", source="simulated", memory_reserved_bytes=10e9, memory_allocated_bytes=10e9 * (1 - frag)
    )


SCENARIOS: dict[str, Scenario] = {
    # the live rule against the replica's own past (no peers here): its baseline and its noise need
    # history first; then tokens 2.7 x slower on average with the same median hold
    "long_tail": Scenario(
        build=_warmed(30, lambda t: (base_fv(t), _live(t, 60.0)), lambda t: (base_fv(t), _live(t, 25.0))),
        severity=Severity.WARNING,
        action="enable_tracing",
        open_after=1,
        clear_after=7,  # clear_steps 6, and the first clean step's 10 s span still holds the last slow sample
    ),
    # a stuck scheduler: 30 requests wait beside 30 free slots and free KV, two scrapes in a row
    "batch_collapse": Scenario(
        build=_simple(
            lambda t: (base_fv(t, rps=3.0), _engine(t, queue=30)),
            lambda t: (base_fv(t, rps=3.0), _engine(t, queue=0)),
        ),
        severity=Severity.CRITICAL,
        action="adjust_batch_policy",
        open_after=2,
        clear_after=2,
        routing=("throttle",),
    ),
    # the newest 20 s's prompts 8 x the replica's own window that ended where they begin
    "context_burst": Scenario(
        build=_warmed(12, lambda t: (base_fv(t, **_recent(8 * 3000.0)), None),
                      lambda t: (base_fv(t, **_recent(3000.0)), None)),
        severity=Severity.INFO,
        action="prewarm_tokenizer_cache",
        open_after=1,
        clear_after=2,
    ),
    # fragmentation with a hit rate below the replica's own past
    "kv_pressure": Scenario(
        build=_warmed(14, lambda t: (base_fv(t, kv_cache_hit_rate_mean=0.5), _kv_tel(t, 0.6)),
                      lambda t: (base_fv(t, kv_cache_hit_rate_mean=0.75), _kv_tel(t, 0.1))),
        severity=Severity.WARNING,
        action=None,
        open_after=2,
        clear_after=2,
    ),
    # every token twice as slow as the replica's own past (no peers here: it needs 14 steps of it)
    "slow_replica": Scenario(
        build=_warmed(14, lambda t: (base_fv(t, tpot_p50=40.0, tpot_p90=52.0), None),
                      lambda t: (base_fv(t, tpot_p50=20.0, tpot_p90=26.0), None)),
        severity=Severity.WARNING,
        action=None,
        open_after=2,
        clear_after=4,
        on={"enabled": True},
    ),
    "learned": Scenario(
        build=_learned,
        severity=Severity.INFO,
        action=None,
        open_after=6,
        clear_after=4,
    ),
    "gpu_health": Scenario(
        build=_simple(
            lambda t: (base_fv(t, step_cuda_errors={"cudaErrorMemoryAllocation": 1}), None),
            lambda t: (base_fv(t), None),
        ),
        severity=Severity.WARNING,
        action="isolate",
        open_after=1,
        clear_after=60,  # isolation: 300 s without a new error
    ),
}


def run(detector: Detector, inputs: list[Inputs]) -> list[DetectorOutput]:
    return [detector.update(fv, tel, now=fv.window_end) for fv, tel in inputs]


def snapshot(outputs: list[DetectorOutput]) -> list[Any]:
    return [([a.to_dict() for a in o.alerts], [a.to_dict() for a in o.actions]) for o in outputs]


def alerts_of(outputs: list[DetectorOutput], state: str) -> list[Any]:
    return [a for o in outputs for a in o.alerts if a.state == state]


def inputs_for(name: str, pattern: list[bool]) -> list[Inputs]:
    """The scenario's inputs; the pattern is the *tail* (a rule judged against the replica's own past
    gets warm-up steps first)."""
    return SCENARIOS[name].build(pattern)


DETECTOR_NAMES = sorted(DETECTORS)


def make(name: str) -> Detector:
    """``name``'s detector with its defaults, turned on where it is off by default."""
    on = SCENARIOS[name].on
    return DETECTORS[name](DETECTORS[name].Config.from_overrides(on)) if on else DETECTORS[name]()


def test_every_detector_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(DETECTORS)


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_pure_same_inputs_same_outputs(name: str) -> None:
    holding = max(4, SCENARIOS[name].open_after)  # enough to open
    pattern = [False] + [True] * holding + [False, False, True] + [False] * 70
    inputs = inputs_for(name, pattern)
    first = snapshot(run(make(name), inputs))
    second = snapshot(run(make(name), inputs))
    assert first == second
    assert any(alerts for alerts, _ in first)  # the sequence did something worth comparing


@pytest.mark.parametrize("name", DETECTOR_NAMES)
@pytest.mark.parametrize("split", [3, 16, 30])
def test_state_round_trips_through_json_and_continues_identically(name: str, split: int) -> None:
    pattern = [True] * 5 + [False] * 3 + [True] * 4 + [False] * 80
    inputs = inputs_for(name, pattern)
    reference = make(name)
    expected = snapshot(run(reference, inputs))

    before = make(name)
    head = snapshot(run(before, inputs[:split]))
    restored = make(name)
    restored.load_state(json.loads(json.dumps(before.state_dict())))
    assert restored.state_dict() == before.state_dict()
    tail = snapshot(run(restored, inputs[split:]))
    assert head + tail == expected
    assert restored.state_dict() == reference.state_dict()


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_fires_on_a_clear_case(name: str) -> None:
    scenario = SCENARIOS[name]
    outputs = run(make(name), inputs_for(name, [True] * (scenario.open_after + 3)))
    opened = alerts_of(outputs, "open")
    assert len(opened) == 1
    alert = opened[0]
    assert (alert.detector, alert.severity, alert.model, alert.replica) == (name, scenario.severity, "m", "r1")
    assert alert.evidence  # the numbers that triggered it
    json.dumps(alert.to_dict())
    if scenario.action is not None:
        assert outputs[-1].actions and {a.action for a in outputs[-1].actions} == {scenario.action, *scenario.routing}
        assert all(a.replica == "r1" and a.expires_at is not None for a in outputs[-1].actions)
        json.dumps([a.to_dict() for a in outputs[-1].actions])
    else:
        assert not any(o.actions for o in outputs)


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_opens_only_after_persistence(name: str) -> None:
    scenario = SCENARIOS[name]
    outputs = run(make(name), inputs_for(name, [True] * scenario.open_after))
    steps = [i for i, o in enumerate(outputs) if o.alerts]
    assert steps == [len(outputs) - 1]


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_silent_on_a_clean_case(name: str) -> None:
    outputs = run(make(name), inputs_for(name, [False] * 40))
    assert not any(o.alerts or o.actions for o in outputs)
    assert make(name).open_alerts() == {}


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_resolves_after_the_condition_clears(name: str) -> None:
    scenario = SCENARIOS[name]
    n_open = scenario.open_after + 2
    detector = make(name)
    outputs = run(detector, inputs_for(name, [True] * n_open + [False] * (scenario.clear_after + 5)))
    opened, resolved = alerts_of(outputs, "open"), alerts_of(outputs, "resolved")
    assert len(opened) == 1 and len(resolved) == 1
    offset = len(outputs) - (n_open + scenario.clear_after + 5)
    resolved_at = next(i for i, o in enumerate(outputs) if any(a.state == "resolved" for a in o.alerts))
    assert resolved_at == offset + n_open + scenario.clear_after - 1
    assert resolved[0].severity == opened[0].severity
    assert not any(o.actions for o in outputs[resolved_at:])
    assert detector.open_alerts() == {}


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_no_flapping_on_an_edge_sequence(name: str) -> None:
    scenario = SCENARIOS[name]
    pattern = [True] * scenario.open_after + [False, True] * 15
    detector = make(name)
    outputs = run(detector, inputs_for(name, pattern))
    assert len(alerts_of(outputs, "open")) == 1
    assert alerts_of(outputs, "resolved") == []
    assert len(detector.open_alerts()) == 1
    if scenario.action is not None:
        first_open = next(i for i, o in enumerate(outputs) if o.alerts)
        assert all(o.actions for o in outputs[first_open:])  # the action stays in force throughout


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_keys_are_independent(name: str) -> None:
    detector = make(name)
    firing = inputs_for(name, [True] * (SCENARIOS[name].open_after + 1))
    clean = inputs_for(name, [False] * (SCENARIOS[name].open_after + 1))
    alerts = []
    for (fv_hot, tel_hot), (fv_cold, tel_cold) in zip(firing, clean, strict=True):
        fv_cold.replica = "r2"
        alerts += detector.update(fv_hot, tel_hot, fv_hot.window_end).alerts
        alerts += detector.update(fv_cold, tel_cold, fv_cold.window_end).alerts
    assert {a.replica for a in alerts} == {"r1"}
    detector.forget("m/r1")
    assert detector.open_alerts() == {}


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_config_overrides_accept_env_strings_and_reject_unknown_keys(name: str) -> None:
    from skewwatch.config import ConfigError

    cls = DETECTORS[name]
    field_name, value = next(iter(cls.Config().to_dict().items()))
    config = cls.Config.from_overrides(
        {field_name: str(value) if not isinstance(value, tuple) else ",".join(map(str, value))}
    )
    assert config == cls.Config()
    with pytest.raises(ConfigError, match=name):
        cls.Config.from_overrides({"no_such_threshold": "1"})


def test_alert_and_action_round_trip_and_identity() -> None:
    from skewwatch.pipeline.detectors.alerts import Action, Alert

    alert = Alert(1.0, "m", "r1", "kv_pressure", Severity.INFO, "open", "msg", {"rule": "prefill", "x": 1.5})
    assert Alert.from_dict(json.loads(json.dumps(alert.to_dict()))) == alert
    assert alert.key == "m/r1/kv_pressure#prefill"
    assert Alert(1.0, "m", None, "long_tail", Severity.WARNING, "resolved", "", {}).key == "m/*/long_tail"
    with pytest.raises(ValueError, match="state"):
        Alert.from_dict({**alert.to_dict(), "state": "closed"})
    action = Action("r1", "isolate", Severity.WARNING, "reason", {"health": 0.4}, 300.0)
    assert Action.from_dict(json.loads(json.dumps(action.to_dict()))) == action
    renewed = Action("r1", "isolate", Severity.WARNING, "reason", {"health": 0.4}, 600.0)
    assert renewed.identity == action.identity and renewed != action


# --------------------------------------------------------------------------- column screens


def _random_step(rng: random.Random, n: int, end: float) -> tuple[list[FeatureVector], list[TelemetrySample | None]]:
    """Vectors and fresh telemetry that land on both sides of every threshold, with gaps."""

    def maybe(value: float) -> float | None:
        return None if rng.random() < 0.15 else value

    vectors: list[FeatureVector] = []
    samples: list[TelemetrySample | None] = []
    for i in range(n):
        p50 = rng.choice([0.0, rng.uniform(50, 500)])
        tokens = rng.uniform(1, 400)
        vectors.append(base_fv(
            end, replica=f"r{i}", count=rng.choice([0, 1, 19, 20, 200]),
            latency_p50=maybe(p50), latency_p99=maybe(p50 * rng.uniform(1.0, 6.0)),
            latency_mean=maybe(p50 * rng.uniform(0.5, 2.0)), latency_p95=maybe(rng.uniform(50, 200)),
            completion_tokens_mean=maybe(tokens), completion_tokens_var=maybe(tokens**2 * rng.uniform(0, 2)),
            batch_size_std=maybe(rng.uniform(0, 4)), batch_fill_mean=maybe(rng.uniform(0, 1)),
            batch_size_mean=maybe(rng.uniform(1, 32)), queue_length_mean=maybe(rng.uniform(0, 20)),
            kv_cache_hit_rate_mean=maybe(rng.uniform(0.4, 1.0)), tokens_per_s=rng.uniform(0, 300),
            prompt_tokens_mean=maybe(rng.uniform(500, 5000)), prompt_tokens_var=maybe(rng.uniform(0, 1e6)),
            **_tpot_and_recent(rng, maybe),
        ))
        if rng.random() < 0.3:
            samples.append(None)
            continue
        reserved = 10e9
        samples.append(TelemetrySample(
            ts=end, replica=f"r{i}", source="simulated", queue_length=rng.choice([None, rng.randint(0, 20)]),
            running_requests=rng.choice([None, rng.randint(0, 32)]), batch_capacity=rng.choice([None, 32]),
            kv_cache_usage=rng.choice([None, rng.uniform(0, 1)]),
            kv_cache_hit_rate=rng.choice([None, rng.uniform(0.4, 1)]),
            memory_reserved_bytes=rng.choice([None, 0.0, reserved, reserved]),
            memory_allocated_bytes=rng.choice([None, reserved * rng.uniform(0.3, 1.1)]),
            utilization_gpu=rng.uniform(0, 1),
            **_live_tokens(rng, i, late=end >= T0 + 25 * STEP),
        ))
    return vectors, samples


def _live_tokens(rng: random.Random, i: int, late: bool) -> dict[str, Any]:
    """The engine's per-token latencies of the last scrape: steady, or (a few replicas, ``late``
    in the run, once their own noise is learnt) a tail or a slowed median, with first tokens;
    sometimes none."""
    if rng.random() < 0.2:
        return {}
    tpot = 0.02 * (1.0 + 0.01 * (i % 7))
    mean, p50 = tpot * rng.uniform(0.95, 1.05), tpot
    if i % 5 == 0 and late:  # a tail: the mean moves, the median does not
        mean = tpot * rng.choice([1.2, 2.0, 4.0])
    elif i % 5 == 1 and late:  # the whole replica slower
        mean = p50 = tpot * rng.choice([1.5, 3.0])
    return {"tpot_count": rng.choice([0, 50, 400, 400]), "tpot_mean_s": mean, "tpot_p50_s": rng.choice([None, p50]),
            "ttft_count": rng.choice([0, 3]), "ttft_p50_s": rng.uniform(0.08, 0.12),
            "ttft_p99_s": rng.choice([None, rng.uniform(0.2, 1.0)])}


def _tpot_and_recent(rng: random.Random, maybe: Any) -> dict[str, Any]:
    """The v1.2 fields: TPOT quantiles (tight, spread or with one outlier) and the recent 20 s."""
    p50 = rng.uniform(10, 60)
    p99 = p50 * rng.choice([1.2, 1.4, 3.0])
    return {"tpot_p50": maybe(p50), "tpot_p99": maybe(p99), "tpot_max": maybe(p99 * rng.choice([1.0, 1.5, 8.0])),
            "recent_count": rng.choice([None, 0, 14, 15, 60]),
            "recent_prompt_tokens_mean": maybe(rng.uniform(500, 5000)),
            "recent_prompt_tokens_var": maybe(rng.uniform(0, 1e7))}


def _configs(name: str) -> list[Any]:
    """The defaults, the seed profile's section, and each boolean option flipped."""
    from skewwatch.pipeline.detectors.profiles import PROFILES

    cls = DETECTORS[name].Config
    on = SCENARIOS[name].on
    base = cls.from_overrides(on)
    configs = [base]
    if name in PROFILES["seed"]:
        configs.append(cls.from_overrides(PROFILES["seed"][name]))
    for f in msgspec.structs.fields(cls):
        if isinstance(getattr(base, f.name), bool):
            try:
                configs.append(cls.from_overrides({**on, f.name: not getattr(base, f.name)}))
            except ConfigError:
                continue  # e.g. seed_rule off needs another rule on
    return configs


@pytest.mark.parametrize("name", [n for n in DETECTOR_NAMES if issubclass(DETECTORS[n], ThresholdDetector)])
def test_column_screen_never_hides_a_rule_that_holds(name: str) -> None:
    """``quiet`` (the rules over a step's replicas as columns) is True only where evaluate() finds
    no rule holding and changes the key's memory exactly as remember() does: the decider calls
    only remember() for those replicas (nothing at all for a detector without ``remembers``, which
    judges a key that holds memory whatever the screen says, and must leave none on a screened one)."""
    rng = random.Random(7)
    screened = held = 0
    for config in _configs(name):
        detector = DETECTORS[name](config)
        assert isinstance(detector, ThresholdDetector)
        memories: dict[str, dict[str, Any]] = {}  # per key, as the steps go on
        for step in range(40):  # the last 15 with tails (_live_tokens), once the noise is learnt
            vectors, samples = _random_step(rng, 50, T0 + STEP * step)
            columns = StepColumns(vectors, samples)
            detector.prepare(columns)  # the pool's baselines first, as update_step does
            quiet = detector.quiet(columns)
            if quiet is None:
                detector.prepare(None)
                continue
            for fv, sample, is_quiet in zip(vectors, samples, quiet.tolist(), strict=True):
                before = json.loads(json.dumps(memories.get(fv.key, {})))
                memory = memories.setdefault(fv.key, {})
                findings = detector.evaluate(fv, sample, memory)
                remembered = json.loads(json.dumps(before))
                detector.remember(fv, sample, remembered)
                held += any(f.holds for f in findings.values())
                if is_quiet:
                    screened += 1
                    assert not any(f.holds for f in findings.values()), (config, fv, sample)
                    if detector.remembers or not before:  # (a key with memory is judged whatever the screen)
                        assert json.dumps(memory) == json.dumps(remembered)  # NaN (a missing latency) equal too
                    if not detector.remembers:
                        assert memory == {}  # the decider drops a screened key's idle state, memory too
            detector.prepare(None)
    assert screened > 0 and held > 0  # both sides of the screen seen


@pytest.mark.parametrize("name", [n for n in DETECTOR_NAMES if issubclass(DETECTORS[n], ThresholdDetector)
                                  and DETECTORS[n].remembers])
def test_a_screened_step_is_every_replica_evaluated(name: str) -> None:
    """``update_step`` with the screen (``remember`` on the replicas it clears, in the memory
    :meth:`prepare` just wrote) gives the alerts, actions and memory of evaluating every replica."""
    rng = random.Random(11)
    for config in _configs(name):
        screened, every = DETECTORS[name](config), DETECTORS[name](config)
        assert isinstance(screened, ThresholdDetector) and isinstance(every, ThresholdDetector)
        every.quiet = lambda step: None  # type: ignore[method-assign]  # evaluate every replica
        for step in range(40):
            end = T0 + STEP * step
            vectors, samples = _random_step(rng, 50, end)
            got: tuple[list[Any], list[Any]] = ([], [])
            want: tuple[list[Any], list[Any]] = ([], [])
            screened.update_step(StepColumns(vectors, samples), end, *got)
            every.update_step(StepColumns(vectors, samples), end, *want)
            assert [a.to_dict() for a in got[0]] == [a.to_dict() for a in want[0]]
            assert [a.to_dict() for a in got[1]] == [a.to_dict() for a in want[1]]
            assert json.dumps(screened.state_dict()) == json.dumps(every.state_dict())


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_step_fields_name_every_column_a_step_reads(name: str) -> None:
    """``step_fields`` and ``step_telemetry_fields`` (read by the decider in one pass) name every
    vector and sample field the detector reads as a column of a step, in each of its configurations."""
    rng = random.Random(3)
    read: set[str] = set()
    read_telemetry: set[str] = set()

    class Recording(StepColumns):
        def column(self, field: str) -> Any:
            read.add(field)
            return super().column(field)

        def telemetry_column(self, field: str) -> Any:
            read_telemetry.add(field)
            return super().telemetry_column(field)

    for config in _configs(name):
        detector = DETECTORS[name](config)
        read.clear()
        read_telemetry.clear()
        for step in range(20):
            end = T0 + STEP * step
            vectors, samples = _random_step(rng, 50, end)
            detector.update_step(Recording(vectors, samples), end, [], [])
        fields, telemetry_fields = set(detector.step_fields()), set(detector.step_telemetry_fields())
        assert read <= fields, (config, read - fields)
        assert read_telemetry <= telemetry_fields, (config, read_telemetry - telemetry_fields)
        # a detector that declares fields reads some (gpu_health: none)
        assert (bool(read), bool(read_telemetry)) == (bool(fields), bool(telemetry_fields))


def test_context_burst_history_is_the_last_lookback_whatever_the_order_of_steps() -> None:
    """Steps out of time order included, the history always holds exactly the windows ending
    within ``lookback_s`` of the latest call (and its checkpoint lists them in time order)."""
    from skewwatch.pipeline.detectors.context_burst import HISTORY_KEY, ContextBurstDetector

    rng = random.Random(5)
    detector = ContextBurstDetector()
    reference: dict[int, float] = {}
    end = T0
    for _ in range(300):
        end += rng.choice([5.0, 5.0, 5.0, 10.0, -5.0, -30.0, 0.0])
        var = rng.uniform(0, 1e4)
        fv = base_fv(end, prompt_tokens_var=var)
        detector._remember(fv)
        history = detector.state_dict()["keys"][fv.key]["memory"][HISTORY_KEY]
        end_ms = round(end * 1000)
        reference[end_ms] = var
        reference = {k: v for k, v in reference.items() if k >= end_ms - 60_000}
        assert {int(k): v[2] for k, v in history.items()} == reference  # [count, mean, variance]
        assert list(history) == sorted(history, key=int)


# --------------------------------------------------------------------------- evidence
# A rule judges only with enough evidence: a window of 1-5 requests says nothing but hard faults, and
# a healthy replica of a quiet pool, whose windows hold a handful of requests, raises nothing.


@pytest.mark.parametrize("name", DETECTOR_NAMES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_a_window_of_one_to_five_requests_alerts_on_nothing_but_hard_faults(name: str, n: int) -> None:
    thin = [(dataclasses.replace(fv, count=n, step_count=min(n, fv.step_count),
                                 recent_count=None if fv.recent_count is None else min(n, fv.recent_count)), tel)
            for fv, tel in inputs_for(name, [True] * 20)]
    outputs = run(make(name), thin)
    if name == "gpu_health":  # one CUDA error, XID or ECC fault is its own evidence
        assert len(alerts_of(outputs, "open")) == 1
    else:
        assert not any(o.alerts or o.actions for o in outputs), name


def low_rate_pool(seconds: float = 1800.0, rate: float = 0.08, seed: int = 14) -> Any:
    """A pool of four healthy replicas at ``rate`` requests/s each (9 s requests, so windows of a
    handful of requests and minute-long Poisson gaps), as stage 2 sees it: per step, the replicas that
    reported within 90 s with their 60 s window, and each replica's engine telemetry (its queue,
    running batch, KV usage, allocator, and the per-token latencies of whatever it ran in the last 5 s)."""
    from skewwatch.config import WindowSettings
    from tests.reference import reference_features

    rng = random.Random(seed)
    events = []
    for replica in POOL:
        t = T0 + rng.expovariate(rate)
        while t < T0 + seconds:
            completion = rng.randint(50, 500)
            tpot = rng.uniform(0.018, 0.026)
            ttft = rng.uniform(0.05, 0.4)
            events.append({"model": "m", "replica": replica, "ts": t + ttft + completion * tpot, "start": t,
                           "ttft": ttft, "tpot": tpot, "latency_ms": 1000 * (ttft + completion * tpot),
                           "ttft_ms": 1000 * ttft, "prompt_tokens": rng.randint(100, 3000),
                           "completion_tokens": completion, "kv_cache_hit_rate": rng.uniform(0.6, 0.9)})
            t += rng.expovariate(rate)
    events.sort(key=lambda e: e["ts"])
    last: dict[str, float] = {}
    index = 0
    for i in range(1, round(seconds / STEP)):
        end = T0 + STEP * i
        while index < len(events) and events[index]["ts"] < end:
            last[events[index]["replica"]] = events[index]["ts"]
            index += 1
        vectors = [reference_features(events[:index], "m", r, end, WindowSettings())
                   for r in POOL if r in last and end - last[r] <= 90]
        telemetry = {}
        for replica in POOL:
            running = [e for e in events if e["replica"] == replica and e["start"] < end and e["ts"] >= end - STEP]
            tokens = sum(min(e["ts"], end) - max(e["start"] + e["ttft"], end - STEP) for e in running) / 0.022
            started = [e for e in running if end - STEP <= e["start"] + e["ttft"] < end]
            sample = TelemetrySample(
                ts=end, replica=replica, source="vllm", queue_length=0, running_requests=len(running),
                kv_cache_usage=0.02 * len(running), memory_reserved_bytes=10e9, memory_allocated_bytes=9e9,
                tpot_count=max(round(tokens), 0),
                tpot_mean_s=sum(e["tpot"] for e in running) / len(running) if running else None,
                tpot_p50_s=min((e["tpot"] for e in running), default=None),
                ttft_count=len(started),
                ttft_p50_s=started[0]["ttft"] if started else None, ttft_p99_s=started[-1]["ttft"] if started else None)
            telemetry[replica] = (sample, 0.0)
        yield end, vectors, telemetry


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_a_low_rate_healthy_replica_raises_no_alert(name: str) -> None:
    from skewwatch.pipeline.detector_settings import DetectorSettings
    from skewwatch.pipeline.model_decisions import ModelDecider

    others = ",".join(n for n in DETECTORS if n != name)
    decider = ModelDecider(DetectorSettings.from_overrides({"decider": {"disabled": others}, name: SCENARIOS[name].on}))
    judged = 0
    for end, vectors, telemetry in low_rate_pool():
        d = decider.step("m", end, vectors, None, telemetry)
        assert d.alerts == [], (name, end, [a.to_dict() for a in d.alerts])
        judged += sum(1 for v in vectors if v.count >= 6)
    assert judged > 100  # windows with enough requests to be judged were there, and passed


# --------------------------------------------------------------------------- the pool: every detector
# Each detector runs alone in a model's decider over a pool of four replicas; whatever it finds,
# the correction keeps the pool's guards: a low-rate healthy replica is never weighted 0, a pool
# that falls silent is never routed to nowhere, and no more than the cap is ejected at once.

POOL = ("r0", "r1", "r2", "r3")


def _alone(name: str, **weights: Any) -> Any:
    from skewwatch.pipeline.detector_settings import DetectorSettings

    others = ",".join(n for n in DETECTORS if n != name)
    return DetectorSettings.from_overrides({"decider": {"disabled": others}, "weights": weights,
                                            name: SCENARIOS[name].on})


def _on(replica: str, inputs: Inputs) -> Inputs:
    import dataclasses

    fv, tel = inputs
    return (dataclasses.replace(fv, replica=replica),
            None if tel is None else dataclasses.replace(tel, replica=replica))


def _pool_step(decider: Any, end: float, by_replica: dict[str, Inputs]) -> Any:
    vectors = [fv for fv, _ in by_replica.values()]
    telemetry = {r: (tel, end - tel.ts) for r, (_, tel) in by_replica.items() if tel is not None}
    return decider.step("m", end, vectors, None, telemetry)


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_a_low_rate_healthy_replica_is_never_weighted_zero(name: str) -> None:
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.model_decisions import ModelDecider
    from tests.reference import reference_features

    rng = random.Random(14)
    events = []
    for replica in POOL:  # ~0.08 requests/s each, 9 s requests: Poisson gaps of a minute are ordinary
        t = T0 + rng.expovariate(0.08)
        while t < T0 + 1800:
            events.append({"model": "m", "replica": replica, "ts": t, "latency_ms": rng.uniform(7000, 11000),
                           "prompt_tokens": rng.randint(100, 3000), "completion_tokens": rng.randint(50, 500)})
            t += rng.expovariate(0.08)
    events.sort(key=lambda e: e["ts"])
    decider = ModelDecider(_alone(name))
    last: dict[str, float] = {}
    index = 0
    for i in range(1, 361):
        end = T0 + STEP * i
        while index < len(events) and events[index]["ts"] < end:
            last[events[index]["replica"]] = events[index]["ts"]
            index += 1
        vectors = [reference_features(events[:index], "m", r, end, WindowSettings())
                   for r in POOL if r in last and end - last[r] <= 90]  # stage 1 reports a replica 90 s
        d = decider.step("m", end, vectors, None, {})
        if end >= T0 + 120:
            assert all(w.weight > 0 for w in d.weights.values()), (name, end, d.weights)
            assert d.current is not None and d.current.mode == "normal"


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_a_whole_pool_silent_is_never_all_zero(name: str) -> None:
    from skewwatch.pipeline.model_decisions import ModelDecider

    decider = ModelDecider(_alone(name))
    holding = inputs_for(name, [True] * 12)
    clean = inputs_for(name, [False] * 12)
    ends = []
    for step_inputs, clean_inputs in zip(holding, clean, strict=True):  # the fault on r0, the others clean
        end = step_inputs[0].window_end
        ends.append(end)
        by_replica = {"r0": _on("r0", step_inputs), **{r: _on(r, clean_inputs) for r in POOL[1:]}}
        _pool_step(decider, end, by_replica)
    opened = set(decider.open_alerts())
    corrections = []
    for i in range(1, 240):  # then no replica reports anything for 20 minutes
        d = decider.step("m", ends[-1] + STEP * i, [], None, {})
        assert d.current is not None
        corrections.append(d.current)
        assert sum(d.current.weights.values()) == pytest.approx(1.0), (name, d.current)
        assert set(d.current.weights) == set(POOL)
    assert corrections[-1].mode == "panic" and "silent" in (corrections[-1].mode_reason or "")
    # without requests, only what does not need them may still be open (a GPU's health, the pool's own)
    still = {(detector, severity) for detector, severity in decider.open_alerts()}
    assert all(d == "fail_static" or not DETECTORS[d].needs_traffic for d, _ in still), (opened, still)


@pytest.mark.parametrize("name", DETECTOR_NAMES)
@pytest.mark.parametrize("share", [0.5, 0.25])
def test_the_ejection_cap_holds(name: str, share: float) -> None:
    from skewwatch.pipeline.failstatic import ejection_cap
    from skewwatch.pipeline.model_decisions import ModelDecider

    decider = ModelDecider(_alone(name, max_ejection_share=share))
    cap = ejection_cap(len(POOL), share)
    for step_inputs in inputs_for(name, [True] * 12):  # the rule holds on every replica at once
        d = _pool_step(decider, step_inputs[0].window_end, {r: _on(r, step_inputs) for r in POOL})
        assert d.current is not None
        out = {a.replica for a in d.current.actions if a.action in ("drain", "isolate")}
        out |= {r for r, w in d.current.weights.items() if w == 0.0}
        assert len(out) <= cap, (name, d.current)
        assert sum(d.current.weights.values()) == pytest.approx(1.0)


def test_the_ejection_cap_holds_for_hardware_faults_and_says_so() -> None:
    from skewwatch.pipeline.model_decisions import ModelDecider

    decider = ModelDecider(_alone("gpu_health", max_ejection_share=0.25))
    alerts = []
    for i in range(6):
        end = T0 + STEP * i
        by_replica = {r: (base_fv(end, replica=r, step_cuda_errors={"cudaErrorIllegalAddress": 1}
                                  if r in ("r0", "r1") else {}), None) for r in POOL}
        d = _pool_step(decider, end, by_replica)
        alerts += d.alerts
    assert d.current is not None and d.current.mode == "normal"
    assert [a.replica for a in d.current.actions if a.action == "drain"] == ["r0"]  # one of four
    assert d.current.weights["r0"] == 0.0 and d.current.weights["r1"] > 0
    cap = [a for a in alerts if a.detector == "fail_static"]
    assert [(a.evidence["rule"], a.state, a.replica) for a in cap] == [("ejection_cap", "open", None)]
    assert "held back: r1" in cap[0].message
