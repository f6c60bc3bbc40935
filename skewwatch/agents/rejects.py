"""One log line, at most every 30 s per stage, about the input a stage rejected, with the counts by reason.

Every rejected input goes to the dead-letter topic and is counted in ``skewwatch_rejected_total``, but
an operator reading the worker's log saw nothing of it. :class:`RejectLog` logs the first rejection at
once and then at most one line per ``interval_s`` with what was rejected since (the counts by reason),
so a flood of bad input costs two lines a minute, and points at ``skewwatch tail dead-letter``.

>>> rejects = RejectLog("stage1", "llm.dead-letter")
>>> rejects.summary({"too_large": 1, "missing_field": 3}, 4).split(", each")[0]
'stage1: 4 inputs rejected (missing_field 3, too_large 1)'
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from skewwatch.logs import REPEAT_INTERVAL_S
from skewwatch.schemas.rejection import Rejection

log = logging.getLogger("skewwatch.worker.rejects")


class RejectLog:
    """Counts rejections by reason; :meth:`flush_due` logs them at most once per ``interval_s``."""

    def __init__(self, stage: str, dead_letter_topic: str, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage = stage
        self.topic = dead_letter_topic
        self.interval_s = interval_s
        self._clock = clock
        self._pending: Counter[str] = Counter()
        self._last: float | None = None  # when the last line was logged

    def add(self, rejects: Iterable[Rejection]) -> None:
        """Count one rejected message's rejections; the first of a quiet spell is logged at once."""
        self._pending.update(reject.reason_code for reject in rejects)
        self.flush_due()

    def flush_due(self) -> None:
        """Log what is pending when the last line is at least ``interval_s`` old (called every poll)."""
        if not self._pending:
            return
        now = self._clock()
        if self._last is None or now - self._last >= self.interval_s:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Log what is pending now (a stage that stops says what it rejected last)."""
        if self._pending:
            total = sum(self._pending.values())
            # rate-limited here already: the log handler's own limiter must not hold the line back
            log.warning("%s", self.summary(self._pending, total), extra={"rate_limited": True})
            self._pending.clear()
            self._last = self._clock() if now is None else now

    def summary(self, counts: dict[str, int], total: int) -> str:
        reasons = ", ".join(f"{code} {n}" for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{self.stage}: {total} inputs rejected ({reasons}), each on {self.topic} with its bytes and "
                "reason: see `skewwatch tail dead-letter`")


__all__ = ["RejectLog"]
