"""The run panel: "Run this experiment" from a lesson, with live charts, a log and a Stop key.

``RunPanelScreen(lesson, language)`` launches the lesson's experiment through the engine's
launcher in a worker thread; the launcher's consumer only appends events to a queue, and a
timer on the UI thread drains it ten times a second, so the interface stays responsive however
fast the ranks emit. It shows a progress bar and the status, the charts the lesson declares in
its ``[run]`` table (``lessons/registry.py``, ``RunView``): the loss as a Sparkline, lesson 1's
bandwidth sweep (busbw of our ring and of ``dist.all_reduce`` per message size, as bars on one
scale), the lesson's own view of a run (lesson 3's timeline, lesson 5's measured schedule);
beside them the lesson's visualizer fed with the run's events (lesson 1: the ring, animated from
the real ``ring_step`` events); under the charts the run's checks, its lesson's predictions against
what it measured (``tutor/check_table.py``, the same table as ``distai run``'s); below, the ranks' output. When the run ends, a lesson whose
summary is rank 0's output gets a log tall enough to read it whole. ``s`` stops every rank
(torchrun's own report of the stop signal stays in the run folder's log, not on screen);
``escape``/``q`` closes (stopping a run still going); ``a`` runs again. Closing the tutor stops the
run too.

With ``record=`` (a finished run's ``RunRecord``) the panel replays that run instead.
Imports no torch (the launcher starts torch in other processes).
"""
from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, RichLog, Sparkline, Static

from ..engine.run_state import RunState, feed_readable, replay_events
from ..engine.runs import phase_text, reason_text
from ..lessons.events import LOG, OUTPUT, PHASE, RUN_END, RUN_START, STEP
from ..lessons.strings import TranslatedError, has, translated
from ..lessons.units import format_bandwidth, format_bytes, format_fixed, format_time
from .check_table import check_table
from .screens.common import BoundText, apply_breakpoints, localize_bindings

if TYPE_CHECKING:
    from textual.worker import Worker

    from ..engine.launcher import Launch
    from ..engine.supervisor import Supervisor
    from ..visualizers.base import LessonVisualizer


def export_path(record) -> str:
    """Where ``distai runs export`` puts a run's Chrome trace by default."""
    from .cli_runs import default_export_path

    return str(default_export_path(record.path, "chrome-trace"))



BLOCKS = " ▏▎▍▌▋▊▉█"

COLUMN_GAP = re.compile(r"(?<=\S) {2,}(?=\S)")  # two spaces or more between words: a table's columns
BOX_DRAWING = frozenset("│┃║┆┊─━═┼╋╬┬┴├┤┌┐└┘╭╮╰╯")


def table_like(line: str, after_table: bool = False) -> bool:
    """Whether a rank's printed line is a row of a table (columns set apart by runs of spaces, or
    drawn with box characters): such a line is written to the log whole, never wrapped mid-row.
    Two gaps make a row, and so does one as wide as four spaces (a header whose titles are words:
    "policy           TTFT p50/p99 ms TPOT p50/p99 ms tokens/s hits"); ``after_table``: the line
    before was a row (one gap is enough then). Prose has single spaces, or two after a label."""
    gaps = [len(gap) for gap in COLUMN_GAP.findall(line.strip())]
    return (len(gaps) >= 2 or max(gaps, default=0) >= 4 or (after_table and bool(gaps))
            or any(ch in BOX_DRAWING for ch in line))


class FirstThatFits:
    """The first of ``choices`` (renderables, widest first) drawn whole at the width it is given: a table's no-wrap
    cells are cut, not wrapped, where it is too wide (Rich's minimum is a cell's longest word, so its natural width
    is what is compared)."""

    def __init__(self, *choices):
        self.choices = choices

    def __rich_console__(self, console, options):
        from rich.measure import Measurement

        natural = options.update_width(10_000)
        yield next((c for c in self.choices if Measurement.get(console, natural, c).maximum <= options.max_width),
                   self.choices[-1])

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        return Measurement.get(console, options, self.choices[-1])


def hbar(value: float, top: float, width: int) -> str:
    """A horizontal bar of ``value`` on a scale where ``top`` fills ``width`` cells (eighths)."""
    if width <= 0:
        return ""
    if top <= 0 or value <= 0:
        return " " * width
    eighths = max(1, round(min(1.0, value / top) * width * 8))
    full, rest = divmod(eighths, 8)
    return ("█" * full + (BLOCKS[rest] if rest else "")).ljust(width)


