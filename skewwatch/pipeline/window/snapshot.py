"""Checkpoint bytes of a :class:`PartitionWindows`, never pickle (they are read back from Kafka):
:func:`decode` validates every array's size and range.

Format ``skewwatch.partition-windows``, version 4: magic ``b"SWW3"``, then zlib of a 4-byte header
length, a JSON header (settings, watermark, lateness count, the keys (model, replica, last event ts)
in first-seen order, bucket and entry counts, CUDA error counts) and every non-empty bucket, sealed or
open, as raw little-endian columns: its key, id, stats row (column-major) and its combined latency +
TTFT + TPOT sparse sketch (TTFT at ``n_slots + slot``, TPOT at ``2 * n_slots + slot``; slots as
uint16, counts as uint16 unless one exceeds it). Sketch totals are not stored: they are by definition
the sum of the sealed buckets and are rebuilt on restore (smaller, and they cannot disagree with the
buckets). Any other version or layout is refused.

Both directions are whole-array operations over all buckets (no per-key Python besides the key list
itself); zlib is most of the cost.

>>> from skewwatch.config import WindowSettings
>>> from skewwatch.schemas.requests.columns import RequestColumns
>>> from skewwatch.pipeline.window import PartitionWindows
>>> windows = PartitionWindows(WindowSettings())
>>> _ = windows.apply(RequestColumns.from_rows([dict(request_id="a", ts=101.0, model="m", replica="r1",
...     latency_ms=100.0, prompt_tokens=1, completion_tokens=2, batch_size=1, batch_capacity=2)]))
>>> data = windows.snapshot()
>>> PartitionWindows.restore(data, WindowSettings()).snapshot() == data
True
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from skewwatch.config import WindowSettings
from skewwatch.pipeline.window.partition import N_SKETCHES, PartitionWindows, split_entries
from skewwatch.pipeline.window.summary import _COUNT, _STATS_LEN

SNAPSHOT_FORMAT = "skewwatch.partition-windows"
SNAPSHOT_VERSION = 4  # the only version read: the latency, TTFT and TPOT sketches in one slot space
_SNAPSHOT_MAGIC = b"SWW3"
_HEADER = struct.Struct("<I")
_SNAPSHOT_MAX_BYTES = 512 << 20  # refuse to inflate past this (a corrupt or hostile record)
_U16_MAX = 0xFFFF


def encode(windows: PartitionWindows) -> bytes:
    """The complete state of ``windows`` as snapshot bytes. Open sketches are merged
    in place first, which changes nothing observable: the live windows and a restored copy continue
    identically.

    Buckets are written ordered by (bucket id, key): each ring position and each open bucket is
    then one block whose rows are already in key order, and needs no sort (v2 readers accept any
    order; the per-key writer used (key, id)).
    """
    w = windows
    keys = list(w.keys)
    n_keys = len(keys)
    rows = np.fromiter(w.keys.values(), dtype=np.intp, count=n_keys)
    key_of_row = np.full(max(w._capacity, 1), -1, dtype=np.int64)
    key_of_row[rows] = np.arange(n_keys)
    n = w.n_buckets
    n_slots = w.bins.n_slots
    blocks: list[tuple[int, npt.NDArray[np.float64], npt.NDArray[np.int32]]] = []  # (id, stats by key, entries)
    if w.closed_through is not None and n_keys:
        for bucket_id in range(w.closed_through - n + 1, w.closed_through + 1):
            sealed = w._ring[bucket_id % n]
            shifted = []
            for k, part in enumerate(sealed):
                if k:
                    part = part.copy()
                    part[1] += k * n_slots
                shifted.append(part)
            blocks.append((bucket_id, w._stats[bucket_id % n][rows], np.concatenate(shifted, axis=1)))
    open_cuda: dict[int, dict[int, Counter[str]]] = {}
    for bucket_id, bucket in sorted(w._open.items()):
        entries = bucket.sketch(N_SKETCHES * n_slots)
        blocks.append((bucket_id, bucket.stats[rows], entries))
        open_cuda[bucket_id] = bucket.cuda_errors

    b_key: list[npt.NDArray[np.int64]] = []
    b_id: list[npt.NDArray[np.int64]] = []
    b_stats: list[npt.NDArray[np.float64]] = []
    b_len: list[npt.NDArray[np.int64]] = []
    sketches: list[npt.NDArray[np.int32]] = []
    cuda_rows: list[list[Any]] = []
    written = 0
    for bucket_id, stats, entries in blocks:
        present = np.flatnonzero(stats[:, _COUNT])  # keys with events in this bucket, in key order
        if not present.size:
            continue
        entry_key = key_of_row[entries[0]]
        # entries come sorted by (row, slot), a sealed bucket's as two such runs (latency, then TTFT
        # at higher slots): a stable sort by key alone orders them by (key, slot) (a merge of two
        # runs; nothing to do when rows follow key order and there is one run)
        if np.any(np.diff(entry_key) < 0):
            order = np.argsort(entry_key, kind="stable")
            entries, entry_key = entries[:, order], entry_key[order]
        b_key.append(present.astype(np.int64))
        b_id.append(np.full(present.size, bucket_id, dtype=np.int64))
        b_stats.append(stats[present])
        b_len.append(np.bincount(entry_key, minlength=n_keys)[present])
        sketches.append(entries[1:])
        if bucket_id in open_cuda:
            for row, errors in open_cuda[bucket_id].items():
                cuda_rows.append([written + int(np.searchsorted(present, key_of_row[row])), dict(errors)])
        written += present.size
    cuda_rows.sort(key=lambda item: int(item[0]))

    def joined(parts: list[npt.NDArray[Any]], empty: npt.NDArray[Any], axis: int = 0) -> npt.NDArray[Any]:
        return np.concatenate(parts, axis=axis) if parts else empty

    meta: dict[str, Any] = {
        "format": SNAPSHOT_FORMAT,
        "v": SNAPSHOT_VERSION,
        "length_s": w.settings.length_s,
        "step_s": w.settings.step_s,
        "relative_accuracy": w.settings.sketch_relative_accuracy,
        "watermark": w.watermark,
        "closed_through": w.closed_through,
        "late_total": w.late_total,
        "keys": [[model, replica, ts] for (model, replica), ts in zip(keys, w._last_ts[rows].tolist(), strict=True)],
    }
    key_col = joined(b_key, np.zeros(0, np.int64)).astype(np.int32)
    id_col = joined(b_id, np.zeros(0, np.int64))
    stats_col = joined(b_stats, np.zeros((0, _STATS_LEN)))
    length_col = joined(b_len, np.zeros(0, np.int64)).astype(np.int32)
    sketch_col = joined(sketches, np.zeros((2, 0), np.int32), axis=1).astype(np.int32)
    wide_counts = bool(sketch_col.shape[1]) and int(sketch_col[1].max()) > _U16_MAX
    header = orjson.dumps({**meta, "cuda_errors": cuda_rows, "buckets": int(key_col.size),
                           "entries": int(sketch_col.shape[1]), "wide_counts": wide_counts})
    parts = [
        _HEADER.pack(len(header)), header,
        key_col.astype("<i4").tobytes(),
        id_col.astype("<i8").tobytes(),
        np.ascontiguousarray(stats_col.T).astype("<f8").tobytes(),  # column-major: zlib finds more
        length_col.astype("<i4").tobytes(),
        sketch_col[0].astype("<u2").tobytes(),  # slots < 2 * n_slots (checked by LogBins' range)
        sketch_col[1].astype("<i4" if wide_counts else "<u2").tobytes(),
    ]
    return _SNAPSHOT_MAGIC + zlib.compress(b"".join(parts), 1)


def decode(data: bytes, settings: WindowSettings) -> PartitionWindows:
    """Rebuild windows from :func:`encode` bytes; ValueError if they are not a compatible snapshot."""
    try:
        return _decode(data, settings)
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


def _read_binary(data: bytes) -> tuple[dict[str, Any], Columns]:
    """Header length, JSON header, raw little-endian columns; every size checked."""
    raw = _inflate(data[len(_SNAPSHOT_MAGIC):])
    (header_len,) = _HEADER.unpack_from(raw)
    at = _HEADER.size + header_len
    doc = orjson.loads(raw[_HEADER.size:at])
    if doc.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"not a {SNAPSHOT_FORMAT} snapshot")
    if doc.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported {SNAPSHOT_FORMAT} snapshot version {doc.get('v')!r} "
                         f"(this worker reads v{SNAPSHOT_VERSION})")
    n, total = int(doc["buckets"]), int(doc["entries"])
    if n < 0 or total < 0:
        raise ValueError("negative bucket or entry count")
    count_type = "<i4" if doc["wide_counts"] else "<u2"
    layout = [("<i4", n), ("<i8", n), ("<f8", n * _STATS_LEN), ("<i4", n), ("<u2", total), (count_type, total)]
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
    stats = np.ascontiguousarray(stats_t.reshape(_STATS_LEN, n).T).astype(np.float64)
    sketch = np.stack([slots.astype(np.int32), counts.astype(np.int32)]) if total else np.zeros((2, 0), np.int32)
    return doc, Columns(key.astype(np.int32), ids.astype(np.int64), stats, lengths, sketch)


class Columns(NamedTuple):
    """A snapshot's buckets: key index, id, stats row, sketch length, and the
    sketches concatenated (row 0 combined latency/TTFT slots, row 1 counts)."""

    key: npt.NDArray[np.int32]
    ids: npt.NDArray[np.int64]
    stats: npt.NDArray[np.float64]
    lengths: npt.NDArray[np.int64]
    sketch: npt.NDArray[np.int32]


def _decode(data: bytes, settings: WindowSettings) -> PartitionWindows:
    if not data.startswith(_SNAPSHOT_MAGIC):
        raise ValueError("not a window snapshot (bad magic)")
    doc, cols = _read_binary(data)
    for name, have in (("length_s", settings.length_s), ("step_s", settings.step_s),
                       ("relative_accuracy", settings.sketch_relative_accuracy)):
        if doc[name] != have:
            raise ValueError(f"snapshot was taken with {name}={doc[name]}, settings say {have}")
    w = PartitionWindows(settings)
    w.watermark = None if doc["watermark"] is None else float(doc["watermark"])
    w.closed_through = None if doc["closed_through"] is None else int(doc["closed_through"])
    w.late_total = int(doc["late_total"])
    key_rows = doc["keys"]
    if key_rows:
        w._grow(len(key_rows))
    for model, replica, _ in key_rows:
        w._add_key((str(model), str(replica)))  # rows 0..k-1, in order
    if key_rows:
        w._last_ts[:len(key_rows)] = [float(ts) for _, _, ts in key_rows]
    if len(w.keys) != len(key_rows):
        raise ValueError("a key is stored twice")

    key = cols.key.astype(np.intp)
    n = key.size
    ids, stats, lengths, sketch = cols.ids, cols.stats, cols.lengths, cols.sketch
    if n and (key.min() < 0 or key.max() >= len(key_rows)):
        raise ValueError("bucket refers to an unknown key")
    total = int(lengths.sum())
    n_slots = w.bins.n_slots
    top = 2 * n_slots + w.tpot_bins.n_slots  # TPOT slots in coarser bins
    if total and (sketch[0].min() < 0 or sketch[0].max() >= top or sketch[1].min() <= 0):
        raise ValueError("sketch slot out of range or non-positive count")
    entry_bucket = np.repeat(np.arange(n), lengths)
    same_bucket = entry_bucket[1:] == entry_bucket[:-1]
    if np.any(np.diff(sketch[0].astype(np.int64))[same_bucket] <= 0):
        raise ValueError("sketch slots not strictly increasing")
    if n:
        low = int(ids.min())
        code = key.astype(np.int64) * (int(ids.max()) - low + 1) + (ids - low)
        if np.unique(code).size != n:
            raise ValueError("a bucket is stored twice")

    nb = w.n_buckets
    if w.closed_through is None:
        sealed = np.zeros(n, dtype=bool)
    else:
        sealed = ids <= w.closed_through
        if np.any(ids[sealed] <= w.closed_through - nb):
            raise ValueError(f"bucket {int(ids[sealed].min())} is older than the window")
    entry_row = key[entry_bucket].astype(np.int32)
    entry_sealed = sealed[entry_bucket]
    w._stats[ids[sealed] % nb, key[sealed]] = stats[sealed]
    entry_position = (ids % nb)[entry_bucket]
    for position in range(nb):
        mine = entry_sealed & (entry_position == position)
        if mine.any():
            entries = np.stack([entry_row[mine], sketch[0, mine], sketch[1, mine]])
            w._ring[position] = split_entries(entries, n_slots)
            w._add_sealed(w._ring[position], +1)
    cuda = {int(i): {str(k): int(v) for k, v in errs.items()} for i, errs in doc["cuda_errors"]}
    if cuda and (min(cuda) < 0 or max(cuda) >= n):
        raise ValueError("cuda errors of an unknown bucket")
    for bucket_id in np.unique(ids[~sealed]).tolist():
        bucket = w._open_bucket(bucket_id)
        mine = ~sealed & (ids == bucket_id)
        bucket.stats[key[mine]] = stats[mine]
        in_bucket = mine[entry_bucket]
        bucket.parts = [np.stack([entry_row[in_bucket], sketch[0, in_bucket], sketch[1, in_bucket]])]
        for i in np.flatnonzero(mine).tolist():
            if i in cuda:
                bucket.cuda_errors[int(key[i])] = Counter(cuda[i])
    return w
