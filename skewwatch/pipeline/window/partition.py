"""The windows of every (model, replica) of one Kafka partition, as columns.

One partition's state is a handful of arrays with one row per key (a key registry maps
``(model, replica)`` to its row; released rows are reused):

* ``_stats[ring, row, :]``: the ring of ``n_buckets`` sealed buckets, bucket ``b`` in ring
  position ``b % n_buckets``, one float64 bucket row each (layout in ``bucket_row.py``; ring-major, so
  merging a window adds 12 contiguous ``(rows, STATS_LEN)`` slabs);
* open buckets (still collecting events, usually 1-2): per bucket id a dense ``(rows, STATS_LEN)``
  array, the sketch as ``(row, slot, count)`` parts, and the CUDA error counts of the rows that had any
  (``buckets.py``);
* the sealed buckets' sketches as ``(3, k)`` int32 ``(row, slot, count)`` arrays per ring position,
  latency, TTFT and TPOT (time per output token) apart (an open bucket keeps them in one slot
  space: TTFT at ``n_slots + slot``, TPOT at ``2 * n_slots + slot``; TPOT's bins are coarser,
  ``tpot_accuracy``, so its slots fit below ``n_slots``);
* three dense running totals per row (latency, TTFT, TPOT) over the slot range in use by the partition
  (grown when a value falls outside it, trimmed when its edges empty out): a step *adds* the newly
  sealed bucket's entries and *subtracts* the leaving one's, instead of re-merging 12 buckets
  (``row_totals.py``).

A step is then a few whole-array operations for all rows: Chan's merge of the 12 buckets'
moments, one cumulative sum + rank search over the dense totals for the quantiles
(:meth:`LogBins.row_quantiles`), the prompt-length moments of the newest ``RECENT_S`` (4 buckets),
and a :class:`StepBatch` of columns. Per-row Python runs only
when someone iterates the batch (to publish it).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline import moments
from skewwatch.pipeline.sketch import log_bins
from skewwatch.pipeline.window import snapshot
from skewwatch.pipeline.window.bucket_row import (
    BATCH_N,
    COMPLETION,
    COUNT,
    DERIVED_N,
    ERRORS,
    FILL_N,
    M2,
    MEAN,
    OPT_N,
    OPT_SUM,
    STATS_LEN,
    merge_stats,
    optional_values,
    window_stats,
)
from skewwatch.pipeline.window.buckets import (
    EMPTY_ENTRIES,
    EMPTY_SEALED,
    N_SKETCHES,
    Entries,
    OpenBucket,
    Sealed,
    split_entries,
    unique_codes,
)
from skewwatch.pipeline.window.feature_columns import LATENCY_QUANTILES, TPOT_QUANTILES, TTFT_QUANTILES
from skewwatch.pipeline.window.partition_state import PartitionState
from skewwatch.pipeline.window.row_totals import RowTotals
from skewwatch.pipeline.window.steps import ClosedSteps, StepBatch
from skewwatch.pipeline.window.summary import tpot_accuracy
from skewwatch.pipeline.window_settings import WindowSettings
from skewwatch.schemas.feature_vector import RECENT_S
from skewwatch.schemas.requests.columns import BATCH_DERIVED, RequestColumns

FloatArray = npt.NDArray[np.float64]


class ApplyResult(NamedTuple):
    accepted: int  # events folded into open buckets
    late: int  # events whose bucket was already sealed: counted, not applied


class PartitionWindows:
    """The windows of every (model, replica) of one Kafka partition, with its watermark."""

    def __init__(self, settings: WindowSettings) -> None:
        n = settings.length_s / settings.step_s
        if settings.step_s <= 0 or n < 1 or abs(n - round(n)) > 1e-9:
            raise ValueError(f"window length {settings.length_s} s must be a whole number of "
                             f"{settings.step_s} s steps")
        self.settings = settings
        self.n_buckets = round(n)
        self.bins = log_bins(settings.sketch_relative_accuracy)
        self.tpot_bins = log_bins(tpot_accuracy(settings.sketch_relative_accuracy))  # coarser
        self.keys: dict[tuple[str, str], int] = {}  # (model, replica) -> row, in first-seen order
        self.watermark: float | None = None
        self.closed_through: int | None = None  # id of the newest sealed bucket
        self.late_total = 0
        n_slots = self.bins.n_slots
        self._capacity = 0
        self._next_row = 0  # rows [0, _next_row) have been handed out (some may be free again)
        self._free: list[int] = []
        self._stats: FloatArray = np.zeros((self.n_buckets, 0, STATS_LEN))
        self._last_ts: FloatArray = np.zeros(0)
        self._open: dict[int, OpenBucket] = {}  # bucket id -> bucket not sealed yet
        self._ring: list[Sealed] = [EMPTY_SEALED] * self.n_buckets  # sealed sketches by ring position
        self._latency = RowTotals(0, n_slots)  # always the sum of the ring's latency entries
        self._ttft = RowTotals(0, n_slots)  # ... and of its TTFT entries (slot - n_slots)
        self._tpot = RowTotals(0, self.tpot_bins.n_slots)  # ... and of its TPOT entries (slot - 2 * n_slots)
        # the newest buckets whose prompt moments make the recent_* features
        self.recent_buckets = min(max(round(RECENT_S / settings.step_s), 1), self.n_buckets)

    @property
    def last_closed_end(self) -> float | None:
        """End of the newest closed step: events before it are late."""
        return None if self.closed_through is None else (self.closed_through + 1) * self.settings.step_s

    def advance_watermark(self, watermark: float) -> None:
        """Move the watermark to ``watermark`` if that is ahead (an idle partition following the others)."""
        if self.watermark is None or watermark > self.watermark:
            self.watermark = float(watermark)

    # -- rows -----------------------------------------------------------------------------------

    def _grow(self, needed: int) -> None:
        """Make room for ``needed`` rows (by a quarter at least: memory per replica matters more
        than the occasional copy)."""
        capacity = max(needed, self._capacity + self._capacity // 4, 16)
        stats = np.zeros((self.n_buckets, capacity, STATS_LEN))
        stats[:, :self._capacity] = self._stats
        last_ts = np.full(capacity, -math.inf)
        last_ts[:self._capacity] = self._last_ts
        self._stats, self._last_ts = stats, last_ts
        for bucket in self._open.values():
            grown = np.zeros((capacity, STATS_LEN))
            grown[:self._capacity] = bucket.stats
            bucket.stats = grown
        self._latency.grow_rows(capacity)
        self._ttft.grow_rows(capacity)
        self._tpot.grow_rows(capacity)
        self._capacity = capacity

    def _add_key(self, key: tuple[str, str]) -> int:
        if self._free:
            row = self._free.pop()
        else:
            row = self._next_row
            self._next_row += 1
            if row >= self._capacity:
                self._grow(row + 1)
        self.keys[key] = row
        return row

    def _release(self, rows: npt.NDArray[np.intp], keys: list[tuple[str, str]]) -> None:
        """Forget keys idle past the window: their rows hold no data (all of it left the window)."""
        for key in keys:
            del self.keys[key]
        # with idle_release_s < length_s an event at exactly E - length_s is still in the ring: drop
        # it with its key, as the per-key state did, so a reused row starts empty
        for position, sealed in enumerate(self._ring):
            mine = [np.isin(entries[0], rows) for entries in sealed]
            if any(m.any() for m in mine):
                self._ring[position] = Sealed(*(e[:, ~m] for e, m in zip(sealed, mine, strict=True)))
        self._stats[:, rows] = 0.0
        self._last_ts[rows] = -math.inf
        self._latency.counts[rows] = 0
        self._ttft.counts[rows] = 0
        self._tpot.counts[rows] = 0
        self._free.extend(rows.tolist())

    def _open_bucket(self, bucket_id: int) -> OpenBucket:
        bucket = self._open.get(bucket_id)
        if bucket is None:
            bucket = self._open[bucket_id] = OpenBucket(self._capacity)
        return bucket

    def _add_sealed(self, sealed: Sealed, sign: int) -> None:
        """Add a sealed bucket's sketch to the running totals (``sign=-1``: it leaves the window)."""
        for totals, entries in ((self._latency, sealed.latency), (self._ttft, sealed.ttft),
                                (self._tpot, sealed.tpot)):
            totals.add(entries[0], entries[1], entries[2], sign)

    # -- events ---------------------------------------------------------------------------------

    def apply(self, cols: RequestColumns) -> ApplyResult:
        """Fold a batch of validated events into their open buckets, in one vectorised pass."""
        n = len(cols)
        if n == 0:
            return ApplyResult(0, 0)
        step = self.settings.step_s
        self.advance_watermark(float(cols.ts.max()) - self.settings.allowed_lateness_s)
        bucket = np.floor(cols.ts / step).astype(np.int64)
        late = 0
        if self.closed_through is not None:
            on_time = bucket > self.closed_through
            late = int(n - np.count_nonzero(on_time))
            if late:
                self.late_total += late
                if late == n:
                    return ApplyResult(0, late)
                cols, bucket = cols.take(on_time), bucket[on_time]
        accepted = n - late

        # group rows by (key, bucket) once; every statistic below is computed per group
        key_index: dict[tuple[str, str], int] = {}
        key_code = np.fromiter(
            (key_index.setdefault(k, len(key_index))
             for k in zip(cols.model.tolist(), cols.replica.tolist(), strict=True)),
            dtype=np.int64, count=accepted)
        code_row = np.fromiter((self.keys.get(k) if k in self.keys else self._add_key(k) for k in key_index),
                               dtype=np.intp, count=len(key_index))
        bucket_ids, bucket_code = np.unique(bucket, return_inverse=True)
        n_ids = bucket_ids.size
        # groups ordered by (row, bucket): every part of an open bucket is then sorted by row, and
        # its sketch entries by (row, slot), which the ring and the snapshot rely on
        groups, g = unique_codes(code_row[key_code] * n_ids + bucket_code, inverse=True)
        n_groups = groups.size

        stats = np.zeros((n_groups, STATS_LEN))
        stats[:, COUNT] = np.bincount(g, minlength=n_groups)
        stats[:, ERRORS] = np.bincount(g, weights=cols.is_error, minlength=n_groups)
        stats[:, COMPLETION] = np.bincount(g, weights=cols.completion_tokens, minlength=n_groups)
        self._batch_moments(cols, g, n_groups, stats)
        for j, x in enumerate(optional_values(cols)):
            reported = ~np.isnan(x)
            stats[:, OPT_N.start + j] = np.bincount(g[reported], minlength=n_groups)
            stats[:, OPT_SUM.start + j] = np.bincount(g[reported], weights=x[reported], minlength=n_groups)
        entry_group, entry_slot, entry_count = self._group_sketches(cols, g)
        cuda: dict[int, Counter[str]] = {}
        codes = cols.cuda_error.tolist()  # object column: no vectorised "is None"
        if codes.count(None) != len(codes):  # a C scan by identity: most polls have no error, and pay no loop
            for event, code in enumerate(codes):
                if code is not None:
                    cuda.setdefault(int(g[event]), Counter())[str(code)] += 1
        last_ts = np.full(len(key_index), -math.inf)
        np.maximum.at(last_ts, key_code, cols.ts)
        self._last_ts[code_row] = np.maximum(self._last_ts[code_row], last_ts)

        group_row = groups // n_ids
        group_bucket = groups % n_ids
        entry_bucket = group_bucket[entry_group]
        n_codes = N_SKETCHES * self.bins.n_slots
        for b, bucket_id in enumerate(bucket_ids.tolist()):  # a loop over bucket ids (1-2), not keys
            open_bucket = self._open_bucket(bucket_id)
            mine = np.flatnonzero(group_bucket == b) if n_ids > 1 else slice(None)
            rows = group_row[mine]  # unique: one group per (key, bucket)
            open_bucket.stats[rows] = merge_stats(open_bucket.stats[rows], stats[mine])
            entries = entry_bucket == b if n_ids > 1 else slice(None)
            open_bucket.add_entries(np.stack([group_row[entry_group[entries]], entry_slot[entries],
                                              entry_count[entries]]).astype(np.int32), n_codes)
        for group, counter in cuda.items():
            errors = self._open[int(bucket_ids[group_bucket[group]])].cuda_errors
            errors.setdefault(int(group_row[group]), Counter()).update(counter)
        return ApplyResult(accepted, late)

    @staticmethod
    def _batch_moments(cols: RequestColumns, g: npt.NDArray[np.intp], n_groups: int, stats: FloatArray) -> None:
        """Per group, the MOMENT_FIELDS moments and the batch counts, into ``stats``. Batch moments
        are over the rows with a known batch only (v1.1: the batch fields are optional)."""
        fill = cols.batch_fill  # NaN where the size or the capacity is unknown
        size_known = cols.batch_size > 0
        fill_known = ~np.isnan(fill)
        if size_known.all() and fill_known.all():  # every row has a batch: one grouped pass
            values = np.column_stack([cols.latency_ms, cols.prompt_tokens, cols.completion_tokens,
                                      cols.batch_size, fill]).astype(np.float64)
            group_moments = moments.grouped(values, g, n_groups)
            stats[:, MEAN] = group_moments.mean
            stats[:, M2] = group_moments.m2
            stats[:, BATCH_N] = stats[:, FILL_N] = stats[:, COUNT]
        else:
            values = np.column_stack([cols.latency_ms, cols.prompt_tokens,
                                      cols.completion_tokens]).astype(np.float64)
            per_event = moments.grouped(values, g, n_groups)
            size = moments.grouped(cols.batch_size[size_known].astype(np.float64), g[size_known], n_groups)
            filled = moments.grouped(fill[fill_known], g[fill_known], n_groups)
            stats[:, MEAN] = np.column_stack([per_event.mean, size.mean, filled.mean])
            stats[:, M2] = np.column_stack([per_event.m2, size.m2, filled.m2])
            stats[:, BATCH_N] = size.count
            stats[:, FILL_N] = filled.count
        derived = cols.batch_source == BATCH_DERIVED
        if derived.any():
            stats[:, DERIVED_N] = np.bincount(g[derived], minlength=n_groups)

    def _group_sketches(self, cols: RequestColumns, g: npt.NDArray[np.intp]
                        ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Per group, the combined latency + TTFT + TPOT sketch entries (group, slot, count), from one
        np.unique. TPOT = (latency - TTFT) / (completion tokens - 1): the first token comes at the
        TTFT, and each token after it takes one decode step (an event with one token has none);
        without a TTFT, latency / completion tokens (the first token cannot be told apart)."""
        n_slots = self.bins.n_slots
        ttft = cols.ttft_ms
        has_ttft = ~np.isnan(ttft)
        completion = cols.completion_tokens
        # dividing by every token instead made a 2-token output's TPOT half its decode step: where
        # outputs are short, the window's TPOT then moved with the lengths it served, not the engine
        has_tpot = np.where(has_ttft, completion > 1, completion > 0)
        # decode time; a TTFT above the latency (clock skew) reads as 0, not negative
        decode_ms = np.maximum(cols.latency_ms[has_tpot] - np.where(has_ttft[has_tpot], ttft[has_tpot], 0.0), 0.0)
        tpot = decode_ms / (completion[has_tpot] - has_ttft[has_tpot])
        slots = np.concatenate([self.bins.index(cols.latency_ms), self.bins.index(ttft[has_ttft]) + n_slots,
                                self.tpot_bins.index(tpot) + 2 * n_slots])
        owner = np.concatenate([g, g[has_ttft], g[has_tpot]]).astype(np.int64)
        n_codes = N_SKETCHES * n_slots
        pairs, counts = unique_codes(owner * n_codes + slots, counts=True)
        return pairs // n_codes, pairs % n_codes, counts

    # -- steps ----------------------------------------------------------------------------------

    def close_steps(self) -> ClosedSteps:
        """Close every step whose end is <= the watermark, oldest first, for every known key.

        A step ending at ``E`` seals bucket ``E/step - 1`` and reports ``[E - length_s, E)``.
        After each step, keys without an event in ``(E - idle, E]`` are released, where
        ``idle = max(idle_release_s, length_s)``. One :class:`StepBatch` per closed step.
        """
        if self.watermark is None:
            return ClosedSteps([])
        step = self.settings.step_s
        if self.closed_through is None:
            first_open = min(self._open, default=None)
            if first_open is None or (first_open + 1) * step > self.watermark:
                return ClosedSteps([])  # no step can close yet: declare nothing closed (that would make events late)
            self.closed_through = first_open - 1
        idle = max(self.settings.idle_release_s, self.settings.length_s)
        batches: list[StepBatch] = []
        while (self.closed_through + 2) * step <= self.watermark:
            if not self.keys:  # nobody to report: jump straight to the watermark
                self.closed_through = math.floor(self.watermark / step) - 1
                break
            bucket_id = self.closed_through + 1
            keys = list(self.keys)
            rows = np.fromiter(self.keys.values(), dtype=np.intp, count=len(keys))
            batch = self._step(bucket_id, keys, rows)
            batches.append(batch)
            self.closed_through = bucket_id
            idle_rows = np.flatnonzero(self._last_ts[rows] <= batch.window_end - idle)
            if idle_rows.size:
                self._release(rows[idle_rows], [keys[i] for i in idle_rows.tolist()])
        return ClosedSteps(batches)

    def _step(self, bucket_id: int, keys: list[tuple[str, str]], rows: npt.NDArray[np.intp]) -> StepBatch:
        """Seal bucket ``bucket_id`` (it enters the ring, ``bucket_id - n`` leaves) and summarise
        every key's window."""
        settings = self.settings
        position = bucket_id % self.n_buckets
        # keys added in order and none released yet: rows are 0..k-1, and slices (views) replace
        # the gathers of every row's arrays
        in_order = bool(rows.size) and rows[-1] == rows.size - 1 and bool(np.all(np.diff(rows) == 1))
        select: slice | npt.NDArray[np.intp] = slice(0, rows.size) if in_order else rows
        self._add_sealed(self._ring[position], -1)
        entering = self._open.pop(bucket_id, None)
        cuda: dict[int, dict[str, int]] = {}
        newest_tpot = EMPTY_ENTRIES  # the newest step's TPOT entries (row, slot, count)
        if entering is None:
            self._stats[position] = 0.0
            self._ring[position] = EMPTY_SEALED
            step_count = np.zeros(rows.size, dtype=np.int64)
        else:
            self._stats[position] = entering.stats
            sealed = self._ring[position] = split_entries(entering.sketch(N_SKETCHES * self.bins.n_slots),
                                                          self.bins.n_slots)
            self._add_sealed(sealed, +1)
            newest_tpot = sealed.tpot
            step_count = entering.stats[select, COUNT].astype(np.int64)
            if entering.cuda_errors:
                index_of_row = dict(zip(rows.tolist(), range(rows.size), strict=True))
                cuda = {index_of_row[row]: dict(errors) for row, errors in entering.cuda_errors.items()}
        self._latency.trim()
        self._ttft.trim()
        self._tpot.trim()
        # copies (a slice is copied too): the totals move on with the next step, the batch keeps these
        latency = self._latency.counts[select].copy() if in_order else self._latency.counts[select]
        ttft = self._ttft.counts[select].copy() if in_order else self._ttft.counts[select]
        tpot = self._tpot.counts[select].copy() if in_order else self._tpot.counts[select]
        return StepBatch(
            window_end=(bucket_id + 1) * settings.step_s,
            length_s=settings.length_s,
            relative_accuracy=settings.sketch_relative_accuracy,
            keys=keys,
            stats=window_stats(self._stats[:, select]),
            step_count=step_count,
            step_cuda_errors=cuda,
            latency_q=self.bins.row_quantiles(latency, self._latency.offset, LATENCY_QUANTILES),
            ttft_q=self.bins.row_quantiles(ttft, self._ttft.offset, TTFT_QUANTILES),
            latency_counts=latency,
            latency_offset=self._latency.offset,
            ttft_counts=ttft,
            ttft_offset=self._ttft.offset,
            tpot_q=self.tpot_bins.row_quantiles(tpot, self._tpot.offset, TPOT_QUANTILES),
            tpot_counts=tpot,
            tpot_offset=self._tpot.offset,
            recent=self._recent_prompt(bucket_id, select),
            step_tpot_max=self._slowest(newest_tpot, rows),
        )

    def _slowest(self, tpot: Entries, rows: npt.NDArray[np.intp]) -> FloatArray:
        """Per row of ``rows``: the largest TPOT bin value among the newest step's entries (NaN: none)."""
        top = np.full(len(self._last_ts), -1, dtype=np.int64)
        if tpot.shape[1]:
            np.maximum.at(top, tpot[0].astype(np.intp), tpot[1].astype(np.int64))
        slot = top[rows]
        return np.where(slot >= 0, self.tpot_bins.value(np.maximum(slot, 0)), np.nan)

    def _recent_prompt(self, bucket_id: int, select: slice | npt.NDArray[np.intp]) -> FloatArray:
        """``(rows, 3)``: count, prompt-length mean and m2 of the newest ``recent_buckets`` sealed
        buckets (up to ``bucket_id``), by Chan's merge of three columns only, not the whole rows."""
        prompt_mean, prompt_m2 = MEAN.start + 1, M2.start + 1  # MOMENT_FIELDS[1] is prompt_tokens
        positions = [(bucket_id - k) % self.n_buckets for k in range(self.recent_buckets)]
        count = np.stack([self._stats[p, select, COUNT] for p in positions])  # (buckets, rows)
        bucket_mean = np.stack([self._stats[p, select, prompt_mean] for p in positions])
        m2 = sum(self._stats[p, select, prompt_m2] for p in positions)
        n = count.sum(axis=0)
        mean = (count * bucket_mean).sum(axis=0) / np.where(n > 0, n, 1.0)
        between = bucket_mean - mean
        out = np.empty((n.size, 3))
        out[:, 0] = n
        out[:, 1] = mean
        out[:, 2] = m2 + (count * between * between).sum(axis=0)
        return out

    # -- checkpoint -----------------------------------------------------------------------------

    def export_state(self) -> PartitionState:
        """The complete state as plain columns (see ``partition_state.py``). Open sketches are merged in
        place first, which changes nothing observable: the live windows and a restored copy continue
        identically.

        Buckets are exported ordered by (bucket id, key): each ring position and each open bucket is
        then one block whose rows are already in key order, and needs no sort.
        """
        keys = list(self.keys)
        n_keys = len(keys)
        rows = np.fromiter(self.keys.values(), dtype=np.intp, count=n_keys)
        key_of_row = np.full(max(self._capacity, 1), -1, dtype=np.int64)
        key_of_row[rows] = np.arange(n_keys)
        n = self.n_buckets
        n_slots = self.bins.n_slots
        blocks: list[tuple[int, FloatArray, Entries]] = []  # (id, stats by key, combined-slot entries)
        if self.closed_through is not None and n_keys:
            for bucket_id in range(self.closed_through - n + 1, self.closed_through + 1):
                shifted = []
                for k, part in enumerate(self._ring[bucket_id % n]):
                    if k:
                        part = part.copy()
                        part[1] += k * n_slots
                    shifted.append(part)
                blocks.append((bucket_id, self._stats[bucket_id % n][rows], np.concatenate(shifted, axis=1)))
        open_cuda: dict[int, dict[int, Counter[str]]] = {}
        for bucket_id, bucket in sorted(self._open.items()):
            blocks.append((bucket_id, bucket.stats[rows], bucket.sketch(N_SKETCHES * n_slots)))
            open_cuda[bucket_id] = bucket.cuda_errors

        b_key: list[npt.NDArray[np.int64]] = []
        b_id: list[npt.NDArray[np.int64]] = []
        b_stats: list[FloatArray] = []
        b_len: list[npt.NDArray[np.int64]] = []
        sketches: list[Entries] = []
        cuda_rows: list[tuple[int, dict[str, int]]] = []
        written = 0
        for bucket_id, stats, entries in blocks:
            present = np.flatnonzero(stats[:, COUNT])  # keys with events in this bucket, in key order
            if not present.size:
                continue
            entry_key = key_of_row[entries[0]]
            # entries come sorted by (row, slot), a sealed bucket's as one such run per sketch: a stable
            # sort by key alone orders them by (key, slot) (nothing to do when rows follow key order and
            # there is one run)
            if np.any(np.diff(entry_key) < 0):
                order = np.argsort(entry_key, kind="stable")
                entries, entry_key = entries[:, order], entry_key[order]
            b_key.append(present.astype(np.int64))
            b_id.append(np.full(present.size, bucket_id, dtype=np.int64))
            b_stats.append(stats[present])
            b_len.append(np.bincount(entry_key, minlength=n_keys)[present])
            sketches.append(entries[1:])
            for row, errors in open_cuda.get(bucket_id, {}).items():
                cuda_rows.append((written + int(np.searchsorted(present, key_of_row[row])), dict(errors)))
            written += present.size
        cuda_rows.sort(key=lambda item: item[0])
        settings = self.settings
        empty = PartitionState.empty(settings.length_s, settings.step_s, settings.sketch_relative_accuracy)
        return empty._replace(
            watermark=self.watermark,
            closed_through=self.closed_through,
            late_total=self.late_total,
            keys=[(model, replica, ts) for (model, replica), ts in zip(keys, self._last_ts[rows].tolist(),
                                                                      strict=True)],
            bucket_key=np.concatenate(b_key).astype(np.int32) if b_key else empty.bucket_key,
            bucket_id=np.concatenate(b_id) if b_id else empty.bucket_id,
            bucket_stats=np.concatenate(b_stats) if b_stats else empty.bucket_stats,
            sketch_lengths=np.concatenate(b_len) if b_len else empty.sketch_lengths,
            sketch=np.concatenate(sketches, axis=1).astype(np.int32) if sketches else empty.sketch,
            cuda_errors=cuda_rows,
        )

    @classmethod
    def from_state(cls, state: PartitionState, settings: WindowSettings) -> PartitionWindows:
        """Windows rebuilt from :meth:`export_state`'s columns; ValueError when ``state`` was taken
        under other settings or does not describe windows (unknown keys, slots out of range or
        unsorted, a bucket stored twice or older than the window)."""
        for name, then, now in (("length_s", state.length_s, settings.length_s),
                                ("step_s", state.step_s, settings.step_s),
                                ("relative_accuracy", state.relative_accuracy, settings.sketch_relative_accuracy)):
            if then != now:
                raise ValueError(f"snapshot was taken with {name}={then}, settings say {now}")
        w = cls(settings)
        w.watermark = state.watermark
        w.closed_through = state.closed_through
        w.late_total = state.late_total
        n_keys = len(state.keys)
        if n_keys:
            w._grow(n_keys)
        for model, replica, _ in state.keys:
            w._add_key((model, replica))  # rows 0..k-1, in order
        if len(w.keys) != n_keys:
            raise ValueError("a key is stored twice")
        w._last_ts[:n_keys] = [ts for _, _, ts in state.keys]

        key = state.bucket_key.astype(np.intp)
        ids, stats, lengths, sketch = state.bucket_id, state.bucket_stats, state.sketch_lengths, state.sketch
        n = key.size
        if not (ids.size == lengths.size == n and stats.shape == (n, STATS_LEN) and sketch.shape[0] == 2):
            raise ValueError("bucket columns of different lengths")
        if (lengths.size and lengths.min() < 0) or int(lengths.sum()) != sketch.shape[1]:
            raise ValueError("sketch lengths do not add up to the entries")
        if n and (key.min() < 0 or key.max() >= n_keys):
            raise ValueError("bucket refers to an unknown key")
        n_slots = w.bins.n_slots
        top = 2 * n_slots + w.tpot_bins.n_slots  # TPOT slots in coarser bins
        if sketch.shape[1] and (sketch[0].min() < 0 or sketch[0].max() >= top or sketch[1].min() <= 0):
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
        cuda = dict(state.cuda_errors)
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

    def snapshot(self) -> bytes:
        """The complete state as compact bytes (``snapshot.py``); :meth:`restore` reads them back."""
        return snapshot.encode(self.export_state())

    @classmethod
    def restore(cls, data: bytes, settings: WindowSettings) -> PartitionWindows:
        """Rebuild from :meth:`snapshot`; ValueError if the bytes are not a compatible snapshot."""
        return cls.from_state(snapshot.decode(data), settings)
