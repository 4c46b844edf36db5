"""Lesson 7 visualizer: the grids are the formulas' and the engine's layout, the paged view is the
scheduler's pool, the chart is the planner's, keys change what is drawn."""
from __future__ import annotations

import asyncio

import pytest

from distai.lessons.lesson7 import formulas as f
from distai.lessons.lesson7 import paging
from distai.lessons.lesson7 import planner as pl
from distai.lessons.units import format_integer
from distai.visualizers.base import visualizer_class
from distai.visualizers.kv_cache import (
    PRESETS,
    KVCacheVisualizer,
    head_owners,
    layer_stage,
    shard_table,
)
from pilot_harness import drawn_text, mounted


def _text(viz, width=100, height=None) -> str:
    return drawn_text(viz, width, height)


def test_registered_under_its_lesson_name():
    assert visualizer_class("kv-cache") is KVCacheVisualizer


@pytest.mark.parametrize("layers,pp", [(4, 2), (5, 2), (80, 8), (7, 3), (4, 4)])
def test_layer_stages_are_the_engines(layers, pp):
    from distai.engine.inference import split_layers

    stages = layer_stage(layers, pp)
    assert [list(r) for r in split_layers(layers, pp)] == \
        [[i for i, s in enumerate(stages) if s == k] for k in range(pp)]


@pytest.mark.parametrize("kv,tp", [(8, 4), (8, 8), (4, 2), (1, 2), (2, 4), (8, 16)])
def test_head_owners_are_the_engines(kv, tp):
    import torch

    from distai.engine.inference import DecoderShard, build_model
    from distai.lessons.model_size import ModelSize

    owners = head_owners(kv, tp)
    cfg = ModelSize.preset("llama-tiny", vocab=16, hidden=8 * 16, layers=1, heads=16, kv_heads=kv)
    w = build_model(cfg, dtype=torch.float32)
    for r in range(tp):
        sh = DecoderShard(cfg, w, tp_rank=r, tp_size=tp)
        mine = [h for h, o in enumerate(owners) if r in o]
        assert mine == list(range(sh.kv0, sh.kv0 + sh.kv_local))


@pytest.mark.parametrize("tp,pp", [(1, 1), (4, 1), (1, 4), (2, 2), (8, 2), (16, 1)])
def test_shard_table_bytes_are_the_formulas(tp, pp):
    m = PRESETS[0]  # Llama-2-70B
    tokens = 4096
    rows = shard_table(m, tp, pp, tokens)
    assert len(rows) == tp * pp
    want = f.kv_cache_total(m.layers, m.kv_heads, m.head_dim, 2, tokens, tp, pp)
    assert max(r["kv_bytes"] for r in rows) == want["per_gpu_bytes"]
    if tp <= m.kv_heads:
        assert sum(r["kv_bytes"] for r in rows) == want["total_bytes"]
    else:
        assert sum(r["kv_bytes"] for r in rows) == want["total_bytes"] * tp // m.kv_heads
    assert sum(r["weight_bytes"] for r in rows) == pytest.approx(m.params * 2)


def test_tp_grid_colours_each_gpu_its_heads():
    viz = KVCacheVisualizer()
    viz.tp, viz.pp = 4, 2
    lines = viz.build_lines(100, 60)
    grid = [ln for ln in lines if ln.plain.startswith("L")]
    assert grid
    first = grid[0].plain[8:].split()  # GPU labels of the first row of layers: stage 0
    last = grid[-1].plain[8:].split()
    assert first == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert last == ["4", "4", "5", "5", "6", "6", "7", "7"]
    text = _text(viz, 100, 60)
    per_gpu = f.kv_cache_total(80, 8, 128, 2, viz.tokens, 4, 2)["per_gpu_bytes"]
    assert f"{per_gpu / 1e9:.3g} GB KV" in text


def test_replicated_heads_are_marked():
    viz = KVCacheVisualizer()
    viz.tp, viz.pp = 16, 1
    text = _text(viz, 100, 80)
    assert "×2" in text and "each head stored on 2 GPUs" in text
    viz.tp = 3
    assert "does not fit" in _text(viz) or "cannot" in _text(viz)


