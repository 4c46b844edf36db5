"""The one view of a run's checks (issue 28): its ``check`` events as translated, formatted rows.

Every place that shows a run's predictions against its measurements reads them through here:
``distai run``'s end-of-run summary and ``distai runs show`` (``tutor/check_table.py`` draws the
rows as a Rich table under the run's view), the tutor's run panel (the same table). Pure: events
in, strings out (names and headers from ``lessons/catalog/checks.toml``, numbers through
``lessons/units.py``; bytes in decimal units, as the lessons' formulas and calculators give them).

Usage::

    from ..lessons.check_view import check_rows, check_headers, check_lines

    rows = check_rows(events, lang)       # events: any iterable of run events; non-checks are skipped
    for row in rows:                      # one CheckRow per name and the ranks that read alike (the
                                          #   last event of each rank wins)
        row.cells()                       # label, predicted, measured, gap, verdict: the table's columns
        row.explanation                   # "" when ok, else "= 20% + unequal stages +9.0 pts + … = 35%;
                                          #   unexplained +1.0 pts": the line under the row
        row.causes, row.unexplained       # its parts; row.ok, row.explained: booleans (colour)
    check_headers(lang)                   # the column titles, in cells()' order
    check_lines(events, lang)             # the same table as plain aligned text lines (title first)
    check_lines(events, lang, width)      # ... each name on a line of its own where a row is wider
    table_lines(rows, lang, width)        # the same lines, each with its part ("row", ...) and its row

A check's ``name`` is a key of ``[name]`` in the catalog and each cause a key of ``[cause]``; a
lesson adds its own there (a name without one shows as written). Units: ``s`` (time), ``B`` (bytes),
``B/s`` (bandwidth), ``fraction`` (a share, shown as a percentage; a gap in points), ``count``,
``ratio`` (×); any other unit is shown after the number. A gap in a fraction is in points, one decimal.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .checks import Check, reconcile
from .events import CHECK
from .strings import has, translated
from .units import (
    format_bandwidth,
    format_bytes,
    format_fixed,
    format_number,
    format_percent,
    format_range,
    format_time,
)

__all__ = ["CheckRow", "check_rows", "check_headers", "check_lines", "table_lines", "format_value", "check_label",
           "cause_label", "COLUMNS"]

#: the table's columns, in order (catalog keys of checks.toml); a missed check's causes go on a line under it
COLUMNS = ("check", "predicted", "measured", "gap", "verdict")


@dataclass(frozen=True)
class CheckRow:
    """One check as the learner reads it: every field a formatted string but ``ok``/``explained``."""
    label: str
    predicted: str
    measured: str
    gap: str
    causes: str  # "unequal stages +9.0 pts + communication +6.0 pts" ("—" when ok)
    unexplained: str  # what the causes leave ("—" when ok)
    explanation: str  # the line under a missed check: prediction + causes = total; unexplained ("" when ok)
    verdict: str
    ok: bool
    explained: bool
    event: Mapping[str, Any]

    def cells(self) -> tuple[str, ...]:
        """The row's cells in :data:`COLUMNS`' order."""
        return (self.label, self.predicted, self.measured, self.gap, self.verdict)


def _fixed_not_zero(value: float, decimals: int, lang: str) -> str:
    """``value`` with ``decimals`` decimals, or up to two more where fewer would show a nonzero
    value as 0 (an unexplained +0.04 pts, not "+0.0 pts" beside totals that differ by 0.1)."""
    for more in range(3):
        if value == 0 or round(abs(value), decimals + more) != 0:
            return format_fixed(value, decimals + more, lang)
    return format_fixed(value, decimals + 2, lang)


def format_value(value: float, unit: str, lang: str, *, signed: bool = False) -> str:
    """``value`` in ``unit`` as the learner reads it (``signed``: a difference, with its sign)."""
    sign = "+" if signed and value > 0 else ""
    if unit == "s":
        text = format_time(value, lang=lang)
    elif unit == "B":
        text = format_bytes(value, lang=lang)  # decimal, as the lessons' formulas give memory
    elif unit == "B/s":
        text = format_bandwidth(value, lang=lang)
    elif unit == "fraction":
        text = (translated("checks", "points", lang, value=_fixed_not_zero(100 * value, 1, lang)) if signed
                else format_percent(value, 3, lang))
    elif unit == "ratio":
        text = f"{_fixed_not_zero(value, 2, lang)}×"
    elif unit == "count":
        text = format_number(value, 4, lang)
    else:
        text = f"{format_number(value, 3, lang)} {unit}"
    return sign + text


def check_label(name: str, lang: str) -> str:
    """A check's name as the learner reads it (its catalog entry, else the name itself)."""
    return translated("checks", f"name.{name}", lang) if has("checks", f"name.{name}") else name


def cause_label(name: str, lang: str) -> str:
    """A cause's name as the learner reads it (its catalog entry, else the name itself)."""
    return translated("checks", f"cause.{name}", lang) if has("checks", f"cause.{name}") else name


