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
(``feed_event``) replace the simulation by the measured run; a key switches between the two. No torch, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import replace

from rich.text import Text
from textual.widgets import Static

from ..lessons.lesson6.mixed_precision_run import MixedPrecisionRun
from ..lessons.lesson6.simulation import (
    REGIONS,
    ExponentHistogram,
    OverlapModel,
    ScalerSimConfig,
    simulate_scaler,
)
from ..lessons.strings import strings
from ..lessons.units import format_fixed, format_fixed_percent, format_plain
from .base import Control, LessonVisualizer

REGION_STYLE = {"zero": "red", "subnormal": "yellow", "normal": "green", "overflow": "magenta"}
LANE_STYLES = ("cyan", "blue")
MODE_ORDER = ("overlap", "no-overlap", "ddp")
GROWTH_FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)
BACKOFF_FACTORS = (0.125, 0.25, 0.5, 0.75, 0.875)
GROWTH_INTERVALS = (5, 10, 20, 50, 100, 200, 500, 2000)
BUCKET_MIB = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 64, 1024)
BLOCKS = " ▁▂▃▄▅▆▇█"

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


def _sim_timeline_dict(tl) -> dict:
    ms = 1000.0
    return {"layers": [[n, a * ms, b * ms] for n, a, b in tl.layers],
            "buckets": [[i, nb, a * ms, b * ms] for i, nb, a, b in tl.buckets],
            "backward_end": tl.backward_end * ms, "end": tl.end * ms}


