"""The check table as a Rich renderable: ``distai run``'s summary, ``distai runs show`` and the run
panel draw a run's checks with it (rows and layout from ``lessons/check_view``: ``check_rows``,
``table_lines``).

Usage: ``table = check_table(events, lang)`` (a Rich renderable; None when the run checked nothing); ``events`` is any
iterable of run events (``RunState.checks`` keeps a run's ``check`` events as they arrive).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..lessons.check_view import check_headers, check_rows, table_lines


def check_table(events: Iterable[Mapping[str, Any]], lang: str):
    """The run's checks as a Rich renderable, laid out for the width it is drawn at (each name on a
    line of its own where a row would not fit, and the names' header on its own line above the
    numbers' headers, as the rows are laid out): the title and headers in bold, each verdict coloured
    (green ok, yellow explained, red not explained), each missed check's causes dimmed under it,
    wrapped under their own indent; None without checks."""
    rows = check_rows(events, lang)
    return _CheckTable(rows, lang) if rows else None


class _CheckTable:
    def __init__(self, rows: list, lang: str):
        self.rows, self.lang = rows, lang

    def __rich_console__(self, console, options):
        from rich.text import Text

        style = {"title": "bold magenta", "header": "bold", "label": "bold"}
        lines = table_lines(self.rows, self.lang, options.max_width)
        if any(part == "label" for part, _text, _row in lines):  # each name on a line of its own: its
            at = next(i for i, (part, _text, _row) in enumerate(lines) if part == "header")  # header too
            lines.insert(at, ("header", check_headers(self.lang)[0], None))
        for part, text, row in lines:
            if part == "row" and row is not None:
                line = Text(text)
                line.stylize("green" if row.ok else "yellow" if row.explained else "bold red",
                             len(line) - len(row.verdict))
                yield line
            elif part == "explanation":
                body = text.lstrip()
                yield _Indented(Text(body, style="dim"), len(text) - len(body))
            else:
                yield Text(text, style=style[part])


class _Indented:
    """Styled text wrapped under its own indent at the width it is drawn at, never between a number
    and its unit (``wrap_text``, the visualizers' rule): Rich's own wrap breaks at no-break spaces."""

    def __init__(self, text, indent: int):
        self.text, self.indent = text, indent

    def __rich_console__(self, console, options):
        from ..visualizers.ring_drawing import wrap_indented

        yield from wrap_indented(self.text, options.max_width, self.indent)
