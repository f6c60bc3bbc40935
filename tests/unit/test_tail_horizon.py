"""The horizon's running sums against a recount of every step it holds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from skewwatch.pipeline.detectors.tail_horizon import TailHorizon


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_running_sums_equal_a_recount_with_skipped_steps_clears_and_forgotten_replicas(seed: int) -> None:
    rng = random.Random(seed)
    horizon = TailHorizon(span_s=50.0)  # 10 steps of 5 s
    keys = [f"r{i}" for i in range(6)]
    records: list[tuple[int, str, float, float]] = []  # (step, key, requests, slowest)
    for step in range(1, 120):
        present = [k for k in keys if rng.random() < 0.8]  # replicas skip steps
        if rng.random() < 0.03:
            gone = rng.choice(keys)
            horizon.forget(gone)
            records = [r for r in records if r[1] != gone]
        if rng.random() < 0.05 and step > 1:
            cleared = rng.choice(keys)
            horizon.clear(cleared)
            records = [r for r in records if r[1] != cleared]
        count = np.array([float(rng.choice([0, 0, 1, 1, 2])) for _ in present])
        slowest = np.array([rng.lognormvariate(3.0, 0.5) * (8.0 if rng.random() < 0.05 else 1.0) if c else np.nan
                            for c in count])
        judged = horizon.update(5.0 * step, present, count, slowest, ratio=2.0)
        if step == 1:  # the step's length is not known yet: nothing recorded, nothing judged
            assert judged.hits.sum() == 0 and judged.requests.sum() == 0
            continue
        records = [r for r in records if not (r[0] == step and r[1] in present)]
        records += [(step, k, float(c), 0.0 if np.isnan(v) else float(v))
                    for k, c, v in zip(present, count, slowest, strict=True)]
        held = [r for r in records if r[0] > step - 10]
        for i, key in enumerate(present):
            own = [r for r in held if r[1] == key]
            others = [r for r in held if r[1] != key and r[1] in present]
            assert judged.requests[i] == sum(r[2] for r in own)
            assert judged.peer_requests[i] == sum(r[2] for r in held if r[1] in present) - judged.requests[i]
            top = max((r[3] for r in others), default=0.0)
            if top > 0:
                assert judged.level[i] == pytest.approx(2.0 * top)
                assert judged.hits[i] == sum(r[3] > 2.0 * top for r in own)
            else:
                assert np.isnan(judged.level[i]) and judged.hits[i] == 0
