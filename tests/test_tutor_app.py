"""The tutor driven through Textual's Pilot: home, lesson walk, language, help, palette, mouse."""
from __future__ import annotations

import dataclasses
from contextlib import asynccontextmanager

import pytest
from textual.widgets import Markdown, OptionList, Static

from distai.lessons.registry import Step, all_lessons, resolve_lesson
from distai.lessons.strings import translated
from distai.tutor.app import DistaiApp
from distai.tutor.progress import ProgressStore
from distai.tutor.screens import lesson as lesson_module
from distai.tutor.screens.help import HelpScreen
from distai.tutor.screens.home import HomeScreen
from distai.tutor.screens.lesson import LessonScreen, step_markdown
from distai.tutor.screens.step_text import keep_together
from pilot_harness import async_test, wait_for

SIZE = (120, 40)


def plain(widget: Static) -> str:
    content = widget.content
    return content.plain if hasattr(content, "plain") else str(content)


def shown(app) -> dict:
    screen = app.screen
    return {
        "counter": plain(screen.query_one("#step-counter")),
        "title": plain(screen.query_one("#step-title")),
        "lesson": plain(screen.query_one("#lesson-title")),
        "markdown": screen.query_one("#step-text", Markdown).source,
    }


def check_step(app, lesson, i, lang):
    step = lesson.steps[i]
    got = shown(app)
    assert got["counter"] == translated("tutor", "step_counter", lang, k=i + 1, n=len(lesson.steps))
    assert got["title"] == step.title[lang]
    assert lesson.title[lang] in got["lesson"]
    assert got["markdown"] == keep_together(step_markdown(lesson, step.key, lang))  # numbers kept with units


@async_test
async def test_home_lists_every_lesson_with_progress():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, HomeScreen)
        options = app.screen.query_one(OptionList)
        lessons = all_lessons()
        assert options.option_count == len(lessons) >= 8
        for i, lesson in enumerate(lessons):
            prompt = options.get_option_at_index(i)
            assert prompt.id == lesson.id
        details = app.screen.query_one("#details", Static)
        assert details.content is not None


@async_test
async def test_home_shows_best_quiz_and_mastery(isolated_distai_home):
    from distai.lessons.quiz import generators

    day = 86400.0
    with ProgressStore(isolated_distai_home / "progress.db") as store:
        store.record_quiz_session("lesson1", 4, 5)
        kind = next(iter(generators("lesson1")))
        # right, then right again once due a day later: Leitner box 3 counts as mastered
        store.record_quiz_answer("lesson1", kind, True, at=1000.0)
        store.record_quiz_answer("lesson1", kind, True, at=1000.0 + day + 1)
        store.record_quiz_answer("lesson2", next(iter(generators("lesson2"))), False, at=1000.0)
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        options = app.screen.query_one(OptionList)

        def row(i):
            return "".join(seg.text for seg in app.console.render(options.get_option_at_index(i).prompt))

        assert "best quiz 80%" in row(0)
        assert f"mastery {round(100 / len(generators('lesson1')))}%" in row(0)
        assert "quiz —" in row(1) and "mastery 0%" in row(1)
        assert "mastery" not in row(2)  # no answers yet: no mastery figure


@async_test
async def test_walk_lesson_forward_back_switch_language_and_quit(isolated_distai_home, monkeypatch):
    monkeypatch.setattr(LessonScreen, "DONE_AFTER_S", 0.01)  # every step shown counts as done here
    lesson = resolve_lesson("lesson1")
    n = len(lesson.steps)
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, LessonScreen) and app.screen.lesson.id == "lesson1"
        check_step(app, lesson, 0, "en")
        for i in range(1, n):
            await pilot.press("right" if i % 2 else "n")
            check_step(app, lesson, i, "en")
        await pilot.press("right")  # past the end: stays on the last step
        check_step(app, lesson, n - 1, "en")
        for i in range(n - 2, -1, -1):
            await pilot.press("left" if i % 2 else "p")
            check_step(app, lesson, i, "en")
        await pilot.press("left")
        check_step(app, lesson, 0, "en")

        await pilot.press("l")
        await pilot.pause()
        check_step(app, lesson, 0, "es")
        assert shown(app)["counter"] == f"Paso 1 de {n}"
        assert str(app.screen.query_one("#next").label) == "Siguiente ▶"
        await pilot.press("right")
        check_step(app, lesson, 1, "es")

        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, HomeScreen)
        # the home screen followed the language switch and shows the progress
        prompt = app.screen.query_one(OptionList).get_option_at_index(0).prompt
        rendered = "".join(seg.text for seg in app.console.render(prompt))
        assert lesson.title["es"] in rendered and f"pasos {n}/{n}" in rendered
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    assert not app.is_running

    with ProgressStore(isolated_distai_home / "progress.db") as store:
        assert store.steps_seen("lesson1") == {s.key for s in lesson.steps}
        assert store.summary()["lesson1"]["steps_done"] == n


