"""Decode throughput of ``llm.requests`` messages on one core (the worker's hot path), optionally
side by side with the decoder of an earlier git revision.

Rule measured: the hot path must not pay a per-event Python cost (docs/design.md, "The hot path
reads batches": a plain aiokafka loop with ``json.loads`` reaches ~180k events/s on two cores). Cases:

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

Rates are events per CPU-second of the decoding process (one core), best of 5 rounds (``--rounds``).
Each decoder runs in a child process of its own, fed the same deterministic messages: the working
tree's, and with ``--baseline REV`` the package of that git revision (extracted whole, so the old
decoder runs with the modules of its own revision), the two children's rounds interleaved so that
load on a shared machine hits both alike. Only the package's public API is used
(``skewwatch.schemas.decode_request_message(s)``, ``encode_request_event(s)``,
``skewwatch.config.LimitSettings``), which every revision has. Run::

    .venv/bin/python bench/decode_bench.py [--seconds 2] [--rounds 5] [--baseline main]

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
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

RESULTS = Path(__file__).resolve().parent / "results" / "decode.json"
REPO = Path(__file__).resolve().parent.parent
ROUNDS = 5
# contract request-event.v1's required fields (the sparse case sends only these)
REQUIRED_FIELDS = ("request_id", "ts", "model", "replica", "latency_ms", "prompt_tokens", "completion_tokens")


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


def messages(decoder: types.ModuleType, n_events: int = 5000, n_singles: int = 500, seed: int = 7
             ) -> tuple[list[bytes], list[bytes], list[bytes], list[bytes], list[bytes]]:
    """The cases' messages, encoded by ``decoder``'s own encoders: singles (``n_singles``), singles
    (all), 100-event batches, batches with 10 % bad events, batches with only the required fields."""
    rng = random.Random(seed)
    events = [make_event(rng, i) for i in range(n_events)]
    singles_all = [decoder.encode_request_event(e) for e in events]
    batches = [decoder.encode_request_events(events[i:i + 100]) for i in range(0, n_events, 100)]
    spoilt = [decoder.encode_request_events([spoil(e, i) if i % 10 == 0 else e for i, e in
                                             enumerate(events[j:j + 100], start=j)]) for j in range(0, n_events, 100)]
    sparse = [decoder.encode_request_events([{name: e[name] for name in REQUIRED_FIELDS} for e in events[i:i + 100]])
              for i in range(0, n_events, 100)]
    return singles_all[:n_singles], singles_all, batches, spoilt, sparse


def timed(run: Callable[[], int], seconds: float) -> tuple[int, float]:
    """Call ``run`` (which returns the events it handled) for ``seconds`` of this process's CPU time:
    (events, CPU seconds). CPU time, not wall time: "events/s on one core" is what the worker budget
    needs, and it stays meaningful on a shared machine where other processes steal the core."""
    events = 0
    start = time.process_time()
    deadline = start + seconds
    while time.process_time() < deadline:
        events += run()
    return events, time.process_time() - start


def measure_side_by_side(runs: dict[str, Callable[[float], tuple[int, float]]], seconds: float,
                         rounds: int = ROUNDS) -> dict[str, float]:
    """Events per CPU-second of each ``run`` (one round: given its CPU seconds, returns events and
    CPU seconds spent), best of ``rounds`` rounds, the runs' rounds interleaved."""
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for name, run in runs.items():
            events, cpu = run(seconds / rounds)
            best[name] = max(best[name], events / cpu)
    return best


