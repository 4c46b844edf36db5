"""What a view needs to know about a run, folded from its events (live or replayed).

The terminal view, the ``--json`` stream's consumers and the tutor's run panel all feed
events to a :class:`RunState` and draw from it, so a replay (``distai runs show ID``) shows the
same thing the live run did. Pure Python: no torch, no UI toolkit.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..lessons.events import CHECK, ERROR, LOG, OUTPUT, PHASE, PROGRESS, RUN_END, RUN_START, STEP, SUMMARY
from ..lessons.lesson1.events import FIT, RING_CHECK, RING_STEP, SWEEP
from ..lessons.strings import translated
from .events import is_number, time_span
from .profiling import is_profiler_trace_line


@dataclass
class RunState:
    run_id: str | None = None
    lesson: str | None = None
    nproc: int | None = None  # the run's ranks, every node's
    nnodes: int = 1
    device: str | None = None
    backend: str | None = None
    note: str | None = None
    phase: str | None = None
    done: int = 0
    total: int = 0
    steps_of: int | None = None
    # the loss curve shown: one rank's (the lowest that reports a loss: rank 0, or a pipeline's last stage), the
    # series of its latest strategy, schedule or mode; every rank's in arrival order mixed local losses and
    # differed between the live view and a replay
    losses: list[float] = field(default_factory=list)
    loss_rank: int | None = None
    loss_series: dict[tuple[str, ...], list[float]] = field(default_factory=dict)
    loss_steps: dict[tuple[str, ...], list[Any]] = field(default_factory=dict)  # each loss's step number
    last_step: dict[str, Any] | None = None
    sweep: list[dict[str, Any]] = field(default_factory=list)
    fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    ring_check: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)  # the run's check events (lessons/check_view)
    summary: dict[str, Any] | None = None
    ring_steps: int = 0
    last_ring_step: dict[str, Any] | None = None
    output: deque = field(default_factory=lambda: deque(maxlen=500))
    logs: deque = field(default_factory=lambda: deque(maxlen=200))
    errors: list[dict[str, Any]] = field(default_factory=list)
    status: str = "starting"
    error: str | None = None
    failed_rank: int | None = None
    tail: list[str] = field(default_factory=list)
    exit_code: int | None = None
    first_t: float | None = None
    last_t: float | None = None
    duration_s: float | None = None
    events_seen: int = 0

    def placement_text(self, lang: str) -> str:
        """``4 × cpu (gloo)``, with the nodes where there are several (``4 × cpu (gloo, 2 nodes)``), or ""."""
        if not self.nproc:
            return ""
        inside = [self.backend] if self.backend else []
        if self.nnodes > 1:
            inside.append(translated("run", "nodes_count", lang, n=self.nnodes))
        return f"{self.nproc} × {self.device or '?'}" + (f" ({', '.join(inside)})" if inside else "")

    @property
    def fraction(self) -> float:
        if self.status == "ok":
            return 1.0
        return min(1.0, self.done / self.total) if self.total else 0.0

    @property
    def progress_known(self) -> bool:
        """Whether the run reports how far it is (``progress`` events) or has ended well: a lesson
        that reports only its phases (lessons 4 and 7) gets a bar that pulses, not one stuck at 0 %."""
        return self.status == "ok" or self.total > 0

    @property
    def elapsed(self) -> float:
        if self.duration_s is not None:
            return self.duration_s
        if self.first_t is None or self.last_t is None:
            return 0.0
        return self.last_t - self.first_t

    def clock(self, now: float | None = None) -> float:
        """Seconds since the launch: ``elapsed`` once finished (or replayed, ``now`` None), else
        counted to ``now`` from the launcher's ``run_start``, so it runs while ranks start."""
        if self.finished or now is None or self.first_t is None:
            return self.elapsed
        return max(self.elapsed, now - self.first_t)

    @property
    def ranks_starting(self) -> bool:
        """Launched, and no rank has reported yet (torchrun and the interpreters are starting)."""
        return self.status == "starting" or (self.status == "running" and self.phase is None)

    @property
    def finished(self) -> bool:
        return self.status in ("ok", "failed", "stopped", "killed", "damaged")

    def _add_loss(self, e: dict[str, Any]) -> None:
        given = e.get("rank")
        rank = given if isinstance(given, int) else 0
        if self.loss_rank is None or rank < self.loss_rank:  # a lower rank's curve replaces what came first
            self.loss_rank, self.loss_series, self.loss_steps = rank, {}, {}
        if rank == self.loss_rank:
            series = tuple(str(e[k]) for k in ("strategy", "schedule", "mode") if e.get(k) is not None)
            self.losses = self.loss_series.setdefault(series, [])
            steps = self.loss_steps.setdefault(series, [])
            step = e.get("step")
            if e.get("redo") is True and isinstance(step, int):  # a step done again after a restart replaces
                while steps and isinstance(steps[-1], int) and steps[-1] >= step:  # the lost one: one point a step
                    steps.pop()
                    self.losses.pop()
            steps.append(step)
            self.losses.append(float(e["loss"]))

    def feed(self, e: dict[str, Any]) -> None:
        self.events_seen += 1
        t = e.get("t")
        if isinstance(t, (int, float)):
            self.first_t = t if self.first_t is None else min(self.first_t, t)
            self.last_t = t if self.last_t is None else max(self.last_t, t)
        kind = e.get("kind")  # any lesson's variant of a kind: read by name, as a dict
        if self.backend is None and isinstance(e.get("backend"), str):  # a lesson's config names it, or its start
            self.backend = e["backend"]
        if kind == RUN_START.name:
            self.run_id, self.lesson = e.get("run_id"), e.get("lesson")
            self.nproc, self.device, self.note = e.get("nproc"), e.get("device"), e.get("note")
            self.nnodes = e.get("nnodes") or 1
            self.status = "running"
        elif kind == PHASE.name:
            self.phase = e.get("name")
            if self.status == "starting":
                self.status = "running"
            if e.get("name") == "start":
                self.backend = e.get("backend") or self.backend
                self.nproc = e.get("n", self.nproc)
            if e.get("name") == "train":
                self.steps_of = e.get("steps")
        elif kind == PROGRESS.name:
            self.done, self.total = int(e.get("done", 0)), int(e.get("total", 0))
        elif kind == STEP.name:
            step, of, loss = e.get("step"), e.get("of"), e.get("loss")
            if not _is_int(step) or not (of is None or _is_int(of)) or not (loss is None or is_number(loss)):
                return  # a damaged step ("step": "x"), not drawn rather than breaking the view that draws it
            if loss is not None:
                self._add_loss(e)
            self.steps_of = of if of is not None else self.steps_of
            self.last_step = e
        elif kind == SWEEP.name:
            self.sweep.append(e)
        elif kind == FIT.name:
            self.fits[e.get("impl", "?")] = e
        elif kind == CHECK.name:
            self.checks.append(e)
        elif kind == RING_CHECK.name:
            self.ring_check = e
        elif kind == RING_STEP.name:
            self.ring_steps += 1
            self.last_ring_step = e
        elif kind == SUMMARY.name:
            self.summary = {k: v for k, v in e.items() if k not in ("kind", "t", "rank")}
        elif kind == LOG.name:
            self.logs.append((e.get("rank"), str(e.get("msg", ""))))
        elif kind == OUTPUT.name:
            self.output.append((e.get("rank"), str(e.get("line", ""))))
        elif kind == ERROR.name:
            self.errors.append(e)
        elif kind == RUN_END.name:
            self.status = e.get("status", "failed")
            self.error, self.failed_rank = e.get("error"), e.get("failed_rank")
            self.tail = list(e.get("tail") or [])
            self.exit_code = e.get("exit_code")
            self.duration_s = e.get("duration_s")


