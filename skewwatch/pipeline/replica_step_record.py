"""The stage 1 -> stage 2 record: one per (input partition, model, closed step), as columns.

Stage 1 closes a step for every replica of its input partition at once; stage 2 needs them per
model. So every replica of one model in one closed step of one input partition goes in ONE record
(format 3): the replicas' feature vectors as columns, their telemetry, and ONE window summary, the
replicas' summaries already merged by stage 1 on its columns (``StepBatch.merged``). Stage 2
merges those partial summaries (one per input partition and part) into the model's vector: it
equals the merge of every replica's own summary (counts and sketches exactly), and no per-replica
summary is built, sent or decoded.

``{"v": 3, "model", "window_end", "source", "replicas": [names], "summary": WindowSummary.to_dict()
(replica null, replicas = how many), "features": {name: [one value per replica]}, "telemetry":
[sample dict or null, ...], "telemetry_stale": [[field, ...], ...]}`` (JSON).
The feature fields are read off the dataclass, so a field added to :class:`FeatureVector` travels
without a change here; the decoded objects equal what ``from_dict(to_dict())`` gives (the tests hold
them equal, field by field). Routing needs no JSON: the Kafka header ``skewwatch-step`` holds
``[window_end, source, replicas, part]`` (:func:`step_header`, :func:`read_step_header`).

>>> from skewwatch.pipeline.window_settings import WindowSettings
>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> from skewwatch.pipeline.window import PartitionWindows
>>> ev = dict(model="m", prompt_tokens=10, completion_tokens=20, batch_size=4, batch_capacity=16)
>>> windows = PartitionWindows(WindowSettings())
>>> _ = windows.apply(RequestColumns.from_rows([dict(ev, request_id=r, replica=r, ts=101.0, latency_ms=100.0)
...                                             for r in ("r1", "r2")]))
>>> windows.advance_watermark(105.0)
>>> [batch] = windows.close_steps().batches
>>> [summary] = batch.merged(list(batch.model_rows().values()))
>>> record = encode_model_step("m", 105.0, 0, batch.feature_vectors(), summary, [None, None], [[], []])
>>> decoded = decode_model_step(record)
>>> [(name, step.features == fv) for (name, step), fv in zip(decoded.replicas, batch.feature_vectors())]
[('r1', True), ('r2', True)]
>>> decoded.summary.count, decoded.summary.replicas
(2, 2)
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from skewwatch.pipeline.step_completion import ModelStep
from skewwatch.pipeline.window import StepBatch, WindowSummary
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

HANDOFF_VERSION = 3  # the only format read
STEP_HEADER = "skewwatch-step"  # Kafka header of a record: [window_end, source, replicas, part]
# A partition's replicas of one model go in parts of at most this many (a record stays well under the
# topic's 1 MiB max.message.bytes: ~1.5 KB per replica's features with its telemetry)
MAX_REPLICAS_PER_RECORD = 256

_FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FeatureVector))
_FEATURE_SET = frozenset(_FEATURE_NAMES)
_feature_row = operator.attrgetter(*_FEATURE_NAMES)
_TELEMETRY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TelemetrySample))
_TELEMETRY_NAMES = frozenset(_TELEMETRY_FIELDS)
_telemetry_row = operator.attrgetter(*_TELEMETRY_FIELDS)


@dataclass(slots=True)
class ReplicaStepInput:
    """One replica's step as stage 2 reads it from a record: its features and telemetry."""

    features: FeatureVector
    telemetry: TelemetrySample | None = None


class ModelStepRecord(NamedTuple):
    """A decoded record: its replicas in the order stage 1 sent them, and their merged summary."""

    replicas: list[tuple[str, ReplicaStepInput]]
    summary: WindowSummary


class ModelStepInputs(NamedTuple):
    """A released model step's inputs: each replica once, the partial summaries to merge, and why a
    record that could not be decoded was left out (its chunk key and the one-line reason)."""

    replicas: dict[str, ReplicaStepInput]
    summaries: list[WindowSummary]
    rejected: list[tuple[tuple[int, int], str]] = []


