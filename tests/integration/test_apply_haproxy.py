"""`skewwatch apply haproxy` against a real HAProxy (Debian's, scripts/haproxy.sh) with stub HTTP backends:
real requests through it follow the corrections' weights; drain/isolate take servers out and their expiry
brings them back; panic mode and an all-ejecting correction leave every server ready."""

from __future__ import annotations

import asyncio
import csv
import http.client
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from skewwatch.bridges.haproxy import RuntimeAPI
from skewwatch.config import Settings
from tests.integration.worker_proc import free_port, produce, settings_env
from tests.tools import tool

pytestmark = pytest.mark.kafka
REPLICAS = ("r1", "r2", "r3")
REQUESTS = 600
TOLERANCE = 0.04  # absolute, on each server's share of REQUESTS


class Stub(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A real HAProxy in front of three stub backends: (frontend port, runtime API socket)."""
    servers = []
    for name in REPLICAS:
        server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    short = Path(tempfile.mkdtemp(prefix="swha-", dir="/tmp"))  # a UNIX socket path must stay short
    socket_path = short / "admin.sock"
    port = free_port()
    lines = "\n".join(f"  server {name} 127.0.0.1:{s.server_address[1]} weight 100"
                      for name, s in zip(REPLICAS, servers, strict=True))
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"""global
  stats socket {socket_path} mode 600 level admin
defaults
  mode http
  timeout connect 2s
  timeout client 10s
  timeout server 10s
frontend fe
  bind 127.0.0.1:{port}
  default_backend llama
backend llama
  balance roundrobin
{lines}
""")
    proc = subprocess.Popen([str(tool("haproxy")), "-f", str(config), "-db"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not socket_path.exists():
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "HAProxy did not open its runtime API socket"
            time.sleep(0.1)
        yield port, str(socket_path)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in servers:
            server.shutdown()
        shutil.rmtree(short, ignore_errors=True)


def split(port: int, n: int = REQUESTS) -> dict[str, float]:
    """Send ``n`` real requests through HAProxy, each on its own connection: share per backend."""
    counts: Counter[str] = Counter()
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/completions")
        response = conn.getresponse()
        assert response.status == 200
        counts[response.read().decode()] += 1
        conn.close()
    return {name: counts[name] / n for name in REPLICAS}


def state(socket_path: str, server: str) -> str:
    """ready | drain | maint, as HAProxy reports the server (without health checks a ready server is "no check")."""
    status = stat(socket_path)[server]["status"]
    return "drain" if status.startswith("DRAIN") else "maint" if status.startswith("MAINT") else "ready"


def stat(socket_path: str) -> dict[str, dict[str, str]]:
    """HAProxy's own view of the llama servers (runtime API `show stat`): server -> CSV row."""
    text = asyncio.run(RuntimeAPI(socket_path=socket_path).command("show stat"))
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {row["svname"]: row for row in rows if row["pxname"] == "llama" and row["svname"] in REPLICAS}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def correction(seq: int, weights: dict[str, float], actions: list[dict[str, Any]] | None = None,
               mode: str | None = None) -> tuple[bytes, bytes]:
    record: dict[str, Any] = {"model": "llama-3-8b", "ts": time.time(), "seq": seq, "weights": weights,
                              "actions": actions or [], "v": 1}
    if mode is not None:
        record["mode"] = mode
    return b"llama-3-8b", orjson.dumps(record)


def action(replica: str, name: str, ttl: float) -> dict[str, Any]:
    return {"replica": replica, "action": name, "severity": "CRITICAL", "reason": "test", "params": {},
            "expires_at": time.time() + ttl}


def assert_close(measured: dict[str, float], expected: dict[str, float]) -> None:
    for name in REPLICAS:
        assert abs(measured[name] - expected[name]) <= TOLERANCE, (measured, expected)



def test_apply_haproxy_follows_corrections(kafka_settings: Settings, haproxy: tuple[int, str],
                                           tmp_path: Path) -> None:
    port, socket_path = haproxy
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.routing_corrections
    backend_map = tmp_path / "backends.toml"
    backend_map.write_text('[models."llama-3-8b"]\nbackend = "llama"\n')
    before = split(port, 300)
    assert_close(before, {"r1": 1 / 3, "r2": 1 / 3, "r3": 1 / 3})  # HAProxy's own config: equal

    asyncio.run(produce(bootstrap, topic, [correction(1000, {"r1": 0.6, "r2": 0.3, "r3": 0.1})]))
    env = {**os.environ, **settings_env(kafka_settings)}
    env.pop("KAFKA_BOOTSTRAP", None)
    log_path = tmp_path / "bridge.log"
    with log_path.open("wb") as log:
        bridge = subprocess.Popen([sys.executable, "-m", "skewwatch", "apply", "haproxy", "--socket", socket_path,
                                   "--backend-map", str(backend_map), "--resync-s", "5"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: stat(socket_path)["r1"]["weight"] == "256", "the weights to reach HAProxy")
        weighted = split(port)
        print("split at 0.6/0.3/0.1:", weighted)
        assert_close(weighted, {"r1": 0.6, "r2": 0.3, "r3": 0.1})

        # drain r2 for 6 s: no new request reaches it; then it expires and r2 is ready again
        asyncio.run(produce(bootstrap, topic, [correction(2000, {"r1": 0.6, "r2": 0.3, "r3": 0.1},
                                                          [action("r2", "drain", 6.0)])]))
        wait_for(lambda: state(socket_path, "r2") == "drain", "r2 to drain")
        drained = split(port, 300)
        assert drained["r2"] == 0.0, drained
        assert_close(drained, {"r1": 256 / 299, "r2": 0.0, "r3": 43 / 299})
        wait_for(lambda: state(socket_path, "r2") == "ready", "the drain to expire", timeout=20)
        assert split(port, 300)["r2"] > 0.2

        # isolate -> maint
        asyncio.run(produce(bootstrap, topic, [correction(3000, {"r1": 0.5, "r2": 0.5, "r3": 0.0},
                                                          [action("r1", "isolate", 60.0)])]))
        wait_for(lambda: state(socket_path, "r1") == "maint", "r1 to go to maintenance")
        assert split(port, 200) == {"r1": 0.0, "r2": 1.0, "r3": 0.0}

        # panic: every server ready, whatever the actions say; weights as published
        asyncio.run(produce(bootstrap, topic, [correction(4000, {"r1": 0.4, "r2": 0.3, "r3": 0.3},
                                                          [action("r1", "isolate", 60.0),
                                                           action("r2", "drain", 60.0)], mode="panic")]))
        wait_for(lambda: all(state(socket_path, r) == "ready" for r in REPLICAS), "panic: all ready")
        assert_close(split(port), {"r1": 0.4, "r2": 0.3, "r3": 0.3})

        # a correction that would eject every server: fail-static, all stay ready
        asyncio.run(produce(bootstrap, topic, [correction(5000, {"r1": 0.4, "r2": 0.3, "r3": 0.3},
                                                          [action(r, "drain", 60.0) for r in REPLICAS])]))
        time.sleep(3)
        assert all(state(socket_path, r) == "ready" for r in REPLICAS)
        assert min(split(port, 300).values()) > 0.2

        # HAProxy loses its runtime state (an operator, a reload): the resync puts it back
        asyncio.run(RuntimeAPI(socket_path=socket_path).command("set weight llama/r1 1"))
        wait_for(lambda: stat(socket_path)["r1"]["weight"] == "256", "the resync", timeout=20)
    finally:
        bridge.terminate()
        bridge.wait(timeout=15)
    log_text = log_path.read_text()
    assert "no server of the pool ready" in log_text, log_text
    assert "Traceback" not in log_text, log_text


def test_apply_haproxy_without_haproxy_is_one_line(tmp_path: Path, kafka_bootstrap: str) -> None:
    backend_map = tmp_path / "backends.toml"
    backend_map.write_text('[models."m"]\nbackend = "b"\n')
    done = subprocess.run([sys.executable, "-m", "skewwatch", "apply", "haproxy", "--socket",
                           str(tmp_path / "none.sock"), "--backend-map", str(backend_map),
                           "--bootstrap", kafka_bootstrap], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3  # PeerUnreachable
    assert done.stderr.strip().startswith("Error: HAProxy runtime API at") and "does not answer" in done.stderr
    assert "Traceback" not in done.stderr
