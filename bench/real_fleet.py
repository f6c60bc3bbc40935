"""Real engines behind a real load balancer, the parts of ``bench/real_loop.py`` and of its suite test.

- :class:`Engine`: one llama.cpp ``llama-server`` replica (built by ``scripts/engines.sh``) serving the
  bundled SmolLM2-135M on loopback, with its Prometheus ``/metrics``;
- :class:`HAProxy`: HAProxy in front of them (``leastconn`` or ``roundrobin``, health checks on
  ``/health``), which names the serving replica in the ``X-Served-By`` response header and takes
  weights through its runtime API socket;
- :class:`LoadGenerator`: OpenAI-style chat completions through HAProxy at Poisson arrivals, prompt
  and output lengths drawn from a bundled trace and scaled to what the tiny model serves on a CPU;
  one request event per finished request, published with ``skewwatch.client``'s producer from what a
  gateway has (its own latency, the response's ``usage`` and llama.cpp's per-request ``timings``);
- the faults a real fleet suffers, on one replica: :class:`Throttle` (the process stopped and
  continued on a duty cycle, the way a thermally throttled GPU runs at a fraction of its speed),
  a hang (stopped for good), a death (killed; a supervisor restarts it when the fault ends) and a
  starved replica (restarted with fewer slots than its peers: slower for its load, not broken).

>>> print(haproxy_config("leastconn", {"r0": 8001, "r1": 8002}, 9000, "/tmp/a.sock").splitlines()[-2])
    server r0 127.0.0.1:8001 weight 256 check
>>> scaled_lengths([4000, 100], [500, 3], prompt_scale=0.1, output_scale=0.1, max_prompt=256, max_output=48)
([256, 10], [48, 4])
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from skewwatch.client import RequestEventProducer

MODEL = "smollm2-135m"  # the model name of the events and of the backend map
BACKEND = "llm"
SERVED_BY = "X-Served-By"
MIN_PROMPT, MIN_OUTPUT = 8, 4  # tokens: the shortest request the generator sends


def scaled_lengths(prompts: Sequence[int], outputs: Sequence[int], *, prompt_scale: float, output_scale: float,
                   max_prompt: int, max_output: int) -> tuple[list[int], list[int]]:
    """A trace's prompt and output lengths scaled to the tiny model's speed and clipped to its context."""
    p = [min(max(round(x * prompt_scale), MIN_PROMPT), max_prompt) for x in prompts]
    o = [min(max(round(x * output_scale), MIN_OUTPUT), max_output) for x in outputs]
    return p, o


def haproxy_config(balance: str, servers: dict[str, int], port: int, socket_path: str) -> str:
    """HAProxy's configuration: one frontend on loopback, one backend of ``servers`` (name -> port)."""
    lines = [
        "global",
        f"    stats socket {socket_path} mode 600 level admin",
        "    maxconn 2000",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 90s",
        "    timeout server 60s",  # under the generator's own timeout: a hung replica's requests end as 504 here
        "frontend fe",
        f"    bind 127.0.0.1:{port}",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        f"    balance {balance}",
        "    option httpchk GET /health",
        "    default-server inter 1s fall 3 rise 2",
        # after-response: HAProxy's own 503/504 name the server too, so a failed request is attributed
        f"    http-after-response set-header {SERVED_BY} %s",
    ]
    lines += [f"    server {name} 127.0.0.1:{p} weight 256 check" for name, p in servers.items()]
    return "\n".join(lines) + "\n"


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")


@dataclass
class Engine:
    """One ``llama-server`` replica on loopback."""

    name: str
    binary: Path
    model_path: Path
    port: int
    log_dir: Path
    threads: int = 1
    slots: int = 2
    context: int = 2048  # tokens, shared by the slots
    proc: subprocess.Popen[bytes] | None = None

    def start(self, *, slots: int | None = None, timeout_s: float = 60.0) -> Engine:
        slots = slots or self.slots
        command = [str(self.binary), "-m", str(self.model_path), "--host", "127.0.0.1", "--port", str(self.port),
                   "-t", str(self.threads), "-np", str(slots), "-c", str(self.context), "--metrics",
                   "--alias", MODEL]
        with (self.log_dir / f"{self.name}.log").open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_http(f"http://127.0.0.1:{self.port}/health", timeout_s, self.proc)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        stop_process(self.proc)


