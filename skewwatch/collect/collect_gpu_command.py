"""``skewwatch collect-gpu``: sample NVML every interval and publish to ``llm.gpu-telemetry``.

One sample per GPU every ``--interval`` (default: the window step,
5 s), key = replica id; an XID event publishes a fresh sample for its GPU at once instead of
waiting for the next interval (so ``gpu_health`` can drain within one step); no NVML means a
one-line error and exit code 1 unless ``--simulate``; a broker outage costs buffered-then-
dropped samples (counted), never a stalled NVML loop: NVML reads and XID waits run in worker
threads with timeouts and publishing is a non-blocking
:meth:`~skewwatch.client.bounded_producer.BoundedProducer.offer`.

``--once`` reads one round and prints one JSON sample per line, no Kafka (handy to check a
node)::

    $ skewwatch collect-gpu --once --simulate --simulate-gpus 1 --node n1
    {"ts":...,"replica":"n1-gpu0","source":"simulated","node":"n1","gpu_index":0,...}

>>> import asyncio
>>> from skewwatch.collect.nvml_collector import SimulatedReader
>>> reader = SimulatedReader(gpus=2, node="n1", seed=0)
>>> got = []
>>> asyncio.run(run_collector(reader, got.append, interval_s=0.01, stop=None, max_rounds=3))
3
>>> len(got), sorted({s.replica for s in got})
(6, ['n1-gpu0', 'n1-gpu1'])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import click

from skewwatch.cli import command_settings
from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.collect.nvml_collector import GpuReader, NvmlReader, NvmlUnavailable, SimulatedReader
from skewwatch.collect.publish import encode_sample, publish_sample, require_delivered, stop_on_signals
from skewwatch.collect.replica_map import ReplicaMapError, load_replica_map
from skewwatch.config import KafkaSettings
from skewwatch.errors import ConfigProblem
from skewwatch.kafka_client import require_bootstrap
from skewwatch.kafka_security import client_options, describe_listener
from skewwatch.logs import logging_options, setup_logging, skewwatch_version
from skewwatch.schemas.telemetry_sample import TelemetrySample

log = logging.getLogger(__name__)

XID_POLL_S = 1.0  # longest single wait on NVML events; also how quickly a stop request is noticed
STATS_EVERY_S = 60.0


async def run_collector(
    reader: GpuReader,
    publish: Callable[[TelemetrySample], None],
    *,
    interval_s: float,
    stop: asyncio.Event | None,
    max_rounds: int | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """Sample every ``interval_s`` until ``stop`` is set or ``max_rounds`` rounds ran; returns the rounds.

    Between rounds it waits on XID events; a GPU that reports one is sampled and published at once.
    A round that falls behind (slow NVML) is skipped rather than bursting to catch up.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    read_timeout = max(interval_s, 2.0)
    rounds = 0
    next_due = loop.time()
    while not stop.is_set() and (max_rounds is None or rounds < max_rounds):
        now = loop.time()
        if now >= next_due:
            try:
                samples = await asyncio.wait_for(asyncio.to_thread(reader.read, clock()), read_timeout)
            except TimeoutError:
                log.warning("NVML read took over %.1f s; round skipped", read_timeout)
                samples = []
            for sample in samples:
                publish(sample)
            rounds += 1
            next_due += interval_s
            if next_due <= now:
                next_due = now + interval_s
            continue
        wait_s = min(next_due - now, XID_POLL_S)
        if reader.waits_for_events:
            hit = await asyncio.to_thread(reader.wait_xid, wait_s)
            if hit:
                for sample in await asyncio.to_thread(reader.read_gpus, hit, clock()):
                    publish(sample)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait_s)
    return rounds


