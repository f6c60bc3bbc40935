"""``skewwatch alertmanager-bridge``: ``llm.alerts`` -> Prometheus Alertmanager (``POST /api/v2/alerts``).

A Faust agent (its own app and consumer group, ``skewwatch-alertmanager`` by default) reads the
alerts topic; alerts are a low-rate stream, which is where Faust's agent model fits. For each record:

* labels: ``alertname`` (``Skewwatch`` + the detector in CamelCase), ``model``, ``replica`` (absent on a
  model-level alert), ``detector``, ``severity`` (lower case: ``info|warning|critical``), ``rule`` when
  the detector names one, and ``source="skewwatch"``. Open and resolve carry the same labels, so
  Alertmanager sees one alert;
* annotations: ``summary`` (the alert's message), ``description`` (every evidence number on one line)
  and one ``evidence_<name>`` per evidence field;
* ``open``: ``startsAt`` = the alert's event time, ``endsAt`` = now + 4 × ``resend_s``, and the open
  alert is re-sent every ``resend_s`` (60 s) while it stays open, as Prometheus does for its own alerts:
  if the bridge stops, Alertmanager resolves what it last heard about within 4 × ``resend_s``;
* ``resolved``: ``endsAt`` = the resolve's event time (at most now), which ends the alert.

The open alerts are kept in a Faust table (changelogged to Kafka), so a restarted bridge keeps
re-sending them. A failed POST is retried with exponential backoff (0.5 s doubling to at most 30 s,
tenacity) for as long as Alertmanager answers 5xx or not at all (the alert stays in Kafka meanwhile,
its offset uncommitted); a 4xx answer means the alert itself is refused: logged and dropped.

>>> from dataclasses import replace
>>> record = decode_alert(b'{"ts": 1700000000.0, "model": "llama", "replica": "r1", "detector": "kv_pressure", '
...                       b'"severity": "CRITICAL", "state": "open", "message": "KV cache 97 % full", '
...                       b'"evidence": {"rule": "usage", "kv_usage": 0.97}}')
>>> am = to_alertmanager(record, now=1700000100.0, resend_s=60.0)
>>> am["labels"]["alertname"], am["labels"]["severity"], am["labels"]["rule"]
('SkewwatchKvPressure', 'critical', 'usage')
>>> am["startsAt"], am["endsAt"], am["annotations"]["evidence_kv_usage"]
('2023-11-14T22:13:20Z', '2023-11-14T22:19:00Z', '0.97')
>>> to_alertmanager(replace(record, state="resolved", ts=1700000050.0), now=1700000100.0)["endsAt"]
'2023-11-14T22:14:10Z'
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from skewwatch.errors import SkewwatchError
from skewwatch.kafka_security import describe_listener
from skewwatch.logs import logging_options, setup_logging, skewwatch_version
from skewwatch.schemas.alerts import Alert, decode_alert

if TYPE_CHECKING:
    from skewwatch.config import KafkaSettings

log = logging.getLogger(__name__)

DEFAULT_RESEND_S = 60.0
MAX_BACKOFF_S = 30.0


class AlertmanagerRefused(SkewwatchError, RuntimeError):
    """Alertmanager answered 4xx: the alert itself is refused, re-sending it will not help."""


class AlertmanagerUnavailable(SkewwatchError, RuntimeError):
    """Alertmanager answered 5xx or not at all: retried with backoff."""

    retriable = True  # Alertmanager restarting or overloaded answers again later


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{int(round(ts % 1 * 1000)):03d}Z" if ts % 1 else "Z")


def to_alertmanager(record: Alert, now: float, resend_s: float = DEFAULT_RESEND_S,
                    starts_at: float | None = None) -> dict[str, Any]:
    """The Alertmanager v2 ``postableAlert`` of one ``llm.alerts`` record (see the module docstring)."""
    detector = record.detector
    evidence = record.evidence
    labels = {
        "alertname": "Skewwatch" + "".join(part.capitalize() for part in detector.split("_")),
        "source": "skewwatch",
        "model": record.model,
        "detector": detector,
        "severity": str(record.severity).lower(),
    }
    if record.replica:
        labels["replica"] = record.replica
    if evidence.get("rule") is not None:
        labels["rule"] = str(evidence["rule"])
    annotations = {"summary": record.message}
    if evidence:
        annotations["description"] = ", ".join(f"{k}={v}" for k, v in sorted(evidence.items()))
        annotations.update({f"evidence_{k}": str(v) for k, v in evidence.items()})
    ts = record.ts
    alert: dict[str, Any] = {"labels": labels, "annotations": annotations,
                             "startsAt": _rfc3339(starts_at if starts_at is not None else ts)}
    if record.state == "resolved":
        alert["endsAt"] = _rfc3339(min(ts, now))
    else:
        alert["endsAt"] = _rfc3339(now + 4 * resend_s)
    return alert


class AlertmanagerClient:
    """POSTs alerts to one Alertmanager, retrying with exponential backoff (tenacity)."""

    def __init__(self, url: str, timeout: float = 10.0, max_backoff_s: float = MAX_BACKOFF_S) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout = timeout
        self.max_backoff_s = max_backoff_s
        self.posted = 0
        self.failures = 0
        self._session: Any = None

    async def _post_once(self, alerts: list[dict[str, Any]]) -> None:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.post(self.url, data=orjson.dumps(alerts),
                                          headers={"Content-Type": "application/json"}) as response:
                body = (await response.text())[:200]
                if 400 <= response.status < 500:
                    raise AlertmanagerRefused(f"Alertmanager at {self.url} refused the alert: "
                                              f"{response.status} {body}")
                if response.status >= 300:
                    raise AlertmanagerUnavailable(f"Alertmanager at {self.url} answered {response.status} {body}")
        except aiohttp.ClientError as exc:
            raise AlertmanagerUnavailable(f"Alertmanager at {self.url} does not answer: {exc}") from exc
        except TimeoutError as exc:
            raise AlertmanagerUnavailable(f"Alertmanager at {self.url} timed out") from exc

    async def post(self, alerts: list[dict[str, Any]]) -> None:
        """POST until Alertmanager takes them (retrying 5xx and connection errors); a 4xx raises."""
        from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

        def before_sleep(state: Any) -> None:
            self.failures += 1
            if state.attempt_number <= 3 or state.attempt_number % 20 == 0:  # a long outage is not a log flood
                log.warning("%s; retry %d in %.1f s", state.outcome.exception(), state.attempt_number,
                            state.next_action.sleep)

        async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.5, max=self.max_backoff_s),
                                           retry=retry_if_exception_type(AlertmanagerUnavailable),
                                           before_sleep=before_sleep, reraise=True):
            with attempt:
                await self._post_once(alerts)
        self.posted += len(alerts)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def create_bridge_app(bootstrap: str, alerts_topic: str, url: str, *, group_id: str = "skewwatch-alertmanager",
                      resend_s: float = DEFAULT_RESEND_S, partitions: int = 8, replication_factor: int = 1,
                      web_port: int | None = None, kafka: KafkaSettings | None = None) -> Any:
    """The Faust app: an agent on ``alerts_topic`` posting to Alertmanager, a table of open alerts, a timer."""
    import faust

    from skewwatch.kafka_client import faust_app_kwargs

    app = faust.App(group_id, **faust_app_kwargs(kafka, bootstrap=bootstrap), autodiscover=False, store="memory://",
                    web_enabled=web_port is not None, web_port=web_port or 6067, web_host="127.0.0.1",
                    web_bind="127.0.0.1", topic_partitions=partitions,
                    topic_replication_factor=replication_factor,
                    # a stop must not wait for the alert in hand: while Alertmanager does not answer its POST
                    # retries for as long as the outage lasts, and SIGTERM would never end the process. The
                    # alert's offset is not committed, so the next start sends it again.
                    stream_wait_empty=False)
    client = AlertmanagerClient(url)
    topic = app.topic(alerts_topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                      value_serializer="raw", partitions=partitions)
    # key -> the open alert's record (JSON), changelogged: a restarted bridge keeps re-sending it
    open_alerts = app.Table("open-alerts", default=None, partitions=partitions)  # JSON keys and values
    # one POST at a time, and the table changed under the same lock: a re-send that snapshotted an alert
    # before its resolve was handled would otherwise reach Alertmanager after the resolve and reopen it
    posting = asyncio.Lock()

    @app.agent(topic)
    async def forward(stream: Any) -> Any:
        # acked by hand once handled: a stop during an Alertmanager outage cancels the POST's retries,
        # and the alert, unacked, is read again (its offset uncommitted) by the next start. Faust's own
        # acks would ack it as the iteration is cancelled, and the alert would be lost.
        events = stream.noack()
        async for event in events.events():
            try:
                record = decode_alert(event.value)
                key = record.key
                starts = None
                if record.state == "resolved" and open_alerts.get(key) is not None:
                    starts = float(open_alerts[key]["ts"])
                alert = to_alertmanager(record, time.time(), resend_s, starts_at=starts)
            except (ValueError, KeyError, TypeError) as exc:  # msgspec's errors are ValueErrors
                log.warning("alertmanager-bridge: skipped a malformed alert record: %s", exc)
                await events.ack(event)
                continue
            async with posting:
                try:
                    await client.post([alert])
                except AlertmanagerRefused as exc:
                    log.error("%s", exc)
                if record.state == "open":
                    open_alerts[key] = record.to_dict()
                else:
                    open_alerts.pop(key, None)
            log.info("alertmanager-bridge: %s %s", record.state, key)
            await events.ack(event)
            yield key

    @app.timer(resend_s)
    async def resend_open() -> None:
        async with posting:  # the snapshot and its POST, with no resolve between them
            now = time.time()
            alerts = [to_alertmanager(Alert.from_dict(record), now, resend_s)
                      for record in open_alerts.values() if record is not None]
            if alerts:
                try:
                    await client.post(alerts)
                except AlertmanagerRefused as exc:
                    log.error("%s", exc)

    @app.service
    class CloseClient(faust.Service):
        async def on_stop(self) -> None:
            await client.close()

    return app


@click.command("alertmanager-bridge")
@click.option("--url", envvar="ALERTMANAGER_URL", default="http://127.0.0.1:9093", show_default=True,
              help="Alertmanager's base URL.")
@click.option("--resend-s", type=float, default=DEFAULT_RESEND_S, show_default=True,
              help="Re-send open alerts this often (Alertmanager ends an alert 4x this after the last send).")
@click.option("--group-id", default="skewwatch-alertmanager", show_default=True,
              help="Kafka consumer group (and Faust app id) of the bridge.")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", metavar="HOST:PORT", help="Kafka to read from.")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Settings TOML file (topic names, Kafka); default: env SKEWWATCH_CONFIG.")
@logging_options
def alertmanager_bridge_command(url: str, resend_s: float, group_id: str, bootstrap: str | None,
                                config_path: Path | None, loglevel: str, log_format: str) -> None:
    """Forward skewwatch's alerts (llm.alerts) to Prometheus Alertmanager; resolve ends them."""
    import faust

    from skewwatch.client.command import reader_settings, topic_partitions

    if resend_s <= 0:
        raise click.BadParameter("must be > 0", param_hint="--resend-s")
    from skewwatch.kafka_client import quiet_client_logs, run_blocking

    setup_logging(loglevel, log_format)
    settings, servers, kwargs = reader_settings(config_path, bootstrap)
    quiet_client_logs()
    # one line, before Faust starts, when Kafka or the topic is missing (Faust would print a traceback);
    # the table of open alerts is co-partitioned with the topic, so it takes the topic's partition count
    partitions = run_blocking(topic_partitions(servers, settings.topics.alerts, client_kwargs=kwargs))
    app = create_bridge_app(servers, settings.topics.alerts, url, group_id=group_id, resend_s=resend_s,
                            partitions=partitions, kafka=settings.kafka,
                            replication_factor=settings.kafka.replication_factor)
    log.info("skewwatch alertmanager-bridge %s: %s at %s, group %s -> %s", skewwatch_version(),
             settings.topics.alerts, describe_listener(servers, settings.kafka), group_id, url)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False,
                          override_logging=False)  # logging is ours (skewwatch.logs): text or JSON, rate limits
    worker.spinner = None  # Faust's spinner writes terminal control codes even when stdout is not a TTY
    worker.execute_from_commandline()


__all__ = ["AlertmanagerClient", "AlertmanagerRefused", "AlertmanagerUnavailable",
           "alertmanager_bridge_command", "create_bridge_app", "to_alertmanager"]
