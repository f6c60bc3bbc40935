"""Waiting for the broker's acknowledgements off the hot path, in order per input partition.

A stage closes a step in three moves: it *sends* the step's outputs (features, hand-off records,
alerts, corrections), then, once the broker has acknowledged every one of them, it writes the
checkpoint of the state that produced them, and once that is acknowledged it may commit the input
offset. The order is what makes a restart lose nothing: a checkpoint never covers an output that
was not stored. Waiting for it inline costs one or more broker round trips (``linger_ms`` plus
``acks=all``) per partition and step during which the stage reads nothing, so the broker's
latency, not the work, would set the stage's pace (bench/README.md, "Costs the code was shaped by").

:class:`OrderedAcks` keeps the order without the wait: the stage sends its outputs at once
(the producer's futures are created then), encodes the checkpoint, and hands the rest
("wait for these futures, then write the checkpoint, then mark the offset") to a background
task chained after the previous one of the same partition. Bounded: at most ``max_pending``
chains per partition are in flight; the next one waits for the oldest (back-pressure when the
broker is slow). A failure (a send or a checkpoint write refused) stops the partition's later
jobs (a later checkpoint must not cover the lost outputs) and is raised by the next
:meth:`~OrderedAcks.raise_failure`, so the stage restarts from its last checkpoint as it did when
it waited inline. :meth:`~OrderedAcks.drain` waits for everything of some partitions (revocation,
shutdown).

>>> import asyncio
>>> async def demo() -> list[str]:
...     done: list[str] = []
...     acks = OrderedAcks[int](max_pending=2)
...     async def job(name: str, delay: float) -> None:
...         await asyncio.sleep(delay)
...         done.append(name)
...     await acks.submit(0, lambda: job("first", 0.02))
...     await acks.submit(0, lambda: job("second", 0.0))  # runs after "first", though quicker
...     await acks.drain()
...     return done
>>> asyncio.run(demo())
['first', 'second']
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

from skewwatch.errors import SkewwatchError

K = TypeVar("K", bound=Hashable)


class ChainBroken(SkewwatchError, RuntimeError):
    """A job was skipped because an earlier job of the same partition failed."""


class OrderedAcks(Generic[K]):
    """Per-key chains of background jobs, each started after the previous one of its key ended.

    ``max_pending``: jobs in flight per key before :meth:`submit` waits for the oldest.
    """

    def __init__(self, max_pending: int = 4) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be ≥ 1, got {max_pending}")
        self.max_pending = max_pending
        self._chains: dict[K, deque[asyncio.Task[None]]] = {}
        self._failure: BaseException | None = None

    def __len__(self) -> int:
        """Jobs in flight, all keys together."""
        return sum(len(chain) for chain in self._chains.values())

    async def submit(self, key: K, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job()`` once every earlier job of ``key`` has ended (not before: it is only called
        then). Waits while ``key`` already has ``max_pending`` jobs in flight; raises the failure of
        an earlier job, of any key, if there was one."""
        self.raise_failure()
        chain = self._chains.setdefault(key, deque())
        self._prune(chain)
        while len(chain) >= self.max_pending:
            await asyncio.wait([chain[0]])
            self._prune(chain)
            self.raise_failure()
        previous = chain[-1] if chain else None
        task = asyncio.ensure_future(self._run(previous, job))
        task.add_done_callback(self._record)
        chain.append(task)

    async def drain(self, keys: Iterable[K] | None = None) -> None:
        """Wait until the jobs of ``keys`` (None: every key) have ended; then raise a failure if any."""
        for key in list(self._chains) if keys is None else list(keys):
            chain = self._chains.get(key)
            if chain:
                await asyncio.wait(list(chain))
                self._prune(chain)
            if not chain:
                self._chains.pop(key, None)
        self.raise_failure()

    def cancel(self) -> None:
        """Drop every job in flight (the stage is going away after a failure; its checkpoint stands)."""
        for chain in self._chains.values():
            for task in chain:
                task.cancel()
        self._chains.clear()

    def raise_failure(self) -> None:
        """Raise the first failure of a job, once (later calls go on unless another job fails)."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    @staticmethod
    async def _run(previous: asyncio.Task[None] | None, job: Callable[[], Awaitable[None]]) -> None:
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None:
                raise ChainBroken("an earlier job of this partition failed; this one was not run")
        await job()

    def _record(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        failure = task.exception()
        if failure is not None and self._failure is None and not isinstance(failure, ChainBroken):
            self._failure = failure

    @staticmethod
    def _prune(chain: deque[asyncio.Task[None]]) -> None:
        while chain and chain[0].done():
            chain.popleft()
