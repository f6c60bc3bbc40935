"""skewwatch.errors: one root for every exception the package defines, and one table of exit codes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import click
import pytest

import skewwatch
from skewwatch import errors
from skewwatch.errors import CommandError, SkewwatchError

ROOT = Path(__file__).parents[2]
# classes whose modules still give them another base; an entry that derives from the root fails (strict)
ROOT_PENDING: frozenset[str] = frozenset()


def _package_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (each module imported once)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(skewwatch.__path__, "skewwatch."):
        if info.name.endswith("__main__"):  # runs the CLI when imported
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


EXCEPTIONS = _package_exceptions()


def test_the_walk_finds_the_package_exceptions() -> None:
    names = {cls.__qualname__ for cls in EXCEPTIONS}
    assert {"ConfigError", "KafkaUnreachable", "BrokerError", "OtlpDecodeError", "TopicError"} <= names
    assert len(EXCEPTIONS) >= 25


@pytest.mark.parametrize("cls", [
    pytest.param(cls, marks=pytest.mark.xfail(strict=True, reason="not yet derived from SkewwatchError"))
    if f"{cls.__module__}.{cls.__qualname__}" in ROOT_PENDING else cls
    for cls in EXCEPTIONS], ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_exception_derives_from_the_root(cls: type[BaseException]) -> None:
    assert issubclass(cls, SkewwatchError), f"{cls.__module__}.{cls.__qualname__} does not derive from SkewwatchError"
    assert isinstance(cls.exit_code, int) and isinstance(cls.retriable, bool)


def test_builtin_bases_are_kept_for_callers_that_catch_them() -> None:
    from skewwatch.config_section import ConfigError
    from skewwatch.otlp.decode import OtlpDecodeError
    from skewwatch.topics import TopicError

    assert issubclass(ConfigError, ValueError) and issubclass(OtlpDecodeError, ValueError)
    assert issubclass(TopicError, RuntimeError)


def test_only_command_errors_reach_click_as_one_line() -> None:
    """Any other exception reaching click stays a traceback (a bug), whatever its root."""
    for cls in EXCEPTIONS:
        assert issubclass(cls, click.ClickException) == issubclass(cls, CommandError), cls
    assert not issubclass(SkewwatchError, click.ClickException)


def _table_codes() -> dict[int, tuple[str, str]]:
    """errors.py's table: code -> (class name, retry), the rows that name a class."""
    rows = re.findall(r"^(\d)\s+:class:`(\w+)`\s+(yes|no)\s", errors.__doc__ or "", re.M)
    return {int(code): (name, retry) for code, name, retry in rows}


def test_the_table_in_errors_matches_the_classes() -> None:
    table = _table_codes()
    assert sorted(table) == [2, 3, 4, 5, 6, 7, 8, 9]
    for code, (name, retry) in table.items():
        cls = getattr(errors, name)
        assert cls.exit_code == code, name
        assert cls.retriable == (retry == "yes"), name
    assert {cls.exit_code for cls in CommandError.__subclasses__()} == set(table)


def test_the_documented_exit_codes_match_errors() -> None:
    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    documented = {int(code): retry for code, retry in re.findall(r"^\| (\d) \| (yes|no|) \|", configuration, re.M)}
    assert sorted(documented) == [0, 1, *sorted(_table_codes())]
    assert {code: retry for code, retry in documented.items() if retry} == {
        code: retry for code, (_, retry) in _table_codes().items()}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Expected\s+failures are one line", readme)
    assert found, "README no longer summarises the exit codes where it did"
    summary = readme[found.start():][:600]
    for code in _table_codes():
        assert re.search(rf"\b{code} ", summary), f"README's summary of the exit codes lacks {code}"
