"""How every Kafka client connects: the ``[kafka]`` section's security settings as aiokafka options.

One place turns ``[kafka]`` into the keyword arguments of every aiokafka client skewwatch makes
(worker, OTLP receiver, bridges, GPU collector, generator, simulator, producer helper, topic
admin): :func:`client_options`. The protocols are Kafka's own names:

* ``security_protocol``: ``PLAINTEXT`` (the default: a loopback broker), ``SSL`` (TLS, and mTLS
  with ``ssl_certfile``/``ssl_keyfile``), ``SASL_PLAINTEXT`` or ``SASL_SSL``;
* ``sasl_mechanism``: ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``, with ``sasl_username``;
* the password is never a setting: it is read from the file ``sasl_password_file`` or from the
  environment variable named by ``sasl_password_env`` (``SKEWWATCH_KAFKA_PASSWORD``), each time a
  client is made, and never logged (options are not logged; :class:`Secret` prints as ``***``);
* TLS: ``ssl_cafile`` (else the system's CAs), hostname verification on unless
  ``ssl_check_hostname = false``, built with aiokafka's ``create_ssl_context``.

A broker that refuses the connection is diagnosed in one line naming the listener and the mechanism
(:func:`connection_problem`, for :func:`skewwatch.kafka_client.check_connection`): a wrong password,
an untrusted certificate or a protocol that does not match the listener is
:class:`~skewwatch.errors.KafkaRefused` (exit code 4, retrying will not help);
nothing answering is :class:`~skewwatch.errors.KafkaUnreachable` (3).

>>> from skewwatch.config import KafkaSettings
>>> client_options(KafkaSettings())
{'security_protocol': 'PLAINTEXT'}
>>> kafka = KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
...                       sasl_username="worker", sasl_password_env="EXAMPLE_PASSWORD")
>>> options = client_options(kafka, env={"EXAMPLE_PASSWORD": "s3cret"})
>>> options["sasl_mechanism"], options["sasl_plain_username"], options["sasl_plain_password"] == "s3cret"
('SCRAM-SHA-256', 'worker', True)
>>> describe_listener("broker-1:9094", kafka)
'broker-1:9094 (SASL_PLAINTEXT, SCRAM-SHA-256 as worker)'
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skewwatch.config_section import ConfigError
from skewwatch.errors import CommandError, KafkaRefused, KafkaUnreachable

if TYPE_CHECKING:
    from skewwatch.config import KafkaSettings

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class Secret(str):
    """A string that never shows itself in a repr (so a logged dict of options hides it).

    >>> Secret("hunter2")
    Secret('***')
    >>> Secret("hunter2") == "hunter2"
    True
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret('***')"


def uses_tls(kafka: KafkaSettings) -> bool:
    return kafka.security_protocol in ("SSL", "SASL_SSL")


def uses_sasl(kafka: KafkaSettings) -> bool:
    return kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def read_secret_file(path: str, what: str) -> Secret:
    """The first line of ``path`` (a trailing newline is not part of a secret); ConfigError if unusable."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise ConfigError(f"{what}: {path} is empty")
    return Secret(secret)


def check_security(kafka: KafkaSettings, env: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError (one line naming the setting) unless the security settings can be used."""
    env = os.environ if env is None else env
    if kafka.security_protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"kafka.security_protocol: expected one of {', '.join(SECURITY_PROTOCOLS)}, "
                          f"got {kafka.security_protocol!r}")
    if uses_sasl(kafka):
        if kafka.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka.sasl_mechanism: expected one of {', '.join(SASL_MECHANISMS)}, "
                              f"got {kafka.sasl_mechanism!r}")
        if not kafka.sasl_username:
            raise ConfigError(f"kafka.sasl_username: required with security_protocol {kafka.security_protocol}")
        _sasl_password(kafka, env)
    elif kafka.sasl_username or kafka.sasl_password_file:
        raise ConfigError(f"kafka.sasl_username / sasl_password_file are set but security_protocol is "
                          f"{kafka.security_protocol}: use SASL_SSL (or SASL_PLAINTEXT) to log in")
    tls_files = {"ssl_cafile": kafka.ssl_cafile, "ssl_certfile": kafka.ssl_certfile,
                 "ssl_keyfile": kafka.ssl_keyfile, "ssl_key_password_file": kafka.ssl_key_password_file}
    if not uses_tls(kafka):
        given = [name for name, value in tls_files.items() if value]
        if given:
            raise ConfigError(f"kafka.{given[0]} is set but security_protocol is {kafka.security_protocol}: "
                              "use SSL or SASL_SSL for TLS")
        return
    for name, value in tls_files.items():
        if value and not Path(value).expanduser().is_file():
            raise ConfigError(f"kafka.{name}: {value} is not a readable file")
    if kafka.ssl_keyfile and not kafka.ssl_certfile:
        raise ConfigError("kafka.ssl_keyfile is set without kafka.ssl_certfile (the client certificate)")
    _ssl_context_for(kafka)  # a certificate that does not load is a setting problem too


