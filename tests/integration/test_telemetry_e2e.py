"""Telemetry end to end on the real broker: telemetry from several GPUs and sources reaches the decider.

One worker, one generated run of three models (three replicas each), the generator's requests and
telemetry, with the telemetry of one replica per model rewritten the way real producers send it:

* model ``mem``, replica r1: tensor parallel on two GPUs (``nvml`` samples per GPU) plus the engine;
  from MEM_AT on, GPU 1 runs at 98 % of its memory and publishes just *before* the healthy GPU 0,
  so "latest sample wins" would keep the healthy one. Its weight must drop below its peers'.
* model ``xid``, replica r4: an ``nvml`` sample with XID 79 at XID_AT (between two steps, the
  collector publishes it at once). The next step must drain r4: gpu_health CRITICAL, ``drain``
  action, weight 0 in the correction of that step.
* model ``mix``, replica r7: a ``vllm`` engine sample (allocator reserved/allocated: fragmentation
  0.6) and, half a second later, an ``nvml`` GPU sample (memory 97 %). Both must reach the decider:
  ``kv_pressure`` fires with the fragmentation rule (the engine's fields; the events carry the
  injected low hit rate) and the weight drops below its peers' (the GPU's memory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.kafka_client import run_blocking
from skewwatch.pipeline.replica_step_record import read_step_header, replica_step_dicts
from skewwatch.schemas.telemetry import decode_telemetry, encode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.emit import produce_traffic
from skewwatch.sim.faults import Injection
from skewwatch.sim.generator import GeneratorConfig, TrafficChunk, generate_chunks
from skewwatch.topics import delete_topics, ensure_topics
from tests.conftest import topic_names, unique_settings
from tests.integration.worker_proc import WorkerProcess, consume_until

pytestmark = pytest.mark.kafka

START = 1_700_000_000.0
RUN_FOR = 180.0
STEP = 5.0
MEM_AT = 60.0  # r1's GPU 1 fills up from here
XID_AT = 90.2  # r4's XID 79, between the steps ending at 90 and 95
KV_AT = 30.0  # r7's kv_pressure (fragmentation) injection
GIB = float(1 << 30)
TOTAL = 80.0 * GIB

MODELS = ("mem", "xid", "mix")  # replicas r0-r2, r3-r5, r6-r8
MEM_REPLICA, XID_REPLICA, MIX_REPLICA = "r1", "r4", "r7"


def _through_the_wire(sample: TelemetrySample) -> TelemetrySample:
    """What a producer publishes is what the worker decodes: check the contract on the way."""
    decoded = decode_telemetry(encode_telemetry(sample))
    assert isinstance(decoded, TelemetrySample), decoded
    return decoded


def _rewrite(sample: TelemetrySample) -> list[TelemetrySample]:
    """The generator's one simulated sample per replica -> what real producers would send."""
    t = sample.ts
    if sample.replica == MEM_REPLICA:
        # the engine (no GPU memory) + two GPUs; GPU 1 reports first, GPU 0 (healthy) last
        engine = dataclasses.replace(sample, memory_used_bytes=None, memory_total_bytes=None)
        hot = 0.98 if t >= START + MEM_AT else 0.60
        common: dict[str, Any] = {"replica": sample.replica, "source": "nvml", "node": "node-a",
                                  "memory_total_bytes": TOTAL, "utilization_gpu": 0.7, "xid_count_5m": 0,
                                  "ecc_uncorrected_total": 0}
        return [engine,
                TelemetrySample(ts=t - 0.2, gpu_index=1, gpu_uuid="GPU-1", memory_used_bytes=hot * TOTAL, **common),
                TelemetrySample(ts=t, gpu_index=0, gpu_uuid="GPU-0", memory_used_bytes=0.60 * TOTAL, **common)]
    if sample.replica == XID_REPLICA:
        xid: dict[str, Any] = {"xid_last": 79, "xid_count_5m": 1} if t >= START + XID_AT else {"xid_count_5m": 0}
        gpu = TelemetrySample(ts=t, replica=sample.replica, source="nvml", gpu_index=0, gpu_uuid="GPU-0",
                              memory_used_bytes=sample.memory_used_bytes, memory_total_bytes=TOTAL, **xid)
        out = [sample, gpu]
        if t - STEP < START + XID_AT <= t:  # the collector publishes an XID at once, between rounds
            out.append(dataclasses.replace(gpu, ts=START + XID_AT))
        return out
    if sample.replica == MIX_REPLICA:
        # the vLLM bridge (+ the server's allocator stats), then the GPU collector half a second later
        engine = TelemetrySample(ts=t - 0.5, replica=sample.replica, source="vllm",
                                 queue_length=sample.queue_length, running_requests=sample.running_requests,
                                 kv_cache_usage=sample.kv_cache_usage, kv_cache_hit_rate=sample.kv_cache_hit_rate,
                                 memory_reserved_bytes=50 * GIB, memory_allocated_bytes=20 * GIB)
        gpu = TelemetrySample(ts=t, replica=sample.replica, source="nvml", gpu_index=0, gpu_uuid="GPU-0",
                              memory_used_bytes=0.97 * TOTAL, memory_total_bytes=TOTAL, utilization_gpu=0.8,
                              temperature_c=70.0, xid_count_5m=0)
        return [engine, gpu]
    return [sample]


