"""`skewwatch simulate` offline: JSON-lines output, labels, summary with the routing table's spreads."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from skewwatch.schemas.requests import check_request_event
from skewwatch.sim.faults import read_labels
from skewwatch.sim.simulate_command import simulate_command

T0 = 1_700_000_000.0


def test_simulate_writes_messages_labels_and_summary(tmp_path: Path) -> None:
    out, labels, summary = tmp_path / "m.jsonl", tmp_path / "l.json", tmp_path / "s.json"
    result = CliRunner().invoke(simulate_command, [
        "--replicas", "3", "--duration", "60", "--start-ts", str(T0), "--seed", "1",
        "--policy", "least_connections", "--inject", "gpu_fault", "--replica", "r2", "--at", "10", "--for", "20",
        "--labels", str(labels), "--output", str(out), "--summary", str(summary),
    ], env={"KAFKA_BOOTSTRAP": ""})
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    events = [m["value"] for m in lines if m["topic"] == "llm.requests"]
    samples = [m["value"] for m in lines if m["topic"] == "llm.gpu-telemetry"]
    assert events and all(check_request_event(e) is None and e["replica"] == m["key"]
                          for m, e in zip([m for m in lines if m["topic"] == "llm.requests"], events, strict=True))
    assert len(samples) >= 3 * 12
    assert {e["replica"] for e in events if e["status"] == "error"} == {"r2"}
    assert read_labels(labels)[0] | {"params": {}} == {"replica": "r2", "kind": "gpu_fault", "start": T0 + 10,
                                                       "end": T0 + 30, "model": "llama-3-70b", "params": {}}
    report = orjson.loads(summary.read_bytes())
    assert report["arrivals"] == report["finished"] + report["failed"] == len(events)
    results = report["results"]
    assert set(results["replicas"]) == {"r0", "r1", "r2"}
    assert results["p99_deviation_ms"] is not None and results["utilization_spread_pp"] is not None
    assert abs(sum(r["share"] for r in results["replicas"].values()) - 1.0) < 1e-9


def test_simulate_refuses_an_unknown_replica() -> None:
    result = CliRunner().invoke(simulate_command, ["--replicas", "2", "--inject", "slow_replica",
                                                   "--replica", "r5", "--output", "/dev/null"])
    assert result.exit_code != 0 and "no replica 'r5'" in result.output


def test_simulate_takes_the_quoted_inject_form_as_demo_and_generate_do(tmp_path: Path) -> None:
    labels = tmp_path / "labels.json"
    result = CliRunner().invoke(simulate_command, ["--replicas", "2", "--duration", "30", "--start-ts", str(T0),
                                                   "--inject", "slow_replica --replica r1 --at 10 --for 15",
                                                   "--labels", str(labels), "--output", "/dev/null"],
                                env={"KAFKA_BOOTSTRAP": ""})
    assert result.exit_code == 0, result.output
    [label] = orjson.loads(labels.read_bytes())
    assert (label["replica"], label["kind"], label["end"] - label["start"]) == ("r1", "slow_replica", 15)
    bad = CliRunner().invoke(simulate_command, ["--inject", "slow_replica --replica r1 --at soon"])
    assert bad.exit_code == 2 and "--inject 'KIND --replica R" in bad.output


def test_simulate_closes_the_loop_in_process_under_both_dynamic_policies() -> None:
    for policy in ("dynamic", "dynamic_least_request"):
        result = CliRunner().invoke(simulate_command, ["--replicas", "2", "--duration", "30", "--start-ts", str(T0),
                                                       "--policy", policy], env={"KAFKA_BOOTSTRAP": ""})
        assert result.exit_code == 0, result.output
        report = orjson.loads(result.stdout)
        # only the first 5 s step routes without a correction (least connections, counted)
        assert report["policy"] == policy and 0 < report["fallbacks"] < report["arrivals"] / 3
