"""``skewwatch otlp-receiver``: an OTLP/HTTP trace endpoint that publishes request events.

Issue 7 ("OTLP in"): point vLLM's ``--otlp-traces-endpoint http://HOST:4318/v1/traces`` here and
its per-request spans become contract-v1 events on ``llm.requests``, keyed by replica, as
``{"events": [...]}`` batches (per replica per export, at most ``otlp.max_events_per_message``
events each), with no Collector needed.

Answers per the OTLP/HTTP specification (opentelemetry.io/docs/specs/otlp/#otlphttp):

* ``POST /v1/traces`` with ``Content-Type: application/x-protobuf`` or ``application/json``
  (``Content-Encoding: gzip`` accepted); the response uses the request's content type.
* 200 with an ``ExportTraceServiceResponse``; ``partial_success.rejected_spans`` counts the spans
  that looked like requests but could not be mapped or failed the worker's validation, and
  ``error_message`` quotes the first reasons. Spans that are not inference requests are accepted
  and ignored (counted in ``/stats``), as they are not errors of the sender.
* Errors carry a ``google.rpc.Status`` body (protobuf for a protobuf request, JSON for a JSON
  one; ``code`` INVALID_ARGUMENT, or UNAVAILABLE for 503): 400 when the body cannot be decoded
  (or does not gunzip); 413 above the body limit; 415 for another content type or encoding
  (answered in protobuf); 503 with ``Retry-After`` while Kafka is unreachable or backed up, so
  the sender's OTLP exporter retries instead of us buffering without bound.

Dead letters (seed rule: every rejected input lands on ``llm.dead-letter`` with its bytes and the
reason, and is counted): each rejected span is published there as a ``dead-letter.v1`` record,
keyed by its replica when the resource names one, holding that span alone as an
``ExportTraceServiceRequest`` (its resource and scope kept, in the request's encoding, so a fixed
copy can be POSTed again) and the reason (``wrong_type``, ``missing_field``, ``out_of_range``...).
A body that is not OTLP (400, ``malformed_otlp``) is dead-lettered whole: decompressed, or as
received when it does not gunzip. ``source_topic`` is ``otlp-http:/v1/traces``, ``partition`` and
``offset`` are 0, and ``origin`` says what came in (content type and encoding of the value, the
peer address, the span's position in the export). Spans that are not inference requests are
skipped and counted, never dead-lettered; 413/415/503 refuse the request before its body is
interpreted (the sender is told, nothing is dead-lettered). ``/stats`` counts
``dead_letters_published`` and ``rejected_<reason_code>``.

>>> receiver = OtlpReceiver(ListPublisher())
>>> sorted({r.resource.canonical for r in receiver.app.router.routes()})
['/stats', '/v1/traces']
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import time
import zlib
from collections import Counter
from typing import Any, Literal, Protocol

import click
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from skewwatch.cli import command_settings
from skewwatch.config import LimitSettings, Settings
from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, AttributeMap, as_sequence
from skewwatch.otlp.decode import (
    MALFORMED_OTLP,
    OtlpDecodeError,
    attributes_to_dict,
    encode_by_replica,
    encode_export_request,
    parse_export_request,
    request_to_events,
    span_requests,
)
from skewwatch.schemas.dead_letter import DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES, dead_letter_record
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests import check_request_event

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 16 * 1024 * 1024  # decompressed; the Collector's default max_request_body_size is 20 MiB
_MAX_REASONS_SHOWN = 5
_RETRY_AFTER_S = "2"
_GRPC_INVALID_ARGUMENT = 3  # google.rpc.Code
_GRPC_UNAVAILABLE = 14
DEAD_LETTER_SOURCE = "otlp-http:/v1/traces"  # source_topic of the receiver's dead letters (not a topic)


class EventPublisher(Protocol):
    """Where mapped events go (one message per replica), and the dead letters of rejected input."""

    def ready(self) -> bool:
        """False while messages cannot be delivered (the receiver then answers 503)."""
        ...

    def publish(self, key: bytes, value: bytes) -> None:
        """Queue one request-events message; must not block."""
        ...

    def publish_dead_letter(self, key: bytes | None, value: bytes) -> None:
        """Queue one ``dead-letter.v1`` record; must not block."""
        ...


class ListPublisher:
    """An in-memory publisher (for tests and dry runs): keeps ``(key, value)`` pairs."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []
        self.dead_letters: list[tuple[bytes | None, bytes]] = []
        self.is_ready = True

    def ready(self) -> bool:
        return self.is_ready

    def publish(self, key: bytes, value: bytes) -> None:
        self.messages.append((key, value))

    def publish_dead_letter(self, key: bytes | None, value: bytes) -> None:
        self.dead_letters.append((key, value))