def _chunks(config: GeneratorConfig) -> Iterator[TrafficChunk]:
    for chunk in generate_chunks(config, START, RUN_FOR):
        telemetry = sorted((_through_the_wire(s) for sample in chunk.telemetry for s in _rewrite(sample)),
                           key=lambda s: s.ts)
        yield TrafficChunk(end_ts=chunk.end_ts, requests=chunk.requests, telemetry=telemetry)


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One worker over the whole run; the tests below read what it published."""
    settings: Settings = unique_settings(kafka_bootstrap)
    run_blocking(ensure_topics(kafka_bootstrap, settings))
    config = GeneratorConfig(models=MODELS, replicas=3, rate=6.0, seed=11,
                             injections=(Injection("kv_pressure", MIX_REPLICA, KV_AT, RUN_FOR - KV_AT),))
    worker = WorkerProcess(settings, tmp_path_factory.mktemp("telemetry-e2e") / "worker.log").start()
    topics = settings.topics
    try:
        asyncio.run(produce_traffic(kafka_bootstrap, _chunks(config), requests_topic=topics.requests,
                                    telemetry_topic=topics.gpu_telemetry, batch=50))

        def done(records: list[Any]) -> bool:
            finished = {orjson.loads(r.value)["model"] for r in records if r.topic == topics.routing_corrections
                        and orjson.loads(r.value)["ts"] >= START + RUN_FOR - 30}
            return finished == set(MODELS)

        records = asyncio.run(consume_until(kafka_bootstrap, [topics.alerts, topics.routing_corrections,
                                                              topics.replica_steps], done, 120))
    finally:
        worker.stop()
    try:
        yield {
            "alerts": [orjson.loads(r.value) for r in records if r.topic == topics.alerts],
            "corrections": sorted((orjson.loads(r.value) for r in records if r.topic == topics.routing_corrections),
                                  key=lambda c: (c["model"], c["seq"])),
            # stage 1 -> stage 2 (internal): each replica's step with the telemetry the join merged
            "steps": [body for r in records if r.topic == topics.replica_steps and read_step_header(r.headers)
                      for body in replica_step_dicts(r.value)],
            "log": worker.log_tail(),
        }
    finally:
        try:
            run_blocking(delete_topics(kafka_bootstrap, topic_names(settings)))
        except Exception as exc:  # best effort, as in conftest
            print(f"could not delete test topics: {exc}")


def _corrections(run: dict[str, Any], model: str, start: float, end: float = math.inf) -> list[dict[str, Any]]:
    return [c for c in run["corrections"] if c["model"] == model and START + start <= c["ts"] < START + end]


def test_memory_pressure_on_one_gpu_of_a_replica_lowers_its_weight(run: dict[str, Any]) -> None:
    before = _corrections(run, "mem", 30.0, MEM_AT)
    during = _corrections(run, "mem", MEM_AT + 10.0)
    assert before and during, run["log"]
    for correction in during:
        weights = correction["weights"]
        peers = [w for r, w in weights.items() if r != MEM_REPLICA]
        assert weights[MEM_REPLICA] < min(peers), correction
    mean_before = sum(c["weights"][MEM_REPLICA] for c in before) / len(before)
    mean_during = sum(c["weights"][MEM_REPLICA] for c in during) / len(during)
    print(f"mem: {MEM_REPLICA} weight {mean_before:.3f} before GPU 1 filled up, {mean_during:.3f} after")
    # 0.4 x memory: 0.60 -> 0.98 moves the seed's denominator by ~0.15 on ~0.4-0.5
    assert mean_during < 0.85 * mean_before
    assert not [a for a in run["alerts"] if a["model"] == "mem"], "memory pressure alone raises no alert"


def test_every_step_carries_the_merged_telemetry_of_its_time(run: dict[str, Any]) -> None:
    """What stage 1 hands stage 2: one merged sample per replica and step, fresh, nothing stale."""
    steps = run["steps"]
    assert len(steps) >= 9 * 30, len(steps)  # 9 replicas, ~35 closed steps
    for body in steps:
        fv, telemetry = body["features"], body["telemetry"]
        assert telemetry is not None and body["telemetry_stale"] == [], body
        age = fv["window_end"] - telemetry["ts"]
        assert 0.0 <= age <= STEP, body  # as of the step's end: never a sample from its future
        if fv["replica"] == MEM_REPLICA:  # two GPUs and the engine
            hot = fv["window_end"] >= START + MEM_AT
            ratio = telemetry["memory_used_bytes"] / telemetry["memory_total_bytes"]
            assert ratio == pytest.approx(0.98 if hot else 0.60), body  # the worst GPU
            assert telemetry["queue_length"] is not None and telemetry["xid_count_5m"] == 0
            assert "gpu_index" not in telemetry  # not one GPU
        if fv["replica"] == MIX_REPLICA:  # engine + GPU: both sources' fields
            assert telemetry["memory_allocated_bytes"] == 20 * GIB and telemetry["memory_total_bytes"] == TOTAL
            assert telemetry["source"] == "vllm" and age == pytest.approx(0.5)


def test_xid_79_drains_the_replica_at_the_next_step(run: dict[str, Any]) -> None:
    before = _corrections(run, "xid", 0.0, XID_AT)
    assert before, run["log"]
    for correction in before:
        assert correction["weights"][XID_REPLICA] > 0
        assert not [a for a in correction["actions"] if a["action"] == "drain"], correction
    drained = next(c for c in _corrections(run, "xid", XID_AT)
                   if any(a["action"] == "drain" and a["replica"] == XID_REPLICA for a in c["actions"]))
    next_step = math.ceil(XID_AT / STEP) * STEP
    delay_steps = math.ceil((drained["ts"] - (START + XID_AT)) / STEP)
    print(f"xid: drained in the correction of step {drained['ts'] - START:.0f} s, "
          f"{drained['ts'] - START - XID_AT:.1f} s of event time after the XID ({delay_steps} step)")
    assert drained["ts"] == START + next_step, "not drained at the first step after the XID"
    assert drained["weights"][XID_REPLICA] == 0.0
    assert all(w > 0 for r, w in drained["weights"].items() if r != XID_REPLICA)
    action = next(a for a in drained["actions"] if a["action"] == "drain")
    assert action["severity"] == "CRITICAL" and action["params"]["cause"] == "XID 79"
    opened = [a for a in run["alerts"] if a["model"] == "xid" and a["state"] == "open"]
    assert [(a["replica"], a["detector"], a["severity"], a["ts"]) for a in opened] == [
        (XID_REPLICA, "gpu_health", "CRITICAL", START + next_step)]
    assert opened[0]["evidence"]["xid_last"] == 79
    # it stays drained for the rest of the run (300 s quiet period, the run ends earlier)
    assert all(c["weights"][XID_REPLICA] == 0.0 for c in _corrections(run, "xid", XID_AT))


def test_engine_and_gpu_samples_of_one_replica_both_reach_the_decider(run: dict[str, Any]) -> None:
    kv = [a for a in run["alerts"] if a["model"] == "mix" and a["detector"] == "kv_pressure" and a["state"] == "open"]
    assert kv, run["alerts"]
    assert {a["replica"] for a in kv} == {MIX_REPLICA}
    fragmentation = [a for a in kv if a["evidence"]["rule"] == "fragmentation"]
    assert fragmentation, kv
    evidence = fragmentation[0]["evidence"]
    assert evidence["fragmentation"] == pytest.approx(0.6)  # from the vllm sample's allocator stats
    assert evidence["kv_cache_hit_rate"] < 0.65
    # and the nvml sample (published after the engine's) still gives the memory signal
    during = _corrections(run, "mix", KV_AT + 30.0)
    assert during, run["log"]
    for correction in during:
        weights = correction["weights"]
        assert weights[MIX_REPLICA] < min(w for r, w in weights.items() if r != MIX_REPLICA), correction
