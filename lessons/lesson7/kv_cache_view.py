"""Lesson 7's visualizer, what it shows: its settings (:class:`KVState`), how keys, the lesson's
steps and a run's events move them, and the figures drawn (:class:`KVCacheView`): the KV cache's
layout over TP × PP GPUs (``formulas.py``), the paged, contiguous and prefix-sharing pools over
time (``paging.py``, the scheduler the engine uses, on a synthetic request mix or the run's own
``kv_step`` events folded by ``serving_run.py``), and the planner's chart (``planner.py``). Pure:
the widget (``visualizers/kv_cache.py``) holds a state in its reactive attributes and draws.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import formulas as f
from . import paging
from . import planner as pl
from .events import CONFIG, KV_SHARD, KV_STEP
from .serving_run import ServingRun

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


# -- the layouts (tested directly) ---------------------------------------------------------------
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


# -- the state and its moves ---------------------------------------------------------------------
@dataclass(frozen=True)
class KVState:
    """The settings of the KV-cache visualizer (every field a reactive of the widget)."""

    view: str = "tp"  # tp, pp, paged, prefix, planner
    model_index: int = 0
    tp: int = 4
    pp: int = 1
    tokens: int = 64 * 4096
    cursor: int = 0  # the paged and prefix views: the scheduler iteration shown
    source: str = "sim"  # or "run"
    tpot_slo: float = 0.05
    gpus: int = 8


def _nearest_step(choices: tuple, value: float, d: int) -> float:
    i = min(range(len(choices)), key=lambda k: abs(choices[k] - value))
    return choices[max(0, min(len(choices) - 1, i + d))]


def with_tp(state: KVState, d: int) -> KVState:
    return replace(state, tp=max(1, min(64, state.tp * 2 if d > 0 else state.tp // 2)))


def with_tokens(state: KVState, d: int) -> KVState:
    return replace(state, tokens=max(1, min(1 << 30, state.tokens * 2 if d > 0 else state.tokens // 2)))


def with_slo(state: KVState, d: int) -> KVState:
    return replace(state, tpot_slo=_nearest_step(TPOT_SLOS, state.tpot_slo, d))


def with_gpus(state: KVState, d: int) -> KVState:
    i = GPU_COUNTS.index(state.gpus) if state.gpus in GPU_COUNTS else 3
    return replace(state, gpus=GPU_COUNTS[max(0, min(len(GPU_COUNTS) - 1, i + d))])


def show_step(state: KVState, view: dict) -> KVState:
    """The state a lesson step's ``view = {...}`` asks for (``show``, and ``tp`` with ``pp``)."""
    if not view:
        return state
    state = replace(state, view=view["show"])
    return replace(state, tp=view["tp"], pp=view["pp"]) if "tp" in view else state


@dataclass(frozen=True)
class PagedFigures:
    """The paged view at one iteration: the snapshots shown and the wastes (now and on average so far)."""

    k: int  # the iteration shown
    total: int
    snap: paging.Snapshot
    contig: paging.Snapshot | None
    paged_waste: float
    contig_waste: float
    paged_mean: float
    contig_mean: float


@dataclass(frozen=True)
class PrefixFigures:
    """The prefix-sharing view at one iteration."""

    k: int
    refs: list[int]  # per block, the requests holding it
    shared: list[int]  # the reference counts above one
    physical: int  # blocks held
    logical: int  # blocks the tables name
    reused_so_far: int  # prompt tokens found cached up to this iteration


@dataclass(frozen=True)
class PlannerPoint:
    candidate: int  # index into the chart's candidates
    col: int
    row: int


@dataclass(frozen=True)
class PlannerChart:
    """The planner's throughput against TPOT, laid out on a ``width`` × ``height`` grid: log y axis."""

    candidates: list[pl.Candidate]  # with a curve, by (tp, pp)
    best: pl.Candidate | None
    points: list[PlannerPoint]  # drawn in this order (the best last, on top)
    slo_col: int
    x_max: float
    log_lo: float
    log_hi: float

    def y_at(self, row: int, height: int) -> float:
        """The throughput at ``row`` (0 the top)."""
        return 10 ** (self.log_hi - row / (height - 1) * (self.log_hi - self.log_lo))


