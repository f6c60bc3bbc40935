"""The columnar windows: same features as the plain-Python reference on any stream, the per-replica
objects bit-identical to ``WindowSummary.features``, rows released and reused cleanly, a corrupt
snapshot refused and an exported state rebuilding the same windows."""

from __future__ import annotations

import math
from typing import Any

import hypothesis
import numpy as np
import orjson
import pytest
from hypothesis import strategies as st

from skewwatch.config import WindowSettings
from skewwatch.pipeline.window import PartitionWindows, ReplicaStep, WindowSummary
from skewwatch.schemas.requests.columns import RequestColumns
from tests.reference import reference_features
from tests.unit.test_window import assert_features_match, by_key, event, random_events

SETTINGS = WindowSettings()
KEYS = [("llama", "r1"), ("llama", "r2"), ("llama", "r3"), ("mistral", "m1"), ("mistral", "m2")]


def simple_events(seed: int, n: int, t0: float, t1: float) -> list[dict[str, Any]]:
    """A small, fixed event generator (the snapshot fixture below was written from it)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        model, replica = KEYS[int(rng.integers(len(KEYS)))]
        ev: dict[str, Any] = {"request_id": f"s{i}", "ts": round(float(rng.uniform(t0, t1)), 3), "model": model,
                              "replica": replica, "latency_ms": round(float(rng.lognormal(5.0, 1.0)), 3),
                              "prompt_tokens": int(rng.integers(0, 4000)),
                              "completion_tokens": int(rng.integers(0, 1000))}
        if i % 3:
            ev["batch_size"], ev["batch_capacity"] = int(rng.integers(1, 9)), 8
        if i % 2:
            ev["ttft_ms"] = round(float(rng.lognormal(3.0, 0.8)), 3)
        if i % 7 == 0:
            ev["status"], ev["cuda_error"] = "error", "cudaErrorLaunchTimeout"
        out.append(ev)
    return sorted(out, key=lambda e: e["ts"])


def check_step(step: ReplicaStep) -> None:
    """The columnar features equal the summary's own features exactly, also after JSON."""
    assert step.summary.features() == step.features
    assert WindowSummary.from_dict(orjson.loads(orjson.dumps(step.summary.to_dict()))).features() == step.features


class Tracked:
    """Windows fed in chunks, remembering which events were accepted (late ones are not)."""

    def __init__(self, settings: WindowSettings) -> None:
        self.settings = settings
        self.windows = PartitionWindows(settings)
        self.accepted: list[dict[str, Any]] = []
        self.late = 0
        self.steps: list[ReplicaStep] = []

    def feed(self, chunk: list[dict[str, Any]]) -> None:
        closed = self.windows.closed_through
        on_time = [e for e in chunk if closed is None or math.floor(e["ts"] / self.settings.step_s) > closed]
        result = self.windows.apply(RequestColumns.from_rows(chunk))
        assert result == (len(on_time), len(chunk) - len(on_time))
        self.accepted += on_time
        self.late += len(chunk) - len(on_time)
        self.close()

    def close(self) -> None:
        closed = self.windows.close_steps()
        assert len(closed) == sum(len(batch) for batch in closed.batches)
        for batch in closed.batches:
            assert batch.count.tolist() == [s.features.count for s in batch.replica_steps()]
        self.steps += closed


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 150), chunk=st.integers(1, 40),
                  idle=st.sampled_from([30.0, 60.0, 90.0]), restore_at=st.integers(0, 6))
def test_property_columnar_windows_match_the_reference(seed: int, n: int, chunk: int, idle: float,
                                                       restore_at: int) -> None:
    """Random streams with late events, gaps longer than the idle release (keys released, rows
    reused by others), events on step boundaries, unknown/derived batches, a snapshot + restore."""
    rng = np.random.default_rng(seed)
    settings = WindowSettings(idle_release_s=idle)
    missing = float(rng.choice([0.0, 0.4, 1.0]))
    # two bursts with a gap longer than the window + idle release, new keys in the second one
    first = random_events(rng, n, 500.0, 500.0 + float(rng.choice([3.0, 40.0, 150.0])), KEYS[:3], missing)
    second = random_events(rng, n, 900.0, 960.0, KEYS[1:], missing)
    events = first + second
    for e in events[::4]:
        e["ts"] = 5.0 * round(e["ts"] / 5.0)  # exactly on a step boundary
    arrival = np.array([e["ts"] for e in events]) + rng.uniform(0.0, 4.9, len(events))
    arrival[rng.random(len(events)) < 0.1] += 30.0  # some arrive far too late
    order = np.argsort(arrival, kind="stable")
    bursts = [[events[i] for i in order if arrival[i] < 800.0], [events[i] for i in order if arrival[i] >= 800.0]]
    tracked = Tracked(settings)
    k = 0
    for n_burst, burst in enumerate(bursts):
        for part in [burst[i:i + chunk] for i in range(0, len(burst), chunk)]:
            if k == restore_at:
                data = tracked.windows.snapshot()
                tracked.windows = PartitionWindows.restore(data, settings)
                assert tracked.windows.snapshot() == data
            tracked.feed(part)
            k += 1
        if n_burst == 0:  # the partition idles between the bursts, following the others' watermark:
            tracked.windows.advance_watermark(850.0)  # every key is released, the second burst's take
            tracked.close()  # their rows
            assert not tracked.windows.keys
    data = tracked.windows.snapshot()  # now with rows reused by the second burst's keys
    tracked.windows = PartitionWindows.restore(data, settings)
    assert tracked.windows.snapshot() == data
    tracked.windows.advance_watermark(max(e["ts"] for e in events) + 300.0)
    tracked.close()
    assert tracked.windows.late_total == tracked.late and not tracked.windows.keys
    for (model, replica), by_end in by_key(tracked.steps).items():
        for end, fv in by_end.items():
            assert_features_match(fv, reference_features(tracked.accepted, model, replica, end, settings))
    for step in tracked.steps:
        check_step(step)


