"""``skewwatch simulate``: the fleet simulator from the command line.

Runs :class:`~skewwatch.sim.fleet.FleetSimulator` for ``--duration`` seconds of event time, as
fast as the machine allows (or paced with ``--speed``), and sends what the fleet reports:

- to Kafka (``--bootstrap``, or the config's / ``KAFKA_BOOTSTRAP``): ``llm.requests`` events,
  single or batched (``--batch``), and ``llm.gpu-telemetry`` samples, exactly as ``skewwatch
  generate`` does;
- or to a JSON-lines file (``--output PATH``): one ``{"topic": ..., "key": ..., "value": ...}``
  per message, for offline analysis;
- or nowhere (neither given): only the summary.

It always prints a summary (JSON on stdout): arrivals, finished, failed, throughput, fleet P99,
and per replica its share of requests, P99 latency and mean GPU utilisation, with the two
spreads of the seed's routing table (std across replicas of per-replica P99, in ms, and of mean
utilisation, in percentage points). ``--policy dynamic`` (smooth weighted round robin) and
``--policy dynamic_least_request`` (weighted least request) close the routing loop, in lockstep
on event time, with the pipeline's pure weights in-process
(:class:`~skewwatch.sim.loop.LocalWeightsLoop`) or the real worker's corrections (``--weights kafka``).

    skewwatch simulate --policy least_connections --load 0.8 --duration 3600 \\
        --inject slow_replica --replica r1 --at 600 --for 1200 --labels labels.json

>>> summary = summarize([], [], start_ts=0.0, end_ts=60.0)
>>> summary["requests"], summary["p99_deviation_ms"]
(0, None)
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import click
import numpy as np
import orjson

from skewwatch.cli import command_settings
from skewwatch.errors import ConfigProblem, KafkaUnreachable
from skewwatch.kafka_client import check_kafka, require_bootstrap
from skewwatch.kafka_security import client_options
from skewwatch.logs import logging_options, quiet_libraries, setup_logging
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import FAULT_KINDS, FaultError, target_model, write_labels
from skewwatch.sim.fleet import FleetConfig, FleetSimulator
from skewwatch.sim.generate_command import InjectionCommand, injections_from_options, parse_speed, parse_start_ts
from skewwatch.sim.generator import TrafficChunk, event_rows, replica_ids
from skewwatch.sim.loop import LocalWeightsLoop
from skewwatch.sim.router import CORRECTION_POLICIES, POLICIES
from skewwatch.sim.shapes import SHAPES, make_shape
from skewwatch.sim.trace import ColumnMapping, TraceError, load_trace


def summarize(requests: list[RequestColumns], telemetry: list[TelemetrySample], start_ts: float,
              end_ts: float) -> dict[str, Any]:
    """The run's numbers; spreads are population std across replicas (P99 in ms, utilisation in pp)."""
    cols = RequestColumns.concat(requests)
    arrival = cols.ts - cols.latency_ms / 1000.0
    in_run = (arrival >= start_ts) & (arrival < end_ts)
    cols = cols.take(in_run)
    replicas = sorted(set(cols.replica.tolist()) | {s.replica for s in telemetry})
    per: dict[str, dict[str, Any]] = {}
    for replica in replicas:
        mine = cols.replica == replica
        ok = mine & ~cols.is_error
        util = [s.utilization_gpu for s in telemetry
                if s.replica == replica and s.utilization_gpu is not None and start_ts < s.ts <= end_ts]
        per[replica] = {
            "requests": int(mine.sum()),
            "share": float(mine.mean()) if len(cols) else 0.0,
            "errors": int((mine & cols.is_error).sum()),
            "latency_p50_ms": float(np.percentile(cols.latency_ms[ok], 50)) if ok.any() else None,
            "latency_p99_ms": float(np.percentile(cols.latency_ms[ok], 99)) if ok.any() else None,
            "utilization_mean": float(np.mean(util)) if util else None,
        }
    p99s = [p["latency_p99_ms"] for p in per.values() if p["latency_p99_ms"] is not None]
    utils = [p["utilization_mean"] for p in per.values() if p["utilization_mean"] is not None]
    ok = ~cols.is_error
    return {
        "requests": len(cols),
        "errors": int(cols.is_error.sum()),
        "throughput_rps": len(cols) / (end_ts - start_ts),
        "fleet_latency_p99_ms": float(np.percentile(cols.latency_ms[ok], 99)) if ok.any() else None,
        "p99_deviation_ms": float(np.std(p99s)) if len(p99s) > 1 else None,
        "utilization_spread_pp": 100.0 * float(np.std(utils)) if len(utils) > 1 else None,
        "replicas": per,
    }


