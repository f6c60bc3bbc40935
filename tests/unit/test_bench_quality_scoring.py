"""Pure scoring of the quality and routing benchmarks: alerts -> episodes, episodes vs labels -> precision,
recall and delay; weights -> stale/weights episodes; the routing table's spreads.

No broker, no worker: these are the functions that turn what the real worker published into the
README's numbers, so a mistake here would misreport every run.
"""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common, quality, routing, scenarios, scoring  # noqa: E402
from bench.scoring import (  # noqa: E402
    DETECTOR_OF,
    DETECTORS,
    Episode,
    Label,
    alert_episodes,
    confusion,
    correction_report,
    judge,
    match,
    pool_alert_episodes,
    score,
    weight_episodes,
)
from skewwatch.schemas.requests.columns import RequestColumns  # noqa: E402
from skewwatch.schemas.telemetry_sample import TelemetrySample  # noqa: E402
from skewwatch.sim.shapes import SHAPES  # noqa: E402


def alert(ts: float, state: str, replica: str | None = "r1", detector: str = "long_tail", model: str = "m",
          rule: str | None = None) -> dict[str, Any]:
    return {"ts": ts, "model": model, "replica": replica, "detector": detector, "state": state,
            "evidence": {} if rule is None else {"rule": rule}}


@pytest.mark.parametrize("module", [common, quality, routing, scenarios, scoring], ids=lambda m: m.__name__)
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


def test_the_slow_replica_alert_owns_its_kind_and_the_weights_are_reported_beside_it() -> None:
    labels = [Label("m", "r1", "slow_replica", 100, 200), Label("n", "r2", "kv_pressure", 100, 200)]
    eps = [Episode("m", "r1", "slow_replica", "", 140), Episode("m", "r1", "weights", "", 145),
           Episode("n", "r2", "slow_replica", "", 130)]  # on the kv_pressure replica: not its kind
    s = score(eps, labels, clean_models=[], clean_hours=0.0)
    assert DETECTOR_OF["slow_replica"] == "slow_replica" and "weights" in DETECTORS
    mine = s["slow_replica"]
    assert (mine["labels"], mine["detected"], mine["delays_s"], mine["precision"]) == (1, 1, [40.0], 0.5)
    weights = s["weights"]
    assert (weights["labels"], weights["detected"], weights["delays_s"], weights["precision"]) == (1, 1, [45.0], 1.0)
    assert match(Episode("n", "r2", "slow_replica", "", 130), labels) is None


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
    sc = scenarios.Scenario(SHAPES["conv@1x"], seed=1)
    label = next(lb for lb in sc.labels() if lb["kind"] == "long_tail")
    hit = alert(label["start"] + 30, "open", model="long_tail", replica=label["replica"])
    runs = [quality.Run(sc, "default", "FIT", "fast", [hit], []), quality.Run(sc, "default", "FIT", "fast", [], [])]
    s = quality.summarize(runs, quality.delay_targets("default"))["detectors"]["long_tail"]
    assert (s["labels"], s["detected"], s["precision"]) == (2, 1, 1.0)


def test_every_fault_kind_has_a_pool_a_label_and_a_detector() -> None:
    from skewwatch.sim.faults import FAULT_KINDS

    assert set(scoring.DETECTOR_OF) == set(FAULT_KINDS)
    sc = scenarios.Scenario(SHAPES["code@1x"], seed=3)
    labels = sc.labels()
    learned = scenarios.Scenario.learned(SHAPES["code@1x"], seed=3).labels()
    assert {lb["kind"] for lb in labels} == set(FAULT_KINDS) - set(scenarios.LEARNED_FAULTS)
    assert {lb["kind"] for lb in learned} == set(FAULT_KINDS) - {"quiet_pool"}
    assert all(lb["start"] == scenarios.START_TS + scenarios.LEARNED_FAULT_AT_S for lb in learned)
    replica_labels = [lb for lb in labels if lb["kind"] != "quiet_pool"]
    # seed 3 -> replica index 3 of each pool, the pool named after its fault
    assert all(lb["model"] == lb["kind"] and int(lb["replica"][1:]) % 4 == 3 for lb in replica_labels)
    quiet = next(lb for lb in labels if lb["kind"] == "quiet_pool")
    assert quiet["replica"] is None and quiet["model"] == "quiet_pool" and quiet["end"] - quiet["start"] == 180
    config = sc.fleet_config()
    assert config.models == tuple(sc.pools()) and len(config.model_rates or ()) == len(sc.pools())
    rates = dict(zip(config.models, config.model_rates or (), strict=True))
    assert rates["low-rate"] == pytest.approx(4 * scenarios.LOW_RATE) and scenarios.LOW_RATE <= 0.1
    assert rates["clean-a"] == pytest.approx(4 * SHAPES["code@1x"].rate_per_replica)


