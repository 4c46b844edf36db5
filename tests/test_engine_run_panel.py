"""The tutor's run panel: live charts, log, progress, Stop; a scripted launch and a real one."""
from __future__ import annotations

import asyncio
import functools
import threading
import time

import pytest
from textual.app import App
from textual.widgets import ProgressBar, RichLog, Sparkline, Static

from distai.lessons.registry import all_lessons, resolve_lesson
from distai.tutor.run_panel import RunPanelScreen
from pilot_harness import wait_for

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another


class Spec:
    class placement:
        nproc = 4


class Record:
    id = "fake-run"
    path = "/tmp/fake-run"


class FakeLaunch:
    """Emits a scripted run from a thread, then holds until stop() (like a long run)."""

    def __init__(self, lesson, consumer, nproc=None, args=None, flood: int = 0):
        self.consumer, self.spec, self.record = consumer, Spec, Record
        self.stopped = threading.Event()
        self.stop_reason = None
        self.flood = flood

    @property
    def stopping(self):
        return self.stopped.is_set()

    def stop(self, reason="stopped"):
        if self.stop_reason is None:  # as Launch.stop: the first reason stands
            self.stop_reason = reason
        self.stopped.set()

    def run(self):
        now = time.time
        c = self.consumer
        c({"kind": "run_start", "run_id": "fake-run", "nproc": 4, "device": "cpu", "lesson": "lesson1", "t": now()})
        c({"kind": "phase", "name": "start", "n": 4, "backend": "gloo", "rank": 0, "t": now()})
        c({"kind": "phase", "name": "train", "steps": 20, "rank": 0, "t": now()})
        for i in range(20):
            c({"kind": "step", "step": i, "of": 20, "loss": 1.0 / (i + 1), "comm_s": 0.001, "compute_s": 0.002,
               "rank": 0, "t": now()})
            c({"kind": "progress", "done": i + 1, "total": 40, "rank": 0, "t": now()})
            c({"kind": "output", "rank": i % 4, "line": f"hello from step {i}", "t": now()})
        c({"kind": "phase", "name": "sweep", "rank": 0, "t": now()})
        for k in range(3):
            c({"kind": "sweep", "size": 1024 << k, "n": 4, "ring_time_s": 1e-3, "ring_algbw": 1e6,
               "ring_busbw": 1.5e6 * (k + 1), "ar_time_s": 1e-3, "ar_algbw": 1e6, "ar_busbw": 1.6e6 * (k + 1),
               "rank": 0, "t": now()})
        for i in range(self.flood):  # a burst of ring events
            c({"kind": "ring_step", "call": i, "step": 0, "of": 6, "chunk": 0, "to": 1, "from": 3,
               "recv_chunk": 3, "phase": "reduce-scatter", "bytes": 4, "size": 16, "n": 4, "rank": 0, "t": now()})
        self.stopped.wait(30)
        c({"kind": "run_end", "status": "stopped", "error": self.stop_reason, "exit_code": 1,
           "failed_rank": None, "tail": [], "duration_s": 1.0, "t": now()})


class PanelApp(App):
    def __init__(self, screen_factory, store=None):
        super().__init__()
        self.screen_factory = screen_factory
        self.store = store
        self.language = "en"

    def on_mount(self):
        self.push_screen(self.screen_factory())


def fake_run_panel(lang: str = "en", lesson_id: str = "lesson1") -> tuple[PanelApp, list]:
    """A panel app whose runs are FakeLaunches (listed in the second item as they are made)."""
    lesson = resolve_lesson(lesson_id)
    made: list = []

    def factory(lesson, consumer, nproc=None, args=None):
        made.append(FakeLaunch(lesson, consumer))
        return made[-1]

    return PanelApp(lambda: RunPanelScreen(lesson, lang, launch_factory=factory)), made


def as_text(renderable) -> str:
    from rich.console import Console

    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