class StepHeader(NamedTuple):
    """What stage 2 routes a record by (its Kafka header; the key is the model)."""

    window_end: float
    source: int  # stage 1's input partition
    replicas: int  # replica steps in the record
    part: int  # which part of the partition's replicas of the model (past MAX_REPLICAS_PER_RECORD)


def step_header(window_end: float, source: int, replicas: int, part: int = 0) -> list[tuple[str, bytes]]:
    """The Kafka headers of a record."""
    return [(STEP_HEADER, orjson.dumps([window_end, source, replicas, part]))]


def read_step_header(headers: Sequence[tuple[str, bytes]] | None) -> StepHeader | None:
    """The :class:`StepHeader` of a record; None for any other record."""
    for key, value in headers or ():
        if key == STEP_HEADER:
            end, source, replicas, part = orjson.loads(value)
            return StepHeader(float(end), int(source), int(replicas), int(part))
    return None


class RecordPart(NamedTuple):
    """What one record of a closed step holds: a model's replicas (a part of them past the size bound)."""

    model: str
    part: int
    features: list[FeatureVector]
    summary: WindowSummary  # theirs, merged


def record_parts(batch: StepBatch) -> list[RecordPart]:
    """Stage 1's records of one closed step of its partition: per model, its replicas' vectors in parts
    of at most :data:`MAX_REPLICAS_PER_RECORD`, each part's summaries merged on the columns."""
    features = batch.feature_vectors()
    parts = [(model, part, rows[start:start + MAX_REPLICAS_PER_RECORD])
             for model, rows in batch.model_rows().items()
             for part, start in enumerate(range(0, len(rows), MAX_REPLICAS_PER_RECORD))]
    return [RecordPart(model, part, [features[i] for i in rows.tolist()], summary)
            for (model, part, rows), summary in zip(parts, batch.merged([rows for _, _, rows in parts]), strict=True)]


def _telemetry_dict(sample: TelemetrySample) -> dict[str, Any]:
    """``sample.to_dict()`` (unknown fields left out) without ``asdict``'s deep copy."""
    return {name: value for name, value in zip(_TELEMETRY_FIELDS, _telemetry_row(sample), strict=True)
            if value is not None}


def encode_model_step(model: str, window_end: float, source: int, features: Sequence[FeatureVector],
                      summary: WindowSummary, telemetry: Sequence[TelemetrySample | None],
                      stale: Sequence[list[str]]) -> bytes:
    """The record of one model's replicas (``features``, one per replica, and ``summary``, theirs
    merged) in one closed step of input partition ``source``."""
    if summary.replica is not None or summary.replicas != len(features):
        raise ValueError(f"replica-steps record: the summary must merge the record's {len(features)} replicas "
                         f"(replica={summary.replica!r}, replicas={summary.replicas!r})")
    columns = zip(*map(_feature_row, features), strict=True) if features else ([] for _ in _FEATURE_NAMES)
    return orjson.dumps({
        "v": HANDOFF_VERSION, "model": model, "window_end": window_end, "source": source,
        "replicas": [fv.replica for fv in features],
        "summary": summary.to_dict(),
        "features": {name: list(column) for name, column in zip(_FEATURE_NAMES, columns, strict=True)},
        "telemetry": [None if t is None else _telemetry_dict(t) for t in telemetry],
        "telemetry_stale": list(stale),
    })


_PREFIX = b'{"v":%d,' % HANDOFF_VERSION  # what encode_model_step's JSON starts with (orjson keeps key order)


def format_problem(value: bytes | None) -> str | None:
    """Why a record with the step header is not one this worker reads (None: it is), checked on its
    first bytes only, so stage 2 can refuse a record of another format (an older worker's, during an
    upgrade) when it arrives rather than when its step completes."""
    if value is not None and value.startswith(_PREFIX):
        return None
    return f"replica-steps record: not hand-off format {HANDOFF_VERSION} (an older or other worker wrote it)"