def _jsonl_lines(chunk: TrafficChunk, requests_topic: str, telemetry_topic: str) -> Iterable[bytes]:
    for event in event_rows(chunk.requests):
        yield orjson.dumps({"topic": requests_topic, "key": event["replica"], "value": event})
    for sample in chunk.telemetry:
        yield orjson.dumps({"topic": telemetry_topic, "key": sample.replica, "value": sample.to_dict()})


@click.command("simulate", cls=InjectionCommand)
@click.option("--models", default="llama-3-70b", show_default=True, help="Model names, comma separated.")
@click.option("--replicas", default=4, show_default=True, type=click.IntRange(min=1), help="Replicas per model.")
@click.option("--policy", type=click.Choice(POLICIES), default="round_robin", show_default=True,
              help="Routing policy; 'dynamic' (smooth weighted round robin) and 'dynamic_least_request' "
                   "(weighted least request) close the loop with the pipeline's weights.")
@click.option("--load", default=0.8, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Target share of the fleet's estimated capacity.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Fleet requests/s instead of --load.")
@click.option("--duration", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds of event time with arrivals (in-flight requests then drain).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--start-ts", default="now", show_default=True, help="Event time of the start: 'now' or epoch s.")
@click.option("--trace", "trace_name", default="conv", show_default=True,
              help="Arrivals and lengths from 'conv' or 'code' (bundled Azure 2023 traces) or a CSV path.")
@click.option("--columns", help="CSV column mapping, e.g. ts=time,prompt=input_tokens,completion=output_tokens"
                               ",ts_unit=ms.")
@click.option("--shape", help=f"A traffic shape instead of --trace/--load/--rate: a bundled trace at a multiple of its "
                             f"base rate per replica, on the engine it needs ({', '.join(SHAPES)}; any TRACE@Kx).")
@click.option("--max-batch", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--kv-capacity-tokens", default=52_000, show_default=True, type=click.IntRange(min=1))
@click.option("--inject", "inject_kinds", multiple=True, metavar="KIND[:name=value,...]",
              help=f"Inject a fault (repeatable): {', '.join(FAULT_KINDS)}.")
@click.option("--replica", "inject_replicas", multiple=True, help="Replica of each --inject (r0, r1, ...).")
@click.option("--at", "inject_at", multiple=True, type=float, help="Seconds after the start each fault begins.")
@click.option("--for", "inject_for", multiple=True, type=float, help="Seconds each fault lasts.")
@click.option("--param", "inject_params", multiple=True, metavar="NAME=VALUE",
              help="Fault parameter for every --inject that has it.")
@click.option("--labels", "labels_path", type=click.Path(dir_okay=False),
              help="Write the injected faults' ground truth here (JSON list of {replica, kind, start, end}).")
@click.option("--bootstrap", help="Produce to this Kafka (default: config kafka.bootstrap / KAFKA_BOOTSTRAP).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="skewwatch TOML config file.")
@click.option("--topic", help="Request events topic (default: config topics.requests).")
@click.option("--telemetry-topic", help="GPU telemetry topic (default: config topics.gpu_telemetry).")
@click.option("--no-telemetry", is_flag=True, help="Do not emit simulated GPU telemetry.")
@click.option("--no-live-signals", is_flag=True,
              help="Telemetry without the engines' live gauges and latency histograms (queue, running, KV usage, "
                   "tpot_*, ttft_*).")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(min=1), help="Events per message.")
@click.option("--speed", default="max", show_default=True, help="Pace by event time: 'max', 1.0, 10, ...")
@click.option("--output", "output_path", type=click.Path(dir_okay=False),
              help="Write messages as JSON lines to this file instead of Kafka.")
@click.option("--weights", "weights_source", type=click.Choice(["local", "kafka"]), default="local",
              show_default=True,
              help="dynamic policies: weights from the pure pipeline in-process, or from the real worker's "
                   "llm.routing-corrections in lockstep (needs Kafka; run the worker with "
                   "SKEWWATCH_DETECTORS__CORRECTIONS__HEARTBEAT_S=5 so it publishes every step).")
@click.option("--corrections-topic", help="Routing corrections topic (default: config topics.routing_corrections).")
@click.option("--lockstep-lag", default=2, show_default=True, type=click.IntRange(min=1),
              help="Steps between a produced step and the correction it waits for (covers allowed lateness).")
@click.option("--lockstep-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Wall seconds to wait for a correction before going on (counted as a miss).")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), help="Also write the summary here.")
@logging_options
def simulate_command(models: str, replicas: int, policy: str, load: float, rate: float | None, duration: float,
                     seed: int, start_ts: str, trace_name: str, columns: str | None, shape: str | None,
                     max_batch: int,
                     kv_capacity_tokens: int, inject_kinds: tuple[str, ...], inject_replicas: tuple[str, ...],
                     inject_at: tuple[float, ...], inject_for: tuple[float, ...], inject_params: tuple[str, ...],
                     labels_path: str | None, bootstrap: str | None, config_path: str | None, topic: str | None,
                     telemetry_topic: str | None, no_telemetry: bool, no_live_signals: bool, batch: int, speed: str,
                     output_path: str | None, weights_source: str, corrections_topic: str | None,
                     lockstep_lag: int, lockstep_timeout: float, summary_path: str | None, loglevel: str,
                     log_format: str) -> None:
    """Simulate an inference fleet (continuous batching, a router, faults) and emit what it reports."""
    setup_logging(loglevel, log_format)
    settings = command_settings(config_path)
    start = parse_start_ts(start_ts)
    pace = parse_speed(speed)
    try:
        injections = injections_from_options(inject_kinds, inject_replicas, inject_at, inject_for, inject_params)
        names = tuple(m.strip() for m in models.split(",") if m.strip())
        common: dict[str, Any] = {"models": names, "replicas": replicas, "policy": policy, "seed": seed,
                                  "max_batch": max_batch, "injections": tuple(injections),
                                  "telemetry": not no_telemetry, "live_signals": not no_live_signals}
        if shape:
            chosen = make_shape(shape)
            config = chosen.fleet_config(**common, model_rates=(replicas * chosen.rate_per_replica,) * len(names))
        else:
            trace = load_trace(trace_name, ColumnMapping.parse(columns) if columns else None)
            config = FleetConfig(**common, load=load, rate=rate, trace=trace, kv_capacity_tokens=kv_capacity_tokens)
    except (TraceError, FaultError, ValueError) as exc:
        raise ConfigProblem(str(exc)) from exc
    to_kafka = bool(not output_path and (bootstrap or settings.kafka.bootstrap))
    if to_kafka:  # one line (exit 3 or 4) before anything is simulated
        quiet_libraries(loglevel)
        check_kafka(require_bootstrap(bootstrap, settings, "to produce to"), settings)
    options = client_options(settings.kafka)
    if labels_path:
        pairs = replica_ids(config)
        write_labels(labels_path, [inj.label(start, target_model(inj, pairs)) for inj in config.injections])
    closed = policy in CORRECTION_POLICIES
    kafka_loop = closed and weights_source == "kafka"
    loop = LocalWeightsLoop() if closed and not kafka_loop else None
    sim = FleetSimulator(config, start, duration, on_step=loop)
    requests_topic = topic or settings.topics.requests
    tel_topic = telemetry_topic or settings.topics.gpu_telemetry
    kept_requests: list[RequestColumns] = []
    kept_telemetry: list[TelemetrySample] = []

    def chunks() -> Iterable[TrafficChunk]:
        for chunk in sim.chunks():
            kept_requests.append(chunk.requests)
            kept_telemetry.extend(chunk.telemetry)
            yield chunk

    began = time.monotonic()
    target = output_path or bootstrap or settings.kafka.bootstrap
    misses: int | None = None
    try:
        if kafka_loop:
            if output_path or not (bootstrap or settings.kafka.bootstrap):
                raise click.UsageError("--weights kafka needs Kafka (--bootstrap or KAFKA_BOOTSTRAP), not --output")
            misses = _closed_loop(str(bootstrap or settings.kafka.bootstrap), sim, chunks_seen=kept_requests,
                                  telemetry_seen=kept_telemetry, requests_topic=requests_topic,
                                  telemetry_topic=None if no_telemetry else tel_topic,
                                  corrections_topic=corrections_topic or settings.topics.routing_corrections,
                                  batch=batch, lag=lockstep_lag, timeout=lockstep_timeout,
                                  client_options=options)
        elif output_path:
            with Path(output_path).open("wb") as out:
                _write_jsonl(out, chunks(), requests_topic, tel_topic)
        elif target:
            _produce(str(target), chunks(), requests_topic, None if no_telemetry else tel_topic, batch, pace,
                     options)
        else:
            click.echo("no --output and no Kafka bootstrap: simulating for the summary only", err=True)
            for _ in chunks():
                pass
    except KeyboardInterrupt:
        click.echo("interrupted: the summary covers what was simulated", err=True)
    summary = {"policy": policy, "load": load, "seed": seed, "start_ts": start, "duration_s": duration,
               "wall_s": round(time.monotonic() - began, 2), **sim.stats(),
               **({"lockstep_misses": misses} if misses is not None else {}),
               **{"results": summarize(kept_requests, kept_telemetry, start, start + duration)}}
    text = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    if summary_path:
        Path(summary_path).write_bytes(text)
    sys.stdout.write(text.decode() + "\n")


def _write_jsonl(out: IO[bytes], chunks: Iterable[TrafficChunk], requests_topic: str, telemetry_topic: str) -> None:
    for chunk in chunks:
        for line in _jsonl_lines(chunk, requests_topic, telemetry_topic):
            out.write(line + b"\n")


def _produce(bootstrap: str, chunks: Iterable[TrafficChunk], requests_topic: str, telemetry_topic: str | None,
             batch: int, speed: float | None, client_options: Mapping[str, Any]) -> None:
    from skewwatch.sim.emit import produce_traffic

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await produce_traffic(bootstrap, chunks, requests_topic=requests_topic,
                                  telemetry_topic=telemetry_topic, batch=batch, speed=speed,
                                  client_options=client_options)

    _run_to_kafka(run(), bootstrap)


def _closed_loop(bootstrap: str, sim: FleetSimulator, *, chunks_seen: list[RequestColumns],
                 telemetry_seen: list[TelemetrySample], requests_topic: str, telemetry_topic: str | None,
                 corrections_topic: str, batch: int, lag: int, timeout: float,
                 client_options: Mapping[str, Any]) -> int:
    """A dynamic policy through the real worker; returns the number of lockstep misses."""
    from skewwatch.sim.emit import TrafficProducer
    from skewwatch.sim.loop import KafkaCorrections, run_kafka_loop

    corrections = KafkaCorrections(bootstrap, corrections_topic, client_options)
    original_on_step = sim.on_step

    def keep(s: FleetSimulator, chunk: TrafficChunk) -> None:
        chunks_seen.append(chunk.requests)
        telemetry_seen.extend(chunk.telemetry)
        if original_on_step is not None:
            original_on_step(s, chunk)

    sim.on_step = keep

    async def run() -> None:
        await corrections.start()
        try:
            async with TrafficProducer(bootstrap, requests_topic=requests_topic, telemetry_topic=telemetry_topic,
                                       batch=batch, client_options=client_options) as producer:
                await run_kafka_loop(sim, producer, corrections, lag_steps=lag, timeout_s=timeout)
        finally:
            await corrections.stop()

    _run_to_kafka(run(), bootstrap)
    if corrections.missed_steps:
        click.echo(f"lockstep: no correction within {timeout:g} s for steps ending at "
                   f"{', '.join(f'{t:.0f}' for t in corrections.missed_steps[:10])}", err=True)
    return corrections.misses


def _run_to_kafka(coroutine: Coroutine[Any, Any, None], bootstrap: str) -> None:
    """Run a produce loop; a missing topic or a broker lost mid-run is one line (exit 2 or 3)."""
    from aiokafka.errors import KafkaError

    from skewwatch.kafka_client import describe_exception
    from skewwatch.sim.emit import TopicMissingError

    try:
        asyncio.run(coroutine)
    except TopicMissingError as exc:
        raise ConfigProblem(str(exc)) from None
    except KafkaError as exc:
        raise KafkaUnreachable(f"Kafka at {bootstrap} failed during the run: {describe_exception(exc)}") from None
