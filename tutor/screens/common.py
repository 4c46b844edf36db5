"""What the tutor's screens share: bindings whose footer labels follow the language, and the
actions every screen offers (help, language)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.text import Text
from textual.binding import BindingsMap
from textual.dom import DOMNode
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static

from ...lessons import units
from ...lessons.strings import translated


def localize_bindings(node: DOMNode, lang: str, labels: dict[str, str], area: str = "tutor",
                      hidden: frozenset[str] = frozenset()) -> None:
    """Give ``node``'s bindings the footer descriptions ``labels[action]`` (keys of the catalog's
    ``area``) in ``lang``; those of the ``hidden`` actions leave the footer (the keys still work)."""
    merged = type(node)._merged_bindings
    if merged is None:
        return
    new = BindingsMap()
    for _key, bindings in merged.key_to_bindings.items():
        for binding in bindings:
            if binding.action in labels:
                binding = replace(binding, description=translated(area, labels[binding.action], lang))
            if binding.action in hidden:
                binding = replace(binding, show=False)
            new._add_binding(binding)
    node._bindings = new
    node.refresh_bindings()


def apply_breakpoints(screen: Screen) -> None:
    """Give ``screen`` the classes of its breakpoints for the app's size now. Textual adds them on the
    screen's first Resize, which comes after its first layout: that first frame laid a lesson out as
    at 120 columns (text and visualizer side by side, the visualizer drawn 28 columns wide at 80x24)."""
    width, height = screen.app.size
    for breakpoints, dimension in ((screen.HORIZONTAL_BREAKPOINTS or screen.app.HORIZONTAL_BREAKPOINTS, width),
                                   (screen.VERTICAL_BREAKPOINTS or screen.app.VERTICAL_BREAKPOINTS, height)):
        if not breakpoints or not dimension:
            continue
        names = {name for _, name in breakpoints}
        chosen = next((name for at, name in sorted(breakpoints, reverse=True) if dimension >= at), None)
        for name in names:
            screen.set_class(name == chosen, name)


def more_below(box: Widget) -> bool:
    """Whether some of ``box`` is below what it shows: by the row it draws from (the rounded offset), so
    an animated scroll that shows the last line says so at once, not a second later at the float's end."""
    return box.scroll_offset.y < box.max_scroll_y


class CommonActions:
    """The actions of every tutor screen: the help overlay (``?``) and the language switch (``l``)."""

    app: Any

    def action_help(self) -> None:
        self.app.action_show_help_overlay()

    async def action_toggle_language(self) -> None:
        await self.app.action_toggle_language()


def wrap_bound(content: Text, console, width: int) -> Text:
    """``content`` wrapped to ``width`` as the lesson text wraps: never between a number and its unit, nor
    around the "=" of a symbol and its value (units.bind_units)."""
    glued = content.copy()
    glued.plain = units.bind_units_aligned(content.plain, units.GLUE)  # every style span stays where it was
    wrapped = Text("\n").join(glued.wrap(console, width))
    wrapped.plain = wrapped.plain.replace(units.GLUE, " ")
    return wrapped


class BoundText:
    """A Text that wraps as :func:`wrap_bound` says, for a line inside a Rich group (the run panel's α-β fits:
    "1,21" / "GB/s" split there)."""

    def __init__(self, text: Text):
        self.text = text

    def __rich_console__(self, console, options):
        yield wrap_bound(self.text, console, options.max_width)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        return Measurement.get(console, options, self.text)


class BoundStatic(Static):
    """A Static whose text wraps as the lesson text wraps: "= 140" / "µs" split the quiz's explanations."""

    def render(self):
        content, width = self.content, self.content_size.width
        if not isinstance(content, Text) or width < 20:
            return super().render()
        return wrap_bound(content, self.app.console, width)