def _sasl_password(kafka: KafkaSettings, env: Mapping[str, str]) -> Secret:
    if kafka.sasl_password_file:
        return read_secret_file(kafka.sasl_password_file, "kafka.sasl_password_file")
    value = env.get(kafka.sasl_password_env, "")
    if not value:
        raise ConfigError(f"kafka.sasl_username is {kafka.sasl_username!r} but there is no password: put it in "
                          f"a file named by kafka.sasl_password_file, or in ${kafka.sasl_password_env}")
    return Secret(value)


def _ssl_context_for(kafka: KafkaSettings) -> ssl.SSLContext:
    key_password = (read_secret_file(kafka.ssl_key_password_file, "kafka.ssl_key_password_file")
                    if kafka.ssl_key_password_file else None)
    return _ssl_context(kafka.ssl_cafile, kafka.ssl_certfile, kafka.ssl_keyfile, key_password,
                        kafka.ssl_check_hostname)


@functools.lru_cache(maxsize=8)
def _ssl_context(cafile: str | None, certfile: str | None, keyfile: str | None, key_password: str | None,
                 check_hostname: bool) -> ssl.SSLContext:
    from aiokafka.helpers import create_ssl_context

    try:
        context = create_ssl_context(cafile=cafile, certfile=certfile, keyfile=keyfile, password=key_password)
    except (OSError, ssl.SSLError) as exc:
        which = "kafka.ssl_cafile" if cafile and "cert" not in str(exc).lower() else "kafka.ssl_certfile/ssl_keyfile"
        raise ConfigError(f"{which}: cannot load ({describe_tls_error(exc)})") from None
    # hostname verification stays on unless the operator turns it off (a broker certificate must name
    # the host clients dial: its advertised listener)
    context.check_hostname = check_hostname
    return context


