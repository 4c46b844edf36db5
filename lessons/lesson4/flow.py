"""The tensor-parallel Transformer block as a sequence of stages, for lesson 4's visualizer.

Pure Python (no torch, no numpy). ``block_flow(sequence_parallel)`` lists what happens to one
layer, forward then backward: which weight is split how, how the activation is laid out across
the T ranks afterwards (``replicated``, ``heads``, ``hidden``, ``sequence``, ``partial``) and which
collective runs where (``op``, ``site``) — the same site names the engine's collectives are tagged with
(``distai.engine.tensor_parallel``, counted by ``distai.engine.metering.CommMeter``), and the tests check that the engine runs exactly these
collectives. ``vocab_ce_walkthrough`` computes a tiny vocabulary-parallel cross-entropy by hand,
rank by rank, with the all-reduces that make it exact.
"""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

REPLICATED, HEADS, HIDDEN, SEQUENCE, PARTIAL = "replicated", "heads", "hidden", "sequence", "partial"
LAYOUTS = (REPLICATED, HEADS, HIDDEN, SEQUENCE, PARTIAL)


@dataclass(frozen=True)
class Stage:
    key: str  # e.g. "ln1", "attn.f", "qkv"
    phase: str  # "fwd", "bwd" or "grad-sync"
    label: dict[str, str]  # short name, en / es
    note: dict[str, str]  # one line: what happens, en / es
    shape: str = ""  # the tensor this rank holds afterwards, e.g. "s/T·b·h"
    layout: str | None = None  # how that tensor sits across ranks
    split: str | None = None  # "column", "row" or "replicated" for a stage with weights
    op: str | None = None  # collective: all_reduce, all_gather, reduce_scatter
    site: str | None = None  # the engine's site name for that collective
    block: str = ""  # "attn", "mlp" or "" (layer norms, residuals)


def _t(en: str, es: str) -> dict[str, str]:
    return {"en": en, "es": es}


# Megatron's conjugate operators at the two ends of each block: f where the block's input enters, g
# where its output leaves. Where partial results are summed (f backward, g forward) it is an all-reduce,
# a reduce-scatter with sequence parallelism; on the other pass f and g do nothing without it and
# all-gather the sequence with it (Shoeybi et al. 2019; Korthikanti et al. 2022). What each one does:
_CONJUGATE_NOTES = {
    ("f", "fwd", False): _t("forward: nothing to do, the input is already on every rank",
                            "forward: nada que hacer, la entrada ya está en cada rango"),
    ("f", "fwd", True): _t("gather the sequence: every rank needs all s tokens for its matmul",
                           "juntar la secuencia: cada rango necesita los s tokens para su matmul"),
    ("g", "fwd", False): _t("sum the partial results: every rank gets the full output",
                            "sumar los parciales: cada rango recibe la salida completa"),
    ("g", "fwd", True): _t("sum the partial results and keep only this rank's s/T tokens",
                           "sumar los parciales y quedarse solo con los s/T tokens de este rango"),
    ("g", "bwd", False): _t("the gradient of a sum is the same for every term: nothing to do",
                            "el gradiente de una suma es el mismo para cada sumando: nada que hacer"),
    ("g", "bwd", True): _t("the output's gradient arrives by sequence shard: gather it",
                           "el gradiente de la salida llega por trozos de secuencia: juntarlo"),
    ("f", "bwd", False): _t("sum the partial input gradients: the input was replicated",
                            "sumar los gradientes parciales: la entrada estaba replicada"),
    ("f", "bwd", True): _t("sum the partial input gradients, keep this rank's tokens",
                           "sumar los gradientes parciales de la entrada, quedarse con los tokens propios"),
}


def _conjugate(blk: str, end: str, phase: str, sp: bool) -> Stage:
    """Operator ``end`` ("f" or "g") of block ``blk`` in ``phase``, e.g. "ḡ bwd: all-gather": a
    reduce-scatter leaves each rank its s/T tokens, anything else the whole tensor on every rank."""
    sums = (end == "f") == (phase == "bwd")
    op = ("reduce_scatter" if sp else "all_reduce") if sums else ("all_gather" if sp else None)
    name = unicodedata.normalize("NFC", end + ("\u0304" if sp else ""))  # f̄, ḡ: the SP forms
    name += " bwd" if phase == "bwd" else ""
    label = {lang: f"{name}: {op.replace('_', '-') if op else identity}"
             for lang, identity in (("en", "identity"), ("es", "identidad"))}
    shape, layout = ("s/T·b·h", SEQUENCE) if op == "reduce_scatter" else ("s·b·h", REPLICATED)
    return Stage(f"{blk}.{end}", phase, label, _CONJUGATE_NOTES[(end, phase, sp)], shape, layout, op=op,
                 site=f"{blk}.{end}" if op else None, block=blk)


