"""Pieces every benchmark shares: a broker to run against, fresh settings, the machine's facts.

Ratios are quoted from one run, on one machine, against one broker: :func:`broker_bootstrap` uses
``KAFKA_BOOTSTRAP`` when set and otherwise starts the embedded Apache Kafka once for the whole
benchmark. :func:`fresh_settings` gives every worker run its own topic names and consumer group,
so a run never restores another run's checkpoints (that would skip the work being measured).

>>> s = fresh_settings("127.0.0.1:9092", partitions=8, tag="x")
>>> s.kafka.partitions, s.topics.requests.startswith("llm.requests.bx-"), s.kafka.group_id.startswith("bench-x-")
(8, True, True)
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `python bench/scale.py` runs with bench/ first on the path, not the repo
    sys.path.insert(0, str(REPO))

import msgspec  # noqa: E402

from skewwatch.config import Settings  # noqa: E402

RESULTS = REPO / "bench" / "results"


def fresh_settings(bootstrap: str, partitions: int, tag: str) -> Settings:
    """Default settings with every topic name and the group id suffixed by a fresh id."""
    suffix = f"b{tag}-{uuid.uuid4().hex[:8]}"
    settings = Settings()
    settings.kafka.bootstrap = bootstrap
    settings.kafka.partitions = partitions
    settings.kafka.group_id = f"bench-{tag}-{suffix}"
    settings.topics = msgspec.structs.replace(
        settings.topics,
        **{f.name: f"{getattr(settings.topics, f.name)}.{suffix}" for f in msgspec.structs.fields(settings.topics)},
    )
    return settings


@contextlib.contextmanager
def broker_bootstrap(workdir: Path, bootstrap: str | None = None) -> Iterator[str]:
    """``host:port`` of the Kafka to use: the given one, ``KAFKA_BOOTSTRAP``, or an embedded broker
    started here (and stopped on exit)."""
    bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    from skewwatch.broker import EmbeddedBroker

    broker = EmbeddedBroker(workdir / "kafka", port=0)
    broker.start(timeout=180)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def write_result(path: Path, result: Any) -> None:
    """Write a benchmark's JSON (its folder made) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on; load average says how busy the shared machine was."""
    load: list[float] | None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and (max - min) / median of repeated measurements.

    >>> spread([10.0, 12.0, 11.0])
    {'median': 11.0, 'min': 10.0, 'max': 12.0, 'spread': 0.182, 'n': 3}
    """
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {"median": med, "min": lo, "max": hi, "spread": round((hi - lo) / med, 3) if med else 0.0,
            "n": len(values)}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]): a measured value, never an interpolation.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 99)
    (2.0, 4.0)
    """
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least 1
    return ordered[int(rank) - 1]


def peak_rss_bytes(pid: int) -> int | None:
    """Peak resident set size (VmHWM) of a live process, from /proc (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