def test_a_released_row_is_reused_clean() -> None:
    """idle_release_s below the window: a key whose last event sits exactly on the window's start
    is released while that event is still in the ring; the key that takes its row starts empty."""
    settings = WindowSettings(idle_release_s=10.0)  # idle = max(10, 60) = 60 s
    windows = PartitionWindows(settings)
    windows.apply(RequestColumns.from_rows([event(100.0, replica="a", latency_ms=5.0), event(101.0, replica="b")]))
    windows.advance_watermark(160.0)
    steps = by_key(windows.close_steps())
    assert max(steps[("m", "a")]) == 160.0 and steps[("m", "a")][160.0].count == 1  # reported, then released
    assert ("m", "a") not in windows.keys and ("m", "b") in windows.keys
    windows.apply(RequestColumns.from_rows([event(163.0, replica="c", latency_ms=50.0)]))
    windows.advance_watermark(170.0)
    later = by_key(windows.close_steps())
    c = later[("m", "c")][165.0]
    assert (c.count, c.step_count) == (1, 1) and c.latency_p99 is not None
    assert abs(c.latency_p99 - 50.0) <= 0.5  # not a's 5 ms
    assert later[("m", "b")][165.0].count == 0  # b's event (101) left the window at 165


def test_steps_are_columns_until_iterated() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(101.0), event(102.0, replica="r2"), event(107.0)]))
    windows.advance_watermark(115.0)
    closed = windows.close_steps()
    assert [(b.window_end, len(b)) for b in closed.batches] == [(105.0, 2), (110.0, 2), (115.0, 2)]
    assert all(b._steps is None for b in closed.batches)  # nothing built yet
    assert closed.batches[1].count.tolist() == [2, 1]
    assert closed[-1].features.window_end == 115.0 and len(closed) == 6
    assert closed == list(closed) and closed != []


# -- snapshot format (binary columns) ------------------------------------------------------------

def test_sketch_counts_above_uint16_are_kept() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0 + i * 1e-5, latency_ms=7.0) for i in range(70_000)]))
    windows.advance_watermark(110.0)
    windows.close_steps()  # the bucket is sealed: one slot holds 70,000
    restored = PartitionWindows.restore(windows.snapshot(), SETTINGS)
    restored.advance_watermark(115.0)
    assert [s.summary.latency[1].tolist() for s in restored.close_steps()] == [[70_000]]


def test_a_corrupt_snapshot_is_refused() -> None:
    import struct
    import zlib

    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0, ttft_ms=3.0), event(101.0, replica="r2")]))
    data = windows.snapshot()
    raw = zlib.decompress(data[4:])
    (header_len,) = struct.unpack_from("<I", raw)
    header = orjson.loads(raw[4:4 + header_len])

    def rebuilt(new_header: dict[str, Any], body: bytes | None = None) -> bytes:
        text = orjson.dumps(new_header)
        rest = raw[4 + header_len:] if body is None else body
        return b"SWW3" + zlib.compress(struct.pack("<I", len(text)) + text + rest, 1)

    body = bytearray(raw[4 + header_len:])
    slots_at = len(body) - 4 * header["entries"]  # the slots (uint16) come before the counts (uint16)
    body[slots_at:slots_at + 2] = struct.pack("<H", 60_000)  # out of range
    bad = [data[:-5], b"SWW3" + b"garbage", rebuilt({**header, "buckets": header["buckets"] + 1}),
           rebuilt({**header, "entries": header["entries"] - 1}), rebuilt({**header, "v": 7}),
           rebuilt({**header, "v": 3}), rebuilt({**header, "v": 4}), rebuilt({**header, "v": 5}),
           rebuilt(header, raw[4 + header_len:-2]), rebuilt(header, bytes(body)),
           b"SWW3" + zlib.compress(b"\x00\x00"), rebuilt({**header, "late_total": "x"})]
    for blob in bad:
        with pytest.raises(ValueError):
            PartitionWindows.restore(blob, SETTINGS)
    assert PartitionWindows.restore(rebuilt(header), SETTINGS).snapshot() == data


