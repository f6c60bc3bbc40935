"""Several ``skewwatch worker`` processes in one consumer group, and what they cost the machine.

:class:`WorkerGroup` starts ``size`` workers with the same settings (so the same consumer groups: the
topics' partitions are spread over them), kills one (SIGKILL: no last checkpoint), stops one
(SIGTERM: a clean stop), replaces either with a new process, and sums their ``/metrics``.
:class:`ResourceSampler` reads each live worker's resident memory and CPU time from ``/proc`` a few
times a second, so a test or benchmark can say how much memory a worker held while something
happened.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from skewwatch.config import Settings
from tests.integration.worker_proc import WorkerProcess

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a live process (``/proc/PID/statm``), None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (``/proc/PID/stat``), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return None


def parse_metrics(text: str) -> dict[str, float]:
    """A Prometheus exposition as ``{name or name{labels}: value}`` (label sets kept apart, and summed
    under the bare name)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        out[name] = number
        bare = name.partition("{")[0]
        if bare != name:
            out[bare] = out.get(bare, 0.0) + number
    return out


class WorkerGroup:
    """``size`` workers with ``settings`` in one group; logs under ``log_dir`` (``worker-N.log``)."""

    def __init__(self, settings: Settings, log_dir: Path, size: int, extra_env: dict[str, str] | None = None,
                 *, loglevel: str = "info") -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.extra_env = dict(extra_env or {})
        self.loglevel = loglevel
        self.started = 0
        self.workers: list[WorkerProcess] = [self._new() for _ in range(size)]

    def _new(self) -> WorkerProcess:
        self.started += 1
        # each in its own directory: Faust keeps a <group>-data directory in the working directory
        return WorkerProcess(self.settings, self.log_dir / f"worker-{self.started}.log", self.extra_env,
                             cwd=self.log_dir / f"worker-{self.started}", loglevel=self.loglevel)

    def start(self, timeout: float = 120.0) -> WorkerGroup:
        """Start every worker at once; return when all answer ``/healthz`` (partitions assigned)."""
        for worker in self.workers:
            worker.launch()
        for worker in self.workers:
            worker.wait_healthy(timeout)
        return self

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index``: no last checkpoint, its partitions wait for the session timeout."""
        self.workers[index].kill()

    def terminate(self, index: int) -> None:
        """SIGTERM worker ``index`` and wait until it has exited (a clean stop: last checkpoints)."""
        self.workers[index].stop()

    def replace(self, index: int, timeout: float = 120.0) -> WorkerProcess:
        """A new worker in place of ``index`` (which must have stopped); returns once it is healthy."""
        worker = self.workers[index] = self._new()
        worker.launch()
        worker.wait_healthy(timeout)
        return worker

    def pids(self) -> dict[str, int]:
        """``worker-N`` -> pid of each running worker."""
        return {w.log_path.stem: w.proc.pid for w in self.workers
                if w.proc is not None and w.proc.poll() is None}

    def metrics(self) -> dict[str, float]:
        """Every running worker's ``/metrics``, summed."""
        total: dict[str, float] = {}
        for worker in self.workers:
            if worker.proc is None or worker.proc.poll() is not None:
                continue
            try:
                parsed = parse_metrics(worker.get("/metrics").decode())
            except OSError:
                continue
            for name, value in parsed.items():
                total[name] = total.get(name, 0.0) + value
        return total

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def log_tails(self, n: int = 30) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.log_tail(n)}" for w in self.workers)

    def __enter__(self) -> WorkerGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ResourceSampler:
    """Samples resident memory and CPU time of the processes ``pids()`` names, every ``interval_s``."""

    pids: object  # () -> {name: pid}
    interval_s: float = 0.5
    peak_rss: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # newest CPU seconds seen per process
    samples: list[tuple[float, str, int]] = field(default_factory=list)  # (monotonic, name, rss)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)

    def start(self) -> ResourceSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def peak_between(self, start: float, end: float) -> int:
        """The largest RSS of any process sampled between monotonic ``start`` and ``end``."""
        return max((rss for t, _, rss in self.samples if start <= t <= end), default=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for name, pid in self.pids().items():  # type: ignore[operator]
                rss = rss_bytes(pid)
                cpu = cpu_seconds(pid)
                if rss is not None:
                    self.samples.append((now, name, rss))
                    self.peak_rss[name] = max(self.peak_rss.get(name, 0), rss)
                if cpu is not None:
                    self.cpu[name] = cpu
            self._stop.wait(self.interval_s)
