"""Choosing the degrees of 3D parallelism: every (tp, pp, dp, microbatch, ZeRO stage, recompute,
pipeline chunks) for G GPUs, ranked by predicted step time.

For every split ``tp · pp · dp = G`` the planner

1. **checks the shape** with the course's one shape check (:func:`~distai.lessons.model_size.refusals`):
   ``tp`` divides the attention heads, the hidden size, the vocabulary and (sequence parallelism) the
   sequence, and divides the KV heads or is a multiple of them (each KV head then replicated on
   ``tp/H_kv`` ranks, vLLM's way; the model states still count ``Ψ/tp`` per rank); ``tp`` stays inside a
   node unless allowed (Narayanan et al. 2021, takeaway #1: TP's per-layer all-reduces need NVLink); ``pp`` divides the layers, or the layers plus
   the embedding and output slots (:func:`~.formulas.stage_layers`); the global batch splits into
   ``dp · microbatch``-sized pieces (:func:`~.formulas.microbatches_per_replica`); ZeRO-2/3 only without
   pipeline parallelism (the gradients accumulate over the microbatches; DeepSpeed's pipeline engine
   allows stage 0 or 1 only) and ZeRO only when ``dp > 1``; interleaved chunks ``v > 1`` only when they
   divide the stage's layers and ``m ≥ pp`` (Megatron-LM's interleaved schedule);
2. **checks the fit**: per GPU, the model states of ``Ψ/(tp·pp)`` parameters sharded by ZeRO over ``dp``
   (lesson 2's :func:`~distai.lessons.lesson2.formulas.model_state_bytes`) plus the activations of the
   busiest stage (lesson 2's :func:`~distai.lessons.lesson2.formulas.activation_bytes`, sequence
   parallelism on when ``tp > 1``) times the microbatches the first stage holds at once (lesson 5's
   :func:`~distai.lessons.lesson5.formulas.peak_inflight_microbatches`), plus, with full recomputation,
   one layer rebuilt during its backward; the last stage instead holds one microbatch plus the fp32
   logits of its vocabulary shard (s·b·V/t·4 bytes). It must fit in ``gpu_memory · memory_util``;
3. **predicts the step time**: each stage runs ``m`` microbatches; one microbatch on one stage costs its
   share of the hardware FLOPs (:func:`~.formulas.hardware_flops_per_token`) at ``efficiency ·`` peak,
   plus its layers' TP collectives (lesson 4's
   :func:`~distai.lessons.lesson4.formulas.tp_comm_time_per_layer`, repeated in the recomputed forward),
   plus its point-to-point sends to the neighbouring stages (``2·v`` messages of ``s·b·h·2/t`` bytes,
   Megatron's scatter/gather, lesson 1's α-β :func:`~distai.lessons.lesson1.formulas.serial_messages_time`).
   The pipeline takes ``m + (p−1)/v`` such slots (lesson 5's bubble). Then data parallelism: the gradient
   all-reduce (ZeRO-1/2: reduce-scatter, then all-gather of the updated parameters) of the rank's
   ``Ψ/(tp·pp)`` bf16 gradients (lesson 1's ring), overlapped with the last microbatch's backward; ZeRO-3
   all-gathers the parameters twice and reduce-scatters the gradients every microbatch, overlapped with
   that microbatch's compute. Each group's link is NVLink when all its ranks share a node (ranks fill
   nodes in order on the (pp, dp, tp) mesh), else the inter-node link;
4. **ranks** the feasible configurations by step time (ties: less memory first), and reports the MFU
   (:func:`~.formulas.mfu`: model FLOPs only, recomputation excluded).

The model is deliberately simple — perfectly balanced stages apart from the embedding slots, no
overlap of TP or PP communication with compute, ring collectives in the α-β model — so that it
explains why a layout wins. ``efficiency`` (the fraction of peak a transformer layer's kernels sustain
on one GPU, default 0.75) is an input: measure yours. Pure Python.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import units
from ..lesson1.formulas import (
    ring_allgather_time,
    ring_allreduce_time,
    ring_reduce_scatter_time,
    serial_messages_time,
)
from ..lesson2.formulas import activation_bytes, activation_bytes_per_layer, model_state_bytes
from ..lesson4.formulas import tp_comm_time_per_layer
from ..lesson5.formulas import ScheduleError, bubble_fraction, check_schedule, peak_inflight_microbatches
from ..model_size import Refusal, ShapeError, explain, refusals
from ..model_spec import ModelSpec
from . import formulas as f

MICROBATCHES = (1, 2, 4, 8)
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
CHUNKS = (1, 2, 4, 8)
GRAD_BYTES = 2  # bf16 gradients, reduced as Megatron-LM and torchtitan do by default


@dataclass(frozen=True)
class Cluster:
    gpus: int
    gpu_memory: float  # bytes
    gpus_per_node: int = 8
    flops: float = 989e12  # peak dense bf16 FLOP/s (H100 SXM)
    intra_bandwidth: float = 450e9  # NVLink, B/s per direction (H100: 900 GB/s both ways)
    inter_bandwidth: float = 50e9  # per GPU between nodes, B/s (a 400 Gb/s NIC per GPU)
    alpha: float = 5e-6  # latency per message inside a node, s
    inter_alpha: float = 10e-6  # between nodes, s
    efficiency: float = 0.75  # fraction of peak a layer's kernels sustain on one GPU
    memory_util: float = 0.9  # the rest: CUDA context, NCCL buffers, allocator fragmentation
    tp_across_nodes: bool = False


@dataclass
class Config:
    tp: int
    pp: int
    dp: int
    microbatch: int | None = None
    zero: int | None = None
    recompute: str | None = None
    chunks: int | None = None
    reason: str = ""
    microbatches: int = 0
    memory_bytes: float = 0.0
    memory: dict = field(default_factory=dict)
    step_time_s: float = 0.0
    time: dict = field(default_factory=dict)
    bubble_fraction: float = 0.0
    mfu: float = 0.0
    tokens_per_s: float = 0.0

    @property
    def layout(self) -> tuple[int, int, int]:
        return (self.tp, self.pp, self.dp)

    def as_dict(self) -> dict:
        return asdict(self)

    def rejected_dict(self) -> dict:
        keys = ("tp", "pp", "dp", "microbatch", "zero", "recompute", "chunks", "reason")
        return {k: getattr(self, k) for k in keys}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _spans_nodes(stride: int, size: int, gpus_per_node: int) -> bool:
    """Whether the mesh's groups of ``size`` ranks ``stride`` apart reach beyond a node. The groups of one
    dimension tile blocks of ``stride·size`` consecutive ranks; they all stay inside nodes exactly when
    such a block fits in a node and the node holds a whole number of blocks."""
    block = stride * size
    return size > 1 and not (block <= gpus_per_node and gpus_per_node % block == 0)


def _link(cluster: Cluster, across: bool) -> tuple[float, float]:
    """(α, β) of a group's link: NVLink inside a node, the inter-node network across nodes."""
    if across:
        return cluster.inter_alpha, 1 / cluster.inter_bandwidth
    return cluster.alpha, 1 / cluster.intra_bandwidth


