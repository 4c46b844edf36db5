"""The help overlay: the keys of the screen underneath, in the current language."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...lessons.strings import translated
from ...lessons.units import format_fixed
from .common import more_below

HOME_KEYS = [
    ("↑ ↓", "key_move"),
    ("Tab", "key_tab"),
    ("Enter", "key_open"),
    ("l", "key_lang"),
    ("ctrl+p", "key_palette"),
    ("?", "key_help"),
    ("q", "key_back"),
]
LESSON_KEYS = [
    ("→  n", "key_next"),
    ("←  p", "key_prev"),
    ("↑ ↓ PgUp PgDn", "key_scroll"),
    ("t", "key_quiz"),
    ("r", "key_run"),
    ("l", "key_lang"),
    ("v", "key_visualizer"),
    ("V", "key_maximize"),
    ("ctrl+p", "key_palette"),
    ("?", "key_help"),
    ("q  Esc", "key_back"),
]

RUN_KEYS = [  # the run panel's (tutor/run_panel.py)
    ("s", "key_run_stop"),
    ("a", "key_run_again"),
    ("v", "key_run_visual"),
    ("l", "key_run_lang"),
    ("?", "key_help"),
    ("q  Esc", "key_run_close"),
]
QUIZ_KEYS = [  # the quiz screen's (tutor/quiz_screen.py)
    ("Enter", "key_quiz_enter"),
    ("1 2 3 4", "key_quiz_option"),
    ("ctrl+n", "key_quiz_new"),
    ("?", "key_help"),
    ("Esc", "key_quiz_back"),
]
CONTEXT_KEYS = {"home": HOME_KEYS, "lesson": LESSON_KEYS, "run": RUN_KEYS, "quiz": QUIZ_KEYS}


def open_help(app, context: str, language: str, visualizer=None) -> None:
    """The help overlay of ``context`` (:data:`CONTEXT_KEYS`) over ``app``'s screen, in ``language``, with
    ``visualizer``'s keys where one is shown; nothing while it is already open."""
    if isinstance(app.screen, HelpScreen):
        return
    keys = visualizer.key_help() if visualizer is not None and hasattr(visualizer, "key_help") else []
    app.push_screen(HelpScreen(context, language, visualizer_keys=keys))


class HelpScreen(ModalScreen[None]):
    """Lists the bindings; Esc, q, ? or a click closes it."""

    BINDINGS = [
        Binding("escape,q,question_mark,enter", "close", "Close", show=False),
    ]

    def __init__(self, context: str, language: str, visualizer_keys: list[tuple[str, str]] | None = None):
        super().__init__()
        self.context = context
        self.language = language
        self.visualizer_keys = list(visualizer_keys or [])  # the lesson visualizer's own keys

    def compose(self) -> ComposeResult:
        lang = self.language
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for keys, label in CONTEXT_KEYS.get(self.context, HOME_KEYS):
            table.add_row(keys, translated("tutor", label, lang))
        table.add_row(translated("tutor", "mouse", lang), translated("tutor", "key_mouse", lang))
        if self.context == "quiz":  # how an answer may be written, as distai quiz says it
            table.add_row("", "")
            table.add_row(translated("tutor", "quiz_answers", lang), translated("quiz_cli", "howto", lang))
        if self.context == "lesson":
            from .lesson import LessonScreen

            table.add_row("", "")
            table.add_row(translated("tutor", "progress", lang),
                          translated("tutor", "progress_rule", lang, s=format_fixed(LessonScreen.DONE_AFTER_S, 0, lang)))
        if self.visualizer_keys:
            table.add_row("", "")
            table.add_row(Text(translated("tutor", "help_visualizer", lang), style="bold"), "")
            for keys, label in self.visualizer_keys:
                table.add_row(keys, label)
        with VerticalScroll(id="help-box") as box:
            box.border_title = translated("tutor", "help_title", lang)
            yield Static(table, id="help-keys")
            yield Static(Text(translated("tutor", "help_close", lang), style="dim"), id="help-close")

    def on_mount(self) -> None:
        self.call_after_refresh(self._mark_overflow)
        self.watch(self.query_one("#help-box", VerticalScroll), "scroll_y", lambda _y: self._mark_overflow(), init=False)

    def on_resize(self) -> None:
        self.call_after_refresh(self._mark_overflow)

    def _mark_overflow(self) -> None:
        """Say on the frame that the list scrolls while some of it is below (80x24 hides its last keys)."""
        box = self.query_one("#help-box", VerticalScroll)
        box.border_subtitle = translated("tutor", "help_scroll", self.language) if more_below(box) else ""

    def action_close(self) -> None:
        self.dismiss(None)

    def on_click(self) -> None:
        self.dismiss(None)
