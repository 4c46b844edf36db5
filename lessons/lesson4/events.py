"""Lesson 4's run events (``engine/experiments/lesson4.py``): see ``lessons/events.py``.
``mode`` is ``tp`` (Megatron's tensor parallelism) or ``tp+sp`` (with sequence parallelism)."""
from typing import Any

from .. import events as shared
from ..events import Envelope, EventKind, NotRequired


class Config(Envelope):
    """The run: ``T`` ranks of tensor parallelism on a GPT of this size, the modes it trains."""
    T: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    micro_batch: int
    layers: int
    vocab: int
    dropout: float
    modes: list[str]
    regather: bool
    backend: str


class Step(shared.Step):
    """A tensor-parallel step against the dense model's, and the worst gradient difference."""
    mode: str
    dense_loss: float
    max_grad_diff: float


class Comm(Envelope):
    """One collective of the metered step (``layer``: a block's index, or ``head``)."""
    mode: str
    layer: int | str | None
    phase: str | None
    op: str
    site: str | None
    count: int
    wire_bytes: float
    payload_bytes: int


class CommCheck(Envelope):
    """Per layer (``"0"``…) and direction (``fwd``, ``bwd``, ``grad-sync``): the collectives
    counted against ``tp_comm_per_layer``'s ``formula``; ``match``: all equal."""
    mode: str
    layers: dict[str, dict[str, dict[str, Any]]]
    formula: dict[str, Any]
    match: bool


class Memory(Envelope):
    """A layer's activation bytes, measured against the formula (+ the layer norms' stats)."""
    mode: str
    layer: str
    measured_bytes: int
    formula_bytes: float
    ln_stats_bytes: float


class Vocab(Envelope):
    """The vocabulary-parallel loss: logits each rank holds, the cross-entropy's all-reduces
    against gathering the logits."""
    mode: str
    logits_width: int
    vocab: int
    ce_allreduce_count: int
    ce_wire_bytes: float
    gather_logits_wire_bytes: float


class Pitfall(Envelope):
    """A classic bug run on purpose (``name``): how far it lands, and with the fix."""
    name: str
    max_diff: float
    fixed_diff: float


class DTensor(Envelope):
    """One block, ours against PyTorch's DTensor tensor parallelism and the dense one."""
    mode: str
    out_ours_vs_dense: float
    input_grad_ours_vs_dense: float
    grad_ours_vs_dense: float
    ours_comm: dict[str, int]
    out_dtensor_vs_dense: NotRequired[float]
    out_ours_vs_dtensor: NotRequired[float]
    input_grad_ours_vs_dtensor: NotRequired[float]
    grad_ours_vs_dtensor: NotRequired[float]
    dtensor_comm: NotRequired[dict[str, int]]


CONFIG = EventKind("config", Config)
STEP = EventKind("step", Step)
COMM = EventKind("comm", Comm)
COMM_CHECK = EventKind("comm_check", CommCheck)
MEMORY = EventKind("memory", Memory)
VOCAB = EventKind("vocab", Vocab)
PITFALL = EventKind("pitfall", Pitfall)
DTENSOR = EventKind("dtensor", DTensor)

EVENTS = (CONFIG, STEP, COMM, COMM_CHECK, MEMORY, VOCAB, PITFALL, DTENSOR)