def _row(event: Mapping[str, Any], lang: str, label: str) -> CheckRow:
    c: Check = reconcile(event)
    fmt = lambda v, signed=False: format_value(v, c.unit, lang, signed=signed)  # noqa: E731
    causes = " + ".join(f"{cause_label(k, lang)} {fmt(v, True)}" for k, v in c.causes.items()) if not c.ok else ""
    unexplained = fmt(c.unexplained, True) if not c.ok else "—"
    # a decomposition's causes are the measurement's parts: nothing to leave unexplained, nothing explained
    explanation = "" if c.ok else translated(
        "checks", "explanation_parts" if c.broken_down else "explanation", lang, predicted=fmt(c.predicted),
        causes=causes or "—", total=fmt(c.explained_value), unexplained=unexplained)
    verdict = "ok" if c.ok else "broken_down" if c.broken_down else "explained" if c.explained else "not_explained"
    return CheckRow(label=label, predicted=fmt(c.predicted), measured=fmt(c.measured),
                    gap=fmt(c.measured - c.predicted, True), causes=causes or "—", unexplained=unexplained,
                    explanation=explanation, verdict=translated("checks", verdict, lang), ok=c.ok,
                    explained=c.explained, event=event)


def check_rows(events: Iterable[Mapping[str, Any]], lang: str) -> list[CheckRow]:
    """The rows of every ``check`` event in ``events`` (others skipped), in the order each name first
    appeared, from the latest event of each (name, rank). The ranks whose rows of one name read
    alike (the same numbers, verdict and causes, as shown) share one row; a name more than one
    rank checks is labelled with its ranks ("(rank 2)", "(ranks 0–3)", "(ranks 0, 2)")."""
    latest: dict[tuple[str, Any], Mapping[str, Any]] = {}
    for event in events:
        if CHECK.matches(event):
            latest[(event["name"], event.get("rank"))] = event
    by_name: dict[str, list[tuple[Any, CheckRow]]] = {}
    for (name, rank), event in latest.items():
        by_name.setdefault(name, []).append((rank, _row(event, lang, check_label(name, lang))))
    rows = []
    for name, ranked in by_name.items():
        alike: dict[tuple[str, ...], list[tuple[Any, CheckRow]]] = {}
        for rank, row in ranked:
            alike.setdefault((*row.cells(), row.explanation), []).append((rank, row))
        for group in alike.values():
            ranks = [rank for rank, _ in group if rank is not None]
            row = group[-1][1]
            if len(ranked) > 1 and ranks:
                row = replace(row, label=_on_ranks(row.label, ranks, lang))
            rows.append(row)
    return rows


def _on_ranks(label: str, ranks: list[int], lang: str) -> str:
    """``label`` with the ranks it stands for: "(rank 2)", "(ranks 0–3)", "(ranks 0, 1)"."""
    if len(ranks) == 1:
        return translated("checks", "on_rank", lang, check=label, rank=ranks[0])
    ranks = sorted(ranks)
    contiguous = len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1))
    listed = format_range(ranks[0], ranks[-1]) if contiguous else ", ".join(str(r) for r in ranks)
    return translated("checks", "on_ranks", lang, check=label, ranks=listed)


def check_headers(lang: str) -> tuple[str, ...]:
    """The column titles, in :class:`CheckRow.cells`' order."""
    return tuple(translated("checks", key, lang) for key in COLUMNS)


def check_lines(events: Iterable[Mapping[str, Any]], lang: str, width: int | None = None) -> list[str]:
    """The check table as plain text: its title, the headers and one line per check, columns
    aligned, each missed check's explanation indented under it (empty when the run checked nothing).
    Where a row would be wider than ``width``, each check's name gets a line of its own and its
    numbers go under it, aligned under the numbers' headers (the run panel's half-width column)."""
    return [text for _part, text, _row in table_lines(check_rows(events, lang), lang, width)]


def table_lines(rows: list[CheckRow], lang: str, width: int | None = None) -> list[tuple[str, str, CheckRow | None]]:
    """:func:`check_lines` of ``rows``, each line with what it is: ``("title" | "header" | "label" | "row" |
    "explanation", text, its row or None)``, for a view that styles each part (``tutor/check_table.py``)."""
    if not rows:
        return []
    headers = check_headers(lang)
    table = [headers, *(r.cells() for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    stacked = width is not None and sum(widths) + 2 * (len(widths) - 1) > width
    if stacked:  # the name column leaves the table: two cells of indent stand for it
        widths[0] = 0

    def line(cells: tuple[str, ...]) -> str:
        if stacked:
            cells = ("", *cells[1:])
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    lines: list[tuple[str, str, CheckRow | None]] = [("title", translated("checks", "title", lang), None),
                                                     ("header", line(headers), None)]
    for row in rows:
        if stacked:
            lines.append(("label", row.label, row))
        lines.append(("row", line(row.cells()), row))
        if row.explanation:
            lines.append(("explanation", "  " + row.explanation, row))
    return lines
