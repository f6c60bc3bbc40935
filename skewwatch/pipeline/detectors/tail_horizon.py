"""A pool's slowest requests over a horizon of steps: the evidence of many windows, summed.

A window of 60 s judges the requests it holds. Where a replica finishes a few requests a minute,
a window holds one or two stalled requests at most, and no quantile of it can prove a share of
them slow; the next window, which overlaps it, proves nothing new. What adds up is the newest step
of each window: its requests (``step_count``) and the slowest of them (``step_tpot_max``), which
no other step holds. :class:`TailHorizon` keeps both per replica for the last ``span_s`` and
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
>>> judged.hits.tolist(), judged.requests.tolist(), judged.peer_requests.tolist()  # (from the second step)
([4, 0, 0, 0], [59.0, 59.0, 59.0, 59.0], [177.0, 177.0, 177.0, 177.0])
>>> judged.level.tolist()  # 2 x the slowest of each one's peers: 11 ms for "a", its 200 ms for the others
[22.0, 400.0, 400.0, 400.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.evidence import binomial_tail_bound

Floats = npt.NDArray[np.float64]
BULK_SHARE = 0.5  # steps above the level since the first: this share or more is a shifted bulk, no tail


@dataclass(frozen=True, slots=True)
class HorizonJudgement:
    """Per replica of the step (its order): the span's counts against its peers'. Only the replicas
    with a step above their level (``hits > 0``) are read further (:meth:`newest_hit`, :meth:`bulk`),
    from the horizon as it is until its next update."""

    now: float  # the step judged: when it ended
    hits: npt.NDArray[np.int64]  # steps of the span whose slowest request is above the level
    requests: Floats  # the replica's requests over the span (n)
    peer_requests: Floats  # its peers' requests over the span (M)
    peers: npt.NDArray[np.int64]  # peers with a request over the span
    level: Floats  # ratio x the slowest of the peers' requests (NaN: no peer has one)
    rows: npt.NDArray[np.intp]  # each replica's row of the horizon
    horizon: TailHorizon

    def newest_hit(self, i: int) -> float:
        """When the newest step of replica ``i`` above its level ended (-inf: none)."""
        row = self.rows[i]
        slow, ended = self.horizon.cells_of(row)
        hit = slow > self.level[i]  # (NaN level: never)
        return float(ended[hit].max()) if hit.any() else -math.inf

    def bulk(self, i: int) -> tuple[float, float, float]:
        """Replica ``i``'s steps with a request since its first step above the level: the share of
        them above it, the median of their slowest requests, and the median of the others' steps
        over the same time (NaN: none). A tail is a minority of a replica's requests around its
        usual median; a replica slower as a whole has most of them above, or its median shifted."""
        row = self.rows[i]
        slow, ended = self.horizon.cells_of(row)
        hit = slow > self.level[i]  # (NaN level: never)
        if not hit.any():
            return math.nan, math.nan, math.nan
        first = ended[hit].min()
        own = slow[(ended >= first) & (slow > 0)]
        others_slow, others_ended = self.horizon.cells_of(np.delete(self.rows, i))
        others = others_slow[(others_ended >= first) & (others_slow > 0)]
        return (float(hit.sum() / len(own)), float(np.median(own)),
                float(np.median(others)) if len(others) else math.nan)


class TailHorizon:
    """Each replica's requests and slowest request per step over the last ``span_s`` seconds: a
    ring of steps per replica, as many as ``span_s`` holds at the steps' own length (learnt from
    the first two steps; none is judged before). A replica that skips steps has their cells
    emptied when it comes back. The sums a step needs are kept as it goes (each replica's
    requests and slowest over the ring): a step costs a pass over its replicas, not over their
    rings. One per pool; not kept in the checkpoint (after a restart it judges again once it has
    the steps)."""

    def __init__(self, span_s: float) -> None:
        if span_s <= 0:
            raise ValueError(f"span_s must be positive, not {span_s}")
        self.span_s = span_s
        self.cells = 0  # ring length in steps, once the step's length is known
        self._step_s = 0.0
        self._now = -math.inf
        self._row: dict[str, int] = {}
        self._free: list[int] = []  # rows of forgotten replicas, reused first
        self._next = 0  # rows ever made
        self._count = np.zeros((0, 0), dtype=np.float32)  # (a step's requests: exact in float32)
        self._slowest = np.zeros((0, 0))
        self._ended = np.zeros((0, 0))
        self._last = np.zeros(0, dtype=np.int64)  # the step index each row last recorded
        self._requests = np.zeros(0)  # per row: its requests over the ring
        self._top = np.zeros(0)  # per row: its slowest over the ring

    def __len__(self) -> int:
        return len(self._row)

    def cells_of(self, rows: int | npt.NDArray[np.intp]) -> tuple[Floats, Floats]:
        """The slowest request (0: none) and the end of each step of ``rows``' rings (flattened)."""
        return self._slowest[rows].ravel(), self._ended[rows].ravel()

    def _rows(self, keys: list[str]) -> npt.NDArray[np.intp]:
        get = self._row.get
        rows = np.fromiter((get(key, -1) for key in keys), np.intp, len(keys))
        missing = np.flatnonzero(rows < 0)
        if len(missing):  # new replicas: rows freed before, then new ones, made empty at once
            reused = [self._free.pop() for _ in range(min(len(missing), len(self._free)))]
            fresh = list(range(self._next, self._next + len(missing) - len(reused)))
            self._next += len(fresh)
            if self._next > len(self._count):
                grow = max(self._next, 2 * len(self._count), 8)
                self._count = _grown(self._count, grow, 0.0)
                self._slowest = _grown(self._slowest, grow, 0.0)
                self._ended = _grown(self._ended, grow, -math.inf)
                self._last = np.concatenate([self._last, np.zeros(grow - len(self._last), dtype=np.int64)])
                self._requests = np.concatenate([self._requests, np.zeros(grow - len(self._requests))])
                self._top = np.concatenate([self._top, np.zeros(grow - len(self._top))])
            new = np.array(reused + fresh, dtype=np.intp)
            for i, row in zip(missing.tolist(), new.tolist(), strict=True):
                self._row[keys[i]] = row
            rows[missing] = new
            self._empty(new)
        return rows

    def _empty(self, rows: int | npt.NDArray[np.intp]) -> None:
        self._count[rows] = 0.0
        self._slowest[rows] = 0.0
        self._ended[rows] = -math.inf
        self._requests[rows] = 0.0
        self._top[rows] = 0.0
        self._last[rows] = np.iinfo(np.int64).min // 2

    def clear(self, key: str) -> None:
        """Forget a replica's steps so far (its evidence starts again)."""
        row = self._row.get(key)
        if row is not None:
            self._empty(row)

    def forget(self, key: str) -> None:
        """Drop a replica (released by stage 1): its row is reused."""
        row = self._row.pop(key, None)
        if row is not None:
            self._free.append(row)

    def update(self, now: float, keys: list[str], count: Floats, slowest: Floats, ratio: float) -> HorizonJudgement:
        """Record the step ending at ``now``: the requests (``count``) and the slowest request
        (``slowest``; NaN or 0: none) of the replicas ``keys``, and judge each of them against the
        others of ``keys`` over the span ending at ``now``. Recording a step again replaces it."""
        n = len(keys)
        if not self.cells:
            if self._now < now:
                self._step_s, self._now = now - self._now, now
            if math.isinf(self._step_s) or self._step_s <= 0:  # the first step: its length is not known
                return _nothing(now, n, self)
            self.cells = max(round(self.span_s / self._step_s), 1)
            self._count = np.zeros((len(self._count), self.cells), dtype=np.float32)
            self._slowest = np.zeros((len(self._slowest), self.cells))
            self._ended = np.full((len(self._count), self.cells), -math.inf)
        self._now = max(self._now, now)
        rows = self._rows(keys)
        step = round(now / self._step_s)
        cell = step % self.cells
        # rows that skipped steps (or are new): the cells of those steps emptied, all at once where
        # it skipped a whole ring
        gap = rows[self._last[rows] < step - 1]
        if len(gap):
            far = gap[step - 1 - self._last[gap] >= self.cells]
            self._count[far], self._slowest[far], self._ended[far] = 0.0, 0.0, -math.inf
            self._requests[far], self._top[far] = 0.0, 0.0
            for row in gap[step - 1 - self._last[gap] < self.cells].tolist():
                for back in range(1, step - int(self._last[row])):
                    old = (step - back) % self.cells
                    self._requests[row] -= self._count[row, old]
                    self._count[row, old], self._slowest[row, old], self._ended[row, old] = 0.0, 0.0, -math.inf
                self._top[row] = self._slowest[row].max()
        new_count, new_slow = np.nan_to_num(count), np.nan_to_num(slowest)
        old_slow = self._slowest[rows, cell]
        self._requests[rows] += new_count - self._count[rows, cell]  # (the step it overwrites leaves)
        self._count[rows, cell] = new_count
        self._slowest[rows, cell] = new_slow
        self._ended[rows, cell] = now
        self._last[rows] = step
        top = self._top[rows]
        lost = np.flatnonzero((old_slow >= top) & (new_slow < old_slow))  # the slowest left the ring
        top = np.maximum(top, new_slow)
        if len(lost):
            top[lost] = self._slowest[rows[lost]].max(axis=1)
        self._top[rows] = top
        requests = self._requests[rows]
        peer_requests = requests.sum() - requests
        peers = (requests > 0).sum() - (requests > 0)
        # the slowest of the others: the pool's slowest, or its second where the replica holds it
        peer_top = np.zeros(n)
        if n > 1:
            first = int(np.argmax(top))
            peer_top[:] = top[first]
            others = top.copy()
            others[first] = -math.inf
            peer_top[first] = others.max()
        level = np.where(peer_top > 0, ratio * peer_top, np.nan)
        hits = np.zeros(n, dtype=np.int64)
        with np.errstate(invalid="ignore"):
            above = np.flatnonzero(top > level)  # (NaN level: never) most replicas have no step above
        if len(above):
            hits[above] = (self._slowest[rows[above]] > level[above, None]).sum(axis=1)
        return HorizonJudgement(now=now, hits=hits, requests=requests, peer_requests=peer_requests,
                                peers=peers.astype(np.int64), level=level, rows=rows, horizon=self)


def _nothing(now: float, n: int, horizon: TailHorizon) -> HorizonJudgement:
    """A judgement of no evidence (the horizon's first step)."""
    zeros = np.zeros(n)
    return HorizonJudgement(now=now, hits=np.zeros(n, dtype=np.int64), requests=zeros, peer_requests=zeros,
                            peers=np.zeros(n, dtype=np.int64), level=np.full(n, np.nan),
                            rows=np.zeros(n, dtype=np.intp), horizon=horizon)


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


_Grown = TypeVar("_Grown", bound=np.generic)


def _grown(array: npt.NDArray[_Grown], rows: int, fill: float) -> npt.NDArray[_Grown]:
    grown = np.full((rows, array.shape[1]), fill, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


__all__ = ["HorizonJudgement", "HorizonRule", "HorizonVerdict", "TailHorizon"]
