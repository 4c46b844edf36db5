"""The bandwidth sweep of a lesson-1 run: busbw against message size, with the fitted α-β curves.

:func:`sweep_chart` draws it as lines of Rich text (the ring visualizer's chart view);
:class:`SweepChart` is the same chart as a stand-alone widget for a run view.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widget import Widget

from ..lessons.lesson1 import formulas
from ..lessons.strings import strings
from ..lessons.units import format_bandwidth, format_time
from .base import wrap_words
from .ring_drawing import AR_COLOR, RUN_COLOR, code_spans, fmt_bytes, styled, wrap_text

Cell = tuple[str, str | None]  # a character of the plot and its style


def sweep_chart(rows: Sequence[Mapping[str, Any]], fits: Mapping[str, Mapping[str, Any]], width: int, height: int,
                lang: str = "en") -> list[Text]:
    """busbw against message size (log₂ axis): our ring ●, ``dist.all_reduce`` ◆, fitted α-β curves ·.

    The fitted curves are ``formulas.busbw(S, a + b·S, n)`` with the run's ``fit`` events' a, b.
    Returns ``height`` lines at most, each at most ``width`` cells.
    """
    s = strings("ring", lang)["chart"]
    pts = [r for r in rows if r.get("size") and r.get("ring_busbw") is not None]
    if not pts:
        return wrap_text(code_spans(s["none"], "dim"), width)[:height]
    legend = [Text(line) for line in wrap_words(s["legend"], width)]
    fit_lines = _fit_lines(fits, s, lang)
    label_w = 10
    plot_w = max(8, width - label_w)
    plot_h = max(3, height - 3 - len(legend) - len(fit_lines))  # title, axis, x labels
    sizes = sorted({int(r["size"]) for r in pts})
    lo, hi = math.log2(sizes[0]), math.log2(sizes[-1])
    span = max(hi - lo, 1e-9)
    n = int(pts[0].get("n", 2))

    def col(size: float) -> int:
        return max(0, min(plot_w - 1, round((math.log2(size) - lo) / span * (plot_w - 1))))

    curves = _fitted_curves(fits, lo, span, plot_w, n)
    top = max([r["ring_busbw"] for r in pts] + [r.get("ar_busbw") or 0 for r in pts]
              + [v for vals in curves.values() for v in vals if v is not None])
    top = top * 1.05 if top > 0 else 1.0

    def row_of(v: float) -> int:
        return max(0, min(plot_h - 1, plot_h - 1 - round(v / top * (plot_h - 1))))

    grid: list[list[Cell]] = [[(" ", None)] * plot_w for _ in range(plot_h)]
    for impl, colour in (("all_reduce", AR_COLOR), ("ring", RUN_COLOR)):
        for c, v in enumerate(curves.get(impl, [])):
            if v is not None and v <= top:
                grid[row_of(v)][c] = ("·", colour)
    for r in pts:
        if r.get("ar_busbw") is not None:
            grid[row_of(r["ar_busbw"])][col(r["size"])] = ("◆", f"bold {AR_COLOR}")
    for r in pts:
        grid[row_of(r["ring_busbw"])][col(r["size"])] = ("●", f"bold {RUN_COLOR}")
    title = styled(s["title"], "bold")
    title.append(f"  N = {n}", style="dim")
    lines = [title]
    for y in range(plot_h):
        label = ""
        if y == 0:
            label = format_bandwidth(top * (plot_h - 1) / (plot_h - 1), digits=2, lang=lang)
        elif y == plot_h - 1:
            label = "0"
        elif y == (plot_h - 1) // 2:
            label = format_bandwidth(top * (plot_h - 1 - y) / (plot_h - 1), digits=2, lang=lang)
        lines.append(_plot_line(styled(f"{label:>{label_w - 2}} " + ("┤" if label else "│"), "dim"), grid[y]))
    lines.append(Text(" " * (label_w - 1) + "└" + "─" * plot_w, style="dim"))
    xl = [" "] * plot_w
    for size in (sizes[0], sizes[len(sizes) // 2], sizes[-1]):
        lab = fmt_bytes(size, lang).replace(" ", "")
        start = max(0, min(plot_w - len(lab), col(size) - len(lab) // 2))
        if all(ch == " " for ch in xl[max(0, start - 1):start + len(lab) + 1]):
            xl[start:start + len(lab)] = list(lab)
    lines.append(Text(" " * label_w + "".join(xl), style="dim"))
    lines.extend(legend)
    lines.extend(fit_lines)
    return lines[:max(height, 1)]


def _fit_lines(fits: Mapping[str, Mapping[str, Any]], s: dict, lang: str) -> list[Text]:
    """One line per fitted implementation: its α and 1/β."""
    out = []
    for impl in ("ring", "all_reduce"):
        f = fits.get(impl)
        if f and isinstance(f.get("alpha_s"), (int, float)) and isinstance(f.get("beta_s_per_byte"), (int, float)):
            bw = 1 / f["beta_s_per_byte"] if f["beta_s_per_byte"] > 0 else None
            out.append(Text(s["fit"].format(
                impl=s["impl"][impl], a=format_time(f["alpha_s"], lang=lang),
                bw="—" if bw is None else format_bandwidth(bw, lang=lang)), style="dim"))
    return out


def _fitted_curves(fits: Mapping[str, Mapping[str, Any]], lo: float, span: float, plot_w: int,
                   n: int) -> dict[str, list[float | None]]:
    """Per fitted implementation, the busbw of ``a + b·S`` at each column's size (None: t ≤ 0)."""
    curves: dict[str, list[float | None]] = {}
    for impl in ("ring", "all_reduce"):
        f = fits.get(impl)
        if not f or not isinstance(f.get("a_s"), (int, float)) or not isinstance(f.get("b_s_per_byte"), (int, float)):
            continue
        vals: list[float | None] = []
        for c in range(plot_w):
            size = 2 ** (lo + span * c / max(1, plot_w - 1))
            t = f["a_s"] + f["b_s_per_byte"] * size
            vals.append(formulas.busbw(size, t, int(f.get("n", n))) if t > 0 else None)
        curves[impl] = vals
    return curves


def _plot_line(line: Text, cells: list[Cell]) -> Text:
    """``line`` with the plot's ``cells`` appended, one span per run of the same style."""
    run_ch: list[str] = []
    run_style: str | None = None
    for ch, style in cells:
        if style != run_style and run_ch:
            line.append("".join(run_ch), style=run_style)
            run_ch = []
        run_style = style
        run_ch.append(ch)
    if run_ch:
        line.append("".join(run_ch), style=run_style)
    return line


class SweepChart(Widget):
    """The bandwidth-sweep chart alone, for a run view: ``update(rows, fits)``."""

    DEFAULT_CSS = "SweepChart { height: 1fr; width: 1fr; }"

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(**kwargs)
        self.language = language
        self.rows: list[Mapping[str, Any]] = []
        self.fits: dict[str, Mapping[str, Any]] = {}

    def update(self, rows: Sequence[Mapping[str, Any]], fits: Mapping[str, Mapping[str, Any]]) -> None:
        self.rows, self.fits = list(rows), dict(fits)
        self.refresh()

    def render(self) -> Text:
        lines = sweep_chart(self.rows, self.fits, self.size.width, self.size.height, self.language)
        out = Text("\n").join(lines)
        out.no_wrap = True
        return out
