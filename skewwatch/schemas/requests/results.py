"""What decoding ``llm.requests`` messages gives: the valid events as columns, and each message's rejections.

>>> from skewwatch.schemas.rejection import Rejection
>>> rejects = MessageRejects(2, {1: [Rejection("empty", "value is null or zero bytes")]})
>>> [len(r) for r in rejects], list(rejects.rejected)
([0, 1], [1])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests.columns import IntArray, RequestColumns

# --- results ---------------------------------------------------------------------------------------

@dataclass(slots=True)
class DecodedMessage:
    """One ``llm.requests`` message: its valid events as columns, and why the others were rejected."""

    columns: RequestColumns
    rejects: list[Rejection]

    @property
    def rejected_whole_message(self) -> bool:
        return any(r.is_message_level for r in self.rejects)


class MessageRejects(Sequence[list[Rejection]]):
    """The rejections of each message of a poll (read-only): ``rejects[m]`` is message ``m``'s
    list, empty when it was clean. Lists are stored for the rejected messages only: a clean poll
    of 20,000 messages allocating 20,000 lists that outlive the decode would make the garbage
    collector scan the whole heap, a cost per message that grows with the worker's state
    (bench/decode_bench.py).

    >>> rejects = MessageRejects(3, {1: [Rejection("empty", "value is null or zero bytes")]})
    >>> [[r.reason_code for r in rs] for rs in rejects], rejects == [[], rejects[1], []]
    ([[], ['empty'], []], True)
    """

    __slots__ = ("_by_message", "_count")

    def __init__(self, count: int, by_message: Mapping[int, list[Rejection]] | None = None) -> None:
        self._count = count
        self._by_message = {m: rs for m, rs in (by_message or {}).items() if rs}

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> list[Rejection]: ...

    @overload
    def __getitem__(self, index: slice) -> list[list[Rejection]]: ...

    def __getitem__(self, index: int | slice) -> list[Rejection] | list[list[Rejection]]:
        if isinstance(index, slice):
            return [self[m] for m in range(*index.indices(self._count))]
        m = index + self._count if index < 0 else index
        if not 0 <= m < self._count:
            raise IndexError(f"message {index} of {self._count}")
        return self._by_message.get(m) or []  # a fresh empty list: a clean message's is nobody's

    def __iter__(self) -> Iterator[list[Rejection]]:
        get = self._by_message.get
        return (get(m) or [] for m in range(self._count))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageRejects):
            return self._count == other._count and self._by_message == other._by_message
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable lists inside: not hashable, like a list

    def __repr__(self) -> str:
        return f"MessageRejects({self._count}, {self._by_message!r})"

    @property
    def rejected(self) -> dict[int, list[Rejection]]:
        """Message index -> its rejections, for the rejected messages only (ascending)."""
        return dict(sorted(self._by_message.items()))


@dataclass(slots=True)
class DecodedMessages:
    """Many messages decoded together (one poll): one column batch, rejects per message.

    ``message_index[i]`` is the input position of the message that row ``i`` of ``columns`` came
    from; ``rejects[m]`` lists message ``m``'s rejections (empty when it was clean).
    """

    columns: RequestColumns
    message_index: IntArray
    rejects: MessageRejects