def test_a_pool_alert_is_right_only_on_a_quiet_pool_and_replica_alerts_there_are_false() -> None:
    quiet = Label("q", None, "quiet_pool", 100.0, 280.0)
    recs = [alert(130.0, "open", replica=None, model="q", detector="weights", rule="all_zero"),
            alert(135.0, "open", replica="r1", model="q", detector="stale"),
            alert(140.0, "open", replica=None, model="clean", detector="weights")]
    eps = pool_alert_episodes(recs, 60.0, 400.0) + alert_episodes(recs, 60.0, 400.0)
    s = score(eps, [quiet], clean_models=["clean"], clean_hours=1.0)
    assert (s["pool"]["recall"], s["pool"]["precision"], s["pool"]["delays_s"]) == (1.0, 0.5, [30.0])
    assert s["pool"]["clean_false"] == 1
    assert s["stale"]["precision"] == 0.0  # a replica alert on the quiet pool is a false alert
    assert confusion(eps, [quiet])["stale"] == {"quiet_pool": 1}


def test_correction_report_counts_healthy_zeros_all_zero_pools_and_lasting_drops() -> None:
    labels = [Label("m", "c", "slow_replica", 100.0, 150.0), Label("m", "d", "gpu_fault", 100.0, 120.0)]
    series = [
        (95.0, {"a": 0.3, "b": 0.3, "c": 0.2, "d": 0.2}),  # c below before its fault: does not count
        (100.0, {"a": 0.3, "b": 0.3, "c": 0.25, "d": 0.15}),
        (105.0, {"a": 0.3, "b": 0.35, "c": 0.2, "d": 0.15}),  # c below every other one ...
        (110.0, {"a": 0.0, "b": 0.5, "c": 0.5, "d": 0.0}),  # ... not any more (d is not "other healthy", still)
        (115.0, {"a": 0.0, "b": 0.6, "c": 0.4, "d": 0.0}),  # a at 0 while healthy: one episode over 2 steps
        (120.0, {"a": 0.3, "b": 0.5, "c": 0.2, "d": 0.0}),  # from here c stays below until 150
        (125.0, {"a": 0.4, "b": 0.5, "c": 0.1, "d": 0.0}),
        (140.0, {"a": 0.5, "b": 0.4, "c": 0.1, "d": 0.0}),  # d stays drained after its fault: not "healthy"
        (160.0, {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}),  # all-zero
    ]
    recs = [{"model": "m", "ts": t, "weights": w, "actions": [], **({"mode": "panic"} if t == 140.0 else {})}
            for t, w in series]
    r = correction_report(recs, labels, 60.0, 300.0)
    below = {b["replica"]: b["delay_s"] for b in r["below"]}
    assert below == {"c": None, "d": None}  # c: 0.1 in the 140 record is below, but 0.0 of d is not above it
    assert r["healthy_zero"] == [["m", "a", 110.0], ["m", "a", 160.0], ["m", "b", 160.0]]
    assert r["healthy_zero_steps"] == 4 and r["all_zero"] == [["m", 160.0]] and r["panic"] == 1


