"""Local TCP ports: whether one is free, and picking a free one.

>>> port = free_port()
>>> 0 < port < 65536 and port_is_free(port)
True
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when a listener could bind ``host:port`` now (SO_REUSEADDR, as the JVM and aiohttp bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK, avoid: set[int] | None = None) -> int:
    """A port the OS considers free now (another process may still take it before it is bound).

    Raises OSError when none is found (``avoid`` lists ports not to return).
    """
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
        if not avoid or port not in avoid:
            return port
    raise OSError(f"could not find a free TCP port on {host}")


__all__ = ["LOOPBACK", "free_port", "port_is_free"]
