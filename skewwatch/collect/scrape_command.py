"""``skewwatch scrape``: bridge a Prometheus endpoint (vLLM, SGLang, TGI, llama.cpp, DCGM exporter) to telemetry.

A deployment plugs in without changing its servers: point one bridge at each engine's
``/metrics`` (``--replica`` = the replica id the router uses) and one at each node's DCGM
exporter (replica from ``--replica``, the ``pod`` label, or ``<Hostname>-gpu<index>``). The
mapping itself is the data tables of :mod:`skewwatch.collect.engine_maps`; this module only
fetches (aiohttp), parses (prometheus_client's parser, not by hand), keeps the per-target
counter state across scrapes and publishes through
:class:`~skewwatch.client.bounded_producer.BoundedProducer`.

A failed scrape (endpoint down, timeout, unparsable text) publishes nothing for that
interval: missing telemetry means unknown, and the worker treats the replica's last sample
as stale after three intervals.

``--batch-capacity N`` (contract v1.1) fills ``batch_capacity``, the most requests the replica
runs at once, for engines that do not expose it (vLLM ``--max-num-seqs``, TGI
``--max-batch-size``, llama.cpp ``-np``; see :mod:`~skewwatch.collect.engine_maps`): the worker derives the
batch fill of OTLP requests from it. A capacity the endpoint does expose wins over the flag
(it is what the engine runs with now), with one warning when they differ.

>>> normalize_target("http://10.0.0.5:8000")
'http://10.0.0.5:8000/metrics'
>>> normalize_target("http://dcgm:9400/metrics")
'http://dcgm:9400/metrics'
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import click

from skewwatch.cli import command_settings
from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.collect.engine_maps import ENGINE_MAPS, CounterTracker, EngineMap, map_exposition
from skewwatch.collect.publish import encode_sample, publish_sample, require_delivered, stop_on_signals
from skewwatch.config import KafkaSettings
from skewwatch.errors import PeerUnreachable, SkewwatchError
from skewwatch.kafka_client import require_bootstrap
from skewwatch.kafka_security import client_options, describe_listener
from skewwatch.logs import logging_options, setup_logging, skewwatch_version
from skewwatch.schemas.telemetry_sample import TelemetrySample

log = logging.getLogger(__name__)

ENGINE_KINDS: tuple[str, ...] = ("llamacpp", "sglang", "tgi", "vllm")  # the kinds that serve requests (not dcgm)


class ScrapeError(SkewwatchError, RuntimeError):
    """A scrape failed; ``str()`` is one line naming the target."""

    exit_code = 3  # scrape --once: the target is a peer that does not answer (PeerUnreachable)
    retriable = True  # the long-running scrape tries again next interval


def normalize_target(url: str) -> str:
    """Add ``http://`` when no scheme is given and ``/metrics`` when no path is given."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urlunsplit(parts)


class Scraper:
    """One target: fetch its exposition and map it, remembering counters between scrapes."""

    def __init__(self, url: str, kind: str, replica: str | None = None, timeout_s: float = 4.0,
                 batch_capacity: int | None = None) -> None:
        if kind not in ENGINE_MAPS:
            raise ValueError(f"unknown kind {kind!r}; known: {', '.join(sorted(ENGINE_MAPS))}")
        if batch_capacity is not None and (kind not in ENGINE_KINDS or batch_capacity < 1):
            raise ValueError(f"batch_capacity: an integer >= 1 for engines ({', '.join(ENGINE_KINDS)}), "
                             f"got {batch_capacity} for {kind}")
        self.url = normalize_target(url)
        self.kind = kind
        self.engine: EngineMap = ENGINE_MAPS[kind]
        self.replica = replica
        self.timeout_s = timeout_s
        self.batch_capacity = batch_capacity  # the engine's setting, for engines that do not expose it
        self._capacity_warned = False
        self.tracker = CounterTracker()  # previous counter values: hit rates from deltas, resets detected

    async def fetch(self, session: aiohttp.ClientSession) -> str:
        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
                if response.status != 200:
                    raise ScrapeError(f"{self.url}: HTTP {response.status}")
                return await response.text()
        except TimeoutError:
            raise ScrapeError(f"{self.url}: no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise ScrapeError(f"{self.url}: {exc}") from None

    def map(self, text: str, now: float) -> list[TelemetrySample]:
        try:
            samples = map_exposition(text, self.engine, self.tracker, ts=now, replica=self.replica)
        except ValueError as exc:  # prometheus_client's parser on text that is not an exposition
            raise ScrapeError(f"{self.url}: not a Prometheus text exposition ({exc})") from None
        if self.batch_capacity is None:
            return samples
        return [self._with_capacity(sample) for sample in samples]

    def _with_capacity(self, sample: TelemetrySample) -> TelemetrySample:
        exposed = sample.batch_capacity
        if exposed is None:
            return dataclasses.replace(sample, batch_capacity=self.batch_capacity)
        if exposed != self.batch_capacity and not self._capacity_warned:
            log.warning("%s exposes a batch capacity of %d; using it, not --batch-capacity %d",
                        self.url, exposed, self.batch_capacity)
            self._capacity_warned = True
        return sample

    async def scrape(self, session: aiohttp.ClientSession, now: float | None = None) -> list[TelemetrySample]:
        """Fetch and map once. Raises :class:`ScrapeError`."""
        text = await self.fetch(session)
        return self.map(text, time.time() if now is None else now)


async def run_bridge(
    scraper: Scraper,
    publish: Callable[[TelemetrySample], None],
    *,
    interval_s: float,
    stop: asyncio.Event | None = None,
    max_rounds: int | None = None,
    session: aiohttp.ClientSession | None = None,
) -> int:
    """Scrape every ``interval_s`` until ``stop`` or ``max_rounds``; returns the rounds attempted."""
    stop = stop or asyncio.Event()
    own_session = session is None
    session = session or aiohttp.ClientSession()
    loop = asyncio.get_running_loop()
    rounds = 0
    last_error: str | None = None
    try:
        next_due = loop.time()
        while not stop.is_set() and (max_rounds is None or rounds < max_rounds):
            try:
                samples = await scraper.scrape(session)
            except ScrapeError as exc:
                if str(exc) != last_error:  # log a failure once, not every interval
                    log.warning("scrape failed: %s", exc)
                last_error = str(exc)
                samples = []
            else:
                if last_error is not None:
                    log.info("scrape of %s works again", scraper.url)
                last_error = None
                if not samples:
                    log.warning("%s: no %s metrics found (wrong --kind?)", scraper.url, scraper.kind)
            for sample in samples:
                publish(sample)
            rounds += 1
            if max_rounds is not None and rounds >= max_rounds:
                break
            next_due += interval_s
            now = loop.time()
            if next_due <= now:  # a slow scrape: skip ahead rather than burst
                next_due = now + interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), next_due - now)
    finally:
        if own_session:
            await session.close()
    return rounds


