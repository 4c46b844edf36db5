"""Lesson 3's visualizer: how often to checkpoint, a simulated day of failures, and a real run.

Three views (the lesson's step chooses one; the keys are its ``CONTROLS``, listed by ``?``):

- *interval*: goodput (the share of wall-clock time spent on useful work) against the checkpoint
  interval τ on a log axis, simulated by :mod:`distai.lessons.lesson3.failure_sim` — a long
  failure log of the cluster played against each τ — as dots, over Daly's closed form as a thin
  line. Vertical marks: Young's √(2·C·M) (``Y``), Daly's interval (``D``) and the simulated
  optimum (``S``), which lands on Daly's.
- *day*: one simulated day on that cluster checkpointing at Daly's interval: work, checkpoints,
  the work lost to each failure, restarts, and the GPU that failed.
- *run*: the timeline of a real ``distai run lesson3`` fed by ``feed_event`` — each start of the
  worker group on its own row, its steps, checkpoints, the failure, the restart and the work
  redone, and the final comparison with an uninterrupted run.

The sliders move the GPUs (×2/÷2), the per-GPU MTBF, the checkpoint cost and the restart time up
and down ladders of round values; reset goes back to the Llama 3 example (16,384 GPUs, 419
interruptions in 54 days, C = 60 s, R = 5 min). No torch, no I/O; the simulation runs
in a worker thread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, overload

from rich.console import Group
from rich.text import Text
from textual import work

from ..lessons.events import RUN_START
from ..lessons.lesson3 import failure_sim as fs
from ..lessons.lesson3.formulas import DAY, component_mtbf_from_log, job_mtbf
from ..lessons.lesson3.run_timeline import RunTimeline
from ..lessons.strings import strings
from ..lessons.units import format_integer, format_percent, format_time
from .base import NEXT_VIEW, Control, LessonVisualizer, view_controls
from .ring_drawing import wrap_text
from .run_timeline import timeline_lines

FAILURES = 100_000  # failures in the simulated log behind the curve
GPU_RANGE = (1, 1 << 20)
HOUR = 3600.0
LADDERS: dict[str, list[float]] = {
    "gpu_mtbf": [h * HOUR for h in (100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000, 200_000,
                                    500_000, 1_000_000)],
    "cost": [0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200],
    "restart": [0, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600],
}


def ladder_step(value: float, ladder: list[float], up: bool) -> float:
    """The next round value above (or below) ``value`` on ``ladder`` (the end if there is none)."""
    if up:
        return next((v for v in ladder if v > value * (1 + 1e-9)), ladder[-1])
    return next((v for v in reversed(ladder) if v < value * (1 - 1e-9)), ladder[0])
SEG_STYLE = {"work": ("█", "green"), "checkpoint": ("▌", "cyan"), "lost": ("░", "red"), "restart": ("▒", "magenta")}

@dataclass(frozen=True)
class Params:
    gpus: int
    gpu_mtbf: float
    cost: float
    restart: float

    @property
    def mtbf(self) -> float:
        return job_mtbf(self.gpu_mtbf, self.gpus)


LLAMA3 = Params(16384, component_mtbf_from_log(16384, 54 * DAY, 419), cost=60.0, restart=300.0)


def _waste_at(sweep: fs.Sweep, tau: float) -> float:
    from ..lessons.lesson3.formulas import expected_waste_fraction

    return expected_waste_fraction(tau, sweep.mtbf, sweep.cost, sweep.restart)


def plot_lines(sweep: fs.Sweep, width: int, height: int, lang: str) -> list[Text]:
    """Goodput against log τ: simulated dots over Daly's curve, with the Y, D and S marks."""
    tr = strings("failures", lang)
    label_w = 7
    cols = max(20, width - label_w - 2)
    rows = max(5, height)
    x = sweep.intervals
    lx0, lx1 = math.log(x[0]), math.log(x[-1])

    def col(tau: float) -> int:
        return min(cols - 1, max(0, int(round((math.log(tau) - lx0) / (lx1 - lx0) * (cols - 1)))))

    lo = max(0.0, min(float(sweep.goodput.min()), float(sweep.expected.min())))
    hi = min(1.0, max(float(sweep.goodput.max()), float(sweep.expected.max())))
    span = max(hi - lo, 1e-3)
    lo, hi = max(0.0, lo - 0.04 * span), min(1.0, hi + 0.06 * span)

    def row(g: float) -> int:
        return min(rows - 1, max(0, int(round((hi - g) / (hi - lo) * (rows - 1)))))

    grid: list[list[tuple[str, str]]] = [[(" ", "")] * cols for _ in range(rows)]
    # Daly's closed form, one value per column
    for c in range(cols):
        tau = math.exp(lx0 + (lx1 - lx0) * c / max(1, cols - 1))
        grid[row(1 - _waste_at(sweep, tau))][c] = ("─", "grey50")
    # S first: where it covers D, the simulation has found Daly's interval
    marks = [(sweep.optimum, "S", "bold green"), (sweep.daly, "D", "magenta"), (sweep.young, "Y", "yellow")]
    for tau, _label, style in marks:
        if x[0] <= tau <= x[-1]:
            c = col(tau)
            top = row(1 - _waste_at(sweep, tau))
            for r in range(top + 1, rows):
                if grid[r][c][0] == " ":
                    grid[r][c] = ("│", style)
    for tau, g in zip(x, sweep.goodput):
        grid[row(float(g))][col(float(tau))] = ("•", "bold cyan")
    lines = [Text(tr["goodput"], style="bold")]
    for r in range(rows):
        value = hi - (hi - lo) * r / (rows - 1)
        label = format_percent(value, 3, lang) if r % 2 == 0 else ""
        line = Text(label.rjust(label_w - 1) + ("┤" if label else "│"), style="grey62")
        for ch, style in grid[r]:
            line.append(ch, style=style)
        lines.append(line)
    axis = Text(" " * (label_w - 1) + "└" + "─" * cols, style="grey62")
    lines.append(axis)
    # the marks' letters under their lines (a second row where two share a column)
    label_rows = [[(" ", "")] * (cols + label_w + 2) for _ in range(3)]
    for tau, label, style in marks:
        if x[0] <= tau <= x[-1]:
            c = label_w + col(tau)
            for lr in label_rows:
                if lr[c][0] == " ":
                    lr[c] = (label, style)
                    break
    mark_lines = []
    for lr in label_rows:
        if any(ch != " " for ch, _ in lr):
            t = Text()
            for ch, style in lr:
                t.append(ch, style=style)
            mark_lines.append(t)
    tick_line = [" "] * (cols + label_w + 12)
    for k in range(5):
        tau = math.exp(lx0 + (lx1 - lx0) * k / 4)
        text = format_time(tau, 2, lang)
        c = label_w + col(tau) - (len(text) // 2 if k else 0)
        c = min(max(label_w, c), cols + label_w - len(text)) if k < 4 else cols + label_w - len(text)
        if all(t == " " for t in tick_line[max(0, c - 1):c + len(text) + 1]):
            tick_line[c:c + len(text)] = list(text)
    lines.append(Text("".join(tick_line).rstrip(), style="grey62"))
    lines.extend(mark_lines)
    lines.append(Text(" " * label_w + tr["axis"], style="grey50"))
    return lines


class FailuresVisualizer(LessonVisualizer):
    """Goodput against the checkpoint interval, a simulated day of failures, and a live run."""

    can_focus = True
    DEFAULT_CLASSES = "panel"
    VIEWS = ("interval", "day", "run")
    STEP_SETTINGS = frozenset({"show"})
    CONTROLS = (
        NEXT_VIEW,
        *view_controls("failures", VIEWS),
        Control("d", "scale('gpus', 2)", "failures.gpus",
                back_keys="D", back_action="scale('gpus', 0.5)", hint=True),
        Control("m", "scale('gpu_mtbf', 2)", "failures.gpu_mtbf",
                back_keys="M", back_action="scale('gpu_mtbf', 0.5)", hint=True),
        Control("c", "scale('cost', 2)", "failures.cost",
                back_keys="C", back_action="scale('cost', 0.5)", hint=True),
        Control("e", "scale('restart', 2)", "failures.restart",
                back_keys="E", back_action="scale('restart', 0.5)"),
        Control("0", "reset", "failures.reset"),
    )

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.params = LLAMA3
        self.view = "interval"
        self.run = RunTimeline()
        self._sweeps: dict[Params, fs.Sweep] = {}
        self._days: dict[Params, fs.Timeline] = {}

    # -- model ------------------------------------------------------------------------------------
    @overload
    def sweep(self, compute: Literal[True] = ...) -> fs.Sweep: ...
    @overload
    def sweep(self, compute: bool) -> fs.Sweep | None: ...

    def sweep(self, compute: bool = True) -> fs.Sweep | None:
        """The sweep for the current parameters (computed here if ``compute`` and not cached)."""
        p = self.params
        if p not in self._sweeps and compute:
            self._sweeps[p] = fs.sweep(p.gpus, p.gpu_mtbf, p.cost, p.restart, failures=FAILURES)
        return self._sweeps.get(p)

    def day(self) -> fs.Timeline:
        p = self.params
        if p not in self._days:
            s = self.sweep()
            self._days[p] = fs.simulate_timeline(p.gpus, p.gpu_mtbf, p.cost, p.restart, s.daly, DAY, seed=3)
        return self._days[p]

    @work(thread=True, exclusive=True, group="failures-sweep")
    def _compute(self, p: Params) -> None:
        result = fs.sweep(p.gpus, p.gpu_mtbf, p.cost, p.restart, failures=FAILURES)
        self.app.call_from_thread(self._computed, p, result)

    def _computed(self, p: Params, result: fs.Sweep) -> None:
        self._sweeps[p] = result
        self._redraw()

    # -- Textual ----------------------------------------------------------------------------------
    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 100, size.height or None))

    def show_step(self, step_key: str) -> None:
        """Show the view the step declares (``view = { show = "day" }`` in lessons/lesson3/lesson.toml)."""
        view = self.step_view(step_key).get("show")
        if view is not None:
            self.view = view
            self._redraw()

    def feed_event(self, event: dict) -> None:
        if RUN_START.matches(event) and not event.get("relaunch"):
            self.view = "run"
        if self.run.feed(event):
            self._redraw()

    # -- actions ----------------------------------------------------------------------------------
    def action_scale(self, what: str, factor: float) -> None:
        p = self.params
        value: float
        if what == "gpus":
            value = int(min(GPU_RANGE[1], max(GPU_RANGE[0], round(p.gpus * factor))))
            new = Params(value, p.gpu_mtbf, p.cost, p.restart)
        else:
            value = ladder_step(getattr(p, what), LADDERS[what], up=factor > 1)
            new = Params(**{**p.__dict__, what: value})
        if new.cost >= 2 * new.mtbf:  # past the model's range (Daly's τ = M): keep the previous
            self.app.bell()
            return
        self.params = new
        if new not in self._sweeps:
            self._compute(new)
        self._redraw()

    def action_reset(self) -> None:
        self.params = LLAMA3
        self._redraw()

    # -- drawing ----------------------------------------------------------------------------------
    def header(self, width: int) -> Text:
        tr = strings("failures", self.language)
        p, lang = self.params, self.language
        fields = dict(g=format_integer(p.gpus, lang),
                      mg=f"{format_integer(round(p.gpu_mtbf / HOUR), lang)} h", m=format_time(p.mtbf, 3, lang),
                      c=format_time(p.cost, 3, lang), r=format_time(p.restart, 3, lang) if p.restart else "0 s")
        text = tr["params"].format(**fields)
        if len(text) > width:
            text = tr["params_short"].format(**fields)
        return Text(text, style="bold")

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        tr = strings("failures", self.language)
        width = max(40, width)
        height = height or 30
        tabs = Text()
        for v in self.VIEWS:
            label = f" {self.VIEWS.index(v) + 1} {tr['views'][v]} "
            tabs.append(label, style="bold reverse" if v == self.view else "grey62")
            tabs.append(" ")
        lines = [tabs]
        if self.view == "run":
            lines.extend(timeline_lines(self.run, width, self.language))
            if self.run.empty:
                lines.append(Text(""))
                lines.extend(self.day_lines(width))
        else:
            lines.extend(wrap_text(self.header(width), width))  # "C 1 min" stays whole
            if self.view == "interval":
                lines.extend(self.interval_lines(width, height - 4))
            else:
                lines.extend(self.day_lines(width))
        lines.append(Text(self.controls_hint(width), style="grey50"))
        return self.fit_height(lines, height)

    def interval_lines(self, width: int, height: int) -> list[Text]:
        tr = strings("failures", self.language)
        lang = self.language
        s = self.sweep(compute=not self._sweeps)  # the first one at once; later ones in the worker
        if s is None:
            return [Text(tr["simulating"].format(n=format_integer(FAILURES, lang)), style="italic")]
        plot_h = max(5, min(16, height - 7))
        lines = plot_lines(s, width, plot_h, lang)
        gap = (s.optimum - s.daly) / s.daly
        lines.extend(wrap_text(Text(tr["marks"].format(y=format_time(s.young, 3, lang), d=format_time(s.daly, 3, lang),
                                                       s=format_time(s.optimum, 3, lang),
                                                       n=format_integer(s.failures, lang),
                                                       gap=("+" if gap >= 0 else "−") + format_percent(abs(gap), 2, lang)),
                                    style="bold"), width))
        i = int(min(range(len(s.intervals)), key=lambda k: abs(math.log(s.intervals[k] / s.daly))))
        lines.extend(wrap_text(Text(tr["waste"].format(w=format_percent(_waste_at(s, s.daly), 3, lang),
                                             ws=format_percent(1 - float(s.goodput[i]), 3, lang),
                                             w10=format_percent(_waste_at(s, s.daly * 10), 3, lang),
                                             w01=format_percent(_waste_at(s, s.daly / 10), 3, lang))), width))
        lines.extend(wrap_text(Text(tr["legend"], style="grey50"), width))
        return lines

    def day_lines(self, width: int) -> list[Text]:
        tr = strings("failures", self.language)
        lang = self.language
        s = self.sweep()
        tl = self.day()
        cols = max(20, width - 2)
        dt = tl.horizon / cols
        cells: list[tuple[str, str]] = [(" ", "")] * cols
        order = ("lost", "restart", "checkpoint", "work")
        weight: list[dict[str, float]] = [dict() for _ in range(cols)]
        for seg in tl.segments:
            a, b = max(0.0, seg.start), min(tl.horizon, seg.end)
            c = int(a / dt)
            while a < b and c < cols:
                end = min(b, (c + 1) * dt)
                weight[c][seg.kind] = weight[c].get(seg.kind, 0.0) + end - a
                a, c = end, c + 1
        for c in range(cols):
            if weight[c]:
                # a cell with any lost work or restart shows it (they are rare and short)
                time_in = weight[c]
                kind = next((k for k in order[:2] if time_in.get(k, 0) > 0.15 * dt), None) \
                    or max(time_in, key=lambda k: time_in[k])
                cells[c] = SEG_STYLE[kind]
        marks = [" "] * cols
        for t, _gpu in tl.failures:
            if t < tl.horizon:
                marks[min(cols - 1, int(t / dt))] = "✕"
        ckpts = [" "] * cols
        if s.daly + self.params.cost >= 2 * dt:  # one mark per checkpoint, or none where they would merge
            for seg in tl.segments:
                if seg.kind == "checkpoint" and seg.end <= tl.horizon:
                    ckpts[min(cols - 1, int(seg.end / dt))] = "◆"
        hours = [" "] * cols
        for h in range(0, 25, 6):
            label = f"{h} {tr['hours']}"
            c = min(cols - len(label), int(h * 3600 / dt))
            hours[c:c + len(label)] = list(label)
        strip = Text()
        for ch, style in cells:
            strip.append(ch, style=style)
        lost, ck, rs = tl.total("lost"), tl.total("checkpoint"), tl.total("restart")
        wasted = (lost + ck + rs) / tl.horizon
        n_fail = sum(1 for t, _ in tl.failures if t < tl.horizon)
        who = ""
        for g in (g for t, g in tl.failures if t < tl.horizon):
            item = f"#{g}" if not who else f", #{g}"
            if len(who) + len(item) > max(20, width - 22):
                who += ", …"
                break
            who += item
        lines = [Text(tr["day_title"].format(tau=format_time(s.daly, 3, lang)), style="bold"),
                 Text("".join(marks), style="bold red"), Text("".join(ckpts), style="cyan"), strip, Text("".join(hours).rstrip(), style="grey62"),
                 Text(tr["day_stats"].format(f=n_fail, w=format_percent(wasted, 3, lang),
                                             lost=format_percent(lost / tl.horizon, 2, lang),
                                             ck=format_percent(ck / tl.horizon, 2, lang),
                                             rs=format_percent(rs / tl.horizon, 2, lang))),
                 Text(tr["day_legend"], style="grey50")]
        if who:
            lines.append(Text(tr["failed_gpus"].format(who=who), style="grey62"))
        return lines

    def _redraw(self) -> None:
        self.refresh()


VISUALIZER = FailuresVisualizer
