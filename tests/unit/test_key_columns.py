"""KeyColumns: per-key records as columns behave as a dict of per-key dicts would."""

from __future__ import annotations

import random

import numpy as np

from skewwatch.pipeline.detectors.key_columns import KeyColumns


def test_random_operations_match_a_dict_of_dicts() -> None:
    """Puts, prunes, forgets and re-added keys (rows reused, arrays grown) against a reference."""
    rng = random.Random(7)
    cols = KeyColumns(width=2)
    reference: dict[str, dict[int, list[float]]] = {}
    keys = [f"m/r{i}" for i in range(40)]
    for _ in range(2000):
        op = rng.random()
        chosen = rng.sample(keys, rng.randint(1, 12))
        slot = rng.choice([0, 5000, 10000, 15000, 20000])
        if op < 0.5:
            values = np.array([[float(rng.randint(1, 9)), rng.random()] for _ in chosen])
            cols.put(cols.rows(chosen), slot, values)
            for key, value in zip(chosen, values.tolist(), strict=True):
                reference.setdefault(key, {})[slot] = value
        elif op < 0.7:
            cols.drop_before(cols.rows(chosen), slot)
            for key in chosen:
                reference[key] = {s: v for s, v in reference.get(key, {}).items() if s >= slot}
        elif op < 0.8:
            for key in chosen[:2]:
                cols.forget(key)
                reference.pop(key, None)
        key = rng.choice(keys)
        assert cols.get(cols.row(key), slot) == reference.get(key, {}).get(slot)
    for key in keys:
        assert cols.records(key) == dict(sorted(reference.get(key, {}).items()))
    assert set(cols.held_keys()) == {key for key, records in reference.items() if records}


def test_rows_are_stable_and_a_forgotten_key_leaves_nothing_behind() -> None:
    cols = KeyColumns(width=1)
    first = cols.rows(["a", "b", "c"]).tolist()
    assert cols.rows(["a", "b", "c"]).tolist() == first  # the same step's rows, step after step
    cols.put(cols.rows(["b"]), 7, np.array([[3.0]]))
    cols.forget("b")
    assert cols.row("b") is None and cols.records("b") == {}
    reused = cols.add("d")  # takes b's row, without b's record
    assert reused == first[1] and cols.get(reused, 7) is None
    cols.drop_before(cols.rows(["a", "c", "d"]), 10)
    assert list(cols.held_keys()) == []
