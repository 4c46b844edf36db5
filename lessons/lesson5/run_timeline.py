"""What a lesson-5 run measured, folded from its events: each schedule's blocks per step and rank.

Fed the events of ``distai.engine.experiments.lesson5`` (``pp_config``, ``pp_op``, ``pp_stage``,
``summary``; live or replayed), :class:`PipelineRun` keeps the start and end time of every
forward and backward block, per schedule, step and rank, and finds the latest step where every
rank reported all its blocks (:meth:`PipelineRun.latest_complete`), in units of the mean forward
time like the simulated timelines. The pipeline visualizer and ``distai run lesson5``'s terminal
view both draw from it. Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START, SUMMARY
from . import simulator as sim
from .events import PP_CONFIG, PP_OP, PP_STAGE, PipelineStage

KINDS = tuple(k.name for k in (RUN_START, PP_CONFIG, PP_OP, PP_STAGE, SUMMARY))


@dataclass(frozen=True)
class CompleteStep:
    """One measured step, ready to draw: per rank (start, end, op) in forward-time units."""

    step: int
    blocks: list[list[tuple[float, float, sim.Op]]]
    makespan: float  # in the same units
    v: int
    seconds: float  # the step's wall time
    work: list[float] | None = None  # per rank, its blocks' own work in the same units (None: not recorded)


@dataclass
class PipelineRun:
    """A run's timestamps: schedule -> step -> rank -> [(t0, t1, op)] (see the module docstring)."""

    p: int = 0
    m: int = 0
    v: int = 1
    ops: dict = field(default_factory=dict)
    work: dict = field(default_factory=dict)  # schedule -> step -> rank -> the blocks' work (pp_op's compute), s
    stages: dict[str, dict[int, PipelineStage]] = field(default_factory=dict)  # schedule -> rank -> pp_stage event
    summary: dict = field(default_factory=dict)

    def feed(self, event: dict) -> bool:
        """Take one run event; True if it was one of this lesson's (``run_start`` and ``pp_config``
        start afresh)."""
        if RUN_START.matches(event):
            PipelineRun.__init__(self)
        elif PP_CONFIG.matches(event):
            PipelineRun.__init__(self, p=int(event["p"]), m=int(event["m"]), v=int(event.get("v", 1)))
        elif PP_OP.matches(event) and self.p:
            op = sim.Op(event["op"], int(event["mb"]), int(event.get("chunk", 0)), int(event["stage"]))
            rank = event.get("rank")
            rank = int(event["stage"]) % self.p if rank is None else int(rank)
            by_step = self.ops.setdefault(event["schedule"], {}).setdefault(int(event.get("step", 0)), {})
            by_step.setdefault(rank, []).append((float(event["t0"]), float(event["t1"]), op))
            if "compute" in event:
                works = self.work.setdefault(event["schedule"], {}).setdefault(int(event.get("step", 0)), {})
                works[rank] = works.get(rank, 0.0) + float(event["compute"])
        elif PP_STAGE.matches(event):
            self.stages.setdefault(event["schedule"], {})[int(event.get("rank") or 0)] = event
        elif event.get("kind") == SUMMARY.name and event.get("lesson") == "lesson5":  # open: read as a dict
            self.summary = event
        else:
            return False
        return True

    def latest_schedule(self) -> str | None:
        """The schedule of the run's latest complete step (or, before one, the latest with events)."""
        done = [s for s in self.ops if self.latest_complete(s) is not None]
        return done[-1] if done else (list(self.ops)[-1] if self.ops else None)

    def latest_complete(self, schedule: str) -> CompleteStep | None:
        """The latest step of ``schedule`` where every rank reported all its blocks."""
        steps = self.ops.get(schedule, {})
        v = self.v if schedule == "interleaved" else 1
        want = 2 * self.m * v
        for step in sorted(steps, reverse=True):
            ranks = steps[step]
            if len(ranks) == self.p and all(len(ranks.get(r, [])) == want for r in range(self.p)):
                t0 = min(b[0] for r in range(self.p) for b in ranks[r])
                t1 = max(b[1] for r in range(self.p) for b in ranks[r])
                span = t1 - t0
                # in units of the mean forward time, like the simulated panels
                fwd = [b[1] - b[0] for r in range(self.p) for b in ranks[r] if b[2].kind == "F"]
                unit = (sum(fwd) / len(fwd)) * v if fwd and sum(fwd) > 0 else (span or 1.0)
                blocks = [[((a - t0) / unit, (b - t0) / unit, op) for a, b, op in sorted(ranks[r])]
                          for r in range(self.p)]
                works = self.work.get(schedule, {}).get(step, {})
                work = [works[r] / unit for r in range(self.p)] if len(works) == self.p else None
                return CompleteStep(step, blocks, span / unit, v, span, work)
        return None
