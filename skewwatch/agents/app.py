"""The worker: the two pipeline stages, the HTTP API and the metrics in one process.

Faust gives the process its lifecycle (signals, graceful stop) and its conventions; it runs no
Kafka client and no web server of its own (:class:`LifecycleOnly`). The per-request hot path does
*not* go through a Faust stream: each stage owns an aiokafka consumer (see
:mod:`skewwatch.agents.stage`) because a Faust stream pays a fixed cost per message, and at a
fleet's event rate that cost, not the work, would set the pipeline's pace. Its state is
checkpointed with the offset it covers (:mod:`skewwatch.agents.checkpoint`) instead of a Faust
table, which would write a changelog entry per event and ack offsets independently.

HTTP (:mod:`skewwatch.agents.http_api`, ``[web]`` host and port, 127.0.0.1:6066 by default):
``GET /healthz``, ``GET /readyz``, ``GET /api/v1/weights``, ``POST /api/v1/update_weights``,
``GET /metrics``.

The worker waits for its broker: it listens at once, answers ``/readyz`` with 503 and why, probes the
broker with back-off (:class:`~skewwatch.broker_watch.BrokerWatch`), then creates the topics and
starts the stages. A stage that stops on a Kafka error restarts from its last checkpoint once the
broker answers again, with back-off; the logs say so once per distinct error per 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import faust
import mode
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from faust.app.base import BootStrategy

from skewwatch.agents.http_api import HttpService, WorkerApi
from skewwatch.agents.memory import trim_heap
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.model_stage import ModelStage
from skewwatch.agents.otlp_stage import OtlpStage
from skewwatch.agents.replica_stage import ReplicaStage
from skewwatch.agents.stage import Stage
from skewwatch.broker_watch import BrokerWatch
from skewwatch.cli import command_settings
from skewwatch.config import Settings
from skewwatch.errors import KafkaUnreachable
from skewwatch.kafka_client import (
    check_kafka,
    client_kwargs,
    describe_exception,
    faust_app_kwargs,
    require_bootstrap,
)
from skewwatch.kafka_security import describe_listener
from skewwatch.listen import bind_socket, listening_url
from skewwatch.logs import logging_options, setup_logging, skewwatch_version
from skewwatch.pipeline.detectors.profiles import PROFILES
from skewwatch.topics import TopicError, ensure_topics
from skewwatch.web_auth import AccessPolicy, check_bind, is_loopback, load_token

log = logging.getLogger("skewwatch.worker")

PRODUCER_MAX_REQUEST_BYTES = 16 * 1024 * 1024  # checkpoint chunks are up to 4 MiB
# aiokafka sends one produce request per broker at a time, holding at most one batch per partition,
# and a send() to a partition whose batch is full waits until that batch has left. With the default
# 16 KiB batches, a step's hand-off records (a few KB each, on the few partitions of the models' keys)
# queued behind one round trip per 16 KiB, so the broker's round trips, not the work, set stage 1's
# pace. One batch holds a step's records of a partition; it still leaves after linger_ms however
# little it holds.
PRODUCER_BATCH_BYTES = 1024 * 1024
RESTART_BACKOFF_S = (1.0, 30.0)  # a failed stage restarts after 1 s, doubling up to 30 s
STABLE_RUN_S = 60.0  # a stage that ran this long before failing starts again from the shortest back-off
WEB_TOKEN_HINT = "put one in a file named by [web] token_file (--token-file) or in $SKEWWATCH_WEB_TOKEN"


class LifecycleOnly(BootStrategy):
    """Faust starts no Kafka client and no web server: the stages own their clients, the API its server."""

    enable_kafka = False
    enable_web = False


class WorkerApp(faust.App):
    """The worker's Faust app (lifecycle only, see :class:`LifecycleOnly`)."""

    BootStrategy = LifecycleOnly
    logger = logging.getLogger("mode.lifecycle")  # "Starting..."/"Stopping..." at --loglevel debug only


