"""No function over 80 lines in engine/ and visualizers/ (its ``def`` to its last line, docstring and
decorators aside): a longer body is split into well-named pieces."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
PACKAGES = ("engine", "visualizers")

# being split by other work in progress (issue 24): each leaves this list when it is shortened
PENDING = {
    "engine/experiments/lesson4.py:run",
    "engine/experiments/lesson7.py:run",
    "engine/experiments/experts.py:run",
    "visualizers/kv_cache.py:_planner_lines",
    "visualizers/ring_chart.py:sweep_chart",
}


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


def test_no_new_function_over_80_lines():
    new = {name: size for name, size in _long_functions().items() if name not in PENDING}
    assert not new, f"functions over {MAX_LINES} lines (split them): {new}"


@pytest.mark.xfail(reason="lesson4/lesson7 run (helper model), the experts run (helper experts) and two "
                          "visualizer functions (helper views) are being split", strict=False)
def test_no_function_over_80_lines():
    assert not _long_functions()
