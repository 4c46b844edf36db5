"""Lesson 2's run events (``engine/experiments/lesson2.py``): see ``lessons/events.py``."""
from typing import Any

from .. import events as shared
from ..events import Envelope, EventKind, NotRequired


class Phase(shared.Phase):
    """``setup`` (the run's size and strategies), then one phase per strategy."""
    world_size: NotRequired[int]
    num_params: NotRequired[int]
    precision: NotRequired[str]
    optimizer: NotRequired[str]
    strategies: NotRequired[list[str]]
    backend: NotRequired[str]


class Step(shared.Step):
    strategy: str


class Memory(Envelope):
    """Bytes one rank holds after a strategy's metered step, against the calculator's."""
    strategy: str
    params: int
    grads: int
    optimizer: int
    total: int
    predicted: float
    predicted_parts: dict[str, int]
    peak: int | None
    fsdp_tracker: dict[str, Any] | None
    world_size: int
    num_params: int
    precision: str
    optimizer_name: str


class Comm(Envelope):
    """Bytes one rank sent in a strategy's metered step, by operation, against the formula."""
    strategy: str
    sent: float | None
    by_op: dict[str, float]
    calls: dict[str, int]
    predicted: float
    num_params: int


class StrategyDone(Envelope):
    strategy: str
    step_time_s: float
    max_abs_diff: float | None
    final_loss: float


PHASE = EventKind("phase", Phase)
STEP = EventKind("step", Step)
MEMORY = EventKind("memory", Memory)
COMM = EventKind("comm", Comm)
STRATEGY_DONE = EventKind("strategy_done", StrategyDone)

EVENTS = (PHASE, STEP, MEMORY, COMM, STRATEGY_DONE)
