"""Capstone quiz: the five-axis device mesh (pp, dp, cp, tp, with experts inside dp·cp), its groups,
what each axis's collectives send, the memory per GPU and which degree to grow when a limit binds.

Every answer is computed by what the engine and the planner use: the mesh's ranks and groups by
:class:`~.mesh_run.Layout` (the engine's ``MeshShape``; its groups are tested against the real
DeviceMesh), each axis's bytes by the lessons' formulas the engine's ``expected_comm`` calls (lesson 4's
TP, the context lesson's ring, the experts lesson's all-to-all, lesson 2's ZeRO volume, this lesson's
pipeline sends), the memory by the planner's :func:`~.planner.memory_terms`. Texts in ``quiz.toml``.
"""
from __future__ import annotations

from ..context.formulas import cp_comm_per_layer
from ..experts.formulas import dispatch_bytes_per_layer, moe_model_params
from ..lesson2.formulas import comm_volume_per_step
from ..lesson4.formulas import tp_comm_per_layer
from ..lesson5.formulas import bubble_fraction
from ..model_spec import ModelSpec
from ..quiz import Choice, Numeric, build
from . import formulas as f
from .mesh_run import Layout
from .planner import Cluster, Config, memory_terms
from .published import DEEPSEEK_V3_MODEL

DEGREES = [2, 4, 8]
STAGES = [2, 4, 8, 16]
MESH = {"pp": STAGES, "dp": DEGREES, "tp": DEGREES}
# published models: (name, parameters, hidden size) — GPT-3 175B, Llama 3 70B and 405B
MODELS = [("GPT-3 175B", 175e9, 12288), ("Llama 3 70B", 70e9, 8192), ("Llama 3 405B", 405e9, 16384)]
MODEL = ("model", "params", "hidden")

# ------------------------------------------------------------------ the five axes
#: a mesh with experts, small enough to count by hand: (pp, dp, cp, tp) and ep dividing dp·cp
MESH5 = {"pp": [1, 2, 4], "dp": [2, 4], "cp": [2, 4], "tp": [2, 4],
         "ep": lambda dp, cp: [e for e in (2, 4, 8) if (dp * cp) % e == 0]}
#: the groups of a rank: TP, CP, the dp·cp gradient group, EP, the experts' gradient group, PP
GROUP_DIMS = ("tp", "cp", "dp", "ep", "edp", "pp")
# (name, layers, hidden, heads, KV heads): Llama 3 8B and 70B, Llama 3 paper Table 3
GQA = [("Llama 3 8B", 32, 4096, 32, 8), ("Llama 3 70B", 80, 8192, 64, 8)]
GQA_MODEL = ("model", "layers", "hidden", "heads", "kv_heads")
#: Mixtral 8x7B (the experts lesson's count: 46.7B parameters) and DeepSeek-V3 as the planner sizes them: with its
#: multi-token-prediction module, a 59th MoE layer (its 665B routed parameters are not the report's 654B), so named
MOE_MODELS = {
    "Mixtral 8x7B": ModelSpec(moe_model_params(32, 4096, 14336, 8, 2, 32000, 32, 8)["total_params"], 32, 4096, 32, 8,
                              4096, 32000, experts=8, top_k=2, expert_ffn=14336, tied_embeddings=False),
    "DeepSeek-V3 + MTP": DEEPSEEK_V3_MODEL,
}
#: what the planner sizes a GPU with: an 80 GB H100 (the memory terms below do not depend on the rest)
GPU = Cluster(gpus=1, gpu_memory=80e9)
#: the changes "grow-axis" offers, in its options' order: double cp, dp or pp, or turn ZeRO-1 on
GROWTHS = ("cp", "dp", "pp", "zero")


def _group_words(dim: str) -> dict:
    """The group's name for the texts: ``DIM`` (EP), ``a_DIM`` with its English article (an EP, a DP: the
    letters' names), ``note`` the key of its definition in the ``[terms]`` tables (DP and EDP only)."""
    name = dim.upper()
    return {"DIM": name, "a_DIM": ("an " if name[0] in "AEFHILMNORSX" else "a ") + name, "note": f"note-{dim}"}


def _layout(pp: int, dp: int, cp: int, tp: int, ep: int = 1) -> Layout:
    """The engine's mesh with experts (``distai run capstone --moe``)."""
    return Layout(pp, dp, tp, cp, ep, moe=True)