def run_async(fn):
    """Run an async test in its own event loop (no pytest-asyncio needed)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


@run_async
async def test_panel_draws_a_scripted_run_and_stop_key_stops_it():
    lesson = resolve_lesson("lesson1")
    made = []

    def factory(lesson, consumer, nproc=None, args=None):
        made.append(FakeLaunch(lesson, consumer, flood=20000))
        return made[-1]

    app = PanelApp(lambda: RunPanelScreen(lesson, "en", launch_factory=factory))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, RunPanelScreen)
        assert await wait_for(pilot, lambda: len(screen.state.sweep) == 3 and screen.state.ring_steps == 20000, 20)
        # the UI stayed responsive through a 20 000-event burst: a key press is handled at once
        t0 = time.monotonic()
        await pilot.press("s")
        assert await wait_for(pilot, lambda: screen.state.status == "stopped", 5)
        assert time.monotonic() - t0 < 3
        assert made[0].stop_reason == "stopped from the tutor"
        assert screen.query_one("#loss-spark", Sparkline).data == [1.0 / (i + 1) for i in range(20)]
        sweep = as_text(screen.query_one("#sweep-table", Static).content)
        assert "1.5 MB/s" in sweep and "4.8 MB/s" in sweep and "0.94" in sweep
        assert screen.query_one("#run-progress", ProgressBar).progress == pytest.approx(20 / 40)
        status = str(screen.query_one("#run-status", Static).render())
        assert "stopped" in status and "4 × cpu (gloo)" in status
        log_text = "\n".join(str(line.text) for line in screen.query_one("#run-log", RichLog).lines)
        assert "hello from step 19" in log_text and "stopped" in log_text
        # escape closes the panel
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, RunPanelScreen)


@run_async
async def test_run_again_starts_from_empty_views():
    """A run stopped before it measured anything showed the run before's verdicts as its own: "run again"
    clears what that run drew (the fake run streams no checks of its own)."""
    lesson = resolve_lesson("lesson1")

    def factory(lesson, consumer, nproc=None, args=None):
        return FakeLaunch(lesson, consumer)

    app = PanelApp(lambda: RunPanelScreen(lesson, "en", launch_factory=factory))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: len(screen.state.sweep) == 3, 20)
        await pilot.press("s")
        assert await wait_for(pilot, lambda: screen.state.finished, 5)
        screen.query_one("#check-table", Static).update("the first run's verdicts")
        await pilot.press("a")
        await pilot.pause()
        assert as_text(screen.query_one("#check-table", Static).content).strip() == ""
        # ? lists the panel's own keys (it did nothing here)
        from distai.tutor.screens.help import HelpScreen

        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen) and app.screen.context == "run"
        keys = as_text(app.screen.query_one("#help-keys", Static).content)
        assert "run the experiment again" in keys and "stop the run" in keys
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen
        await pilot.press("s")
        assert await wait_for(pilot, lambda: screen.state.finished, 5)


@run_async
async def test_panel_runs_the_real_experiment(tmp_path):
    from distai.tutor.progress import ProgressStore

    lesson = resolve_lesson("lesson1")
    store = ProgressStore(tmp_path / "progress.db")
    app = PanelApp(lambda: RunPanelScreen(lesson, "es", nproc=2, args=["--steps", "8", "--no-sweep"]), store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: screen.state.finished, 180), screen.state
        await pilot.pause(0.3)
        assert screen.state.status == "ok", (screen.state.error, screen.state.tail)
        assert len(screen.state.losses) == 8
        assert screen.query_one("#loss-spark", Sparkline).data == screen.state.losses
        assert screen.query_one("#run-progress", ProgressBar).progress == pytest.approx(1.0)
        status = str(screen.query_one("#run-status", Static).render())
        assert "terminada" in status  # Spanish: la ejecución
        log_text = "\n".join(str(line.text) for line in screen.query_one("#run-log", RichLog).lines)
        assert "rank 0" in log_text and "carpeta de la ejecución" in log_text
        record = screen.launch.record
        command = f"como traza de Chrome (Perfetto): distai runs export {record.id} -o {record.dir / 'trace.json'}"
        assert "".join(command.split()) in "".join(log_text.split())  # whole, where the log wrapped it
        runs = store.runs("lesson1")
        assert len(runs) == 1 and runs[0]["status"] == "ok"
    store.close()


# --------------------------------------------------------------------------------------------
# Each lesson's run view (its [run] table): the charts it declares, a summary readable whole.
SUMMARY = [f"summary line {i}: " + "figures " * 6 for i in range(24)]


class ScriptedLaunch(FakeLaunch):
    """A finished run of ``lesson``: a few steps, lesson 5's schedule events, rank 0's summary."""

    def run(self):
        now = time.time
        c = self.consumer
        c({"kind": "run_start", "run_id": "fake-run", "nproc": 2, "device": "cpu", "lesson": "x", "t": now()})
        c({"kind": "phase", "name": "train", "steps": 4, "rank": 0, "t": now()})
        for i in range(4):
            c({"kind": "step", "step": i, "of": 4, "loss": 2.0 - i / 4, "rank": 0, "t": now()})
        c({"kind": "pp_config", "p": 2, "m": 2, "v": 1, "rank": 0, "t": now()})
        t0 = now()
        for rank in range(2):  # one 1F1B step on 2 stages: F0 F1 B0 B1 each
            for k, (op, mb) in enumerate((("F", 0), ("F", 1), ("B", 0), ("B", 1))):
                c({"kind": "pp_op", "rank": rank, "schedule": "1f1b", "step": 0, "op": op, "mb": mb, "chunk": 0,
                   "stage": rank, "t0": t0 + k + rank, "t1": t0 + k + rank + 0.9, "t": now()})
        for line in SUMMARY:
            c({"kind": "output", "rank": 0, "line": line, "t": now()})
        c({"kind": "run_end", "status": "ok", "error": None, "exit_code": 0, "failed_rank": None, "tail": [],
           "duration_s": 1.0, "t": now()})


def _finished_panel(lesson_id, size):
    lesson = resolve_lesson(lesson_id)

    def factory(lesson, consumer, nproc=None, args=None):
        return ScriptedLaunch(lesson, consumer)

    return lesson, PanelApp(lambda: RunPanelScreen(lesson, "en", launch_factory=factory)), size


def _visible(screen, widget) -> bool:
    region = widget.region
    return widget.display and region.height > 0 and screen.region.contains_region(region)


@pytest.mark.parametrize("lesson_id,size", [(lesson.id, (120, 40)) for lesson in all_lessons() if lesson.experiment]
                         + [("lesson5", (80, 24)), ("lesson7", (80, 24))])
@run_async
async def test_each_lesson_shows_its_run_view(lesson_id, size):
    lesson, app, size = _finished_panel(lesson_id, size)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: screen.state.finished, 10)
        await pilot.pause(0.3)
        panel = lesson.run.panel
        # only the charts the lesson declares: no empty bandwidth sweep or loss chart elsewhere
        assert bool(screen.query("#sweep-table")) == ("sweep" in panel)
        assert bool(screen.query("#loss-spark")) == ("loss" in panel)
        if "view" in panel:  # the lesson's own view of the run, drawn from its events, even at 80x24
            view = screen.query_one("#lesson-view", Static)
            assert _visible(screen, view)
            text = as_text(view.content)
            assert "r0" in text and "r1" in text if lesson_id == "lesson5" else text.strip()
        # the status line is whole (it wraps rather than being cut)
        status = screen.query_one("#run-status", Static)
        assert _visible(screen, status)
        assert status.region.width * status.region.height >= len(str(status.render()).rstrip())
        log = screen.query_one("#run-log", RichLog)
        if lesson.run.summary == "output" and size == (120, 40):
            # rank 0's summary is readable without scrolling: every line of it is on screen at once
            # (once the layout has settled: a loaded machine takes a while)
            assert await wait_for(pilot, lambda: len(log.lines) <= log.scrollable_content_region.height, 5), (
                len(log.lines), log.scrollable_content_region.height)
            text = "\n".join(str(line.text) for line in log.lines)
            assert all(line.strip() in text for line in SUMMARY)


class SilentLaunch(FakeLaunch):
    """Launched, and the ranks say nothing yet: torchrun and the interpreters are starting."""

    def run(self):
        self.consumer({"kind": "run_start", "run_id": "fake-run", "nproc": 4, "device": "cpu",
                       "lesson": "lesson1", "t": time.time()})
        self.stopped.wait(30)
        self.consumer({"kind": "run_end", "status": "stopped", "error": self.stop_reason, "exit_code": 1,
                       "failed_rank": None, "tail": [], "duration_s": None, "t": time.time()})


def silent_panel(lesson_id: str, lang: str) -> PanelApp:
    """A run panel for ``lesson_id`` whose launch starts, says nothing, and stops when asked."""
    lesson = resolve_lesson(lesson_id)
    return PanelApp(lambda: RunPanelScreen(lesson, lang, launch_factory=SilentLaunch))


@run_async
async def test_the_run_clock_counts_from_the_launch_while_ranks_start():
    """Issue 27.5: the clock read 0.0 s for the ~9 s the ranks took to start."""
    app = silent_panel("lesson1", "en")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: screen.state.status == "running", 5)
        started = time.monotonic()

        def status() -> str:
            return str(screen.query_one("#run-status", Static).render())

        assert await wait_for(pilot, lambda: time.monotonic() - started > 1.2 and "starting ranks" in status(), 5)
        shown = float(status().split(" · ")[-1].split()[0])
        assert shown >= 1.0, status()
        await pilot.press("s")
        assert await wait_for(pilot, lambda: screen.state.finished, 5)


@run_async
async def test_a_spanish_panel_labels_its_keys_and_log_in_spanish():
    """Issue 27.2: the footer read 's Stop  a Run again  esc Close' and the log 'rank 0' in Spanish."""
    from distai.lessons.strings import translated

    app, _ = fake_run_panel("es")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: len(screen.state.sweep) == 3, 20)
        labels = {b.action: b.description for _, b in screen._bindings if b.action in ("stop", "again", "close")}
        # while the run goes on, Close says that it stops it (an audit read "esc Close" as "keep it running")
        assert labels == {"stop": translated("run", "stop", "es"), "again": translated("run", "again", "es"),
                          "close": translated("run", "close_stops", "es")} and "detiene" in labels["close"]
        log_text = "\n".join(str(line.text) for line in screen.query_one("#run-log", RichLog).lines)
        # the rank's label as the catalog writes it (Spanish keeps "rank", as the lessons' text does)
        assert translated("run", "rank_n", "es", rank=3) + " hello from step 19" in " ".join(log_text.split())
        assert screen.check_action("stop", ()) and not screen.check_action("again", ())
        await pilot.press("s")
        assert await wait_for(pilot, lambda: screen.state.finished, 5)
        # an audit found "s Stop" still offered once the run had ended
        assert not screen.check_action("stop", ()) and screen.check_action("again", ())
        await pilot.pause()
        close = next(b.description for _, b in screen._bindings if b.action == "close")
        assert close == translated("run", "close", "es")


@run_async
async def test_closing_the_panel_mid_run_stops_it_and_says_so():
    app, made = fake_run_panel()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: len(screen.state.sweep) == 3, 20)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, RunPanelScreen) and made[0].stop_reason == "the run panel was closed"
        said = [str(n.message) for n in app._notifications]
        assert any(f"Run {made[0].record.id} stopped: its panel was closed" in m for m in said), said


@run_async
async def test_the_palettes_help_on_the_run_panel_lists_the_panels_keys():
    from distai.tutor.app import DistaiApp
    from distai.tutor.screens.help import HelpScreen

    app = DistaiApp("en")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        factory_app, _ = fake_run_panel()
        app.push_screen(factory_app.screen_factory())
        await pilot.pause()
        next(c for c in app.get_system_commands(app.screen) if c.title == "Help").callback()
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen) and app.screen.context == "run"
        app.pop_screen()
        await pilot.pause()
        app.screen.action_close()
        await pilot.pause()


@run_async
async def test_the_log_keeps_a_number_with_its_unit_where_it_wraps():
    """At 80x24 the log wrapped "(= 578" / "MB/s)": the lesson text's rule keeps them on one line."""
    from rich.text import Text

    class LogApp(App):
        def compose(self):
            yield RichLog(id="run-log", wrap=True, markup=False)

    line = "rank 0: fit alpha 893 µs, beta 1.73e-9 s/B (= 578 MB/s), on 4 ranks"
    for width in range(24, 44):
        app = LogApp()
        async with app.run_test(size=(width, 10)) as pilot:
            log = app.query_one(RichLog)
            await pilot.pause()
            RunPanelScreen._write(log, Text(line, style="italic"))
            await pilot.pause()
            shown = [str(s.text).rstrip() for s in log.lines]
            assert not any(s.endswith(("578", "893", " 4")) for s in shown), (width, shown)
            assert " ".join(shown).replace("\u00a0", " ").split() == line.split()
            if width < 36:
                continue
            # a rank's output wraps under its text, not under its label
            log.clear()
            RunPanelScreen._write(log, Text(f"{'rank 0':>9} {line}"), hanging=10)
            await pilot.pause()
            shown = [str(s.text).rstrip() for s in log.lines]
            assert len(shown) > 1 and " ".join(shown).split() == ["rank", "0", *line.split()]
            room = log.scrollable_content_region.width
            assert all(len(s) <= room for s in shown), (width, shown)
            assert all(s.startswith(" " * 10) for s in shown[1:]), (width, shown)


