"""The real worker as a benchmark contender: ``skewwatch worker`` in a child process, watched from outside.

The contender "ours": the real worker, end to end. The worker reads the dataset's topic
(the other topics are fresh per run, so no checkpoint is restored and all work is redone). From
outside, the harness reads ``/metrics`` (``skewwatch_events_in_total``) every ``scrape_s`` and the
process's CPU time every ``poll_s``. The clocks start when the worker's first poll with records returns (written by
:mod:`bench.throughput.probe`, the same start as the peers'), and every event counts. Two rates:

- *ingest*: until every event is accepted into the windows (or counted late/rejected);
- *end to end*: until the per-model feature vector of the step that holds the last event is on
  ``llm.features`` (its Kafka timestamp), i.e. every event's step was decoded, windowed, closed,
  merged per model, decided and published. This is the headline number.

CPU per event is the worker's process CPU time over the end-to-end interval, peak RSS its VmHWM.
With ``profile`` the run is sampled by py-spy (``--format raw``: collapsed stacks) so that a missed
target comes with where the time went (:mod:`bench.throughput.profile`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import orjson
from aiokafka import AIOKafkaConsumer
from prometheus_client.parser import text_string_to_metric_families

from bench.throughput.common import REPO, fresh_settings, peak_rss_bytes
from bench.throughput.dataset import Dataset
from skewwatch.config import Settings
from skewwatch.topics import ensure_topics
from tests.integration.worker_proc import free_port, settings_env


class BenchWorker:
    """A ``skewwatch worker`` child process: start, metrics, CPU, peak RSS, optional py-spy, stop."""

    def __init__(self, settings: Settings, log_path: Path, extra_env: dict[str, str] | None = None,
                 tree: Path | None = None) -> None:
        """``tree``: another checkout of the repository to run the worker from (its own code on
        ``PYTHONPATH``, with this virtual environment); default this one."""
        self.settings = settings
        self.tree = tree or REPO
        self.port = free_port()
        self.log_path = log_path
        self.probe_path = log_path.with_suffix(".probe.json")
        self.probe_path.unlink(missing_ok=True)
        self.env = {**os.environ, **settings_env(settings), "SKEWWATCH_BENCH_PROBE": str(self.probe_path),
                    **(extra_env or {})}
        if tree is not None:
            self.env["PYTHONPATH"] = str(tree)
        self.env.pop("KAFKA_BOOTSTRAP", None)
        self.proc: subprocess.Popen[bytes] | None = None
        self._spy: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> BenchWorker:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.throughput.probe", "worker", "--web-port", str(self.port),
             "--loglevel", "warning"], cwd=self.tree, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def first_poll(self) -> tuple[float, float] | None:
        """(wall, process CPU) when the first poll with records returned, once the probe wrote it."""
        try:
            data = orjson.loads(self.probe_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return float(data["wall"]), float(data["cpu"])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> dict[str, float] | None:
        """Every sample of ``/metrics``, summed over label sets: name -> value (None while down)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
                if sample.labels:
                    key = sample.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
                    out[key] = sample.value
        return out

    def cpu_seconds(self) -> float:
        import psutil  # bench extra

        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def peak_rss(self) -> int | None:
        return peak_rss_bytes(self.pid)

    def profile_start(self, path: Path, rate: int = 100) -> None:
        """Sample the worker with py-spy (collapsed stacks to ``path``) until :meth:`profile_stop`."""
        self._spy = subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(self.pid), "--threads",
             "--format", "raw", "--rate", str(rate), "-o", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def profile_stop(self) -> None:
        if self._spy is not None and self._spy.poll() is None:
            self._spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                self._spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._spy.kill()
        self._spy = None

    def stop(self) -> None:
        self.profile_stop()
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