def cases_for(decoder: types.ModuleType, limits: Any, singles: list[bytes], singles_5000: list[bytes],
              batches: list[bytes], spoilt: list[bytes], sparse: list[bytes]) -> dict[str, Callable[[], int]]:
    """Each case as a callable returning the events it decoded, for one decoder module."""
    decode_one, decode_poll = decoder.decode_request_message, decoder.decode_request_messages
    one_bad = list(singles)
    one_bad[len(one_bad) // 2] = decoder.encode_request_event(spoil(orjson.loads(one_bad[len(one_bad) // 2]), 0))

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


def serve(stdin: IO[str], stdout: IO[str]) -> None:
    """A decoder child: build the messages with this process's ``skewwatch``, then answer each request
    line ``{"case", "seconds"}`` with ``{"events", "cpu_s"}`` (one round of that case)."""
    import skewwatch.schemas as decoder
    from skewwatch.config import LimitSettings

    singles, singles_5000, batches, spoilt, sparse = messages(decoder)
    cases = cases_for(decoder, LimitSettings(), singles, singles_5000, batches, spoilt, sparse)
    cases["orjson_only"] = run_orjson(batches)
    stdout.write(json.dumps({"ready": list(cases), "package": str(Path(decoder.__file__).parents[2]),
                             "event_bytes_mean": round(sum(map(len, singles)) / len(singles))}) + "\n")
    stdout.flush()
    for line in stdin:
        request = json.loads(line)
        events, cpu = timed(cases[request["case"]], float(request["seconds"]))
        stdout.write(json.dumps({"events": events, "cpu_s": cpu}) + "\n")
        stdout.flush()


class DecoderChild:
    """A ``serve`` child importing ``skewwatch`` from ``package`` (None: the working tree)."""

    def __init__(self, package: Path | None) -> None:
        from bench.revision import child_env

        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=child_env(package), cwd=tempfile.gettempdir())
        hello = self._read()
        self.cases: list[str] = hello["ready"]
        self.event_bytes_mean: int = hello["event_bytes_mean"]
        self.package = Path(hello["package"])
        expected = (package if package is not None else REPO).resolve()
        if self.package.resolve() != expected:  # the child must run the code it was given
            raise RuntimeError(f"decoder child imported skewwatch from {self.package}, not {expected}")

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"decoder child exited ({self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def round(self, case: str) -> Callable[[float], tuple[int, float]]:
        def run(seconds: float) -> tuple[int, float]:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"case": case, "seconds": seconds}) + "\n")
            self.process.stdin.flush()
            answer = self._read()
            return int(answer["events"]), float(answer["cpu_s"])
        return run

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU time per case and decoder")
    parser.add_argument("--baseline", metavar="REV", help="also run the decoder of this git revision")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds per case (best kept): more rounds ride out a busy machine's bursts")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(sys.stdin, sys.stdout)
        return
    if str(REPO) not in sys.path:  # `python bench/decode_bench.py` puts bench/ first, not the repo
        sys.path.insert(0, str(REPO))
    from bench.revision import baseline_package

    with tempfile.TemporaryDirectory(prefix="decode-bench-") as tmp:
        children: dict[str, DecoderChild] = {}
        try:
            if args.baseline:
                children["baseline"] = DecoderChild(baseline_package(args.baseline, Path(tmp)))
            children["now"] = DecoderChild(None)
            names = children["now"].cases
            event_bytes_mean = children["now"].event_bytes_mean
            results: dict[str, dict[str, int]] = {}
            for name in names:
                runs = {label: child.round(name) for label, child in children.items()
                        if name in child.cases and (name != "orjson_only" or label == "now")}
                measured = measure_side_by_side(runs, args.seconds, args.rounds)
                results[name] = {label: round(rate) for label, rate in measured.items()}
        finally:
            for child in children.values():
                child.close()
    labels = list(children)
    width = max(map(len, names))
    header = f"{'case':<{width}}  " + "  ".join(f"{label:>12}" for label in labels)
    if args.baseline:
        header += "  now/baseline"
    print(header + "   (events per CPU-second)")
    for name, rates in results.items():
        line = f"{name:<{width}}  " + "  ".join(f"{rates[label]:>12,}" if label in rates else f"{'':>12}"
                                                 for label in labels)
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
        "event_bytes_mean": event_bytes_mean,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
