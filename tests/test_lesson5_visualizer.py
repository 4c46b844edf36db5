"""Lesson 5 visualizer: the timelines it draws are the simulator's, keys change what is drawn,
and a run's events become a measured timeline."""
from __future__ import annotations

import asyncio

import pytest
from textual.app import App

from distai.lessons.lesson5 import formulas
from distai.lessons.lesson5 import simulator as sim
from distai.lessons.units import format_percent
from distai.visualizers.base import visualizer_class
from distai.visualizers.pipeline import IDLE_CHAR, Lanes, PipelineVisualizer, draw_lanes
from pilot_harness import drawn_text, mounted


def _text(viz, width=120, height=None) -> str:
    return drawn_text(viz, width, height)


def test_registered_under_its_lesson_name():
    assert visualizer_class("pipeline") is PipelineVisualizer


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2),
                                            ("1f1b", 3, 5, 1)])
def test_drawn_rows_are_the_simulated_timeline(schedule, p, m, v):
    tl = sim.simulate(schedule, p, m, v)
    lanes = Lanes.from_timeline(tl)
    cols = int(lanes.makespan * 8)  # 8 columns per forward: every block is whole columns
    rows = draw_lanes(lanes, cols, lanes.makespan, None, mem_max=m)
    timeline_rows = rows[0::2]
    strips = rows[1::2]
    assert len(timeline_rows) == p
    idle = sum(row.plain[4:4 + cols].count(IDLE_CHAR) for row in timeline_rows)
    assert idle / (p * cols) == pytest.approx(formulas.bubble_fraction(p, m, v), abs=0.01)
    # each rank's strip ends with its peak (no cursor given), and the peak is the simulator's
    for r, strip in enumerate(strips):
        assert strip.plain.rstrip().endswith(f"▲{tl.peak_inflight[r]:g}")
    # forward labels appear in the simulator's order on each rank
    for r, row in enumerate(timeline_rows):
        labels = [str(op.mb) + ("abcdefgh"[op.chunk] if v > 1 else "") for op in tl.order[r]]
        body = row.plain[4:4 + cols]
        pos = 0
        for label in labels:
            found = body.find(label, pos)
            assert found >= 0, (r, label, body)
            pos = found + len(label)


def test_keys_change_p_m_v_view_and_cursor():
    asyncio.run(_keys())


async def _keys():
    async with mounted(PipelineVisualizer, size=(130, 60)) as (pilot, viz):
        await pilot.press("space")  # pause the animation
        assert viz.playing is False
        assert (viz.p, viz.m, viz.v) == (4, 8, 2)
        text = _text(viz)
        assert "GPipe" in text and "1F1B" in text and "Interleaved 1F1B" in text
        assert f"{formulas.bubble_fraction(4, 8):.1%}" in text
        assert f"{formulas.bubble_fraction(4, 8, 2):.1%}" in text
        await pilot.press("s", "m", "m", "c")
        assert (viz.p, viz.m, viz.v) == (5, 10, 3)
        assert f"{formulas.bubble_fraction(5, 10):.1%}" in _text(viz)
        await pilot.press("S", "M", "M", "C")
        assert (viz.p, viz.m, viz.v) == (4, 8, 2)
        await pilot.press("1")
        text = _text(viz)
        assert "GPipe" in text and "Interleaved" not in text and "1F1B  " not in text
        await pilot.press("2")
        assert viz.shown_schedules() == ["1f1b"]
        await pilot.press("3")
        assert viz.shown_schedules() == ["interleaved"]
        await pilot.press("0")
        assert viz.shown_schedules() == list(sim.SCHEDULES)
        await pilot.press("b")
        assert viz.b_cost == 3.0 and "B = 3×F" in _text(viz)
        await pilot.press("h")
        assert viz.hop > 0
        await pilot.press("full_stop", "full_stop")
        assert viz.cursor > 0
        before = viz.cursor
        await pilot.press("space")
        viz._on_tick()  # one tick of the playback timer
        assert viz.playing and viz.cursor > before


