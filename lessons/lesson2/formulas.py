"""Lesson 2 formulas: memory per GPU of data parallelism, ZeRO-1/2/3 and FSDP, and their traffic.

Sources:
- Rajbhandari, Rasley, Ruwase & He, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC 2020 — Sec. 3.1 (mixed-precision Adam keeps 2Ψ + 2Ψ + KΨ bytes, K = 12), Fig. 1
  (per-GPU memory of P_os, P_os+g, P_os+g+p) and Sec. 7 (communication volume 2Ψ vs 3Ψ).
- Zhao et al., "PyTorch FSDP", VLDB 2023 (FULL_SHARD = ZeRO-3's layout).
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023
  (arXiv:2205.05198), Sec. 4 and Table 2 (activation bytes per transformer layer).

Ψ (``params``) is the number of model parameters; N (``dp``) the data-parallel degree the model
states are sharded over (ZeRO's N_d). Shards are ⌈Ψ/N⌉ elements (flat buffers padded to a multiple of
N, as FSDP and the ZeRO implementations do), so the results are whole bytes. Pure Python.
"""
from __future__ import annotations

import math

from ..model_size import check_degrees
from ..units import LARGEST_COUNT

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
OPTIMIZERS = ("adam", "sgd", "sgd-nomomentum")
PRECISIONS = ("mixed", "fp32")
# bytes of each optimizer moment (Adam's momentum and variance, SGD's momentum): fp32 by default (ZeRO Sec. 3.1);
# DeepSeek-V3 kept AdamW's in BF16 (technical report, Sec. 3.3.3), the fp32 master copy beside them
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
RECOMPUTE = ("none", "selective", "full")