@async_test
async def test_reopening_a_lesson_resumes_at_the_last_step_seen():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.open_lesson("lesson2")
        await pilot.pause()
        await pilot.press("right", "right")
        await pilot.press("q")
        app.open_lesson("zero-fsdp")
        await pilot.pause()
        assert app.screen.index == 2
        check_step(app, resolve_lesson(2), 2, "en")


@async_test
async def test_start_on_a_lesson_in_spanish_with_home_underneath():
    lesson = resolve_lesson("ring-allreduce")
    app = DistaiApp("es", lesson_id="1")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, LessonScreen)
        check_step(app, lesson, 0, "es")
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, HomeScreen)


@async_test
async def test_mouse_clicks_open_lessons_and_press_buttons():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        # lesson 2 occupies rows 3-4 of the list (border, then two rows per lesson)
        assert await pilot.click("#lesson-list", offset=(10, 3))
        await pilot.pause()
        assert isinstance(app.screen, LessonScreen) and app.screen.lesson.id == "lesson2"
        for button_id, expected in (("#next", 1), ("#next", 2), ("#prev", 1)):
            await pilot.click(button_id)
            await pilot.pause(0.3)  # a human does not click twice within a few milliseconds
            assert app.screen.index == expected


@async_test
async def test_help_overlay_lists_the_keys_and_closes():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter", "question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = app.screen.query_one("#help-keys", Static).content
        text = "".join(seg.text for seg in app.console.render(keys))
        for label in ("key_next", "key_prev", "key_quiz", "key_run", "key_lang", "key_back"):
            assert translated("tutor", label, "en") in text
        await pilot.press("escape")
        assert isinstance(app.screen, LessonScreen)


@async_test
async def test_quiz_screen_has_help_and_leaves_question_marks_out_of_the_answer(isolated_distai_home):
    """An audit found "?" typed into the quiz's answer box ("could not read '?'"), the only screen without help."""
    from distai.tutor.quiz_screen import QuizScreen

    app = DistaiApp("es")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter", "t")
        await pilot.pause()
        assert isinstance(app.screen, QuizScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = "".join(seg.text for seg in app.console.render(app.screen.query_one("#help-keys", Static).content))
        for label in ("key_quiz_enter", "key_quiz_option", "key_quiz_new", "key_quiz_back"):
            assert translated("tutor", label, "es") in text
        assert "16,6 GB" in text and "tolerancia" in text  # how an answer may be written
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, QuizScreen) and app.screen.query_one("#quiz-input").value == ""
        await pilot.press("1", ".", "5")  # every other key still goes to the answer
        assert app.screen.query_one("#quiz-input").value == "1.5"


@async_test
async def test_help_overlay_says_when_it_scrolls():
    """At 80x24 the lesson's keys do not fit: the frame says there is more (nothing showed it)."""
    for size, scrolls in (((80, 24), True), ((120, 40), False)):
        app = DistaiApp("es")
        async with app.run_test(size=size) as pilot:
            await pilot.press("enter")
            assert await wait_for(pilot, lambda: isinstance(app.screen, LessonScreen), 10)
            await pilot.press("question_mark")
            assert await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 10)
            await pilot.pause(0.3)
            box = app.screen.query_one("#help-box")
            assert (box.border_subtitle == translated("tutor", "help_scroll", "es")) == scrolls, size
            if scrolls:  # scrolled to the end, nothing is below: the hint goes
                box.scroll_end(animate=False)
                await pilot.pause(0.3)
                assert box.border_subtitle == ""


