"""Every number the Mixture-of-Experts lesson quotes, with its source.

* Parameters of a decoder with MoE blocks: the Llama/Mixtral shape (RMSNorm, SwiGLU experts of
  three matrices, grouped-query attention, no biases, an untied head). Mixtral 8x7B (Jiang et al.
  2024, "Mixtral of Experts", arXiv:2401.04088; Mistral AI's announcement, Dec. 2023): 32 layers,
  h = 4096, FFN 14336, 8 experts, top-2, vocabulary 32000, 32 heads, 8 KV heads → 46.7B total,
  12.9B active per token. Mixtral 8x22B (Mistral AI's announcement, Apr. 2024; the model's
  config.json): 56 layers, h = 6144, FFN 16384, 8 experts, top-2, vocabulary 32768, 48 heads, 8 KV
  heads → 141B total, 39B active. DBRX (Databricks' announcement, Mar. 2024; config.json): 40
  layers, h = 6144, FFN 10752, 16 experts, top-4, vocabulary 100352, 48 heads, 8 KV heads, norms
  without biases → 132B total, 36B active.
* Capacity ``C = ceil(c·T·k/E)`` (GShard, Lepikhin et al. 2021; Switch Transformer, Fedus et al.
  2022, eq. 3 with ``k = 1``).
* Switch's load-balancing loss ``α·E·Σ_i f_i·P_i`` (Fedus et al. 2022, eq. 4-6): ``α = 0.01``;
  it is ``α`` for a perfectly uniform router and ``α·E`` when every token goes to one expert.
* Activations an MoE layer's MLP stores for the backward, per token and expert it reaches (its top-k
  and any shared experts): the expert's input (2h bytes; over t with sequence parallelism) and, over t,
  its first GEMM's output (gate and up, 2f elements) and its second GEMM's input (f elements) in 16
  bits: 2h + 6f/t bytes (Megatron-LM's SwiGLU, which keeps fc1's output and recomputes SiLU). It
  replaces Korthikanti et al. 2022's 4h GeLU MLP (2h + 16h/t of the layer's 34·s·b·h). The router's
  E probabilities per token are left out (E·4 bytes against thousands).
* The all-to-all in the α-β model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, pairwise
  exchange): ``(N−1)·α + bytes sent·β``.
"""
from __future__ import annotations

import math

from ..model_size import check_degrees

FLOAT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
COUNT_BYTES = 8  # the routing counts travel as int64
#: the run's defaults (`distai run experts`): Mixtral's 8 experts, top-2, GShard's capacity factor 1.25
RUN_EXPERTS, RUN_TOP_K, RUN_CAPACITY_FACTOR = 8, 2, 1.25
#: published shapes: (name, layers, hidden, ffn, vocabulary, heads, KV heads, experts, top-k)
MIXTRAL_8X7B = ("Mixtral 8x7B", 32, 4096, 14336, 32000, 32, 8, 8, 2)
MIXTRAL_8X22B = ("Mixtral 8x22B", 56, 6144, 16384, 32768, 48, 8, 8, 2)
DBRX = ("DBRX", 40, 6144, 10752, 100352, 48, 8, 16, 4)


# ----------------------------------------------------------------------------------------------
# Activations
# ----------------------------------------------------------------------------------------------

def expert_mlp_activation_bytes(tokens: float, hidden: int, ffn: int, experts_per_token: int, tp: int = 1,
                                sequence_parallel: bool = False) -> float:
    """Bytes one MoE layer's MLP stores for the backward on one GPU (see the module's sources): each of
    ``tokens`` at each of its ``experts_per_token`` experts (top-k plus shared), 2h + 6f/t, its input over
    t too with ``sequence_parallel``."""
    t = max(1, tp)
    return tokens * experts_per_token * (2 * hidden / (t if sequence_parallel else 1) + 6 * ffn / t)