class Throttle:
    """Stop and continue a process on a duty cycle: it runs ``duty`` of every ``period_s``."""

    def __init__(self, engine: Engine, duty: float = 0.5, period_s: float = 0.1) -> None:
        self.engine, self.duty, self.period_s = engine, duty, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"throttle:{engine.name}", daemon=True)

    def start(self) -> Throttle:
        self._thread.start()
        return self

    def _run(self) -> None:
        running_s, stopped_s = self.period_s * self.duty, self.period_s * (1.0 - self.duty)
        while not self._stop.is_set():
            self.engine.signal(signal.SIGSTOP)
            self._stop.wait(stopped_s)
            self.engine.signal(signal.SIGCONT)
            self._stop.wait(running_s)
        self.engine.signal(signal.SIGCONT)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.engine.signal(signal.SIGCONT)


class Fault:
    """One fault on one engine, begun and ended by the benchmark's clock."""

    KINDS = ("throttle", "hang", "die", "starve")

    def __init__(self, kind: str, engine: Engine, *, duty: float = 0.5, starved_slots: int = 1) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"unknown fault {kind!r} (kinds: {', '.join(self.KINDS)})")
        self.kind, self.engine, self.duty, self.starved_slots = kind, engine, duty, starved_slots
        self._throttle: Throttle | None = None

    def begin(self) -> None:
        if self.kind == "throttle":
            self._throttle = Throttle(self.engine, self.duty).start()
        elif self.kind == "hang":
            self.engine.signal(signal.SIGSTOP)
        elif self.kind == "die":
            self.engine.signal(signal.SIGKILL)
        else:  # a rolling restart with a bad setting: fewer slots than its peers
            self.engine.stop()
            self.engine.start(slots=self.starved_slots)

    def end(self) -> None:
        if self._throttle is not None:
            self._throttle.stop()
        elif self.kind == "hang":
            self.engine.signal(signal.SIGCONT)
        elif self.kind in ("die", "starve"):  # its supervisor brings it back as it was
            self.engine.stop()
            self.engine.start()


class HAProxy:
    """HAProxy with ``haproxy_config``; its runtime API at ``socket_path``."""

    def __init__(self, binary: Path, balance: str, servers: dict[str, int], port: int, workdir: Path) -> None:
        self.binary, self.port, self.workdir = binary, port, workdir
        self.socket_path = str(workdir / "admin.sock")
        self.config_path = workdir / "haproxy.cfg"
        self.config_path.write_text(haproxy_config(balance, servers, port, self.socket_path))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HAProxy:
        with (self.workdir / "haproxy.log").open("ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "-db", "-f", str(self.config_path)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not Path(self.socket_path).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start: {(self.workdir / 'haproxy.log').read_text()[-2000:]}")
            time.sleep(0.1)
        return self

    def command(self, line: str) -> str:
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(self.socket_path)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def weights(self) -> dict[str, int]:
        """Each server's current weight (``show servers state``: field 8 is srv_uweight)."""
        out: dict[str, int] = {}
        for line in self.command(f"show servers state {BACKEND}").splitlines():
            parts = line.split()
            if len(parts) > 7 and parts[1] == BACKEND:
                out[parts[3]] = int(parts[7])
        return out

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@dataclass
class Finished:
    """One request as the client saw it."""

    start: float  # wall clock, s
    end: float
    replica: str | None  # HAProxy's X-Served-By (None: no answer named one)
    latency_ms: float
    ok: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0


WORDS = ("the", "fleet", "router", "replica", "token", "window", "batch", "queue", "engine", "latency",
         "signal", "weight", "stream", "event", "model", "cache", "prompt", "answer", "request", "server")