@async_test
async def test_the_visualizer_alone_takes_the_body_and_gives_it_back():
    """80x24 leaves the shared pane a handful of rows: V shows the visualizer alone, V or v brings the
    text back; the footer's palette key is in the learner's language."""
    app = DistaiApp("es", lesson_id="lesson4")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen, shared = app.screen, 0
        pane, text = screen.query_one("#visualizer-pane"), screen.query_one("#text-pane")
        for keys, alone in ((("v",), False), (("V",), True), (("V",), False), (("V",), True), (("v",), False)):
            await pilot.press(*keys)
            await pilot.pause()
            assert pane.display and text.display != alone, keys
            if alone:
                assert pane.region.height >= 24 - 6 > shared
            else:
                shared = pane.region.height
        palette = next(b for _k, b in app._bindings if b.action == "command_palette")
        assert palette.description == translated("tutor", "binding_palette", "es") == "paleta"
        await pilot.press("l")
        await pilot.pause()
        palette = next(b for _k, b in app._bindings if b.action == "command_palette")
        assert palette.description == "palette"


@async_test
async def test_command_palette_opens_lessons():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        commands = list(app.get_system_commands(app.screen))
        opens = [c for c in commands if c.title.startswith("Open lesson")]
        assert [c.title for c in opens] == [f"Open lesson {l.number}: {l.title['en']}" for l in all_lessons()]
        opens[4].callback()
        await pilot.pause()
        assert app.screen.lesson.id == "lesson5"
        # from inside a lesson, opening another one replaces it (no stacking)
        opens[2].callback()
        await pilot.pause()
        assert app.screen.lesson.id == "lesson3"
        assert [type(s).__name__ for s in app.screen_stack] == ["HomeScreen", "LessonScreen"]
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert type(app.screen).__name__ == "CommandPalette"
        # the palette lists them in course order (Textual's own provider sorts as text: 10 before 1)
        from distai.tutor.app import CourseOrderCommands

        assert CourseOrderCommands in DistaiApp.COMMANDS
        provider = CourseOrderCommands(app.screen)
        shown = [hit.text async for hit in provider.discover()]
        assert [t for t in shown if str(t).startswith("Open lesson")] == [c.title for c in opens]


@async_test
async def test_the_spanish_palette_says_every_command_in_spanish(tmp_path, monkeypatch):
    """Textual's own commands ("Theme", "Quit", "Keys" and its English key panel) and its "Search for
    commands…" sat among the Spanish ones: every command is the tutor's now, in the learner's language."""
    from textual.widgets import Input

    from distai.tutor.screens.help import HelpScreen

    app = DistaiApp("es")
    async with app.run_test(size=SIZE) as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        english = [t for t in titles if t in ("Theme", "Quit", "Keys", "Screenshot", "Maximize", "Minimize")]
        assert not english and {"Ayuda", "Tema", "Salir", "Captura de pantalla"} <= set(titles)
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert app.screen.query_one(Input).placeholder == "Buscar comandos…"
        await pilot.press("escape")
        await pilot.pause()
        monkeypatch.chdir(tmp_path)  # the screenshot lands in the folder the tutor was started from
        next(c for c in app.get_system_commands(app.screen) if c.title == "Captura de pantalla").callback()
        await pilot.pause()
        saved = list(tmp_path.glob("*.svg"))
        assert len(saved) == 1 and any("Captura guardada: " in str(n.message) and saved[0].name in str(n.message)
                                       for n in app._notifications)
        next(c for c in app.get_system_commands(app.screen) if c.title == "Ayuda").callback()
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)


@async_test
async def test_quiz_and_run_fall_back_when_their_screens_are_missing(monkeypatch):
    notes = []
    monkeypatch.setattr(lesson_module, "load_screen_class", lambda module, name: None)
    app = DistaiApp("en")
    monkeypatch.setattr(app, "notify", lambda message, **kw: notes.append(message))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter", "t", "r")
        await pilot.pause()
        assert isinstance(app.screen, LessonScreen)
    assert translated("tutor", "quiz_unavailable", "en") in notes and translated("tutor", "run_unavailable", "en") in notes


