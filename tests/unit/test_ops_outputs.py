"""Pure parts of the output side: the corrections client's fail-static rules, tail's formatting, the
HAProxy plan, the Alertmanager mapping, the replica gauges (their docstring examples: test_docstring_examples.py)."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from prometheus_client import CollectorRegistry

from skewwatch.agents.replica_gauges import ReplicaGauges
from skewwatch.bridges.alertmanager import to_alertmanager
from skewwatch.bridges.haproxy import BackendMap, ServerState, desired_servers, haproxy_weights
from skewwatch.client.corrections import CorrectionsSubscriber, ModelState
from skewwatch.schemas.alerts import Alert, Severity, decode_alert, encode_alert
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.tail import format_row, matches, parse_duration, read_record


def record(**extra: object) -> dict[str, object]:
    return {"model": "m", "ts": 60.0, "seq": 60000, "weights": {"a": 0.7, "b": 0.3},
            "actions": [{"replica": "b", "action": "drain", "severity": "CRITICAL", "reason": "x",
                         "expires_at": 130.0}], **extra}


def test_model_state_fail_static_rules() -> None:
    state = ModelState.from_record(record(), received_at=100.0)
    assert state.mode == "normal"
    assert state.routing_weights(stale=True, on_stale="keep") == {"a": 0.7, "b": 0.3}
    assert state.routing_weights(stale=True, on_stale="equal") == {"a": 0.5, "b": 0.5}
    assert [a.replica for a in state.live_actions(now=120.0, stale=True, on_stale="keep")] == ["b"]
    assert state.live_actions(now=131.0, stale=False, on_stale="keep") == []  # expired by itself
    assert state.live_actions(now=120.0, stale=True, on_stale="equal") == []
    assert ModelState.from_record(record(mode="panic"), 0.0).mode == "panic"
    assert ModelState.from_value(orjson.dumps(record(mode=None)), 0.0).mode == "normal"  # a writer before v1.4
    for bad in (record(mode="chaos"), {"model": "m"}):
        with pytest.raises(ValueError, match="mode|ts"):
            ModelState.from_record(bad, 0.0)
        with pytest.raises(ValueError, match="mode|ts"):
            ModelState.from_value(orjson.dumps(bad), 0.0)


def test_subscriber_refuses_bad_settings() -> None:
    with pytest.raises(ValueError):
        CorrectionsSubscriber("k:9092", heartbeat_s=0)
    with pytest.raises(ValueError):
        CorrectionsSubscriber("k:9092", on_stale="drop")  # type: ignore[arg-type]


def test_tail_formatting_and_filters() -> None:
    assert parse_duration("1h") == 3600.0
    for bad in ("", "10", "ten minutes", "5x", "1h 30m"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    alert = read_record("alerts", b'{"ts": 0.0, "state": "open", "severity": "WARNING", "model": "m", '
                                  b'"replica": null, "detector": "long_tail", "message": "slow"}')
    assert format_row("alerts", alert)[1:] == ["open", "WARNING", "m", "*", "long_tail", "slow"]
    correction = read_record("corrections", orjson.dumps(record(mode=None)))
    assert format_row("corrections", correction)[1:] == ["m", "60000", "normal", "a=0.70 b=0.30", "b:drain"]
    for kind, bad in (("alerts", b'{"ts": 0.0}'), ("corrections", b'{"model": "m"}'), ("features", b"[1]")):
        with pytest.raises(ValueError):
            read_record(kind, bad)  # tail skips it
    features = {"window_end": 0.0, "model": "m", "replica": "r1", "count": 12, "rps": 0.2, "latency_p50": None,
                "latency_p99": 812.25, "batch_fill_mean": 0.5}
    assert format_row("features", features)[1:] == ["m", "r1", "12", "0.20", "-", "812.2", "-", "0.50", "-"]
    assert matches("corrections", {"model": "m", "weights": {"r1": 1.0}}, None, "r1")
    assert not matches("corrections", {"model": "m", "weights": {"r1": 1.0}}, None, "r2")
    assert matches("features", features, "m", "r1") and not matches("features", features, "n", None)


def test_haproxy_plan() -> None:
    assert haproxy_weights({"a": 0.0, "b": 0.0}) == {"a": 0, "b": 0}
    # all weights zero: every server at full weight rather than a pool routed to nowhere
    assert desired_servers({"a": 0.0, "b": 0.0}, {}, panic=False) == {"a": ServerState(256, "ready"),
                                                                       "b": ServerState(256, "ready")}
    plan = desired_servers({"a": 0.5, "b": 0.3, "c": 0.2}, {"b": "isolate", "c": "throttle"}, panic=False)
    assert [plan[r].state for r in "abc"] == ["ready", "maint", "ready"]  # throttle is not a balancer's
    # the only positive-weight server ready is drained: everything stays ready
    plan = desired_servers({"a": 1.0, "b": 0.0}, {"a": "drain"}, panic=False)
    assert plan["a"].state == "ready"
    plan = desired_servers({"a": 0.5, "b": 0.5}, {"a": "isolate"}, panic=True)
    assert plan["a"].state == "ready"


def test_backend_map_errors(tmp_path: object) -> None:
    from pathlib import Path

    base = Path(str(tmp_path))
    good = base / "good.toml"
    good.write_text('[models."m"]\nbackend = "b"\nservers = { r1 = "s1" }\n')
    mapping = BackendMap.load(good)
    assert (mapping.server("m", "r1"), mapping.server("m", "r2")) == ("s1", "r2")
    for text, message in (("", "no \\[models"), ('[models."m"]\n', "needs backend"),
                          ('[models."m"]\nbackend = "b"\nservers = { r1 = 3 }\n', "servers must map"),
                          ("[models\n", "backend map")):
        bad = base / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            BackendMap.load(bad)
    with pytest.raises(ValueError, match="does not exist"):
        BackendMap.load(base / "none.toml")


def test_alertmanager_mapping() -> None:
    alert = Alert(100.0, "m", None, "batch_collapse", Severity.CRITICAL, "open", "batch collapsed")
    am = to_alertmanager(alert, now=200.0, resend_s=30.0)
    assert "replica" not in am["labels"] and am["labels"]["alertname"] == "SkewwatchBatchCollapse"
    assert am["annotations"] == {"summary": "batch collapsed"}
    assert am["endsAt"] == "1970-01-01T00:05:20Z"  # now + 4 x resend
    resolved = to_alertmanager(replace(alert, state="resolved", ts=500.0), now=200.0, starts_at=100.0)
    assert resolved["endsAt"] == "1970-01-01T00:03:20Z"  # a resolve from the future ends now
    assert resolved["startsAt"] == "1970-01-01T00:01:40Z"
    assert alert.key == "m/*/batch_collapse"
    assert replace(alert, replica="r1", evidence={"rule": "usage"}).key == "m/r1/batch_collapse#usage"
    # the bridge reads the record as the worker writes it, through the contract's one decoder
    assert to_alertmanager(decode_alert(encode_alert(alert)), now=200.0, resend_s=30.0) == am


def test_replica_gauges_follow_the_fleet() -> None:
    registry = CollectorRegistry()
    now = [0.0]
    gauges = ReplicaGauges(registry, expire_s=90.0, clock=lambda: now[0])
    fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=5, rps=0.1,
                       latency_p50=100.0, latency_p99=300.0, batch_fill_mean=0.25)
    sample = TelemetrySample(ts=59.0, replica="r1", source="nvml", utilization_gpu=0.8, kv_cache_usage=0.4)
    gauges.observe_step("m", [fv], {"r1": (sample, 1.0)}, mode="normal", published_at=1234.0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": "m", **labels})

    assert value("skewwatch_replica_latency_ms", replica="r1", quantile="0.5") == 100.0
    assert value("skewwatch_replica_gpu_utilization", replica="r1") == 0.8
    assert value("skewwatch_replica_kv_cache_usage", replica="r1") == 0.4
    assert value("skewwatch_replica_batch_fill", replica="r1") == 0.25
    assert value("skewwatch_replica_tpot_ms", replica="r1", quantile="0.99") is None  # unknown: no series
    assert value("skewwatch_model_last_correction_timestamp_seconds") == 1234.0
    assert value("skewwatch_model_panic") == 0.0
    # without telemetry this step: the GPU series go, the latency ones stay
    gauges.observe_step("m", [fv], {}, mode="normal", published_at=None)
    assert value("skewwatch_replica_gpu_utilization", replica="r1") is None
    assert value("skewwatch_replica_latency_ms", replica="r1", quantile="0.99") == 300.0
    assert value("skewwatch_model_last_correction_timestamp_seconds") == 1234.0
    # the model's steps stop (moved to another worker, or quiet): its replica series and panic flag go
    now[0] = 91.0
    assert value("skewwatch_replica_latency_ms", replica="r1", quantile="0.99") is None
    assert value("skewwatch_model_panic") is None
    assert value("skewwatch_model_last_correction_timestamp_seconds") == 1234.0  # the stale rule needs it


def test_a_record_is_valid_for_its_own_valid_for_s_else_the_heartbeat_rule() -> None:
    from skewwatch.client.corrections import ModelState
    from skewwatch.schemas.corrections import decode_correction

    record = {"model": "m", "ts": 60.0, "seq": 60000, "weights": {"a": 1.0}, "actions": [], "valid_for_s": 10.0}
    state = ModelState.from_record(record, received_at=100.0)
    assert (state.is_stale(109.0, stale_after_s=90.0), state.is_stale(111.0, stale_after_s=90.0)) == (False, True)
    older = ModelState.from_record({**record, "valid_for_s": None}, received_at=100.0)
    assert (older.is_stale(111.0, stale_after_s=90.0), older.is_stale(191.0, stale_after_s=90.0)) == (False, True)
    with pytest.raises(ValueError, match="valid_for_s"):
        decode_correction(b'{"model": "m", "ts": 1, "seq": 1, "weights": {}, "valid_for_s": 0}')
