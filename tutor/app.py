"""The Textual tutor: ``DistaiApp(language, lesson_id=None)``.

Home lists the lessons with the learner's progress; a lesson walks its steps with the
step's Markdown, the engine code it teaches and the lesson's visualizer; ``t`` opens the quiz
(``distai.tutor.quiz_screen.QuizScreen``) and ``r`` the run panel
(``distai.tutor.run_panel.RunPanelScreen``) once those modules exist. Importing this module
does not import torch.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from functools import partial

from textual.app import App, SystemCommand
from textual.binding import BindingsMap
from textual.command import CommandPalette, DiscoveryHit, Hits
from textual.screen import Screen
from textual.system_commands import SystemCommandsProvider
from textual.theme import ThemeProvider

from ..lessons.registry import LANGUAGES, all_lessons, resolve_lesson
from ..lessons.strings import translated
from .progress import lesson_mastery
from .screens.help import open_help
from .screens.home import HomeScreen
from .screens.lesson import LessonScreen


class CourseOrderCommands(SystemCommandsProvider):
    """The palette's commands in the order the app gives them: lesson 1 to 10, not sorted as text
    ("Open lesson 10" came before "Open lesson 1")."""

    async def discover(self) -> Hits:
        for name, help_text, callback, discover in self.app.get_system_commands(self.screen):
            if discover:
                yield DiscoveryHit(name, callback, help=help_text)


# `kill` and a closed terminal: the tutor ends on them as on q (DistaiApp.on_mount)
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: seconds the tutor may take to go once its screens are gone (its run stopped, its progress saved) before it
#: ends itself: with its terminal closed, Textual's driver could wait without end on a thread (11 of 20 tutors
#: whose tmux session was killed were still there an hour later, idle)
EXIT_STALL_S = 20.0


def end_after(seconds: float, code: int) -> threading.Thread:
    """A daemon thread that ends the process with ``code`` if it is still here after ``seconds`` (an
    interpreter that exits normally takes the thread with it)."""
    def end() -> None:
        time.sleep(seconds)
        os._exit(code)

    watchdog = threading.Thread(target=end, name="distai-exit-watchdog", daemon=True)
    watchdog.start()
    return watchdog


class NoTerminal(RuntimeError):
    """The tutor was started with its input or output not a terminal (a script, ``< /dev/null``, a pipe)."""


def on_a_terminal() -> bool:
    """Whether standard input and output are both terminals, as the tutor's screen and keys need."""
    import sys

    return all(stream is not None and stream.isatty() for stream in (sys.stdin, sys.stdout))


#: the tutor's garbage collector thresholds (young, middle, full), where Python's are (700, 10, 10).
#: Textual caches every line it draws (a Strip and its caches): after a few lessons the heap holds ~400k
#: long-lived objects, and the full collection Python runs at each 25 % of growth froze the screen about 25
#: times in a minute's reading of the lessons, up to 0.3 s each (bench/tutor_gc.py). Young collections every
#: 20,000 allocations, middle ones over at most 100,000 objects, leave one full collection to a minute and
#: no pause over about 70 ms. Fewer middle collections (50,000 and 20) left single pauses of 0.3-0.4 s.
GC_THRESHOLDS = (20_000, 5, 10)


