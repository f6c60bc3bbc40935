"""Request traces: arrival times and prompt/completion lengths from a CSV, as numpy arrays.

Token lengths and arrival times come from real traces; any CSV with a timestamp, a prompt-token
and a completion-token column works through a documented column mapping. This module is that
mapping and nothing more: it reads a CSV, picks three columns by name, and hands back plain
arrays (no Kafka, no clock).

Three traces ship inside the package (``skewwatch/data/SOURCE.md``), so nothing outside it is
read at run time: ``conv`` and ``code``, the Azure LLM inference traces of 2023 (Patel et al.,
"Splitwise", ISCA 2024; CC-BY 4.0), and ``mooncake``, the synthetic long-context trace of the
Mooncake release (Qin et al., FAST 2025; Apache-2.0): mean prompts of 15k tokens, Poisson
arrivals. Each bundled name carries its own column mapping (the Mooncake file's columns are
``timestamp_ms,input_length,output_length``); any other value is a path.

The timestamp column may hold ISO-like date-times (``2023-11-16 18:17:03.9799600``, as in the
Azure files) or plain numbers in ``ts_unit`` (``s`` by default, ``ms`` or ``us``: epoch or
relative). Either way ``offset_s`` is seconds since the trace's first request, sorted ascending.

>>> m = ColumnMapping.parse("ts=time,prompt=in,completion=out,ts_unit=ms")
>>> (m.ts, m.prompt, m.completion, m.ts_unit)
('time', 'in', 'out', 'ms')
>>> t = load_trace("conv")
>>> len(t), t.source
(19366, 'conv')
>>> bool(t.offset_s[0] == 0.0 and (t.offset_s[1:] >= t.offset_s[:-1]).all())
True
>>> m = load_trace("mooncake")
>>> len(m), round(m.duration_s), int(m.prompt_quantile(0.9))
(3993, 1022, 38611)
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from skewwatch.errors import SkewwatchError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

TS_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6}  # numeric timestamps -> seconds


class TraceError(SkewwatchError, ValueError):
    """A trace that cannot be used; the message names the file, row or column."""

    exit_code = 2  # a trace file or mapping given as an option that cannot be used


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """Which CSV column holds each of the three fields a trace must have, and the unit of
    numeric timestamps.

    Defaults are the Azure trace's header (``TIMESTAMP,ContextTokens,GeneratedTokens``).
    """

    ts: str = "TIMESTAMP"
    prompt: str = "ContextTokens"
    completion: str = "GeneratedTokens"
    ts_unit: str = "s"  # numeric timestamps: s, ms or us (date-times carry their own unit)

    def __post_init__(self) -> None:
        if self.ts_unit not in TS_UNITS:
            raise TraceError(f"ts_unit {self.ts_unit!r}: expected one of {', '.join(TS_UNITS)}")

    @classmethod
    def parse(cls, text: str) -> ColumnMapping:
        """Read ``ts=COL,prompt=COL,completion=COL,ts_unit=UNIT`` (any subset; the rest keep their
        defaults)."""
        values: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, column = part.partition("=")
            key = key.strip()
            if not sep or key not in ("ts", "prompt", "completion", "ts_unit") or not column.strip():
                raise TraceError(
                    f"column mapping {part!r}: expected ts=COLUMN, prompt=COLUMN, completion=COLUMN "
                    f"or ts_unit={'|'.join(TS_UNITS)}"
                )
            values[key] = column.strip()
        return cls(**values)


#: Traces bundled in ``skewwatch/data`` (see SOURCE.md there for the attribution): file and mapping.
BUNDLED_TRACES: dict[str, tuple[str, ColumnMapping]] = {
    "conv": ("AzureLLMInferenceTrace_conv.csv", ColumnMapping()),
    "code": ("AzureLLMInferenceTrace_code.csv", ColumnMapping()),
    "mooncake": ("MooncakeTrace_synthetic.csv",
                 ColumnMapping(ts="timestamp_ms", prompt="input_length", completion="output_length", ts_unit="ms")),
}
DEFAULT_TRACE = "conv"


@dataclass(frozen=True, slots=True)
class Trace:
    """One request per row, sorted by arrival: offsets in seconds from the first, token counts."""

    offset_s: FloatArray
    prompt_tokens: IntArray
    completion_tokens: IntArray
    source: str  # bundled name or path, for messages and reports

    def __len__(self) -> int:
        return int(self.offset_s.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.offset_s[-1]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace's span (0 when it spans no time)."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def prompt_quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the trace's prompt lengths, in tokens (0 for an empty trace).

        Faults that are relative to the trace read it (a context burst is k x the P90 prompt).
        """
        return float(np.quantile(self.prompt_tokens, q)) if len(self) else 0.0


