"""``skewwatch apply haproxy``: apply routing corrections to HAProxy through its runtime API.

A :class:`~skewwatch.client.CorrectionsSubscriber` follows ``llm.routing-corrections``; for every model
named in the backend map the bridge computes each server's desired weight and state and sends only the
runtime-API commands that change something:

* weights: ``set weight BACKEND/SERVER N`` with N in HAProxy's 0..256 scale, the largest weight of the
  pool at 256 and the others in proportion (a positive weight never rounds down to 0);
* ``drain`` actions: ``set server BACKEND/SERVER state drain`` (no new connections);
  ``isolate``: ``state maint``; when the action expires (its ``expires_at``) or is withdrawn, the
  server goes back to ``state ready``; other actions (tracing, batch policy) are not a balancer's;
* panic mode (``mode: "panic"`` on the correction): every server ``ready``, weights as published;
* fail-static: when the actions would leave no server of a backend ready with a positive weight, every
  server is kept ``ready`` instead (a pool is never routed to nowhere), with a warning; a model whose
  newest correction expired (its ``valid_for_s``) routes equally by default, or keeps its last weights
  (``--on-stale keep``), logged once, see the subscriber.

Every ``--resync-s`` seconds the whole desired state is sent again, so an HAProxy that restarted
(and lost its runtime changes) is corrected within that time.

The backend map (TOML) names the HAProxy backend of each model and, where they differ, the server of
each replica::

    [models."llama-3-8b"]
    backend = "llama"
    servers = { "llama-3-8b-0" = "gpu-a", "llama-3-8b-1" = "gpu-b" }  # optional; default: same name

>>> haproxy_weights({"a": 0.6, "b": 0.3, "c": 0.1, "d": 0.0})
{'a': 256, 'b': 128, 'c': 43, 'd': 0}
>>> haproxy_weights({"a": 0.999, "b": 0.001})  # positive stays positive
{'a': 256, 'b': 1}
>>> plan = desired_servers({"a": 0.5, "b": 0.5}, {"b": "drain"}, panic=False)
>>> plan["b"], plan["a"]
(ServerState(weight=256, state='drain'), ServerState(weight=256, state='ready'))
>>> desired_servers({"a": 0.5, "b": 0.5}, {"a": "isolate", "b": "drain"}, panic=False)["a"].state  # fail-static
'ready'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click

from skewwatch.client.corrections import CorrectionsSubscriber, OnStale
from skewwatch.errors import SkewwatchError
from skewwatch.logs import logging_options, setup_logging

log = logging.getLogger(__name__)

HAPROXY_MAX_WEIGHT = 256  # HAProxy's server weight range is 0..256
ServerStateName = Literal["ready", "drain", "maint"]
ACTION_STATES: dict[str, ServerStateName] = {"drain": "drain", "isolate": "maint"}
_STRONGER = {"ready": 0, "drain": 1, "maint": 2}  # two actions on one server: the stronger one holds


class HAProxyError(SkewwatchError, RuntimeError):
    """The runtime API cannot be reached (HAProxy restarting, or not there); one actionable line.
    The bridge tries again at its next tick, so a retry can help."""

    retriable = True


@dataclass(frozen=True, slots=True)
class ServerState:
    """What one HAProxy server should be: weight (0..256) and administrative state."""

    weight: int
    state: ServerStateName


@dataclass(frozen=True, slots=True)
class BackendMap:
    """model -> HAProxy backend, and replica -> server name within it."""

    backends: dict[str, str]
    servers: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> BackendMap:
        """Read the TOML file; ValueError naming the problem."""
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"backend map {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"backend map {path}: {exc}") from None
        models = data.get("models")
        if not isinstance(models, dict) or not models:
            raise ValueError(f'backend map {path}: no [models."NAME"] table')
        backends: dict[str, str] = {}
        servers: dict[str, dict[str, str]] = {}
        for model, entry in models.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("backend"), str):
                raise ValueError(f'backend map {path}: [models."{model}"] needs backend = "NAME"')
            backends[model] = entry["backend"]
            names = entry.get("servers", {})
            if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
                raise ValueError(f'backend map {path}: [models."{model}"] servers must map replica = "server"')
            servers[model] = dict(names)
        return cls(backends, servers)

    def server(self, model: str, replica: str) -> str:
        """The server name of ``replica`` in the model's backend (the replica id unless mapped)."""
        return self.servers.get(model, {}).get(replica, replica)


def haproxy_weights(weights: Mapping[str, float]) -> dict[str, int]:
    """Correction weights on HAProxy's 0..256 scale: the largest at 256, a positive weight at least 1."""
    top = max(weights.values(), default=0.0)
    if top <= 0:
        return {replica: 0 for replica in weights}
    return {replica: (max(1, round(HAPROXY_MAX_WEIGHT * w / top)) if w > 0 else 0)
            for replica, w in weights.items()}


