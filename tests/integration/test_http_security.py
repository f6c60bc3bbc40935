"""Who may call the worker's API and the OTLP receiver, on real sockets against the real broker.

The bind address is read from the kernel's socket table (tests/integration/listening.py), not from
what the service says. Loopback by default; beyond loopback a token is required for everything but
/healthz, and a service without one refuses to start unless ``--insecure-no-auth``; the POST needs a
token always, validates its body and publishes a model at most once per second; Faust's own pages
are gone; wrong methods and unknown paths keep their 405 and 404.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.kafka_security import Secret
from skewwatch.otlp.receiver import ListPublisher, OtlpReceiver, serve, server_tls_context
from skewwatch.web_auth import AccessPolicy
from tests.integration.commands import one_line_error, wait_listening
from tests.integration.listening import listening_addresses
from tests.integration.secure_broker import make_certificates
from tests.integration.test_worker import T0, advance_events, as_messages, make_events, wait_for_windows
from tests.integration.worker_proc import WorkerProcess, consume_until, free_port, produce, settings_env
from tests.unit.test_otlp_decode import vllm_request


def call(url: str, method: str = "GET", body: bytes | None = None, token: str | None = None,
         context: ssl.SSLContext | None = None, content_type: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if content_type:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture
def worker(kafka_settings: Settings, tmp_path: Path) -> Any:
    proc = WorkerProcess(kafka_settings, tmp_path / "worker.log").start()
    yield proc
    proc.stop()


def test_the_worker_listens_on_loopback_and_guards_its_post(kafka_settings: Settings, worker: WorkerProcess) -> None:
    assert listening_addresses(worker.port) == {"127.0.0.1"}  # what the kernel says, not the worker
    base = f"http://127.0.0.1:{worker.port}"
    for faust_page in ("/", "/router/", "/table/"):
        assert call(base + faust_page)[0] == 404
    assert call(base + "/api/v1/weights")[0] == 200  # reads are open on loopback
    assert call(base + "/healthz") == (200, b'{"status": "ok"}')
    status, body = call(base + "/api/v1/update_weights", "POST", b"")
    assert status == 401 and b"bearer token" in body  # a change needs the token, even on loopback
    assert call(base + "/api/v1/update_weights", "POST", b"", token="wrong")[0] == 401
    assert call(base + "/api/v1/update_weights", "POST", b"", token=worker.token)[0] == 200
    assert call(base + "/api/v1/update_weights", "PUT", b"", token=worker.token)[0] == 405
    assert call(base + "/api/v1/update_weights", "GET")[0] == 405
    assert call(base + "/api/v1/nothing", "POST", b"{}", token=worker.token)[0] == 404
    for bad in (b"{not json", b"[1, 2]", b'{"model": "m"}', b'{"models": "m"}', b'{"models": []}',
                b'{"models": [""]}', b'{"models": [1]}'):
        status, body = call(base + "/api/v1/update_weights", "POST", bad, token=worker.token,
                            content_type="application/json")
        assert status == 400, (bad, body)
    status, body = call(base + "/api/v1/update_weights", "POST", b'{"models": ["nobody"]}', token=worker.token)
    assert status == 200 and orjson.loads(body)["unknown"] == ["nobody"]
    assert worker.token not in worker.log_path.read_text()  # never logged


def test_post_publishes_a_model_at_most_once_a_second(kafka_settings: Settings, worker: WorkerProcess) -> None:
    bootstrap, topics = kafka_settings.kafka.bootstrap or "", kafka_settings.topics
    events = make_events(3, ["r0", "r1"], T0, 30.0, rate=4.0, model="m")
    asyncio.run(produce(bootstrap, topics.requests, as_messages(events, 10) +
                        as_messages(advance_events(["r0", "r1"], T0 + 60), 1)))
    wait_for_windows(kafka_settings, [("m", T0 + 30)])
    before = len(asyncio.run(consume_until(bootstrap, [topics.routing_corrections], lambda rs: False, 3)))
    started = time.monotonic()
    answers = [worker_post(worker) for _ in range(40)]
    elapsed = time.monotonic() - started
    published = [body for status, body in answers if status == 200]
    assert all(body["published"].keys() == {"m"} for body in published)
    assert 1 <= len(published) <= elapsed / 1.0 + 1  # one publish per model per second at most
    assert all(body["throttled"] == ["m"] for status, body in answers if status == 429)
    assert {status for status, _ in answers} == {200, 429}
    after = asyncio.run(consume_until(bootstrap, [topics.routing_corrections],
                                      lambda rs: len(rs) >= before + len(published), 30))
    assert len(after) - before == len(published)  # 40 POSTs, as many records as publishes, no more


def worker_post(worker: WorkerProcess) -> tuple[int, Any]:
    status, body = call(f"http://127.0.0.1:{worker.port}/api/v1/update_weights", "POST", b'{"models": ["m"]}',
                        token=worker.token)
    return status, orjson.loads(body)


def test_beyond_loopback_everything_but_healthz_needs_the_token(kafka_settings: Settings, tmp_path: Path) -> None:
    with WorkerProcess(kafka_settings, tmp_path / "worker.log", args=("--web-host", "0.0.0.0")) as worker:
        assert listening_addresses(worker.port) == {"0.0.0.0"}
        base = f"http://127.0.0.1:{worker.port}"
        assert call(base + "/healthz")[0] == 200
        for path in ("/readyz", "/metrics", "/api/v1/weights"):
            assert call(base + path)[0] == 401, path
            assert call(base + path, token=worker.token)[0] == 200, path


@pytest.mark.parametrize("command", ["worker", "otlp-receiver"])
def test_beyond_loopback_without_a_token_refuses_to_start(kafka_settings: Settings, command: str,
                                                           tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "SKEWWATCH_WEB_TOKEN",
                                                            "SKEWWATCH_OTLP_TOKEN")}
    env.update(settings_env(kafka_settings))
    port = free_port()
    host_flag = "--web-host" if command == "worker" else "--host"
    port_flag = "--web-port" if command == "worker" else "--port"
    done = subprocess.run([sys.executable, "-m", "skewwatch", command, host_flag, "0.0.0.0", port_flag, str(port)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    one_line_error(done, 2, "beyond loopback", "--insecure-no-auth")
    open_service = subprocess.Popen([sys.executable, "-m", "skewwatch", command, host_flag, "0.0.0.0", port_flag,
                                     str(port), "--insecure-no-auth"], env=env, cwd=tmp_path,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(open_service, port, "0.0.0.0")
        assert call(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        open_service.terminate()
        _, stderr = open_service.communicate(timeout=30)
    assert "NO AUTHENTICATION" in stderr  # the start line says so


# ------------------------------------------------------------------------------------------- the receiver


async def test_the_receiver_wants_its_token_and_serves_tls(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    key_and_chain = certs.broker  # key + certificate for "localhost" + CA, as a server uses it
    publisher = ListPublisher()
    receiver = OtlpReceiver(publisher, policy=AccessPolicy(token=Secret("sender-token"), beyond_loopback=False))
    tls = server_tls_context(str(key_and_chain), str(key_and_chain))
    port = free_port()
    runner = await serve(receiver, "127.0.0.1", port, ssl_context=tls)
    try:
        assert listening_addresses(port) == {"127.0.0.1"}
        client = ssl.create_default_context(cafile=str(certs.ca))
        url = f"https://localhost:{port}"
        body = vllm_request(2).SerializeToString()
        kind = "application/x-protobuf"
        assert await asyncio.to_thread(call, url + "/healthz", context=client) == (200, b'{"status": "ok"}')
        status, _ = await asyncio.to_thread(call, url + "/v1/traces", "POST", body, None, client, kind)
        assert status == 401 and publisher.messages == []
        status, _ = await asyncio.to_thread(call, url + "/v1/traces", "POST", body, "sender-token", client, kind)
        assert status == 200 and len(publisher.messages) == 1
        with pytest.raises(OSError):  # plain HTTP on the TLS port is not answered
            await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        await runner.cleanup()
