"""``skewwatch worker`` with one clock probe, for the benchmark only.

``python -m bench.throughput.probe worker ...`` runs the unchanged worker CLI after wrapping
:meth:`skewwatch.agents.replica_stage.ReplicaStage._process` so that the first call with records writes
``{"wall": time.time(), "cpu": time.process_time()}`` to the file named by
``SKEWWATCH_BENCH_PROBE``. That is the moment the first poll returned, the same start as every
peer's (``bench/throughput/contenders.py``: the first poll or message handed to user code), which
cannot be seen from outside the process: ``/metrics`` only moves after the first poll was
processed, and one poll of batched messages can hold most of the topic.

With ``SKEWWATCH_BENCH_TRACEMALLOC=PATH`` it also traces allocations from the start, and on SIGUSR1
writes to PATH the traced bytes (current, peak) and the lines holding the most memory: how much of the
RSS is live Python data, and whose (``bench/scale.py --rss-tracemalloc``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import tracemalloc
from pathlib import Path
from typing import Any

from skewwatch.agents import replica_stage

_original = replica_stage.ReplicaStage._process
_probe_path = os.environ.get("SKEWWATCH_BENCH_PROBE")


async def _probed_process(self: replica_stage.ReplicaStage, batches: dict[Any, list[Any]]) -> None:
    global _probe_path
    if _probe_path is not None and any(batches.values()):
        # the log levels in force: a DEBUG-enabled client logger costs a LogRecord per message sent
        levels = {name or "root": logging.getLevelName(logging.getLogger(name).getEffectiveLevel())
                  for name in ("", "aiokafka", "aiokafka.producer.producer", "skewwatch")}
        Path(_probe_path).write_text(json.dumps({"wall": time.time(), "cpu": time.process_time(),
                                                 "log_levels": levels}))
        _probe_path = None  # once
    await _original(self, batches)


replica_stage.ReplicaStage._process = _probed_process  # type: ignore[method-assign]

_tracemalloc_path = os.environ.get("SKEWWATCH_BENCH_TRACEMALLOC")


def _dump_tracemalloc(signum: int, frame: Any) -> None:
    assert _tracemalloc_path is not None
    current, peak = tracemalloc.get_traced_memory()
    stats = tracemalloc.take_snapshot().statistics("lineno")
    top = [{"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}", "bytes": s.size, "blocks": s.count}
           for s in stats[:40]]
    Path(_tracemalloc_path).write_text(json.dumps({"current": current, "peak": peak, "top": top}))


if _tracemalloc_path:
    tracemalloc.start()
    signal.signal(signal.SIGUSR1, _dump_tracemalloc)

if __name__ == "__main__":
    from skewwatch.cli import main

    main()
