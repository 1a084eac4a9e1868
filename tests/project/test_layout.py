"""The package keeps the shape docs/architecture.md describes (issue 14): small modules,
bounded classes, and imports that never go round in a circle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "toolkit"
#: The longest module and the longest class, lines (STYLE.md: small, well-named modules).
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 450


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports when it is imported (not under
    ``TYPE_CHECKING``, not inside a function)."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[: len(package) - node.level + 1], base])
                for alias in node.names:
                    full = f"{base.rstrip('.')}.{alias.name}"
                    found.add(full if full in modules else base.rstrip("."))
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text()).body)
    return {module for module in found if module in modules and module != name}


def test_no_module_or_class_is_too_long() -> None:
    long = []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{name}.{node.name}: a class of {lines} lines")
    assert not long, long


def test_the_package_has_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"an import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_import_reader_sees_what_a_module_imports() -> None:
    modules = _modules()
    task = _imported("toolkit.engine.task", modules["toolkit.engine.task"], modules)
    assert {"toolkit.checkpoint", "toolkit.engine.protocol", "toolkit.store.writes"} <= task
    package = _imported("toolkit.engine", modules["toolkit.engine"], modules)
    assert "toolkit.engine.interpreter" in package  # a package's own re-exports count
