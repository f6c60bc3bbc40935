"""A pool's slowest requests over a horizon of steps: the evidence of many windows, summed.

A window of 60 s judges the requests it holds. Where a replica finishes a few requests a minute,
a window holds one or two stalled requests at most, and no quantile of it can prove a share of
them slow; the next window, which overlaps it, proves nothing new. What adds up is the newest step
of each window: its requests (``step_count``) and the slowest of them (``step_tpot_max``), which
no other step holds. :class:`TailHorizon` keeps both per replica for the last ``span`` steps and
judges every replica of a step against its peers over the same span:

* the level: ``ratio`` x the slowest request of all its peers' over the span (their ``M``
  requests). Were the replica's requests drawn like its peers', each would be above the slowest
  of ``M`` with probability ``1 / (M + 1)`` (any order of ``M + 1`` exchangeable values is
  equally likely), and above ``ratio`` x that no more often;
* the count: the steps of the span whose slowest request of the replica is above the level (each
  holds one such request at least) among its ``n`` requests of the span;
* the tail bound ``P(X >= hits)``, ``X ~ Binomial(n, 1 / (M + 1))``
  (:func:`~skewwatch.pipeline.detectors.evidence.binomial_tail_bound`).

It needs no model of the latencies' tail, only that a healthy replica's requests are like its
peers': the bound is what ``M`` requests can show. On a pool of ``k`` replicas the expected count
is about ``1 / (k - 1)`` whatever the span, so three or four stalled requests within it are news;
a longer span lets them be further apart.

>>> horizon = TailHorizon(span_s=600.0)
>>> keys = ["a", "b", "c", "d"]
>>> for step in range(60):  # five minutes of 5 s steps: a request a step each, ~10 ms per token
...     slow = 200.0 if step in (20, 31, 44, 52) else 10.0 + step % 3  # "a" stalls 4 times
...     judged = horizon.update(5.0 * step, keys, np.ones(4), np.array([slow, 10.5, 11.0, 10.2]), ratio=2.0)
>>> judged.hits.tolist(), judged.requests.tolist(), judged.peer_requests.tolist()
([4, 0, 0, 0], [60.0, 60.0, 60.0, 60.0], [180.0, 180.0, 180.0, 180.0])
>>> judged.level.tolist()  # 2 x the slowest of each one's peers: 11 ms for "a", its 200 ms for the others
[22.0, 400.0, 400.0, 400.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.evidence import binomial_tail_bound

Floats = npt.NDArray[np.float64]
BULK_SHARE = 0.5  # steps above the level since the first: this share or more is a shifted bulk, no tail


@dataclass(frozen=True, slots=True)
class HorizonJudgement:
    """Per replica of the step (its order): the span's counts against its peers'; and, asked for one
    replica, the bulk of its steps against the pool's (:meth:`medians`)."""

    now: float  # the step judged: when it ended
    hits: npt.NDArray[np.int64]  # steps of the span whose slowest request is above the level
    requests: Floats  # the replica's requests over the span (n)
    steps: npt.NDArray[np.int64]  # its steps with a request over the span
    peer_requests: Floats  # its peers' requests over the span (M)
    peers: npt.NDArray[np.int64]  # peers with a request over the span
    level: Floats  # ratio x the slowest of the peers' requests (NaN: no peer has one)
    slowest: Floats  # (replicas, cells): each step's slowest request within the span (0: none)
    ended: Floats  # (replicas, cells): when each of those steps ended

    def newest_hit(self, row: int) -> float:
        """When the newest step of replica ``row`` above its level ended (-inf: none)."""
        hit = self.slowest[row] > self.level[row]  # (NaN level: never)
        return float(self.ended[row][hit].max()) if hit.any() else -math.inf

    def bulk(self, row: int) -> tuple[float, float, float]:
        """Replica ``row``'s steps with a request since its first step above the level: the share of
        them above it, the median of their slowest requests, and the median of the others' steps
        over the same time (NaN: none). A tail is a minority of a replica's requests around its
        usual median; a replica slower as a whole has most of them above, or its median shifted."""
        slow, ended = self.slowest, self.ended
        hit = slow[row] > self.level[row]  # (NaN level: never)
        if not hit.any():
            return math.nan, math.nan, math.nan
        since = ended >= ended[row][hit].min()
        served = since & (slow > 0)
        own = slow[row][served[row]]
        served[row] = False
        others = slow[served]
        return (float(hit.sum() / len(own)), float(np.median(own)),
                float(np.median(others)) if len(others) else math.nan)


