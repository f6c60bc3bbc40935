"""The ``llm.routing-corrections`` record (contract routing-correction.v1, v1.4): its one encoder and decoder.

A record is ``model, ts, seq, weights {replica: share}, actions [...]`` and, since v1.4, ``mode``
(``normal`` | ``panic``) and ``mode_reason``; since v1.9 it also says how long a reader may route
by it after it arrives, ``valid_for_s`` (null from an older writer). The worker builds a
:class:`RoutingCorrection` (:mod:`skewwatch.pipeline.model_decisions`) and publishes it with
:func:`encode_correction`; every reader — the client library and the bridges on it, the tail
command, the closed-loop simulator, the benchmarks — reads it with :func:`decode_correction`, and
the worker's checkpoint with :meth:`RoutingCorrection.from_dict`, by the same declaration below.

**mode.** A record from a writer before v1.4 has no ``mode`` (or ``null``): it reads as
``normal``, here and only here (:data:`DEFAULT_MODE`), so readers of either version read both.

>>> c = RoutingCorrection("m", 60.0, 60000, {"a": 0.5, "b": 0.5}, mode="panic",
...                       mode_reason="panic: 1 of 4 replicas healthy", valid_for_s=90.0)
>>> encode_correction(c)[:64]
b'{"model":"m","ts":60.0,"seq":60000,"weights":{"a":0.5,"b":0.5},"'
>>> decode_correction(encode_correction(c)) == c, RoutingCorrection.from_dict(c.to_dict()) == c
(True, True)
>>> decode_correction(b'{"model": "m", "ts": 60.0, "seq": 60000, "weights": {}, "actions": []}').mode
'normal'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

import msgspec
import orjson

from skewwatch.schemas.alerts import Action

Mode = Literal["normal", "panic"]
MODES: Final[tuple[Mode, ...]] = get_args(Mode)
DEFAULT_MODE: Final[Mode] = "normal"  # a record without mode (a writer before v1.4)
CORRECTIONS_SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class RoutingCorrection:
    """One record on ``llm.routing-corrections`` (key = model).

    ``mode`` and ``v`` take ``None`` only as a record from an older writer spells them; a
    correction, built or decoded, always has ``mode`` in :data:`MODES` and ``v`` = 1.
    """

    model: str
    ts: float  # event time of the step (window_end) or of the forced recompute
    seq: int  # strictly increasing per model
    weights: dict[str, float]  # replica -> weight, summing to 1 over the pool (never all 0)
    actions: list[Action] = field(default_factory=list)
    mode: Mode | None = DEFAULT_MODE  # normal | panic (v1.4)
    mode_reason: str | None = None  # why the mode is panic (v1.4)
    valid_for_s: float | None = None  # how long a reader may route by it after it arrives (v1.9)
    v: Literal[1] | None = CORRECTIONS_SCHEMA_VERSION

    def __post_init__(self) -> None:
        # runs on construction and on every decode (msgspec calls it), so the defaults of a record
        # from an older writer and the checks are stated once
        if self.mode is None:
            object.__setattr__(self, "mode", DEFAULT_MODE)
        elif self.mode not in MODES:  # a caller building one in code; msgspec checks the decoded
            raise ValueError(f"routing correction: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.v is None:
            object.__setattr__(self, "v", CORRECTIONS_SCHEMA_VERSION)
        valid = self.valid_for_s
        if valid is not None and not valid > 0:
            raise ValueError(f"routing correction: valid_for_s must be a number of seconds > 0, got {valid!r}")

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data (the worker's checkpoint keeps it so)."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingCorrection:
        """A correction from plain data, by the rules of :func:`decode_correction`."""
        return msgspec.convert(data, cls)


_DECODER = msgspec.json.Decoder(RoutingCorrection)


def encode_correction(correction: RoutingCorrection) -> bytes:
    """The ``llm.routing-corrections`` value of one correction (UTF-8 JSON, fields in declaration order)."""
    # orjson serialises the dataclass itself (no intermediate dict); it writes a float of 1e16 or
    # more as 1e+16 where msgspec writes 1e16, and the records on the topic keep orjson's spelling
    return orjson.dumps(correction)


def decode_correction(value: bytes) -> RoutingCorrection:
    """A correction from its ``llm.routing-corrections`` value, ``mode`` filled in (``normal`` when
    absent or null); unknown fields are ignored. Raises ValueError (msgspec.ValidationError or
    DecodeError) naming the problem."""
    return _DECODER.decode(value)


__all__ = ["CORRECTIONS_SCHEMA_VERSION", "DEFAULT_MODE", "MODES", "Mode", "RoutingCorrection", "decode_correction",
           "encode_correction"]
