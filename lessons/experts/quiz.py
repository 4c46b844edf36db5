"""Mixture-of-Experts quiz: parameters, capacity and drops, balance, expert parallelism's memory
and all-to-alls. Answers from :mod:`.formulas`; texts in ``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build
from . import formulas as f

SHAPE = ("name", "layers", "hidden", "ffn", "vocab", "heads", "kv_heads", "experts", "top_k")
#: published MoE models the lesson's parameter count reproduces (sources in formulas.py's docstring)
SHAPES = [f.MIXTRAL_8X7B, f.MIXTRAL_8X22B, f.DBRX]
EXPERTS = [8, 16, 32, 64]


def _worked(hidden: int = 1, ffn: int = 1, layers: int = 1, experts: int = 1, top_k: int = 1,
            tokens: int = 1, ep: int = 1) -> dict:
    """The intermediate numbers the explanations show."""
    expert = f.expert_params(hidden, ffn)
    return {"expert": expert, "share": tokens * top_k / experts, "leaving": tokens * top_k * (ep - 1) / ep,
            # the expert parameters a GPU holds (1 byte each); only where the question has experts to split
            "held": f.expert_bytes_per_rank(layers, experts, ep, expert, 1) if experts % ep == 0 else None}


def _params(key: str):
    return lambda layers, hidden, ffn, experts, top_k, vocab, heads, kv_heads: \
        f.moe_model_params(layers, hidden, ffn, experts, top_k, vocab, heads, kv_heads)[key]


GENERATORS = build("experts", __package__, values=_worked, kinds=[
    Numeric("total-params", draw={SHAPE: SHAPES},
            answer=_params("total_params"), quantity="count", unit="B",
            wrong={"active only": _params("active_params")}),
    Numeric("active-params", draw={SHAPE: SHAPES},
            answer=_params("active_params"), quantity="count", unit="B",
            wrong={"every expert": _params("total_params")}),
    Numeric("capacity", draw={"tokens": [1024, 2048, 4096, 8192], "experts": EXPERTS, "top_k": [1, 2],
                              "capacity_factor": [1.0, 1.25, 1.5, 2.0]},
            answer=f.capacity, quantity="count", integer=True),
    Numeric("drop-rate", draw={"tokens": [32, 64, 128], "experts": [4, 8], "top_k": [1, 2],
                               "capacity_factor": [1.0, 1.25]},
            answer=f.expected_drop_rate, quantity="fraction", unit="%"),
    Numeric("aux-loss", draw={"hot": [0.4, 0.5, 0.75], "experts": [4, 8, 16], "alpha": 0.01},
            values=lambda hot, experts: {"rest": (1 - hot) / (experts - 1), "others": experts - 1},  # their f_i = P_i
            answer=lambda hot, experts, alpha: f.switch_aux_loss(
                [hot] + [(1 - hot) / (experts - 1)] * (experts - 1),
                [hot] + [(1 - hot) / (experts - 1)] * (experts - 1), alpha)),
    Numeric("experts-per-gpu", draw={"experts": [16, 32, 64, 128, 256], "ep": [4, 8, 16]},
            answer=f.experts_per_rank, quantity="count", integer=True),
    Numeric("expert-memory", draw={SHAPE: SHAPES, "ep": [2, 4, 8], "elem_size": 2},
            answer=lambda layers, experts, ep, hidden, ffn, elem_size: f.expert_bytes_per_rank(
                layers, experts, ep, f.expert_params(hidden, ffn), elem_size),
            quantity="bytes", unit="GB"),
    Numeric("a2a-bytes", draw={"tokens": [2048, 4096, 8192], "hidden": [4096, 6144, 7168], "top_k": [1, 2, 8],
                               "ep": [2, 4, 8, 16], "elem_size": 2},
            answer=lambda tokens, hidden, top_k, ep, elem_size: f.dispatch_bytes_per_layer(
                tokens, hidden, top_k, ep, elem_size),
            quantity="bytes", unit="MB",
            wrong={"every choice leaves": lambda tokens, hidden, top_k, ep, elem_size: 2 * tokens * top_k * hidden
                   * elem_size}),
    Numeric("hot-expert", draw={"hot": [20, 30, 40, 50], "experts": [8, 16]},  # the hot one is the busiest
            answer=lambda hot, experts: f.imbalance_step_time([hot] + [(100 - hot) / (experts - 1)] * (experts - 1))),
    Choice("gradient-path"),
    Choice("where-ep"),
    Choice("dropped-token"),
])