class DistaiApp(App):
    """The distai tutor."""

    def run(self, *args, **kwargs):
        """The app, on a terminal only: from ``< /dev/null`` Textual's driver redrew the screen at full speed for
        ever (410 MB of output in 10 minutes), deaf to SIGTERM and SIGINT. Its process collects garbage at
        :data:`GC_THRESHOLDS`."""
        if not kwargs.get("headless") and not on_a_terminal():  # headless (snapshots, tests) draws nowhere
            raise NoTerminal
        gc.set_threshold(*GC_THRESHOLDS)
        return super().run(*args, **kwargs)

    CSS_PATH = "app.tcss"
    TITLE = "distai"
    COMMANDS = {CourseOrderCommands}

    def __init__(self, language: str = "en", lesson_id: str | None = None, store=None):
        super().__init__()
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}; choose one of {', '.join(LANGUAGES)}")
        self.language = language
        self.initial_lesson = resolve_lesson(lesson_id) if lesson_id else None
        self.store_error: str | None = None
        self._said_unsaved = False
        self._owns_store = store is None
        if store is None:
            from .paths import DataHomeError
            from .progress import ProgressError, ProgressStore

            try:
                store = ProgressStore()
            except (ProgressError, DataHomeError) as exc:  # the tutor still teaches; it says progress is not saved
                self.store_error = exc.text(language)
        self.store = store

    # -- screens ---------------------------------------------------------------------------------
    def get_default_screen(self) -> Screen:
        return HomeScreen()

    def _localize_palette(self) -> None:
        """The footer's command-palette key ("^p palette", Textual's own binding on the app) in the language."""
        label = translated("tutor", "binding_palette", self.language)
        bindings = BindingsMap()
        for _key, binding in self._bindings:
            if binding.action == "command_palette":
                binding = replace(binding, description=label, tooltip=translated("tutor", "key_palette", self.language))
            bindings._add_binding(binding)
        self._bindings = bindings
        self.refresh_bindings()

    def on_mount(self) -> None:
        self._localize_palette()
        # `kill` or a closed terminal ends the tutor as q does: a run in its panel stops and says why ("the tutor
        # was closed"), not a launcher killed mid-run; the shell reads 128 + the signal, as for `distai run`
        loop = asyncio.get_running_loop()
        for signum in ENDING_SIGNALS:
            if signal.getsignal(signum) != signal.SIG_IGN:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                    loop.add_signal_handler(signum, self.exit, None, 128 + signum)
        saved = self.store.setting("theme") if self.store is not None else None
        if saved in self.available_themes:  # the learner's last choice (one no longer offered is let be)
            self.theme = saved
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        if self.store is not None and self.store.recovered_from:
            self.notify(self.store.recovered_text(self.language), severity="warning", timeout=15)
        if self.store_error:
            self.notify(translated("tutor", "progress_unsaved", self.language, error=self.store_error),
                        severity="error", timeout=15)
        if self.initial_lesson is not None:
            self.open_lesson(self.initial_lesson.id)

    def open_lesson(self, lesson_id: str) -> None:
        """Show a lesson above the home screen, resuming at the step last seen."""
        lesson = resolve_lesson(lesson_id)
        while len(self.screen_stack) > 1 and not isinstance(self.screen, HomeScreen):
            self.pop_screen()
        start = 0
        last = self.store.last_step_seen(lesson.id) if self.store is not None else None
        if last is not None and last in [s.key for s in lesson.steps]:
            start = lesson.step_index(last)
        self.push_screen(LessonScreen(lesson, start=start))
        if start:
            self.notify(translated("tutor", "resumed", self.language, k=start + 1), timeout=3)

    def action_show_help_overlay(self) -> None:
        # the run panel and the quiz name their own help (the palette's Help reaches them too)
        context = getattr(self.screen, "help_context", None) or (
            "lesson" if isinstance(self.screen, LessonScreen) else "home")
        open_help(self, context, self.language, getattr(self.screen, "visualizer", None))

    async def action_toggle_language(self) -> None:
        await self.set_language("es" if self.language == "en" else "en")

    async def set_language(self, language: str) -> None:
        """Switch the language and re-render every screen that knows how."""
        self.language = language
        self._localize_palette()
        for screen in self.screen_stack:
            apply = getattr(screen, "apply_language", None)
            if apply is not None:
                result = apply()
                if hasattr(result, "__await__"):
                    await result
        self.notify(translated("tutor", "language_now", language), timeout=2)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        lang = self.language
        yield SystemCommand(translated("tutor", "cmd_home", lang), translated("tutor", "cmd_home_help", lang), self.go_home)
        for lesson in all_lessons():
            yield SystemCommand(
                translated("tutor", "cmd_open", lang, n=lesson.number, title=lesson.title[lang]),
                translated("tutor", "cmd_open_help", lang, m=lesson.duration_min, slug=lesson.slug),
                partial(self.open_lesson, lesson.id),
            )
        yield SystemCommand(translated("tutor", "cmd_lang", lang), translated("tutor", "cmd_lang_help", lang),
                            self.action_toggle_language)
        # Textual's own commands are English, and its key panel lists its widgets' bindings in English: the
        # tutor's help overlay takes the panel's place, the rest is said in the learner's language
        yield SystemCommand(translated("tutor", "cmd_help", lang), translated("tutor", "cmd_help_help", lang),
                            self.action_show_help_overlay)
        yield SystemCommand(translated("tutor", "cmd_theme", lang), translated("tutor", "cmd_theme_help", lang),
                            self.search_themes)
        yield SystemCommand(translated("tutor", "cmd_screenshot", lang),
                            translated("tutor", "cmd_screenshot_help", lang), self.save_screenshot_here)
        yield SystemCommand(translated("tutor", "cmd_quit", lang), translated("tutor", "cmd_quit_help", lang),
                            self.action_quit)

    def save_screenshot_here(self) -> None:
        """Textual's Screenshot command, said in the learner's language (Textual's own toast is English)."""
        try:
            path = self.save_screenshot()
        except OSError as exc:
            self.notify(translated("tutor", "screenshot_failed", self.language, error=exc.strerror or exc),
                        severity="error")
            return
        self.notify(translated("tutor", "screenshot_saved", self.language, path=path), timeout=6)

    def action_command_palette(self) -> None:
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(CommandPalette(placeholder=translated("tutor", "cmd_search", self.language),
                                            id="--command-palette"))

    def search_themes(self) -> None:
        self.push_screen(CommandPalette(providers=[ThemeProvider],
                                        placeholder=translated("tutor", "cmd_theme_search", self.language)))

    def go_home(self) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()

    # -- progress (the screens go through these, so that a missing store is harmless) ------------
    def mark_step_seen(self, lesson_id: str, step_key: str) -> None:
        if self.store is not None:
            self._saving(self.store.mark_step_seen, lesson_id, step_key)

    def remember_position(self, lesson_id: str, step_key: str) -> None:
        if self.store is not None:
            self._saving(self.store.set_position, lesson_id, step_key)

    def _remember_theme(self, theme) -> None:
        if self.store is not None and self.store.setting("theme") != theme.name:
            self._saving(self.store.set_setting, "theme", theme.name)

    def _saving(self, write, *args) -> None:
        """A progress write; one the database cannot take now (another process holds it past the wait) is
        said once, and the lesson goes on."""
        from .progress import ProgressError

        try:
            write(*args)
        except ProgressError as exc:
            self.say_unsaved(exc)

    def say_unsaved(self, exc) -> None:
        """That progress could not be saved (``exc``: a ProgressError), once per session: the lessons and the
        quiz go on."""
        if not self._said_unsaved:
            self._said_unsaved = True
            self.notify(translated("tutor", "progress_unsaved", self.language, error=exc.text(self.language)),
                        severity="error", timeout=15)

    def steps_seen(self, lesson_id: str) -> set[str]:
        return self.store.steps_seen(lesson_id) if self.store is not None else set()

    def progress_summary(self) -> dict[str, dict]:
        if self.store is None:
            return {}
        summary = self.store.summary()
        for lesson_id, row in summary.items():
            row["mastery"] = lesson_mastery(self.store, lesson_id)
        return summary

    def on_unmount(self) -> None:
        # everything the learner keeps is saved by now (the run panel stopped its run as it unmounted); a headless
        # app (a test's) shares its process with what follows it
        if not self.is_headless:
            end_after(EXIT_STALL_S, self.return_code or 0)
        loop = asyncio.get_running_loop()
        for signum in ENDING_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)
        if self.store is not None and self._owns_store:
            self.store.close()