def _body(value: bytes) -> dict[str, Any]:
    """The record's JSON, its format checked; ValueError (one line) on anything else."""
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ValueError(f"replica-steps record: not a format-{HANDOFF_VERSION} record (not JSON)") from None
    if not isinstance(body, dict) or body.get("v") != HANDOFF_VERSION:
        found = body.get("v") if isinstance(body, dict) else type(body).__name__
        raise ValueError(f"replica-steps record: unsupported format {found!r} (this worker reads {HANDOFF_VERSION})")
    return body


def decode_model_step(value: bytes) -> ModelStepRecord:
    """Every replica's step in a record, in the order stage 1 sent them, and their merged summary.

    Raises ValueError on a record that is not format 3, whose summary version is not this one's, or
    whose columns do not match its replicas.
    """
    body = _body(value)
    replicas: list[str] = body["replicas"]
    rows = len(replicas)
    summary = WindowSummary.from_dict(body["summary"])
    if summary.replicas != rows:
        raise ValueError(f"replica-steps record: its summary merges {summary.replicas} replicas, it holds {rows}")
    feature_columns = {name: column for name, column in body["features"].items() if name in _FEATURE_SET}
    if any(len(column) != rows for column in feature_columns.values()) or len(body["telemetry"]) != rows:
        raise ValueError(f"replica-steps record: columns do not match its {rows} replicas")
    if tuple(feature_columns) == _FEATURE_NAMES:  # positionally: the same fields in the dataclass's order
        features = [FeatureVector(*values) for values in zip(*feature_columns.values(), strict=True)]
    else:
        features = [FeatureVector(**dict(zip(feature_columns, values, strict=True)))
                    for values in zip(*feature_columns.values(), strict=True)]
    telemetry = [None if t is None else TelemetrySample(**{k: v for k, v in t.items() if k in _TELEMETRY_NAMES})
                 for t in body["telemetry"]]
    steps = [(name, ReplicaStepInput(features=fv, telemetry=t))
             for name, fv, t in zip(replicas, features, telemetry, strict=True)]
    return ModelStepRecord(steps, summary)


def replica_step_dicts(value: bytes) -> list[dict[str, Any]]:
    """A record as one plain dict per replica step (``features``, ``telemetry`` or None,
    ``telemetry_stale``), in the order stage 1 sent them: for tools and tests that read the internal topic."""
    stale = _body(value)["telemetry_stale"]
    return [{"features": step.features.to_dict(),
             "telemetry": None if step.telemetry is None else step.telemetry.to_dict(),
             "telemetry_stale": replica_stale}
            for (_, step), replica_stale in zip(decode_model_step(value).replicas, stale, strict=True)]


def model_step_inputs(step: ModelStep) -> ModelStepInputs:
    """Every replica's decoded step of a released model step, by replica, in the order the records
    came (a replica in two records counts once: the later one), and every record's summary. A record
    that does not decode is left out (``rejected``): the step is decided on the others.

    A replica in two records of one step happens only when its key moved to another input partition
    (the requests topic repartitioned) within the step; its own vector then counts once, and the
    model's merged vector counts its window twice for that step.
    """
    inputs: dict[str, ReplicaStepInput] = {}
    summaries: list[WindowSummary] = []
    rejected: list[tuple[tuple[int, int], str]] = []
    for chunk, payload in step.chunks.items():
        try:
            record = decode_model_step(payload)
        except (ValueError, KeyError, TypeError) as exc:  # KeyError/TypeError: a field missing or of another type
            rejected.append((chunk, str(exc) if isinstance(exc, ValueError) else
                             f"replica-steps record: malformed ({type(exc).__name__}: {exc})"))
            continue
        inputs.update(record.replicas)
        summaries.append(record.summary)
    return ModelStepInputs(inputs, summaries, rejected)
