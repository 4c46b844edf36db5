"""`bench/gpu_check`, the script a GPU machine validates a release with: every lesson is in it, and
a run that ended well but whose own boolean figures say no is a FAIL."""
from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

from distai.lessons.registry import all_lessons


def _gpu_check():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(Path(__file__).parents[1] / "bench" / "gpu_check"))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_lesson_is_checked():
    assert set(_gpu_check().CHECKS) == {lesson.id for lesson in all_lessons()}


def test_a_false_figure_fails_the_lesson():
    falsified = _gpu_check().falsified
    assert falsified({"tp": {"equal": True, "all_reduces_per_token": 8}, "comm_match": True}) == []
    assert falsified({"tp": {"equal": False}, "pp": {"equal": True}, "memory_ok": False, "n": 0}) == ["tp.equal", "memory_ok"]
    # a prediction check: a miss that its causes explain passes, one they do not explain fails
    explained = {"name": "bubble", "predicted": 0.2, "measured": 0.3, "ok": False, "unit": "", "causes": {"cpu_contention": 0.1}}
    unexplained = {**explained, "causes": {"cpu_contention": 0.01}}
    assert falsified({"gpipe": {"bubble_check": explained}}) == []
    assert falsified({"gpipe": {"bubble_check": unexplained}}) == ["gpipe.bubble_check (not explained)"]
