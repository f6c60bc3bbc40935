"""The expected failures of skewwatch's commands: one line each, with a documented exit code.

Every command reports what it expected could go wrong (a bad setting, a busy port, a Kafka that
does not answer or refuses the credentials, a broker data directory in use, nothing sent) as ONE
line on stderr, ``Error: <what happened>; <what to do>``, and exits with the code of its class.
A traceback means a bug. The classes are :class:`click.ClickException` subclasses, so click prints
them and exits with :attr:`exit_code`; code outside a click command can raise them too.

==== ============================ ====================================================================
code class                         when
==== ============================ ====================================================================
0                                  success (also Ctrl-C / SIGTERM on a long-running command)
1    (none: a bug)                 an unexpected exception; the traceback is worth a bug report
2    :class:`ConfigProblem`        a setting or option cannot be used (click's usage errors are 2 too)
3    :class:`PeerUnreachable`      nothing answers where a command must connect as it starts: Kafka for a
                                   one-shot command or a bridge (:class:`KafkaUnreachable`), HAProxy's
                                   runtime API for ``apply haproxy``; or Kafka went away during a run
4    :class:`KafkaRefused`         Kafka answered but refused the connection: TLS or SASL failed
5    :class:`AddressInUse`         the port to listen on is taken
6    :class:`DataDirLocked`        the broker's data directory is locked by another broker
7    :class:`NothingSent`          a bounded run (``scrape --rounds``) ended with nothing delivered
8    :class:`BrokerFailed`         the embedded broker could not be fetched or started, or it stopped
9    :class:`ChildFailed`          a process the command started (``demo``'s worker or generator) exited
==== ============================ ====================================================================

>>> KafkaUnreachable("no Kafka answers at 127.0.0.1:9").exit_code
3
>>> sorted({cls.exit_code for cls in SkewwatchError.__subclasses__()})
[2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import errno

import click


class SkewwatchError(click.ClickException):
    """Base of skewwatch's expected failures: a one-line message and the exit code of its class."""

    exit_code = 1


class ConfigProblem(SkewwatchError):
    """A setting or option cannot be used (the message names it)."""

    exit_code = 2


class PeerUnreachable(SkewwatchError):
    """Nothing answered where the command must connect (services that wait for their peer do not raise it)."""

    exit_code = 3


class KafkaUnreachable(PeerUnreachable):
    """Nothing answered at the bootstrap address (a one-shot command or a bridge; services wait instead)."""


class KafkaRefused(SkewwatchError):
    """Kafka answered but the TLS handshake or the SASL login failed: waiting will not help."""

    exit_code = 4


class AddressInUse(SkewwatchError):
    """The host:port a service should listen on is taken by another process."""

    exit_code = 5


class DataDirLocked(SkewwatchError):
    """Another broker holds the lock on the data directory."""

    exit_code = 6


class NothingSent(SkewwatchError):
    """A run that had something to deliver ended with nothing acknowledged."""

    exit_code = 7


class BrokerFailed(SkewwatchError):
    """The embedded broker could not be fetched or started (Java, Maven, formatting) or stopped."""

    exit_code = 8


class ChildFailed(SkewwatchError):
    """A process the command started and depends on (``demo``'s worker or generator) exited on its own."""

    exit_code = 9


def listen_error(exc: OSError, host: str, port: int, what: str) -> SkewwatchError:
    """The one-line error for a failed bind of ``host:port``.

    >>> listen_error(OSError(errno.EADDRINUSE, "in use"), "127.0.0.1", 6066, "the worker's HTTP API").exit_code
    5
    """
    if exc.errno == errno.EADDRINUSE:
        return AddressInUse(f"{what} cannot listen on {host}:{port}: the port is already in use "
                            "(another instance?); pick another port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigProblem(f"{what} cannot listen on {host}:{port}: no interface of this machine has "
                             f"the address {host}")
    if exc.errno == errno.EACCES:
        return ConfigProblem(f"{what} cannot listen on {host}:{port}: permission denied (ports below 1024 "
                             "need privileges)")
    return ConfigProblem(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc}")


__all__ = [
    "AddressInUse",
    "BrokerFailed",
    "ChildFailed",
    "ConfigProblem",
    "DataDirLocked",
    "KafkaRefused",
    "KafkaUnreachable",
    "NothingSent",
    "PeerUnreachable",
    "SkewwatchError",
    "listen_error",
]
