"""The detectors the NAB benchmark runs: NAB's windowed Gaussian (the scoring's check), river's
anomaly and drift detectors as they come, and ours (``make_scorer``) with its layers taken apart.
Each maps a file's values to one anomaly score per row in [0, 1], seeing the rows one at a time and in
order (score, then learn), as NAB runs them.

>>> values = np.array([10.0, 10.5, 9.5, 10.0, 10.2, 50.0])
>>> [round(float(s), 3) for s in windowed_gaussian(values)]
[0.0, 1.0, 0.999, 0.5, 0.714, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.novelty import NoveltyBank, NoveltyParams, make_scorer

Series = npt.NDArray[np.float64]

# NAB's windowedGaussian: a Gaussian over the last 6400 values, moved every 100 values
GAUSSIAN_WINDOW = 6400
GAUSSIAN_STEP = 100


def windowed_gaussian(values: Series, window: int = GAUSSIAN_WINDOW, step: int = GAUSSIAN_STEP) -> Series:
    """NAB's ``windowedGaussian`` detector: ``1 - Q(|x - mean| / std)`` of each value against the mean and
    (population) standard deviation of the window before it; the window grows to ``window`` values, then
    slides by ``step`` values at a time; 0 for the first value; a zero deviation counts as 1e-6."""
    n = len(values)
    scores = np.zeros(n)
    data: list[float] = []
    pending: list[float] = []
    # while the window grows its mean/std move with every value: Welford's update, one value at a time
    count, mean, m2 = 0, 0.0, 0.0
    std = 1.0
    for i, x in enumerate(values.tolist()):
        if data:
            z = abs(x - mean) / std
            scores[i] = 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0))
        if len(data) < window:
            data.append(x)
            count += 1
            d = x - mean
            mean += d / count
            m2 += d * (x - mean)
            std = math.sqrt(m2 / count) or 1e-6
        else:
            pending.append(x)
            if len(pending) == step:
                data = data[step:] + pending
                pending = []
                arr = np.asarray(data)
                mean = float(arr.mean())
                std = float(arr.std()) or 1e-6
    return scores


def river_halfspace_trees(values: Series, seed: int = 42) -> Series:
    """river's HalfSpaceTrees behind a MinMaxScaler, river's defaults otherwise: the "out of the box"
    row of the table (learn after score, as NAB's river detector does)."""
    from river import anomaly, preprocessing

    model = preprocessing.MinMaxScaler() | anomaly.HalfSpaceTrees(seed=seed)
    scores = np.empty(len(values))
    for i, v in enumerate(values.tolist()):
        x = {"value": v}
        scores[i] = model.score_one(x)
        model.learn_one(x)
    return scores


def run_scorer(values: Series, make: Callable[..., Any], params: Mapping[str, Any] | None = None) -> Series:
    """Any river-style scorer (``score_one`` then ``learn_one`` per value, ``x = {"value": v}``)."""
    scorer = make(**dict(params or {}))
    scores = np.empty(len(values))
    for i, v in enumerate(values.tolist()):
        x = {"value": v}
        scores[i] = scorer.score_one(x)
        scorer.learn_one(x)
    return scores


def bank_scores(series: Sequence[Series], params: Mapping[str, Any] | None = None, *,
                novelty: bool = False) -> list[Series]:
    """Each series scored as ``run_scorer(values, make_scorer, params)`` scores it (score, then learn,
    one value at a time, in order), all of them in one pass: each series is a row of one
    :class:`NoveltyBank`, the bank :class:`NoveltyScorer` itself runs with one row, stepped a value of
    every series at a time. The same arithmetic, so the same scores; numpy's fixed cost per call is
    paid once per step for all the series, not once per value of each (a one-row scorer is mostly that
    cost). ``novelty``: the range novelty ``e / (1 + e)`` instead (``novelty_only``'s scores).

    >>> a, b = np.array([1.0, 2.0, 1.0, 9.0]), np.array([5.0, 5.0])
    >>> params = {"warmup": 1, "grace": 1, "short": 1}
    >>> together = bank_scores([a, b], params)
    >>> all((s == run_scorer(v, make_scorer, params)).all() for s, v in zip(together, (a, b)))
    True
    """
    bank = NoveltyBank(["value"], NoveltyParams(**dict(params or {})))
    # longest first: the series still running at a step are then the bank's first rows, which it reads
    # and writes as views (a slice) rather than as gathered copies
    order = sorted(range(len(series)), key=lambda i: -len(series[i]))
    lengths = [len(series[i]) for i in order]
    longest = lengths[0] if lengths else 0
    values = np.full((len(order), longest), np.nan)
    for row, i in enumerate(order):
        values[row, :lengths[row]] = series[i]
    scores = np.zeros_like(values)
    rows = bank.add_rows(len(order))
    running = len(order)
    for t in range(longest):
        while lengths[running - 1] <= t:
            running -= 1
        batch = bank.evaluate(rows[:running], values[:running, t:t + 1])
        bank.commit(batch)
        scores[:running, t] = batch.raw if novelty else batch.score
    out: list[Series] = [np.empty(0)] * len(order)
    for row, i in enumerate(order):
        out[i] = scores[row, :lengths[row]].copy()
    return out


def river_gaussian_scorer(values: Series, window: int = 1000) -> Series:
    """river's GaussianScorer over the last ``window`` values (a Gaussian tail, like NAB's own)."""
    from river import anomaly

    model = anomaly.GaussianScorer(window_size=window, grace_period=100)
    scores = np.empty(len(values))
    for i, v in enumerate(values.tolist()):
        scores[i] = model.score_one(None, v)
        model.learn_one(None, v)
    return scores


def river_one_class_svm(values: Series) -> Series:
    """river's OneClassSVM (nu = 0.2) behind a StandardScaler."""
    from river import anomaly, preprocessing

    return run_scorer(values, lambda: preprocessing.StandardScaler() | anomaly.OneClassSVM(nu=0.2))


def river_drift(values: Series, kind: str) -> Series:
    """A river drift detector with its defaults as a scorer: 1 where it signals a drift, else 0."""
    from river import drift

    detector = {"adwin": drift.ADWIN, "page_hinkley": drift.PageHinkley, "kswin": lambda: drift.KSWIN(seed=42)}[kind]()
    scores = np.zeros(len(values))
    for i, v in enumerate(values.tolist()):
        detector.update(v)
        if detector.drift_detected:
            scores[i] = 1.0
    return scores


def novelty_only(values: Series) -> Series:
    """Our first layer alone: the range novelty ``e / (1 + e)``, no likelihood, no onsets."""
    scorer = make_scorer()
    scores = np.empty(len(values))
    for i, v in enumerate(values.tolist()):
        x = {"value": v}
        e = scorer.novelty_one(x).get("value", 0.0)
        scores[i] = e / (1.0 + e)
        scorer.learn_one(x)
    return scores


@dataclass(frozen=True)
class Entry:
    """A detector of the table: how to score one file, and what it is."""

    run: Callable[[Series], Series]
    what: str
    # every file at once, where the detector scores many series faster together (the same scores)
    run_all: Callable[[Sequence[Series]], list[Series]] | None = None

    def score_files(self, series: Sequence[Series]) -> list[Series]:
        """One score per row of each series."""
        return self.run_all(series) if self.run_all is not None else [self.run(v) for v in series]


DETECTORS: dict[str, Entry] = {
    "ours": Entry(lambda v: run_scorer(v, make_scorer), "make_scorer(): range novelty -> likelihood -> onsets",
                  bank_scores),
    "ours-level": Entry(lambda v: run_scorer(v, make_scorer, {"onset": False}),
                        "make_scorer(onset=False): the likelihood as a level, no onsets",
                        lambda s: bank_scores(s, {"onset": False})),
    "ours-novelty": Entry(novelty_only, "the range novelty alone (no likelihood, no onsets)",
                          lambda s: bank_scores(s, novelty=True)),
    "windowed-gaussian": Entry(windowed_gaussian, "NAB's windowedGaussian re-implemented (the scoring's check)"),
    "river-hst": Entry(river_halfspace_trees, "river MinMaxScaler | HalfSpaceTrees, defaults"),
    "river-gaussian": Entry(river_gaussian_scorer, "river GaussianScorer(window_size=1000)"),
    "river-ocsvm": Entry(river_one_class_svm, "river StandardScaler | OneClassSVM(nu=0.2)"),
    "river-adwin": Entry(lambda v: river_drift(v, "adwin"), "river ADWIN: 1 at a drift"),
    "river-page-hinkley": Entry(lambda v: river_drift(v, "page_hinkley"), "river PageHinkley: 1 at a drift"),
    "river-kswin": Entry(lambda v: river_drift(v, "kswin"), "river KSWIN: 1 at a drift"),
}
