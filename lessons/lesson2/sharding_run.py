"""What a lesson-2 run measured, folded from its events: the bytes each strategy held and sent.

Fed the events of ``distai run lesson2`` (live, or replayed from a run folder by the tutor),
:class:`ShardingRun` keeps the run's setup (world size, parameters, precision, optimizer) and, per
strategy, rank 0's ``memory`` event (bytes held, beside the calculator's prediction) and ``comm``
event (bytes sent). The sharding visualizer draws from it. Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START
from .events import COMM, MEMORY, PHASE, Comm, Memory

SETUP_FIELDS = ("world_size", "num_params", "precision", "optimizer")


@dataclass
class ShardingRun:
    """Everything one run has said so far (see the module docstring)."""

    run_id: str | None = None
    setup: dict = field(default_factory=dict)
    memory: dict[str, Memory] = field(default_factory=dict)  # strategy -> rank 0's memory event
    sent: dict[str, Comm] = field(default_factory=dict)  # strategy -> rank 0's comm event

    @property
    def empty(self) -> bool:
        return not self.memory

    def feed(self, event: dict) -> bool:
        """Take one event; True if it changed what the run says (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            ShardingRun.__init__(self, run_id=event.get("run_id"))
        elif PHASE.matches(event) and event.get("name") == "setup":
            self.setup = {k: event.get(k) for k in SETUP_FIELDS}
        elif MEMORY.matches(event) and event.get("rank", 0) == 0:
            self.memory[str(event.get("strategy"))] = event
            for k in SETUP_FIELDS[:3]:  # a replay that starts after the setup phase still has them
                self.setup.setdefault(k, event.get(k))
        elif COMM.matches(event) and event.get("rank", 0) == 0:
            self.sent[str(event.get("strategy"))] = event
        else:
            return False
        return True

    def sent_bytes(self, strategy: str) -> float | None:
        """What rank 0 sent in one step under ``strategy`` (None if the run has not said)."""
        comm = self.sent.get(strategy)
        return comm.get("sent") if comm is not None else None
