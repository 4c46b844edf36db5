"""Replaying a recorded run into a lesson's visualizer (the tutor side: it reads the run folder).

Visualizers do no I/O; when one posts ``LessonVisualizer.ReplayRequested`` (lesson 1's ring: key
``o``), the lesson screen calls :func:`replay_latest`, which finds the lesson's newest run under
``runs_root()`` and feeds its events — exactly those ``distai runs show ID`` replays — to the
widget's ``feed_event``. Nothing here imports torch.
"""
from __future__ import annotations

from pathlib import Path

from ..lessons.events import OUTPUT


def latest_run(lesson_id: str, root: str | Path | None = None, newest: bool = False):
    """The newest run of ``lesson_id`` that ended ``ok`` (a ``RunRecord``); where none did, or with ``newest``
    (the run that just ended in the run panel), the newest of any ending (a stopped or failed run still shows
    its steps); None when there is no run. A run stopped seconds after its start must not hide the finished
    one before it when the learner asks for "the last run"."""
    from ..engine.runs import list_runs
    from .paths import runs_root

    runs = list_runs(root if root is not None else runs_root(), lesson_id)
    last = runs[0] if runs else None
    return last if newest else next((r for r in runs if r.effective_status == "ok"), last)


def replay_into(visualizer, record) -> int:
    """Feed ``record``'s events to ``visualizer`` in order; returns how many were fed."""
    from ..engine.run_state import replay_events

    count = 0
    for event in replay_events(record):
        if OUTPUT.matches(event):
            continue
        visualizer.feed_event(event)
        count += 1
    return count


def replay_latest(lesson_id: str, visualizer, root: str | Path | None = None, newest: bool = False):
    """Replay :func:`latest_run` of ``lesson_id`` into ``visualizer``; returns its record or None."""
    record = latest_run(lesson_id, root, newest)
    if record is not None:
        replay_into(visualizer, record)
    return record
