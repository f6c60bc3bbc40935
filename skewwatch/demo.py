"""``skewwatch demo``: the embedded broker, a worker, the generator, and a live table.

Everything runs on this machine: a real Kafka broker (started here unless ``KAFKA_BOOTSTRAP``
points at one), ``skewwatch worker`` and ``skewwatch generate`` as child processes, and a
terminal table of the newest feature vector per replica and per model, the open alerts and
the current routing weights, until Ctrl-C or ``--duration``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson
from aiokafka import AIOKafkaConsumer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from skewwatch.cli import command_settings
from skewwatch.config import Settings
from skewwatch.errors import BrokerFailed, ChildFailed, ConfigProblem
from skewwatch.kafka_client import client_kwargs
from skewwatch.logs import logging_options, setup_logging
from skewwatch.topics import ensure_topics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


class DemoView:
    def __init__(self) -> None:
        self.features: dict[str, dict[str, Any]] = {}
        self.alerts: dict[str, dict[str, Any]] = {}
        self.corrections: dict[str, dict[str, Any]] = {}

    def update(self, topic: str, value: dict[str, Any], topics: Any) -> None:
        if topic == topics.features:
            key = value["model"] if value.get("replica") is None else f"{value['model']}/{value['replica']}"
            self.features[key] = value
        elif topic == topics.alerts:
            key = f"{value.get('model')}/{value.get('replica')}/{value.get('detector')}"
            if value.get("state") == "resolved":
                self.alerts.pop(key, None)
            else:
                self.alerts[key] = value
        elif topic == topics.routing_corrections:
            self.corrections[value["model"]] = value

    def render(self) -> Group:
        table = Table(title="llm.features (newest 60 s window per replica and per model)")
        for column in ("key", "window_end", "count", "rps", "p50 ms", "p99 ms", "ttft p50", "batch fill",
                       "batch std", "prompt var", "tok/s", "err", "weight"):
            table.add_column(column, justify="right" if column != "key" else "left")
        for key in sorted(self.features):
            fv = self.features[key]
            weight = None
            if fv.get("replica") is not None:
                weight = self.corrections.get(fv["model"], {}).get("weights", {}).get(fv["replica"])
            table.add_row(
                key if fv.get("replica") is not None else f"[bold]{key} (model)[/bold]",
                time.strftime("%H:%M:%S", time.localtime(fv["window_end"])), _fmt(fv["count"]),
                _fmt(fv["rps"], 1), _fmt(fv["latency_p50"]), _fmt(fv["latency_p99"]), _fmt(fv["ttft_p50"]),
                _fmt(fv["batch_fill_mean"], 2), _fmt(fv["batch_size_std"], 1),
                _fmt(fv["prompt_tokens_var"]), _fmt(fv["tokens_per_s"], 0), _fmt(fv["error_rate"], 3),
                _fmt(weight, 3),
            )
        alerts = Table(title="open alerts (llm.alerts)")
        for column in ("replica", "detector", "severity", "message"):
            alerts.add_column(column)
        for value in self.alerts.values():
            alerts.add_row(f"{value.get('model')}/{value.get('replica')}", str(value.get("detector")),
                           str(value.get("severity")), str(value.get("message")))
        return Group(table, alerts)


async def _watch(bootstrap: str, settings: Settings, duration: float | None,
                 children: list[subprocess.Popen[bytes]], log_dir: Path) -> None:
    topics = settings.topics
    consumer = AIOKafkaConsumer(topics.features, topics.alerts, topics.routing_corrections,
                                **client_kwargs(settings.kafka, bootstrap=bootstrap),
                                group_id=f"skewwatch-demo-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="latest", enable_auto_commit=False)
    await consumer.start()
    view = DemoView()
    deadline = time.monotonic() + duration if duration else None
    try:
        with Live(view.render(), refresh_per_second=2, screen=False) as live:
            while deadline is None or time.monotonic() < deadline:
                for name, child in (("worker", children[0]), ("generator", children[1])):
                    if child.poll() is not None and (name == "worker" or child.returncode != 0):
                        raise ChildFailed(f"the {name} exited with code {child.returncode}; its log is "
                                          f"{log_dir / (name + '.log')}")
                batches = await consumer.getmany(timeout_ms=500)
                for tp, messages in batches.items():
                    for message in messages:
                        with contextlib.suppress(orjson.JSONDecodeError):
                            view.update(tp.topic, orjson.loads(message.value), topics)
                live.update(view.render())
    finally:
        await consumer.stop()


def check_generate_arguments(args: list[str]) -> None:
    """Parse ``skewwatch generate`` arguments as the child process will, --inject included: ConfigProblem
    (exit code 2) naming what is wrong, before a broker or a worker is started."""
    from skewwatch.sim.generate_command import generate_command, injections_from_options

    try:
        params = generate_command.make_context("generate", list(args)).params
    except ConfigProblem:
        raise
    except click.ClickException as exc:
        raise ConfigProblem(f"--inject: {exc.format_message()}") from None
    injections_from_options(params["inject_kinds"], params["inject_replicas"], params["inject_at"],
                            params["inject_for"], params["inject_params"])


@click.command("demo")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: Ctrl-C).")
@click.option("--replicas", type=int, default=4, show_default=True, help="Replicas per model.")
@click.option("--models", default="llama-70b,mistral-7b", show_default=True)
@click.option("--rate", type=float, default=5.0, show_default=True, help="Requests/s per replica.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=".skewwatch/demo-kafka",
              show_default=True, help="Data directory of the embedded broker.")
@click.option("--inject", "injections", multiple=True,
              help="Passed to `skewwatch generate --inject` (e.g. 'long_tail --replica R --at 30 --for 60').")
@logging_options
def demo_command(duration: float | None, replicas: int, models: str, rate: float, data_dir: str,
                 injections: tuple[str, ...], loglevel: str, log_format: str) -> None:
    """Start a broker, a worker and the generator, and show features, alerts and weights live."""
    from skewwatch.broker import BrokerError, EmbeddedBroker
    from skewwatch.sim.generate_command import injection_arguments

    setup_logging(loglevel, log_format)
    settings = command_settings()
    generate = [sys.executable, "-m", "skewwatch", "generate", "--models", models,
                "--replicas", str(replicas), "--rate", str(rate), "--speed", "1", "--loglevel", loglevel,
                "--log-format", log_format]
    for injection in injections:
        generate += injection_arguments(injection)
    check_generate_arguments(generate[4:])  # a bad --inject is reported before anything starts
    broker: EmbeddedBroker | None = None
    bootstrap = settings.kafka.bootstrap
    if not bootstrap:
        broker = EmbeddedBroker(Path(data_dir), port=_free_port())
        click.echo(f"starting the embedded Kafka broker (data in {data_dir}) ...", err=True)
        try:
            broker.start()
        except BrokerError as exc:
            raise BrokerFailed(str(exc)) from None
        bootstrap = broker.bootstrap
    click.echo(f"Kafka at {bootstrap}", err=True)
    children: list[subprocess.Popen[bytes]] = []
    try:
        settings.kafka.bootstrap = bootstrap
        asyncio.run(ensure_topics(bootstrap, settings))
        env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap}
        web_port = settings.web.port
        log_dir = Path(data_dir).parent
        log_dir.mkdir(parents=True, exist_ok=True)
        worker_log = (log_dir / "worker.log").open("ab")
        children.append(subprocess.Popen(
            [sys.executable, "-m", "skewwatch", "worker", "--web-port", str(web_port), "--loglevel", loglevel,
             "--log-format", log_format],
            env=env, stdout=worker_log, stderr=subprocess.STDOUT))
        gen_log = (log_dir / "generator.log").open("ab")
        children.append(subprocess.Popen(generate, env=env, stdout=gen_log, stderr=subprocess.STDOUT))
        click.echo(f"worker: http://127.0.0.1:{web_port}/api/v1/weights  (log: {log_dir / 'worker.log'})",
                   err=True)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_watch(bootstrap, settings, duration, children, log_dir))
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
        if broker is not None:
            broker.stop()
