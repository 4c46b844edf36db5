"""Lesson 5's visualizer: pipeline schedules as timelines.

Stages are rows and time runs across. Forward blocks are light, backward blocks dark, both
coloured and labelled by microbatch (with a chunk letter when a rank holds v > 1 chunks); idle
time is shaded ``░`` — the bubble. Under each stage a memory strip shows how many microbatches'
activations that stage holds over time. GPipe, 1F1B and interleaved 1F1B are drawn one above the
other on one time scale for the same p and m, so equal lengths and different memory strips are
seen at a glance. A cursor plays the step; the strips' right-hand figures say what each stage
holds at the cursor and at its peak.

Its ``CONTROLS`` (listed by ``?``) change the stages, microbatches, chunks per rank, the backward's
cost (1, 2, 3 forwards) and the time per hop, pick the schedules shown, play and move the cursor.

Fed a run's events (``pp_config``, ``pp_op``, ``pp_stage``, ``summary`` from
``distai.engine.experiments.lesson5``), it switches to the run's p, m and v and draws the measured
timeline of the latest complete step under the simulated one. No torch, no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Group
from rich.text import Text

from ..lessons.lesson5 import simulator as sim
from ..lessons.lesson5.events import PP_CONFIG
from ..lessons.lesson5.run_timeline import CompleteStep, PipelineRun
from ..lessons.strings import strings
from ..lessons.units import (
    format_fixed,
    format_number,
    format_percent,
    format_plain,
    format_score,
    format_time,
)
from .base import NEXT_VIEW, PLAY, Control, view_controls
from .playback import PlaybackVisualizer

# Tableau 10: distinct hues; backward blocks use a darker shade of the same hue.
_HUES = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
         "#9c755f", "#bab0ac"]
_LEVELS = " ▁▂▃▄▅▆▇█"
_CHUNK_LETTERS = "abcdefgh"
IDLE_CHAR = "░"


@dataclass
class Lanes:
    """What one panel draws: per rank, (start, end, op) blocks; the step's length; v; and for a
    measured step each rank's work (its blocks' CPU time on a CPU: busy is work, not wall time)."""

    blocks: list[list[tuple[float, float, sim.Op]]]
    makespan: float
    v: int
    work: list[float] | None = None

    @classmethod
    def from_timeline(cls, tl: sim.Timeline) -> Lanes:
        # draw time in units of one forward through a whole stage
        scale = 1.0 / tl.t_f
        return cls([[(s * scale, e * scale, op) for s, e, op in tl.blocks(r)] for r in range(tl.p)],
                   tl.makespan * scale, tl.v)

    @classmethod
    def of_step(cls, step: CompleteStep) -> Lanes:
        """A measured step (already in forward-time units)."""
        return cls(step.blocks, step.makespan, step.v, step.work)

    @property
    def p(self) -> int:
        return len(self.blocks)

    def busy(self, rank: int) -> float:
        if self.work is not None:
            return self.work[rank]
        return sum(e - s for s, e, _ in self.blocks[rank])

    def bubble(self) -> float:
        if not self.makespan:
            return 0.0
        return 1.0 - sum(self.busy(r) for r in range(self.p)) / (self.p * self.makespan)

    def held_series(self, rank: int) -> list[tuple[float, int]]:
        """(time, chunk-microbatches held from then on): +1 when a forward starts, −1 when a
        backward ends."""
        changes = sorted([(s, 1) if op.kind == "F" else (e, -1) for s, e, op in self.blocks[rank]],
                         key=lambda c: (c[0], c[1]))
        series, held = [(0.0, 0)], 0
        for t, d in changes:
            held += d
            series.append((t, held))
        return series

    def peak(self, rank: int) -> float:
        return max(c for _t, c in self.held_series(rank)) / self.v


def _label(op: sim.Op, v: int) -> str:
    return f"{op.mb}{_CHUNK_LETTERS[op.chunk % len(_CHUNK_LETTERS)]}" if v > 1 else str(op.mb)


def _dark(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"#{int(r * 0.5):02x}{int(g * 0.5):02x}{int(b * 0.5):02x}"


def _block_style(op: sim.Op) -> str:
    hue = _HUES[op.mb % len(_HUES)]
    return f"bold black on {hue}" if op.kind == "F" else f"bold white on {_dark(hue)}"


def draw_lanes(lanes: Lanes, cols: int, t_max: float, cursor: float | None, mem_max: float,
               memory: bool = True, lang: str = "en") -> list[Text]:
    """Rows of one panel: per rank a timeline row (and a memory strip). ``t_max`` is the time the
    ``cols`` columns span (shared by stacked panels), ``mem_max`` the activations a full strip means."""
    dt = t_max / cols if t_max > 0 else 1.0
    cursor_col = min(cols - 1, int(cursor / dt)) if cursor is not None else -1
    rows: list[Text] = []
    for r in range(lanes.p):
        cells: list[tuple[str, str] | None] = [None] * cols
        for s, e, op in lanes.blocks[r]:
            c0, c1 = int(round(s / dt)), int(round(e / dt))
            c1 = max(c1, c0 + 1)  # a block shorter than a column still shows
            c0, c1 = max(0, c0), min(cols, c1)
            if c1 <= c0:
                continue
            label = _label(op, lanes.v)
            text = label if c1 - c0 >= len(label) else ""
            style = _block_style(op)
            for c in range(c0, c1):
                k = c - c0
                cells[c] = (text[k] if k < len(text) else " ", style)
        end_col = int(round(lanes.makespan / dt))
        row = Text(f"r{r:<2} ", style="bold")
        for c in range(cols):
            cell = cells[c]
            ch, style = cell if cell is not None else ((IDLE_CHAR, "grey35") if c < end_col else (" ", ""))
            if c == cursor_col:
                style = (style + " reverse").strip()
            row.append(ch, style=style)
        idle = 1.0 - lanes.busy(r) / lanes.makespan if lanes.makespan else 0.0
        row.append(" " + format_score(idle, lang).rjust(4), style="grey50")
        rows.append(row)
        if not memory:
            continue
        series = lanes.held_series(r)
        strip = Text("    ")
        j = 0
        held_now: float = 0
        for c in range(cols):
            mid = (c + 0.5) * dt
            while j + 1 < len(series) and series[j + 1][0] <= mid:
                j += 1
            held = series[j][1] / lanes.v if mid <= lanes.makespan or series[j][1] else 0
            level = min(len(_LEVELS) - 1, int(round(held / mem_max * (len(_LEVELS) - 1)))) if mem_max else 0
            if held > 0 and level == 0:
                level = 1
            ratio = held / mem_max if mem_max else 0
            colour = "green" if ratio < 0.4 else ("yellow" if ratio < 0.75 else "red")
            style = colour + (" reverse" if c == cursor_col else "")
            strip.append(_LEVELS[level], style=style)
            if c == cursor_col:
                held_now = held
        if cursor is not None:
            held_now = 0
            for t, count in series:
                if t > cursor:
                    break
                held_now = count
            held_now /= lanes.v
        if cursor is None:  # a measured run: only its peak
            strip.append(f" ▲{format_plain(lanes.peak(r), lang)}", style="grey50")
        else:
            strip.append(f" {format_plain(held_now, lang)}/{format_plain(lanes.peak(r), lang)}", style="grey50")
        rows.append(strip)
    return rows


class PipelineVisualizer(PlaybackVisualizer):
    """Timelines of GPipe, 1F1B and interleaved 1F1B, simulated and measured."""

    can_focus = True
    DEFAULT_CLASSES = "panel"
    VIEWS = ("all", "gpipe", "1f1b", "interleaved", "same-time", "1f1b-interleaved")
    STEP_SETTINGS = frozenset({"show", "microbatches"})
    CONTROLS = (
        PLAY,
        Control("full_stop", "step(1)", "pipeline.cursor",
                back_keys="comma", back_action="step(-1)"),
        NEXT_VIEW,
        *view_controls("pipeline", VIEWS[:4], first=0),  # all, GPipe, 1F1B, interleaved
        Control("s", "stages(1)", "pipeline.stages",
                back_keys="S", back_action="stages(-1)", hint=True),
        Control("m", "microbatches(1)", "pipeline.microbatches",
                back_keys="M", back_action="microbatches(-1)", hint=True),
        Control("c", "chunks(1)", "pipeline.chunks",
                back_keys="C", back_action="chunks(-1)"),
        Control("b", "backward_cost", "pipeline.backward_cost"),
        Control("h", "hop", "pipeline.hop"),
    )
    P_RANGE = (2, 16)
    M_RANGE = (1, 64)
    V_RANGE = (2, 8)
    B_COSTS = (2.0, 3.0, 1.0)
    HOPS = (0.0, 0.25, 1.0)
    TICK_S = 1 / 12
    TICKS_PER_PLAY = 160  # cursor steps across one step of the longest schedule

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.p, self.m, self.v = 4, 8, 2
        self.b_cost, self.hop = 2.0, 0.0
        self.view = "all"
        self.cursor = 0.0
        self.playing = True
        self.measured = PipelineRun()
        self._cache: dict = {}

    # -- model ------------------------------------------------------------------------------------
    def lanes(self, schedule: str) -> Lanes | str:
        """The simulated panel for ``schedule`` at the current settings, or why it cannot run."""
        v = self.v if schedule == "interleaved" else 1
        key = (schedule, self.p, self.m, v, self.b_cost, self.hop)
        if key not in self._cache:
            try:
                tl = sim.simulate(schedule, self.p, self.m, v, t_f=1.0, t_b=self.b_cost, t_comm=self.hop)
                self._cache[key] = (Lanes.from_timeline(tl), tl)
            except sim.ScheduleError as exc:
                self._cache[key] = (exc, None)
        lanes = self._cache[key][0]
        return lanes.text(self.language) if isinstance(lanes, sim.ScheduleError) else lanes  # in today's language

    def timeline(self, schedule: str) -> sim.Timeline | None:
        self.lanes(schedule)
        v = self.v if schedule == "interleaved" else 1
        return self._cache[(schedule, self.p, self.m, v, self.b_cost, self.hop)][1]

    def shown_schedules(self) -> list[str]:
        if self.view == "all":
            return list(sim.SCHEDULES)
        if self.view == "same-time":
            return ["gpipe", "1f1b"]
        if self.view == "1f1b-interleaved":  # the interleaved step: its row under 1F1B's, GPipe left out to fit
            return ["1f1b", "interleaved"]
        if self.view == "run":
            return [self._latest_measured_schedule() or "1f1b"]
        return [self.view]

    def _latest_measured_schedule(self) -> str | None:
        return self.measured.latest_schedule()

    def t_max(self) -> float:
        spans = [lanes.makespan for s in self.shown_schedules() if isinstance(lanes := self.lanes(s), Lanes)]
        return max(spans, default=1.0)

    # -- Textual ----------------------------------------------------------------------------------
    # playback (visualizers/playback.py): a cursor across the step, looping
    def advance(self, dt: float) -> bool:
        t_max = self.t_max()
        self.cursor += t_max / self.TICKS_PER_PLAY
        if self.cursor > t_max * 1.1:
            self.cursor = 0.0
        self.refresh()
        return True

    def seek(self, frames: int) -> None:
        t_max = self.t_max()
        self.cursor = min(t_max, max(0.0, self.cursor + frames * t_max / 40))

    def rewind(self) -> None:
        self.cursor = 0.0

    def to_end(self) -> None:
        self.cursor = self.t_max()

    def show_step(self, step_key: str) -> None:
        """Show what the step declares (``view = { show = "gpipe", microbatches = 8 }`` in
        lessons/lesson5/lesson.toml); a run's own m stays once one is drawn."""
        view = self.step_view(step_key)
        if "show" not in view:
            return
        self.view = view["show"]
        if "microbatches" in view and not self.measured.ops:
            self.m = view["microbatches"]
        self.cursor = 0.0
        self.refresh()

    def feed_event(self, event: dict) -> None:
        """Fold the event into the run (``lessons/lesson5/run_timeline.py``); a run of this lesson
        (``pp_config``) is drawn beside its simulation, with its p, m and v."""
        if not self.measured.feed(event):
            return
        if PP_CONFIG.matches(event):
            self.view = "run"
            self.p, self.m = self.measured.p, self.measured.m
            self.v = max(self.V_RANGE[0], self.measured.v)
        self.refresh()

    # -- actions ----------------------------------------------------------------------------------
    def _changed(self) -> None:
        self.cursor = 0.0
        self.refresh()

    def action_stages(self, delta: int) -> None:
        self.p = min(self.P_RANGE[1], max(self.P_RANGE[0], self.p + delta))
        self._changed()

    def action_microbatches(self, delta: int) -> None:
        self.m = min(self.M_RANGE[1], max(self.M_RANGE[0], self.m + delta))
        self._changed()

    def action_chunks(self, delta: int) -> None:
        self.v = min(self.V_RANGE[1], max(self.V_RANGE[0], self.v + delta))
        self._changed()

    def action_backward_cost(self) -> None:
        self.b_cost = self.B_COSTS[(self.B_COSTS.index(self.b_cost) + 1) % len(self.B_COSTS)]
        self._changed()

    def action_hop(self) -> None:
        self.hop = self.HOPS[(self.HOPS.index(self.hop) + 1) % len(self.HOPS)]
        self._changed()

    def action_view(self, view: str) -> None:
        self.view = view  # "run" too, though g does not cycle to it
        self._changed()

    # -- drawing ----------------------------------------------------------------------------------
    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        tr = strings("pipeline", self.language)
        lang = self.language
        width = max(30, width)
        cols = width - 4 - 8  # "r0  " on the left, " 27%" / " 3/8" on the right
        lines: list[Text] = []
        narrow = width < 90
        # v means nothing to GPipe and 1F1B: the chunks are named only when an interleaved schedule is drawn
        chunks = (tr["chunks_short" if narrow else "chunks"].format(v=self.v)
                  if "interleaved" in self.shown_schedules() else "")
        head = Text(tr["header_short" if narrow else "header"].format(
            p=self.p, m=self.m, chunks=chunks, b=format_plain(self.b_cost, self.language),
            h=format_plain(self.hop, self.language)), style="bold")
        lines.append(head)
        t_max = self.t_max()
        status = Text(tr["playing"] if self.playing else tr["paused"], style="bold cyan")
        status.append("  " + tr["time"].format(t=format_fixed(min(self.cursor, t_max), 1, lang), T=format_fixed(t_max, 1, lang)))
        lines.append(status)
        panels: list[list[Text]] = []
        schedules = self.shown_schedules()
        mem_max = max([lanes.peak(0) for s in schedules if isinstance(lanes := self.lanes(s), Lanes)] + [1.0])
        for schedule in schedules:
            panel: list[Text] = []
            lanes = self.lanes(schedule)
            title = Text(tr["schedules"][schedule] + ("" if schedule != "interleaved" else f" (v = {self.v})"),
                         style="bold underline")
            if isinstance(lanes, str):
                title.append("  " + lanes, style="yellow")
                panels.append([title])
                continue
            tl = self.timeline(schedule)
            if tl is None:  # (lanes and timeline are simulated together: a panel with lanes has one)
                continue
            v = tl.v
            title.append("  " + tr["step"].format(T=format_fixed(lanes.makespan, 1, lang)))
            bubble = tr["bubble"].format(f=format_percent(tl.bubble_fraction, 3, lang), vm="m" if v == 1 else f"{v}m")
            title.append(" · " + (bubble.split(" = ")[0] if narrow else bubble))
            title.append(" · " + tr["peak"].format(x=format_plain(tl.peak_inflight[0], lang)))
            panel.append(title)
            panel.extend(draw_lanes(lanes, cols, t_max, self.cursor, mem_max, lang=self.language))
            measured = self._measured_panel(schedule, cols, mem_max, tr)
            panel.extend(measured)
            panels.append(panel)
        footer = [Text(tr["legend_short" if narrow else "legend"].format(idle=IDLE_CHAR), style="grey50"),
                  Text(self.controls_hint(width), style="grey50")]
        budget = (height or 10_000) - len(lines) - len(footer)
        if sum(len(panel) for panel in panels) > budget and len(panels) > 1:
            # a short pane, schedules to compare: each keeps its first ranks (r0 shows the fill, the
            # bubble and the step's end) rather than the first schedule taking every row
            panels = [[ln for k, ln in enumerate(panel) if k == 0 or not ln.plain.startswith("    ")]
                      for panel in panels]  # the memory strips first
            for dropped in (footer, lines):  # then the legend, then the play status
                if sum(len(panel) for panel in panels) > budget and len(dropped) > 1:
                    dropped.pop(0 if dropped is footer else 1)
                    budget += 1
            quota = max(2, budget // len(panels))
            panels = [panel[:quota] for panel in panels]
        used = 0
        for i, panel in enumerate(panels):
            if used + len(panel) > budget and i > 0:
                compact = [ln for k, ln in enumerate(panel) if k == 0 or not ln.plain.startswith("    ")]
                if used + len(compact) <= budget:
                    lines.extend(compact)
                    used += len(compact)
                    continue
                lines.append(Text(tr["more"].format(n=len(panels) - i), style="yellow"))
                break
            lines.extend(panel)
            used += len(panel)
        lines.extend(footer)
        return self.fit_height(lines, height)  # one schedule taller than the pane: cut, and said so

    def _measured_panel(self, schedule: str, cols: int, mem_max: float, tr: Mapping) -> list[Text]:
        meas = self.measured
        if not meas.p or schedule not in meas.ops or self.view == "all":
            return []
        if (self.p, self.m) != (meas.p, meas.m) or (schedule == "interleaved" and self.v != meas.v):
            return []
        found = meas.latest_complete(schedule)
        if found is None:
            return [Text(tr["waiting"].format(name=tr["schedules"][schedule]), style="italic")]
        step, lanes, seconds = found.step, Lanes.of_step(found), found.seconds
        title = Text(tr["measured"].format(name=tr["schedules"][schedule], step=step, ms=format_time(seconds, lang=self.language),
                                           f=format_percent(lanes.bubble(), 2, self.language)),
                     style="bold magenta")
        res = meas.summary.get("schedules", {}).get(schedule) if meas.summary else None
        if res:
            title.append(tr["measured_formula"].format(f=format_percent(res["bubble_formula"], 2, self.language)), style="magenta")
        return [title] + draw_lanes(lanes, cols, lanes.makespan, None, mem_max, lang=self.language)

    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 100, size.height or None))


