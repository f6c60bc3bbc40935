"""Pure scoring of the quality and routing benchmarks: alerts -> episodes, episodes vs labels -> precision,
recall and delay; weights -> stale/weights episodes; the routing table's spreads.

No broker, no worker: these are the functions that turn what the real worker published into the
README's numbers, so a mistake here would misreport every run.
"""

from __future__ import annotations

import doctest
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, quality, routing  # noqa: E402
from bench.quality import (  # noqa: E402
    Episode,
    Label,
    alert_episodes,
    confusion,
    judge,
    match,
    score,
    weight_episodes,
)
from skewwatch.schemas.requests.columns import RequestColumns  # noqa: E402
from skewwatch.schemas.telemetry_sample import TelemetrySample  # noqa: E402


def alert(ts: float, state: str, replica: str | None = "r1", detector: str = "long_tail", model: str = "m",
          rule: str | None = None) -> dict[str, Any]:
    return {"ts": ts, "model": model, "replica": replica, "detector": detector, "state": state,
            "evidence": {} if rule is None else {"rule": rule}}


@pytest.mark.parametrize("module", [common, quality, routing], ids=lambda m: m.__name__)
def test_doctests(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


# ------------------------------------------------------------------ episodes from alerts


def test_open_resolve_pairs_make_one_episode_each() -> None:
    eps = alert_episodes([alert(100, "open"), alert(120, "resolved"), alert(150, "open")], 60, 300)
    assert [(e.start, e.carried) for e in eps] == [(100, False), (150, False)]


def test_reopen_while_open_is_the_same_episode() -> None:
    # gpu_health re-opens with a new severity while open: still one alert
    recs = [alert(100, "open", detector="gpu_health"), alert(110, "open", detector="gpu_health"),
            alert(200, "resolved", detector="gpu_health")]
    assert len(alert_episodes(recs, 60, 300)) == 1


def test_warmup_alerts_resolved_in_warmup_do_not_count_but_standing_ones_do() -> None:
    recs = [alert(10, "open", replica="r0"), alert(30, "resolved", replica="r0"),  # cold start, gone
            alert(20, "open", replica="r1")]  # opened in warm-up and never resolved: a standing claim
    eps = alert_episodes(recs, scored_from=60, scored_to=300)
    assert [(e.replica, e.start, e.carried) for e in eps] == [("r1", 60, True)]


def test_rules_are_separate_keys_and_model_level_alerts_are_ignored() -> None:
    recs = [alert(100, "open", detector="kv_pressure", rule="fragmentation"),
            alert(105, "open", detector="kv_pressure", rule="prefill"),
            alert(100, "open", replica=None)]
    eps = alert_episodes(recs, 60, 300)
    assert sorted(e.rule for e in eps) == ["fragmentation", "prefill"]


def test_episodes_after_the_scored_span_are_dropped() -> None:
    assert alert_episodes([alert(400, "open")], 60, 300) == []


# ------------------------------------------------------------------ weights episodes


def correction(ts: float, weights: dict[str, float], actions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"model": "m", "ts": ts, "weights": weights, "actions": actions or []}


def test_stale_needs_weight_zero_without_a_drain() -> None:
    recs = [correction(100, {"a": 0.0, "b": 1.0}, [{"replica": "a", "action": "drain"}]),
            correction(105, {"a": 0.0, "b": 1.0})]
    eps = weight_episodes(recs, 60, 300)
    assert [(e.replica, e.detector, e.start) for e in eps] == [("a", "stale", 105)]


def test_weight_drop_opens_once_and_needs_two_clear_records_to_end() -> None:
    lo, even = {"a": 0.3, "b": 0.7}, {"a": 0.5, "b": 0.5}
    recs = [correction(t, w) for t, w in [(100, lo), (105, even), (110, lo), (115, even), (120, even), (125, lo)]]
    eps = weight_episodes(recs, 60, 300)
    assert [(e.replica, e.start) for e in eps] == [("a", 100), ("a", 125)]


def test_weight_drop_threshold_is_relative_to_the_pool_size() -> None:
    # 4 replicas: an equal share is 0.25, the threshold 0.2
    recs = [correction(100, {"a": 0.21, "b": 0.26, "c": 0.27, "d": 0.26}),
            correction(200, {"a": 0.19, "b": 0.27, "c": 0.27, "d": 0.27})]
    assert [(e.replica, e.start) for e in weight_episodes(recs, 60, 300)] == [("a", 200)]


# ------------------------------------------------------------------ matching and scoring


LABEL = Label("m", "r1", "long_tail", 100.0, 200.0)


@pytest.mark.parametrize(("episode", "expected"), [
    (Episode("m", "r1", "long_tail", "", 100.0), True),  # at the start
    (Episode("m", "r1", "long_tail", "", 290.0), True),  # within the grace after the end
    (Episode("m", "r1", "long_tail", "", 291.0), False),  # past it
    (Episode("m", "r1", "long_tail", "", 99.0), False),  # before the fault
    (Episode("m", "r2", "long_tail", "", 150.0), False),  # another replica
    (Episode("x", "r1", "long_tail", "", 150.0), False),  # another model (pool)
    (Episode("m", "r1", "batch_collapse", "", 150.0), False),  # the wrong detector
    (Episode("m", "r1", "weights", "", 150.0), True),  # weights may drop on any degraded replica
])
def test_match(episode: Episode, expected: bool) -> None:
    assert (match(episode, [LABEL], grace_s=90.0) is not None) is expected


def test_weights_recall_counts_only_slow_replica_but_precision_accepts_any_fault() -> None:
    labels = [Label("m", "r1", "slow_replica", 100, 200), Label("n", "r2", "kv_pressure", 100, 200)]
    eps = [Episode("n", "r2", "weights", "", 130)]  # drop on the kv_pressure replica only
    s = score(eps, labels, clean_models=[], clean_hours=0.0)["weights"]
    assert (s["labels"], s["detected"], s["recall"], s["precision"]) == (1, 0, 0.0, 1.0)


def test_score_counts_delays_from_the_first_true_alert_and_clean_false_alerts() -> None:
    labels = [Label("a", "r1", "batch_collapse", 100, 250), Label("b", "r5", "batch_collapse", 100, 250)]
    eps = [Episode("a", "r1", "batch_collapse", "", 140), Episode("a", "r1", "batch_collapse", "", 180),
           Episode("b", "r5", "batch_collapse", "", 135),
           Episode("clean", "r9", "batch_collapse", "", 70), Episode("clean", "r9", "long_tail", "", 70)]
    s = score(eps, labels, clean_models=["clean"], clean_hours=0.5)
    bc = s["batch_collapse"]
    assert bc["delays_s"] == [35.0, 40.0]
    assert bc["recall"] == 1.0 and bc["true"] == 3 and bc["alerts"] == 4 and bc["precision"] == 0.75
    assert bc["delay_median_s"] == 37.5 and bc["delay_p95_s"] == 40.0
    assert bc["clean_false"] == 1 and bc["false_per_hour"] == 2.0
    assert s["long_tail"]["recall"] is None and s["long_tail"]["precision"] == 0.0  # no label, one false alert
    assert s["context_burst"]["precision"] is None  # no alert: nothing to judge


def test_a_missed_fault_lowers_recall_and_has_no_delay() -> None:
    labels = [Label("a", "r1", "gpu_fault", 100, 250), Label("b", "r1", "gpu_fault", 100, 250)]
    s = score([Episode("a", "r1", "gpu_health", "", 105)], labels, [], 0.0)["gpu_health"]
    assert s["recall"] == 0.5 and s["delays_s"] == [5.0]


def test_confusion_places_each_alert_where_it_fired() -> None:
    labels = [Label("a", "r1", "context_burst", 100, 200)]
    eps = [Episode("a", "r1", "batch_collapse", "", 150), Episode("a", "r2", "batch_collapse", "", 150),
           Episode("a", "r1", "context_burst", "", 110)]
    assert confusion(eps, labels) == {"batch_collapse": {"context_burst": 1, "clean": 1},
                                      "context_burst": {"context_burst": 1}}


def test_judge_against_the_issue_targets() -> None:
    ok = {"recall": 0.95, "precision": 0.95, "delay_median_s": 25.0, "false_per_hour": 1.0}
    assert judge(ok, persistence=15.0) == {"recall": True, "precision": True, "delay": True, "false_per_hour": True}
    bad = {"recall": 0.9, "precision": None, "delay_median_s": 25.5, "false_per_hour": 1.1}
    assert judge(bad, persistence=15.0) == {"recall": False, "precision": None, "delay": False,
                                            "false_per_hour": False}


def test_runs_are_scored_apart_even_with_the_same_model_names() -> None:
    # two runs with the same pools: an alert in run 0 must not detect run 1's fault
    label = {"model": "long_tail", "replica": "r1", "kind": "long_tail", "start": quality.START_TS + 120,
             "end": quality.START_TS + 270}
    hit = alert(quality.START_TS + 150, "open", model="long_tail")
    runs = [{"labels": [label], "alerts": [hit], "corrections": []},
            {"labels": [label], "alerts": [], "corrections": []}]
    s = quality.summarize(runs, "seed")["detectors"]["long_tail"]
    assert (s["labels"], s["detected"], s["precision"]) == (2, 1, 1.0)


def test_every_fault_kind_has_a_pool_and_a_detector() -> None:
    from skewwatch.sim.faults import FAULT_KINDS

    assert set(quality.DETECTOR_OF) == set(FAULT_KINDS)
    chunks, labels = quality.run_traffic(quality.RunSpec("generator", 2.0, 3, "seed"))
    assert {lb.kind for lb in labels} == set(FAULT_KINDS)
    assert all(lb.replica.endswith(("3", "7", "11", "15", "19", "23", "27")) for lb in labels)  # seed 3 -> index 3
    first = next(chunks)
    assert {str(m) for m in first.requests.model} <= set(quality.pools())


# ------------------------------------------------------------------ routing metrics


def rows(replica: str, latencies: list[float], t0: float = 100.0, error: bool = False) -> list[dict[str, Any]]:
    return [dict(request_id=f"{replica}-{i}", ts=t0 + i + lat / 1000.0, model="m", replica=replica, latency_ms=lat,
                 prompt_tokens=1, completion_tokens=1, status="error" if error else "ok")
            for i, lat in enumerate(latencies)]


def sample(replica: str, ts: float, util: float) -> TelemetrySample:
    return TelemetrySample(ts=ts, replica=replica, source="simulated", utilization_gpu=util)


def test_routing_spreads_are_population_std_across_replicas() -> None:
    cols = RequestColumns.from_rows(rows("a", [100.0] * 20) + rows("b", [300.0] * 20) + rows("c", [200.0] * 20))
    tel = [sample(r, 105.0 + 5 * k, u) for r, u in (("a", 0.5), ("b", 0.7), ("c", 0.6)) for k in range(4)]
    m = routing.routing_metrics(cols, tel, t0=100.0, t1=130.0)
    assert m["p99_deviation_ms"] == pytest.approx(float(np.std([100.0, 300.0, 200.0])))
    assert m["p99_range_ms"] == pytest.approx(200.0)
    assert m["utilization_spread_pp"] == pytest.approx(float(np.std([50.0, 70.0, 60.0])))
    assert m["utilization_spread_per_step_pp"]["mean"] == pytest.approx(float(np.std([50.0, 70.0, 60.0])))
    assert m["throughput_rps"] == pytest.approx(60 / 30)


def test_routing_metrics_count_by_arrival_and_leave_errors_out_of_latency() -> None:
    late = rows("a", [100.0] * 5, t0=200.0)  # arrived after t1: not in the run
    failed = rows("b", [10_000.0] * 5, error=True)
    cols = RequestColumns.from_rows(rows("a", [100.0] * 10) + rows("b", [100.0] * 10) + late + failed)
    m = routing.routing_metrics(cols, [], t0=100.0, t1=130.0, dropped=5)
    assert m["requests"] == 25 and m["fleet_latency_p99_ms"] == pytest.approx(100.0)
    assert m["replicas"]["b"]["share"] == pytest.approx(15 / 25) and m["dropped"] == 5


def test_per_step_p99_spread_skips_replicas_with_too_few_requests() -> None:
    # 60 s windows every 5 s; replica c has a single request per window: not judged
    cols = RequestColumns.from_rows(rows("a", [100.0] * 80) + rows("b", [500.0] * 80) + rows("c", [9e6], t0=130.0))
    m = routing.routing_metrics(cols, [], t0=100.0, t1=180.0)
    assert m["p99_deviation_per_step_ms"]["mean"] == pytest.approx(200.0)
