"""Read GPU state through NVML (``pynvml``, package nvidia-ml-py) into TelemetrySamples.

A collector on each GPU node reads memory used/total, utilisation, power, temperature, clock
throttle reasons, ECC counts and XID events (docs/design.md, "GPU telemetry"). Every NVML call
a GPU does not support yields ``None`` for that field (unknown), never a crash and never a zero;
a machine without NVML is reported in one line, not a traceback.

Units: memory in bytes (``nvmlDeviceGetMemoryInfo``), utilisation 0..1 (NVML gives percent),
power in W (NVML gives mW), temperature in degrees C, throttle reasons as NVML's
clocks-event-reasons bitmask, ECC as the volatile uncorrected total. XIDs come from an NVML
event set registered for ``nvmlEventTypeXidCriticalError``; :meth:`NvmlReader.wait_xid`
waits on it with a timeout, so it never holds the sampling loop.

Every NVML call goes through the ``pynvml`` module attribute at call time, so tests replace
NVML exactly at the pynvml function boundary. :class:`SimulatedReader` has the same
interface for machines without a GPU (``--simulate``, source ``"simulated"``).

>>> reader = SimulatedReader(gpus=2, node="demo", seed=1)
>>> reader.open()
>>> [(s.replica, s.source, 0.0 <= (s.utilization_gpu or 0.0) <= 1.0) for s in reader.read(now=0.0)]
[('demo-gpu0', 'simulated', True), ('demo-gpu1', 'simulated', True)]
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pynvml

from skewwatch.collect.replica_map import replica_for
from skewwatch.collect.xid_window import XidWindow
from skewwatch.errors import SkewwatchError
from skewwatch.schemas.telemetry_sample import TelemetrySample

log = logging.getLogger(__name__)

T = TypeVar("T")

XID_WINDOW_S = 300.0  # xid_count_5m
MAX_EVENTS_PER_WAIT = 64  # drain at most this many queued events per wait, then sample


class NvmlUnavailable(SkewwatchError, RuntimeError):
    """NVML cannot be used on this machine; ``str()`` is one line for the user."""

    exit_code = 2  # collect-gpu: the option cannot be used on this machine (--simulate can)


class GpuReader(Protocol):
    """What the collector loop needs from NVML (or its simulation)."""

    source: str

    def open(self) -> None: ...
    def read(self, now: float) -> list[TelemetrySample]: ...
    def read_gpus(self, indices: Iterable[int], now: float) -> list[TelemetrySample]: ...
    @property
    def waits_for_events(self) -> bool: ...
    def wait_xid(self, timeout_s: float) -> list[int]: ...
    def close(self) -> None: ...


def _text(value: bytes | str) -> str:
    # pynvml returns str in recent versions and bytes in old ones
    return value.decode() if isinstance(value, bytes) else value


def _unsupported_errors() -> tuple[type[BaseException], ...]:
    """NVML errors that mean "this GPU / driver does not give this value": the field is unknown."""
    names = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")
    return tuple(getattr(pynvml, n) for n in names if hasattr(pynvml, n))


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str | None
    replica: str
    xid: XidWindow | None = None  # None: XID events not supported here, so xid fields are unknown
    unsupported: set[str] = field(default_factory=set)  # fields NVML said it cannot give (asked once)
    failing: set[str] = field(default_factory=set)  # fields whose last read failed (logged once)


class NvmlReader:
    """One TelemetrySample per GPU from NVML; XID events through an NVML event set."""

    source = "nvml"

    def __init__(self, replica_map: Mapping[str, str] | None = None, node: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.replica_map = dict(replica_map or {})
        self.node = node or socket.gethostname()
        self._clock = clock
        self._gpus: list[_Gpu] = []
        self._event_set: Any = None
        self._initialised = False

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Initialise NVML, list the GPUs, register for critical XID events.

        Raises :class:`NvmlUnavailable` (one line) when NVML or the driver is missing or no GPU is visible.
        """
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML is not available on this machine ({exc}); is the NVIDIA driver installed? "
                "Use --simulate for simulated samples."
            ) from None
        self._initialised = True
        try:
            count = pynvml.nvmlDeviceGetCount()
            for index in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = self._uuid_of(handle)
                replica = replica_for(index, uuid, self.replica_map, self.node)
                self._gpus.append(_Gpu(index=index, handle=handle, uuid=uuid, replica=replica))
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML could not list the GPUs ({exc})") from None
        if not self._gpus:
            self.close()
            raise NvmlUnavailable("NVML found no GPU on this machine; use --simulate for simulated samples.")
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML event sets unavailable (%s): XID fields will be unknown", exc)
            return
        for gpu in self._gpus:
            try:
                xid_event = pynvml.nvmlEventTypeXidCriticalError
                pynvml.nvmlDeviceRegisterEvents(gpu.handle, xid_event, self._event_set)
            except pynvml.NVMLError as exc:
                log.warning("GPU %d: cannot register for XID events (%s): XID fields unknown", gpu.index, exc)
                continue
            gpu.xid = XidWindow(XID_WINDOW_S)
        if not any(g.xid is not None for g in self._gpus):
            self._free_event_set()

    def _free_event_set(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def close(self) -> None:
        self._free_event_set()
        if self._initialised:
            self._initialised = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    @property
    def gpu_indices(self) -> list[int]:
        return [g.index for g in self._gpus]

    # ------------------------------------------------------------------ sampling
    @staticmethod
    def _uuid_of(handle: Any) -> str | None:
        try:
            return _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            return None

    def _query(self, gpu: _Gpu, name: str, call: Callable[[], T]) -> T | None:
        """One NVML read for one field: unsupported -> None (and not asked again), other errors -> None."""
        if name in gpu.unsupported:
            return None
        try:
            value = call()
        except _unsupported_errors():
            gpu.unsupported.add(name)
            return None
        except pynvml.NVMLError as exc:
            if name not in gpu.failing:  # log the first failure of a field, not every interval
                log.warning("GPU %d: NVML read of %s failed: %s", gpu.index, name, exc)
                gpu.failing.add(name)
            return None
        gpu.failing.discard(name)
        return value

    @staticmethod
    def _clock_reasons(handle: Any) -> int:
        # nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons (deprecated, same bitmask)
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except (AttributeError, pynvml.NVMLError_FunctionNotFound):
            return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _sample(self, gpu: _Gpu, now: float) -> TelemetrySample:
        h = gpu.handle
        memory = self._query(gpu, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        util = self._query(gpu, "utilization_gpu", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
        power_mw = self._query(gpu, "power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
        temperature = self._query(
            gpu, "temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        )
        throttle = self._query(gpu, "throttle_reasons", lambda: self._clock_reasons(h))
        ecc = self._query(
            gpu,
            "ecc_uncorrected_total",
            lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
        )
        return TelemetrySample(
            ts=now,
            replica=gpu.replica,
            source=self.source,
            node=self.node,
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            memory_used_bytes=float(memory.used) if memory is not None else None,
            memory_total_bytes=float(memory.total) if memory is not None else None,
            utilization_gpu=min(max(util.gpu / 100.0, 0.0), 1.0) if util is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            throttle_reasons=int(throttle) if throttle is not None else None,
            ecc_uncorrected_total=int(ecc) if ecc is not None else None,
            xid_last=gpu.xid.last(now) if gpu.xid is not None else None,
            xid_count_5m=gpu.xid.count(now) if gpu.xid is not None else None,
        )

    def read(self, now: float) -> list[TelemetrySample]:
        """One sample per GPU."""
        return [self._sample(gpu, now) for gpu in self._gpus]

    def read_gpus(self, indices: Iterable[int], now: float) -> list[TelemetrySample]:
        """Samples for some GPUs only (those that just reported an XID)."""
        wanted = set(indices)
        return [self._sample(gpu, now) for gpu in self._gpus if gpu.index in wanted]

    # ------------------------------------------------------------------ XID events
    @property
    def waits_for_events(self) -> bool:
        return self._event_set is not None

    def _gpu_for_event(self, device: Any) -> _Gpu | None:
        uuid = self._uuid_of(device)
        for gpu in self._gpus:
            if (uuid is not None and gpu.uuid == uuid) or gpu.handle is device:
                return gpu
        return None

    def wait_xid(self, timeout_s: float) -> list[int]:
        """Wait up to ``timeout_s`` for critical XID events; record them; return the GPUs that had one.

        Blocking (NVML's wait is a C call): run it in a worker thread. Bounded by the timeout,
        then by :data:`MAX_EVENTS_PER_WAIT` queued events drained without waiting.
        """
        if self._event_set is None:
            time.sleep(max(timeout_s, 0.0))
            return []
        hit: list[int] = []
        timeout_ms = max(int(timeout_s * 1000), 0)
        started = time.monotonic()
        for _ in range(MAX_EVENTS_PER_WAIT):
            try:
                data = pynvml.nvmlEventSetWait(self._event_set, timeout_ms)
            except pynvml.NVMLError_Timeout:
                break
            except pynvml.NVMLError as exc:
                log.warning("NVML event wait failed: %s", exc)
                # do not spin on a persistent error: use up the rest of the wait
                time.sleep(max(timeout_s - (time.monotonic() - started), 0.0))
                break
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                gpu = self._gpu_for_event(data.device)
                if gpu is None or gpu.xid is None:
                    log.warning("XID %d on an unknown GPU", int(data.eventData))
                else:
                    xid = int(data.eventData)
                    gpu.xid.record(xid, self._clock())
                    log.warning("GPU %d (%s): XID %d", gpu.index, gpu.replica, xid)
                    if gpu.index not in hit:
                        hit.append(gpu.index)
            timeout_ms = 0  # drain what is already queued, without waiting again
        return hit


@dataclass(slots=True)
class _SimulatedGpu:
    index: int
    uuid: str
    replica: str
    memory_ratio: float
    utilization: float
    xid: XidWindow = field(default_factory=lambda: XidWindow(XID_WINDOW_S))


class SimulatedReader:
    """Plausible GPU samples for machines without a GPU: a seeded random walk, source ``"simulated"``."""

    source = "simulated"
    waits_for_events = False

    def __init__(self, gpus: int = 2, node: str | None = None, replica_map: Mapping[str, str] | None = None,
                 seed: int | None = None, memory_total_bytes: float = 80 * 1024**3) -> None:
        self.node = node or socket.gethostname()
        self._rng = random.Random(seed)
        self._total = memory_total_bytes
        mapping = dict(replica_map or {})
        self._gpus: list[_SimulatedGpu] = []
        for i in range(gpus):
            uuid = f"GPU-sim-{self.node}-{i}"
            replica = replica_for(i, uuid, mapping, self.node)
            memory_ratio, utilization = self._rng.uniform(0.5, 0.8), self._rng.uniform(0.4, 0.9)
            self._gpus.append(_SimulatedGpu(i, uuid, replica, memory_ratio, utilization))

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def inject_xid(self, gpu_index: int, xid: int, ts: float) -> None:
        """Make a simulated GPU report an XID (demo / tests)."""
        self._gpus[gpu_index].xid.record(xid, ts)

    def wait_xid(self, timeout_s: float) -> list[int]:
        time.sleep(max(timeout_s, 0.0))
        return []

    def _walk(self, value: float, step: float, low: float, high: float) -> float:
        return min(max(value + self._rng.uniform(-step, step), low), high)

    def _sample(self, gpu: _SimulatedGpu, now: float) -> TelemetrySample:
        gpu.memory_ratio = self._walk(gpu.memory_ratio, 0.03, 0.3, 0.97)
        gpu.utilization = util = self._walk(gpu.utilization, 0.08, 0.05, 1.0)
        return TelemetrySample(
            ts=now,
            replica=gpu.replica,
            source=self.source,
            node=self.node,
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            memory_used_bytes=float(round(gpu.memory_ratio * self._total)),
            memory_total_bytes=self._total,
            utilization_gpu=round(util, 4),
            power_w=round(90.0 + 600.0 * util, 1),
            temperature_c=round(32.0 + 45.0 * util + self._rng.uniform(-1.0, 1.0), 1),
            throttle_reasons=0,
            ecc_uncorrected_total=0,
            xid_last=gpu.xid.last(now),
            xid_count_5m=gpu.xid.count(now),
        )

    def read(self, now: float) -> list[TelemetrySample]:
        return [self._sample(gpu, now) for gpu in self._gpus]

    def read_gpus(self, indices: Iterable[int], now: float) -> list[TelemetrySample]:
        wanted = set(indices)
        return [self._sample(gpu, now) for gpu in self._gpus if gpu.index in wanted]
