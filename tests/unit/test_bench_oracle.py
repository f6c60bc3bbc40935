"""The detection-quality benchmark's oracle (bench/oracle.py) on hand-made streams whose answer is known.

Each stream is a few 4-replica pools whose requests are drawn here, step by step, as the simulator's
chunks would bring them: a fault of known size from a known time must be found within a known delay,
clean replicas must stay under the threshold calibrated on them, a replica that receives nothing
cannot be judged, and the calibration must keep to its false-alert budget.
"""

from __future__ import annotations

import doctest
import json
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import oracle, quality  # noqa: E402
from bench.oracle import Fault, OracleFeed, calibrate, crossings  # noqa: E402
from skewwatch.schemas.requests.columns import RequestColumns  # noqa: E402
from skewwatch.schemas.telemetry_sample import TelemetrySample  # noqa: E402

START = 1_700_000_000.0
POOLS = {"m": ["r0", "r1", "r2", "r3"], "c1": ["r4", "r5", "r6", "r7"], "c2": ["r8", "r9", "r10", "r11"]}
PROMPT_P90 = 2000.0


def chunks(seconds: float, seed: int, rate: float = 1.0, slow: Mapping[str, tuple[float, float]] | None = None,
           burst: Mapping[str, float] | None = None, mute: Mapping[str, float] | None = None,
           drift: Mapping[str, tuple[float, float, float]] | None = None,
           shorter: Mapping[str, tuple[float, float]] | None = None,
           pools: Mapping[str, Sequence[str]] = POOLS) -> Iterator[SimpleNamespace]:
    """5 s chunks of Poisson requests on every replica of ``pools``, ``rate`` per second each: prompts
    log-normal around 1,000 tokens, 25 ms per output token. ``slow``: replica -> (from, factor) of its
    time per token; ``burst``: replica -> from when its prompts are ``PROMPT_P90`` x 4 (context_burst's
    defaults); ``mute``: replica -> from when it receives nothing (its telemetry goes on); ``drift``:
    replica -> (from, factor, ramp) of its TTFT (later by (k - 1) x the usual 150 ms, k on the ramp at
    the request's start); ``shorter``: replica -> (from, drop) of its outputs, each token slower to match."""
    rng = np.random.default_rng(seed)
    replicas = [(m, r) for m, rs in pools.items() for r in rs]
    t = START
    while t < START + seconds:
        end = t + 5.0
        rows: list[dict[str, Any]] = []
        for model, replica in replicas:
            if mute and replica in mute and t >= START + mute[replica]:
                continue
            for ts in np.sort(rng.uniform(t, end, rng.poisson(rate * 5.0))):
                completion = int(rng.integers(20, 400))
                tpot = 25.0 * math.exp(0.1 * rng.standard_normal())
                ttft = 150.0 * math.exp(0.2 * rng.standard_normal())
                prompt = 1000.0 * math.exp(0.6 * rng.standard_normal())
                if slow and replica in slow and ts >= START + slow[replica][0]:
                    tpot *= slow[replica][1]
                if drift and replica in drift and ts >= START + drift[replica][0]:
                    at, factor, ramp = drift[replica]
                    ttft += (factor - 1.0) * min((ts - START - at) / ramp if ramp > 0 else 1.0, 1.0) * 150.0
                if shorter and replica in shorter and ts >= START + shorter[replica][0]:
                    keep = 1.0 - shorter[replica][1]
                    completion, tpot = max(round(completion * keep), 1), tpot / keep
                latency = ttft + (completion - 1) * tpot
                if burst and replica in burst and ts - latency / 1000.0 >= START + burst[replica]:
                    prompt = 4.0 * PROMPT_P90 * math.exp(0.47 * rng.standard_normal())
                rows.append({"request_id": f"{replica}-{ts}", "ts": float(ts), "model": model, "replica": replica,
                             "latency_ms": latency, "prompt_tokens": max(int(prompt), 1),
                             "completion_tokens": completion, "batch_size": int(rng.integers(2, 8)),
                             "batch_capacity": 32, "ttft_ms": ttft, "kv_cache_hit_rate": float(rng.beta(30, 10)),
                             "status": "ok"})
        rows.sort(key=lambda row: row["ts"])
        samples = [TelemetrySample(ts=end, replica=r, source="simulated", memory_reserved_bytes=1e9,
                                   memory_allocated_bytes=1e9 * (1.0 - rng.uniform(0.05, 0.15)))
                   for _, r in replicas]
        yield SimpleNamespace(end_ts=end, requests=RequestColumns.from_rows(rows), telemetry=samples)
        t = end


