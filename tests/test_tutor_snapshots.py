"""SVG snapshots of the home and lesson screens (pytest-textual-snapshot).

Deterministic: TEXTUAL_ANIMATIONS=none and a fresh DISTAI_HOME (conftest.py), fixed sizes. The
lesson snapshots use a fixed stand-in lesson (fixed text, no visualizer), so that they test the
tutor's own layout and do not change whenever a lesson's text or visualizer changes. Regenerate
after an intended change with ``python -m pytest tests/test_tutor_snapshots.py --snapshot-update``
and look at the SVGs under ``tests/__snapshots__/``.
"""
from __future__ import annotations

import dataclasses

import pytest

from distai.lessons.registry import Step, resolve_lesson
from distai.tutor.app import DistaiApp
from distai.tutor.screens import lesson as lesson_module
from distai.tutor.screens.lesson import LessonScreen

TEXT = """\
## Averaging gradients

Each of the **N** replicas computes the gradient of its own shard of the batch; the
all-reduce *averages* them, so every replica takes the same step:

- compute `g_i` on shard *i*
- all-reduce: `g = (g_0 + … + g_{N-1}) / N`
- every rank applies `w ← w − η·g`

```python
dist.all_reduce(grad, op=dist.ReduceOp.SUM)
grad /= world_size
```

> Try it: press **r** to run the experiment.
"""


def stand_in_lesson():
    base = resolve_lesson("lesson1")
    steps = tuple(
        Step(key=f"s{i}", title={"en": f"Stand-in step {i}", "es": f"Paso de prueba {i}"})
        for i in range(1, 5))
    return dataclasses.replace(base, steps=steps, visualizer=None)


@pytest.fixture
def fixed_text(monkeypatch):
    monkeypatch.setattr(lesson_module, "step_markdown", lambda lesson, key, lang: TEXT)


def _open(lesson, start=0):
    async def run_before(pilot):
        pilot.app.push_screen(LessonScreen(lesson, start=start))
        await pilot.pause()
    return run_before


def test_home_screen(snap_compare):
    assert snap_compare(DistaiApp("en"), terminal_size=(120, 40))


def test_home_screen_narrow_spanish(snap_compare):
    assert snap_compare(DistaiApp("es"), terminal_size=(80, 24))


def test_lesson_screen(snap_compare, fixed_text):
    assert snap_compare(DistaiApp("en"), terminal_size=(120, 40),
                        run_before=_open(stand_in_lesson(), start=1))


def test_lesson_screen_narrow(snap_compare, fixed_text):
    assert snap_compare(DistaiApp("en"), terminal_size=(80, 24),
                        run_before=_open(stand_in_lesson()))