def test_interleaved_draws_fewer_microbatches_than_stages_and_explains_a_refusal():
    """Issue 27.8: p = 4, m = 3 draws (torch's ScheduleInterleaved1F1B runs it in one round; the widget
    said it needed m >= p); m = 9 splits into no equal rounds, and the widget says so."""
    viz = PipelineVisualizer()
    assert (viz.p, viz.v) == (4, 2)
    viz.m = 3
    assert not isinstance(viz.lanes("interleaved"), str)
    tl = viz.timeline("interleaved")
    assert tl is not None and tl.makespan == formulas.step_time_units(4, 3, 2) * (1.0 + viz.b_cost)
    viz.m = 9
    text = _text(viz)
    assert "rounds of equal size" in text
    assert "GPipe" in text  # the other schedules still draw


def test_steps_pick_views_and_spanish():
    viz = PipelineVisualizer(language="es")
    viz.show_step("same-time")
    assert viz.shown_schedules() == ["gpipe", "1f1b"]
    viz.show_step("stages")
    assert viz.m == 1 and viz.shown_schedules() == ["gpipe"]
    text = _text(viz)
    assert "burbuja" in text and "etapas" in text
    assert format_percent(formulas.bubble_fraction(4, 1), 3, "es") in text  # "75 %", the Spanish way


def test_small_windows_fold_panels():
    viz = PipelineVisualizer()
    full = viz.build_lines(100)
    small = viz.build_lines(100, 20)
    assert len(small) <= 20 < len(full)
    # a pane of 6 rows (80x24's) comparing two schedules shows each one's first rank, not GPipe's first two
    viz.show_step("same-time")
    assert "v = " not in viz.build_lines(120)[0].plain and "v=" not in viz.build_lines(78)[0].plain  # no chunks drawn
    tiny = [line.plain for line in viz.build_lines(78, 6)]
    assert len(tiny) <= 6 and sum(line.startswith("r0 ") for line in tiny) == 2
    assert any(line.startswith("GPipe") for line in tiny) and any(line.startswith("1F1B") for line in tiny)


def _events_from(tl: sim.Timeline, schedule: str, scale: float = 0.01, t0: float = 1000.0):
    for r in range(tl.p):
        for s, e, op in tl.blocks(r):
            yield {"kind": "pp_op", "rank": r, "schedule": schedule, "step": 0, "op": op.kind, "mb": op.mb,
                   "chunk": op.chunk, "stage": op.stage, "t0": t0 + s * scale, "t1": t0 + e * scale}


def test_measured_timeline_from_run_events():
    viz = PipelineVisualizer()
    viz.feed_event({"kind": "pp_config", "p": 4, "m": 8, "v": 2, "schedules": ["1f1b"]})
    assert viz.view == "run"  # a run's events switch to the measured view
    # a "measured" run that is the simulation stretched by a slow last stage
    tl = sim.simulate("1f1b", 4, 8, t_f=1.0, t_b=2.0)
    events = list(_events_from(tl, "1f1b"))
    for ev in events[:-1]:
        viz.feed_event(ev)
    assert "waiting for a complete step" in _text(viz)
    viz.feed_event(events[-1])
    text = _text(viz)
    assert "measured 1F1B, step 0: 330 ms" in text
    assert f"bubble {tl.bubble_fraction:.0%}" in text
    viz.feed_event({"kind": "summary", "lesson": "lesson5",
                    "schedules": {"1f1b": {"bubble_formula": formulas.bubble_fraction(4, 8)}}})
    assert f"(formula {formulas.bubble_fraction(4, 8):.0%})" in _text(viz)
    # unrelated events are ignored
    viz.feed_event({"kind": "log", "msg": "hello"})
    # a new run starts from a blank measured timeline
    viz.feed_event({"kind": "run_start", "run_id": "x", "nproc": 4})
    assert "measured 1F1B" not in _text(viz)


def test_keys_the_screen_binds_go_to_the_screen():
    asyncio.run(_screen_keys())


