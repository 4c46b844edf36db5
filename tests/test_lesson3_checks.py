"""Lesson 3's checks (issue 28) on a run worked by hand: the interval's waste against Young's cost
model and the causes of the gap, folded from events whose times are known."""
from __future__ import annotations

import pytest

from distai.lessons.checks import reconcile
from distai.lessons.lesson3 import formulas
from distai.lessons.lesson3.checks import checkpoint_cost, interval_waste


def _step(step: int, attempt: int, t0: float, t1: float) -> dict:
    return {"kind": "step", "step": step - 1, "attempt": attempt, "t0": t0, "t": t1, "rank": 0}


def _ckpt(step: int, attempt: int, t: float) -> dict:
    return {"kind": "checkpoint", "step": step, "attempt": attempt, "t": t, "seconds": 0.5, "mode": "sync"}


def hand_run() -> list[dict]:
    """8 steps of 1 s, a 0.5 s checkpoint every 2; rank 1 dies half-way through step 5, the group
    restarts 10 s later from the checkpoint after step 4 and finishes."""
    first = [_step(1, 0, 0, 1), _step(2, 0, 1, 2), _ckpt(2, 0, 2.5), _step(3, 0, 2.5, 3.5), _step(4, 0, 3.5, 4.5),
             _ckpt(4, 0, 5.0)]  # step 5 began at 5.0 s and never ended
    failure = {"kind": "failure", "rank": 1, "step": 5, "phase": "step", "attempt": 0, "t": 5.5}
    restart = {"kind": "restart", "attempt": 1, "from_step": 4, "t": 15.5}
    second = [_step(5, 1, 15.5, 16.5), _step(6, 1, 16.5, 17.5), _ckpt(6, 1, 18.0), _step(7, 1, 18.0, 19.0),
              _step(8, 1, 19.0, 20.0), _ckpt(8, 1, 20.5)]
    return [*first, failure, restart, *second]


def test_interval_waste_of_a_run_worked_by_hand():
    c = interval_waste(hand_run(), steps=8, ckpt_every=2)
    assert c is not None and c.name == "interval_waste" and c.unit == "s"
    # t_step: the median step, 1 s; δ: 0.5 s, from a step's end to the next one's start; τ = 2 s; work 8 s
    assert (c.detail["t_step_s"], c.detail["checkpoint_s"], c.detail["interval_s"]) == (1.0, 0.5, 2.0)
    # Young: a checkpoint per interval (4 × 0.5 s) and, for the failure, half an interval and its checkpoint
    assert c.predicted == pytest.approx(formulas.first_order_overhead(2.0, 8.0, 0.5) * 8.0) == pytest.approx(3.25)
    # the attempts trained 5.5 s + 5 s (the 10 s of downtime left out) for 8 s of work
    assert c.measured == pytest.approx(2.5)
    # the failure threw away 0.5 s (from step 5's start), not the 1.25 s Young expects on average
    assert c.detail["lost_s"] == pytest.approx(0.5)
    assert c.causes == {"failure_point": pytest.approx(-0.75), "checkpoints_written": pytest.approx(0.0),
                        "step_variation": pytest.approx(0.0)}
    assert not c.ok and c.explained and c.unexplained == pytest.approx(0.0, abs=1e-12)
    assert reconcile(c.event()) == c


def test_a_slow_step_is_named_and_a_run_without_failure_has_no_waste_check():
    events = hand_run()
    slow = next(e for e in events if e["kind"] == "step" and e["step"] == 6 and e["attempt"] == 1)  # step 7
    slow["t"] += 1.0  # it took 2 s; the rest of the run shifts by 1 s
    for e in events:
        if e.get("attempt") == 1 and e is not slow and e["t"] > 18.5:
            e["t"] += 1.0
            if "t0" in e:
                e["t0"] += 1.0
    c = interval_waste(events, steps=8, ckpt_every=2)
    assert c.measured == pytest.approx(3.5) and c.causes["step_variation"] == pytest.approx(1.0) and c.explained
    assert interval_waste([e for e in hand_run() if e["kind"] not in ("failure", "restart")], 8, 2) is None


def test_checkpoint_cost_against_the_write_alone():
    cost = {"every": 5, "steps": 15, "write_s": 0.1,
            "sync": {"step_s": 0.05, "blocked_s": 0.13, "per_checkpoint_s": 0.17, "slower_steps_s": 0.03,
                     "save_s": 0.14}}
    c = checkpoint_cost(cost)
    assert (c.predicted, c.measured) == (0.1, 0.17) and not c.ok
    assert c.causes == {"save_in_loop": pytest.approx(0.04), "slower_steps": 0.03} and c.explained


def test_a_resume_is_a_new_runs_only_when_no_earlier_attempt_started_in_this_runs_folder(tmp_path):
    """The supervisor's relaunch finds its earlier attempt's start in the run's events; a new run on an
    earlier run's checkpoints finds none (their attempts are counted in the checkpoint folder)."""
    import json

    from distai.engine.experiments.lesson3 import _history, started_on_another_runs_checkpoints

    events = tmp_path / "events"
    events.mkdir()
    (events / "rank0.jsonl").write_text(json.dumps({"kind": "phase", "name": "start", "attempt": 0, "t": 1.0}) + "\n")
    relaunch = _history(events, before_attempt=1)
    assert relaunch["starts"] == 1 and not started_on_another_runs_checkpoints(1, 0, relaunch)
    fresh = _history(tmp_path / "another-runs-events", before_attempt=2)  # this run's folder: nothing earlier
    assert started_on_another_runs_checkpoints(2, 0, fresh)
    assert not started_on_another_runs_checkpoints(2, 1, fresh)  # torchrun restarted it in place
    assert not started_on_another_runs_checkpoints(0, 0, fresh)  # a first start resumes nothing