def test_correction_report_delay_of_a_lasting_drop() -> None:
    labels = [Label("m", "c", "slow_replica", 100.0, 150.0)]
    weights = [(100.0, 0.30), (105.0, 0.20), (110.0, 0.30), (115.0, 0.20), (120.0, 0.15), (145.0, 0.10), (155.0, 0.4)]
    recs = [{"model": "m", "ts": t, "weights": {"a": 0.3, "b": 0.3, "c": w}, "actions": []} for t, w in weights]
    assert correction_report(recs, labels, 60.0, 300.0)["below"][0]["delay_s"] == 15.0  # from 115 to the end


def test_summary_of_a_run_whose_answer_is_known() -> None:
    sc = scenarios.Scenario(SHAPES["conv@1x"], seed=2)
    start = scenarios.START_TS
    lo, hi = (start + s for s in sc.scored)
    pools = sc.pools()
    replicas = {p: [sc.replica(p, i) for i in range(4)] for p in pools}
    faulty = {lb["kind"]: lb for lb in sc.labels() if lb["replica"] is not None}
    corrections, alerts = [], []
    t = lo
    while t <= hi:
        for pool in pools:
            weights = {r: 0.25 for r in replicas[pool]}
            kind_label = faulty.get(pool)
            if kind_label is not None and kind_label["start"] <= t < kind_label["end"]:
                weights = {r: (0.1 if r == kind_label["replica"] else 0.3) for r in replicas[pool]}
            if pool == "low-rate" and t >= start + 200:
                weights[replicas[pool][0]] = 0.0  # one healthy replica at 0 from 200 s on
            if pool == "quiet_pool" and start + 150 <= t < start + 200:
                weights = {r: 0.0 for r in replicas[pool]}  # the pool goes all-zero
            corrections.append({"model": pool, "ts": t, "weights": weights, "actions": []})
        t += 5.0
    gpu = faulty["gpu_fault"]
    alerts += [alert(gpu["start"] + 5, "open", model="gpu_fault", replica=gpu["replica"], detector="gpu_health"),
               alert(start + 100, "open", model="clean-a", replica=replicas["clean-a"][0], detector="long_tail"),
               alert(start + 130, "open", model="quiet_pool", replica=replicas["quiet_pool"][1], detector="stale")]
    summary = quality.summarize([quality.Run(sc, "default", "FIT", "fast", alerts, corrections)],
                                quality.delay_targets("default"))
    c = summary["corrections"]
    assert (c["healthy_zero"], c["all_zero_pools"]) == (5, 1)  # the low-rate replica + 4 quiet ones; one pool
    assert c["below_share"] == 1.0 and c["below"]["slow_replica"]["delay_median_s"] == 0.0
    assert summary["quiet_pool_replica_alerts"] == 5  # the stale alert and the 4 replicas' weight-0 episodes
    hours = (sc.scored[1] - sc.scored[0]) / 3600.0
    # clean pools: the long_tail alert on clean-a and the low-rate replica's stale (weight 0) episode
    assert summary["clean_false_per_hour"] == pytest.approx(2 / (3 * hours))
    assert summary["low_rate_false_per_hour"] == pytest.approx(1 / hours)
    gh = summary["detectors"]["gpu_health"]
    assert (gh["recall"], gh["precision"], gh["delays_s"]) == (1.0, 1.0, [5.0])
    assert summary["detectors"]["weights"]["recall"] == 1.0  # 0.1 < 80 % of an equal share (0.25)


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


# ------------------------------------------------------------------ the harness end to end (in-process)


