"""Mergeable count / mean / M2 moments (Welford state, Chan et al. parallel merge), vectorised.

The window keeps counts, sums and Welford moments for every feature that is not a quantile, so
that per-bucket statistics merge into a 60 s window and replicas into a model (stage 1 ships
mergeable moments, not finished variances: docs/design.md, "Two stages, two keys").

A :class:`Moments` holds three arrays of the same shape: ``count``, ``mean`` and ``m2`` (the sum
of squared deviations from the mean). Batch moments are computed two-pass (mean first, then
squared deviations), which is as stable as Welford's update and vectorises; merging uses the
parallel formula of Chan, Golub & LeVeque (1979), which stays exact for large offsets where the
naive ``E[x^2] - E[x]^2`` loses every digit. Variance is the *population* variance ``m2 / count``.

Why not ``river.stats.Var``: it updates one value at a time in Python; here a batch of 100 events
becomes one array operation. The tests cross-check both.

>>> import numpy as np
>>> x = np.array([1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 4])
>>> whole = of(x)
>>> halves = merge(of(x[:2]), of(x[2:]))
>>> float(variance(whole)), float(variance(halves)), float(np.var(x))
(1.25, 1.25, 1.25)
>>> float(merge_many(grouped(x, np.array([0, 1, 1, 0]), 2)).mean[()] - 1e9)
2.5
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Moments:
    """count, mean and M2 arrays (count is float64: exact up to 2**53; it may be broadcastable
    against mean/m2, e.g. one count per part for several fields)."""

    count: FloatArray
    mean: FloatArray
    m2: FloatArray


def empty(shape: int | tuple[int, ...] = ()) -> Moments:
    """Moments of no observations."""
    return Moments(np.zeros(shape), np.zeros(shape), np.zeros(shape))


def of(values: npt.ArrayLike, axis: int = 0) -> Moments:
    """Moments of a batch along ``axis`` (for an ``(n, k)`` array: k columns at once)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.shape[axis]
    if n == 0:
        return empty(tuple(size for i, size in enumerate(x.shape) if i != axis % x.ndim))
    mean = x.mean(axis=axis)
    m2 = np.square(x - np.expand_dims(mean, axis)).sum(axis=axis)
    return Moments(np.full(np.shape(mean), float(n)), mean, m2)


def grouped(values: npt.ArrayLike, groups: npt.NDArray[np.integer], n_groups: int) -> Moments:
    """Moments per group: ``values`` is ``(n,)`` or ``(n, k)``, ``groups[i]`` in ``[0, n_groups)``.

    Result arrays are ``(n_groups,)`` or ``(n_groups, k)``; empty groups have count 0, mean 0.
    """
    x = np.asarray(values, dtype=np.float64)
    column = x.ndim == 1
    if column:
        x = x[:, None]
    k = x.shape[1]
    count = np.bincount(groups, minlength=n_groups).astype(np.float64)
    safe = np.where(count > 0, count, 1.0)
    # one bincount per column: bincount has no 2-D form, k is small (5 here)
    sums = np.stack([np.bincount(groups, weights=x[:, j], minlength=n_groups) for j in range(k)],
                    axis=1, dtype=np.float64)
    mean = sums / safe[:, None]
    dev2 = np.square(x - mean[groups])
    m2 = np.stack([np.bincount(groups, weights=dev2[:, j], minlength=n_groups) for j in range(k)],
                  axis=1, dtype=np.float64)
    counts = np.repeat(count[:, None], k, axis=1)
    if column:
        return Moments(counts[:, 0], mean[:, 0], m2[:, 0])
    return Moments(counts, mean, m2)


def merge(a: Moments, b: Moments) -> Moments:
    """Chan et al.: the moments of the union of two disjoint sets of observations."""
    n = a.count + b.count
    safe = np.where(n > 0, n, 1.0)
    delta = b.mean - a.mean
    mean = np.where(n > 0, a.mean + delta * (b.count / safe), 0.0)
    m2 = a.m2 + b.m2 + np.square(delta) * (a.count * b.count / safe)
    return Moments(n, mean, m2)


def merge_many(m: Moments, axis: int = 0) -> Moments:
    """Merge all parts along ``axis`` at once (the k-way form of Chan's formula).

    ``mean = sum(n_i * mean_i) / n`` and ``m2 = sum(m2_i) + sum(n_i * (mean_i - mean)**2)``:
    the between-part term is computed from deviations, not raw squares, so it stays stable.
    ``count`` may be broadcastable against ``mean`` (e.g. ``(p, 1)`` for p parts of k fields).
    """
    n = m.count.sum(axis=axis)
    weights = m.count / np.where(n > 0, n, 1.0)  # each part's share of the total
    mean = (weights * m.mean).sum(axis=axis)
    between = (m.count * np.square(m.mean - np.expand_dims(mean, axis))).sum(axis=axis)
    return Moments(n, mean, m.m2.sum(axis=axis) + between)


def merge_runs(m: Moments, starts: npt.NDArray[np.int64]) -> Moments:
    """:func:`merge_many` over each run of consecutive rows (run ``g`` starts at row ``starts[g]``, ends
    where the next starts): ``m``'s arrays are ``(n, k)``, ``count`` may be ``(n, 1)`` (one per row).
    A run with no observation gets mean 0, m2 0.

    >>> runs = merge_runs(Moments(np.array([[1.0], [3.0], [2.0]]), np.array([[4.0], [0.0], [5.0]]),
    ...                           np.zeros((3, 1))), np.array([0, 2]))
    >>> runs.count[:, 0].tolist(), runs.mean[:, 0].tolist(), runs.m2[:, 0].tolist()
    ([4.0, 2.0], [1.0, 5.0], [12.0, 0.0])
    """
    n = np.add.reduceat(m.count, starts, axis=0)
    mean = np.add.reduceat(m.count * m.mean, starts, axis=0) / np.where(n > 0, n, 1.0)
    run_of = np.repeat(np.arange(len(starts)), np.diff(starts, append=len(m.mean)))  # each row's run
    deviation = m.mean - mean[run_of]
    between = np.add.reduceat(m.count * (deviation * deviation), starts, axis=0)
    return Moments(n, mean, np.add.reduceat(m.m2, starts, axis=0) + between)


def merge_rows(count: FloatArray, mean: FloatArray, m2: FloatArray) -> Moments:
    """:func:`merge_many` over axis 0 for p parts (rows) of k fields sharing one count per part.

    Same formula, written with dot products: on a 12 x 5 window this runs in a few microseconds,
    where the generic broadcasting form pays numpy's per-call overhead a dozen times.
    """
    n = float(np.add.reduce(count))
    k = mean.shape[1]
    if n == 0.0:
        return Moments(np.zeros(k), np.zeros(k), np.zeros(k))
    merged_mean = (count / n) @ mean
    deviation = mean - merged_mean
    merged_m2 = np.add.reduce(m2, axis=0) + count @ (deviation * deviation)
    return Moments(np.full(k, n), merged_mean, merged_m2)


def variance(m: Moments) -> FloatArray:
    """Population variance ``m2 / count``; NaN where count is 0 (unknown, not zero)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m.count > 0, m.m2 / np.where(m.count > 0, m.count, 1.0), np.nan)
