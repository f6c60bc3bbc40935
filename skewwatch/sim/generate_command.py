"""``skewwatch generate``: synthetic request events and GPU telemetry into Kafka.

N replicas of one or two models, Poisson arrivals, log-normal latencies, token lengths resampled
from a real trace (the bundled Azure LLM inference trace by default), produced per contract v1
and paced by event time. ``--inject`` adds the faults the detectors look for, with ground truth
in ``--labels``. The generation itself lives in :mod:`skewwatch.sim.generator` (pure) and the
producing in :mod:`skewwatch.sim.emit`; this module only parses options.

    skewwatch generate --bootstrap 127.0.0.1:9092 --replicas 4 --rate 5 --duration 300 \\
        --inject long_tail --replica r1 --at 60 --for 120 --labels labels.json

>>> parse_speed("max") is None, parse_speed("10")
(True, 10.0)
>>> [i.kind for i in build_injections(("gpu_fault:class=resource",), ("r1",), (30.0,), (), ())]
['gpu_fault']
>>> expand_injections(["--inject", "long_tail --replica r1 --at 30", "--seed", "1"])
['--inject', 'long_tail', '--replica', 'r1', '--at', '30', '--seed', '1']
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from skewwatch.cli import command_settings
from skewwatch.errors import ConfigProblem, KafkaUnreachable
from skewwatch.kafka_client import check_kafka, require_bootstrap
from skewwatch.kafka_security import client_options
from skewwatch.logs import logging_options, setup_logging
from skewwatch.sim.faults import DEFAULT_PARAMS, FAULT_KINDS, FaultError, Injection, write_labels
from skewwatch.sim.trace import ColumnMapping, TraceError, load_trace

DEFAULT_INJECT_FOR_S = 60.0
DEFAULT_INJECT_AT_S = 30.0


def parse_speed(text: str) -> float | None:
    """``max`` (or ``0``) means as fast as possible; otherwise a positive factor of real time."""
    if text.strip().lower() in ("max", "0", "inf"):
        return None
    try:
        speed = float(text)
    except ValueError as exc:
        raise click.BadParameter(f"expected a number or 'max', got {text!r}") from exc
    if speed <= 0:
        raise click.BadParameter(f"must be > 0 or 'max', got {text!r}")
    return speed


def parse_start_ts(text: str) -> float:
    if text.strip().lower() == "now":
        return time.time()
    try:
        return float(text)
    except ValueError as exc:
        raise click.BadParameter(f"expected 'now' or epoch seconds, got {text!r}") from exc


def _per_injection(values: Sequence[float], count: int, default: float, name: str) -> list[float]:
    if not values:
        return [default] * count
    if len(values) != count:
        raise click.UsageError(f"give {name} once per --inject ({count}), got {len(values)}")
    return list(values)


def build_injections(kinds: Sequence[str], replicas: Sequence[str], at: Sequence[float],
                     for_: Sequence[float], params: Sequence[str]) -> list[Injection]:
    """Pair the repeated ``--inject/--replica/--at/--for`` options in order.

    ``--param name=value`` applies to every injection whose kind has that parameter; per
    injection, parameters can also follow the kind: ``--inject gpu_fault:class=resource``.
    """
    if len(replicas) != len(kinds):
        raise click.UsageError(f"give --replica once per --inject ({len(kinds)}), got {len(replicas)}")
    at_s = _per_injection(at, len(kinds), DEFAULT_INJECT_AT_S, "--at")
    for_s = _per_injection(for_, len(kinds), DEFAULT_INJECT_FOR_S, "--for")
    extra: dict[str, str] = {}
    for item in params:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.UsageError(f"--param expects name=value, got {item!r}")
        extra[name.strip()] = value.strip()
    used = {name for name in extra if any(name in DEFAULT_PARAMS.get(k.partition(":")[0], {}) for k in kinds)}
    if unused := set(extra) - used:
        raise click.UsageError(f"--param {', '.join(sorted(unused))}: no --inject kind takes it")
    out = []
    for kind, replica, start, length in zip(kinds, replicas, at_s, for_s, strict=True):
        base = kind.partition(":")[0]
        own = {k: v for k, v in extra.items() if k in DEFAULT_PARAMS.get(base, {})}
        out.append(Injection.from_spec(kind, replica, start, length, own))
    return out


# the two forms of --inject, for the errors: one quoted value (as `skewwatch demo` takes it) or separate options
INJECT_FORMS = ("--inject 'KIND --replica R [--at S] [--for S] [--param NAME=VALUE]' "
                "(e.g. --inject 'long_tail --replica r1 --at 30 --for 60'), "
                "or the same as separate options: --inject KIND --replica R ...")
_INJECT_OPTIONS = ("inject_kinds", "inject_replicas", "inject_at", "inject_for", "inject_params")


def injection_arguments(text: str) -> list[str]:
    """One quoted injection (``'long_tail --replica r1 --at 30 --for 60'``) as the separate options
    ``generate`` pairs up in order; the one parser of that form, for ``generate`` and ``demo``."""
    try:
        return ["--inject", *shlex.split(text)]
    except ValueError as exc:  # an unclosed quote
        raise ConfigProblem(f"--inject {text!r}: {exc}; expected {INJECT_FORMS}") from None


def expand_injections(args: Sequence[str]) -> list[str]:
    """``args`` with each ``--inject`` value that holds more than a kind split into separate options."""
    out: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--inject":
            value = next(rest, None)
            if value is None:
                out.append(arg)
            elif len(value.split()) > 1:
                out += injection_arguments(value)
            else:
                out += [arg, value]
        elif arg.startswith("--inject=") and len(arg.split()) > 1:
            out += injection_arguments(arg.partition("=")[2])
        else:
            out.append(arg)
    return out


def injections_from_options(kinds: Sequence[str], replicas: Sequence[str], at: Sequence[float],
                            for_: Sequence[float], params: Sequence[str]) -> list[Injection]:
    """:func:`build_injections`, its errors a :class:`ConfigProblem` (one line, exit 2) that shows the
    forms --inject takes."""
    try:
        for kind in kinds:  # before the pairing: `--inject nonsense` is an unknown kind, not a missing --replica
            if kind.partition(":")[0] not in FAULT_KINDS:
                raise FaultError(f"unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})")
        return build_injections(kinds, replicas, at, for_, params)
    except click.ClickException as exc:
        raise ConfigProblem(f"--inject: {exc.format_message().rstrip('.')}; expected {INJECT_FORMS}") from None
    except (FaultError, ValueError) as exc:
        raise ConfigProblem(f"--inject: {exc}; expected {INJECT_FORMS}") from None


class InjectionCommand(click.Command):
    """A command whose ``--inject`` also takes one quoted injection, as ``skewwatch demo --inject`` does;
    a bad value of an injection's options is one line that shows the forms."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, expand_injections(args))
        except click.BadParameter as exc:
            if exc.param is not None and exc.param.name in _INJECT_OPTIONS:
                problem = exc.format_message().rstrip(".")
                raise ConfigProblem(f"--inject: {problem}; expected {INJECT_FORMS}") from None
            raise


