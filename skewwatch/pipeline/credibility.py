"""Credibility weighting: a replica's load score shrinks toward its pool's when its evidence is thin.

A replica's score (``1 / denominator`` of the weight formula) comes from a 60 s window; on three
requests its mean latency is mostly the luck of which requests it got. Bühlmann's credibility
gives that score the weight its evidence deserves:

    z = n / (n + k)                 n: the requests in the replica's window
    score' = z · score + (1 − z) · pool

where ``pool`` is the pool's credibility-weighted mean score, Σ zᵢ·scoreᵢ / Σ zᵢ (Bühlmann-Straub's
collective estimate). A replica with ``k`` requests is halfway between its own score and the
pool's; one with 10·k requests is 91 % its own. A replica with no request has no score of its own
(z = 0): the decider (:mod:`skewwatch.pipeline.pool_evidence`) holds its last score, or gives it the
pool's. With no request anywhere in the pool there is no pool score and every score stays as the
weight formula gave it.

**The constant k** (``credibility_k``, default 16) is Bühlmann's EPV / VHM: the variance of one
request's latency around its replica's mean, over the variance of the replicas' means. End-to-end
latency of LLM requests varies about as much as its mean (coefficient of variation ≈ 1: output
lengths are heavy-tailed), and a difference between replicas worth routing on is ≥ 25 % of the
mean, so k = 1² / 0.25² = 16: on 16 requests a replica's mean has a standard error of 25 %, as large
as the difference it should reveal. ``k = 0`` turns the shrinking off: every replica with a request
keeps its own score (z = 1), and one without still has none (z = 0), as at any k.

>>> pool = shrink([2.0, 4.0, 10.0], credibilities([100, 100, 2], k=16.0))
>>> [round(s, 2) for s in pool.scores], round(pool.mean or 0.0, 2)
([2.2, 3.92, 4.15], 3.42)
>>> credibilities([16, 0, 3], 16.0), credibilities([16, 0, 3], 0.0)
([0.5, 0.0, 0.15789473684210525], [1.0, 0.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def credibilities(counts: Sequence[float], k: float) -> list[float]:
    """``z = n / (n + k)`` for each replica's request count ``n``: how much of its own score to keep;
    0 for a replica without a request (it has no score of its own), 1 for one with requests when
    ``k`` is 0 (``n / n``).

    One call for the whole pool, not one per replica: a call's fixed cost is then paid once per step,
    not once per replica.
    """
    return [n / (n + k) if n > 0 else 0.0 for n in counts]


@dataclass(frozen=True, slots=True)
class Shrunk:
    """A pool's scores after credibility: ``mean`` is the collective estimate (None: no replica of
    the pool had a request, so there is nothing to shrink toward and ``scores`` are the formula's)."""

    mean: float | None
    scores: list[float]


def shrink(scores: Sequence[float], z: Sequence[float]) -> Shrunk:
    """Every score moved toward the pool's credibility-weighted mean by ``1 − z`` (``z`` from
    :func:`credibilities`). Scores are > 0."""
    total_z = sum(z)
    if not total_z > 0:
        return Shrunk(None, list(scores))
    # Bühlmann-Straub's collective estimate
    mean = sum(zi * s for zi, s in zip(z, scores, strict=True)) / total_z
    return Shrunk(mean, [zi * s + (1.0 - zi) * mean for zi, s in zip(z, scores, strict=True)])
