"""The feature vector's fields, defined once: the one specification the JSON Schema, the
:class:`~skewwatch.schemas.feature_vector.FeatureVector` dataclass and the windows' feature columns
are made from.

One :class:`FeatureField` row per field of contract ``features.v1``, in the order the dataclass
declares them (and a record writes them): its name, JSON kind, whether ``null`` (unknown) is a value,
whether every record carries it, its range, unit and meaning. From these rows:

- :func:`features_schema` renders the JSON Schema; the shipped ``features.v1.json`` must equal it (a
  test checks; ``python -m skewwatch.schemas.feature_spec`` prints it);
- ``FeatureVector`` declares its attributes in the same order, with the type and the default each
  row implies (checked when it is defined: a field cannot be added to one and not the other);
- the windows build a vector from one column per row's name (``pipeline/window/feature_columns.py``),
  in :data:`FEATURE_NAMES` order.

Statistics of an empty window are ``None`` (unknown), never 0, except ``count``, ``rps`` and
``tokens_per_s``, which are genuinely 0 for a silent replica: those rows are not nullable.

>>> FIELDS_BY_NAME["latency_p99"].unit, FIELDS_BY_NAME["latency_p99"].annotation
('ms', 'float | None')
>>> features_schema()["required"]
['model', 'replica', 'window_start', 'window_end', 'count', 'v']
>>> features_schema()["properties"]["error_rate"]["maximum"]
1
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

FEATURES_SCHEMA_VERSION: Final = 1
# span of the recent_* fields: the newest 4 steps of 5 s of the window
RECENT_S: Final = 20.0

# "counts": an object of non-negative integers by name; "version": the record's schema version
FeatureKind = Literal["string", "number", "integer", "counts", "version"]
_PYTHON_TYPES: Final[dict[str, str]] = {
    "string": "str", "number": "float", "integer": "int", "counts": "dict[str, int]", "version": "int",
}


@dataclass(frozen=True, slots=True)
class FeatureField:
    """One field of the feature vector.

    ``required``: every record carries it (the JSON Schema's ``required``); in ``FeatureVector`` it
    has no default, except ``v``, whose default is the version this code writes. A field that is not
    required defaults to ``None`` when nullable, else to the kind's zero.
    """

    name: str
    kind: FeatureKind
    nullable: bool = False  # None (JSON null) is a value: unknown, e.g. a statistic of no event
    required: bool = False
    minimum: int | None = 0  # numbers and integers; None = unbounded
    maximum: int | None = None
    non_empty: bool = False  # strings: at least one character
    unit: str = ""  # "" for names, counts by name and the version
    description: str = ""

    @property
    def annotation(self) -> str:
        """The ``FeatureVector`` attribute's type, as written there."""
        python = _PYTHON_TYPES[self.kind]
        return f"{python} | None" if self.nullable else python

    @property
    def has_default(self) -> bool:
        return not self.required or self.kind == "version"

    def default(self) -> Any:
        """The ``FeatureVector`` attribute's default (a fresh dict for counts)."""
        if self.kind == "version":
            return FEATURES_SCHEMA_VERSION
        if self.nullable:
            return None
        return {"number": 0.0, "integer": 0, "string": "", "counts": {}}[self.kind]


FEATURE_FIELDS: Final[tuple[FeatureField, ...]] = (
    FeatureField("model", "string", required=True, non_empty=True, description="Model pool."),
    FeatureField("replica", "string", nullable=True, required=True,
                 description="Replica id; null on the per-model vector."),
    FeatureField("window_start", "number", required=True, minimum=None, unit="s",
                 description="Epoch seconds, inclusive."),
    FeatureField("window_end", "number", required=True, minimum=None, unit="s",
                 description="Epoch seconds, exclusive; a multiple of the step."),
    FeatureField("count", "integer", required=True, unit="requests", description="Requests finished in the window."),
    FeatureField("rps", "number", unit="requests/s", description="count / window length (requests per second)."),
    FeatureField("latency_p50", "number", nullable=True, unit="ms", description="End-to-end latency median, ms."),
    FeatureField("latency_p95", "number", nullable=True, unit="ms", description="End-to-end latency P95, ms."),
    FeatureField("latency_p99", "number", nullable=True, unit="ms", description="End-to-end latency P99, ms."),
    FeatureField("latency_mean", "number", nullable=True, unit="ms", description="End-to-end latency mean, ms."),
    FeatureField("ttft_p50", "number", nullable=True, unit="ms",
                 description="Time-to-first-token median, ms; null when no event reported ttft_ms."),
    FeatureField("ttft_p99", "number", nullable=True, unit="ms", description="Time-to-first-token P99, ms."),
    FeatureField("batch_size_mean", "number", nullable=True, unit="requests",
                 description="Mean running batch size over the window's events that had one (reported or derived, "
                             "see batch_count); null when none had one."),
    FeatureField("batch_size_std", "number", nullable=True, unit="requests",
                 description="Population standard deviation of batch_size over the events that had one; null when "
                             "none had one."),
    FeatureField("batch_fill_mean", "number", nullable=True, maximum=1, unit="ratio",
                 description="Mean of batch_size / batch_capacity over the events with both, 0..1; null when none "
                             "had both."),
    FeatureField("prompt_tokens_mean", "number", nullable=True, unit="tokens",
                 description="Mean prompt length, tokens."),
    FeatureField("prompt_tokens_var", "number", nullable=True, unit="tokens²",
                 description="Population variance of prompt length, tokens^2."),
    FeatureField("completion_tokens_mean", "number", nullable=True, unit="tokens",
                 description="Mean completion length, tokens."),
    FeatureField("completion_tokens_var", "number", nullable=True, unit="tokens²",
                 description="Population variance of completion length, tokens^2."),
    FeatureField("tokens_per_s", "number", unit="tokens/s",
                 description="Generated (completion) tokens per second over the window."),
    FeatureField("error_rate", "number", nullable=True, maximum=1, unit="ratio",
                 description='Share of events with status "error"; null for an empty window.'),
    FeatureField("queue_length_mean", "number", nullable=True, unit="requests",
                 description="Mean reported queue_length; null when no event reported it."),
    FeatureField("kv_cache_hit_rate_mean", "number", nullable=True, maximum=1, unit="ratio",
                 description="Mean reported kv_cache_hit_rate; null when no event reported it."),
    FeatureField("step_count", "integer", unit="requests",
                 description="Requests in the newest step only (silence shows here first)."),
    FeatureField("step_cuda_errors", "counts",
                 description="cuda_error value (name, or code as a string) -> count, newest step only."),
    FeatureField("replicas", "integer", nullable=True, unit="replicas",
                 description="Per-model vectors: replicas merged; null on per-replica vectors."),
    # contract v1.1 (batch fields optional): the batch_* statistics above cover only these events;
    # None statistics with batch_count 0 mean no event had a batch size (the batch detectors stay silent)
    FeatureField("batch_count", "integer", unit="requests",
                 description="Events in the window with a batch size, reported or derived (contract v1.1: batch "
                             "fields optional). Absent (older writers): every event had one."),
    FeatureField("batch_derived_count", "integer", unit="requests",
                 description="Of batch_count, the events whose batch size the worker derived from the replica's "
                             "telemetry (running_requests)."),
    # contract v1.2 (optional, additive): time per output token. A slowed decode shows here on the
    # first short request that finishes, where end-to-end latency (dominated by output length) shows
    # it a minute later.
    FeatureField("tpot_p50", "number", nullable=True, unit="ms/token",
                 description="v1.2, optional: median time per output token, ms/token: per event (latency_ms - "
                             "ttft_ms) / (completion_tokens - 1) over the events with ttft_ms and completion_tokens "
                             ">= 2 (v1.7: the tokens after the first, which comes at the TTFT), or latency_ms / "
                             "completion_tokens over those without ttft_ms and completion_tokens > 0 (<= 5 % "
                             "relative error). Null when there were none. On per-model vectors: over the events of "
                             "every replica."),
    FeatureField("tpot_p99", "number", nullable=True, unit="ms/token",
                 description="v1.2, optional: P99 time per output token, ms/token (as tpot_p50)."),
    # the slowest event's: one slowed request shows here first
    FeatureField("tpot_max", "number", nullable=True, unit="ms/token",
                 description="v1.2, optional: the largest time per output token in the window, ms/token (as "
                             "tpot_p50)."),
    # contract v1.5 (optional, additive): with P50 and P99, how many of the window's requests are
    # slow proves itself (the long tail's exceedance test)
    FeatureField("tpot_p90", "number", nullable=True, unit="ms/token",
                 description="v1.5, optional: P90 time per output token, ms/token (as tpot_p50): at least a tenth "
                             "of the window's requests are at or above it."),
    # contract v1.6 (optional, additive): prefill grows with the prompt, so a window's TTFT moves with
    # the prompts it happened to serve; per prompt token it does not, and a replica slow to start
    # shows at any mix
    FeatureField("ttft_per_prompt_token", "number", nullable=True, unit="ms/token",
                 description="v1.6, optional: geometric mean of ttft_ms / prompt_tokens over the events with "
                             "ttft_ms > 0 and prompt_tokens > 0, ms per prompt token. Null when there were none. On "
                             "per-model vectors: over the events of every replica."),
    # contract v1.8 (optional, additive): a TTFT is a step's wait plus prefill, so per prompt token a
    # short prompt takes longer than a long one: beside it, TTFT per prompt token can be judged at a
    # given prompt length
    FeatureField("ttft_prompt_tokens_gmean", "number", nullable=True, unit="tokens",
                 description="v1.8, optional: geometric mean of prompt_tokens over the same events as "
                             "ttft_per_prompt_token (ttft_ms > 0 and prompt_tokens > 0), tokens: beside it, TTFT per "
                             "prompt token can be judged at a given prompt length. Null when there were none. On "
                             "per-model vectors: over the events of every replica."),
    # the window's newest RECENT_S (20 s, 4 steps) only: prompt-length moments for rules that must
    # not wait for the 60 s window to fill. None on vectors that do not carry them
    FeatureField("recent_count", "integer", nullable=True, unit="requests",
                 description="v1.2, optional: requests finished in the newest 20 s (4 steps) of the window "
                             "(per-model: every replica's)."),
    FeatureField("recent_prompt_tokens_mean", "number", nullable=True, unit="tokens",
                 description="v1.2, optional: mean prompt length of those requests, tokens; null when recent_count "
                             "is 0 or null."),
    FeatureField("recent_prompt_tokens_var", "number", nullable=True, unit="tokens²",
                 description="v1.2, optional: population variance of their prompt length, tokens^2."),
    # contract v1.10 (optional, additive): the newest step's slowest request, which no other step's
    # vector holds: summed over many steps, a few stalled requests at a request a minute add up
    FeatureField("step_tpot_max", "number", nullable=True, unit="ms/token",
                 description="v1.10, optional: the largest time per output token among the newest step's events "
                             "only, ms/token (as tpot_p50). Null when the step had none. On per-model vectors: over "
                             "the events of every replica."),
    FeatureField("v", "version", required=True, description="Schema version."),
)
FIELDS_BY_NAME: Final = {f.name: f for f in FEATURE_FIELDS}
FEATURE_NAMES: Final = tuple(f.name for f in FEATURE_FIELDS)


# --- the JSON Schema -------------------------------------------------------------------------------

SCHEMA_ID: Final = "urn:skewwatch:schema:features:v1"
_SCHEMA_DESCRIPTION: Final = (
    'One feature vector per replica (key "model/replica") and one per model (key "model", replica null) every '
    "step (5 s of event time), covering the last window (60 s). Statistics of an empty window are null "
    "(unknown), never 0; count, rps and tokens_per_s are genuinely 0 for a silent replica. Consumers must "
    "ignore unknown fields.")


def field_schema(field: FeatureField) -> dict[str, Any]:
    """The JSON Schema of one field's value (null allowed when the field is nullable)."""
    out: dict[str, Any]
    if field.kind == "version":
        out = {"const": FEATURES_SCHEMA_VERSION}
    elif field.kind == "counts":
        out = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
    else:
        out = {"type": [field.kind, "null"] if field.nullable else field.kind}
        if field.non_empty:
            out["minLength"] = 1
        if field.kind != "string":
            if field.minimum is not None:
                out["minimum"] = field.minimum
            if field.maximum is not None:
                out["maximum"] = field.maximum
    out["description"] = field.description
    return out


def features_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one ``llm.features`` record, made from :data:`FEATURE_FIELDS`."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "llm.features record, v1",
        "description": _SCHEMA_DESCRIPTION,
        "type": "object",
        "required": [f.name for f in FEATURE_FIELDS if f.required],
        "properties": {f.name: field_schema(f) for f in FEATURE_FIELDS},
        "additionalProperties": True,
    }


if __name__ == "__main__":  # regenerate the shipped file: python -m skewwatch.schemas.feature_spec > ...json
    print(json.dumps(features_schema(), indent=2, ensure_ascii=False))
