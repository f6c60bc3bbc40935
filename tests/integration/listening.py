"""Test helper: which address a TCP port is bound to, read from the kernel's socket table."""

from __future__ import annotations

import ipaddress
from pathlib import Path


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets LISTENing on ``port`` (``/proc/net/tcp`` and ``tcp6``, Linux)."""
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, _, port_hex = local.partition(":")
            if state != "0A" or int(port_hex, 16) != port or len(address) != width:
                continue
            raw = bytes.fromhex(address)
            # the kernel prints each 32-bit word in host (little-endian) order
            ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(ordered)
            mapped = getattr(ip, "ipv4_mapped", None)  # a JVM binds IPv4 through IPv6-mapped sockets
            found.add(str(mapped or ip))
    return found