class LossScaleVisualizer(LessonVisualizer):
    """See the module docstring."""

    can_focus = True
    DEFAULT_CSS = """
    LossScaleVisualizer { height: 1fr; width: 1fr; }
    LossScaleVisualizer:focus { background: $boost; }
    LossScaleVisualizer > Static { width: 1fr; height: auto; }
    """
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

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.view = "scale"
        self.fmt = "fp16"
        self.config = ScalerSimConfig()
        self.overlap_model = OverlapModel()
        self.hist_index: int | None = None   # None: follow the latest
        self.run = MixedPrecisionRun()
        self.use_live = False
        self.live_bucket: float | None = None
        self.last_text = Text()
        self._sim = None

    def compose(self):
        yield Static(id="ls-body")

    def on_mount(self) -> None:
        self.refresh_view()

    def on_resize(self, _event) -> None:
        self.refresh_view()

    # ---- lesson hooks ----------------------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        view = self.step_view(step_key)  # lessons/lesson6/lesson.toml
        self.view = view.get("show", self.view)
        self.fmt = view.get("format", "fp16")
        self.refresh_view()

    def feed_event(self, event: dict) -> None:
        if not self.run.feed(event):
            return
        if event.get("kind") == "run_start":  # a new run replaces the previous one's data
            self.live_bucket = None
            self.hist_index = None
        else:
            self.use_live = True
        self.refresh_view()

    # ---- actions ---------------------------------------------------------------------------
    def action_view(self, view: str) -> None:
        self.view = view
        self.refresh_view()

    def action_slide(self, what: str, direction: int) -> None:
        c = self.config

        def step(choices, value):
            i = min(range(len(choices)), key=lambda k: abs(choices[k] - value))
            return choices[max(0, min(len(choices) - 1, i + direction))]

        if what == "growth_interval":
            self.config = replace(c, growth_interval=step(GROWTH_INTERVALS, c.growth_interval))
        elif what == "growth_factor":
            self.config = replace(c, growth_factor=step(GROWTH_FACTORS, c.growth_factor))
        elif what == "backoff_factor":
            self.config = replace(c, backoff_factor=step(BACKOFF_FACTORS, c.backoff_factor))
        elif what == "init_scale":
            e = max(0, min(40, round(math.log2(c.init_scale)) + 2 * direction))
            self.config = replace(c, init_scale=2.0 ** e)
        elif what == "bucket":
            if self.use_live and self.run.timelines:
                sizes = self.run.bucket_sizes()
                cur = self._live_bucket()
                self.live_bucket = sizes[max(0, min(len(sizes) - 1, sizes.index(cur) + direction))]
            else:
                m = self.overlap_model
                self.overlap_model = replace(m, bucket_mib=step(BUCKET_MIB, m.bucket_mib))
        self._sim = None
        self.refresh_view()

    def action_hist_step(self, direction: int) -> None:
        n = len(self._hist_steps())
        if n:
            cur = n - 1 if self.hist_index is None else self.hist_index
            self.hist_index = max(0, min(n - 1, cur + direction))
        self.refresh_view()

    def action_toggle_format(self) -> None:
        self.fmt = "bf16" if self.fmt == "fp16" else "fp16"
        self.refresh_view()

    def action_toggle_source(self) -> None:
        self.use_live = not self.use_live and not self.run.empty
        self.refresh_view()

    def action_reset(self) -> None:
        self.config = ScalerSimConfig()
        self.overlap_model = OverlapModel()
        self.hist_index = None
        self._sim = None
        self.refresh_view()

    # ---- data ------------------------------------------------------------------------------
    def sim(self):
        if self._sim is None:
            self._sim = simulate_scaler(self.config)
        return self._sim

    def _hist_steps(self) -> list[int]:
        if self.use_live and self.run.hists:
            return [h["step"] for h in self.run.hists]
        return list(range(0, self.config.steps, 25))

    def _live_bucket(self) -> float:
        sizes = self.run.bucket_sizes()
        if self.live_bucket in sizes:
            return self.live_bucket
        best = self.run.best_bucket()
        return best if best is not None else sizes[0]

    # ---- rendering -------------------------------------------------------------------------
    def refresh_view(self) -> None:
        width = max(40, (self.size.width or 80) - 2)
        height = max(16, self.size.height or 24)
        t = strings("loss_scale", self.language)
        parts: list[Text] = []
        live = self.use_live and not self.run.empty
        head = Text()
        head.append({"scale": t["scale_title"], "exponents": t["exp_title"].format(fmt=self.fmt),
                     "timeline": ""}[self.view], style="bold")
        head.append(f"   [{t['source_live'] if live else t['source_sim']}]", style="italic dim")
        if self.view != "timeline":
            parts.append(head)
        if self.view == "scale":
            parts += self._render_scale(width, height, live)
        elif self.view == "exponents":
            parts += self._render_exponents(width, height, live)
        else:
            parts += self._render_timeline(width, live)
        text = Text("\n").join(parts)
        self.last_text = text
        try:
            self.query_one("#ls-body", Static).update(text)
        except Exception:  # not mounted yet
            pass

    def _slider_lines(self, width: int) -> list[Text]:
        c, t = self.config, strings("loss_scale", self.language)
        lang = self.language
        parts = [Text(p.format(gi=c.growth_interval, gf=format_plain(c.growth_factor, lang),
                               bf=format_plain(c.backoff_factor, lang),
                               i=format_plain(math.log2(c.init_scale), lang)), style="yellow") for p in t["sliders"]]
        return wrap_parts(parts, width)

    def _render_scale(self, width, height, live) -> list[Text]:
        t = strings("loss_scale", self.language)
        if live:
            scales, overflow, forced, loss = (self.run.scale, self.run.overflow, self.run.forced,
                                              self.run.loss)
            if not scales:
                return [Text(t["no_data"], style="dim")]
        else:
            s = self.sim()
            scales, overflow, forced, loss = s.scale, s.overflow, s.forced, s.loss
        out = [] if live else self._slider_lines(width)
        out += scale_plot(scales, overflow, forced, width, max(8, min(16, height // 2 - 2)))
        out += wrap_parts([Text(t["overflow"], style="red"), Text(t["forced"], style="magenta"),
                           Text(t["skipped"].format(n=sum(overflow), m=len(overflow)), style="dim")], width)
        out.append(Text(f"{t['loss']}  {_num(max(loss), self.language, 4)} → {_num(loss[-1], self.language, 4)}",
                        style="bold"))
        out += bar_plot(loss, width - 2, 3, style="green")
        out += wrap_parts([Text(k, style="dim italic") for k in self.hint_parts("scale")], width)
        return out

    def _render_exponents(self, width, height, live) -> list[Text]:
        t, lang = strings("loss_scale", self.language), self.language
        steps = self._hist_steps()
        idx = len(steps) - 1 if self.hist_index is None else min(self.hist_index, len(steps) - 1)
        out = [] if live else self._slider_lines(width)
        if live and self.run.hists:
            ev = self.run.hists[idx]
            hist = ExponentHistogram.from_dict(ev)
            scale = float(ev["scale"])
            step = ev["step"]
        elif live:
            return [Text(t["no_data"], style="dim")]
        else:
            step = steps[idx]
            sim = self.sim()
            hist = sim.histogram(step)
            scale = sim.scale[step]
        k = math.log2(scale)
        rows = max(3, min(8, (height - 14) // 2))
        for label, shift in ((t["without"], 0.0), (t["with"].format(k=format_plain(round(k, 1), self.language)), k)):
            line = Text(f"{label}  ", style="bold")
            line.append(t["step"].format(i=step), style="dim")
            out.append(line)
            out += histogram_plot(hist, shift, self.fmt, width, rows, lang)
            shares = hist.region_shares(round(shift), self.fmt)
            out += wrap_parts([Text(f"■ {t['overflow_r'] if r == 'overflow' else t[r]} "
                                    f"{_pct(shares[r], lang)}", style=REGION_STYLE[r]) for r in REGIONS],
                              width)
        if live and self.run.hists:
            ev = self.run.hists[idx]
            out.append(Text(t["measured"].format(fmt=ev.get("dtype", "fp16"), u=_pct(ev["zero_unscaled"], lang),
                                                 s=_pct(ev.get("zero_scaled"), lang)), style="cyan"))
        out += wrap_parts([Text(k, style="dim italic") for k in self.hint_parts("exponents")], width)
        return out

    def _render_timeline(self, width, live) -> list[Text]:
        t, lang = strings("loss_scale", self.language), self.language
        lane_w = max(20, width - 1)
        out = []
        if live and self.run.timelines:
            bucket = self._live_bucket()
            tls = {m: self.run.timeline(bucket, m) for m in MODE_ORDER if (bucket, m) in self.run.timelines}
            title_bucket = format_plain(bucket, lang)
        elif live:
            return [Text(t["no_data"], style="dim")]
        else:
            m = self.overlap_model
            tls = {"overlap": _sim_timeline_dict(m.run(True)),
                   "no-overlap": _sim_timeline_dict(m.run(False))}
            title_bucket = format_plain(m.bucket_mib, lang)
        head = Text(t["tl_title"].format(b=title_bucket), style="bold")
        head.append(f"   [{t['source_live'] if live else t['source_sim']}]", style="italic dim")
        out.append(head)
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
        if live and self.run.sweep:
            out.append(Text(t["sweep"], style="bold"))
            for b in sorted({b for b, _ in self.run.sweep}):
                row = " / ".join(f"{format_fixed(self.run.sweep.get((b, m), float('nan')), 2, lang):>8}"
                                 for m in MODE_ORDER)
                mark = " ◀" if b == self._live_bucket() else ""
                out.append(Text(f"  {format_plain(b, lang):>6} MiB: {row}{mark}"))
            ov = (self.run.summary or {}).get("overlap")
            if ov:
                out.append(Text(t["best"].format(b=format_plain(ov["best_bucket_mb"], lang), x=_num(ov["overlap_speedup"], lang, 2),
                                                 r=_num(ov["ours_over_ddp"], lang, 2)), style="green"))
        elif not live:
            m = self.overlap_model
            out += wrap_parts([Text(x.strip(), style="dim") for x in t["sim_model"].format(
                n=m.n_layers, mb=format_plain(m.layer_mib, lang), ms=format_plain(m.layer_backward_ms, lang),
                w=m.world_size, bw=format_plain(m.bandwidth_gbps, lang),
                a=format_plain(m.alpha_us, lang)).split(", ")], width, sep=", ")
            sweep = m.sweep(BUCKET_MIB)
            best = min(sweep, key=sweep.get)
            out.append(Text(t["sim_sweep"], style="bold"))
            out += wrap_parts([Text(f"{format_plain(b, lang)}:{_num(v * 1000, lang)}", style="bold green" if b == best else "")
                               for b, v in sweep.items()], width, sep="  ")
        out += wrap_parts([Text(k, style="dim italic") for k in self.hint_parts("timeline")], width)
        return out


VISUALIZER = LossScaleVisualizer
