"""Context parallelism's run events (``engine/experiments/context.py``): see ``lessons/events.py``."""
from typing import Any, NotRequired

from .. import events as shared
from ..events import Envelope, EventKind


class CPConfig(Envelope):
    """The run: ``cp`` ranks per context-parallel group (× ``dp`` replicas), the sequence
    ``layout`` and attention ``variant``, the GPT's size."""
    cp: int
    dp: int
    world: int
    backend: str
    layout: str
    variant: str
    seq: int
    batch: int
    hidden: int
    heads: int
    kv_heads: int
    layers: int
    vocab: int


class Step(shared.Step):
    """A context-parallel step against one process's."""
    reference_loss: float
    max_grad_rel_diff: float


class CPStep(Envelope):
    """One ring step of the attention on one rank (replica 0's) in training step ``train_step``:
    the block it holds (``owner``'s), its tiles (``full``/``diagonal``), causal scores, seconds
    computing and waiting, messages and bytes sent, each against the schedule and the formula."""
    train_step: int
    phase: str
    step: int
    owner: int
    layer: int | str | None
    tiles: list[str]
    scores: float
    compute_s: float
    wait_s: float
    messages: int
    sent_bytes: float
    compute_cpu_s: NotRequired[float]  # the CPU seconds of that compute: the work, its waits for a core apart
    formula_scores: float
    formula_messages: int
    formula_bytes: float
    match: bool
    t0: NotRequired[float]  # wall-clock start of its compute: the trace draws compute, then the wait


class CommCheck(Envelope):
    """Per layer (``"0"``…) and phase (``fwd``, ``bwd``): messages and bytes the meter saw against
    ``cp_comm_per_layer``; ``match``: all equal."""
    layers: dict[str, dict[str, dict[str, Any]]]
    match: bool


class Memory(Envelope):
    """Activation bytes per layer at sequence ``seq``: one CP rank's and one process's, measured
    against the formula, and their peaks."""
    seq: int
    measured_bytes: float
    formula_bytes: float
    one_process_bytes: float
    one_process_formula_bytes: float
    peak_bytes: float
    one_process_peak_bytes: float


CP_CONFIG = EventKind("cp_config", CPConfig)
STEP = EventKind("step", Step)
CP_STEP = EventKind("cp_step", CPStep)
COMM_CHECK = EventKind("comm_check", CommCheck)
MEMORY = EventKind("memory", Memory)

EVENTS = (CP_CONFIG, STEP, CP_STEP, COMM_CHECK, MEMORY)
