"""Lesson 1's view model (``lessons/lesson1/ring_view.py``) alone, no Textual: the states the keys,
the steps and a run's events lead to, and the figures drawn, against the models and formulas."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from distai.lessons.lesson1 import formulas, ring_model
from distai.lessons.lesson1 import ring_view as rv
from distai.lessons.lesson1.ring_plan import NAIVE, RING, TREE
from distai.lessons.registry import step_view

ALGOS = (RING, TREE, NAIVE)


def _play(view: rv.RingView, state: rv.RingState, dt: float = 0.25, limit: int = 1000) -> rv.RingState:
    state = replace(state, playing=True)
    for _ in range(limit):
        if not state.playing:
            return state
        state = view.advance(state, dt)
    raise AssertionError("the animation did not stop")


def test_the_view_model_loads_without_textual_or_torch():
    code = "import sys, distai.lessons.lesson1.ring_view; print('textual' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("n", [2, 4, 7, 16])
def test_playing_walks_every_step_and_the_status_is_the_formulas(n):
    view, state = rv.RingView(), rv.RingState(n=n)
    size, a, b = state.size_bytes, state.alpha, state.beta
    seen = []
    state = replace(state, playing=True)
    while state.playing:
        if state.progress == 0.0:
            seen.append(state.frame)
            st = view.status(state, state.frame)
            assert st.sent == pytest.approx(ring_model.bytes_sent(size, n, state.frame))
            assert st.time_now == pytest.approx(formulas.serial_messages_time(state.frame, size / n, a, b))
            assert st.phase == ring_model.phase_of(state.frame, n)[0]
            assert (st.finished_phase is not None) == (state.frame == n - 1)  # reduce-scatter just ended
        state = view.advance(state, 0.5)
    assert seen == list(range(ring_model.num_steps(n)))
    assert state.frame == ring_model.num_steps(n) and view.at_end(state)
    st = view.status(state, state.frame)
    assert st.phase is None and st.time_now == pytest.approx(formulas.ring_allreduce_time(size, n, a, b))
    assert st.total_bytes == pytest.approx(formulas.allreduce_bytes_per_rank(size, n, RING))
    assert st.mismatches is None and st.waiting == ()


def test_the_lessons_steps_stop_where_their_phase_ends():
    view = rv.RingView()
    state = view.show_step(rv.RingState(), step_view("ring", "reduce-scatter"), "reduce-scatter")
    assert state.playing and state.algorithm == RING and state.frame == 0
    state = _play(view, state)
    assert state.frame == state.n - 1 and state.stop_at is None  # N-1: the end of reduce-scatter
    state = view.show_step(state, step_view("ring", "all-gather"), None)
    assert state.frame == state.n - 1 and state.playing
    assert _play(view, state).frame == ring_model.num_steps(state.n)
    chart = view.show_step(state, {"show": "chart"}, None)
    assert chart.view == "chart" and chart.frame == state.frame  # only the view changes


def test_the_comparison_is_the_three_algorithms_costs():
    view = rv.RingView()
    state = rv.RingState(n=8, size_bytes=256 << 20)
    for algorithm in (RING, TREE, NAIVE):
        state = replace(state, algorithm=algorithm)
        end = view.to_end(state)
        costs = view.comparison(end, end.frame)
        assert [c.algorithm for c in costs] == [RING, TREE, NAIVE]
        for c in costs:
            assert c.link_bytes == formulas.allreduce_bytes_per_rank(256 << 20, 8, c.algorithm)
            assert c.steps == formulas.allreduce_steps(8, c.algorithm)
            assert c.time == pytest.approx(formulas.allreduce_time(256 << 20, 8, state.alpha, state.beta, c.algorithm))
        shown = [c for c in costs if c.done_bytes is not None]
        assert [c.algorithm for c in shown] == [algorithm]
        assert shown[0].done_bytes == pytest.approx(shown[0].link_bytes)  # all of it moved at the end
        assert view.comparison(state, 0)[ALGOS.index(algorithm)].done_bytes == 0


def test_keys_move_the_state_within_its_ranges():
    view, state = rv.RingView(), rv.RingState()
    for _ in range(20):
        state = view.ranks(state, 1)
    assert state.n == rv.N_MAX
    for _ in range(20):
        state = view.ranks(state, -1)
    assert state.n == rv.N_MIN
    sizes = []
    for _ in range(len(rv.SIZES)):
        state = rv.next_size(state, 1)
        sizes.append(state.size_bytes)
    assert sizes[-1] == rv.SIZES[-1] and sizes == sorted(sizes)
    assert [rv.next_algorithm(replace(state, algorithm=a)).algorithm for a in ALGOS] == [TREE, NAIVE, RING]
    halfway = replace(state, frame=1, progress=0.5)
    assert view.seek(halfway, -1) == replace(halfway, progress=0.0)  # back to the start of the step under way
    assert view.seek(replace(halfway, progress=0.0), -1).frame == 0
    assert view.seek(state, 100).frame == view.plan(state).total


def _ring_events(n: int, size: int, upto: tuple[int, int] | None = None) -> list[dict]:
    events = [{"kind": "run_start", "run_id": "t"}]
    for step in range(ring_model.num_steps(n)):
        for r in range(n):
            if upto is not None and (step, r) >= upto:
                return events
            events.append({"kind": "ring_step", "call": 0, "n": n, "size": size, "step": step, "rank": r,
                           "chunk": ring_model.send_chunk(r, step, n), "to": ring_model.right(r, n),
                           "recv_chunk": ring_model.recv_chunk(r, step, n), "bytes": size // n,
                           "phase": ring_model.phase_of(step, n)[0]})
    return events


def test_a_runs_first_call_takes_over_and_a_live_run_waits_for_its_ranks():
    view, state = rv.RingView(), rv.RingState()
    for event in _ring_events(3, 3000):
        state = view.feed(state, event) or state
    assert state.source == "run" and state.call == 0 and not state.follow_run and state.playing
    # on the busbw step (a chart) the loaded run's ring waits behind the chart: o showed the replay instead
    chart = replace(rv.RingState(), view="chart")
    for event in _ring_events(3, 3000):
        chart = view.feed(chart, event) or chart
    assert chart.view == "chart" and chart.source == "run" and not chart.playing
    assert view.effective_n(state) == 3 and view.effective_size(state) == 3000
    end = _play(view, state)
    st = view.status(end, end.frame)
    assert end.frame == ring_model.num_steps(3) and st.mismatches == 0
    assert st.sent_range == (2 * 2 * 1000, 2 * 2 * 1000)  # 2(N−1) chunks of S/N each
    assert view.feed(state, {"kind": "nothing we know"}) is None
    assert view.switch_source(end).source == "sim"
    live, state = rv.RingView(), rv.RingState()
    for event in _ring_events(3, 3000, upto=(2, 2)):  # rank 2 has not finished step 2
        state = live.feed(state, event) or state
    state = live.to_end(state)
    assert state.frame == 2 and live.status(state, 2).waiting == (2,)
    assert live.advance(replace(state, playing=True), 1.0).frame == 2  # it waits, still playing
    assert rv.RingView().switch_source(rv.RingState()) is None  # no run to switch to


def test_a_command_in_a_widgets_text_is_drawn_bold_not_between_backticks():
    """Lesson 1's busbw step read "Ejecuta `distai run lesson1 --cpu 4` y pulsa o": a widget has no Markdown."""
    from distai.lessons.lesson3.run_timeline import RunTimeline
    from distai.visualizers.ring_chart import sweep_chart
    from distai.visualizers.run_timeline import timeline_lines

    for lang, command in (("en", "distai run lesson1 --cpu 4"), ("es", "distai run lesson1 --cpu 4")):
        lines = sweep_chart([], {}, 40, 10, lang=lang)
        joined = " ".join(line.plain for line in lines)
        assert "`" not in joined and all(line.cell_len <= 40 for line in lines), joined
        bold = [line.plain[sp.start:sp.end] for line in lines for sp in line.spans if "bold" in str(sp.style)]
        assert " ".join(bold) == command, bold  # the command, wrapped or not
        waiting = timeline_lines(RunTimeline(), 80, lang)[0]
        assert "`" not in waiting.plain and "distai run lesson3 --cpu 2" in waiting.plain
