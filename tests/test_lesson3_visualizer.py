"""Lesson 3's visualizer: the goodput curve with Young's, Daly's and the simulated optimum, the
sliders, a simulated day, and the run timeline fed by a run's events (English and Spanish)."""
from __future__ import annotations

import pytest

from distai.lessons.lesson3 import formulas as f
from distai.lessons.lesson3.run_timeline import RunTimeline
from distai.visualizers.base import make_visualizer
from distai.visualizers.failures import LADDERS, LLAMA3, FailuresVisualizer, ladder_step
from pilot_harness import async_test, drawn_text, mounted


def run_events() -> list[dict]:
    """What a 12-step run with rank 1 killed during step 7 and checkpoints every 3 steps emits."""
    ev = [{"kind": "run_start", "run_id": "r1"},
          {"kind": "phase", "name": "start", "n": 2, "attempt": 0},
          {"kind": "phase", "name": "train", "steps": 12, "attempt": 0}]
    ev += [{"kind": "step", "step": i, "of": 12, "loss": 1.0 / (i + 1), "attempt": 0, "redo": False} for i in range(6)]
    ev += [{"kind": "checkpoint", "step": s, "bytes": 4096, "seconds": 0.01, "attempt": 0} for s in (3, 6)]
    ev += [{"kind": "failure", "rank": 1, "step": 7, "phase": "step", "cause": "--kill-rank", "attempt": 0},
           {"kind": "phase", "name": "start", "n": 2, "attempt": 1},
           {"kind": "restart", "attempt": 1, "from_step": 6, "checkpoint": "step_00000006", "skipped": [],
            "failed_rank": 1, "failed_step": 7, "lost_steps": 0, "restart_count": 1, "load_s": 0.02}]
    ev += [{"kind": "step", "step": i, "of": 12, "loss": 1.0 / (i + 1), "attempt": 1, "redo": False}
           for i in range(6, 12)]
    ev += [{"kind": "checkpoint", "step": s, "bytes": 4096, "seconds": 0.01, "attempt": 1} for s in (9, 12)]
    ev += [{"kind": "compare", "steps": 12, "identical": True, "equal_steps": 12, "first_diff_step": None,
            "max_abs_diff": 0.0, "weights_identical": True, "attempt": 1},
           {"kind": "run_end", "status": "ok"}]
    return ev


def plain(v: FailuresVisualizer, width=130, height=34) -> str:
    return drawn_text(v, width, height)


def test_registered_under_the_lessons_name():
    assert isinstance(make_visualizer("failures"), FailuresVisualizer)


def test_ladders():
    assert ladder_step(LLAMA3.gpu_mtbf, LADDERS["gpu_mtbf"], up=False) == 50_000 * 3600
    assert ladder_step(60, LADDERS["cost"], up=True) == 120 and ladder_step(60, LADDERS["cost"], up=False) == 30
    assert ladder_step(0, LADDERS["restart"], up=False) == 0


@async_test
async def test_curve_marks_young_daly_and_the_simulated_optimum():
    async with mounted(FailuresVisualizer, size=(110, 34)) as (pilot, v):
        text = plain(v)
        M = f.job_mtbf(LLAMA3.gpu_mtbf, LLAMA3.gpus)
        assert "G = 16,384 GPUs" in text and "M = 3.09 h" in text
        assert "Young √(2CM) = 19.3 min" in text and "Daly = 18.6 min" in text
        s = v.sweep()
        assert s.daly == pytest.approx(f.daly_interval(M, 60, 300))
        assert abs(s.optimum - s.daly) / s.daly < 0.02
        assert "S simulated optimum = 18.6 min" in text
        assert "wasted at Daly's interval: 12.4%" in text  # the lesson's worked example


@async_test
async def test_sliders_move_the_cluster_and_the_optimum_follows_daly():
    async with mounted(FailuresVisualizer, size=(110, 34)) as (pilot, v):
        # the worked example's second case: 50,000 h per GPU, 16,384 GPUs, C = 10 s, R = 5 min
        await pilot.press("M", "C", "C", "C")
        assert (v.params.gpu_mtbf, v.params.cost, v.params.restart, v.params.gpus) == (50_000 * 3600, 10, 300, 16384)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        s = v.sweep(compute=False)
        assert s is not None and s.cost == 10
        assert abs(s.optimum - s.daly) / s.daly < 0.02
        assert s.daly == pytest.approx(f.daly_interval(f.job_mtbf(50_000 * 3600, 16384), 10, 300))
        await pilot.press("d", "e")  # twice the GPUs: the interval shrinks about √2
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        s2 = v.sweep(compute=False)
        assert v.params.gpus == 32768 and v.params.restart == 600
        assert s2.daly / s.daly == pytest.approx(2 ** -0.5, rel=0.02)
        assert "G = 32,768 GPUs" in plain(v)
        await pilot.press("0")
        assert v.params.gpus == 16384 and v.params.cost == 60


@async_test
async def test_a_simulated_day_and_the_views():
    async with mounted(FailuresVisualizer, size=(110, 34)) as (pilot, v):
        v.show_step("failures")
        assert v.view == "day"
        text = plain(v)
        assert "a simulated day on this cluster, checkpointing every 18.6 min (Daly)" in text
        assert "failures in 24 h" in text and "✕" in text and "◆" in text
        await pilot.press("g")
        assert v.view == "run"
        assert "distai run lesson3" in plain(v)  # how to get a run, until one is fed
        await pilot.press("1")
        assert v.view == "interval"
        v.show_step("elastic")
        assert v.view == "run"


