"""Is a silent replica dead? Judged against its own arrival rate and its engine's telemetry.

A replica that finished no request for a while may be dead, or may simply have had no traffic: a
replica serving 0.08 requests/s has a gap longer than 15 s between two requests three times in
ten. So a silence is judged against the replica's *own* recent rate, with the evidence behind
that rate taken into account.

**The rule.** Each replica keeps ``n`` (requests) and ``T`` (seconds it was watched) up to its
latest request, both decayed with time constant ``rate_horizon_s`` so the rate follows the
traffic. Requests of a replica are taken as a Poisson stream of unknown rate λ; given ``n``
requests in ``T`` (λ's posterior is Gamma(n, T)), the probability of a silence of ``s`` seconds
from its last request on is

    P(silence ≥ s) = (1 + s / T) ** (−n)

(the Lomax tail; for large ``n`` it is e^(−λ̂ s), λ̂ = n / T). The replica is **stale** when that
probability falls below ``stale_probability`` p, i.e. when

    s ≥ T · (p ** (−1/n) − 1)

which is k mean gaps with k = n · (p^(−1/n) − 1): k = ln(1/p) (9.2 for p = 1e-4, 6.9 for 1e-3) when
the rate is well known, more when it is not (k = 14.9 for n = 10 at p = 1e-4). The threshold is
exact under Poisson arrivals: a healthy replica's gap crosses it with probability p whatever ``n``
(the gap and ``T`` are independent Gamma variables). Below ``stale_min_requests`` requests no
silence is judged (the rate is not known), and no silence shorter than ``stale_min_s`` (the step
resolution and a missed hand-off) ever is.

**Its peers.** A replica of a pool is compared with its peers as well: if the pool's other
replicas finished ``m`` requests since its last one and it usually gets a share ``s`` of the
pool's requests (its rate over the pool's, or the weight it was last given if smaller: a router that
follows the weights sends it that share), the chance it got none of them is ``(1 − s) ** m``.
It is stale only when that too is below ``p``. A whole pool that goes quiet (its traffic stopped)
then has no stale replica: each silence is explained by the others' (the pool's own silence is
judged once, for the pool, by the same rule on the pool's arrivals). A replica alone in its pool
is judged on its own rate.

**Bursts.** Real arrivals are burstier than Poisson (a code-assistant trace pauses for a minute
between bursts): a silence is also never judged stale before ``stale_gap_factor`` (2) times the
longest gap the replica (or pool) had recently (decayed like ``n`` and ``T``). For a stationary
stream the next gap exceeds the longest of the previous N with probability 1 / (N + 1) whatever
its distribution; twice the longest is rarer still. On Poisson traffic the rate rule decides.

**Engine telemetry.** A fresh sample from the engine itself (vLLM, SGLang, TGI, the simulator:
the process answered its metrics endpoint) means the replica is alive whatever its silence
(``liveness_from_telemetry``, default on). A replica that had engine telemetry and lost it
(older than ``telemetry_max_age_s``) while it also finished no request for that long is stale:
both channels went quiet — when a peer's engine answered ``telemetry_max_age_s`` after its last
sample (every engine going quiet together is the pool, or the scraper, not one replica). A
replica whose engine answered when it was last reported and that is no longer reported at all
(stage 1 stops reporting a replica, and its telemetry with it, 90 s after its last request) is
not judged on its silence: its liveness is unknown, not gone, and its weight is held.

**After an ejection.** A replica ejected gets no traffic, so its silence during the ejection
says nothing; :meth:`ArrivalEvidence.restart` starts its silence again when the ejection ends,
and the time it spent out does not count as watched time.

>>> a = ArrivalEvidence.first(now=60.0, window_count=5, window_s=60.0)
>>> for t in range(65, 305, 5):
...     a.observe(now=float(t), requests=1 if t % 15 == 0 else 0)
>>> round(a.rate(), 3), a.silence(300.0)
(0.069, 0.0)
>>> round(a.stale_after(1e-4, min_requests=10), 1)
176.9
>>> a.judge(now=470.0, p=1e-4, min_requests=10, min_s=15.0).stale
False
>>> v = a.judge(now=480.0, p=1e-4, min_requests=10, min_s=15.0)
>>> v.stale, v.reason[:53]
(True, 'stale: no request for 180 s; at its own rate (0.069/s')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a replica is stale now, and why (``reason`` is empty when it is not)."""

    stale: bool
    reason: str = ""
    silence_s: float = 0.0
    threshold_s: float | None = None  # the silence that would make it stale; None: not judged


NOT_STALE = Verdict(False)