async def _screen_keys():
    from textual.binding import Binding
    from textual.screen import Screen

    class Panel(Screen):
        BINDINGS = [Binding("s", "stop", "Stop"), Binding("a", "again", "Again")]
        stopped = 0

        def compose(self):
            yield PipelineVisualizer()

        def action_stop(self):
            Panel.stopped += 1

    class Host(App):
        def on_mount(self):
            self.push_screen(Panel())

    app = Host()
    async with app.run_test(size=(120, 50)) as pilot:
        viz = app.screen.query_one(PipelineVisualizer)
        viz.focus()
        await pilot.press("s", "m")
        assert viz.p == 4 and Panel.stopped == 1  # "s" stopped the run instead of adding a stage
        assert viz.m == 9  # keys the screen does not bind still reach the visualizer
        hints = viz.build_lines(110)[-1].plain
        assert "stages" not in hints and "microbatches" in hints  # no hint for a key it cannot use


def test_terminal_view_of_distai_run():
    from distai.tutor.cli_run import lesson_view
    from distai.visualizers.pipeline import TerminalPipeline

    view = lesson_view("lesson5")
    assert isinstance(view, TerminalPipeline)
    assert view.renderables(100) == []  # nothing before the run's events
    view.feed({"kind": "pp_config", "p": 4, "m": 8, "v": 2})
    tl = sim.simulate("gpipe", 4, 8)
    for ev in _events_from(tl, "gpipe"):
        view.feed(ev)
    view.feed({"kind": "summary", "lesson": "lesson5", "schedules": {"gpipe": {
        "bubble_measured": 0.5, "bubble_formula": formulas.bubble_fraction(4, 8), "step_time_s": 0.2,
        "torch_step_time_s": 0.25, "max_grad_diff_vs_torch": 0.0,
        "stages": [{"peak_microbatches": 8.0, "peak_formula": 8}]}}})
    text = "\n".join(t.plain for t in view.renderables(100))
    assert "measured GPipe, step 0: 330 ms" in text
    assert "27.3%" in text and "0.80x" in text


def test_a_finished_run_shows_rank_0s_last_paragraph_whole():
    """`distai run lesson5` ended with its last six lines, which began inside a wrapped message
    ("7.73 ms, B = 13.37 ms; why they differ…)"): a finished run whose summary is the view shows rank
    0's last paragraph whole, unprefixed; a long or unparagraphed output, and a live run, its last six."""
    from distai.engine.run_state import RunState
    from distai.tutor.cli_run import PARAGRAPH_LINES, TAIL_LINES, last_paragraph, output_lines

    printed = ["GPipe", "  step: 9 ms", "", "1F1B", "  bubble: measured 25% · formula 20%",
               "          (replayed: the schedule with each measured block's work, mean F =",
               "          7.73 ms, B = 13.37 ms; why they differ: the check table)",
               "  rank  bubble", "     0   25%", "     1   26%", "  (peak: activations", "   order", ""]
    state = RunState()
    state.feed({"kind": "run_start", "t": 0.0, "n": 2})
    for line in printed:
        state.feed({"kind": "output", "t": 1.0, "rank": 0, "line": line})
    state.feed({"kind": "output", "t": 1.0, "rank": 1, "line": "rank 1's last word"})
    live = output_lines(state, summary=False).plain
    assert "rank 1's last word" in live and "1F1B" not in live and live.count("\n") == TAIL_LINES - 1
    state.feed({"kind": "run_end", "t": 2.0, "status": "ok"})
    shown = output_lines(state, summary=False).plain
    assert shown.strip().splitlines() == printed[3:-1]  # the paragraph, from its title, as printed
    assert last_paragraph(["a", "b"]) == [] and last_paragraph(["", *["x"] * (PARAGRAPH_LINES + 1)]) == []
    assert output_lines(state, summary=True).plain.strip().splitlines() == printed[:-1]  # a summary: all of it


def test_the_interleaved_step_draws_1f1b_above_the_interleaved_schedule_at_its_texts_m():
    """At 80x24 the interleaved step showed GPipe and 1F1B and hid the interleaved row, the step's subject;
    resumed at that step it drew m = 1."""
    v = visualizer_class("pipeline")("en")
    v.show_step("stages")  # m = 1, as a learner resuming later would have it
    v.show_step("interleaved")
    assert v.shown_schedules() == ["1f1b", "interleaved"] and v.m == 8