@dataclass
class LoadGenerator:
    """Poisson arrivals of chat completions through ``url``; every finished request is one event."""

    url: str
    bootstrap: str
    topic: str
    replicas: Sequence[str]
    prompts: Sequence[int]
    outputs: Sequence[int]
    rate: float  # requests per second, the whole fleet
    batch_capacity: int | None = None
    seed: int = 1
    timeout_s: float = 90.0
    finished: list[Finished] = field(default_factory=list)
    published: int = 0

    async def calibrate(self, duration_s: float, concurrency: int) -> float:
        """Requests per second the fleet serves with ``concurrency`` requests always in flight (closed
        loop, nothing published): the capacity the open-loop rate is set against, measured on this
        machine as it is loaded now rather than assumed."""
        rng = random.Random(self.seed + 1)
        end = time.monotonic() + duration_s
        done = 0

        async def client(session: aiohttp.ClientSession) -> None:
            nonlocal done
            while time.monotonic() < end:
                i = rng.randrange(len(self.prompts))
                if (await self._post(session, self.prompts[i], self.outputs[i], rng.random()))[2]:
                    done += 1

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as session:
            started = time.monotonic()
            await asyncio.gather(*(client(session) for _ in range(concurrency)))
            return done / (time.monotonic() - started)

    async def run(self, duration_s: float) -> None:
        rng = random.Random(self.seed)
        producers = {name: RequestEventProducer(self.bootstrap, replica=name, model=MODEL, topic=self.topic,
                                                linger_ms=100) for name in self.replicas}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                tasks: set[asyncio.Task[None]] = set()
                end = time.monotonic() + duration_s
                while (now := time.monotonic()) < end:
                    i = rng.randrange(len(self.prompts))
                    task = asyncio.create_task(self._one(session, producers, self.prompts[i], self.outputs[i],
                                                         rng.random()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    await asyncio.sleep(min(rng.expovariate(self.rate), max(end - now, 0.0)))
                if tasks:
                    await asyncio.wait(tasks)
        finally:
            for producer in producers.values():
                await producer.aclose()

    async def _post(self, session: aiohttp.ClientSession, prompt_tokens: int, max_tokens: int,
                    salt: float) -> tuple[str | None, dict[str, Any], bool]:
        """One chat completion: (the replica HAProxy named, the response body, whether it succeeded)."""
        # words of one token each in SmolLM2's vocabulary; a salt first so no two prompts share a prefix
        text = f"{salt:.12f} " + " ".join(WORDS[(k * 7) % len(WORDS)] for k in range(max(prompt_tokens - 8, 1)))
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "ignore_eos": True, "cache_prompt": False, "temperature": 0.8}
        replica: str | None = None
        try:
            async with session.post(self.url, json=body) as response:
                replica = response.headers.get(SERVED_BY)
                if response.status == 200:
                    return replica, await response.json(), True
                await response.read()
        except (TimeoutError, aiohttp.ClientError):
            pass
        return replica, {}, False

    async def _one(self, session: aiohttp.ClientSession, producers: dict[str, RequestEventProducer],
                   prompt_tokens: int, max_tokens: int, salt: float) -> None:
        start_wall, start = time.time(), time.monotonic()
        replica, payload, ok = await self._post(session, prompt_tokens, max_tokens, salt)
        latency_ms = (time.monotonic() - start) * 1000.0
        usage = payload.get("usage") or {}
        timings = payload.get("timings") or {}
        done = Finished(start_wall, start_wall + latency_ms / 1000.0, replica, latency_ms, ok,
                        int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        self.finished.append(done)
        producer = producers.get(replica or "")
        if producer is None:  # no replica named: nothing to attribute (counted in `finished`)
            return
        # a gateway's view: its own latency; the first token after the queue and the prefill, i.e.
        # everything but llama.cpp's decode time of the other tokens
        predicted_ms = float(timings.get("predicted_ms") or 0.0)
        per_token_ms = predicted_ms / max(done.completion_tokens, 1)
        ttft_ms = max(latency_ms - predicted_ms + per_token_ms, 0.0) if ok else None
        producer.record(latency_ms=latency_ms, prompt_tokens=done.prompt_tokens or prompt_tokens,
                        completion_tokens=done.completion_tokens, batch_size=None,
                        batch_capacity=self.batch_capacity, ttft_ms=ttft_ms, status="ok" if ok else "error",
                        ts=done.end)
        self.published += 1
