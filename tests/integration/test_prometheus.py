"""Prometheus rules and the Grafana dashboard, checked with the real tools built from their Go modules:
`promtool test rules` on docker/prometheus/rules.yml, every dashboard query parsed by promtool, and every
query evaluated by a real Prometheus scraping a real worker that reads generated traffic, where each one
must return series (and the detector rule must fire on the fault the traffic carries)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from skewwatch.config import Settings
from skewwatch.sim.emit import produce_traffic
from skewwatch.sim.faults import Injection
from skewwatch.sim.generator import GeneratorConfig, generate_chunks
from tests.integration.worker_proc import WorkerProcess, free_port, produce
from tests.tools import ROOT, tool

RULES = ROOT / "docker" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "docker" / "grafana" / "skewwatch.json"
START = time.time() - 300  # event time: the last 5 minutes, so the traffic is "now" to Prometheus too


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, with the dashboard's variables filled in as Grafana would."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r'\$model\b', ".*", target["expr"])
            out.append((panel["title"], expr))
    return out


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool("promtool")), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_rules_pass_their_promtool_unit_tests() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 11 rules found" in checked.stdout
    tested = promtool("test", "rules", "tests/rules_test.yml", cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:  # the check above can fail
    broken = tmp_path / "broken.yml"
    broken.write_text(RULES.read_text().replace("sum by (model) (skewwatch_weight) == 0",
                                                "sum by (model) (skewwatch_weight == 0"))
    assert promtool("check", "rules", str(broken)).returncode != 0


def test_dashboard_structure_and_every_query_parses(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "skewwatch"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    heatmaps = {panel["targets"][0]["expr"].split("{")[0] for panel in dashboard["panels"]
                if panel["type"] == "heatmap"}
    assert heatmaps == {"skewwatch_replica_gpu_utilization", "skewwatch_replica_kv_cache_usage"}
    queries = dashboard_queries()
    text = " ".join(expr for _, expr in queries)
    for metric in ("skewwatch_replica_latency_ms", "skewwatch_replica_tpot_ms", "skewwatch_replica_batch_fill",
                   "skewwatch_weight", "skewwatch_open_alerts", "skewwatch_consumer_lag", "skewwatch_rejected_total"):
        assert metric in text, metric
    # promtool parses PromQL in rule files: one recording rule per panel query
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout


def query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.kafka
def test_every_dashboard_query_returns_series_from_a_real_prometheus_scraping_a_real_worker(
        kafka_settings: Settings, tmp_path: Path) -> None:
    bootstrap = kafka_settings.kafka.bootstrap or ""
    worker = WorkerProcess(kafka_settings, tmp_path / "worker.log").start()
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "skewwatch", "static_configs": [{"targets": [f"127.0.0.1:{worker.port}"]}]}],
    }))
    prometheus = subprocess.Popen(
        [str(tool("prometheus")), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        # Prometheus scraping the worker before the traffic: the worker drains the backlog in seconds,
        # and the replica gauges read the telemetry of the last decided step, which the steps the
        # worker closes once its input is idle no longer have
        ready = time.monotonic() + 60
        while time.monotonic() < ready:
            with contextlib.suppress(OSError):
                if any(r["value"][1] == "1" for r in query(prom_port, 'up{job="skewwatch"}')):
                    break
            time.sleep(0.5)
        # a hardware fault on r1 from 200 s to the end keeps a CRITICAL gpu_health alert open
        generator = GeneratorConfig(models=("m",), replicas=3, rate=6.0, seed=11,
                                    injections=(Injection("gpu_fault", "r1", 200.0, 200.0, {"class": "hardware"}),))
        asyncio.run(produce_traffic(bootstrap, generate_chunks(generator, START, 290.0),
                                    requests_topic=kafka_settings.topics.requests,
                                    telemetry_topic=kafka_settings.topics.gpu_telemetry, batch=50))
        asyncio.run(produce(bootstrap, kafka_settings.topics.requests, [(b"r1", b"{not json")]))  # a dead letter
        # Each query must return series at some scrape. Not all at one instant: the traffic is a backlog the
        # worker drains in seconds, and a model's per-replica series expire 90 s after its last step, while
        # on a loaded machine another series (the consumer lag, the dead letter) may show up later than that.
        queries = dashboard_queries()
        deadline = time.monotonic() + 120
        empty = [f"{title}: {expr}" for title, expr in queries]
        gpu: dict[str, float] = {}
        while (empty or len(gpu) < 3) and time.monotonic() < deadline:
            time.sleep(2)
            empty = [f"{title}: {expr}" for title, expr in queries
                     if f"{title}: {expr}" in empty and not query(prom_port, expr)]
            if len(gpu) < 3:  # the replica gauges carry real values
                gpu = {r["metric"]["replica"]: float(r["value"][1])
                       for r in query(prom_port, 'skewwatch_replica_gpu_utilization{model="m"}')}
        assert not empty, f"queries without series: {empty}\n{worker.log_tail()}"
        assert set(gpu) == {"r0", "r1", "r2"} and all(0 < v <= 1 for v in gpu.values()), gpu
        # and the rules run in this Prometheus

        def firing() -> set[str]:
            url = f"http://127.0.0.1:{prom_port}/api/v1/alerts"
            with urllib.request.urlopen(url, timeout=10) as r:
                return {a["labels"]["alertname"] for a in json.load(r)["data"]["alerts"] if a["state"] == "firing"}

        deadline = time.monotonic() + 30
        while "SkewwatchDetectorCritical" not in firing() and time.monotonic() < deadline:
            time.sleep(1)
        assert "SkewwatchDetectorCritical" in firing()
        assert "SkewwatchWorkerDown" not in firing()
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=20)
        worker.stop()