def client_options(kafka: KafkaSettings, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The security keyword arguments for any aiokafka client (producer, consumer, admin, connection)."""
    env = os.environ if env is None else env
    options: dict[str, Any] = {"security_protocol": kafka.security_protocol}
    if kafka.security_protocol not in SECURITY_PROTOCOLS:
        check_security(kafka, env)  # raises the one-line ConfigError
    if uses_tls(kafka):
        options["ssl_context"] = _ssl_context_for(kafka)
    if uses_sasl(kafka):
        options["sasl_mechanism"] = kafka.sasl_mechanism
        options["sasl_plain_username"] = kafka.sasl_username
        options["sasl_plain_password"] = _sasl_password(kafka, env)
    return options


def describe_listener(bootstrap: str, kafka: KafkaSettings) -> str:
    """``host:port (PROTOCOL[, MECHANISM as user])``: what a message about a connection names."""
    detail: str = kafka.security_protocol
    if uses_sasl(kafka):
        detail += f", {kafka.sasl_mechanism} as {kafka.sasl_username}"
    elif uses_tls(kafka) and kafka.ssl_certfile:
        detail += ", client certificate"
    return f"{bootstrap} ({detail})"


def describe_tls_error(exc: BaseException) -> str:
    """An ssl error's own words without the library's tuple decoration.

    >>> describe_tls_error(ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
    ...                                                 "verify failed: self-signed certificate (_ssl.c:1006)"))
    'certificate verify failed: self-signed certificate'
    """
    text = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or ""
    message = str(exc.args[1]) if len(exc.args) > 1 and isinstance(exc.args[1], str) else str(exc)
    if "] " in message:
        message = message.split("] ", 1)[1]
    message = message.split(" (_ssl.c")[0].strip()
    if isinstance(exc, ssl.SSLCertVerificationError) and text and text not in message:
        message = f"certificate verify failed: {text}"
    return message or str(text) or type(exc).__name__


def bootstrap_hosts(bootstrap: str) -> list[tuple[str, int]]:
    """``(host, port)`` of each server in ``host:port[,host:port]``; ConfigError for anything else.

    >>> bootstrap_hosts("kafka-1:9092,[::1]:9093")
    [('kafka-1', 9092), ('::1', 9093)]
    """
    hosts = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"kafka.bootstrap: expected host:port[,host:port], got {bootstrap!r}")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def connection_problem(exc: BaseException, bootstrap: str, kafka: KafkaSettings) -> CommandError:
    """The one-line error for a failed connection to one bootstrap server."""
    from aiokafka import errors as kafka_errors

    where = describe_listener(bootstrap, kafka)
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = ("is kafka.ssl_cafile the CA that signed the broker's certificate?" if
                "hostname" not in str(exc).lower() and "IP address" not in str(exc) else
                "the certificate must name the host in kafka.bootstrap (or ssl_check_hostname = false)")
        return KafkaRefused(f"Kafka at {where}: the broker's certificate is not trusted: "
                            f"{describe_tls_error(exc)}; {hint}")
    if isinstance(exc, ssl.SSLError):
        return KafkaRefused(f"Kafka at {where}: the TLS handshake failed: {describe_tls_error(exc)}; does the "
                            "listener speak TLS, and does it require a client certificate (kafka.ssl_certfile)?")
    if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError | kafka_errors.IllegalSaslStateError):
        return KafkaRefused(f"Kafka at {where} does not offer SASL mechanism {kafka.sasl_mechanism}: {exc}")
    if isinstance(exc, kafka_errors.SaslAuthenticationFailed | kafka_errors.AuthenticationFailedError):
        message = " ".join(str(exc).split()) or "authentication failed"
        return KafkaRefused(f"Kafka at {where} refused the login: {message} (wrong password, or no such user "
                            f"for {kafka.sasl_mechanism}?)")
    if isinstance(exc, ConnectionRefusedError | socket.gaierror | TimeoutError | asyncio.TimeoutError):
        detail = "connection refused" if isinstance(exc, ConnectionRefusedError) else (
            "no answer" if isinstance(exc, TimeoutError | asyncio.TimeoutError) else f"cannot resolve: {exc}")
        return KafkaUnreachable(f"no Kafka answers at {bootstrap}: {detail}; start one with `skewwatch broker` "
                                "or point --bootstrap / KAFKA_BOOTSTRAP at a running cluster")
    if isinstance(exc, kafka_errors.KafkaConnectionError | ConnectionError | kafka_errors.KafkaError):
        # the TCP connection opened, then the broker hung up during the first request: a TLS listener
        # dialled without TLS, a client certificate missing, or SASL expected
        return KafkaRefused(f"Kafka at {where} closed the connection during the first request: does "
                            f"security_protocol {kafka.security_protocol} match the listener (TLS? SASL? "
                            f"client certificate?) ({type(exc).__name__})")
    if isinstance(exc, OSError):
        return KafkaUnreachable(f"no Kafka answers at {bootstrap}: {exc.strerror or exc}")
    return KafkaUnreachable(f"no Kafka answers at {bootstrap}: {type(exc).__name__}: {exc}")


__all__ = [
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "Secret",
    "bootstrap_hosts",
    "check_security",
    "client_options",
    "connection_problem",
    "describe_listener",
    "describe_tls_error",
    "read_secret_file",
    "uses_sasl",
    "uses_tls",
]
