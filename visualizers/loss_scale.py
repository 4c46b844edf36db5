"""Lesson 6's visualizer: loss-scale dynamics, gradient exponents against fp16's limits, and the
timeline of backward compute against bucketed all-reduce.

Three views (the lesson's step picks one; the keys are its ``CONTROLS``, listed by ``?``):

- *scale*: the loss scale on a log2 axis over the steps, overflow steps marked (▼ a real fp16
  overflow, ✕ an injected one), and the loss curve under it;
- *exponents*: a histogram of the gradient values' exponents (floor(log2|g|)) coloured by what
  fp16 (or bf16, ``x``) makes of them — zero, subnormal, normal, overflow — without scaling and
  with the current scale, and the share that underflows to zero in each case;
- *timeline*: for one step, when backward finished each layer and when each bucket's all-reduce
  ran, for our overlapped buckets, for the same buckets all-reduced after backward, and for
  torch DDP.

With no run attached, the views draw the lesson's models (:mod:`distai.lessons.lesson6.simulation`)
and the keys act as sliders: growth interval, growth factor, backoff factor, initial scale and
bucket size, plus the histogram's step and a reset. Events from ``distai run lesson6``
(``feed_event``) replace the simulation by the measured run; a key switches between the two.

What it shows is a pure view model, ``lessons/lesson6/loss_scale_view.py`` (the state, its moves,
the series of the simulation or the run); the widget keeps the state in one reactive attribute per
field and renders itself from it (a change repaints, a resize re-lays out). No torch, no I/O.
"""
from __future__ import annotations

import math

from rich.text import Text
from textual.reactive import reactive

from ..lessons.lesson6 import loss_scale_view as ls
from ..lessons.lesson6.loss_scale_view import (  # noqa: F401 - the sliders' notches, for callers and tests
    BACKOFF_FACTORS,
    BUCKET_MIB,
    GROWTH_FACTORS,
    GROWTH_INTERVALS,
    MODE_ORDER,
    LossScaleState,
)
from ..lessons.lesson6.mixed_precision_run import MixedPrecisionRun
from ..lessons.lesson6.simulation import REGIONS, ExponentHistogram, OverlapModel, ScalerSim, ScalerSimConfig
from ..lessons.strings import strings
from ..lessons.units import format_fixed, format_fixed_percent, format_plain
from .base import Control, LessonVisualizer
from .view_state import StateOf

REGION_STYLE = {"zero": "red", "subnormal": "yellow", "normal": "green", "overflow": "magenta"}
LANE_STYLES = ("cyan", "blue")
BLOCKS = " ▁▂▃▄▅▆▇█"
_START = LossScaleState()

def _num(x: float, lang: str, digits: int = 1) -> str:
    return format_fixed(x, digits, lang)


def _pct(x: float | None, lang: str) -> str:
    if x is None:
        return "—"
    return format_fixed_percent(x, 2 if 0 < x < 0.01 else 1, lang)


def _ms(x: float, lang: str) -> str:
    return f"{_num(x, lang, 1)} ms"


# ---- pure renderers (tested directly) ----------------------------------------------------------
def wrap_parts(parts: list[Text], width: int, sep: str = " · ") -> list[Text]:
    """Join ``parts`` with ``sep`` into lines no wider than ``width`` (a part is never split)."""
    lines: list[Text] = []
    line = Text()
    for part in parts:
        if line.cell_len and line.cell_len + len(sep) + part.cell_len > width:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(sep, style="dim")
        line.append_text(part)
    if line.cell_len:
        lines.append(line)
    return lines


def scale_plot(scales: list[float], overflow: list[bool], forced: list[bool], width: int,
               height: int) -> list[Text]:
    """The scale as a step line on a log2 axis; ▼/✕ above the columns with an overflow."""
    if not scales:
        return []
    label_w = 6
    cols = max(8, width - label_w - 1)
    logs = [math.log2(s) for s in scales]
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    if hi == lo:
        hi = lo + 1
    rows = max(3, height - 1)
    n = len(scales)
    per_col = max(1, math.ceil(n / cols))
    ncols = math.ceil(n / per_col)
    col_val, col_mark = [], []
    for c in range(ncols):
        a, b = c * per_col, min(n, (c + 1) * per_col)
        col_val.append(logs[b - 1])
        mark = "✕" if any(forced[a:b]) else ("▼" if any(overflow[a:b]) else " ")
        col_mark.append(mark)

    def row_of(v: float) -> int:
        return round((v - lo) / (hi - lo) * (rows - 1))

    grid = [[" "] * ncols for _ in range(rows)]
    prev = None
    for c, v in enumerate(col_val):
        r = row_of(v)
        if prev is not None and prev != r:
            for rr in range(min(prev, r) + 1, max(prev, r)):
                grid[rr][c] = "┃"
        grid[r][c] = "━"
        prev = r
    out = []
    marks = Text(" " * (label_w + 1))
    for m in col_mark:
        marks.append(m, style="bold magenta" if m == "✕" else "bold red")
    out.append(marks)
    for r in reversed(range(rows)):
        value = lo + (hi - lo) * r / (rows - 1)
        label = f"2^{value:.0f}" if r in (0, rows - 1) or r == (rows - 1) // 2 else ""
        line = Text(f"{label:>{label_w}}┤", style="dim")
        line.append("".join(grid[r]), style="bold cyan")
        out.append(line)
    return out