@async_test
async def test_quiz_and_run_open_their_screens_with_lesson_and_language(monkeypatch):
    from textual.screen import Screen

    opened = []

    class Fake(Screen):
        def __init__(self, lesson, language, **options):
            super().__init__()
            opened.append((lesson.id, language, *options.values()))

    monkeypatch.setattr(lesson_module, "load_screen_class", lambda module, name: Fake)
    app = DistaiApp("es")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter", "t")
        await pilot.pause()
        assert isinstance(app.screen, Fake)
        app.pop_screen()
        await pilot.click("#run")
        await pilot.pause()
        assert isinstance(app.screen, Fake)
    assert opened == [("lesson1", "es"), ("lesson1", "es", [])]  # the run with the lesson's [run] args: none


def test_load_screen_class_tells_missing_modules_apart():
    assert lesson_module.load_screen_class("distai.tutor.no_such_screen", "X") is None
    assert lesson_module.load_screen_class("distai.tutor.screens.help", "HelpScreen") is HelpScreen


def _fake_lesson(**step_fields):
    base = resolve_lesson("lesson1")
    steps = (Step(key="no-such-step", title={"en": "A step with no text", "es": "Un paso sin texto"},
                  **step_fields),
             base.steps[0])
    return dataclasses.replace(base, steps=steps, visualizer=None)


@asynccontextmanager
async def _fake_lesson_screen(**step_fields):
    """The tutor showing ``_fake_lesson(**step_fields)``'s first step: ``(app, pilot)``."""
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(LessonScreen(_fake_lesson(**step_fields)))
        await pilot.pause()
        yield app, pilot


@async_test
async def test_a_step_without_text_shows_a_note_not_a_crash():
    async with _fake_lesson_screen() as (app, pilot):
        md = shown(app)["markdown"]
        assert "not yet written" in md and "lessons/lesson1/en/no-such-step.md" in md
        await pilot.press("l")
        await pilot.pause()
        assert "aún no está escrito" in shown(app)["markdown"]


@async_test
async def test_code_step_shows_the_real_engine_source():
    from distai.tutor.code_source import read_source

    async with _fake_lesson_screen(code="distai.engine.runtime:init_distributed") as (app, pilot):
        code = app.screen.query_one("#code", Static)
        assert app.screen.query_one("#code-box").display
        listing = code.content
        assert listing.source.rstrip() == read_source("distai.engine.runtime:init_distributed").source.rstrip()
        assert listing.source.startswith("def init_distributed(")
        assert "init_distributed" in plain(app.screen.query_one("#code-title"))


@async_test
async def test_code_step_with_a_missing_name_says_so():
    async with _fake_lesson_screen(code="distai.engine.runtime:no_such_function") as (app, pilot):
        title = plain(app.screen.query_one("#code-title"))
        assert "Source not available" in title and "has no no_such_function" in title
        assert not app.screen.query_one("#code-box").display


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40)])
@async_test
async def test_layout_fits_down_to_80x24(size):
    width, height = size
    app = DistaiApp("es")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        home = app.screen
        for widget in home.query("#lesson-list, #lesson-details"):
            assert widget.region.right <= width and widget.region.bottom <= height
            assert widget.region.height >= 3
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        if height < 30:  # 80x24: the text takes the body, the visualizer waits on `v`
            assert not screen.query_one("#visualizer-pane").display
            assert screen.query_one("#text-pane").region.height >= height - 8
            await pilot.press("v")
            await pilot.pause()
        text = screen.query_one("#text-pane").region
        viz = screen.query_one("#visualizer-pane").region
        assert text.width >= 40 and text.height >= 5
        assert viz.height >= 5 and viz.right <= width and viz.bottom <= height
        if width < 100:
            assert screen.has_class("-narrow") and viz.y >= text.bottom  # below the text
        else:
            assert screen.has_class("-wide") and viz.x >= text.right  # beside the text
        for button_id in ("#prev", "#next", "#quiz", "#run"):
            region = screen.query_one(button_id).region
            assert region.width > 0 and region.right <= width and region.bottom <= height


