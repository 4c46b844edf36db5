"""The check table as a Rich renderable: ``distai run``'s summary, ``distai runs show`` and the run
panel draw a run's checks with it (rows and layout from ``lessons/check_view``: ``check_rows``,
``check_lines``).

Usage: ``table = check_table(events, lang)`` (a Rich ``Group``; None when the run checked nothing); ``events`` is any
iterable of run events (``RunState.checks`` keeps a run's ``check`` events as they arrive).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..lessons.check_view import check_lines, check_rows


def check_table(events: Iterable[Mapping[str, Any]], lang: str):
    """The run's checks as a Rich renderable: the title and headers in bold, each verdict coloured
    (green ok, yellow explained, red not explained), each missed check's causes dimmed under it,
    wrapped under their own indent where the line is narrower than they are; None without checks."""
    from rich.console import Group
    from rich.text import Text

    events = list(events)
    rows = check_rows(events, lang)
    if not rows:
        return None
    title, header, *body = check_lines(events, lang)
    parts: list[Any] = [Text(title, style="bold magenta"), Text(header, style="bold")]
    for row in rows:
        line = Text(body.pop(0))
        style = "green" if row.ok else "yellow" if row.explained else "bold red"
        line.stylize(style, len(line) - len(row.verdict))
        parts.append(line)
        if row.explanation:
            indent = len(body[0]) - len(body[0].lstrip())
            parts.append(_Indented(Text(body.pop(0).lstrip(), style="dim"), indent))
    return Group(*parts)


class _Indented:
    """Styled text wrapped under its own indent at the width it is drawn at, never between a number
    and its unit (``wrap_text``, the visualizers' rule): Rich's own wrap breaks at no-break spaces."""

    def __init__(self, text, indent: int):
        self.text, self.indent = text, indent

    def __rich_console__(self, console, options):
        from rich.text import Text

        from ..visualizers.ring_drawing import wrap_text

        for line in wrap_text(self.text, max(10, options.max_width - self.indent)):
            yield Text(" " * self.indent) + line
