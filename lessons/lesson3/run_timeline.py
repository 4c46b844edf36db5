"""What a lesson-3 run did, folded from its events: steps, checkpoints, failures, restarts, redone work.

Fed the events of ``distai.engine.experiments.lesson3`` (live, or replayed from a run folder),
plus the launcher's ``run_start``/``run_end`` and the supervisor's ``relaunch``,
:class:`RunTimeline` keeps one :class:`Attempt` per start of the worker group: the steps it
computed (and which of them were redone work), the checkpoints it wrote, the failure that ended
it. :meth:`RunTimeline.cells` lays the attempts out on a common step axis for drawing; the
terminal view (``distai run``) and the tutor's visualizer both draw from it. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..events import RELAUNCH, RUN_END, RUN_START, SUMMARY, Relaunch
from .events import (
    CHECKPOINT,
    COMPARE,
    FAILURE,
    PHASE,
    REDONE,
    RESTART,
    STEP,
    Checkpoint,
    Compare,
    Failure,
    Redone,
    Restart,
)

KINDS = tuple(k.name for k in (RUN_START, RUN_END, PHASE, STEP, CHECKPOINT, FAILURE, RESTART, RELAUNCH, REDONE,
                               COMPARE, SUMMARY))


def step_columns(step: int, n: int, width: int) -> range:
    """The cells of step ``step`` (1..``n``) on a row of ``width`` cells, spaced evenly: each step the same
    whole number of cells where ``width`` is a multiple of ``n``; where it is narrower, each cell the same
    ``⌈n/width⌉`` steps (checkpoints every k steps then land every k/⌈n/width⌉ cells, not a cell early or late
    by rounding); otherwise in proportion. The rows and the axis under them both place steps here."""
    width, n = max(1, width), max(1, n)
    if width % n == 0:
        k = width // n
        return range((step - 1) * k, step * k)
    if width < n:
        col = min(width - 1, (step - 1) // -(-n // width))
        return range(col, col + 1)
    c0 = min(width - 1, max(0, int((step - 1) * width / n)))
    return range(c0, max(c0 + 1, min(width, int(step * width / n))))


@dataclass
class Attempt:
    number: int
    from_step: int = 0  # steps already done when it started (resumed from a checkpoint after them)
    steps: dict[int, float] = field(default_factory=dict)  # step (from 1) -> loss
    redo: set[int] = field(default_factory=set)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    failure: Failure | None = None
    restart: Restart | None = None  # the restart event that began it (None for the first)

    @property
    def last_step(self) -> int:
        return max(self.steps, default=self.from_step)


# what a cell shows, strongest first when several steps share one cell
CELL_ORDER = ("failure", "checkpoint", "redo", "step", "restart", "empty")


@dataclass
class RunTimeline:
    steps_of: int = 0
    world_size: int | None = None
    ckpt_every: int | None = None
    attempts: dict[int, Attempt] = field(default_factory=dict)
    relaunches: list[Relaunch] = field(default_factory=list)
    redone: list[Redone] = field(default_factory=list)
    compare: Compare | None = None
    summary: dict | None = None
    status: str = "waiting"
    run_id: str | None = None
    _current: int = 0

    def attempt(self, number: int) -> Attempt:
        if number not in self.attempts:
            self.attempts[number] = Attempt(number)
        return self.attempts[number]

    @property
    def empty(self) -> bool:
        return not self.attempts

    def feed(self, e: dict[str, Any]) -> bool:
        """Fold one event in; True when it changed what is drawn."""
        if e.get("kind") not in KINDS:
            return False
        a = e.get("attempt")
        number = int(a) if isinstance(a, int) else self._current
        if RUN_START.matches(e):
            if not e.get("relaunch") and (self.attempts or self.run_id not in (None, e.get("run_id"))):
                RunTimeline.__init__(self)  # a new run: every field back to its default
            self.run_id = e.get("run_id")
            self.status = "running"
        elif RUN_END.matches(e):
            self.status = e.get("status", "failed")
        elif PHASE.matches(e):
            self._current = number
            if e.get("name") == "start":
                self.world_size = e.get("n", self.world_size)
                self.attempt(number)
            elif e.get("name") == "train":
                self.steps_of = int(e.get("steps") or self.steps_of)
        elif STEP.matches(e):
            at = self.attempt(number)
            s = int(e["step"]) + 1
            at.steps[s] = float(e["loss"]) if e.get("loss") is not None else float("nan")
            if e.get("redo"):
                at.redo.add(s)
            self.steps_of = int(e.get("of") or self.steps_of)
        elif CHECKPOINT.matches(e):
            self.attempt(number).checkpoints.append(e)
        elif FAILURE.matches(e):
            self.attempt(number).failure = e
        elif RESTART.matches(e):
            at = self.attempt(number)
            at.restart = e
            at.from_step = int(e.get("from_step") or 0)
            self._current = number
        elif RELAUNCH.matches(e):
            self.relaunches.append(e)
        elif REDONE.matches(e):
            self.redone.append(e)
        elif COMPARE.matches(e):
            self.compare = e
        elif e.get("kind") == SUMMARY.name:  # open: the lesson's own figures, read as a dict
            if e.get("lesson", "lesson3") != "lesson3":
                return False
            self.summary = e
            self.ckpt_every = e.get("ckpt_every", self.ckpt_every)
        return True

    # ---- derived figures ----
    @property
    def checkpoints(self) -> list[Checkpoint]:
        return [c for n in sorted(self.attempts) for c in self.attempts[n].checkpoints]

    @property
    def failures(self) -> list[Failure]:
        return [f for n in sorted(self.attempts) if (f := self.attempts[n].failure)]

    @property
    def restarts(self) -> list[Restart]:
        return [r for n in sorted(self.attempts) if (r := self.attempts[n].restart)]

    @property
    def redone_steps(self) -> int:
        return sum(int(r.get("lost_steps") or 0) for r in self.restarts)

    @property
    def done(self) -> int:
        """The highest step completed by any attempt."""
        return max((a.last_step for a in self.attempts.values()), default=0)

    def span(self) -> int:
        return max(self.steps_of, self.done, 1)

    def cells(self, width: int) -> list[tuple[int, list[str]]]:
        """Per attempt, ``width`` cells over steps 1..N: each cell one of :data:`CELL_ORDER`.

        A step's cell is ``step`` (new work), ``redo`` (work done again after a failure),
        ``checkpoint`` (a checkpoint was written after it) or ``failure`` (the step in progress
        when a rank died); the cell just before an attempt's first step is ``restart``.
        """
        n = self.span()
        width = max(1, width)
        rows = []
        for number in sorted(self.attempts):
            at = self.attempts[number]
            row = ["empty"] * width

            def put(cols: range | list, what: str) -> None:
                for col in cols:
                    if CELL_ORDER.index(what) < CELL_ORDER.index(row[col]):
                        row[col] = what

            for s in at.steps:
                put(step_columns(s, n, width), "redo" if s in at.redo else "step")
            for c in at.checkpoints:
                put([step_columns(int(c["step"]), n, width)[-1]], "checkpoint")
            if at.failure is not None:
                put(step_columns(max(1, int(at.failure.get("step") or at.last_step + 1)), n, width), "failure")
            if at.restart is not None and at.from_step >= 1:
                put([step_columns(at.from_step, n, width)[-1]], "restart")
            elif at.restart is not None and row[0] == "empty":
                row[0] = "restart"
            rows.append((number, row))
        return rows
