"""The embedded Apache Kafka broker: fetched from Maven Central, formatted and started by the project.

Issue 2 ("Broker: real Apache Kafka, started by the project"): a pinned Kafka release, single node, KRaft,
on loopback; jars from Maven Central through ``docker/kafka/pom.xml``, cached between runs; Java 17+ and
Maven are the only prerequisites, and a missing one is a one-line error naming what to install.
``KAFKA_BOOTSTRAP`` / ``--bootstrap`` point at an existing cluster instead, and then nothing is started.

The pieces:

* :func:`ensure_kafka_jars` runs Maven once and caches the jars under
  ``$SKEWWATCH_CACHE`` (default ``~/.cache/skewwatch``) ``/kafka-<version>/libs``.
* :class:`EmbeddedBroker` formats a data directory (once, so data survives restarts), starts
  ``kafka.Kafka`` in a child JVM and waits until a real metadata request answers.
* :data:`broker_command` is ``skewwatch broker``: the same thing in the foreground until Ctrl-C.

>>> kafka_version()
'4.4.0'
>>> java_major_version('openjdk version "17.0.15" 2025-04-15')
17
>>> java_major_version('java version "1.8.0_292"')
8
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from skewwatch.ports import free_port, port_is_free

if TYPE_CHECKING:
    from skewwatch.config import Settings

log = logging.getLogger(__name__)

MIN_JAVA = 17
# docker/kafka/ next to the package: the supported install is an editable one from a clone.
KAFKA_FILES_DIR = Path(__file__).resolve().parent.parent / "docker" / "kafka"
POM_PATH = KAFKA_FILES_DIR / "pom.xml"
LOG4J_CONFIG_PATH = KAFKA_FILES_DIR / "log4j2.xml"
_COMPLETE_MARKER = ".skewwatch-complete"  # written last: a fetch without it was interrupted
_HOST = "127.0.0.1"
_NODE_ID = 1

T = TypeVar("T")


class BrokerError(RuntimeError):
    """The broker cannot be fetched, started or reached; the message says what to do, in one line."""


# --------------------------------------------------------------------------------------------------
# prerequisites: the pom, Java, Maven


def _kafka_files() -> Path:
    if not POM_PATH.is_file():
        raise BrokerError(
            f"cannot find {POM_PATH} (the Kafka fetch files): skewwatch broker runs from a clone installed "
            "with `pip install -e .`; otherwise point at an existing cluster with KAFKA_BOOTSTRAP=host:port"
        )
    return KAFKA_FILES_DIR


def kafka_version(pom: Path | None = None) -> str:
    """The pinned Kafka version: ``<kafka.version>`` in docker/kafka/pom.xml."""
    pom = pom or _kafka_files() / "pom.xml"
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ElementTree.parse(pom).getroot().find("m:properties/m:kafka.version", namespace)
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom} has no <kafka.version> property")
    return (node.text or "").strip()


def java_major_version(version_output: str) -> int | None:
    """Major version from ``java -version`` output ("1.8.0" is Java 8); None when unrecognisable."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major


def find_java() -> str:
    """Path of a Java 17+ ``java`` on PATH, or BrokerError saying what to install."""
    java = shutil.which("java")
    install = "install e.g. openjdk-17-jre-headless (apt) or any JDK 17+ and put its bin/ on PATH"
    if java is None:
        raise BrokerError(f"skewwatch broker needs Java {MIN_JAVA}+ on PATH (found: no java); {install}")
    try:
        probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        output = (probe.stderr + probe.stdout).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(
            f"skewwatch broker needs Java {MIN_JAVA}+ on PATH (found: {java}, which fails: {exc}); {install}"
        ) from exc
    major = java_major_version(output)
    if major is None or major < MIN_JAVA:
        found = output.splitlines()[0] if output else "no version"
        raise BrokerError(f"skewwatch broker needs Java {MIN_JAVA}+ on PATH (found: {java}: {found}); {install}")
    return java


def find_maven(version: str) -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            f"skewwatch broker needs Apache Maven (mvn) on PATH to fetch Kafka {version} from Maven Central "
            "once (found: no mvn); install e.g. maven (apt) or https://maven.apache.org/download.cgi"
        )
    return mvn


