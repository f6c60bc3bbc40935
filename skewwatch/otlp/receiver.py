"""``skewwatch otlp-receiver``: an OTLP/HTTP trace endpoint that publishes request events.

Issue 7 ("OTLP in"): point vLLM's ``--otlp-traces-endpoint http://HOST:4318/v1/traces`` here and
its per-request spans become contract-v1 events on ``llm.requests``, keyed by replica, as
``{"events": [...]}`` batches (one message per replica per export), with no Collector needed.

Answers per the OTLP/HTTP specification (opentelemetry.io/docs/specs/otlp/#otlphttp):

* ``POST /v1/traces`` with ``Content-Type: application/x-protobuf`` or ``application/json``
  (``Content-Encoding: gzip`` accepted); the response uses the request's content type.
* 200 with an ``ExportTraceServiceResponse``; ``partial_success.rejected_spans`` counts the spans
  that looked like requests but could not be mapped or failed the worker's validation, and
  ``error_message`` quotes the first reasons. Spans that are not inference requests are accepted
  and ignored (counted in ``/stats``), as they are not errors of the sender.
* 400 with a ``google.rpc.Status`` when the body cannot be decoded; 415 for another content type
  or encoding; 503 with ``Retry-After`` while Kafka is unreachable or backed up, so the sender's
  OTLP exporter retries instead of us buffering without bound.

>>> receiver = OtlpReceiver(ListPublisher())
>>> sorted({r.resource.canonical for r in receiver.app.router.routes()})
['/stats', '/v1/traces']
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import zlib
from collections import Counter
from typing import Any, Protocol

import click
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from skewwatch.config import LimitSettings, load_settings
from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, AttributeMap, as_sequence
from skewwatch.otlp.decode import decode_otlp_traces, encode_by_replica
from skewwatch.schemas.requests import check_request_event

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 16 * 1024 * 1024  # decompressed; the Collector's default max_request_body_size is 20 MiB
_MAX_REASONS_SHOWN = 5
_RETRY_AFTER_S = "2"
_GRPC_INVALID_ARGUMENT = 3  # google.rpc.Code
_GRPC_UNAVAILABLE = 14


class EventPublisher(Protocol):
    """Where mapped events go: one message per replica."""

    def ready(self) -> bool:
        """False while messages cannot be delivered (the receiver then answers 503)."""
        ...

    def publish(self, key: bytes, value: bytes) -> None:
        """Queue one message; must not block."""
        ...


class ListPublisher:
    """An in-memory publisher (for tests and dry runs): keeps ``(key, value)`` pairs."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []
        self.is_ready = True

    def ready(self) -> bool:
        return self.is_ready

    def publish(self, key: bytes, value: bytes) -> None:
        self.messages.append((key, value))


