"""Lesson 9 formulas: long context, context parallelism and ring attention.

Sources:
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  arXiv:2205.05198, Sec. 4 and Table 2: activations per layer ``s·b·h·(34 + 5·a·s/h)`` bytes
  (16-bit, with dropout masks); the ``5·a·s/h`` term is the attention scores, softmax and dropout.
- Dao et al., "FlashAttention", NeurIPS 2022: the scores are never stored (recomputed tile by tile
  in the backward from the row statistics), which removes the ``5·a·s/h`` term.
- Milakov & Gimelshein, "Online normalizer calculation for softmax", arXiv:1805.02867, 2018: the
  running maximum and sum that merge partial softmaxes exactly.
- Liu, Zaharia & Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
  arXiv:2310.01889, 2023: the K/V ring; compute hides the transfer once each block is large enough.
- Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, 2024, Sec. 3.3.2 and
  Table 4: context parallelism by all-gathering K/V (with GQA, 8 K/V heads for 128 query heads),
  the load-balanced 2·CP chunk layout, and the long-context stage of Llama 3 405B: 131,072-token
  sequences on 16,384 H100s as TP 8 × CP 16 × PP 16 × DP 8 at 380 TFLOP/s per GPU.
- Ring and all-gather costs in the alpha-beta model: :mod:`distai.lessons.lesson1.formulas`.

The engine's own activation count (:func:`model_activation_bytes_per_layer`) is what the course's
GPT (``engine/model.py``) saves for backward, checked against the measurement of a real run.
Sizes are in bytes, times in seconds. Pure Python.
"""
from __future__ import annotations

import math

from ..lesson2.formulas import _count
from ..model_size import check_degrees
from . import ring_schedule as plan

# Llama 3 405B (Llama 3 paper, Table 3) and its long-context stage (Sec. 3.3.2, Table 4)
LLAMA3_405B = {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256}
LLAMA3_LONG = {"seq": 131072, "tp": 8, "cp": 16, "pp": 16, "dp": 8, "gpus": 16384, "tflops": 380}


def _cp_degree(cp: int, seq: int) -> int:
    c = _count(cp, "the context-parallel size")
    check_degrees(cp=c, seq=seq)  # the course's one shape check
    return c


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, cp: int = 1, tp: int = 1,
                               flash: bool = False, elem_bytes: float = 2) -> float:
    """Activation bytes one transformer layer stores per GPU (Korthikanti Table 2 with tensor and
    sequence parallelism of degree ``tp``), each GPU holding ``seq/cp`` tokens:
    ``(s/cp)·b·h/t·(34 + 5·a·s/h)``. Each GPU's queries still meet all ``s`` keys, so the score
    term keeps one full ``s``. ``flash``: the scores are never stored, ``(s/cp)·b·h·34/t``.
    Korthikanti counts 16-bit activations and 1-byte dropout masks: 34 = 16 values × 2 B + 2 masks, and
    5 = 2 score tensors × 2 B + 1 mask; ``elem_bytes`` e gives ``16e + 2`` and ``2e + 1`` (66 and 9 in fp32)."""
    s = _count(seq, "the sequence length")
    b = _count(micro_batch, "the micro-batch size")
    h = _count(hidden, "the hidden size")
    a = _count(heads, "the number of heads")
    c = _cp_degree(cp, s)
    t = _count(tp, "the tensor-parallel size")
    e = elem_bytes
    scores = 0.0 if flash else (2 * e + 1) * a * s / h
    return s / c * b * h / t * (16 * e + 2 + scores)


def activation_bytes_per_gpu(layers: int, seq: int, micro_batch: int, hidden: int, heads: int, cp: int = 1,
                             tp: int = 1, pp: int = 1, flash: bool = False, elem_bytes: float = 2) -> float:
    """The activations of one GPU's ``layers/pp`` layers for one micro-batch (Korthikanti's count)."""
    per_stage = math.ceil(_count(layers, "the number of layers") / _count(pp, "the pipeline size"))
    return per_stage * activation_bytes_per_layer(seq, micro_batch, hidden, heads, cp, tp, flash, elem_bytes)


