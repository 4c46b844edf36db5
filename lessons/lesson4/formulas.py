"""Lesson 4 formulas: the communication of Megatron-style tensor parallelism per transformer layer.

Sources:
- Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
  Parallelism", arXiv:1909.08053, Sec. 3 and Fig. 4: the f and g operators; 2 all-reduces in the
  forward and 2 in the backward pass of each transformer layer.
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  arXiv:2205.05198, Sec. 4.2.2: with sequence parallelism each all-reduce becomes a reduce-scatter
  (g) paired with an all-gather (f); same bytes, activations between them sharded by t.
- Ring costs from :mod:`distai.lessons.lesson1.formulas` (Thakur et al. 2005).

Activation memory per layer (Korthikanti Table 2) lives in
:func:`distai.lessons.lesson2.formulas.activation_bytes_per_layer`, re-exported here.
Pure Python.
"""
from __future__ import annotations

from ..lesson1.formulas import (
    ring_allgather_time,
    ring_allreduce_time,
    ring_reduce_scatter_time,
)
from ..lesson2.formulas import _count, activation_bytes_per_layer, check_tp_degree  # noqa: F401


def tp_comm_per_layer(hidden: int, seq: int, micro_batch: int, tp: int, sequence_parallel: bool = False,
                      bytes_per_elem: int = 2, alpha: float | None = None, beta: float | None = None) -> dict:
    """Collectives and bytes one rank sends per transformer layer under tensor parallelism of degree t.

    Without sequence parallelism (Megatron-LM Sec. 3): forward — g after the attention block and g
    after the MLP: 2 all-reduces of the s·b·h activation; backward — f before each block: 2 all-reduces
    of the s·b·h input gradient. With sequence parallelism (Korthikanti Sec. 4.2.2): per direction
    2 all-gathers (producing s·b·h from s·b·h/t shards) and 2 reduce-scatters (of s·b·h into s·b·h/t).
    An all-reduce is a reduce-scatter plus an all-gather, so the bytes are the same. With a ring, an
    all-reduce of X bytes sends 2(t-1)/t·X per rank; an all-gather or a reduce-scatter (t-1)/t·X.

    Returns {"tensor_bytes": s·b·h·bytes, "forward": {op: count}, "backward": {op: count},
    "forward_bytes_per_rank", "backward_bytes_per_rank", "total_bytes_per_rank",
    and, when ``alpha`` and ``beta`` are given, "forward_time_s", "backward_time_s", "total_time_s"}.
    With sequence parallelism also "regather": {"all_gather": 2} and "regather_bytes_per_rank"
    (and "regather_time_s"): Korthikanti's count leaves them out, but Megatron-LM's column-parallel
    linears save only their s·b·h/t input shard and all-gather it again in the backward for the weight
    gradient (``LinearWithGradAccumulationAndAsyncCommunication.backward``, overlapped with the
    input-gradient GEMM), as distai's run does by default: the backward sends 1.5× the forward's bytes.
    (The small all-reduce of the layer-norm weight gradients that SP needs is not counted.)
    """
    h = _count(hidden, "the hidden size")
    s = _count(seq, "the sequence length")
    b = _count(micro_batch, "the micro-batch size")
    t = check_tp_degree(tp, hidden=h, seq=s, sequence_parallel=sequence_parallel)
    e = _count(bytes_per_elem, "the bytes per element")
    x = s * b * h * e
    if sequence_parallel:
        ops = {"all_gather": 2, "reduce_scatter": 2}
        per_dir = 2 * (t - 1) / t * x + 2 * (t - 1) / t * x
    else:
        ops = {"all_reduce": 2}
        per_dir = 2 * (2 * (t - 1) / t * x)
    out = {
        "tensor_bytes": x,
        "forward": dict(ops),
        "backward": dict(ops),
        "forward_bytes_per_rank": per_dir,
        "backward_bytes_per_rank": per_dir,
        "total_bytes_per_rank": 2 * per_dir,
    }
    if sequence_parallel:  # QKV's and FC1's inputs, gathered again for their weight gradients
        out["regather"] = {"all_gather": 2}
        out["regather_bytes_per_rank"] = 2 * (t - 1) / t * x
    if alpha is not None and beta is not None:
        if sequence_parallel:
            one_dir = 2 * ring_allgather_time(x, t, alpha, beta) + 2 * ring_reduce_scatter_time(x, t, alpha, beta)
        else:
            one_dir = 2 * ring_allreduce_time(x, t, alpha, beta)
        out["forward_time_s"] = one_dir
        out["backward_time_s"] = one_dir
        out["total_time_s"] = 2 * one_dir
        if sequence_parallel:
            out["regather_time_s"] = 2 * ring_allgather_time(x, t, alpha, beta)
    return out


