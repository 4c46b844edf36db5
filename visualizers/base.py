"""What every lesson visualizer is, and how the tutor finds one by name.

A lesson's ``lesson.toml`` names its visualizer (``visualizer = "ring"``); the widget lives in
``distai.visualizers.<name>`` (dashes become underscores) and that module exposes it as
``VISUALIZER``. Until a lesson's visualizer lands, the tutor shows ``Placeholder``.
Visualizers draw a lesson model's state: no torch, no I/O.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from ..lessons import units
from ..lessons.registry import step_view
from ..lessons.strings import strings, translated
from .legibility import legible_strip

# The lesson screen's keys: they work whatever has focus, so no visualizer may bind them.
LESSON_KEYS = frozenset({"n", "p", "t", "r", "l", "v", "q", "question_mark", "escape", "left", "right",
                         "tab", "shift+tab", "ctrl+p"})
# How Textual's key names read in the help and the hints (the words among them, ``space``, ``home``
# and ``end``, are in the catalog: lessons/catalog/visualizer.toml's ``key_names``).
KEY_SYMBOLS = {"comma": ",", "full_stop": ".", "left_square_bracket": "[", "right_square_bracket": "]",
               "left_curly_bracket": "{", "right_curly_bracket": "}",
               "plus": "+", "minus": "-", "equals_sign": "=", "underscore": "_"}


def key_name(key: str, lang: str) -> str:
    """How the Textual key ``key`` reads to a learner in ``lang`` (``space`` → ``espacio``)."""
    if key in KEY_SYMBOLS:
        return KEY_SYMBOLS[key]
    words = strings("visualizer", lang)["key_names"]
    return words.get(key, key)


@dataclass(frozen=True)
class Control:
    """One thing the learner can do in a visualizer: its key(s), the action, what it does.

    ``keys`` are Textual key names (comma-separated for aliases). ``label`` names what it does in the
    catalog: ``"ring.size"`` is ``size`` in the ``key_actions`` table of lessons/catalog/ring.toml, so
    a visualizer's strings, its keys' included, are one file. A pair
    (``more`` / ``less``) gives ``back_keys`` and ``back_action`` too, shown as ``s / S``. ``hint``
    puts it in the one-line hint a visualizer draws (the help overlay, ``?``, lists every control).
    """

    keys: str
    action: str
    label: str
    back_keys: str = ""
    back_action: str = ""
    hint: bool = False

    def text(self, lang: str) -> str:
        """What the control does, in ``lang``."""
        return translated(*self.catalog_key(), lang)

    @property
    def name(self) -> str:
        """The control's own name, unique in its visualizer: its label's key (``"ring.size"`` → ``size``)."""
        return self.label.partition(".")[2]

    def catalog_key(self) -> tuple[str, str]:
        """(area, key) of its label in the catalog: ``"ring.size"`` → ``("ring", "key_actions.size")``."""
        area, _, name = self.label.partition(".")
        return area, f"key_actions.{name}"

    def bindings(self) -> list[Binding]:
        out = [Binding(self.keys, self.action, self.text("en"), show=False)]
        if self.back_keys:
            out.append(Binding(self.back_keys, self.back_action, self.text("en"), show=False))
        return out

    def key_names(self) -> list[str]:
        return [k.strip() for k in f"{self.keys},{self.back_keys}".split(",") if k.strip()]

    def shown(self, lang: str) -> str:
        def first(keys: str) -> str:
            return key_name(keys.split(",")[0].strip(), lang)

        return f"{first(self.keys)} / {first(self.back_keys)}" if self.back_keys else first(self.keys)


# The controls every animated visualizer shares (the playback base's actions).
PLAY = Control("space", "play", "visualizer.play", hint=True)
STEP = Control("full_stop", "step(1)", "visualizer.step", back_keys="comma", back_action="step(-1)", hint=True)
RESTART = Control("0,home", "restart", "visualizer.restart")
TO_END = Control("end", "to_end", "visualizer.to_end")
SPEED = Control("plus,equals_sign", "speed(1)", "visualizer.speed", back_keys="minus", back_action="speed(-1)")
PLAYBACK_CONTROLS = (PLAY, STEP, RESTART, TO_END, SPEED)
NEXT_VIEW = Control("g", "next_view", "visualizer.next_view", hint=True)


def view_controls(area: str, views: tuple[str, ...], first: int = 1) -> tuple[Control, ...]:
    """A digit key per view, in order from ``first``: ``1`` shows ``views[0]`` (``view('…')``), its
    label ``<area>.view_<view>`` (``view_<view>`` in the ``key_actions`` table of the area)."""
    return tuple(Control(str(first + i), f"view('{view}')", f"{area}.view_{view.replace('-', '_')}")
                 for i, view in enumerate(views))


class LessonVisualizer(Widget):
    """Base class: a widget the lesson screen shows beside the step text.

    A visualizer declares its ``CONTROLS``; the bindings, the help overlay's list (``key_help``)
    and the hint line (``controls_hint``) all come from them. The lesson screen hands it the
    keys that nothing else takes (``press``), so its keys work without focusing it first.
    """

    # ``DEFAULT_CLASSES = "panel"``: lines of text one cell in from the sides, lit while focused
    DEFAULT_CSS = """
    LessonVisualizer { height: 1fr; width: 1fr; }
    LessonVisualizer.panel { padding: 0 1; }
    LessonVisualizer.panel:focus { background: $boost; }
    """
    CONTROLS: ClassVar[tuple[Control, ...]] = ()
    HINTS: ClassVar[dict[str, tuple[str, ...]]] = {}  # per view: the controls (names) its hint line shows
    VIEWS: ClassVar[tuple[str, ...]] = ()  # the views ``self.view`` takes, in the order ``g`` cycles them
    # the settings a step's ``view = {...}`` may give it (empty: not declared; a test holds lesson.toml to it)
    STEP_SETTINGS: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs):
        if "CONTROLS" in cls.__dict__:  # before Textual's own hook reads BINDINGS
            cls.BINDINGS = [b for c in cls.CONTROLS for b in c.bindings()]
        super().__init_subclass__(**kwargs)

    class ReplayRequested(Message):
        """The learner asked to see the lesson's latest recorded run in this visualizer.

        The tutor (which may read files; visualizers may not) answers by feeding that run's
        events to ``visualizer.feed_event``.
        """

        def __init__(self, visualizer: LessonVisualizer, quiet: bool = False, newest: bool = False):
            super().__init__()
            self.visualizer = visualizer
            self.quiet = quiet  # asked by a step that shows the run, not by the learner: no run is no news
            # the run that just ended, however it ended (back from the run panel); else the newest that ended ok
            self.newest = newest

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(**kwargs)
        self.language = language
        self._asked_for_run = False  # ask_for_the_latest_run's once

    def render_lines(self, crop):
        """Every visualizer's lines, their fixed hues made legible on the learner's theme (and NO_COLOR)."""
        return [legible_strip(strip, self.app.no_color) for strip in super().render_lines(crop)]

    def key_help(self) -> list[tuple[str, str]]:
        """``(keys, what they do)`` in ``self.language`` for the help overlay: the controls whose keys reach
        this visualizer (the run panel keeps ``s`` and ``a`` for Stop and Run again)."""
        return [(c.shown(self.language), c.text(self.language)) for c in self.CONTROLS if not self._kept_by_screen(c)]

    def _kept_by_screen(self, control: Control) -> bool:
        """Whether the screen binds one of ``control``'s keys itself: then the key is the screen's, and the
        control neither runs, nor is named in the hint or the help."""
        taken = _screen_keys(self.screen) if self.is_attached else set()
        return any(k in taken for k in control.key_names())

    def controls_hint(self, width: int | None = None, names: tuple[str, ...] | None = None) -> str:
        """One line: the main controls, in words, and where to find the rest (``?``); with
        ``width``, as many of them as fit in it; ``names`` (controls' :attr:`Control.name`) picks
        other controls than the ``hint`` ones (those of the view shown, say)."""
        parts = self._hint_parts(names)
        more = parts.pop()
        while parts and width is not None and len(" · ".join(parts + [more])) > width:
            parts.pop()
        return " · ".join(parts + [more])

    def hint_parts(self, view: str) -> list[str]:
        """The hint of ``self.HINTS[view]`` (a visualizer's per-view hints), one part per control."""
        return self._hint_parts(self.HINTS[view])

    def _hint_parts(self, names: tuple[str, ...] | None) -> list[str]:
        lang = self.language
        picked = [c for c in self.CONTROLS
                  if (c.name in names if names is not None else c.hint) and not self._kept_by_screen(c)]
        return [f"{c.shown(lang)} {c.text(lang)}" for c in picked] + [translated("visualizer", "more_keys", lang)]

    def fit_height(self, lines: list, height: int | None) -> list:
        """``lines`` cut to ``height``, never silently: the last line (the hint) stays and a mark
        says how many lines a taller pane (or ``v`` hiding the text… a bigger terminal) would show."""

        if not height or len(lines) <= height:
            return lines
        if height < 3:
            return lines[:height]
        keep = height - 2
        hidden = len(lines) - 1 - keep
        return lines[:keep] + [self.more_lines_mark(hidden), lines[-1]]

    def more_lines_mark(self, hidden: int):
        """"▼ n more lines", and the key of the screen hosting this visualizer that gives it more room (the
        lesson screen's V, the run panel's v; none once it has the room)."""
        from rich.text import Text

        room_key = getattr(self.screen, "room_key", None) if self.is_attached else None
        key = room_key() if callable(room_key) else None
        text = (translated("visualizer", "more_lines_key", self.language, n=hidden, key=key) if key
                else translated("visualizer", "more_lines", self.language, n=hidden))
        return Text(text, style="dim italic")

    def control_for(self, key: str) -> tuple[str, Control] | None:
        """The action ``key`` runs here, with its control, or None."""
        for control in self.CONTROLS:
            if key in [k.strip() for k in control.keys.split(",")]:
                return control.action, control
            if key in [k.strip() for k in control.back_keys.split(",") if k.strip()]:
                return control.back_action, control
        return None

    async def press(self, key: str) -> bool:
        """Run the control bound to ``key`` (the lesson screen's unclaimed keys); True if one ran."""
        found = self.control_for(key)
        if found is None:
            return False
        action = found[0]
        name = action.split("(", 1)[0]
        if self.check_action(name, ()) is False:
            return False
        await self.run_action(action)
        return True

    async def take_unclaimed_key(self, event) -> None:
        """A key event nothing on the screen took (the lesson screen's and the run panel's ``on_key``): its
        control runs, so the controls work without focusing the visualizer, and the event stops there. When
        the visualizer has the focus its own bindings already had the key."""
        if self.screen.focused is self:
            return
        if await self.press(event.key):
            event.stop()
            event.prevent_default()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """Leave a key to the screen when it binds it too (the run panel's ``s`` Stop, ``a`` Again)."""
        for control in self.CONTROLS:
            if action in (control.action.split("(", 1)[0], control.back_action.split("(", 1)[0]):
                if self._kept_by_screen(control):
                    return False
        return True

    def action_view(self, view: str) -> None:
        """Show ``view`` (one of ``VIEWS``)."""
        self.view = view
        self.refresh()

    def action_next_view(self) -> None:
        """Show the next of the views that can be shown now (``NEXT_VIEW``, ``g``)."""
        views = self.views_available()
        at = views.index(self.view) + 1 if self.view in views else 0
        self.action_view(views[at % len(views)])

    def views_available(self) -> tuple[str, ...]:
        """The ``VIEWS`` there is something to show in (all of them, unless a subclass says)."""
        return self.VIEWS

    def show_step(self, step_key: str) -> None:
        """The lesson moved to ``step_key``: highlight what that step teaches (optional).

        What a step shows is declared by the step itself (``view = {...}`` in its lesson.toml,
        read with :meth:`step_view`), not by the visualizer."""

    def step_view(self, step_key: str) -> dict:
        """The settings the lesson's step ``step_key`` gives this visualizer (``{}`` if none)."""
        return step_view(type(self).__module__.rsplit(".", 1)[-1], step_key)

    def feed_event(self, event: dict) -> None:
        """One event from a live or replayed run of the lesson's experiment (optional)."""

    def shows_run(self, step_key: str) -> bool:
        """Whether the step draws the learner's run (``show = "run"`` or ``"chart"``, ``source = "run"``):
        the lesson screen then replays the latest one into it, as the step asks and after a run ends."""
        view = self.step_view(step_key)
        return view.get("show") in ("run", "chart") or view.get("source") == "run"

    def ask_for_the_latest_run(self) -> None:
        """Once in this widget's life: a step that draws the learner's run asks for the latest (quietly: no run
        is no news), so that a run without what the step draws is not read again at every visit."""
        if not self._asked_for_run:
            self._asked_for_run = True
            self.post_message(self.ReplayRequested(self, quiet=True))


def wrap_words(text: str, width: int) -> list[str]:
    """Greedy word wrap for hints and captions (a word longer than ``width`` keeps its own line); a
    number stays with its unit and a symbol with its value (lessons/units.py's bind_units)."""
    width = max(8, width)
    out: list[str] = []
    line = ""
    # a pair of keys or of words given as alternatives ("] / [", "more / fewer") stays on one line
    bound = re.sub(r"(?<=\S) / (?=\S)", f"{units.GLUE}/{units.GLUE}", units.bind_units(text, units.GLUE))
    for word in bound.split(" "):
        word = word.replace(units.GLUE, " ")
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out


def _screen_keys(screen) -> set[str]:
    """The keys a screen binds itself (from its BINDINGS)."""
    keys: set[str] = set()
    for b in getattr(type(screen), "BINDINGS", []):
        key = b.key if isinstance(b, Binding) else b[0]
        keys.update(k.strip() for k in key.split(","))
    return keys


class Placeholder(LessonVisualizer):
    """Stands in for a visualizer that has not been written yet."""

    def __init__(self, name: str | None = None, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.visualizer_name = name

    def compose(self):
        label = translated("visualizer", "coming_soon", self.language)
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