async def _scrape_once(scraper: Scraper) -> list[TelemetrySample]:
    async with aiohttp.ClientSession() as session:
        return await scraper.scrape(session)


async def _publish_loop(scraper: Scraper, bootstrap: str, topic: str, interval_s: float, max_buffered: int,
                        max_rounds: int | None, kafka: KafkaSettings) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)
    log.info("skewwatch scrape %s: %s (%s) every %g s -> %s at %s", skewwatch_version(), scraper.url, scraper.kind,
             interval_s, topic, describe_listener(bootstrap, kafka))
    async with BoundedProducer(bootstrap, topic, max_buffered=max_buffered,
                               client_id=f"skewwatch-scrape-{scraper.kind}",
                               producer_options=client_options(kafka)) as producer:
        rounds = await run_bridge(scraper, lambda s: publish_sample(producer, s), interval_s=interval_s,
                                  stop=stop, max_rounds=max_rounds)
    log.info("scrape %s: %d rounds, %s", scraper.url, rounds, producer.stats())
    if max_rounds is not None and not stop.is_set():  # a bounded run that delivered nothing: exit 7;
        require_delivered(producer, bootstrap)  # a run stopped by SIGTERM / Ctrl-C exits 0


@click.command("scrape")
@click.option("--target", required=True, help="The Prometheus endpoint, e.g. http://vllm-0:8000/metrics.")
@click.option("--kind", type=click.Choice(sorted(ENGINE_MAPS)), required=True, help="What exposes it.")
@click.option("--replica", default=None,
              help="Replica id of the samples (required for engines; DCGM: default the pod label or "
                   "<Hostname>-gpu<index>).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.05), default=None,
              help="Seconds between scrapes (default: the window step, 5 s).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=4.0, show_default=True)
@click.option("--batch-capacity", type=click.IntRange(min=1), default=None,
              help="Engines only: the most requests the replica runs at once (vLLM --max-num-seqs, TGI "
                   "--max-batch-size, llama.cpp -np), for engines that do not expose it; an exposed value wins.")
@click.option("--once", is_flag=True, help="Scrape once, print one JSON sample per line, no Kafka.")
@click.option("--rounds", "max_rounds", type=click.IntRange(min=1), default=None,
              help="Stop after this many scrapes (default: run until interrupted).")
@click.option("--bootstrap", help="Kafka bootstrap host:port (default: settings / KAFKA_BOOTSTRAP).")
@click.option("--topic", help="Topic (default: settings topics.gpu_telemetry, llm.gpu-telemetry).")
@click.option("--max-buffered", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@logging_options
def scrape_command(
    target: str,
    kind: str,
    replica: str | None,
    interval_s: float | None,
    timeout_s: float,
    batch_capacity: int | None,
    once: bool,
    max_rounds: int | None,
    bootstrap: str | None,
    topic: str | None,
    max_buffered: int,
    config_path: Path | None,
    loglevel: str,
    log_format: str,
) -> None:
    """Bridge a vLLM / SGLang / TGI / llama.cpp / DCGM Prometheus endpoint onto llm.gpu-telemetry."""
    setup_logging(loglevel, log_format)
    if replica is None and kind != "dcgm":
        raise click.UsageError(f"--replica is required for --kind {kind}")
    if batch_capacity is not None and kind not in ENGINE_KINDS:
        raise click.UsageError(f"--batch-capacity is an engine setting ({', '.join(ENGINE_KINDS)}), "
                               f"not one of {kind}")
    settings = command_settings(config_path)
    scraper = Scraper(target, kind, replica=replica, timeout_s=timeout_s, batch_capacity=batch_capacity)
    if once:
        try:
            samples = asyncio.run(_scrape_once(scraper))
        except ScrapeError as exc:  # the target does not answer, or not with metrics
            raise PeerUnreachable(str(exc)) from None
        for sample in samples:
            click.echo(encode_sample(sample).decode())
        return
    servers = require_bootstrap(bootstrap, settings, "to publish to")
    interval = interval_s if interval_s is not None else settings.window.step_s
    asyncio.run(_publish_loop(scraper, servers, topic or settings.topics.gpu_telemetry, interval, max_buffered,
                              max_rounds, settings.kafka))
