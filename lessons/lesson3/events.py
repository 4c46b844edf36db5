"""Lesson 3's run events (``engine/experiments/lesson3.py``): see ``lessons/events.py``.

Steps are numbered from 1 in ``failure``/``restart``/``redone``/``checkpoint``; ``step`` events
carry the 0-based index like every experiment. ``attempt``: 0 for the first start, then one more
for each restart (in place by torchrun, or a relaunch by the supervisor).
"""
from typing import TypedDict

from .. import events as shared
from ..events import Envelope, EventKind, NotRequired


class Phase(shared.Phase):
    """``start`` (``restart_count`` > 0: torchrun restarted the group in place), ``train``,
    ``compare``, ``checkpoint cost``."""
    attempt: int
    backend: NotRequired[str]
    n: NotRequired[int]
    restart_count: NotRequired[int]
    steps: NotRequired[int]


class Step(shared.Step):
    """``redo``: a step the failure threw away, done again; ``t0`` its start."""
    lr: float
    attempt: int
    redo: bool
    t0: float


class Restart(Envelope):
    """Attempt ``attempt`` resumed after ``from_step`` steps from ``checkpoint`` (None: from the
    beginning), having ``skipped`` the bad ones (``[name, why]``); ``lost_steps`` completed steps
    were thrown away."""
    attempt: int
    from_step: int
    checkpoint: str | None
    skipped: list[list[str]]
    failed_rank: int | None
    failed_step: int | None
    failed_phase: str | None
    last_done: int
    lost_steps: int
    restart_count: int
    load_s: float
    forgot: list[str]
    new_run: NotRequired[bool]  # the earlier attempts were another run's: this one was started on their checkpoints


class Checkpoint(Envelope):
    """A checkpoint after ``step`` (an ``async`` one once published: ``seconds`` from the call
    until then, ``blocked_s`` the training's wait, ``t_end`` when it was published)."""
    step: int
    bytes: int
    seconds: float
    name: str
    form: str
    attempt: int
    pruned: list[str]
    mode: str
    blocked_s: NotRequired[float]
    t_end: NotRequired[float | None]


class Failure(Envelope):
    """From the rank about to die: during ``step`` (``phase``: ``step`` or ``checkpoint``)."""
    step: int
    phase: str
    cause: str
    attempt: int


class Redone(Envelope):
    """Once the resumed run redid the lost steps: whether their losses equal the first time's."""
    first: int
    last: int
    steps: int
    compared: int
    identical: bool


class Compare(Envelope):
    """The resumed run against one trained again from scratch without faults (same seed)."""
    attempt: int
    steps: int
    identical: bool
    equal_steps: int
    first_diff_step: int | None
    max_abs_diff: float
    weights_identical: bool
    run_sha256: str
    reference_sha256: str


class ModeCost(TypedDict):
    """One checkpoint mode's cost: the loop's seconds per step, a save's blocking seconds and,
    saving, the loop's extra seconds per checkpoint against none, and the part of them its steps
    took longer (``slower_steps_s``) and its save calls took (``save_s``), per checkpoint."""
    step_s: float
    blocked_s: float
    per_checkpoint_s: NotRequired[float]
    slower_steps_s: NotRequired[float]
    save_s: NotRequired[float]


# "async" is a keyword: these fields need the functional form
_CostModes = TypedDict("_CostModes", {"none": ModeCost, "sync": ModeCost, "async": ModeCost})


class CheckpointCost(_CostModes):
    """What checkpoints cost the loop: ``steps`` steps, a save every ``every``, each written in
    ``write_s``."""
    steps: int
    every: int
    write_s: float


class CkptCost(Envelope, CheckpointCost):
    attempt: int


PHASE = EventKind("phase", Phase)
STEP = EventKind("step", Step)
RESTART = EventKind("restart", Restart)
CHECKPOINT = EventKind("checkpoint", Checkpoint)
FAILURE = EventKind("failure", Failure)
REDONE = EventKind("redone", Redone)
COMPARE = EventKind("compare", Compare)
CKPT_COST = EventKind("ckpt_cost", CkptCost)

EVENTS = (PHASE, STEP, RESTART, CHECKPOINT, FAILURE, REDONE, COMPARE, CKPT_COST)