def _forward(sp: bool) -> list[Stage]:
    x_shape, x_layout = ("s/T·b·h", SEQUENCE) if sp else ("s·b·h", REPLICATED)
    st: list[Stage] = [
        Stage("x", "fwd", _t("input x", "entrada x"),
              _t("the layer's input: " + ("each rank holds s/T of the tokens" if sp else "every rank holds all of it"),
                 "la entrada de la capa: " + ("cada rango tiene s/T de los tokens" if sp else "cada rango la tiene entera")),
              x_shape, x_layout),
        Stage("ln1", "fwd", _t("LayerNorm 1", "LayerNorm 1"),
              _t("on this rank's tokens only (weights replicated)" if sp else "same weights, same result on every rank",
                 "solo sobre los tokens de este rango (pesos replicados)" if sp else "mismos pesos, mismo resultado en cada rango"),
              x_shape, x_layout, split="replicated"),
    ]
    for blk, col, row, col_shape, col_layout, middle in (
        ("attn", _t("QKV", "QKV"), _t("W_o", "W_o"), "s·b·3h/T", HEADS,
         Stage("core", "fwd", _t("attention", "atención"),
               _t("softmax(QKᵀ/√d)·V for a/T whole heads: no communication",
                  "softmax(QKᵀ/√d)·V de a/T cabezas enteras: sin comunicación"),
               "s·b·h/T", HEADS, block="attn")),
        ("mlp", _t("fc1", "fc1"), _t("fc2", "fc2"), "s·b·4h/T", HIDDEN,
         Stage("gelu", "fwd", _t("GeLU", "GeLU"),
               _t("element-wise on 4h/T features: no communication",
                  "elemento a elemento sobre 4h/T rasgos: sin comunicación"),
               "s·b·4h/T", HIDDEN, block="mlp")),
    ):
        st.append(_conjugate(blk, "f", "fwd", sp))
        st.append(Stage(f"{blk}.{col['en'].lower()}", "fwd", col,
                        _t("weight split by columns (output features): each rank computes its slice",
                           "peso partido por columnas (rasgos de salida): cada rango calcula su parte"),
                        col_shape, col_layout, split="column", block=blk))
        st.append(middle)
        st.append(Stage(f"{blk}.{row['en'].lower().replace('_', '')}", "fwd", row,
                        _t("weight split by rows (input features): each rank has a partial sum",
                           "peso partido por filas (rasgos de entrada): cada rango tiene una suma parcial"),
                        "s·b·h", PARTIAL, split="row", block=blk))
        st.append(_conjugate(blk, "g", "fwd", sp))
        st.append(Stage(f"{blk}.residual", "fwd", _t("bias, dropout, + x", "sesgo, dropout, + x"),
                        _t("on s/T tokens per rank" if sp else "repeated identically on every rank",
                           "sobre s/T tokens por rango" if sp else "repetido igual en cada rango"),
                        x_shape, x_layout, block=blk))
        if blk == "attn":
            st.append(Stage("ln2", "fwd", _t("LayerNorm 2", "LayerNorm 2"), st[1].note, x_shape, x_layout,
                            split="replicated"))
    return st


def _backward(sp: bool) -> list[Stage]:
    x_shape, x_layout = ("s/T·b·h", SEQUENCE) if sp else ("s·b·h", REPLICATED)
    st: list[Stage] = []
    for blk, col, row in (("mlp", "fc1", "fc2"), ("attn", "QKV", "W_o")):
        st.append(_conjugate(blk, "g", "bwd", sp))
        st.append(Stage(f"{blk}.{row.lower().replace('_', '')}", "bwd", _t(f"{row} grads", f"grad. de {row}"),
                        _t("local: this rank's rows of the weight, its slice of the input gradient",
                           "local: las filas del peso de este rango, su parte del gradiente de entrada"),
                        "s·b·4h/T" if blk == "mlp" else "s·b·h/T", HIDDEN if blk == "mlp" else HEADS, split="row", block=blk))
        st.append(Stage(f"{blk}.{col.lower()}", "bwd", _t(f"{col} grads", f"grad. de {col}"),
                        _t("each rank's input gradient covers only its columns: a partial sum",
                           "el gradiente de entrada de cada rango cubre solo sus columnas: una suma parcial"),
                        "s·b·h", PARTIAL, split="column", block=blk))
        if sp:
            st.append(Stage(f"{blk}.f.regather", "bwd", _t("re-gather input", "re-gather (entrada)"),
                            _t("the weight gradient needs all s tokens: all-gather the saved s/T shard again",
                               "el gradiente del peso necesita los s tokens: all-gather otra vez del trozo guardado"),
                            "s·b·h", REPLICATED, op="all_gather", site=f"{blk}.f.regather", block=blk))
        st.append(_conjugate(blk, "f", "bwd", sp))
        ln = "ln2" if blk == "mlp" else "ln1"
        st.append(Stage(ln, "bwd", _t(f"LayerNorm {ln[-1]} grads", f"grad. de LayerNorm {ln[-1]}"),
                        _t("from this rank's tokens only: a partial gradient" if sp else "identical on every rank",
                           "solo de los tokens de este rango: gradiente parcial" if sp else "idénticos en cada rango"),
                        x_shape, x_layout, split="replicated"))
    if sp:
        st.append(Stage("sp.grads", "grad-sync", _t("LN grads: all-reduce", "grad. LN: all-reduce"),
                        _t("layer-norm weights and row-parallel biases saw s/T tokens each: sum them (the classic bug)",
                           "los pesos de LayerNorm y los sesgos por filas vieron s/T tokens cada uno: sumarlos (el bug clásico)"),
                        "6h", REPLICATED, op="all_reduce", site="sp.grads"))
    return st


