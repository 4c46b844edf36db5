"""Lesson 2's layout model and its visualizer: what is drawn is what the formulas and the ZeRO paper say."""
from __future__ import annotations

import asyncio

import pytest

from distai.lessons.lesson2 import formulas as F
from distai.lessons.lesson2 import layout as L
from distai.lessons.registry import resolve_lesson, step_view
from distai.visualizers.base import visualizer_class
from distai.visualizers.sharding import PRESETS, STRATEGIES, ShardingVisualizer
from pilot_harness import mounted


@pytest.mark.parametrize("strategy", L.STRATEGIES)
@pytest.mark.parametrize("optimizer", F.OPTIMIZERS)
@pytest.mark.parametrize("precision", F.PRECISIONS)
@pytest.mark.parametrize("psi,n", [(7_500_000_000, 64), (1000, 3), (234_880, 4), (10, 1)])
def test_layout_matches_the_formulas(strategy, optimizer, precision, psi, n):
    lay = L.layout(psi, n, strategy, optimizer, precision)
    expected = F.model_state_bytes(psi, n, strategy, optimizer, precision)
    assert len(lay.gpus) == n
    for gpu in lay.gpus:
        assert gpu.model_states == expected["total_bytes"]
        assert gpu.bytes_of("params") == expected["params_bytes"]
        assert gpu.bytes_of("grads") == expected["grads_bytes"]
        opt = gpu.bytes_of("master") + gpu.bytes_of("momentum") + gpu.bytes_of("variance")
        assert opt == expected["optimizer_bytes"]


def test_optimizer_parts_add_up_to_k():
    for opt in F.OPTIMIZERS:
        for prec in F.PRECISIONS:
            assert sum(F.optimizer_state_parts(opt, prec).values()) == F.optimizer_k(opt, prec)
    assert F.optimizer_state_parts("adam", "mixed") == {"master": 4, "momentum": 4, "variance": 4}


def test_who_holds_which_slice():
    n = 4
    for rank in range(n):
        assert L.slices_held("ddp", "params", rank, n) == [0, 1, 2, 3]
        assert L.slices_held("zero1", "grads", rank, n) == [0, 1, 2, 3]
        assert L.slices_held("zero1", "momentum", rank, n) == [rank]
        assert L.slices_held("zero2", "grads", rank, n) == [rank]
        assert L.slices_held("zero2", "params", rank, n) == [0, 1, 2, 3]
        assert all(L.slices_held("zero3", s, rank, n) == [rank] for s in L.MODEL_STATES)
    # every slice of every sharded state is held by exactly one GPU
    lay = L.layout(1000, n, "zero3", "adam", "mixed")
    for state in L.MODEL_STATES:
        owners = [o for g in lay.gpus for seg in g.segments if seg.state == state for o in seg.owners]
        assert sorted(owners) == list(range(n))


def test_zero_paper_worked_example():
    """Rajbhandari et al. 2020, Fig. 1: 7.5B parameters, K = 12, N = 64."""
    got = {s: L.layout(7.5e9, 64, s).per_gpu / 1e9 for s in L.STRATEGIES}
    assert got["ddp"] == pytest.approx(120)
    assert got["zero1"] == pytest.approx(31.4, abs=0.05)
    assert got["zero2"] == pytest.approx(16.6, abs=0.05)
    assert got["zero3"] == pytest.approx(1.88, abs=0.005)
    assert L.layout(7.5e9, 64, "ddp").redundancy == pytest.approx(64)
    assert L.layout(7.5e9, 64, "zero3").redundancy == pytest.approx(1, rel=1e-6)
    assert not L.layout(7.5e9, 64, "ddp", capacity=80e9).fits
    assert L.layout(7.5e9, 64, "zero1", capacity=80e9).fits


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("n", [2, 4, 64])
@pytest.mark.parametrize("precision", F.PRECISIONS)
def test_zero3_step_moves_three_psi_against_ddps_two(prefetch, n, precision):
    psi, layers = 7_500_000_000, 4
    phases = L.zero3_step(psi, n, layers, precision, prefetch)
    b = 2 if precision == "mixed" else 4
    assert phases[-1].sent == pytest.approx(F.comm_volume_per_step(psi, "zero3", n, b)["exact_bytes"])
    assert phases[-1].sent_ddp == pytest.approx(F.comm_volume_per_step(psi, "ddp", n, b)["exact_bytes"])
    assert phases[-1].sent / phases[-1].sent_ddp == pytest.approx(1.5)
    assert L.step_traffic(psi, n, precision)["zero3"] == pytest.approx(phases[-1].sent)
    actions = [(p.action, p.layer) for p in phases]
    for i in range(layers):
        assert actions.count(("all_gather", i)) == 2  # before forward, again before backward
        assert actions.count(("free", i)) == 2
        assert actions.count(("reduce_scatter", i)) == 1
        # gathered before it computes, freed after; gradients reduce-scattered after its backward
        assert actions.index(("all_gather", i)) < actions.index(("forward", i)) < actions.index(("free", i))
        bwd = actions.index(("backward", i))
        assert bwd < actions.index(("reduce_scatter", i))
        assert max(j for j, a in enumerate(actions[:bwd]) if a == ("all_gather", i)) > actions.index(("forward", i))
    most = max(len(p.gathered) for p in phases)
    assert most == (2 if prefetch else 1)
    assert phases[-1].action == "step" and not phases[-1].gathered and not phases[-1].full_grads
    # DDP sends nothing in forward; ZeRO-3 already sends Ψ(N-1)/N there
    fwd_end = max(i for i, p in enumerate(phases) if p.stage == "forward")
    assert phases[fwd_end].sent_ddp == 0
    assert phases[fwd_end].sent == pytest.approx(phases[-1].sent / 3)


