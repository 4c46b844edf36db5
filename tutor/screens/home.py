"""The home screen: the lessons with their duration and the learner's progress."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from ...lessons.registry import Lesson, all_lessons
from ...lessons.strings import translated
from ...lessons.units import format_score
from ...visualizers.ring_drawing import code_spans
from .common import CommonActions, apply_breakpoints, localize_bindings, more_below

BINDING_LABELS = {
    "open": "binding_open",
    "quit_app": "binding_quit",
    "help": "binding_help",
    "toggle_language": "binding_lang",
}


class HomeScreen(CommonActions, Screen):
    """The lesson list. Enter (or a click) opens the highlighted lesson."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("enter", "open", "Open"),
        Binding("q", "quit_app", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("l", "toggle_language", "Español"),
    ]

    def compose(self) -> ComposeResult:
        apply_breakpoints(self)
        yield Static(id="home-title")
        yield Static(id="home-hint")
        with Horizontal(id="home-body"):
            yield OptionList(id="lesson-list")
            with VerticalScroll(id="lesson-details"):
                yield Static(id="details")
        yield Footer()

    @property
    def lang(self) -> str:
        return self.app.language

    def on_mount(self) -> None:
        self.apply_language()
        self.query_one(OptionList).focus()
        self.watch(self.query_one("#lesson-details"), "scroll_y", lambda _y: self._mark_more(), init=False)

    def on_resize(self) -> None:
        self.call_after_refresh(self._mark_more)

    def _mark_more(self) -> None:
        """The details' frame says when some of them is below (at 80x24 a lesson's summary and steps
        do not fit): Tab reaches them, then the arrows or the wheel scroll."""
        box = self.query_one("#lesson-details", VerticalScroll)
        box.border_subtitle = translated("tutor", "details_scroll", self.lang) if more_below(box) else ""

    def on_screen_resume(self) -> None:
        self.refresh_progress()

    # -- rendering -------------------------------------------------------------------------------
    def apply_language(self) -> None:
        lang = self.lang
        title = Text()
        title.append(translated("tutor", "app_title", lang), style="bold")
        title.append("  —  " + translated("tutor", "app_tagline", lang))
        self.query_one("#home-title", Static).update(title)
        self.query_one("#home-hint", Static).update(Text(translated("tutor", "home_hint", lang)))
        localize_bindings(self, lang, BINDING_LABELS)
        self.refresh_progress()

    def refresh_progress(self) -> None:
        summary = self.app.progress_summary()
        lessons = all_lessons()
        option_list = self.query_one(OptionList)
        keep = option_list.highlighted
        option_list.clear_options()
        option_list.add_options(
            Option(self._prompt(lesson, summary.get(lesson.id, {})), id=lesson.id) for lesson in lessons)
        option_list.highlighted = keep if keep is not None else 0
        self._show_details()

    def _prompt(self, lesson: Lesson, progress: dict) -> Table:
        lang = self.lang
        grid = Table.grid(padding=(0, 1), pad_edge=False)
        grid.add_column(width=2, style="bold", no_wrap=True)
        grid.add_column(ratio=1)
        text = Text()
        text.append(lesson.title[lang], style="bold")
        text.append("\n")
        parts = [translated("tutor", "minutes", lang, m=lesson.duration_min),
                 translated("tutor", "steps_done", lang, done=progress.get("steps_done", 0),
                    total=progress.get("steps_total", len(lesson.steps)))]
        best = progress.get("best_quiz")
        parts.append(translated("tutor", "best_quiz", lang, score=format_score(best, lang)) if best is not None
                     else translated("tutor", "no_quiz", lang))
        mastery = progress.get("mastery")
        if mastery is not None:
            parts.append(translated("tutor", "mastery", lang, score=format_score(mastery, lang)))
        text.append(" · ".join(parts), style="dim")
        grid.add_row(f"{lesson.number:>2}", text)
        return grid

    def _show_details(self) -> None:
        lesson = self.highlighted_lesson()
        details = self.query_one("#details", Static)
        if lesson is None:
            details.update("")
            return
        lang = self.lang
        seen = self.app.steps_seen(lesson.id)
        text = Text()
        text.append(f"{translated('tutor', 'lesson_n', lang, n=lesson.number)} · "
                    f"{translated('tutor', 'minutes', lang, m=lesson.duration_min)}\n", style="dim")
        text.append(lesson.title[lang] + "\n\n", style="bold")
        text.append(lesson.summary[lang] + "\n\n")
        text.append_text(code_spans(translated("tutor", "mastery_explained", lang) + "\n\n", "dim italic"))
        steps = Table.grid(padding=(0, 1))
        steps.add_column(width=1)
        steps.add_column(width=3, justify="right")
        steps.add_column(ratio=1)
        for i, step in enumerate(lesson.steps, 1):
            done = step.key in seen
            steps.add_row(Text("✓" if done else "·", style="green" if done else "dim"), f"{i}.",
                          step.title[lang])
        refs = Text()
        if lesson.references:
            refs.append("\n" + translated("tutor", "references", lang) + "\n", style="bold")
            for ref in lesson.references:
                refs.append(f"• {ref}\n", style="dim")
        text.rstrip()
        text.append("\n")
        details.update(Group(text, steps, refs))
        self.query_one("#lesson-details", VerticalScroll).scroll_home(animate=False)
        self.call_after_refresh(self._mark_more)  # once laid out: how much of them is below

    def highlighted_lesson(self) -> Lesson | None:
        option = self.query_one(OptionList).highlighted_option
        if option is None:
            return None
        return next(lesson for lesson in all_lessons() if lesson.id == option.id)

    # -- events and actions ----------------------------------------------------------------------
    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show_details()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.app.open_lesson(event.option.id)

    def action_open(self) -> None:
        lesson = self.highlighted_lesson()
        if lesson is not None:
            self.app.open_lesson(lesson.id)

    def action_quit_app(self) -> None:
        self.app.exit()