def desired_servers(weights: Mapping[str, float], actions: Mapping[str, str], panic: bool) -> dict[str, ServerState]:
    """replica -> ServerState for one pool, from its routing weights and ``replica -> action`` in force."""
    scaled = haproxy_weights(weights)
    states: dict[str, ServerStateName] = {replica: "ready" for replica in weights}
    if not panic:
        for replica, action in actions.items():
            state = ACTION_STATES.get(action)
            if state is not None and replica in states and _STRONGER[state] > _STRONGER[states[replica]]:
                states[replica] = state
        if states and not any(states[r] == "ready" and scaled[r] > 0 for r in states):
            log.warning("corrections would leave no server of the pool ready (%s): keeping every server ready",
                        ", ".join(f"{r}={s}" for r, s in sorted(states.items())))
            states = {replica: "ready" for replica in states}
    if not any(scaled.values()):
        scaled = {replica: HAPROXY_MAX_WEIGHT for replica in scaled}
    return {replica: ServerState(scaled[replica], states[replica]) for replica in weights}


class RuntimeAPI:
    """HAProxy's runtime API on a UNIX socket or a TCP ``host:port``: one command per connection."""

    def __init__(self, socket_path: str | None = None, address: str | None = None, timeout: float = 5.0) -> None:
        if (socket_path is None) == (address is None):
            raise ValueError("give exactly one of socket_path and address")
        self.socket_path = socket_path
        self.address = address
        self.timeout = timeout

    @property
    def where(self) -> str:
        return self.socket_path or self.address or ""

    async def command(self, line: str) -> str:
        """Send one command and return HAProxy's answer (empty when it has nothing to say)."""
        try:
            async with asyncio.timeout(self.timeout):
                if self.socket_path is not None:
                    reader, writer = await asyncio.open_unix_connection(self.socket_path)
                else:
                    host, _, port = (self.address or "").rpartition(":")
                    reader, writer = await asyncio.open_connection(host or "127.0.0.1", int(port))
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    answer = await reader.read()
                finally:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
        except (OSError, TimeoutError, ValueError) as exc:
            raise HAProxyError(f"HAProxy runtime API at {self.where} does not answer: {exc or type(exc).__name__}")\
                from exc
        return answer.decode(errors="replace").strip()


class HAProxyBridge:
    """Keeps HAProxy's servers where the corrections say; see the module docstring."""

    def __init__(self, subscriber: CorrectionsSubscriber, api: RuntimeAPI, backend_map: BackendMap,
                 resync_s: float = 30.0, tick_s: float = 1.0) -> None:
        self.subscriber = subscriber
        self.api = api
        self.map = backend_map
        self.resync_s = resync_s
        self.tick_s = tick_s
        self.applied: dict[tuple[str, str], ServerState] = {}  # (backend, server) -> what HAProxy has
        self.commands_sent = 0
        self._unknown_warned: set[tuple[str, str]] = set()

    def desired(self) -> dict[tuple[str, str], ServerState]:
        """(backend, server) -> ServerState for every mapped model the subscriber knows."""
        out: dict[tuple[str, str], ServerState] = {}
        for model, backend in self.map.backends.items():
            weights = self.subscriber.weights(model)
            if not weights:
                continue
            actions: dict[str, str] = {}
            for action in self.subscriber.actions(model):
                if action.action in ACTION_STATES:
                    previous = ACTION_STATES.get(actions.get(action.replica, ""), "ready")
                    if _STRONGER[ACTION_STATES[action.action]] > _STRONGER[previous]:
                        actions[action.replica] = action.action
            panic = self.subscriber.mode(model) == "panic"
            for replica, state in desired_servers(weights, actions, panic).items():
                out[(backend, self.map.server(model, replica))] = state
        return out

    async def apply(self, force: bool = False) -> int:
        """Send the commands that change HAProxy toward :meth:`desired`; the number sent."""
        sent = 0
        for (backend, server), state in sorted(self.desired().items()):
            before = None if force else self.applied.get((backend, server))
            target = f"{backend}/{server}"
            commands = []
            if before is None or before.weight != state.weight:
                commands.append(f"set weight {target} {state.weight}")
            if before is None or before.state != state.state:
                commands.append(f"set server {target} state {state.state}")
            ok = True
            for command in commands:
                answer = await self.api.command(command)
                sent += 1
                if answer:  # HAProxy answers a successful set with nothing
                    ok = False
                    if (backend, server) not in self._unknown_warned:
                        self._unknown_warned.add((backend, server))
                        log.warning("HAProxy refused %r: %s", command, answer.splitlines()[0])
            if ok and commands and self.applied.get((backend, server)) != state:  # a resync alone is quiet
                log.info("haproxy %s: weight %d, %s", target, state.weight, state.state)
            if ok:
                self.applied[(backend, server)] = state
        self.commands_sent += sent
        return sent

    async def run(self) -> None:
        """Apply on every change, every ``tick_s`` (actions expire) and resync every ``resync_s``."""
        changes = self.subscriber.changes()
        await self.subscriber.wait_caught_up()
        await self.apply(force=True)
        last_resync = time.monotonic()
        waiter: asyncio.Task[Any] | None = None
        try:
            while True:
                if waiter is None:
                    waiter = asyncio.ensure_future(changes.__anext__())
                done, _ = await asyncio.wait({waiter}, timeout=self.tick_s)
                if waiter in done:
                    try:
                        waiter.result()
                    except StopAsyncIteration:
                        return
                    waiter = None
                force = time.monotonic() - last_resync >= self.resync_s
                if force:
                    last_resync = time.monotonic()
                try:
                    await self.apply(force=force)
                except HAProxyError as exc:  # HAProxy restarting: try again at the next tick, from scratch
                    log.warning("%s; retrying", exc)
                    self.applied.clear()
        finally:
            if waiter is not None:
                waiter.cancel()
            changes.close()