class KVCacheView:
    """The figures of a :class:`KVState`: the models, the simulated pools and the learner's run."""

    BLOCK_SIZE, NUM_BLOCKS = 8, 48
    SYSTEM_PROMPT = 29  # 3 full blocks of 8 and 5 tokens: the 4th block is copied on write
    TTFT_SLO = 1.0

    def __init__(self) -> None:
        self.presets: list[ModelPreset] = list(PRESETS)
        self.run = ServingRun()
        self._plan_cache: dict = {}
        bs, nb = self.BLOCK_SIZE, self.NUM_BLOCKS
        # paged model: the same scheduler the engine uses, on a synthetic request mix
        reqs = paging.poisson_requests(24, 0.6, prompt_range=(4, 40), output_range=(4, 56), seed=3)
        self.max_len = max(r.prompt_len + r.output_len - 1 for r in reqs)
        self.sim_paged = paging.simulate(reqs, paging.BlockAllocator(nb, bs), 16)
        self.sim_contig = paging.simulate(reqs, paging.ContiguousAllocator(nb * bs // self.max_len, self.max_len), 16)
        # prefix sharing: every request starts with the same system prompt (token ids needed)
        shared = paging.poisson_requests(24, 0.6, prompt_range=(2, 16), output_range=(4, 40), seed=3, vocab=64,
                                         system_prompt=self.SYSTEM_PROMPT)
        self.sim_prefix = paging.simulate(shared, paging.PrefixCachingAllocator(nb, bs), 16)
        self.sim_prefix_ttft = (ttft_iterations(shared, self.sim_prefix), ttft_iterations(
            shared, paging.simulate(shared, paging.BlockAllocator(nb, bs), 16)))
        self.sim_prompt_tokens = sum(r.prompt_len for r in shared)

    # -- what is shown ---------------------------------------------------------------------------
    def model(self, state: KVState) -> ModelPreset:
        return self.presets[state.model_index % len(self.presets)]

    def plan(self, state: KVState) -> dict:
        model = self.model(state)
        key = (model, state.gpus, state.tpot_slo)
        if key not in self._plan_cache:
            wl = pl.Workload(prompt=2048, output=2048, ttft_slo=self.TTFT_SLO, tpot_slo=state.tpot_slo)
            self._plan_cache[key] = pl.plan(model.spec(), pl.h100_node(state.gpus), wl)
        return self._plan_cache[key]

    def paged_steps(self, state: KVState) -> tuple[list[paging.Snapshot], list[paging.Snapshot], int, int, int]:
        """(paged snapshots, contiguous snapshots, blocks, block size, max_len) of the shown source."""
        run = self.run
        if state.source == "run" and run.paged and run.paged_pool:
            n, bs = run.paged_pool
            return run.paged, run.contiguous, n, bs, run.contiguous_len or bs
        return self.sim_paged, self.sim_contig, self.NUM_BLOCKS, self.BLOCK_SIZE, self.max_len

    def prefix_steps(self, state: KVState) -> tuple[list[paging.Snapshot], int, int]:
        """(snapshots, blocks, block size) of the shown source, with prefix sharing."""
        if state.source == "run" and self.run.prefix and self.run.prefix_pool:
            n, bs = self.run.prefix_pool
            return self.run.prefix, n, bs
        return self.sim_prefix, self.NUM_BLOCKS, self.BLOCK_SIZE

    def paged_total(self, state: KVState) -> int:
        if state.view == "prefix":
            return len(self.prefix_steps(state)[0])
        steps, contig = self.paged_steps(state)[:2]
        return max(len(steps), len(contig))

    def measured_for(self, state: KVState, row: dict) -> float | None:
        """The bytes the run measured on ``row``'s GPU, when the run's model, mesh and tokens are shown."""
        if state.model_index != len(self.presets) - 1 or self.model(state).name != self.presets[-1].name:
            return None
        mode = self.run.mode_of(state.tp, state.pp)
        ev = self.run.shards.get((mode, row["gpu"])) if mode else None
        if ev is None or int(ev.get("tokens", -1)) != state.tokens:
            return None
        return ev["bytes"]

    def paged(self, state: KVState) -> PagedFigures | None:
        steps, contig = self.paged_steps(state)[:2]
        if not steps:
            return None
        total = max(len(steps), len(contig))
        k = min(state.cursor, total - 1)
        snap = steps[min(k, len(steps) - 1)]
        return PagedFigures(
            k=k, total=total, snap=snap, contig=contig[min(k, len(contig) - 1)] if contig else None,
            paged_waste=snap.waste_fraction, contig_waste=contig[k].waste_fraction if k < len(contig) else 0.0,
            paged_mean=paging.waste_summary(steps[: k + 1])["waste_fraction"],
            contig_mean=paging.waste_summary(contig[: k + 1])["waste_fraction"] if contig else 0.0)

    def prefix(self, state: KVState) -> PrefixFigures | None:
        steps = self.prefix_steps(state)[0]
        if not steps:
            return None
        k = min(state.cursor, len(steps) - 1)
        snap = steps[k]
        refs = snap.refs or [0 if o is None else 1 for o in snap.owners]
        return PrefixFigures(k=k, refs=refs, shared=[r for r in refs if r > 1], physical=sum(1 for r in refs if r),
                             logical=sum(refs), reused_so_far=sum(s.reused_tokens for s in steps[: k + 1]))

    def planner_chart(self, state: KVState, width: int, height: int) -> PlannerChart:
        res = self.plan(state)
        cands = sorted((c for c in res["accepted"] + res["rejected"] if c.curve), key=lambda c: (c.tp, c.pp))
        best = res["best"]
        x_max = 2 * state.tpot_slo
        pts = [(i, t, thr) for i, c in enumerate(cands) for (_n, t, thr) in c.curve if t <= x_max]
        y_lo, y_hi = (min(p[2] for p in pts), max(p[2] for p in pts)) if pts else (1.0, 10.0)
        ly_lo, ly_hi = math.log10(max(1e-9, y_lo * 0.8)), math.log10(y_hi * 1.25)
        pts.sort(key=lambda p: (best is not None and cands[p[0]] is best, cands[p[0]].accepted))
        points = []
        for i, t, thr in pts:
            col = min(width - 1, int(t / x_max * (width - 1)))
            row = height - 1 - int((math.log10(thr) - ly_lo) / (ly_hi - ly_lo) * (height - 1))
            points.append(PlannerPoint(i, col, max(0, min(height - 1, row))))
        return PlannerChart(cands, best, points, min(width - 1, int(state.tpot_slo / x_max * (width - 1))),
                            x_max, ly_lo, ly_hi)

    # -- what moves it ---------------------------------------------------------------------------
    def feed(self, state: KVState, event: dict, run_model_name: str) -> KVState | None:
        """Fold ``event`` into the run; the state after it, or None when it changed nothing. The run's
        model (named ``run_model_name``) joins the presets and is shown, its mesh and tokens too."""
        run = self.run
        if not run.feed(event):
            return None
        if CONFIG.matches(event):
            model = ModelPreset(run_model_name, float(event.get("params", 0)), int(event["layers"]),
                                int(event["hidden"]), int(event["heads"]), int(event["kv_heads"]),
                                int(event["head_dim"]), run.dtype_bytes())
            self.presets = [p for p in self.presets if p.name != model.name] + [model]
            return replace(state, model_index=len(self.presets) - 1)
        if KV_SHARD.matches(event):
            tp, pp = run.mesh(event)
            state = replace(state, tp=tp, pp=pp)
            return replace(state, tokens=int(event["tokens"])) if run.config else state
        if KV_STEP.matches(event) and event.get("cache") in ("paged", "prefix"):
            return replace(state, source="run")
        return state

    def with_pp(self, state: KVState, d: int) -> KVState:
        return replace(state, pp=max(1, min(self.model(state).layers, state.pp * 2 if d > 0 else state.pp // 2)))

    def next_model(self, state: KVState) -> KVState:
        state = replace(state, model_index=(state.model_index + 1) % len(self.presets))
        return replace(state, pp=min(state.pp, self.model(state).layers))

    def switch_source(self, state: KVState) -> KVState:
        run = state.source == "sim" and bool(self.run.paged or self.run.prefix)
        return replace(state, source="run" if run else "sim", cursor=0)

    def advance(self, state: KVState) -> KVState:
        """One scheduler iteration on, looping (the paged and prefix views only)."""
        if state.view not in ("paged", "prefix"):
            return state
        return replace(state, cursor=(state.cursor + 1) % max(1, self.paged_total(state)))

    def seek(self, state: KVState, frames: int) -> KVState:
        return replace(state, cursor=max(0, min(self.paged_total(state) - 1, state.cursor + frames)))

    def to_end(self, state: KVState) -> KVState:
        return replace(state, cursor=max(0, self.paged_total(state) - 1))