class KafkaPublisher:
    """Publishes through :class:`~skewwatch.bounded_producer.BoundedProducer` (never blocks)."""

    def __init__(self, bootstrap: str, topic: str, *, max_buffered: int = 10_000) -> None:
        from skewwatch.bounded_producer import BoundedProducer

        self.producer = BoundedProducer(bootstrap, topic, max_buffered=max_buffered,
                                        client_id="skewwatch-otlp-receiver")

    def ready(self) -> bool:
        # Refuse (503) rather than fill the buffer past half: the sender retries, nothing is dropped.
        return self.producer.connected and self.producer.buffered < self.producer.max_buffered // 2

    def publish(self, key: bytes, value: bytes) -> None:
        self.producer.offer(key, value)

    async def start(self) -> None:
        await self.producer.start()

    async def close(self) -> None:
        await self.producer.close()


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _decompress_gzip(body: bytes, limit: int) -> bytes:
    """gunzip with a size cap (a small gzip body can expand to gigabytes)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = decompressor.decompress(body, limit + 1)
    if len(out) > limit:
        raise ValueError(f"gzip body expands beyond {limit} bytes")
    if not decompressor.eof:
        raise ValueError("gzip body is truncated")
    return out


class OtlpReceiver:
    """The aiohttp application; counters in :attr:`stats` (also served at ``GET /stats``)."""

    def __init__(self, publisher: EventPublisher, attribute_map: AttributeMap = DEFAULT_ATTRIBUTE_MAP, *,
                 limits: LimitSettings | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.publisher = publisher
        self.attribute_map = attribute_map
        self.limits = limits or LimitSettings()
        self.max_body_bytes = max_body_bytes
        self.stats: Counter[str] = Counter()
        # auto_decompress off: aiohttp would gunzip without a size cap and refuse unknown encodings
        # with a 400 before the handler could answer the spec's 415.
        self.app = web.Application(client_max_size=max_body_bytes, handler_args={"auto_decompress": False})
        self.app.router.add_post("/v1/traces", self.handle_traces)
        self.app.router.add_get("/stats", self.handle_stats)

    async def handle_stats(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))

    def _respond(self, message: Message, media_type: str, status: int = 200,
                 headers: dict[str, str] | None = None) -> web.Response:
        if media_type == JSON:
            body = json_format.MessageToJson(message, indent=None).encode()
        else:
            body = message.SerializeToString()
        return web.Response(body=body, status=status, content_type=media_type, headers=headers)

    def _error(self, status: int, text: str, media_type: str,
               headers: dict[str, str] | None = None) -> web.Response:
        self.stats[f"http_{status}"] += 1
        log.info("OTLP request answered %d: %s", status, text)
        try:
            from google.rpc.status_pb2 import Status  # googleapis-common-protos, when installed
        except ImportError:  # the spec says SHOULD: a plain-text reason is still actionable
            return web.Response(text=text, status=status, headers=headers)
        code = _GRPC_UNAVAILABLE if status == 503 else _GRPC_INVALID_ARGUMENT
        return self._respond(Status(code=code, message=text), media_type if media_type in (JSON, PROTOBUF)
                             else PROTOBUF, status, headers)

    async def handle_traces(self, request: web.Request) -> web.Response:
        media_type = _media_type(request.headers.get("Content-Type", ""))
        if media_type not in (PROTOBUF, JSON):
            return self._error(415, f"unsupported Content-Type {media_type or '(none)'!r}: send "
                                    f"{PROTOBUF} or {JSON}", PROTOBUF)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            return self._error(415, f"unsupported Content-Encoding {encoding!r}: send gzip or none",
                               media_type)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._error(413, f"body larger than {self.max_body_bytes} bytes", media_type)
        if encoding == "gzip":
            try:
                body = _decompress_gzip(body, self.max_body_bytes)
            except (ValueError, zlib.error, gzip.BadGzipFile) as exc:
                return self._error(400, f"Content-Encoding gzip but the body does not gunzip: {exc}",
                                   media_type)
        if not self.publisher.ready():
            return self._error(503, "Kafka is not reachable or backed up; retry later", media_type,
                               {"Retry-After": _RETRY_AFTER_S})

        result = decode_otlp_traces(body, "otlp_json" if media_type == JSON else "otlp_proto",
                                    self.attribute_map)
        if result.is_malformed:
            return self._error(400, result.rejections[0].reason, media_type)

        reasons = [r.reason for r in result.rejections]
        valid: list[dict[str, Any]] = []
        for event in result.events:
            rejection = check_request_event(_with_batch_placeholders(event), self.limits)
            if rejection is not None:
                reasons.append(f"request {event.get('request_id')}: {rejection.reason}")
                self.stats[f"rejected_{rejection.reason_code}"] += 1
            else:
                valid.append(event)
        for rejection in result.rejections:
            self.stats[f"rejected_{rejection.reason_code}"] += 1
        for key, value in encode_by_replica(valid):
            self.publisher.publish(key, value)
        self.stats["events_published"] += len(valid)

        self.stats["spans_total"] += result.spans_total
        for reason, count in result.skipped.items():
            self.stats[f"skipped_{reason}"] += count
        self.stats["http_200"] += 1
        response = ExportTraceServiceResponse()
        if reasons:
            shown = "; ".join(reasons[:_MAX_REASONS_SHOWN])
            hidden = len(reasons) - _MAX_REASONS_SHOWN
            more = f"; ...(+{hidden} more)" if hidden > 0 else ""
            response.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=len(reasons),
                                                                        error_message=shown + more))
        return self._respond(response, media_type)


def _with_batch_placeholders(event: dict[str, Any]) -> dict[str, Any]:
    """Validate every field with the worker's rules except the batch fields a span may lack.

    Spans carry no per-request batch size (vLLM's do not); contract v1.1 makes the batch fields
    optional and lets the worker fill them from telemetry. Until then, leave absence to the contract
    rather than reject every vLLM span here; present batch fields are still checked.
    """
    if "batch_size" in event and "batch_capacity" in event:
        return event
    size = event.get("batch_size", 1)
    return {**event, "batch_size": size, "batch_capacity": event.get("batch_capacity", max(size, 1)
                                                                      if isinstance(size, int) else 1)}


async def serve(receiver: OtlpReceiver, host: str, port: int) -> web.AppRunner:
    """Start serving on ``host:port``; the caller awaits ``runner.cleanup()`` to stop."""
    runner = web.AppRunner(receiver.app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def _run(host: str, port: int, bootstrap: str, topic: str, attribute_map: AttributeMap) -> None:
    publisher = KafkaPublisher(bootstrap, topic)
    await publisher.start()
    receiver = OtlpReceiver(publisher, attribute_map)
    runner = await serve(receiver, host, port)
    click.echo(f"OTLP/HTTP receiver on http://{host}:{port}/v1/traces -> {topic} at {bootstrap}", err=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await publisher.close()


@click.command("otlp-receiver")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for all).")
@click.option("--port", default=4318, show_default=True, type=int,
              help="Port (4318 is OTLP/HTTP's standard).")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers (host:port).")
@click.option("--topic", default=None,
              help="Topic for request events [default: setting topics.requests, llm.requests].")
@click.option("--model", "default_model", default=None,
              help="Model name for spans that carry none (vLLM V1 spans do not).")
@click.option("--replica-attributes", default=None,
              help="Resource attributes naming the replica, in order "
                   "[default: service.instance.id,k8s.pod.name,host.name].")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file.")
def otlp_receiver_command(host: str, port: int, bootstrap: str | None, topic: str | None,
                          default_model: str | None, replica_attributes: str | None,
                          config_path: str | None) -> None:
    """Accept OTLP/HTTP trace exports (vLLM --otlp-traces-endpoint) and publish request events."""
    settings = load_settings(config_path)
    bootstrap = bootstrap or settings.kafka.bootstrap
    if not bootstrap:
        raise click.UsageError("no Kafka to publish to: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP "
                               "(`skewwatch broker` starts one)")
    overrides: dict[str, Any] = {}
    if default_model:
        overrides["default_model"] = default_model
    if replica_attributes:
        overrides["replica_keys"] = as_sequence(replica_attributes)
    attribute_map = DEFAULT_ATTRIBUTE_MAP.with_overrides(overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(host, port, bootstrap, topic or settings.topics.requests, attribute_map))
