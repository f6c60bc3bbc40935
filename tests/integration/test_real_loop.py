"""The whole loop on real engines, short: three llama.cpp replicas behind a real HAProxy, one of them
throttled for real (stopped and continued on a 25 % duty cycle: 4 x slower), the worker, `skewwatch scrape` per
replica and `skewwatch apply haproxy` (bench/real_loop.py, with its own timeline shortened).

It asserts what a user of the loop would check, under the default profile: its weight dropped in
HAProxy itself, its share of the real requests falling, and no alert on a healthy replica. (A replica
slower as a whole than its peers raises no alert under the default profile, only a lower weight: the
slow_replica detector that would is off by default, docs/detectors.md.)

Why 4 x and not the benchmark's 2 x: at the rate one CPU thread per replica serves (about 1.3
requests/s for the fleet), the fault's second half holds about 50 requests, so the replica's share
there has a sampling error of about 0.07, as large as what a 2 x throttle takes off it under
``leastconn``; a 4 x throttle takes off about 0.15, which a share can show."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.real_loop import RunConfig, run_once
from tests.tools import smollm2_model, tool

pytestmark = [pytest.mark.kafka, pytest.mark.real_engine]


def test_a_throttled_llama_server_is_demoted_in_haproxy_and_loses_traffic(kafka_bootstrap: str, tmp_path: Path) -> None:
    paths = (tool("llama-server"), smollm2_model(), tool("haproxy"))
    config = RunConfig("throttle", "leastconn+skewwatch", replicas=3, slots=2, rate=None, load=0.5,
                       warmup_s=70.0, fault_for_s=80.0, after_s=0.0, prompt_scale=0.01, output_scale=0.03, duty=0.25)
    run = run_once(config, kafka_bootstrap, paths, tmp_path, calibrate_s=10.0)
    shares = [(b["t"], b["faulty_share"]) for b in run["timeline"] if b["faulty_share"] is not None]
    before = [s for t, s in shares if t < config.warmup_s]
    late = [s for t, s in shares if config.warmup_s + config.fault_for_s / 2 <= t < config.warmup_s
            + config.fault_for_s]
    context = f"rate {run['rate']:.2f}/s; alerts {run['detectors']} elsewhere {run['alerts_elsewhere']}; " \
              f"HAProxy weights {run['haproxy_weights'][-6:]}"
    assert run["failed"] == 0, context
    assert not run["alerts_elsewhere"], context  # no alert on a healthy replica
    assert run["demoted_haproxy_s"] is not None, context  # its weight dropped in HAProxy itself
    # ... and stayed down through the fault's second half (below 80 % of its peers' mean, on average)
    held = [w["r1"] / ((w["r0"] + w["r2"]) / 2) for w in run["haproxy_weights"]
            if config.warmup_s + config.fault_for_s / 2 <= w["t"] < config.warmup_s + config.fault_for_s]
    assert held and sum(held) / len(held) < 0.8, (held, context)
    # its share of the real requests falls: in the fault's second half, below its share before the fault
    assert sum(late) / len(late) < 0.8 * sum(before) / len(before), (shares, context)
