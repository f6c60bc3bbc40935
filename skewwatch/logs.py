"""Logging for every command: one handler on stderr, text or JSON, and no floods.

:func:`setup_logging` is what every long-running command calls (through the ``--loglevel`` and
``--log-format`` options of :func:`logging_options`):

* one handler, on stderr; ``--log-format json`` writes one JSON object per line (``ts``, ``level``,
  ``logger``, ``message``, and ``exc`` for a traceback) for log shippers. It is the stdlib's
  :class:`logging.Formatter` with orjson (already a dependency): python-json-logger would add a
  package to format the same five keys;
* no colours or other terminal control codes, ever (the text format is plain);
* a WARNING or ERROR repeated with the same text (numbers aside) is printed once per
  ``interval_s`` (30 s) per logger: the next one after the interval says how many were held back
  (:class:`RateLimitFilter`). A broker outage costs a few lines a minute, not thousands;
* the Kafka client's "Group Coordinator Request failed: GroupCoordinatorNotAvailableError" while
  the broker elects the coordinator of a new group is a normal step of the first start, retried by
  the client: it is logged at INFO, not ERROR (:class:`CoordinatorElectionFilter`);
* likewise the fetcher's "Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError" while
  the partitions of new topics elect their leaders: WARNING, not ERROR (:class:`LeaderElectionFilter`),
  so a first start does not trip ERROR-based alerting;
* the libraries' own INFO lines (aiokafka, Faust, mode, aiohttp) show at ``--loglevel debug`` only.

>>> limiter = RateLimiter(interval_s=30.0, clock=iter([0.0, 1.0, 2.0, 31.0]).__next__)
>>> [limiter.hit("broker down") for _ in range(4)]
[0, None, None, 2]
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click
import orjson

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# the libraries whose INFO lines are theirs to read, not the operator's
LIBRARY_LOGGERS = ("aiokafka", "faust", "mode", "aiohttp", "kafka")
REPEAT_INTERVAL_S = 30.0

F = TypeVar("F", bound=Callable[..., Any])
_NUMBERS = re.compile(r"\d+")


class RateLimiter:
    """At most one pass per key per ``interval_s``; :meth:`hit` says how many were held back since.

    ``hit(key)`` returns ``None`` when the caller should stay quiet, else the number of hits held
    back since the last pass (0 the first time).
    """

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 1024) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._last: dict[Any, float] = {}
        self._held: dict[Any, int] = {}

    def hit(self, key: Any) -> int | None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if len(self._last) >= self._max_keys and key not in self._last:
            oldest = min(self._last, key=self._last.__getitem__)  # bounded memory under many distinct errors
            self._last.pop(oldest)
            self._held.pop(oldest, None)
        self._last[key] = now
        return self._held.pop(key, 0)

    def held(self, key: Any) -> int:
        """Hits held back for ``key`` since its last pass."""
        return self._held.get(key, 0)


class RateLimitFilter(logging.Filter):
    """Pass a WARNING+ record once per ``interval_s`` per logger and text (digits masked); the next
    pass after held-back repeats ends with ``(N more like this in the last 30 s)``."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S, min_level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.limiter = RateLimiter(interval_s, clock)
        self.min_level = min_level

    def filter(self, record: logging.LogRecord) -> bool:
        # a record flagged ``rate_limited`` was limited by its producer (a summary with counts)
        if record.levelno < self.min_level or getattr(record, "rate_limited", False):
            return True
        message = record.getMessage()
        held = self.limiter.hit((record.name, record.levelno, _NUMBERS.sub("#", message)))
        if held is None:
            return False
        if held:
            record.msg = f"{message} ({held} more like this in the last {self.limiter.interval_s:g} s)"
            record.args = None
        return True


