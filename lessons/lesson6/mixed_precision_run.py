"""What a lesson-6 run measured, folded from its events: the loss scale, gradient exponents, bucket timelines.

Fed the events of ``distai run lesson6`` (live, or replayed from a run folder by the tutor),
:class:`MixedPrecisionRun` keeps the GradScaler's scale per step (with the overflows, injected or
real, and the loss), the gradient-exponent histograms (``grad_hist``), one rank's timeline of a
step per bucket size and mode (``overlap``, ``no-overlap``, ``ddp``: when backward finished each
layer, when each bucket's all-reduce ran), the measured step time per bucket size and mode, and
the summary. The loss-scale visualizer draws from it. Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START, SUMMARY
from .events import BUCKET_SWEEP, GRAD_HIST, SCALE, TIMELINE, GradHist, Timeline


@dataclass
class MixedPrecisionRun:
    """Everything one run has said so far (see the module docstring)."""

    run_id: str | None = None
    scale: list[float] = field(default_factory=list)
    overflow: list[bool] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)  # an overflow the experiment injected
    loss: list[float] = field(default_factory=list)
    hists: list[GradHist] = field(default_factory=list)
    timelines: dict[tuple[float, str], Timeline] = field(default_factory=dict)  # (bucket MiB, mode) -> event
    sweep: dict[tuple[float, str], float] = field(default_factory=dict)  # (bucket MiB, mode) -> step ms
    summary: dict | None = None
    rank: int | None = None  # the rank whose timelines are kept (the first one heard)

    @property
    def empty(self) -> bool:
        return not (self.scale or self.hists or self.timelines)

    def feed(self, event: dict) -> bool:
        """Take one event; True if it changed what the run says (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            MixedPrecisionRun.__init__(self, run_id=event.get("run_id"))
        elif TIMELINE.matches(event):
            rank = event.get("rank", 0)
            if self.rank is None:
                self.rank = rank
            if rank != self.rank:
                return False
            self.timelines[(float(event["bucket_mb"]), event["mode"])] = event
        elif SCALE.matches(event):
            self.scale.append(float(event["scale"]))
            self.overflow.append(bool(event["overflow"]))
            self.forced.append(bool(event.get("injected", False)))
            self.loss.append(float(event["loss"]))
        elif GRAD_HIST.matches(event):
            self.hists.append(event)
        elif BUCKET_SWEEP.matches(event):
            self.sweep[(float(event["bucket_mb"]), event["mode"])] = float(event["step_ms"])
        elif event.get("kind") == SUMMARY.name:  # open: the lesson's own figures, read as a dict
            self.summary = event
        else:
            return False
        return True

    def bucket_sizes(self) -> list[float]:
        """The bucket sizes (MiB) the run has a timeline for, smallest first."""
        return sorted({b for b, _ in self.timelines})

    def best_bucket(self) -> float | None:
        """The bucket size the run's summary found fastest, if it has a timeline for it."""
        best = (self.summary or {}).get("overlap", {}).get("best_bucket_mb")
        return best if best in self.bucket_sizes() else None

    def timeline(self, bucket_mb: float, mode: str) -> dict | None:
        """One step's timeline in ms from the start of backward: ``layers`` ``[name, start, end]``,
        ``buckets`` ``[index, bytes, start, end]``, ``backward_end`` and ``end``."""
        ev = self.timelines.get((bucket_mb, mode))
        if ev is None:
            return None
        t0 = ev.get("marks", {}).get("backward")
        if t0 is None:
            t0 = min((a for _, a, _ in ev["layers"]), default=0.0)
        layers = [[n, a - t0, b - t0] for n, a, b in ev["layers"]]
        buckets = [[i, nb, a - t0, b - t0] for i, nb, a, b in ev["buckets"]]
        backward_end = max((b for _, _, b in layers), default=0.0)
        end = max([backward_end] + [b for *_, b in buckets])
        return {"layers": layers, "buckets": buckets, "backward_end": backward_end, "end": end}