def _worked(pp: int = 1, dp: int = 1, tp: int = 1, cp: int = 1, ep: int = 1, rank: int = 0, micro_batch: int = 1) -> dict:
    """The intermediate numbers the explanations show."""
    replicas = dp * cp
    return {"world": pp * dp * cp * tp, "dt": dp * tp, "ct": cp * tp, "dct": dp * cp * tp, "dc": replicas,
            "et": ep * tp, "edp_size": replicas // ep if replicas % ep == 0 else 0,
            "rank_div_t": rank // tp, "rank_div_ct": rank // (cp * tp),
            "inner": (rank // (cp * tp)) % dp * cp + (rank // tp) % cp,
            "dp_coord": (rank // (cp * tp)) % dp, "cp_coord": (rank // tp) % cp,
            "p1": pp - 1, "dpmb": dp * micro_batch, "shards": pp * tp}


def _bubble(pp: int, dp: int, global_batch: int, micro_batch: int) -> float:
    return bubble_fraction(pp, f.microbatches_per_replica(global_batch, dp, micro_batch))


def _nodes(pp: int, dp: int, tp: int) -> dict:
    return {"dp_nodes": f.nodes_spanned("dp", pp, dp, tp, 8), "pp_nodes": f.nodes_spanned("pp", pp, dp, tp, 8)}


def _coordinate(rank: int, pp: int, dp: int, cp: int, tp: int, ep: int, dim: str) -> int:
    return _layout(pp, dp, cp, tp, ep).coords(rank)[dim]


def _group_count(pp: int, dp: int, cp: int, tp: int, ep: int, dim: str) -> int:
    """How many distinct ``dim`` groups the engine's mesh has: every rank's group, counted once."""
    layout = _layout(pp, dp, cp, tp, ep)
    return len({tuple(layout.group(r, dim)) for r in range(layout.world)})


def _group_stride(pp: int, dp: int, cp: int, tp: int, ep: int, dim: str) -> int:
    """The distance between the first two members of rank 0's ``dim`` group."""
    first = _layout(pp, dp, cp, tp, ep).group(0, dim)
    return first[1] - first[0]


def _member_options(pp: int, dp: int, cp: int, tp: int, ep: int, rank: int, dim: str, slot: int) -> list[str]:
    """Four groups of ``rank``: its ``dim`` group at ``slot``, around it its first three other groups of
    more than one rank that differ from it and from each other (GROUP_DIMS order)."""
    layout = _layout(pp, dp, cp, tp, ep)
    right = layout.group(rank, dim)
    others: list[list[int]] = []
    for other in GROUP_DIMS:
        group = layout.group(rank, other)
        if len(group) > 1 and group != right and group not in others:
            others.append(group)
    options = others[:3]
    options.insert(slot, right)
    return [", ".join(map(str, g)) for g in options]


def _members(pp: int, dp: int, cp: int, tp: int, ep: int, rank: int, dim: str, slot: int) -> dict:
    options = _member_options(pp, dp, cp, tp, ep, rank, dim, slot)
    return {f"o{i}": text for i, text in enumerate(options + [""] * (4 - len(options)))}


def _stage_step(per_layer: float, layers: int, pp: int, m: int) -> float:
    """A stage's layers (the planner's :func:`~.formulas.stage_layers`) times ``m`` microbatches."""
    return m * f.stage_layers(layers, pp) * per_layer


def _cp_bytes(layers: int, hidden: int, heads: int, kv_heads: int, seq: int, micro_batch: int, cp: int, tp: int,
              pp: int, m: int, phase: str = "total") -> float:
    ring = cp_comm_per_layer(seq, micro_batch, kv_heads, hidden // heads, cp, "ring", 2, tp)
    return _stage_step(ring[f"{phase}_bytes_per_rank"], layers, pp, m)


def _config(tp: int, pp: int, dp: int, cp: int, ep: int, zero: int) -> Config:
    """The planner's configuration: one sequence per microbatch, 1F1B, sequence parallelism, no recompute."""
    return Config(tp, pp, dp, microbatch=1, zero=zero, recompute="none", chunks=1, sp=tp > 1, cp=cp, ep=ep)


def _memory(model: str, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int, m: int, term: str) -> float:
    spec = MOE_MODELS[model]
    terms = memory_terms(spec, GPU, _config(tp, pp, dp, cp, ep, zero), f.stage_layers(spec.layers, pp), m, "adam")
    return terms[term]


def _state_values(model: str, tp: int, pp: int, dp: int, cp: int, ep: int) -> dict:
    spec = MOE_MODELS[model]
    expert = spec.expert_params
    return {"expert_params": expert, "dense_params": spec.params - expert, "tpp": tp * pp, "tppe": tp * pp * ep,
            "dc": dp * cp, "dce": dp * cp // ep}


def _grown(change: str, model: str, tp: int, pp: int, dp: int, cp: int, ep: int, m: int, term: str) -> float:
    """``term`` of the memory after one change: a degree doubled (the GPUs with it), or ZeRO-1 on."""
    degrees = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "zero": 0}
    degrees[change] = 1 if change == "zero" else 2 * degrees[change]
    return _memory(model, m=m, term=term, **degrees)


def _grow_answer(model: str, tp: int, pp: int, dp: int, cp: int, ep: int, m: int, binds: str) -> int:
    after = [_grown(c, model, tp, pp, dp, cp, ep, m, binds) for c in GROWTHS]
    return after.index(min(after))


def _grow_unique(model: str, tp: int, pp: int, dp: int, cp: int, ep: int, m: int, binds: str) -> bool:
    after = sorted(_grown(c, model, tp, pp, dp, cp, ep, m, binds) for c in GROWTHS)
    return after[0] < after[1] * (1 - 1e-9)


def _grow_values(model: str, tp: int, pp: int, dp: int, cp: int, ep: int, m: int, binds: str) -> dict:
    after = {c: _grown(c, model, tp, pp, dp, cp, ep, m, binds) for c in GROWTHS}
    return {"now": _memory(model, tp, pp, dp, cp, ep, 0, m, binds), **{f"after_{c}": v for c, v in after.items()}}


GENERATORS = build("capstone", __package__, values=_worked, kinds=[
    Numeric("world-size", draw={"pp": STAGES, "dp": DEGREES, "cp": [2, 4], "tp": DEGREES,
                                "ep": lambda dp, cp: [e for e in (2, 4, 8) if (dp * cp) % e == 0]},
            answer=lambda pp, dp, cp, tp, ep: _layout(pp, dp, cp, tp, ep).world, integer=True,
            wrong={"ep as one more axis": lambda pp, dp, cp, tp, ep: _layout(pp, dp, cp, tp, ep).world * ep}),
    Numeric("coordinate", draw={**MESH5, "rank": lambda pp, dp, cp, tp: range(pp * dp * cp * tp),
                                "dim": ["pp", "dp", "cp", "tp", "ep", "edp"]},
            variant="dim", answer=_coordinate, integer=True),
    # groups of one rank ask nothing (with pp = 1, "how many PP groups": 16 or none?)
    Numeric("group-count", draw={**MESH5, "dim": list(GROUP_DIMS)}, variant="dim", answer=_group_count,
            where=lambda pp, dp, cp, tp, ep, dim: _layout(pp, dp, cp, tp, ep).size(dim) > 1,
            integer=True, values=_group_words),
    Numeric("group-stride", draw={**MESH5, "dim": ["cp", "dp", "ep", "edp", "pp"]},
            where=lambda pp, dp, cp, tp, ep, dim: _layout(pp, dp, cp, tp, ep).size(dim) > 1,
            variant="dim", answer=_group_stride, integer=True, values=_group_words),
    Choice("group-members", draw={**MESH5, "rank": lambda pp, dp, cp, tp: range(pp * dp * cp * tp),
                                  "dim": ["cp", "dp", "ep", "edp"], "slot": range(4)},
           where=lambda pp, dp, cp, tp, ep, rank, dim, slot: _layout(pp, dp, cp, tp, ep).size(dim) > 1 and len(set(
               _member_options(pp, dp, cp, tp, ep, rank, dim, slot))) == 4,
           variant="dim", values=_members, answer=lambda slot: slot),
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
    Numeric("dp-bytes", draw={MODEL: MODELS, "pp": [4, 8], "tp": [4, 8], "dp": [2, 4, 8], "cp": [2, 4],
                              "zero": [0, 1]},
            variant="zero", quantity="bytes", unit="GB",
            answer=lambda params, pp, tp, dp, cp, zero: comm_volume_per_step(
                params / (pp * tp), "zero1" if zero else "ddp", dp * cp)["exact_bytes"],
            wrong={"over dp ranks only, forgetting cp": lambda params, pp, tp, dp, zero: comm_volume_per_step(
                params / (pp * tp), "zero1" if zero else "ddp", dp)["exact_bytes"]}),
    Numeric("tp-bytes", draw={MODEL: MODELS, "seq": [8192, 16384, 32768], "cp": [2, 4, 8], "tp": DEGREES},
            quantity="bytes", unit="MB",
            answer=lambda hidden, seq, cp, tp: tp_comm_per_layer(hidden, seq // cp, 1, tp, True)["total_bytes_per_rank"],
            values=lambda seq, cp: {"s_local": seq // cp},
            wrong={"the whole sequence, forgetting CP": lambda hidden, seq, tp: tp_comm_per_layer(
                hidden, seq, 1, tp, True)["total_bytes_per_rank"]}),
    Numeric("cp-bytes", draw={GQA_MODEL: GQA, "seq": [32768, 65536, 131072], "micro_batch": 1, "cp": [2, 4, 8],
                              "tp": 8, "pp": [4, 8], "m": [8, 16]},
            answer=_cp_bytes, quantity="bytes", unit="GB",
            values=lambda layers, hidden, heads, kv_heads, seq, cp, tp, pp: {
                "stage": f.stage_layers(layers, pp), "hops": 3 * cp - 2,
                "block": cp_comm_per_layer(seq, 1, kv_heads, hidden // heads, cp, "ring", 2, tp)["block_bytes"]},
            wrong={"forward only": lambda layers, hidden, heads, kv_heads, seq, micro_batch, cp, tp, pp, m: _cp_bytes(
                layers, hidden, heads, kv_heads, seq, micro_batch, cp, tp, pp, m, "forward")}),
    Numeric("ep-bytes", draw={"hidden": [4096, 7168], "seq": [4096, 8192], "micro_batch": [1, 2], "cp": [1, 2, 4],
                              "top_k": [2, 8], "ep": [4, 8, 16]},
            answer=lambda hidden, seq, micro_batch, cp, top_k, ep: dispatch_bytes_per_layer(
                seq * micro_batch // cp, hidden, top_k, ep, 2),
            quantity="bytes", unit="MB", values=lambda seq, micro_batch, cp: {"tokens": seq * micro_batch // cp},
            wrong={"every choice leaves": lambda hidden, seq, micro_batch, cp, top_k: 2 * seq * micro_batch // cp
                   * top_k * hidden * 2}),
    Numeric("p2p-bytes", draw={MODEL: MODELS, "seq": [2048, 4096, 8192], "micro_batch": [1, 2], "cp": [1, 2, 4],
                               "tp": DEGREES},
            answer=lambda seq, micro_batch, hidden, cp, tp: f.pp_p2p_bytes_per_microbatch(seq // cp, micro_batch,
                                                                                          hidden, tp),
            quantity="bytes", unit="MB", values=lambda seq, cp: {"s_local": seq // cp},
            wrong={"the whole activation from every TP rank":
                   lambda seq, micro_batch, hidden, cp: seq // cp * micro_batch * hidden * 2}),
    Numeric("model-states", draw={"model": list(MOE_MODELS), "tp": [4, 8], "pp": [4, 8, 16], "dp": [4, 8, 16],
                                  "cp": [1, 2], "ep": lambda dp, cp: [e for e in (4, 8, 16) if (dp * cp) % e == 0],
                                  "zero": [0, 1], "m": 16},
            variant="zero", quantity="bytes", unit="GB",
            answer=lambda model, tp, pp, dp, cp, ep, zero, m: _memory(model, tp, pp, dp, cp, ep, zero, m,
                                                                      "model_states_bytes"),
            values=_state_values,
            wrong={"experts not split by ep": lambda model, tp, pp, dp, cp, zero, m: _memory(
                model, tp, pp, dp, cp, 1, zero, m, "model_states_bytes")}),
    Choice("grow-axis", draw={"model": list(MOE_MODELS), "tp": 8, "pp": [2, 4], "dp": [2, 4, 8], "cp": [1, 2],
                              "ep": lambda dp, cp: [e for e in (2, 4, 8) if (dp * cp) % e == 0], "m": 32,
                              "binds": ["activations_bytes", "model_states_bytes"]},
           where=_grow_unique, variant="binds", values=_grow_values, answer=_grow_answer),
    Choice("innermost"),
    Choice("within-node", draw={"pp": [2, 4, 8], "dp": [2, 4, 8], "tp": 8}, values=_nodes),
    Choice("pp-activations"),
])
