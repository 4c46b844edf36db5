"""Lesson 1's run events (``engine/experiments/lesson1.py``, ``engine/ring.py``): see ``lessons/events.py``."""
from typing import TypedDict

from .. import events as shared
from ..events import Envelope, EventKind, NotRequired


class Phase(shared.Phase):
    """``start`` (the run's size), ``check``, ``train`` (the model's), ``sweep`` (its sizes),
    ``predict`` (the sizes whose all-reduce time is checked against the ring formula)."""
    n: NotRequired[int]
    backend: NotRequired[str]
    device: NotRequired[str]
    steps: NotRequired[int]
    sweep_sizes: NotRequired[list[int]]
    params: NotRequired[int]
    global_batch: NotRequired[int]
    sizes: NotRequired[list[int]]


class Step(shared.Step):
    """A data-parallel step: seconds computing and in the ring, gradient bytes reduced; ``t0`` its start
    (the end of the step before), for the run's trace."""
    compute_s: float
    comm_s: float
    grad_bytes: int
    t0: float


# "from" is a keyword: this field needs the functional form
_FromRank = TypedDict("_FromRank", {"from": int})


class RingStep(Envelope, _FromRank):
    """One step of a traced ring all-reduce on one rank (``engine/ring.py``): chunk ``chunk``
    goes ``to`` the right neighbour, ``recv_chunk`` comes ``from`` the left one; ``t0`` the
    step's start (``t`` its end)."""
    call: int
    phase: str
    step: int
    of: int
    n: int
    chunk: int
    to: int
    recv_chunk: int
    bytes: int
    size: int
    t0: float


class Sweep(Envelope):
    """One message size of the bandwidth sweep: median seconds and bandwidths of both."""
    size: int
    n: int
    iters: int
    ring_time_s: float
    ring_algbw: float
    ring_busbw: float
    ar_time_s: float
    ar_algbw: float
    ar_busbw: float


class Fit(Envelope):
    """The alpha-beta model fitted to one implementation's times; ``predicted``: ``[size, s]``."""
    impl: str
    n: int
    predicted: list[list[float]]
    alpha_s: float
    beta_s_per_byte: float
    a_s: float
    b_s_per_byte: float
    bandwidth: float | None


class RingCheck(Envelope):
    """Our ring against ``dist.all_reduce`` on ``size`` bytes."""
    size: int
    max_abs_diff: float


PHASE = EventKind("phase", Phase)
STEP = EventKind("step", Step)
RING_STEP = EventKind("ring_step", RingStep)
SWEEP = EventKind("sweep", Sweep)
FIT = EventKind("fit", Fit)
RING_CHECK = EventKind("ring_check", RingCheck)

EVENTS = (PHASE, STEP, RING_STEP, SWEEP, FIT, RING_CHECK)