@pytest.mark.parametrize("version", [4, 5])
def test_a_snapshot_of_an_older_version_is_read(version: int) -> None:
    """A v4 snapshot (a worker before TTFT per prompt token) and a v5 one (before its prompts' mean)
    restore: their buckets have every other statistic, the fields they lack count only the events
    that come after."""
    import dataclasses
    import struct
    import zlib

    from skewwatch.pipeline.window.bucket_row import OPT_N, OPT_SUM, STATS_LEN

    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0, ttft_ms=30.0), event(101.0, ttft_ms=50.0, prompt_tokens=10)]))
    data = windows.snapshot()
    raw = zlib.decompress(data[4:])
    (header_len,) = struct.unpack_from("<I", raw)
    header = orjson.loads(raw[4:4 + header_len])
    n = header["buckets"]
    at = 4 + header_len + 4 * n + 8 * n  # the bucket rows, column by column, after the keys and ids
    columns = [raw[at + 8 * n * c:at + 8 * n * (c + 1)] for c in range(STATS_LEN)]
    missing = 6 - version  # the newest optional fields the older version lacks
    lacks = {*range(OPT_N.stop - missing, OPT_N.stop), *range(OPT_SUM.stop - missing, OPT_SUM.stop)}
    kept = [c for i, c in enumerate(columns) if i not in lacks]
    text = orjson.dumps({**header, "v": version})
    old = b"SWW3" + zlib.compress(struct.pack("<I", len(text)) + text + raw[4 + header_len:at] + b"".join(kept)
                                  + raw[at + 8 * n * STATS_LEN:], 1)
    vectors = []
    per_token, prompts = math.sqrt(0.3 * 5.0), math.sqrt(100 * 10)
    for restored, expected in ((PartitionWindows.restore(data, SETTINGS), (per_token, prompts)),
                               (PartitionWindows.restore(old, SETTINGS), (per_token if version == 5 else None, None))):
        restored.advance_watermark(105.0)
        [step] = restored.close_steps()
        vectors.append(step.features)
        assert (step.features.ttft_per_prompt_token, step.features.ttft_prompt_tokens_gmean) == pytest.approx(expected)
    lost = {"ttft_prompt_tokens_gmean": None, **({"ttft_per_prompt_token": None} if version == 4 else {})}
    assert dataclasses.replace(vectors[0], **lost) == vectors[1]  # the rest is all there
    # after the older buckets, new events count: 20 ms over 100 prompt tokens
    restored.apply(RequestColumns.from_rows([event(106.0, ttft_ms=20.0)]))
    restored.advance_watermark(110.0)
    [step] = restored.close_steps()
    assert step.features.count == 3 and step.features.ttft_prompt_tokens_gmean == pytest.approx(100.0)
    if version == 4:
        assert step.features.ttft_per_prompt_token == pytest.approx(0.2)


def test_the_exported_state_rebuilds_the_same_windows() -> None:
    """export_state/from_state, the pair the snapshot goes through: a rebuilt partition exports the same
    columns and continues as the original does; a state that does not describe windows is refused."""
    rng = np.random.default_rng(64)
    windows = PartitionWindows(SETTINGS)
    events = random_events(rng, 1200, 1000.0, 1100.0, KEYS, batch_missing=0.3)
    for i in range(0, len(events), 100):
        windows.apply(RequestColumns.from_rows(sorted(events[i:i + 100], key=lambda e: e["ts"])))
        windows.close_steps()
    windows.apply(RequestColumns.from_rows([event(1099.0, model="llama", status="error", cuda_error="cudaErrorX")]))
    state = windows.export_state()
    assert state.cuda_errors and state.closed_through is not None and len(state.keys) == len(KEYS)
    rebuilt = PartitionWindows.from_state(state, SETTINGS)
    again = rebuilt.export_state()
    for name, value in state._asdict().items():
        other = getattr(again, name)
        assert (np.array_equal(value, other) if isinstance(value, np.ndarray) else value == other), name
    more = RequestColumns.from_rows([event(1101.0 + i, model="llama") for i in range(5)])
    for w in (windows, rebuilt):
        w.apply(more)
        w.advance_watermark(1130.0)
    assert [s.features for s in rebuilt.close_steps()] == [s.features for s in windows.close_steps()]
    for bad in (state._replace(bucket_key=state.bucket_key + len(KEYS)),
                state._replace(keys=state.keys + state.keys[:1]),
                state._replace(sketch_lengths=state.sketch_lengths + 1),
                state._replace(closed_through=(state.closed_through or 0) + 100),
                state._replace(cuda_errors=[(len(state.bucket_id), {"x": 1})])):
        with pytest.raises(ValueError):
            PartitionWindows.from_state(bad, SETTINGS)
    with pytest.raises(ValueError, match="step_s"):
        PartitionWindows.from_state(state, WindowSettings(step_s=10.0))
