"""Lesson 7's visualizer: the KV cache across GPUs, paged blocks over time, and the planner's trade-off.

Five views (the lesson's step picks one; the keys are its ``CONTROLS``, listed by ``?``):

- *tp* and *pp* — the KV cache of one model as a grid of layers (rows, grouped when there are many)
  × KV heads (columns), each cell coloured by the GPU that stores it: tensor parallelism cuts the
  columns (heads), pipeline parallelism the rows (layers), both together a checkerboard; under it
  each GPU's share in bytes from :func:`~distai.lessons.lesson7.formulas.kv_cache_total` for the
  chosen number of cached tokens (and the weights it holds). With ``tp`` above the KV heads each
  head is stored on several GPUs (marked ×n). Keys change TP, PP, the cached tokens and the model.
- *paged* — a pool of KV blocks filling and freeing as requests arrive and leave
  (:func:`~distai.lessons.lesson7.paging.simulate`, the scheduler the engine uses): each block
  shows the request that owns it, a partly filled last block shows its fill; under it the same
  requests in a contiguous cache with one ``max_len`` region each, the reserved-but-empty part
  shaded, and both wastes. It plays and steps, and switches to a run's blocks.
- *prefix* — prefix sharing: the same pool when every request starts with one system prompt
  (:class:`~distai.lessons.lesson7.paging.PrefixCachingAllocator`): a block held by several
  requests shows its reference count (×N), blocks no request holds but kept for reuse are shaded,
  copies made on write are underlined; under it the memory saved (physical against logical blocks),
  the prompt tokens found cached and the TTFT (in iterations) against the same requests unshared.
  The same playback as *paged*.
- *planner* — output tokens/s against TPOT for every TP × PP × replicas split of the GPUs
  (:func:`~distai.lessons.lesson7.planner.plan`), one curve per configuration over batch sizes,
  the TPOT target as a vertical line; configurations that do not fit are listed with the reason.
  ``s/S`` tighter/looser TPOT target, ``d/D`` more/fewer GPUs, ``m`` model.

Fed the events of ``distai run lesson7`` (``config``, ``kv_shard``, ``kv_step``, ``kv_compare``,
``prefix_compare``), it adds the run's model (measured bytes per rank beside the formula) and the run's
paged and shared blocks.

What it shows is a pure view model, ``lessons/lesson7/kv_cache_view.py`` (the state, its moves, the
layouts, the pools' and the planner chart's figures); the widget keeps the state in one reactive
attribute per field (a change repaints) and draws. No torch, no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.reactive import reactive

from ..lessons.lesson7 import formulas as f
from ..lessons.lesson7 import kv_cache_view as kv
from ..lessons.lesson7 import paging
from ..lessons.lesson7.kv_cache_view import (  # noqa: F401 - the presets and layouts, for callers and tests
    GPU_COUNTS,
    PRESETS,
    TPOT_SLOS,
    KVState,
    ModelPreset,
    head_owners,
    layer_stage,
    shard_table,
    ttft_iterations,
)
from ..lessons.lesson7.serving_run import ServingRun
from ..lessons.strings import strings, translated
from ..lessons.units import (
    format_bytes,
    format_fixed,
    format_integer,
    format_number,
    format_percent,
    format_plain,
    format_range,
    format_score,
    format_time,
)
from .base import NEXT_VIEW, PLAY, STEP, Control, view_controls
from .playback import PlaybackVisualizer
from .view_state import StateOf

GPU_HUES = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
FILL = "▁▂▃▄▅▆▇█"
MARKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_START = KVState()


def _bytes(n: float, lang: str = "en") -> str:
    return format_bytes(n, lang=lang)


def _hue(i: int) -> str:
    return GPU_HUES[i % len(GPU_HUES)]


def _req_hue(rid: int) -> str:
    return GPU_HUES[(rid * 7) % len(GPU_HUES)]


# ---------------------------------------------------------------------------------------------
# pure drawing helpers (tested directly; the layouts are lessons/lesson7/kv_cache_view.py's)
# ---------------------------------------------------------------------------------------------

def owned_block(owner: int, fill: int, block_size: int, emphasis: str = "") -> tuple[str, str]:
    """A block request ``owner`` holds, two characters and their style: its number (``07``) when the block
    is full, else a glyph of how full it is and the number's last digit (``▃7``)."""
    style = f"black on {_req_hue(owner)}" + emphasis
    if fill >= block_size:
        return f"{owner % 100:02d}", style
    glyph = FILL[max(0, min(len(FILL) - 1, math.ceil(fill / block_size * len(FILL)) - 1))]
    return glyph + f"{owner % 10}", style