@async_test
async def test_run_timeline_fed_by_events():
    async with mounted(FailuresVisualizer, size=(110, 34)) as (pilot, v):
        for e in run_events():
            v.feed_event(e)
        await pilot.pause()
        assert v.view == "run"
        text = plain(v)
        assert "run timeline: 12 steps on 2 ranks" in text
        rows = [line for line in text.splitlines() if line.startswith("try ")]
        assert rows[0].startswith("try 0") and rows[0].count("◆") == 2 and "✕" in rows[0]
        assert rows[1].startswith("try 1") and "↻" in rows[1] and rows[1].count("◆") == 2
        assert "rank 1 killed (--kill-rank) during step 7" in text
        assert "resumed from the checkpoint after step 6" in text
        assert "12/12 losses identical (==), weights identical" in text


@async_test
async def test_spanish():
    async with mounted(FailuresVisualizer, "es", size=(110, 34)) as (pilot, v):
        text = plain(v)
        assert "óptimo simulado = 18,6 min" in text and "G = 16.384 GPUs" in text
        for e in run_events():
            v.feed_event(e)
        text = plain(v)
        assert "línea de tiempo: 12 pasos en 2 ranks" in text and "pérdidas idénticas" in text


def test_run_timeline_cells():
    tl = RunTimeline()
    for e in run_events():
        tl.feed(e)
    rows = dict(tl.cells(12))
    assert rows[0][:6] == ["step", "step", "checkpoint", "step", "step", "checkpoint"]
    assert rows[0][6] == "failure" and rows[0][7:] == ["empty"] * 5
    assert rows[1][5] == "restart" and rows[1][8] == "checkpoint" and rows[1][11] == "checkpoint"
    assert tl.done == 12 and len(tl.failures) == 1 and len(tl.restarts) == 1
    # a new run starts a new timeline; a relaunch of the same run does not
    tl.feed({"kind": "run_start", "run_id": "r1", "relaunch": 1})
    assert not tl.empty
    tl.feed({"kind": "run_start", "run_id": "r2"})
    assert tl.empty


def test_checkpoint_marks_are_evenly_spaced_whatever_the_width():
    """The audit: the side timeline spaced its checkpoint marks unevenly (45 steps on 23 cells put step k at
    ⌊(k−1)·23/45⌋). Where a cell stands for p steps, a checkpoint every 10 steps lands every 10/p cells, and
    the axis writes each step number over that step's first cell; where a step has k cells, every step k."""
    import re

    from distai.lessons.lesson3.run_timeline import step_columns
    from distai.visualizers.run_timeline import _axis, _layout

    for n in (40, 45, 60, 97, 120):
        for width in range(12, 130):
            cols, per = _layout(n, width, 8)
            spans = [step_columns(k, n, cols) for k in range(1, n + 1)]
            if per > 1:
                assert [r[0] for r in spans] == [(k - 1) // per for k in range(1, n + 1)], (n, width)
                if 10 % per == 0:
                    marks = [spans[k - 1][-1] for k in range(10, n + 1, 10)]
                    assert len({b - a for a, b in zip(marks, marks[1:])}) <= 1, (n, width, marks)
            else:
                assert cols % n == 0 and {len(r) for r in spans} == {cols // n}, (n, width)
            for m in re.finditer(r"\d+", _axis(n, cols, 0).plain):
                assert m.start() == spans[int(m.group()) - 1][0], (n, width, m.group())


@async_test
async def test_a_new_run_on_an_earlier_runs_checkpoints_is_not_called_a_relaunch():
    """`distai run lesson3 --ckpt-dir <a stopped run's checkpoints>` resumed and said "restart 1 (supervisor,
    fresh torchrun)" though the learner started it; its restart event says ``new_run`` and the line says so."""
    events = [dict(e, restart_count=0, new_run=True) if e["kind"] == "restart" else e for e in run_events()]
    async with mounted(FailuresVisualizer, size=(110, 34)) as (pilot, v):
        for e in events:
            v.feed_event(e)
        await pilot.pause()
        text = " ".join(plain(v).split())
        assert "restart 1 (a new run, on an earlier run's checkpoints)" in text and "fresh torchrun" not in text


def test_a_stopped_run_with_checkpoints_says_how_to_continue_it(tmp_path):
    from distai.engine.runs import create_run
    from distai.tutor.cli_run import resume_command

    rec = create_run(tmp_path, "lesson3", "distai.engine.experiments.lesson3",
                     argv=["distai", "run", "lesson3", "--cpu", "2", "--step-time", "0.2"])
    rec.status = "stopped"
    assert resume_command(rec) is None  # no checkpoint yet
    (rec.dir / "checkpoints" / "step_00000010").mkdir(parents=True)
    assert resume_command(rec) == ("distai run lesson3 --cpu 2 --step-time 0.2 --ckpt-dir "
                                   f"{rec.dir / 'checkpoints'}")
    rec.argv = ["distai", "run", "lesson3", "--run-dir", "/tmp/x", "--cpu", "2", "--run-dir=/tmp/y"]
    assert resume_command(rec) == f"distai run lesson3 --cpu 2 --ckpt-dir {rec.dir / 'checkpoints'}"  # not taken again
    rec.status = "ok"
    assert resume_command(rec) is None  # it finished: nothing to continue