@click.command("generate", cls=InjectionCommand)
@click.option("--bootstrap",
              help="Kafka bootstrap host:port (default: config kafka.bootstrap / KAFKA_BOOTSTRAP).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="skewwatch TOML config file.")
@click.option("--topic", help="Request events topic (default: config topics.requests, llm.requests).")
@click.option("--telemetry-topic", help="GPU telemetry topic (default: config topics.gpu_telemetry).")
@click.option("--no-telemetry", is_flag=True, help="Do not produce simulated GPU telemetry.")
@click.option("--models", default="llama-3-70b", show_default=True,
              help="One or two model names, comma separated.")
@click.option("--replicas", default=4, show_default=True, type=click.IntRange(min=1),
              help="Replicas per model.")
@click.option("--rate", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Requests per second per replica (Poisson).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True),
              help="Seconds of event time to generate (default: until Ctrl-C).")
@click.option("--speed", default="1.0", show_default=True,
              help="Pace by event time: 1.0 real time, 10 ten times faster, 'max' as fast as possible.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1),
              help="Events per message: 1 sends single events, more sends {\"events\": [...]} per replica.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--start-ts", default="now", show_default=True,
              help="Event time of the start: 'now' or epoch seconds.")
@click.option("--trace", "trace_name", default="conv", show_default=True,
              help="Token lengths from: 'conv' or 'code' (bundled Azure 2023 traces) or a CSV path.")
@click.option("--columns",
              help="CSV column mapping, e.g. ts=time,prompt=input_tokens,completion=output_tokens.")
@click.option("--capacity", "batch_capacity", default=32, show_default=True, type=click.IntRange(min=1),
              help="batch_capacity of every replica.")
@click.option("--latency-median-ms", default=800.0, show_default=True, type=float)
@click.option("--latency-sigma", default=0.2, show_default=True, type=float,
              help="Log-normal sigma of latency; keep it modest (0.2 gives P99/P50 ~ 1.8).")
@click.option("--inject", "inject_kinds", multiple=True, metavar="KIND[:name=value,...]",
              help=f"Inject a fault (repeatable): {', '.join(FAULT_KINDS)}; also one quoted injection, "
                   "as demo takes it: 'long_tail --replica r1 --at 30 --for 60'.")
