"""Lesson 7 formulas: KV cache size, decode and prefill rooflines, tensor parallelism in decode.

Sources:
- Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023, Sec. 2: KV cache bytes
  2·L·h_kv·d_head per token per element byte; decode is memory-bandwidth bound at small batch.
- Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
  Checkpoints", EMNLP 2023 (fewer KV heads than query heads). Llama 2 70B: 80 layers, 8 KV heads,
  head dim 128 (Touvron et al. 2023, Table 1 / the released config).
- Williams, Waterman & Patterson, "Roofline: An Insightful Visual Performance Model", CACM 2009:
  time ≥ max(FLOPs / peak FLOP/s, bytes / bandwidth).
- Kaplan et al., "Scaling Laws for Neural Language Models", 2020, Sec. 2.1: forward pass ≈ 2·N FLOPs
  per token for N non-embedding parameters.
- Shoeybi et al. 2019 (Megatron-LM): 2 all-reduces per layer in the forward pass, here per decoded token.
Sizes in bytes, times in seconds, bandwidths in bytes/s, compute in FLOP/s. Pure Python.
"""
from __future__ import annotations

import math

from ..lesson1.formulas import nccl_ring_allreduce, ring_allreduce_time
from ..lesson2.formulas import _count, check_tp_degree
from ..model_size import check_degrees

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a KV-cache/weight dtype: fp32 4, fp16/bf16 2, fp8/int8 1."""
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}") from None


def kv_cache_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float = 2) -> float:
    """KV-cache bytes one token adds: 2 (K and V) · L · H_kv · d_head · bytes (Pope et al. 2023, Sec. 2).

    Llama-2-70B (80 layers, 8 KV heads, d = 128, fp16): 2·80·8·128·2 = 327,680 B = 320 KiB per token.
    """
    L = _count(layers, "the number of layers")
    H = _count(kv_heads, "the number of KV heads")
    d = _count(head_dim, "the head dimension")
    if not dtype_bytes > 0:
        raise ValueError("bytes per element must be > 0")
    value = 2 * L * H * d * dtype_bytes
    return int(value) if float(value).is_integer() else value


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads each tensor-parallel rank holds: H_kv / t when t divides H_kv; when t > H_kv each head is
    replicated on t / H_kv ranks, so every rank holds one (as vLLM does). Other combinations are
    rejected."""
    H = _count(kv_heads, "the number of KV heads")
    t = check_tp_degree(tp, kv_heads=H)
    return max(1, H // t)


def kv_cache_total(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float, tokens: int,
                   tp: int = 1, pp: int = 1) -> dict:
    """KV cache for ``tokens`` tokens (summed over all sequences in flight):
    {"bytes_per_token", "total_bytes", "per_gpu_bytes"}.

    Tensor parallelism shards it by KV heads (:func:`kv_heads_per_gpu`), pipeline parallelism by layers:
    the busiest stage holds ⌈L/pp⌉ layers. per_gpu_bytes = 2·⌈L/pp⌉·(H_kv per rank)·d·bytes·tokens.
    (When t > H_kv the replicated heads make the sum over GPUs exceed total_bytes.)
    """
    T = _count(tokens, "the number of tokens")
    p = _count(pp, "the pipeline-parallel degree")
    L = _count(layers, "the number of layers")
    check_degrees(tp=_count(tp, "the tensor-parallel degree"), kv_heads=_count(kv_heads, "the number of KV heads"),
                  pp=p, layers=L)  # the course's one shape check: KV heads split or replicated, a layer per stage
    per_token = kv_cache_bytes_per_token(L, kv_heads, head_dim, dtype_bytes)
    per_gpu = kv_cache_bytes_per_token(-(-L // p), kv_heads_per_gpu(kv_heads, tp), head_dim, dtype_bytes) * T
    return {"bytes_per_token": per_token, "total_bytes": per_token * T, "per_gpu_bytes": per_gpu}


def max_kv_tokens(free_bytes: float, bytes_per_token: float) -> int:
    """How many tokens of KV cache fit in ``free_bytes``: ⌊free / bytes_per_token⌋."""
    if bytes_per_token <= 0:
        raise ValueError("bytes per token must be > 0")
    return max(0, math.floor(free_bytes / bytes_per_token))


def decode_tokens_per_s_upper_bound(bandwidth: float, bytes_per_token_read: float) -> float:
    """Memory-bandwidth bound on decode speed: tokens/s ≤ bandwidth / bytes read per generated token
    (Pope et al. 2023, Sec. 2; roofline). For one sequence the bytes read per token are all the
    weights plus its KV cache."""
    if not bandwidth > 0 or not bytes_per_token_read > 0:
        raise ValueError("bandwidth and bytes per token must be > 0")
    return bandwidth / bytes_per_token_read


def decode_step_bytes(weight_bytes: float, kv_bytes_per_seq: float, batch: int = 1) -> float:
    """Bytes one decode step reads for a batch: the weights once, plus every sequence's KV cache:
    W + B·KV (the weights are shared by the batch, which is why batching helps decode)."""
    return weight_bytes + _count(batch, "the batch size") * kv_bytes_per_seq


def forward_flops(params: float, tokens: int) -> float:
    """Forward FLOPs ≈ 2·N per token (Kaplan et al. 2020, Sec. 2.1; attention over the context ignored)."""
    return 2.0 * params * tokens


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline lower bound on time: max(FLOPs / peak, bytes / bandwidth) (Williams et al. 2009)."""
    if not peak_flops > 0 or not bandwidth > 0:
        raise ValueError("peak FLOP/s and bandwidth must be > 0")
    return max(flops / peak_flops, bytes_moved / bandwidth)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved; compute-bound when above the ridge point (:func:`ridge_point`)."""
    if not bytes_moved > 0:
        raise ValueError("bytes moved must be > 0")
    return flops / bytes_moved


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The machine balance, peak FLOP/s / bandwidth, in FLOPs per byte (Williams et al. 2009)."""
    if not bandwidth > 0:
        raise ValueError("bandwidth must be > 0")
    return peak_flops / bandwidth


def prefill_time(params: float, prompt_tokens: int, weight_bytes: float, peak_flops: float,
                 bandwidth: float, batch: int = 1) -> float:
    """Roofline prefill time of ``batch`` prompts of ``prompt_tokens``: FLOPs 2·N·B·s, bytes the weights
    once (KV writes ignored) — usually compute-bound."""
    T = _count(prompt_tokens, "the prompt length") * _count(batch, "the batch size")
    return roofline_time(forward_flops(params, T), weight_bytes, peak_flops, bandwidth)


def decode_time_per_token(params: float, weight_bytes: float, kv_bytes_per_seq: float, peak_flops: float,
                          bandwidth: float, batch: int = 1) -> float:
    """Roofline time of one decode step producing one token for each of ``batch`` sequences:
    max(2·N·B / peak, (W + B·KV) / bandwidth) — memory-bound at small B."""
    B = _count(batch, "the batch size")
    return roofline_time(forward_flops(params, B), decode_step_bytes(weight_bytes, kv_bytes_per_seq, B),
                         peak_flops, bandwidth)


def tp_decode_comm_time(layers: int, hidden: int, batch: int, tp: int, alpha: float | None, beta: float,
                        bytes_per_elem: float = 2) -> float:
    """Tensor-parallel all-reduce time per decoded token: 2 ring all-reduces of B·h elements per layer
    (Megatron-LM's g after attention and after the MLP): 2·L·ring_allreduce_time(B·h·bytes, t, α, β), or
    with ``alpha`` None, NCCL's own model of each inside an NVLink node at bus bandwidth 1/β
    (:func:`~distai.lessons.lesson1.formulas.nccl_ring_allreduce`: its LL protocol for small messages)."""
    L = _count(layers, "the number of layers")
    x = _count(batch, "the batch size") * _count(hidden, "the hidden size") * bytes_per_elem
    t = _count(tp, "the tensor-parallel degree")
    one = nccl_ring_allreduce(x, t, 1 / beta)["time_s"] if alpha is None else ring_allreduce_time(x, t, alpha, beta)
    return 2 * L * one