def _count(value, what: str, maximum: float = LARGEST_COUNT) -> int:
    """``value`` as a positive whole number no larger than ``maximum`` (a ValueError saying which, if not)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{what} must be a positive whole number, got {value!r}")
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive whole number, got {value!r}") from None
    if not math.isfinite(as_float) or as_float < 1 or as_float != int(as_float):
        raise ValueError(f"{what} must be a positive whole number, got {value!r}")
    if as_float > maximum:
        raise ValueError(f"{what} must be at most {maximum:.3g}, got {value!r}")
    return int(value) if isinstance(value, int) else int(as_float)


def check_tp_degree(tp, *, hidden=None, heads=None, kv_heads=None, seq=None,
                    sequence_parallel: bool = False) -> int:
    """A tensor-parallel degree t checked against a model's shape by the course's one shape check
    (:func:`distai.lessons.model_size.refusals`; Megatron-LM, Shoeybi et al. 2019, Sec. 3;
    Korthikanti et al. 2022, Sec. 4.2.2): t divides the hidden size h and the attention heads a; the KV
    heads H_kv split evenly over t, or t is a multiple of H_kv and each KV head is replicated on
    t / H_kv ranks (vLLM's way); with sequence parallelism t divides the sequence length s.
    Returns t; raises ValueError (a ShapeError) naming what t fails to divide. Shape values left out
    are not checked."""
    t = _count(tp, "the tensor-parallel degree")
    sizes = {name: _count(value, f"the {what}") if value is not None else None
             for name, value, what in (("hidden", hidden, "hidden size"), ("heads", heads, "attention heads"),
                                       ("kv_heads", kv_heads, "number of KV heads"),
                                       ("seq", seq, "sequence length"))}
    check_degrees(tp=t, sequence_parallel=sequence_parallel, **sizes)
    return t


def bytes_per_param(optimizer: str = "adam", precision: str = "mixed", moments: str = "fp32") -> dict[str, int]:
    """Bytes per parameter of each model state before sharding: {"params", "grads", "optimizer"}.

    precision="mixed" (ZeRO Sec. 3.1): fp16/bf16 parameters (2) and gradients (2); the optimizer keeps
    an fp32 master copy (4) plus its own state:
      - adam: momentum (4) + variance (4) → K = 12, the paper's value;
      - sgd (with momentum): momentum (4) → K = 8;
      - sgd-nomomentum: nothing → K = 4 (the master copy only).
    precision="fp32": parameters (4) and gradients (4) are already fp32, so there is no master copy:
      - adam: momentum + variance → 8; sgd (momentum) → 4; sgd-nomomentum → 0.
    (AdamW has Adam's state; pass "adam".) ``moments`` "bf16" keeps each moment in 2 bytes
    (:data:`MOMENT_BYTES`): mixed-precision Adam's K becomes 8, DeepSeek-V3's (Sec. 3.3.3).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    opt = "adam" if optimizer == "adamw" else optimizer
    if opt not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if moments not in MOMENT_BYTES:
        raise ValueError(f"unknown moment precision {moments!r}; choose one of {', '.join(MOMENT_BYTES)}")
    state = {"adam": 2, "sgd": 1, "sgd-nomomentum": 0}[opt] * MOMENT_BYTES[moments]
    if precision == "mixed":
        return {"params": 2, "grads": 2, "optimizer": 4 + state}
    return {"params": 4, "grads": 4, "optimizer": state}


def optimizer_state_parts(optimizer: str = "adam", precision: str = "mixed", moments: str = "fp32") -> dict[str, int]:
    """Where the optimizer's K bytes per parameter go (ZeRO Sec. 3.1): {"master", "momentum", "variance"}.

    Mixed precision keeps an fp32 master copy of the parameters (4); Adam keeps momentum and variance
    (4 each in fp32, 2 in ``moments`` "bf16"), SGD with momentum only the momentum, plain SGD nothing. In
    fp32 there is no master copy (the parameters are already fp32). The parts add up to :func:`optimizer_k`.
    """
    per = bytes_per_param(optimizer, precision, moments)  # validates the arguments
    opt = "adam" if optimizer == "adamw" else optimizer
    moment = MOMENT_BYTES[moments]
    parts = {
        "master": 4 if precision == "mixed" else 0,
        "momentum": moment if opt in ("adam", "sgd") else 0,
        "variance": moment if opt == "adam" else 0,
    }
    assert sum(parts.values()) == per["optimizer"]
    return parts


def optimizer_k(optimizer: str = "adam", precision: str = "mixed", moments: str = "fp32") -> int:
    """ZeRO's K: optimizer-state bytes per parameter (12 for mixed-precision Adam, ZeRO Sec. 3.1)."""
    return bytes_per_param(optimizer, precision, moments)["optimizer"]


def _sharded(elements: int, dp: int, sharded: bool) -> int:
    return -(-elements // dp) if sharded else elements


def model_state_bytes(params, dp: int = 1, strategy: str = "ddp", optimizer: str = "adam",
                      precision: str = "mixed", moments: str = "fp32") -> dict[str, int]:
    """Model-state bytes held by one GPU (ZeRO, Rajbhandari et al. 2020, Fig. 1 and Sec. 5):

    - ddp:   (2 + 2 + K)·Ψ            — everything replicated;
    - zero1: 2Ψ + 2Ψ + K·Ψ/N          — P_os, optimizer states sharded;
    - zero2: 2Ψ + (2 + K)·Ψ/N         — P_os+g, gradients sharded too;
    - zero3 / fsdp: (2 + 2 + K)·Ψ/N   — P_os+g+p, parameters sharded too (FSDP FULL_SHARD).
    (byte counts for mixed precision; see :func:`bytes_per_param` for fp32, SGD and BF16 ``moments``.)
    Returns {"params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes"}; a sharded state holds
    ⌈Ψ/N⌉ elements. Transient buffers (all-gathered layers, communication buckets) are not counted.
    """
    psi = _count(params, "the number of parameters", math.inf)
    n = _count(dp, "the data-parallel degree")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    per = bytes_per_param(optimizer, precision, moments)
    level = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}[strategy]
    out = {
        "params_bytes": per["params"] * _sharded(psi, n, level >= 3),
        "grads_bytes": per["grads"] * _sharded(psi, n, level >= 2),
        "optimizer_bytes": per["optimizer"] * _sharded(psi, n, level >= 1),
    }
    out["total_bytes"] = out["params_bytes"] + out["grads_bytes"] + out["optimizer_bytes"]
    return out


def max_params_that_fit(memory_bytes: float, dp: int = 1, strategy: str = "ddp", optimizer: str = "adam",
                        precision: str = "mixed", reserved_bytes: float = 0.0) -> int:
    """The largest Ψ whose model states (:func:`model_state_bytes`) fit in ``memory_bytes`` per GPU
    after ``reserved_bytes`` (activations, buffers) are set aside. Inverts ZeRO's Fig. 1 formulas.
    """
    n = _count(dp, "the data-parallel degree")
    free = memory_bytes - reserved_bytes
    if free <= 0:
        return 0
    per = bytes_per_param(optimizer, precision)
    level = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}.get(strategy)
    if level is None:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    coeff = (per["params"] / (n if level >= 3 else 1) + per["grads"] / (n if level >= 2 else 1)
             + per["optimizer"] / (n if level >= 1 else 1))
    guess = int(free / coeff) + 2
    # Walk down to the exact answer under ⌈Ψ/N⌉ rounding.
    while guess > 0 and model_state_bytes(guess, n, strategy, optimizer, precision)["total_bytes"] > free:
        guess -= 1
    return guess


def comm_volume_per_step(params, strategy: str = "ddp", dp: int | None = None,
                         bytes_per_elem: int = 2) -> dict:
    """Elements (and bytes) each GPU sends per training step (ZeRO Sec. 7.1-7.2).

    - ddp: all-reduce of the Ψ gradients = reduce-scatter (Ψ) + all-gather (Ψ): 2Ψ;
    - zero1 / zero2: reduce-scatter of gradients (Ψ) + all-gather of updated parameters (Ψ): 2Ψ;
    - zero3 / fsdp: all-gather of parameters in forward (Ψ) and again in backward (Ψ) +
      reduce-scatter of gradients (Ψ): 3Ψ, i.e. 1.5× DDP.
    The paper counts each collective of Ψ elements as Ψ (its ring sends (N-1)/N·Ψ); with ``dp`` given,
    ``exact_elements`` applies that (N-1)/N factor. ``bytes_per_elem`` = 2 for fp16/bf16 traffic.
    Returns {"elements", "bytes", "exact_elements", "exact_bytes", "collectives"}.
    """
    psi = _count(params, "the number of parameters", math.inf)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if strategy == "ddp":
        collectives = [("all_reduce", "gradients", 2)]
    elif strategy in ("zero1", "zero2"):
        collectives = [("reduce_scatter", "gradients", 1), ("all_gather", "parameters", 1)]
    else:
        collectives = [("all_gather", "parameters (forward)", 1), ("all_gather", "parameters (backward)", 1),
                       ("reduce_scatter", "gradients", 1)]
    units = sum(c[2] for c in collectives)
    elements = units * psi
    out = {"elements": elements, "bytes": elements * bytes_per_elem,
           "collectives": [{"op": op, "of": what, "elements": k * psi} for op, what, k in collectives]}
    if dp is not None:
        n = _count(dp, "the data-parallel degree")
        exact = elements * (n - 1) / n
        out["exact_elements"] = exact
        out["exact_bytes"] = exact * bytes_per_elem
    return out


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Activation bytes one transformer layer stores for backward, per GPU
    (Korthikanti et al. 2022, Sec. 4.1-4.3, Table 2; 16-bit activations, 1-byte dropout masks):

    - no parallelism:                        s·b·h·(34 + 5·a·s/h)
    - tensor parallel t, no SP:              s·b·h·(10 + 24/t + 5·a·s/(h·t))
    - tensor + sequence parallel:            s·b·h/t·(34 + 5·a·s/h)
    - selective recompute (no SP / with SP): s·b·h·(10 + 24/t)  /  s·b·h·34/t   (drops the 5as/h term)
    - full recompute:                        2·s·b·h (only the layer input is kept; with SP that input is
      sharded along the sequence, 2·s·b·h/t — the natural extension, not a row of Table 2).
    s = ``seq``, b = ``micro_batch``, h = ``hidden``, a = ``heads``, t = ``tp``.
    """
    s = _count(seq, "the sequence length")
    b = _count(micro_batch, "the micro-batch size")
    h = _count(hidden, "the hidden size")
    a = _count(heads, "the number of heads")
    t = check_tp_degree(tp, hidden=h, heads=a, seq=s, sequence_parallel=sequence_parallel)
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; choose one of {', '.join(RECOMPUTE)}")
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / t if sequence_parallel else 2 * sbh
    attn = 0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return sbh / t * (34 + attn)
    return sbh * (10 + 24 / t + attn / t)


def activation_bytes(layers: int, seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                     sequence_parallel: bool = False, recompute: str = "none") -> float:
    """:func:`activation_bytes_per_layer` × ``layers`` (Korthikanti et al. 2022, Sec. 4.3: the
    transformer layers dominate; embeddings and the output layer are left out)."""
    L = _count(layers, "the number of layers")
    return L * activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp, sequence_parallel, recompute)


def memory_per_gpu(params, dp: int = 1, strategy: str = "ddp", optimizer: str = "adam",
                   precision: str = "mixed", layers: int | None = None, hidden: int | None = None,
                   seq: int | None = None, micro_batch: int | None = None, heads: int | None = None,
                   tp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
                   moments: str = "fp32") -> dict:
    """Model states (:func:`model_state_bytes`) plus, when the shape is given, activations
    (:func:`activation_bytes`). With tensor parallelism of degree ``tp`` each GPU first holds ⌈Ψ/t⌉ of
    the parameters (Megatron splits every weight matrix and the embedding t ways; layer norms, in fact
    replicated, are divided too: a slight underestimate), which its data-parallel group then shards as ZeRO does.
    Keys: params_bytes, grads_bytes, optimizer_bytes, activations_bytes (None without a shape),
    total_bytes.
    """
    psi = _count(params, "the number of parameters", math.inf)
    t = _count(tp, "the tensor-parallel degree")
    out: dict = dict(model_state_bytes(-(-psi // t), dp, strategy, optimizer, precision, moments))
    if layers is not None and hidden is not None and seq is not None and micro_batch is not None \
            and heads is not None:
        act = activation_bytes(layers, seq, micro_batch, hidden, heads, tp, sequence_parallel, recompute)
        out["activations_bytes"] = act
        out["total_bytes"] = out["total_bytes"] + act
    elif any(v is not None for v in (layers, hidden, seq, micro_batch, heads)):
        raise ValueError("activations need all of layers, hidden, seq, micro_batch and heads")
    else:
        out["activations_bytes"] = None
    return out
