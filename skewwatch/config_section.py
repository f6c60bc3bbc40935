"""What every configuration section is built on: a msgspec Struct, its checks, and one-line errors.

A section (``[window]``, ``[detectors.long_tail]``, ...) is a :class:`ConfigSection`: a msgspec
``Struct`` that forbids unknown fields, whose field types carry their ranges
(``Annotated[float, Meta(gt=0)]``) and whose ``__post_init__`` checks what spans several fields.
Raw values (a TOML table, or strings from the environment) become a section through
:func:`convert`, which is ``msgspec.convert(..., strict=True)``: a float where an integer is
expected, a string where a number is expected, a value out of range or an unknown key is an error,
never a silent coercion. Each error becomes one :class:`ConfigError` line naming the key and where
its value came from.

Environment values are text: :func:`parse_strings` reads them by the field's type first
(``"4"`` for an int, ``"true"``/``"off"`` for a bool, ``"a,b"`` for a list, ``"k=1,j=2"`` for a
table, ``""``/``"none"`` for an optional value); what it cannot read stays text and is rejected.

>>> from typing import Annotated
>>> from msgspec import Meta
>>> class Example(FrozenConfigSection, frozen=True):
...     section = "example"
...     step_s: Annotated[float, Meta(gt=0)] = 5.0
...     names: tuple[str, ...] = ()
>>> Example.from_overrides({"step_s": "2.5", "names": "a,b"})
Example(step_s=2.5, names=('a', 'b'))
>>> convert({"step_s": 0}, Example, {("step_s",): "cfg.toml"})
Traceback (most recent call last):
...
skewwatch.config_section.ConfigError: example.step_s = 0 (from cfg.toml): expected a number > 0.0
>>> Example.from_overrides({"stpe_s": 1})
Traceback (most recent call last):
...
skewwatch.config_section.ConfigError: example.stpe_s: unknown setting (known: names, step_s)
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from msgspec import Meta

from skewwatch.errors import SkewwatchError

T = TypeVar("T")

# the ranges most settings share
Positive = Annotated[float, Meta(gt=0)]
NonNegative = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(gt=0, le=1)]  # (0, 1]
Unit = Annotated[float, Meta(ge=0, le=1)]  # [0, 1]
Count = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Name = Annotated[str, Meta(min_length=1)]

Path = tuple[str, ...]  # a key's place: ("detectors", "long_tail", "ratio")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NONE = frozenset({"", "none", "null"})
_INTEGER = re.compile(r"[+-]?\d+")


class ConfigError(SkewwatchError, ValueError):
    """A setting that cannot be used: one line naming the key, its value and where it came from."""

    exit_code = 2  # the CLI prints the line and exits with it (ConfigProblem's code)


class _SectionMethods:
    """What both kinds of section share (a mixin: msgspec Structs take slot-less mixins)."""

    __slots__ = ()

    section: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (nested sections stay objects)."""
        return msgspec.structs.asdict(self)  # type: ignore[arg-type]  # always mixed into a Struct

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None = None) -> typing.Self:
        """Defaults, then ``overrides`` (TOML values, or text as from the environment, read by
        :func:`parse_strings`); ConfigError on an unknown key or a bad value."""
        raw = {str(key).strip().lower(): value for key, value in (overrides or {}).items()}
        return convert(parse_strings(raw, cls), cls)

    def _require(self, ok: bool, name: str, rule: str) -> None:
        """Raise ConfigError ``<section>.<name>: <rule>, got <value>`` unless ``ok``."""
        if not ok:
            where = f"{self.section}.{name}" if self.section else name
            raise ConfigError(f"{where}: {rule}, got {getattr(self, name)!r}")


class ConfigSection(_SectionMethods, msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of a settings section: unknown fields are errors, fields are keyword-only.

    ``section`` is the section's dotted place in the settings (``"detectors.long_tail"``), for
    messages. Ranges live in the field types (checked by :func:`convert`); rules over several
    fields in ``__post_init__`` through :meth:`_require` (checked on every construction).
    """


class FrozenConfigSection(_SectionMethods, msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A :class:`ConfigSection` that cannot change once built (what the detectors hold: their
    derived values are computed once from it)."""


# --------------------------------------------------------------------------- text -> typed values


def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0]), len(args) < len(typing.get_args(tp))
    return tp, False


def parse_text(text: str, tp: Any) -> Any:
    """An environment value read as type ``tp``; what cannot be read is returned as it is.

    >>> parse_text("4", int), parse_text("off", bool), parse_text("a, b", tuple[str, ...])
    (4, False, ['a', 'b'])
    >>> parse_text("llama=256,qwen=128", dict[str, int]), parse_text("none", int | None)
    ({'llama': 256, 'qwen': 128}, None)
    >>> parse_text("2.0", int)  # not an int: left as text, rejected by convert
    '2.0'
    """
    tp, nullable = _optional(tp)
    if nullable and text.strip().lower() in _NONE:
        return None
    origin = typing.get_origin(tp)
    if origin in (tuple, list, set, frozenset):
        item = _unwrap(next((a for a in typing.get_args(tp) if a is not Ellipsis), str))
        return [parse_text(part.strip(), item) for part in text.split(",") if part.strip()]
    if origin in (dict, Mapping):
        value_type = typing.get_args(tp)[1] if typing.get_args(tp) else str
        pairs = [item.partition("=") for item in text.split(",") if item.strip()]
        if any(not sep or not key.strip() for key, sep, _ in pairs):
            return text
        return {key.strip(): parse_text(value.strip(), value_type) for key, _, value in pairs}
    if tp is bool:
        word = text.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else text
    if tp is int:  # digits only: "2.0" or "2.7" for an integer is an error, never a truncation
        return int(text) if _INTEGER.fullmatch(text.strip()) else text
    if tp is float:
        try:
            return float(text)
        except ValueError:
            return text
    return text