async def model_steps_published(bootstrap: str, topic: str, models: tuple[str, ...], window_end: float,
                                timeout_s: float) -> float | None:
    """Kafka timestamp (epoch s) at which the per-model vectors of ``window_end`` were all on
    ``topic`` (the latest of the models'), or None if not within ``timeout_s``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    found: dict[str, float] = {}
    wanted = {m.encode(): m for m in models}
    try:
        deadline = time.monotonic() + timeout_s
        while len(found) < len(models) and time.monotonic() < deadline:
            polled = await consumer.getmany(timeout_ms=200)
            for messages in polled.values():
                for message in messages:
                    model = wanted.get(message.key or b"")
                    if model is None or model in found:
                        continue
                    if float(orjson.loads(message.value)["window_end"]) >= window_end:
                        found[model] = message.timestamp / 1000.0
    finally:
        await consumer.stop()
    return max(found.values()) if len(found) == len(models) else None


async def delete_run_topics(settings: Settings, keep: str) -> None:
    """Delete the topics this run created (all but ``keep``, the dataset's): each worker run makes
    its own output, hand-off and checkpoint topics, and a broker holding hundreds of partitions from
    earlier runs does more background work while the later contenders run."""
    from aiokafka.admin import AIOKafkaAdminClient

    names = [name for f in msgspec.structs.fields(settings.topics)
             if isinstance(name := getattr(settings.topics, f.name), str) and name and name != keep]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap or "")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [name for name in names if name in existing]
        if doomed:
            await admin.delete_topics(doomed)
    except Exception as exc:  # a leftover topic only costs the broker a little; keep the run's numbers
        print(f"  (could not delete this run's topics: {exc})", file=sys.stderr)
    finally:
        await admin.close()


def _interpolate(samples: list[tuple[float, float]], t: float) -> float:
    """Linear interpolation of (time, value) samples at ``t`` (clamped to the ends)."""
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in zip(samples, samples[1:], strict=False):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return samples[-1][1]


async def run_worker_case(dataset: Dataset, batched: bool, workdir: Path, *, poll_s: float = 0.1, scrape_s: float = 0.5,
                          timeout_s: float = 900.0, stall_s: float = 60.0,
                          profile_path: Path | None = None,
                          checkpoint_interval_s: float | None = None, tree: Path | None = None) -> dict[str, Any]:
    """One run of the real worker over one topic of the dataset; see the module docstring.
    ``checkpoint_interval_s``: the worker's ``limits.checkpoint_interval_s`` (None: its default); ``tree``:
    the checkout whose worker runs (None: this one).
    The process's CPU time is read every ``poll_s``; ``/metrics`` is scraped every ``scrape_s`` (each
    scrape costs the worker a few ms of its event loop: 10 a second measurably slowed it, where a
    Prometheus server scrapes every 15 s or so)."""
    settings = fresh_settings(dataset.bootstrap, dataset.partitions, "ours")
    if checkpoint_interval_s is not None:
        settings.limits.checkpoint_interval_s = checkpoint_interval_s
    settings.topics = msgspec.structs.replace(settings.topics, requests=dataset.topic(batched))
    await ensure_topics(dataset.bootstrap, settings)
    worker = BenchWorker(settings, workdir / f"worker-{'batch' if batched else 'single'}.log", tree=tree).start()
    try:
        cpu: list[tuple[float, float]] = []
        ingest_end: float | None = None
        profiling = False
        last_progress = (0.0, time.monotonic())
        metrics: dict[str, float] = {}
        next_scrape = 0.0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.log_tail()}")
            now = time.time()
            if profile_path is not None and not profiling and worker.first_poll() is not None:
                worker.profile_start(profile_path)
                profiling = True
            if metrics and now < next_scrape:  # between scrapes: only the CPU clock (read from outside)
                cpu.append((now, worker.cpu_seconds()))
                await asyncio.sleep(poll_s)
                continue
            got = await asyncio.to_thread(worker.metrics)
            if got is None:  # still starting
                await asyncio.sleep(poll_s)
                continue
            metrics = got
            next_scrape = now + scrape_s
            cpu.append((now, worker.cpu_seconds()))
            handled = (got.get("skewwatch_events_in_total", 0.0) + got.get("skewwatch_late_events_total", 0.0)
                       + got.get("skewwatch_rejected_total", 0.0))
            if handled > last_progress[0]:
                last_progress = (handled, time.monotonic())
            if handled >= dataset.events:
                ingest_end = now
                break
            if handled and time.monotonic() - last_progress[1] > stall_s:
                break
            await asyncio.sleep(poll_s)
        first = worker.first_poll()
        if first is None or ingest_end is None:
            accepted = metrics.get("skewwatch_events_in_total")
            raise RuntimeError(f"the worker did not take every event in time ({accepted} of {dataset.events}):\n"
                               f"{worker.log_tail()}")
        # end to end: the per-model vectors of the last step; keep sampling CPU meanwhile
        waiter = asyncio.ensure_future(model_steps_published(
            dataset.bootstrap, settings.topics.features, dataset.models, dataset.last_step_end, timeout_s=120))
        while not waiter.done():
            cpu.append((time.time(), worker.cpu_seconds()))
            await asyncio.sleep(poll_s)
        e2e_end = waiter.result()
        worker.profile_stop()
        final = await asyncio.to_thread(worker.metrics) or metrics
        peak = worker.peak_rss()
    finally:
        worker.stop()
        await delete_run_topics(settings, keep=dataset.topic(batched))
    if e2e_end is None:
        raise RuntimeError("the last step's per-model vectors never appeared on llm.features")
    wall0, cpu0 = first
    events = final.get("skewwatch_events_in_total", 0.0)
    e2e_seconds = e2e_end - wall0
    return {
        "events": int(events),
        "seconds": e2e_seconds,
        "cpu_s": _interpolate(cpu, e2e_end) - cpu0,
        "peak_rss_bytes": peak,
        "ingest_seconds": ingest_end - wall0,
        "ingest_events_per_s": events / (ingest_end - wall0),
        "accepted": int(final.get("skewwatch_events_in_total", 0.0)),
        "late": int(final.get("skewwatch_late_events_total", 0.0)),
        "rejected": int(final.get("skewwatch_rejected_total", 0.0)),
        "step_seconds_stage1": round(final.get("skewwatch_step_duration_seconds_sum{stage=stage1}", 0.0), 3),
        "step_seconds_stage2": round(final.get("skewwatch_step_duration_seconds_sum{stage=stage2}", 0.0), 3),
        "profile": str(profile_path) if profile_path is not None else None,
    }


__all__ = ["BenchWorker", "model_steps_published", "run_worker_case"]
