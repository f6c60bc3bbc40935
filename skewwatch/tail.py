"""``skewwatch tail alerts|corrections|features|dead-letter``: read skewwatch's topics as a person or a pipe would.

``dead-letter`` is the input that was rejected (``dead-letter.v1``): where it came from, its key, and
why, by reason code, with the first reason's text; ``--json`` gives the whole record (the original
bytes in ``value_b64``).

On a terminal the records are a table (rich); otherwise (a pipe, a file) each record is printed as
it is on the topic, one JSON object per line, so ``skewwatch tail alerts | jq`` works. ``--since``
seeks each partition to the first record at or after that age (the records' Kafka timestamps, i.e.
when the worker published them); without ``--follow`` the command stops at the end of the topic.

>>> parse_duration("10m"), parse_duration("90s"), parse_duration("1h30m"), parse_duration("2d")
(600.0, 90.0, 5400.0, 172800.0)
>>> value = (b'{"model": "m", "ts": 60.0, "seq": 60000, "weights": {"r1": 0.75, "r2": 0.25}, "actions": '
...          b'[{"replica": "r2", "action": "drain", "severity": "CRITICAL", "reason": "down"}]}')
>>> format_row("corrections", read_record("corrections", value))[1:]
['m', '60000', 'normal', 'r1=0.75 r2=0.25', 'r2:drain']
>>> matches("alerts", {"model": "m", "replica": "r1"}, model="m", replica="r2")
False
>>> dead = {"rejected_at": 60.0, "source_topic": "llm.requests", "partition": 3, "offset": 17, "key_b64": "cjE=",
...         "rejects": [{"reason_code": "out_of_range", "reason": "latency_ms: must be >= 0, got -3"}],
...         "rejects_total": 1}
>>> format_row("dead-letter", dead)[1:]
['llm.requests/3@17', 'r1', '1', 'out_of_range 1', 'latency_ms: must be >= 0, got -3']
>>> matches("dead-letter", dead, model=None, replica="r1"), matches("dead-letter", dead, model="m", replica=None)
(True, False)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import click
import orjson

from skewwatch.schemas.alerts import decode_alert
from skewwatch.schemas.corrections import decode_correction

Kind = Literal["alerts", "corrections", "features", "dead-letter"]
KINDS: tuple[Kind, ...] = ("alerts", "corrections", "features", "dead-letter")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
COLUMNS: dict[str, list[str]] = {
    "alerts": ["time", "state", "severity", "model", "replica", "detector", "message"],
    "corrections": ["time", "model", "seq", "mode", "weights", "actions"],
    "features": ["window_end", "model", "replica", "count", "rps", "p50 ms", "p99 ms", "tpot p99",
                 "batch fill", "errors"],
    "dead-letter": ["time", "source", "key", "rejects", "reasons", "first reason"],
}
_MIN_WIDTH = {"source": 20, "reasons": 16,
              "time": 19, "window_end": 19, "state": 8, "severity": 8, "model": 16, "replica": 10, "detector": 14,
              "seq": 14, "mode": 6, "weights": 32, "actions": 12}
_SEVERITY_STYLE = {"CRITICAL": "bold red", "WARNING": "yellow", "INFO": "cyan"}


def parse_duration(text: str) -> float:
    """Seconds in ``10m``, ``90s``, ``1h30m``, ``2d``; ValueError otherwise."""
    text = text.strip().lower()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 1d)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _time(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _number_cell(value: Any, digits: int = 1) -> str:
    """A table cell: the number with ``digits`` decimals, ``-`` where the record has none."""
    return "-" if not isinstance(value, int | float) else f"{value:.{digits}f}"


def dead_letter_key(record: Mapping[str, Any]) -> str | None:
    """The rejected message's key as text (None: it had none, or it is not base64)."""
    key = record.get("key_b64")
    if not isinstance(key, str):
        return None
    try:
        return base64.b64decode(key, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return None


def read_record(kind: Kind, value: bytes) -> dict[str, Any]:
    """One record of ``kind`` as plain data; ValueError when it is not one. Alerts and corrections are
    read by their contract's decoder (a correction's missing ``mode`` is ``normal``), the others as
    the JSON object they are."""
    if kind == "corrections":
        return decode_correction(value).to_dict()
    if kind == "alerts":
        return decode_alert(value).to_dict()
    record = orjson.loads(value)
    if not isinstance(record, dict):
        raise ValueError(f"a {kind} record must be a JSON object")
    return record


def format_row(kind: Kind, record: Mapping[str, Any]) -> list[str]:
    """The table row of one record (the columns of :data:`COLUMNS`), as :func:`read_record` gives it."""
    if kind == "dead-letter":
        rejects = [r for r in record.get("rejects") or [] if isinstance(r, Mapping)]
        counts = record.get("rejects_by_code") or {}
        if not counts:
            counts = {}
            for reject in rejects:
                code = str(reject.get("reason_code", "?"))
                counts[code] = counts.get(code, 0) + 1
        reasons = " ".join(f"{code} {n}" for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return [_time(record.get("rejected_at")),
                f"{record.get('source_topic', '?')}/{record.get('partition', '?')}@{record.get('offset', '?')}",
                dead_letter_key(record) or "-", str(record.get("rejects_total", len(rejects))), reasons or "-",
                str(rejects[0].get("reason", "")) if rejects else "-"]
    if kind == "alerts":
        return [_time(record.get("ts")), str(record.get("state", "")), str(record.get("severity", "")),
                str(record.get("model", "")), str(record.get("replica") or "*"), str(record.get("detector", "")),
                str(record.get("message", ""))]
    if kind == "corrections":
        weights = record.get("weights") or {}
        actions = record.get("actions") or []
        return [_time(record.get("ts")), str(record.get("model", "")), str(record.get("seq", "")),
                str(record.get("mode")),
                " ".join(f"{r}={w:.2f}" for r, w in sorted(weights.items())),
                " ".join(f"{a.get('replica')}:{a.get('action')}" for a in actions) or "-"]
    return [_time(record.get("window_end")), str(record.get("model", "")), str(record.get("replica") or "*"),
            str(record.get("count", "")), _number_cell(record.get("rps"), 2),
            _number_cell(record.get("latency_p50")), _number_cell(record.get("latency_p99")),
            _number_cell(record.get("tpot_p99"), 2), _number_cell(record.get("batch_fill_mean"), 2),
            _number_cell(record.get("error_rate"), 3)]


def matches(kind: Kind, record: Mapping[str, Any], model: str | None, replica: str | None) -> bool:
    """Does ``record`` pass the ``--model`` / ``--replica`` filters? (corrections: the replica is in the pool)"""
    if kind == "dead-letter":  # by the rejected message's key: a replica, or model/replica
        key = dead_letter_key(record) or ""
        model_ok = model is None or key == model or key.startswith(f"{model}/")
        return model_ok and (replica is None or key == replica or key.endswith(f"/{replica}"))
    if model is not None and record.get("model") != model:
        return False
    if replica is None:
        return True
    if kind == "corrections":
        return replica in (record.get("weights") or {})
    return bool(record.get("replica") == replica)


class Printer:
    """Writes records: a rich table on a terminal, one JSON object per line elsewhere."""

    def __init__(self, kind: Kind, out: TextIO, table: bool) -> None:
        self.kind = kind
        self.out = out
        self.table = table
        self.headed = False
        self.console: Any = None
        if table:
            from rich.console import Console

            self.console = Console(file=out)

    def write(self, records: Sequence[tuple[bytes, Mapping[str, Any]]]) -> None:
        if not records:
            return
        if not self.table:
            for raw, _ in records:
                self.out.write(raw.decode("utf-8", "replace") + "\n")
            self.out.flush()
            return
        from rich.table import Table

        table = Table(show_header=not self.headed, box=None, pad_edge=False)
        for name in COLUMNS[self.kind]:  # fixed widths: the batches of --follow line up
            table.add_column(name, no_wrap=name not in ("message", "weights", "actions", "first reason"),
                             min_width=_MIN_WIDTH.get(name, len(name)))
        for _, record in records:
            style = _SEVERITY_STYLE.get(str(record.get("severity"))) if self.kind == "alerts" else None
            if self.kind == "alerts" and record.get("state") == "resolved":
                style = "green"
            table.add_row(*format_row(self.kind, record), style=style)
        self.console.print(table)
        self.headed = True


async def tail(bootstrap: str, topic: str, kind: Kind, printer: Printer, *, since_s: float | None,
               follow: bool, model: str | None, replica: str | None,
               client_kwargs: Mapping[str, Any] | None = None) -> int:
    """Print the records of ``topic`` (from ``since_s`` ago, or the start) and, with ``follow``, new ones.

    Returns the number of records printed.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from skewwatch.client.command import topic_missing
    from skewwatch.kafka_client import client_kwargs as connection
    from skewwatch.kafka_client import refresh_metadata

    options = {**connection(bootstrap=bootstrap), **(client_kwargs or {})}
    consumer = AIOKafkaConsumer(**options, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        async with asyncio.timeout(30):
            await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    printed = 0
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await refresh_metadata(consumer)  # the metadata of a topic the consumer is not assigned yet
            partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise topic_missing(topic, bootstrap)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        if since_s is None:
            await consumer.seek_to_beginning(*tps)
        else:
            found = await consumer.offsets_for_times({tp: int((time.time() - since_s) * 1000) for tp in tps})
            for tp in tps:
                at = found.get(tp)
                consumer.seek(tp, at.offset if at is not None else ends[tp])
        pending = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while follow or pending:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            rows: list[tuple[int, bytes, dict[str, Any]]] = []
            for messages in batches.values():
                for message in messages:
                    if message.value is None:
                        continue
                    try:
                        record = read_record(kind, message.value)
                    except ValueError:  # orjson's and msgspec's errors are ValueErrors: not a record of kind
                        continue
                    if matches(kind, record, model, replica):
                        rows.append((message.timestamp, message.value, record))
            rows.sort(key=lambda row: row[0])  # partitions interleaved by publication time
            printer.write([(raw, record) for _, raw, record in rows])
            printed += len(rows)
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return printed


@click.command("tail")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--model", help="Only this model (dead-letter: keys model or model/...).")
@click.option("--replica", help="Only this replica (corrections: pools that include it; dead-letter: by key).")
@click.option("--since", "since", metavar="DURATION",
              help="Start this long ago (30s, 10m, 2h, 1d), by publication time. Default: 10m for alerts, "
                   "features and dead letters, the whole compacted topic for corrections.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records until interrupted.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines even on a terminal.")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", metavar="HOST:PORT", help="Kafka to read from.")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Settings TOML file (topic names, Kafka); default: env SKEWWATCH_CONFIG.")
def tail_command(kind: Kind, model: str | None, replica: str | None, since: str | None, follow: bool,
                 as_json: bool, bootstrap: str | None, config_path: Path | None) -> None:
    """Print skewwatch's alerts, routing corrections, feature vectors or rejected input (dead-letter): a
    table on a terminal, JSON lines otherwise."""
    from aiokafka.errors import KafkaError

    from skewwatch.client.command import reader_settings
    from skewwatch.kafka_client import kafka_failure, quiet_client_logs
    from skewwatch.stopping import run_until_stopped

    quiet_client_logs()
    try:
        since_s = parse_duration(since) if since else (None if kind == "corrections" else 600.0)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    settings, servers, kwargs = reader_settings(config_path, bootstrap)
    topic = {"alerts": settings.topics.alerts, "corrections": settings.topics.routing_corrections,
             "features": settings.topics.features, "dead-letter": settings.topics.dead_letter}[kind]
    printer = Printer(kind, sys.stdout, table=sys.stdout.isatty() and not as_json)
    try:
        # SIGTERM / Ctrl-C end `--follow` with exit code 0, the consumer closed
        run_until_stopped(tail(servers, topic, kind, printer, since_s=since_s, follow=follow, model=model,
                               replica=replica, client_kwargs=kwargs))
    except (KafkaError, OSError, TimeoutError) as exc:  # the broker went away after the first connection
        raise kafka_failure(exc, servers, f"while reading {topic}") from None


__all__ = ["COLUMNS", "KINDS", "Printer", "dead_letter_key", "format_row", "matches", "parse_duration", "tail",
           "tail_command"]
