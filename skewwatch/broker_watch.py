"""Is the Kafka cluster reachable right now? A probe every few seconds, and its transitions logged once.

The services (worker, OTLP receiver) must tell the truth on ``/readyz`` and answer a POST that
needs the broker with 503 at once while it is gone, instead of hanging. Their producers and
consumers reconnect by themselves and say nothing useful about the cluster as a whole, so
:class:`BrokerWatch` asks: every ``interval_s`` it sends a metadata request through a client of its
own (same TLS/SASL options as every client, :mod:`skewwatch.kafka_security`) and gives it
``timeout_s`` to answer. The first failure marks the cluster unreachable (so ``/readyz`` fails
within ``interval_s + timeout_s``, 5 s by default); the first success after that marks it
reachable again.

Each transition is logged once: "Kafka at X is unreachable: <why>" (WARNING) and "Kafka at X is
reachable again after N s" (INFO). Until the first success the watch retries with exponential
back-off (``interval_s`` up to 10 s) and reports why on :attr:`BrokerWatch.last_error`; a refusal
(wrong password, untrusted certificate) is diagnosed in one line by
:func:`~skewwatch.kafka_client.check_connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from skewwatch.config import KafkaSettings
from skewwatch.errors import CommandError, KafkaRefused
from skewwatch.kafka_client import check_connection, client_kwargs
from skewwatch.kafka_security import describe_listener

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 10.0


class BrokerWatch:
    """Probe ``bootstrap`` until :meth:`stop`; read :attr:`reachable`, :attr:`last_error`, :meth:`down_for`."""

    def __init__(self, bootstrap: str, kafka: KafkaSettings, *, interval_s: float = 2.0, timeout_s: float = 3.0,
                 client_id: str = "skewwatch-probe") -> None:
        self.bootstrap = bootstrap
        self.kafka = kafka
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.client_id = client_id
        self.reachable = False
        self.ever_reached = False
        self.refused: KafkaRefused | None = None  # the broker refused our credentials or TLS
        self.last_error: str | None = "no answer yet"
        self._changed_at = time.monotonic()
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._client: Any = None

    def down_for(self) -> float:
        """Seconds since the cluster was last seen reachable (0 while it is)."""
        return 0.0 if self.reachable else time.monotonic() - self._changed_at

    def describe(self) -> str:
        return describe_listener(self.bootstrap, self.kafka)

    async def wait_reachable(self) -> None:
        """Return once a probe succeeded (at once if the last one did)."""
        while not self.reachable:
            self._changed.clear()
            await self._changed.wait()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Probe until :meth:`stop`."""
        backoff = self.interval_s
        try:
            while not self._stopping.is_set():
                ok, reason = await self._probe()
                self._note(ok, reason)
                # once up, probe at the interval (to notice an outage in time); before, back off
                backoff = self.interval_s if ok or self.ever_reached else min(backoff * 2, MAX_BACKOFF_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
        finally:
            await self._close_client()

    async def _probe(self) -> tuple[bool, str | None]:
        from aiokafka import AIOKafkaClient

        try:
            async with asyncio.timeout(self.timeout_s):
                if self._client is None:
                    client = AIOKafkaClient(**client_kwargs(self.kafka, bootstrap=self.bootstrap),
                                            client_id=self.client_id,
                                            request_timeout_ms=int(self.timeout_s * 1000))
                    try:
                        await client.bootstrap()
                    except BaseException:
                        await client.close()
                        raise
                    self._client = client
                await self._client.fetch_all_metadata()
            return True, None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return False, await self._diagnose(exc)

    async def _diagnose(self, exc: BaseException) -> str:
        # the client's own error ("Unable to bootstrap") hides the cause: one direct connection says it
        try:
            await check_connection(self.bootstrap, self.kafka, timeout=self.timeout_s)
        except KafkaRefused as refused:
            self.refused = refused
            return refused.message
        except CommandError as problem:
            return problem.message
        except Exception as other:  # noqa: BLE001 - a diagnosis must not take the watch down
            return f"{type(other).__name__}: {other}"
        return f"no answer to a metadata request within {self.timeout_s:g} s ({type(exc).__name__})"

    def _note(self, ok: bool, reason: str | None) -> None:
        if ok == self.reachable and (ok or reason == self.last_error):
            return
        was_reachable, self.reachable = self.reachable, ok
        now = time.monotonic()
        if ok:
            self.refused = None
            if self.ever_reached:
                log.info("Kafka at %s is reachable again after %.0f s", self.describe(), now - self._changed_at)
            self.ever_reached = True
            self.last_error = None
            self._changed_at = now
        else:
            if was_reachable:
                self._changed_at = now
                log.warning("Kafka at %s is unreachable: %s", self.describe(), reason)
            elif reason != self.last_error:
                log.warning("waiting for Kafka at %s: %s", self.describe(), reason)
            self.last_error = reason
        self._changed.set()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()


__all__ = ["BrokerWatch"]