def score_bytes(seq: int, micro_batch: int, heads: int, cp: int = 1, tp: int = 1, elem_bytes: float = 2) -> float:
    """The softmax probabilities of one layer per GPU: ``b·(a/t)·(s/cp)·s`` scores."""
    s = _count(seq, "the sequence length")
    return _count(micro_batch, "the micro-batch size") * heads / tp * s / _cp_degree(cp, s) * s * elem_bytes


def kv_block_bytes(seq: int, micro_batch: int, kv_heads: int, head_dim: int, cp: int, elem_bytes: float = 2,
                   tp: int = 1) -> float:
    """One rank's K and V for one layer: ``2·b·(s/cp)·(g/t)·d`` elements, what one ring hop carries."""
    s = _count(seq, "the sequence length")
    g = _count(kv_heads, "the number of K/V heads")
    return 2 * _count(micro_batch, "the micro-batch size") * s / _cp_degree(cp, s) * max(1, g // tp) * \
        _count(head_dim, "the head dimension") * elem_bytes


def cp_step_traffic(cp: int, step: int, phase: str, variant: str = "ring", block_bytes: float = 1.0) -> dict:
    """Messages one rank sends, and their bytes, at ring step ``step`` of one layer's attention.

    Ring: each forward step but the last passes the K/V block one hop on; each backward step
    passes it too, and then the gradient of the block it just used, one hop behind (the last
    backward step's goes home). All-gather (Llama 3's forward; its backward, not in the paper, the
    all-gather's adjoint): the forward's all-gather at step 0; in the backward an all-gather at step 0
    and the reduce-scatter of the K/V gradients after the last, each ``(cp − 1)/cp`` of the ``cp`` blocks.
    """
    c = _count(cp, "the context-parallel size")
    if phase not in ("fwd", "bwd") or variant not in plan.VARIANTS or not 0 <= step < c:
        raise ValueError(f"no step {step} of phase {phase!r} in the {variant!r} variant with cp = {c}")
    if c == 1:
        return {"messages": 0, "bytes": 0.0}
    if variant == "ring":
        messages = (1 if step < c - 1 else 0) + (1 if phase == "bwd" else 0)
        return {"messages": messages, "bytes": messages * block_bytes}
    messages = (1 if step == 0 else 0) + (1 if phase == "bwd" and step == c - 1 else 0)
    return {"messages": messages, "bytes": messages * (c - 1) * block_bytes}


def cp_comm_per_layer(seq: int, micro_batch: int, kv_heads: int, head_dim: int, cp: int, variant: str = "ring",
                      elem_bytes: float = 2, tp: int = 1) -> dict:
    """What one rank sends per layer for attention under context parallelism (the sum of
    :func:`cp_step_traffic` over the steps): ring, ``cp − 1`` K/V hops forward, ``cp − 1`` K/V
    hops and ``cp`` gradient hops backward; all-gather, ``(cp − 1)`` blocks in one all-gather
    forward, twice that (an all-gather and a reduce-scatter) backward. Returns the block's
    bytes, the messages and bytes per rank in each direction, and the total.
    """
    block = kv_block_bytes(seq, micro_batch, kv_heads, head_dim, cp, elem_bytes, tp)
    c = _cp_degree(cp, seq)
    out: dict = {"block_bytes": block}
    for phase, name in (("fwd", "forward"), ("bwd", "backward")):
        steps = [cp_step_traffic(c, t, phase, variant, block) for t in range(c)]
        out[f"{name}_messages"] = sum(x["messages"] for x in steps)
        out[f"{name}_bytes_per_rank"] = sum(x["bytes"] for x in steps)
    out["total_bytes_per_rank"] = out["forward_bytes_per_rank"] + out["backward_bytes_per_rank"]
    return out


def ring_step_flops(seq: int, micro_batch: int, hidden: int, cp: int, tp: int = 1) -> float:
    """Forward attention FLOPs of one ring step on one rank, load-balanced: ``QKᵀ`` and ``PV`` over
    half of an ``(s/cp) × (s/cp)`` block, ``2 · 2·b·(s/cp)²·(h/t) / 2 = 2·b·(s/cp)²·h/t``."""
    s = _count(seq, "the sequence length")
    n = s / _cp_degree(cp, s)
    return 2 * _count(micro_batch, "the micro-batch size") * n * n * _count(hidden, "the hidden size") / tp


def ring_overlap(seq: int, micro_batch: int, hidden: int, kv_heads: int, head_dim: int, cp: int, flops: float,
                 alpha: float, beta: float, elem_bytes: float = 2, tp: int = 1) -> dict:
    """Does a ring hop hide behind one step's attention? compute ``ring_step_flops / flops`` vs
    the hop ``α + block·β``; ``min_tokens``: the shortest whole shard ``s/cp`` that hides it
    (``2·b·n²·h/t/F ≥ α + 2·b·n·(g/t)·d·e·β``, solved for ``n`` and rounded up: one token fewer does not)."""
    compute = ring_step_flops(seq, micro_batch, hidden, cp, tp) / flops
    block = kv_block_bytes(seq, micro_batch, kv_heads, head_dim, cp, elem_bytes, tp)
    hop = alpha + block * beta
    b, g = micro_batch, max(1, kv_heads // tp)
    quad, lin = 2 * b * hidden / tp / flops, 2 * b * g * head_dim * elem_bytes * beta
    min_tokens = math.ceil((lin + math.sqrt(lin * lin + 4 * quad * alpha)) / (2 * quad))
    return {"compute_s": compute, "hop_s": hop, "hidden": compute >= hop, "min_tokens": min_tokens,
            "shard_tokens": seq / cp}


def online_softmax_merge(m1: float, l1: float, o1: float, m2: float, l2: float, o2: float) -> dict:
    """Merge two partial softmax results of one query row: running maxima ``m``, sums
    ``l = Σ exp(score − m)`` and unnormalised outputs ``o = Σ exp(score − m)·v``.
    ``m = max(m1, m2)``, ``l = l1·e^(m1−m) + l2·e^(m2−m)``, likewise ``o``; the output is ``o/l``."""
    m = max(m1, m2)
    w1, w2 = math.exp(m1 - m), math.exp(m2 - m)
    l, o = l1 * w1 + l2 * w2, o1 * w1 + o2 * w2
    return {"m": m, "l": l, "o": o, "out": o / l, "lse": m + math.log(l)}


def partial_softmax(scores: list[float], values: list[float]) -> dict:
    """One block's partial result for one query row: ``m``, ``l`` and ``o`` of its scores."""
    m = max(scores)
    weights = [math.exp(x - m) for x in scores]
    return {"m": m, "l": sum(weights), "o": sum(w * v for w, v in zip(weights, values))}


def idle_fraction(cp: int, layout: str = "contiguous", seq: int | None = None) -> float:
    """The share of the ranks' time a causal ring spends waiting (each step lasts as long as its busiest
    rank), counting the exact causal pairs of every tile. ``seq`` defaults to a long one (chunks of
    4096 tokens), where a diagonal tile is half a tile and the contiguous layout's share is
    ``(cp−1)/(2cp−1)`` to four digits (3/7 at cp = 4; one half as cp grows); short chunks' diagonal
    tiles are a little over half full, and their share a little lower (42.5% for s = 64, cp = 4)."""
    c = _count(cp, "the context-parallel size")
    return plan.idle_fraction(seq if seq is not None else 2 * c * 4096, c, layout)


def model_activation_bytes_per_layer(tokens: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                                     elem_bytes: float, rope: bool = False, seq: int | None = None,
                                     batch: int = 1) -> float:
    """What one block of the course's GPT (LayerNorm, GeLU) saves for backward for ``tokens``
    tokens on a rank, counted tensor by tensor (in ``elem_bytes`` per number): per token, the two
    norms' inputs and outputs (``4h``) and their mean and 1/std (4), ``q`` (``h``), the MLP's two
    ``ffn``-wide tensors, the attention output entering W_o (``h``), with ``rope`` the cosines and
    sines of the rotations of q and k (``2·d``). A ring (or flash) core adds ``k`` and ``v``
    (``2·kv_heads·d``) and one log-sum-exp per head. ``seq``: a core on one process that forms the
    probabilities instead (``engine.model.attend``, whose softmax keeps only its output): the K/V
    expanded to every head (``2h``) and ``batch·heads·seq²`` probabilities."""
    d = hidden // heads
    per_token = 4 * hidden + 4 + hidden + hidden + 2 * ffn + (2 * d if rope else 0)
    if seq is None:
        return tokens * (per_token + 2 * kv_heads * d + heads) * elem_bytes
    return tokens * (per_token + 2 * hidden) * elem_bytes + batch * heads * seq * seq * elem_bytes


def llama3_long_context(dtype_bytes: float = 2) -> dict:
    """Llama 3 405B's 128K stage, per GPU: the layers and tokens each GPU holds, its activations
    per micro-batch with and without CP (flash attention), and the GPUs the layout uses."""
    m, r = LLAMA3_405B, LLAMA3_LONG
    with_cp = activation_bytes_per_gpu(m["layers"], r["seq"], 1, m["hidden"], m["heads"], r["cp"], r["tp"], r["pp"],
                                       flash=True)
    without = activation_bytes_per_gpu(m["layers"], r["seq"], 1, m["hidden"], m["heads"], 1, r["tp"], r["pp"],
                                       flash=True)
    return {"gpus": r["tp"] * r["cp"] * r["pp"] * r["dp"], "tokens_per_gpu": r["seq"] // r["cp"],
            "layers_per_gpu": math.ceil(m["layers"] / r["pp"]), "with_cp_bytes": with_cp,
            "without_cp_bytes": without}


def two_block_example(score_a: float, value_a: float, score_b: float, value_b: float, score_c: float,
                      value_c: float) -> dict:
    """The text's worked merge: one query row whose first block holds keys a and b and whose second
    holds key c (scalar values). The partial results (``m1 l1 o1``, ``m2 l2 o2``), the merged ``m``,
    ``l``, ``o`` and output, and the output of one softmax over all three keys (``direct``)."""
    first = partial_softmax([score_a, score_b], [value_a, value_b])
    second = partial_softmax([score_c], [value_c])
    merged = online_softmax_merge(first["m"], first["l"], first["o"], second["m"], second["l"], second["o"])
    scores, values = (score_a, score_b, score_c), (value_a, value_b, value_c)
    weights = [math.exp(x) for x in scores]
    direct = sum(w * v for w, v in zip(weights, values)) / sum(weights)
    return {"m1": first["m"], "l1": first["l"], "o1": first["o"], "m2": second["m"], "l2": second["l"],
            "o2": second["o"], **merged, "direct": direct}


def example_row(seq: int) -> tuple[list[float], list[float]]:
    """Scores and scalar values of one query row against ``seq`` keys, for the visualizer's row
    panel: deterministic, varied, with the maximum somewhere in the middle."""
    scores = [round(2.0 * math.sin(0.9 * k) - 3.0 * k / seq, 3) for k in range(seq)]
    values = [round(math.cos(0.5 * k), 3) for k in range(seq)]
    return scores, values


def row_trace(seq: int, cp: int, layout: str, position: int | None = None) -> list[dict]:
    """The running ``m``, ``l`` and output of the query at ``position`` (default the last token)
    after each ring step of the forward, merging the keys its rank meets at that step (the
    causal ones). The last entry equals one softmax over all earlier keys (``direct``)."""
    plan.check_layout(seq, cp, layout)
    pos = seq - 1 if position is None else position
    rank = next(r for r in range(cp) if pos in plan.positions(r, seq, cp, layout))
    scores, values = example_row(seq)
    m, l, o = -math.inf, 0.0, 0.0
    out = []
    for step in range(cp):
        keys = [k for k in plan.positions(plan.owner(rank, step, cp), seq, cp, layout) if k <= pos]
        if keys:
            part = partial_softmax([scores[k] for k in keys], [values[k] for k in keys])
            if m == -math.inf:
                m, l, o = part["m"], part["l"], part["o"]
            else:
                merged = online_softmax_merge(m, l, o, part["m"], part["l"], part["o"])
                m, l, o = merged["m"], merged["l"], merged["o"]
        out.append({"step": step, "rank": rank, "keys": len(keys), "m": m, "l": l,
                    "out": o / l if l else None})
    weights = [math.exp(scores[k]) for k in range(pos + 1)]
    out[-1]["direct"] = sum(w * values[k] for k, w in enumerate(weights)) / sum(weights)
    return out
