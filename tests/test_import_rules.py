"""The import graph, read from the files alone (no installing, no importing).

The four packages (``engine/``, ``lessons/``, ``visualizers/``, ``tutor/``) install as ``distai.*``
and import each other relatively, so a reader or a tool can follow every edge in a checkout. Data
flows one way: lesson models -> visualizers -> tutor; engine -> events -> tutor. This test walks
the AST of every module and fails on an import that breaks those rules; one test then imports the
visualizers for real, to confirm that none of them loads torch.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "lessons", "visualizers", "tutor")

# What each package may not import, at any depth of the file (inside functions too).
FORBIDDEN = {
    "engine": ("textual", "distai.visualizers", "distai.tutor"),
    "visualizers": ("torch", "distai.engine", "distai.tutor"),
    "lessons": ("torch", "textual", "distai.engine", "distai.visualizers", "distai.tutor"),
    "tutor": (),
}
# What the CLI and the tutor may not pull in while their modules load (`distai --help` and
# `distai tutor` start without torch): checked over the transitive module-level import graph.
NOT_AT_STARTUP = ("torch",)


@dataclass(frozen=True)
class Import:
    module: str          # the imported module, absolute ("distai.engine.events", "torch.nn")
    line: int
    relative: bool       # written with leading dots
    top_level: bool      # runs when the importing module loads (not inside a def, not TYPE_CHECKING)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["distai", *parts])


def package_of(path: Path) -> str:
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


MODULES = {module_name(p): p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    pkg = package_of(path)
    found: list[Import] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                visit(child, False)
            elif isinstance(child, ast.Import):
                found.extend(Import(a.name, child.lineno, False, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = pkg.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append(Import(target, child.lineno, bool(child.level), top))
                for alias in child.names:  # `from . import units` imports a submodule
                    sub = f"{target}.{alias.name}"
                    if sub in MODULES:
                        found.append(Import(sub, child.lineno, bool(child.level), top))
            else:
                visit(child, top)

    visit(tree, True)
    return found


@functools.cache
def graph() -> dict[str, list[Import]]:
    """Every module's imports, parsed on first use rather than while each pytest-xdist worker collects (2 s)."""
    return {name: imports_of(path) for name, path in MODULES.items()}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_checkout_has_the_four_packages():
    assert {name.split(".")[1] for name in MODULES} == set(PACKAGES)
    assert len(MODULES) > 50


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_inside_the_packages_are_relative(name):
    absolute = [f"line {i.line}: {i.module}" for i in graph()[name]
                if _under(i.module, "distai") and not i.relative]
    assert not absolute, f"{MODULES[name]} imports distai.* absolutely: {absolute}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_relative_imports_resolve_to_files(name):
    missing = [f"line {i.line}: {i.module}" for i in graph()[name]
               if i.relative and i.module not in MODULES]
    # `from .x import name` may import a name from module x; x itself must exist.
    assert not missing, f"{MODULES[name]} imports modules that are not in the checkout: {missing}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_data_flows_one_way(name):
    top = name.split(".")[1]
    bad = [f"line {i.line}: {i.module}" for i in graph()[name]
           for banned in FORBIDDEN[top] if _under(i.module, banned)]
    assert not bad, f"{MODULES[name]} ({top}/) must not import {FORBIDDEN[top]}: {bad}"


def startup_closure(start: str) -> dict[str, str]:
    """Every module loaded when ``start`` is imported, each with the module that pulled it in."""
    seen = {start: ""}
    todo = [start]
    while todo:
        current = todo.pop()
        parents = current.split(".")
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        chain = [".".join(parents[:k]) for k in range(2, len(parents))]
        for mod in chain:
            if mod in MODULES and mod not in seen:
                seen[mod] = current
                todo.append(mod)
        for imp in graph().get(current, ()):
            if imp.top_level and imp.module not in seen:
                seen[imp.module] = current
                if imp.module in MODULES:
                    todo.append(imp.module)
    return seen


def _chain(seen: dict[str, str], module: str) -> str:
    path = [module]
    while seen.get(path[-1]):
        path.append(seen[path[-1]])
    return " <- ".join(path)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _under(n, "distai.tutor")))
def test_the_tutor_and_cli_start_without_torch(name):
    seen = startup_closure(name)
    heavy = [_chain(seen, m) for m in seen for banned in NOT_AT_STARTUP if _under(m, banned)]
    assert not heavy, f"loading {name} imports torch at module level: {heavy}"


def test_the_visualizers_load_without_torch():
    """What the static rules promise, seen in a fresh interpreter: the first visualizer that loads torch."""
    modules = [module for module in sorted(MODULES) if _under(module, "distai.visualizers")]
    code = ("import importlib, sys\n"
            "for module in sys.argv[1:]:\n"
            "    importlib.import_module(module)\n"
            "    if 'torch' in sys.modules:\n"
            "        print(module)\n"
            "        break\n")
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {out.stdout.strip()} loads torch"


def test_the_rules_catch_a_violation(tmp_path):
    """The walker sees imports inside functions and resolves relative ones (so the rules can fail)."""
    pkg = ROOT / "engine"
    fake = pkg / "_import_rules_probe.py"
    fake.write_text("def f():\n    from textual.app import App\n    from ..tutor.cli import app\n")
    try:
        found = imports_of(fake)
    finally:
        fake.unlink()
    assert Import("textual.app", 2, False, False) in found
    assert Import("distai.tutor.cli", 3, True, False) in found