def shape_refusals(model: ModelSpec, tp: int | None = None, pp: int | None = None) -> list[Refusal]:
    """The course's one shape check (:func:`~distai.lessons.model_size.refusals`) for a (tp, pp)
    split as this planner runs it: sequence parallelism whenever tp > 1, a vocabulary-parallel head,
    KV heads split or replicated, and stages that hold the layers with the embedding and output
    slots (:func:`~.formulas.stage_layers`). A degree left out is not checked."""
    t, p = tp or 1, pp or 1
    return refusals(tp=t, sequence_parallel=t > 1, heads=model.heads, kv_heads=model.kv_heads,
                    hidden=model.hidden, vocab=model.vocab or None, seq=model.seq,
                    pp=p, stages="with-ends", layers=model.layers if pp is not None else None)


def shape_reason(model: ModelSpec, cluster: Cluster, tp: int, pp: int) -> str:
    """Why a (tp, pp) split cannot hold the model, or "" when it can."""
    found = shape_refusals(model, tp, pp)
    if found:
        return explain(found)
    if _spans_nodes(1, tp, cluster.gpus_per_node) and not cluster.tp_across_nodes:
        where = ("spans more than one node" if tp > cluster.gpus_per_node
                 else "does not divide the node, so some TP groups straddle two nodes")
        return (f"tp = {tp} {where} of {cluster.gpus_per_node} GPUs (TP stays on NVLink; allow it with "
                f"--tp-across-nodes)")
    return ""


