"""bench/real_loop.py's measurements on runs whose answer is known (the run itself: the suite's
tests/integration/test_real_loop.py and the benchmark)."""

from __future__ import annotations

import doctest

import pytest

from bench import real_fleet, real_loop
from bench.real_fleet import Finished
from bench.real_loop import FAULTY, measure, verdicts


@pytest.mark.parametrize("module", [real_fleet, real_loop])
def test_doctests(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0


def _requests() -> list[Finished]:
    # 60 s of requests, one a second, alternating r0 / r1; r1's take 3 x as long from t = 30
    return [Finished(float(t), t + 0.5, "r1" if t % 2 else "r0", 1500.0 if t % 2 and t >= 30 else 500.0, True)
            for t in range(60)]


def test_the_fault_span_alone_is_measured_and_its_alert_and_weights_timed() -> None:
    alerts = [{"ts": 41.0, "replica": FAULTY, "detector": "long_tail", "state": "open"},
              {"ts": 50.0, "replica": "r0", "detector": "long_tail", "state": "open"},
              {"ts": 20.0, "replica": FAULTY, "detector": "long_tail", "state": "open"}]  # before the fault
    samples = [(31.0, {"r0": 256, "r1": 256}), (45.0, {"r0": 256, "r1": 100}), (61.0, {"r0": 256, "r1": 100}),
               (75.0, {"r0": 256, "r1": 240})]
    corrections = [{"ts": 44.0, "weights": {"r0": 0.7, "r1": 0.3}}]
    m = measure(_requests(), ["r0", "r1"], (30.0, 60.0), True, alerts, corrections, samples)
    assert m["requests"] == 30 and m["fleet_p50_ms"] == 1000.0  # half at 500, half at 1500
    assert m["replica_p99_ms"] == {"r0": 500.0, "r1": 1500.0} and m["p99_deviation_ms"] == 500.0
    assert (m["detected_s"], m["detectors"]) == (11.0, ["long_tail"])
    assert (m["demoted_haproxy_s"], m["demoted_published_s"], m["restored_s"]) == (15.0, 14.0, 15.0)
    assert [a["replica"] for a in m["alerts_elsewhere"]] == ["r0"]


def test_a_clean_run_counts_every_alert_and_times_nothing() -> None:
    alerts = [{"ts": 41.0, "replica": FAULTY, "detector": "long_tail", "state": "open"},
              {"ts": 42.0, "replica": FAULTY, "detector": "long_tail", "state": "resolved"}]
    m = measure(_requests(), ["r0", "r1"], (0.0, 60.0), False, alerts, [], [(45.0, {"r0": 256, "r1": 10})])
    assert len(m["alerts_elsewhere"]) == 1 and m["detected_s"] is None and m["demoted_haproxy_s"] is None


def test_verdicts_compare_the_corrected_policy_with_leastconn() -> None:
    base = {"fault": "throttle", "detected_s": 20.0, "demoted_haproxy_s": 25.0, "restored_s": 70.0,
            "alerts_elsewhere": []}
    runs = [{**base, "policy": "leastconn", "fleet_p99_ms": 1000.0},
            {**base, "policy": "leastconn+skewwatch", "fleet_p99_ms": 650.0}]
    assert verdicts(runs) == ["throttle: fleet P99 0.65 x leastconn's (met: <= 0.7)",
                              "throttle: detected 20 s (met: <= 30 s)", "throttle: demoted 25 s (met: <= 30 s)",
                              "throttle: restored 70 s (MISSED: <= 60 s)"]
