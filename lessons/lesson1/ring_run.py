"""What a lesson-1 run recorded, folded from its events: the traced ring calls, the sweep, the fits.

Fed the events of ``distai run lesson1`` (live, or replayed from a run folder by the tutor),
:class:`RingRun` keeps each traced ring all-reduce as a :class:`RecordedCall` (its ``ring_step``
events by step and rank), the bandwidth sweep's rows, the α-β fits per implementation and the
training steps seen. The ring visualizer draws from it. Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START
from . import ring_model
from .events import FIT, RING_STEP, STEP, SWEEP, Fit, RingStep, Sweep

KINDS = tuple(k.name for k in (RUN_START, RING_STEP, SWEEP, FIT, STEP))


@dataclass
class RecordedCall:
    """The ``ring_step`` events of one traced ring all-reduce (``call``) of a run."""

    call: int
    n: int
    size: int
    total: int
    events: dict[tuple[int, int], RingStep] = field(default_factory=dict)  # (step, rank) -> event


@dataclass
class RingRun:
    """Everything one run has said so far (see the module docstring)."""

    run_id: str | None = None
    calls: dict[int, RecordedCall] = field(default_factory=dict)
    sweep: list[Sweep] = field(default_factory=list)
    fits: dict[str, Fit] = field(default_factory=dict)
    train_steps: list[int] = field(default_factory=list)

    def feed(self, event: dict) -> bool:
        """Take one event; True if it changed what the run says (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            RingRun.__init__(self, run_id=event.get("run_id"))
        elif RING_STEP.matches(event):
            return self.add_ring_step(event) is not None
        elif SWEEP.matches(event):
            self.sweep.append(event)
        elif FIT.matches(event):
            self.fits[str(event.get("impl", "ring"))] = event
        elif STEP.matches(event) and event.get("step") is not None:
            self.train_steps.append(int(event["step"]))
        else:
            return False
        return True

    def add_ring_step(self, e: RingStep) -> RecordedCall | None:
        """File one ``ring_step`` event under its call; None if it is malformed."""
        rank = e.get("rank")
        if rank is None:
            return None
        try:
            call, n, step, rank = int(e.get("call", 0)), int(e["n"]), int(e["step"]), int(rank)
            total = int(e.get("of", ring_model.num_steps(n)))
        except (KeyError, TypeError, ValueError):
            return None
        rec = self.calls.get(call)
        if rec is None:
            rec = self.calls[call] = RecordedCall(call, n, int(e.get("size", 0)), total)
        if 0 <= step < rec.total and 0 <= rank < rec.n:
            rec.events[(step, rank)] = e
        return rec

    def fit_params(self, impl: str = "ring") -> tuple[float, float] | None:
        """(α seconds, β seconds per byte) of the run's fit for ``impl``, if it made a usable one."""
        f = self.fits.get(impl)
        if not f:
            return None
        a, b = f.get("alpha_s"), f.get("beta_s_per_byte")
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a < 0 or b <= 0:
            return None
        return float(a), float(b)