class PipelineService(mode.Service):
    """Waits for the broker, then runs stage 1 and stage 2 with one shared producer; restarts a stage that
    fails (from its last checkpoint, with back-off); knows whether the worker is ready."""

    logger = logging.getLogger("mode.lifecycle")

    def __init__(self, settings: Settings, bootstrap: str, metrics: WorkerMetrics, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.bootstrap = bootstrap
        self.metrics = metrics
        health = settings.health
        self.watch = BrokerWatch(bootstrap, settings.kafka, interval_s=health.probe_interval_s,
                                 timeout_s=health.probe_timeout_s, client_id=f"{settings.kafka.client_id}-probe")
        self.producer: AIOKafkaProducer | None = None
        self.stage1: ReplicaStage | None = None
        self.stage2: ModelStage | None = None
        self.otlp: OtlpStage | None = None  # only when topics.otlp_spans is set
        self.phase = "waiting for Kafka"
        self._stage_tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    @mode.Service.task
    async def _watch_broker(self) -> None:
        await self.watch.run()

    @mode.Service.task
    async def _start_pipeline(self) -> None:
        """Wait for the broker (the watch backs off), create the topics, start the producer and stages."""
        delay = RESTART_BACKOFF_S[0]
        while not self.should_stop:
            await self.watch.wait_reachable()
            try:
                self.phase = "creating topics"
                created = await ensure_topics(self.bootstrap, self.settings)
                if created:
                    log.info("created topics: %s", ", ".join(created))
                self.phase = "starting the producer"
                self.producer = await self._start_producer()
                break
            except (TopicError, KafkaUnreachable, KafkaError, OSError) as exc:
                self.phase = "waiting for Kafka"
                log.warning("cannot start the pipeline yet (%s); retrying in %.0f s", describe_exception(exc), delay)
                await self.sleep(delay)
                delay = min(delay * 2, RESTART_BACKOFF_S[1])
        if self.should_stop:
            return
        self.phase = "running"
        self._stage_tasks = [
            asyncio.ensure_future(self._supervise("stage1", self._new_stage1)),
            asyncio.ensure_future(self._supervise("stage2", self._new_stage2)),
        ]
        if self.settings.topics.otlp_spans:
            self._stage_tasks.append(asyncio.ensure_future(self._supervise("otlp", self._new_otlp)))

    async def _start_producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            **client_kwargs(self.settings.kafka, bootstrap=self.bootstrap),
            client_id=f"{self.settings.kafka.client_id}-out",
            acks="all",
            linger_ms=5,
            enable_idempotence=True,  # keeps per-partition order: progress markers follow summaries
            max_request_size=PRODUCER_MAX_REQUEST_BYTES,
            max_batch_size=PRODUCER_BATCH_BYTES,
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()  # no "Unclosed AIOKafkaProducer" on the way out
            raise
        return producer

    def _new_otlp(self) -> OtlpStage:
        assert self.producer is not None
        self.otlp = OtlpStage(self.settings, self.bootstrap, self.producer, self.metrics)
        return self.otlp

    def _new_stage1(self) -> ReplicaStage:
        assert self.producer is not None
        self.stage1 = ReplicaStage(self.settings, self.bootstrap, self.producer, self.metrics)
        return self.stage1

    def _new_stage2(self) -> ModelStage:
        assert self.producer is not None
        self.stage2 = ModelStage(self.settings, self.bootstrap, self.producer, self.metrics)
        return self.stage2

    @mode.Service.task
    async def _trim_memory(self) -> None:
        """Every ``limits.memory_trim_s``: the heap's free memory back to the OS (see agents/memory.py)."""
        interval = self.settings.limits.memory_trim_s
        if interval <= 0:
            return
        while not self.should_stop:
            await self.sleep(interval)
            started = time.perf_counter()
            if trim_heap():
                log.debug("malloc_trim released free heap memory in %.1f ms", 1e3 * (time.perf_counter() - started))

    async def _supervise(self, name: str, factory: Callable[[], Stage]) -> None:
        """A stage must not take the worker down: rebuild it from its last checkpoint and go on. A Kafka
        error waits for the broker to answer again; the back-off doubles (1 s to 30 s) while failures
        follow each other, so an outage costs a few lines, not a restart loop."""
        delay = RESTART_BACKOFF_S[0]
        while not self._stopping:
            stage = factory()
            started = time.monotonic()
            try:
                await stage.run()
            except asyncio.CancelledError:
                raise
            except (KafkaError, OSError) as exc:
                log.warning("%s stopped on a Kafka error (%s); restarting it from its last checkpoint once the "
                            "broker answers", name, describe_exception(exc))
            except Exception:
                log.exception("%s failed; restarting it from its last checkpoint", name)
            if time.monotonic() - started > STABLE_RUN_S:
                delay = RESTART_BACKOFF_S[0]
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF_S[1])
            await self.watch.wait_reachable()

    def broker_problem(self) -> str | None:
        """Why a write to Kafka cannot be acknowledged now (None: the last probe answered)."""
        if self.watch.reachable:
            return None
        return f"Kafka at {self.watch.describe()} is unreachable: {self.watch.last_error}"

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: the broker answers, both stages have partitions restored, stage 1 is not too far behind."""
        watch = self.watch
        broker: dict[str, Any] = {"ok": watch.reachable, "bootstrap": watch.describe()}
        if not watch.reachable:
            broker.update(error=watch.last_error, down_for_s=round(watch.down_for(), 1))
        counts = {name: len(stage.consumer.assignment()) if stage is not None and stage.consumer is not None else 0
                  for name, stage in (("stage1", self.stage1), ("stage2", self.stage2))}
        # assigned is not enough: aiokafka reports an assignment before the callback has restored it
        restoring = [name for name, stage in (("stage1", self.stage1), ("stage2", self.stage2))
                     if stage is not None and stage.restoring]
        partitions: dict[str, Any] = {"ok": all(counts.values()) and not restoring, **counts}
        if restoring:
            partitions["restoring"] = restoring
        if self.phase != "running":
            partitions["phase"] = self.phase
        lag_records = self.stage1.lag_records if self.stage1 is not None else 0
        limit = self.settings.health.max_lag_records
        lag = {"ok": lag_records <= limit, "records": lag_records, "max": limit}
        checks = {"broker": broker, "partitions": partitions, "lag": lag}
        return all(check["ok"] for check in checks.values()), checks

    async def on_stop(self) -> None:
        self._stopping = True
        self.watch.stop()
        for stage in (self.stage1, self.stage2, self.otlp):
            if stage is not None:
                stage.stop()
        if self._stage_tasks:
            _, pending = await asyncio.wait(self._stage_tasks, timeout=15)
            for task in pending:
                task.cancel()
        if self.producer is not None:
            await self.producer.stop()


def create_app(settings: Settings, bootstrap: str, sock: socket.socket,
               policy: AccessPolicy) -> tuple[faust.App, PipelineService]:
    """The worker's app: the pipeline service, and the HTTP API on ``sock`` (already bound)."""
    app = WorkerApp(
        settings.kafka.group_id,
        **faust_app_kwargs(settings.kafka, bootstrap=bootstrap),  # never dialled (LifecycleOnly): the stages do
        web_enabled=False,
        autodiscover=False,
        store="memory://",
    )
    metrics = WorkerMetrics()
    service = PipelineService(settings, bootstrap, metrics)
    api = WorkerApi(service, policy, update_interval_s=settings.web.update_interval_s,
                    ack_timeout_s=settings.health.ack_timeout_s)
    # Faust also accepts instances here (App._prepare_subservice): started and stopped with the app, in order
    app.service(HttpService(api, sock))  # type: ignore[arg-type]
    app.service(service)  # type: ignore[arg-type]
    return app, service


