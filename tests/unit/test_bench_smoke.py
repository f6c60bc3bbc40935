"""The benchmark scripts import and run a toy case in seconds (bench/throughput, bench/scale).

Not a measurement: it keeps the harness from rotting between the (long) real runs.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.throughput import common, compare, contenders, dataset, profile, report  # noqa: E402
from skewwatch.kafka_client import run_blocking  # noqa: E402


def load_scale() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scale", REPO / "bench" / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scale"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("module", [common, contenders, dataset, profile, report], ids=lambda m: m.__name__)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


def test_throughput_compare_takes_checkouts_only(tmp_path: Path) -> None:
    """Each tree is NAME=PATH of a checkout; anything else stops before a broker is started."""
    for argv in (["base"], [f"base={tmp_path}"], [f"={REPO}"]):
        with pytest.raises(SystemExit):
            compare.main(argv)


def test_scale_step_cost_and_memory_toy() -> None:
    scale = load_scale()
    row = scale.measure_step_cost(40, models=4, rate=3.0, steps=1, warm=2)
    assert row["replicas"] == 40 and row["ms"]["total"] > 0 and row["us_per_replica"] > 0
    assert row["cpu_ms"]["n"] == 1 and row["cpu_ms"]["median"] > 0
    memory = scale.measure_memory(40, models=4, rate=3.0, warm=2)
    assert 0 < memory["window_bytes_per_replica"] < 64 * 1024
    # the 20 silent replicas' windows are gone after max(idle_release_s, length_s) = 90 s
    assert memory["window_keys_after_silence"] == 20 and memory["released_after_s"] <= 95
    judged = {t["name"]: t["met"] for t in scale.judge({"memory": memory})}
    assert judged["idle replicas' window state released"]


def test_scale_linearity_is_judged_on_the_marginal_cost() -> None:
    """A fixed per-model cost (an affine a + b n) is linear; a cost per replica that grows is not."""
    scale = load_scale()

    def rows(total: dict[int, float]) -> dict[str, list[dict[str, object]]]:
        return {"step_cost": [{"replicas": n, "ms": {"total": ms}, "us_per_replica": ms * 1e3 / n}
                              for n, ms in total.items()]}

    name = "step cost linear (marginal us per replica between sizes, max/min <= 1.5)"
    affine = {t["name"]: t["met"] for t in scale.judge(rows({1000: 15 + 25, 10_000: 15 + 250, 50_000: 15 + 1250}))}
    assert affine[name] is True
    quadratic = {t["name"]: t["met"] for t in scale.judge(rows({1000: 25, 10_000: 2500, 50_000: 62_500}))}
    assert quadratic[name] is False


def test_throughput_ceiling_on_a_tiny_dataset(kafka_bootstrap: str, tmp_path: Path) -> None:
    data = run_blocking(dataset.produce_dataset(kafka_bootstrap, events=300, replicas_per_model=4, batch=10))
    assert data.events == 300 + data.sentinels and data.batched_messages < data.single_messages
    from bench.throughput.__main__ import run_child

    for batched in (False, True):
        spec = contenders.Spec(case="ceiling", bootstrap=kafka_bootstrap, topic=data.topic(batched),
                               partitions=data.partitions, events=data.events, batched=batched,
                               result=str(tmp_path / f"ceiling-{batched}.json"))
        out = run_child(spec, timeout_s=120)
        assert "error" not in out, out
        assert out["events"] == data.events and out["seconds"] > 0 and out["peak_rss_bytes"] > 0


def test_separability_sees_the_drift_per_prompt_token(tmp_path: Path) -> None:
    """bench/separability on one run, through its command line to its JSON: the drifted replica's TTFT
    per prompt token (by window and by request), and the replica with shorter outputs' time per
    output token, move further than any healthy replica's (statistics the learned detector judges);
    the numbers come from a seeded simulation, so this is the harness working, not a measurement."""
    module = importlib.import_module("bench.separability")  # by name: its worker processes import it too
    out = tmp_path / "separability.json"
    assert module.main(["--shape", "conv@0.1x", "--seeds", "1", "--out", str(out)]) == 0
    statistics = json.loads(out.read_text())["statistics"]
    assert set(statistics) == {name + suffix for name in module.STATISTICS for suffix in ("", module.BY_REQUEST)}
    for name in ("ttft_per_prompt_token (mean log)", "ttft_per_prompt_token (mean log)" + module.BY_REQUEST,
                 "tpot_p50 (window median time per output token after the first)"):  # throughput_drop's replica
        shape = statistics[name]["shapes"]["conv@0.1x"]
        [moved] = shape["drift"]
        assert shape["null_n"] >= 10 and moved > shape["null_max"] and shape["inside"] == 0