def _parse_timestamps(values: list[str], source: str, unit: str = "s") -> FloatArray:
    """Seconds (float) from numbers (in ``unit``) or date-times; numpy's datetime64 parses the ISO forms."""
    try:
        return np.array([float(v) for v in values], dtype=np.float64) * TS_UNITS[unit]
    except ValueError:
        pass
    try:
        # numpy wants the ISO 'T' separator; the Azure files use a space.
        stamps = np.array([v.strip().replace(" ", "T", 1) for v in values], dtype="datetime64[ns]")
    except ValueError as exc:
        raise TraceError(f"{source}: timestamp column is neither numbers nor ISO date-times ({exc})") from exc
    return (stamps - stamps.min()).astype(np.int64).astype(np.float64) / 1e9


def read_trace(text: str, mapping: ColumnMapping = ColumnMapping(), source: str = "<text>") -> Trace:
    """Parse CSV text (header row first) into a Trace. Pure: no file access."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    for field_name, column in (("ts", mapping.ts), ("prompt", mapping.prompt),
                               ("completion", mapping.completion)):
        if column not in header:
            raise TraceError(
                f"{source}: no column {column!r} for {field_name} (columns: {', '.join(header) or 'none'}); "
                f"map it with --columns ts=...,prompt=...,completion=..."
            )
    ts_raw: list[str] = []
    prompt: list[int] = []
    completion: list[int] = []
    for line_no, row in enumerate(reader, start=2):
        try:
            p = int(float(row[mapping.prompt]))
            c = int(float(row[mapping.completion]))
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{source}, line {line_no}: token counts must be numbers ({exc})") from exc
        if p < 0 or c < 0:
            raise TraceError(f"{source}, line {line_no}: token counts must be >= 0, got {p}, {c}")
        ts_raw.append(row[mapping.ts])
        prompt.append(p)
        completion.append(c)
    if not ts_raw:
        raise TraceError(f"{source}: no rows")
    ts = _parse_timestamps(ts_raw, source, mapping.ts_unit)
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    return Trace(
        offset_s=ts - ts[0],
        prompt_tokens=np.asarray(prompt, dtype=np.int64)[order],
        completion_tokens=np.asarray(completion, dtype=np.int64)[order],
        source=source,
    )


@functools.lru_cache(maxsize=8)
def _bundled(name: str, mapping: ColumnMapping) -> Trace:
    # Cached: parsing the date-times is most of a load and the files never change. Callers only read
    # the arrays (the generator indexes them into new arrays), so sharing one Trace is safe.
    text = (resources.files("skewwatch") / "data" / BUNDLED_TRACES[name][0]).read_text(encoding="utf-8")
    trace = read_trace(text, mapping, source=name)
    for array in (trace.offset_s, trace.prompt_tokens, trace.completion_tokens):
        array.flags.writeable = False
    return trace


def load_trace(name_or_path: str | Path = DEFAULT_TRACE, mapping: ColumnMapping | None = None) -> Trace:
    """A bundled trace by name (``conv``, ``code``, ``mooncake``: each with its own mapping unless
    one is given) or any CSV by path."""
    key = str(name_or_path)
    if key in BUNDLED_TRACES:
        return _bundled(key, mapping or BUNDLED_TRACES[key][1])
    path = Path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TraceError(
            f"trace {key!r} is neither a file nor a bundled trace ({', '.join(BUNDLED_TRACES)})"
        ) from exc
    return read_trace(text, mapping or ColumnMapping(), source=str(path))
