"""Finding the Java and Maven the embedded broker needs, or one line saying what to install.

>>> java_major_version('openjdk version "17.0.15" 2025-04-15')
17
>>> java_major_version('java version "1.8.0_292"')
8
"""

from __future__ import annotations

import re
import shutil
import subprocess

from skewwatch.broker.errors import BrokerError

MIN_JAVA = 17


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
    """Path of ``mvn`` on PATH, or BrokerError saying what to install (``version``: the Kafka to fetch)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            f"skewwatch broker needs Apache Maven (mvn) on PATH to fetch Kafka {version} from Maven Central "
            "once (found: no mvn); install e.g. maven (apt) or https://maven.apache.org/download.cgi"
        )
    return mvn


__all__ = ["MIN_JAVA", "find_java", "find_maven", "java_major_version"]