@async_test
async def test_resize_switches_layouts_live():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.has_class("-wide")
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.screen.has_class("-narrow")
        assert not app.screen.query_one("#visualizer-pane").display  # 80x24: on `v`
        await pilot.press("v")
        assert app.screen.query_one("#visualizer-pane").display
        await pilot.press("v")
        assert not app.screen.query_one("#visualizer-pane").display


@async_test
async def test_recovered_database_is_announced(isolated_distai_home, monkeypatch):
    (isolated_distai_home / "progress.db").write_bytes(b"not a database" * 500)
    notes = []
    app = DistaiApp("en")
    monkeypatch.setattr(app, "notify", lambda message, **kw: notes.append((message, kw)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
    assert app.store.recovered_from
    assert any(msg == app.store.recovered_from and kw.get("severity") == "warning" for msg, kw in notes)
    assert list(isolated_distai_home.glob("progress.db.corrupt-*"))


@async_test
async def test_every_lesson_opens_in_the_tutor_with_its_visualizer():
    """Each lesson's first and last step render (text, code, visualizer) in both languages."""
    from distai.visualizers.base import LessonVisualizer, visualizer_class

    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        for lesson in all_lessons():
            app.open_lesson(lesson.id)
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, LessonScreen) and screen.lesson.id == lesson.id
            last = len(lesson.steps) - 1
            for i in (0, last):
                await screen.show_step(i)
                check_step(app, lesson, i, app.language)
                name = lesson.steps[i].visualizer or lesson.visualizer
                expected = visualizer_class(name)
                assert isinstance(screen.visualizer, LessonVisualizer)
                if expected is not None:  # the lesson's own widget, not the placeholder
                    assert isinstance(screen.visualizer, expected)
            await app.action_toggle_language()
            check_step(app, lesson, last, app.language)
            app.pop_screen()
            await pilot.pause()
        assert isinstance(app.screen, HomeScreen)


@async_test
async def test_a_boundary_key_pressed_again_replaces_its_toast():
    """Issue 27.5: ← held on the first step stacked one toast per press over the text."""
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.open_lesson("lesson1")
        await pilot.pause()
        for _ in range(4):
            await pilot.press("left")
            await pilot.pause(0.1)
        # the app's notifications are what its toast rack draws (headless runs mount no rack)
        shown = [n.message for n in app._notifications]
        assert shown == [translated("tutor", "first_step", "en")], shown


@async_test
async def test_paging_through_marks_no_step_done_but_a_moment_or_the_end_does(isolated_distai_home, monkeypatch):
    """Issue 27.7: → through a lesson marked every step done (pasos 10/10)."""
    lesson = resolve_lesson("lesson1")
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.open_lesson("lesson1")
        await pilot.pause()
        for _ in lesson.steps:
            await pilot.press("right")
        await pilot.pause()
        assert app.steps_seen("lesson1") == set()  # paged through: nothing read yet
        screen = app.screen
        assert screen.index == len(lesson.steps) - 1
        await pilot.press("q")
        app.open_lesson("lesson1")  # resumes where the learner was, done or not
        await pilot.pause()
        screen = app.screen
        assert screen.index == len(lesson.steps) - 1
        await pilot.press("left")
        await pilot.pause()
        pane = screen.query_one("#text-pane")
        assert pane.max_scroll_y > 0
        pane.scroll_end(animate=False)  # read to its end
        await pilot.pause()
        assert app.steps_seen("lesson1") == {lesson.steps[-2].key}
        monkeypatch.setattr(LessonScreen, "DONE_AFTER_S", 0.3)
        await pilot.press("left")
        await pilot.pause(0.6)  # a moment on it
        assert app.steps_seen("lesson1") == {lesson.steps[-2].key, lesson.steps[-3].key}


@pytest.mark.parametrize("lang", ["en", "es"])
@async_test
async def test_every_footer_key_fits_at_80_columns(lang):
    """Issue 27.6: at 80x24 the footer's `q` label was cut."""
    app = DistaiApp(lang)
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_lesson("lesson1")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, LessonScreen)
        shown = [b for _, b in screen.active_bindings.items() if b.binding.show]
        for _ in range(20):  # the footer recomposes once the bindings are localized
            keys = list(screen.query("FooterKey"))
            if keys and all(key.region.width for key in keys):
                break
            await pilot.pause(0.1)
        from textual.widgets import Footer

        footer = screen.query_one(Footer)
        assert keys and footer.virtual_size.width <= 80, [(k.description, k.region) for k in keys]
        assert translated("tutor", "binding_back", lang) in [k.description for k in keys], shown


