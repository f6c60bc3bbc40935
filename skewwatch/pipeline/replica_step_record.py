"""The stage 1 -> stage 2 record: one per (input partition, model, closed step), as columns.

Stage 1 closes a step for every replica of its input partition at once; stage 2 needs them per
model. So every replica of one model in one closed step of one input partition goes in ONE record
(format 2), its per-replica fields as columns, which costs a few ``send`` calls and one decode per
record rather than per replica step:

``{"v": 2, "model", "window_end", "source", "replicas": [names],
"summary": {"v": SUMMARY_VERSION, "fields": {name: {"kind", "data", ...}}},
"features": {name: [one value per replica]}, "telemetry": [sample dict or null, ...],
"telemetry_stale": [[field, ...], ...]}``

A summary field whose values are 1-D arrays is a ``rows`` slice of its dtype's block (one
``(replicas, width)`` matrix per dtype), a 2-D (sparse sketch) one an ``index`` into the ``sparse``
concatenation (``lengths`` per field and replica), anything else ``values`` (a JSON list); the
arrays are the record's binary tail, after a 4-byte length and the JSON head.
The fields are read off the dataclasses, so a field added to :class:`WindowSummary` or
:class:`FeatureVector` travels without a change here; the decoded objects equal what
``from_dict(to_dict())`` gives (the tests hold them equal, field by field and dtype).
Routing needs no JSON: the Kafka header ``skewwatch-step`` holds ``[window_end, source,
replicas]`` (:func:`step_header`, :func:`read_step_header`).

>>> from skewwatch.config import WindowSettings
>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> from skewwatch.pipeline.window import PartitionWindows
>>> ev = dict(model="m", prompt_tokens=10, completion_tokens=20, batch_size=4, batch_capacity=16)
>>> windows = PartitionWindows(WindowSettings())
>>> _ = windows.apply(RequestColumns.from_rows([dict(ev, request_id=r, replica=r, ts=101.0, latency_ms=100.0)
...                                             for r in ("r1", "r2")]))
>>> windows.advance_watermark(105.0)
>>> steps = list(windows.close_steps())
>>> record = encode_model_step("m", 105.0, 0, steps, [None, None], [[], []])
>>> decoded = decode_model_step(record)
>>> [(name, step.features == s.features) for (name, step), s in zip(decoded, steps)]
[('r1', True), ('r2', True)]
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson

from skewwatch.pipeline.sketch import log_bins
from skewwatch.pipeline.step_completion import ModelStep
from skewwatch.pipeline.window import ReplicaStep, WindowSummary
from skewwatch.pipeline.window.summary import SUMMARY_VERSION
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

HANDOFF_VERSION = 2  # the only format read
STEP_HEADER = "skewwatch-step"  # Kafka header of a format-2 record: [window_end, source, replicas, part]
# A partition's replicas of one model go in parts of at most this many (a record stays well under the
# topic's 1 MiB max.message.bytes: ~2 KB per replica step with its telemetry)
MAX_REPLICAS_PER_RECORD = 256

_HEAD_LENGTH = struct.Struct(">I")  # a record: length of the JSON head, the head, the arrays' bytes
_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_SUMMARY_FIELDS = dataclasses.fields(WindowSummary)
_SUMMARY_NAMES: tuple[str, ...] = tuple(f.name for f in _SUMMARY_FIELDS)
# from_dict's conversions of the plain scalar fields (annotations are strings here), kept so a decoded
# object is the same, type for type (a float field sent as 5.0 comes back as 5.0, not 5)
_CASTS: dict[str, type] = {"float": float, "int": int, "str": str}
_SUMMARY_CAST: dict[str, type] = {f.name: _CASTS[str(f.type)] for f in _SUMMARY_FIELDS if str(f.type) in _CASTS}
_FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FeatureVector))
_FEATURE_SET = frozenset(_FEATURE_NAMES)
_summary_row = operator.attrgetter(*_SUMMARY_NAMES)
_feature_row = operator.attrgetter(*_FEATURE_NAMES)
_TELEMETRY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TelemetrySample))
_TELEMETRY_NAMES = frozenset(_TELEMETRY_FIELDS)
_telemetry_row = operator.attrgetter(*_TELEMETRY_FIELDS)


@dataclass(slots=True)
class ReplicaStepInput:
    """One replica's step as stage 2 reads it from a record: its summary, features and telemetry."""

    summary: WindowSummary
    features: FeatureVector
    telemetry: TelemetrySample | None = None