class TailHorizon:
    """Each replica's requests and slowest request per step over the last ``span_s`` seconds (a
    ring of ``cells`` steps per replica; a cell counts while its step ended within the span, so a
    replica that skips steps keeps no stale ones, and steps shorter than ``span_s / cells`` shorten
    the span to ``cells`` steps). One per pool."""

    def __init__(self, span_s: float, cells: int = 128) -> None:
        if span_s <= 0 or cells < 1:
            raise ValueError(f"span_s must be positive and cells at least 1, not {span_s} and {cells}")
        self.span_s = span_s
        self.cells = cells
        self._row: dict[str, int] = {}
        self._free: list[int] = []
        self._count = np.zeros((0, cells))
        self._slowest = np.zeros((0, cells))
        self._ended = np.full((0, cells), -np.inf)  # when the step each cell holds ended
        self._cell = -1
        self._now = -np.inf

    def __len__(self) -> int:
        return len(self._row)

    def _rows(self, keys: list[str]) -> npt.NDArray[np.intp]:
        rows = np.empty(len(keys), dtype=np.intp)
        for i, key in enumerate(keys):
            row = self._row.get(key)
            if row is None:
                row = self._free.pop() if self._free else len(self._row)
                if row >= len(self._count):
                    grow = max(row + 1, 2 * len(self._count), 8)
                    self._count = _grown(self._count, grow, 0.0)
                    self._slowest = _grown(self._slowest, grow, 0.0)
                    self._ended = _grown(self._ended, grow, -np.inf)
                self._row[key] = row
                self._count[row] = 0.0
                self._slowest[row] = 0.0
                self._ended[row] = -np.inf
            rows[i] = row
        return rows

    def clear(self, key: str) -> None:
        """Forget a replica's steps so far (its evidence starts again)."""
        row = self._row.get(key)
        if row is not None:
            self._ended[row] = -np.inf

    def forget(self, key: str) -> None:
        """Drop a replica (released by stage 1): its row is reused."""
        row = self._row.pop(key, None)
        if row is not None:
            self._free.append(row)

    def update(self, now: float, keys: list[str], count: Floats, slowest: Floats, ratio: float) -> HorizonJudgement:
        """Record the step ending at ``now``: the requests (``count``) and the slowest request
        (``slowest``; NaN or 0: none) of the replicas ``keys``, and judge each of them against the
        others of ``keys`` over the span ending at ``now``. Recording a step again replaces it."""
        if now > self._now:
            self._cell, self._now = (self._cell + 1) % self.cells, now
        rows = self._rows(keys)
        cell = self._cell
        self._count[rows, cell] = np.nan_to_num(count)
        self._slowest[rows, cell] = np.nan_to_num(slowest)
        self._ended[rows, cell] = now
        live = self._ended[rows] > now - self.span_s  # (replicas, cells): the span's steps
        counts = np.where(live, self._count[rows], 0.0)
        slow = np.where(live, self._slowest[rows], 0.0)
        requests = counts.sum(axis=1)
        top = slow.max(axis=1)
        peer_requests = requests.sum() - requests
        peers = (requests > 0).sum() - (requests > 0)
        # the slowest of the others: the pool's slowest, or its second where the replica holds it
        peer_top = np.zeros(len(top))
        if len(top) > 1:
            order = np.argsort(-top, kind="stable")
            peer_top[:] = top[order[0]]
            peer_top[order[0]] = top[order[1]]
        level = np.where(peer_top > 0, ratio * peer_top, np.nan)
        with np.errstate(invalid="ignore"):
            hits = (slow > level[:, None]).sum(axis=1)
        return HorizonJudgement(now=now, hits=hits.astype(np.int64), requests=requests,
                                steps=(counts > 0).sum(axis=1).astype(np.int64), peer_requests=peer_requests,
                                peers=peers.astype(np.int64), level=level, slowest=slow,
                                ended=np.where(live, self._ended[rows], -np.inf))


@dataclass(frozen=True, slots=True)
class HorizonVerdict:
    """The horizon rule on one replica of a step."""

    holds: bool
    bound: float  # P(X >= hits), X ~ Binomial(n, 1 / (M + 1))
    shifted: bool  # its recent bulk is slow: a slow replica's, no tail


