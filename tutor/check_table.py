"""The check table as a Rich renderable: ``distai run``'s summary, ``distai runs show`` and the run
panel draw a run's checks with it (the rows come from ``lessons/check_view.check_rows``).

Usage: ``table = check_table(events, lang)`` (None when the run checked nothing); ``events`` is any
iterable of run events (``RunState.checks`` keeps a run's ``check`` events as they arrive).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..lessons.check_view import check_headers, check_rows
from ..lessons.strings import translated


def check_table(events: Iterable[Mapping[str, Any]], lang: str):
    """A Rich ``Table`` of the run's checks, titled, a verdict coloured per row; None without checks."""
    from rich.table import Table
    from rich.text import Text

    rows = check_rows(events, lang)
    if not rows:
        return None
    table = Table(title=translated("checks", "title", lang), title_justify="left", show_edge=False,
                  pad_edge=False, box=None, header_style="bold", padding=(0, 1))
    for i, header in enumerate(check_headers(lang)):
        table.add_column(header, justify="left" if i in (0, 4) else "right", overflow="fold")
    for row in rows:
        style = "green" if row.ok else "yellow" if row.explained else "bold red"
        *cells, verdict = row.cells()
        table.add_row(*cells, Text(verdict, style=style))
    return table