def prefix_pool_lines(snap: paging.Snapshot, block_size: int, width: int) -> list[Text]:
    """The pool with prefix sharing, two characters a block: ``×N`` a block N requests hold (``NN`` from
    10 on, on the same green), ``░░`` a
    cached block nobody holds, the owner's number (or fill glyph and number) for a private block, ``··``
    free; new or copied blocks underlined."""
    n = len(snap.owners)
    refs = snap.refs or [0 if o is None else 1 for o in snap.owners]
    cached, new = set(snap.cached), set(snap.allocated) | set(snap.cow)
    per_row = max(4, (width - 1) // 3)
    out = []
    for r0 in range(0, n, per_row):
        line = Text()
        for b in range(r0, min(n, r0 + per_row)):
            mark = " underline" if b in new else ""
            if refs[b] > 1:
                label = f"×{refs[b]}" if refs[b] < 10 else f"{min(refs[b], 99)}"
                line.append(label, style="bold white on #2f6f4f" + mark)
            elif b in cached:
                line.append("░░", style="grey58")
            elif snap.owners[b] is None:
                line.append("··", style="grey35")
            else:
                line.append(*owned_block(snap.owners[b], snap.fills[b], block_size, mark))
            line.append(" ")
        out.append(line)
    return out


class KVCacheVisualizer(PlaybackVisualizer):
    """KV cache across GPUs (by heads, by layers), paged blocks over time, the planner's trade-off."""

    can_focus = True
    TICK_S = 1 / 4
    DEFAULT_CLASSES = "panel"
    VIEWS = ("tp", "pp", "paged", "prefix", "planner")
    STEP_SETTINGS = frozenset({"show", "tp", "pp"})  # lessons/lesson7/lesson.toml
    CONTROLS = (
        NEXT_VIEW,
        *view_controls("kv_cache", ("tp", "pp", "paged", "planner", "prefix")),
        Control("right_square_bracket", "tp(1)", "kv_cache.tp",
                back_keys="left_square_bracket", back_action="tp(-1)"),
        Control("right_curly_bracket", "pp(1)", "kv_cache.pp", back_keys="left_curly_bracket", back_action="pp(-1)"),
        Control("k", "tokens(1)", "kv_cache.tokens", back_keys="K", back_action="tokens(-1)"),
        Control("m", "model", "kv_cache.model"),
        PLAY,
        STEP,
        Control("x", "source", "kv_cache.source"),
        Control("s", "slo(-1)", "kv_cache.slo", back_keys="S", back_action="slo(1)"),
        Control("d", "gpus(1)", "kv_cache.gpus", back_keys="D", back_action="gpus(-1)"),
    )
    HINTS = {"shard": ("next_view", "tp", "pp", "tokens", "model"), "paged": ("next_view", "play", "step", "source"),
             "prefix": ("next_view", "play", "step", "source"),
             "planner": ("next_view", "slo", "gpus", "model")}

    view: reactive[str] = reactive(_START.view)
    model_index: reactive[int] = reactive(_START.model_index)
    tp: reactive[int] = reactive(_START.tp)
    pp: reactive[int] = reactive(_START.pp)
    tokens: reactive[int] = reactive(_START.tokens)
    cursor: reactive[int] = reactive(_START.cursor)
    source: reactive[str] = reactive(_START.source)
    tpot_slo: reactive[float] = reactive(_START.tpot_slo)
    gpus: reactive[int] = reactive(_START.gpus)
    run_version: reactive[int] = reactive(0)  # bumped by every event that changes what is drawn
    state = StateOf(KVState)  # the reactive attributes of its fields, as one KVState

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.figures = kv.KVCacheView()
        self.playing = True

    # -- the state and what it shows (lessons/lesson7/kv_cache_view.py) --------------------------------
    @property
    def run(self) -> ServingRun:
        return self.figures.run

    @property
    def model(self) -> ModelPreset:
        return self.figures.model(self.state)

    @property
    def presets(self) -> list[ModelPreset]:
        return self.figures.presets

    def plan(self) -> dict:
        return self.figures.plan(self.state)

    # the simulated pools, for tests and callers
    sim_paged = property(lambda self: self.figures.sim_paged)
    sim_contig = property(lambda self: self.figures.sim_contig)
    sim_prefix = property(lambda self: self.figures.sim_prefix)
    sim_prefix_ttft = property(lambda self: self.figures.sim_prefix_ttft)
    num_blocks = property(lambda self: self.figures.NUM_BLOCKS)

    # -- Textual -----------------------------------------------------------------------------------
    # playback (visualizers/playback.py): the paged view's cursor, one scheduler step per tick, looping
    def advance(self, dt: float) -> bool:
        self.state = self.figures.advance(self.state)
        return True

    def seek(self, frames: int) -> None:
        self.state = self.figures.seek(self.state, frames)

    def rewind(self) -> None:
        self.cursor = 0

    def to_end(self) -> None:
        self.state = self.figures.to_end(self.state)

    def show_step(self, step_key: str) -> None:
        self.state = kv.show_step(self.state, self.step_view(step_key))  # lessons/lesson7/lesson.toml

    def feed_event(self, event: dict) -> None:
        state = self.figures.feed(self.state, event, translated("kv_cache", "run_model", self.language))
        if state is not None:
            self.state = state
            self.run_version += 1

    # -- actions -----------------------------------------------------------------------------------
    def action_tp(self, d: int) -> None:
        self.state = kv.with_tp(self.state, d)

    def action_pp(self, d: int) -> None:
        self.state = self.figures.with_pp(self.state, d)

    def action_tokens(self, d: int) -> None:
        self.state = kv.with_tokens(self.state, d)

    def action_model(self) -> None:
        self.state = self.figures.next_model(self.state)

    def action_source(self) -> None:
        self.state = self.figures.switch_source(self.state)

    def action_slo(self, d: int) -> None:
        self.state = kv.with_slo(self.state, d)

    def action_gpus(self, d: int) -> None:
        self.state = kv.with_gpus(self.state, d)

    # -- drawing -----------------------------------------------------------------------------------
    def tr(self) -> Mapping[str, Any]:
        return strings("kv_cache", self.language)

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        width, state = max(40, width), self.state
        if state.view in ("tp", "pp"):
            lines = self._shard_lines(state, width, height)
        elif state.view == "paged":
            lines = self._paged_lines(state, width, height)
        elif state.view == "prefix":
            lines = self._prefix_lines(state, width, height)
        else:
            lines = self._planner_lines(state, width, height)
        return self.fit_height(lines, height)

    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 80, size.height or None))

    def _hint(self, width: int, hint: str) -> Text:
        return Text(self.controls_hint(width, self.HINTS[hint]), style="grey50")

    # tp / pp --------------------------------------------------------------------------------------
    def _shard_lines(self, state: KVState, width: int, height: int | None) -> list[Text]:
        tr, m, lang = self.tr(), self.figures.model(state), self.language
        narrow = width < 80
        out = [Text(tr["tp_title_short" if narrow else "tp_title"].format(
            model=m.name, L=m.layers, H=m.kv_heads, tp=state.tp, pp=state.pp), style="bold")]
        try:
            owners = head_owners(m.kv_heads, state.tp)
        except ValueError as exc:
            out.append(Text(tr["invalid"].format(tp=state.tp, H=m.kv_heads, msg=exc), style="yellow"))
            out.append(self._hint(width, "shard"))
            return out
        pp = min(state.pp, m.layers)
        out += self._shard_grid(state, m, owners, pp, width, height)
        tokens = state.tokens
        seqs = f"{tokens // 4096} × {format_integer(4096, lang)}" if tokens % 4096 == 0 and tokens >= 4096 else "1 ×"
        total = f.kv_cache_total(m.layers, m.kv_heads, m.head_dim, m.dtype_bytes, tokens, state.tp, pp)
        out.append(Text(tr["tokens"].format(T=format_integer(tokens, lang), seqs=seqs) + " · " + tr["per_token"].format(
            pt=_bytes(total["bytes_per_token"], lang), pg=_bytes(total["per_gpu_bytes"] / tokens, lang)), style="italic"))
        rows = shard_table(m, state.tp, pp, tokens)
        budget = (height or 100) - len(out) - 4
        for i, row in enumerate(rows):
            if i >= max(2, budget) and len(rows) - i > 1:
                out.append(Text(tr["more_gpus"].format(n=len(rows) - i), style="grey50"))
                break
            heads = row["kv_heads"]
            hs = format_range(heads[0], heads[-1])
            rep = f" ×{len(owners[heads[0]])}" if len(owners[heads[0]]) > 1 else ""
            text = Text("■ ", style=_hue(row["gpu"]))
            text.append(tr["gpu_row_short" if narrow else "gpu_row"].format(
                g=row["gpu"], l0=row["layers"][0], l1=row["layers"][-1], heads=hs, rep=rep,
                kv=_bytes(row["kv_bytes"], lang), w=_bytes(row["weight_bytes"], lang)))
            meas = self.figures.measured_for(state, row)
            if meas is not None:
                text.append(tr["measured"].format(m=_bytes(meas, lang)), style="bold magenta")
            out.append(text)
        if len(owners[0]) > 1:
            out.append(Text(tr["replicated"].format(n=len(owners[0]), H=m.kv_heads, tp=state.tp), style="yellow"))
        out.append(self._hint(width, "shard"))
        return out

    def _shard_grid(self, state: KVState, m: ModelPreset, owners: list[list[int]], pp: int, width: int,
                    height: int | None) -> list[Text]:
        """Layers (rows, grouped when many) × KV heads (columns), each cell the GPU storing it."""
        stages = layer_stage(m.layers, pp)
        rows_avail = max(4, min(16, (height or 40) - 8 - min(state.tp * pp, 16)))
        group = -(-m.layers // rows_avail)
        cols = m.kv_heads
        label_w = 8
        cell = max(1, min(6, (width - label_w - 2) // max(1, cols)))
        col_group = 1
        while cell < 2 and col_group < cols:
            col_group *= 2
            cell = max(1, min(6, (width - label_w - 2) // -(-cols // col_group)))
        out = [Text(self.tr()["axis"], style="grey50")]
        head = Text(" " * label_w, style="grey62")
        for h0 in range(0, cols, col_group):
            name = f"h{h0}" if col_group == 1 else f"h{h0}+"
            head.append(name[: cell - 1].center(cell - 1) + " " if cell > 1 else name[:1])
        out.append(head)
        for r0 in range(0, m.layers, group):
            r1 = min(m.layers, r0 + group) - 1
            line = Text(f"L{r0:>2}-{r1:<3}"[:label_w].ljust(label_w), style="grey62")
            st = stages[r0]
            for h0 in range(0, cols, col_group):
                own = owners[h0]
                gpu = st * state.tp + own[0]
                label = (str(gpu) if len(own) == 1 else f"{gpu}×{len(own)}")
                if cell > 2:
                    line.append(label[: cell - 1].center(cell - 1), style=f"bold black on {_hue(gpu)}")
                    line.append(" ")
                else:
                    line.append(label[:cell].center(cell), style=f"bold black on {_hue(gpu)}")
            out.append(line)
        return out

    # paged ----------------------------------------------------------------------------------------
    def _paged_lines(self, state: KVState, width: int, height: int | None) -> list[Text]:
        tr, lang = self.tr(), self.language
        fig = self.figures.paged(state)
        if fig is None:
            return [Text("—")]
        steps, contig, n, bs, max_len = self.figures.paged_steps(state)
        snap, k = fig.snap, fig.k
        narrow = width < 80
        src = tr["src_run"] if state.source == "run" and self.run.paged else tr["src_sim"]
        out = [Text(tr["paged_title_short" if narrow else "paged_title"].format(
            n=n, bs=bs, k=k + 1, N=fig.total, src=src), style="bold")]
        status = Text("▶ " if self.playing else "❚❚ ", style="bold cyan")
        status.append(tr["running"].format(r=len(snap.running), w=len(snap.waiting), a=len(snap.allocated),
                                           f=len(snap.freed)))
        out.append(status)
        per_row = max(4, (width - 1) // 3)
        new = set(snap.allocated)
        freed = set(snap.freed)
        for r0 in range(0, n, per_row):
            line = Text()
            for b in range(r0, min(n, r0 + per_row)):
                owner = snap.owners[b]
                if owner is None:
                    line.append("··", style="bold red" if b in freed else "grey35")
                else:
                    line.append(*owned_block(owner, snap.fills[b], bs, " bold underline" if b in new else ""))
                line.append(" ")
            out.append(line)
        if k >= len(steps):
            out.append(Text(tr["paged_done"].format(N=len(steps)), style="grey50"))
        out.append(Text(tr["legend_paged_short" if narrow else "legend_paged"], style="grey50"))
        if fig.contig is not None:
            out += self._contiguous_lines(fig.contig, max_len, width, (height or 100) - len(out) - 4)
            if k >= len(contig):
                out.append(Text(tr["contig_done"].format(N=len(contig)), style="grey50"))
        out.append(Text(tr["waste_short" if narrow else "waste"].format(
            p=format_score(fig.paged_waste, lang), c=format_score(fig.contig_waste, lang),
            pm=format_score(fig.paged_mean, lang), cm=format_score(fig.contig_mean, lang)), style="bold"))
        if self.run.kv_compare and state.source == "run":
            kc = self.run.kv_compare
            out.append(Text(tr["compare"].format(
                p=format_percent(kc["paged"]["waste_fraction"], lang=lang),
                c=format_percent(kc["contiguous"]["waste_fraction"], lang=lang),
                r=format_fixed(kc["throughput_ratio"], 2, lang)), style="magenta"))
        out.append(self._hint(width, "paged"))
        return out

    def _contiguous_lines(self, cs: paging.Snapshot, max_len: int, width: int, room: int) -> list[Text]:
        """The same requests in one ``max_len`` slot each: the reserved-but-empty part shaded."""
        slots = len(cs.owners)
        out = [Text(self.tr()["contig_title"].format(s=slots, L=max_len), style="bold")]
        bar_w = max(10, width - 10)
        for s in range(slots):
            if s >= max(1, room):
                out.append(Text(f"… {slots - s}", style="grey50"))
                break
            owner = cs.owners[s]
            line = Text(f"{s:>2} ", style="grey62")
            if owner is None:
                line.append("·" * bar_w, style="grey35")
            else:
                used = round(cs.fills[s] / max_len * bar_w)
                line.append(f"{owner % 100:02d}".ljust(max(2, used), " "), style=f"black on {_req_hue(owner)}")
                line.append("░" * max(0, bar_w - max(2, used)), style="red")
            out.append(line)
        return out

    # prefix sharing -------------------------------------------------------------------------------
    def _prefix_lines(self, state: KVState, width: int, height: int | None) -> list[Text]:
        tr, lang = self.tr(), self.language
        fig = self.figures.prefix(state)
        if fig is None:
            return [Text("—")]
        steps, n, bs = self.figures.prefix_steps(state)
        snap = steps[fig.k]
        narrow = width < 80
        run = state.source == "run" and bool(self.run.prefix)
        src = tr["src_run"] if run else tr["src_sim"]
        pc = self.run.prefix_compare
        sp = int(pc.get("system_prompt", 0)) if run and pc else self.figures.SYSTEM_PROMPT
        out = [Text(tr["prefix_title_short" if narrow else "prefix_title"].format(
            n=n, bs=bs, sp=sp, k=fig.k + 1, N=len(steps), src=src), style="bold")]
        short = "_short" if narrow else ""
        status = Text("▶ " if self.playing else "❚❚ ", style="bold cyan")
        status.append(tr["prefix_status" + short].format(r=len(snap.running), w=len(snap.waiting), s=len(fig.shared),
                                                         m=max(fig.shared, default=1), c=len(snap.cached)))
        out.append(status)
        out.extend(prefix_pool_lines(snap, bs, width))
        out.append(Text(tr["legend_prefix" + short], style="grey50"))
        saved = format_percent(1 - fig.physical / fig.logical if fig.logical else 0.0, 2, lang)
        out.append(Text(tr["prefix_memory" + short].format(p=fig.physical, l=fig.logical, saved=saved), style="bold"))
        out.append(Text(tr["prefix_step" + short].format(t=snap.reused_tokens, cow=len(snap.cow), e=len(snap.evicted))))
        if run and pc:
            a, b = pc["no-sharing"], pc["prefix"]
            out.append(Text(tr["prefix_compare" + short].format(
                saved=format_percent(b["memory_saved"], 2, lang), pb=b["peak_blocks"], nb=a["peak_blocks"],
                t1=format_time(b["ttft_p50_s"], 3, lang), t0=format_time(a["ttft_p50_s"], 3, lang),
                r=format_number(pc["ttft_ratio"], 2, lang)), style="magenta"))
        elif not run:
            shared_ttft, plain_ttft = self.figures.sim_prefix_ttft
            out.append(Text(tr["prefix_total" + short].format(
                r=format_integer(fig.reused_so_far, lang), T=format_integer(self.figures.sim_prompt_tokens, lang),
                a=format_number(sum(shared_ttft.values()) / len(shared_ttft), 2, lang),
                b=format_number(sum(plain_ttft.values()) / len(plain_ttft), 2, lang))))
        out.append(self._hint(width, "prefix"))
        return out

    # planner --------------------------------------------------------------------------------------
    def _planner_lines(self, state: KVState, width: int, height: int | None) -> list[Text]:
        tr, lang = self.tr(), self.language
        res = self.figures.plan(state)
        m = self.figures.model(state)
        narrow = width < 80
        out = [Text(tr["planner_title_short" if narrow else "planner_title"].format(
            model=m.name, G=state.gpus, slo=format_time(state.tpot_slo, lang=lang)), style="bold")]
        best = res["best"]
        if best is not None:
            out.append(Text(tr["best"].format(cfg=f"{best.tp}×{best.pp}×{best.replicas}", b=best.batch,
                                              tpot=format_time(best.tpot_s, lang=lang),
                                              thr=format_integer(best.throughput_tokens_per_s, lang)), style="bold green"))
        else:
            out.append(Text(tr["none"], style="bold yellow"))
        n_curves = sum(1 for c in res["accepted"] + res["rejected"] if c.curve)
        chart_h = max(6, min(16, (height or 30) - 8 - n_curves // 3 - 2))
        chart = self.figures.planner_chart(state, max(20, width - 9), chart_h)
        out += self._planner_chart_lines(state, chart, max(20, width - 9), chart_h, width)
        out += self._planner_legend(chart.candidates, width)
        for c in [c for c in res["rejected"] if not c.curve][:3]:
            cfg = f"{c.tp}×{c.pp}×{c.replicas}"
            if c.reason == "memory" and c.free_bytes is not None and c.free_bytes <= 0:
                msg = tr["no_fit"].format(cfg=cfg, w=_bytes(c.weights_per_gpu_bytes, lang), u=_bytes(c.usable_bytes, lang))
            elif c.reason == "memory":
                msg = tr["no_kv"].format(cfg=cfg, kv=_bytes(c.kv_per_seq_per_gpu_bytes, lang))
            else:
                msg = f"{cfg} {tr['reasons'][c.reason]}: {c.detail}"
            out.append(Text(msg, style="yellow"))
        out.append(self._hint(width, "planner"))
        return out

    def _planner_chart_lines(self, state: KVState, chart: kv.PlannerChart, chart_w: int, chart_h: int,
                             width: int) -> list[Text]:
        """Output tokens/s (log) against TPOT: a marker per configuration and batch, the target ┆."""
        tr, lang = self.tr(), self.language
        grid = [[(" ", "")] * chart_w for _ in range(chart_h)]
        for r in range(chart_h):
            grid[r][chart.slo_col] = ("┆", "yellow")
        for p in chart.points:
            c = chart.candidates[p.candidate]
            style = f"bold {_hue(p.candidate)}" if c.accepted else _hue(p.candidate)
            if chart.best is not None and c is chart.best:
                style += " reverse"
            grid[p.row][p.col] = (MARKERS[p.candidate % len(MARKERS)], style)
        out = [Text(tr["y_axis"] + " ↑", style="grey50")]
        for r in range(chart_h):
            labelled = r in (0, chart_h - 1, chart_h // 2)
            label = format_integer(chart.y_at(r, chart_h), lang).rjust(7) if labelled else " " * 7
            line = Text(label + "│", style="grey62")
            for ch, st in grid[r]:
                line.append(ch, style=st)
            out.append(line)
        out.append(Text(" " * 7 + "└" + "─" * chart_w, style="grey62"))
        ticks = Text(" " * 8)
        end_txt = f"{format_plain(chart.x_max * 1e3, lang)} ms"
        slo_txt = format_plain(state.tpot_slo * 1e3, lang)
        pos = 0
        for col, txt in [(0, "0"), (chart.slo_col, slo_txt), (chart_w - len(end_txt), end_txt)]:
            if col >= pos:
                ticks.append(" " * (col - pos))
                ticks.append(txt, style="yellow" if txt == slo_txt and col == chart.slo_col else "grey62")
                pos = col + len(txt)
        if len(ticks.plain) + len(tr["x_axis"]) + 2 <= width:
            ticks.append("  " + tr["x_axis"], style="grey50")
        out.append(ticks)
        return out

    def _planner_legend(self, cands: list, width: int) -> list[Text]:
        """Each configuration's marker, TP×PP×replicas and ✓ or why it misses the targets, in columns."""
        tr = self.tr()
        legend: list[Text] = []
        for i, c in enumerate(cands):
            item = Text(f"{MARKERS[i % len(MARKERS)]} ", style=f"bold {_hue(i)}")
            item.append(f"{c.tp}×{c.pp}×{c.replicas}")
            item.append(" ✓" if c.accepted else f" {tr['reasons'][c.reason]}", style="green" if c.accepted else "yellow")
            legend.append(item)
        col_w = 16 if width >= 64 else 14
        per_line = max(1, width // col_w)
        out = []
        for j in range(0, len(legend), per_line):
            line = Text()
            for item in legend[j:j + per_line]:
                line.append_text(item)
                line.append(" " * max(1, col_w - len(item.plain)))
            out.append(line)
        return out

VISUALIZER = KVCacheVisualizer