@run_async
async def test_l_in_the_panel_says_the_run_keeps_its_language():
    """``l`` switches the language on every other screen; the run panel's run speaks the language it
    was launched in (its ranks print in it): the key says so, in that language, and changes nothing."""
    from distai.lessons.strings import translated

    lesson = resolve_lesson("lesson1")
    app = PanelApp(lambda: RunPanelScreen(lesson, "es", launch_factory=lambda lesson, consumer, nproc=None, args=None:
                                          FakeLaunch(lesson, consumer)))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        await pilot.press("l")
        await pilot.pause()
        assert [n.message for n in app._notifications] == [translated("run", "language_fixed", "es")]
        assert app.screen is screen and screen.language == "es"


@run_async
async def test_the_panels_bar_is_indeterminate_for_a_run_that_reports_only_its_phases():
    """Lesson 7's bar read 0% through its whole run, then 100%."""
    app = silent_panel("lesson7", "es")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        screen.state.feed({"kind": "run_start", "run_id": "r", "nproc": 2, "device": "cpu", "t": 0.0})
        screen.state.feed({"kind": "phase", "name": "prefix sharing", "t": 1.0})
        screen._refresh()
        await pilot.pause()
        assert screen.query_one("#run-progress", ProgressBar).total is None
        screen.state.feed({"kind": "run_end", "status": "ok", "t": 2.0})
        screen._refresh()
        await pilot.pause()
        bar = screen.query_one("#run-progress", ProgressBar)
        assert bar.total == 1.0 and bar.progress == 1.0
        screen.launch.stop("the test's run ended")  # its fake launch would hold the app's exit 30 s