def run(fault: Fault, seconds: float, seed: int, clean: Sequence[str] = ("c1", "c2"),
        **stream: Any) -> oracle.OracleRecord:
    feed = OracleFeed(POOLS, [fault], clean, (START + 60.0, START + seconds), PROMPT_P90)
    for chunk in chunks(seconds, seed, **stream):
        feed.add(chunk)
    return feed.record()


def test_doctests() -> None:
    result = doctest.testmod(oracle)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("kind, stream", [
    ("slow_replica", {"slow": {"r1": (300.0, 3.0)}}),
    ("context_burst", {"burst": {"r1": 300.0}}),
    ("ttft_drift", {"drift": {"r1": (300.0, 3.0, 0.0)}}),
    ("throughput_drop", {"shorter": {"r1": (300.0, 0.4)}}),
])
def test_a_shift_of_known_size_is_found_within_a_few_steps(kind: str, stream: dict[str, Any]) -> None:
    fault = Fault("m", "r1", kind, START + 300.0, START + 450.0)
    record = run(fault, 600.0, seed=1, **stream)
    calibrations, results = oracle.evaluate([record])
    found = results[0][0]
    # every request of the replica after the onset is far outside its peers': one or two steps, at
    # most three (the first requests to finish after it may have arrived before it)
    assert found["detectable"] and 5.0 <= found["delay_s"] <= 15.0, found
    # the same replica without the fault: nothing to find, on the same threshold
    clean = run(fault, 600.0, seed=1)
    assert not oracle.detect(clean.faults[0], calibrations[kind].h)["detectable"]


def test_a_smaller_shift_takes_longer() -> None:
    fault = Fault("m", "r1", "slow_replica", START + 300.0, START + 450.0)
    strong = oracle.evaluate([run(fault, 600.0, seed=2, slow={"r1": (300.0, 3.0)})])[1][0][0]
    weak = oracle.evaluate([run(fault, 600.0, seed=2, slow={"r1": (300.0, 1.15)})])[1][0][0]
    assert strong["detectable"]
    assert not weak["detectable"] or weak["delay_s"] > strong["delay_s"]


def test_a_drift_on_a_ramp_takes_longer_than_a_jump_to_its_top() -> None:
    jump = Fault("m", "r1", "ttft_drift", START + 300.0, START + 900.0, {"factor": 2.0, "ramp_s": 0.0})
    ramp = Fault("m", "r1", "ttft_drift", START + 300.0, START + 900.0, {"factor": 2.0, "ramp_s": 300.0})
    at_once = oracle.evaluate([run(jump, 1000.0, seed=4, drift={"r1": (300.0, 2.0, 0.0)})])[1][0][0]
    slowly = oracle.evaluate([run(ramp, 1000.0, seed=4, drift={"r1": (300.0, 2.0, 300.0)})])[1][0][0]
    assert at_once["detectable"] and slowly["detectable"], (at_once, slowly)
    assert slowly["delay_s"] > at_once["delay_s"]


def test_clean_replicas_stay_under_the_calibrated_threshold() -> None:
    """A clean run long enough for a budget of a few false alerts: calibrated on its clean pools, a
    fault label on a replica of another pool that nothing happened to is never raised."""
    fault = Fault("m", "r2", "slow_replica", START + 1800.0, START + 1950.0)
    record = run(fault, 3600.0, seed=3)
    assert record.clean_pool_hours == pytest.approx(2 * 3540 / 3600)
    calibrations, results = oracle.evaluate([record])
    assert calibrations["slow_replica"].h > 0
    assert results[0][0]["detectable"] is False and results[0][0]["requests"] > 100


