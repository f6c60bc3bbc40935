"""The package's layering, read from the source (the AST of every module, nothing imported):

- ``skewwatch/schemas/`` (the wire contracts) sits at the bottom: it imports only itself and
  ``skewwatch.gc_pause``, and nothing it reaches imports the engine (pipeline, agents) or settings;
- ``skewwatch/pipeline/`` is pure: nothing it reaches imports the agents or a Kafka/HTTP client;
- the settings loader (``skewwatch.config``) depends on ``pipeline/``, never the reverse: it composes
  the pipeline's own settings types, and no pipeline module reaches it;
- no two modules of the package import each other, directly or around a longer loop (imports inside
  functions count: a deferred import hides a cycle, it does not break it; imports only for the type
  checker do not, they never run).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "skewwatch"
ENGINE = ("skewwatch.pipeline", "skewwatch.agents", "skewwatch.config")
CLIENTS = frozenset({"aiokafka", "faust", "mode", "aiohttp", "kafka"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (module level or in a function), not the type checker's."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            visit(child)

    visit(tree)
    return found


@cache
def _imports(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """(modules of the package it imports, top-level names of the other packages it imports)."""
    path = _modules()[module]
    is_package = path.name == "__init__.py"
    internal: set[str] = set()
    external: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in _modules() else base
                     for alias in node.names]
        for name in names:
            if name == "skewwatch" or name.startswith("skewwatch."):
                while name not in _modules() and "." in name:  # `import skewwatch.a.b` names a module
                    name = name.rpartition(".")[0]
                internal.add(name)
            else:
                external.add(name.split(".")[0])
    internal.discard(module)
    return frozenset(internal), frozenset(external)


def _reached(module: str) -> set[str]:
    """The package's modules that importing ``module`` can run, itself included."""
    seen = {module}
    todo = [module]
    while todo:
        for other in _imports(todo.pop())[0]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_graph_reads_the_package() -> None:
    """Known edges, so that an empty or misread graph cannot pass the tests below."""
    assert "skewwatch.schemas.rejection" in _imports("skewwatch.schemas.dead_letter")[0]
    assert "orjson" in _imports("skewwatch.schemas.dead_letter")[1]
    assert "skewwatch.pipeline.moments" in _imports("skewwatch.pipeline.window.summary")[0]  # `from pkg import mod`


def test_schemas_import_nothing_of_the_engine() -> None:
    offenders = {}
    for module in _modules():
        if not _in(module, ("skewwatch.schemas",)):
            continue
        direct = {m for m in _imports(module)[0] if not _in(m, ("skewwatch.schemas", "skewwatch.gc_pause"))}
        engine = sorted(m for m in _reached(module) if _in(m, ENGINE))
        if direct or engine:
            offenders[module] = sorted(direct | set(engine))
    assert offenders == {}


def test_pipeline_reaches_no_agents_and_no_clients() -> None:
    offenders = {}
    for module in _modules():
        if not _in(module, ("skewwatch.pipeline",)):
            continue
        reached = _reached(module)
        agents = sorted(m for m in reached if _in(m, ("skewwatch.agents",)))
        clients = sorted({name for m in reached for name in _imports(m)[1]} & CLIENTS)
        if agents or clients:
            offenders[module] = agents + clients
    assert offenders == {}


# pipeline modules that still take WindowSettings from skewwatch.config's re-export instead of its home,
# skewwatch.pipeline.window_settings; an entry that no longer imports the loader fails the test below
CONFIG_IMPORT_PENDING: frozenset[str] = frozenset()


def test_pipeline_never_imports_the_settings_loader() -> None:
    """Neither directly nor through a module outside pipeline/ (imports inside functions count)."""
    direct = {}
    around = {}
    for module in _modules():
        if not _in(module, ("skewwatch.pipeline",)):
            continue
        imported = _imports(module)[0]
        if "skewwatch.config" in imported:
            direct[module] = "skewwatch.config"
        for other in sorted(imported):
            if other != "skewwatch.config" and not _in(other, ("skewwatch.pipeline",)) and \
                    "skewwatch.config" in _reached(other):
                around[module] = other
    assert around == {}, f"pipeline modules reaching skewwatch.config through another module: {around}"
    assert set(direct) == CONFIG_IMPORT_PENDING, (
        f"pipeline modules importing skewwatch.config: {sorted(direct)}; the settings types pipeline/ needs "
        "live in pipeline/ (skewwatch.pipeline.window_settings, skewwatch.pipeline.detector_settings)")


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return found


def test_no_import_cycles() -> None:
    assert _cycles({module: _imports(module)[0] for module in _modules()}) == []


def test_the_cycle_check_finds_cycles() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a", "e"}),
             "e": frozenset({"d"}), "f": frozenset({"a"})}
    assert _cycles(graph) == [["a", "b", "c"], ["d", "e"]]
