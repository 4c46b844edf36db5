"""What a run of the experts experiment measured, folded from its events.

Fed the events of ``distai run experts`` (live, or replayed from a run folder), :class:`ExpertsRun`
keeps the run's ``moe_config``, every step's load per expert summed over the layers (routing
choices and what the experts kept: the difference is the dropped tokens), the capacity line, the
drop rate and the balancing loss per step, and the two checks (``moe_comm``, ``moe_memory``).
Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START
from .events import MOE_COMM, MOE_CONFIG, MOE_LOAD, MOE_MEMORY, STEP, MoEComm, MoEConfig, MoEMemory


@dataclass
class StepLoad:
    """One step, all layers: choices per expert, kept per expert, the capacity per layer."""

    step: int
    routed: list[int]
    kept: list[int]
    capacity: int | None
    layers: int = 0
    sent: list[list[int]] = field(default_factory=list)  # [rank][EP rank]: rows dispatched, all layers

    @property
    def dropped(self) -> list[int]:
        return [r - k for r, k in zip(self.routed, self.kept)]


@dataclass
class ExpertsRun:
    run_id: str | None = None
    config: MoEConfig | None = None
    loads: list[StepLoad] = field(default_factory=list)
    drop_rates: list[float] = field(default_factory=list)
    aux_losses: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    comm: MoEComm | None = None
    memory: MoEMemory | None = None

    def feed(self, event: dict) -> bool:
        """Take one event; True if it changed what the run says (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            ExpertsRun.__init__(self, run_id=event.get("run_id"))
        elif MOE_CONFIG.matches(event):
            self.config = event
            self.loads, self.drop_rates, self.aux_losses, self.losses = [], [], [], []
        elif MOE_LOAD.matches(event):
            step = int(event["step"])
            if not self.loads or self.loads[-1].step != step:
                self.loads.append(StepLoad(step, [0] * len(event["routed"]), [0] * len(event["kept"]),
                                           event.get("capacity")))
            load = self.loads[-1]
            load.routed = [a + int(b) for a, b in zip(load.routed, event["routed"])]
            load.kept = [a + int(b) for a, b in zip(load.kept, event["kept"])]
            sent = [[int(n) for n in row] for row in event.get("sent", [])]
            load.sent = sent if not load.sent else [[a + b for a, b in zip(r0, r1)] for r0, r1 in zip(load.sent, sent)]
            load.layers += 1
        elif STEP.matches(event) and "drop_rate" in event:
            self.drop_rates.append(float(event["drop_rate"]))
            self.aux_losses.append(float(event["aux_loss"]))
            self.losses.append(float(event["loss"]))
        elif MOE_COMM.matches(event):
            self.comm = event
        elif MOE_MEMORY.matches(event):
            self.memory = event
        else:
            return False
        return True

    @property
    def comm_match(self) -> bool | None:
        return None if self.comm is None else all(r["match"] for r in self.comm["ranks"])