@dataclass(slots=True)
class ArrivalEvidence:
    """One replica's arrival-rate evidence: decayed requests ``n`` over watched seconds ``exposure_s``
    up to ``since`` (its latest request, or the moment its silence started counting)."""

    n: float = 0.0
    exposure_s: float = 0.0
    since: float = 0.0  # the silence counts from here
    horizon_s: float = 600.0  # time constant of the decay (rate_horizon_s)
    pool_mark: float = 0.0  # the pool's request count at ``since`` (its peers' requests since = now's - this)
    last_arrival: float | None = None  # its latest request (``since`` also moves when an ejection ends)
    max_gap: float = 0.0  # its longest gap between requests, decayed like n and T

    @classmethod
    def first(cls, now: float, window_count: int, window_s: float, horizon_s: float = 600.0) -> ArrivalEvidence:
        """A replica seen for the first time at ``now``: its window's requests over the window's length
        (a replica that started inside the window then looks slower than it is: a longer threshold)."""
        if window_count > 0:
            return cls(n=float(window_count), exposure_s=window_s, since=now, horizon_s=horizon_s, last_arrival=now)
        return cls(since=now, horizon_s=horizon_s)

    def observe(self, now: float, requests: int, pool_mark: float = 0.0,
                decays: dict[float, float] | None = None) -> None:
        """Fold one step ending at ``now`` with ``requests`` new requests (its ``step_count``);
        ``pool_mark``: the pool's request count after this step; ``decays``: a cache of the decay
        factor by gap, shared by the replicas of a step (most have the same gap)."""
        if requests <= 0:
            return
        gap = max(now - self.since, 0.0)
        decay = decays.get(gap) if decays is not None else None
        if decay is None:
            decay = math.exp(-gap / self.horizon_s) if self.horizon_s > 0 else 1.0
            if decays is not None:
                decays[gap] = decay
        self.n = self.n * decay + requests
        self.exposure_s = self.exposure_s * decay + gap
        self.max_gap = max(self.max_gap * decay, gap)
        self.since, self.pool_mark, self.last_arrival = now, pool_mark, now

    def restart(self, now: float, pool_mark: float = 0.0) -> None:
        """Start the silence again at ``now`` (an ejection ended: the time it was out does not count)."""
        if now > self.since:
            self.since, self.pool_mark = now, pool_mark

    def silence(self, now: float) -> float:
        """Seconds since the latest request (or since the silence started counting)."""
        return max(now - self.since, 0.0)

    def rate(self) -> float | None:
        """Requests per second, as estimated; None before any watched time."""
        return self.n / self.exposure_s if self.exposure_s > 0 else None

    def stale_after(self, p: float, min_requests: float) -> float | None:
        """The silence (s) whose probability under the replica's own rate is ``p``:
        ``T · (p^(−1/n) − 1)``; None below ``min_requests`` of evidence."""
        if self.n < min_requests or self.exposure_s <= 0:
            return None
        return self.exposure_s * math.expm1(-math.log(p) / self.n)

    def judge(
        self,
        now: float,
        p: float,
        min_requests: float,
        min_s: float,
        engine_alive: bool = False,
        engine_lost: bool = False,
        peer_requests: float | None = None,
        share: float | None = None,
        gap_factor: float = 0.0,
    ) -> Verdict:
        """Stale or not at ``now``: never while ``engine_alive``; stale when the engine's telemetry is
        ``engine_lost`` and the silence is at least ``min_s``, or when the silence is improbable at
        the replica's own rate and, in a pool (``peer_requests`` not None: its peers' requests since
        its last one; ``share``: its usual share of the pool's), against its peers too; and never
        before ``gap_factor`` times its longest recent gap."""
        if engine_alive:
            return NOT_STALE
        silence = self.silence(now)
        if engine_lost:
            # telemetry does not depend on the traffic it is sent: its loss outlasts an ejection
            quiet = now - (self.last_arrival if self.last_arrival is not None else self.since)
            if quiet >= min_s:
                return Verdict(True, f"stale: engine telemetry lost and no request for {quiet:.0f} s", quiet, min_s)
        threshold = self.stale_after(p, min_requests)
        if threshold is None:
            return Verdict(False, "", silence, None)
        threshold = max(threshold, min_s, gap_factor * self.max_gap)
        if silence < threshold:
            return Verdict(False, "", silence, threshold)
        rate = self.n / self.exposure_s
        reason = (f"stale: no request for {silence:.0f} s; at its own rate ({rate:.2g}/s from {self.n:.0f} "
                  f"requests) a silence this long has probability < {p:g}")
        if peer_requests is not None:
            if share is None or share <= 0 or (1.0 - share) ** peer_requests >= p:
                return Verdict(False, "", silence, None)  # its peers were as quiet: the pool's traffic
            reason += f", and its peers finished {peer_requests:.0f} requests meanwhile (its share {share:.2f})"
        return Verdict(True, reason, silence, threshold)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (the decider's checkpoint)."""
        return {"n": self.n, "exposure_s": self.exposure_s, "since": self.since, "pool_mark": self.pool_mark,
                "last_arrival": self.last_arrival, "max_gap": self.max_gap}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], horizon_s: float = 600.0) -> ArrivalEvidence:
        """Inverse of :meth:`to_dict`."""
        last = data.get("last_arrival")
        return cls(float(data["n"]), float(data["exposure_s"]), float(data["since"]), horizon_s,
                   float(data.get("pool_mark", 0.0)), None if last is None else float(last),
                   float(data.get("max_gap", 0.0)))