def _field_types(cls: Any) -> dict[str, Any]:
    tp = _optional(cls)[0]
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return {f.name: f.type for f in msgspec.structs.fields(tp)}
    return {}


def parse_strings(raw: Mapping[str, Any], cls: Any) -> dict[str, Any]:
    """``raw`` with every text value read by its field's type (:func:`parse_text`), recursively
    through nested sections. Unknown keys are kept for :func:`convert` to reject."""
    types_of = _field_types(cls)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        tp = types_of.get(key)
        if tp is None:
            out[key] = value
        elif isinstance(value, Mapping) and _field_types(tp):
            out[key] = parse_strings(value, tp)
        elif isinstance(value, str):
            out[key] = parse_text(value, tp)
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------- convert, with errors


_AT = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_KEYED = re.compile(r"^(?P<key>[A-Za-z_][\w.]*): (?P<rule>.*)$", re.DOTALL)
_TYPE_WORDS = {
    "int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
    "object": "a table", "array": "a list", "null": "nothing",
}


def _words(message: str) -> str:
    """msgspec's ``Expected `int`, got `float``` -> ``expected an integer`` (the value is shown apart)."""
    message = re.sub(r", got `[^`]*`$", "", message)
    message = re.sub(r"`(\w+)`", lambda m: _TYPE_WORDS.get(m.group(1), m.group(1)), message)
    return message[:1].lower() + message[1:]


def _split_path(path: str) -> Path:
    return tuple(part for part in re.split(r"\.|\[[^\]]*\]", path) if part)


def field_type(cls: Any, path: Path) -> Any:
    """The declared type of the key at ``path`` in section type ``cls``; None if there is none.

    >>> from skewwatch.config import Settings
    >>> field_type(Settings, ("kafka", "bootstrap")), field_type(Settings, ("kafka", "bootstarp"))
    (str | None, None)
    """
    tp: Any = cls
    for part in path:
        found = _field_types(tp).get(part)
        if found is None:
            return None
        tp = found
    return tp


def _type_at(cls: Any, path: Path) -> Any:
    tp = field_type(cls, path)
    return None if tp is None else _optional(tp)[0]


def _value_at(raw: Mapping[str, Any], path: Path) -> tuple[bool, Any]:
    value: Any = raw
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _source_of(sources: Mapping[Path, str], path: Path) -> str | None:
    """Where the value at ``path`` came from: its own source, else those of the keys under it."""
    if path in sources:
        return sources[path]
    below = sorted({source for key, source in sources.items() if key[: len(path)] == path})
    return ", ".join(below) or None


def convert(raw: Mapping[str, Any], cls: type[T], sources: Mapping[Path, str] | None = None,
            prefix: Path | None = None) -> T:
    """``msgspec.convert(raw, cls, strict=True)``; a failure is one ConfigError line.

    ``sources`` maps a key's path (within ``raw``) to where its value came from (a file path, an
    environment variable); ``prefix`` is ``cls``'s own place in the settings, for messages
    (default: its ``section``).
    """
    if prefix is None:
        section = getattr(cls, "section", "")
        prefix = tuple(section.split(".")) if section else ()
    try:
        return msgspec.convert(raw, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(describe_error(str(exc), raw, cls, sources or {}, prefix)) from None


def describe_error(text: str, raw: Mapping[str, Any], cls: Any, sources: Mapping[Path, str],
                   prefix: Path = ()) -> str:
    """One line for a msgspec validation message: ``<key> = <value> (from <source>): <problem>``."""
    match = _AT.match(text)
    message, path = (match["message"], _split_path(match["path"])) if match else (text, ())
    unknown = _UNKNOWN.match(message)
    keyed = _KEYED.match(message)
    if unknown is not None:  # the path is the table holding it
        path = (*path, unknown["name"])
        known = ", ".join(sorted(_field_types(_type_at(cls, path[:-1]))))
        found, value = _value_at(raw, path)
        what = "section" if found and isinstance(value, Mapping) else "setting"
        problem = f"unknown {what} (known: {known})"
        show_value = False
    elif keyed is not None:  # a section's __post_init__ rule (ConfigSection._require) names its key
        key = tuple(keyed["key"].split("."))
        problem = keyed["rule"]
        # the rule names its full place; the path is the section's place within raw
        if key[: len(prefix)] == prefix and len(key) > len(prefix):
            key = key[len(prefix):]
        if key[: len(path)] != path:
            key = (*path, *key[-1:])
        path, show_value = key, False
    else:
        problem = _words(message)
        if message.startswith("Invalid enum value"):
            choices = typing.get_args(_type_at(cls, path)) if typing.get_origin(_type_at(cls, path)) is Literal else ()
            problem = f"expected one of {', '.join(map(str, choices))}" if choices else problem
        show_value = True
    name = ".".join((*prefix, *path)) or "settings"
    found, value = _value_at(raw, path)
    head = f"{name} = {value!r}" if show_value and found else name
    source = _source_of(sources, path)
    return f"{head} (from {source}): {problem}" if source else f"{head}: {problem}"


__all__ = [
    "ConfigError",
    "ConfigSection",
    "FrozenConfigSection",
    "Count",
    "Fraction",
    "Name",
    "NonNegative",
    "NonNegativeInt",
    "Positive",
    "Unit",
    "convert",
    "describe_error",
    "field_type",
    "parse_strings",
    "parse_text",
]
