"""Per-key numeric records kept as columns: one row per key, one float64 array per slot.

A detector that remembers a few numbers per replica every step (a window's TPOT by its end, a
hit rate's running mean) pays for a dict and a list per replica and step when it keeps them one
replica at a time, and for the cyclic collector scanning them. :class:`KeyColumns` keeps the same
records as arrays: a *slot* (an integer: a window's end in ms, or 0 for a single record) holds
``width`` floats per row, a row per key; a record is present where its first float is not NaN
(so that float must never be NaN in a present record: a count, a weight). A whole step's
replicas are written, read and pruned at once by their rows; a lone key reads and writes its own.

>>> cols = KeyColumns(width=2)
>>> rows = cols.rows(["m/a", "m/b"])
>>> cols.put(rows, 60_000, np.array([[10.0, 1.5], [20.0, 2.5]]))
>>> cols.get(cols.row("m/b"), 60_000), cols.get(cols.row("m/b"), 55_000)
([20.0, 2.5], None)
>>> cols.drop_before(rows[:1], 65_000)  # m/a's records before 65 s are gone, m/b's are kept
>>> cols.records("m/a"), cols.records("m/b")
({}, {60000: [20.0, 2.5]})
>>> cols.forget("m/b"); cols.records("m/b")
{}
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class KeyColumns:
    """Records of ``width`` floats per key and slot, as one ``(rows, width)`` array per slot."""

    __slots__ = ("width", "_row", "_free", "_capacity", "_slots", "_last_keys", "_last_rows")

    def __init__(self, width: int) -> None:
        self.width = width
        self._row: dict[str, int] = {}  # key -> its row
        self._free: list[int] = []  # rows of forgotten keys, reused (their records cleared)
        self._capacity = 0
        self._slots: dict[int, FloatArray] = {}  # slot -> (capacity, width), NaN where absent
        # the last rows() call's keys and rows: a model's step has the same replicas step after step
        self._last_keys: list[str] | None = None
        self._last_rows: IntArray = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, key: object) -> bool:
        return key in self._row

    # ------------------------------------------------------------------ rows

    def row(self, key: str) -> int | None:
        """``key``'s row, None when it has none."""
        return self._row.get(key)

    def add(self, key: str) -> int:
        """``key``'s row, given one if it has none (without records)."""
        row = self._row.get(key)
        if row is not None:
            return row
        if self._free:
            row = self._free.pop()
        else:
            row = len(self._row)
            if row >= self._capacity:
                self._grow(max(16, 2 * self._capacity))
        self._row[key] = row
        self._last_keys = None
        return row

    def rows(self, keys: Sequence[str]) -> IntArray:
        """The rows of ``keys`` (in that order), given to those without one."""
        last = self._last_keys
        if last is not None and len(last) == len(keys) and last == keys:
            return self._last_rows
        found = self._row
        if all(key in found for key in keys):
            rows = np.fromiter((found[key] for key in keys), np.int64, len(keys))
        else:
            rows = np.fromiter((self.add(key) for key in keys), np.int64, len(keys))
        self._last_keys, self._last_rows = list(keys), rows
        return rows

    def forget(self, key: str) -> None:
        """Drop ``key`` and its records (its row is reused)."""
        row = self._row.pop(key, None)
        if row is None:
            return
        for values in self._slots.values():
            values[row] = np.nan
        self._free.append(row)
        self._last_keys = None

    def clear(self) -> None:
        """Drop every key and record."""
        self._row.clear()
        self._free.clear()
        self._capacity = 0
        self._slots.clear()
        self._last_keys = None

    def _grow(self, capacity: int) -> None:
        for slot, values in self._slots.items():
            grown = np.full((capacity, self.width), np.nan)
            grown[: self._capacity] = values
            self._slots[slot] = grown
        self._capacity = capacity

    # ------------------------------------------------------------------ records

    def put(self, rows: IntArray, slot: int, values: FloatArray) -> None:
        """Set the records of ``rows`` at ``slot`` (``values``: one row of ``width`` per row)."""
        if len(rows) == 0:
            return
        column = self._slots.get(slot)
        if column is None:
            column = self._slots[slot] = np.full((self._capacity, self.width), np.nan)
        column[rows] = values

    def get(self, row: int | None, slot: int) -> list[float] | None:
        """The record of ``row`` at ``slot``; None when absent (or ``row`` is None)."""
        column = self._slots.get(slot)
        if column is None or row is None:
            return None
        record = column[row]
        if np.isnan(record[0]):
            return None
        return record.tolist()

    def read(self, rows: IntArray, slot: int) -> FloatArray:
        """The records of ``rows`` at ``slot``, ``(len(rows), width)``, NaN where absent."""
        column = self._slots.get(slot)
        if column is None:
            return np.full((len(rows), self.width), np.nan)
        return column[rows]

    def drop_before(self, rows: IntArray, cutoff: int) -> None:
        """Remove the records of ``rows`` at slots below ``cutoff``; a slot left empty is freed."""
        if len(rows) == 0:
            return
        for slot in [slot for slot in self._slots if slot < cutoff]:
            column = self._slots[slot]
            column[rows] = np.nan
            if np.isnan(column[:, 0]).all():
                del self._slots[slot]

    def records(self, key: str) -> dict[int, list[float]]:
        """``key``'s records by slot, in slot order (for a checkpoint)."""
        row = self._row.get(key)
        if row is None:
            return {}
        found: dict[int, list[float]] = {}
        for slot in sorted(self._slots):
            record = self._slots[slot][row]
            if not np.isnan(record[0]):
                found[slot] = record.tolist()
        return found

    def held_keys(self) -> Iterator[str]:
        """The keys with at least one record."""
        if not self._slots:
            return
        held = np.zeros(self._capacity, dtype=bool)
        for values in self._slots.values():
            held |= ~np.isnan(values[:, 0])
        for key, row in self._row.items():
            if held[row]:
                yield key


__all__ = ["KeyColumns"]
