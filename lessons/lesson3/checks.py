"""Lesson 3's predictions against its run (issue 28): what a checkpoint costs the loop, and what the
chosen interval wastes under the injected failures, against Young's cost model.

Pure: folded from the run's events (every rank's, every attempt's), so a recorded run can be checked
again. Times are the events' own clocks (``t``: when an event was written; a step's ``t0``: when it
began), all measured on the ranks.

The interval's waste, as Young (1974) and Daly (2006) count it (:func:`formulas.first_order_overhead`):
per interval τ of work one checkpoint of cost δ, per failure on average half an interval and its
checkpoint redone, (τ + δ)/2; the restart's downtime R is left out on both sides (measured it is
the relaunch, which the interval does not choose). So for work T_s, k failures and an interval of
``ckpt_every`` steps of t_step each:

    predicted = T_s·δ/τ + k·(τ + δ)/2
    measured  = the attempts' training time (first step to the last, or to the failure) − T_s

with t_step the median step, T_s = steps·t_step and δ the median time a checkpoint held the loop
(from its step's end to the next step's start: a synchronous save's write, an asynchronous one's
staging and its wait for the previous write).
When they differ the causes, each measured from the events:

* ``failure_point``: the work each failure really threw away (from the end of the checkpoint the
  run resumed from to the failure) minus k·(τ + δ)/2: a failure strikes where it strikes, not half
  an interval in on average;
* ``checkpoints_written``: the time every checkpoint held the loop minus T_s·δ/τ (a last one at the
  end, the redone steps' again, writes slower or faster than the median);
* ``step_variation``: the steps that count (each step's last run) minus T_s: steps slower or
  faster than the median.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from ..checks import Check, check
from . import formulas

__all__ = ["interval_waste", "checkpoint_cost"]


def _kind(events: list[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("kind") == kind]


def _holds(checkpoints: list[Mapping[str, Any]], steps: list[Mapping[str, Any]]) -> list[float]:
    """How long each checkpoint held the training loop: from its step's end to the next step's
    start (the last one's: to its event for a synchronous save, the staging wait for an
    asynchronous one, whose event comes when it is published)."""
    ends = {(int(e["attempt"]), int(e["step"]) + 1): float(e["t"]) for e in steps}
    starts = {(int(e["attempt"]), int(e["step"]) + 1): float(e["t0"]) for e in steps}
    out = []
    for c in checkpoints:
        key = (int(c.get("attempt", 0)), int(c["step"]))
        if (key[0], key[1] + 1) in starts:
            out.append(starts[(key[0], key[1] + 1)] - ends[key])
        elif c.get("mode") == "async":
            out.append(float(c.get("blocked_s", 0.0)))
        else:
            out.append(float(c["t"]) - ends[key])
    return out


def _spans(steps: list[Mapping[str, Any]], saved: dict[tuple[int, int], float],
           failures: list[Mapping[str, Any]]) -> dict[int, tuple[float, float]]:
    """Each attempt's training: from its first step's start to its failure, or to the end of its
    last step and the checkpoint after it."""
    out = {}
    for a in sorted({int(e["attempt"]) for e in steps}):
        mine = [e for e in steps if e["attempt"] == a]
        start = min(float(e["t0"]) for e in mine)
        fail = [float(f["t"]) for f in failures if f.get("attempt") == a]
        last = max(mine, key=lambda e: float(e["t"]))
        after = saved.get((a, int(last["step"]) + 1), float(last["t"]))
        out[a] = (start, min(fail) if fail else after)
    return out


def interval_waste(events: Iterable[Mapping[str, Any]], steps: int, ckpt_every: int) -> Check | None:
    """The interval's waste against Young's model (module docstring); None without steps, or
    without a failure that the run restarted from."""
    events = list(events)
    step_events = [e for e in _kind(events, "step") if "t0" in e and e.get("t") is not None]
    step_ends = {(int(e["attempt"]), int(e["step"]) + 1): float(e["t"]) for e in step_events}
    checkpoints = [c for c in _kind(events, "checkpoint") if (int(c.get("attempt", 0)), int(c["step"])) in step_ends]
    restarts = _kind(events, "restart")
    failures = [f for f in _kind(events, "failure")
                if f.get("t") is not None and any(r["attempt"] == f["attempt"] + 1 for r in restarts)]
    if not step_events or not failures or not checkpoints:
        return None
    t_step = statistics.median(float(e["t"]) - float(e["t0"]) for e in step_events)
    blocked = _holds(checkpoints, step_events)
    # when the loop went on after each checkpoint: its step's end plus the time the save held it
    saved = {(int(c.get("attempt", 0)), int(c["step"])): step_ends[(int(c.get("attempt", 0)), int(c["step"]))] + b
             for c, b in zip(checkpoints, blocked)}
    delta = statistics.median(blocked)
    work, tau, k = steps * t_step, ckpt_every * t_step, len(failures)
    spans = _spans(step_events, saved, failures)
    lost = 0.0
    for f in failures:
        a = int(f["attempt"])
        resumed = next(r for r in restarts if r["attempt"] == a + 1)["from_step"]
        at = [t for (ca, cs), t in saved.items() if cs == resumed and ca <= a]
        lost += float(f["t"]) - max([spans[a][0]] + at)
    last_runs: dict[int, Mapping[str, Any]] = {}
    for e in sorted(step_events, key=lambda e: e["attempt"]):
        last_runs[int(e["step"])] = e
    counted = sum(float(e["t"]) - float(e["t0"]) for e in last_runs.values())
    measured = sum(end - start for start, end in spans.values()) - work
    predicted = formulas.first_order_overhead(tau, work / k, delta) * work
    return check("interval_waste", predicted, measured, "s",
                 causes={"failure_point": lost - k * (tau + delta) / 2,
                         "checkpoints_written": sum(blocked) - work * delta / tau,
                         "step_variation": counted - work},
                 detail={"t_step_s": t_step, "interval_s": tau, "checkpoint_s": delta, "failures": k,
                         "work_s": work, "lost_s": lost, "checkpoints": len(checkpoints),
                         "young_interval_s": formulas.young_interval(work / k, delta) if delta > 0 else 0.0})


def checkpoint_cost(cost: Mapping[str, Any]) -> Check:
    """A synchronous checkpoint costs the loop its write time δ (the lesson's model): δ measured
    alone (``write_s``, a save outside the loop) against the loop's extra time per checkpoint
    against the same loop without (``sync.per_checkpoint_s``, ``engine/experiments/lesson3``'s
    ``checkpoint_cost``). A miss names ``save_in_loop``, how much longer (or shorter) the save
    calls took inside the loop than alone (``sync.save_s`` − ``write_s``, each call timed), and
    ``slower_steps``, how much longer the loop's steps took, each timed alone, than the same steps
    without checkpoints (``sync.slower_steps_s``), both per checkpoint."""
    sync = cost["sync"]
    return check("checkpoint_cost", float(cost["write_s"]), float(sync["per_checkpoint_s"]), "s",
                 causes={"save_in_loop": float(sync.get("save_s", sync["blocked_s"])) - float(cost["write_s"]),
                         "slower_steps": float(sync.get("slower_steps_s", 0.0))},
                 detail={"every": float(cost["every"]), "blocked_s": float(sync["blocked_s"])})