class StepHeader(NamedTuple):
    """What stage 2 routes a format-2 record by (its Kafka header; the key is the model)."""

    window_end: float
    source: int  # stage 1's input partition
    replicas: int  # replica steps in the record
    part: int  # which part of the partition's replicas of the model (past MAX_REPLICAS_PER_RECORD)


def step_header(window_end: float, source: int, replicas: int, part: int = 0) -> list[tuple[str, bytes]]:
    """The Kafka headers of a format-2 record."""
    return [(STEP_HEADER, orjson.dumps([window_end, source, replicas, part]))]


def read_step_header(headers: Sequence[tuple[str, bytes]] | None) -> StepHeader | None:
    """The :class:`StepHeader` of a format-2 record; None for any other record."""
    for key, value in headers or ():
        if key == STEP_HEADER:
            end, source, replicas, part = orjson.loads(value)
            return StepHeader(float(end), int(source), int(replicas), int(part))
    return None


def _summary_columns(summaries: Sequence[WindowSummary], blobs: list[bytes]) -> dict[str, Any]:
    """The summaries as columns. Arrays go to ``blobs`` (the record's binary tail), few and large (the
    cost is per array, not per byte): every 1-D field of one dtype side by side in one ``(rows, width)``
    block, every sparse sketch field in one ``(2, entries)`` int32 array; the fields say where."""
    fields: dict[str, dict[str, Any]] = {}
    dense: dict[str, list[np.ndarray]] = {}  # dtype -> the (rows, w) matrices of its fields, in order
    widths: dict[str, int] = {}
    sparse: list[Sequence[np.ndarray]] = []
    at = sum(map(len, blobs))

    def blob(array: np.ndarray) -> dict[str, Any]:
        nonlocal at
        data = np.ascontiguousarray(array).tobytes()
        blobs.append(data)
        at += len(data)
        return {"dtype": array.dtype.str, "at": at - len(data), "nbytes": len(data)}

    for name, values in zip(_SUMMARY_NAMES, _transpose(summaries, _summary_row), strict=True):
        first = values[0]
        if not isinstance(first, np.ndarray):
            fields[name] = {"kind": "values", "data": values}
        elif first.ndim == 1:
            matrix = np.stack(values)
            key = matrix.dtype.str
            fields[name] = {"kind": "rows", "block": key, "start": widths.get(key, 0), "width": matrix.shape[1]}
            dense.setdefault(key, []).append(matrix)
            widths[key] = widths.get(key, 0) + matrix.shape[1]
        elif first.ndim == 2:  # a sparse sketch (2, k): slots and counts
            fields[name] = {"kind": "sparse", "index": len(sparse)}
            sparse.append(values)
        else:
            raise TypeError(f"window summary field {name}: {first.ndim}-D arrays cannot be sent as columns")
    out: dict[str, Any] = {"v": SUMMARY_VERSION, "fields": fields,
                           "blocks": {key: {"width": widths[key], **blob(np.hstack(matrices))}
                                      for key, matrices in dense.items()}}
    if sparse:
        out["sparse"] = {"lengths": [[a.shape[1] for a in arrays] for arrays in sparse],
                         **blob(np.concatenate([a for arrays in sparse for a in arrays], axis=1).astype(np.int32))}
    return out


def _transpose(objects: Sequence[Any], row: Callable[[Any], tuple[Any, ...]]) -> list[list[Any]]:
    """Columns (one list per field) of ``objects``; ``row`` reads every field of one (attrgetter)."""
    return [list(column) for column in zip(*map(row, objects), strict=True)]


