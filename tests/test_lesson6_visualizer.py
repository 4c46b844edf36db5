"""Lesson 6's visualizer: renderers, sliders, step views and live events (no torch)."""
from __future__ import annotations

import asyncio
import math

from distai.lessons.lesson6.simulation import ExponentHistogram, simulate_scaler
from distai.visualizers.base import visualizer_class
from distai.visualizers.loss_scale import (
    VISUALIZER,
    LossScaleVisualizer,
    histogram_plot,
    scale_plot,
    timeline_rows,
)
from pilot_harness import mounted


def test_registered_under_lesson_name():
    assert visualizer_class("loss-scale") is LossScaleVisualizer is VISUALIZER


def test_scale_plot_marks_overflows_on_a_log2_axis():
    scales = [2.0 ** 16] * 10 + [2.0 ** 17] * 10 + [2.0 ** 16] * 10
    overflow = [False] * 20 + [True] + [False] * 9
    forced = [False] * 30
    forced[5] = overflow[5] = True
    lines = scale_plot(scales, overflow, forced, width=30 + 7, height=6)
    marks = lines[0].plain[7:]
    assert marks[5] == "✕" and marks[20] == "▼" and marks.count("▼") == 1
    assert lines[1].plain.strip().startswith("2^17") and lines[-1].plain.strip().startswith("2^16")
    assert lines[-1].plain[7:17] == "━" * 10 and lines[1].plain[17:27] == "━" * 10


def test_histogram_plot_colours_by_fp16_region():
    # 1000 values at 2^-30 (zero in fp16), 1000 at 2^-20 (subnormal), 1000 at 2^-5 (normal)
    h = ExponentHistogram(-64, [0] * 89)
    for e in (-30, -20, -5):
        h.counts[e + 64] = 1000
    lines = histogram_plot(h, 0, "fp16", width=58, height=3, lang="en")
    top = lines[0]
    cols = [i for i, ch in enumerate(top.plain) if ch == "█"]
    assert [c - 0 for c in cols] == [-30 + 40, -20 + 40, -5 + 40]
    spans = {s.start: str(s.style) for s in top.spans}
    assert spans[cols[0]] == "red" and spans[cols[1]] == "yellow" and spans[cols[2]] == "green"
    assert "2⁻²⁴" in lines[-1].plain and "65504" in lines[-1].plain
    shifted = histogram_plot(h, 16, "fp16", width=58, height=3, lang="en")[0]
    assert [i for i, ch in enumerate(shifted.plain) if ch == "█"] == [c + 16 for c in cols]
    # 2^-5 scaled by 2^25 = 2^20 > 65504: drawn in the last column, as an overflow
    over = histogram_plot(h, 25, "fp16", width=58, height=3, lang="en")[0]
    assert over.plain[57] == "█" and {s.start: str(s.style) for s in over.spans}[57] == "magenta"


def test_timeline_rows_draw_compute_and_buckets():
    tl = {"layers": [["L1", 0.0, 5.0], ["L0", 5.0, 10.0]],
          "buckets": [[0, 100, 5.0, 8.0], [1, 100, 10.0, 12.0]]}
    back, comm = timeline_rows(tl, 20.0, 20)
    assert back.plain == "█" * 10 + " " * 10
    assert comm.plain[5] == "0" and comm.plain[6:8] == "▓▓" and comm.plain[10] == "1"
    # a bucket launched while the previous still runs waits (░)
    tl["buckets"] = [[0, 100, 5.0, 12.0], [1, 100, 6.0, 14.0]]
    _, comm = timeline_rows(tl, 20.0, 20)
    assert comm.plain[5] == "0" and comm.plain[12] == "1" and "░" not in comm.plain[5:12]


def _events():
    yield {"kind": "phase", "name": "loss-scaling", "rank": 0}
    for i, (s, o, inj) in enumerate([(65536.0, False, False), (65536.0, True, True),
                                      (32768.0, False, False)]):
        yield {"kind": "scale", "step": i, "scale": s, "new_scale": s, "overflow": o, "skipped": o,
               "injected": inj, "growth_tracker": 0, "loss": 1.0 - 0.1 * i, "rank": 0}
    counts = [0] * 89
    counts[-20 + 64] = 900
    counts[-30 + 64] = 100
    yield {"kind": "grad_hist", "step": 0, "lo": -64, "counts": counts, "zeros": 0, "scale": 65536.0,
           "zero_unscaled": 0.1, "zero_scaled": 0.0, "dtype": "fp16", "rank": 0}
    for mode in ("overlap", "no-overlap", "ddp"):
        for rank in (0, 1):
            yield {"kind": "timeline", "bucket_mb": 1.0, "mode": mode, "rank": rank,
                   "marks": {"backward": 1.0},
                   "layers": [["2", 1.0, 3.0], ["0", 3.0, 5.0]],
                   "buckets": [[0, 1000, 3.0 if mode != "no-overlap" else 5.0, 7.0]]}
        yield {"kind": "bucket_sweep", "bucket_mb": 1.0, "mode": mode, "step_ms": {"overlap": 6.0,
               "no-overlap": 8.0, "ddp": 6.5}[mode], "n_buckets": 1, "rank": 0}
    yield {"kind": "summary", "rank": 0, "overlap": {"best_bucket_mb": 1.0, "overlap_speedup": 8 / 6,
                                                      "ours_over_ddp": 6 / 6.5}}


