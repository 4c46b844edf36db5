"""One control scheme for the visualizers (issue 20): keys work without focusing the visualizer,
the lesson's keys always win, and `?` lists every visualizer's controls."""
from __future__ import annotations

import asyncio
import re

from distai.lessons.registry import all_lessons, resolve_lesson
from distai.lessons.strings import has
from distai.tutor.app import DistaiApp
from distai.tutor.screens.help import HelpScreen
from distai.tutor.screens.lesson import LessonScreen
from distai.visualizers.base import LESSON_KEYS, visualizer_class


def _visualizers():
    names = {step.visualizer or lesson.visualizer for lesson in all_lessons() for step in lesson.steps}
    classes = [visualizer_class(name) for name in sorted(n for n in names if n)]
    return [cls for cls in classes if cls is not None]


def test_every_visualizer_declares_its_controls_and_leaves_the_lesson_keys_alone():
    classes = _visualizers()
    assert len(classes) >= 7
    for cls in classes:
        assert cls.CONTROLS, f"{cls.__name__} declares no controls"
        for control in cls.CONTROLS:
            assert set(control.key_names()).isdisjoint(LESSON_KEYS), (cls.__name__, control)
            # what it does is a string of the catalog (the key_actions table of its area), in both languages
            assert control.text("en") and control.text("es"), (cls.__name__, control)
            assert has(*control.catalog_key()), (cls.__name__, control.label)
            for lang in ("en", "es"):  # keys read as a learner types them, not as Textual names them
                assert not re.search(r"[a-z]_[a-z]", control.shown(lang)), (cls.__name__, control.shown(lang))
        keys = [k for c in cls.CONTROLS for k in c.key_names()]
        assert len(keys) == len(set(keys)), f"{cls.__name__} binds a key twice"
        for lang in ("en", "es"):
            widget = cls(language=lang)
            assert len(widget.key_help()) == len(cls.CONTROLS)
            assert widget.controls_hint().endswith(("? all keys", "? todas las teclas"))
            for view, names in cls.HINTS.items():  # a view's hint names controls that exist, each once
                assert sorted(names) == sorted({c.name for c in cls.CONTROLS} & set(names)), (cls.__name__, view)


def test_every_step_view_gives_settings_its_visualizer_reads():
    for lesson in all_lessons():
        for step in lesson.steps:
            cls = visualizer_class(step.visualizer or lesson.visualizer)
            if cls is None or not cls.STEP_SETTINGS:
                continue
            unknown = set(step.view) - cls.STEP_SETTINGS
            assert not unknown, f"{lesson.id}/{step.key}: view sets {sorted(unknown)}, {cls.__name__} reads none of them"
            if "show" in step.view and cls.VIEWS:
                widget = cls()
                widget.show_step(step.key)
                assert widget.view == step.view["show"] or step.view["show"] == "run", (lesson.id, step.key)


def test_keys_reach_the_visualizer_without_focus_and_lesson_keys_always_work():
    async def go():
        app = DistaiApp("en")
        async with app.run_test(size=(120, 40)) as pilot:
            lesson = resolve_lesson("lesson1")
            screen = LessonScreen(lesson, start=lesson.step_index("allreduce"))
            await app.push_screen(screen)
            await pilot.pause()
            ring = screen.visualizer
            assert app.focused is not ring and not ring.playing
            await pilot.press("space")  # "Press space to play." works as written
            assert ring.playing
            await pilot.press("space", "full_stop", "full_stop")
            assert not ring.playing and ring.frame == 2
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            rows = app.screen.visualizer_keys
            assert ("space", "play / pause") in rows and (". / ,", "step forward / back") in rows
            await pilot.press("escape")
            await app.pop_screen()
            lesson7 = resolve_lesson("lesson7")
            screen = LessonScreen(lesson7)
            await app.push_screen(screen)
            await pilot.pause()
            screen.visualizer.focus()  # even when the visualizer has focus, t and p are the lesson's
            await pilot.press("right", "right", "p")
            assert screen.index == 1
            await pilot.press("t")
            assert type(app.screen).__name__ == "QuizScreen"

    asyncio.run(go())


def test_a_short_pane_names_the_key_that_gives_the_visualizer_room():
    """At 80x24 lesson 5's pipeline showed 2 of its 4 rows, with no mark of the cut (an audit): now every cut
    is marked, and the mark names the lesson screen's V while the text shares the screen, and no key once
    the visualizer has it all."""
    import asyncio

    from distai.tutor.app import DistaiApp
    from pilot_harness import lesson_step

    async def main():
        app = DistaiApp("en")
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await lesson_step(app, pilot, "lesson5", "1f1b")
            vis = screen.visualizer
            lines = [ln.plain for ln in vis.build_lines(vis.content_size.width, 8)]
            assert len(lines) == 8 and lines[-2].startswith("▼") and "(V, or a taller terminal)" in lines[-2]
            assert "? all keys" in lines[-1]  # the hint stays
            await pilot.press("V")
            await pilot.pause()
            lines = [ln.plain for ln in vis.build_lines(vis.content_size.width, 8)]
            assert "a taller terminal shows them" in lines[-2]

    asyncio.run(main())
