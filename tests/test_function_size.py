"""No function over 80 lines in engine/ and visualizers/ (its ``def`` to its last line, docstring and
decorators aside): a longer body is split into well-named pieces."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
PACKAGES = ("engine", "visualizers")


def _long_functions() -> dict[str, int]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    size = node.end_lineno - node.lineno + 1
                    if size > MAX_LINES:
                        found[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = size
    return found


def test_no_function_over_80_lines():
    long = _long_functions()
    assert not long, f"functions over {MAX_LINES} lines (split them): {long}"
