"""Capstone formulas: ranks on a (pp, dp, tp) device mesh, the groups each rank belongs to, and
what each dimension costs per step.

The mesh order is Megatron-LM's (``megatron/core/parallel_state.py``, ``RankGenerator`` with order
"tp-dp-pp" read innermost first) and torchtitan's (``ParallelDims``: mesh dims ("pp", "dp", "tp")):
tensor parallelism is the innermost (fastest-varying) dimension, so the t ranks of a TP group are
consecutive global ranks — the GPUs of one node, joined by NVLink — and pipeline parallelism is the
outermost. ``torch.distributed.device_mesh.init_device_mesh(device, (pp, dp, tp))`` lays ranks out the
same way (row-major): rank = (p·dp + d)·tp + t.

Sources:
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
  SC 2021, Sec. 3 (takeaways #1-#3: TP within a server, PP across servers, DP for the rest).
- Per-dimension costs reuse lessons 1 (ring α-β), 2 (model states, activations), 4 (TP traffic) and
  5 (bubble).
Pure Python.
"""
from __future__ import annotations

from ..lesson2.formulas import _count
from ..model_size import check_degrees

DIMS = ("pp", "dp", "tp")  # outermost first, as the mesh is built


def _degrees(pp: int, dp: int, tp: int) -> tuple[int, int, int]:
    return (_count(pp, "the pipeline-parallel degree"), _count(dp, "the data-parallel degree"),
            _count(tp, "the tensor-parallel degree"))


def world_size(pp: int, dp: int, tp: int) -> int:
    """Ranks on the mesh: pp·dp·tp."""
    p, d, t = _degrees(pp, dp, tp)
    return p * d * t