class HorizonRule:
    """The rule over a :class:`TailHorizon`: a replica holds when its count of steps above the
    level has a tail bound at most ``alpha``, its newest such step ended within ``recent_s`` (the
    stalls go on), and, of its steps with a request since its first above the level, fewer than
    :data:`BULK_SHARE` are above it and their median is at most ``shift_ratio`` x the others' over
    the same time (else its bulk is slow, a slow replica's, not a tail; its steps so far are
    forgotten, as they are when its alert resolves, so neither a slowdown nor a tail that ended
    argues for the next one). No claim with fewer than ``min_peers`` peers with requests over
    the span."""

    def __init__(self, span_s: float, recent_s: float, ratio: float, alpha: float, shift_ratio: float,
                 min_peers: int) -> None:
        self.horizon = TailHorizon(span_s)
        self.recent_s, self.ratio, self.alpha = recent_s, ratio, alpha
        self.shift_ratio, self.min_peers = shift_ratio, min_peers
        self.judged: HorizonJudgement | None = None
        self.verdicts: dict[int, HorizonVerdict] = {}  # row -> verdict, for the rows with a step above

    def step(self, now: float, keys: list[str], count: Floats, slowest: Floats, resolved: Iterable[str]) -> None:
        """Record the step and judge it; ``resolved``: replicas whose alert resolved since the last."""
        for key in resolved:
            self.horizon.clear(key)
        judged = self.judged = self.horizon.update(now, keys, count, slowest, self.ratio)
        self.verdicts = {}
        since = now - self.recent_s
        for row in np.flatnonzero((judged.hits > 0) & (judged.peers >= self.min_peers)).tolist():
            hits, n = int(judged.hits[row]), int(judged.requests[row])
            bound = binomial_tail_bound(hits, n, 1.0 / (float(judged.peer_requests[row]) + 1.0))
            shifted = False
            if bound <= self.alpha and judged.newest_hit(row) > since:
                share, own, others = judged.bulk(row)
                shifted = share >= BULK_SHARE or own > self.shift_ratio * others  # (NaN compares False)
                if shifted:
                    self.horizon.clear(keys[row])
            self.verdicts[row] = HorizonVerdict(bound <= self.alpha and judged.newest_hit(row) > since
                                                and not shifted, bound, shifted)

    def holds(self, rows: int) -> npt.NDArray[np.bool_]:
        """Per row of the judged step (``rows`` of them): whether the rule holds."""
        out = np.zeros(rows, dtype=bool)
        out[[row for row, verdict in self.verdicts.items() if verdict.holds]] = True
        return out

    def finding(self, row: int, span_s: float) -> tuple[bool | None, dict[str, Any], str]:
        """The rule's judgement of ``row``: (holds, None without peers or requests; its evidence;
        its message)."""
        judged = self.judged
        if judged is None or judged.peers[row] < self.min_peers or judged.requests[row] == 0:
            return None, {}, ""
        verdict = self.verdicts.get(row, HorizonVerdict(False, 1.0, False))
        hits, n, m = int(judged.hits[row]), int(judged.requests[row]), int(judged.peer_requests[row])
        level = float(judged.level[row])
        evidence: dict[str, Any] = {
            "signal": "TPOT over the horizon", "horizon_s": span_s, "horizon_hits": hits, "horizon_requests": n,
            "horizon_peer_requests": m, "horizon_level_ms": None if math.isnan(level) else level,
            "horizon_probability": verdict.bound, "alpha": self.alpha}
        message = (
            f"long tail: at least {hits} of {n} requests over the last {span_s:g} s decoded slower than "
            f"{level:.1f} ms per token ({self.ratio:g} x the slowest of its peers' {m}; probability "
            f"{verdict.bound:.1e} <= {self.alpha:g} if it served like them)")
        if verdict.shifted:
            message += "; since the first, its requests are slow as a whole: a slow replica, not a tail"
        return verdict.holds, evidence, message


def _grown(array: Floats, rows: int, fill: float) -> Floats:
    grown = np.full((rows, array.shape[1]), fill, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


__all__ = ["HorizonJudgement", "HorizonRule", "HorizonVerdict", "TailHorizon"]
