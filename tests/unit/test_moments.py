"""Welford/Chan moments: merging chunks equals the direct (numpy) variance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from river import stats as river_stats

from skewwatch.pipeline import moments

DATASETS = {
    "normal": lambda rng: rng.normal(100.0, 15.0, 10_000),
    "pareto": lambda rng: 1.0 + rng.pareto(1.5, 10_000) * 1000.0,  # heavy tail, huge variance
    "large-offset": lambda rng: 1e9 + rng.normal(0.0, 1.0, 10_000),  # naive E[x^2]-E[x]^2 fails here
    "integers": lambda rng: rng.integers(0, 4096, 10_000).astype(float),
}


def split(values: np.ndarray, rng: np.random.Generator, parts: int) -> list[np.ndarray]:
    cuts = np.sort(rng.choice(np.arange(1, values.size), parts - 1, replace=False))
    return np.split(values, cuts)


@pytest.mark.parametrize("name", DATASETS)
def test_chunked_merge_equals_direct_variance(name: str) -> None:
    rng = np.random.default_rng(7)
    x = DATASETS[name](rng)
    chunks = split(x, rng, 37)
    pairwise = moments.empty()
    for chunk in chunks:
        pairwise = moments.merge(pairwise, moments.of(chunk))
    stacked = moments.Moments(*(np.array([getattr(moments.of(c), f) for c in chunks])
                                for f in ("count", "mean", "m2")))
    many = moments.merge_many(stacked)
    for m in (pairwise, many):
        assert float(m.count) == x.size
        assert float(m.mean) == pytest.approx(np.mean(x), rel=1e-12)
        assert float(moments.variance(m)) == pytest.approx(np.var(x), rel=1e-8)  # float64 limit at 1e9


def test_naive_formula_really_fails_on_the_offset_data() -> None:
    """Guard that the large-offset case is a real test: the textbook shortcut loses it."""
    x = DATASETS["large-offset"](np.random.default_rng(7))
    naive = np.mean(x * x) - np.mean(x) ** 2
    assert abs(naive - np.var(x)) / np.var(x) > 0.1


def test_grouped_equals_per_group_and_columns() -> None:
    rng = np.random.default_rng(8)
    x = np.column_stack([rng.normal(0, 1, 500), rng.lognormal(3, 1, 500)])
    groups = rng.integers(0, 4, 500)
    g = moments.grouped(x, groups, 5)  # group 4 is empty
    for k in range(4):
        direct = moments.of(x[groups == k])
        assert np.allclose(g.count[k], direct.count)
        assert np.allclose(g.mean[k], direct.mean)
        assert np.allclose(g.m2[k], direct.m2)
    assert np.all(g.count[4] == 0) and np.all(g.m2[4] == 0)
    one_column = moments.grouped(x[:, 1], groups, 5)
    assert np.allclose(one_column.m2, g.m2[:, 1])


def test_empty_parts_are_neutral_and_empty_variance_is_unknown() -> None:
    x = moments.of(np.array([1.0, 2.0, 4.0]))
    for m in (moments.merge(moments.empty(), x), moments.merge(x, moments.empty())):
        assert (float(m.count), float(m.mean), float(m.m2)) == (float(x.count), float(x.mean), float(x.m2))
    assert np.isnan(moments.variance(moments.empty()))
    assert np.isnan(moments.variance(moments.of(np.array([]))))
    assert float(moments.merge_many(moments.empty((3,))).count) == 0


def test_agrees_with_river_var() -> None:
    x = np.random.default_rng(9).lognormal(2.0, 1.0, 2000)
    river_var = river_stats.Var(ddof=0)
    for v in x:
        river_var.update(float(v))
    assert float(moments.variance(moments.of(x))) == pytest.approx(river_var.get(), rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=2, max_size=200),
       cut=st.integers(min_value=1, max_value=199), offset=st.sampled_from([0.0, 1e6, 1e9]))
def test_two_way_merge_property(values: list[float], cut: int, offset: float) -> None:
    x = np.array(values) + offset
    cut = min(cut, x.size - 1)
    m = moments.merge(moments.of(x[:cut]), moments.of(x[cut:]))
    assert float(m.count) == x.size
    assert float(moments.variance(m)) == pytest.approx(np.var(x), rel=1e-6, abs=1e-6)