# --------------------------------------------------------------------------------------------------
# the jars


def default_cache_root() -> Path:
    """``$SKEWWATCH_CACHE``, else ``$XDG_CACHE_HOME/skewwatch``, else ``~/.cache/skewwatch``."""
    if os.environ.get("SKEWWATCH_CACHE"):
        return Path(os.environ["SKEWWATCH_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "skewwatch"


def kafka_jars_dir(cache_dir: Path | None = None) -> Path:
    """Where the jars of the pinned version live (fetched or not)."""
    return (cache_dir or default_cache_root()) / f"kafka-{kafka_version()}" / "libs"


def _pom_digest(pom: Path) -> str:
    # The marker records which pom produced the jars, so editing the pom (a new pin) refetches them.
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _jars_complete(libs: Path, digest: str) -> bool:
    marker = libs / _COMPLETE_MARKER
    return marker.is_file() and marker.read_text().strip() == digest


def ensure_kafka_jars(cache_dir: Path | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """The directory holding the pinned Kafka's jars, fetched with Maven the first time.

    ``cache_dir`` replaces the cache root (``$SKEWWATCH_CACHE`` or ``~/.cache/skewwatch``); the jars go
    to ``<root>/kafka-<version>/libs``. The fetch goes to a scratch directory that is renamed into place
    with its marker file, under a file lock: an interrupted or concurrent fetch never leaves a half set.
    """
    files = _kafka_files()
    pom = files / "pom.xml"
    version = kafka_version(pom)
    digest = _pom_digest(pom)
    libs = kafka_jars_dir(cache_dir)
    if _jars_complete(libs, digest):
        return libs
    mvn = find_maven(version)
    libs.parent.mkdir(parents=True, exist_ok=True)
    with open(libs.parent / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits, then finds the jars complete
        if _jars_complete(libs, digest):
            return libs
        if progress is not None:
            progress(f"fetching Apache Kafka {version} from Maven Central into {libs} (once)...")
        scratch = libs.parent / f"libs.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        command = [
            mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={scratch}",
        ]  # fmt: skip
        try:
            fetched = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"Maven did not fetch Kafka {version} within 15 minutes; retry") from exc
        jars = list(scratch.glob("*.jar")) if scratch.is_dir() else []
        if fetched.returncode != 0 or not any(j.name.startswith("kafka_") for j in jars):
            shutil.rmtree(scratch, ignore_errors=True)
            raise BrokerError(
                f"Maven could not fetch Kafka {version} (exit {fetched.returncode}): "
                f"{_last_error_line(fetched.stdout + fetched.stderr)}; check access to Maven Central "
                "(a proxy or mirror goes in ~/.m2/settings.xml)"
            )
        (scratch / _COMPLETE_MARKER).write_text(digest + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        scratch.rename(libs)
    return libs


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _last_error_line(output: str) -> str:
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if "ERROR" in line or "Exception" in line or "Error" in line]
    return (errors or lines or ["no output"])[-1][:400]


# --------------------------------------------------------------------------------------------------
# ports


def _busy_port_message(port: int, what: str) -> str:
    return (
        f"{what} port {port} on {_HOST} is already in use (another broker?); pick another with --port, "
        f"or use the running one with --bootstrap {_HOST}:{port}"
    )


# --------------------------------------------------------------------------------------------------
# talking to a cluster


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, even when called inside a running event loop.

    It runs on a fresh loop in a helper thread, so it never touches the caller's loop (pytest-asyncio's
    or a Faust worker's) — ``asyncio.run`` in the calling thread would close or replace it.
    """
    result: list[T] = []
    failure: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:  # handed back to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=runner, name="skewwatch-run-blocking", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


async def describe_cluster(bootstrap: str, timeout: float = 10.0) -> dict[str, Any]:
    """A real Kafka metadata request: ``{"brokers": [...], "cluster_id": ..., "controller_id": ...}``.

    Raises BrokerError when nothing answers at ``bootstrap`` within ``timeout`` seconds.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="skewwatch-probe", request_timeout_ms=int(timeout * 1000)
    )
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
            cluster: dict[str, Any] = await admin.describe_cluster()
    except Exception as exc:
        raise BrokerError(f"no Kafka answers at {bootstrap}: {describe_exception(exc)}") from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    if not cluster.get("brokers"):
        raise BrokerError(f"Kafka at {bootstrap} answers but lists no live broker yet")
    return cluster


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` on one line, without the type twice (aiokafka's messages repeat it).

    >>> describe_exception(TimeoutError())
    'TimeoutError'
    """
    name = type(exc).__name__
    message = " ".join(str(exc).split())
    if not message:
        return name
    return message if message.startswith(name) else f"{name}: {message}"


def quiet_client_logs() -> None:
    """Keep aiokafka's per-connection errors off a command's terminal when no logging is configured.

    Without any handler, Python prints WARNING+ records through its last-resort handler, so a refused
    connection would show a stack of aiokafka lines above the command's own one-line error.
    """
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())


def _tcp_accepts(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


def _die_with_parent() -> None:  # runs in the child between fork and exec (main-thread parents only)
    # Linux: the JVM gets SIGTERM when the process that started it dies, even by SIGKILL,
    # so a killed test run or CLI never leaves an orphan broker holding its port and data dir.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


# --------------------------------------------------------------------------------------------------
# the broker


class EmbeddedBroker:
    """A single-node KRaft Kafka (broker + controller in one JVM) on loopback, in a child process.

    ``port=0`` picks a free port at the first start and keeps it for later restarts; ``controller_port``
    ``None`` picks a free one at each start (clients never see it). Layout of ``data_dir``:
    ``server.properties`` (rewritten at each start), ``data/`` (Kafka's log.dirs: topics and the
    metadata log, formatted once) and ``logs/server.log`` (the broker's log, see docker/kafka/log4j2.xml).
    With ``echo_console`` the JVM's console (WARN and above) goes to this process's stderr, else to
    ``logs/console.log``. ``jvm_options`` (then the env ``SKEWWATCH_KAFKA_JVM_OPTS``) are appended to the
    JVM's flags, so they override the defaults.

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
        try:
            if self.port == 0:
                self.port = free_port()
            controller_port = self.controller_port or free_port(avoid={self.port})
        except OSError as exc:
            raise BrokerError(str(exc)) from exc
        if not port_is_free(self.port):
            raise BrokerError(_busy_port_message(self.port, "Kafka"))
        if not port_is_free(controller_port):
            raise BrokerError(_busy_port_message(controller_port, "Kafka controller"))
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
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(_NODE_ID),
            "controller.quorum.voters": f"{_NODE_ID}@{_HOST}:{controller_port}",
            "listeners": f"PLAINTEXT://{_HOST}:{self.port},CONTROLLER://{_HOST}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{_HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
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
            # C1 only: the broker starts in ~4 s instead of ~10 s on a busy 2-core machine, and C2's
            # compiler threads stop competing with the pipeline for CPU. A loopback dev broker is
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
            "format", "-t", cluster_id, "-c", str(self.properties_path),
        )  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError(
                f"formatting {self.kafka_data_dir} failed (exit {done.returncode}): "
                f"{_last_error_line(done.stdout + done.stderr)}"
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
                raise BrokerError(self.describe_failure(f"Kafka exited with code {code} while starting"))
            # a quiet TCP probe first: aiokafka logs an error for every refused connection
            if _tcp_accepts(_HOST, self.port):
                try:
                    run_blocking(describe_cluster(self.bootstrap, timeout=5.0))
                    return
                except BrokerError as exc:
                    last_problem = str(exc)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Kafka did not answer on {self.bootstrap} within {timeout:.0f} s ({last_problem}); "
                    f"see {self.log_path}"
                )
            time.sleep(0.2)

    def describe_failure(self, headline: str) -> str:
        """One line on why the JVM stopped: the last error it logged since this start."""
        text = ""
        for path in (self.log_path, self.logs_dir / "console.log"):
            with contextlib.suppress(OSError), open(path, "rb") as logged:
                # only this run's lines: an old "Address already in use" must not explain a new failure
                logged.seek(self._log_offsets.get(path, 0))
                text += logged.read().decode(errors="replace")[-20000:] + "\n"
        if "Address already in use" in text:
            return _busy_port_message(self.port, "Kafka") + f" (see {self.log_path})"
        return f"{headline}: {_last_error_line(text)} (see {self.log_path})"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (22 characters).

    >>> len(new_cluster_id())
    22
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):  # Kafka avoids these too: they read as a command-line flag
            return cluster_id


# --------------------------------------------------------------------------------------------------
# `skewwatch broker`


class _Terminated(Exception):
    """SIGTERM arrived: stop like on Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


@click.command("broker")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".skewwatch/kafka"),
    show_default=True,
    help="Where the broker keeps its topics and logs (formatted on first use, kept across restarts).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=9092, show_default=True, help="Client port.")
@click.option(
    "--bootstrap",
    envvar="KAFKA_BOOTSTRAP",
    metavar="HOST:PORT",
    help="Use this existing cluster instead (env KAFKA_BOOTSTRAP): start nothing, check that it answers.",
)
@click.option(
    "--topics/--no-topics",
    default=True,
    show_default=True,
    help="Create skewwatch's topics (from the settings) once the broker is ready.",
)
@click.option("--heap", default="512m", show_default=True, help="JVM heap (-Xmx) of the broker.")
@click.pass_context
def broker_command(
    ctx: click.Context, data_dir: Path, port: int, bootstrap: str | None, topics: bool, heap: str
) -> None:
    """Run a single-node Apache Kafka (KRaft) on loopback in the foreground until Ctrl-C.

    The first run fetches the pinned Kafka from Maven Central (needs Java 17+ and Maven on PATH).
    """
    quiet_client_logs()
    if bootstrap:
        source = ctx.get_parameter_source("bootstrap")
        origin = "KAFKA_BOOTSTRAP" if source == click.core.ParameterSource.ENVIRONMENT else "--bootstrap"
        click.echo(f"{origin}={bootstrap} is set: using that cluster, starting no broker")
        try:
            cluster = run_blocking(describe_cluster(bootstrap, timeout=15.0))
        except BrokerError as exc:
            raise click.ClickException(f"{exc} (from {origin}; unset it to start the embedded broker)") from None
        click.echo(f"cluster {cluster.get('cluster_id')} at {bootstrap} answers: {len(cluster['brokers'])} broker(s)")
        return

    from skewwatch.cli import command_settings

    settings = command_settings() if topics else None  # invalid settings stop it before the JVM starts
    broker = EmbeddedBroker(
        data_dir, port=port, heap=heap, echo_console=True, progress=lambda m: click.echo(m, err=True)
    )
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_sigint = signal.getsignal(signal.SIGINT)
    try:
        try:
            broker.start()
            if settings is not None:
                _create_topics(broker.bootstrap, settings)
            click.echo(f"Kafka {kafka_version()} ready: bootstrap {broker.bootstrap} (data {broker.data_dir})")
            click.echo(f"KAFKA_BOOTSTRAP={broker.bootstrap}")
            click.echo(f"broker log: {broker.log_path}; Ctrl-C stops it")
            code = broker.wait()
            raise click.ClickException(broker.describe_failure(f"Kafka exited by itself with code {code}"))
        except (KeyboardInterrupt, _Terminated):
            click.echo("stopping Kafka...", err=True)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the JVM
            broker.stop()
            click.echo("Kafka stopped", err=True)
        except BrokerError as exc:
            raise click.ClickException(str(exc)) from None
    finally:
        broker.stop()
        signal.signal(signal.SIGTERM, previous_sigterm)
        signal.signal(signal.SIGINT, previous_sigint)


def _create_topics(bootstrap: str, settings: Settings) -> None:
    from skewwatch.topics import TopicError, ensure_topics

    try:
        created = run_blocking(ensure_topics(bootstrap, settings))
    except TopicError as exc:
        raise BrokerError(f"Kafka started, but creating topics failed: {exc}") from exc
    if created:
        click.echo(f"created topics: {', '.join(created)}", err=True)


__all__ = [
    "BrokerError",
    "EmbeddedBroker",
    "broker_command",
    "describe_cluster",
    "describe_exception",
    "ensure_kafka_jars",
    "find_java",
    "free_port",
    "kafka_jars_dir",
    "kafka_version",
    "port_is_free",
    "quiet_client_logs",
    "run_blocking",
]