def block_flow(sequence_parallel: bool = False) -> list[Stage]:
    """One layer, forward then backward (then the SP gradient sync)."""
    return _forward(sequence_parallel) + _backward(sequence_parallel)


def collectives(sequence_parallel: bool = False) -> list[tuple[str, str, str]]:
    """``(phase, op, site)`` of every collective one layer runs, in order."""
    return [(s.phase, s.op, s.site) for s in block_flow(sequence_parallel) if s.op]


def count_collectives(stages: list[Stage], phase: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in stages:
        if s.op and (phase is None or s.phase == phase):
            out[s.op] = out.get(s.op, 0) + 1
    return out


def ring_bytes_per_rank(op: str, tensor_bytes: float, t: int) -> float:
    """What one rank sends for one collective over a tensor of ``tensor_bytes`` (ring):
    all-reduce 2(t−1)/t, all-gather and reduce-scatter (t−1)/t (Thakur et al. 2005)."""
    factor = 2 * (t - 1) / t if op == "all_reduce" else (t - 1) / t
    return factor * tensor_bytes


# ----------------------------------------------------------------------------------------------
# The vocabulary-parallel cross-entropy, by hand
# ----------------------------------------------------------------------------------------------

EXAMPLE_LOGITS = (1.2, 0.3, -0.5, 2.0, 0.1, 1.7, -1.0, 0.4)
EXAMPLE_TARGET = 5


def vocab_ce_walkthrough(logits=EXAMPLE_LOGITS, target: int = EXAMPLE_TARGET, t: int = 2) -> list[dict]:
    """One token's loss with its V logits split over ``t`` ranks, step by step.

    Each entry: ``key``, ``per_rank`` (what every rank holds or computes), ``collective`` (None or
    the all-reduce and its result) and ``value`` (the number everyone ends with). The final loss
    equals ``log(Σ exp(z)) − z[target]`` computed on one process.
    """
    v = len(logits)
    if v % t:
        raise ValueError(f"vocabulary {v} is not divisible by T={t}")
    n = v // t
    shards = [list(logits[r * n:(r + 1) * n]) for r in range(t)]
    local_max = [max(s) for s in shards]
    gmax = max(local_max)
    local_sum = [sum(math.exp(z - gmax) for z in s) for s in shards]
    gsum = sum(local_sum)
    owner = target // n
    local_target = [(shards[r][target - r * n] - gmax) if r == owner else 0.0 for r in range(t)]
    tgt = sum(local_target)
    loss = math.log(gsum) - tgt
    steps = [
        {"key": "shard", "per_rank": shards, "collective": None, "value": None},
        {"key": "max", "per_rank": local_max, "collective": ("all_reduce", "max"), "value": gmax},
        {"key": "sumexp", "per_rank": local_sum, "collective": ("all_reduce", "sum"), "value": gsum},
        {"key": "target", "per_rank": local_target, "collective": ("all_reduce", "sum"), "value": tgt},
        {"key": "loss", "per_rank": [loss] * t, "collective": None, "value": loss},
        {"key": "grad", "per_rank": [[math.exp(z - gmax) / gsum - (1.0 if r * n + i == target else 0.0)
                                      for i, z in enumerate(s)] for r, s in enumerate(shards)],
         "collective": None, "value": None},
    ]
    return steps


def dense_cross_entropy(logits=EXAMPLE_LOGITS, target: int = EXAMPLE_TARGET) -> float:
    m = max(logits)
    return math.log(sum(math.exp(z - m) for z in logits)) + m - logits[target]
