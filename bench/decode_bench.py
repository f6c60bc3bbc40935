"""Decode throughput of ``llm.requests`` messages on one core (the worker's hot path), optionally
side by side with the decoder of an earlier git revision.

Seed rule measured: the hot path must not pay a per-event Python cost (DESIGN.md numbers: a plain
aiokafka loop with ``json.loads`` reaches ~180k events/s on this class of machine). Cases:

- ``single``: one event per message, decoded one message at a time (decode_request_message);
- ``single_poll``: the same messages decoded a poll of 500 at a time (decode_request_messages), as
  the worker does;
- ``single_poll_5000``: a poll of 5,000 single-event messages (a catch-up poll of one partition);
- ``single_poll_1_bad``: the poll of 500 with one invalid message in the middle (its dead letter);
- ``batch100``: 100-event messages (the producer helper's batch form), one message at a time;
- ``batch100_poll``: the same messages a poll of 50 at a time (5,000 events), as the worker does;
- ``batch100_poll_sparse``: as batch100_poll with only the required fields (no batch size, no
  optional field: events converted from OTLP spans, contract v1.1);
- ``batch100_10pct_bad``: as batch100 with 10 % of the events invalid (reasons worded per bad row);
- ``reference_batch100``: batch100 through the general (reference) path, ``typed_fast_path=False``;
- ``orjson_only``: orjson.loads of the batch100 messages alone, the floor for any JSON decoder.

Rates are events per CPU-second of the decoding process (one core), best of 5 rounds (``--rounds``); with
``--baseline REV`` the decoder (``skewwatch/schemas/requests.py``) of that git revision runs every
case too, its rounds interleaved with the current decoder's so that load on a shared machine hits
both alike. The baseline module is loaded from ``git show REV:...`` and runs against the current
tree's other modules. Run::

    .venv/bin/python bench/decode_bench.py [--seconds 2] [--rounds 5] [--baseline ff883c9]

It prints a table and writes ``bench/results/decode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from skewwatch.config import LimitSettings
from skewwatch.schemas import requests as current_requests
from skewwatch.schemas.requests import REQUIRED_FIELDS, encode_request_event, encode_request_events

RESULTS = Path(__file__).resolve().parent / "results" / "decode.json"
REPO = Path(__file__).resolve().parent.parent
DECODER_PATH = "skewwatch/schemas/requests.py"
ROUNDS = 5


def make_event(rng: random.Random, i: int) -> dict[str, Any]:
    event: dict[str, Any] = {
        "request_id": f"req-{i:08d}",
        "ts": 1.7e9 + i * 0.001,
        "model": "llama-3-8b",
        "replica": f"replica-{i % 8}",
        "latency_ms": rng.lognormvariate(5.5, 0.6),
        "prompt_tokens": rng.randint(10, 4000),
        "completion_tokens": rng.randint(1, 800),
        "batch_size": rng.randint(1, 32),
        "batch_capacity": 32,
        "ttft_ms": rng.lognormvariate(4.0, 0.5),
        "queue_length": rng.randint(0, 20),
        "kv_cache_hit_rate": rng.random(),
        "status": "ok",
    }
    if i % 50 == 0:
        event["status"] = "error"
        event["cuda_error"] = "cudaErrorLaunchTimeout"
    return event


def spoil(event: dict[str, Any], i: int) -> dict[str, Any]:
    bad = dict(event)
    kind = i % 4
    if kind == 0:
        bad["latency_ms"] = -3
    elif kind == 1:
        bad["batch_size"] = 40
    elif kind == 2:
        bad["prompt_tokens"] = "12"
    else:
        del bad["model"]
    return bad


def load_decoder_at(rev: str) -> types.ModuleType:
    """The request decoder module as it was at git revision ``rev``."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{DECODER_PATH}"], check=True,
                            capture_output=True).stdout
    module = types.ModuleType(f"decode_bench_baseline_{rev}")
    module.__file__ = f"{rev}:{DECODER_PATH}"
    sys.modules[module.__name__] = module  # dataclasses look their module up while decorating
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # our own file, as it was
    return module


def measure_side_by_side(runs: dict[str, Callable[[], int]], seconds: float, rounds: int = ROUNDS) -> dict[str, float]:
    """Events per CPU-second of each ``run`` (which returns the events it handled), best of
    ``rounds`` rounds, the runs' rounds interleaved.

    CPU time of this process, not wall time: "events/s on one core" is what the worker budget
    needs, and it stays meaningful on a shared machine where other processes steal the core.
    """
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for name, run in runs.items():
            events = 0
            start = time.process_time()
            deadline = start + seconds / rounds
            while time.process_time() < deadline:
                events += run()
            best[name] = max(best[name], events / (time.process_time() - start))
    return best


