"""The log-bin quantile sketch against numpy's exact quantiles (<= 1 % relative error at P50/P95/P99)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewwatch.pipeline.sketch import LogBins, SketchTotal, add_sparse, log_bins

QS = [0.5, 0.95, 0.99]
ALPHA = 0.01
# the rank definition is numpy's "lower" (x[floor(q*(n-1))]); the bound is alpha plus float noise
TOLERANCE = ALPHA * (1 + 1e-9)


def relative_errors(bins: LogBins, values: np.ndarray, qs: list[float]) -> np.ndarray:
    sparse = bins.sparse_counts(values)
    estimate = np.array(bins.quantile(sparse[1], qs, slots=sparse[0]))
    exact = np.quantile(values, qs, method="lower")
    return np.abs(estimate - exact) / exact


@pytest.mark.parametrize("name, draw", [
    ("uniform", lambda rng, n: rng.uniform(1.0, 5000.0, n)),
    ("lognormal", lambda rng, n: rng.lognormal(mean=5.0, sigma=1.2, size=n)),
    ("pareto", lambda rng, n: 20.0 * (1.0 + rng.pareto(1.1, n))),  # very heavy tail
    ("tiny-and-huge", lambda rng, n: 10.0 ** rng.uniform(-2.5, 7.5, n)),
])
def test_quantiles_within_one_percent_of_numpy(name: str, draw) -> None:
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    bins = LogBins(ALPHA)
    for n in (1, 2, 7, 100, 50_000):
        values = draw(rng, n)
        errors = relative_errors(bins, values, [*QS, 0.0, 1.0])
        assert errors.max() <= TOLERANCE, (name, n, errors)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(min_value=2e-3, max_value=1e8, allow_nan=False), min_size=1, max_size=300),
       q=st.floats(min_value=0.0, max_value=1.0))
def test_any_quantile_of_any_data_in_range(values: list[float], q: float) -> None:
    assert relative_errors(log_bins(ALPHA), np.array(values), [q]).max() <= TOLERANCE


def test_coarser_accuracy_has_its_own_bound_and_fewer_bins() -> None:
    fine, coarse = LogBins(0.01), LogBins(0.05)
    values = np.random.default_rng(1).lognormal(4.0, 2.0, 20_000)
    assert relative_errors(coarse, values, QS).max() <= 0.05 * (1 + 1e-9)
    assert relative_errors(coarse, values, QS).max() > 0.01  # it really is coarser
    assert coarse.n_slots < fine.n_slots / 4


def test_index_value_round_trip_and_gamma() -> None:
    bins = LogBins(ALPHA)
    assert bins.gamma == pytest.approx(1.01 / 0.99)
    x = 10.0 ** np.random.default_rng(2).uniform(-2.9, 7.9, 10_000)
    back = bins.value(bins.index(x))
    assert np.max(np.abs(back - x) / x) <= TOLERANCE
    assert np.all(np.diff(bins.index(np.sort(x))) >= 0)  # slots are monotone in the value


def test_zero_bin_and_clamping() -> None:
    bins = LogBins(ALPHA, min_value=1e-3, max_value=1e8)
    assert bins.index(np.array([0.0, 1e-9, 1e-3])).tolist() == [0, 0, 0]
    assert bins.index(np.array([1.001e-3]))[0] >= 1
    assert bins.value(0) == 0.0
    top = bins.n_slots - 1
    assert bins.index(np.array([1e8, 1e12, np.inf])).tolist() == [top, top, top]
    assert bins.value(top) == pytest.approx(1e8, rel=ALPHA)
    zeros = bins.sparse_counts(np.zeros(10))
    assert bins.quantile(zeros[1], 0.99, slots=zeros[0]) == 0.0


def test_empty_sketch_has_no_quantile_and_bad_q_is_refused() -> None:
    bins = LogBins(ALPHA)
    assert bins.quantile(np.zeros(5, dtype=np.int32), 0.5) is None
    assert bins.quantile(np.zeros(0, dtype=np.int32), [0.5, 0.9]) is None
    one = bins.sparse_counts(np.array([3.0]))
    with pytest.raises(ValueError):
        bins.quantile(one[1], 1.5, slots=one[0])


def test_dense_and_sparse_quantiles_agree() -> None:
    bins = LogBins(ALPHA)
    values = np.random.default_rng(3).lognormal(5.0, 1.0, 5000)
    sparse = bins.sparse_counts(values)
    dense = np.bincount(sparse[0], weights=sparse[1], minlength=bins.n_slots).astype(np.int64)
    assert bins.quantile(dense, QS) == bins.quantile(sparse[1], QS, slots=sparse[0])


def test_merging_is_addition_of_counts() -> None:
    bins = LogBins(ALPHA)
    rng = np.random.default_rng(4)
    parts = [rng.lognormal(m, 1.0, 1000) for m in (3.0, 5.0, 7.0)]
    merged = add_sparse([bins.sparse_counts(p) for p in parts])
    assert np.array_equal(merged, bins.sparse_counts(np.concatenate(parts)))
    assert add_sparse([]).shape == (2, 0)


def test_sketch_total_adds_subtracts_and_trims() -> None:
    bins = LogBins(ALPHA)
    a = bins.sparse_counts(np.array([1.0, 1.0, 1000.0]))
    b = bins.sparse_counts(np.array([10.0, 20.0]))
    total = SketchTotal()
    total.add(a)
    total.add(b)
    assert total.count == 5
    assert np.array_equal(total.sparse(), add_sparse([a, b]))
    total.subtract(a)
    assert np.array_equal(total.sparse(), b)
    assert total.counts.size == b[0, -1] - b[0, 0] + 1  # trimmed to the touched range only
    total.subtract(b)
    assert total.count == 0 and total.counts.size == 0 and total.sparse().shape == (2, 0)
    with pytest.raises(ValueError):
        total.subtract(a)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 40), width=st.integers(1, 60),
       density=st.sampled_from([0.0, 0.05, 0.5, 1.0]))
def test_row_quantiles_equal_the_per_sketch_quantiles(seed: int, rows: int, width: int, density: float) -> None:
    """The vectorised per-row quantiles are bit-identical to quantile() on each row (NaN when empty)."""
    rng = np.random.default_rng(seed)
    bins = log_bins(ALPHA)
    offset = int(rng.integers(0, bins.n_slots - width))
    counts = (rng.random((rows, width)) < density) * rng.integers(1, 1000, (rows, width))
    counts = counts.astype(np.int32)
    qs = [0.0, 0.5, 0.95, 0.99, 1.0]
    got = bins.row_quantiles(counts, offset, qs)
    for r in range(rows):
        want = bins.quantile(counts[r], qs, slots=np.arange(offset, offset + width))
        if want is None:
            assert np.isnan(got[r]).all()
        else:
            assert got[r].tolist() == want
    assert bins.row_quantiles(np.zeros((3, 0), np.int32), 0, qs).shape == (3, len(qs))


def test_row_quantiles_with_counts_past_32_bit_cumulative_sums() -> None:
    """Rows whose shifted cumulative counts do not fit 32-bit integers (the 64-bit path) give the same
    answers as quantile() on each row."""
    bins = log_bins(ALPHA)
    counts = np.zeros((3, 8), np.int32)
    counts[0, [1, 6]] = 2**30, 5
    counts[1, 3] = 2**30
    counts[2, [0, 7]] = 7, 2**29
    qs = [0.0, 0.5, 0.99, 1.0]
    got = bins.row_quantiles(counts, 40, qs)
    for r in range(3):
        assert got[r].tolist() == bins.quantile(counts[r], qs, slots=np.arange(40, 48))
