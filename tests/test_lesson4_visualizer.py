"""Lesson 4's flow model and its visualizer: what is drawn is what the engine and formulas say."""
from __future__ import annotations

import math

import pytest

from distai.lessons.lesson4 import flow as F
from distai.lessons.lesson4.formulas import tp_comm_per_layer
from distai.lessons.registry import resolve_lesson, step_view
from distai.visualizers.base import visualizer_class
from distai.visualizers.tp_block import TPBlockVisualizer
from pilot_harness import async_test, mounted


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("t", [2, 4, 8])
def test_flow_collectives_match_formula(sp, t):
    stages = [s for s in F.block_flow(sp) if not (s.site or "").endswith(".regather")]
    h, s_, b, e = 64, 32, 2, 2
    f = tp_comm_per_layer(h, s_, b, t, sp, bytes_per_elem=e)
    assert F.count_collectives(stages, "fwd") == f["forward"]
    assert F.count_collectives(stages, "bwd") == f["backward"]
    tensor = s_ * b * h * e
    for phase, key in (("fwd", "forward_bytes_per_rank"), ("bwd", "backward_bytes_per_rank")):
        sent = sum(F.ring_bytes_per_rank(x.op, tensor, t) for x in stages if x.op and x.phase == phase)
        assert sent == pytest.approx(f[key])