async def _publish_loop(reader: GpuReader, bootstrap: str, topic: str, interval_s: float,
                        max_buffered: int, max_rounds: int | None, kafka: KafkaSettings) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    producer = BoundedProducer(bootstrap, topic, max_buffered=max_buffered, client_id="skewwatch-collect-gpu",
                               producer_options=client_options(kafka))
    log.info("skewwatch collect-gpu %s: GPU telemetry every %g s -> %s at %s", skewwatch_version(), interval_s,
             topic, describe_listener(bootstrap, kafka))
    await producer.start()

    async def report() -> None:
        last_dropped = 0
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            if producer.dropped_total != last_dropped or producer.last_error:
                log.warning("telemetry producer: %s", producer.stats())
                last_dropped = producer.dropped_total

    reporter = asyncio.create_task(report())
    try:
        rounds = await run_collector(reader, lambda s: publish_sample(producer, s), interval_s=interval_s,
                                     stop=stop, max_rounds=max_rounds)
    finally:
        reporter.cancel()
        await producer.close(timeout=5.0)
    log.info("collect-gpu: %d rounds, %s", rounds, producer.stats())
    if max_rounds is not None and not stop.is_set():  # a bounded run that delivered nothing: exit 7;
        require_delivered(producer, bootstrap)  # a run stopped by SIGTERM / Ctrl-C exits 0


@click.command("collect-gpu")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.05), default=None,
              help="Seconds between samples (default: the window step, 5 s).")
@click.option("--replica-map", "replica_map_path", type=click.Path(dir_okay=False, path_type=Path),
              help="JSON or TOML file mapping GPU index or UUID to replica id (default <node>-gpu<index>).")
@click.option("--bootstrap", help="Kafka bootstrap host:port (default: settings / KAFKA_BOOTSTRAP).")
@click.option("--topic", help="Topic (default: settings topics.gpu_telemetry, llm.gpu-telemetry).")
@click.option("--once", is_flag=True, help="Read one round, print one JSON sample per line, no Kafka.")
@click.option("--rounds", "max_rounds", type=click.IntRange(min=1), default=None,
              help="Stop after this many rounds (default: run until interrupted).")
@click.option("--simulate", is_flag=True, help="No NVML: publish plausible samples marked source=simulated.")
@click.option("--simulate-gpus", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--seed", type=int, default=None, help="Seed of the simulation.")
@click.option("--node", default=None, help="Node name in the samples (default: this host's name).")
@click.option("--max-buffered", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Samples kept while the broker is unreachable; the oldest are dropped beyond this.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="skewwatch TOML config file.")
@logging_options
def collect_gpu_command(
    interval_s: float | None,
    replica_map_path: Path | None,
    bootstrap: str | None,
    topic: str | None,
    once: bool,
    max_rounds: int | None,
    simulate: bool,
    simulate_gpus: int,
    seed: int | None,
    node: str | None,
    max_buffered: int,
    config_path: Path | None,
    loglevel: str,
    log_format: str,
) -> None:
    """Publish one GPU telemetry sample per GPU per interval from NVML."""
    setup_logging(loglevel, log_format)
    settings = command_settings(config_path)
    try:
        replica_map = load_replica_map(replica_map_path) if replica_map_path else {}
    except ReplicaMapError as exc:
        raise ConfigProblem(str(exc)) from None
    interval = interval_s if interval_s is not None else settings.window.step_s
    reader: GpuReader
    if simulate:
        reader = SimulatedReader(gpus=simulate_gpus, node=node, replica_map=replica_map, seed=seed)
    else:
        reader = NvmlReader(replica_map=replica_map, node=node)
    try:
        reader.open()
    except NvmlUnavailable as exc:  # the option cannot be used on this machine: --simulate can
        raise ConfigProblem(str(exc)) from None
    try:
        if once:
            for sample in reader.read(time.time()):
                click.echo(encode_sample(sample).decode())
            return
        servers = require_bootstrap(bootstrap, settings, "to publish to")
        topic = topic or settings.topics.gpu_telemetry
        asyncio.run(_publish_loop(reader, servers, topic, interval, max_buffered, max_rounds, settings.kafka))
    finally:
        reader.close()
