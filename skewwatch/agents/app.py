"""The worker: a Faust app hosting the two pipeline stages, the HTTP API and the metrics.

Faust gives the process its lifecycle (signals, graceful stop), its web server and its CLI
conventions. The per-request hot path does *not* go through a Faust stream: each stage owns
an aiokafka consumer (see :mod:`skewwatch.agents.stage`) because Faust's per-message cost
caps a stream at ~9k events/s while the pipeline must keep up with a fleet. Its state is
checkpointed with the offset it covers (:mod:`skewwatch.agents.checkpoint`) instead of a
Faust table, which would write a changelog entry per event and ack offsets independently.

HTTP (port ``--web-port``, default 6066):
``GET /api/v1/weights``, ``POST /api/v1/update_weights``, ``GET /metrics``, ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import faust
import mode
from aiokafka import AIOKafkaProducer

from skewwatch.agents.memory import trim_heap
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.model_stage import ModelStage
from skewwatch.agents.otlp_stage import OtlpStage
from skewwatch.agents.replica_stage import ReplicaStage
from skewwatch.agents.stage import Stage
from skewwatch.cli import command_settings
from skewwatch.config import Settings
from skewwatch.kafka_client import client_kwargs, faust_app_kwargs
from skewwatch.ports import free_port
from skewwatch.topics import ensure_topics

log = logging.getLogger("skewwatch.worker")

PRODUCER_MAX_REQUEST_BYTES = 16 * 1024 * 1024  # checkpoint chunks are up to 4 MiB
# aiokafka sends one produce request per broker at a time, holding at most one batch per partition,
# and a send() to a partition whose batch is full waits until that batch has left. With the default
# 16 KiB batches, a step's hand-off records (a few KB each, on the few partitions of the models' keys)
# queued behind one round trip per 16 KiB: measured on the batched throughput run, publishing took
# ~40 % of stage 1's time. A batch still leaves after linger_ms however little it holds.
PRODUCER_BATCH_BYTES = 1024 * 1024


class PipelineService(mode.Service):
    """Runs stage 1 and stage 2 with one shared producer; restarts a stage that fails."""

    def __init__(self, settings: Settings, bootstrap: str, metrics: WorkerMetrics, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.producer: AIOKafkaProducer | None = None
        self.stage1: ReplicaStage | None = None
        self.stage2: ModelStage | None = None
        self.otlp: OtlpStage | None = None  # only when topics.otlp_spans is set
        self._stage_tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def on_start(self) -> None:
        created = await ensure_topics(self.bootstrap, self.settings)
        if created:
            log.info("created topics: %s", ", ".join(created))
        self.producer = AIOKafkaProducer(
            **client_kwargs(self.settings.kafka, bootstrap=self.bootstrap),
            client_id=f"{self.settings.kafka.client_id}-out",
            acks="all",
            linger_ms=5,
            enable_idempotence=True,  # keeps per-partition order: progress markers follow summaries
            max_request_size=PRODUCER_MAX_REQUEST_BYTES,
            max_batch_size=PRODUCER_BATCH_BYTES,
        )
        await self.producer.start()
        self._stage_tasks = [
            asyncio.ensure_future(self._supervise("stage1", self._new_stage1)),
            asyncio.ensure_future(self._supervise("stage2", self._new_stage2)),
        ]
        if self.settings.topics.otlp_spans:
            self._stage_tasks.append(asyncio.ensure_future(self._supervise("otlp", self._new_otlp)))

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
        """A bug must not take the worker down silently: log it, rebuild the stage from its
        last checkpoint and go on."""
        while not self._stopping:
            stage = factory()
            try:
                await stage.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; restarting it from its last checkpoint in 1 s", name)
                await asyncio.sleep(1.0)

    async def on_stop(self) -> None:
        self._stopping = True
        for stage in (self.stage1, self.stage2, self.otlp):
            if stage is not None:
                stage.stop()
        if self._stage_tasks:
            _, pending = await asyncio.wait(self._stage_tasks, timeout=15)
            for task in pending:
                task.cancel()
        if self.producer is not None:
            await self.producer.stop()


def create_app(settings: Settings, bootstrap: str) -> tuple[faust.App, PipelineService]:
    app = faust.App(
        settings.kafka.group_id,
        **faust_app_kwargs(settings.kafka, bootstrap=bootstrap),
        web_host=settings.web.host,
        web_port=settings.web.port,
        web_enabled=True,
        autodiscover=False,
        topic_replication_factor=settings.kafka.replication_factor,
        store="memory://",
    )
    metrics = WorkerMetrics()
    service = PipelineService(settings, bootstrap, metrics)
    # Faust also accepts an instance here (App._prepare_subservice): started and stopped with the app
    app.service(service)  # type: ignore[arg-type]

    @app.page("/api/v1/weights")
    class Weights(faust.web.View):
        async def get(self, request: faust.web.Request) -> faust.web.Response:
            stage = service.stage2
            models = {m: c.to_dict() for m, c in (stage.corrections.items() if stage else [])}
            return self.json({"models": models})

    @app.page("/api/v1/update_weights")
    class UpdateWeights(faust.web.View):
        async def post(self, request: faust.web.Request) -> faust.web.Response:
            stage = service.stage2
            if stage is None:
                return self.json({"error": "the worker is still starting"}, status=503)
            published = await stage.force_update()
            return self.json({"published": published})

    @app.page("/metrics")
    class Metrics(faust.web.View):
        async def get(self, request: faust.web.Request) -> faust.web.Response:
            return self.bytes(metrics.exposition(), content_type="text/plain; version=0.0.4")

    @app.page("/healthz")
    class Health(faust.web.View):
        async def get(self, request: faust.web.Request) -> faust.web.Response:
            ready = service.stage1 is not None and service.stage1.ready.is_set()
            return self.json({"status": "ok" if ready else "starting"}, status=200 if ready else 503)

    return app, service


@click.command("worker")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers (host:port).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--web-port", type=click.IntRange(0, 65535),
              help="HTTP port for the API and /metrics (default: web.port, 6066; 0: any free port, printed).")
@click.option("--web-host", help="HTTP bind address (default 127.0.0.1).")
@click.option("--loglevel", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def worker_command(bootstrap: str | None, config_path: str | None, web_port: int | None,
                   web_host: str | None, loglevel: str) -> None:
    """Run a skewwatch worker (both stages, HTTP API, metrics) against a Kafka cluster."""
    settings = command_settings(config_path)
    bootstrap = bootstrap or settings.kafka.bootstrap
    if not bootstrap:
        raise click.ClickException("no Kafka cluster: pass --bootstrap HOST:PORT, set KAFKA_BOOTSTRAP, "
                                   "or start one with `skewwatch broker`")
    settings.kafka.bootstrap = bootstrap
    if web_port is not None:
        settings.web.port = web_port
    if web_host is not None:
        settings.web.host = web_host
    if settings.web.port == 0:  # any free port (Faust itself needs a fixed one): picked here, said once
        try:
            settings.web.port = free_port(settings.web.host)
        except OSError as exc:
            raise click.ClickException(f"cannot find a free port on {settings.web.host}: {exc}") from None
        click.echo(f"HTTP API and /metrics on http://{settings.web.host}:{settings.web.port}", err=True)
    app, _ = create_app(settings, bootstrap)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    logging.getLogger("skewwatch").setLevel(loglevel.upper())
    # Faust sets the root logger to DEBUG-capable handlers; aiokafka's per-record debug logging
    # measurably costs the hot path (bench/README.md), so keep it at the chosen level or above.
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLevelName(loglevel.upper())))
    worker.execute_from_commandline()
    sys.exit(0)