def mesh_coords(rank: int, pp: int, dp: int, tp: int) -> dict[str, int]:
    """The (pp, dp, tp) coordinates of a global rank on a row-major (pp, dp, tp) mesh:
    tp = rank mod t, dp = (rank div t) mod d, pp = rank div (d·t)."""
    p, d, t = _degrees(pp, dp, tp)
    if isinstance(rank, bool) or int(rank) != rank or not 0 <= rank < p * d * t:
        raise ValueError(f"rank must be an integer in [0, {p * d * t}), got {rank!r}")
    r = int(rank)
    return {"pp": r // (d * t), "dp": (r // t) % d, "tp": r % t}


def rank_at(pp_index: int, dp_index: int, tp_index: int, pp: int, dp: int, tp: int) -> int:
    """The global rank at mesh coordinates (pp_index, dp_index, tp_index): (p·d_deg + d)·t_deg + t."""
    p, d, t = _degrees(pp, dp, tp)
    for value, size, name in ((pp_index, p, "pp"), (dp_index, d, "dp"), (tp_index, t, "tp")):
        if not 0 <= value < size:
            raise ValueError(f"{name} index must be in [0, {size}), got {value!r}")
    return (pp_index * d + dp_index) * t + tp_index


def group_ranks(rank: int, dim: str, pp: int, dp: int, tp: int) -> list[int]:
    """The ranks of ``rank``'s group along ``dim`` (``pp``, ``dp`` or ``tp``): the ranks that share its
    other two coordinates. TP groups are consecutive ranks; DP groups stride by t; PP groups by d·t."""
    if dim not in DIMS:
        raise ValueError(f"unknown mesh dimension {dim!r}; choose one of {', '.join(DIMS)}")
    c = mesh_coords(rank, pp, dp, tp)
    size = {"pp": pp, "dp": dp, "tp": tp}[dim]
    out = []
    for i in range(size):
        coords = dict(c, **{dim: i})
        out.append(rank_at(coords["pp"], coords["dp"], coords["tp"], pp, dp, tp))
    return out


def group_stride(dim: str, pp: int, dp: int, tp: int) -> int:
    """Distance between consecutive global ranks of one group along ``dim``: 1 for tp, t for dp, d·t for pp."""
    p, d, t = _degrees(pp, dp, tp)
    return {"tp": 1, "dp": t, "pp": d * t}[dim]


def group_count(dim: str, pp: int, dp: int, tp: int) -> int:
    """How many groups of ``dim`` the mesh has: world / (the degree of ``dim``). Every rank is in exactly
    one group of each dimension."""
    if dim not in DIMS:
        raise ValueError(f"unknown mesh dimension {dim!r}; choose one of {', '.join(DIMS)}")
    p, d, t = _degrees(pp, dp, tp)
    return p * d * t // {"pp": p, "dp": d, "tp": t}[dim]


def nodes_spanned(dim: str, pp: int, dp: int, tp: int, gpus_per_node: int) -> int:
    """How many nodes one group of ``dim`` touches when ranks fill nodes in order (rank // gpus_per_node
    is its node): 1 means the group talks over NVLink only."""
    g = _count(gpus_per_node, "the GPUs per node")
    return len({r // g for r in group_ranks(0, dim, pp, dp, tp)})


# ------------------------------------------------------------------------------ five axes
#
# torchtitan's ParallelDims and the capstone's engine (engine/mesh.py): a (pp, dp, cp, tp) mesh, TP
# innermost, then CP, DP and PP: rank = ((p·dp + d)·cp + c)·tp + t. Gradients are reduced over the
# dp·cp ranks of a (pp, tp) coordinate (torchtitan's dp_shard_cp); expert parallelism borrows ``ep``
# consecutive ones of them in (d, c) order, and the experts' own gradients are reduced over ``edp``,
# the ranks at the same place in every EP group. With cp = ep = 1 this is :func:`mesh_coords`' mesh.

MESH5_GROUPS = ("tp", "cp", "ep", "dp", "edp", "pp")  # innermost first; dp: the dp·cp gradient group


def _degrees5(pp: int, dp: int, cp: int, tp: int, ep: int) -> tuple[int, int, int, int, int]:
    p, d, t = _degrees(pp, dp, tp)
    c = _count(cp, "the context-parallel degree")
    e = _count(ep, "the expert-parallel degree")
    if (d * c) % e:
        raise ValueError(f"the expert-parallel degree {e} must divide dp·cp = {d}·{c} = {d * c}")
    return p, d, c, t, e


def mesh5_coords(rank: int, pp: int, dp: int, cp: int, tp: int, ep: int = 1) -> dict[str, int]:
    """``{pp, dp, cp, tp, ep, edp}`` of a global rank on the (pp, dp, cp, tp) mesh: tp = r mod t,
    cp = (r div t) mod c, dp = (r div c·t) mod d, pp = r div (d·c·t); ``ep`` and ``edp`` are its place
    inside and among the EP groups of its dp·cp ranks (i = d·cp + c: ep = i mod e, edp = i div e)."""
    p, d, c, t, e = _degrees5(pp, dp, cp, tp, ep)
    if isinstance(rank, bool) or int(rank) != rank or not 0 <= rank < p * d * c * t:
        raise ValueError(f"rank must be an integer in [0, {p * d * c * t}), got {rank!r}")
    r = int(rank)
    dp_i, cp_i = (r // (c * t)) % d, (r // t) % c
    inner = dp_i * c + cp_i
    return {"pp": r // (d * c * t), "dp": dp_i, "cp": cp_i, "tp": r % t, "ep": inner % e, "edp": inner // e}


def mesh5_rank(pp_index: int, dp_index: int, cp_index: int, tp_index: int, pp: int, dp: int, cp: int,
               tp: int) -> int:
    """The global rank at (pp, dp, cp, tp) coordinates: ((p·dp + d)·cp + c)·tp + t."""
    p, d, c, t, _ = _degrees5(pp, dp, cp, tp, 1)
    for value, size, name in ((pp_index, p, "pp"), (dp_index, d, "dp"), (cp_index, c, "cp"), (tp_index, t, "tp")):
        if not 0 <= value < size:
            raise ValueError(f"{name} index must be in [0, {size}), got {value!r}")
    return ((pp_index * d + dp_index) * c + cp_index) * t + tp_index


def mesh5_group(rank: int, dim: str, pp: int, dp: int, cp: int, tp: int, ep: int = 1) -> list[int]:
    """The ranks of ``rank``'s group along ``dim``: ``tp``, ``cp``, ``pp`` (the ranks that differ from it
    on that axis only), ``dp`` (the dp·cp ranks that reduce its gradients), ``ep`` (its ``ep`` consecutive
    ones of those, which exchange tokens) or ``edp`` (those at its place in every EP group, which reduce
    its experts' gradients)."""
    if dim not in MESH5_GROUPS:
        raise ValueError(f"unknown mesh group {dim!r}; choose one of {', '.join(MESH5_GROUPS)}")
    p, d, c, t, e = _degrees5(pp, dp, cp, tp, ep)
    x = mesh5_coords(rank, p, d, c, t, e)
    if dim in ("pp", "cp", "tp"):
        size = {"pp": p, "cp": c, "tp": t}[dim]
        at = [{**x, dim: i} for i in range(size)]
        return [mesh5_rank(y["pp"], y["dp"], y["cp"], y["tp"], p, d, c, t) for y in at]
    replicas = [mesh5_rank(x["pp"], i // c, i % c, x["tp"], p, d, c, t) for i in range(d * c)]
    if dim == "ep":
        return replicas[x["edp"] * e:(x["edp"] + 1) * e]
    return replicas[x["ep"]::e] if dim == "edp" else replicas


def mesh5_nodes_spanned(dim: str, pp: int, dp: int, cp: int, tp: int, gpus_per_node: int, ep: int = 1) -> int:
    """How many nodes one group of ``dim`` on the five-axis mesh touches when ranks fill nodes in order:
    1 means it talks over NVLink only."""
    g = _count(gpus_per_node, "the GPUs per node")
    return len({r // g for r in mesh5_group(0, dim, pp, dp, cp, tp, ep)})


def microbatches_per_replica(global_batch: int, dp: int, micro_batch: int) -> int:
    """Microbatches each pipeline runs per step: global batch / (dp · microbatch size), which must divide."""
    b = _count(global_batch, "the global batch")
    d = _count(dp, "the data-parallel degree")
    mb = _count(micro_batch, "the micro-batch size")
    if b % (d * mb):
        raise ValueError(f"the global batch {b} is not a multiple of dp·microbatch = {d}·{mb} = {d * mb}")
    return b // (d * mb)


def params_per_gpu(params, pp: int, tp: int) -> float:
    """Parameters each GPU holds before any ZeRO sharding: Ψ/(pp·tp) (every weight matrix split t ways,
    the layers split p ways; embeddings and norms counted as if split evenly too)."""
    psi = _count(params, "the number of parameters")
    p = _count(pp, "the pipeline-parallel degree")
    t = _count(tp, "the tensor-parallel degree")
    return psi / (p * t)


def pp_p2p_bytes_per_microbatch(seq: int, micro_batch: int, hidden: int, tp: int = 1,
                                bytes_per_elem: int = 2, scatter_gather: bool = True) -> float:
    """Bytes one stage boundary sends per microbatch and direction: the s·b·h activation (forward) or its
    gradient (backward). Megatron's scatter/gather optimisation (Narayanan et al. 2021, Sec. 4.1) sends
    only 1/t of it from each TP rank and all-gathers it over NVLink on the other side."""
    s = _count(seq, "the sequence length")
    b = _count(micro_batch, "the micro-batch size")
    h = _count(hidden, "the hidden size")
    t = _count(tp, "the tensor-parallel degree")
    e = _count(bytes_per_elem, "the bytes per element")
    x = s * b * h * e
    return x / t if scatter_gather else x


def dp_grad_bytes(params, pp: int, tp: int, bytes_per_elem: int = 2) -> float:
    """Gradient bytes each data-parallel group reduces per step: the Ψ/(pp·tp) gradients of one rank's
    shard of the model (``bytes_per_elem`` 2: bf16 gradients, Megatron-LM's ``--grad-reduce-in-bf16``; 4: fp32, what
    Megatron-LM reduces by default with bf16, and torchtitan and Llama 3 too)."""
    e = _count(bytes_per_elem, "the bytes per element")
    return params_per_gpu(params, pp, tp) * e


# ------------------------------------------------------------------------------ FLOPs and MFU

def model_flops_per_token(params, layers: int, hidden: int, seq: int, attention_width: float | None = None) -> float:
    """Training FLOPs per token that count toward MFU: 6Ψ + 12·L·h·s — the 6Ψ of the forward and
    backward matmuls plus the attention scores and their use (Chowdhery et al., "PaLM", 2022,
    Appendix B); ``attention_width`` in place of h when the attention core is wider (a·(d_qk + d_v)/2,
    DeepSeek's MLA). Recomputation is not counted: MFU asks how much of the peak went into the model."""
    psi = _count(params, "the number of parameters")
    L = _count(layers, "the number of layers")
    h = _count(hidden, "the hidden size")
    s = _count(seq, "the sequence length")
    return 6 * psi + 12 * L * (attention_width or h) * s


def hardware_flops_per_token(params, layers: int, hidden: int, seq: int, recompute: str = "none",
                             attention_width: float | None = None, layer_params: float | None = None) -> float:
    """FLOPs the GPUs actually execute per token: :func:`model_flops_per_token` plus what
    recomputation repeats (Korthikanti et al. 2022, Sec. 5): full recomputation runs every layer's
    forward again (2·Ψ_layers + 4·L·h·s, ``layer_params`` the layers' Ψ_layers: the output layer is not
    recomputed, so with Ψ = Ψ_layers + V·h this is Megatron-LM's 96·s·l·h²·(1 + s/(6h) + V/(16lh)) per
    sequence; Ψ when not given), selective recomputation only the attention core's forward (4·L·h·s);
    ``attention_width`` in place of h as in :func:`model_flops_per_token` (without recomputation the two
    counts are equal: HFU = MFU)."""
    base = model_flops_per_token(params, layers, hidden, seq, attention_width)
    attention_forward = 4 * layers * (attention_width or hidden) * seq
    recomputed = params if layer_params is None else layer_params
    extra = {"none": 0, "selective": attention_forward, "full": 2 * recomputed + attention_forward}
    if recompute not in extra:
        raise ValueError(f"unknown recompute {recompute!r}; choose one of none, selective, full")
    return base + extra[recompute]


def megatron_flops_per_step(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs per step as Megatron-LM counts them for its published throughputs, with full activation
    recomputation: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (Narayanan et al. 2021, Sec. 5.1, eq. 3).
    BLOOM's throughput uses the same count (BigScience tr11-176B-ml README, "Throughput")."""
    B = _count(batch, "the global batch")
    s = _count(seq, "the sequence length")
    L = _count(layers, "the number of layers")
    h = _count(hidden, "the hidden size")
    V = _count(vocab, "the vocabulary size")
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def neox_flops_per_token(params: float, seq: int, hidden: int, layers: int) -> float:
    """FLOPs per token as GPT-NeoX counted them for its logged throughput from May 2021 to September 2023
    (EleutherAI/gpt-neox, ``megatron/logging.py``'s ``get_flops``, replaced by eq. 3 in PR #1044):
    6·Ψ + 60·s·h·l, Ψ every parameter of the model (embeddings included)."""
    if not params > 0:
        raise ValueError("the parameters must be greater than 0")
    return 6 * params + 60 * _count(seq, "the sequence length") * _count(hidden, "the hidden size") * _count(
        layers, "the number of layers")


def mfu(model_flops_per_step: float, step_time_s: float, gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: model FLOPs per step / (GPUs · peak FLOP/s · step time)
    (Chowdhery et al. 2022, Sec. 4.1 and Appendix B)."""
    n = _count(gpus, "the number of GPUs")
    if not (step_time_s > 0 and peak_flops > 0):
        raise ValueError("the step time and the peak FLOP/s must be greater than 0")
    return model_flops_per_step / (n * peak_flops * step_time_s)


def published_mfu(achieved_flops_per_gpu: float, counted_flops: float, model_flops: float,
                  peak_flops: float) -> float:
    """A published per-GPU throughput turned into MFU: the publisher counted ``counted_flops`` per step
    (with recomputation, for Megatron-LM and BLOOM) and achieved ``achieved_flops_per_gpu``; only
    ``model_flops`` of them were the model's: achieved · model/counted / peak."""
    if not (achieved_flops_per_gpu > 0 and counted_flops > 0 and model_flops > 0 and peak_flops > 0):
        raise ValueError("published throughputs and FLOP counts must be greater than 0")
    return achieved_flops_per_gpu * model_flops / counted_flops / peak_flops


def stage_layers(layers: int, pp: int) -> int:
    """Transformer layers on the busiest pipeline stage. ``pp`` must divide the layers, or the layers
    plus two: the embedding and the output layer then take one layer's slot each on the first and last
    stages — BLOOM's ``--pp-partition-method 'type:transformer|embedding'`` (70 + 2 = 12 × 6) and
    Llama 3 405B's balanced pipeline (126 + 2 = 16 × 8; Llama 3 paper, Sec. 3.3.2)."""
    L = _count(layers, "the number of layers")
    p = _count(pp, "the pipeline-parallel degree")
    check_degrees(pp=p, stages="with-ends", layers=L)  # the course's one shape check
    return L // p if L % p == 0 else (L + 2) // p


# ------------------------------------------------------------------------------ how fast one GPU runs a layer
#
# A layer's forward on one GPU is three kinds of work (Korthikanti et al. 2022, Sec. 4.1, count its
# tensors; Anthony et al., "The Case for Co-Designing Model Architectures with Hardware", 2024, measure
# the GEMMs' throughput against their sizes):
#
# - the GEMMs, 2·b·s·P_layer/t FLOPs, at a fraction of peak that grows with the matrices' narrow sizes:
#   E / (1 + w½·(t/h + cp/(b·s))) — E the best a GEMM reaches on this GPU, h/t the width of the
#   per-GPU weight shards, b·s/cp the rows of the activation; w½ the size at which a GEMM runs at E/2;
# - the attention core, 4·b·s²·h/(t·cp) FLOPs (QKᵀ and the weighted sum of V), at E; FlashAttention
#   skips the masked half of a causal score matrix;
# - the memory-bound kernels, bytes through HBM at its bandwidth: per s·b·h element
#   ELEMENTWISE_REPLICATED bytes (2 LayerNorms 2+2, 2 fused bias-dropout-adds 2+2+2+1 — split t ways only
#   with sequence parallelism) and ELEMENTWISE_SPLIT bytes (the GeLU over the 4h activation,
#   8 in and 8 out, always split); without FlashAttention, SOFTMAX_BYTES per a·s²·b score (the fused
#   scale-mask-softmax reads 2 and writes 2, its dropout reads 2, writes 2 and a 1-byte mask).
#
# The backward costs twice the forward; recomputation adds the forward again (full) or its attention
# core and softmax (selective). E and w½ are fitted (see :mod:`.published`); the byte counts are
# counted, not fitted.

ELEMENTWISE_REPLICATED = 22  # bytes per s·b·h element, forward: 2 LayerNorms (2 in, 2 out) and 2 fused
#                               bias-dropout-adds (Megatron-LM's bias_dropout_add_fused: 2 + 2 in, 2 out, 1-B mask)
ELEMENTWISE_SPLIT = 16  # bytes per s·b·h element, forward: the GeLU over 4h (8 read, 8 written)
SOFTMAX_BYTES = 9  # bytes per a·s²·b score, forward, without FlashAttention


def gemm_efficiency(hidden: int, tokens: float, tp: int, peak_fraction: float, half_width: float,
                    cp: int = 1) -> float:
    """Fraction of peak a layer's GEMMs reach on one GPU: E / (1 + w½·(t/h + cp/tokens)), ``tokens``
    the rows b·s of a microbatch (split ``cp`` ways by context parallelism), h/t the narrow side of the
    weight shards. Large matrices approach E; small ones spend their time on tiles' edges and launches."""
    h = _count(hidden, "the hidden size")
    t = _count(tp, "the tensor-parallel degree")
    c = _count(cp, "the context-parallel degree")
    if not (0 < peak_fraction <= 1 and half_width >= 0 and tokens > 0):
        raise ValueError("the GEMM efficiency needs 0 < E <= 1, w½ >= 0 and tokens > 0")
    return peak_fraction / (1 + half_width * (t / h + c / tokens))


def layer_forward_seconds(*, hidden: int, heads: int, seq: int, micro_batch: int, layer_params: float,
                          tp: int = 1, cp: int = 1, sequence_parallel: bool = False, flash: bool = False,
                          peak_flops: float, hbm_bandwidth: float, peak_fraction: float,
                          half_width: float, attention_width: float | None = None,
                          linear_flops: float | None = None,
                          linear_efficiency: float | None = None, attention_efficiency: float | None = None,
                          attention_backward: float = 2.0) -> dict[str, float]:
    """One layer's forward for one microbatch on one GPU, in seconds: {"gemm_s", "attention_s",
    "memory_s", "total_s", "gemm_efficiency"} (the model in the comment above). ``attention_width``: the
    attention core's a·(d_qk + d_v)/2 when it is not h; ``linear_flops``: the peak the linear layers'
    GEMMs run at when it is not ``peak_flops`` (FP8 GEMMs: the FP8 peak; the attention core stays at
    ``peak_flops``); ``linear_efficiency``: with ``linear_flops``, the fraction of it the linear GEMMs reach
    as measured on the run's own shapes (DeepSeek-V3's FP8 GEMMs, DeepGEMM's published TFLOP/s), in place of
    the fitted E/(1 + w½·(t/h + cp/(b·s))); ``attention_efficiency``: the attention core's measured fraction
    of ``peak_flops`` in place of E, and ``attention_backward`` its backward's time over its forward's
    (2, like the rest, unless measured). "backward_s": the layer's backward."""
    h, a, s, b = hidden, heads, seq, micro_batch
    tokens = s * b / cp
    eff = gemm_efficiency(h, tokens, tp, peak_fraction, half_width, cp)
    linear_eff = linear_efficiency if (linear_flops and linear_efficiency) else eff
    gemm = 2 * tokens * layer_params / tp / ((linear_flops or peak_flops) * linear_eff)
    attn_flops = 4 * b * s * (s / cp) * (attention_width or h) / tp * (0.5 if flash else 1.0)
    attention = attn_flops / (peak_flops * (attention_efficiency or peak_fraction))
    sbh = tokens * h
    elementwise = sbh * (ELEMENTWISE_REPLICATED / (tp if sequence_parallel else 1) + ELEMENTWISE_SPLIT / tp)
    softmax = 0.0 if flash else SOFTMAX_BYTES * a * s * (s / cp) * b / tp
    memory = (elementwise + softmax) / hbm_bandwidth
    return {"gemm_s": gemm, "attention_s": attention, "memory_s": memory, "softmax_s": softmax / hbm_bandwidth,
            "total_s": gemm + attention + memory, "gemm_efficiency": eff,
            "backward_s": 2 * (gemm + memory) + attention_backward * attention}


def layer_train_seconds(forward: dict[str, float], recompute: str) -> float:
    """Forward + backward (twice the forward, or ``backward_s`` when measured apart) + what recomputation repeats: the whole forward (full) or
    the attention core and its softmax (selective)."""
    extra = {"none": 0.0, "selective": forward["attention_s"] + forward["softmax_s"], "full": forward["total_s"]}
    if recompute not in extra:
        raise ValueError(f"unknown recompute {recompute!r}; choose one of none, selective, full")
    return forward["total_s"] + forward.get("backward_s", 2 * forward["total_s"]) + extra[recompute]
