"""How much input the decoders accept: the three limits every wire decoder checks.

The decoders take any object with these three attributes (``skewwatch.config.LimitSettings``, the
``[limits]`` section of the settings, is one), so the contracts depend on no configuration code.
:data:`DEFAULT_LIMITS` holds the defaults, which ``[limits]`` starts from.

>>> DEFAULT_LIMITS.max_tokens
10000000
>>> DecodeLimits(max_tokens=100).max_message_bytes == MAX_MESSAGE_BYTES
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

MAX_MESSAGE_BYTES: Final = 1 << 20  # a message larger than 1 MiB is rejected (too_large)
MAX_TOKENS: Final = 10_000_000  # prompt/completion tokens above this are rejected as absurd (too_many_tokens)
MAX_EVENTS_PER_MESSAGE: Final = 10_000  # events in one {"events": [...]} message (too_many_events)


class InputLimits(Protocol):
    """What a decoder reads of its limits (``LimitSettings`` and :class:`DecodeLimits` both qualify)."""

    @property
    def max_message_bytes(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def max_events_per_message(self) -> int: ...


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """The decoders' limits on their own, for callers without settings (producers, tools, tests)."""

    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_tokens: int = MAX_TOKENS
    max_events_per_message: int = MAX_EVENTS_PER_MESSAGE


DEFAULT_LIMITS: Final = DecodeLimits()