def cases_for(decoder: types.ModuleType, limits: LimitSettings, singles: list[bytes], singles_5000: list[bytes],
              batches: list[bytes], spoilt: list[bytes], sparse: list[bytes]) -> dict[str, Callable[[], int]]:
    """Each case as a callable returning the events it decoded, for one decoder module."""
    decode_one, decode_poll = decoder.decode_request_message, decoder.decode_request_messages
    one_bad = list(singles)
    one_bad[len(one_bad) // 2] = encode_request_event(spoil(orjson.loads(one_bad[len(one_bad) // 2]), 0))

    # sanity: the benchmark measures real decoding, not rejections
    assert len(decode_poll(singles, limits).columns) == len(singles)
    assert len(decode_poll(singles_5000, limits).columns) == len(singles_5000)
    assert len(decode_poll(one_bad, limits).columns) == len(one_bad) - 1
    assert all(len(decode_one(b, limits).columns) == 100 for b in batches)
    assert len(decode_poll(batches, limits).columns) == 100 * len(batches)
    assert len(decode_poll(sparse, limits).columns) == 100 * len(sparse)
    assert all(len(decode_one(b, limits).rejects) == 10 for b in spoilt)

    def one_at_a_time(values: list[bytes], per_message: int) -> Callable[[], int]:
        def run() -> int:
            for value in values:
                decode_one(value, limits)
            return per_message * len(values)
        return run

    def as_one_poll(values: list[bytes], per_message: int, **options: Any) -> Callable[[], int]:
        def run() -> int:
            decode_poll(values, limits, **options)
            return per_message * len(values)
        return run

    return {
        "single": one_at_a_time(singles, 1),
        "single_poll": as_one_poll(singles, 1),
        "single_poll_5000": as_one_poll(singles_5000, 1),
        "single_poll_1_bad": as_one_poll(one_bad, 1),
        "batch100": one_at_a_time(batches, 100),
        "batch100_poll": as_one_poll(batches, 100),
        "batch100_poll_sparse": as_one_poll(sparse, 100),
        "batch100_10pct_bad": one_at_a_time(spoilt, 100),
        "reference_batch100": lambda: sum(len(decode_poll([b], limits, typed_fast_path=False).columns)
                                          for b in batches),
    }


def run_orjson(batches: list[bytes]) -> Callable[[], int]:
    def run() -> int:
        for value in batches:
            orjson.loads(value)
        return 100 * len(batches)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU time per case and decoder")
    parser.add_argument("--baseline", metavar="REV", help="also run the decoder of this git revision")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds per case (best kept): more rounds ride out a busy machine's bursts")
    args = parser.parse_args()
    rng = random.Random(7)
    limits = LimitSettings()
    events = [make_event(rng, i) for i in range(5000)]
    singles_5000 = [encode_request_event(e) for e in events]
    singles = singles_5000[:500]
    batches = [encode_request_events(events[i:i + 100]) for i in range(0, 5000, 100)]
    spoilt = [encode_request_events([spoil(e, i) if i % 10 == 0 else e for i, e in
                                     enumerate(events[j:j + 100], start=j)]) for j in range(0, 5000, 100)]
    sparse = [encode_request_events([{name: e[name] for name in REQUIRED_FIELDS} for e in events[i:i + 100]])
              for i in range(0, 5000, 100)]

    decoders = {"now": current_requests}
    if args.baseline:
        decoders = {"baseline": load_decoder_at(args.baseline), **decoders}
    cases = {label: cases_for(module, limits, singles, singles_5000, batches, spoilt, sparse)
             for label, module in decoders.items()}
    names = [*cases["now"], "orjson_only"]
    results: dict[str, dict[str, int]] = {}
    for name in names:
        runs = ({label: run_orjson(batches) for label in ("now",)} if name == "orjson_only"
                else {label: case[name] for label, case in cases.items()})
        measured = measure_side_by_side(runs, args.seconds, args.rounds)
        results[name] = {label: round(rate) for label, rate in measured.items()}

    width = max(map(len, names))
    header = f"{'case':<{width}}  " + "  ".join(f"{label:>12}" for label in decoders)
    if args.baseline:
        header += "  now/baseline"
    print(header + "   (events per CPU-second)")
    for name, rates in results.items():
        line = f"{name:<{width}}  " + "  ".join(f"{rates[label]:>12,}" if label in rates else f"{'':>12}"
                                                 for label in decoders)
        if args.baseline and "baseline" in rates:
            line += f"  {rates['now'] / rates['baseline']:>11.2f}x"
        print(line)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "events_per_cpu_s": {name: rates["now"] for name, rates in results.items()},
        "baseline": None if not args.baseline else {
            "revision": args.baseline,
            "events_per_cpu_s": {name: rates["baseline"] for name, rates in results.items() if "baseline" in rates},
        },
        "rounds": args.rounds,
        "seconds_per_case": args.seconds,
        "load_average_1m": round(os.getloadavg()[0], 2),  # > cores: other processes shared the machine
        "event_bytes_mean": round(sum(map(len, singles)) / len(singles)),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