def dense_mlp_activation_bytes(tokens: float, hidden: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """What Korthikanti et al. 2022's count gives a layer's 4h GeLU MLP (its dropout mask apart): the
    input, 2h (over t with sequence parallelism), and the GeLU's input and output, 16h/t bytes per token:
    what :func:`expert_mlp_activation_bytes` replaces in an MoE layer."""
    t = max(1, tp)
    return tokens * (2 * hidden / (t if sequence_parallel else 1) + 16 * hidden / t)


# ----------------------------------------------------------------------------------------------
# Parameters: total and active
# ----------------------------------------------------------------------------------------------

def expert_params(hidden: int, ffn: int, gated: bool = True, bias: bool = False) -> int:
    """One expert: a SwiGLU MLP (gate, up, down: 3·h·f) or a GeLU one (2·h·f), with biases."""
    matrices = (3 if gated else 2) * hidden * ffn
    return matrices + (((2 if gated else 1) * ffn + hidden) if bias else 0)


def attention_params(hidden: int, heads: int, kv_heads: int, bias: bool = False) -> int:
    """W_q and W_o (h·h each), W_k and W_v (h·kv each, kv = kv_heads·h/heads)."""
    kv = kv_heads * (hidden // heads)
    return 2 * hidden * hidden + 2 * hidden * kv + ((2 * hidden + kv) if bias else 0)


def moe_model_params(layers: int, hidden: int, ffn: int, experts: int, top_k: int, vocab: int, heads: int,
                     kv_heads: int, shared_experts: int = 0, gated: bool = True, bias: bool = False,
                     tied: bool = False) -> dict[str, int]:
    """``total_params`` (every expert) and ``active_params`` (what one token uses: attention,
    router, its ``top_k`` experts and the shared ones), Mixtral's shape by default."""
    expert = expert_params(hidden, ffn, gated, bias)
    norms = 2 * hidden  # two RMSNorms per block
    dense = attention_params(hidden, heads, kv_heads, bias) + hidden * experts + norms
    embeddings = vocab * hidden * (1 if tied else 2) + hidden  # + the final norm
    total = layers * (dense + (experts + shared_experts) * expert) + embeddings
    active = layers * (dense + (top_k + shared_experts) * expert) + embeddings
    return {"total_params": total, "active_params": active, "expert_params": layers * experts * expert}


def active_fraction(layers: int, hidden: int, ffn: int, experts: int, top_k: int, vocab: int, heads: int,
                    kv_heads: int) -> float:
    """Active over total parameters: roughly the FLOPs per token of the MoE over the FLOPs of a
    dense model of its size."""
    p = moe_model_params(layers, hidden, ffn, experts, top_k, vocab, heads, kv_heads)
    return p["active_params"] / p["total_params"]


# ----------------------------------------------------------------------------------------------
# Capacity, drops and balance
# ----------------------------------------------------------------------------------------------

def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Tokens one expert takes: ``ceil(c·T·k/E)``."""
    return math.ceil(capacity_factor * tokens * top_k / experts)


#: the widest window :func:`expected_drop_rate` sums term by term (σ about 5000 choices); beyond it the
#: binomial load is its normal limit to far better than the rate's printed digits
_EXACT_DROP_TERMS = 200_000


def _normal_excess(mean: float, sigma: float, c: float) -> float:
    """E[(X − c)⁺] for X ~ Normal(mean, sigma²): (μ − c)·Φ((μ − c)/σ) + σ·φ((μ − c)/σ)."""
    z = (mean - c) / sigma
    return (mean - c) * 0.5 * math.erfc(-z / math.sqrt(2)) + sigma * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def expected_drop_rate(tokens: int, experts: int, top_k: int, capacity_factor: float) -> float:
    """The fraction of the ``T·k`` routing choices dropped when each token picks ``k`` different experts
    uniformly at random (a random k-subset, as a top-k router does): each expert is among a token's
    choices with probability k/E, independently across tokens, so its load is Binomial(T, k/E), and it
    drops what exceeds ``C``. (Binomial(T·k, 1/E) would let a token pick one expert twice.)"""
    n, p, c = tokens, top_k / experts, capacity(tokens, experts, top_k, capacity_factor)
    over = 0.0
    # loads more than 40 standard deviations from the mean have a probability below e^-800, a double's 0:
    # summing inside that window is exact and takes O(√n) terms, not O(n)
    mean, spread = n * p, 40 * math.sqrt(n * p * (1 - p)) + 1
    if spread > _EXACT_DROP_TERMS:  # 10¹¹ tokens took seconds, 9·10¹⁵ never ended: the normal limit instead
        return experts * _normal_excess(mean, math.sqrt(n * p * (1 - p)), c) / (tokens * top_k)
    for load in range(max(c + 1, math.floor(mean - spread)), min(n, math.ceil(mean + spread)) + 1):
        log_pmf = (math.lgamma(n + 1) - math.lgamma(load + 1) - math.lgamma(n - load + 1)
                   + load * math.log(p) + (n - load) * math.log1p(-p))
        over += (load - c) * math.exp(log_pmf)
    return experts * over / (tokens * top_k)


def switch_aux_loss(fractions: list[float], probs: list[float], alpha: float = 0.01) -> float:
    """``α·E·Σ f_i·P_i``: ``f_i`` the fraction of choices that picked expert i, ``P_i`` its mean
    router probability."""
    return alpha * len(fractions) * sum(f * p for f, p in zip(fractions, probs))


def imbalance_step_time(loads: list[int]) -> float:
    """How much longer the layer takes than with a perfect balance: the busiest expert over the
    mean (every expert waits for the slowest)."""
    return max(loads) / (sum(loads) / len(loads))


# ----------------------------------------------------------------------------------------------
# Expert parallelism: memory and the all-to-alls
# ----------------------------------------------------------------------------------------------

def experts_per_rank(experts: int, ep: int) -> int:
    check_degrees(ep=ep, experts=experts)  # the course's one shape check
    return experts // ep


def expert_bytes_per_rank(layers: int, experts: int, ep: int, params_per_expert: int, elem_size: int) -> int:
    """The expert weights one rank holds: ``E/ep`` experts of every MoE layer."""
    return layers * experts_per_rank(experts, ep) * params_per_expert * elem_size


def all_to_all_calls_per_layer(dropless: bool = True) -> dict[str, int]:
    """All-to-alls one MoE layer runs per training step: forward, the counts (and, under a
    capacity limit, each owner's answer of how many it keeps), the dispatch and the combine;
    backward, the combine's and the dispatch's reverses."""
    return {"fwd": 3 if dropless else 4, "bwd": 2}


def token_all_to_all_bytes(sent_rows: int, received_rows: int, hidden: int, elem_size: int) -> int:
    """Bytes one rank sends in one direction of a layer (forward or backward): the rows it
    dispatches to other ranks and the rows of other ranks it sends back (combine)."""
    return (sent_rows + received_rows) * hidden * elem_size


def count_all_to_all_bytes(ep: int, top_k: int, local_experts: int) -> int:
    """Bytes one rank sends in one counts exchange: an int64 per (choice, expert) of every other rank."""
    return (ep - 1) * top_k * local_experts * COUNT_BYTES


def dispatch_bytes_per_layer(tokens_per_rank: int, hidden: int, top_k: int, ep: int, elem_size: int) -> float:
    """Expected bytes one rank sends per layer in one direction under uniform routing: of its
    ``T·k`` choices ``(ep−1)/ep`` leave for other ranks, dispatched there and combined back."""
    return 2 * tokens_per_rank * top_k * (ep - 1) / ep * hidden * elem_size


def all_to_all_time(sent_bytes: float, ep: int, alpha: float, beta: float) -> float:
    """One all-to-all among ``ep`` ranks (pairwise exchange): ``(ep−1)·α + bytes·β``."""
    return (ep - 1) * alpha + sent_bytes * beta


def top_k_gates(probs: list[float], k: int) -> list[float]:
    """The gates of a token's ``k`` largest router probabilities: the probability itself for
    ``k = 1`` (Switch), renormalised to sum to 1 for ``k > 1`` (GShard, Mixtral)."""
    top = sorted(probs, reverse=True)[:k]
    return top if k == 1 else [p / sum(top) for p in top]
