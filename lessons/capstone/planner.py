"""Choosing the degrees of 3D parallelism: every (tp, pp, dp, microbatch, ZeRO stage, recompute,
pipeline chunks) for G GPUs, ranked by predicted step time.

For every split ``tp · pp · dp = G`` the planner

1. **checks the shape** with the course's one shape check (:func:`~distai.lessons.model_size.refusals`):
   ``tp`` divides the attention heads, the hidden size, the vocabulary and (sequence parallelism) the
   sequence, and divides the KV heads or is a multiple of them (each KV head then replicated on
   ``tp/H_kv`` ranks, vLLM's way; the model states still count ``Ψ/tp`` per rank); ``tp`` stays inside a
   node unless allowed (Narayanan et al. 2021, takeaway #1: TP's per-layer all-reduces need NVLink); ``pp`` divides the layers, or the layers plus
   the embedding and output slots (:func:`~.formulas.stage_layers`); the global batch splits into
   ``dp · microbatch``-sized pieces (:func:`~.formulas.microbatches_per_replica`); ZeRO stages above
   ``Axes.max_zero_pp`` only without pipeline parallelism (DeepSpeed's pipeline engine allows stage 0 or 1
   only; torchtitan and Llama 3 run FSDP, ZeRO-3, with a pipeline) and ZeRO only when ``dp > 1``; interleaved chunks ``v > 1`` only when they
   divide the stage's layers; and the pipeline schedule must be one the framework runs for ``m``
   microbatches (lesson 5's :func:`~distai.lessons.lesson5.formulas.check_schedule` on ``Axes.engine``:
   Megatron-LM's interleaved schedule needs ``m`` a multiple of ``pp``, torch.distributed.pipelining's
   takes any ``m < pp`` too, its 1F1B needs ``m ≥ pp``);
2. **checks the fit**: per GPU, the model states of ``Ψ/(tp·pp)`` parameters sharded by ZeRO over ``dp``
   (lesson 2's :func:`~distai.lessons.lesson2.formulas.model_state_bytes`) plus the activations of the
   busiest stage (lesson 2's :func:`~distai.lessons.lesson2.formulas.activation_bytes`, sequence
   parallelism on when ``tp > 1``) times the microbatches the first stage holds at once (lesson 5's
   :func:`~distai.lessons.lesson5.formulas.peak_inflight_microbatches`; with the embedding and output
   slots, the busier of the first stage, one layer short, and the second, one microbatch fewer), plus what recomputation rebuilds
   for the layer whose backward runs (full: its whole forward; selective without FlashAttention: its
   attention scores); the last stage instead holds one microbatch plus the fp32
   logits of its vocabulary shard (s·b·V/t·4 bytes). It must fit in ``gpu_memory · memory_util``;
3. **predicts the step time**: each stage runs ``m`` microbatches; one microbatch on one stage costs its
   layers on the GPU model (:func:`~.formulas.layer_forward_seconds`; the last stage also runs the output
   layer, and the pipeline runs at its busiest stage), or with a fixed ``efficiency`` its share of the
   hardware FLOPs (:func:`~.formulas.hardware_flops_per_token`) at ``efficiency ·`` peak, plus adding its
   gradients into the buffer the reduction sends where the framework does not fuse that into the
   weight-gradient GEMM (``Axes.grad_accumulation``, :func:`grad_accumulation_seconds`, at HBM bandwidth),
   plus its layers' TP collectives (the ops lesson 4's
   :func:`~distai.lessons.lesson4.formulas.tp_comm_per_layer` counts, each priced by :func:`collective_seconds`:
   NCCL's model inside a node, the α-β ring across nodes; repeated in the recomputed forward;
   SP's backward re-gathers, its ``regather``, are left out: Megatron-LM overlaps them with the
   input-gradient GEMM),
   plus its point-to-point sends to the neighbouring stages (``2·v`` messages of ``s·b·h·2/t`` bytes,
   Megatron's scatter/gather, lesson 1's α-β :func:`~distai.lessons.lesson1.formulas.serial_messages_time`;
   DeepSpeed's pipeline engine partitions them over the TP group too, ``Axes.p2p``),
   plus a mixture of experts' all-to-all over the inter-node link when its EP group spans nodes
   (hidden behind the compute, as far as it lasts, when ``Cluster.expert_a2a_overlap``).
   The pipeline takes ``m + (p−1)/v`` such slots, or ``p + (m−1)/v`` interleaved with ``m < p``, where
   the pipeline never fills (lesson 5's :func:`~distai.lessons.lesson5.formulas.step_time_units`); with
   DeepSeek's DualPipe (``Axes.dualpipe``) m slots plus (PP/2 − 1)(F&B + B − 3W) (:func:`dualpipe_bubble`),
   two stages' states per GPU, the all-to-all and PP sends hidden. Then data parallelism: the gradient
   all-reduce (ZeRO-1/2: reduce-scatter, then all-gather of the updated parameters) of the rank's
   ``Ψ/(tp·pp)`` gradients (lesson 1's ring, ``Cluster.grad_bytes`` each), overlapped with the last
   microbatch's backward (or not at all, ``Axes.dp_overlap`` False, as Megatron-LM and DeepSpeed's pipeline did); ZeRO-3
   all-gathers the parameters twice and reduce-scatters the gradients every microbatch, overlapped with
   that microbatch's compute. Each group's link is NVLink when all its ranks share a node (ranks fill
   nodes in order on the (pp, dp, tp) mesh), else the inter-node link. Last, the optimizer step: the
   parameters the GPU updates (ZeRO-1/2/3: its 1/(dp·cp) shard), their states read and written, their
   gradients read by the clipping norm and the update, the bf16 copy written, at HBM bandwidth
   (:func:`optimizer_step_bytes`: the bytes the memory count holds);
4. **ranks** the feasible configurations by step time (ties: less memory first), and reports the MFU
   (:func:`~.formulas.mfu`: model FLOPs only, recomputation excluded).

The model is deliberately simple — perfectly balanced stages apart from the embedding slots, no
overlap of TP or PP communication with compute, ring collectives as NCCL prices them inside a node and in
the α-β model across nodes — so that it
explains why a layout wins. The GPU model's constants (E per GPU kind, w½) are fitted on published runs
(:mod:`.published`, ``bench/planner_fit.py``); a fixed ``efficiency`` replaces it when given: measure yours.
Pure Python.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .. import units
from ..context.formulas import kv_block_bytes
from ..experts.formulas import dense_mlp_activation_bytes, expert_mlp_activation_bytes
from ..lesson1.formulas import (
    nccl_ring_time,
    ring_allgather_time,
    ring_allreduce_time,
    ring_reduce_scatter_time,
    serial_messages_time,
)
from ..lesson2.formulas import activation_bytes, activation_bytes_per_layer, bytes_per_param
from ..lesson4.formulas import tp_comm_per_layer
from ..lesson5.formulas import (
    ScheduleError,
    bubble_fraction,
    check_schedule,
    peak_inflight_microbatches,
    step_time_units,
)
from ..model_size import Refusal, ShapeError, explain_texts, param_bounds, refusals
from ..model_spec import ModelSpec
from ..strings import LANGUAGES, TranslatedError, translated, translations
from . import formulas as f

MICROBATCHES = (1, 2, 4, 8)
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
CHUNKS = (1, 2, 4, 8)
SEQUENCE_PARALLEL = (False, True)
PARAM_BYTES = 2  # bf16 weights
GRAD_BUFFER_BYTES = 4  # fp32 gradient buffer: Megatron-LM's main_grad with bf16 (accumulate and reduce in fp32),
#                        DeepSpeed's BF16 optimizer and FSDP's fp32 reduce alike
GRAD_BYTES = GRAD_BUFFER_BYTES  # what the data-parallel reduction sends per gradient
DDP_BUCKET_BYTES = 25e6  # PyTorch DDP's bucket_cap_mb: two buckets in flight while the backward runs
CONTEXT_BYTES = 2e9  # CUDA context (~0.5 GB) and NCCL's buffers for the job's communicators
ALLOCATOR_FRACTION = 0.05  # the caching allocator's fragmentation, on top of what the tensors hold

# How fast a GPU runs a layer (:func:`~.formulas.layer_forward_seconds`): E, the best fraction of peak a
# GEMM reaches, and w½, the narrow size at which it reaches E/2: the optimum of :func:`.published.fit_gpu_model`
# (A100 on Megatron-LM's Table 1, H100 on Llama 3's 8,192-GPU run; ``python bench/planner_fit.py`` re-runs it,
# a test checks these equal it); HBM bandwidths from the data sheets.
GEMM_HALF_WIDTH = 75.0
A100_GEMM = 0.69  # E of an A100 (Megatron-LM's kernels, 2021-2022)
H100_GEMM = 0.82  # E of an H100 (Llama 3's kernels, 2024)


@dataclass(frozen=True)
class Cluster:
    gpus: int
    gpu_memory: float  # bytes
    gpus_per_node: int = 8
    flops: float = 989e12  # peak dense bf16 FLOP/s (H100 SXM)
    intra_bandwidth: float = 450e9  # NVLink, B/s per direction (H100: 900 GB/s both ways)
    inter_bandwidth: float = 50e9  # per GPU between nodes, B/s (a 400 Gb/s NIC per GPU)
    alpha: float = 5e-6  # latency per message inside a node, s: pipeline sends, and collectives without nccl_collectives
    nccl_collectives: bool = True  # all-reduces, all-gathers and reduce-scatters inside a node as NCCL's tuner prices
    #                                them (lesson 1's nccl_ring_time, as the serving planner); False: the α-β ring
    #                                with ``alpha`` (a measured link, or gloo)
    inter_alpha: float = 10e-6  # between nodes, s
    efficiency: float | None = None  # a fixed fraction of peak for every layer; None: the shape-aware model
    memory_util: float = 1.0  # share of the GPU's memory the job may use (the allowances are counted)
    tp_across_nodes: bool = False
    hbm_bandwidth: float = 3.35e12  # H100 SXM data sheet
    gemm_peak_fraction: float = H100_GEMM  # E (fitted, see published.py)
    gemm_half_width: float = GEMM_HALF_WIDTH
    flash_attention: bool = True
    linear_flops: float | None = None  # peak of the linear layers' GEMMs when not ``flops`` (FP8: its own peak)
    linear_efficiency: float | None = None  # with linear_flops: the fraction of it the linear GEMMs reach, measured
    #                                          on the run's shapes (None: the fitted E and w½)
    quantize_bytes_per_token: float = 0.0  # HBM bytes per token and layer, per training step, that casting to
    #                                        FP8 adds outside the GEMMs (DeepSeek-V3's fine-grained FP8)
    attention_efficiency: float | None = None  # the attention core's measured fraction of the computing SMs'
    #                                             peak (None: the fitted E)
    attention_backward: float = 2.0  # its backward's time over its forward's (measured: DeepSeek's profile)
    compute_share: float = 1.0  # share of the SMs that compute (DeepSeek-V3 gives 20 of 132 to communication)
    expert_a2a_overlap: bool = False  # the MoE all-to-all hidden behind other work (DeepSeek's DualPipe)
    expert_dispatch_bytes: float = 2.0  # bytes per element the dispatch sends (bf16; FP8 with its scales: 1.03)
    expert_node_limit: int = 0  # nodes one token's experts may span (node-limited routing; 0: no limit)
    grad_bytes: float = GRAD_BYTES  # bytes per gradient, held and reduced (fp16 training without an fp32 buffer: 2)
    # full recomputation's saved layer inputs split over the TP group, each rank keeping 1/t, and all-gathered
    # before the layer is recomputed (--distribute-checkpointed-activations of Megatron-LM and of metaseq, whose
    # checkpoint wrapper calls split_tensor_into_1d_equal_chunks in the forward, gather_split_1d_tensor in the
    # backward)
    distributed_checkpoints: bool = False
    # what a data-parallel ring that crosses nodes gets of the network: "one" NIC's inter_bandwidth, however many
    # of its ranks a node holds (the planner's model, fitted so); "per-rank": the k NICs of its k ranks on a
    # node (NCCL builds a channel per NIC, so a ring with 8 ranks a node runs at up to 8 NICs' bandwidth), up
    # to NVLink's. A what-if that Narayanan et al. 2021's Figs. 14-15 argue for (published.sweep_ranking)
    dp_ring_nics: str = "one"  # one of DP_RING_NICS

    def __post_init__(self) -> None:
        if self.dp_ring_nics not in DP_RING_NICS:
            raise ValueError(f"unknown dp_ring_nics {self.dp_ring_nics!r}; choose one of {', '.join(DP_RING_NICS)}")


DP_RING_NICS = ("one", "per-rank")  # Cluster.dp_ring_nics


@dataclass
class Config:
    tp: int
    pp: int
    dp: int
    microbatch: int | None = None
    zero: int | None = None
    recompute: str | None = None
    chunks: int | None = None
    sp: bool = False
    cp: int = 1
    ep: int = 1
    reason: str = ""
    reason_text: dict = field(default_factory=dict)  # the reason in each language: {"en": ..., "es": ...}
    microbatches: int = 0
    memory_bytes: float = 0.0
    memory: dict = field(default_factory=dict)
    step_time_s: float = 0.0
    time: dict = field(default_factory=dict)
    bubble_fraction: float = 0.0
    mfu: float = 0.0
    tokens_per_s: float = 0.0

    @property
    def layout(self) -> tuple[int, int, int, int, int]:
        """(tp, pp, dp, cp, ep)."""
        return (self.tp, self.pp, self.dp, self.cp, self.ep)

    def as_dict(self) -> dict:
        return asdict(self)

    def rejected_dict(self) -> dict:
        keys = ("tp", "pp", "dp", "cp", "ep", "sp", "microbatch", "zero", "recompute", "chunks", "reason", "reason_text")
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


def tp_layer_comm_seconds(cluster: Cluster, across: bool, hidden: int, seq: int, micro_batch: int, tp: int,
                          sequence_parallel: bool) -> float:
    """Seconds of one layer's tensor-parallel collectives, forward and backward (the ops
    :func:`~distai.lessons.lesson4.formulas.tp_comm_per_layer` counts, of its s·b·h tensor), each priced by
    :func:`collective_seconds`."""
    comm = tp_comm_per_layer(hidden, seq, micro_batch, tp, sequence_parallel)
    return sum(count * collective_seconds(cluster, across, op, comm["tensor_bytes"], tp)
               for way in ("forward", "backward") for op, count in comm[way].items())


RING_TIMES = {"all_reduce": ring_allreduce_time, "all_gather": ring_allgather_time,
              "reduce_scatter": ring_reduce_scatter_time}


def collective_seconds(cluster: Cluster, across: bool, op: str, size_bytes: float, n: int,
                       beta: float | None = None) -> float:
    """One ring ``op`` ("all_reduce", "all_gather", "reduce_scatter") of ``size_bytes`` over ``n`` ranks of a
    group: inside a node with ``cluster.nccl_collectives``, NCCL's own model at the node's bandwidth
    (:func:`~distai.lessons.lesson1.formulas.nccl_ring_time`); else the α-β ring of the group's link
    (:func:`_link`, ``beta`` replacing its β)."""
    if not across and cluster.nccl_collectives:
        return nccl_ring_time(size_bytes, n, cluster.intra_bandwidth, op)["time_s"]
    alpha, link_beta = _link(cluster, across)
    return RING_TIMES[op](size_bytes, n, alpha, link_beta if beta is None else beta)


def _dp_spans_nodes(cluster: Cluster, c: Config) -> bool:
    """Whether the gradients' reduction group (dp·cp ranks, t apart: context parallelism's ranks hold
    the same weights) reaches beyond a node."""
    return _spans_nodes(c.tp, c.dp * c.cp, cluster.gpus_per_node)


def _dp_link(cluster: Cluster, c: Config) -> tuple[float, float]:
    """(α, β) of the data-parallel group (dp·cp ranks, t apart): :func:`_link`, and with
    ``cluster.dp_ring_nics`` "per-rank" a ring across nodes at the bandwidth of the NICs of its ranks on a
    node, at most NVLink's."""
    g, shard = cluster.gpus_per_node, c.dp * c.cp
    across = _dp_spans_nodes(cluster, c)
    alpha, beta = _link(cluster, across)
    if across and cluster.dp_ring_nics == "per-rank":
        on_node = max(1, min(shard, g // c.tp))  # the group's ranks on one node
        beta = 1 / min(on_node * cluster.inter_bandwidth, cluster.intra_bandwidth)
    return alpha, beta


def strides(c: Config) -> dict[str, int]:
    """Distance between consecutive ranks of a group on the mesh, Megatron-LM's order tp-cp-ep-dp-pp
    (innermost first; ``megatron/core/parallel_state.py``): tp 1, cp t, dp t·cp, pp t·cp·dp; ep t, its
    ranks ep consecutive ones of the dp·cp block (MoE parallel folding, as the capstone run's mesh places
    them: :func:`~.formulas.mesh5_group`)."""
    return {"tp": 1, "cp": c.tp, "dp": c.tp * c.cp, "ep": c.tp, "pp": c.tp * c.cp * c.dp}


# ------------------------------------------------------------------------------ shapes

def shape_bounds(model: ModelSpec) -> tuple[float, float]:
    """The fewest and the most parameters the shape (layers, hidden, heads, KV heads, vocabulary; experts
    when given) can hold: :func:`~distai.lessons.model_size.param_bounds`."""
    return param_bounds(model.layers, model.hidden, model.heads, model.kv_heads, model.vocab or None,
                        model.experts + model.shared_experts, model.expert_ffn or None)


class PlanInputError(TranslatedError):
    """Input the planner cannot plan for, whatever the degrees: one line in every language
    (``lessons/catalog/calc.toml``'s ``plan.errors``)."""

    area, prefix = "calc", "plan.errors."


def check_shape(model: ModelSpec) -> None:
    """:class:`PlanInputError` (one line) when ``--params`` cannot be this shape's parameter count."""
    if model.seq < 1:
        raise PlanInputError.keyed("seq", seq=model.seq)
    if model.hidden % model.heads or model.heads % model.kv_heads:
        raise PlanInputError.keyed("shape_divides", hidden=model.hidden, heads=model.heads, kv_heads=model.kv_heads)
    if model.experts and model.expert_params >= model.params:
        raise PlanInputError.keyed("experts_exceed", params=lambda lang: units.format_count(model.params, lang=lang),
                                   experts=model.experts, ffn=model.expert_ffn,
                                   layers=model.layers if model.moe_layers is None else model.moe_layers,
                                   expert_params=lambda lang: units.format_count(model.expert_params, lang=lang))
    low, high = shape_bounds(model)
    if not low <= model.params <= high:
        raise PlanInputError.keyed("params_shape", params=lambda lang: units.format_count(model.params, lang=lang),
                                   layers=model.layers, hidden=model.hidden,
                                   low=lambda lang: units.format_count(low, lang=lang),
                                   high=lambda lang: units.format_count(high, lang=lang))


def shape_refusals(model: ModelSpec, tp: int | None = None, pp: int | None = None, cp: int | None = None,
                   ep: int | None = None, sequence_parallel: bool | None = None) -> list[Refusal]:
    """The course's one shape check (:func:`~distai.lessons.model_size.refusals`) for a split as this
    planner runs it: sequence parallelism when asked (by default whenever tp > 1), a
    vocabulary-parallel head, KV heads split or replicated, context parallelism in the zigzag layout
    (2·cp divides the sequence), experts split over ep, and stages that hold the layers with the
    embedding and output slots (:func:`~.formulas.stage_layers`). A degree left out is not checked."""
    t, p, c, e = tp or 1, pp or 1, cp or 1, ep or 1
    sp = t > 1 if sequence_parallel is None else sequence_parallel
    return refusals(tp=t, sequence_parallel=sp, heads=model.heads, kv_heads=model.kv_heads,
                    hidden=model.hidden, vocab=model.vocab or None, seq=model.seq, cp=c, zigzag=c > 1,
                    ep=e, experts=model.experts or None,
                    pp=p, stages="with-ends", layers=model.layers if pp is not None else None)


def _texts(key: str, **fields) -> dict[str, str]:
    """A rejection's reason in every language (``[<lang>.plan.reasons]``)."""
    return translations("calc", f"plan.reasons.{key}", **fields)


def shape_reasons(model: ModelSpec, cluster: Cluster, tp: int, pp: int, cp: int = 1, ep: int = 1) -> dict[str, str]:
    """Why a split cannot hold the model, in each language, or {} when it can (sequence parallelism not asked)."""
    found = shape_refusals(model, tp, pp, cp, ep, sequence_parallel=False)
    if found:
        return explain_texts(found)
    if _spans_nodes(1, tp, cluster.gpus_per_node) and not cluster.tp_across_nodes:
        return _texts("tp_spans" if tp > cluster.gpus_per_node else "tp_straddles", tp=tp, g=cluster.gpus_per_node)
    return {}


def shape_reason(model: ModelSpec, cluster: Cluster, tp: int, pp: int, cp: int = 1, ep: int = 1) -> str:
    """Why a split cannot hold the model (in English), or "" when it can."""
    return shape_reasons(model, cluster, tp, pp, cp, ep).get("en", "")


def _reject(c: Config, texts: dict[str, str]) -> Config:
    """``c`` refused for ``texts`` (its reason in each language; ``reason`` the English one)."""
    c.reason, c.reason_text = texts.get("en", ""), dict(texts)
    return c


# ------------------------------------------------------------------------------ memory

def _params_per_gpu(model: ModelSpec, c: Config) -> tuple[float, float]:
    """(dense, expert) parameters one GPU holds before ZeRO: the dense ones split tp·pp ways, the
    experts tp·pp·ep ways."""
    expert = model.expert_params
    return (model.params - expert) / (c.tp * c.pp), expert / (c.tp * c.pp * c.ep)


def _rebuilt_layer_bytes(model: ModelSpec, flash: bool, recompute: str, seq: int, micro_batch: int, tp: int,
                         sp: bool) -> float:
    """What recomputation rebuilds, one layer at a time, for the layer whose backward runs (Korthikanti et
    al. 2022, Table 2, one layer): full recomputation its whole forward's activations (the "none" count;
    FlashAttention keeps no score matrix even then: the "selective" one); selective recomputation the
    attention core's 5·a·s/h·s·b·h score, dropout mask and dropout output (over t), which FlashAttention
    never stores."""
    def per_layer(count: str) -> float:
        return activation_bytes_per_layer(seq, micro_batch, model.hidden, model.heads, tp, sp, count)

    if recompute == "full":
        return per_layer("selective" if flash else "none")
    if recompute == "selective" and not flash:
        return per_layer("none") - per_layer("selective")
    return 0.0


def _moe_layer_share(model: ModelSpec) -> float:
    """The share of the layers whose MLP is experts (0 for a dense model)."""
    if not model.experts:
        return 0.0
    return (model.layers if model.moe_layers is None else model.moe_layers) / model.layers


def _expert_mlp_extra_bytes(model: ModelSpec, tokens: float, tp: int, sp: bool) -> float:
    """What an MoE layer's experts store beyond the 4h GeLU MLP of Korthikanti's count, on one GPU for
    ``tokens`` (the experts lesson's :func:`~distai.lessons.experts.formulas.expert_mlp_activation_bytes`:
    Mixtral's top-2 of SwiGLU experts 3.5h wide store 62·s·b·h a layer where the count says 34)."""
    reached = model.top_k + model.shared_experts
    return expert_mlp_activation_bytes(tokens, model.hidden, model.expert_ffn, reached, tp, sp) - \
        dense_mlp_activation_bytes(tokens, model.hidden, tp, sp)


# CP's K/V buffers, in blocks of cp (Llama 3's all-gather, as the step time counts it): the whole sequence's K and V
# gathered for the layer (the context lesson's all-gather page: cp blocks on every rank) and, in its backward,
# their gradients before the reduce-scatter
CP_KV_BUFFERS = 2


def cp_kv_block_bytes(model: ModelSpec, micro_batch: int, tp: int, cp: int) -> float:
    """One CP rank's K and V for one layer, bf16, its KV heads split over tp (replicated beyond them): the
    message of one step of CP's ring, the context lesson's :func:`~distai.lessons.context.formulas.kv_block_bytes`."""
    return kv_block_bytes(model.seq, micro_batch, model.kv_heads, model.kv_dim // model.kv_heads, cp, 2, tp)


def memory_terms(model: ModelSpec, cluster: Cluster, c: Config, stage: int, m: int, optimizer: str,
                 dualpipe: bool = False, moments: str = "fp32") -> dict:
    """Every term of the busiest GPU's memory (bytes): {"params_bytes" (bf16, sharded over dp·cp by
    ZeRO-3), "grad_buffer_bytes" (fp32, sharded by ZeRO-2/3), "optimizer_bytes" (fp32 master copy and
    Adam's moments, fp32 or ``moments`` "bf16", sharded by ZeRO-1/2/3: lesson 2), "activations_bytes" (lesson 2's Korthikanti count
    for the stage times lesson 5's microbatches in flight, plus what recomputation rebuilds for one layer:
    :func:`_rebuilt_layer_bytes`), "logits_bytes" (last stage: fp32 logits of its vocabulary shard),
    "optimizer_params" (the parameters whose update this GPU runs: those whose optimizer states it holds),
    "comm_buffers_bytes" (ZeRO-3's gathered layers, TP's gathered input, PP's send and receive, CP's
    gathered K/V and their gradients, :data:`CP_KV_BUFFERS` · cp blocks of :func:`cp_kv_block_bytes`, DDP's
    buckets), "allocator_bytes" (CUDA context and NCCL, plus ALLOCATOR_FRACTION of
    the rest), "first_stage_bytes", "last_stage_bytes", "microbatches_in_flight", "usable_bytes"}.
    ``dualpipe``: each GPU holds two stages' parameters (their gradients and optimizer states too) and
    PP + 1 microbatches' activations (DeepSeek-V3 report, Table 2; DualPipe's README)."""
    tp, pp, cp, b, v = c.tp, c.pp, c.cp, c.microbatch or 1, c.chunks or 1
    shard = c.dp * cp  # data and context ranks hold the same weights
    dense, expert = _params_per_gpu(model, c)
    expert_shard = max(1, shard // c.ep)
    zero = c.zero or 0

    def sharded(x: float, level: int) -> float:
        return dense / (shard if zero >= level else 1) * x + expert / (expert_shard if zero >= level else 1) * x

    optimizer_bytes = bytes_per_param(optimizer, moments=moments)["optimizer"]
    params = sharded(PARAM_BYTES, 3)
    grads = sharded(cluster.grad_bytes, 2)
    opt = sharded(optimizer_bytes, 1)
    s_local = model.seq // cp
    recompute = c.recompute or "none"
    # FlashAttention keeps no score matrix: its activations are the selective count
    stored = "selective" if recompute == "none" and cluster.flash_attention else recompute
    # the saved input of a fully recomputed layer is split t ways by sequence parallelism or by distributed
    # checkpoints alike (lesson 2's count for "full": 2·s·b·h, over t with SP)
    split_input = c.sp or (cluster.distributed_checkpoints and recompute == "full")
    act_mb = activation_bytes(stage, s_local, b, model.hidden, model.heads, tp, split_input, stored)
    if recompute != "full":  # the MoE layers' experts in place of the 4h GeLU MLP Korthikanti counts
        act_mb += stage * _moe_layer_share(model) * _expert_mlp_extra_bytes(model, s_local * b, tp, c.sp)
    schedule = "interleaved" if v > 1 else "1f1b"
    inflight = pp + 1 if dualpipe else peak_inflight_microbatches(pp, m, schedule, v)
    held = act_mb * inflight
    if model.layers % pp and pp > 1 and not dualpipe:
        # the embedding and output slots (formulas.stage_layers): the first stage holds stage − 1 layers, the
        # second the stage's layers, one microbatch fewer in flight; the busier of the two
        held = max(act_mb * (stage - 1) / stage * inflight,
                   act_mb * peak_inflight_microbatches(pp, m, schedule, v, rank=1))
    working = _rebuilt_layer_bytes(model, cluster.flash_attention, recompute, s_local, b, tp, c.sp)
    if recompute == "full" and _moe_layer_share(model):  # the rebuilt layer is an MoE layer's
        working += _expert_mlp_extra_bytes(model, s_local * b, tp, c.sp)
    logits = s_local * b * model.vocab / tp * 4 if model.vocab else 0.0
    layer_params = model.layer_params / tp
    sbh = s_local * b * model.hidden * 2
    comm = (2 * layer_params * PARAM_BYTES if zero == 3 and shard > 1 else 0.0) \
        + (sbh if tp > 1 else 0.0) + (2 * sbh / tp if pp > 1 else 0.0) \
        + (CP_KV_BUFFERS * cp * cp_kv_block_bytes(model, b, tp, cp) if cp > 1 else 0.0) \
        + (2 * DDP_BUCKET_BYTES if shard > 1 and zero < 3 else 0.0)
    copies = 2 if dualpipe else 1
    states = (params + grads + opt) * copies
    first = states + held + working + comm
    last = states + act_mb * (1 if pp > 1 else inflight) + working + logits + comm
    busiest = max(first, last)
    allocator = math.ceil(CONTEXT_BYTES + ALLOCATOR_FRACTION * busiest)  # whole bytes, as every other term
    return {"params_bytes": params, "grad_buffer_bytes": grads, "optimizer_bytes": opt,
            "optimizer_params": sharded(1, 1) * copies,
            "model_states_bytes": states, "activations_bytes": held + working,
            "logits_bytes": logits, "comm_buffers_bytes": comm, "allocator_bytes": allocator,
            "first_stage_bytes": first + allocator, "last_stage_bytes": last + allocator,
            "microbatches_in_flight": inflight, "usable_bytes": cluster.gpu_memory * cluster.memory_util}


def optimizer_step_bytes(owned_params: float, optimizer: str, grad_bytes: float, precision: str = "mixed",
                         clip: bool = True, moments: str = "fp32") -> float:
    """HBM bytes one GPU's optimizer step streams for the ``owned_params`` parameters it updates (all of
    its Ψ/(tp·pp) without ZeRO, its 1/(dp·cp) shard with ZeRO-1/2/3): a memory-bound pass, no FLOPs to speak
    of. The optimizer's states, lesson 2's :func:`~distai.lessons.lesson2.formulas.bytes_per_param` (the
    bytes :func:`memory_terms` holds: the fp32 master copy, Adam's two moments), each read and written
    (Apex's FusedAdam, ``multi_tensor_adam``: reads g, p, m, v, writes p, m, v); the gradient read twice, by
    the norm for clipping and by the update (Megatron-LM's ``clip_grad_norm_fp32``: ``multi_tensor_l2norm``
    over the rank's main grads; the scaling pass runs only when the norm is clipped); the bf16 model copy
    written (``_copy_main_params_to_model_params``). fp16's copy of the gradients to fp32 and their
    unscaling are not counted. ``precision`` "fp32": no master copy, the parameters themselves read and
    written; ``clip`` False: no clipping norm; ``moments`` "bf16": each moment read and written in 2 bytes."""
    per = bytes_per_param(optimizer, precision, moments)
    weights = per["params"] * (1 if precision == "mixed" else 2)
    return owned_params * (2 * per["optimizer"] + (2 if clip else 1) * grad_bytes + weights)


# ------------------------------------------------------------------------------ time

def layer_seconds(model: ModelSpec, cluster: Cluster, micro_batch: int, recompute: str, tp: int = 1, cp: int = 1,
                  sp: bool = False) -> tuple[float, dict[str, float]]:
    """(one average layer's forward, backward and recomputation for one microbatch on the GPU model, in
    seconds; its forward's terms, :func:`~.formulas.layer_forward_seconds`), the FP8 casts included."""
    share = cluster.compute_share
    fwd = f.layer_forward_seconds(hidden=model.hidden, heads=model.heads, seq=model.seq, micro_batch=micro_batch,
                                  layer_params=model.active_layer_params, tp=tp, cp=cp,
                                  sequence_parallel=sp, flash=cluster.flash_attention,
                                  peak_flops=cluster.flops * share, hbm_bandwidth=cluster.hbm_bandwidth,
                                  peak_fraction=cluster.gemm_peak_fraction, half_width=cluster.gemm_half_width,
                                  attention_width=model.attention_width,
                                  linear_flops=(cluster.linear_flops or cluster.flops) * share,
                                  linear_efficiency=cluster.linear_efficiency if cluster.linear_flops else None,
                                  attention_efficiency=cluster.attention_efficiency,
                                  attention_backward=cluster.attention_backward)
    # the FP8 casts outside the GEMMs (memory-bound, once per step: a recomputed forward is not counted again)
    quantize = micro_batch * model.seq / cp / tp * cluster.quantize_bytes_per_token / cluster.hbm_bandwidth
    return f.layer_train_seconds(fwd, recompute) + quantize, fwd


def _compute_per_microbatch(model: ModelSpec, cluster: Cluster, c: Config, stage: int) -> dict:
    """Seconds one stage computes one microbatch (forward, backward, recomputation): its ``stage``
    layer slots, the vocabulary's GEMM spread over the layers as the stages spread it."""
    b, recompute = c.microbatch or 1, c.recompute or "none"
    if cluster.efficiency is not None:  # one fixed fraction of peak: FLOPs / (efficiency · peak)
        tokens = b * model.seq / c.cp
        hw = tokens * f.hardware_flops_per_token(model.active_params, model.layers, model.hidden, model.seq, recompute,
                                                 model.attention_width, model.active_layer_params * model.layers)
        seconds = hw / (c.tp * cluster.flops * cluster.efficiency) * stage / model.layers
        return {"compute_s": seconds, "gemm_efficiency": cluster.efficiency, "dualpipe_ratio": 2 / 3}
    share = cluster.compute_share
    layer, fwd = layer_seconds(model, cluster, b, recompute, c.tp, c.cp, c.sp)
    logits = 3 * 2 * b * model.seq / c.cp * model.hidden * model.vocab / c.tp / (
        cluster.flops * share * fwd["gemm_efficiency"])
    # the output layer's GEMM runs on the last stage only, which then holds its layers (one slot fewer when
    # the stages count the embedding and output slots) plus the logits; the pipeline runs at its busiest stage
    last_layers = stage if model.layers % c.pp == 0 else stage - 1
    busiest = max(stage * layer, last_layers * layer + logits) if c.pp > 1 else stage * layer + logits
    # DualPipe's (F + 2B − 3W)/(F + B) for one layer: F its forward, B its whole backward (twice the forward,
    # plus what recomputation repeats), W the weights' share of it (the linear layers' weight-gradient GEMMs:
    # one forward's GEMMs); the FP8 casts left out
    back = f.layer_train_seconds(fwd, recompute) - fwd["total_s"]
    ratio = (fwd["total_s"] + 2 * back - 3 * fwd["gemm_s"]) / (fwd["total_s"] + back)
    return {"compute_s": busiest, "gemm_efficiency": fwd["gemm_efficiency"], "dualpipe_ratio": ratio}


# How a framework adds each microbatch's gradients into the buffer the data-parallel reduction sends: HBM bytes
# per parameter the GPU holds, beyond the weight-gradient GEMM that writes the new gradient. "fused": the GEMM
# accumulates into the buffer itself (Megatron-LM's gradient_accumulation_fusion, default since February 2022;
# nothing more); "add": the new 16-bit gradient and the buffer read, the buffer written, for every microbatch
# after the first, whose gradient becomes the buffer (PyTorch's AccumulateGrad, Megatron-LM 2021's
# ``main_grad.add_(param.grad)``); "cast-add": DeepSpeed's BF16_Optimizer.update_hp_grads,
# ``hp_grad.add_(lp.grad.to(float32))`` after every microbatch's backward: the cast reads the bf16 gradient and
# writes an fp32 copy, the add reads it and the fp32 buffer and writes the buffer (2 + 4 + 4 + 4 + 4 bytes)
GRAD_ACCUMULATION = ("fused", "add", "cast-add")


def grad_accumulation_seconds(params: float, how: str, grad_bytes: float, hbm_bandwidth: float,
                              microbatches: int) -> float:
    """Seconds a GPU spends per microbatch, on average over the step's ``microbatches``, adding the
    gradients of its ``params`` into its gradient buffer the way ``how`` says (:data:`GRAD_ACCUMULATION`):
    a memory-bound pass at ``hbm_bandwidth``."""
    if how == "fused":
        return 0.0
    if how == "add":
        per_param, passes = PARAM_BYTES + 2 * grad_bytes, (microbatches - 1) / microbatches
    elif how == "cast-add":
        per_param, passes = PARAM_BYTES + 4 * GRAD_BUFFER_BYTES, 1.0  # the fp32 copy written and read, the buffer
    else:
        raise ValueError(f"grad_accumulation must be one of {', '.join(GRAD_ACCUMULATION)}, not {how!r}")
    return params * per_param * passes / hbm_bandwidth


def dualpipe_bubble(pp: int, slot: float, ratio: float) -> float:
    """DualPipe's bubble, (PP/2 − 1)(F&B + B − 3W) (DeepSeek-V3 report, Table 2; deepseek-ai/DualPipe's
    README), for chunks of one stage: F&B, a forward and a backward chunk overlapped, takes their compute
    F + B = ``slot`` (the overlap hides communication, not compute), and ``ratio`` is (F + 2B − 3W)/(F + B).
    1F1B's is (PP − 1)(F + B)."""
    return (pp / 2 - 1) * slot * ratio


def _expert_a2a_per_microbatch(model: ModelSpec, cluster: Cluster, c: Config, stage: int) -> float:
    """Seconds one stage's MoE layers spend in the expert all-to-all for one microbatch: the dispatch
    (``expert_dispatch_bytes`` per element) and the bf16 combine in the forward, both in bf16 in the
    backward, for each token's remote destinations. An EP group that spans nodes sends each token once
    to each node of its top-k experts (at most ``expert_node_limit``) other than its own, over the
    inter-node link (then on NVLink inside the node, not counted); one inside a node sends it to each
    of its experts' GPUs other than its own, over NVLink."""
    if not model.experts or c.ep == 1:
        return 0.0
    g = cluster.gpus_per_node
    across = _spans_nodes(strides(c)["ep"], c.ep, g)
    places = max(1, c.ep * strides(c)["ep"] // g) if across else c.ep  # nodes, or GPUs in the node
    targets = min(model.top_k, places, (cluster.expert_node_limit or places) if across else places)
    remote = targets * (places - 1) / places  # the token's own node (GPU) among its targets, on average
    moe = stage * (model.moe_layers if model.moe_layers is not None else model.layers) / model.layers
    tokens = (c.microbatch or 1) * model.seq / c.cp / c.tp
    per_token = remote * model.hidden * ((cluster.expert_dispatch_bytes + 2) + (2 + 2))
    return moe * tokens * per_token / (cluster.inter_bandwidth if across else cluster.intra_bandwidth)


def _dp_exposed(model: ModelSpec, cluster: Cluster, c: Config, m: int, stage: int, compute_mb: float,
                overlap: bool = True, zero1_reduction: str = "reduce-scatter") -> float:
    """The data-parallel reduction (over dp·cp ranks) that the backward does not hide: ZeRO-0 an
    all-reduce behind the last backward; ZeRO-1 a reduce-scatter behind it (``zero1_reduction``
    "all-reduce": every rank gets all the gradients, DeepSpeed's BF16_Optimizer) and the all-gather of the
    updated bf16 parameters; ZeRO-2 a reduce-scatter behind every microbatch's backward (gradients sharded
    as they are made); ZeRO-3 also all-gathers the parameters for each microbatch's forward and backward,
    one layer at a time."""
    shard = c.dp * c.cp
    if shard == 1:
        return 0.0
    across, beta = _dp_spans_nodes(cluster, c), _dp_link(cluster, c)[1]

    def ring(op: str, size_bytes: float) -> float:
        return collective_seconds(cluster, across, op, size_bytes, shard, beta)

    dense, expert = _params_per_gpu(model, c)
    params_gpu = dense + expert
    grads = params_gpu * cluster.grad_bytes
    backward_mb = compute_mb * 2 / 3 if overlap else 0.0  # a framework that reduces after the pipeline hides none
    zero = c.zero or 0
    if zero == 0:
        return max(0.0, ring("all_reduce", grads) - backward_mb)
    reduce = "all_reduce" if zero == 1 and zero1_reduction == "all-reduce" else "reduce_scatter"
    scatter = ring(reduce, grads)
    if zero == 1:
        return max(0.0, scatter - backward_mb) + ring("all_gather", params_gpu * PARAM_BYTES)
    if zero == 2:
        return m * max(0.0, scatter - backward_mb) + ring("all_gather", params_gpu * PARAM_BYTES)
    # one all-gather (forward, backward) and one reduce-scatter per layer, each layer its own unit (FSDP's
    # fully_shard per block, torchtitan's and metaseq's wrapping): the bytes of the whole stage, a ring's
    # (n − 1) latencies once per layer
    per_layer = 2 * ring("all_gather", params_gpu * PARAM_BYTES / stage) + ring(reduce, grads / stage)
    return m * max(0.0, stage * per_layer - compute_mb)


def _deepspeed_p2p_per_microbatch(model: ModelSpec, cluster: Cluster, s_local: int, b: int, tp: int,
                                  alpha: float, beta: float) -> float:
    """Seconds a middle stage of DeepSpeed's PipelineEngine spends on its boundaries per microbatch: its
    SendActivation, RecvActivation, SendGrad and RecvGrad, blocking and one after the other, each a small
    meta tensor and then the rank's 1/t share of the s·b·h activation or gradient (with tensor parallelism
    the engine partitions what crosses a stage over the TP group, ``is_pipe_partitioned`` and
    ``is_grad_partitioned`` = ``is_model_parallel``, DeepSpeed ``runtime/pipe/engine.py`` from the engine's
    first release, 2020-09, until 2023-11 made it an option, on by default), and the TP group's all-gathers
    that rebuild the whole tensor: the received input before the forward, the stage's output and the
    received gradient before the backward (``PartitionedTensor.full``), over the TP group's link."""
    part = f.pp_p2p_bytes_per_microbatch(s_local, b, model.hidden, tp)  # s·b·h·2/t
    sends = serial_messages_time(4, part, alpha, beta) + serial_messages_time(4, 0.0, alpha, beta)
    if tp == 1:
        return sends
    across = _spans_nodes(1, tp, cluster.gpus_per_node)
    return sends + 3 * collective_seconds(cluster, across, "all_gather", part * tp, tp)


def _refuse(c: Config, cluster: Cluster, model: ModelSpec, stage: int, m: int, max_zero_pp: int,
            engine: str) -> dict[str, str]:
    """Why this configuration cannot run, in each language, or {}."""
    v, pp, zero = c.chunks or 1, c.pp, c.zero or 0
    if zero > max_zero_pp and pp > 1:
        return _texts("zero_pp", zero=zero, pp=pp, max_zero=max_zero_pp)
    if zero > 0 and c.dp * c.cp == 1:
        return _texts("zero_dp", zero=zero)
    if v > 1 and (pp == 1 or stage % v):
        return _texts("chunks_divide", v=v, stage=stage) if pp > 1 else _texts("chunks_pp")
    if pp > 1:
        try:  # lesson 5 decides what the framework's schedule accepts (interleaved m < pp: torch yes, Megatron no);
            # the sends the planner prices block (Megatron-LM before 2024): no interleaving on 2 stages
            check_schedule("interleaved" if v > 1 else "1f1b", pp, m, v, engine, p2p_overlap=False)
        except ScheduleError as exc:  # lesson 5's message, in every language
            return {lang: exc.text(lang) for lang in LANGUAGES}
    if c.sp and c.tp == 1:
        return _texts("sp_tp")
    if c.sp:
        found = shape_refusals(model, c.tp, cp=c.cp, sequence_parallel=True)
        if found:
            return explain_texts(found)
    return {}


@dataclass(frozen=True)
class Axes:
    """What the search may try, narrowed to what a framework offers (Megatron-LM in 2021: no ZeRO, no
    sequence parallelism; DeepSpeed's pipeline: ZeRO-1 at most with pp > 1). A fixed degree is None
    when free."""
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = 1
    ep: int | None = 1
    max_cp: int = 0  # with cp free: the largest degree to try (0: any)
    microbatches: tuple[int, ...] = MICROBATCHES
    zero: tuple[int, ...] = ZERO_STAGES
    max_zero_pp: int = 3
    recompute: tuple[str, ...] = RECOMPUTE
    chunks: tuple[int, ...] = CHUNKS
    sp: tuple[bool, ...] = SEQUENCE_PARALLEL
    # how the pipeline sends: "megatron" (scatter/gather, sends and receives together: 2·v messages of
    # s·b·h/t per microbatch) or "deepspeed" (DeepSpeed's PipelineEngine: its send and receive instructions
    # one after the other, 4 messages of s·b·h/t, and 3 all-gathers over the TP group:
    # :func:`_deepspeed_p2p_per_microbatch`)
    p2p: str = "megatron"
    # whose pipeline schedules (lesson 5's :func:`~distai.lessons.lesson5.formulas.check_schedule`): "megatron"
    # (1F1B on any m, interleaved on m a multiple of p), "torch" (torch.distributed.pipelining: 1F1B on
    # m >= p, interleaved on any m < p or equal rounds) or "distai"
    engine: str = "megatron"
    # whether the data-parallel reduction overlaps the backward (PyTorch DDP's buckets, FSDP) or runs after
    # the last backward (Megatron-LM's local DDP until 2023: train_step all-reduces after the pipeline;
    # DeepSpeed's pipeline engine: its ReduceGrads instruction ends the schedule); "no-pipeline": only when
    # pp = 1 (Megatron-LM in 2021 offered PyTorch's DDP, which overlaps, only without a pipeline: training.py
    # asserts DDP_impl == 'local' when pp > 1; NVIDIA's script for Table 1, examples/sc21/run_table_1.sh, ran
    # its pp = 1 runs with --DDP-impl torch)
    dp_overlap: bool | str = True
    # DeepSeek's DualPipe in place of 1F1B (pp and the microbatches even, at least 2·pp microbatches:
    # deepseek-ai/DualPipe's step() asserts it): its bubble, its two stages per GPU, the all-to-all and the
    # PP sends hidden behind the paired chunk
    dualpipe: bool = False
    # how each microbatch's gradients reach the buffer the reduction sends (:data:`GRAD_ACCUMULATION`)
    grad_accumulation: str = "fused"
    # how ZeRO-1 reduces the gradients: "reduce-scatter" (each rank receives the shard it updates: DeepSpeed's
    # ZeRO stage 1, Megatron-LM's distributed optimizer, FSDP) or "all-reduce" (DeepSpeed's BF16_Optimizer,
    # its own ZeRO-1: the fp32 gradients all-reduced whole, ``buffered_allreduce_fallback``, before each rank
    # updates its shard and all-gathers the bf16 parameters)
    zero1_reduction: str = "reduce-scatter"
    # the optimizer moments' precision, "fp32" or "bf16" (DeepSeek-V3's AdamW, Sec. 3.3.3; lesson 2's MOMENT_BYTES)
    moments: str = "fp32"


def evaluate(model: ModelSpec, cluster: Cluster, global_batch: int, c: Config, optimizer: str = "adam",
             axes: Axes = Axes()) -> Config:
    """Fill in ``c``'s memory, time and MFU, or its ``reason`` when it is infeasible, as ``axes``' framework
    runs it (its ZeRO with a pipeline, pipeline sends and schedules, DP overlap, DualPipe, gradient
    accumulation, ZeRO-1 reduction and optimizer moments; the degrees and the search's choices in ``axes``
    are not read: ``c`` fixes them)."""
    tp, pp, dp, b, v = c.tp, c.pp, c.dp, c.microbatch, c.chunks
    if b is None or v is None or c.zero is None or c.recompute is None:
        raise ValueError(f"evaluate needs the microbatch, ZeRO stage, recomputation and chunks of {c}")
    try:
        m = f.microbatches_per_replica(global_batch, dp, b)
    except ValueError as exc:
        return _reject(c, {lang: str(exc) for lang in LANGUAGES})
    c.microbatches = m
    stage = f.stage_layers(model.layers, pp)
    refused = _refuse(c, cluster, model, stage, m, axes.max_zero_pp, axes.engine)
    dual = axes.dualpipe and pp > 1
    if not refused and dual and (pp % 2 or m % 2 or m < 2 * pp):
        refused = _texts("dualpipe", pp=pp, m=m)
    if refused:
        return _reject(c, refused)
    c.memory = memory_terms(model, cluster, c, stage, m, optimizer, dual, axes.moments)
    c.memory_bytes = max(c.memory["first_stage_bytes"], c.memory["last_stage_bytes"])
    if c.memory_bytes > c.memory["usable_bytes"]:
        need, usable = c.memory_bytes, c.memory["usable_bytes"]
        return _reject(c, _texts("memory", memory=lambda lang: units.format_bytes_apart(need, usable, lang)[0],
                                 usable=lambda lang: units.format_bytes_apart(need, usable, lang)[1]))

    # one microbatch on one stage: compute + TP collectives + CP's K/V + PP sends
    n, g, st = cluster.gpus, cluster.gpus_per_node, strides(c)
    comp = _compute_per_microbatch(model, cluster, c, stage)
    # into the gradients this GPU holds (ZeRO-2/3: its shard; DualPipe: two stages')
    held_grads = c.memory["grad_buffer_bytes"] / cluster.grad_bytes
    accumulation_mb = grad_accumulation_seconds(held_grads, axes.grad_accumulation, cluster.grad_bytes,
                                                cluster.hbm_bandwidth, m)
    compute_mb = comp["compute_s"] + accumulation_mb  # on the compute stream, after each microbatch's backward
    s_local = model.seq // c.cp
    tp_mb = 0.0
    if tp > 1:
        across = _spans_nodes(1, tp, g)
        per_layer = tp_layer_comm_seconds(cluster, across, model.hidden, s_local, b, tp, c.sp)
        tp_mb = stage * per_layer * (1.5 if c.recompute == "full" else 1.0)  # the recomputed forward talks again
        if cluster.distributed_checkpoints and c.recompute == "full" and not c.sp:  # each layer's input gathered
            tp_mb += stage * collective_seconds(cluster, across, "all_gather", s_local * b * model.hidden * 2, tp)
    cp_mb = 0.0
    if c.cp > 1:  # Llama 3's all-gather of K and V (forward, recomputed forward) and reduce-scatter of their gradients
        across = _spans_nodes(st["cp"], c.cp, g)
        kv = c.cp * cp_kv_block_bytes(model, b, tp, c.cp)  # the whole sequence's K and V, one block per rank
        cp_mb = stage * (2 * collective_seconds(cluster, across, "all_gather", kv, c.cp)
                         + collective_seconds(cluster, across, "reduce_scatter", kv, c.cp))
    pp_mb = 0.0
    if pp > 1:
        a, beta = _link(cluster, _spans_nodes(st["pp"], pp, g))
        if axes.p2p == "deepspeed":
            pp_mb = _deepspeed_p2p_per_microbatch(model, cluster, s_local, b, tp, a, beta)
        else:
            pp_mb = serial_messages_time(2 * v, f.pp_p2p_bytes_per_microbatch(s_local, b, model.hidden, tp), a, beta)
    ep_mb = _expert_a2a_per_microbatch(model, cluster, c, stage)
    if dual:  # DualPipe hides the all-to-all and the PP sends behind the paired chunk's compute (report, Fig. 4)
        hidden = max(0.0, ep_mb + pp_mb - compute_mb)
        ep_mb, pp_mb = hidden * ep_mb / (ep_mb + pp_mb or 1.0), hidden * pp_mb / (ep_mb + pp_mb or 1.0)
    elif cluster.expert_a2a_overlap:  # hidden behind the compute, as far as the compute lasts
        ep_mb = max(0.0, ep_mb - compute_mb)
    slot = compute_mb + tp_mb + cp_mb + pp_mb + ep_mb
    if dual:
        pipeline = slot * m + dualpipe_bubble(pp, slot, comp["dualpipe_ratio"])
    else:
        pipeline = slot * step_time_units(pp, m, v)  # m + (p−1)/v; interleaved with m < p: p + (m−1)/v
    overlap = pp == 1 if axes.dp_overlap == "no-pipeline" else bool(axes.dp_overlap)
    dp_exposed = _dp_exposed(model, cluster, c, m, stage, compute_mb, overlap, axes.zero1_reduction)
    update = optimizer_step_bytes(c.memory["optimizer_params"], optimizer, cluster.grad_bytes, moments=axes.moments)
    optimizer_s = update / cluster.hbm_bandwidth  # memory-bound, after the gradients are reduced
    c.step_time_s = pipeline + dp_exposed + optimizer_s
    c.time = {"compute_s": compute_mb * m, "grad_accumulation_s": accumulation_mb * m,  # the latter inside compute
              "tp_comm_s": tp_mb * m, "cp_comm_s": cp_mb * m, "pp_comm_s": pp_mb * m, "ep_comm_s": ep_mb * m,
              "bubble_s": pipeline - slot * m, "dp_comm_exposed_s": dp_exposed, "optimizer_s": optimizer_s,
              "gemm_efficiency": comp["gemm_efficiency"],
              "tp_over_nodes": _spans_nodes(1, tp, g), "cp_over_nodes": _spans_nodes(st["cp"], c.cp, g),
              "pp_over_nodes": _spans_nodes(st["pp"], pp, g), "dp_over_nodes": _dp_spans_nodes(cluster, c)}
    c.bubble_fraction = (pipeline - slot * m) / pipeline if dual else bubble_fraction(pp, m, v)
    c.mfu = f.mfu(model_flops_per_step(model, global_batch), c.step_time_s, n, cluster.flops)
    c.tokens_per_s = global_batch * model.seq / c.step_time_s
    for key, value in (("step", c.step_time_s), ("mfu", c.mfu), ("memory", c.memory_bytes)):
        if not math.isfinite(value):
            where = {lang: translated("calc", f"plan.columns.{key}", lang) for lang in LANGUAGES}
            raise PlanInputError(texts=translations("calc", "errors.not_finite", value=value, where=where.__getitem__))
    return c


def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """The model's FLOPs in one step of ``global_batch`` sequences (no recomputation; a mixture of
    experts counts its active parameters): what MFU counts."""
    return global_batch * model.seq * f.model_flops_per_token(model.active_params, model.layers, model.hidden,
                                                              model.seq, model.attention_width)


# ------------------------------------------------------------------------------ the search

def _check_fixed(model: ModelSpec, n: int, global_batch: int, axes: Axes) -> None:
    """:class:`PlanInputError` (or ShapeError) when a fixed degree cannot be right whatever the others are."""
    fixed = {"tp": axes.tp, "pp": axes.pp, "dp": axes.dp, "cp": axes.cp}
    for name, value in fixed.items():
        if value is not None and n % value:
            raise PlanInputError.keyed("degree_gpus", name=name, value=value, gpus=n)
    given = {name: value for name, value in fixed.items() if value not in (None, 1)}
    if len(given) > 1 and n % math.prod(given.values()):
        raise PlanInputError.keyed("degrees_gpus", names="·".join(given), values="·".join(map(str, given.values())),
                                   product=math.prod(given.values()), gpus=n)
    sp_only = axes.sp == (True,) and (axes.tp or 1) > 1  # sequence parallelism asked for: its rule too
    found = shape_refusals(model, axes.tp, axes.pp, axes.cp, axes.ep, sequence_parallel=sp_only)
    if found:
        raise ShapeError(found)
    if axes.dp is not None and global_batch % axes.dp:
        raise PlanInputError.keyed("dp_batch", dp=axes.dp, batch=global_batch)
    if axes.ep not in (None, 1) and not model.experts:
        raise PlanInputError.keyed("ep_dense", ep=axes.ep)
    # EP folds into the dp·cp ranks (Megatron-core's MoE parallel folding; the capstone run's mesh)
    if axes.ep is not None and axes.dp is not None and axes.cp is not None and (axes.dp * axes.cp) % axes.ep:
        raise PlanInputError.keyed("ep_divides", ep=axes.ep, dp=axes.dp, cp=axes.cp, product=axes.dp * axes.cp)
    if None not in (axes.tp, axes.pp, axes.dp, axes.cp):
        product = axes.tp * axes.pp * axes.dp * axes.cp  # type: ignore[operator]
        if product != n:
            raise PlanInputError.keyed("world", tp=axes.tp, pp=axes.pp, dp=axes.dp, cp=axes.cp, product=product,
                                       gpus=n)


def layouts(n: int, axes: Axes, experts: int = 0):
    """Every (tp, pp, dp, cp, ep) with tp·pp·dp·cp = n (ep divides dp·cp and the experts) that the fixed
    degrees allow."""
    for t in _divisors(n):
        if axes.tp not in (None, t):
            continue
        for c in _divisors(n // t):
            if axes.cp not in (None, c) or (axes.max_cp and c > axes.max_cp):
                continue
            for p in _divisors(n // (t * c)):
                d = n // (t * c * p)
                if axes.pp not in (None, p) or axes.dp not in (None, d):
                    continue
                for e in (_divisors(d * c) if experts else [1]):
                    if axes.ep in (None, e) and (not experts or experts % e == 0):
                        yield t, p, d, c, e


def plan(model: ModelSpec, cluster: Cluster, global_batch: int, optimizer: str = "adam", axes: Axes = Axes()) -> dict:
    """Every configuration for ``cluster.gpus`` GPUs: {"configs": the feasible ones, best first;
    "rejected": the others, each with its reason; "obstacle": when none is feasible, what blocks every
    layout, in English; "obstacle_text": the same in every language}. A fixed degree that does not divide the GPUs, the heads, the layers or the batch, or a
    shape that cannot hold ``model.params``, is a ValueError."""
    n = cluster.gpus
    check_shape(model)
    _check_fixed(model, n, global_batch, axes)
    feasible: list[Config] = []
    rejected: list[Config] = []
    for t, p, d, cp, e in layouts(n, axes, model.experts):
        why = shape_reasons(model, cluster, t, p, cp, e)
        if why:
            rejected.append(_reject(Config(t, p, d, cp=cp, ep=e), why))
            continue
        for b in axes.microbatches:
            if global_batch % (d * b):
                rejected.append(_reject(Config(t, p, d, b, cp=cp, ep=e),
                                        _texts("batch_split", batch=global_batch, dp=d, mb=b)))
                continue
            for sp in (axes.sp if t > 1 else (False,)):
                for z in axes.zero:
                    for r in axes.recompute:
                        for v in axes.chunks:
                            c = evaluate(model, cluster, global_batch, Config(t, p, d, b, z, r, v, sp, cp, e),
                                         optimizer, axes)
                            if not c.reason:
                                feasible.append(c)
                            elif v == 1 or c.memory_bytes:  # a shape reason once, not once per chunk count
                                rejected.append(c)
    feasible.sort(key=lambda c: (c.step_time_s, c.memory_bytes, c.layout))
    blocked = obstacle(model, cluster, global_batch, axes, rejected) if not feasible else {}
    return {"configs": feasible, "rejected": rejected, "obstacle": blocked.get("en", ""), "obstacle_text": blocked}


def _factors(n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    q = 2
    while q * q <= n:
        while n % q == 0:
            out[q] = out.get(q, 0) + 1
            n //= q
        q += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def _power(x: int, q: int) -> int:
    k = 0
    while x % q == 0:
        x //= q
        k += 1
    return k


def obstacle(model: ModelSpec, cluster: Cluster, global_batch: int, axes: Axes, rejected: list[Config]) -> dict[str, str]:
    """What blocks every layout, in one sentence per language: a prime factor of the GPU count that no
    degree can take (each degree's own rule, alone), else memory (the nearest miss), else the commonest
    reason."""
    n = cluster.gpus
    ok = {name: [x for x in _divisors(n) if fixed in (None, x) and rule(x)] for name, fixed, rule in (
        ("tp", axes.tp, lambda x: not shape_reason(model, cluster, x, 1)),
        ("pp", axes.pp, lambda x: not shape_refusals(model, pp=x, sequence_parallel=False)),
        ("dp", axes.dp, lambda x: global_batch % x == 0),
        ("cp", axes.cp, lambda x: not (axes.max_cp and x > axes.max_cp)
         and not shape_refusals(model, cp=x, sequence_parallel=False)))}
    for q, k in _factors(n).items():
        room = sum(max(_power(x, q) for x in values) for values in ok.values() if values)
        if room < k:
            return {lang: translated(
                "calc", "plan.obstacle.factor", lang, gpus=units.format_integer(n, lang),
                size=f"{q}^{k}" if k > 1 else str(q),
                tp=", ".join(map(str, ok["tp"])) or translated("calc", "plan.obstacle.none", lang),
                node=cluster.gpus_per_node, layers=model.layers, slots=model.layers + 2,
                batch=units.format_integer(global_batch, lang),
                cp=translated("calc", "plan.obstacle.cp_max" if axes.cp is None and axes.max_cp else "plan.obstacle.cp",
                              lang, seq=units.format_integer(model.seq, lang), max_cp=axes.max_cp)
                if axes.cp != 1 else "") for lang in LANGUAGES}
    memory = [c for c in rejected if c.memory_bytes]
    if memory:
        least = min(memory, key=lambda c: c.memory_bytes)
        return translations("calc", "plan.obstacle.memory",
                            need=lambda lang: units.format_bytes(least.memory_bytes, lang=lang),
                            tp=least.tp, pp=least.pp, dp=least.dp, cp=least.cp, ep=least.ep, mb=least.microbatch,
                            zero=least.zero,
                            recompute=lambda lang: translated("calc", f"plan.recompute_{least.recompute}", lang),
                            usable=lambda lang: units.format_bytes(least.memory["usable_bytes"], lang=lang))
    counts: dict[str, int] = {}
    for c in rejected:
        counts[c.reason] = counts.get(c.reason, 0) + 1
    if not counts:
        return translations("calc", "plan.obstacle.no_split")
    common = max(counts, key=lambda r: counts[r])
    texts = next(c.reason_text for c in rejected if c.reason == common)
    return translations("calc", "plan.obstacle.refused", reason=lambda lang: texts.get(lang, common))


def layout_rank(configs: list[Config], layout: tuple[int, ...]) -> tuple[int, Config | None]:
    """Rank (1 = best) of ``layout`` — (tp, pp, dp) or (tp, pp, dp, cp, ep), cp and ep 1 when left out —
    among distinct layouts, each at its best configuration, and that configuration; (0, None) when the
    layout has no feasible configuration."""
    want = tuple(layout) + (1,) * (5 - len(layout))
    seen: list[tuple[int, ...]] = []
    for c in configs:
        if c.layout not in seen:
            seen.append(c.layout)
            if c.layout == want:
                return len(seen), c
    return 0, None

