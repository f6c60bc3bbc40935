"""The real NVML path, no fakes: run on a machine with an NVIDIA GPU (``.venv/bin/pytest tests/gpu -q``).

Everything here is skipped, with the NVML error as the reason, where NVML cannot initialise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from skewwatch.collect.collect_gpu_command import run_collector
from skewwatch.collect.nvml_collector import NvmlReader
from skewwatch.collect.publish import encode_sample
from skewwatch.schemas.telemetry import decode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample

REPO = Path(__file__).resolve().parents[2]


def _nvml_problem() -> str | None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"no usable NVML here ({exc}): needs an NVIDIA GPU and driver"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML initialised but sees no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


NVML_PROBLEM = _nvml_problem()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NVML_PROBLEM is not None, reason=NVML_PROBLEM or "")]


@pytest.fixture
def reader() -> Iterator[NvmlReader]:
    nvml_reader = NvmlReader()
    nvml_reader.open()
    yield nvml_reader
    nvml_reader.close()


def gpu_count() -> int:
    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def test_one_plausible_sample_per_gpu(reader: NvmlReader) -> None:
    samples = reader.read(now=time.time())
    assert len(samples) == gpu_count() == len(reader.gpu_indices)
    for sample in samples:
        print(sample.to_dict())
        assert sample.source == "nvml" and sample.replica == f"{reader.node}-gpu{sample.gpu_index}"
        assert sample.gpu_uuid and sample.gpu_uuid.startswith(("GPU-", "MIG-"))
        assert sample.memory_total_bytes is not None and sample.memory_total_bytes > 0
        assert sample.memory_used_bytes is not None and 0 <= sample.memory_used_bytes <= sample.memory_total_bytes
        if sample.utilization_gpu is not None:
            assert 0.0 <= sample.utilization_gpu <= 1.0
        if sample.temperature_c is not None:
            assert 5.0 < sample.temperature_c < 110.0
        if sample.power_w is not None:
            assert 0.0 < sample.power_w < 2000.0  # watts, not milliwatts
        if sample.xid_count_5m is not None:
            assert sample.xid_count_5m >= 0
        assert decode_telemetry(encode_sample(sample)) == sample


def test_xid_wait_is_bounded(reader: NvmlReader) -> None:
    started = time.monotonic()
    reader.wait_xid(0.2)  # a healthy GPU reports nothing; either way the wait must end
    assert time.monotonic() - started < 3.0


async def test_collector_loop_on_real_nvml(reader: NvmlReader) -> None:
    published: list[TelemetrySample] = []
    rounds = await run_collector(reader, published.append, interval_s=0.2, stop=None, max_rounds=2)
    assert rounds == 2 and len(published) >= 2 * len(reader.gpu_indices)


def test_once_cli_prints_valid_samples() -> None:
    proc = subprocess.run([sys.executable, "-m", "skewwatch", "collect-gpu", "--once"], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == gpu_count()
    for line in lines:
        sample = decode_telemetry(line.encode())
        assert isinstance(sample, TelemetrySample), sample
        assert sample.source == "nvml" and (sample.memory_total_bytes or 0) > 0
