"""Lesson 1's visualizer, driven through Textual's Pilot, checked against the models and formulas.

What is drawn (each cell's label and colour, the sending chunk, the status line's numbers) is read
back from the widget's rendered strips and compared with ``ring_model.states`` and
``lessons/lesson1/formulas.py``; a real 3-rank run of the lesson's experiment (one process group,
started once) is replayed into the widget, directly and through the tutor's ``o`` key. The ring
schedule's correctness for every N is ``tests/test_lesson1_ring_model.py``'s job; the tree and
naive models the widget compares it with are checked here.
"""
from __future__ import annotations

import json
import re

import pytest
from textual.app import App
from textual.geometry import Region

from distai.lessons.lesson1 import baselines, formulas
from distai.lessons.lesson1 import ring_model as model
from distai.lessons.units import format_bytes, format_time
from distai.visualizers import ring as R
from distai.visualizers import ring_drawing
from distai.visualizers.base import visualizer_class
from pilot_harness import async_test, mounted

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

RUN_N = 3
RUN_ARGS = ["--steps", "2", "--sweep-min", "1KiB", "--sweep-max", "16KiB", "--iters", "2", "--hidden", "8"]


def strips(vis):
    return vis.render_lines(Region(0, 0, vis.region.width, vis.region.height))


def screen_text(vis) -> list[str]:
    return [s.text for s in strips(vis)]


def drawn_rows(vis, n: int) -> dict[int, list]:
    """rank -> that rank's chunk cells as drawn: [(label, background, underlined)]."""
    out = {}
    for strip in strips(vis):
        text = strip.text.strip()
        head = text.split(" ", 1)[0]
        if head.startswith("r") and head[1:].isdigit() and int(head[1:]) < n and int(head[1:]) not in out:
            cells = [(seg.text.strip(), seg.style.bgcolor.triplet, bool(seg.style.underline))
                     for seg in strip if seg.style and seg.style.bgcolor and seg.text.strip().isdigit()
                     and seg.style.bgcolor.triplet != strips_bg(vis)]
            out[int(head[1:])] = cells
    return out


def strips_bg(vis):
    return vis.rich_style.bgcolor.triplet if vis.rich_style.bgcolor else None


def expected_bg(count, n, column, sending):
    return R.cell_style(count, n, column % 2 == 1, sending).bgcolor.triplet


