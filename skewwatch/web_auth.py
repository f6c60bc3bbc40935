"""Who may call the HTTP services (the worker's API, the OTLP receiver): bind address and bearer token.

The rules (docs/security.md):

* A service binds where it is told, ``127.0.0.1`` by default.
* A bearer token (``Authorization: Bearer <token>``) comes from a file (``token_file``) or an
  environment variable (``token_env``), is read once at start and never logged.
* A request that changes something (any method but GET/HEAD/OPTIONS) needs the token. The worker's
  ``POST /api/v1/update_weights`` needs it even on loopback: without a configured token it answers
  401 saying how to set one. The OTLP receiver's ingest (``POST /v1/traces``) is open on loopback
  while no token is configured, like the Kafka topic it writes to.
* Bound beyond loopback, every request except ``GET /healthz`` needs the token, and a service with
  no token refuses to start (exit code 2) unless ``--insecure-no-auth`` says otherwise.
* Unknown paths and wrong methods keep their 404 and 405.

>>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
(True, True, True, False)
>>> load_token(None, "EXAMPLE_TOKEN", "web", env={"EXAMPLE_TOKEN": "t0k3n"})
Secret('***')
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from aiohttp import web

from skewwatch.config import ConfigError
from skewwatch.errors import ConfigProblem
from skewwatch.kafka_security import Secret, read_secret_file

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_PATHS = frozenset({"/healthz"})  # liveness: probes from anywhere, nothing in it to protect

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, "localhost")."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def load_token(token_file: str | None, token_env: str, section: str,
               env: Mapping[str, str] | None = None) -> Secret | None:
    """The bearer token from ``token_file``, else from ``$token_env``; None when neither gives one."""
    env = os.environ if env is None else env
    if token_file:
        try:
            return read_secret_file(token_file, f"{section}.token_file")
        except ConfigError as exc:
            raise ConfigProblem(str(exc)) from None
    value = env.get(token_env, "").strip()
    return Secret(value) if value else None


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """What a service requires: its token (if any), whether it is reachable beyond loopback, and whether
    a write is allowed without a token while none is configured (the receiver's ingest on loopback)."""

    token: Secret | None
    beyond_loopback: bool
    open_writes_without_token: bool = False
    token_hint: str = "set a token"  # how to configure one, for the 401 answer

    def describe(self) -> str:
        """For the start line: what protects the service (never the token itself)."""
        if self.token is not None:
            return "bearer token required" + ("" if self.beyond_loopback else " for changes")
        if self.beyond_loopback:
            return "NO AUTHENTICATION (--insecure-no-auth)"
        return "loopback only, " + ("no token" if self.open_writes_without_token else "changes disabled (no token)")


def check_bind(host: str, token: Secret | None, insecure_no_auth: bool, what: str, token_hint: str) -> None:
    """Refuse (exit 2, one line) to listen beyond loopback without a token, unless told to."""
    if token is None and not is_loopback(host) and not insecure_no_auth:
        raise ConfigProblem(f"{what} would listen on {host}, beyond loopback, without a token: {token_hint}, "
                            "or pass --insecure-no-auth to run it open")


def _deny(reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=401,
                             headers={"WWW-Authenticate": 'Bearer realm="skewwatch"'})


def bearer_matches(request: web.Request, token: Secret) -> bool:
    """Constant-time comparison of the request's bearer token with ours."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def auth_middleware(policy: AccessPolicy, public_paths: Collection[str] = PUBLIC_PATHS) -> Callable[..., Awaitable[
        web.StreamResponse]]:
    """The aiohttp middleware enforcing ``policy``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.http_exception is not None:  # unknown path or wrong method: 404 / 405 as is
            return await handler(request)
        writes = request.method not in SAFE_METHODS
        if request.path in public_paths and not writes:
            return await handler(request)
        needs_token = writes or policy.beyond_loopback
        if not needs_token:
            return await handler(request)
        if policy.token is None:
            if policy.beyond_loopback or (writes and policy.open_writes_without_token):
                return await handler(request)  # --insecure-no-auth, or ingest on loopback
            return _deny(f"this endpoint needs a bearer token and none is configured: {policy.token_hint}")
        if not bearer_matches(request, policy.token):
            return _deny("missing or wrong bearer token (Authorization: Bearer <token>)")
        return await handler(request)

    return middleware


__all__ = ["AccessPolicy", "PUBLIC_PATHS", "auth_middleware", "bearer_matches", "check_bind", "is_loopback",
           "load_token"]
