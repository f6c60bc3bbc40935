"""How much a window's numbers prove: tail bounds that turn a count into a false-alarm probability.

A rule that compares a point value with a threshold fires on a window of three requests as
readily as on one of three thousand. The default rules instead ask *how improbable* what they see
would be if the replica behaved like its baseline (its pool, or its own past), and judge only when
that probability is below the rule's false-alarm bound. The evidence minimum then follows from the
bound: too few requests can never be improbable enough.

* :func:`binomial_tail_bound`: ``P(X >= k)`` for ``X ~ Binomial(n, p)`` (requests above a level
  that each request of the baseline exceeds with probability ``p``), the Chernoff bound
  ``exp(-n KL(k/n || p))``. It is never below the exact probability, so a rule that fires when it
  is under ``alpha`` has a false-alarm probability under ``alpha``.
* :func:`poisson_tail_bound`: ``P(X >= k)`` for ``X ~ Poisson(mu)`` (requests that arrived within
  one scheduler iteration), the Chernoff bound ``exp(-mu) (e mu / k)^k``.
* :func:`hoeffding_mean_bound`: ``P(mean of n values in [0, 1] <= mu - t)`` (a hit rate below its
  baseline), ``exp(-2 n t^2)``, whatever the values' distribution.
* :func:`lognormal_mean_tail`: ``P(mean of n draws >= x)`` when draws are log-normal with the
  baseline's mean and variance (lengths of prompts are heavy-tailed, a normal fit fires on any long
  one): the mean of ``n`` is approximated by the log-normal of the same mean and variance / ``n``
  (Fenton-Wilkinson).
* :func:`min_exceeding`: how many of ``n`` requests are at least a window's quantile ``q`` (the
  sketches' lower-rank rule), so a quantile above a level proves a count above it.

>>> round(binomial_tail_bound(6, 60, 0.01), 5)  # 6 of 60 above a level 1 % of the baseline exceeds
0.00017
>>> binomial_tail_bound(1, 60, 0.02)  # at or under the expected count: no evidence at all
1.0
>>> min_exceeding(60, 0.9), min_exceeding(60, 0.5), min_exceeding(60, 1.0)
(7, 31, 1)
>>> hoeffding_mean_bound(0.3, 0.75, 40) < 1e-6  # a hit rate of 0.3 over 40 requests where 0.75 is usual
True
>>> lognormal_mean_tail(11_000.0, 1_000.0, 1_300.0 ** 2, 5) < 1e-5  # 5 prompts of 11k where 1k is usual
True
>>> round(lognormal_mean_tail(1_200.0, 1_000.0, 1_300.0 ** 2, 5), 2)
0.27
"""

from __future__ import annotations

import math

SQRT2 = math.sqrt(2.0)


def kl_bernoulli(a: float, p: float) -> float:
    """Kullback-Leibler divergence ``KL(Bernoulli(a) || Bernoulli(p))`` in nats (``0 < p < 1``).

    >>> kl_bernoulli(0.5, 0.5), round(kl_bernoulli(1.0, 0.5), 4)
    (0.0, 0.6931)
    """
    total = 0.0
    if a > 0.0:
        total += a * math.log(a / p)
    if a < 1.0:
        total += (1.0 - a) * math.log((1.0 - a) / (1.0 - p))
    return total


def binomial_tail_bound(k: int, n: int, p: float) -> float:
    """Chernoff bound on ``P(X >= k)`` for ``X ~ Binomial(n, p)``: ``exp(-n KL(k/n || p))`` when
    ``k > n p``, else 1 (no evidence of excess). ``p`` is clipped into ``(1e-12, 1 - 1e-12)``.

    >>> binomial_tail_bound(0, 0, 0.5), binomial_tail_bound(10, 10, 0.5) == 0.5 ** 10
    (1.0, True)
    """
    if n <= 0 or k <= n * p:
        return 1.0
    p = min(max(p, 1e-12), 1.0 - 1e-12)
    return math.exp(-n * kl_bernoulli(min(k / n, 1.0), p))


def poisson_tail_bound(k: float, mu: float) -> float:
    """Chernoff bound on ``P(X >= k)`` for ``X ~ Poisson(mu)``: ``exp(-mu) (e mu / k)^k`` when
    ``k > mu``, else 1.

    >>> poisson_tail_bound(1, 2.0), round(poisson_tail_bound(5, 0.1), 9)
    (1.0, 4.3e-07)
    """
    if k <= mu:
        return 1.0
    if mu <= 0:
        return 0.0
    return math.exp(-mu + k - k * math.log(k / mu))


def hoeffding_mean_bound(observed: float, baseline: float, n: int) -> float:
    """Hoeffding bound on ``P(mean <= observed)`` for the mean of ``n`` independent values in
    ``[0, 1]`` whose expectation is ``baseline``; 1 when ``observed >= baseline``.

    >>> hoeffding_mean_bound(0.8, 0.75, 100)
    1.0
    >>> round(hoeffding_mean_bound(0.65, 0.75, 100), 4)
    0.1353
    """
    gap = baseline - observed
    if n <= 0 or gap <= 0:
        return 1.0
    return math.exp(-2.0 * n * gap * gap)


def normal_sf(z: float) -> float:
    """``P(Z >= z)`` for a standard normal ``Z``.

    >>> round(normal_sf(0.0), 3), round(normal_sf(3.719), 6)
    (0.5, 0.0001)
    """
    return 0.5 * math.erfc(z / SQRT2)


def lognormal_mean_tail(x: float, mean: float, var: float, n: int) -> float:
    """``P(mean of n draws >= x)`` for draws log-normal with ``mean`` and ``var`` (Fenton-Wilkinson:
    the mean of ``n`` taken as log-normal with the same mean and ``var / n``); 1 without evidence
    (``n < 1``, a non-positive mean or ``x``).

    >>> lognormal_mean_tail(100.0, 100.0, 0.0, 3)  # no spread: exactly the mean is not "above"
    1.0
    >>> lognormal_mean_tail(101.0, 100.0, 0.0, 3)
    0.0
    """
    if n < 1 or mean <= 0 or x <= 0:
        return 1.0
    cv2 = max(var, 0.0) / (mean * mean) / n
    if cv2 <= 0.0:
        return 0.0 if x > mean else 1.0
    sigma2 = math.log1p(cv2)
    mu = math.log(mean) - sigma2 / 2.0
    return normal_sf((math.log(x) - mu) / math.sqrt(sigma2))


def min_exceeding(n: int, q: float) -> int:
    """How many of ``n`` values are at least the window's ``q`` quantile: the sketches read the
    quantile at rank ``floor(q (n - 1))`` (0-based, lower), so that value and every one above it.

    >>> min_exceeding(1, 0.5), min_exceeding(100, 0.99), min_exceeding(0, 0.5)
    (1, 2, 0)
    """
    if n <= 0:
        return 0
    return n - math.floor(q * (n - 1))


__all__ = [
    "binomial_tail_bound",
    "hoeffding_mean_bound",
    "kl_bernoulli",
    "lognormal_mean_tail",
    "min_exceeding",
    "normal_sf",
    "poisson_tail_bound",
]
