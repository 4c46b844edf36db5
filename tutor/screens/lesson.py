"""A lesson: a step-by-step walk with the step's text, its code and the lesson's visualizer."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Static

from ...lessons.registry import Lesson
from ...lessons.strings import TranslatedError, has, translated
from ..code_source import CodeNotFound, read_source
from .common import CommonActions, apply_breakpoints, localize_bindings
from .step_text import CodeListing, StepText

if TYPE_CHECKING:
    from textual.timer import Timer

    from ...visualizers.base import LessonVisualizer

BINDING_LABELS = {
    "next": "binding_next",
    "prev": "binding_prev",
    "back": "binding_back",
    "quiz": "binding_quiz",
    "run": "binding_run",
    "toggle_language": "binding_lang",
    "toggle_visualizer": "binding_visualizer",
    "maximize_visualizer": "binding_maximize",
    "help": "binding_help",
}


def step_markdown(lesson: Lesson, key: str, lang: str) -> str:
    """The step's Markdown, or a note saying that it is not written yet."""
    if lesson.has_step_text(key, lang):
        return lesson.step_text(key, lang)
    folder = lesson.package.rsplit(".", 1)[-1]
    return translated("tutor", "text_missing", lang, path=f"lessons/{folder}/{lang}/{key}.md")


def load_screen_class(module: str, name: str):
    """``module.name`` if that module exists yet, else None (errors inside it propagate)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise
    return getattr(mod, name, None)


class LessonScreen(CommonActions, Screen):
    """One lesson. Keyboard first; the buttons do the same with the mouse."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    # narrow and short (80x24): the text takes the body and the visualizer waits on `v`
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    # A step is done once the learner has spent this long on it or scrolled its text to the end
    # (the help says so): paging through with → marks nothing.
    DONE_AFTER_S = 5.0
    # The lesson's keys work whatever has focus (priority), so no visualizer may bind them
    # (visualizers.base.LESSON_KEYS); every other key goes to the visualizer (on_key).
    BINDINGS = [
        Binding("right,n", "next", "Next", key_display="→", priority=True),
        Binding("left,p", "prev", "Previous", key_display="←", priority=True),
        Binding("t", "quiz", "Quiz", priority=True),
        Binding("r", "run", "Run", priority=True),
        Binding("l", "toggle_language", "Español", priority=True),
        Binding("v", "toggle_visualizer", "Visualizer", priority=True),
        # the visualizer alone, the text hidden: at 80x24 the shared pane holds a handful of rows
        Binding("V,shift+v", "maximize_visualizer", "Visualizer only", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?", priority=True),
        Binding("q,escape", "back", "Back", priority=True),
    ]

    def __init__(self, lesson: Lesson, start: int = 0):
        super().__init__()
        self.lesson = lesson
        self.index = max(0, min(start, len(lesson.steps) - 1))
        self.visualizer: LessonVisualizer | None = None
        self._visualizer_name: str | None = None
        self._visualizer_lang: str | None = None
        self._done_timer: Timer | None = None
        self._run_panel_opened = False  # back from it, a step that draws the run replays it
        self._full_footer: dict[str, int] = {}  # the uncompacted footer's width, per language (_measure_footer)

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        apply_breakpoints(self)  # laid out for this terminal from its first frame
        with Horizontal(id="lesson-bar"):
            yield Static(id="lesson-title")
            yield Static(id="lesson-duration")
        with Horizontal(id="step-bar"):
            yield Static(id="step-counter")
            yield Static(id="step-title")
            yield Static(id="step-dots")
        with Container(id="body"):
            with VerticalScroll(id="text-pane"):
                yield StepText(id="step-text")
                yield Static(id="code-title")
                with Container(id="code-box"):
                    yield Static(id="code")
            yield Container(id="visualizer-pane")
        with Horizontal(id="actions"):
            yield Button("", id="prev", compact=True)
            yield Button("", id="next", compact=True, variant="primary")
            yield Static(classes="spacer")
            yield Button("", id="quiz", compact=True)
            yield Button("", id="run", compact=True, variant="success")
        yield Footer()

    @property
    def lang(self) -> str:
        return self.app.language

    @property
    def step(self):
        return self.lesson.steps[self.index]

    async def on_mount(self) -> None:
        self.watch(self.query_one("#text-pane", VerticalScroll), "scroll_y", self._text_scrolled, init=False)
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)
        await self.apply_language()

    def _theme_changed(self, theme) -> None:
        """The code listing's colours follow a light or dark theme (the text's fences do it themselves)."""
        listing = self.query_one("#code", Static).content
        if isinstance(listing, CodeListing) and listing.dark != theme.dark:
            self.query_one("#code", Static).update(CodeListing(listing.source, listing.start_line, listing.lexer,
                                                               dark=theme.dark))

    # -- rendering -------------------------------------------------------------------------------
    async def apply_language(self) -> None:
        """Re-render everything in the app's current language."""
        lang = self.lang
        lesson = self.lesson
        title = Text()
        title.append(translated("tutor", "lesson_n", lang, n=lesson.number) + " · ", style="bold")
        title.append(lesson.title[lang], style="bold")
        self.query_one("#lesson-title", Static).update(title)
        self.query_one("#lesson-duration", Static).update(translated("tutor", "minutes", lang, m=lesson.duration_min))
        for button_id in ("prev", "next", "quiz", "run"):
            button = self.query_one(f"#{button_id}", Button)
            button.label = translated("tutor", button_id, lang)
            button.refresh(layout=True)
        self.query_one("#run", Button).display = bool(lesson.experiment)
        self._localize_footer()
        await self.show_step(self.index)

    async def show_step(self, index: int) -> None:
        self.index = index
        lang = self.lang
        lesson, step = self.lesson, self.lesson.steps[index]
        n = len(lesson.steps)
        self.query_one("#step-counter", Static).update(translated("tutor", "step_counter", lang, k=index + 1, n=n))
        self.query_one("#step-title", Static).update(Text(step.title[lang]))
        dots = Text()
        dots.append("●" * (index + 1), style="bold")
        dots.append("○" * (n - index - 1), style="dim")
        self.query_one("#step-dots", Static).update(dots)
        self.query_one("#prev", Button).disabled = index == 0
        self.query_one("#next", Button).disabled = index == n - 1
        await self.query_one("#step-text", StepText).update(step_markdown(lesson, step.key, lang))
        self._show_code(step)
        await self._show_visualizer(step)
        self.query_one("#text-pane", VerticalScroll).scroll_home(animate=False)
        self._focus_text()
        self.app.remember_position(lesson.id, step.key)
        if self._done_timer is not None:
            self._done_timer.stop()
        self._done_timer = self.set_timer(self.DONE_AFTER_S, lambda: self._mark_done(index))

    def _mark_done(self, index: int) -> None:
        if index == self.index:
            self.app.mark_step_seen(self.lesson.id, self.lesson.steps[index].key)

    def _text_scrolled(self, scroll_y: float) -> None:
        pane = self.query_one("#text-pane", VerticalScroll)
        if pane.max_scroll_y > 0 and scroll_y >= pane.max_scroll_y:
            self._mark_done(self.index)  # read to its end

    def _show_code(self, step) -> None:
        code_title = self.query_one("#code-title", Static)
        code = self.query_one("#code", Static)
        box = self.query_one("#code-box")
        if not step.code:
            code_title.display = box.display = False
            return
        code_title.display = box.display = True
        try:
            src = read_source(step.code)
        except CodeNotFound as exc:
            code_title.update(Text(translated("tutor", "code_missing", self.lang, spec=step.code, reason=str(exc)),
                                   style="italic yellow"))
            box.display = False
            return
        code_title.update(Text(translated("tutor", "code_title", self.lang, where=src.where), style="bold"))
        # wrapped, never cut: the listing reads whole beside the visualizer, at 80 columns too
        code.update(CodeListing(src.source, src.start_line, dark=self.app.current_theme.dark))

    async def _show_visualizer(self, step) -> None:
        from ...visualizers.base import make_visualizer

        pane = self.query_one("#visualizer-pane", Container)
        name = step.visualizer or self.lesson.visualizer
        shown = translated("tutor", f"visualizer_names.{name}", self.lang) if name and has(
            "tutor", f"visualizer_names.{name}") else (name or "—")
        pane.border_title = f"{translated('tutor', 'visualizer', self.lang)}: {shown}"
        self._mark_maximize()
        if self.visualizer is None or (name, self.lang) != (self._visualizer_name, self._visualizer_lang):
            await pane.remove_children()
            self.visualizer = None
            try:
                widget = make_visualizer(name, self.lang)
            except Exception as exc:  # a broken visualizer must not take the lesson down
                self.log.error(f"visualizer {name!r} failed: {exc!r}")
                await pane.mount(Static(Text(f"{name}: {type(exc).__name__}: {exc}", style="red")))
                self._visualizer_name, self._visualizer_lang = name, self.lang
                return
            self.visualizer = widget
            self._visualizer_name, self._visualizer_lang = name, self.lang
            await pane.mount(widget)
        if self.visualizer is not None:
            self.visualizer.show_step(step.key)

    def on_lesson_visualizer_replay_requested(self, message) -> None:
        """The visualizer asked for the lesson's latest run: read it here and feed it to it."""
        message.stop()
        from ..replay import replay_latest

        try:
            record = replay_latest(self.lesson.id, message.visualizer, newest=message.newest)
        except Exception as exc:  # noqa: BLE001 - a broken run folder must not take the lesson down
            why = exc.text(self.lang) if isinstance(exc, TranslatedError) else str(exc)
            self.notify(translated("tutor", "replay_failed", self.lang, error=why), severity="error")
            return
        if message.quiet:  # asked by a step or after a run, not by the learner: no toast
            return
        if record is None:
            self.notify(translated("tutor", "replay_none", self.lang, lesson=self.lesson.id), severity="warning")
        else:
            self.notify(translated("tutor", "replay_loaded", self.lang, run=record.id, status=record.effective_status),
                        timeout=4)

    # -- actions ---------------------------------------------------------------------------------
    async def action_next(self) -> None:
        if self.index < len(self.lesson.steps) - 1:
            await self.show_step(self.index + 1)
        else:
            self.notify_alone(translated("tutor", "last_step", self.lang))

    async def action_prev(self) -> None:
        if self.index > 0:
            await self.show_step(self.index - 1)
        else:
            self.notify_alone(translated("tutor", "first_step", self.lang))

    def notify_alone(self, message: str) -> None:
        """A toast that replaces those shown: a key held at the first step must not pile them up."""
        self.app.clear_notifications()
        self.notify(message, timeout=3)

    def action_back(self) -> None:
        self.app.pop_screen()


    def _localize_footer(self) -> None:
        """The footer's labels in the language; narrower than its whole width (100 columns, or what the
        language's words need, measured once laid out) it is compact and leaves out ← → (the buttons above
        say them) and the palette, so that every other key fits in 80."""
        narrow = self.size.width < max(100, self._full_footer.get(self.lang, 0))
        footer = self.query_one(Footer)
        footer.compact, footer.show_command_palette = narrow, not narrow
        localize_bindings(self, self.lang, BINDING_LABELS, hidden=frozenset({"next", "prev"} if narrow else ()))
        if not narrow:
            self.call_after_refresh(self._measure_footer)

    def _measure_footer(self, tries: int = 5) -> None:
        """The whole footer's width in this language: Spanish needs 102 columns, and at 100 its last key was cut.
        The footer lays its keys out a refresh or two after its bindings change: measured once they have a size."""
        footers = self.query(Footer)
        if not footers or not self.is_attached:  # the screen left before its footer was laid out
            return
        footer = footers.first()
        if footer.compact or self.lang in self._full_footer:
            return
        widths = [key.outer_size.width for key in footer.children]
        if not widths or 0 in widths:
            if tries:
                self.call_after_refresh(self._measure_footer, tries - 1)
            return
        self._full_footer[self.lang] = sum(widths)
        if self._full_footer[self.lang] > self.size.width:
            self._localize_footer()

    def on_resize(self, event) -> None:
        self._localize_footer()

    def action_toggle_visualizer(self) -> None:
        pane = self.query_one("#visualizer-pane")
        if self.has_class("-maximized"):  # back to the text beside the visualizer
            self.action_maximize_visualizer()
            return
        pane.display = not pane.display
        self.call_after_refresh(self._focus_text)  # once a hidden visualizer has let its focus go

    def _focus_text(self) -> None:
        """The text pane takes the focus when nothing has it (hiding the text for V left the focus
        nowhere, and ↓ PgDn End scrolled nothing until Tab): the keys that scroll go to the text."""
        text = self.query_one("#text-pane", VerticalScroll)
        if self.focused is None and text.display:
            text.focus(scroll_visible=False)

    def room_key(self) -> str | None:
        """The key that gives the visualizer more room (the visualizer's "▼ n more lines" names it), or None
        when it has it all."""
        return None if self.has_class("-maximized") else "V"

    def action_maximize_visualizer(self) -> None:
        """The visualizer takes the whole body (the text hidden), or gives the text back."""
        maximized = not self.has_class("-maximized")
        self.set_class(maximized, "-maximized")
        text = self.query_one("#text-pane", VerticalScroll)
        text.display = not maximized
        if maximized:
            self.query_one("#visualizer-pane").display = True
        else:  # the text back, and the keys that scroll it with it
            text.focus(scroll_visible=False)
        self._mark_maximize()

    def _mark_maximize(self) -> None:
        """The pane's bottom border says what V does (the footer at 80 columns has no room for it)."""
        key = "restore_hint" if self.has_class("-maximized") else "maximize_hint"
        self.query_one("#visualizer-pane").border_subtitle = translated("tutor", key, self.lang)

    def action_quiz(self) -> None:
        cls = load_screen_class("distai.tutor.quiz_screen", "QuizScreen")
        if cls is None:
            self.notify(translated("tutor", "quiz_unavailable", self.lang), severity="warning")
            return
        self.app.push_screen(cls(self.lesson, self.lang))

    def action_run(self) -> None:
        if not self.lesson.experiment:
            self.notify(translated("tutor", "no_experiment", self.lang), severity="warning")
            return
        cls = load_screen_class("distai.tutor.run_panel", "RunPanelScreen")
        if cls is None:
            self.notify(translated("tutor", "run_unavailable", self.lang), severity="warning")
            return
        # the run the text describes; back from it, a step that shows the run replays it (the capstone's mesh)
        self.app.push_screen(cls(self.lesson, self.lang, args=list(self.lesson.run.args)))
        self._run_panel_opened = True

    def on_screen_suspend(self) -> None:
        from ...visualizers.playback import hold_animations

        hold_animations(self, True)  # covered (help, quiz, run panel): its animation waits

    def on_unmount(self) -> None:
        # the theme signal holds its subscribers' callbacks, and a callback holds its screen: every lesson
        # opened stayed in memory (3.7 MB each) until the theme changed
        self.app.theme_changed_signal.unsubscribe(self)

    def on_screen_resume(self) -> None:
        """Back from the run panel: a step that draws the learner's run shows the one that just ended."""
        from ...visualizers.playback import hold_animations

        hold_animations(self, False)
        if self._run_panel_opened and self.visualizer is not None:
            self._run_panel_opened = False
            if self.visualizer.shows_run(self.lesson.steps[self.index].key):
                self.visualizer.post_message(self.visualizer.ReplayRequested(self.visualizer, quiet=True, newest=True))

    async def on_key(self, event) -> None:
        """A key nothing else took goes to the visualizer: its controls work without focusing it."""
        if self.visualizer is not None and self.query_one("#visualizer-pane").display:
            await self.visualizer.take_unclaimed_key(event)

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions = {"prev": self.action_prev, "next": self.action_next}
        if event.button.id in actions:
            await actions[event.button.id]()
        elif event.button.id == "quiz":
            self.action_quiz()
        elif event.button.id == "run":
            self.action_run()
