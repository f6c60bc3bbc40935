"""The broker's errors, and how a tool's output becomes the one line it quotes."""

from __future__ import annotations

import re

from skewwatch.errors import SkewwatchError


class BrokerError(SkewwatchError, RuntimeError):
    """The broker cannot be fetched, started or reached; the message says what to do, in one line."""

    exit_code = 8  # skewwatch broker and demo report it as BrokerFailed


class PortBusy(BrokerError):
    """The broker's (or its controller's) port is taken."""

    exit_code = 5  # AddressInUse


class DataDirInUse(BrokerError):
    """Another broker holds the lock on the data directory."""

    exit_code = 6  # DataDirLocked


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEVEL_ERROR = re.compile(r"(^|[\s\[])(ERROR|FATAL|SEVERE)\b")
_EXCEPTION_LINE = re.compile(r"^(Caused by: )?[\w.$]+(Exception|Error)\b")


def last_error_line(output: str) -> str:
    """The line that says what went wrong, without colours: the last one logged at ERROR, else the last
    exception line, else the last line. (Matching any "Error" substring once quoted an INFO line that
    named a setting.)

    >>> last_error_line("[INFO] ok\\n[ERROR] Failed to resolve\\n[INFO] done")
    '[ERROR] Failed to resolve'
    >>> last_error_line("[x] INFO Kafka: errors.tolerance = none\\n[x] ERROR Kafka: disk full\\nstack")
    '[x] ERROR Kafka: disk full'
    """
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    errors = ([line for line in lines if _LEVEL_ERROR.search(line)]
              or [line for line in lines if _EXCEPTION_LINE.match(line)])
    return (errors or lines or ["no output"])[-1][:400]


__all__ = ["BrokerError", "DataDirInUse", "PortBusy", "last_error_line"]