@click.option("--replica", "inject_replicas", multiple=True, help="Replica of each --inject (r0, r1, ...).")
@click.option("--at", "inject_at", multiple=True, type=float,
              help=f"Seconds after the start when each fault begins (default {DEFAULT_INJECT_AT_S:g}).")
@click.option("--for", "inject_for", multiple=True, type=float,
              help=f"Seconds each fault lasts (default {DEFAULT_INJECT_FOR_S:g}).")
@click.option("--param", "inject_params", multiple=True, metavar="NAME=VALUE",
              help="Fault parameter for every --inject that has it, e.g. class=hardware.")
@click.option("--labels", "labels_path", type=click.Path(dir_okay=False),
              help="Write the injected faults' ground truth here (JSON list of {replica, kind, start, end}).")
@click.option("--quiet", is_flag=True, help="No summary line.")
@logging_options
def generate_command(bootstrap: str | None, config_path: str | None, topic: str | None,
                     telemetry_topic: str | None, no_telemetry: bool, models: str, replicas: int,
                     rate: float, duration: float | None, speed: str, batch: int, seed: int, start_ts: str,
                     trace_name: str, columns: str | None, batch_capacity: int, latency_median_ms: float,
                     latency_sigma: float, inject_kinds: tuple[str, ...], inject_replicas: tuple[str, ...],
                     inject_at: tuple[float, ...], inject_for: tuple[float, ...],
                     inject_params: tuple[str, ...], labels_path: str | None, quiet: bool, loglevel: str,
                     log_format: str) -> None:
    """Produce synthetic LLM request events (and GPU telemetry) to Kafka, paced by event time."""
    from aiokafka.errors import KafkaError

    from skewwatch.kafka_client import describe_exception
    from skewwatch.sim.emit import ProduceStats, TopicMissingError, produce_traffic
    from skewwatch.sim.generator import GeneratorConfig, generate_chunks, labels

    setup_logging(loglevel, log_format)
    settings = command_settings(config_path)
    bootstrap = require_bootstrap(bootstrap, settings, "to produce to")
    model_names = tuple(m.strip() for m in models.split(",") if m.strip())
    if not 1 <= len(model_names) <= 2:
        raise click.BadParameter("give one or two model names", param_hint="--models")
    pace = parse_speed(speed)
    start = parse_start_ts(start_ts)
    try:
        trace = load_trace(trace_name, ColumnMapping.parse(columns) if columns else None)
        injections = injections_from_options(inject_kinds, inject_replicas, inject_at, inject_for,
                                             inject_params)
        config = GeneratorConfig(models=model_names, replicas=replicas, rate=rate, seed=seed, trace=trace,
                                 batch_capacity=batch_capacity, latency_median_ms=latency_median_ms,
                                 latency_sigma=latency_sigma, injections=tuple(injections),
                                 telemetry=not no_telemetry)
    except (TraceError, FaultError, ValueError) as exc:
        raise ConfigProblem(str(exc)) from exc
    check_kafka(bootstrap, settings)  # after the options: a bad --inject is reported without Kafka
    if labels_path:
        write_labels(labels_path, labels(config, start))
    stats = ProduceStats()
    began = time.monotonic()

    async def run() -> None:
        # SIGTERM (how `skewwatch demo` stops its children) ends the run like Ctrl-C does:
        # cancel, let the producer flush and stop, print the summary.
        task = asyncio.current_task()
        assert task is not None
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows loops
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await produce_traffic(
                bootstrap, generate_chunks(config, start, duration),
                requests_topic=topic or settings.topics.requests,
                telemetry_topic=None if no_telemetry else (telemetry_topic or settings.topics.gpu_telemetry),
                batch=batch, speed=pace, stats=stats, client_options=client_options(settings.kafka))

    try:
        asyncio.run(run())
    except TopicMissingError as exc:
        raise ConfigProblem(str(exc)) from exc
    except KafkaError as exc:  # the broker went away after the first connection
        raise KafkaUnreachable(f"Kafka at {bootstrap} failed during the run: {describe_exception(exc)}") from None
    except KeyboardInterrupt:
        pass  # Ctrl-C: the summary below still tells what went out
    if not quiet:
        wall = max(time.monotonic() - began, 1e-9)
        span = 0.0 if stats.first_ts is None or stats.last_ts is None else stats.last_ts - stats.first_ts
        summary: dict[str, Any] = {"events": stats.events, "messages": stats.messages,
                                   "telemetry": stats.telemetry, "event_time_s": round(span, 1),
                                   "wall_s": round(wall, 1), "events_per_s": round(stats.events / wall)}
        click.echo("generated " + " ".join(f"{k}={v}" for k, v in summary.items()), err=True)
    sys.stdout.flush()
