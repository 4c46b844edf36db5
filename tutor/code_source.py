"""The source of the engine function a step teaches, read from its file without importing it.

A step's ``code = "distai.engine.ring:ring_allreduce"`` names a module and a qualified name.
Importing engine modules imports torch, which the tutor must not do, so the module's file is
located with ``importlib.util.find_spec`` (which imports only the parent packages, and those
import nothing heavy), parsed with ``ast``, and the definition's lines are returned verbatim:
the code the learner reads is the code that runs.
"""
from __future__ import annotations

import ast
import importlib.util
import textwrap
from dataclasses import dataclass
from pathlib import Path


class CodeNotFound(LookupError):
    """The module or the name does not exist; the message says which, in one line."""


@dataclass(frozen=True)
class CodeSource:
    module: str
    qualname: str
    path: Path
    start_line: int  # 1-based, first decorator included
    end_line: int
    source: str  # dedented

    @property
    def where(self) -> str:
        return f"{self.module}:{self.qualname} ({self.path.name}:{self.start_line})"


def _children(node: ast.AST) -> list[ast.stmt]:
    return getattr(node, "body", [])


def _name_of(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def find_definition(tree: ast.Module, qualname: str) -> ast.stmt | None:
    """The node defining ``qualname`` (``func``, ``Class``, ``Class.method``) in ``tree``."""
    scope: ast.AST = tree
    found: ast.stmt | None = None
    for part in qualname.split("."):
        found = None
        # the last definition wins, as at run time
        for node in _children(scope):
            if part in _name_of(node):
                found = node
        if found is None:
            return None
        scope = found
    return found


def parse_spec(spec: str) -> tuple[str, str]:
    module, sep, qualname = spec.partition(":")
    if not sep or not module or not qualname:
        raise CodeNotFound(f"{spec!r} is not of the form 'module:qualname'")
    return module.strip(), qualname.strip()


def module_file(module: str) -> Path:
    """The ``.py`` file of ``module``, found without importing the module itself or any package below the
    top two levels (``find_spec`` runs every parent's ``__init__``: ``distai.engine.tensor_parallel``'s
    imports torch, and showing lesson 4's code loaded it into the tutor, 210 MB and 1.6 s): the top
    (``distai.engine``, whose ``__init__`` imports nothing) through importlib, the rest by its folders."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        raise CodeNotFound(f"module {module} not found ({exc})") from None
    if spec is None:
        raise CodeNotFound(f"module {module} not found")
    found = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    for part in parts[2:]:
        found = next((f for d in folders for f in (d / part / "__init__.py", d / f"{part}.py") if f.is_file()), None)
        folders = [d / part for d in folders if (d / part).is_dir()]
    if found is None:
        raise CodeNotFound(f"module {module} not found")
    return found


def read_source(spec: str) -> CodeSource:
    """The definition named by ``"module:qualname"``, read from the module's file."""
    module, qualname = parse_spec(spec)
    path = module_file(module)
    text = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise CodeNotFound(f"{path.name} does not parse ({exc.msg}, line {exc.lineno})") from None
    node = find_definition(tree, qualname)
    if node is None:
        raise CodeNotFound(f"{module} has no {qualname}")
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    end = node.end_lineno or node.lineno
    lines = text.splitlines()[start - 1:end]
    return CodeSource(module, qualname, path, start, end, textwrap.dedent("\n".join(lines)))
