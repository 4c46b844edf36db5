"""The lesson's quiz inside the tutor: ``QuizScreen(lesson, language)``, pushed by the lesson screen (``t``).

Same questions, checking and explanations as ``distai quiz`` (:mod:`distai.lessons.quiz`), and the
same recording (:class:`distai.tutor.review.QuizSession` on the app's progress store): each settled
answer goes to the history that spaced review uses, a finished quiz saves its score for the home
screen. Type the answer (units welcome: ``16.6 GB``, ``1.5 ms``, ``27%``) or the option's number,
then Enter; Enter again moves on. ``ctrl+n`` deals a new quiz, ``escape`` goes back.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING, cast

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from ..lessons.strings import translated
from ..lessons.units import format_score
from .screens.common import BoundStatic, localize_bindings

if TYPE_CHECKING:
    from .app import DistaiApp
    from .review import QuizSession


def _numbered(n: int, text: str) -> Table:
    """An option as "n. text", its text wrapping under itself rather than under the number."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row(f"{n}.", text)
    return grid


class AnswerInput(Input):
    """The answer box, which leaves "?" to the screen's help (no answer holds one): an Input consumes
    every printable key before even a priority binding sees it."""

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return character != "?" and super().check_consume_key(key, character)


class QuizScreen(Screen):
    """A quiz of ``count`` questions on ``lesson`` (a registry Lesson) in ``language``."""

    DEFAULT_CSS = """
    QuizScreen { layout: vertical; }
    QuizScreen #quiz-title { text-style: bold; padding: 0 1; }
    QuizScreen #quiz-counter { color: $text-muted; padding: 0 1; }
    QuizScreen #quiz-body { height: 1fr; padding: 0 1; }
    QuizScreen #quiz-prompt { margin: 1 0 0 0; }
    QuizScreen #quiz-choices { height: auto; max-height: 10; margin: 1 0 0 0; }
    QuizScreen #quiz-feedback { margin: 1 0 0 0; }
    QuizScreen #quiz-input { margin: 0 1; }
    """
    help_context = "quiz"  # the help overlay's keys for this screen (the app's palette asks for them too)
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("ctrl+n", "new_quiz", "New quiz"),
        Binding("question_mark", "help", "Help", key_display="?", priority=True),  # AnswerInput leaves "?" to it
    ]

    def __init__(self, lesson, language: str = "en", count: int = 5, seed: int | None = None):
        super().__init__()
        self.lesson = lesson
        self.lang = language if language in ("en", "es") else "en"
        self.count = count
        self.seed = seed
        self.session: QuizSession | None = None  # built by new_quiz when the screen mounts
        self.mode = "asking"  # asking | feedback | done

    # -- layout ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(translated("quiz_screen", "title", self.lang, title=self.lesson.title[self.lang]), id="quiz-title")
        yield Static("", id="quiz-counter")
        with VerticalScroll(id="quiz-body"):
            yield BoundStatic("", id="quiz-prompt")
            yield OptionList(id="quiz-choices")
            yield BoundStatic("", id="quiz-feedback")
        yield AnswerInput(id="quiz-input")
        yield Footer()

    def on_mount(self) -> None:
        # the footer's words in the quiz's language (the catalog's back and new)
        localize_bindings(self, self.lang, {"back": "back", "new_quiz": "new", "help": "help"}, area="quiz_screen")
        self.new_quiz(self.seed)

    # -- state -------------------------------------------------------------------------------
    @property
    def store(self):
        return getattr(self.app, "store", None)

    @property
    def quiz(self) -> QuizSession:
        """The quiz in progress."""
        if self.session is None:
            raise RuntimeError("the quiz screen has no quiz before it is mounted")
        return self.session

    def new_quiz(self, seed: int | None = None) -> None:
        from ..lessons.quiz import build_quiz
        from .review import QuizSession

        if seed is None:
            seed = random.SystemRandom().randrange(10 ** 6)
        self.seed = seed
        questions = build_quiz(self.lesson.id, self.count, seed, self.lang)
        self.session = QuizSession(questions, self.store, self.lesson.id)
        self.show_question()

    def show_question(self) -> None:
        q = self.quiz.current
        if q is None:  # every question answered
            self.show_score()
            return
        self.mode = "asking"
        self.query_one("#quiz-counter", Static).update(
            translated("quiz_screen", "counter", self.lang, i=self.quiz.index + 1, n=len(self.quiz.questions), c=self.quiz.correct))
        prompt = Text(q.prompt, style="bold")
        if not q.is_choice:
            prompt.append("\n" + translated("quiz_screen", "tolerance", self.lang, tol=q.tolerance_text()), style="dim")
        self.query_one("#quiz-prompt", Static).update(prompt)
        choices = self.query_one("#quiz-choices", OptionList)
        choices.clear_options()
        choices.display, choices.disabled = q.is_choice, False
        if q.is_choice:
            choices.add_options(Option(_numbered(i + 1, c), id=str(i)) for i, c in enumerate(q.choices))
            choices.highlighted = None
        self.query_one("#quiz-feedback", Static).update("")
        box = self.query_one("#quiz-input", Input)
        box.value = ""
        box.placeholder = translated("quiz_screen", "placeholder_choice" if q.is_choice else "placeholder_num", self.lang)
        box.focus()

    def submit(self, text: str) -> None:
        """Check ``text`` against the current question (or move on after feedback)."""
        if self.mode == "feedback":
            if self.quiz.finished:
                self.show_score()
            else:
                self.show_question()
            return
        if self.mode == "done":
            self.new_quiz()
            return
        q = self.quiz.current
        if q is None:
            self.show_score()
            return
        out = self.quiz.answer(text)
        if self.quiz.unsaved is not None:  # the quiz goes on; the app says it once
            cast("DistaiApp", self.app).say_unsaved(self.quiz.unsaved)
        feedback = self.query_one("#quiz-feedback", Static)
        if not out.final:
            feedback.update(Text(translated("quiz_screen", "again", self.lang, msg=out.check.message), style="yellow"))
            return
        msg = Text()
        if out.correct:
            msg.append(translated("quiz_screen", "right", self.lang), style="bold green")
        else:
            key = "wrong" if out.check.valid else "unread"
            msg.append(translated("quiz_screen", key, self.lang, answer=q.answer_text()), style="bold red")
        msg.append("\n\n" + translated("quiz_screen", "why", self.lang), style="bold")
        msg.append(q.explanation)
        feedback.update(msg)
        self.mode = "feedback"
        self.query_one("#quiz-choices", OptionList).disabled = True  # answered: a stray click picks nothing
        box = self.query_one("#quiz-input", Input)
        box.value = ""
        box.placeholder = translated("quiz_screen", "placeholder_next", self.lang)
        box.focus()  # an answer picked in the list leaves the focus there; Enter for the next question is the box's
        self.query_one("#quiz-counter", Static).update(
            translated("quiz_screen", "counter", self.lang, i=min(self.quiz.index, len(self.quiz.questions)),
              n=len(self.quiz.questions), c=self.quiz.correct))

    def show_score(self) -> None:
        self.mode = "done"
        self.query_one("#quiz-counter", Static).update("")  # "question 5 of 5" is over: the score says it all
        n = len(self.quiz.questions)
        pct = format_score(self.quiz.correct / n, self.lang)
        text = Text(translated("quiz_screen", "score", self.lang, c=self.quiz.correct, n=n, pct=pct), style="bold")
        text.append(translated("quiz_screen", "saved", self.lang) if self.quiz.saved else translated("quiz_screen", "not_saved", self.lang))
        self.query_one("#quiz-prompt", Static).update(text)
        self.query_one("#quiz-choices", OptionList).display = False
        self.query_one("#quiz-feedback", Static).update("")
        box = self.query_one("#quiz-input", Input)
        box.placeholder = translated("quiz_screen", "placeholder_done", self.lang)
        box.focus()

    # -- events ------------------------------------------------------------------------------
    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit(event.value)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if self.mode == "asking" and event.option.id is not None:
            self.submit(str(int(event.option.id) + 1))

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_help(self) -> None:
        from .screens.help import open_help

        open_help(self.app, self.help_context, self.lang)

    def action_new_quiz(self) -> None:
        self.new_quiz()