def _is_int(x: Any) -> bool:
    return is_number(x) and isinstance(x, int)


def feed_readable(fold: Any, event: dict[str, Any]) -> bool:
    """``fold.feed(event)``, an event whose fields a fold cannot read (``"step": "x"`` in a file edited by
    hand or damaged) left out as a torn line is: False then, else what ``feed`` returned (True if None)."""
    try:
        changed = fold.feed(event)
    except (ValueError, TypeError, KeyError, ArithmeticError):  # ArithmeticError: a number past what a float holds
        return False
    return True if changed is None else bool(changed)


def replay_events(record) -> list[dict[str, Any]]:
    """A finished (or crashed) run's events as the live consumer saw them, from its folder."""
    recorded = list(record.events())
    start_t, duration_s = record.created, record.duration_s
    if record.status == "damaged":  # no record of its start or length: its events' own times say them
        span = time_span(recorded)
        start_t, duration_s = (span[0], span[1] - span[0]) if span else (record.created, None)
    events: list[dict[str, Any]] = [RUN_START.event({
        "t": start_t, "run_id": record.id, "lesson": record.lesson, "nnodes": record.nodes,
        "nproc": record.config["nproc"] * record.nodes if isinstance(record.config.get("nproc"), int) else None,
        "device": record.config.get("device"), "note": record.config.get("note"), "command": record.command,
    })]
    events.extend(recorded)
    for rank_file in sorted(record.logs_dir.glob("rank*.log")) if record.logs_dir.is_dir() else []:
        rank = int(rank_file.stem[4:])
        lines = [x for x in rank_file.read_text(encoding="utf-8", errors="replace").splitlines()
                 if not is_profiler_trace_line(x)]
        for line in lines[-50:]:
            events.append(OUTPUT.event({"rank": rank, "line": line, "t": None}))
    status = record.effective_status
    end_t = start_t + (duration_s or 0.0)
    if status != "running":
        events.append(RUN_END.event({
            "t": end_t, "run_id": record.id, "status": status, "exit_code": record.exit_code,
            "error": record.error if record.error or status != "killed" else "the launcher was killed before the run ended",
            "failed_rank": record.failed_rank, "tail": record.error_tail, "duration_s": duration_s}))
    return events