class RetriedErrorFilter(logging.Filter):
    """Rewrite an ERROR of the Kafka client that the client itself retries to a lower ``level``.

    A record is rewritten when its format string starts with one of ``PREFIXES`` and its text names one
    of ``NORMAL``; anything else (a refused connection, an unknown error) stays ERROR.
    """

    LOGGER = ""
    PREFIXES: tuple[str, ...] = ()
    NORMAL: tuple[str, ...] = ()
    LEVEL = logging.INFO

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno >= logging.ERROR and str(record.msg).startswith(self.PREFIXES)
                and any(name in record.getMessage() for name in self.NORMAL)):
            record.levelno, record.levelname = self.LEVEL, logging.getLevelName(self.LEVEL)
            # the logger's own level was checked before the filter: re-check it for the new level
            return logging.getLogger(record.name).isEnabledFor(self.LEVEL)
        return True


class CoordinatorElectionFilter(RetriedErrorFilter):
    """The coordinator of a new consumer group is being elected: INFO, not ERROR (the client retries)."""

    LOGGER = "aiokafka.consumer.group_coordinator"
    PREFIXES = ("Group Coordinator Request failed",)
    NORMAL = ("GroupCoordinatorNotAvailableError", "NotCoordinatorForGroupError", "CoordinatorLoadInProgress")
    LEVEL = logging.INFO


class LeaderElectionFilter(RetriedErrorFilter):
    """A new topic's partition leaders are still being elected: WARNING, not ERROR.

    On a first start the fetcher asks for offsets before the broker has a leader for every new
    partition and logs "Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError" at ERROR;
    it refreshes its metadata and retries, so this is not an error for ERROR-based alerting. WARNING
    (not INFO) keeps a leader that never comes visible, once per 30 s through :class:`RateLimitFilter`.
    """

    LOGGER = "aiokafka.consumer.fetcher"
    PREFIXES = ("Failed fetch offsets from", "Failed fetch messages from")
    NORMAL = ("NotLeaderForPartitionError", "LeaderNotAvailableError")
    LEVEL = logging.WARNING


# each filter on the logger whose records it rewrites (a logger's filters see only its own records)
RETRIED_ERROR_FILTERS: tuple[type[RetriedErrorFilter], ...] = (CoordinatorElectionFilter, LeaderElectionFilter)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``[, ``exc``]."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def setup_logging(level: str = "info", fmt: str = "text", stream: IO[str] | None = None,
                  interval_s: float = REPEAT_INTERVAL_S) -> logging.Handler:
    """Configure the root logger once for a command: one stderr handler, the filters above."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RateLimitFilter(interval_s))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))
    for kind in RETRIED_ERROR_FILTERS:
        client_logger = logging.getLogger(kind.LOGGER)
        if not any(isinstance(f, kind) for f in client_logger.filters):
            client_logger.addFilter(kind())
    logging.captureWarnings(True)  # "Unclosed ..." ResourceWarnings go through the same handler
    return handler


def quiet_libraries(level: str = "info") -> None:
    """For one-shot commands: the Kafka client's own lines only at ``--loglevel debug``; the command's
    one-line error says what went wrong."""
    if level.lower() != "debug":
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def skewwatch_version() -> str:
    """The installed package's version, for start lines."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("skewwatch")
    except PackageNotFoundError:
        return "unknown"


def logging_options(command: F) -> F:
    """``--loglevel`` and ``--log-format`` (env SKEWWATCH_LOG_FORMAT) for a long-running command."""
    command = click.option("--log-format", "log_format", type=click.Choice(FORMATS), default="text",
                           show_default=True, envvar="SKEWWATCH_LOG_FORMAT",
                           help="text, or json: one object per line for log shippers.")(command)
    command = click.option("--loglevel", type=click.Choice(LEVELS), default="info", show_default=True,
                           help="Least severe level logged (libraries' INFO lines need debug).")(command)
    return command


__all__ = [
    "CoordinatorElectionFilter",
    "JsonFormatter",
    "LeaderElectionFilter",
    "RateLimitFilter",
    "RateLimiter",
    "RetriedErrorFilter",
    "logging_options",
    "quiet_libraries",
    "setup_logging",
    "skewwatch_version",
]
