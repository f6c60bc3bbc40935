"""long_tail's exceedance test: how many of a window's requests its quantiles prove above a level,
against how often a request of the baseline is above it.

The level is ``tail_ratio`` x the baseline's P99, which a request of the baseline exceeds with
probability at most 1 % (:data:`BASELINE_EXCEEDANCE`, more on a P99 read from few requests); the
window's quantiles prove a count of its ``n`` requests above it
(:func:`~skewwatch.pipeline.detectors.evidence.min_exceeding`), and the test holds when that count
has probability at most ``alpha`` under Binomial(n, that rate)
(:func:`~skewwatch.pipeline.detectors.evidence.binomial_tail_bound`) and the window's median is
not above ``shift_ratio`` x the baseline's (a slow replica, not a tail).

>>> test = ExceedanceTest(tail_ratio=2.0, shift_ratio=1.5, alpha=1e-3, sample_rate=1.0)
>>> found = test.judge(200, ((0.5, 20.0), (0.9, 90.0), (0.99, 150.0), (1.0, 200.0)), (20.0, 25.0, 200.0, "peers"),
...                    None, 1.0, "TPOT", "decoded slower than", "ms per token", {}, "tpot")
>>> found.holds, found.evidence["exceeding"]
(True, 21)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.alerts import fmt
from skewwatch.pipeline.detectors.evidence import binomial_tail_bound, min_exceeding
from skewwatch.pipeline.detectors.threshold import Finding

Floats = npt.NDArray[np.float64]

BASELINE_EXCEEDANCE = 0.01  # a request of the baseline is above its P99 with at most this probability
TPOT_QUANTILES = np.array([0.5, 0.9, 0.99, 1.0])  # of the window's TPOT p50, p90, p99 and max
LATENCY_QUANTILES = np.array([0.5, 0.95, 0.99])  # of the window's latency p50, p95 and p99
LATENCY_LOWER_TAIL = 0.05  # above the peers' latency P95


@dataclass(frozen=True, slots=True)
class ExceedanceTest:
    """The test with its constants (``alpha``: one signal's share of the rule's bound)."""

    tail_ratio: float
    shift_ratio: float
    alpha: float
    sample_rate: float  # the action's params.sample_rate

    def possible(self, n: Floats, quantiles: Floats, levels: Floats, peer_p99: Floats, peer_count: Floats,
                 tail: tuple[Floats, float, Floats] | None = None) -> npt.NDArray[np.bool_]:
        """Where the test against the peers could hold, for many windows at once (``n``: their
        requests; ``quantiles``: (len(levels), rows), the quantile ``levels[i]`` of each window):
        :meth:`judge`'s count of requests above the level and its binomial bound, as columns, with
        a hair of slack both on the level and on the bound (so rounding can only let a replica
        through to be judged); ``tail`` (the peers' lower quantile, the share above it, their
        requests in all): the rate beyond their P99 at their tail's slope; None: the rate at their
        P99."""
        level = self.tail_ratio * peer_p99 * (1.0 - 1e-9)
        with np.errstate(invalid="ignore", divide="ignore"):
            above = quantiles >= level  # NaN (no value, or no level) is never above
            possible = above.any(axis=0) & (n > 0)
            rows = np.flatnonzero(possible)  # most replicas have no quantile above the level: done
            if not len(rows):
                return possible
            # the first (lowest) quantile above the level proves the most requests above it
            quantile = levels[np.argmax(above[:, rows], axis=0)]
            n = n[rows]
            exceeding = n - np.floor(quantile * (n - 1))
            m = np.trunc(peer_count[rows])
            rate = np.maximum((m - np.floor(0.99 * (m - 1)) - 1) / (m + 1), BASELINE_EXCEEDANCE)
            if tail is not None:
                lower, lower_tail, total = tail
                rate = beyond_p99(rate, self.tail_ratio, lower[rows], peer_p99[rows], lower_tail, total[rows])
            rate *= 1.0 - 1e-9  # (a hair lower than evaluate's rate: the screen may only let more through)
            # binomial_tail_bound is 1 unless the count is above n p
            over = exceeding > n * rate * (1.0 - 1e-9)
            possible[rows] = over
            rows, n, exceeding, rate = rows[over], n[over], exceeding[over], rate[over]
            if not len(rows):
                return possible
            rate = np.minimum(np.maximum(rate, 1e-12), 1.0 - 1e-12)
            share = np.minimum(exceeding / n, 1.0)
            kl = np.where(share > 0, share * np.log(share / rate), 0.0) + np.where(
                share < 1, (1.0 - share) * np.log((1.0 - share) / (1.0 - rate)), 0.0)
            # exp(-n KL) <= alpha (each signal's share of it)
            possible[rows] = n * kl >= -math.log(self.alpha) * (1.0 - 1e-9)
        return possible

    def judge(self, n: int, quantiles: tuple[tuple[float, float | None], ...], ref: tuple[float, float, float, str],
              tail: tuple[float | None, float, float] | None, prefill: float, what: str, verb: str, unit: str,
              evidence: dict[str, Any], prefix: str) -> Finding:
        """One signal's test on one window: how many of its ``n`` requests its ``quantiles``
        ((quantile, value) pairs, the median first) prove above ``tail_ratio`` x the reference P99
        (``ref``: its P50, P99, requests and name; the level raised by ``prefill``), against
        Binomial(n, the reference's exceedance rate); ``tail`` as in :meth:`possible`, for one."""
        ref50, ref99, ref_n, source = ref
        level = self.tail_ratio * ref99 * prefill
        exceeding = 0
        for quantile, value in quantiles:
            if value is not None and value >= level:
                exceeding = min_exceeding(n, quantile)
                break
        # a P99 read from m requests is their (floor(0.99 (m - 1)) + 1)-th smallest, which a new
        # request of the same distribution exceeds with probability (m - that rank) / (m + 1); on few
        # requests that is well above 1 % (the second largest of 30: 6.5 %), whatever tail_ratio adds
        m = int(ref_n)
        baseline_rate = max((m - math.floor(0.99 * (m - 1)) - 1) / (m + 1), BASELINE_EXCEEDANCE)
        if tail is not None:  # beyond the P99 at the slope of the reference's tail
            lower, lower_tail, total = tail
            baseline_rate = float(beyond_p99(np.array([baseline_rate]), self.tail_ratio,
                                             np.array([math.nan if lower is None else lower]), np.array([ref99]),
                                             lower_tail, np.array([total]))[0])
        probability = binomial_tail_bound(exceeding, n, baseline_rate)
        median = quantiles[0][1]
        shifted = ref50 > 0 and median is not None and median > self.shift_ratio * ref50
        alpha = self.alpha
        values = {f"{prefix}_p{round(100 * q)}_ms" if q < 1 else f"{prefix}_max_ms": v for q, v in quantiles}
        evidence.update({**values, "level_ms": level, "exceeding": exceeding, "baseline_rate": baseline_rate,
                         "probability": probability, "alpha": alpha, "reference": source, "signal": what})
        holds = probability <= alpha and not shifted
        message = (
            f"long tail: at least {exceeding} of {n} requests {verb} {fmt(level, 1)} {unit} "
            f"({self.tail_ratio:g} x the {source}' {what} P99 {fmt(ref99, 1)} {unit}; probability "
            f"{probability:.1e} <= {alpha:g} if it served like them)"
        )
        if shifted and median is not None:
            message += (f"; its median {fmt(median, 1)} {unit} is {median / ref50:.1f} x theirs: "
                        "a slow replica, not a tail")
        if prefill > 1.0:
            message += f" (its first tokens {prefill:.1f} x slower than theirs: the level {prefill:.1f} x higher)"
        return Finding(holds=holds, message=message, evidence=dict(evidence),
                       params={"sample_rate": self.sample_rate})


def beyond_p99(rate: npt.NDArray[np.float64], ratio: float, lower: npt.NDArray[np.float64],
                p99: npt.NDArray[np.float64], lower_tail: float,
                total: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """How often a baseline request exceeds ``ratio`` x its P99, from ``rate`` (at the P99 itself):
    the tail beyond the P99 continued as a power law with the slope it has between the baseline's
    lower quantile (exceeded with probability ``lower_tail``) and its P99, ``S(x) ~ x^-a``. A
    log-normal's tail (concave on log-log axes) falls faster than that line, so it overstates the
    rate there; it is never taken below one request in all the peers' ``total`` (``1 / (total +
    1)``: what so many requests can show), nor above ``rate`` (without a lower quantile, ``rate``).

    >>> float(beyond_p99(np.array([0.01]), 2.0, np.array([10.0]), np.array([100.0]), 0.1, np.array([1e6]))[0])
    0.005
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.log(lower_tail / BASELINE_EXCEEDANCE) / np.log(p99 / lower)
        beyond = rate * np.power(ratio, -np.where((lower > 0) & (p99 > lower), slope, 0.0))
    floor = 1.0 / (np.maximum(np.nan_to_num(total), 0.0) + 1.0)
    return np.minimum(np.maximum(np.nan_to_num(beyond, nan=1.0), floor), rate)


__all__ = ["BASELINE_EXCEEDANCE", "LATENCY_LOWER_TAIL", "LATENCY_QUANTILES", "TPOT_QUANTILES", "ExceedanceTest",
           "beyond_p99"]