@run_async
async def test_the_panel_says_in_its_language_when_distai_home_cannot_hold_a_run(tmp_path, monkeypatch):
    # the panel's own launch makes the run folder under DISTAI_HOME: a file in its place crashed the tutor with
    # an English DataHomeError traceback
    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setenv("DISTAI_HOME", str(blocker))
    app = PanelApp(lambda: RunPanelScreen(resolve_lesson("lesson1"), "es", nproc=2))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, RunPanelScreen) and screen.launch is None
        assert "no se puede usar" in str(screen.query_one("#run-status", Static).render())


@run_async
async def test_the_panel_says_in_its_language_when_the_disk_is_too_full_for_a_run_folder(monkeypatch):
    # the run folder's record met a full disk (OSError from create_run): a traceback ended the tutor
    import errno
    import os

    from distai.engine import runs

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/home/learner/.distai/runs/x/run.json")

    monkeypatch.setattr(runs, "create_run", full)
    app = PanelApp(lambda: RunPanelScreen(resolve_lesson("lesson1"), "es", nproc=2))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, RunPanelScreen) and screen.launch is None and app.is_running
        said = str(screen.query_one("#run-status", Static).render())
        assert "no se puede crear la carpeta de la ejecución" in said and "no queda espacio en el disco" in said, said


