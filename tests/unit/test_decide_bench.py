"""bench/decide_bench.py runs (a seconds-long --quick run, nothing written) and its vectors are sane."""

from __future__ import annotations

import numpy as np
import pytest

from bench.decide_bench import feature_vectors, main, make_fleet, measure


def test_fleet_vectors_cover_every_replica_once() -> None:
    fleet = make_fleet(10, 3)
    vectors = feature_vectors(fleet, 60.0, np.random.default_rng(0))
    names = sorted(str(v.replica) for vs in vectors.values() for v in vs)
    assert names == sorted(r for rs in fleet.values() for r in rs)
    for v in (v for vs in vectors.values() for v in vs):
        assert v.window_end == 60.0 and v.latency_p50 is not None and v.latency_p99 is not None
        assert v.latency_p99 >= v.latency_p50


def test_measure_reports_cost_and_state_per_replica() -> None:
    result = measure(100, steps=1, warm=2)
    assert result["replicas"] == 100 and result["cpu_ms"] > 0 and result["state_bytes_per_replica"] > 0


def test_quick_run_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick"]) == 0
    assert "us/rep" in capsys.readouterr().out
