"""skewwatch's one error hierarchy: every exception the package defines, and the commands' exit codes.

:class:`SkewwatchError` is the root of every exception class in the package. It carries the exit
code a command ends with when it fails this way, and :attr:`~SkewwatchError.retriable`: whether the
same call may succeed later (a peer that does not answer yet) or not (a setting, a refused login).
Module-specific errors keep their builtin base too (``ConfigError`` is a ``ValueError``, ...), so
callers that catch the builtin still do.

Every command reports what it expected could go wrong (a bad setting, a busy port, a Kafka that
does not answer or refuses the credentials, a broker data directory in use, nothing sent) as ONE
line on stderr, ``Error: <what happened>; <what to do>``, and exits with the code of its class:
those are the :class:`CommandError` subclasses below, which are also :class:`click.ClickException`
so that click prints them and exits with :attr:`exit_code`; code outside a click command can raise
them too. Any other exception reaching click is a bug: a traceback and exit code 1, whatever its class.

==== ======================== ===== ======================================================================
code class                    retry when
==== ======================== ===== ======================================================================
0                                   success (also Ctrl-C / SIGTERM on a long-running command)
1    (none: a bug)                  an unexpected exception; the traceback is worth a bug report
2    :class:`ConfigProblem`   no    a setting or option cannot be used (click's usage errors are 2 too)
3    :class:`PeerUnreachable` yes   nothing answers where a command must connect as it starts: Kafka for
                                    a one-shot command or a bridge (:class:`KafkaUnreachable`), HAProxy's
                                    runtime API for ``apply haproxy``; or Kafka went away during a run
4    :class:`KafkaRefused`    no    Kafka answered but refused the connection: TLS or SASL failed
5    :class:`AddressInUse`    no    the port to listen on is taken
6    :class:`DataDirLocked`   no    the broker's data directory is locked by another broker
7    :class:`NothingSent`     no    a bounded run (``scrape --rounds``) ended with nothing delivered
8    :class:`BrokerFailed`    no    the embedded broker could not be fetched or started, or it stopped
9    :class:`ChildFailed`     no    a process the command started (``demo``'s worker or generator) exited
==== ======================== ===== ======================================================================

"retry": :attr:`SkewwatchError.retriable`, whether running the command again later can succeed.

>>> KafkaUnreachable("no Kafka answers at 127.0.0.1:9").exit_code, KafkaUnreachable.retriable
(3, True)
>>> sorted({cls.exit_code for cls in CommandError.__subclasses__()})
[2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import errno

import click


class SkewwatchError(Exception):
    """Root of every exception skewwatch defines.

    ``exit_code``: what a command exits with when it fails this way (1, a bug, unless a subclass
    says otherwise; only :class:`CommandError` subclasses reach click as one line). ``retriable``:
    whether trying the same thing again later can succeed, as aiokafka's errors say.
    """

    exit_code: int = 1
    retriable: bool = False


class CommandError(SkewwatchError, click.ClickException):
    """A command's expected failure: click prints its one-line message and exits with its code."""


class ConfigProblem(CommandError):
    """A setting or option cannot be used (the message names it)."""

    exit_code = 2


class PeerUnreachable(CommandError):
    """Nothing answered where the command must connect (services that wait for their peer do not raise it)."""

    exit_code = 3
    retriable = True  # the peer may come up: long-running services wait for it instead


class KafkaUnreachable(PeerUnreachable):
    """Nothing answered at the bootstrap address, or no live broker is listed there yet (a one-shot command
    or a bridge exits with it; services wait instead)."""


class KafkaRefused(CommandError):
    """Kafka answered but the TLS handshake or the SASL login failed: waiting will not help."""

    exit_code = 4


class AddressInUse(CommandError):
    """The host:port a service should listen on is taken by another process."""

    exit_code = 5


class DataDirLocked(CommandError):
    """Another broker holds the lock on the data directory."""

    exit_code = 6


class NothingSent(CommandError):
    """A run that had something to deliver ended with nothing acknowledged."""

    exit_code = 7


class BrokerFailed(CommandError):
    """The embedded broker could not be fetched or started (Java, Maven, formatting) or stopped."""

    exit_code = 8


class ChildFailed(CommandError):
    """A process the command started and depends on (``demo``'s worker or generator) exited on its own."""

    exit_code = 9


def listen_error(exc: OSError, host: str, port: int, what: str) -> CommandError:
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
    "CommandError",
    "ConfigProblem",
    "DataDirLocked",
    "KafkaRefused",
    "KafkaUnreachable",
    "NothingSent",
    "PeerUnreachable",
    "SkewwatchError",
    "listen_error",
]
