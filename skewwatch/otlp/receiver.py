"""``skewwatch otlp-receiver``: an OTLP/HTTP trace endpoint that publishes request events.

Point vLLM's ``--otlp-traces-endpoint http://HOST:4318/v1/traces`` here and
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
  (or does not gunzip); 413 above ``[otlp_receiver] max_body_bytes`` as received (4 MiB) or when
  a gzip body expands beyond ``max_decompressed_bytes`` (16 MiB); 415 for another content type
  or encoding (answered in protobuf); 503 with ``Retry-After`` while Kafka is unreachable or
  backed up, so the sender's OTLP exporter retries instead of us buffering without bound.
* ``GET /healthz`` (liveness) and ``GET /readyz`` (Kafka reachable and the buffers not backed up).
* Who may send (skewwatch.web_auth): with a token configured (``[otlp_receiver] token_file`` or
  ``$SKEWWATCH_OTLP_TOKEN``) every request but ``/healthz`` needs ``Authorization: Bearer <token>``
  (vLLM: ``OTEL_EXPORTER_OTLP_TRACES_HEADERS=Authorization=Bearer%20<token>``); without one the
  receiver only listens on loopback (``--insecure-no-auth`` overrides). ``tls_certfile`` /
  ``tls_keyfile`` serve HTTPS.
* A refused request is logged once per status per ``log_interval_s`` (30 s), with a count.

Dead letters (seed rule: every rejected input lands on ``llm.dead-letter`` with its bytes and the
reason, and is counted): each rejected span is published there as a ``dead-letter.v1`` record,
keyed by its replica when the resource names one, holding that span alone as an
``ExportTraceServiceRequest`` (its resource and scope kept, in the request's encoding, so a fixed
copy can be POSTed again) and the reason (``wrong_type``, ``missing_field``, ``out_of_range``...).
A body that is not OTLP (400, ``malformed_otlp``) is dead-lettered as received (still compressed).

A dead letter is never larger than the request that caused it: the original bytes stored for one
request never exceed its body as received, nor ``dead_letter_max_bytes`` (256 KiB) per record.
When the spans one by one would (a gzip request, or a large resource repeated per span), one
record holds the request's body as received, capped (``value_truncated`` and ``value_bytes`` say
so), with every span's reason and ``origin.whole_request: true``. Without this cap a 15 KB gzip
request became a 5.6 MB dead letter: an unauthenticated sender could fill the broker's disk.

``source_topic`` is ``otlp-http:/v1/traces``, ``partition`` and ``offset`` are 0, and ``origin``
says what came in (content type and encoding of the value, the peer address, the span's position
in the export). Spans that are not inference requests are skipped and counted, never
dead-lettered; 413/415/503 refuse the request before its body is interpreted (the sender is told,
nothing is dead-lettered). ``/stats`` counts
``dead_letters_published`` and ``rejected_<reason_code>``.

>>> receiver = OtlpReceiver(ListPublisher())
>>> sorted({r.resource.canonical for r in receiver.app.router.routes()})
['/healthz', '/readyz', '/stats', '/v1/traces']
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import signal
import socket
import ssl
import time
import zlib
from collections import Counter
from collections.abc import Mapping
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

from skewwatch.broker_watch import BrokerWatch
from skewwatch.cli import command_settings
from skewwatch.config import LimitSettings, Settings
from skewwatch.errors import ConfigProblem, KafkaUnreachable, SkewwatchError
from skewwatch.kafka_client import check_kafka, require_bootstrap
from skewwatch.kafka_security import client_options, describe_listener, describe_tls_error
from skewwatch.listen import bind_socket
from skewwatch.logs import RateLimiter, logging_options, setup_logging, skewwatch_version
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
from skewwatch.web_auth import AccessPolicy, auth_middleware, check_bind, is_loopback, load_token

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 4 * 1024 * 1024  # as received ([otlp_receiver] max_body_bytes)
MAX_DECOMPRESSED_BYTES = 16 * 1024 * 1024  # the Collector's default max_request_body_size is 20 MiB
DEAD_LETTER_MAX_BYTES = 256 * 1024
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
    """Publishes through two :class:`~skewwatch.client.bounded_producer.BoundedProducer` (never blocks):
    request events to ``topic``, dead letters to ``dead_letter_topic``."""

    def __init__(self, bootstrap: str, topic: str, *, dead_letter_topic: str = "llm.dead-letter",
                 max_buffered: int = 10_000, client_options: Mapping[str, Any] | None = None,
                 watch: BrokerWatch | None = None) -> None:
        from skewwatch.client.bounded_producer import BoundedProducer

        security = dict(client_options or {})  # TLS / SASL (skewwatch.kafka_security)
        self.watch = watch
        self.producer = BoundedProducer(bootstrap, topic, max_buffered=max_buffered,
                                        client_id="skewwatch-otlp-receiver", producer_options=security)
        # a dead letter holds up to 4 MiB of original bytes, base64: above aiokafka's 1 MiB default
        self.dead_letters = BoundedProducer(
            bootstrap, dead_letter_topic, max_buffered=max_buffered, client_id="skewwatch-otlp-receiver-dlq",
            producer_options={"max_request_size": DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES, **security})

    def ready(self) -> bool:
        # Refuse (503) rather than fill a buffer past half: the sender retries, nothing is dropped. A
        # broker the watch cannot reach is refused at once (the producers would only buffer).
        if self.watch is not None and not self.watch.reachable:
            return False
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


class TooLarge(SkewwatchError, ValueError):
    """A gzip body that expands beyond the decompressed-size limit."""


def _decompress_gzip(body: bytes, limit: int) -> bytes:
    """gunzip with a size cap (a small gzip body can expand to gigabytes)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = decompressor.decompress(body, limit + 1)
    if len(out) > limit:
        raise TooLarge(f"gzip body expands beyond {limit} bytes")
    if not decompressor.eof:
        raise ValueError("gzip body is truncated")
    return out