def tp_activation_saving(seq: int, micro_batch: int, hidden: int, heads: int, tp: int) -> float:
    """Ratio of per-layer activation memory without to with sequence parallelism at the same t
    (Korthikanti Table 2): (10 + 24/t + 5as/(ht)) / ((34 + 5as/h)/t)."""
    without = activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp, False)
    with_sp = activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp, True)
    return without / with_sp


def tp_comm_bytes_per_layer(hidden: int, seq: int, micro_batch: int, tp: int, sequence_parallel: bool = False,
                            bytes_per_elem: int = 2) -> float:
    """Bytes one rank sends per transformer layer, forward plus backward, with a ring: the scalar
    ``tp_comm_per_layer(...)["total_bytes_per_rank"]`` = 4 · 2(t−1)/t · s·b·h·bytes, the same with
    sequence parallelism (Megatron-LM Sec. 3; Korthikanti et al. Sec. 4.2.2)."""
    return tp_comm_per_layer(hidden, seq, micro_batch, tp, sequence_parallel, bytes_per_elem)["total_bytes_per_rank"]


def tp_comm_time_per_layer(hidden: int, seq: int, micro_batch: int, tp: int, alpha: float, beta: float,
                           sequence_parallel: bool = False, bytes_per_elem: int = 2) -> float:
    """Seconds of tensor-parallel communication per layer, forward plus backward, with ring collectives
    under the α-β model (Thakur et al. 2005): the scalar ``tp_comm_per_layer(...)["total_time_s"]``."""
    return tp_comm_per_layer(hidden, seq, micro_batch, tp, sequence_parallel, bytes_per_elem,
                             alpha, beta)["total_time_s"]


def vocab_parallel_ce_bytes_per_rank(seq: int, micro_batch: int, tp: int, bytes_per_elem: int = 4) -> float:
    """Bytes one rank sends for the vocabulary-parallel cross-entropy: three all-reduces of s·b numbers
    (the max logit, the target's logit, the sum of exponentials), 3 · 2(t−1)/t · s·b·bytes with a ring.
    Shoeybi et al. 2019, Sec. 3: the output GEMM is fused with the loss so that only b×s scalars are
    communicated instead of the b×s×V logits (Megatron-LM's ``vocab_parallel_cross_entropy``)."""
    s = _count(seq, "the sequence length")
    b = _count(micro_batch, "the micro-batch size")
    t = _count(tp, "the tensor-parallel degree")
    e = _count(bytes_per_elem, "the bytes per element")
    return 3 * 2 * (t - 1) / t * s * b * e


def gathered_logits_bytes_per_rank(seq: int, micro_batch: int, vocab: int, tp: int, bytes_per_elem: int = 4) -> float:
    """Bytes one rank would send to all-gather the full logits instead, (t−1)/t · s·b·V·bytes with a ring:
    the cost the vocabulary-parallel cross-entropy avoids (Shoeybi et al. 2019, Sec. 3)."""
    s = _count(seq, "the sequence length")
    b = _count(micro_batch, "the micro-batch size")
    v = _count(vocab, "the vocabulary size")
    t = _count(tp, "the tensor-parallel degree")
    e = _count(bytes_per_elem, "the bytes per element")
    return (t - 1) / t * s * b * v * e


def collective_time(op: str, payload_bytes: float, n: int, alpha: float, beta: float) -> float:
    """α-β time of one ring collective over a full buffer of ``payload_bytes`` among ``n`` ranks
    (lesson 1's formulas, Thakur et al. 2005): an all-reduce 2(n−1)α + 2(n−1)/n·S·β, an all-gather
    or a reduce-scatter half of it. A tensor-parallel step's time is its compute plus the sum of
    these over its collectives (the run checks it: ``tp_step_time``)."""
    times = {"all_reduce": ring_allreduce_time, "all_gather": ring_allgather_time,
             "reduce_scatter": ring_reduce_scatter_time}
    if op not in times:
        raise ValueError(f"no α-β time for {op!r}; choose from {', '.join(times)}")
    return times[op](payload_bytes, n, alpha, beta) if n > 1 else 0.0