@click.command("worker")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers (host:port).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--web-port", type=click.IntRange(0, 65535),
              help="HTTP port for the API and /metrics (default: web.port, 6066; 0: any free port, logged).")
@click.option("--web-host", help="HTTP bind address (default 127.0.0.1; beyond loopback a token is required).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="File holding the API's bearer token (default: [web] token_file, else $SKEWWATCH_WEB_TOKEN).")
@click.option("--insecure-no-auth", is_flag=True,
              help="Allow listening beyond loopback without a token: anyone who reaches the port may call it.")
@click.option("--profile", type=click.Choice(sorted(PROFILES)),
              help="Detector profile: default (rules judged with evidence, against peers and the replica's own "
                   "past) or seed (the original design's rules); wins over [detectors] profile.")
@logging_options
def worker_command(bootstrap: str | None, config_path: str | None, web_port: int | None,
                   web_host: str | None, token_file: str | None, insecure_no_auth: bool, profile: str | None,
                   loglevel: str, log_format: str) -> None:
    """Run a skewwatch worker (both stages, HTTP API, metrics) against a Kafka cluster."""
    setup_logging(loglevel, log_format)
    settings = command_settings(config_path, profile)
    bootstrap = require_bootstrap(bootstrap, settings, "to read from")
    web = settings.web
    web.port = web.port if web_port is None else web_port
    web.host = web.host if web_host is None else web_host
    web.token_file = token_file or web.token_file
    token = load_token(web.token_file, web.token_env, "web")
    check_bind(web.host, token, web.insecure_no_auth or insecure_no_auth, "the worker's HTTP API", WEB_TOKEN_HINT)
    # a refused login or an untrusted certificate will not fix itself: one line, exit code 4; a broker
    # that does not answer yet is waited for (and /readyz says so)
    with contextlib.suppress(KafkaUnreachable):
        check_kafka(bootstrap, settings, timeout=5.0)
    sock = bind_socket(web.host, web.port, "the worker's HTTP API")  # a busy port: one line, exit code 5
    policy = AccessPolicy(token, beyond_loopback=not is_loopback(web.host), token_hint=WEB_TOKEN_HINT)
    app, _ = create_app(settings, bootstrap, sock, policy)
    log.info("skewwatch worker %s: bootstrap %s, group %s, listening on %s (%s)", skewwatch_version(),
             describe_listener(bootstrap, settings.kafka), settings.kafka.group_id, listening_url(sock),
             policy.describe())
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False,
                          override_logging=False)  # logging is ours (skewwatch.logs): no colours, rate limits
    worker.spinner = None  # Faust's spinner writes terminal control codes even when stdout is not a TTY
    worker.execute_from_commandline()
    sys.exit(0)