@run_async
async def test_the_sweep_table_drops_its_bars_before_it_cuts_a_figure():
    # at 100 columns every bandwidth was cut ("1.91 M…") and the ratio column lost: the bars took the room
    lesson = resolve_lesson("lesson1")
    app = PanelApp(lambda: RunPanelScreen(lesson, "en", launch_factory=lambda *a, **k: FakeLaunch(*a, **k)))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: len(screen.state.sweep) == 3, 20)
        await pilot.pause(0.2)
        table = screen.query_one("#sweep-table", Static)
        shown = "\n".join(line.text for line in table.render_lines(table.region.reset_offset))
        assert "…" not in shown and "1.5 MB/s" in shown and "4.8 MB/s" in shown and "0.94" in shown, shown
        assert table.content_size.width < 60  # narrow enough that the 8-cell bars could not fit
        wide = as_text(table.content)  # at 120 columns of its own: the bars are back
        assert "█" in wide and "…" not in wide
        await pilot.press("s")


def _tutor_with_a_run_then(sig: int, tmp_path) -> dict:
    """`distai tutor` on a terminal, lesson 1's run started from its panel (r), then ``sig`` to the tutor (SIGHUP:
    the terminal closes)."""
    import os
    import pty
    import select
    import signal
    import sys
    from pathlib import Path

    from child_processes import exit_code_within
    from distai.engine import launcher as L
    from distai.engine.runs import RunRecord

    home = tmp_path / "home"
    env = dict(os.environ, DISTAI_HOME=str(home), COLUMNS="120", LINES="40", TERM="xterm-256color")
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "distai.tutor.cli", "tutor", "--lesson", "1"], env)
    run_dir, deadline, pressed, shown = None, time.time() + 180, False, b""
    while time.time() < deadline and run_dir is None:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                shown = (shown + os.read(fd, 65536))[-65536:]  # what the terminal shows
            except OSError:
                break
        if not pressed and b"Run experiment" in shown:  # the lesson is on the screen, its run key with it
            os.write(fd, b"r")
            pressed = True
        found = list((home / "runs").glob("*/events/rank0.jsonl")) if (home / "runs").is_dir() else []
        if found and found[0].stat().st_size > 2000:
            run_dir = found[0].parents[1]
    if sig == signal.SIGHUP:
        os.close(fd)
    else:
        os.kill(pid, sig)
    rc = exit_code_within(pid, 90)  # the tutor waits for its run to stop: slow on 2 cores under the suite's load
    if sig != signal.SIGHUP:
        os.close(fd)
    time.sleep(0.5)
    record = RunRecord.load(run_dir) if run_dir else None
    return {"rc": rc, "record": record, "left": L.run_processes(Path(run_dir).name) if run_dir else []}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_tutor_ended_by_a_signal_stops_its_run_as_q_does(sig, tmp_path):
    # `kill` or a closed terminal killed the tutor by the signal's default action: its run read "killed: the
    # launcher was killed at step 40/40" and never reached the progress store
    import signal

    r = _tutor_with_a_run_then(getattr(signal, sig), tmp_path)
    assert r["record"] is not None, "the run never started"
    assert r["rc"] == 128 + getattr(signal, sig), r["rc"]
    assert r["record"].status == "stopped" and r["record"].error == "the tutor was closed", r["record"]
    assert r["left"] == []


def test_the_fit_lines_never_break_between_a_number_and_its_unit():
    # at 120 columns in Spanish the panel's α-β fit read "1,21" / "GB/s" on two lines
    from rich.console import Console
    from rich.text import Text

    from distai.tutor.screens.common import BoundText

    line = Text("ajuste alfa-beta (nuestro anillo): α = 21,5 µs, 1/β = 1,21 GB/s")
    for width in range(24, 70):
        console = Console(width=width, record=True, file=open("/dev/null", "w"))
        console.print(BoundText(line))
        lines = [row.strip() for row in console.export_text().splitlines()]
        assert not any(row.startswith(("GB/s", "µs")) for row in lines), (width, lines)
        assert " ".join(lines).split() == line.plain.split()  # every word kept, none cut