# ------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("algorithm", [baselines.NAIVE, baselines.TREE])
def test_baselines_reduce_everywhere_with_the_formulas_costs(algorithm):
    for n in range(1, 17):
        holds = baselines.holds_after(algorithm, n)
        assert all(h == frozenset(range(n)) for h in holds[-1]), (algorithm, n)
        sched = baselines.schedule(algorithm, n)
        assert len(sched) == formulas.allreduce_steps(n, algorithm)
        for step in sched:  # one full-duplex link per rank: one send and one receive at most
            assert len({m.src for m in step}) == len(step) == len({m.dst for m in step})
        sent, got = baselines.link_bytes(algorithm, n, 1e9)
        assert max(max(sent), max(got)) == formulas.allreduce_bytes_per_rank(1e9, n, algorithm)
        assert sent[0] == got[0] == formulas.allreduce_bytes_per_rank(1e9, n, algorithm)  # rank 0 is busiest
    # negative control: the reduce half alone leaves the non-root ranks without the sum
    half = baselines.holds_after(algorithm, 5)[len(baselines.schedule(algorithm, 5)) // 2]
    assert half[0] == frozenset(range(5)) and half[1] != frozenset(range(5))


def test_ring_plan_is_the_model():
    for n in range(2, 17):
        plan = R.model_plan(R.RING, n)
        states = list(model.states(n))
        assert plan.total == len(plan.sends) == model.num_steps(n)
        for k, st in enumerate(states):
            assert plan.counts[k] == tuple(tuple(st.count(r, c) for c in range(n)) for r in range(n))
            assert plan.sent[k] == pytest.approx((model.bytes_sent(1.0, n, k),) * n)


def test_partial_alpha_beta_time_adds_up_to_the_formulas():
    for n in (2, 4, 8, 16):
        s, a, b = 1e9, 5e-6, 4e-11
        assert formulas.serial_messages_time(2 * (n - 1), s / n, a, b) == pytest.approx(
            formulas.ring_allreduce_time(s, n, a, b))
        assert formulas.serial_messages_time(formulas.allreduce_steps(n, "tree"), s, a, b) == pytest.approx(
            formulas.tree_allreduce_time(s, n, a, b))
    with pytest.raises(ValueError):
        formulas.serial_messages_time(-1, 1.0, 0, 0)


def test_colours_tell_counts_apart():
    for n in range(2, 17):
        rgbs = [R.count_rgb(k, n) for k in range(1, n + 1)]
        assert len(set(rgbs)) == n and rgbs[-1] == ring_drawing._COMPLETE


# ------------------------------------------------------------------------------------ drawing
def test_registered_as_the_ring_visualizer():
    assert visualizer_class("ring") is R.RingVisualizer is R.VISUALIZER


@async_test
async def test_stepping_draws_the_model_and_the_formulas_numbers():
    async with mounted(R.RingVisualizer, size=(60, 40)) as (pilot, vis):
        n, size = 4, R.DEFAULT_SIZE
        states = list(model.states(n))
        total = model.num_steps(n)
        for k in range(total + 1):
            rows = drawn_rows(vis, n)
            assert sorted(rows) == list(range(n))
            for r in range(n):
                sending = model.send_chunk(r, k, n) if k < total else None
                assert [label for label, _, _ in rows[r]] == [str(states[k].count(r, c)) for c in range(n)]
                assert [bg for _, bg, _ in rows[r]] == [
                    expected_bg(states[k].count(r, c), n, c, c == sending) for c in range(n)]
                assert [c for c, (_, _, u) in enumerate(rows[r]) if u] == ([] if sending is None else [sending])
            text = "\n".join(screen_text(vis))
            assert f"{k} of {total} steps done" in text
            sent = format_bytes(model.bytes_sent(size, n, k))
            per_rank = format_bytes(formulas.allreduce_bytes_per_rank(size, n, "ring"))
            assert f"sent per rank {sent} of 2(N−1)/N·S = {per_rank}" in text
            t = formulas.serial_messages_time(k, size / n, R.DEFAULT_ALPHA, R.DEFAULT_BETA)
            t_all = formulas.ring_allreduce_time(size, n, R.DEFAULT_ALPHA, R.DEFAULT_BETA)
            assert f"α-β time {format_time(t)} of {format_time(t_all)}" in text
            if k < total:
                phase = model.phase_of(k, n)[0]
                assert phase in text
                for r in range(n):  # the arrow names the chunk and the right neighbour
                    assert f"c{model.send_chunk(r, k, n)} " in text
                await pilot.press("full_stop")
        assert "done" in "\n".join(screen_text(vis))
        # after N-1 steps each rank owns exactly one complete chunk (what the lesson says to check)
        for _ in range(total - (n - 1)):
            await pilot.press("comma")
        rows = drawn_rows(vis, n)
        for r in range(n):
            assert [c for c, (label, _, _) in enumerate(rows[r]) if label == str(n)] == [model.owned_chunk(r, n)]


@async_test
async def test_keys_change_n_size_algorithm_and_the_comparison_follows():
    async with mounted(R.RingVisualizer, size=(60, 40)) as (pilot, vis):
        await pilot.press(*["right_square_bracket"] * 20)
        assert vis.n == 16
        rows = drawn_rows(vis, 16)
        assert sorted(rows) == list(range(16)) and all(len(cells) == 16 for cells in rows.values())
        await pilot.press(*["left_square_bracket"] * 20)
        assert vis.n == 2
        await pilot.press(*["right_square_bracket"] * 6, "S")  # N = 8, 256 MiB
        assert vis.n == 8 and vis.size_bytes == 256 << 20
        text = "\n".join(screen_text(vis))
        for algo, name in ((R.RING, "ring"), (R.TREE, "tree"), (R.NAIVE, "naive")):
            line = next(line for line in text.splitlines() if line.strip().lstrip("▸ ").startswith(name + " "))
            b = formulas.allreduce_bytes_per_rank(256 << 20, 8, algo)
            t = formulas.allreduce_time(256 << 20, 8, R.DEFAULT_ALPHA, R.DEFAULT_BETA, algo)
            assert format_bytes(b, binary=True) in line and format_time(t) in line
            assert f" {formulas.allreduce_steps(8, algo)} " in line
        await pilot.press("a")  # tree: whole buffers, 2·⌈log2 8⌉ = 6 steps
        assert vis.algorithm == R.TREE
        await pilot.press("end")
        text = "\n".join(screen_text(vis))
        assert "6 of 6 steps done" in text
        assert "rank 0 link: in 768 MiB, out 768 MiB, of 768 MiB each way" in text
        rows = drawn_rows(vis, 8)
        assert all(label == "8" for cells in rows.values() for label, _, _ in cells)
        await pilot.press("a", "0", "full_stop", "full_stop")  # naive: ranks 1, 2 reduced into rank 0
        assert vis.algorithm == R.NAIVE
        rows = drawn_rows(vis, 8)
        assert {label for label, _, _ in rows[0]} == {"3"} and {label for label, _, _ in rows[1]} == {"1"}
        assert all(u for _, _, u in rows[3])  # rank 3 sends its whole buffer next
        await pilot.press("plus", "plus", "minus")
        assert vis.speed == 2.0


@async_test
async def test_mouse_controls_and_scrolling():
    async with mounted(R.RingVisualizer, size=(60, 40)) as (pilot, vis):
        def spot(action):
            y, x0, x1, _ = next(h for h in vis.hits if h[3] == action)
            return (x0 + 1 + 1, y)  # +1 for the widget's left padding

        await pilot.click("#v", offset=spot("step(1)"))
        assert vis.frame == 1
        await pilot.click("#v", offset=spot("ranks(1)"))
        assert vis.n == 5
        await pilot.click("#v", offset=spot("algorithm"))
        assert vis.algorithm == R.TREE
        await pilot.click("#v", offset=spot("chart"))
        assert vis.view == "chart"
        assert any("distai run lesson1" in line for line in screen_text(vis))
        await pilot.click("#v", offset=spot("chart"))
        from textual import events

        def wheel(cls):
            vis.post_message(cls(vis, 3, 3, 0, 1, 0, False, False, False))

        wheel(events.MouseScrollDown)
        wheel(events.MouseScrollDown)
        await pilot.pause()
        assert vis.frame == 2  # (the algorithm click restarted the animation)
        wheel(events.MouseScrollUp)
        await pilot.pause()
        assert vis.frame == 1


@async_test
async def test_play_animates_and_reduce_scatter_step_stops_at_its_end():
    async with mounted(R.RingVisualizer, size=(60, 40)) as (pilot, vis):
        vis.show_step("reduce-scatter")
        assert vis.playing and vis.algorithm == R.RING and vis.n == 4
        vis.speed = 8.0
        frames_before = vis.frames_rendered
        for _ in range(60):
            await pilot.pause(0.05)
            if not vis.playing:
                break
        assert not vis.playing and vis.frame == 3  # N-1: the end of reduce-scatter
        assert vis.frames_rendered - frames_before >= 6  # frames in between, not only step ends
        text = "\n".join(screen_text(vis))
        assert "reduce-scatter ✓" in text and "all-gather" in text
        vis.show_step("all-gather")
        assert vis.frame == 3 and vis.playing
        vis.speed = 8.0
        for _ in range(60):
            await pilot.pause(0.05)
            if not vis.playing:
                break
        assert vis.frame == 6
        vis.show_step("naive")
        assert vis.algorithm == R.NAIVE and vis.frame == 0
        vis.show_step("worked-example")
        vis.action_to_end()
        text = "\n".join(screen_text(vis))
        assert "70.1 ms of 70.1 ms" in text and "1.75 GB" in text  # the lesson's worked example
        # the first step's caption tells where the ring starts; played to the end, it says where it ended
        vis.show_step("replicate")
        start = " ".join(screen_text(vis))
        vis.action_step(1)  # mid reduce-scatter, then mid all-gather: each phase's own caption, not the start's
        await pilot.pause()
        assert "starts with its own" not in " ".join(screen_text(vis))
        assert "each hop adds one contribution" in " ".join(screen_text(vis))
        vis.action_step(vis.figures.plan(vis.state).phases.index("all-gather"))
        await pilot.pause()
        assert "chase each other" in " ".join(screen_text(vis))
        vis.action_to_end()
        await pilot.pause()
        end = " ".join(screen_text(vis))
        assert "starts with its own" in start and "starts with its own" not in end
        assert "Done: every chunk" in end


@async_test
async def test_spanish_and_narrow_short_panes():
    async with mounted(R.RingVisualizer, "es", size=(46, 34)) as (pilot, vis):
        vis.n = 16
        vis.refresh()
        await pilot.pause()
        text = screen_text(vis)
        assert all(len(line) <= 46 for line in text)
        assert sorted(drawn_rows(vis, 16)) == list(range(16))
        joined = " ".join(line.strip() for line in text)
        assert "enviado por rank 0 B de 2(N−1)/N·S = 1,88 GB" in joined
        assert "tiempo α-β 0 s de 75,1 ms" in joined
    async with mounted(R.RingVisualizer, size=(76, 6)) as (pilot, vis):  # the tutor's pane at 80×24
        text = screen_text(vis)
        assert sorted(drawn_rows(vis, 4)) == [0, 1, 2, 3]
        assert any("steps done" in line for line in text)
        assert any(h[3] == "play" for h in vis.hits)
    # the alpha-beta step at 80×24 (N = 8, the time stressed): the time leads the figures (it was cut off)
    # and the hidden ranks' note fits its column (it read "… 5 ranks más (un panel más alto los muestr")
    async with mounted(R.RingVisualizer, "es", size=(76, 7)) as (pilot, vis):
        vis.show_step("alpha-beta")
        vis.refresh()
        await pilot.pause()
        text = screen_text(vis)
        assert any("tiempo α-β 0 s de" in line for line in text), text
        assert any(re.search(r"… \d ranks? más \(V los muestra\) +│", line) for line in text), text


def test_sweep_chart_places_points_and_the_fitted_curve():
    a, b = 1e-3, 1e-6  # t = a + b·S: busbw climbs to 1.5/b = 1.5 MB/s
    sizes = [1024 * 4 ** k for k in range(5)]
    rows = [{"size": s, "n": 4, "ring_busbw": formulas.busbw(s, a + b * s, 4),
             "ar_busbw": formulas.busbw(s, a + b * s, 4) / 2} for s in sizes]
    fits = {"ring": {"impl": "ring", "n": 4, "a_s": a, "b_s_per_byte": b, "alpha_s": a / 6, "beta_s_per_byte": b / 1.5}}
    lines = R.sweep_chart(rows, fits, 40, 14, "en")
    plot = [line.plain for line in lines if "┤" in line.plain or "│" in line.plain]
    col = {ch: [(y, x) for y, line in enumerate(plot) for x, c in enumerate(line) if c == ch] for ch in "●◆"}
    assert len(col["●"]) == 5 and len(col["◆"]) == 5
    ring = sorted(col["●"], key=lambda p: p[1])
    assert [x for _, x in ring] == sorted(x for _, x in ring) and ring[0][1] == 10 and ring[-1][1] == 39
    assert [y for y, _ in ring] == sorted((y for y, _ in ring), reverse=True)  # up and to the right
    assert min(y for y, _ in ring) <= 1  # the biggest busbw is near the top
    assert "1.5 MB/s" in lines[1].plain or "1.6 MB/s" in lines[1].plain
    assert lines[-1].plain.startswith("fit ring: α 167 µs, 1/β 1.5 MB/s")
    dots = [y for y, line in enumerate(plot) if "·" in line]
    assert dots  # the fitted curve, busbw(S, a + b·S, 4), is drawn
    assert R.sweep_chart([], {}, 40, 5, "en")[0].plain.startswith("No sweep yet")


@async_test
async def test_sweep_chart_widget_for_run_views():
    class ChartHost(App):
        def compose(self):
            yield R.SweepChart(id="c")

    app = ChartHost()
    async with app.run_test(size=(50, 16)) as pilot:
        chart = app.query_one("#c")
        await pilot.pause()
        assert "No sweep yet" in "".join(s.text for s in strips(chart))
        rows = [{"size": 1024 * 4 ** k, "n": 2, "ring_busbw": 1e6 * (k + 1), "ar_busbw": 1e6} for k in range(4)]
        chart.update(rows, {})
        await pilot.pause()
        assert sum(s.text.count("●") for s in strips(chart)) == 4 + 1  # four sizes and the legend


# ------------------------------------------------------------------------------------ a real run
def _traced_run(rank: int, world_size: int) -> list[dict]:
    import os
    import tempfile

    from distai.engine.events import read_events
    from distai.engine.experiments import lesson1

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DISTAI_EVENTS_DIR"] = tmp
        lesson1.main(RUN_ARGS)
        del os.environ["DISTAI_EVENTS_DIR"]
        return list(read_events(os.path.join(tmp, f"rank{rank}.jsonl")))


@pytest.fixture(scope="module")
def run_events():
    from distai.engine.testing import run_in_group

    per_rank = run_in_group(_traced_run, RUN_N, timeout_s=240)
    return per_rank


def _merged(per_rank):
    return sorted((e for events in per_rank for e in events), key=lambda e: e.get("t", 0.0))


@async_test
async def _replay_checks(per_rank):
    events = _merged(per_rank)
    async with mounted(R.RingVisualizer, size=(60, 60)) as (pilot, vis):
        vis.feed_event({"kind": "run_start", "run_id": "test"})
        for e in events:
            vis.feed_event(e)
        vis.action_restart()
        await pilot.pause()
        assert vis.source == "run" and vis.call == 0 and vis.effective_n == RUN_N
        plan = vis.plan
        assert plan.mismatches == 0 and plan.ready == plan.total == model.num_steps(RUN_N)
        states = list(model.states(RUN_N))
        steps0 = {(e["step"], e["rank"]): e for e in events if e["kind"] == "ring_step" and e["call"] == 0}
        size = next(iter(steps0.values()))["size"]
        for k in range(plan.total + 1):
            rows = drawn_rows(vis, RUN_N)
            for r in range(RUN_N):
                assert [label for label, _, _ in rows[r]] == [str(states[k].count(r, c)) for c in range(RUN_N)]
            text = "\n".join(screen_text(vis))
            sent = [sum(steps0[(j, r)]["bytes"] for j in range(k)) for r in range(RUN_N)]
            lo, hi = format_bytes(min(sent)), format_bytes(max(sent))
            assert f"sent per rank {hi if lo == hi else lo + '–' + hi} of" in text
            assert "✓ every message matches the model" in text
            vis.action_step(1)
            await pilot.pause()
        # every rank sent 2(N-1) chunks: the whole buffer minus its own chunk, twice
        total_sent = [sum(steps0[(j, r)]["bytes"] for j in range(plan.total)) for r in range(RUN_N)]
        assert sum(total_sent) == pytest.approx(formulas.allreduce_bytes_per_rank(size, RUN_N) * RUN_N)
        # the sweep draws as a chart: one ● per size
        sweeps = [e for e in events if e["kind"] == "sweep"]
        vis.action_chart()
        await pilot.pause()
        text = screen_text(vis)
        assert sum(line.count("●") for line in text) - 1 == len(sweeps)  # (one more in the legend)
        assert any(line.strip().startswith("fit ring: α") for line in text)
        # the next call (a sweep warm-up) is another recorded ring
        vis.action_next_call()
        assert vis.call != 0 and vis.plan.mismatches == 0
        # a message that did not follow the schedule is flagged
        bad = dict(steps0[(1, 0)], chunk=(steps0[(1, 0)]["chunk"] + 1) % RUN_N)
        vis.feed_event({"kind": "run_start", "run_id": "tampered"})
        for e in events:
            vis.feed_event(bad if e is steps0[(1, 0)] else e)
        await pilot.pause()
        assert vis.plan.mismatches == 1
        assert any("1 messages differ from the model" in line for line in screen_text(vis))
        # live: ranks 0 and 1 have finished step 2, rank 2 not yet -> the animation waits for it
        vis.feed_event({"kind": "run_start", "run_id": "live"})
        for e in events:
            if e["kind"] == "ring_step" and e["call"] == 0 and (e["step"], e["rank"]) < (2, 2):
                vis.feed_event(e)
        vis.action_to_end()
        await pilot.pause()
        assert vis.plan.ready == 2 and vis.frame == 2
        assert any("waiting for ranks 2" in line for line in screen_text(vis))
    return True


def test_a_real_run_replays_into_the_widget(run_events):
    assert all(any(e["kind"] == "ring_step" for e in events) for events in run_events)
    _replay_checks(run_events)


@async_test
async def _tutor_replay(per_rank, tmp_path):
    from distai.engine.runs import create_run
    from distai.tutor.app import DistaiApp
    from distai.tutor.paths import runs_root
    from distai.tutor.screens.help import HelpScreen

    record = create_run(runs_root(), "lesson1", "distai.engine.experiments.lesson1")
    for rank, events in enumerate(per_rank):
        (record.events_dir / f"rank{rank}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    record.status, record.exit_code, record.duration_s = "ok", 0, 1.0
    record.save()
    app = DistaiApp("en", lesson_id="lesson1")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        await screen.show_step(len(screen.lesson.steps) - 1)  # try-it
        vis = screen.visualizer
        assert isinstance(vis, R.RingVisualizer) and not vis.run.calls
        vis.focus()
        await pilot.press("o")
        await pilot.pause()
        assert vis.run.calls and vis.source == "run" and vis.effective_n == RUN_N
        assert len(vis.run.sweep) == sum(e["kind"] == "sweep" for e in per_rank[0])
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = "".join(seg.text for seg in app.console.render(app.screen.query_one("#help-keys").content))
        for _, label in vis.key_help():
            assert label in help_text
    return True


def test_the_tutor_replays_the_latest_run_with_o_and_lists_the_keys(run_events, tmp_path):
    _tutor_replay(run_events, tmp_path)


@async_test
async def test_o_without_runs_says_so():
    from distai.tutor.app import DistaiApp

    app = DistaiApp("en", lesson_id="lesson1")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await app.screen.show_step(4)
        vis = app.screen.visualizer
        vis.focus()
        await pilot.press("o")
        await pilot.pause()
        assert not vis.run.calls
        assert any("No lesson1 run yet" in str(n.message) for n in app._notifications)


@async_test
async def test_the_comparisons_column_names_wrap_in_a_narrow_spanish_pane():
    """At 120×40 in Spanish the pane is 44 columns and the column names 52: they were dropped, leaving
    the three rows' figures unnamed; they now wrap at their separators."""
    async with mounted(R.RingVisualizer, language="es", size=(44, 40)) as (pilot, vis):
        text = "\n".join(screen_text(vis))
        assert "enlace más cargado (un sentido) · pasos ·" in text and "tiempo α-β" in text
    assert R._fit_at("a · b · c", " · ", 7) == ["a · b ·", "c"] and R._fit_at("a · b", " · ", 80) == ["a · b"]
    for width in range(20, 60):  # the mark a continued line ends in counts too (the longest part and its mark: 20)
        assert all(len(line) <= width for line in R._fit_at("enlace más cargado · pasos · tiempo α-β", " · ", width))


def test_the_busbw_step_loads_the_latest_run_and_is_quiet_without_one(tmp_path, monkeypatch):
    """The busbw step drew "No sweep yet … then press o" with runs saved: a step that shows the learner's run
    asks for the latest (the lesson screen replays it), and says nothing when there is none."""
    import asyncio

    from distai.lessons.lesson1.events import SWEEP
    from distai.tutor.app import DistaiApp
    from pilot_harness import lesson_step, saved_run

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))

    async def main():
        app = DistaiApp("en")
        async with app.run_test(size=(120, 40)) as pilot:
            v = (await lesson_step(app, pilot, "lesson1", "busbw")).visualizer
            assert not v.run.sweep and not app._notifications  # no run, no toast
        sweep = [SWEEP.event({"size": 1024 * 4 ** k, "n": 4, "ring_busbw": 1e6 * (k + 1), "ar_busbw": 1e6,
                              "t": 1.0 + k, "rank": 0}) for k in range(4)]
        saved_run(tmp_path / "runs", "lesson1", sweep)
        app = DistaiApp("en")
        async with app.run_test(size=(120, 40)) as pilot:
            v = (await lesson_step(app, pilot, "lesson1", "busbw")).visualizer
            assert len(v.run.sweep) == 4 and v.state.view == "chart"

    asyncio.run(main())


def test_o_replays_the_newest_finished_run_not_a_newer_one_stopped_at_its_start(tmp_path):
    """A run stopped seconds after it began (no sweep, no step) hid the finished run before it: `o` said it
    replayed the stopped one and the pane kept the simulation. The newest run that ended ok is replayed; with
    none ok, the newest of any ending (a stopped run's steps still show)."""
    from distai.tutor.replay import latest_run
    from pilot_harness import saved_run

    finished = saved_run(tmp_path, "lesson1", [], created=1000.0)
    stopped = saved_run(tmp_path, "lesson1", [], created=2000.0, status="stopped")
    saved_run(tmp_path, "lesson2", [], created=3000.0)  # another lesson's newer run is not lesson 1's
    assert latest_run("lesson1", tmp_path).id == finished.id
    # back from the run panel, the run that just ended is shown, stopped or not
    assert latest_run("lesson1", tmp_path, newest=True).id == stopped.id
    finished.status = "failed"
    finished.save()
    assert latest_run("lesson1", tmp_path).id == stopped.id
    assert latest_run("lesson3", tmp_path) is None
