"""The embedded broker: a single-node KRaft Kafka (broker + controller in one JVM) on loopback.

>>> len(new_cluster_id())
22
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from skewwatch.broker.errors import BrokerError, DataDirInUse, PortBusy, last_error_line
from skewwatch.broker.jars import LOG4J_CONFIG_PATH, ensure_kafka_jars
from skewwatch.broker.java import find_java
from skewwatch.errors import KafkaUnreachable
from skewwatch.kafka_client import describe_cluster, run_blocking
from skewwatch.ports import LOOPBACK, free_port, port_is_free

log = logging.getLogger(__name__)

_HOST = LOOPBACK
_NODE_ID = 1


def busy_port_message(port: int, what: str) -> str:
    """One line for a port another process holds: what to do about it."""
    return (
        f"{what} port {port} on {_HOST} is already in use (another broker?); pick another with --port, "
        f"or use the running one with --bootstrap {_HOST}:{port}"
    )


def check_data_dir_unlocked(kafka_data_dir: Path) -> None:
    """DataDirInUse naming the lock when a running broker holds ``<data dir>/.lock``.

    Kafka locks its log directory with ``FileChannel.tryLock`` (an fcntl record lock on Linux); the
    same non-blocking lock from here fails while that broker runs, and is released at once.
    """
    lock_path = kafka_data_dir / ".lock"
    if not lock_path.is_file():
        return
    try:
        with open(lock_path, "a") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(lock, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise DataDirInUse(f"the data directory {kafka_data_dir.parent} is in use by another broker (it "
                               f"holds the lock {lock_path}); stop that broker or pick another --data-dir") from None
        raise BrokerError(f"cannot check the lock {lock_path}: {exc.strerror or exc}") from None


def _tcp_accepts(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


def _die_with_parent() -> None:  # runs in the child between fork and exec (main-thread parents only)
    # Linux: the JVM gets SIGTERM when the process that started it dies, even by SIGKILL,
    # so a killed test run or CLI never leaves an orphan broker holding its port and data dir.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class EmbeddedBroker:
    """A single-node KRaft Kafka (broker + controller in one JVM) on loopback, in a child process.

    ``port=0`` picks a free port at the first start and keeps it for later restarts; ``controller_port``
    ``None`` picks a free one at each start (clients never see it). Layout of ``data_dir``:
    ``server.properties`` (rewritten at each start), ``data/`` (Kafka's log.dirs: topics and the
    metadata log, formatted once) and ``logs/server.log`` (the broker's log,
    see ``skewwatch/broker/log4j2.xml``).
    With ``echo_console`` the JVM's console (WARN and above) goes to this process's stderr, else to
    ``logs/console.log``. ``jvm_options`` (then the env ``SKEWWATCH_KAFKA_JVM_OPTS``) are appended to the
    JVM's flags, so they override the defaults.

    Secured listeners (a test of TLS and SASL, see docs/security.md) are added with
    ``extra_listeners`` (``(name, security protocol, port, advertised host)``), their settings with
    ``extra_properties`` (``listener.name.<name>.…``, keystores, JAAS), and SCRAM users with
    ``format_args`` (``--add-scram 'SCRAM-SHA-256=[name=u,password=p]'``: Kafka's own StorageTool
    writes them into the metadata log when the data directory is formatted). The PLAINTEXT
    listener on ``port`` stays: the broker talks to itself through it.

    >>> broker = EmbeddedBroker(Path("/tmp/skewwatch-doctest"), port=19092)
    >>> broker.bootstrap, broker.log_path.name, broker.running
    ('127.0.0.1:19092', 'server.log', False)
    """

    def __init__(
        self,
        data_dir: Path,
        port: int = 9092,
        controller_port: int | None = None,
        heap: str = "512m",
        *,
        jvm_options: Sequence[str] = (),
        cache_dir: Path | None = None,
        echo_console: bool = False,
        progress: Callable[[str], None] | None = None,
        extra_listeners: Sequence[tuple[str, str, int, str]] = (),
        extra_properties: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.controller_port = controller_port
        self.heap = heap
        # later flags win in HotSpot, so these (then $SKEWWATCH_KAFKA_JVM_OPTS) override the defaults
        self.jvm_options = [*jvm_options, *os.environ.get("SKEWWATCH_KAFKA_JVM_OPTS", "").split()]
        self.cache_dir = cache_dir
        self.echo_console = echo_console
        self._progress = progress or (lambda message: log.info("%s", message))
        self.extra_listeners = list(extra_listeners)
        self.extra_properties = dict(extra_properties or {})
        self.format_args = list(format_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None
        self._log_offsets: dict[Path, int] = {}

    # -- paths and addresses

    @property
    def bootstrap(self) -> str:
        return f"{_HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.logs_dir / "server.log"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def kafka_data_dir(self) -> Path:
        return self.data_dir / "data"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- lifecycle

    def start(self, timeout: float = 60) -> None:
        """Fetch (once), format (once), start and wait until a metadata request answers."""
        if self.running:
            return
        java = find_java()
        check_data_dir_unlocked(self.kafka_data_dir)  # before the port: the more specific reason
        try:
            if self.port == 0:
                self.port = free_port()
            controller_port = self.controller_port or free_port(avoid={self.port})
        except OSError as exc:
            raise BrokerError(str(exc)) from exc
        if not port_is_free(self.port):
            raise PortBusy(busy_port_message(self.port, "Kafka"))
        if not port_is_free(controller_port):
            raise PortBusy(busy_port_message(controller_port, "Kafka controller"))
        libs = ensure_kafka_jars(self.cache_dir, progress=self._progress)
        self.kafka_data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(self._server_properties(controller_port))
        if not (self.kafka_data_dir / "meta.properties").is_file():
            self._format(java, libs)
        self._launch(java, libs)
        try:
            self._wait_ready(timeout)
        except BaseException:  # including Ctrl-C while waiting: never leave a half-started JVM behind
            self.stop()
            raise

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (Kafka's clean shutdown), wait up to ``timeout`` s, then SIGKILL."""
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("Kafka did not stop within %.0f s of SIGTERM; killing it", timeout)
                    process.kill()
                    process.wait()
        finally:
            if self._console is not None:
                self._console.close()
                self._console = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the JVM exits (or ``timeout``); its exit code, or None while it still runs."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals

    def _server_properties(self, controller_port: int) -> str:
        extra = "".join(f",{name}://{_HOST}:{port}" for name, _, port, _ in self.extra_listeners)
        advertised = "".join(f",{name}://{host}:{port}" for name, _, port, host in self.extra_listeners)
        protocols = "".join(f",{name}:{protocol}" for name, protocol, _, _ in self.extra_listeners)
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(_NODE_ID),
            "controller.quorum.voters": f"{_NODE_ID}@{_HOST}:{controller_port}",
            "listeners": f"PLAINTEXT://{_HOST}:{self.port},CONTROLLER://{_HOST}:{controller_port}{extra}",
            "advertised.listeners": f"PLAINTEXT://{_HOST}:{self.port}{advertised}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{protocols}",
            "log.dirs": str(self.kafka_data_dir),
            # one node: internal topics cannot have more replicas than that
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # partitions of internal topics only spread coordinator load across brokers; with one broker
            # 50 (the default) just makes the first consumer group join slower
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.num.partitions": "8",
            # topics are created explicitly with their configs (skewwatch.topics), never by a typo
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            # one member joins at once in dev and tests; the 3 s default only delays the first poll
            "group.initial.rebalance.delay.ms": "0",
            **self.extra_properties,
        }
        header = "# written by skewwatch.broker at each start; edits are overwritten\n"
        return header + "".join(f"{key}={value}\n" for key, value in settings.items())

    def _java_command(self, java: str, libs: Path, main_class: str, *args: str) -> list[str]:
        return [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            # C1 only: the broker starts sooner (C2 would optimise start-up code that runs once), and
            # C2's compiler threads stop competing with the pipeline for CPU. A loopback dev broker is
            # nowhere near CPU-bound; -XX:TieredStopAtLevel=4 in jvm_options restores full C2.
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            # log4j's own shutdown hook would close logging while Kafka's shutdown hook still logs
            # (it then falls back to a console SimpleLogger); the JVM flushes the files at exit anyway
            "-Dlog4j2.shutdownHookEnabled=false",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG_PATH}",
            f"-Dkafka.logs.dir={self.logs_dir}",
            *self.jvm_options,
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _format(self, java: str, libs: Path) -> None:
        cluster_id = new_cluster_id()
        self._progress(f"formatting {self.kafka_data_dir} (cluster id {cluster_id})")
        command = self._java_command(
            java, libs, "kafka.tools.StorageTool",
            "format", "-t", cluster_id, "-c", str(self.properties_path), *self.format_args,
        )  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError(
                f"formatting {self.kafka_data_dir} failed (exit {done.returncode}): "
                f"{last_error_line(done.stdout + done.stderr)}"
            )

    def _launch(self, java: str, libs: Path) -> None:
        command = self._java_command(java, libs, "kafka.Kafka", str(self.properties_path))
        self._log_offsets = {
            path: path.stat().st_size if path.exists() else 0 for path in (self.log_path, self.logs_dir / "console.log")
        }
        if self.echo_console:
            output: IO[bytes] | None = None
        else:
            # stays open while the JVM runs; stop() closes it
            self._console = output = open(self.logs_dir / "console.log", "ab")  # noqa: SIM115
        main_thread = threading.current_thread() is threading.main_thread()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            # own session: a terminal's Ctrl-C reaches only us, and stop() shuts the JVM down in order
            start_new_session=True,
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only from the main thread
            preexec_fn=_die_with_parent if main_thread and sys.platform == "linux" else None,
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_problem = "no answer yet"
        while True:
            assert self._process is not None
            code = self._process.poll()
            if code is not None:
                raise self.failure(f"Kafka exited with code {code} while starting")
            # a quiet TCP probe first: aiokafka logs an error for every refused connection
            if _tcp_accepts(_HOST, self.port):
                try:
                    run_blocking(describe_cluster(self.bootstrap, timeout=5.0))
                    return
                except KafkaUnreachable as exc:
                    last_problem = str(exc)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Kafka did not answer on {self.bootstrap} within {timeout:.0f} s ({last_problem}); "
                    f"see {self.log_path}"
                )
            time.sleep(0.2)

    def failure(self, headline: str) -> BrokerError:
        """The error for a JVM that stopped: :meth:`describe_failure`, as the class its cause calls for."""
        message = self.describe_failure(headline)
        if message.startswith(("Kafka port", "Kafka controller port")):
            return PortBusy(message)
        if "in use by another broker" in message:
            return DataDirInUse(message)
        return BrokerError(message)

    def describe_failure(self, headline: str) -> str:
        """One line on why the JVM stopped: the last error it logged since this start."""
        text = ""
        for path in (self.log_path, self.logs_dir / "console.log"):
            with contextlib.suppress(OSError), open(path, "rb") as logged:
                # only this run's lines: an old "Address already in use" must not explain a new failure
                logged.seek(self._log_offsets.get(path, 0))
                text += logged.read().decode(errors="replace")[-20000:] + "\n"
        if "Address already in use" in text:
            return busy_port_message(self.port, "Kafka") + f" (see {self.log_path})"
        if "Failed to acquire lock" in text:
            return (f"the data directory {self.data_dir} is in use by another broker (it holds the lock "
                    f"{self.kafka_data_dir / '.lock'}); stop that broker or pick another --data-dir")
        return f"{headline}: {last_error_line(text)} (see {self.log_path})"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 characters).

    >>> len(new_cluster_id())
    22
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # Kafka avoids these too: they read as a command-line flag
            return cluster_id


__all__ = ["BrokerError", "EmbeddedBroker", "busy_port_message", "check_data_dir_unlocked", "new_cluster_id"]
