"""Lesson 2's sharding layouts: which GPU holds which slice of which state, and what a ZeRO-3 step moves.

Pure Python on top of :mod:`distai.lessons.lesson2.formulas` (the byte counts come from there; this
module only says *where* they sit). The visualizer draws these objects.

Vocabulary
----------
* A *state* is one of ``params``, ``grads``, ``master`` (fp32 copy in mixed precision), ``momentum``,
  ``variance`` (Adam), plus ``activations`` (per GPU, never sharded by ZeRO).
* Every state is partitioned into N equal *slices*; slice ``k`` is *owned* by rank ``k`` (the rank
  that updates it). Under DDP every GPU holds all N slices of everything (the same bytes N times);
  ZeRO-1 keeps only the owner's slice of the optimizer states, ZeRO-2 of the gradients too, ZeRO-3
  (and FSDP's full sharding) of the parameters too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import formulas as F

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")  # FSDP (full sharding) has ZeRO-3's layout
MODEL_STATES = ("params", "grads", "master", "momentum", "variance")
STATES = MODEL_STATES + ("activations",)
#: the first stage that shards each model state (ZeRO paper, Fig. 1)
SHARDED_FROM = {"params": 3, "grads": 2, "master": 1, "momentum": 1, "variance": 1}
LEVEL = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}


def bytes_per_param_by_state(optimizer: str = "adam", precision: str = "mixed") -> dict[str, int]:
    """Bytes per parameter of each model state before sharding (sums to 2 + 2 + K in mixed precision)."""
    per = F.bytes_per_param(optimizer, precision)
    return {"params": per["params"], "grads": per["grads"], **F.optimizer_state_parts(optimizer, precision)}


def is_sharded(strategy: str, state: str) -> bool:
    if strategy not in LEVEL:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return state in SHARDED_FROM and LEVEL[strategy] >= SHARDED_FROM[state]


def slices_held(strategy: str, state: str, rank: int, dp: int) -> list[int]:
    """The owners of the slices of ``state`` that GPU ``rank`` holds: just its own when sharded."""
    if state == "activations":
        return [rank]
    return [rank] if is_sharded(strategy, state) else list(range(dp))


@dataclass(frozen=True)
class Segment:
    """One state on one GPU: its bytes and the owners of the slices it is made of."""

    state: str
    bytes: float
    owners: tuple[int, ...]
    sharded: bool


@dataclass(frozen=True)
class GPU:
    rank: int
    segments: tuple[Segment, ...]
    capacity: float | None

    @property
    def total(self) -> float:
        return sum(s.bytes for s in self.segments)

    @property
    def model_states(self) -> float:
        return sum(s.bytes for s in self.segments if s.state != "activations")

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.total <= self.capacity

    def bytes_of(self, state: str) -> float:
        return sum(s.bytes for s in self.segments if s.state == state)


@dataclass(frozen=True)
class Layout:
    params: int
    dp: int
    strategy: str
    optimizer: str
    precision: str
    capacity: float | None
    activations: float
    gpus: tuple[GPU, ...] = field(repr=False)

    @property
    def per_gpu(self) -> float:
        """Bytes on one GPU (all GPUs hold the same amount; only the slices differ)."""
        return self.gpus[0].total

    @property
    def fits(self) -> bool:
        return self.gpus[0].fits

    @property
    def cluster_total(self) -> float:
        return self.per_gpu * self.dp

    @property
    def redundancy(self) -> float:
        """How many times the cluster stores each model-state byte (N for DDP, 1 for ZeRO-3)."""
        unique = sum(bytes_per_param_by_state(self.optimizer, self.precision).values()) * self.params
        return self.gpus[0].model_states * self.dp / unique if unique else 0.0


def layout(params, dp: int, strategy: str = "ddp", optimizer: str = "adam", precision: str = "mixed",
           capacity: float | None = None, activations: float = 0.0, ranks: list[int] | None = None) -> Layout:
    """Every GPU's memory, state by state, with the owner of each slice it holds.

    Byte counts are :func:`formulas.model_state_bytes`'s (a sharded state holds ⌈Ψ/N⌉ elements);
    ``activations`` (bytes per GPU, e.g. from :func:`formulas.activation_bytes`) are added as is.
    ``ranks`` limits which GPUs are built (all by default).
    """
    psi = int(params)
    n = int(dp)
    states = F.model_state_bytes(psi, n, "fsdp" if strategy == "fsdp" else strategy, optimizer, precision)
    per = bytes_per_param_by_state(optimizer, precision)
    shard = math.ceil(psi / n)
    gpus = []
    for rank in (range(n) if ranks is None else ranks):
        segs = []
        for state in MODEL_STATES:
            if per[state] == 0:
                continue
            sharded = is_sharded(strategy, state)
            segs.append(Segment(state, per[state] * (shard if sharded else psi),
                                tuple(slices_held(strategy, state, rank, n)), sharded))
        if activations:
            segs.append(Segment("activations", float(activations), (rank,), False))
        gpus.append(GPU(rank, tuple(segs), capacity))
    out = Layout(psi, n, strategy, optimizer, precision, capacity, float(activations), tuple(gpus))
    if gpus:
        assert gpus[0].model_states == states["total_bytes"], (gpus[0].model_states, states)
    return out


# ------------------------------------------------------------------------------------------------
# One ZeRO-3 (FSDP) training step, phase by phase, against DDP's traffic
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One moment of the step. ``sent`` and ``sent_ddp`` are the bytes one rank has sent so far."""

    index: int
    action: str                 # all_gather | forward | backward | free | reduce_scatter | step
    layer: int | None
    stage: str                  # forward | backward | optimizer
    gathered: tuple[int, ...]   # layers whose full parameters are in memory after this phase
    full_grads: tuple[int, ...]  # layers whose full (unreduced) gradients are in memory
    moved: float                # bytes this phase sends per rank
    sent: float
    sent_ddp: float


