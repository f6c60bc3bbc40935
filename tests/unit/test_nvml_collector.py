"""The NVML collector with NVML replaced ONLY at the pynvml function boundary.

Samples carry the right fields and units, XID events become samples, and a machine without NVML
gets the one-line error. The fakes return pynvml's own ctypes structures and raise pynvml's own error classes
(``pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)`` becomes ``NVMLError_NotSupported``), so the code under
test runs unchanged; the real-NVML counterpart is tests/gpu/test_nvml_real.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pynvml
import pytest
from click.testing import CliRunner

from skewwatch.collect.collect_gpu_command import collect_gpu_command, run_collector
from skewwatch.collect.nvml_collector import NvmlReader, NvmlUnavailable, SimulatedReader
from skewwatch.collect.publish import encode_sample
from skewwatch.collect.replica_map import ReplicaMapError, load_replica_map
from skewwatch.schemas.telemetry import decode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample

REPO = Path(__file__).resolve().parents[2]
UNSUPPORTED = "unsupported"  # marker in a FakeGpu field: that NVML call raises NVMLError_NotSupported


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    """What one GPU answers, in NVML's own units (bytes, percent, mW, C, bitmask)."""

    uuid: Any
    memory_used: int = 60 * 1024**3
    memory_total: int = 80 * 1024**3
    util_percent: Any = 87
    power_mw: Any = 512_347
    temperature_c: Any = 64
    clocks_event_reasons: Any = 0x4  # SwPowerCap
    new_clocks_api: bool = True  # False: only nvmlDeviceGetCurrentClocksThrottleReasons exists (old driver)
    ecc_uncorrected: Any = 0
    xid_events: Any = True  # False: registering for XID events is not supported


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    events: deque[tuple[int, int]] = field(default_factory=deque)  # (gpu index, xid) queued in the event set
    calls: dict[str, int] = field(default_factory=dict)
    initialised: bool = False

    def count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        handles = [SimpleNamespace(index=i) for i in range(len(self.gpus))]

        def gpu(handle: Any) -> FakeGpu:
            return self.gpus[handle.index]

        def answer(name: str, value: Any) -> Any:
            self.count(name)
            if isinstance(value, Exception):
                raise value
            if isinstance(value, str) and value == UNSUPPORTED:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return value

        def init() -> None:
            self.initialised = True

        def shutdown() -> None:
            self.initialised = False

        def memory(h: Any) -> Any:
            g = gpu(h)
            return answer("memory", pynvml.c_nvmlMemory_t(total=g.memory_total, free=g.memory_total - g.memory_used,
                                                          used=g.memory_used))

        def utilization(h: Any) -> Any:
            g = gpu(h)
            value = answer("utilization", g.util_percent)
            return pynvml.c_nvmlUtilization_t(gpu=value, memory=30)

        def clocks_new(h: Any) -> int:
            if not gpu(h).new_clocks_api:
                raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return int(answer("clocks", gpu(h).clocks_event_reasons))

        def temperature(h: Any, sensor: int) -> int:
            assert sensor == pynvml.NVML_TEMPERATURE_GPU
            return int(answer("temperature", gpu(h).temperature_c))

        def ecc(h: Any, error_type: int, counter_type: int) -> int:
            assert (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
            return int(answer("ecc", gpu(h).ecc_uncorrected))

        def register(h: Any, event_types: int, event_set: Any) -> None:
            assert event_types & pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
            if not gpu(h).xid_events:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def wait(event_set: Any, timeout_ms: int) -> Any:
            self.count("wait")
            if not self.events:
                time.sleep(min(timeout_ms, 50) / 1000)  # the real call blocks up to the timeout
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            index, xid = self.events.popleft()
            return SimpleNamespace(device=handles[index], eventType=pynvml.nvmlEventTypeXidCriticalError,
                                   eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

        patches = {
            "nvmlInit": init,
            "nvmlShutdown": shutdown,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
            "nvmlDeviceGetUUID": lambda h: gpu(h).uuid,
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetUtilizationRates": utilization,
            "nvmlDeviceGetPowerUsage": lambda h: answer("power", gpu(h).power_mw),
            "nvmlDeviceGetTemperature": temperature,
            "nvmlDeviceGetCurrentClocksEventReasons": clocks_new,
            "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: int(answer("clocks", gpu(h).clocks_event_reasons)),
            "nvmlDeviceGetTotalEccErrors": ecc,
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlDeviceRegisterEvents": register,
            "nvmlEventSetWait": wait,
            "nvmlEventSetFree": lambda s: None,
        }
        for name, fake in patches.items():
            assert hasattr(pynvml, name), name  # only replace functions pynvml really has
            monkeypatch.setattr(pynvml, name, fake)


H100 = FakeGpu(uuid="GPU-5f0e2a71-3c1b-8a4e-92d0-7a1c4b6e9f21")
# A workstation card: no ECC, no power reading, no XID events, an old driver without the new clocks call;
# pynvml < 11 returned bytes for the UUID.
WORKSTATION = FakeGpu(uuid=b"GPU-0b1d2c3e-aaaa-bbbb-cccc-0123456789ab", memory_used=3 * 1024**3,
                      memory_total=24 * 1024**3, util_percent=5, power_mw=UNSUPPORTED, temperature_c=38,
                      clocks_event_reasons=0x1, new_clocks_api=False, ecc_uncorrected=UNSUPPORTED, xid_events=False)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(gpus=[FakeGpu(**vars(H100)), FakeGpu(**vars(WORKSTATION))])
    fake.install(monkeypatch)
    return fake


def open_reader(**kwargs: Any) -> NvmlReader:
    reader = NvmlReader(node="gpu-node-7", **kwargs)
    reader.open()
    return reader


def test_samples_carry_the_right_fields_and_units(nvml: FakeNvml) -> None:
    reader = open_reader()
    full, partial = reader.read(now=1000.0)
    assert full == TelemetrySample(
        ts=1000.0, replica="gpu-node-7-gpu0", source="nvml", node="gpu-node-7", gpu_index=0,
        gpu_uuid="GPU-5f0e2a71-3c1b-8a4e-92d0-7a1c4b6e9f21",
        memory_used_bytes=60.0 * 1024**3, memory_total_bytes=80.0 * 1024**3,
        utilization_gpu=0.87,  # percent -> 0..1
        power_w=512.347,  # mW -> W
        temperature_c=64.0, throttle_reasons=0x4, ecc_uncorrected_total=0,
        xid_last=None, xid_count_5m=0,  # XID events registered, none seen: a known zero
    )
    # unsupported means unknown (absent on the wire), never zero
    assert (partial.power_w, partial.ecc_uncorrected_total, partial.xid_count_5m, partial.xid_last) == (None,) * 4
    assert partial.gpu_uuid == "GPU-0b1d2c3e-aaaa-bbbb-cccc-0123456789ab"  # bytes decoded
    assert partial.throttle_reasons == 0x1  # through the deprecated call on an old driver
    assert partial.memory_ratio == pytest.approx(3 / 24) and partial.utilization_gpu == pytest.approx(0.05)
    assert {"power_w", "ecc_uncorrected_total", "xid_last", "xid_count_5m"}.isdisjoint(partial.to_dict())
    assert [decode_telemetry(encode_sample(s)) for s in (full, partial)] == [full, partial]  # the contract holds
    reader.close()
    assert not nvml.initialised


def test_an_unsupported_call_is_not_asked_again_and_other_errors_do_not_crash(nvml: FakeNvml) -> None:
    reader = open_reader()
    for _ in range(3):
        reader.read(now=1.0)
    assert nvml.calls["power"] == 3 + 1  # GPU 0 every round, GPU 1 once (NotSupported is remembered)
    nvml.gpus[0].temperature_c = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml.gpus[0].util_percent = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    sample = reader.read(now=2.0)[0]
    assert (sample.temperature_c, sample.utilization_gpu) == (None, None)
    assert sample.memory_used_bytes == 60.0 * 1024**3  # the rest of the sample is still there
    nvml.gpus[0].temperature_c = 70
    assert reader.read(now=3.0)[0].temperature_c == 70.0  # a transient failure is retried


def test_an_xid_event_becomes_a_sample_with_last_and_5_minute_count(nvml: FakeNvml) -> None:
    clock = [1000.0]
    reader = open_reader(clock=lambda: clock[0])
    assert reader.waits_for_events
    nvml.events.extend([(0, 79), (0, 13)])
    assert reader.wait_xid(timeout_s=0.5) == [0]  # both drained in one wait, one GPU hit
    [sample] = reader.read_gpus([0], now=1001.0)
    assert (sample.gpu_index, sample.xid_last, sample.xid_count_5m) == (0, 13, 2)
    assert reader.read(now=1001.0)[1].xid_count_5m is None  # GPU 1 cannot report XIDs: unknown
    # five minutes later the events have left the window
    assert reader.read(now=1000.0 + 301.0)[0].xid_count_5m == 0
    assert reader.read(now=1000.0 + 301.0)[0].xid_last is None


def test_wait_xid_is_bounded_when_nothing_happens(nvml: FakeNvml) -> None:
    reader = open_reader()
    started = time.monotonic()
    assert reader.wait_xid(timeout_s=0.05) == []
    assert time.monotonic() - started < 1.0


async def test_collector_publishes_an_xid_sample_at_once_not_at_the_next_interval(nvml: FakeNvml) -> None:
    reader = open_reader()
    published: list[TelemetrySample] = []
    stop = asyncio.Event()

    def publish(sample: TelemetrySample) -> None:
        published.append(sample)
        if sample.xid_last == 79:
            stop.set()

    async def gpu_falls_off_the_bus() -> None:
        await asyncio.sleep(0.2)
        nvml.events.append((0, 79))

    started = time.monotonic()
    injector = asyncio.create_task(gpu_falls_off_the_bus())
    rounds = await asyncio.wait_for(run_collector(reader, publish, interval_s=30.0, stop=stop), timeout=10)
    await injector
    assert rounds == 1 and time.monotonic() - started < 5.0  # long before the 30 s interval
    first_round, xid_sample = published[:2], published[2]
    assert [s.gpu_index for s in first_round] == [0, 1] and all(s.xid_last is None for s in first_round)
    assert (xid_sample.gpu_index, xid_sample.replica, xid_sample.xid_last, xid_sample.xid_count_5m) == (
        0, "gpu-node-7-gpu0", 79, 1)


def test_replica_map_json_and_toml(nvml: FakeNvml, tmp_path: Path) -> None:
    as_json = tmp_path / "replicas.json"
    as_json.write_text(orjson.dumps({"0": "llama-a", H100.uuid: "llama-by-uuid"}).decode())
    reader = open_reader(replica_map=load_replica_map(as_json))
    assert [s.replica for s in reader.read(now=1.0)] == ["llama-by-uuid", "gpu-node-7-gpu1"]  # UUID wins
    as_toml = tmp_path / "replicas.toml"
    as_toml.write_text('[replicas]\n0 = "qwen-a"\n1 = "qwen-b"\n')
    reader = open_reader(replica_map=load_replica_map(as_toml))
    assert [s.replica for s in reader.read(now=1.0)] == ["qwen-a", "qwen-b"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"0": 5}')
    with pytest.raises(ReplicaMapError, match="must be a non-empty string"):
        load_replica_map(bad)


def test_missing_nvml_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library() -> None:
        raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(NvmlUnavailable) as raised:
        NvmlReader(node="n").open()
    assert "\n" not in str(raised.value) and "NVML Shared Library Not Found" in str(raised.value)
    result = CliRunner().invoke(collect_gpu_command, ["--once"])
    assert result.exit_code == 2 and "--simulate" in result.output and "Traceback" not in result.output


def nvml_really_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(nvml_really_present(), reason="NVML works here: the real path is tested in tests/gpu")
def test_the_real_cli_without_nvml_prints_one_line_and_exits_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "skewwatch", "collect-gpu", "--once"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 2  # ConfigProblem: --simulate works here, the default does not
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: NVML is not available") and proc.stdout == ""


def test_once_prints_one_json_sample_per_gpu(nvml: FakeNvml) -> None:
    result = CliRunner().invoke(collect_gpu_command, ["--once", "--node", "gpu-node-7"])
    assert result.exit_code == 0, result.output
    samples = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [(s["replica"], s["source"], s["gpu_index"]) for s in samples] == [
        ("gpu-node-7-gpu0", "nvml", 0), ("gpu-node-7-gpu1", "nvml", 1)]
    assert samples[0]["power_w"] == pytest.approx(512.347) and "power_w" not in samples[1]


def test_simulate_is_clearly_marked_and_plausible() -> None:
    result = CliRunner().invoke(collect_gpu_command, ["--once", "--simulate", "--simulate-gpus", "3", "--seed", "7"])
    assert result.exit_code == 0, result.output
    samples = [TelemetrySample.from_dict(orjson.loads(line)) for line in result.stdout.splitlines()]
    assert len(samples) == 3 and {s.source for s in samples} == {"simulated"}
    for s in samples:
        assert s.memory_ratio is not None and 0.3 <= s.memory_ratio <= 0.97
        assert s.utilization_gpu is not None and 0.0 <= s.utilization_gpu <= 1.0
        assert s.temperature_c is not None and 20.0 < s.temperature_c < 90.0
    reader = SimulatedReader(gpus=1, node="n", seed=1)
    reader.inject_xid(0, 79, ts=10.0)
    assert reader.read(now=11.0)[0].xid_last == 79
