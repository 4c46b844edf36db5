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
No torch, no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from ..lessons.lesson7 import formulas as f
from ..lessons.lesson7 import paging
from ..lessons.lesson7 import planner as pl
from ..lessons.lesson7.serving_run import ServingRun
from ..lessons.strings import strings, translated
from ..lessons.units import (
    format_bytes,
    format_fixed,
    format_integer,
    format_number,
    format_percent,
    format_plain,
    format_score,
    format_time,
)
from .base import NEXT_VIEW, PLAY, STEP, Control, view_controls
from .playback import PlaybackVisualizer

GPU_HUES = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
FILL = "▁▂▃▄▅▆▇█"
MARKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TPOT_SLOS = (0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2)
GPU_COUNTS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class ModelPreset:
    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float = 2

    def spec(self) -> pl.ModelSpec:
        return pl.ModelSpec(self.params, self.layers, self.hidden, self.heads, self.kv_heads,
                            head_dim=self.head_dim, dtype_bytes=self.dtype_bytes)


PRESETS = [
    ModelPreset("Llama-2-70B", 69e9, 80, 8192, 64, 8, 128),
    ModelPreset("Llama-2-13B", 13e9, 40, 5120, 40, 40, 128),
    ModelPreset("Llama-3-8B", 8e9, 32, 4096, 32, 8, 128),
    ModelPreset("Llama-2-7B", 6.7e9, 32, 4096, 32, 32, 128),
]

def _bytes(n: float, lang: str = "en") -> str:
    return format_bytes(n, lang=lang)


def _hue(i: int) -> str:
    return GPU_HUES[i % len(GPU_HUES)]


def _req_hue(rid: int) -> str:
    return GPU_HUES[(rid * 7) % len(GPU_HUES)]


# ---------------------------------------------------------------------------------------------
# pure layout helpers (tested directly)
# ---------------------------------------------------------------------------------------------