# ------------------------------------------------------------------------------------------------
# The widget


def _run(coro_fn, lang="en", size=(70, 50)):
    async def main():
        async with mounted(ShardingVisualizer, lang, size) as (pilot, vis):
            return await coro_fn(pilot, vis)

    return asyncio.run(main())


def _body(vis) -> str:
    return vis.render_body().plain


def test_registered_for_lesson2():
    lesson = resolve_lesson("lesson2")
    assert visualizer_class(lesson.visualizer) is ShardingVisualizer
    for step in lesson.steps:  # every step says what the visualizer shows (lesson.toml's view)
        view = step_view("sharding", step.key)
        assert view["strategy"] in STRATEGIES and view["model"] in [p[0] for p in PRESETS], step.key


STEP_KEYS = [s.key for s in resolve_lesson("lesson2").steps]


def test_every_step_view_renders_in_both_languages():
    async def go(pilot, vis):
        out = {}
        for key in STEP_KEYS:
            vis.show_step(key)
            await pilot.pause()
            out[key] = _body(vis)
        return out

    for lang in ("en", "es"):
        bodies = _run(go, lang)
        assert all(bodies.values())
    bodies = _run(go, "en")
    # the worked example: ZeRO-1, 7.5B on 64 GPUs
    assert "ZeRO-1" in bodies["worked-example"] and "31.4 GB" in bodies["worked-example"]
    assert "58 more" in bodies["worked-example"]
    assert "does not fit" in bodies["copies"] and "120 GB" in bodies["copies"]
    assert "one ZeRO-3 / FSDP step" in bodies["traffic"]
    es = _run(go, "es")
    assert "31,4 GB" in es["worked-example"] and "no cabe" in es["copies"]


def test_keys_change_strategy_size_and_gpus():
    async def go(pilot, vis):
        seen = []
        vis.show_step("copies")  # DDP, 7.5B, N=4
        for _ in range(3):
            await pilot.press("s")
            seen.append((vis.strategy, vis.current_layout().per_gpu))
        await pilot.press("right_square_bracket")
        dp = vis.dp
        await pilot.press("plus")
        psi = vis.params
        await pilot.press("m", "o", "c", "a")
        return seen, dp, psi, vis.precision, vis.optimizer, vis.capacity, vis.activations

    seen, dp, psi, prec, opt, cap, act = _run(go)
    assert [s for s, _ in seen] == ["zero1", "zero2", "zero3"]
    sizes = [b for _, b in seen]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] == pytest.approx(16 * 7.5e9 / 4)
    assert dp == 8 and psi == PRESETS[3][1]
    assert (prec, opt, cap, act) == ("fp32", "sgd", 141e9, "none")


