"""Lesson 6's view model (``lessons/lesson6/loss_scale_view.py``) alone, no Textual: the states the
sliders, the steps and a run's events lead to, and the series drawn, against the simulation and the
run's fold."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from distai.lessons.lesson6 import loss_scale_view as ls
from distai.lessons.lesson6.simulation import OverlapModel, ScalerSimConfig, simulate_scaler
from distai.lessons.registry import step_view


def _run_events():
    """A small run of ``distai run lesson6``: four scaler steps (one injected overflow), a gradient
    histogram, one step's timeline per mode at two bucket sizes (rank 1's copy ignored), its summary."""
    yield {"kind": "run_start", "run_id": "t"}
    for i, (scale, overflow) in enumerate([(1024.0, False), (1024.0, True), (512.0, False), (1024.0, False)]):
        yield {"kind": "scale", "step": i, "scale": scale, "overflow": overflow, "injected": overflow,
               "loss": 2.0 - 0.2 * i, "rank": 0}
    counts = [0] * 89
    counts[-18 + 64] = 500
    yield {"kind": "grad_hist", "step": 3, "lo": -64, "counts": counts, "zeros": 0, "scale": 1024.0,
           "zero_unscaled": 0.2, "zero_scaled": 0.0, "dtype": "fp16", "rank": 0}
    for bucket in (2.0, 8.0):
        for mode in ls.MODE_ORDER:
            for rank in (0, 1):
                yield {"kind": "timeline", "bucket_mb": bucket, "mode": mode, "rank": rank,
                       "layers": [["1", 0.0, 2.0], ["0", 2.0, 4.0]], "buckets": [[0, 1000, 2.0, 5.0 + bucket]]}
    yield {"kind": "summary", "rank": 0, "overlap": {"best_bucket_mb": 8.0}}


def test_the_view_model_loads_without_textual_or_torch():
    code = "import sys, distai.lessons.lesson6.loss_scale_view; print('textual' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_sliders_step_through_their_notches_and_reset():
    view, state = ls.LossScaleView(), ls.LossScaleState()
    up = view.slide(state, "growth_interval", 1)
    assert up.config.growth_interval == 100 and view.sim(up).scale == simulate_scaler(up.config).scale
    assert view.sim(up).scale != view.sim(state).scale
    assert view.slide(state, "init_scale", -1).config.init_scale == state.config.init_scale / 4
    top = state
    for _ in range(10):
        top = view.slide(top, "growth_factor", 1)
    assert top.config.growth_factor == ls.GROWTH_FACTORS[-1]
    assert view.slide(state, "backoff_factor", -1).config.backoff_factor == 0.25
    bucket = view.slide(state, "bucket", 1)
    assert bucket.overlap_model.bucket_mib == 16 and bucket.config == state.config
    assert ls.reset(replace(top, hist_index=3, view="exponents")) == replace(state, view="exponents")
    with pytest.raises(ValueError):
        view.slide(state, "no such slider", 1)


def test_steps_pick_the_view_and_format():
    state = ls.show_step(ls.LossScaleState(), step_view("loss-scale", "bf16"))
    assert (state.view, state.fmt) == ("exponents", "bf16")
    assert ls.show_step(state, step_view("loss-scale", "overlap")) == replace(state, view="timeline", fmt="fp16")
    assert ls.toggle_format(state).fmt == "fp16"


def test_the_simulated_series_are_the_models():
    view, state = ls.LossScaleView(), ls.LossScaleState()
    sim = simulate_scaler(state.config)
    assert view.scale_series(state) == (sim.scale, sim.overflow, sim.forced, sim.loss)
    latest = view.histogram(state)
    steps = list(range(0, state.config.steps, ls.HIST_EVERY))
    assert latest.step == steps[-1] and latest.scale == sim.scale[steps[-1]] and latest.measured is None
    assert latest.hist.counts == sim.histogram(steps[-1]).counts
    first = view.hist_step(view.hist_step(state, -1), -100)
    assert first.hist_index == 0 and view.histogram(first).step == 0
    assert view.hist_step(state, 1).hist_index == 0  # "." at the last step (where the view opens) goes round
    assert view.hist_step(first, -1).hist_index == len(view.hist_steps(state)) - 1
    tls, bucket = view.timelines(state)
    model = OverlapModel()
    assert bucket == model.bucket_mib and set(tls) == {"overlap", "no-overlap"}
    assert tls["overlap"]["end"] == pytest.approx(model.run(True).end * 1000)
    assert tls["no-overlap"]["end"] > tls["overlap"]["end"]  # overlapping hides communication


def test_a_run_replaces_the_simulation_until_switched_back():
    view, state = ls.LossScaleView(), ls.LossScaleState()
    assert view.feed(state, {"kind": "no such kind"}) is None
    for ev in _run_events():
        state = view.feed(state, ev) or state
    assert view.live(state)
    scales, overflow, forced, _ = view.scale_series(state)
    assert scales == [1024.0, 1024.0, 512.0, 1024.0] and overflow == forced == [False, True, False, False]
    shown = view.histogram(state)
    assert shown.measured is view.run.hists[-1] and shown.step == view.run.hists[-1]["step"]
    tls, bucket = view.timelines(state)
    assert bucket == view.run.best_bucket() and list(tls) == [m for m in ls.MODE_ORDER if (bucket, m) in view.run.timelines]
    sizes = view.run.bucket_sizes()
    assert sizes == [2.0, 8.0] and len(view.run.timelines) == 6  # rank 1's copies ignored
    assert bucket == 8.0 and tls["overlap"]["end"] == 13.0  # the summary's best bucket
    assert view.live_bucket(view.slide(state, "bucket", -1)) == 2.0  # the run's sizes, not the model's
    sim = view.toggle_source(state)
    assert not view.live(sim) and view.toggle_source(sim).use_live
    restart = view.feed(replace(state, hist_index=0, live_bucket=sizes[0]), {"kind": "run_start", "run_id": "y"})
    assert restart.hist_index is None and restart.live_bucket is None and not view.live(restart)
    assert view.toggle_source(replace(restart, use_live=False)).use_live is False  # nothing to show
    assert ScalerSimConfig() == restart.config


def test_s_without_a_run_says_so():
    """An audit pressed s (simulation ↔ your run) with no run: the view still read [simulation], nothing else."""
    import asyncio

    from distai.visualizers.loss_scale import LossScaleVisualizer
    from pilot_harness import mounted

    async def main():
        for lang, words in (("en", "no run yet"), ("es", "aún no hay ejecución")):
            async with mounted(LossScaleVisualizer, lang) as (pilot, vis):
                assert words not in vis.last_text.plain
                await pilot.press("s")
                await pilot.pause()
                assert words in vis.last_text.plain
                await pilot.press("g")  # the other views say it too
                await pilot.pause()
                assert words in vis.last_text.plain

    asyncio.run(main())