def test_paged_view_draws_the_schedulers_pool():
    viz = KVCacheVisualizer()
    viz.view = "paged"
    viz.playing = False
    for k in (0, 10, 40, len(viz.sim_paged) - 1):
        viz.cursor = k
        snap = viz.sim_paged[k]
        lines = viz.build_lines(100, 80)
        pool = "".join(ln.plain for ln in lines[2:2 + -(-viz.num_blocks // 33)])
        assert pool.count("··") == sum(o is None for o in snap.owners)
        text = _text(viz, 100, 80)
        assert f"paged {snap.waste_fraction:.0%}" in text
        assert f"running {len(snap.running)} · waiting {len(snap.waiting)}" in text


def test_paged_view_contiguous_wastes_more():
    viz = KVCacheVisualizer()
    p = paging.waste_summary(viz.sim_paged)["waste_fraction"]
    c = paging.waste_summary(viz.sim_contig)["waste_fraction"]
    assert p < c
    viz.view = "paged"
    viz.cursor = max(len(viz.sim_paged), len(viz.sim_contig)) - 1
    assert f"mean: paged {p:.0%} · contiguous {c:.0%}" in _text(viz, 100, 80)


def test_prefix_view_draws_shared_blocks_and_their_counts():
    viz = KVCacheVisualizer()
    viz.view = "prefix"
    viz.playing = False
    seen_shared = seen_cached = False
    for k in range(len(viz.sim_prefix)):
        viz.cursor = k
        snap = viz.sim_prefix[k]
        lines = viz.build_lines(100, 80)
        pool = " ".join(ln.plain for ln in lines[2:2 + -(-viz.num_blocks // 33)]).split()
        assert len(pool) == viz.num_blocks
        for b, cell in enumerate(pool):
            if snap.refs[b] > 1:
                assert cell == (f"×{snap.refs[b]}" if snap.refs[b] < 10 else str(snap.refs[b]))
                seen_shared = True
            elif b in snap.cached:
                assert cell == "░░" and snap.owners[b] is None
                seen_cached = True
            elif snap.refs[b] == 0:
                assert cell == "··"
        phys, logical = sum(1 for r in snap.refs if r), sum(snap.refs)
        assert f"in use: {phys} blocks hold what {logical} would unshared" in _text(viz, 100, 80)
    assert seen_shared and seen_cached
    # the simulated TTFT: sharing admits requests sooner than the same pool unshared
    shared, plain = viz.sim_prefix_ttft
    assert sum(shared.values()) < sum(plain.values())


def test_planner_view_is_the_planners_ranking():
    viz = KVCacheVisualizer()
    viz.view = "planner"
    res = pl.plan(PRESETS[0].spec(), pl.h100_node(8), pl.Workload(ttft_slo=1.0, tpot_slo=0.05))
    best = res["best"]
    text = _text(viz, 100, 40)
    assert f"best: {best.tp}×{best.pp}×{best.replicas}" in text
    assert f"{format_integer(best.throughput_tokens_per_s)} tokens/s" in text  # 9903: four digits whole
    assert "1×1×8 does not fit" in text
    for c in res["accepted"]:
        assert f"{c.tp}×{c.pp}×{c.replicas} ✓" in text


def test_keys():
    asyncio.run(_keys())


async def _keys():
    async with mounted(KVCacheVisualizer, size=(110, 50)) as (pilot, viz):
        await pilot.press("right_square_bracket", "right_curly_bracket")
        assert (viz.tp, viz.pp) == (8, 2)
        await pilot.press("left_square_bracket", "left_square_bracket", "left_curly_bracket")
        assert (viz.tp, viz.pp) == (2, 1)
        tokens = viz.tokens
        await pilot.press("k")
        assert viz.tokens == 2 * tokens
        await pilot.press("m")
        assert viz.model.name == PRESETS[1].name
        await pilot.press("3")
        assert viz.view == "paged"
        await pilot.press("space")
        assert viz.playing is False
        start = viz.cursor  # the animation may have moved it before the pause
        await pilot.press("full_stop", "full_stop")
        assert viz.cursor == start + 2
        await pilot.press("5")
        assert viz.view == "prefix" and "prefix sharing" in _text(viz)
        await pilot.press("4")
        assert viz.view == "planner"
        await pilot.press("s")
        assert viz.tpot_slo < 0.05
        await pilot.press("S", "S")
        assert viz.tpot_slo > 0.05
        await pilot.press("d")
        assert viz.gpus == 16
        await pilot.press("g")
        assert viz.view == "tp"


def test_steps_pick_views_and_spanish():
    viz = KVCacheVisualizer(language="es")
    viz.show_step("pp-decode")
    assert viz.view == "pp" and (viz.tp, viz.pp) == (1, 4)
    assert "capas" in _text(viz)
    viz.show_step("paged")
    assert viz.view == "paged" and "paginada" in _text(viz)
    viz.show_step("prefix")
    assert viz.view == "prefix" and "bloques compartidos" in _text(viz)
    viz.show_step("planner")
    assert viz.view == "planner" and "no cabe" in _text(viz)


def test_feed_events_switch_to_the_run():
    viz = KVCacheVisualizer()
    viz.feed_event({"kind": "config", "W": 2, "hidden": 64, "layers": 4, "heads": 8, "kv_heads": 4, "head_dim": 8,
                    "dtype": "float32", "params": 1e5})
    viz.feed_event({"kind": "kv_shard", "mode": "tp", "rank": 0, "layers": [0, 1, 2, 3], "kv_heads": [0, 1],
                    "bytes": 12345, "formula_bytes": 12345, "tokens": 100})
    assert viz.model.name == "the run's model" and (viz.tp, viz.pp) == (2, 1) and viz.tokens == 100
    assert "measured 12.3 kB" in _text(viz)
    viz.feed_event({"kind": "kv_step", "cache": "paged", "step": 0, "num_blocks": 4, "block_size": 4,
                    "allocated": [0, 1], "freed": [], "running": [7], "waiting": [], "admitted": [7],
                    "finished": [], "preempted": [], "tables": {"7": [0, 1]}, "lengths": {"7": 6},
                    "tokens_stored": 6, "reserved_tokens": 8})
    assert viz.source == "run" and viz.run.paged[0].fills == [4, 2, 0, 0]
    viz.view = "paged"
    text = _text(viz)
    assert "(run)" in text and "07" in text and "paged 25%" in text
