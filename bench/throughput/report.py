"""Turning runs into the throughput table: medians, spread, ratios to the ceiling, the targets.

The targets are ratios *from the same run*, so every ratio here divides two medians
measured by the same invocation; the per-round ratios (contender run *i* over ceiling run *i*,
measured back to back) give the ratio's own spread on a shared, noisy machine.

>>> runs = [{"case": "ceiling", "round": r, "events": 100, "seconds": 1.0, "cpu_s": 0.5,
...          "peak_rss_bytes": 2**20} for r in range(3)]
>>> runs += [{"case": "ours-batch", "round": r, "events": 90, "seconds": 1.0, "cpu_s": 0.9,
...           "peak_rss_bytes": 2**21} for r in range(3)]
>>> s = summarise(runs)
>>> s["ours-batch"]["events_per_s"]["median"], s["ours-batch"]["ratio_to_ceiling"]
(90.0, 0.9)
>>> [(t["name"], t["met"]) for t in targets(s)]
[('ours-batch >= 0.8 x ceiling', True)]
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.throughput.common import spread

CEILING = "ceiling"

# What each case is, for the table and the JSON.
CASES: dict[str, str] = {
    "ceiling": "aiokafka getmany + JSON decode per message, nothing else (single-event topic)",
    "ceiling-batch": "the same on the batched topic (100 events per message)",
    "quix": "Quix Streams StreamingDataFrame, JSON deserializer (orjson), stateless count",
    "faust-decode": "Faust agent `async for value in stream` + orjson decode only (Faust's per-event cost)",
    "faust-window": "Faust agent `async for` + decode + PartitionWindows.apply(1-row columns) + close_steps",
    "ours": "skewwatch worker end to end, single-event messages",
    "ours-batch": "skewwatch worker end to end, batched messages (100 events per message)",
    "ours-batch-ckpt": "ours-batch with a checkpoint at every step close (limits.checkpoint_interval_s = 0)",
}

# (name, case, reference case, minimum ratio): the throughput targets (bench/README.md).
TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("ours-batch >= 0.8 x ceiling", "ours-batch", "ceiling", 0.8),
    ("ours >= 1.0 x quix", "ours", "quix", 1.0),
    ("ours >= 10 x faust-window", "ours", "faust-window", 10.0),
)


def _rate(run: dict[str, Any]) -> float:
    return float(run["events"]) / float(run["seconds"])


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: events/s, CPU µs per event, peak RSS MiB (median/min/max/spread), ratio to the ceiling."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if "error" not in run:
            by_case.setdefault(run["case"], []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for case, case_runs in by_case.items():
        rates = [_rate(r) for r in case_runs]
        cpu_us = [1e6 * float(r["cpu_s"]) / float(r["events"]) for r in case_runs]
        rss = [r["peak_rss_bytes"] / 2**20 for r in case_runs if r.get("peak_rss_bytes")]
        entry: dict[str, Any] = {
            "runs": len(case_runs),
            "events_per_run": statistics.median(int(r["events"]) for r in case_runs),
            "events_per_s": spread(rates),
            "cpu_us_per_event": spread(cpu_us),
            "peak_rss_mib": spread(rss) if rss else None,
        }
        ingest = [float(r["ingest_events_per_s"]) for r in case_runs if "ingest_events_per_s" in r]
        if ingest:
            entry["ingest_events_per_s"] = spread(ingest)
        out[case] = entry
    for case, entry in out.items():
        for ref in (CEILING, "ceiling-batch"):
            if ref in out:
                entry[f"ratio_to_{ref.replace('-', '_')}"] = round(
                    entry["events_per_s"]["median"] / out[ref]["events_per_s"]["median"], 3)
        paired = _paired_ratios(by_case.get(case, []), by_case.get(CEILING, []))
        if paired:
            entry["ratio_to_ceiling_per_round"] = {"min": round(min(paired), 3), "max": round(max(paired), 3)}
    return out


def _paired_ratios(case_runs: list[dict[str, Any]], ceiling_runs: list[dict[str, Any]]) -> list[float]:
    ceiling_by_round = {r["round"]: _rate(r) for r in ceiling_runs}
    return [_rate(r) / ceiling_by_round[r["round"]] for r in case_runs if r["round"] in ceiling_by_round]


def targets(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The throughput targets that this run can judge (both cases measured)."""
    out = []
    for name, case, ref, minimum in TARGETS:
        if case in summary and ref in summary:
            ratio = summary[case]["events_per_s"]["median"] / summary[ref]["events_per_s"]["median"]
            out.append({"name": name, "ratio": round(ratio, 3), "target": minimum, "met": ratio >= minimum})
    return out


def _fmt_rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def table(summary: dict[str, dict[str, Any]], markdown: bool = False) -> str:
    """The results table (plain text, or GitHub markdown for the README)."""
    header = ["case", "runs", "events/run", "events/s median", "min..max", "spread", "x ceiling",
              "CPU µs/event", "peak RSS MiB"]
    rows = []
    for case in [c for c in CASES if c in summary] + [c for c in summary if c not in CASES]:
        s = summary[case]
        rate = s["events_per_s"]
        rss = s["peak_rss_mib"]
        rows.append([
            case, str(s["runs"]), f"{s['events_per_run']:,.0f}", _fmt_rate(rate["median"]),
            f"{_fmt_rate(rate['min'])}..{_fmt_rate(rate['max'])}", f"{rate['spread']:.0%}",
            f"{s['ratio_to_ceiling']:.2f}" if "ratio_to_ceiling" in s else "-",
            f"{s['cpu_us_per_event']['median']:.1f}", f"{rss['median']:.0f}" if rss else "-",
        ])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*header)] + [fmt.format(*r) for r in rows])


def targets_table(results: list[dict[str, Any]]) -> str:
    return "\n".join(f"{'MET   ' if t['met'] else 'MISSED'}  {t['name']}: {t['ratio']:.2f} (target {t['target']:g})"
                     for t in results)