class OtlpReceiver:
    """The aiohttp application; counters in :attr:`stats` (also served at ``GET /stats``).

    ``max_body_bytes``: a body as received; ``max_decompressed_bytes``: what a gzip body may expand
    to; ``dead_letter_max_bytes``: original bytes one dead letter may hold. ``policy``: who may call
    (skewwatch.web_auth; default: loopback, no token).
    """

    def __init__(self, publisher: EventPublisher, attribute_map: AttributeMap = DEFAULT_ATTRIBUTE_MAP, *,
                 limits: LimitSettings | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
                 dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES, max_events_per_message: int = 1000,
                 policy: AccessPolicy | None = None, log_interval_s: float = 30.0) -> None:
        if max_events_per_message < 1:
            raise ValueError(f"max_events_per_message must be >= 1, got {max_events_per_message}")
        self.publisher = publisher
        self.attribute_map = attribute_map
        self.limits = limits or LimitSettings()
        self.max_body_bytes = max_body_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.dead_letter_max_bytes = dead_letter_max_bytes
        # as the worker's OTLP stage (setting otlp.max_events_per_message): ~250 B an event, far below the
        # worker's 1 MiB message limit however large the export
        self.max_events_per_message = max_events_per_message
        self.stats: Counter[str] = Counter()
        self._log_limit = RateLimiter(log_interval_s)
        policy = policy or AccessPolicy(None, beyond_loopback=False, open_writes_without_token=True)
        # auto_decompress off: aiohttp would gunzip without a size cap and refuse unknown encodings
        # with a 400 before the handler could answer the spec's 415.
        self.app = web.Application(client_max_size=max_body_bytes, handler_args={"auto_decompress": False},
                                   middlewares=[auth_middleware(policy)])
        self.app.router.add_post("/v1/traces", self.handle_traces)
        self.app.router.add_get("/stats", self.handle_stats)
        self.app.router.add_get("/healthz", self.handle_healthz)
        self.app.router.add_get("/readyz", self.handle_readyz)

    async def handle_stats(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        ready = self.publisher.ready()
        return web.json_response({"status": "ready" if ready else "not ready (Kafka unreachable or backed up)"},
                                 status=200 if ready else 503)

    def _respond(self, message: Message, media_type: str, status: int = 200,
                 headers: dict[str, str] | None = None) -> web.Response:
        if media_type == JSON:
            body = json_format.MessageToJson(message, indent=None).encode()
        else:
            body = message.SerializeToString()
        return web.Response(body=body, status=status, content_type=media_type, headers=headers)

    def _error(self, status: int, text: str, media_type: str,
               headers: dict[str, str] | None = None, peer: str | None = None) -> web.Response:
        """The OTLP/HTTP failure answer: a google.rpc.Status in the request's encoding. Logged once per
        status per interval with the number held back: a sender retrying a bad request costs no flood."""
        self.stats[f"http_{status}"] += 1
        held = self._log_limit.hit(status)
        if held is not None:
            more = f" ({held} more {status} answers in the last {self._log_limit.interval_s:g} s)" if held else ""
            log.warning("OTLP request from %s answered %d: %s%s", peer or "?", status, text, more)
        code = _GRPC_UNAVAILABLE if status == 503 else _GRPC_INVALID_ARGUMENT
        return self._respond(Status(code=code, message=text), media_type if media_type in (JSON, PROTOBUF)
                             else PROTOBUF, status, headers)

    def _dead_letter(self, key: bytes | None, value: bytes, rejects: list[Rejection],
                     origin: dict[str, Any]) -> None:
        for reject in rejects:
            self.stats[f"rejected_{reject.reason_code}"] += 1
        record = dead_letter_record(source_topic=DEAD_LETTER_SOURCE, partition=0, offset=0, key=key, value=value,
                                    rejects=rejects, ts=time.time(), origin=origin,
                                    max_value_bytes=self.dead_letter_max_bytes)
        self.publisher.publish_dead_letter(key, record)
        self.stats["dead_letters_published"] += 1

    def _malformed(self, request: web.Request, received: bytes, reason: str, media_type: str,
                   content_encoding: str) -> web.Response:
        """400 for a body that is not OTLP, after dead-lettering it as received (capped)."""
        self._dead_letter(None, received, [Rejection.message_level(MALFORMED_OTLP, reason)],
                          {"protocol": "otlp-http", "content_type": media_type,
                           "content_encoding": content_encoding, "peer": request.remote, "whole_request": True})
        return self._error(400, reason, media_type, peer=request.remote)

    async def handle_traces(self, request: web.Request) -> web.Response:
        media_type = _media_type(request.headers.get("Content-Type", ""))
        if media_type not in (PROTOBUF, JSON):
            return self._error(415, f"unsupported Content-Type {media_type or '(none)'!r}: send "
                                    f"{PROTOBUF} or {JSON}", PROTOBUF, peer=request.remote)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            return self._error(415, f"unsupported Content-Encoding {encoding!r}: send gzip or none",
                               media_type, peer=request.remote)
        try:
            received = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._error(413, f"body larger than {self.max_body_bytes} bytes", media_type, peer=request.remote)
        # before interpreting the body: a refused request (503) is retried by the sender, so
        # nothing of it is dead-lettered yet
        if not self.publisher.ready():
            return self._error(503, "Kafka is not reachable or backed up; retry later", media_type,
                               {"Retry-After": _RETRY_AFTER_S}, peer=request.remote)
        body = received
        if encoding == "gzip":
            try:
                body = _decompress_gzip(received, self.max_decompressed_bytes)
            except TooLarge as exc:  # refused before it is interpreted: nothing is dead-lettered
                return self._error(413, str(exc), media_type, peer=request.remote)
            except (ValueError, zlib.error, gzip.BadGzipFile) as exc:
                return self._malformed(request, received, f"Content-Encoding gzip but the body does not gunzip: "
                                       f"{exc}", media_type, "gzip")

        wire_encoding: Literal["otlp_proto", "otlp_json"] = "otlp_json" if media_type == JSON else "otlp_proto"
        try:  # an empty body is an empty export (a valid zero-length protobuf), in either encoding
            export = parse_export_request(body, wire_encoding) if body else ExportTraceServiceRequest()
        except OtlpDecodeError as exc:
            return self._malformed(request, received, str(exc), media_type, encoding)
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
        if rejected:
            self._dead_letter_spans(request, export, rejected, received, media_type, encoding, wire_encoding)
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

    def _dead_letter_spans(self, request: web.Request, export: ExportTraceServiceRequest,
                           rejected: list[tuple[int, Rejection]], received: bytes, media_type: str,
                           encoding: str, wire_encoding: Literal["otlp_proto", "otlp_json"]) -> None:
        """One dead letter per rejected span, each holding that span alone, while they fit the request's
        own size; else one dead letter holding the request as received (capped), with every reason."""
        singles = span_requests(export, [position for position, _ in rejected])
        encoded = [encode_export_request(singles[position], wire_encoding) for position, _ in rejected]
        budget = min(len(received), self.dead_letter_max_bytes * len(encoded))
        if sum(map(len, encoded)) <= budget and max(map(len, encoded)) <= self.dead_letter_max_bytes:
            for (position, rejection), value in zip(rejected, encoded, strict=True):
                single = singles[position]
                replica = self.attribute_map.replica_of(
                    attributes_to_dict(single.resource_spans[0].resource.attributes))
                self._dead_letter(None if replica is None else replica.encode(), value,
                                  [Rejection(rejection.reason_code, rejection.reason, 0)],
                                  {"protocol": "otlp-http", "content_type": media_type,
                                   "content_encoding": "identity", "peer": request.remote, "span_index": position})
            return
        self._dead_letter(None, received, [Rejection(r.reason_code, f"span {position}: {r.reason}", 0)
                                           for position, r in rejected],
                          {"protocol": "otlp-http", "content_type": media_type, "content_encoding": encoding,
                           "peer": request.remote, "whole_request": True,
                           "span_indexes": [position for position, _ in rejected]})


async def serve(receiver: OtlpReceiver, host: str, port: int, *, sock: socket.socket | None = None,
                ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    """Start serving on ``host:port`` (or on ``sock``, already bound); the caller awaits ``runner.cleanup()``."""
    runner = web.AppRunner(receiver.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = (web.SockSite(runner, sock, ssl_context=ssl_context) if sock is not None
            else web.TCPSite(runner, host, port, ssl_context=ssl_context))
    await site.start()
    return runner


def server_tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """HTTPS from ``[otlp_receiver] tls_certfile``/``tls_keyfile`` (both or neither); None for plain HTTP."""
    if not certfile and not keyfile:
        return None
    if not (certfile and keyfile):
        raise ConfigProblem("otlp_receiver.tls_certfile and tls_keyfile go together: give both, or neither")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigProblem(f"otlp_receiver.tls_certfile/tls_keyfile: cannot load "
                            f"({describe_tls_error(exc)})") from None
    return context


async def _run(sock: socket.socket, ssl_context: ssl.SSLContext | None, bootstrap: str, topic: str,
               dead_letter_topic: str, attribute_map: AttributeMap, settings: Settings, policy: AccessPolicy) -> None:
    config = settings.otlp_receiver
    health = settings.health
    watch = BrokerWatch(bootstrap, settings.kafka, interval_s=health.probe_interval_s,
                        timeout_s=health.probe_timeout_s, client_id="skewwatch-otlp-receiver-probe")
    publisher = KafkaPublisher(bootstrap, topic, dead_letter_topic=dead_letter_topic,
                               client_options=client_options(settings.kafka), watch=watch)
    receiver = OtlpReceiver(publisher, attribute_map, limits=settings.limits,
                            max_events_per_message=settings.otlp.max_events_per_message,
                            max_body_bytes=config.max_body_bytes, max_decompressed_bytes=config.max_decompressed_bytes,
                            dead_letter_max_bytes=config.dead_letter_max_bytes, policy=policy,
                            log_interval_s=config.log_interval_s)
    runner = await serve(receiver, config.host, config.port, sock=sock, ssl_context=ssl_context)
    scheme = "https" if ssl_context is not None else "http"
    host, port = sock.getsockname()[:2]
    log.info("skewwatch otlp-receiver %s: listening on %s://%s:%s/v1/traces (%s) -> %s at %s (dead letters -> %s)",
             skewwatch_version(), scheme, host, port, policy.describe(), topic,
             describe_listener(bootstrap, settings.kafka), dead_letter_topic)
    watching = asyncio.create_task(watch.run())
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # a clean stop (flush, close) and exit code 0
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    try:
        await publisher.start()
        await stop.wait()
    finally:
        watch.stop()
        await runner.cleanup()
        await publisher.close()
        await watching


@click.command("otlp-receiver")
@click.option("--host", default=None,
              help="Address to listen on [default: setting otlp_receiver.host, 127.0.0.1]; beyond loopback a "
                   "token is required.")
@click.option("--port", default=None, type=click.IntRange(0, 65535),
              help="Port [default: setting otlp_receiver.port, 4318, OTLP/HTTP's standard; 0: any free port, "
                   "logged at start].")
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
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the bearer token senders must present [default: setting "
                   "otlp_receiver.token_file, else $SKEWWATCH_OTLP_TOKEN].")
@click.option("--insecure-no-auth", is_flag=True,
              help="Allow listening beyond loopback without a token: anyone who reaches the port may send.")
@click.option("--tls-cert", "tls_certfile", type=click.Path(dir_okay=False), default=None,
              help="Serve HTTPS with this certificate chain (PEM) [setting otlp_receiver.tls_certfile].")
@click.option("--tls-key", "tls_keyfile", type=click.Path(dir_okay=False), default=None,
              help="... and this private key (PEM) [setting otlp_receiver.tls_keyfile].")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file.")
@logging_options
def otlp_receiver_command(host: str | None, port: int | None, bootstrap: str | None, topic: str | None,
                          dead_letter_topic: str | None, default_model: str | None,
                          replica_attributes: str | None, token_file: str | None, insecure_no_auth: bool,
                          tls_certfile: str | None, tls_keyfile: str | None, config_path: str | None,
                          loglevel: str, log_format: str) -> None:
    """Accept OTLP/HTTP trace exports (vLLM --otlp-traces-endpoint) and publish request events."""
    setup_logging(loglevel, log_format)
    settings = command_settings(config_path)
    bootstrap = require_bootstrap(bootstrap, settings, "to publish to")
    config = settings.otlp_receiver
    config.host = host or config.host
    config.port = config.port if port is None else port
    config.token_file = token_file or config.token_file
    config.tls_certfile = tls_certfile or config.tls_certfile
    config.tls_keyfile = tls_keyfile or config.tls_keyfile
    overrides: dict[str, Any] = {}
    if default_model:
        overrides["default_model"] = default_model
    if replica_attributes:
        overrides["replica_keys"] = as_sequence(replica_attributes)
    try:
        attribute_map = DEFAULT_ATTRIBUTE_MAP.with_overrides(overrides)
    except ValueError as exc:
        raise ConfigProblem(str(exc)) from None
    token = load_token(config.token_file, config.token_env, "otlp_receiver")
    check_bind(config.host, token, config.insecure_no_auth or insecure_no_auth, "the OTLP receiver", TOKEN_HINT)
    ssl_context = server_tls_context(config.tls_certfile, config.tls_keyfile)
    # a refused login or an untrusted certificate will not fix itself: one line, exit code 4; a broker
    # that does not answer yet is waited for (503 and /readyz say so)
    with contextlib.suppress(KafkaUnreachable):
        check_kafka(bootstrap, settings, timeout=5.0)
    sock = bind_socket(config.host, config.port, "the OTLP receiver")  # a busy port: one line, exit code 5
    policy = AccessPolicy(token, beyond_loopback=not is_loopback(config.host), open_writes_without_token=True,
                          token_hint=TOKEN_HINT)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(sock, ssl_context, bootstrap, topic or settings.topics.requests,
                         dead_letter_topic or settings.topics.dead_letter, attribute_map, settings, policy))


TOKEN_HINT = ("put one in a file named by [otlp_receiver] token_file (--token-file) or in $SKEWWATCH_OTLP_TOKEN")
