"""A run of lesson 9's experiment folded from its events, for the visualizer and the run view.
Pure Python: no torch, no Textual, no I/O.

Events of ``distai.engine.experiments.context``: ``cp_config`` (the group's shape, layout, variant
and the model), ``cp_step`` (one rank's ring step of one layer: its tiles, the causal scores it
computed, its compute and wait times, the messages and bytes it sent, and the schedule's and the
formula's figures for it), ``step`` (the loss against one process), ``memory`` (activations per
layer at one sequence length, measured and from the formula, with CP and on one process) and
``summary``. The ring steps kept are those of the latest training step, layer 0.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..events import RUN_START, SUMMARY
from .events import CP_CONFIG, CP_STEP, MEMORY, STEP, CPStep


@dataclass
class CPRun:
    config: dict = field(default_factory=dict)
    # (phase, step) -> rank -> the cp_step event of layer 0 in the latest training step
    ring: dict[tuple[str, int], dict[int, CPStep]] = field(default_factory=dict)
    train_step: int | None = None
    steps: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    summary: dict | None = None

    def feed(self, event: dict) -> bool:
        """Fold one event; True when it changed what there is to draw (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            CPRun.__init__(self)
            return True
        if CP_CONFIG.matches(event):
            CPRun.__init__(self)
            self.config = {k: v for k, v in event.items() if k not in ("kind", "t", "rank")}
            return True
        if not self.config:
            return False
        if CP_STEP.matches(event):
            if str(event.get("layer")) != "0":
                return False
            step = int(event.get("train_step", 0))
            if self.train_step is None or step > self.train_step:
                self.train_step, self.ring = step, {}
            elif step < self.train_step:
                return False
            self.ring.setdefault((str(event["phase"]), int(event["step"])), {})[int(event.get("rank") or 0)] = event
            return True
        if STEP.matches(event):
            self.steps.append({k: event.get(k) for k in ("step", "loss", "reference_loss", "max_grad_rel_diff")})
            return True
        if MEMORY.matches(event):
            self.memory.append({k: v for k, v in event.items() if k not in ("kind", "t")})
            return True
        if event.get("kind") == SUMMARY.name:  # open: the lesson's own figures
            self.summary = {k: v for k, v in event.items() if k not in ("kind", "t")}
            return True
        return False

    @property
    def cp(self) -> int:
        return int(self.config.get("cp", 0))

    def step_records(self, phase: str, step: int) -> dict[int, CPStep]:
        """Rank -> its cp_step record at ``step`` of ``phase`` (layer 0, latest training step)."""
        return self.ring.get((phase, step), {})

    def idle_share(self, phase: str = "fwd") -> float | None:
        """Measured: the share of the ranks' compute time the ranks waited for the slowest rank of
        each step (None until every step of every rank arrived)."""
        cp = self.cp
        steps = [self.step_records(phase, t) for t in range(cp)]
        if not cp or any(len(s) < cp for s in steps):
            return None
        return idle_share_of([[work_seconds(r) for r in s.values()] for s in steps])


def work_seconds(record: Mapping[str, Any]) -> float:
    """A ring step's compute as work: its CPU seconds where recorded (ranks sharing a core wait for it, which
    is contention, not the schedule's imbalance); on a GPU, whose kernels the thread only launches, and in runs
    recorded before them, its wall seconds."""
    return float(record.get("compute_cpu_s", record["compute_s"]))


def idle_share_of(work_by_step: Sequence[Sequence[float]]) -> float:
    """The share of the ranks' time spent waiting for each ring step's busiest rank, ``work_by_step[step][rank]``
    its work: 1 − Σ work / (ranks · Σ_steps max), the measured counterpart of ``ring_schedule.idle_fraction``."""
    ranks = max((len(s) for s in work_by_step), default=0)
    busiest = sum(max(s) for s in work_by_step if s)
    worked = sum(sum(s) for s in work_by_step)
    return 1.0 - worked / (ranks * busiest) if busiest > 0 else 0.0
