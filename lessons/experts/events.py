"""The Mixture-of-Experts experiment's run events (``engine/experiments/experts.py``): see
``lessons/events.py``."""
from typing import Any

from .. import events as shared
from ..events import Envelope, EventKind


class MoEConfig(Envelope):
    """Rank 0, first: ``experts`` over EP groups of ``ep`` ranks (× ``dp``), the router's
    settings, the GPT's size, the ``tokens`` a capacity is counted over and that ``capacity``
    (None: dropless)."""
    experts: int
    ep: int
    dp: int
    world: int
    top_k: int
    capacity_factor: float | None
    aux_alpha: float
    shared_experts: int
    bias_rate: float
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    micro_batch: int
    tokens: int
    capacity: int | None
    experts_per_rank: int
    dtype: str
    device: str


class MoELoad(Envelope):
    """Rank 0, every step and layer: tokens ``routed`` to and ``kept`` by each expert, the
    capacity (None: dropless), the drop rate, the balancing loss, and ``sent[rank][q]``: the token
    rows each rank dispatched to rank ``q`` of its EP group."""
    step: int
    layer: int
    routed: list[int]
    kept: list[int]
    capacity: int | None
    drop_rate: float
    aux_loss: float
    sent: list[list[int]]


class Step(shared.Step):
    """One step against one process's (None: ``--no-check``), with the balancing loss and drops."""
    ref_loss: float | None
    loss_rel_diff: float | None
    param_rel_diff: float | None
    aux_loss: float
    drop_rate: float
    step_time_s: float


class MoEComm(Envelope):
    """Rank 0, after the metered ``step``: per rank ``{"rank", "measured", "formula", "match"}``,
    each ``{"calls", "token_bytes", "count_bytes"}`` for one step, all layers."""
    step: int
    ranks: list[dict[str, Any]]


class MoEMemory(Envelope):
    """Rank 0: per rank ``{"rank", "expert_bytes", "formula_bytes", "replicated_bytes",
    "all_experts_bytes"}``."""
    ranks: list[dict[str, Any]]


MOE_CONFIG = EventKind("moe_config", MoEConfig)
MOE_LOAD = EventKind("moe_load", MoELoad)
STEP = EventKind("step", Step)
MOE_COMM = EventKind("moe_comm", MoEComm)
MOE_MEMORY = EventKind("moe_memory", MoEMemory)

EVENTS = (MOE_CONFIG, MOE_LOAD, STEP, MOE_COMM, MOE_MEMORY)
