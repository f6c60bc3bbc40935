"""Credibility weighting: a replica's load score shrinks toward its pool's when its evidence is thin.

A replica's score (``1 / denominator`` of the weight formula) comes from a 60 s window; on three
requests its mean latency is mostly the luck of which requests it got. Bühlmann's credibility
gives that score the weight its evidence deserves:

    z = n / (n + k)                 n: the requests in the replica's window
    score' = z · score + (1 − z) · pool

where ``pool`` is the pool's credibility-weighted mean score, Σ zᵢ·scoreᵢ / Σ zᵢ (Bühlmann-Straub's
collective estimate). A replica with no requests gets the pool's score, i.e. an equal share of the
traffic; one with ``k`` requests is halfway between; one with 10·k requests is 91 % its own.

**The constant k** (``credibility_k``, default 16) is Bühlmann's EPV / VHM: the variance of one
request's latency around its replica's mean, over the variance of the replicas' means. End-to-end
latency of LLM requests varies about as much as its mean (coefficient of variation ≈ 1: output
lengths are heavy-tailed), and a difference between replicas worth routing on is ≥ 25 % of the
mean, so k = 1² / 0.25² = 16: on 16 requests a replica's mean has a standard error of 25 %, as large
as the difference it should reveal. ``k = 0`` turns credibility off (the weight formula alone).

>>> [round(s, 2) for s in shrink([2.0, 4.0, 10.0], [100, 100, 2], k=16.0)]
[2.2, 3.92, 4.15]
"""

from __future__ import annotations

from collections.abc import Sequence


def credibility(n: float, k: float) -> float:
    """``n / (n + k)``: how much of a replica's own score to keep (1.0 when ``k`` is 0).

    >>> credibility(16, 16.0), credibility(0, 16.0), credibility(3, 0.0)
    (0.5, 0.0, 1.0)
    """
    if k <= 0:
        return 1.0
    return n / (n + k) if n > 0 else 0.0


def shrink(scores: Sequence[float], counts: Sequence[float], k: float) -> list[float]:
    """Every score moved toward the pool's credibility-weighted mean by ``1 − z``; with no evidence
    anywhere, every replica gets the plain mean (an equal share). Scores are > 0."""
    if k <= 0 or not scores:
        return list(scores)
    z = [credibility(n, k) for n in counts]
    total_z = sum(z)
    # Bühlmann-Straub's collective estimate; with no evidence anywhere, the plain mean
    pool = sum(zi * s for zi, s in zip(z, scores, strict=True)) / total_z if total_z > 0 else sum(scores) / len(scores)
    return [zi * s + (1.0 - zi) * pool for zi, s in zip(z, scores, strict=True)]
