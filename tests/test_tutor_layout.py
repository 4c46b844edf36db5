"""The tutor's layout at 80x24 as a learner sees it: titles cut before what follows them, panes that say
they scroll, the focus where the scroll keys need it, the first frame laid out for the terminal, and
the run panel's status and check table."""
from __future__ import annotations

import re
import threading

import pytest
from textual.app import App
from textual.widgets import RichLog, Static

from distai.lessons.registry import resolve_lesson
from distai.lessons.strings import translated
from distai.tutor.app import DistaiApp
from distai.tutor.run_panel import RunPanelScreen
from distai.tutor.screens.help import HelpScreen
from pilot_harness import async_test

SMALL = (80, 24)


def screen_lines(app) -> list[str]:
    """The current screen's rows as plain text."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def rendered(widget: Static) -> str:
    return str(widget.render())


# -- lesson screen --------------------------------------------------------------------------------
@pytest.mark.parametrize("lesson_id,lang", [("lesson4", "es"), ("context", "es"), ("capstone", "es"),
                                            ("lesson7", "en")])
@async_test
async def test_a_long_lesson_title_is_cut_with_an_ellipsis_before_its_duration(lesson_id, lang):
    """`…el bloque Transformer comple…80 min`: the cut title ran into the duration."""
    lesson = resolve_lesson(lesson_id)
    duration = translated("tutor", "minutes", lang, m=lesson.duration_min)
    for size in (SMALL, (60, 24), (100, 30)):
        app = DistaiApp(lang, lesson_id=lesson_id)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            bar = screen_lines(app)[0].rstrip()
            assert bar.endswith(" " + duration), (size, bar)
            if lesson.title[lang] not in bar:  # cut: with an ellipsis
                assert re.search(r"… +" + re.escape(duration) + "$", bar), (size, bar)
            assert size != SMALL or lesson.title[lang] not in bar  # 80 columns cut each of these


@async_test
async def test_the_first_frame_is_laid_out_for_the_terminal(monkeypatch):
    """Lesson 7 at 80x24: the visualizer was first drawn 28 columns wide beside the text (its x-axis
    wrapped), the layout of 120 columns, before the screen's breakpoints came."""
    from distai.visualizers import kv_cache

    widths: list[int] = []
    build = kv_cache.VISUALIZER.build_lines

    def spy(self, width, height=None):
        widths.append(width)
        return build(self, width, height)

    monkeypatch.setattr(kv_cache.VISUALIZER, "build_lines", spy)
    app = DistaiApp("es", lesson_id="lesson7")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        assert app.screen.has_class("-narrow") and app.screen.has_class("-short")
        await pilot.press("v")
        await pilot.pause()
        assert widths and min(widths) >= 70, widths  # stacked under the text, the terminal's width


@async_test
async def test_the_text_keeps_the_scroll_keys_after_the_visualizer_alone():
    """Lesson 8 at 80x24: v, V, V, n then PageDown/End scrolled nothing until Tab."""
    app = DistaiApp("es", lesson_id="experts")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        screen = app.screen
        text = screen.query_one("#text-pane")
        for key in ("v", "V", "V"):
            await pilot.press(key)
            await pilot.pause()
        assert app.focused is text
        await pilot.press("n")
        await pilot.pause()
        assert app.focused is text and screen.index == 1
        await pilot.press("pagedown")
        await pilot.pause()
        assert text.scroll_y > 0
        scrolled = text.scroll_y
        await pilot.press("down")  # (End and Home drive the visualizer's playback while it shows)
        await pilot.pause()
        assert text.scroll_y == scrolled + 1
        await pilot.press("V", "v")  # v from the visualizer alone gives the text back too
        await pilot.pause()
        assert app.focused is text


@async_test
async def test_the_help_says_more_below_until_its_last_row_shows():
    """End showed `Pulsa Esc, q o ? para cerrar.` while the frame still said there was more: the hint
    went only when the animated scroll reached the end of its float, a second later."""
    app = DistaiApp("es", lesson_id="lesson6")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("#help-box")
        hint = translated("tutor", "help_scroll", "es")
        assert box.border_subtitle == hint and box.max_scroll_y > 0
        box.scroll_y = box.max_scroll_y - 0.4  # where an animated End draws the last row already
        await pilot.pause()
        assert box.border_subtitle == ""
        await pilot.press("home")
        await pilot.pause()
        assert box.border_subtitle == hint
        await pilot.press("end")
        await pilot.pause()
        assert box.border_subtitle == ""


# -- home -----------------------------------------------------------------------------------------
@async_test
async def test_home_details_show_the_summary_and_say_they_scroll():
    """80x24, lesson 1: the summary was cut at its border (`gigante.` lost) with nothing saying so."""
    app = DistaiApp("es")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        await pilot.pause()
        box = app.screen.query_one("#lesson-details")
        shown = " ".join(line.strip("│ ") for line in screen_lines(app)[box.region.y:box.region.bottom])
        summary = resolve_lesson("lesson1").summary["es"]
        assert " ".join(summary.split()) in " ".join(shown.split())
        hint = translated("tutor", "details_scroll", "es")
        assert box.max_scroll_y > 0 and box.border_subtitle == hint
        await pilot.press("tab")  # Tab reaches the details, and the keys scroll them
        assert app.focused is box
        await pilot.press("end")
        await pilot.pause()
        assert box.scroll_y == box.max_scroll_y and box.border_subtitle == ""
        await pilot.press("home")
        await pilot.pause()
        assert box.border_subtitle == hint
    app = DistaiApp("en")
    async with app.run_test(size=(200, 60)) as pilot:  # all of it fits: no hint
        await pilot.pause()
        await pilot.pause()
        box = app.screen.query_one("#lesson-details")
        assert box.max_scroll_y == 0 and box.border_subtitle == ""