def zero3_step(params, dp: int, layers: int = 4, precision: str = "mixed", prefetch: bool = False) -> list[Phase]:
    """The phases of one ZeRO-3 step over ``layers`` equal layers (FSDP units) of Ψ/layers parameters.

    Forward: all-gather layer i's parameters, compute, free them. Backward (last layer first):
    all-gather again, compute, reduce-scatter the gradients, free. Then each rank's optimizer
    updates its own slice. Each all-gather and reduce-scatter of a layer of P elements sends
    (N-1)/N·P elements per rank (ring); DDP sends its all-reduce, 2(N-1)/N·P, as each layer's
    backward finishes. With ``prefetch`` the next layer's all-gather is issued as the current layer
    starts computing, so two layers are gathered at once. End totals equal
    :func:`formulas.comm_volume_per_step`'s exact bytes (3Ψ vs 2Ψ elements, times (N-1)/N).
    """
    n = int(dp)
    if layers < 1:
        raise ValueError("a step needs at least one layer")
    b = 2 if precision == "mixed" else 4
    psi = int(params)
    sizes = [psi // layers + (1 if i < psi % layers else 0) for i in range(layers)]
    frac = (n - 1) / n
    phases: list[Phase] = []
    gathered: list[int] = []
    grads: list[int] = []
    sent = sent_ddp = 0.0

    def add(action, layer, stage, moved=0.0, ddp=0.0):
        nonlocal sent, sent_ddp
        sent += moved
        sent_ddp += ddp
        phases.append(Phase(len(phases), action, layer, stage, tuple(gathered), tuple(grads), moved,
                            sent, sent_ddp))

    def gather(layer, stage):
        if layer not in gathered:
            gathered.append(layer)
            add("all_gather", layer, stage, frac * sizes[layer] * b)

    for i in range(layers):
        gather(i, "forward")
        if prefetch and i + 1 < layers:
            gather(i + 1, "forward")
        add("forward", i, "forward")
        gathered.remove(i)
        add("free", i, "forward")
    for i in reversed(range(layers)):
        gather(i, "backward")
        if prefetch and i > 0:
            gather(i - 1, "backward")
        grads.append(i)
        add("backward", i, "backward", ddp=2 * frac * sizes[i] * b)
        add("reduce_scatter", i, "backward", frac * sizes[i] * b)
        gathered.remove(i)
        grads.remove(i)  # the full gradient goes too: this rank keeps its reduced slice
        add("free", i, "backward")
    add("step", None, "optimizer")
    return phases


def step_traffic(params, dp: int, precision: str = "mixed") -> dict[str, float]:
    """Bytes one rank sends per step under each strategy (the calculator's exact figures)."""
    b = 2 if precision == "mixed" else 4
    return {s: F.comm_volume_per_step(params, s, dp, b)["exact_bytes"] for s in STRATEGIES}


def layer_bytes(params, layers: int, precision: str = "mixed") -> float:
    """Bytes of one layer's full parameters (what ZeRO-3 materializes for a moment)."""
    return (2 if precision == "mixed" else 4) * int(params) / layers
