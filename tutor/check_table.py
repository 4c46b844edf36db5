"""The check table as a Rich renderable: ``distai run``'s summary, ``distai runs show`` and the run
panel draw a run's checks with it (rows and layout from ``lessons/check_view``: ``check_rows``,
``check_lines``).

Usage: ``table = check_table(events, lang)`` (None when the run checked nothing); ``events`` is any
iterable of run events (``RunState.checks`` keeps a run's ``check`` events as they arrive).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..lessons.check_view import check_lines, check_rows


def check_table(events: Iterable[Mapping[str, Any]], lang: str):
    """The run's checks as Rich ``Text``: the title and headers in bold, each verdict coloured
    (green ok, yellow explained, red not explained), each missed check's causes dimmed under it;
    None without checks."""
    from rich.text import Text

    events = list(events)
    rows = check_rows(events, lang)
    if not rows:
        return None
    title, header, *body = check_lines(events, lang)
    out = Text(title + "\n", style="bold magenta")
    out.append(header + "\n", style="bold")
    for row in rows:
        line = Text(body.pop(0))
        style = "green" if row.ok else "yellow" if row.explained else "bold red"
        line.stylize(style, len(line) - len(row.verdict))
        out.append_text(line)
        out.append("\n")
        if row.explanation:
            out.append(body.pop(0) + "\n", style="dim")
    out.rstrip()
    return out