class KafkaPublisher:
    """Publishes through two :class:`~skewwatch.bounded_producer.BoundedProducer` (never blocks):
    request events to ``topic``, dead letters to ``dead_letter_topic``."""

    def __init__(self, bootstrap: str, topic: str, *, dead_letter_topic: str = "llm.dead-letter",
                 max_buffered: int = 10_000) -> None:
        from skewwatch.bounded_producer import BoundedProducer

        self.producer = BoundedProducer(bootstrap, topic, max_buffered=max_buffered,
                                        client_id="skewwatch-otlp-receiver")
        # a dead letter holds up to 4 MiB of original bytes, base64: above aiokafka's 1 MiB default
        self.dead_letters = BoundedProducer(
            bootstrap, dead_letter_topic, max_buffered=max_buffered, client_id="skewwatch-otlp-receiver-dlq",
            producer_options={"max_request_size": DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES})

    def ready(self) -> bool:
        # Refuse (503) rather than fill a buffer past half: the sender retries, nothing is dropped.
        return all(p.connected and p.buffered < p.max_buffered // 2 for p in (self.producer, self.dead_letters))

    def publish(self, key: bytes, value: bytes) -> None:
        self.producer.offer(key, value)

    def publish_dead_letter(self, key: bytes | None, value: bytes) -> None:
        self.dead_letters.offer(key, value)

    async def start(self) -> None:
        await self.producer.start()
        await self.dead_letters.start()

    async def close(self) -> None:
        await self.producer.close()
        await self.dead_letters.close()


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
                 limits: LimitSettings | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 max_events_per_message: int = 1000) -> None:
        if max_events_per_message < 1:
            raise ValueError(f"max_events_per_message must be >= 1, got {max_events_per_message}")
        self.publisher = publisher
        self.attribute_map = attribute_map
        self.limits = limits or LimitSettings()
        self.max_body_bytes = max_body_bytes
        # as the worker's OTLP stage (setting otlp.max_events_per_message): ~250 B an event, far below the
        # worker's 1 MiB message limit however large the export
        self.max_events_per_message = max_events_per_message
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
        """The OTLP/HTTP failure answer: a google.rpc.Status in the request's encoding."""
        self.stats[f"http_{status}"] += 1
        log.info("OTLP request answered %d: %s", status, text)
        code = _GRPC_UNAVAILABLE if status == 503 else _GRPC_INVALID_ARGUMENT
        return self._respond(Status(code=code, message=text), media_type if media_type in (JSON, PROTOBUF)
                             else PROTOBUF, status, headers)

    def _dead_letter(self, key: bytes | None, value: bytes, rejects: list[Rejection],
                     origin: dict[str, Any]) -> None:
        for reject in rejects:
            self.stats[f"rejected_{reject.reason_code}"] += 1
        record = dead_letter_record(source_topic=DEAD_LETTER_SOURCE, partition=0, offset=0, key=key, value=value,
                                    rejects=rejects, ts=time.time(), origin=origin)
        self.publisher.publish_dead_letter(key, record)
        self.stats["dead_letters_published"] += 1

    def _malformed(self, request: web.Request, body: bytes, reason: str, media_type: str,
                   content_encoding: str) -> web.Response:
        """400 for a body that is not OTLP, after dead-lettering it whole."""
        self._dead_letter(None, body, [Rejection.message_level(MALFORMED_OTLP, reason)],
                          {"protocol": "otlp-http", "content_type": media_type,
                           "content_encoding": content_encoding, "peer": request.remote})
        return self._error(400, reason, media_type)

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
        # before interpreting the body: a refused request (503) is retried by the sender, so
        # nothing of it is dead-lettered yet
        if not self.publisher.ready():
            return self._error(503, "Kafka is not reachable or backed up; retry later", media_type,
                               {"Retry-After": _RETRY_AFTER_S})
        if encoding == "gzip":
            try:
                body = _decompress_gzip(body, self.max_body_bytes)
            except (ValueError, zlib.error, gzip.BadGzipFile) as exc:
                return self._malformed(request, body, f"Content-Encoding gzip but the body does not gunzip: {exc}",
                                       media_type, "gzip")

        wire_encoding: Literal["otlp_proto", "otlp_json"] = "otlp_json" if media_type == JSON else "otlp_proto"
        try:  # an empty body is an empty export (a valid zero-length protobuf), in either encoding
            export = parse_export_request(body, wire_encoding) if body else ExportTraceServiceRequest()
        except OtlpDecodeError as exc:
            return self._malformed(request, body, str(exc), media_type, "identity")
        result = request_to_events(export, self.attribute_map)

        # per rejected span: (its position in the export, why), mapping problems and contract problems
        rejected: list[tuple[int, Rejection]] = [(r.event_index or 0, r) for r in result.rejections]
        valid: list[dict[str, Any]] = []
        for event, position in zip(result.events, result.event_spans, strict=True):
            problem = check_request_event(event, self.limits)  # contract v1.1: batch fields optional
            if problem is None:
                valid.append(event)
            else:
                rejected.append((position, Rejection(problem.reason_code,
                                                     f"request {event.get('request_id')}: {problem.reason}", 0)))
        rejected.sort(key=lambda item: item[0])
        reasons = [r.reason for _, r in rejected]
        singles = span_requests(export, [position for position, _ in rejected])
        for position, rejection in rejected:
            single = singles[position]
            replica = self.attribute_map.replica_of(attributes_to_dict(single.resource_spans[0].resource.attributes))
            self._dead_letter(None if replica is None else replica.encode(),
                              encode_export_request(single, wire_encoding),
                              [Rejection(rejection.reason_code, rejection.reason, 0)],
                              {"protocol": "otlp-http", "content_type": media_type, "content_encoding": "identity",
                               "peer": request.remote, "span_index": position})
        for key, value in encode_by_replica(valid, self.max_events_per_message):
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


