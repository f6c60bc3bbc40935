"""A pool's prompt lengths over a horizon of windows: where prompts arrive seldom, minutes of them.

context_burst judges the prompts of the newest 20 s, or of the 60 s window where those are too
few. A replica that is sent a prompt a minute holds one or two in its window, and no mean of two
is improbable. The windows that end a window length apart do not overlap, so their moments
(count, mean, variance) merge exactly into those of the minutes they cover: :class:`BurstHorizon`
keeps each replica's window moments for the last ``span_s`` and merges, per replica and for its
peers, the last ``k`` such windows for each ``k`` of :data:`SPANS` (2, 4 and 8 minutes: a burst
that began two minutes ago is diluted by eight).

>>> horizon = BurstHorizon(span_s=600.0, window_s=60.0)
>>> for step in range(1, 100):  # a prompt a minute each, ~1k tokens; "a" gets 8k prompts from step 60
...     a = 8000.0 if step >= 60 else 1000.0
...     horizon.update(5.0 * step, ["a", "b", "c"], np.ones(3), np.array([a, 1000.0, 1100.0]), np.zeros(3))
>>> own, peers = horizon.merged(4)  # the last four minutes: the windows ending 0, 60, 120, 180 s ago
>>> own.count.tolist(), own.mean.tolist()[0], peers.mean.tolist()[0]
([4.0, 4.0, 4.0], 8000.0, 1050.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
SPANS: tuple[int, ...] = (2, 4, 8)  # windows merged: minutes of prompts at the default 60 s window


@dataclass(frozen=True, slots=True)
class Moments:
    """Per replica of the step: merged count, mean and population variance (count 0: none)."""

    count: Floats
    mean: Floats
    var: Floats


class BurstHorizon:
    """Each replica's window moments at every step of the last ``span_s`` (a ring as long as the
    span at the steps' own length, learnt from the first two steps). One per pool; not kept in the
    checkpoint (after a restart it judges again once it has the windows)."""

    def __init__(self, span_s: float, window_s: float) -> None:
        if span_s < window_s or window_s <= 0:
            raise ValueError(f"span_s must be at least window_s > 0, not {span_s} and {window_s}")
        self.span_s, self.window_s = span_s, window_s
        self.cells = 0
        self._step_s = math.inf
        self._now = -math.inf
        self._row: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 0
        self._moments = np.zeros((0, 0, 3))  # (rows, cells, [count, sum, sum of squares])
        self._at = np.zeros((0, 0), dtype=np.int64)  # the step index each cell holds
        self._rows = np.zeros(0, dtype=np.intp)  # the last step's replicas' rows
        self._step = 0

    def forget(self, key: str) -> None:
        """Drop a replica (released by stage 1): its row is reused."""
        row = self._row.pop(key, None)
        if row is not None:
            self._free.append(row)
            self._at[row] = -1

    def update(self, now: float, keys: list[str], count: Floats, mean: Floats, var: Floats) -> None:
        """Record the step ending at ``now``: each replica's window moments (NaN: none)."""
        if not self.cells:
            if self._now < now:
                self._step_s, self._now = now - self._now, now
            if math.isinf(self._step_s) or self._step_s <= 0:
                self._rows = np.zeros(0, dtype=np.intp)
                return
            self.cells = max(round(self.span_s / self._step_s), 1)
            self._moments = np.zeros((len(self._at), self.cells, 3))
            self._at = np.full((len(self._at), self.cells), -1, dtype=np.int64)
        self._now = max(self._now, now)
        get = self._row.get
        rows = np.fromiter((get(key, -1) for key in keys), np.intp, len(keys))
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            reused = [self._free.pop() for _ in range(min(len(missing), len(self._free)))]
            fresh = list(range(self._next, self._next + len(missing) - len(reused)))
            self._next += len(fresh)
            if self._next > len(self._at):
                grow = max(self._next, 2 * len(self._at), 8)
                moments = np.zeros((grow, self.cells, 3))
                moments[: len(self._moments)] = self._moments
                at = np.full((grow, self.cells), -1, dtype=np.int64)
                at[: len(self._at)] = self._at
                self._moments, self._at = moments, at
            new = np.array(reused + fresh, dtype=np.intp)
            for i, row in zip(missing.tolist(), new.tolist(), strict=True):
                self._row[keys[i]] = row
            rows[missing] = new
            self._at[new] = -1
        step = round(now / self._step_s)
        known = (count > 0) & ~np.isnan(mean) & ~np.isnan(var)
        n = np.where(known, count, 0.0)
        m = np.where(known, mean, 0.0)
        v = np.where(known, var, 0.0)
        cell = step % self.cells
        self._moments[rows, cell] = np.stack([n, n * m, n * (v + m * m)], axis=1)
        self._at[rows, cell] = step
        self._rows, self._step = rows, step

    def merged(self, k: int) -> tuple[Moments, Moments]:
        """The last step's replicas' moments over the ``k`` windows ending at it, one, two, ... window
        lengths before (those the span still holds; one that skipped a step holds nothing), and
        their peers' (all the others' of the step)."""
        return self.merged_spans((k,))[0]

    def merged_spans(self, spans: tuple[int, ...]) -> list[tuple[Moments, Moments]]:
        """:meth:`merged` for each of ``spans`` (ascending), the windows summed once."""
        rows = self._rows
        total = np.zeros((len(rows), 3))
        out: list[tuple[Moments, Moments]] = []
        per_window = max(round(self.window_s / self._step_s), 1) if self.cells else 1
        held_windows = self.cells // per_window if self.cells else 0
        j = 0
        for k in spans:
            while j < min(k, held_windows) and len(rows):
                back = self._step - j * per_window
                cell = back % self.cells
                held = self._at[rows, cell] == back
                total += np.where(held[:, None], self._moments[rows, cell], 0.0)
                j += 1
            out.append((_moments(total.copy()), _moments(total.sum(axis=0) - total)))
        return out


def _moments(sums: Floats) -> Moments:
    count = sums[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(count > 0, sums[:, 1] / count, np.nan)
        var = np.where(count > 0, np.maximum(sums[:, 2] / count - mean * mean, 0.0), np.nan)
    return Moments(count, mean, var)


__all__ = ["SPANS", "BurstHorizon", "Moments"]
