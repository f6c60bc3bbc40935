"""pyproject.toml declares every third-party package the ``skewwatch`` package imports."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
# namespace packages several distributions share: the distribution of each module prefix
NAMESPACES = {
    "google.protobuf": "protobuf",
    "google.rpc": "googleapis-common-protos",
    "opentelemetry.proto": "opentelemetry-proto",
}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_modules() -> dict[str, set[str]]:
    """Third-party module name -> the package files importing it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "skewwatch").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "skewwatch":
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_runtime_import_is_a_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normal(re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0]) for dep in project["dependencies"]}
    owners = importlib.metadata.packages_distributions()
    missing = {}
    for module, files in _imported_modules().items():
        namespace = next((dist for prefix, dist in NAMESPACES.items()
                          if module == prefix or module.startswith(prefix + ".")), None)
        distributions = [namespace] if namespace else owners.get(module.split(".")[0], [])
        assert distributions, f"{module} (imported by {sorted(files)}) belongs to no installed distribution"
        if not any(_normal(dist) in declared for dist in distributions):
            missing[module] = (distributions, sorted(files))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_package_data_entries_match_files() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, patterns in data.items():
        folder = ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package-data {package}: {pattern} matches nothing"