def test_flow_shapes_and_layouts():
    for sp in (False, True):
        st = {(x.key, x.phase): x for x in F.block_flow(sp)}
        assert st[("attn.qkv", "fwd")].split == "column" and st[("attn.qkv", "fwd")].layout == F.HEADS
        assert st[("attn.wo", "fwd")].split == "row" and st[("attn.wo", "fwd")].layout == F.PARTIAL
        assert st[("mlp.fc1", "fwd")].layout == F.HIDDEN and st[("mlp.fc2", "fwd")].layout == F.PARTIAL
        ln_layout = F.SEQUENCE if sp else F.REPLICATED
        assert st[("ln1", "fwd")].layout == ln_layout and st[("ln2", "fwd")].layout == ln_layout
        assert (("sp.grads", "grad-sync") in st) == sp
    # the backward swaps each collective: f is identity forward / all-reduce backward, g the reverse
    tp = {(x.key, x.phase): x.op for x in F.block_flow(False)}
    for blk in ("attn", "mlp"):
        assert tp[(f"{blk}.f", "fwd")] is None and tp[(f"{blk}.f", "bwd")] == "all_reduce"
        assert tp[(f"{blk}.g", "fwd")] == "all_reduce" and tp[(f"{blk}.g", "bwd")] is None
    sp = {(x.key, x.phase): x.op for x in F.block_flow(True)}
    for blk in ("attn", "mlp"):
        assert (sp[(f"{blk}.f", "fwd")], sp[(f"{blk}.f", "bwd")]) == ("all_gather", "reduce_scatter")
        assert (sp[(f"{blk}.g", "fwd")], sp[(f"{blk}.g", "bwd")]) == ("reduce_scatter", "all_gather")


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("target", [0, 3, 5, 7])
def test_vocab_ce_walkthrough_is_exact(t, target):
    steps = {s["key"]: s for s in F.vocab_ce_walkthrough(target=target, t=t)}
    dense = F.dense_cross_entropy(target=target)
    assert steps["loss"]["value"] == pytest.approx(dense, abs=1e-12)
    assert steps["max"]["value"] == max(F.EXAMPLE_LOGITS)
    assert all(len(shard) == len(F.EXAMPLE_LOGITS) // t for shard in steps["shard"]["per_rank"])
    grad = [g for shard in steps["grad"]["per_rank"] for g in shard]
    m = max(F.EXAMPLE_LOGITS)
    z = sum(math.exp(v - m) for v in F.EXAMPLE_LOGITS)
    expected = [math.exp(v - m) / z - (i == target) for i, v in enumerate(F.EXAMPLE_LOGITS)]
    assert grad == pytest.approx(expected)
    assert sum(grad) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        F.vocab_ce_walkthrough(t=3)


def test_registered_and_every_lesson_step_has_a_view():
    lesson = resolve_lesson("lesson4")
    assert visualizer_class(lesson.visualizer) is TPBlockVisualizer
    for step in lesson.steps:  # each step says where the flow opens (lesson.toml's view), and it exists
        view = step_view("tp-block", step.key)
        assert view, step.key
        stages = F.block_flow(view.get("sequence_parallel", False))
        assert view.get("cross_entropy") or (view["stage"], view["phase"]) in [(s.key, s.phase) for s in stages]


def _flow_text(vis) -> str:
    return vis.render_ce().plain if vis.ce else vis.render_flow().plain


@async_test
async def test_widget_steps_toggles_and_live_events():
    async with mounted(TPBlockVisualizer, size=(60, 40)) as (pilot, vis):
        assert vis.index == 0 and "FORWARD" in _flow_text(vis)
        for _ in range(6):
            await pilot.press("space")
        assert vis.stage.key == "attn.g" and vis.stage.op == "all_reduce"
        assert "1 all-reduce" in vis.render_detail().plain
        await pilot.press("comma")
        assert vis.stage.key == "attn.wo"
        # sequence parallelism: the same stage, now followed by a reduce-scatter
        await pilot.press("s")
        assert vis.sp and vis.stage.key == "attn.wo"
        await pilot.press("space")
        assert vis.stage.op == "reduce_scatter"
        assert "SEQ" in vis.render_flow().plain
        # all the way to the end: backward, then the SP gradient sync
        for _ in range(40):
            await pilot.press("full_stop")
        assert vis.stage.key == "sp.grads" and "BACKWARD" in _flow_text(vis)
        detail = vis.render_detail().plain
        assert "4 all-gather" in detail and "2 reduce-scatter" in detail  # 2 ḡ-bwd + 2 re-gathers
        await pilot.press("x")
        assert vis.t == 8 and vis.render_detail().plain.count("r7") == 1
        # the cross-entropy view
        await pilot.press("c")
        assert vis.ce
        for _ in range(10):
            await pilot.press("space")
        text = _flow_text(vis)
        assert f"{F.dense_cross_entropy():.4f}" in text and "all-reduce(MAX)" in text
        # the walk-through splits V = 8 over the view's T ranks: 8 of one logit each, then (x) 2 of four
        assert "T=8" in text and "r7: [" in text
        await pilot.press("x")
        text = _flow_text(vis)
        assert vis.t == 2 and "T=2" in text and "r1: [" in text and "r2:" not in text
        assert f"{F.dense_cross_entropy():.4f}" in text
        await pilot.click("#tp-ce")
        assert not vis.ce
        # a live run's counts appear beside the drawing
        vis.feed_event({"kind": "config", "T": 2, "hidden": 32, "seq": 8, "micro_batch": 2})
        vis.feed_event({"kind": "comm_check", "mode": "tp+sp", "match": True, "layers": {"0": {
            "fwd": {"counts": {"all_reduce": 0, "all_gather": 2, "reduce_scatter": 2}},
            "bwd": {"counts": {"all_reduce": 0, "all_gather": 2, "reduce_scatter": 2}}}}})
        await pilot.pause()
        assert vis.t == 2
        assert "your run (T=2, tp+sp)" in vis.render_detail().plain


@async_test
async def test_widget_show_step_and_spanish():
    async with mounted(TPBlockVisualizer, "es", size=(60, 40)) as (pilot, vis):
        for step in resolve_lesson("lesson4").steps:
            view = step_view("tp-block", step.key)
            vis.show_step(step.key)
            await pilot.pause()
            assert vis.sp == view.get("sequence_parallel", False) and vis.ce == view.get("cross_entropy", False)
            if "stage" in view:
                assert (vis.stage.key, vis.stage.phase) == (view["stage"], view["phase"])
        vis.show_step("sequence-parallel")
        assert "paral. de secuencia: SÍ" in vis.render_header().plain
        assert "filas" in vis.render_flow().plain
        vis.show_step("not-a-step")  # ignored


@async_test
async def test_lesson_screen_hosts_the_visualizer():
    from distai.tutor.app import DistaiApp

    app = DistaiApp(language="en", lesson_id="lesson4")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        vis = app.screen.visualizer
        assert isinstance(vis, TPBlockVisualizer)
        await pilot.press("right")  # the lesson's next step still works
        await pilot.pause()
        assert app.screen.index == 1 and vis.stage.key == "mlp.f"


@async_test
async def test_the_current_stage_stays_in_view_at_80x24_with_and_without_the_text(tmp_path, monkeypatch):
    """At 80×24, V (the visualizer alone) and back left the list scrolled to its top (or 3 rows above the
    current stage in a one-row list): the detail described fc1 under rows that did not show it."""
    from textual.containers import VerticalScroll

    from distai.tutor.app import DistaiApp

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    app = DistaiApp("en", lesson_id="lesson4")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        for _ in range(2):
            await pilot.press("V")
            await pilot.pause(0.3)
            vis = app.screen.visualizer
            scroll = vis.query_one("#tp-scroll", VerticalScroll)
            row = vis._row_of_index[vis.index]
            assert scroll.scroll_y <= row < scroll.scroll_y + scroll.size.height, (row, scroll.scroll_y,
                                                                                    scroll.size.height)