def test_a_replica_that_receives_nothing_is_undetectable() -> None:
    fault = Fault("m", "r1", "context_burst", START + 300.0, START + 450.0)
    record = run(fault, 600.0, seed=4, burst={"r1": 300.0}, mute={"r1": 290.0})
    calibrations, results = oracle.evaluate([record])
    verdict = results[0][0]
    assert verdict["detectable"] is False and verdict["requests"] == 0
    assert verdict["why"] == "no request reached the replica during the fault"
    assert all(x == 0.0 for x in record.faults[0].increments)


def test_silence_is_found_from_the_request_count_alone() -> None:
    """replica_silence: no request from the onset while the peers go on (telemetry goes on too)."""
    fault = Fault("m", "r3", "replica_silence", START + 300.0, START + 450.0)
    record = run(fault, 600.0, seed=5, mute={"r3": 300.0})
    verdict = oracle.evaluate([record])[1][0][0]
    assert verdict["detectable"] and verdict["delay_s"] <= 30.0, verdict


def test_calibration_keeps_to_one_false_alert_per_pool_hour_on_its_own_data() -> None:
    rng = np.random.default_rng(6)
    streams = [list(rng.normal(-0.5, 1.5, 720)) for _ in range(8)]  # 8 replicas x 1 h of 5 s steps
    c = calibrate(streams, pool_hours=2.0)
    assert sum(len(crossings(s, c.h)) for s in streams) == c.crossings <= 2
    # and it is the smallest such threshold: a little lower crosses more often than allowed
    assert sum(len(crossings(s, c.h * 0.97)) for s in streams) > 2
    # thin clean data (under a pool-hour) allows no crossing at all
    thin = calibrate(streams, pool_hours=0.5)
    assert thin.crossings == 0 and thin.h >= c.h


def test_calibration_on_a_feed_meets_its_budget() -> None:
    fault = Fault("m", "r1", "context_burst", START + 300.0, START + 450.0)
    record = run(fault, 1200.0, seed=7)
    c = calibrate(record.clean["context_burst"], record.clean_pool_hours)
    assert c.streams == 8 and c.false_per_hour is not None and c.false_per_hour <= 1.0
    assert c.crossings == sum(len(crossings(s, c.h)) for s in record.clean["context_burst"])


def test_the_record_survives_json() -> None:
    fault = Fault("m", "r1", "gpu_fault", START + 100.0, START + 150.0)
    record = run(fault, 200.0, seed=8)
    again = oracle.OracleRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record


def test_the_quality_benchmark_prints_and_writes_the_oracle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "quality.json"
    assert quality.main(["--shape", "conv@1x", "--seeds", "1", "--family", "rules", "--profile", "default",
                         "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "oracle (bench/oracle.py" in printed and "undetectable faults" in printed
    data = json.loads(out.read_text())
    assert set(data["oracle"]["calibration"]) == {"conv@1x"}
    rule_kinds = {k for k in oracle.KINDS if quality.DETECTOR_OF[k] != "learned"}  # the learned family's apart
    assert set(data["oracle"]["calibration"]["conv@1x"]) == rule_kinds
    for name in ("default|FIT", "default|conv@1x"):
        per = data["groups"][name]["oracle"]["detectors"]
        assert set(per) == {"long_tail", "slow_replica", "weights", "batch_collapse", "context_burst", "gpu_health",
                            "kv_pressure", "stale"}
        assert all(s["faults"] == 1 and s["oracle_detected"] + len([u for u in data["groups"][name]["oracle"]
                                                                    ["undetectable"] if u["kind"] == s["kind"]]) == 1
                   for s in per.values())
    below = data["groups"]["default|FIT"]["oracle"]["below_of_detectable"]
    detectable = sum(1 for f in data["runs"][0]["oracle"] if f["detectable"])
    assert below["faults"] == detectable and 0 <= below["within_target"] <= detectable
    assert "… of the faults the oracle can detect" in printed
    faults = data["runs"][0]["oracle"]
    assert {f["kind"] for f in faults} == rule_kinds
    assert all(f["detectable"] == (f["delay_s"] is not None) for f in faults)