async def serve(receiver: OtlpReceiver, host: str, port: int) -> web.AppRunner:
    """Start serving on ``host:port``; the caller awaits ``runner.cleanup()`` to stop."""
    runner = web.AppRunner(receiver.app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def _run(host: str, port: int, bootstrap: str, topic: str, dead_letter_topic: str,
               attribute_map: AttributeMap, settings: Settings) -> None:
    publisher = KafkaPublisher(bootstrap, topic, dead_letter_topic=dead_letter_topic)
    await publisher.start()
    receiver = OtlpReceiver(publisher, attribute_map, limits=settings.limits,
                            max_events_per_message=settings.otlp.max_events_per_message)
    try:
        runner = await serve(receiver, host, port)
    except OSError as exc:
        await publisher.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    port = runner.addresses[0][1] if runner.addresses else port  # the one picked for --port 0
    click.echo(f"OTLP/HTTP receiver on http://{host}:{port}/v1/traces -> {topic} at {bootstrap} "
               f"(dead letters -> {dead_letter_topic})", err=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await publisher.close()


@click.command("otlp-receiver")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for all).")
@click.option("--port", default=4318, show_default=True, type=click.IntRange(0, 65535),
              help="Port (4318 is OTLP/HTTP's standard; 0: any free port, printed at start).")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers (host:port).")
@click.option("--topic", default=None,
              help="Topic for request events [default: setting topics.requests, llm.requests].")
@click.option("--dead-letter-topic", default=None,
              help="Topic for rejected spans and bodies [default: setting topics.dead_letter, llm.dead-letter].")
@click.option("--model", "default_model", default=None,
              help="Model name for spans that carry none (vLLM V1 spans do not).")
@click.option("--replica-attributes", default=None,
              help="Resource attributes naming the replica, in order "
                   "[default: service.instance.id,k8s.pod.name,host.name].")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file.")
def otlp_receiver_command(host: str, port: int, bootstrap: str | None, topic: str | None,
                          dead_letter_topic: str | None, default_model: str | None,
                          replica_attributes: str | None, config_path: str | None) -> None:
    """Accept OTLP/HTTP trace exports (vLLM --otlp-traces-endpoint) and publish request events."""
    settings = command_settings(config_path)
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
        asyncio.run(_run(host, port, bootstrap, topic or settings.topics.requests,
                         dead_letter_topic or settings.topics.dead_letter, attribute_map, settings))
