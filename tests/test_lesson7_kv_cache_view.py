"""Lesson 7's view model (``lessons/lesson7/kv_cache_view.py``) alone, no Textual: the states the
keys, the steps and a run's events lead to, and the figures drawn, against the scheduler, the
formulas and the planner."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from distai.lessons.lesson7 import kv_cache_view as kv
from distai.lessons.lesson7 import paging
from distai.lessons.registry import step_view


@pytest.fixture(scope="module")
def view():
    return kv.KVCacheView()


def test_the_view_model_loads_without_textual_or_torch():
    code = "import sys, distai.lessons.lesson7.kv_cache_view; print('textual' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_keys_double_and_halve_within_their_ranges(view):
    state = kv.KVState()
    assert kv.with_tp(state, 1).tp == 8 and kv.with_tp(replace(state, tp=1), -1).tp == 1
    assert kv.with_tokens(state, 1).tokens == 2 * state.tokens
    deep = state
    for _ in range(10):
        deep = view.with_pp(deep, 1)
    assert deep.pp == view.model(deep).layers == 80  # no more stages than layers
    smaller = view.next_model(deep)  # Llama-2-13B: 40 layers, the stages follow
    assert view.model(smaller).name == kv.PRESETS[1].name and smaller.pp == 40
    assert kv.with_slo(state, -1).tpot_slo == 0.04 and kv.with_slo(state, 1).tpot_slo == 0.075
    assert kv.with_slo(replace(state, tpot_slo=kv.TPOT_SLOS[-1]), 1).tpot_slo == kv.TPOT_SLOS[-1]
    assert [kv.with_gpus(state, d).gpus for d in (-1, 1)] == [4, 16]


def test_steps_pick_views_and_meshes():
    state = kv.show_step(kv.KVState(), step_view("kv-cache", "pp-decode"))
    assert (state.view, state.tp, state.pp) == ("pp", 1, 4)
    assert kv.show_step(state, {}) == state


def test_paged_figures_are_the_schedulers_wastes(view):
    state = kv.KVState(view="paged")
    total = view.paged_total(state)
    assert total == max(len(view.sim_paged), len(view.sim_contig))
    for k in (0, 5, total - 1):
        fig = view.paged(replace(state, cursor=k))
        assert fig.k == k and fig.snap is view.sim_paged[min(k, len(view.sim_paged) - 1)]
        assert fig.paged_mean == paging.waste_summary(view.sim_paged[: k + 1])["waste_fraction"]
        assert fig.contig_mean == paging.waste_summary(view.sim_contig[: k + 1])["waste_fraction"]
    end = view.paged(view.to_end(state))
    assert end.contig_mean > end.paged_mean  # what the step teaches
    # playing loops over the iterations, and only in the pool views
    looped = state
    for _ in range(total):
        looped = view.advance(looped)
    assert looped.cursor == 0 and view.advance(kv.KVState(view="tp")).cursor == 0
    assert view.seek(state, -5).cursor == 0 and view.seek(state, 10 ** 6).cursor == total - 1


def test_prefix_figures_count_the_blocks_held(view):
    state = kv.KVState(view="prefix")
    for k in range(len(view.sim_prefix)):
        fig = view.prefix(replace(state, cursor=k))
        snap = view.sim_prefix[k]
        assert fig.physical == sum(1 for r in snap.refs if r) and fig.logical == sum(snap.refs)
        assert fig.reused_so_far == sum(s.reused_tokens for s in view.sim_prefix[: k + 1])
    assert max(max(view.prefix(replace(state, cursor=k)).shared, default=1) for k in range(len(view.sim_prefix))) > 1


def test_the_planner_chart_places_every_curve_point_under_the_axes(view):
    state = kv.KVState(view="planner")
    res = view.plan(state)
    chart = view.planner_chart(state, 60, 12)
    assert chart.best is res["best"] and chart.x_max == 2 * state.tpot_slo
    assert {(c.tp, c.pp) for c in chart.candidates} == {(c.tp, c.pp) for c in res["accepted"] + res["rejected"] if c.curve}
    shown = sum(1 for c in chart.candidates for (_b, t, _thr) in c.curve if t <= chart.x_max)
    assert len(chart.points) == shown and all(0 <= p.col < 60 and 0 <= p.row < 12 for p in chart.points)
    assert chart.slo_col == int(0.5 * 59)  # the target sits halfway along the 2×target axis
    if chart.best is not None:  # the best configuration is drawn last, on top
        assert chart.candidates[chart.points[-1].candidate] is chart.best
    assert chart.y_at(0, 12) > chart.y_at(11, 12)


def test_a_run_adds_its_model_mesh_and_pools():
    view, state = kv.KVCacheView(), kv.KVState()
    state = view.feed(state, {"kind": "config", "W": 2, "hidden": 64, "layers": 4, "heads": 8, "kv_heads": 4,
                              "head_dim": 8, "dtype": "float32", "params": 1e5}, "run")
    assert view.model(state).name == "run" and view.model(state).dtype_bytes == 4
    shard = {"kind": "kv_shard", "mode": "tp", "rank": 0, "layers": [0, 1, 2, 3], "kv_heads": [0, 1],
             "bytes": 12345, "formula_bytes": 12345, "tokens": 100}
    state = view.feed(state, shard, "run")
    assert (state.tp, state.pp, state.tokens) == (2, 1, 100)
    rows = kv.shard_table(view.model(state), state.tp, state.pp, state.tokens)
    assert view.measured_for(state, rows[0]) == 12345
    assert view.measured_for(view.next_model(state), rows[0]) is None  # a preset: nothing measured
    assert view.feed(state, {"kind": "no such kind"}, "run") is None
    step = {"kind": "kv_step", "cache": "paged", "step": 0, "num_blocks": 4, "block_size": 4, "allocated": [0, 1],
            "freed": [], "running": [7], "waiting": [], "admitted": [7], "finished": [], "preempted": [],
            "tables": {"7": [0, 1]}, "lengths": {"7": 6}, "tokens_stored": 6, "reserved_tokens": 8}
    state = view.feed(state, step, "run")
    assert state.source == "run" and view.paged_steps(state)[2:4] == (4, 4)
    assert view.switch_source(state).source == "sim" and view.switch_source(view.switch_source(state)).source == "run"
