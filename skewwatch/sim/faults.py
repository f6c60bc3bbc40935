"""Injected faults and their ground truth: what goes wrong, on which replica, when.

The generator takes ``--inject KIND --replica R --at T --for D`` so that each of the seed's
detectors (seed §2.4, §2.5, §4.3) can be seen to fire, and the simulator takes the same faults,
with a labels file (JSON list of ``{replica, kind, start, end}``, event-time epoch
seconds) as ground truth for the detection-quality benchmark. This module is the one
description of a fault that both the statistical generator and the fleet simulator read; each
decides how to realise it. Every kind has documented parameters whose defaults are chosen to
cross the matching detector's rule clearly, not marginally (see docs/simulator.md).

Kinds and their parameters (defaults in :data:`DEFAULT_PARAMS`):

- ``long_tail``: a ``share`` of requests get ``factor_min``..``factor_max`` x latency
  (P99 > 3 x P50 while P50 barely moves).
- ``slow_replica``: every request's decode is ``factor`` x slower (thermal throttling).
- ``batch_collapse``: the scheduler is stuck at batch 1-2 for a ``stuck_share`` of requests and
  runs 4..``max_batch`` for the rest (std ~ 3.4 > 2, fill ~ 11 % < 30 % at capacity 32) while the
  queue grows by ``queue_growth_per_s`` up to ``queue_max``; each queued request adds
  ``wait_ms_per_queued`` to latency and TTFT. The fleet simulator draws the limit (1-2 with
  probability ``stuck_share``, else 4..``max_batch``) once per ``phase_s`` seconds and only stops
  admissions, so its queue grows by itself; the generator ignores ``phase_s``.
- ``context_burst``: prompts log-normal with mean ``mean_tokens`` and coefficient of variation ``cv``.
- ``gpu_fault``: a ``share`` of requests fail with a CUDA error of class ``class``
  (``transient``, ``resource``, ``hardware``) or exactly ``error``; ``codes=1`` sends the integer
  code instead of the name; telemetry reports XID ``xid`` (79 for hardware by default).
- ``kv_pressure``: ``mode=fragmentation`` (hit rate ``hit_rate``, fragmentation ``fragmentation``)
  or ``mode=underutilized`` (hit rate 0.95, completions cut to about ``tokens_per_s`` tokens/s).
- ``replica_silence``: the replica reports nothing (no requests, no telemetry).

>>> inj = Injection.from_spec("gpu_fault:class=resource", replica="r1", at_s=30, for_s=60)
>>> inj.param("class"), inj.param("share")
('resource', 0.25)
>>> inj.label(start_ts=1000.0, model="m")["start"], inj.label(start_ts=1000.0)["end"]
(1030.0, 1090.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ParamValue = float | str

FAULT_KINDS: tuple[str, ...] = (
    "long_tail",
    "slow_replica",
    "batch_collapse",
    "context_burst",
    "gpu_fault",
    "kv_pressure",
    "replica_silence",
)

DEFAULT_PARAMS: dict[str, dict[str, ParamValue]] = {
    "long_tail": {"share": 0.2, "factor_min": 5.0, "factor_max": 10.0},
    "slow_replica": {"factor": 3.0},
    "batch_collapse": {"stuck_share": 0.7, "max_batch": 12.0, "queue_growth_per_s": 2.0, "queue_max": 128.0,
                       "wait_ms_per_queued": 10.0, "phase_s": 10.0},
    "context_burst": {"mean_tokens": 16384.0, "cv": 0.5, "max_tokens": 32768.0},
    "gpu_fault": {"class": "hardware", "share": 0.25, "error": "", "codes": 0.0, "xid": -1.0},
    "kv_pressure": {"mode": "fragmentation", "hit_rate": 0.3, "fragmentation": 0.6, "tokens_per_s": 60.0},
    "replica_silence": {},
}

# CUDA runtime `cudaError_t` names and their numbers (CUDA 12 driver_types.h), grouped by the
# seed's §4.3 classes. The detector's classifier is the authority; these are examples to send.
CUDA_ERRORS: dict[str, int] = {
    "cudaErrorInvalidValue": 1,
    "cudaErrorMemoryAllocation": 2,
    "cudaErrorInitializationError": 3,
    "cudaErrorNoDevice": 100,
    "cudaErrorECCUncorrectable": 214,
    "cudaErrorIllegalAddress": 700,
    "cudaErrorLaunchOutOfResources": 701,
    "cudaErrorLaunchTimeout": 702,
    "cudaErrorLaunchFailure": 719,
    "cudaErrorUnknown": 999,
}
CUDA_ERROR_CLASSES: dict[str, tuple[str, ...]] = {
    "transient": ("cudaErrorLaunchTimeout", "cudaErrorLaunchOutOfResources"),
    "resource": ("cudaErrorMemoryAllocation", "cudaErrorInvalidValue"),
    "hardware": ("cudaErrorIllegalAddress", "cudaErrorECCUncorrectable", "cudaErrorLaunchFailure"),
}
HARDWARE_XID = 79  # NVIDIA XID 79: GPU has fallen off the bus


class FaultError(ValueError):
    """An injection that cannot be used; the message says which part and what is allowed."""


def _coerce(kind: str, name: str, value: Any) -> ParamValue:
    defaults = DEFAULT_PARAMS[kind]
    if name not in defaults:
        known = ", ".join(defaults) or "none"
        raise FaultError(f"{kind}: unknown parameter {name!r} (known: {known})")
    if isinstance(defaults[name], str):
        return str(value)
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise FaultError(f"{kind}.{name}: expected a number, got {value!r}") from exc


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault on one replica over ``[at_s, at_s + for_s)`` seconds after the run's start."""

    kind: str
    replica: str
    at_s: float
    for_s: float
    params: Mapping[str, ParamValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise FaultError(f"unknown fault kind {self.kind!r} (known: {', '.join(FAULT_KINDS)})")
        if self.at_s < 0 or self.for_s <= 0:
            raise FaultError(f"{self.kind} on {self.replica}: need --at >= 0 and --for > 0, "
                             f"got {self.at_s}, {self.for_s}")
        checked = {name: _coerce(self.kind, name, value) for name, value in self.params.items()}
        object.__setattr__(self, "params", checked)
        if self.kind == "gpu_fault":
            cls, error = self.param("class"), self.param("error")
            if error and error not in CUDA_ERRORS:
                raise FaultError(f"gpu_fault.error: unknown {error!r} (known: {', '.join(CUDA_ERRORS)})")
            if not error and cls not in CUDA_ERROR_CLASSES:
                raise FaultError(f"gpu_fault.class: {cls!r} (known: {', '.join(CUDA_ERROR_CLASSES)})")
        if self.kind == "kv_pressure" and self.param("mode") not in ("fragmentation", "underutilized"):
            raise FaultError(f"kv_pressure.mode: {self.param('mode')!r} "
                             "(known: fragmentation, underutilized)")

    @classmethod
    def from_spec(cls, spec: str, replica: str, at_s: float, for_s: float,
                  extra: Mapping[str, Any] | None = None) -> Injection:
        """``KIND[:name=value,...]`` as typed after ``--inject``; ``extra`` adds ``--param`` values."""
        kind, _, rest = spec.partition(":")
        params: dict[str, Any] = dict(extra or {})
        for part in filter(None, (p.strip() for p in rest.split(","))):
            name, sep, value = part.partition("=")
            if not sep:
                raise FaultError(f"--inject {spec}: parameters are name=value, got {part!r}")
            params[name.strip()] = value.strip()
        return cls(kind=kind.strip(), replica=replica, at_s=float(at_s), for_s=float(for_s), params=params)

    def param(self, name: str) -> Any:
        """The parameter's value, or its documented default."""
        return self.params.get(name, DEFAULT_PARAMS[self.kind][name])

    def window(self, start_ts: float) -> tuple[float, float]:
        """The fault's ``[start, end)`` in event-time epoch seconds."""
        return start_ts + self.at_s, start_ts + self.at_s + self.for_s

    def label(self, start_ts: float, model: str | None = None) -> dict[str, Any]:
        """Ground truth for the labels file."""
        start, end = self.window(start_ts)
        out: dict[str, Any] = {"replica": self.replica, "kind": self.kind, "start": start, "end": end}
        if model is not None:
            out["model"] = model
        out["params"] = dict(self.params)
        return out

    # Derived values the generators share, so both realise a kind the same way.
    def cuda_error_choices(self) -> tuple[str, ...]:
        error = str(self.param("error"))
        return (error,) if error else CUDA_ERROR_CLASSES[str(self.param("class"))]

    def xid(self) -> int | None:
        """The XID telemetry reports while the fault lasts (None: none)."""
        if self.kind != "gpu_fault":
            return None
        xid = int(self.param("xid"))
        if xid >= 0:
            return xid
        hardware = self.param("error") in CUDA_ERROR_CLASSES["hardware"] or (
            not self.param("error") and self.param("class") == "hardware")
        return HARDWARE_XID if hardware else None


def write_labels(path: str | Path, labels: Iterable[Mapping[str, Any]]) -> None:
    """Write the labels file atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(list(labels), option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def read_labels(path: str | Path) -> list[dict[str, Any]]:
    data = orjson.loads(Path(path).read_bytes())
    if not isinstance(data, list):
        raise FaultError(f"{path}: a labels file is a JSON list")
    return data
