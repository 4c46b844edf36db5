"""Lesson 5's run events (``engine/experiments/lesson5.py``, ``engine/pipeline.py``): see
``lessons/events.py``. ``schedule``: ``gpipe``, ``1f1b`` or ``interleaved``."""
from typing import NotRequired

from .. import events as shared
from ..events import Envelope, EventKind


class PipelineConfig(Envelope):
    """The run (rank 0, first): ``p`` stages, ``m`` microbatches, ``v`` chunks per rank."""
    p: int
    m: int
    v: int
    schedules: list[str]
    microbatch_size: int
    d_model: int
    layers: int
    seq: int


class Step(shared.Step):
    """Our run's step, from the rank holding the last stage."""
    schedule: str


class PipelineOp(Envelope):
    """One forward (``F``) or backward (``B``) block of the runner: microbatch ``mb`` of chunk
    ``chunk`` on ``stage``, from ``t0`` to ``t1`` (also the capstone's)."""
    schedule: str
    step: int
    op: str
    mb: int
    chunk: int
    stage: int
    t0: float
    t1: float
    compute: NotRequired[float]  # the block's own work (s): its CPU time on a CPU, t1 - t0 on a GPU


class PipelineStep(Envelope):
    """One step of a rank (``impl``: ``ours`` or ``torch``); ``loss`` on the last stage only."""
    schedule: str
    impl: str
    step: int
    t_start: float
    t_end: float
    loss: float | None


class PipelineStage(Envelope):
    """Rank 0, per schedule and rank (``rank``): the bubble and the peak of activations held,
    measured against the formulas (``torch_peak_bytes``: None without the torch run; ``torch_kept_bytes``:
    what torch's stage still holds after a step, inside its peak: its shape inference's graph on the first stage)."""
    schedule: str
    bubble: float
    bubble_formula: float
    peak_bytes: int
    peak_microbatches: float
    peak_formula: float
    torch_peak_bytes: int | None
    torch_kept_bytes: NotRequired[int | None]  # runs before it was recorded lack it


PP_CONFIG = EventKind("pp_config", PipelineConfig)
STEP = EventKind("step", Step)
PP_OP = EventKind("pp_op", PipelineOp)
PP_STEP = EventKind("pp_step", PipelineStep)
PP_STAGE = EventKind("pp_stage", PipelineStage)

EVENTS = (PP_CONFIG, STEP, PP_OP, PP_STEP, PP_STAGE)
