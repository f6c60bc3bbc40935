"""Encode and decode ``llm.routing-corrections`` records (contract routing-correction.v1, v1.4).

A record is plain data: ``model, ts, seq, weights {replica: share}, actions [...]`` and, since
v1.4, ``mode`` (``normal`` | ``panic``) and ``mode_reason``. A record from a writer before v1.4
has no ``mode``; it decodes as ``normal``, so readers of either version read both. Since v1.9 a
record also says how long a reader may route by it after it arrives, ``valid_for_s`` (null from an
older writer).

>>> record = {"model": "m", "ts": 60.0, "seq": 60000, "weights": {"a": 0.5, "b": 0.5}, "actions": [],
...           "mode": "panic", "mode_reason": "panic: 1 of 4 replicas healthy", "valid_for_s": 90.0, "v": 1}
>>> decode_correction(encode_correction(record)) == record
True
>>> decode_correction(b'{"model": "m", "ts": 60.0, "seq": 60000, "weights": {}, "actions": []}')["mode"]
'normal'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

MODES = ("normal", "panic")


def encode_correction(record: Mapping[str, Any]) -> bytes:
    """The ``llm.routing-corrections`` value of one correction (UTF-8 JSON)."""
    mode = record.get("mode") or "normal"
    if mode not in MODES:
        raise ValueError(f"routing correction: mode must be one of {', '.join(MODES)}, got {mode!r}")
    return orjson.dumps({**record, "mode": mode})


def decode_correction(value: bytes) -> dict[str, Any]:
    """A correction from its ``llm.routing-corrections`` value, ``mode`` filled in (``normal`` when
    absent); unknown fields are kept. Raises ValueError naming the problem."""
    data = orjson.loads(value)
    if not isinstance(data, dict):
        raise ValueError("routing correction must be a JSON object")
    if data.get("v") not in (None, 1):
        raise ValueError(f"routing correction: unsupported schema version {data.get('v')!r}")
    missing = [name for name in ("model", "ts", "seq", "weights") if name not in data]
    if missing:
        raise ValueError(f"routing correction: missing {', '.join(missing)}")
    mode = data.get("mode") or "normal"
    if mode not in MODES:
        raise ValueError(f"routing correction: unknown mode {mode!r}")
    data["mode"] = mode
    data.setdefault("mode_reason", None)
    valid = data.setdefault("valid_for_s", None)
    if valid is not None and (not isinstance(valid, int | float) or isinstance(valid, bool) or not valid > 0):
        raise ValueError(f"routing correction: valid_for_s must be a number of seconds > 0, got {valid!r}")
    data.setdefault("actions", [])
    data.setdefault("v", 1)
    return data


__all__ = ["MODES", "decode_correction", "encode_correction"]
