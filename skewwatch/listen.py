"""Listening sockets, bound by a command before it starts anything else.

A service binds its port first: a port in use, an address this machine does not have or a port
that needs privileges is then one line with its exit code (:func:`skewwatch.errors.listen_error`),
before a Kafka client exists that would print "Unclosed AIOKafkaProducer" on the way out. The
socket is then handed to aiohttp (``web.SockSite``).

>>> sock = bind_socket("127.0.0.1", 0, "an example")
>>> listening_url(sock).startswith("http://127.0.0.1:")
True
>>> sock.close()
"""

from __future__ import annotations

import socket

from skewwatch.errors import ConfigProblem, listen_error


def bind_socket(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket on ``host:port``, or the one-line error (port in use: exit code 5)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigProblem(f"{what} cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart reuses a port in TIME_WAIT
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise listen_error(exc, host, port, what) from None
    sock.setblocking(False)
    return sock


def listening_url(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


__all__ = ["bind_socket", "listening_url"]