# --------------------------------------------------------------------------------------------------
# `skewwatch apply ...`


@click.group("apply")
def apply_command() -> None:
    """Apply routing corrections to a load balancer."""


@apply_command.command("haproxy")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), help="HAProxy's runtime API socket.")
@click.option("--admin", metavar="HOST:PORT", help="HAProxy's runtime API on TCP (a `stats socket ipv4@...`).")
@click.option("--backend-map", "backend_map", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help='TOML: [models."MODEL"] backend = "NAME", optional servers = {replica = "server"}.')
@click.option("--on-stale", type=click.Choice(["keep", "equal"]), default="equal", show_default=True,
              help="When a model's newest correction expired: route equally, or keep its last weights.")
@click.option("--stale-after", type=float, default=3.0, show_default=True,
              help="Heartbeats without a correction before a model is stale, for records without valid_for_s.")
@click.option("--heartbeat-s", type=float, default=30.0, show_default=True,
              help="The worker's corrections heartbeat ([detectors.corrections] heartbeat_s).")
@click.option("--resync-s", type=float, default=30.0, show_default=True,
              help="Re-send the whole state this often (an HAProxy that restarted is corrected).")
@click.option("--bootstrap", envvar="KAFKA_BOOTSTRAP", metavar="HOST:PORT", help="Kafka to read from.")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Settings TOML file (topic names, Kafka); default: env SKEWWATCH_CONFIG.")
@logging_options
def haproxy_command(socket_path: str | None, admin: str | None, backend_map: Path, on_stale: OnStale,
                    stale_after: float, heartbeat_s: float, resync_s: float, bootstrap: str | None,
                    config_path: Path | None, loglevel: str, log_format: str) -> None:
    """Follow the routing corrections and apply them to HAProxy (weights, drain/maint, panic = all ready)."""
    from skewwatch.client.command import reader_settings
    from skewwatch.client.corrections import CorrectionsError, CorrectionsTopicMissing
    from skewwatch.errors import ConfigProblem, PeerUnreachable
    from skewwatch.kafka_client import kafka_failure, quiet_client_logs
    from skewwatch.stopping import run_until_stopped

    setup_logging(loglevel, log_format)
    quiet_client_logs()
    if (socket_path is None) == (admin is None):
        raise click.UsageError("give exactly one of --socket PATH and --admin HOST:PORT")
    try:
        mapping = BackendMap.load(backend_map)
    except ValueError as exc:
        raise ConfigProblem(str(exc)) from None
    settings, servers, kwargs = reader_settings(config_path, bootstrap)
    api = RuntimeAPI(socket_path=socket_path, address=admin)

    async def main() -> None:
        try:
            await api.command("show info")  # fail now, in one line, if HAProxy is not there
        except HAProxyError as exc:
            raise PeerUnreachable(f"{exc}; is HAProxy running with `stats socket ... level admin` there?") \
                from None
        subscriber = CorrectionsSubscriber(servers, settings.topics.routing_corrections,
                                           heartbeat_s=heartbeat_s, stale_after=stale_after, on_stale=on_stale,
                                           client_kwargs=kwargs)
        await subscriber.start()
        try:
            await HAProxyBridge(subscriber, api, mapping, resync_s=resync_s).run()
        finally:
            await subscriber.stop()

    try:
        run_until_stopped(main())  # SIGTERM / Ctrl-C: the subscriber closes, exit code 0
    except CorrectionsTopicMissing as exc:
        raise ConfigProblem(str(exc)) from None
    except CorrectionsError as exc:  # Kafka went away under the subscriber
        raise kafka_failure(exc.__cause__ or exc, servers, f"while reading {settings.topics.routing_corrections}") \
            from None


__all__ = ["BackendMap", "HAProxyBridge", "HAProxyError", "RuntimeAPI", "ServerState", "apply_command",
           "desired_servers", "haproxy_weights"]
