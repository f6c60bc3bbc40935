"""The pinned Kafka's jars: fetched once from Maven Central with the pom beside this module, cached.

``pom.xml`` (beside this module, shipped with the package) pins the Kafka release; Maven copies it
and its runtime dependencies into ``$SKEWWATCH_CACHE`` (default ``~/.cache/skewwatch``)
``/kafka-<version>/libs``, once. ``log4j2.xml`` beside it configures the broker's logging.

>>> kafka_version()
'4.4.0'
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path

from skewwatch.broker.errors import BrokerError, last_error_line
from skewwatch.broker.java import find_maven

KAFKA_FILES_DIR = Path(__file__).resolve().parent
POM_PATH = KAFKA_FILES_DIR / "pom.xml"
LOG4J_CONFIG_PATH = KAFKA_FILES_DIR / "log4j2.xml"
_COMPLETE_MARKER = ".skewwatch-complete"  # written last: a fetch without it was interrupted


def _kafka_files() -> Path:
    if not POM_PATH.is_file():
        raise BrokerError(
            f"cannot find {POM_PATH} (the Kafka fetch file, part of the package): reinstall skewwatch, "
            "or point at an existing cluster with KAFKA_BOOTSTRAP=host:port"
        )
    return KAFKA_FILES_DIR


def kafka_version(pom: Path | None = None) -> str:
    """The pinned Kafka version: ``<kafka.version>`` in the pom beside this module."""
    pom = pom or _kafka_files() / "pom.xml"
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ElementTree.parse(pom).getroot().find("m:properties/m:kafka.version", namespace)
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom} has no <kafka.version> property")
    return (node.text or "").strip()


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
                f"{last_error_line(fetched.stdout + fetched.stderr)}; check access to Maven Central "
                "(a proxy or mirror goes in ~/.m2/settings.xml)"
            )
        (scratch / _COMPLETE_MARKER).write_text(digest + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        scratch.rename(libs)
    return libs


__all__ = ["KAFKA_FILES_DIR", "LOG4J_CONFIG_PATH", "POM_PATH", "default_cache_root", "ensure_kafka_jars",
           "kafka_jars_dir", "kafka_version"]