def default_launch_factory(lesson, consumer, nproc: int | None = None, args: list[str] | None = None,
                           lang: str | None = None):
    """Create (not start) a ``Launch`` of the lesson's experiment in a new run folder (under the
    engine's supervisor when the lesson restarts after failures, as lesson 3 does)."""
    from ..engine.launcher import LaunchSpec, check_torch_version, choose_placement
    from ..engine.runs import create_run
    from ..engine.supervisor import make_launch
    from .paths import run_folder_error, runs_root

    check_torch_version()  # said in the panel, before a run folder is made

    placement = choose_placement(cpu=nproc, default_nproc=getattr(lesson, "ranks", 4), lang=lang or "en") if nproc \
        else choose_placement(default_nproc=getattr(lesson, "ranks", 4), lang=lang or "en")
    root = runs_root()
    try:
        record = create_run(root, lesson.id, lesson.experiment, argv=["distai tutor"])
    except OSError as exc:  # a full disk, say: the panel says it, as `distai run` does, and the tutor stays
        raise run_folder_error(exc, exc.filename or root) from None
    return make_launch(LaunchSpec(lesson.experiment, placement, list(args or []), lang=lang), record, consumer=consumer,
                       max_restarts=getattr(lesson, "max_restarts", 0))


class RunPanelScreen(Screen):
    """Live view of one run of a lesson's experiment."""

    help_context = "run"  # the help overlay's keys for this screen (the app's palette asks for them too)

    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("a", "again", "Run again"),
        Binding("v", "visual_first", "Visualizer"),
        Binding("escape,q", "close", "Close"),
        Binding("question_mark", "help", "Help", key_display="?", show=False),
        Binding("l", "language", "Language", show=False),
    ]

    DEFAULT_CSS = """
    RunPanelScreen { layout: vertical; }
    #run-title { height: 1; padding: 0 1; background: $primary; color: $text; text-style: bold;
                 text-wrap: nowrap; text-overflow: ellipsis; }
    #run-status-bar { height: auto; padding: 0 1; }
    #run-progress { width: 40; }
    #run-status { width: 1fr; height: auto; padding: 0 0 0 2; }
    #run-body { height: 2fr; }
    #run-charts { width: 1fr; height: 1fr; }
    /* the visualizers draw at least 40 columns: 44 with their padding and this border */
    #run-visual { width: 1fr; min-width: 44; height: 1fr; border: round $secondary 50%; }
    .run-label { height: 1; padding: 0 1; color: $text-muted; }
    #loss-spark { height: 4; margin: 0 1; }
    #sweep-table { height: auto; padding: 0 1; }
    #lesson-view { height: auto; padding: 0 1; }
    #check-table { height: auto; padding: 0 1; }
    #run-log { height: 1fr; min-height: 5; border: round $primary 50%; }
    RunPanelScreen.-narrow #run-visual { display: none; }
    RunPanelScreen.-narrow #run-status-bar { layout: vertical; }
    RunPanelScreen.-narrow #run-status { padding: 0; }
    RunPanelScreen.-narrow #run-progress { width: 1fr; }
    RunPanelScreen.-no-charts #run-charts { display: none; }
    RunPanelScreen.-view-summary #run-charts { width: 2fr; }
    RunPanelScreen.-narrow.-no-charts #run-body { display: none; }
    /* v: the visualizer first, the log a few rows (on a narrow screen the visualizer in the charts' place) */
    RunPanelScreen.-visual-first #run-log { height: 7; }
    RunPanelScreen.-narrow.-visual-first #run-visual { display: block; width: 1fr; }
    RunPanelScreen.-narrow.-visual-first #run-charts { display: none; }
    RunPanelScreen.-narrow.-visual-first.-no-charts #run-body { display: block; }
    """
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    SUMMARY_BODY_ROWS = 5  # what the charts and visualizer keep when the log grows to show the summary

    def __init__(self, lesson, language: str = "en", *, nproc: int | None = None,
                 args: list[str] | None = None, record=None,
                 launch_factory: Callable | None = None, drain_interval: float = 0.1):
        super().__init__()
        self.lesson = lesson
        self.language = language
        self.nproc = nproc
        self.args = list(args or [])
        self.replay_record = record
        self.launch_factory = launch_factory or default_launch_factory
        self.drain_interval = drain_interval
        self.state = RunState()
        self._footer_running: bool | None = None  # what the footer last showed: Stop, or Run again
        self.view = lesson.run  # what this lesson's runs show (its [run] table)
        self.lesson_view = None  # the lesson's own view of the run (its [run] terminal), fed every event
        self.launch: Launch | Supervisor | None = None
        self.start_error: Text | None = None  # why no run could start (shown in the status line instead)
        self.visualizer: LessonVisualizer | None = None
        self.stop_lines_hidden = 0
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._worker: Worker[None] | None = None
        self._recorded_start = False
        self.events_drained = 0
        self._step_phase: str | None = None  # the phase the latest step event came in
        self._in_table: dict = {}  # per rank: whether its latest printed line was a table's

    # -- layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        apply_breakpoints(self)
        lang, panel = self.language, self.view.panel
        yield Static(translated("run", "title", lang, n=self.lesson.number, title=self.lesson.title[lang]), id="run-title")
        with Horizontal(id="run-status-bar"):
            yield ProgressBar(total=1.0, show_eta=False, id="run-progress")
            yield Static("", id="run-status")
        with Horizontal(id="run-body"):
            with VerticalScroll(id="run-charts"):
                if "loss" in panel:
                    yield Static(translated("run", "loss", lang), id="loss-label", classes="run-label")
                    yield Sparkline([], summary_function=max, id="loss-spark")
                if "sweep" in panel:
                    yield Static(translated("run", "busbw", lang), id="busbw-label", classes="run-label")
                    yield Static("", id="sweep-table")
                if "view" in panel:
                    yield Static(translated("run", "view", lang), id="view-label", classes="run-label")
                    yield Static(Text(translated("run", "no_view", lang), style="dim"), id="lesson-view")
                yield Static("", id="check-table")
            yield Vertical(id="run-visual")
        yield RichLog(id="run-log", max_lines=2000, min_width=20, wrap=True, markup=False, highlight=False)
        yield Footer()

    def on_mount(self) -> None:
        self._localize_footer()
        self.set_class(not self.view.panel, "-no-charts")
        self._mount_visualizer()
        self.set_interval(self.drain_interval, self._drain)
        if self.replay_record is not None:
            self.lesson_view = self.lesson.terminal_view(self.language)
            self.query_one("#run-title", Static).update(
                translated("run", "title", self.language, n=self.lesson.number, title=self.lesson.title[self.language])
                + " · " + translated("run", "replay", self.language, id=self.replay_record.id))
            # fed once laid out: the log wraps its lines at the width it has then
            self.call_after_refresh(self._replay)
        else:
            self.start_run()
        self._refresh()

    def _replay(self) -> None:
        for event in replay_events(self.replay_record):
            self._consume(event)
        self._drain()

    def _mount_visualizer(self) -> None:
        name = getattr(self.lesson, "visualizer", None)
        if not name:
            self.query_one("#run-visual").display = False
            return
        try:
            from ..visualizers.base import make_visualizer

            self.visualizer = make_visualizer(name, self.language)
            self.query_one("#run-visual").mount(self.visualizer)
        except Exception:  # noqa: BLE001 - a visualizer's failure must not stop the run panel
            self.visualizer = None
            self.query_one("#run-visual").display = False

    # -- running -----------------------------------------------------------------------------------
    def start_run(self) -> None:
        from ..engine.launcher import experiment_available

        self.start_error = None
        if self.launch_factory is default_launch_factory and not experiment_available(self.lesson.experiment):
            self.start_error = Text(translated("run", "unavailable", self.language), style="yellow")
            self._refresh()
            return
        self.state = RunState()
        self.lesson_view = self.lesson.terminal_view(self.language)
        self._recorded_start = False
        self.stop_lines_hidden = 0
        self._step_phase = None
        self._in_table = {}
        self.query_one("#run-log", RichLog).clear()
        self._clear_views()
        self.query_one("#run-log").styles.height = None  # back to the stylesheet's while it runs
        self.query_one("#run-body").styles.height = None
        self.set_class(False, "-view-summary")
        # the ranks print their summary in the tutor's language
        lang = {"lang": self.language} if self.launch_factory is default_launch_factory else {}
        try:
            self.launch = self.launch_factory(self.lesson, self._consume, nproc=self.nproc, args=self.args, **lang)
        except TranslatedError as exc:  # DISTAI_HOME unusable (a file in its place …): said here, in the panel
            self.launch = None
            self.start_error = Text(exc.text(self.language), style="red")
            self._refresh()
            return
        self.query_one("#run-status", Static).update(
            translated("run", "starting", self.language, nproc=self.launch.spec.placement.nproc))
        launch = self.launch
        self._worker = self.run_worker(lambda: self._run_in_thread(launch), thread=True,
                                       exclusive=True, group="distai-run", exit_on_error=False)

    def _run_in_thread(self, launch) -> None:
        try:
            launch.run()
        except Exception as exc:  # noqa: BLE001 - shown in the panel
            self._consume(RUN_END.event({"status": "failed", "error": f"launcher error: {exc}", "exit_code": None,
                                         "failed_rank": None, "tail": [], "duration_s": None}))

    def _consume(self, event: dict) -> None:
        """Called from the launcher's thread: only queue (the UI thread draws)."""
        self._queue.append(event)

    @property
    def running(self) -> bool:
        return self.launch is not None and not self.state.finished and self.replay_record is None

    # -- drawing -----------------------------------------------------------------------------------
    def _drain(self) -> None:
        if not self._queue:
            if self.running:
                self._refresh()  # the clock runs while the ranks are silent
            return
        log = self.query_one("#run-log", RichLog)
        batch: list[dict] = []
        while self._queue and len(batch) < 5000:
            batch.append(self._queue.popleft())
        for e in batch:
            feed_readable(self.state, e)
            if self.lesson_view is not None:
                feed_readable(self.lesson_view, e)
            self.events_drained += 1
            kind = e.get("kind")
            if kind == STEP.name:
                self._step_phase = self.state.phase
            if kind == OUTPUT.name and e.get("rank") is None and self.launch is not None and self.launch.stopping:
                # torchrun answers the stop signal with a SignalException traceback: noise here, kept
                # in the run folder's logs/torchrun.log
                self.stop_lines_hidden += 1
            elif kind == OUTPUT.name:
                self._write_output(log, e)
            elif kind == PHASE.name and e.get("rank", 0) == 0:
                self._write(log, Text(f"── {translated('run', 'phase', self.language)}: "
                                      f"{phase_text(e.get('name'), self.language)}", style="bold cyan"))
            elif kind == LOG.name:
                who = translated("run", "rank_n", self.language, rank=e.get("rank"))
                self._write(log, Text(f"{who}: {e.get('msg')}", style="italic"), hanging=len(who) + 2)
            elif kind == RUN_START.name:
                self._record_progress("running")
            elif kind == RUN_END.name:
                self._on_end(e, log)
            if self.visualizer is not None and kind != OUTPUT.name:
                try:
                    self.visualizer.feed_event(e)
                except Exception:  # noqa: BLE001
                    pass
        self._refresh()

    def _write_output(self, log: RichLog, e: dict) -> None:
        """A rank's printed line under its label: prose wrapped at the log's width, under its text; a
        table's row (``table_like``) whole, however wide: the log scrolls sideways (left/right, or
        shift+wheel) rather than wrap a row and push its last columns under its first ones."""
        rank, line = e.get("rank"), str(e.get("line", ""))
        who = "torchrun" if rank is None else translated("run", "rank_n", self.language, rank=rank)
        text = Text.assemble((f"{who:>9} ", "dim"), line)
        table = table_like(line, self._in_table.get(rank, False))
        self._in_table[rank] = table
        if table:
            log.write(text, width=max(log.scrollable_content_region.width, text.cell_len))
        else:
            self._write(log, text, hanging=10)

    @staticmethod
    def _write(log: RichLog, text: Text, hanging: int = 0) -> None:
        """Wrapped at the log's own width (RichLog would measure against the app console's), a number
        kept with its unit ("578" / "MB/s" split at 80x24): the lesson text's rule (``wrap_text``,
        lessons/units.py's); ``hanging``: the wrapped lines start under the text, not under its label."""
        from ..visualizers.ring_drawing import wrap_text

        width = log.scrollable_content_region.width
        if width <= 0:
            log.write(text)
            return
        for line in wrap_text(text, width, hanging):
            log.write(line, width=width)

    def _on_end(self, e: dict, log: RichLog) -> None:
        status = e.get("status") or "failed"  # as RunState reads a run_end without one
        style = {"ok": "bold green", "stopped": "bold yellow"}.get(status, "bold red")
        msg = Text(translated("run", status, self.language) if has("run", status) else str(status), style=style)
        if e.get("error"):
            msg.append(f": {reason_text(e['error'], self.language)}")
        self._log_checks(log)
        self._write(log, msg)
        if self.stop_lines_hidden and self.launch is not None:
            self._write(log, Text(translated("run", "stop_report", self.language, path=f"{self.launch.record.path}/logs/torchrun.log"),
                           style="dim"))
        if status == "failed" and e.get("tail"):
            rank = e.get("failed_rank")
            self._write(log, Text(translated("run", "failed_rank", self.language, rank="?" if rank is None else rank), style="bold"))
            for line in e["tail"]:
                self._write(log, Text("  " + line, style="red"))
        if self.launch is not None:
            self._write(log, Text(translated("run", "folder", self.language, path=self.launch.record.path), style="dim"))
        record = self.launch.record if self.launch is not None else self.replay_record
        if record is not None:
            self._write(log, Text(translated("run", "export", self.language, id=record.id, path=export_path(record)), style="dim"))
        if self.view.summary == "output" and self.focused in (None, self.query_one("#run-charts")):
            log.focus(scroll_visible=False)  # the summary is the log's: the scroll keys go to it
        self._record_progress(status)

    def _log_checks(self, log: RichLog) -> None:
        """Below 100 columns the charts keep a few rows once the run ends and the check table (the
        lesson's predictions against this run's measurements) sat under them, out of sight: the log,
        which scrolls, shows it too, after the ranks' summary."""
        if not self.has_class("-narrow"):
            return
        table = check_table(self.state.checks, self.language)
        if table is None:
            return
        width = log.scrollable_content_region.width
        log.write(table, width=width if width > 0 else None)

    def _record_progress(self, status: str) -> None:
        """The app's progress store (UI thread only: SQLite objects stay in their thread)."""
        store = getattr(self.app, "store", None)
        if store is None or self.launch is None:
            return
        try:
            store.record_run(self.launch.record.id, self.lesson.id, status, self.launch.record.path)
        except Exception:  # noqa: BLE001 - progress is a convenience
            pass

    def _refresh(self) -> None:
        if self.start_error is not None:  # no run to show: why, until one starts
            self.query_one("#run-status", Static).update(self.start_error)
            return
        s, lang = self.state, self.language
        if self.running != self._footer_running:  # Stop and Run again swap in the footer, and Close says it stops
            self._footer_running = self.running
            self._localize_footer()
        # a run that reports only its phases (lessons 4 and 7): an indeterminate bar, not one stuck at 0 %
        self.query_one("#run-progress", ProgressBar).update(total=1.0 if s.progress_known or s.finished else None,
                                                             progress=s.fraction)
        status = Text()
        # the ranks are done (rank 0's summary came) and torchrun is closing them: not "running" at 100 %
        closing = s.summary is not None and not s.finished
        if s.ranks_starting:
            label = translated("run", "starting_status", lang)
        elif closing:
            label = translated("run", "closing", lang)
        else:
            label = translated("run", s.status, lang) if has("run", s.status) else s.status
        status.append(label, style={"ok": "bold green", "failed": "bold red", "stopped": "bold yellow"}.get(s.status, "bold"))
        if self.launch is not None and self.launch.stopping and not s.finished:
            status.append(" · " + translated("run", "stopping", lang), style="yellow")
        if s.nproc:
            status.append(f" · {s.placement_text(lang)}")
        if s.phase and not s.finished and not closing:
            status.append(f" · {translated('run', 'phase', lang)} {phase_text(s.phase, lang)}", style="cyan")
        # the step count belongs to the phase that counts steps (training), not to the sweep after it
        if s.last_step and s.steps_of and not s.finished and not closing and s.phase == self._step_phase:
            status.append(f" · {translated('run', 'step', lang)} {s.last_step.get('step', 0) + 1}/{s.steps_of}")
        status.append(f" · {format_fixed(s.clock(None if self.replay_record else time.time()), 1, lang)} s",
                      style="dim")
        if s.note:
            status.append(f" · {s.note}", style="yellow")
        self.query_one("#run-status", Static).update(status)
        panel = self.view.panel
        if "loss" in panel and s.losses:
            self.query_one("#loss-spark", Sparkline).data = list(s.losses[-200:])
            self.query_one("#loss-label", Static).update(
                f"{translated('run', 'loss', lang)}: {format_fixed(s.losses[0], 4, lang)} → {format_fixed(s.losses[-1], 4, lang)}")
        elif "loss" in panel and s.finished:
            self.query_one("#loss-label", Static).display = False
            self.query_one("#loss-spark", Sparkline).display = False
        if "sweep" in panel and s.sweep:
            self.query_one("#sweep-table", Static).update(self._sweep_table())
        elif "sweep" in panel and s.phase in ("start", "check", "train"):
            self.query_one("#sweep-table", Static).update(Text(translated("run", "no_sweep", lang), style="dim"))
        self._draw_lesson_view()
        if s.checks:  # the lesson's predictions against this run's measurements (issue 28)
            self.query_one("#check-table", Static).update(check_table(s.checks, lang))
            self.set_class(False, "-no-charts")
        if s.finished:
            summary = self.view.summary == "view"
            if summary != self.has_class("-view-summary"):  # the charts change width: drawn again at it
                self.set_class(summary, "-view-summary")
                self.call_after_refresh(self._draw_lesson_view)
            self._fit_summary()

    def _draw_lesson_view(self) -> None:
        """The lesson's own view of the run, laid out for the charts' width now (lesson 3's timeline
        sizes its rows and wraps its lines to it)."""
        if "view" not in self.view.panel or self.lesson_view is None:
            return
        from rich.console import Group

        width = max(20, self.query_one("#run-charts").scrollable_content_region.width - 2)
        parts = self.lesson_view.renderables(width)
        if parts:
            self.query_one("#lesson-view", Static).update(Group(*parts))

    def _clear_views(self) -> None:
        """What the run before drew (its checks, sweep, loss and lesson view), cleared for a new run: a run
        stopped before it measured anything showed the one before's verdicts as its own."""
        lang, panel = self.language, self.view.panel
        self.query_one("#check-table", Static).update("")
        if "sweep" in panel:
            self.query_one("#sweep-table", Static).update("")
        if "view" in panel:
            self.query_one("#lesson-view", Static).update(Text(translated("run", "no_view", lang), style="dim"))
        if "loss" in panel:
            label, spark = self.query_one("#loss-label", Static), self.query_one("#loss-spark", Sparkline)
            label.update(translated("run", "loss", lang))
            spark.data = []
            label.display = spark.display = True

    def room_key(self) -> str | None:
        """The key that gives the visualizer more room (its "▼ n more lines" names it), or None once it has it."""
        return None if self.has_class("-visual-first") else "v"

    def action_visual_first(self) -> None:
        """``v``: the visualizer first and the log a few rows, or back (a summary's log tall again). At 80×24
        the visualizer is hidden and a run's summary takes the screen: this is how the learner sees it."""
        first = not self.has_class("-visual-first")
        self.set_class(first, "-visual-first")
        log, body = self.query_one("#run-log", RichLog), self.query_one("#run-body")
        log.styles.height = None  # the class's height, or the layout's, not the summary's fit
        body.styles.height = None
        if first:
            self.call_after_refresh(lambda: log.scroll_end(animate=False))
        elif self.state.finished:
            self.call_after_refresh(self._fit_summary)

    def _fit_summary(self) -> None:
        """Once the run ended, a lesson whose summary is rank 0's output gets a log tall enough to read
        it whole (the charts and visualizer keep a few rows, and their own scrolling)."""
        if self.view.summary != "output" or self.has_class("-visual-first"):
            return
        log, body = self.query_one("#run-log", RichLog), self.query_one("#run-body")
        fixed = sum(w.outer_size.height for w in (self.query_one("#run-title"), self.query_one("#run-status-bar"),
                                                   self.query_one(Footer)))
        room = self.size.height - fixed
        keep = self.SUMMARY_BODY_ROWS if body.display else 0
        need = len(log.lines) + 2  # its border
        if log.virtual_size.width > log.scrollable_content_region.width:  # a table's rows, whole
            need += log.styles.scrollbar_size_horizontal
        rows = max(min(need, room - keep), log.outer_size.height)
        if rows != log.outer_size.height:
            log.styles.height = rows
            body.styles.height = "1fr"
        log.scroll_end(animate=False)

    def on_resize(self) -> None:
        self.call_after_refresh(self._draw_lesson_view)
        if self.state.finished:
            self.query_one("#run-log").styles.height = None
            self.query_one("#run-body").styles.height = None
            self.call_after_refresh(self._fit_summary)

    def _sweep_table(self):
        """Rows of the sweep with bars on one shared scale (as long as the pane leaves room for: the figures are
        never cut), then the alpha-beta fits."""
        from rich.console import Group

        lang = self.language
        rows = self.state.sweep  # every size measured: the smallest is the one the α check quotes
        top = max(max(r["ring_busbw"], r["ar_busbw"]) for r in rows) or 1.0

        def table_with_bars(bar: int) -> Table:
            table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold", padding=(0, 1))
            table.add_column(translated("run", "size", lang), justify="right", no_wrap=True)
            table.add_column(translated("run", "ring", lang), justify="left", no_wrap=True)
            table.add_column("dist.all_reduce", justify="left", no_wrap=True)
            table.add_column(translated("run", "ratio", lang), justify="right", no_wrap=True)
            for r in rows:
                ratio = r["ring_busbw"] / r["ar_busbw"] if r.get("ar_busbw") else float("nan")
                table.add_row(
                    format_bytes(r["size"], binary=True, lang=lang),
                    Text.assemble((hbar(r["ring_busbw"], top, bar) + " " * bool(bar), "green"),
                                  format_bandwidth(r["ring_busbw"], lang=lang)),
                    Text.assemble((hbar(r["ar_busbw"], top, bar) + " " * bool(bar), "dark_orange"),
                                  format_bandwidth(r["ar_busbw"], lang=lang)),
                    Text(format_fixed(ratio, 2, lang), style="green" if ratio >= 0.9 else "yellow"))
            return table

        parts: list[Table | Text | FirstThatFits | BoundText] = [FirstThatFits(*(table_with_bars(bar) for bar in (8, 4, 0)))]
        for impl, f in self.state.fits.items():
            bw = f.get("bandwidth")
            parts.append(BoundText(Text(f"{translated('run', 'fit', lang)} ({impl}): α = "
                                        f"{format_time(f['alpha_s'], lang=lang)}, "
                                        f"1/β = {format_bandwidth(bw, lang=lang) if bw else '—'}", style="dim")))
        return Group(*parts)

    # -- actions -----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Stop leaves the footer once nothing runs (a finished run, a replay); Run again waits for the end."""
        if action == "stop":
            return self.running
        if action == "again":
            return self.replay_record is None and not self.running
        return True

    def action_stop(self) -> None:
        if self.running and self.launch is not None:
            self.launch.stop("stopped from the tutor")
            self._refresh()

    def action_again(self) -> None:
        if self.replay_record is None and not self.running:
            self.start_run()

    def action_language(self) -> None:
        """``l`` switches the language everywhere else; a run speaks the language it was launched in
        (its ranks print their summaries in it), so the panel says where to switch instead."""
        self.app.notify(translated("run", "language_fixed", self.language), timeout=4)

    def action_help(self) -> None:
        from .screens.help import open_help

        open_help(self.app, self.help_context, self.language, self.visualizer)

    async def on_key(self, event) -> None:
        """A key nothing else took goes to the visualizer, as on the lesson screen: the controls its hint
        names ("g next view · m next mesh shape") work while the log has the focus. The panel's own keys
        stay the panel's (the visualizer leaves s and a to Stop and Run again)."""
        if self.visualizer is not None and self.query_one("#run-visual").display:
            await self.visualizer.take_unclaimed_key(event)

    def _localize_footer(self) -> None:
        """The footer in the panel's language; while a run goes on, Close says that it stops the run."""
        localize_bindings(self, self.language, {"stop": "stop", "again": "again",
                                                "close": "close_stops" if self.running else "close",
                                                "visual_first": "visual_first"}, area="run")

    def action_close(self) -> None:
        if self.running and self.launch is not None:
            if not self.launch.stopping:  # stopped with s already: that is its reason, not the closing
                self.app.notify(translated("run", "closed_stopped", self.language, id=self.launch.record.id),
                                timeout=6)
            self.launch.stop("the run panel was closed")
        self.app.pop_screen()

    def on_screen_suspend(self) -> None:
        from ..visualizers.playback import hold_animations

        hold_animations(self, True)  # covered (its help): the visualizer's animation waits

    def on_screen_resume(self) -> None:
        from ..visualizers.playback import hold_animations

        hold_animations(self, False)

    def on_unmount(self) -> None:
        # closing the tutor (or this screen) must not leave ranks running
        if self.launch is not None and not self.state.finished:
            self.launch.stop("the tutor was closed")