def _telemetry_dict(sample: TelemetrySample) -> dict[str, Any]:
    """``sample.to_dict()`` (unknown fields left out) without ``asdict``'s deep copy."""
    return {name: value for name, value in zip(_TELEMETRY_FIELDS, _telemetry_row(sample), strict=True)
            if value is not None}


def encode_model_step(model: str, window_end: float, source: int, steps: Sequence[ReplicaStep],
                      telemetry: Sequence[TelemetrySample | None], stale: Sequence[list[str]]) -> bytes:
    """The format-2 record of one model's replicas in one closed step of input partition ``source``."""
    features = [s.features for s in steps]
    blobs: list[bytes] = []
    head = orjson.dumps({
        "v": HANDOFF_VERSION, "model": model, "window_end": window_end, "source": source,
        "replicas": [fv.replica for fv in features],
        "summary": _summary_columns([s.summary for s in steps], blobs),
        "features": dict(zip(_FEATURE_NAMES, _transpose(features, _feature_row), strict=True)),
        "telemetry": [None if t is None else _telemetry_dict(t) for t in telemetry],
        "telemetry_stale": list(stale),
    }, option=_DUMPS_OPTIONS)
    return b"".join([_HEAD_LENGTH.pack(len(head)), head, *blobs])


def _array(column: dict[str, Any], value: bytes, tail: int) -> np.ndarray:
    """A column's array out of the record's binary tail, copied (writable, like from_dict's)."""
    dtype = np.dtype(column["dtype"])
    nbytes = int(column["nbytes"])
    start = tail + int(column["at"])
    if nbytes % dtype.itemsize or start + nbytes > len(value):
        raise ValueError(f"replica-steps record: array at {column['at']} ({nbytes} B) out of bounds")
    return np.frombuffer(value, dtype=dtype, count=nbytes // dtype.itemsize, offset=start).copy()


def _sparse_rows(meta: dict[str, Any], value: bytes, tail: int, rows: int, n_slots: int) -> list[list[Any]]:
    """Each sparse field's per-row ``(2, k)`` sketches (views of one array), checked as from_dict does:
    slots sorted within a row and in range, counts positive."""
    both = _array(meta, value, tail).reshape(2, -1)
    try:
        lengths = np.asarray(meta["lengths"], dtype=np.int64)
    except ValueError:  # ragged
        lengths = np.zeros(0, dtype=np.int64)
    if lengths.ndim != 2 or lengths.shape[1] != rows:
        raise ValueError("replica-steps record: sparse lengths do not match the replicas")
    bounds = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=bounds[1:])
    total = both.shape[1]
    if total != bounds[-1]:
        raise ValueError(f"replica-steps record: {total} sketch entries, the lengths say {bounds[-1]}")
    if total:
        slots, counts = both
        gaps = np.diff(slots)
        starts = bounds[1:-1]
        gaps[starts[(starts > 0) & (starts < total)] - 1] = 1  # a row's first slot follows nothing
        # negative slots read as unsigned are out of range too
        if (slots.view(np.uint32) >= n_slots).any() or (counts <= 0).any() or (gaps <= 0).any():
            raise ValueError("sketch: slots must be sorted, in range, with positive counts")
    edges = bounds.tolist()
    return [[both[:, edges[k * rows + i]:edges[k * rows + i + 1]] for i in range(rows)]
            for k in range(lengths.shape[0])]