def test_quick_run_scores_a_fit_and_a_holdout_run(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    assert quality.main(["--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["mode"] == "fast" and set(data["split"]["runs"].values()) == {"FIT", "HOLDOUT"}
    assert {"default|FIT", "default|HOLDOUT", "seed|FIT", "seed|HOLDOUT", "default|conv@1x",
            "seed|mooncake@1x"} <= set(data["groups"])
    for name, group in data["groups"].items():
        assert group["detectors"]["gpu_health"]["labels"] == group["runs"], name  # one gpu fault per run
        assert group["detectors"]["pool"]["labels"] == group["runs"]  # and one quiet pool
        assert group["clean_pool_hours"] > 0 and group["corrections"]["corrections"] > 0
    for run in data["runs"]:
        load = run["stats"]["load"]
        assert load["runaway"] is False and 0 < load["low_rate_per_replica"] <= 0.1
        assert run["stats"]["quiet_dropped"] > 0 and run["scenario"]["shape"]["trace"] in ("conv", "mooncake")


def test_routing_runs_both_traces_in_process() -> None:
    scenario = routing.Scenario(trace="mooncake", run_s=150.0, warmup_s=30.0)
    result = routing.run_trace(scenario, ["default"], None, Path("."))
    rows = result["rows"]
    assert set(rows) == {"round_robin", "least_connections", "oracle", "dynamic (in-process)",
                         "dynamic_least_request (in-process)"}
    assert result["scenario"]["trace"] == "mooncake"
    assert all(r["requests"] > 50 and r["dropped"] == 0 for r in rows.values())
    assert set(result["target"]) == {"dynamic_least_request (in-process)"}


def test_routing_variants_a_slower_gpu_without_faults_and_a_high_load() -> None:
    hetero = routing.Scenario.of("code", "hetero", run_s=150.0)
    assert hetero.faults() == () and hetero.name == "code/hetero" and hetero.watched() == ["r2"]
    (slower,) = hetero.injections()
    assert slower.kind == "slow_replica" and slower.at_s == 0.0 and slower.params["factor"] == pytest.approx(1 / 0.6)
    high = routing.Scenario.of("conv", "high")
    assert high.load == routing.HIGH_LOAD > routing.LOAD and [f[0] for f in high.faults()] == [
        "slow_replica", "kv_pressure", "batch_collapse"]
    result = routing.run_trace(routing.Scenario.of("conv", "hetero", run_s=150.0), ["default"], None, Path("."))
    rows = result["rows"]
    assert result["scenario"]["faults"] == [] and result["scenario"]["slower_gpu"] == {"replica": "r2", "speed": 0.6}
    # least connections sends the slower GPU less than an equal share; the restore column has no fault to time
    assert rows["least_connections"]["replicas"]["r2"]["share"] < 1 / 8
    assert rows["dynamic (in-process)"]["restore_s"] == {}
    # the oracle is told r2's speed: it sends r2 less than least connections does, and its row is judged
    assert rows["oracle"]["replicas"]["r2"]["share"] < rows["least_connections"]["replicas"]["r2"]["share"]
    assert result["target"]["dynamic_least_request (in-process)"]["oracle_vs_least_connections"] > 0
    checks = result["target"]["dynamic_least_request (in-process)"]["checks"]
    assert set(checks) == {"deviation_vs_least_connections", "deviation_vs_round_robin",
                           "fleet_p99_vs_least_connections", "throughput_vs_least_connections",
                           "dynamic_vs_round_robin"}


def test_learned_faults_can_start_later_on_the_same_traffic() -> None:
    """``--learned-fault-at``: the learned runs' labels move, the rules' runs do not; a start inside the
    unscored first minute is refused."""
    from argparse import Namespace

    args = Namespace(live_signals="on", family="both", quick=False, shape=["conv@1x"], seeds=[1],
                     pool_size=scenarios.REPLICAS, learned_fault_at=40.0)
    rules, learned = quality.scenarios_of(args)
    assert rules.family == "" and rules.fault_at_s == scenarios.FAULT_AT_S
    assert learned.family == "learned" and learned.name.endswith("/at=2400s")
    starts = {label["start"] - scenarios.START_TS for label in learned.labels(scenarios.START_TS)}
    assert starts == {2400.0}
    default = scenarios.Scenario.learned(SHAPES["conv@1x"], 1)
    assert learned.run_s - default.run_s == 2400.0 - scenarios.LEARNED_FAULT_AT_S
    with pytest.raises(SystemExit):
        quality.main(["--family", "learned", "--learned-fault-at", "1"])
