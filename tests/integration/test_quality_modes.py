"""The detection-quality benchmark's two modes agree: the in-process pipeline (fast mode, what rules are
tuned with) and the real worker on the real broker (what the published table runs) publish the same
alerts and corrections on the same simulated traffic.

Why they must: the simulator releases a step's events only when no later one can finish before its end
(no late events), the decider is a pure function of the steps in event-time order, and telemetry is
joined as of each step's end in both (skewwatch/sim/local_pipeline.py). What may differ is the steps a
replica gets before its first event (the worker may know it a few seconds of event time earlier, from a
poll that reached further ahead): the first window. So alerts are compared over the whole run and
corrections over the scored span (from the end of the first window), exactly, field by field.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import quality  # noqa: E402
from bench.scenarios import START_TS, Scenario  # noqa: E402
from skewwatch.sim.shapes import SHAPES  # noqa: E402

pytestmark = pytest.mark.kafka

# a short run: three faulty pools, a quiet pool, a clean and a low-rate pool; faults of 60 s
SCENARIO = Scenario(SHAPES["conv@1x"], seed=1, replica_faults=("gpu_fault", "slow_replica", "batch_collapse"),
                    clean=("clean-a",), min_fault_s=60.0, quiet_for_s=60.0)


def _alerts(run: quality.Run, until: float) -> list[tuple[Any, ...]]:
    return sorted((a["ts"], a["model"], a["replica"] or "", a["detector"], a["state"], a["severity"],
                   str((a.get("evidence") or {}).get("rule") or "")) for a in run.alerts if a["ts"] <= until)


def _corrections(run: quality.Run, since: float, until: float) -> dict[tuple[str, float], Any]:
    return {(c["model"], c["ts"]): (c["seq"], c["weights"], sorted((a["replica"], a["action"]) for a in c["actions"]))
            for c in run.corrections if since <= c["ts"] <= until}


@pytest.mark.parametrize("profile", ["default", "seed"])
def test_fast_and_worker_modes_publish_the_same_alerts_and_corrections(profile: str, kafka_bootstrap: str,
                                                                       tmp_path: Path) -> None:
    since, until = (START_TS + t for t in SCENARIO.scored)
    fast = quality.run_fast(SCENARIO, [profile], "FIT")[0]
    worker = quality.run_worker(SCENARIO, profile, "FIT", kafka_bootstrap, tmp_path)
    fast_alerts, worker_alerts = _alerts(fast, until), _alerts(worker, until)
    # the rules fire on this traffic, so the comparison means something: the faults' detectors on both
    # profiles (the default's through the engines' live telemetry, joined as of each step), and the
    # seed's rules on many replicas besides
    assert {a[3] for a in fast_alerts} >= {"gpu_health", "batch_collapse"}
    if profile == "seed":
        assert len(fast_alerts) > 10
    assert worker_alerts == fast_alerts
    fast_corrections, worker_corrections = _corrections(fast, since, until), _corrections(worker, since, until)
    # every model, every step of the scored span (the quiet pool's too: its replicas are not released in 60 s)
    assert len(fast_corrections) == len(SCENARIO.pools()) * ((until - since) / 5 + 1)
    assert worker_corrections == fast_corrections
    assert worker.stats["arrivals"] == fast.stats["arrivals"]