def test_every_visualizer_has_a_name_in_each_language():
    """The visualizer pane's title names it in the learner's language ("visualizador: anillo", not ": ring")."""
    from distai.lessons.strings import strings

    names = {step.visualizer or lesson.visualizer for lesson in all_lessons() for step in lesson.steps} - {None}
    for lang in ("en", "es"):
        shown = strings("tutor", lang)["visualizer_names"]
        assert names <= set(shown), (lang, names - set(shown))
    assert translated("tutor", "visualizer_names.ring", "es") == "anillo"


@async_test
async def test_a_progress_write_the_database_cannot_take_is_said_once_and_the_lesson_goes_on(isolated_distai_home):
    # another process holding the progress database past the wait made the step's write raise inside the app,
    # which ended the tutor
    from distai.tutor.progress import ProgressError

    store = ProgressStore()

    def held(*args):
        raise ProgressError(texts={"en": "the progress database is held by another distai",
                                   "es": "la base de datos de progreso la tiene ocupada otro distai"})

    store.mark_step_seen = held
    store.set_position = held
    app = DistaiApp("es", store=store)
    async with app.run_test(size=SIZE) as pilot:
        app.open_lesson("lesson1")
        await pilot.pause()
        await pilot.press("right", "right")
        await pilot.pause()
        assert app.screen.index == 2 and app.is_running
        said = [n.message for n in app._notifications]
        assert sum("ocupada otro distai" in m for m in said) == 1, said
    store.close()


@pytest.mark.parametrize("lang", ["en", "es"])
@async_test
async def test_the_lesson_buttons_read_whole_at_70_columns(lang):
    # Textual's 16-cell minimum per button pushed the run button past the edge: "Ejecutar experi"
    app = DistaiApp(lang)
    async with app.run_test(size=(70, 20)) as pilot:
        app.open_lesson("lesson5")
        await pilot.pause()
        for name in ("prev", "next", "quiz", "run"):
            button = app.screen.query_one(f"#{name}")
            label = str(button.label)
            assert button.region.right <= 70 and button.size.width >= len(label), (name, button.region, label)


@pytest.mark.parametrize("lang,width,compact", [("en", 100, False), ("es", 100, True), ("es", 102, False),
                                                ("es", 90, True)])
@async_test
async def test_the_lesson_footer_compacts_where_its_words_do_not_fit(lang, width, compact):
    # Spanish's whole footer needs 102 columns: at 100 it stayed whole and its last key was cut ("q Volve▏")
    from textual.widgets import Footer

    app = DistaiApp(lang)
    async with app.run_test(size=(width, 30)) as pilot:
        app.open_lesson("lesson1")
        for _ in range(4):
            await pilot.pause()
        footer = app.screen.query_one(Footer)
        assert footer.compact == compact
        assert sum(key.outer_size.width for key in footer.children) <= width


def test_a_tutor_whose_exit_stalls_still_ends_with_its_code():
    """With its terminal closed, a tutor's exit could wait without end inside Textual's driver (11 of 20 tutors
    whose tmux session was killed were still there an hour later). Once its screens are gone the tutor arms a
    watchdog: a process stuck after that ends by itself, with the tutor's exit code."""
    import subprocess
    import sys
    import time

    code = ("import threading\n"
            "from distai.tutor.app import end_after\n"
            "end_after(0.5, 129)\n"
            "threading.Event().wait()  # the stalled shutdown\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 129 and time.monotonic() - started < 30, out
