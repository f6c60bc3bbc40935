"""bench/nab's held-out scores (a choice made without the fold it is scored on) and its labelled
synthetic streams (deterministic, labelled where the anomaly is, scored with NAB's code)."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.nab import heldout, synthetic  # noqa: E402
from bench.nab.corpus import NabFile, probation_rows  # noqa: E402
from bench.nab.detectors import bank_scores  # noqa: E402
from bench.nab.heldout import category_folds, file_folds, held_out, normalised  # noqa: E402
from bench.nab.scoring import best_threshold, nab_score, score_at  # noqa: E402
from bench.nab.synthetic import KINDS, anomaly_start, make_corpus, make_stream  # noqa: E402

STANDARD = {"tpWeight": 1.0, "fpWeight": 0.11, "fnWeight": 1.0, "tnWeight": 1.0}


@pytest.mark.parametrize("module", [heldout, synthetic], ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def toy(name: str, n: int = 200, windows: tuple[tuple[int, int], ...] = ((100, 119),)) -> NabFile:
    return NabFile(name, np.arange(n).astype("datetime64[s]"), np.zeros(n), windows)


def test_leave_one_category_out_scores_each_category_at_the_others_threshold() -> None:
    rng = np.random.default_rng(5)
    files = [toy("a/1.csv"), toy("a/2.csv"), toy("b/1.csv"), toy("b/2.csv", windows=((60, 79), (150, 169)))]
    scores = [np.round(rng.random(200), 2) for _ in files]
    for s, f in zip(scores, files, strict=True):
        s[f.windows[0][0] + 3] = 1.0
    folds = category_folds(files)
    assert folds == [[0, 1], [2, 3]]
    expected = 0.0
    for fit, hold in ((folds[1], folds[0]), (folds[0], folds[1])):
        threshold = best_threshold([files[i] for i in fit], [scores[i] for i in fit], STANDARD).threshold
        expected += score_at([files[i] for i in hold], [scores[i] for i in hold], STANDARD, threshold)[0]
    result = held_out(files, [scores], STANDARD, folds)
    assert result["score"] == round(normalised(files, expected, STANDARD), 2)
    # held out can never beat the in-sample optimum of the same scores
    assert result["score"] <= nab_score(files, scores, {"standard": STANDARD})["standard"]["score"] + 1e-9


def test_the_candidate_best_on_the_other_folds_is_chosen() -> None:
    files = [toy("a/1.csv"), toy("b/1.csv"), toy("c/1.csv")]
    good = [np.zeros(200) for _ in files]
    for s, f in zip(good, files, strict=True):
        s[f.windows[0][0]] = 1.0
    noisy = [np.full(200, 1.0) for _ in files]  # fires everywhere: worse on every fold
    result = held_out(files, [noisy, good], STANDARD, file_folds(files))
    assert [c["candidate"] for c in result["chosen"]] == [1, 1, 1]
    assert result["score"] == 100.0


def test_synthetic_streams_are_deterministic_and_differ_by_seed() -> None:
    for kind in KINDS:
        a, b = make_stream(kind, 1), make_stream(kind, 1)
        assert np.array_equal(a.values, b.values) and a.windows == b.windows
        assert not np.array_equal(a.values, make_stream(kind, 2).values)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "clean"])
def test_the_window_is_where_the_anomaly_is(kind: str) -> None:
    stream = make_stream(kind, 2)
    (first, last), = stream.windows
    start = anomaly_start(stream)
    n = len(stream.values)
    assert probation_rows(n) < first < start < last < n
    assert last - first + 1 == int(0.1 * n)
    # the same stream without the anomaly is the same up to `start` and differs from there (counts: a
    # draw at the higher rate can equal one at the lower, so within a few rows)
    plain = make_stream(kind, 2, magnitude=0.0)
    differs = np.flatnonzero(stream.values != plain.values)
    assert len(differs) > 0 and start <= differs[0] < start + 5


def test_a_clean_stream_has_no_window_and_a_level_shift_moves_the_level() -> None:
    assert make_stream("clean", 1).windows == ()
    stream = make_stream("level_shift", 4)
    start = anomaly_start(stream)
    before, after = stream.values[start - 300:start], stream.values[start:start + 300]
    assert abs(after.mean() - before.mean()) > 3.0 * before.std()


def test_our_scorer_finds_trivial_anomalies() -> None:
    """Level shifts of 12 sd and spikes of 36 sd: nearly perfect, no false positive."""
    files = make_corpus(kinds=("level_shift", "spike"), seeds=(1, 2, 3), magnitude=3.0)
    result = nab_score(files, bank_scores([f.values for f in files]), {"standard": STANDARD})["standard"]
    assert result["score"] >= 90.0
    assert result["counts"]["fp"] == 0
