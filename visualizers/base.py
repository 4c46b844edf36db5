"""What every lesson visualizer is, and how the tutor finds one by name.

A lesson's ``lesson.toml`` names its visualizer (``visualizer = "ring"``); the widget lives in
``distai.visualizers.<name>`` (dashes become underscores) and that module exposes it as
``VISUALIZER``. Until a lesson's visualizer lands, the tutor shows ``Placeholder``.
Visualizers draw a lesson model's state: no torch, no I/O.
"""
from __future__ import annotations

import importlib

from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static


class LessonVisualizer(Widget):
    """Base class: a widget the lesson screen shows beside the step text."""

    DEFAULT_CSS = """
    LessonVisualizer { height: 1fr; width: 1fr; }
    """

    class ReplayRequested(Message):
        """The learner asked to see the lesson's latest recorded run in this visualizer.

        The tutor (which may read files; visualizers may not) answers by feeding that run's
        events to ``visualizer.feed_event``.
        """

        def __init__(self, visualizer: LessonVisualizer):
            super().__init__()
            self.visualizer = visualizer

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(**kwargs)
        self.language = language

    def key_help(self) -> list[tuple[str, str]]:
        """``(keys, what they do)`` in ``self.language`` for the help overlay (optional)."""
        return []

    def show_step(self, step_key: str) -> None:
        """The lesson moved to ``step_key``: highlight what that step teaches (optional)."""

    def feed_event(self, event: dict) -> None:
        """One event from a live or replayed run of the lesson's experiment (optional)."""


class Placeholder(LessonVisualizer):
    """Stands in for a visualizer that has not been written yet."""

    def __init__(self, name: str | None = None, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.visualizer_name = name

    def compose(self):
        label = {"en": "visualizer coming soon", "es": "visualizador en preparación"}[self.language]
        yield Static(f"[dim]{self.visualizer_name or '—'}: {label}[/dim]")


def visualizer_class(name: str | None) -> type[LessonVisualizer] | None:
    """The widget class registered under ``name``, or None if there is none yet."""
    if not name:
        return None
    try:
        module = importlib.import_module(f"distai.visualizers.{name.replace('-', '_')}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("distai.visualizers"):
            return None
        raise
    return getattr(module, "VISUALIZER", None)


def make_visualizer(name: str | None, language: str = "en") -> LessonVisualizer:
    cls = visualizer_class(name)
    return cls(language=language) if cls is not None else Placeholder(name, language=language)
