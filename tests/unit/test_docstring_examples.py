"""Every docstring example in the package runs and gives what it says (a module with none is skipped)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import skewwatch


def _with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(skewwatch.__path__, "skewwatch."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin and ">>> " in Path(spec.origin).read_text(encoding="utf-8"):
            names.append(info.name)
    return names


MODULES = _with_examples()


def test_the_package_has_examples() -> None:
    assert {"skewwatch.pipeline.window.summary", "skewwatch.pipeline.detectors.pool_slope"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