def _summary_fields(summary: dict[str, Any], value: bytes, tail: int, rows: int) -> dict[str, list[Any]]:
    """Every summary field's per-row values, by name (the record's fields this code knows)."""
    fields: dict[str, dict[str, Any]] = summary["fields"]
    accuracy = fields.get("relative_accuracy", {}).get("data") or [0.01]
    n_slots = min(log_bins(float(a)).n_slots for a in set(accuracy))
    blocks = {}
    for key, meta in summary.get("blocks", {}).items():
        matrix = _array({**meta, "dtype": key}, value, tail)
        width = int(meta["width"])
        if matrix.size != rows * width:
            raise ValueError(f"replica-steps record: {matrix.size} values for {rows} rows of {width}")
        blocks[key] = matrix.reshape(rows, width)
    sparse = _sparse_rows(summary["sparse"], value, tail, rows, n_slots) if "sparse" in summary else []
    columns: dict[str, list[Any]] = {}
    for name, column in fields.items():
        if name not in _SUMMARY_NAMES:
            continue
        kind = column["kind"]
        if kind == "values":
            cast = _SUMMARY_CAST.get(name)
            columns[name] = column["data"] if cast is None else list(map(cast, column["data"]))
        elif kind == "rows":
            start = int(column["start"])
            columns[name] = list(blocks[column["block"]][:, start:start + int(column["width"])])
        elif kind == "sparse":
            columns[name] = sparse[int(column["index"])]
        else:
            raise ValueError(f"window summary field {name}: unknown column kind {kind!r}")
    return columns


def decode_model_step(value: bytes) -> list[tuple[str, ReplicaStepInput]]:
    """Every replica's step in a format-2 record, in the order stage 1 sent them.

    Raises ValueError on a record that is not format 2 or whose summary version is not this one's.
    """
    (length,) = _HEAD_LENGTH.unpack_from(value)
    tail = _HEAD_LENGTH.size + length
    body = orjson.loads(memoryview(value)[_HEAD_LENGTH.size:tail])
    if body.get("v") != HANDOFF_VERSION:
        raise ValueError(f"replica-steps record: unsupported format {body.get('v')!r}")
    replicas: list[str] = body["replicas"]
    rows = len(replicas)
    summary = body["summary"]
    if summary.get("v") != SUMMARY_VERSION:
        raise ValueError(f"window summary: unsupported version {summary.get('v')!r}")
    columns = _summary_fields(summary, value, tail, rows)
    if tuple(columns) == _SUMMARY_NAMES:  # positionally: the same fields in the dataclass's order
        summaries = [WindowSummary(*values) for values in zip(*columns.values(), strict=True)]
    else:
        summaries = [WindowSummary(**dict(zip(columns, values, strict=True)))
                     for values in zip(*columns.values(), strict=True)]
    feature_columns = {name: column for name, column in body["features"].items() if name in _FEATURE_SET}
    if tuple(feature_columns) == _FEATURE_NAMES:
        features = [FeatureVector(*values) for values in zip(*feature_columns.values(), strict=True)]
    else:
        features = [FeatureVector(**dict(zip(feature_columns, values, strict=True)))
                    for values in zip(*feature_columns.values(), strict=True)]
    telemetry = [None if t is None else TelemetrySample(**{k: v for k, v in t.items() if k in _TELEMETRY_NAMES})
                 for t in body["telemetry"]]
    return [(name, ReplicaStepInput(summary=s, features=fv, telemetry=t))
            for name, s, fv, t in zip(replicas, summaries, features, telemetry, strict=True)]


def replica_step_dicts(value: bytes) -> list[dict[str, Any]]:
    """A record as one plain dict per replica step (``summary``, ``features``, ``telemetry`` or None,
    ``telemetry_stale``), in the order stage 1 sent them: for tools and tests that read the internal topic."""
    (length,) = _HEAD_LENGTH.unpack_from(value)
    stale = orjson.loads(value[_HEAD_LENGTH.size:_HEAD_LENGTH.size + length])["telemetry_stale"]
    return [{"summary": step.summary.to_dict(), "features": step.features.to_dict(),
             "telemetry": None if step.telemetry is None else step.telemetry.to_dict(),
             "telemetry_stale": replica_stale}
            for (_, step), replica_stale in zip(decode_model_step(value), stale, strict=True)]


def model_step_inputs(step: ModelStep) -> dict[str, ReplicaStepInput]:
    """Every replica's decoded step of a released model step, by replica, in the order the records came
    (a replica in two records, a replay across a rebalance, counts once: the later one)."""
    inputs: dict[str, ReplicaStepInput] = {}
    for payload in step.chunks.values():
        inputs.update(decode_model_step(payload))
    return inputs