class TerminalPipeline:
    """``distai run lesson5``'s terminal view (``[run] terminal`` in lessons/lesson5/lesson.toml): the
    latest measured step drawn as a timeline, then the run's figures against the formulas."""

    def __init__(self, language: str = "en"):
        self.language = language
        self.measured = PipelineRun()

    def feed(self, event: dict) -> None:
        self.measured.feed(event)

    def renderables(self, width: int = 100) -> list[Text]:
        meas, tr, lang = self.measured, strings("pipeline", self.language), self.language
        out: list[Text] = []
        schedule = meas.latest_schedule()
        found = meas.latest_complete(schedule) if schedule else None
        if found is not None:
            step, lanes, seconds = found.step, Lanes.of_step(found), found.seconds
            out.append(Text(tr["measured"].format(name=tr["schedules"][schedule], step=step,
                                                  ms=format_time(seconds, lang=self.language),
                                                  f=format_percent(lanes.bubble(), 2, self.language)),
                            style="bold magenta"))
            cols = max(20, min(width, 120) - 12)
            out.extend(draw_lanes(lanes, cols, lanes.makespan, None, max(lanes.peak(0), 1.0), lang=self.language))
        results = (meas.summary or {}).get("schedules") or {}
        if results:
            labels = tr["table_head"]
            rows = []
            for name, r in results.items():
                ratio = (format_fixed(r["step_time_s"] / r["torch_step_time_s"], 2, lang) + "x"
                         if r.get("torch_step_time_s") else "—")
                grad = r.get("max_grad_diff_vs_torch")
                peak0 = r["stages"][0] if r.get("stages") else {}
                rows.append((tr["schedules"][name], format_score(r["bubble_measured"], lang),
                             format_percent(r["bubble_formula"], 3, lang),
                             format_fixed(peak0.get("peak_microbatches", 0), 2, lang),
                             format_plain(peak0.get("peak_formula", 0), lang),
                             ratio, "—" if grad is None else format_number(grad, 1, lang)))
            # each column as wide as its widest cell, one space apart: the Spanish table wrapped at 70 columns
            widths = [max(len(cell) for cell in column) for column in zip(labels, *rows)]
            out.append(Text(" ".join([labels[0].ljust(widths[0])] + [lab.rjust(w) for lab, w in
                                                                      zip(labels[1:], widths[1:])]), style="bold"))
            for row in rows:
                out.append(Text(" ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])])))
        return out


VISUALIZER = PipelineVisualizer
