"""Checkpoint bytes of a partition's windows (a :class:`PartitionState`), never pickle (they are read
back from Kafka): :func:`decode` validates every array's size; ``PartitionWindows.from_state`` then
checks what the arrays say (keys, slots, buckets) against the windows' settings.

Format ``skewwatch.partition-windows``, version 6: magic ``b"SWW3"``, then zlib of a 4-byte header
length, a JSON header (settings, watermark, lateness count, the keys (model, replica, last event ts)
in first-seen order, bucket and entry counts, CUDA error counts) and every non-empty bucket, sealed or
open, as raw little-endian columns: its key, id, stats row (column-major) and its combined latency +
TTFT + TPOT sparse sketch (TTFT at ``n_slots + slot``, TPOT at ``2 * n_slots + slot``; slots as
uint16, counts as uint16 unless one exceeds it). Sketch totals are not stored: they are by definition
the sum of the sealed buckets and are rebuilt on restore (smaller, and they cannot disagree with the
buckets). Versions 4 and 5 are also read: their bucket rows lack the newest optional fields, which
read as not reported. Any other version or layout is refused.

Both directions are whole-array operations over all buckets (no per-key Python besides the key list
itself); zlib is most of the cost.

>>> import numpy as np
>>> from skewwatch.pipeline.window.partition_state import PartitionState
>>> state = PartitionState(60.0, 5.0, 0.01, 103.0, 19, 0, [("m", "r1", 101.0)], np.array([0], np.int32),
...     np.array([20]), np.zeros((1, STATS_LEN)), np.array([1]), np.array([[7], [1]], np.int32), [])
>>> encode(decode(encode(state))) == encode(state)
True
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
import orjson

from skewwatch.pipeline.window.bucket_row import OPT_N, STATS_LEN
from skewwatch.pipeline.window.partition_state import PartitionState

SNAPSHOT_FORMAT = "skewwatch.partition-windows"
SNAPSHOT_VERSION = 6  # the latency, TTFT and TPOT sketches in one slot space; the bucket rows of bucket_row.py
# older versions also read: their bucket rows lack the last optional fields, read as not reported
# (v4: TTFT per prompt token and its prompts' mean; v5: the prompts' mean)
_MISSING_OPTIONAL = {4: 2, 5: 1, SNAPSHOT_VERSION: 0}
_SNAPSHOT_MAGIC = b"SWW3"
_HEADER = struct.Struct("<I")
_SNAPSHOT_MAX_BYTES = 512 << 20  # refuse to inflate past this (a corrupt or hostile record)
_U16_MAX = 0xFFFF


def encode(state: PartitionState) -> bytes:
    """The snapshot bytes of ``state``."""
    sketch = state.sketch
    wide_counts = bool(sketch.shape[1]) and int(sketch[1].max()) > _U16_MAX
    header = orjson.dumps({
        "format": SNAPSHOT_FORMAT,
        "v": SNAPSHOT_VERSION,
        "length_s": state.length_s,
        "step_s": state.step_s,
        "relative_accuracy": state.relative_accuracy,
        "watermark": state.watermark,
        "closed_through": state.closed_through,
        "late_total": state.late_total,
        "keys": [list(key) for key in state.keys],
        "cuda_errors": [[row, errors] for row, errors in state.cuda_errors],
        "buckets": int(state.bucket_id.size),
        "entries": int(sketch.shape[1]),
        "wide_counts": wide_counts,
    })
    parts = [
        _HEADER.pack(len(header)), header,
        state.bucket_key.astype("<i4").tobytes(),
        state.bucket_id.astype("<i8").tobytes(),
        np.ascontiguousarray(state.bucket_stats.T).astype("<f8").tobytes(),  # column-major: zlib finds more
        state.sketch_lengths.astype("<i4").tobytes(),
        sketch[0].astype("<u2").tobytes(),  # slots < 3 * n_slots (checked by LogBins' range)
        sketch[1].astype("<i4" if wide_counts else "<u2").tobytes(),
    ]
    return _SNAPSHOT_MAGIC + zlib.compress(b"".join(parts), 1)


def decode(data: bytes) -> PartitionState:
    """The state in :func:`encode` bytes; ValueError if they are not a snapshot of this format."""
    try:
        return _decode(data)
    except (KeyError, TypeError, AttributeError, IndexError, orjson.JSONDecodeError, zlib.error,
            struct.error) as exc:
        raise ValueError(f"malformed window snapshot: {exc!r}") from exc


def _inflate(body: bytes) -> bytes:
    inflate = zlib.decompressobj()
    raw = inflate.decompress(body, _SNAPSHOT_MAX_BYTES)
    if inflate.unconsumed_tail:
        raise ValueError(f"snapshot inflates past {_SNAPSHOT_MAX_BYTES} bytes")
    if not inflate.eof:  # a cut-off record can still inflate to something that parses
        raise ValueError("snapshot is truncated")
    return raw


def _decode(data: bytes) -> PartitionState:
    """Magic, then header length, JSON header, raw little-endian columns; every size checked."""
    if not data.startswith(_SNAPSHOT_MAGIC):
        raise ValueError("not a window snapshot (bad magic)")
    raw = _inflate(data[len(_SNAPSHOT_MAGIC):])
    (header_len,) = _HEADER.unpack_from(raw)
    at = _HEADER.size + header_len
    doc: dict[str, Any] = orjson.loads(raw[_HEADER.size:at])
    if doc.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"not a {SNAPSHOT_FORMAT} snapshot")
    version = doc.get("v")
    if version not in _MISSING_OPTIONAL:
        raise ValueError(f"unsupported {SNAPSHOT_FORMAT} snapshot version {version!r} "
                         f"(this worker reads v{min(_MISSING_OPTIONAL)} to v{SNAPSHOT_VERSION})")
    missing = _MISSING_OPTIONAL[version]
    width = STATS_LEN - 2 * missing
    n, total = int(doc["buckets"]), int(doc["entries"])
    if n < 0 or total < 0:
        raise ValueError("negative bucket or entry count")
    count_type = "<i4" if doc["wide_counts"] else "<u2"
    layout = [("<i4", n), ("<i8", n), ("<f8", n * width), ("<i4", n), ("<u2", total), (count_type, total)]
    if len(raw) - at != sum(np.dtype(dtype).itemsize * size for dtype, size in layout):
        raise ValueError("snapshot arrays do not match their header")
    arrays = []
    for dtype, size in layout:
        arrays.append(np.frombuffer(raw, dtype=dtype, count=size, offset=at))
        at += np.dtype(dtype).itemsize * size
    key, ids, stats_t, lengths, slots, counts = arrays
    lengths = lengths.astype(np.int64)
    if lengths.size and lengths.min() < 0:
        raise ValueError("negative sketch length")
    if int(lengths.sum()) != total:
        raise ValueError("sketch lengths do not add up to the entries")
    stats = np.ascontiguousarray(stats_t.reshape(width, n).T).astype(np.float64)
    if missing:  # an older version: the last optional fields' counts and sums, 0 (not reported)
        # after its last optional count and after its last optional sum (indices in the older row)
        kept = OPT_N.stop - OPT_N.start - missing
        stats = np.insert(stats, [OPT_N.start + kept] * missing + [OPT_N.start + 2 * kept] * missing, 0.0, axis=1)
    sketch = np.stack([slots.astype(np.int32), counts.astype(np.int32)]) if total else np.zeros((2, 0), np.int32)
    watermark, closed_through = doc["watermark"], doc["closed_through"]
    return PartitionState(
        length_s=float(doc["length_s"]),
        step_s=float(doc["step_s"]),
        relative_accuracy=float(doc["relative_accuracy"]),
        watermark=None if watermark is None else float(watermark),
        closed_through=None if closed_through is None else int(closed_through),
        late_total=int(doc["late_total"]),
        keys=[(str(model), str(replica), float(ts)) for model, replica, ts in doc["keys"]],
        bucket_key=key.astype(np.int32),
        bucket_id=ids.astype(np.int64),
        bucket_stats=stats,
        sketch_lengths=lengths,
        sketch=sketch,
        cuda_errors=[(int(row), {str(k): int(v) for k, v in errors.items()}) for row, errors in doc["cuda_errors"]],
    )
