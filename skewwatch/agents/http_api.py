"""The worker's HTTP API: an aiohttp application on a socket bound before anything starts.

Routes (``[web]`` host and port, 127.0.0.1:6066 by default):

* ``GET /healthz``: liveness. 200 ``{"status": "ok"}`` while the process serves; no token needed.
* ``GET /readyz``: readiness. 200 when the broker answers, both stages have partitions (restored from
  their checkpoints, not merely assigned) and stage 1 is less than ``[health] max_lag_records``
  behind; else 503. The body lists each check.
* ``GET /api/v1/weights``: the latest routing correction published per model this worker owns.
* ``POST /api/v1/update_weights``: publish each model's correction of its latest complete step now,
  with that step's own seq (one already published goes out again unchanged). The body is empty, ``{}``, or
  ``{"models": ["a", "b"]}`` (only those models); anything else is 400. A model is published at most
  once per ``[web] update_interval_s`` (1 s): the others are listed as ``throttled``, and a request
  that published nothing because of that is 429 with ``Retry-After``. While the broker is unreachable,
  or when it has not acknowledged within ``[health] ack_timeout_s`` (1.5 s) of the send, the answer is
  503. A POST that comes while stage 2 restores partitions after a rebalance (or processes a poll) waits
  for it, up to ``BUSY_WAIT_S`` (5 s), then answers 503 saying so, with ``Retry-After``; /readyz is
  503 while a restore runs.
* ``GET /metrics``: Prometheus exposition.

Wrong methods are 405, unknown paths 404. Who may call what is :mod:`skewwatch.web_auth`'s policy (a
bearer token for the POST always, for everything but /healthz beyond loopback). This is a plain
aiohttp server rather than Faust's web view: Faust binds its own ``web_bind`` (0.0.0.0) whatever the
host setting says and serves its own pages (``/``, ``/router/``, ``/table/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any, Protocol

import mode
import msgspec
from aiohttp import web

from skewwatch.agents.stage import StageBusy
from skewwatch.web_auth import AccessPolicy, auth_middleware

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024  # the POST's body is a short list of model names
# How long the POST waits for stage 2's lock: a poll being processed, or a partition being restored after
# a rebalance (its checkpoint and the decisions already on the topics read back: well under a second on a
# healthy broker, seconds on a loaded host). Past it the POST answers 503 and says which, rather than let
# an HTTP client (10 s is a common timeout) time out without an answer.
BUSY_WAIT_S = 5.0


class UpdateWeightsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /api/v1/update_weights``: which models (None: all this worker owns)."""

    models: list[str] | None = None


class WorkerState(Protocol):
    """What the API reads from the running worker (skewwatch.agents.app.PipelineService)."""

    metrics: Any
    stage2: Any

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, the checks) for /readyz."""
        ...

    def broker_problem(self) -> str | None:
        """Why the broker cannot take a write now, or None."""
        ...


class PerModelLimit:
    """At most one pass per model per ``interval_s`` (the POST's publish rate limit).

    >>> limit = PerModelLimit(1.0, clock=iter([0.0, 0.5, 1.2]).__next__)
    >>> [limit.allow("m"), limit.allow("m"), limit.allow("m")]
    [True, False, True]
    """

    def __init__(self, interval_s: float, clock: Any = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}

    def allow(self, model: str) -> bool:
        now = self._clock()
        last = self._last.get(model)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[model] = now
        return True


class WorkerApi:
    """The routes above over a :class:`WorkerState`."""

    def __init__(self, state: WorkerState, policy: AccessPolicy, *, update_interval_s: float = 1.0,
                 ack_timeout_s: float = 1.5, busy_wait_s: float = BUSY_WAIT_S) -> None:
        self.state = state
        self.limit = PerModelLimit(update_interval_s)
        self.ack_timeout_s = ack_timeout_s
        self.busy_wait_s = busy_wait_s
        self.app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[auth_middleware(policy)])
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/api/v1/weights", self.weights)
        self.app.router.add_post("/api/v1/update_weights", self.update_weights)
        self.app.router.add_get("/metrics", self.metrics)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        ready, checks = self.state.readiness()
        return web.json_response({"status": "ready" if ready else "not ready", "checks": checks},
                                 status=200 if ready else 503)

    async def weights(self, request: web.Request) -> web.Response:
        stage = self.state.stage2
        models = {m: c.to_dict() for m, c in (stage.published().items() if stage else [])}
        return web.json_response({"models": models})

    async def metrics(self, request: web.Request) -> web.Response:
        ready, _ = self.state.readiness()  # the rules' "worker not ready" reads what /readyz says
        self.state.metrics.ready.set(1.0 if ready else 0.0)
        # in a thread: with per-replica series the exposition grows with the fleet, and however long
        # it takes must not stall the stages on this loop
        body = await asyncio.to_thread(self.state.metrics.exposition)
        return web.Response(body=body,
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            wanted = msgspec.json.decode(body, type=UpdateWeightsRequest) if body.strip() else UpdateWeightsRequest()
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(400, f'expected an empty body or {{"models": ["name", ...]}}: {exc}')
        if wanted.models is not None and (not wanted.models or not all(wanted.models)):
            return _error(400, '"models" must list at least one non-empty model name')
        stage = self.state.stage2
        if stage is None:
            return _error(503, "the worker is still starting", retry_after=2)
        problem = self.state.broker_problem()
        if problem is not None:  # answered at once: a publish could not be acknowledged anyway
            return _error(503, problem, retry_after=2)
        try:
            update = await stage.force_update(wanted.models, allow=self.limit.allow, wait_s=self.busy_wait_s)
        except StageBusy as exc:  # a restore after a rebalance took longer than the wait: said, not blamed on Kafka
            return _error(503, str(exc), retry_after=2)
        except Exception as exc:  # a refused send
            return _error(503, f"Kafka refused the correction: {exc}", retry_after=2)
        try:  # the acknowledgement's own bound, from the send: the wait for the stage above is not Kafka's
            async with asyncio.timeout(self.ack_timeout_s):
                if update.acks:
                    await asyncio.gather(*(asyncio.shield(ack) for ack in update.acks))
        except TimeoutError:
            return _error(503, f"Kafka did not acknowledge within {self.ack_timeout_s:g} s; retry later", retry_after=2)
        except Exception as exc:  # a refused send
            return _error(503, f"Kafka refused the correction: {exc}", retry_after=2)
        unknown = sorted(set(wanted.models or ()) - update.found)
        answer = {"published": update.published, "throttled": sorted(update.throttled), "unknown": unknown}
        if update.throttled and not update.published:
            return web.json_response(answer, status=429, headers={"Retry-After": f"{self.limit.interval_s:g}"})
        return web.json_response(answer)


def _error(status: int, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    return web.json_response({"error": message}, status=status, headers=headers)


class HttpService(mode.Service):
    """Serves :class:`WorkerApi` on an already bound socket (bound by the command, so a busy port is a
    one-line error before anything else starts)."""

    logger = logging.getLogger("mode.lifecycle")

    def __init__(self, api: WorkerApi, sock: socket.socket, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api = api
        self.sock = sock
        self._runner: web.AppRunner | None = None

    async def on_start(self) -> None:
        self._runner = web.AppRunner(self.api.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, self.sock).start()

    async def on_stop(self) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
        self.sock.close()


__all__ = ["HttpService", "PerModelLimit", "UpdateWeightsRequest", "WorkerApi"]
