"""A visualizer's state, kept in its reactive attributes and handled as one value.

The large visualizers keep what they show in a frozen dataclass of their lesson's view model
(``lessons/lesson1/ring_view.py``'s ``RingState``, …), which computes the next state purely; the
widget declares one Textual ``reactive`` per field, so a change repaints it (or runs its watcher)
without a hand-written ``refresh()``. :class:`StateOf` moves a whole state in and out.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Generic, TypeVar

State = TypeVar("State")


class StateOf(Generic[State]):
    """A widget's property: its reactive attributes read as one ``cls``, and set from one
    (``state = StateOf(RingState)``; ``self.state = view.advance(self.state, dt)``)."""

    def __init__(self, cls: type[State]):
        self.cls = cls

    def __get__(self, widget: Any, owner: type | None = None) -> State:
        if widget is None:
            return self  # type: ignore[return-value]  # the descriptor itself, on the class
        return read_state(widget, self.cls)

    def __set__(self, widget: Any, state: State) -> None:
        write_state(widget, state)


def read_state(widget: Any, cls: type[State]) -> State:
    """The widget's reactive attributes as a ``cls`` (a dataclass whose fields they are)."""
    return cls(**{name: getattr(widget, name) for name in _names(cls)})


def write_state(widget: Any, state: Any) -> None:
    """Set the widget's reactive attributes from ``state``: only those that changed repaint."""
    for name in _names(type(state)):
        setattr(widget, name, getattr(state, name))


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    """The dataclass's field names (read once per class: a frame reads the state often)."""
    if cls not in _NAMES:
        _NAMES[cls] = tuple(f.name for f in fields(cls))
    return _NAMES[cls]
