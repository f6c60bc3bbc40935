"""Which replica a GPU serves: ``--replica-map FILE`` (JSON or TOML), else one replica per GPU.

``--replica-map`` maps GPU index/UUID to replica ids (a file, or one replica per GPU by
default). Telemetry is keyed by replica id so it lands on the same partition as the
replica's request events. A UUID entry wins over an index entry (UUIDs survive a reordering
of devices); a GPU not in the map gets the default ``<node>-gpu<index>``, the same name the
DCGM bridge derives, so both sources agree without a map.

The file is a flat mapping, optionally under a ``replicas`` table::

    # replicas.toml                         // replicas.json
    [replicas]                              {"0": "llama-a", "1": "llama-a",
    0 = "llama-a"                            "GPU-5f0e2a71-...": "qwen-b"}
    "GPU-5f0e2a71-..." = "qwen-b"

>>> replica_for(1, "GPU-x", {"GPU-x": "qwen-b", "1": "llama-a"}, node="n1")
'qwen-b'
>>> replica_for(2, "GPU-y", {"1": "llama-a"}, node="n1")
'n1-gpu2'
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from skewwatch.errors import SkewwatchError


class ReplicaMapError(SkewwatchError, ValueError):
    """The replica map cannot be used; the message names the file and the problem."""

    exit_code = 2  # a setting (--replica-map) that cannot be used


def default_replica(node: str, gpu_index: int) -> str:
    return f"{node}-gpu{gpu_index}"


def replica_for(gpu_index: int, gpu_uuid: str | None, mapping: Mapping[str, str], node: str) -> str:
    if gpu_uuid and gpu_uuid in mapping:
        return mapping[gpu_uuid]
    return mapping.get(str(gpu_index)) or default_replica(node, gpu_index)


def parse_replica_map(text: str, where: str = "replica map") -> dict[str, str]:
    """Parse JSON (an object) or TOML text into ``{index-or-uuid: replica}``."""
    data: Any
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ReplicaMapError(f"{where}: neither JSON nor TOML ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("replicas"), dict):
        data = data["replicas"]
    if not isinstance(data, dict):
        raise ReplicaMapError(f"{where}: expected a mapping of GPU index or UUID to replica id")
    mapping: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            raise ReplicaMapError(f"{where}: replica for {key!r} must be a non-empty string, got {value!r}")
        mapping[str(key)] = value
    return mapping


def load_replica_map(path: str | Path) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReplicaMapError(f"replica map {path}: {exc.strerror or exc}") from None
    return parse_replica_map(text, where=f"replica map {path}")