def head_owners(kv_heads: int, tp: int) -> list[list[int]]:
    """For each KV head, the tensor-parallel ranks that store it (one, or tp/kv_heads when replicated)."""
    per = f.kv_heads_per_gpu(kv_heads, tp)  # raises when they do not divide either way
    if kv_heads >= tp:
        return [[h // per] for h in range(kv_heads)]
    rep = tp // kv_heads
    return [list(range(h * rep, (h + 1) * rep)) for h in range(kv_heads)]


def layer_stage(layers: int, pp: int) -> list[int]:
    """The pipeline stage of each layer (contiguous runs, the first ``layers % pp`` one longer — the
    engine's ``split_layers``)."""
    if not 1 <= pp <= layers:
        raise ValueError(f"{pp} stages for {layers} layers")
    base, extra = divmod(layers, pp)
    out = []
    for s in range(pp):
        out += [s] * (base + (1 if s < extra else 0))
    return out


def shard_table(model: ModelPreset, tp: int, pp: int, tokens: int) -> list[dict]:
    """Per GPU (index stage·tp + tp rank): layers, KV heads, KV bytes for ``tokens`` tokens, weights."""
    owners = head_owners(model.kv_heads, tp)
    stages = layer_stage(model.layers, pp)
    rows = []
    for s in range(pp):
        layers = [i for i, st in enumerate(stages) if st == s]
        for r in range(tp):
            heads = [h for h, o in enumerate(owners) if r in o]
            kv = f.kv_cache_bytes_per_token(len(layers), len(heads), model.head_dim, model.dtype_bytes) * tokens
            rows.append({"gpu": s * tp + r, "stage": s, "tp_rank": r, "layers": layers, "kv_heads": heads,
                         "kv_bytes": kv, "weight_bytes": model.params * model.dtype_bytes * len(layers)
                         / model.layers / tp})
    return rows


def ttft_iterations(requests, snaps: list[paging.Snapshot]) -> dict[int, int]:
    """Per request: iterations from its arrival to its first token (the iteration that prefills it
    gives the first token)."""
    first: dict[int, int] = {}
    for s in snaps:
        for rid in s.admitted:
            first.setdefault(rid, s.step)
    return {r.rid: first[r.rid] - r.arrival for r in requests if r.rid in first}


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

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.view = "tp"
        self.presets: list[ModelPreset] = list(PRESETS)
        self.model_index = 0
        self.tp, self.pp = 4, 1
        self.tokens = 64 * 4096
        self.playing = True
        self.cursor = 0
        self.source = "sim"
        self.tpot_slo = 0.05
        self.gpus = 8
        self.ttft_slo = 1.0
        # paged model: the same scheduler the engine uses, on a synthetic request mix
        self.block_size, self.num_blocks = 8, 48
        reqs = paging.poisson_requests(24, 0.6, prompt_range=(4, 40), output_range=(4, 56), seed=3)
        self.max_len = max(r.prompt_len + r.output_len - 1 for r in reqs)
        self.sim_paged = paging.simulate(reqs, paging.BlockAllocator(self.num_blocks, self.block_size), 16)
        slots = self.num_blocks * self.block_size // self.max_len
        self.sim_contig = paging.simulate(reqs, paging.ContiguousAllocator(slots, self.max_len), 16)
        # prefix sharing: every request starts with the same system prompt (token ids needed)
        self.system_prompt = 29  # 3 full blocks of 8 and 5 tokens: the 4th block is copied on write
        shared = paging.poisson_requests(24, 0.6, prompt_range=(2, 16), output_range=(4, 40), seed=3, vocab=64,
                                         system_prompt=self.system_prompt)
        self.sim_prefix = paging.simulate(shared, paging.PrefixCachingAllocator(self.num_blocks, self.block_size), 16)
        self.sim_prefix_ttft = (ttft_iterations(shared, self.sim_prefix), ttft_iterations(
            shared, paging.simulate(shared, paging.BlockAllocator(self.num_blocks, self.block_size), 16)))
        self.sim_prompt_tokens = sum(r.prompt_len for r in shared)
        self.run = ServingRun()
        self._plan_cache: dict = {}

    # -- model -------------------------------------------------------------------------------------
    @property
    def model(self) -> ModelPreset:
        return self.presets[self.model_index % len(self.presets)]

    def plan(self) -> dict:
        key = (self.model, self.gpus, self.tpot_slo)
        if key not in self._plan_cache:
            hw = pl.h100_node(self.gpus)
            wl = pl.Workload(prompt=2048, output=2048, ttft_slo=self.ttft_slo, tpot_slo=self.tpot_slo)
            self._plan_cache[key] = pl.plan(self.model.spec(), hw, wl)
        return self._plan_cache[key]

    def paged_steps(self) -> tuple[list[paging.Snapshot], list[paging.Snapshot], int, int, int]:
        """(paged snapshots, contiguous snapshots, blocks, block size, max_len) of the shown source."""
        run = self.run
        if self.source == "run" and run.paged and run.paged_pool:
            n, bs = run.paged_pool
            return run.paged, run.contiguous, n, bs, run.contiguous_len or bs
        return self.sim_paged, self.sim_contig, self.num_blocks, self.block_size, self.max_len

    def prefix_steps(self) -> tuple[list[paging.Snapshot], int, int]:
        """(snapshots, blocks, block size) of the shown source, with prefix sharing."""
        if self.source == "run" and self.run.prefix and self.run.prefix_pool:
            n, bs = self.run.prefix_pool
            return self.run.prefix, n, bs
        return self.sim_prefix, self.num_blocks, self.block_size

    def paged_total(self) -> int:
        if self.view == "prefix":
            return len(self.prefix_steps()[0])
        steps, contig = self.paged_steps()[:2]
        return max(len(steps), len(contig))

    # -- Textual -----------------------------------------------------------------------------------
    # playback (visualizers/playback.py): the paged view's cursor, one scheduler step per tick, looping
    def advance(self, dt: float) -> bool:
        if self.view in ("paged", "prefix"):
            self.cursor = (self.cursor + 1) % max(1, self.paged_total())
            self.refresh()
        return True

    def seek(self, frames: int) -> None:
        self.cursor = max(0, min(self.paged_total() - 1, self.cursor + frames))

    def rewind(self) -> None:
        self.cursor = 0

    def to_end(self) -> None:
        self.cursor = max(0, self.paged_total() - 1)

    def show_step(self, step_key: str) -> None:
        view = self.step_view(step_key)  # lessons/lesson7/lesson.toml
        if not view:
            return
        self.view = view["show"]
        if "tp" in view:
            self.tp, self.pp = view["tp"], view["pp"]
        self.refresh()

    def feed_event(self, event: dict) -> None:
        run = self.run
        if not run.feed(event):
            return
        kind = event["kind"]
        if kind == "config":
            name = translated("kv_cache", "run_model", self.language)
            model = ModelPreset(name, float(event.get("params", 0)), int(event["layers"]), int(event["hidden"]),
                                int(event["heads"]), int(event["kv_heads"]), int(event["head_dim"]),
                                run.dtype_bytes())
            self.presets = [p for p in self.presets if p.name != model.name] + [model]
            self.model_index = len(self.presets) - 1
        elif kind == "kv_shard":
            self.tp, self.pp = run.mesh(event)
            if run.config:
                self.tokens = int(event["tokens"])
        elif kind == "kv_step" and event.get("cache") in ("paged", "prefix"):
            self.source = "run"
        self.refresh()

    # -- actions -----------------------------------------------------------------------------------
    def action_tp(self, d: int) -> None:
        self.tp = max(1, min(64, self.tp * 2 if d > 0 else self.tp // 2))
        self.refresh()

    def action_pp(self, d: int) -> None:
        self.pp = max(1, min(self.model.layers, self.pp * 2 if d > 0 else self.pp // 2))
        self.refresh()

    def action_tokens(self, d: int) -> None:
        self.tokens = max(1, min(1 << 30, self.tokens * 2 if d > 0 else self.tokens // 2))
        self.refresh()

    def action_model(self) -> None:
        self.model_index = (self.model_index + 1) % len(self.presets)
        self.pp = min(self.pp, self.model.layers)
        self.refresh()

    def action_source(self) -> None:
        self.source = "run" if self.source == "sim" and (self.run.paged or self.run.prefix) else "sim"
        self.cursor = 0
        self.refresh()

    def action_slo(self, d: int) -> None:
        i = min(range(len(TPOT_SLOS)), key=lambda k: abs(TPOT_SLOS[k] - self.tpot_slo))
        self.tpot_slo = TPOT_SLOS[max(0, min(len(TPOT_SLOS) - 1, i + d))]
        self.refresh()

    def action_gpus(self, d: int) -> None:
        i = GPU_COUNTS.index(self.gpus) if self.gpus in GPU_COUNTS else 3
        self.gpus = GPU_COUNTS[max(0, min(len(GPU_COUNTS) - 1, i + d))]
        self.refresh()

    # -- drawing -----------------------------------------------------------------------------------
    def tr(self) -> Mapping[str, Any]:
        return strings("kv_cache", self.language)

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        width = max(40, width)
        if self.view in ("tp", "pp"):
            lines = self._shard_lines(width, height)
        elif self.view == "paged":
            lines = self._paged_lines(width, height)
        elif self.view == "prefix":
            lines = self._prefix_lines(width, height)
        else:
            lines = self._planner_lines(width, height)
        return self.fit_height(lines, height)

    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 80, size.height or None))

    # tp / pp --------------------------------------------------------------------------------------
    def _shard_lines(self, width: int, height: int | None) -> list[Text]:
        tr, m = self.tr(), self.model
        narrow = width < 80
        out = [Text(tr["tp_title_short" if narrow else "tp_title"].format(
            model=m.name, L=m.layers, H=m.kv_heads, tp=self.tp, pp=self.pp), style="bold")]
        try:
            owners = head_owners(m.kv_heads, self.tp)
        except ValueError as exc:
            out.append(Text(tr["invalid"].format(tp=self.tp, H=m.kv_heads, msg=exc), style="yellow"))
            out.append(Text(self.controls_hint(width, self.HINTS["shard"]), style="grey50"))
            return out
        pp = min(self.pp, m.layers)
        stages = layer_stage(m.layers, pp)
        rows_avail = max(4, min(16, (height or 40) - 8 - min(self.tp * pp, 16)))
        group = -(-m.layers // rows_avail)
        cols = m.kv_heads
        label_w = 8
        cell = max(1, min(6, (width - label_w - 2) // max(1, cols)))
        col_group = 1
        while cell < 2 and col_group < cols:
            col_group *= 2
            cell = max(1, min(6, (width - label_w - 2) // -(-cols // col_group)))
        out.append(Text(tr["axis"], style="grey50"))
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
                gpu = st * self.tp + own[0]
                label = (str(gpu) if len(own) == 1 else f"{gpu}×{len(own)}")
                if cell > 2:
                    line.append(label[: cell - 1].center(cell - 1), style=f"bold black on {_hue(gpu)}")
                    line.append(" ")
                else:
                    line.append(label[:cell].center(cell), style=f"bold black on {_hue(gpu)}")
            out.append(line)
        seqs = f"{self.tokens // 4096} × {format_integer(4096, self.language)}" if self.tokens % 4096 == 0 and self.tokens >= 4096 else "1 ×"
        total = f.kv_cache_total(m.layers, m.kv_heads, m.head_dim, m.dtype_bytes, self.tokens, self.tp, pp)
        out.append(Text(tr["tokens"].format(T=format_integer(self.tokens, self.language), seqs=seqs) + " · " + tr["per_token"].format(
            pt=_bytes(total["bytes_per_token"], self.language), pg=_bytes(total["per_gpu_bytes"] / self.tokens, self.language)), style="italic"))
        rows = shard_table(m, self.tp, pp, self.tokens)
        budget = (height or 100) - len(out) - 4
        for i, row in enumerate(rows):
            if i >= max(2, budget) and len(rows) - i > 1:
                out.append(Text(tr["more_gpus"].format(n=len(rows) - i), style="grey50"))
                break
            heads = row["kv_heads"]
            hs = f"{heads[0]}–{heads[-1]}" if len(heads) > 1 else str(heads[0])
            rep = f" ×{len(owners[heads[0]])}" if len(owners[heads[0]]) > 1 else ""
            text = Text("■ ", style=_hue(row["gpu"]))
            text.append(tr["gpu_row_short" if narrow else "gpu_row"].format(g=row["gpu"], l0=row["layers"][0], l1=row["layers"][-1], heads=hs,
                                             rep=rep, kv=_bytes(row["kv_bytes"], self.language), w=_bytes(row["weight_bytes"], self.language)))
            meas = self._measured_for(row)
            if meas is not None:
                text.append(tr["measured"].format(m=_bytes(meas, self.language)), style="bold magenta")
            out.append(text)
        if len(owners[0]) > 1:
            out.append(Text(tr["replicated"].format(n=len(owners[0]), H=m.kv_heads, tp=self.tp), style="yellow"))
        out.append(Text(self.controls_hint(width, self.HINTS["shard"]), style="grey50"))
        return out

    def _measured_for(self, row: dict):
        if self.model_index != len(self.presets) - 1 or self.model.name != self.presets[-1].name:
            return None
        mode = self.run.mode_of(self.tp, self.pp)
        ev = self.run.shards.get((mode, row["gpu"])) if mode else None
        if ev is None or int(ev.get("tokens", -1)) != self.tokens:
            return None
        return ev["bytes"]

    # paged ----------------------------------------------------------------------------------------
    def _paged_lines(self, width: int, height: int | None) -> list[Text]:
        tr = self.tr()
        steps, contig, n, bs, max_len = self.paged_steps()
        if not steps:
            return [Text("—")]
        total = max(len(steps), len(contig))
        k = min(self.cursor, total - 1)
        snap = steps[min(k, len(steps) - 1)]
        narrow = width < 80
        src = tr["src_run"] if self.source == "run" and self.run.paged else tr["src_sim"]
        out = [Text(tr["paged_title_short" if narrow else "paged_title"].format(
            n=n, bs=bs, k=k + 1, N=total, src=src), style="bold")]
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
        # contiguous
        if contig:
            ck = min(k, len(contig) - 1)
            cs = contig[ck]
            slots = len(cs.owners)
            out.append(Text(tr["contig_title"].format(s=slots, L=max_len), style="bold"))
            bar_w = max(10, width - 10)
            room = (height or 100) - len(out) - 3
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
            if k >= len(contig):
                out.append(Text(tr["contig_done"].format(N=len(contig)), style="grey50"))
        pm = paging.waste_summary(steps[: k + 1])["waste_fraction"]
        cm = paging.waste_summary(contig[: k + 1])["waste_fraction"] if contig else 0.0
        cw = contig[k].waste_fraction if k < len(contig) else 0.0
        lang = self.language
        out.append(Text(tr["waste_short" if narrow else "waste"].format(
            p=format_score(snap.waste_fraction, lang), c=format_score(cw, lang),
            pm=format_score(pm, lang), cm=format_score(cm, lang)), style="bold"))
        if self.run.kv_compare and self.source == "run":
            kc = self.run.kv_compare
            out.append(Text(tr["compare"].format(
                p=format_percent(kc["paged"]["waste_fraction"], lang=self.language),
                c=format_percent(kc["contiguous"]["waste_fraction"], lang=self.language),
                r=format_fixed(kc["throughput_ratio"], 2, self.language)), style="magenta"))
        out.append(Text(self.controls_hint(width, self.HINTS["paged"]), style="grey50"))
        return out

    # prefix sharing -------------------------------------------------------------------------------
    def _prefix_lines(self, width: int, height: int | None) -> list[Text]:
        tr = self.tr()
        steps, n, bs = self.prefix_steps()
        if not steps:
            return [Text("—")]
        k = min(self.cursor, len(steps) - 1)
        snap = steps[k]
        narrow = width < 80
        run = self.source == "run" and bool(self.run.prefix)
        src = tr["src_run"] if run else tr["src_sim"]
        pc = self.run.prefix_compare
        sp = int(pc.get("system_prompt", 0)) if run and pc else self.system_prompt
        out = [Text(tr["prefix_title_short" if narrow else "prefix_title"].format(
            n=n, bs=bs, sp=sp, k=k + 1, N=len(steps), src=src), style="bold")]
        lang = self.language
        short = "_short" if narrow else ""

        refs = snap.refs or [0 if o is None else 1 for o in snap.owners]
        shared = [r for r in refs if r > 1]
        status = Text("▶ " if self.playing else "❚❚ ", style="bold cyan")
        status.append(tr["prefix_status" + short].format(r=len(snap.running), w=len(snap.waiting), s=len(shared),
                                                         m=max(shared, default=1), c=len(snap.cached)))
        out.append(status)
        out.extend(prefix_pool_lines(snap, bs, width))
        out.append(Text(tr["legend_prefix" + short], style="grey50"))
        phys, logical = sum(1 for r in refs if r), sum(refs)
        saved = format_percent(1 - phys / logical if logical else 0.0, 2, lang)
        out.append(Text(tr["prefix_memory" + short].format(p=phys, l=logical, saved=saved), style="bold"))
        out.append(Text(tr["prefix_step" + short].format(t=snap.reused_tokens, cow=len(snap.cow), e=len(snap.evicted))))
        if run and pc:
            a, b = pc["no-sharing"], pc["prefix"]
            out.append(Text(tr["prefix_compare" + short].format(
                saved=format_percent(b["memory_saved"], 2, lang), pb=b["peak_blocks"], nb=a["peak_blocks"],
                t1=format_time(b["ttft_p50_s"], 3, lang), t0=format_time(a["ttft_p50_s"], 3, lang),
                r=format_number(pc["ttft_ratio"], 2, lang)), style="magenta"))
        elif not run:
            shared_ttft, plain_ttft = self.sim_prefix_ttft
            out.append(Text(tr["prefix_total" + short].format(
                r=format_integer(sum(s.reused_tokens for s in steps[: k + 1]), lang),
                T=format_integer(self.sim_prompt_tokens, lang),
                a=format_number(sum(shared_ttft.values()) / len(shared_ttft), 2, lang),
                b=format_number(sum(plain_ttft.values()) / len(plain_ttft), 2, lang))))
        out.append(Text(self.controls_hint(width, self.HINTS["prefix"]), style="grey50"))
        return out

    # planner --------------------------------------------------------------------------------------
    def _planner_lines(self, width: int, height: int | None) -> list[Text]:
        tr = self.tr()
        res = self.plan()
        m = self.model
        narrow = width < 80
        slo = format_time(self.tpot_slo, lang=self.language)
        out = [Text(tr["planner_title_short" if narrow else "planner_title"].format(
            model=m.name, G=self.gpus, slo=slo), style="bold")]
        cands = [c for c in res["accepted"] + res["rejected"] if c.curve]
        cands.sort(key=lambda c: (c.tp, c.pp))
        best = res["best"]
        if best is not None:
            out.append(Text(tr["best"].format(cfg=f"{best.tp}×{best.pp}×{best.replicas}", b=best.batch,
                                              tpot=format_time(best.tpot_s, lang=self.language),
                                              thr=format_integer(best.throughput_tokens_per_s, self.language)), style="bold green"))
        else:
            out.append(Text(tr["none"], style="bold yellow"))
        chart_h = max(6, min(16, (height or 30) - 8 - len(cands) // 3 - 2))
        chart_w = max(20, width - 9)
        x_max = 2 * self.tpot_slo
        pts = [(i, t, thr) for i, c in enumerate(cands) for (_n, t, thr) in c.curve if t <= x_max]
        if pts:
            y_lo = min(p[2] for p in pts)
            y_hi = max(p[2] for p in pts)
        else:
            y_lo, y_hi = 1.0, 10.0
        y_lo, y_hi = max(1e-9, y_lo * 0.8), y_hi * 1.25
        ly_lo, ly_hi = math.log10(y_lo), math.log10(y_hi)
        grid = [[(" ", "")] * chart_w for _ in range(chart_h)]
        slo_col = min(chart_w - 1, int(self.tpot_slo / x_max * (chart_w - 1)))
        for r in range(chart_h):
            grid[r][slo_col] = ("┆", "yellow")
        pts.sort(key=lambda p: (best is not None and cands[p[0]] is best, cands[p[0]].accepted))
        for i, t, thr in pts:
            c = cands[i]
            col = min(chart_w - 1, int(t / x_max * (chart_w - 1)))
            row = chart_h - 1 - int((math.log10(thr) - ly_lo) / (ly_hi - ly_lo) * (chart_h - 1))
            row = max(0, min(chart_h - 1, row))
            style = f"bold {_hue(i)}" if c.accepted else _hue(i)
            if best is not None and c is best:
                style += " reverse"
            grid[row][col] = (MARKERS[i % len(MARKERS)], style)
        out.append(Text(tr["y_axis"] + " ↑", style="grey50"))
        for r in range(chart_h):
            y = 10 ** (ly_hi - r / (chart_h - 1) * (ly_hi - ly_lo))
            label = format_integer(y, self.language).rjust(7) if r in (0, chart_h - 1, chart_h // 2) else " " * 7
            line = Text(label + "│", style="grey62")
            for ch, st in grid[r]:
                line.append(ch, style=st)
            out.append(line)
        axis = Text(" " * 7 + "└" + "─" * chart_w, style="grey62")
        out.append(axis)
        ticks = Text(" " * 8)
        end_txt = f"{format_plain(x_max * 1e3, self.language)} ms"
        tick_txt = [(0, "0"), (slo_col, format_plain(self.tpot_slo * 1e3, self.language)), (chart_w - len(end_txt), end_txt)]
        pos = 0
        for col, txt in tick_txt:
            if col >= pos:
                ticks.append(" " * (col - pos))
                ticks.append(txt, style="yellow" if txt == format_plain(self.tpot_slo * 1e3, self.language) and col == slo_col else "grey62")
                pos = col + len(txt)
        if len(ticks.plain) + len(tr["x_axis"]) + 2 <= width:
            ticks.append("  " + tr["x_axis"], style="grey50")
        out.append(ticks)
        legend: list[Text] = []
        for i, c in enumerate(cands):
            item = Text(f"{MARKERS[i % len(MARKERS)]} ", style=f"bold {_hue(i)}")
            item.append(f"{c.tp}×{c.pp}×{c.replicas}")
            item.append(" ✓" if c.accepted else f" {tr['reasons'][c.reason]}", style="green" if c.accepted else "yellow")
            legend.append(item)
        col_w = 16 if width >= 64 else 14
        per_line = max(1, width // col_w)
        for j in range(0, len(legend), per_line):
            line = Text()
            for item in legend[j:j + per_line]:
                line.append_text(item)
                line.append(" " * max(1, col_w - len(item.plain)))
            out.append(line)
        no_fit = [c for c in res["rejected"] if not c.curve]
        for c in no_fit[:3]:
            cfg = f"{c.tp}×{c.pp}×{c.replicas}"
            if c.reason == "memory" and c.free_bytes is not None and c.free_bytes <= 0:
                msg = tr["no_fit"].format(cfg=cfg, w=_bytes(c.weights_per_gpu_bytes, self.language), u=_bytes(c.usable_bytes, self.language))
            elif c.reason == "memory":
                msg = tr["no_kv"].format(cfg=cfg, kv=_bytes(c.kv_per_seq_per_gpu_bytes, self.language))
            else:
                msg = f"{cfg} {tr['reasons'][c.reason]}: {c.detail}"
            out.append(Text(msg, style="yellow"))
        out.append(Text(self.controls_hint(width, self.HINTS["planner"]), style="grey50"))
        return out


VISUALIZER = KVCacheVisualizer