def _resample(values: list, width: int) -> list[tuple[int, int]]:
    """Index ranges [a, b) splitting ``len(values)`` items over at most ``width`` columns."""
    n = len(values)
    cols = min(n, max(1, width))
    return [(c * n // cols, max(c * n // cols + 1, (c + 1) * n // cols)) for c in range(cols)]


def bar_plot(values: list[float], width: int, height: int, style: str = "green",
             styles: list[str] | None = None) -> list[Text]:
    """Vertical bars (eighth blocks), one column per value (averaged down to ``width`` columns).
    A bar under 1/500 of the tallest is not drawn."""
    if not values:
        return []
    ranges = _resample(values, width)
    vals = [sum(values[a:b]) / (b - a) for a, b in ranges]
    col_styles = [styles[a] for a, _ in ranges] if styles else None
    top = max(vals) or 1.0
    lines = []
    for r in reversed(range(height)):
        line = Text()
        for c, v in enumerate(vals):
            visible = v > top / 500
            level = v / top * height * 8 - r * 8
            ch = BLOCKS[max(0, min(8, int(round(level))))] if visible else " "
            if visible and r == 0 and ch == " ":
                ch = BLOCKS[1]
            line.append(ch, style=(col_styles[c] if col_styles else style))
        lines.append(line)
    return lines


def histogram_plot(hist: ExponentHistogram, log2_scale: float, fmt: str, width: int, height: int,
                   lang: str, lo: int = -40, hi: int = 17) -> list[Text]:
    """Bars per exponent bin (after scaling), coloured by ``fmt``'s region; limits marked below."""
    from ..lessons.lesson6.simulation import region_of_bin

    shift = round(log2_scale)
    counts = dict(zip(hist.exponents(), hist.counts))
    lo = max(lo, hi - (width - 1))  # a narrow pane: the first bin gathers more of the smallest exponents
    bins = list(range(lo, hi + 1))
    vals, styles = [], []
    for e in bins:
        v = counts.get(e - shift, 0.0)
        if e == lo:  # everything at or below the window's edge
            v = sum(c for x, c in counts.items() if x + shift <= lo)
        if e == hi:
            v = sum(c for x, c in counts.items() if x + shift >= hi)
        vals.append(v)
        styles.append(REGION_STYLE[region_of_bin(e, fmt)])
    cw = max(1, min(3, (width - 1) // len(bins)))
    wide_vals = [v for v in vals for _ in range(cw)]
    wide_styles = [s for s in styles for _ in range(cw)]
    lines = bar_plot(wide_vals, len(wide_vals), height, styles=wide_styles)
    axis = [" "] * len(wide_vals)
    labels = {-24: "2⁻²⁴", -14: "2⁻¹⁴", 15: "65504"} if fmt == "fp16" else {-126: "2⁻¹²⁶"}
    for e, text in labels.items():
        if lo <= e <= hi:
            pos = (e - lo) * cw
            axis[pos] = "│"
            start = pos + 1 if pos + 1 + len(text) <= len(axis) else pos - len(text)
            for k, ch in enumerate(text):
                if 0 <= start + k < len(axis):
                    axis[start + k] = ch
    lines.append(Text("".join(axis), style="dim"))
    return lines


def timeline_rows(tl: dict, t_max: float, width: int) -> tuple[Text, Text]:
    """Two lanes (backward per layer, all-reduce per bucket) of one step, ``t_max`` ms wide."""
    cols = max(10, width)
    scale = cols / t_max if t_max > 0 else 1.0
    back = [" "] * cols
    back_style = [""] * cols
    comm = [" "] * cols
    comm_style = [""] * cols
    for k, (name, a, b) in enumerate(tl["layers"]):
        ca, cb = int(a * scale), max(int(a * scale) + 1, int(b * scale))
        for c in range(max(0, ca), min(cols, cb)):
            back[c] = "█"
            back_style[c] = LANE_STYLES[k % 2]
    prev_done = -math.inf
    starts = []
    for idx, _nbytes, a, b in tl["buckets"]:
        # launched at a; if the previous all-reduce was still running, this one waited (░)
        active = max(a, prev_done)
        prev_done = max(prev_done, b)
        ca, cs = int(a * scale), int(active * scale)
        cb = max(cs + 1, int(b * scale))
        style = "red" if idx % 2 == 0 else "magenta"
        for c in range(max(0, ca), min(cols, cs)):
            if comm[c] == " ":
                comm[c], comm_style[c] = "░", style
        for c in range(max(0, cs), min(cols, cb)):
            comm[c], comm_style[c] = "▓", style
        starts.append((idx, cs, cb))
    for idx, cs, cb in starts:  # bucket numbers where there is room for them
        if 0 <= cs < cols and cb - cs >= 2 and not (cs > 0 and comm[cs - 1].isdigit()):
            comm[cs] = str(idx % 10)
    lanes = []
    for chars, styles in ((back, back_style), (comm, comm_style)):
        t = Text()
        for ch, st in zip(chars, styles):
            t.append(ch, style=st or "dim")
        lanes.append(t)
    return lanes[0], lanes[1]


class LossScaleVisualizer(LessonVisualizer):
    """See the module docstring."""

    can_focus = True
    DEFAULT_CLASSES = "panel"  # one cell in from the sides, as every visualizer
    # lowercase more, uppercase less, as in every visualizer
    CONTROLS = (
        Control("g", "next_view", "loss_scale.next_view", hint=True),
        Control("w", "slide('growth_interval', 1)", "loss_scale.growth_interval",
                back_keys="W", back_action="slide('growth_interval', -1)"),
        Control("f", "slide('growth_factor', 1)", "loss_scale.growth_factor",
                back_keys="F", back_action="slide('growth_factor', -1)"),
        Control("b", "slide('backoff_factor', 1)", "loss_scale.backoff_factor",
                back_keys="B", back_action="slide('backoff_factor', -1)"),
        Control("i", "slide('init_scale', 1)", "loss_scale.init_scale",
                back_keys="I", back_action="slide('init_scale', -1)"),
        Control("k", "slide('bucket', 1)", "loss_scale.bucket", back_keys="K", back_action="slide('bucket', -1)"),
        Control("full_stop", "hist_step(1)", "loss_scale.hist_step", back_keys="comma", back_action="hist_step(-1)"),
        Control("x", "toggle_format", "loss_scale.toggle_format"),
        Control("s", "toggle_source", "loss_scale.toggle_source"),
        Control("0", "reset", "loss_scale.reset"),
    )
    SLIDERS = ("growth_interval", "growth_factor", "backoff_factor", "init_scale")  # the scaler's settings
    HINTS = {"scale": ("next_view", *SLIDERS, "reset"), "exponents": ("next_view", "hist_step", "toggle_format", *SLIDERS),
             "timeline": ("next_view", "bucket", "toggle_source")}
    VIEWS = ("scale", "exponents", "timeline")
    STEP_SETTINGS = frozenset({"show", "format"})  # lessons/lesson6/lesson.toml

    view: reactive[str] = reactive(_START.view)
    fmt: reactive[str] = reactive(_START.fmt)
    config: reactive[ScalerSimConfig] = reactive(ScalerSimConfig)
    overlap_model: reactive[OverlapModel] = reactive(OverlapModel)
    hist_index: reactive[int | None] = reactive(_START.hist_index)
    use_live: reactive[bool] = reactive(_START.use_live)
    live_bucket: reactive[float | None] = reactive(_START.live_bucket)
    run_version: reactive[int] = reactive(0)  # bumped by every event that changes what is drawn
    state = StateOf(LossScaleState)  # the reactive attributes of its fields, as one LossScaleState

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.figures = ls.LossScaleView()
        self.asked_for_run = False  # s pressed with no run to show

    # ---- the state and what it shows (lessons/lesson6/loss_scale_view.py) ---------------------------
    @property
    def run(self) -> MixedPrecisionRun:
        return self.figures.run

    def sim(self) -> ScalerSim:
        return self.figures.sim(self.state)

    # ---- lesson hooks ----------------------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        self.state = ls.show_step(self.state, self.step_view(step_key))  # lessons/lesson6/lesson.toml

    def feed_event(self, event: dict) -> None:
        state = self.figures.feed(self.state, event)
        if state is not None:
            self.state = state
            self.run_version += 1

    # ---- actions ---------------------------------------------------------------------------
    def action_slide(self, what: str, direction: int) -> None:
        self.state = self.figures.slide(self.state, what, direction)

    def action_hist_step(self, direction: int) -> None:
        self.state = self.figures.hist_step(self.state, direction)

    def action_toggle_format(self) -> None:
        self.state = ls.toggle_format(self.state)

    def action_toggle_source(self) -> None:
        self.state = self.figures.toggle_source(self.state)
        self.asked_for_run = self.figures.run.empty  # s with no run: the source label says why nothing changed
        self.refresh()

    def action_reset(self) -> None:
        self.state = ls.reset(self.state)

    # ---- rendering -------------------------------------------------------------------------
    def render(self) -> Text:
        # rows as the pane shows them (a line wider than the pane wraps), then cut to its height, saying so
        width = self.content_size.width
        rows: list[Text] = []
        for line in self.last_text.split("\n"):
            rows.extend(line.wrap(self.app.console, width) if width and self.is_attached and line.cell_len > width
                        else [line])
        return Text("\n").join(self.fit_height(rows, self.size.height or None))

    @property
    def last_text(self) -> Text:
        """Everything drawn, for the widget's size (80 × 24 before it has one)."""
        width = max(40, (self.size.width or 80) - 2)
        height = max(16, self.size.height or 24)
        state, t = self.state, strings("loss_scale", self.language)
        live = self.figures.live(state)
        parts: list[Text] = []
        if state.view != "timeline":
            head = Text()
            head.append({"scale": t["scale_title"], "exponents": t["exp_title"].format(fmt=state.fmt)}[state.view],
                        style="bold")
            head.append_text(self._source_label(t, live))
            parts.append(head)
        if state.view == "scale":
            parts += self._render_scale(state, width, height, live)
        elif state.view == "exponents":
            parts += self._render_exponents(state, width, height, live)
        else:
            parts += self._render_timeline(state, width, live)
        return Text("\n").join(parts)

    def _source_label(self, t, live: bool) -> Text:
        """``[live run]`` or ``[simulation]``, and after an ``s`` with no run, why it stayed a simulation."""
        label = Text(f"   [{t['source_live'] if live else t['source_sim']}]", style="italic dim")
        if not live and self.asked_for_run:
            label.append("  " + t["no_run"], style="yellow")
        return label

    def _slider_lines(self, state: LossScaleState, width: int) -> list[Text]:
        c, t = state.config, strings("loss_scale", self.language)
        lang = self.language
        parts = [Text(p.format(gi=c.growth_interval, gf=format_plain(c.growth_factor, lang),
                               bf=format_plain(c.backoff_factor, lang),
                               i=format_plain(math.log2(c.init_scale), lang)), style="yellow") for p in t["sliders"]]
        return wrap_parts(parts, width)

    def _hint_lines(self, view: str, width: int) -> list[Text]:
        return wrap_parts([Text(k, style="dim italic") for k in self.hint_parts(view)], width)

    def _render_scale(self, state: LossScaleState, width: int, height: int, live: bool) -> list[Text]:
        t = strings("loss_scale", self.language)
        series = self.figures.scale_series(state)
        if series is None:
            return [Text(t["no_data"], style="dim")]
        scales, overflow, forced, loss = series
        out = [] if live else self._slider_lines(state, width)
        out += scale_plot(scales, overflow, forced, width, max(8, min(16, height // 2 - 2)))
        out += wrap_parts([Text(t["overflow"], style="red"), Text(t["forced"], style="magenta"),
                           Text(t["skipped"].format(n=sum(overflow), m=len(overflow)), style="dim")], width)
        out.append(Text(f"{t['loss']}  {_num(max(loss), self.language, 4)} → {_num(loss[-1], self.language, 4)}",
                        style="bold"))
        out += bar_plot(loss, width - 2, 3, style="green")
        out += self._hint_lines("scale", width)
        return out

    def _render_exponents(self, state: LossScaleState, width: int, height: int, live: bool) -> list[Text]:
        t, lang = strings("loss_scale", self.language), self.language
        shown = self.figures.histogram(state)
        if shown is None:
            return [Text(t["no_data"], style="dim")]
        out = [] if live else self._slider_lines(state, width)
        k = math.log2(shown.scale)
        rows = max(3, min(8, (height - 14) // 2))
        for label, shift in ((t["without"], 0.0), (t["with"].format(k=format_plain(round(k, 1), lang)), k)):
            line = Text(f"{label}  ", style="bold")
            line.append(t["step"].format(i=shown.step), style="dim")
            out.append(line)
            out += histogram_plot(shown.hist, shift, state.fmt, width, rows, lang)
            shares = shown.hist.region_shares(round(shift), state.fmt)
            out += wrap_parts([Text(f"■ {t['overflow_r'] if r == 'overflow' else t[r]} "
                                    f"{_pct(shares[r], lang)}", style=REGION_STYLE[r]) for r in REGIONS],
                              width)
        if shown.measured is not None:
            ev = shown.measured
            out.append(Text(t["measured"].format(fmt=ev.get("dtype", "fp16"), u=_pct(ev["zero_unscaled"], lang),
                                                 s=_pct(ev.get("zero_scaled"), lang)), style="cyan"))
        out += self._hint_lines("exponents", width)
        return out

    def _render_timeline(self, state: LossScaleState, width: int, live: bool) -> list[Text]:
        t, lang = strings("loss_scale", self.language), self.language
        lane_w = max(20, width - 1)
        shown = self.figures.timelines(state)
        if shown is None:
            return [Text(t["no_data"], style="dim")]
        tls, bucket = shown
        head = Text(t["tl_title"].format(b=format_plain(bucket, lang)), style="bold")
        head.append_text(self._source_label(t, live))
        out = [head]
        t_max = max(d["end"] for d in tls.values()) or 1.0
        for mode, d in tls.items():
            line = Text(t["modes"][mode], style="bold")
            line.append(f"  {_ms(d['end'], lang)}", style="bold")
            line.append(f"  +{_ms(d['end'] - d['backward_end'], lang)}", style="red")
            out.append(line)
            back, comm = timeline_rows(d, t_max, lane_w)
            out += [back, comm]
        axis = Text("0", style="dim")
        axis.append(" " * max(0, lane_w - len(_ms(t_max, lang)) - 1) + _ms(t_max, lang), style="dim")
        out.append(axis)
        out += wrap_parts([Text("█ " + t["backward"], style="cyan"),
                           Text("▓ " + t["allreduce"] + " (0–9: bucket, ░ " + t["queued"] + ")", style="red"),
                           Text("+ " + t["exposed_short"], style="red")], width, sep="   ")
        if live:
            out += self._run_sweep_lines(state)
        else:
            out += self._sim_sweep_lines(state.overlap_model, width)
        out += self._hint_lines("timeline", width)
        return out

    def _run_sweep_lines(self, state: LossScaleState) -> list[Text]:
        """The run's step time per bucket size and mode, the bucket shown marked, and the summary."""
        t, lang, run = strings("loss_scale", self.language), self.language, self.run
        if not run.sweep:
            return []
        out = [Text(t["sweep"], style="bold")]
        for b in sorted({b for b, _ in run.sweep}):
            row = " / ".join(f"{format_fixed(run.sweep.get((b, m), float('nan')), 2, lang):>8}" for m in MODE_ORDER)
            mark = " ◀" if b == self.figures.live_bucket(state) else ""
            out.append(Text(f"  {format_plain(b, lang):>6} MiB: {row}{mark}"))
        ov = (run.summary or {}).get("overlap")
        if ov:
            out.append(Text(t["best"].format(b=format_plain(ov["best_bucket_mb"], lang), x=_num(ov["overlap_speedup"], lang, 2),
                                             r=_num(ov["ours_over_ddp"], lang, 2)), style="green"))
        return out

    def _sim_sweep_lines(self, m: OverlapModel, width: int) -> list[Text]:
        """The simulated model's settings and its step time per bucket size, the fastest in green."""
        t, lang = strings("loss_scale", self.language), self.language
        out = wrap_parts([Text(x.strip(), style="dim") for x in t["sim_model"].format(
            n=m.n_layers, mb=format_plain(m.layer_mib, lang), ms=format_plain(m.layer_backward_ms, lang),
            w=m.world_size, bw=format_plain(m.bandwidth_gbps, lang),
            a=format_plain(m.alpha_us, lang)).split(", ")], width, sep=", ")
        sweep = m.sweep(BUCKET_MIB)
        best = min(sweep, key=lambda b: sweep[b])
        out.append(Text(t["sim_sweep"], style="bold"))
        out += wrap_parts([Text(f"{format_plain(b, lang)}:{_num(v * 1000, lang)}", style="bold green" if b == best else "")
                           for b, v in sweep.items()], width, sep="  ")
        return out

VISUALIZER = LossScaleVisualizer