def test_widget_sliders_steps_and_live_run():
    async def go():
        async with mounted(LossScaleVisualizer, size=(100, 40)) as (pilot, v):
            v.show_step("dynamic")
            assert v.view == "scale" and "[simulation]" in v.last_text.plain
            sim_before = v.sim().scale
            await pilot.press("w")  # growth interval 50 -> 100
            assert v.config.growth_interval == 100
            assert "growth interval 100" in v.last_text.plain
            assert v.sim().scale != sim_before
            await pilot.press("I", "I")  # initial scale 2^16 -> 2^12
            assert v.config.init_scale == 2.0 ** 12 and "initial 2^12" in v.last_text.plain
            await pilot.press("f", "B")
            assert v.config.growth_factor == 3.0 and v.config.backoff_factor == 0.25
            want = simulate_scaler(v.config)
            assert f"{want.skipped} of 400 steps skipped" in v.last_text.plain
            await pilot.press("0")
            assert v.config.growth_interval == 50
            v.show_step("underflow")
            assert v.view == "exponents" and "without scaling" in v.last_text.plain
            v.show_step("bf16")
            assert v.fmt == "bf16" and "bf16's limits" in v.last_text.plain
            v.show_step("overlap")
            text = v.last_text.plain
            assert v.view == "timeline" and "after backward" in text and "simulated step time" in text
            await pilot.press("k")
            assert v.overlap_model.bucket_mib == 16 and "bucket 16 MiB" in v.last_text.plain
            await pilot.press("g")
            assert v.view == "scale"
            # a live run replaces the simulation
            for ev in _events():
                v.feed_event(ev)
            assert "[live run]" in v.last_text.plain and "1 of 3 steps skipped" in v.last_text.plain
            assert "✕" in v.last_text.plain
            v.show_step("underflow")
            text = v.last_text.plain
            assert "zero 10.0%" in text and "0.0% scaled" in text and "10.0% of values became 0" in text
            v.show_step("overlap")
            text = v.last_text.plain
            assert "torch DDP" in text and "1.33x faster" in text and "ours/DDP 0.92x" in text
            assert len(v.run.timelines) == 3  # rank 1's copies ignored
            await pilot.press("s")
            assert "[simulation]" in v.last_text.plain
            v.feed_event({"kind": "run_start", "run_id": "x"})
            assert v.run.empty
    asyncio.run(go())


def test_widget_speaks_spanish():
    async def go():
        async with mounted(LossScaleVisualizer, "es", size=(100, 40)) as (_pilot, v):
            v.show_step("dynamic")
            assert "escala de la pérdida" in v.last_text.plain and "pasos saltados" in v.last_text.plain
            v.show_step("overlap")
            assert "tras el backward" in v.last_text.plain
            for ev in _events():
                v.feed_event(ev)
            v.show_step("underflow")
            assert "cero 10,0 %" in v.last_text.plain
            v.show_step("overlap")
            assert "1,33x más rápido" in v.last_text.plain and "nuestro/DDP 0,92x" in v.last_text.plain
    asyncio.run(go())


def test_log2_helpers_are_consistent():
    sim = simulate_scaler(steps=50, growth_interval=5)
    assert all(math.log2(s).is_integer() for s in sim.scale)


def test_histogram_plot_fits_a_narrow_pane():
    # 58 exponent bins in a 44-cell pane: every line fits (the 65504 mark wrapped onto a line of its own),
    # the smallest exponents gathered in the first bin, the limits still marked
    h = ExponentHistogram(-64, [0] * 89)
    for e in (-30, -20, -5):
        h.counts[e + 64] = 1000
    lines = histogram_plot(h, 0, "fp16", width=44, height=3, lang="en")
    assert all(line.cell_len <= 44 for line in lines)
    assert "2⁻²⁴" in lines[-1].plain and "65504" in lines[-1].plain
    assert lines[0].plain[0] == "█"  # 2^-30, below the window, counted in its first bin