def test_bar_turns_red_past_the_capacity_line():
    async def go(pilot, vis):
        vis.show_step("copies")
        await pilot.pause()
        text = vis.render_body()
        red = [sp for sp in text.spans if "on red" in str(sp.style)]
        vis.strategy = "zero3"
        text3 = vis.render_body()
        red3 = [sp for sp in text3.spans if "on red" in str(sp.style)]
        return red, red3

    red, red3 = _run(go)
    assert red and not red3


def test_space_plays_the_zero3_step():
    async def go(pilot, vis):
        vis.show_step("copies")
        await pilot.press("space")
        assert vis.strategy == "zero3" and vis.playing
        await pilot.pause(1.5)
        moved = vis.phase
        await pilot.press("space")  # pause
        at = vis.phase
        await pilot.press("full_stop", "full_stop")
        return moved, at, vis.phase, vis.playing, _body(vis)

    moved, at, now, playing, body = _run(go)
    assert moved >= 1 and now == at + 2 and not playing
    assert "sent per rank" in body


def test_feed_event_shows_measured_bytes():
    events = [
        {"kind": "phase", "name": "setup", "world_size": 4, "num_params": 234880, "precision": "fp32",
         "optimizer": "adam", "rank": 0},
        {"kind": "memory", "strategy": "zero3", "rank": 0, "total": 939_532, "predicted": 939_520.0,
         "world_size": 4, "num_params": 234880, "precision": "fp32"},
        {"kind": "comm", "strategy": "zero3", "rank": 0, "sent": 2_113_920.0},
        {"kind": "memory", "strategy": "zero3", "rank": 1, "total": 1, "predicted": 2},  # not rank 0
    ]

    async def go(pilot, vis):
        for ev in events:
            vis.feed_event(ev)
        await pilot.pause()
        return _body(vis)

    body = _run(go)
    assert "your run" in body and "zero3: held 940 kB (calculator 940 kB)" in body and "2.11 MB" in body

    async def restart(pilot, vis):
        for ev in events:
            vis.feed_event(ev)
        vis.feed_event({"kind": "run_start", "run_id": "x"})
        await pilot.pause()
        return _body(vis)

    assert "your run" not in _run(restart)


def test_bar_segments_keep_small_states_in_sight_and_equal_states_equal():
    from distai.visualizers.sharding import segment_widths

    # ZeRO-3, Ψ = 6.7B on 8 GPUs: 1.68 GB of parameters beside 10 GB of optimizer states still gets a cell
    widths = segment_widths([1.68e9, 1.68e9, 3.35e9, 3.35e9, 3.35e9, 30e9], 40 / 80e9, 38, True)
    assert all(w >= 1 for w in widths) and widths[0] == widths[1] and widths[2] == widths[3] == widths[4]
    # equal states, equal widths (P and G 15 GB each, M, m and v 7.5 GB each: they drew 4/5 and 2/2/3 cells)
    widths = segment_widths([15e9, 15e9, 7.5e9, 7.5e9, 7.5e9], 60 / 160e9, 50, True)
    assert widths[0] == widths[1] and widths[2] == widths[3] == widths[4]
    # the bar ends inside the capacity mark exactly when the bytes fit
    assert sum(segment_widths([39e9, 40.9e9], 60 / 84e9, 57, True)) <= 57
    assert sum(segment_widths([40e9, 41e9], 60 / 86e9, 56, False)) > 56
    assert segment_widths([0.0, 5e9], 1e-9, 10, True) == [0, 5]


def test_the_zero3_steps_headline_keeps_the_formulas_bytes_apart_from_what_it_gathers():
    """Steps 7-8 read 'per GPU 37.5 GB' where the text and step 5 say 30 GB: what the formula counts and
    the layer gathered at this moment of the animated step are shown apart, their sum after."""
    from distai.lessons.units import format_bytes
    from distai.visualizers.sharding import ShardingVisualizer

    v = ShardingVisualizer("en")
    v.strategy, v.dp, v.phase = "zero3", 4, None
    still = v.render_body().plain
    states = format_bytes(16 * 7.5e9 / 4)
    assert f"per GPU {states} ·" in still and "gathered now" not in still
    v.phase = next(i for i, ph in enumerate(v.phases()) if ph.gathered)
    moving = v.render_body().plain
    extra = sum(x.bytes for x in v.transient())
    assert extra > 0
    assert f"per GPU {states} + {format_bytes(extra)} gathered now = {format_bytes(16 * 7.5e9 / 4 + extra)}" in moving
