"""Lesson 6's run events (``engine/experiments/lesson6.py``): see ``lessons/events.py``."""
from typing import Any

from .. import events as shared
from ..events import Envelope, EventKind, NotRequired


class Phase(shared.Phase):
    """``loss-scaling`` (its ``steps``), then ``overlap`` (the bucket caps it sweeps, MiB)."""
    steps: NotRequired[int]
    bucket_mb: NotRequired[list[float]]


class Scale(Envelope):
    """One step of the loss scaler: ``scale`` multiplied the step's loss, ``new_scale`` is the
    scale after the update; whether the gradients overflowed (``injected``: on purpose) and the
    step was skipped."""
    step: int
    scale: float
    new_scale: float
    overflow: bool
    skipped: bool
    injected: bool
    growth_tracker: int
    loss: float


class GradHist(Envelope):
    """The fp32 gradients' exponents (``counts[k]``: values with floor(log2|g|) = ``lo`` + k, the
    ends clamped; ``zeros``), the share of the non-zero values that the ``dtype`` backward returned
    as 0 (``zero_*``) or stores as subnormals (``subnormal_*``), without scaling and with scale
    ``scale``, and the median relative error of the low-precision values (``relerr_*``)."""
    step: int
    scale: float
    dtype: str
    lo: int
    counts: list[int]
    zeros: int
    zero_unscaled: float
    zero_scaled: float | None  # None: the scaled gradients overflowed
    subnormal_unscaled: float
    subnormal_scaled: float
    overflow_scaled: bool
    relerr_unscaled: float
    relerr_scaled: float | None


class BucketSweep(Envelope):
    """One bucket cap (MiB) and mode (``overlap``, ``no-overlap``, ``ddp``): the median step."""
    bucket_mb: float
    mode: str
    step_ms: float
    n_buckets: int | None
    samples_ms: list[float]


class Timeline(Envelope):
    """One step's backward and bucket all-reduces, ms after ``t_begin`` (wall-clock seconds):
    ``marks`` by name, ``layers`` ``[name, start, end]``, ``buckets`` ``[index, bytes, start, end]``."""
    bucket_mb: float
    mode: str
    step_ms: float
    t_begin: float
    marks: dict[str, float]
    layers: list[list[Any]]
    buckets: list[list[float]]


class Step(shared.Step):
    """A loss-scaling step; ``t0`` its wall-clock start (a stopped run's trace holds the steps it did);
    ``skipped``: the scaler skipped its update (an overflow), ``injected``: one this run forced."""
    t0: float
    skipped: NotRequired[bool]
    injected: NotRequired[bool]


PHASE = EventKind("phase", Phase)
STEP = EventKind("step", Step)
SCALE = EventKind("scale", Scale)
GRAD_HIST = EventKind("grad_hist", GradHist)
BUCKET_SWEEP = EventKind("bucket_sweep", BucketSweep)
TIMELINE = EventKind("timeline", Timeline)

EVENTS = (PHASE, STEP, SCALE, GRAD_HIST, BUCKET_SWEEP, TIMELINE)
