"""Which OpenTelemetry span attributes become which request-event fields: data, not code.

A vLLM fleet is watched by configuration alone. vLLM emits one span per
finished request; this module says, as a table, how such a span becomes one contract-v1
request event, so a new server or a renamed attribute is a config change, not a code change.

Where the names come from (checked against the sources, see docs/connect.md for links):

* vLLM (``vllm/tracing.py`` ``SpanAttributes``; span ``llm_request``, kind SERVER, start = arrival,
  end = finish): ``gen_ai.usage.prompt_tokens`` / ``gen_ai.usage.completion_tokens`` (the pre-1.0
  GenAI semconv names, now deprecated), ``gen_ai.latency.time_to_first_token``,
  ``gen_ai.latency.e2e``, ``gen_ai.latency.time_in_queue`` (all in **seconds**),
  ``gen_ai.request.id``, and on older vLLM versions ``gen_ai.response.model``. vLLM V1 does not put
  the model on the span (its own test has that assert commented out), so the model usually comes
  from a resource attribute (``OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=...``) or
  ``default_model``.
* OTel GenAI semantic conventions: ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id``; the server-side
  TTFT is a *metric* there (``gen_ai.server.time_to_first_token``, seconds) and is also accepted
  as a span attribute of that name.
* SGLang (``sglang/srt/tracing/trace.py``): one root span per request named ``"Req <rid[:8]>"``
  with the attribute ``rid``, and child "slice" spans per stage; stock SGLang puts no token counts
  on spans, so its spans are skipped as ``not_inference`` unless a deployment adds them (the
  ``meta_info`` names ``prompt_tokens`` / ``completion_tokens`` / ``e2e_latency`` are accepted,
  lowest priority). ``rid`` is used as the request id.
* skewwatch's own names (``skewwatch.batch_size``, ``skewwatch.batch_capacity``,
  ``skewwatch.queue_length``, ``skewwatch.kv_cache_hit_rate``, ``skewwatch.cuda_error``) let a
  server with custom instrumentation send every contract field through OTLP.

A span that is not an inference request (no token attributes, a CLIENT span, no model) is
*skipped* and counted by reason, never dead-lettered: a Collector carries many other spans.
A span that claims to be one but cannot be mapped (an attribute of the wrong type, no replica
identity, no end time) is *rejected* with a reason a person can act on.

>>> view = SpanView(attributes={"gen_ai.usage.prompt_tokens": 12, "gen_ai.usage.completion_tokens": 30,
...                             "gen_ai.latency.e2e": 0.25, "gen_ai.request.id": "cmpl-1"},
...                 resource={"service.instance.id": "vllm-0", "gen_ai.request.model": "llama"},
...                 start_ns=1_700_000_000_000_000_000, end_ns=1_700_000_000_300_000_000)
>>> out = DEFAULT_ATTRIBUTE_MAP.map_span(view)
>>> out.event["replica"], out.event["model"], out.event["latency_ms"], out.event["ts"]
('vllm-0', 'llama', 250.0, 1700000000.3)
>>> DEFAULT_ATTRIBUTE_MAP.map_span(SpanView(attributes={"http.route": "/health"})).skip_reason
'not_inference'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

SECONDS_TO_MS = 1000.0

# OTLP span kinds by their proto enum numbers (opentelemetry.proto.trace.v1.Span.SpanKind).
SPAN_KINDS: dict[str, int] = {
    "UNSPECIFIED": 0,
    "INTERNAL": 1,
    "SERVER": 2,
    "CLIENT": 3,
    "PRODUCER": 4,
    "CONSUMER": 5,
}

ValueKind = Literal["int", "float", "str", "str_or_int"]

# Why a span was skipped (label values of a skipped-spans counter; never rename, only add).
SKIP_REASONS: tuple[str, ...] = (
    "span_kind",  # a CLIENT/PRODUCER/CONSUMER span: the caller's view, not the server's
    "not_inference",  # no token-count attribute at all: some other span on the same pipeline
    "incomplete_tokens",  # one token count without the other (e.g. an embeddings request)
    "no_model",  # no model on the span, the resource, or default_model
)


@dataclass(frozen=True, slots=True)
class FieldRule:
    """One event field and the span attributes that can carry it, first present wins."""

    field: str  # contract field name
    keys: tuple[str, ...]  # span attribute names, in priority order
    kind: ValueKind
    scale: float = 1.0  # multiply numeric values (seconds -> milliseconds: 1000)


# The default table. Order inside ``keys``: the current semconv name first, then the deprecated
# or engine-specific ones; a span carrying both forms must carry the same value anyway.
DEFAULT_FIELD_RULES: tuple[FieldRule, ...] = (
    FieldRule("prompt_tokens",
              ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "prompt_tokens"), "int"),
    FieldRule("completion_tokens",
              ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "completion_tokens"), "int"),
    FieldRule("latency_ms", ("gen_ai.latency.e2e", "e2e_latency"), "float", SECONDS_TO_MS),
    FieldRule("ttft_ms", ("gen_ai.latency.time_to_first_token", "gen_ai.server.time_to_first_token"),
              "float", SECONDS_TO_MS),
    FieldRule("model", ("gen_ai.response.model", "gen_ai.request.model"), "str"),
    FieldRule("request_id", ("gen_ai.request.id", "gen_ai.response.id", "rid"), "str_or_int"),
    FieldRule("batch_size", ("skewwatch.batch_size",), "int"),
    FieldRule("batch_capacity", ("skewwatch.batch_capacity",), "int"),
    FieldRule("queue_length", ("skewwatch.queue_length",), "int"),
    FieldRule("kv_cache_hit_rate", ("skewwatch.kv_cache_hit_rate",), "float"),
    FieldRule("cuda_error", ("skewwatch.cuda_error",), "str_or_int"),
)

# Mapped but not emitted while the contract has no field for it: vLLM's queue wait (seconds).
# Contract v1 only has ``queue_length`` (a count); see the report / docs for the proposed
# optional ``queue_time_ms``. Listed here so enabling it is a one-line change.
QUEUE_TIME_RULE = FieldRule("queue_time_ms", ("gen_ai.latency.time_in_queue",), "float", SECONDS_TO_MS)

DEFAULT_REPLICA_KEYS: tuple[str, ...] = ("service.instance.id", "k8s.pod.name", "host.name")
DEFAULT_MODEL_RESOURCE_KEYS: tuple[str, ...] = ("gen_ai.request.model", "gen_ai.response.model",
                                                "skewwatch.model")
DEFAULT_SPAN_KINDS: frozenset[int] = frozenset({SPAN_KINDS["UNSPECIFIED"], SPAN_KINDS["INTERNAL"],
                                                SPAN_KINDS["SERVER"]})
ERROR_TYPE_KEY = "error.type"  # semconv: present when the operation ended in an error

_TOKEN_FIELDS = ("prompt_tokens", "completion_tokens")


@dataclass(frozen=True, slots=True)
class SpanView:
    """The parts of one OTLP span the mapping needs, as plain data (no protobuf here)."""

    attributes: Mapping[str, Any]
    resource: Mapping[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    kind: int = SPAN_KINDS["SERVER"]
    is_error: bool = False  # span status code ERROR
    span_id: str = ""  # hex, used as request_id when the span names none


@dataclass(frozen=True, slots=True)
class SpanOutcome:
    """Exactly one of: an event, a skip reason, or a rejection (reason code + text)."""

    event: dict[str, Any] | None = None
    skip_reason: str | None = None
    reject_code: str | None = None
    reject_reason: str | None = None


def _convert(value: Any, rule: FieldRule, key: str) -> tuple[Any, str | None]:
    """(converted value, None) or (None, actionable error text)."""
    if rule.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, f"attribute {key}: expected an integer, got {value!r}"
        if isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                return None, f"attribute {key}: expected an integer, got {value!r}"
            value = int(value)
        return int(value * rule.scale) if rule.scale != 1.0 else value, None
    if rule.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, f"attribute {key}: expected a number, got {value!r}"
        return float(value) * rule.scale, None
    if rule.kind == "str_or_int" and isinstance(value, int) and not isinstance(value, bool):
        return (value if rule.field == "cuda_error" else str(value)), None
    if not isinstance(value, str) or not value:
        return None, f"attribute {key}: expected a non-empty string, got {value!r}"
    return value, None


@dataclass(frozen=True, slots=True)
class AttributeMap:
    """The mapping table plus where replica and model identity come from."""

    fields: tuple[FieldRule, ...] = DEFAULT_FIELD_RULES
    replica_keys: tuple[str, ...] = DEFAULT_REPLICA_KEYS  # resource attributes, first present wins
    model_resource_keys: tuple[str, ...] = DEFAULT_MODEL_RESOURCE_KEYS  # after the span's own
    default_model: str | None = None  # last resort, e.g. `skewwatch otlp-receiver --model`
    span_kinds: frozenset[int] = DEFAULT_SPAN_KINDS

    def with_overrides(self, overrides: Mapping[str, Any]) -> AttributeMap:
        """A copy changed by a config mapping (TOML-friendly), e.g.

        ``{"replica_keys": ["k8s.pod.name"], "default_model": "llama",
        "span_kinds": ["SERVER"], "fields": {"prompt_tokens": ["my.tokens.in"]}}``. A ``fields``
        entry replaces that field's attribute list; an unknown key raises ValueError.

        >>> m = DEFAULT_ATTRIBUTE_MAP.with_overrides({"fields": {"ttft_ms": ["my.ttft_s"]}})
        >>> [r.keys for r in m.fields if r.field == "ttft_ms"]
        [('my.ttft_s',)]
        """
        changed: dict[str, Any] = {}
        for name, value in overrides.items():
            if name in ("replica_keys", "model_resource_keys"):
                changed[name] = as_sequence(value)  # a TOML list or an env/CLI "a,b,c" string
            elif name == "default_model":
                changed[name] = str(value) if value else None
            elif name == "span_kinds":
                try:
                    changed[name] = frozenset(SPAN_KINDS[str(k).upper().removeprefix("SPAN_KIND_")]
                                              for k in as_sequence(value))
                except KeyError as exc:
                    raise ValueError(f"otlp span_kinds: unknown kind {exc.args[0]!r} "
                                     f"(known: {', '.join(SPAN_KINDS)})") from None
            elif name == "fields":
                rules = {r.field: r for r in self.fields}
                for field_name, keys in value.items():
                    if field_name not in rules:
                        raise ValueError(f"otlp fields.{field_name}: not a mapped field "
                                         f"(known: {', '.join(rules)})")
                    rules[field_name] = replace(rules[field_name], keys=as_sequence(keys))
                changed[name] = tuple(rules.values())
            else:
                raise ValueError(f"otlp.{name}: unknown setting (known: replica_keys, model_resource_keys,"
                                 " default_model, span_kinds, fields)")
        return replace(self, **changed)

    def replica_of(self, resource: Mapping[str, Any]) -> str | None:
        """The replica id a resource names (first of ``replica_keys`` present), or None.

        >>> DEFAULT_ATTRIBUTE_MAP.replica_of({"host.name": "n1", "k8s.pod.name": "vllm-0"})
        'vllm-0'
        """
        replica = next((resource[k] for k in self.replica_keys
                        if isinstance(resource.get(k), str | int) and resource[k] != ""), None)
        return None if replica is None else str(replica)

    def _first(self, rule: FieldRule, attributes: Mapping[str, Any]) -> tuple[str | None, Any]:
        for key in rule.keys:
            if key in attributes and attributes[key] is not None:
                return key, attributes[key]
        return None, None

    def map_span(self, span: SpanView) -> SpanOutcome:
        """One span -> one v1 event (batch fields left out when the span has none), or why not."""
        if span.kind not in self.span_kinds:
            return SpanOutcome(skip_reason="span_kind")
        rules = {r.field: r for r in self.fields}
        token_keys = [self._first(rules[f], span.attributes)[0] for f in _TOKEN_FIELDS if f in rules]
        if not any(token_keys):
            return SpanOutcome(skip_reason="not_inference")
        if not all(token_keys):
            return SpanOutcome(skip_reason="incomplete_tokens")

        event: dict[str, Any] = {}
        for rule in self.fields:
            key, raw = self._first(rule, span.attributes)
            if key is None:
                continue
            value, error = _convert(raw, rule, key)
            if error is not None:
                return SpanOutcome(reject_code="wrong_type", reject_reason=f"span {span.span_id}: {error}")
            event[rule.field] = value

        if "model" not in event:
            model = next((span.resource[k] for k in self.model_resource_keys
                          if isinstance(span.resource.get(k), str) and span.resource[k]), None)
            model = model or self.default_model
            if model is None:
                return SpanOutcome(skip_reason="no_model")
            event["model"] = model

        replica = self.replica_of(span.resource)
        if replica is None:
            return SpanOutcome(
                reject_code="missing_field",
                reject_reason=(f"span {span.span_id}: replica: none of the resource attributes "
                               f"{', '.join(self.replica_keys)} is set; start the server with "
                               "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<replica id>"))
        event["replica"] = replica

        if span.end_ns <= 0:
            return SpanOutcome(reject_code="missing_field",
                               reject_reason=f"span {span.span_id}: endTimeUnixNano is not set")
        seconds, nanos = divmod(span.end_ns, 1_000_000_000)
        event["ts"] = seconds + nanos / 1e9  # event time = request finished; split keeps the float exact
        if "latency_ms" not in event:
            if span.start_ns <= 0 or span.end_ns < span.start_ns:
                return SpanOutcome(
                    reject_code="out_of_range",
                    reject_reason=(f"span {span.span_id}: no gen_ai.latency.e2e and the span's "
                                   f"end ({span.end_ns}) is before its start ({span.start_ns})"))
            event["latency_ms"] = (span.end_ns - span.start_ns) / 1e6
        if "request_id" not in event:
            event["request_id"] = span.span_id or f"span-{span.end_ns}"
        event["status"] = "error" if span.is_error or ERROR_TYPE_KEY in span.attributes else "ok"
        return SpanOutcome(event=event)


DEFAULT_ATTRIBUTE_MAP = AttributeMap()


def attribute_table(amap: AttributeMap = DEFAULT_ATTRIBUTE_MAP) -> list[tuple[str, str, str]]:
    """(event field, span attributes in priority order, unit conversion): the docs' table."""
    return [(r.field, ", ".join(r.keys), "s -> ms" if r.scale == SECONDS_TO_MS else "")
            for r in amap.fields]


def as_sequence(value: str | Sequence[str]) -> tuple[str, ...]:
    """A comma-separated string (env/CLI) or a list (TOML) as a tuple of names.

    >>> as_sequence("k8s.pod.name, host.name"), as_sequence(["a"])
    (('k8s.pod.name', 'host.name'), ('a',))
    """
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(str(v) for v in value)
