"""What a lesson-4 run measured, folded from its events: its layer's shape and the collectives counted.

Fed the events of ``distai run lesson4`` (live, or replayed from a run folder by the tutor),
:class:`TPRun` keeps the run's T and layer shape (its ``config`` event) and, per mode (``tp``,
``tp+sp``), the ``comm_check`` event: the collectives each layer really ran, forward and backward,
and whether they match :func:`~distai.lessons.lesson4.flow.collectives`. The tensor-parallel block
visualizer draws from it. Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START
from .events import COMM_CHECK, CONFIG, CommCheck

# The experiment checks its layers in float64 (engine/experiments/lesson4.py).
RUN_ELEMENT_BYTES = 8


@dataclass
class TPRun:
    """Everything one run has said so far (see the module docstring)."""

    run_id: str | None = None
    t: int | None = None  # the run's tensor-parallel degree
    shape: dict | None = None  # hidden, seq, micro_batch, bytes (per element) of the run's layer
    checks: dict[str, CommCheck] = field(default_factory=dict)  # mode -> its comm_check event

    def feed(self, event: dict) -> bool:
        """Take one event; True if it changed what the run says (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            TPRun.__init__(self, run_id=event.get("run_id"))
        elif CONFIG.matches(event) and all(k in event for k in ("T", "hidden", "seq", "micro_batch")):
            self.t = int(event["T"])
            self.shape = {"hidden": int(event["hidden"]), "seq": int(event["seq"]),
                          "micro_batch": int(event["micro_batch"]), "bytes": RUN_ELEMENT_BYTES}
        elif COMM_CHECK.matches(event):
            self.checks[str(event.get("mode"))] = event
        else:
            return False
        return True

    def layer_counts(self, mode: str, layer: int = 0) -> dict | None:
        """``{"fwd": {op: n}, "bwd": {op: n}, "match": bool}`` of one layer in ``mode``, if the run checked it."""
        check = self.checks.get(mode)
        row = check.get("layers", {}).get(str(layer)) if check else None
        if check is None or row is None:
            return None
        return {"fwd": row["fwd"]["counts"], "bwd": row["bwd"]["counts"], "match": bool(check.get("match"))}
