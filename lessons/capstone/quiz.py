"""Capstone quiz: the device mesh, its groups and what each dimension costs. Answers from
:mod:`.formulas` and lesson 5's bubble; texts in ``quiz.toml``."""
from __future__ import annotations

from ..lesson5.formulas import bubble_fraction
from ..quiz import Choice, Numeric, build
from . import formulas as f

DEGREES = [2, 4, 8]
STAGES = [2, 4, 8, 16]
MESH = {"pp": STAGES, "dp": DEGREES, "tp": DEGREES}
# published models: (name, parameters, hidden size) — GPT-3 175B, Llama 3 70B and 405B
MODELS = [("GPT-3 175B", 175e9, 12288), ("Llama 3 70B", 70e9, 8192), ("Llama 3 405B", 405e9, 16384)]
MODEL = ("model", "params", "hidden")


def _worked(pp: int = 1, dp: int = 1, tp: int = 1, rank: int = 0, global_batch: int = 1, micro_batch: int = 1,
            params: float = 1.0) -> dict:
    """The intermediate numbers the explanations show."""
    return {"world": pp * dp * tp, "dt": dp * tp, "ptp": pp * tp, "rank_div_t": rank // tp,
            "m": global_batch // (dp * micro_batch) if global_batch % (dp * micro_batch) == 0 else 0,
            "p1": pp - 1, "dpmb": dp * micro_batch, "shards": pp * tp}


def _bubble(pp: int, dp: int, global_batch: int, micro_batch: int) -> float:
    return bubble_fraction(pp, f.microbatches_per_replica(global_batch, dp, micro_batch))


def _nodes(pp: int, dp: int, tp: int) -> dict:
    return {"dp_nodes": f.nodes_spanned("dp", pp, dp, tp, 8), "pp_nodes": f.nodes_spanned("pp", pp, dp, tp, 8)}


GENERATORS = build("capstone", __package__, values=_worked, kinds=[
    Numeric("world-size", draw=MESH, answer=f.world_size, integer=True),
    Numeric("coordinate", draw={**MESH, "rank": lambda pp, dp, tp: range(pp * dp * tp), "dim": ["pp", "dp", "tp"]},
            variant="dim", answer=lambda rank, pp, dp, tp, dim: f.mesh_coords(rank, pp, dp, tp)[dim], integer=True),
    Numeric("group-count", draw={**MESH, "dim": ["pp", "dp", "tp"]}, variant="dim", answer=f.group_count,
            integer=True, values=lambda dim: {"DIM": dim.upper()}),
    Numeric("group-stride", draw={**MESH, "dim": ["pp", "dp"]}, variant="dim", answer=f.group_stride, integer=True,
            values=lambda dim: {"DIM": dim.upper()}),
    Numeric("params-per-gpu", draw={MODEL: MODELS, "pp": [4, 8, 16], "tp": DEGREES}, answer=f.params_per_gpu,
            quantity="count", wrong={"Ψ/tp (forgetting the stages)": lambda params, tp: params / tp}),
    Numeric("microbatches", draw={"dp": [8, 16, 32, 64], "micro_batch": [1, 2, 4], "m": [8, 16, 32],
                                  "global_batch": lambda dp, micro_batch, m: [dp * micro_batch * m]},
            answer=f.microbatches_per_replica, integer=True),
    Numeric("bubble", draw={"pp": [4, 8, 16], "dp": [8, 16, 32, 64], "micro_batch": [1, 2], "m": [8, 16, 32],
                            "global_batch": lambda dp, micro_batch, m: [dp * micro_batch * m]},
            answer=_bubble, quantity="fraction", unit="%"),
    Numeric("dp-grad-bytes", draw={MODEL: MODELS, "pp": [4, 8, 16], "tp": DEGREES},
            answer=lambda params, pp, tp: f.dp_grad_bytes(params, pp, tp, 2), quantity="bytes", unit="GB",
            wrong={"fp32 gradients": lambda params, pp, tp: f.dp_grad_bytes(params, pp, tp, 4)}),
    Numeric("p2p-bytes", draw={MODEL: MODELS, "seq": [2048, 4096, 8192], "micro_batch": [1, 2], "tp": DEGREES},
            answer=f.pp_p2p_bytes_per_microbatch, quantity="bytes", unit="MB",
            wrong={"the whole activation from every TP rank":
                   lambda seq, micro_batch, hidden: seq * micro_batch * hidden * 2}),
    Choice("innermost"),
    Choice("within-node", draw={"pp": [2, 4, 8], "dp": [2, 4, 8], "tp": 8}, values=_nodes),
    Choice("pp-activations"),
])