# -- run panel ------------------------------------------------------------------------------------
class SilentLaunch:
    """A launch whose events the test feeds itself (``screen._consume``), held until stopped."""

    class spec:
        class placement:
            nproc = 4

    class record:
        id = "fake-run"
        path = "/tmp/fake-run"

    def __init__(self, lesson, consumer, nproc=None, args=None):
        self.stopped = threading.Event()

    @property
    def stopping(self):
        return self.stopped.is_set()

    def stop(self, reason="stopped"):
        self.stopped.set()

    def run(self):
        self.stopped.wait(30)


class PanelApp(App):
    def __init__(self, lesson_id: str, lang: str):
        super().__init__()
        self.lesson_id, self.lang = lesson_id, lang

    def on_mount(self):
        self.push_screen(RunPanelScreen(resolve_lesson(self.lesson_id), self.lang, launch_factory=SilentLaunch))


def feed(screen: RunPanelScreen, *events: dict) -> None:
    for e in events:
        screen._consume({"t": 1000.0, **e})
        if e["kind"] == "run_end":
            screen.launch.stop()  # its thread goes too
    screen._drain()


CHECKS = [
    {"kind": "check", "rank": 0, "name": "allreduce_small", "predicted": 0.00128, "measured": 0.00329, "unit": "s",
     "tolerance": 0.1, "ok": False, "causes": {"size_regime": -0.0011, "links_at_once": -0.0001,
                                               "reduction": 5.2e-06, "ring_schedule": 0.00045,
                                               "cpu_contention": 0.00275}},
    {"kind": "check", "rank": 0, "name": "allreduce_large", "predicted": 0.0581, "measured": 0.0595, "unit": "s",
     "tolerance": 0.1, "ok": True, "causes": {}},
]


@async_test
async def test_run_panel_title_is_cut_with_an_ellipsis():
    app = PanelApp("capstone", "es")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        title = screen_lines(app)[0].rstrip()
        assert title.startswith(" Ejecución · lección 10") and title.endswith("…"), title
        app.screen.action_stop()


@async_test
async def test_run_status_counts_steps_only_in_training_and_says_when_the_ranks_close():
    app = PanelApp("lesson1", "en")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        screen = app.screen
        status = screen.query_one("#run-status", Static)
        feed(screen, {"kind": "run_start", "run_id": "fake-run", "nproc": 4, "device": "cpu", "lesson": "lesson1"},
             {"kind": "phase", "name": "start", "n": 4, "backend": "gloo", "rank": 0},
             {"kind": "phase", "name": "train", "steps": 4, "rank": 0},
             *({"kind": "step", "step": i, "of": 4, "loss": 2.0 - i / 4, "rank": 0} for i in range(4)),
             {"kind": "progress", "done": 4, "total": 8, "rank": 0})
        assert "step 4/4" in rendered(status)
        feed(screen, {"kind": "phase", "name": "sweep", "rank": 0}, {"kind": "progress", "done": 8, "total": 8, "rank": 0})
        assert "running" in rendered(status) and "step" not in rendered(status), rendered(status)
        feed(screen, {"kind": "summary", "rank": 0, "steps": 4})  # the ranks are done; torchrun closes them
        shown = rendered(status)
        assert translated("run", "closing", "en") in shown and "running" not in shown and "phase" not in shown
        feed(screen, {"kind": "run_end", "status": "ok", "error": None, "exit_code": 0, "failed_rank": None,
                      "tail": [], "duration_s": 1.0})
        shown = rendered(status)
        assert shown.startswith("finished") and "step" not in shown and "closing" not in shown


@pytest.mark.parametrize("size,in_log", [(SMALL, True), ((120, 40), False)])
@async_test
async def test_the_check_table_is_reachable_once_the_run_ends(size, in_log):
    """80x24: the charts keep five rows once lesson 1's summary fills the log, and the table its last
    step promises (prediction against measurement) sat below them; the log shows it too."""
    app = PanelApp("lesson1", "es")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        screen = app.screen
        feed(screen, {"kind": "run_start", "run_id": "fake-run", "nproc": 4, "device": "cpu", "lesson": "lesson1"},
             {"kind": "phase", "name": "predict", "rank": 0}, *CHECKS,
             *({"kind": "output", "rank": 0, "line": f"summary line {i}"} for i in range(8)),
             {"kind": "summary", "rank": 0},
             {"kind": "run_end", "status": "ok", "error": None, "exit_code": 0, "failed_rank": None,
              "tail": [], "duration_s": 1.0})
        await pilot.pause()
        log = screen.query_one("#run-log", RichLog)
        text = "\n".join(line.text for line in log.lines)
        title = translated("checks", "title", "es")
        assert (title in text) == in_log
        if in_log:  # after the ranks' output, before the verdict of the run
            assert text.index("summary line 7") < text.index(title) < text.index(translated("run", "ok", "es"))
            await pilot.press("home")  # the log has the keys: its top is the ranks' output
            await pilot.pause()
            assert app.focused is log and log.scroll_y == 0
        else:
            table = screen.query_one("#check-table", Static)
            charts = screen.query_one("#run-charts")
            assert charts.region.contains_region(table.region)