def evaluate(model: ModelSpec, cluster: Cluster, global_batch: int, c: Config, optimizer: str = "adam") -> Config:
    """Fill in ``c``'s memory, time and MFU, or its ``reason`` when it is infeasible."""
    tp, pp, dp, b, v = c.tp, c.pp, c.dp, c.microbatch, c.chunks
    if b is None or v is None or c.zero is None or c.recompute is None:
        raise ValueError(f"evaluate needs the microbatch, ZeRO stage, recomputation and chunks of {c}")
    try:
        m = f.microbatches_per_replica(global_batch, dp, b)
    except ValueError as exc:
        c.reason = str(exc)
        return c
    c.microbatches = m
    if c.zero >= 2 and pp > 1:
        c.reason = (f"ZeRO-{c.zero} with pp = {pp}: gradients accumulate over microbatches "
                    f"(pipeline engines allow ZeRO-0/1)")
        return c
    if c.zero > 0 and dp == 1:
        c.reason = f"ZeRO-{c.zero} with dp = 1: nothing to shard over"
        return c
    stage = f.stage_layers(model.layers, pp)
    if v > 1 and (pp == 1 or stage % v):
        c.reason = (f"{v} chunks per stage need pp > 1 and must divide the stage's {stage} layers"
                    if pp > 1 else "interleaved chunks need pp > 1")
        return c
    if v > 1:
        try:  # lesson 5 decides what the interleaved schedule accepts (m < pp, or equal rounds)
            check_schedule("interleaved", pp, m, v)
        except ScheduleError as exc:
            c.reason = str(exc)
            return c

    # memory (lesson 2's model states and activations, lesson 5's microbatches in flight)
    params_gpu = -(-int(model.params) // (tp * pp))
    strategy = ("ddp", "zero1", "zero2", "zero3")[c.zero]
    states = model_state_bytes(params_gpu, dp, strategy, optimizer)["total_bytes"]
    sp = tp > 1
    act_mb = activation_bytes(stage, model.seq, b, model.hidden, model.heads, tp, sp, c.recompute)
    schedule = "interleaved" if v > 1 else "1f1b"
    inflight = peak_inflight_microbatches(pp, m, schedule, v)
    working = (activation_bytes_per_layer(model.seq, b, model.hidden, model.heads, tp, sp, "selective")
               if c.recompute == "full" else 0.0)
    first = states + act_mb * inflight + working
    logits = model.seq * b * model.vocab / tp * 4 if model.vocab else 0.0
    last = states + act_mb * (1 if pp > 1 else inflight) + working + logits
    c.memory = {"model_states_bytes": states, "activations_bytes": act_mb * inflight + working,
                "logits_bytes": logits, "first_stage_bytes": first, "last_stage_bytes": last,
                "microbatches_in_flight": inflight, "usable_bytes": cluster.gpu_memory * cluster.memory_util}
    c.memory_bytes = max(first, last)
    if c.memory_bytes > cluster.gpu_memory * cluster.memory_util:
        c.reason = (f"needs {units.format_bytes(c.memory_bytes)} per GPU, more than the usable "
                    f"{units.format_bytes(cluster.gpu_memory * cluster.memory_util)}")
        return c

    # time of one microbatch on one stage: compute + TP collectives + PP sends
    n = cluster.gpus
    tokens = global_batch * model.seq
    hw_flops = tokens * f.hardware_flops_per_token(model.params, model.layers, model.hidden, model.seq, c.recompute)
    imbalance = stage * pp / model.layers  # the busiest stage sets the pace
    compute_mb = hw_flops / (n * cluster.flops * cluster.efficiency) * imbalance / m
    g = cluster.gpus_per_node
    tp_alpha, tp_beta = _link(cluster, _spans_nodes(1, tp, g))
    tp_mb = 0.0
    if tp > 1:
        per_layer = tp_comm_time_per_layer(model.hidden, model.seq, b, tp, tp_alpha, tp_beta, sequence_parallel=True)
        tp_mb = stage * per_layer * (1.5 if c.recompute == "full" else 1.0)  # the recomputed forward talks again
    pp_alpha, pp_beta = _link(cluster, _spans_nodes(dp * tp, pp, g))
    pp_mb = 0.0
    if pp > 1:
        pp_mb = serial_messages_time(2 * v, f.pp_p2p_bytes_per_microbatch(model.seq, b, model.hidden, tp),
                                     pp_alpha, pp_beta)
    slot = compute_mb + tp_mb + pp_mb
    bubble = bubble_fraction(pp, m, v)
    pipeline = slot * (m + (pp - 1) / v)

    # data parallelism: gradients of Ψ/(tp·pp) parameters, overlapped with the last backward
    dp_alpha, dp_beta = _link(cluster, _spans_nodes(tp, dp, g))
    grads = params_gpu * GRAD_BYTES
    backward_mb = compute_mb * 2 / 3  # backward ≈ 2/3 of a microbatch's forward + backward FLOPs
    dp_exposed = 0.0
    if dp > 1:
        if c.zero == 0:
            dp_exposed = max(0.0, ring_allreduce_time(grads, dp, dp_alpha, dp_beta) - backward_mb)
        elif c.zero in (1, 2):
            scatter = ring_reduce_scatter_time(grads, dp, dp_alpha, dp_beta)
            if c.zero == 2:  # sharded gradients: reduce-scatter every microbatch, each behind its backward
                dp_exposed = m * max(0.0, scatter - backward_mb)
            else:
                dp_exposed = max(0.0, scatter - backward_mb)
            dp_exposed += ring_allgather_time(params_gpu * 2, dp, dp_alpha, dp_beta)  # updated bf16 parameters
        else:  # ZeRO-3: gather parameters for forward and backward, reduce-scatter gradients, each microbatch
            per_mb = (2 * ring_allgather_time(params_gpu * 2, dp, dp_alpha, dp_beta)
                      + ring_reduce_scatter_time(grads, dp, dp_alpha, dp_beta))
            dp_exposed = m * max(0.0, per_mb - compute_mb)
    c.step_time_s = pipeline + dp_exposed
    c.time = {"compute_s": compute_mb * m, "tp_comm_s": tp_mb * m, "pp_comm_s": pp_mb * m,
              "bubble_s": pipeline - slot * m, "dp_comm_exposed_s": dp_exposed,
              "tp_over_nodes": _spans_nodes(1, tp, g), "pp_over_nodes": _spans_nodes(dp * tp, pp, g),
              "dp_over_nodes": _spans_nodes(tp, dp, g)}
    c.bubble_fraction = bubble
    c.mfu = f.mfu(model_flops_per_step(model, global_batch), c.step_time_s, n, cluster.flops)
    c.tokens_per_s = tokens / c.step_time_s
    return c


def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """The model's FLOPs in one step of ``global_batch`` sequences (no recomputation): what MFU counts."""
    return global_batch * model.seq * f.model_flops_per_token(model.params, model.layers, model.hidden, model.seq)


def plan(model: ModelSpec, cluster: Cluster, global_batch: int, optimizer: str = "adam",
         tp: int | None = None, pp: int | None = None, dp: int | None = None,
         microbatches: tuple[int, ...] = MICROBATCHES, zero: tuple[int, ...] = ZERO_STAGES,
         recompute: tuple[str, ...] = RECOMPUTE, chunks: tuple[int, ...] = CHUNKS) -> dict:
    """Every configuration for ``cluster.gpus`` GPUs: {"configs": the feasible ones, best first;
    "rejected": the others, each with its reason}. ``tp``/``pp``/``dp`` fix a degree, and the tuples
    narrow the search to what a framework offers (Megatron-LM in 2021 had no ZeRO: ``zero=(0,)``). A fixed
    degree that does not divide the GPUs, the heads, the layers or the batch is a ValueError."""
    n = cluster.gpus
    if model.seq < 1:
        raise ValueError(f"the training sequence length must be at least 1 token, got {model.seq}")
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        if value is not None and n % value:
            raise ValueError(f"--{name} {value} does not divide the {n} GPUs")
    found = shape_refusals(model, tp, pp)
    if found:
        raise ShapeError(found)
    if dp is not None and global_batch % dp:
        raise ValueError(f"--dp {dp} does not divide the global batch of {global_batch} sequences")
    if tp is not None and pp is not None and dp is not None and tp * pp * dp != n:
        raise ValueError(f"tp·pp·dp = {tp}·{pp}·{dp} = {tp * pp * dp} is not the {n} GPUs")
    feasible: list[Config] = []
    rejected: list[Config] = []
    for t in _divisors(n):
        if tp is not None and t != tp:
            continue
        for p in _divisors(n // t):
            d = n // (t * p)
            if (pp is not None and p != pp) or (dp is not None and d != dp):
                continue
            why = shape_reason(model, cluster, t, p)
            if why:
                rejected.append(Config(t, p, d, reason=why))
                continue
            for b in microbatches:
                if global_batch % (d * b):
                    rejected.append(Config(t, p, d, b, reason=(
                        f"the global batch {global_batch} does not split into dp·microbatch = {d}·{b} pieces")))
                    continue
                for z in zero:
                    for r in recompute:
                        for v in chunks:
                            c = evaluate(model, cluster, global_batch, Config(t, p, d, b, z, r, v), optimizer)
                            if not c.reason:
                                feasible.append(c)
                            elif v == 1 or c.memory_bytes:  # a shape reason once, not once per chunk count
                                rejected.append(c)
    feasible.sort(key=lambda c: (c.step_time_s, c.memory_bytes, c.layout))
    return {"configs": feasible, "rejected": rejected}


def layout_rank(configs: list[Config], tp: int, pp: int, dp: int) -> tuple[int, Config | None]:
    """Rank (1 = best) of the layout (tp, pp, dp) among distinct layouts, each at its best configuration,
    and that configuration; (0, None) when the layout has no feasible configuration."""
    seen: list[tuple[int, int, int]] = []
    for c in configs:
        if c.layout not in seen:
            seen.append(c.layout)
            if c.layout == (tp, pp, dp):
                return len(seen), c
    return 0, None
