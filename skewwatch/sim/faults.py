"""Injected faults and their ground truth: what goes wrong, on which replica, when.

``--inject KIND --replica R --at T --for D`` makes each of the seed's detectors (seed §2.4, §2.5,
§4.3) fire, in the statistical generator and in the fleet simulator alike, and a labels file
(JSON list of ``{replica, kind, start, end}``, event-time epoch seconds) is the ground truth of
the detection-quality benchmark. This module is the one description of a fault that both
generators read; each decides how to realise it. Every kind has documented parameters whose
defaults are chosen to cross the matching detector's rule clearly, not marginally (see
docs/simulator.md).

**A fault means the same thing on every trace.** Magnitudes are relative to the trace or to the
replica, never absolute token counts or milliseconds: a context burst is ``factor`` x the
trace's P90 prompt, a long tail stalls requests by k x the replica's own median latency, a slow
replica decodes ``factor`` x slower than itself.

Kinds and their parameters (defaults in :data:`DEFAULT_PARAMS`):

- ``long_tail``: a ``share`` of requests stall: each takes (k - 1) x the replica's own median
  latency longer than it would have (k drawn in ``factor_min``..``factor_max``), so a request of
  median length takes k x the median (P99 > 3 x P50 while P50 barely moves). The simulator's
  median is the replica's own over its last finished requests before the stall; the generator,
  whose latencies sit tightly around their median, multiplies the request's latency by k.
- ``slow_replica``: every request's decode is ``factor`` x slower than the replica's own
  (thermal throttling).
- ``batch_collapse``: the scheduler is stuck at batch 1-2 for a ``stuck_share`` of requests and
  runs 4..``max_batch`` for the rest (std ~ 3.4 > 2, fill ~ 11 % < 30 % at capacity 32) while the
  queue grows by ``queue_growth_per_s`` up to ``queue_max``; each queued request adds
  ``wait_ms_per_queued`` to latency and TTFT. The fleet simulator draws the limit (1-2 with
  probability ``stuck_share``, else 4..``max_batch``) once per ``phase_s`` seconds and only stops
  admissions, so its queue grows by itself; the generator ignores ``phase_s``.
- ``context_burst``: prompts log-normal with mean ``factor`` x the trace's P90 prompt length
  (``mean_tokens`` > 0 sets an absolute mean instead) and coefficient of variation ``cv``, at
  most ``max_tokens`` (0: twice the mean).
- ``gpu_fault``: a ``share`` of requests fail with a CUDA error of class ``class``
  (``transient``, ``resource``, ``hardware``) or exactly ``error``; ``codes=1`` sends the integer
  code instead of the name; telemetry reports XID ``xid`` (79 for hardware by default).
- ``kv_pressure``: ``mode=fragmentation`` (hit rate ``hit_rate``, fragmentation ``fragmentation``)
  or ``mode=underutilized`` (hit rate 0.95, completions cut to about ``tokens_per_s`` tokens/s).
- ``replica_silence``: the replica reports nothing (no requests, no telemetry).
- ``ttft_drift`` (no rule is meant for it): the replica's time to first token rises linearly from
  its own usual to ``factor`` x that over ``ramp_s`` seconds, then stays there; decode is unchanged.
- ``throughput_drop`` (no rule is meant for it): the replica's requests get ``drop`` shorter (their
  output lengths) while their latency holds (each decode step slower by the same share): tokens/s
  falls by ``drop``, latency does not move.
- ``quiet_pool`` (pool level: ``--replica`` names the model, or any replica of it): no request
  arrives for any replica of the model, while other models keep event time moving. With
  ``telemetry=1`` (default) the idle engines keep publishing telemetry (alive, nothing running);
  with ``telemetry=0`` they are silent too. The label's ``replica`` is null.

>>> inj = Injection.from_spec("gpu_fault:class=resource", replica="r1", at_s=30, for_s=60)
>>> inj.param("class"), inj.param("share")
('resource', 0.25)
>>> inj.label(start_ts=1000.0, model="m")["start"], inj.label(start_ts=1000.0)["end"]
(1030.0, 1090.0)
>>> Injection("quiet_pool", "llama", 0, 180).label(start_ts=0.0)["replica"] is None
True
>>> Injection("context_burst", "r0", 0, 60).burst_mean_tokens(prompt_p90=2734.5)
10938.0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from skewwatch.errors import SkewwatchError

ParamValue = float | str

FAULT_KINDS: tuple[str, ...] = (
    "long_tail",
    "slow_replica",
    "batch_collapse",
    "context_burst",
    "gpu_fault",
    "kv_pressure",
    "replica_silence",
    "quiet_pool",
    "ttft_drift",
    "throughput_drop",
)
POOL_KINDS: frozenset[str] = frozenset({"quiet_pool"})  # faults of a whole model pool, not one replica

DEFAULT_PARAMS: dict[str, dict[str, ParamValue]] = {
    "long_tail": {"share": 0.2, "factor_min": 5.0, "factor_max": 10.0},
    "slow_replica": {"factor": 3.0},
    "batch_collapse": {"stuck_share": 0.7, "max_batch": 12.0, "queue_growth_per_s": 2.0, "queue_max": 128.0,
                       "wait_ms_per_queued": 10.0, "phase_s": 10.0},
    # factor 4 x P90: conv 10.9k, code 20.8k, mooncake 154k tokens (conv's P90 is 2,734 tokens)
    "context_burst": {"factor": 4.0, "cv": 0.5, "mean_tokens": 0.0, "max_tokens": 0.0},
    "gpu_fault": {"class": "hardware", "share": 0.25, "error": "", "codes": 0.0, "xid": -1.0},
    "kv_pressure": {"mode": "fragmentation", "hit_rate": 0.3, "fragmentation": 0.6, "tokens_per_s": 60.0},
    "replica_silence": {},
    "quiet_pool": {"telemetry": 1.0},
    "ttft_drift": {"factor": 2.0, "ramp_s": 600.0},
    "throughput_drop": {"drop": 0.4},
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


class FaultError(SkewwatchError, ValueError):
    """An injection that cannot be used; the message says which part and what is allowed."""

    exit_code = 2  # a bad --inject is a usage error


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
        if self.kind == "ttft_drift" and not (float(self.param("factor")) > 0 and float(self.param("ramp_s")) >= 0):
            raise FaultError("ttft_drift: need factor > 0 and ramp_s >= 0")
        if self.kind == "throughput_drop" and not 0.0 <= float(self.param("drop")) < 1.0:
            raise FaultError(f"throughput_drop.drop: must be in [0, 1), got {self.param('drop')!r}")
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

    @property
    def pool_level(self) -> bool:
        """True for faults of a whole pool (``replica`` then names the model or one of its replicas)."""
        return self.kind in POOL_KINDS

    def burst_mean_tokens(self, prompt_p90: float) -> float:
        """``context_burst``: the mean prompt of the burst for a trace whose P90 prompt is ``prompt_p90``."""
        absolute = float(self.param("mean_tokens"))
        return absolute if absolute > 0 else float(self.param("factor")) * max(prompt_p90, 1.0)

    def burst_max_tokens(self, prompt_p90: float) -> float:
        """``context_burst``: the longest prompt of the burst (``max_tokens``, else twice the mean)."""
        cap = float(self.param("max_tokens"))
        return cap if cap > 0 else 2.0 * self.burst_mean_tokens(prompt_p90)

    def window(self, start_ts: float) -> tuple[float, float]:
        """The fault's ``[start, end)`` in event-time epoch seconds."""
        return start_ts + self.at_s, start_ts + self.at_s + self.for_s

    def label(self, start_ts: float, model: str | None = None) -> dict[str, Any]:
        """Ground truth for the labels file (a pool-level fault has ``replica`` null and ``model`` set:
        the caller's, else the injection's target)."""
        start, end = self.window(start_ts)
        out: dict[str, Any] = {"replica": None if self.pool_level else self.replica, "kind": self.kind,
                               "start": start, "end": end}
        if model is not None or self.pool_level:
            out["model"] = model if model is not None else self.replica
        out["params"] = dict(self.params)
        return out

    # Derived values the generators share, so both realise a kind the same way.
    def ttft_factor(self, t: float, start_ts: float) -> float:
        """``ttft_drift``: the replica's TTFT at event time ``t`` as a multiple of its usual.

        >>> inj = Injection("ttft_drift", "r0", 100, 900)
        >>> [inj.ttft_factor(t, 0.0) for t in (100.0, 400.0, 700.0, 900.0)]
        [1.0, 1.5, 2.0, 2.0]
        """
        start = self.window(start_ts)[0]
        ramp = float(self.param("ramp_s"))
        done = 1.0 if ramp <= 0 else min(max((t - start) / ramp, 0.0), 1.0)
        return 1.0 + (float(self.param("factor")) - 1.0) * done

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


