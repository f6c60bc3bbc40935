"""Shared harness of the pipeline benchmarks (``bench/quality.py``, ``bench/routing.py``).

Both put the *real* pipeline in the measurement: ``skewwatch worker`` as a child process on a
real Kafka broker (``KAFKA_BOOTSTRAP``, or the embedded broker started once per suite), a fresh
set of topics and consumer group per run (``tests.conftest.unique_settings``), and a detector
profile chosen by name:

- ``default``: no configuration file: whatever the worker's defaults are;
- ``seed``: ``bench/profiles/seed.toml``, the original design's rules (while the defaults are
  the seed's rules, the file selects nothing);
- ``tuned``: ``bench/profiles/tuned.toml`` on top of the defaults (offered *beside* them where
  the quality benchmark showed a seed default missing its target; nothing in the package changes);
- any ``NAME=PATH`` given to a benchmark's ``--profile``: that file.

A profile is handed to the worker as ``SKEWWATCH_CONFIG`` (environment variables still win, so
the per-run topic names of :func:`tests.integration.worker_proc.settings_env` apply on top).

>>> sorted(PROFILES)
['default', 'seed', 'tuned']
>>> detector_settings("seed").long_tail.ratio
3.0
>>> profile_env("default"), profile_env("seed")["SKEWWATCH_CONFIG"].endswith("seed.toml")
({}, True)
>>> parse_profile("mine=bench/profiles/tuned.toml")[0], parse_profile("seed")[1].name
('mine', 'seed.toml')
>>> persistence_s(detector_settings("seed"), "long_tail")
15.0
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/quality.py` puts bench/ first on the path, not the repo
    sys.path.insert(0, str(REPO))

from skewwatch.config import Settings, load_settings  # noqa: E402
from skewwatch.pipeline.detector_settings import DetectorSettings  # noqa: E402
from tests.integration.worker_proc import WorkerProcess, settings_env  # noqa: E402

RESULTS = REPO / "bench" / "results"
PROFILE_DIR = REPO / "bench" / "profiles"
PROFILES: dict[str, Path | None] = {"default": None, "seed": PROFILE_DIR / "seed.toml",
                                    "tuned": PROFILE_DIR / "tuned.toml"}
STEP_S = 5.0  # the pipeline's step (seed §2.5)
# The closed loop needs a correction every step (the default heartbeat publishes every 30 s or on
# change); the quality benchmark reads the weights' per-step series the same way.
EVERY_STEP_ENV = {"SKEWWATCH_DETECTORS__CORRECTIONS__HEARTBEAT_S": "5"}


def parse_profile(spec: str) -> tuple[str, Path | None]:
    """``NAME`` (one of :data:`PROFILES`) or ``NAME=PATH`` (any configuration file) -> (name, file)."""
    name, sep, path = spec.partition("=")
    if sep:
        if not Path(path).is_file():
            raise ValueError(f"profile {name!r}: no file {path!r}")
        return name, Path(path).resolve()
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)}; or NAME=PATH of a config file)")
    return name, PROFILES[name]


def profile_env(profile: str) -> dict[str, str]:
    """Environment that makes a worker load ``profile`` (``NAME`` or ``NAME=PATH``; empty for ``default``)."""
    path = parse_profile(profile)[1]
    return {} if path is None else {"SKEWWATCH_CONFIG": str(path)}


def profile_settings(profile: str, env: dict[str, str] | None = None) -> Settings:
    """The settings a worker runs with under ``profile``, plus ``env`` (not this process's environment)."""
    return load_settings(parse_profile(profile)[1], env=env or {})


def detector_settings(profile: str) -> DetectorSettings:
    """The detector settings a worker runs with under ``profile`` (ignores this process's env)."""
    return profile_settings(profile).detectors


def persistence_s(settings: DetectorSettings, detector: str) -> float:
    """Seconds of persistence before ``detector`` can open (its ``persistence`` steps x 5 s).

    ``gpu_health`` opens on the step that sees the error; the weights' staleness rule judges no
    silence shorter than ``stale_min_s``; the latency weight reacts on the next step.
    """
    if detector in ("gpu_health", "weights"):
        return STEP_S
    if detector == "stale":
        return settings.weights.stale_min_s
    if detector == "weights":
        return STEP_S
    return float(getattr(settings, detector).persistence) * STEP_S


@contextmanager
def kafka(workdir: Path) -> Iterator[str]:
    """``host:port`` of ``KAFKA_BOOTSTRAP``, or of an embedded broker started for the suite."""
    from bench.throughput.common import broker_bootstrap

    with broker_bootstrap(workdir) as bootstrap:
        yield bootstrap


def fresh_settings(bootstrap: str, partitions: int = 2) -> Settings:
    """Settings with fresh topic names and group id, the topics created (one set per run)."""
    from skewwatch.topics import ensure_topics
    from tests.conftest import unique_settings

    settings = unique_settings(bootstrap, partitions)
    asyncio.run(ensure_topics(bootstrap, settings))
    return settings


def delete_run_topics(bootstrap: str, settings: Settings) -> None:
    """Best effort: a suite creates ~100 topics; keep a shared cluster tidy."""
    from skewwatch.topics import delete_topics
    from tests.conftest import topic_names

    try:
        asyncio.run(delete_topics(bootstrap, topic_names(settings)))
    except Exception as exc:  # noqa: BLE001 - cleanup must never fail a benchmark
        print(f"  (could not delete the run's topics: {exc})", file=sys.stderr)


class Worker(WorkerProcess):
    """``skewwatch worker`` in a child process with ``settings`` and a profile, run in ``workdir``.

    The working directory matters: the worker keeps Faust's ``<group>-data`` directory there,
    and a benchmark starts dozens of workers (the tests' helper runs them in the repo root).
    """

    def __init__(self, settings: Settings, workdir: Path, profile: str, extra_env: dict[str, str] | None = None,
                 name: str = "worker") -> None:
        super().__init__(settings, workdir / f"{name}.log", cwd=workdir, loglevel="warning")
        self.workdir = workdir
        # the caller's own SKEWWATCH_* settings would silently change what is measured: only the profile counts
        inherited = {k: v for k, v in os.environ.items()
                     if k not in ("KAFKA_BOOTSTRAP", "SKEWWATCH_CONFIG")
                     and not (k.startswith("SKEWWATCH_") and "__" in k)}
        self.env = {**inherited, **profile_env(profile), **settings_env(settings), **(extra_env or {})}

    def start(self, timeout: float = 90.0) -> Worker:
        super().start(timeout)
        return self


def read_topics(bootstrap: str, topics: Sequence[str], done: Callable[[list[Any]], bool],
                timeout_s: float) -> list[Any]:
    """Records of ``topics`` from the beginning until ``done(records)`` or ``timeout_s`` (wall)."""
    from tests.integration.worker_proc import consume_until

    return asyncio.run(consume_until(bootstrap, list(topics), done, timeout_s))


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (``q`` in [0, 1]) of measured values; None when there are none.

    >>> quantile([4.0, 1.0, 3.0, 2.0], 0.5), quantile([4.0, 1.0, 3.0, 2.0], 0.95), quantile([], 0.5)
    (2.0, 4.0, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n q), at least 1: a measured value, not interpolated
    return float(ordered[min(int(rank), len(ordered)) - 1])


def machine() -> dict[str, Any]:
    from bench.throughput.common import machine_info

    return machine_info()