def target_model(inj: Injection, pairs: Iterable[tuple[str, str]]) -> str:
    """The model an injection is on, given the run's ``(model, replica)`` pairs; FaultError if none.

    A replica-level fault names a replica; a pool-level one names the model or any of its replicas.

    >>> pairs = [("a", "r0"), ("a", "r1"), ("b", "r2")]
    >>> target_model(Injection("long_tail", "r2", 0, 1), pairs), target_model(Injection("quiet_pool", "a", 0, 1), pairs)
    ('b', 'a')
    """
    pairs = list(pairs)
    for model, replica in pairs:
        if inj.replica == replica:
            return model
    if inj.pool_level and inj.replica in {m for m, _ in pairs}:
        return inj.replica
    names = sorted({r for _, r in pairs} | ({m for m, _ in pairs} if inj.pool_level else set()))
    what = "model or replica" if inj.pool_level else "replica"
    raise FaultError(f"--inject {inj.kind}: no {what} {inj.replica!r} (known: {', '.join(names)})")


def check_targets(injections: Iterable[Injection], pairs: Iterable[tuple[str, str]]) -> None:
    """A configuration's check: every injection names a replica (or model) of the run; the
    :func:`target_model` error of the first that does not, as a ValueError."""
    pairs = list(pairs)
    for inj in injections:
        try:
            target_model(inj, pairs)
        except FaultError as exc:
            raise ValueError(str(exc)) from exc


def applies_to(inj: Injection, model: str, replica: str, target: str) -> bool:
    """Whether ``inj`` (on model ``target``, see :func:`target_model`) acts on this replica."""
    return model == target if inj.pool_level else inj.replica == replica


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
