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
from dataclasses import dataclass

from ..model_size import check_degrees
from ..strings import translated

REPLICATED, HEADS, HIDDEN, SEQUENCE, PARTIAL = "replicated", "heads", "hidden", "sequence", "partial"
LAYOUTS = (REPLICATED, HEADS, HIDDEN, SEQUENCE, PARTIAL)


AREA = "lesson4_flow"  # the stages' texts: lessons/catalog/lesson4_flow.toml


@dataclass(frozen=True)
class Stage:
    key: str  # e.g. "ln1", "attn.f", "qkv"
    phase: str  # "fwd", "bwd" or "grad-sync"
    text: str  # its table in the catalog (AREA): a short ``label`` and a one-line ``note``
    shape: str = ""  # the tensor this rank holds afterwards, e.g. "s/T·b·h"
    layout: str | None = None  # how that tensor sits across ranks
    split: str | None = None  # "column", "row" or "replicated" for a stage with weights
    op: str | None = None  # collective: all_reduce, all_gather, reduce_scatter
    site: str | None = None  # the engine's site name for that collective
    block: str = ""  # "attn", "mlp" or "" (layer norms, residuals)
    fields: tuple[tuple[str, str], ...] = ()  # what its texts name (the weight, the LayerNorm's number)

    def label(self, lang: str) -> str:
        """Its short name in ``lang``."""
        return translated(AREA, f"{self.text}.label", lang, **dict(self.fields))

    def note(self, lang: str) -> str:
        """What happens in it, one line in ``lang``."""
        return translated(AREA, f"{self.text}.note", lang, **dict(self.fields))


def _sp(text: str, sp: bool) -> str:
    """The text of a stage that reads otherwise with sequence parallelism."""
    return text + "_sp" if sp else text


def _conjugate(blk: str, end: str, phase: str, sp: bool) -> Stage:
    """Megatron's conjugate operator ``end`` ("f" where block ``blk``'s input enters, "g" where its output
    leaves) in ``phase``. Where partial results are summed (f backward, g forward) it is an all-reduce,
    a reduce-scatter with sequence parallelism; on the other pass f and g do nothing without it and
    all-gather the sequence with it (Shoeybi et al. 2019; Korthikanti et al. 2022). A reduce-scatter
    leaves each rank its s/T tokens, anything else the whole tensor on every rank."""
    sums = (end == "f") == (phase == "bwd")
    op = ("reduce_scatter" if sp else "all_reduce") if sums else ("all_gather" if sp else None)
    shape, layout = ("s/T·b·h", SEQUENCE) if op == "reduce_scatter" else ("s·b·h", REPLICATED)
    return Stage(f"{blk}.{end}", phase, _sp(f"{end}_{phase}", sp), shape, layout, op=op,
                 site=f"{blk}.{end}" if op else None, block=blk)


def _forward(sp: bool) -> list[Stage]:
    x_shape, x_layout = ("s/T·b·h", SEQUENCE) if sp else ("s·b·h", REPLICATED)
    st: list[Stage] = [
        Stage("x", "fwd", _sp("input", sp), x_shape, x_layout),
        Stage("ln1", "fwd", _sp("layernorm", sp), x_shape, x_layout, split="replicated", fields=(("n", "1"),)),
    ]
    for blk, col, row, col_shape, col_layout, middle in (
        ("attn", "QKV", "W_o", "s·b·3h/T", HEADS, Stage("core", "fwd", "attention", "s·b·h/T", HEADS, block="attn")),
        ("mlp", "fc1", "fc2", "s·b·4h/T", HIDDEN, Stage("gelu", "fwd", "gelu", "s·b·4h/T", HIDDEN, block="mlp")),
    ):
        st.append(_conjugate(blk, "f", "fwd", sp))
        st.append(Stage(f"{blk}.{col.lower()}", "fwd", "column", col_shape, col_layout, split="column", block=blk,
                        fields=(("weight", col),)))
        st.append(middle)
        st.append(Stage(f"{blk}.{row.lower().replace('_', '')}", "fwd", "row", "s·b·h", PARTIAL, split="row",
                        block=blk, fields=(("weight", row),)))
        st.append(_conjugate(blk, "g", "fwd", sp))
        st.append(Stage(f"{blk}.residual", "fwd", _sp("residual", sp), x_shape, x_layout, block=blk))
        if blk == "attn":
            st.append(Stage("ln2", "fwd", _sp("layernorm", sp), x_shape, x_layout, split="replicated",
                            fields=(("n", "2"),)))
    return st


def _backward(sp: bool) -> list[Stage]:
    x_shape, x_layout = ("s/T·b·h", SEQUENCE) if sp else ("s·b·h", REPLICATED)
    st: list[Stage] = []
    for blk, col, row in (("mlp", "fc1", "fc2"), ("attn", "QKV", "W_o")):
        st.append(_conjugate(blk, "g", "bwd", sp))
        st.append(Stage(f"{blk}.{row.lower().replace('_', '')}", "bwd", "row_grads",
                        "s·b·4h/T" if blk == "mlp" else "s·b·h/T", HIDDEN if blk == "mlp" else HEADS, split="row",
                        block=blk, fields=(("weight", row),)))
        st.append(Stage(f"{blk}.{col.lower()}", "bwd", "column_grads", "s·b·h", PARTIAL, split="column", block=blk,
                        fields=(("weight", col),)))
        if sp:
            st.append(Stage(f"{blk}.f.regather", "bwd", "regather", "s·b·h", REPLICATED, op="all_gather",
                            site=f"{blk}.f.regather", block=blk))
        st.append(_conjugate(blk, "f", "bwd", sp))
        ln = "ln2" if blk == "mlp" else "ln1"
        st.append(Stage(ln, "bwd", _sp("layernorm_grads", sp), x_shape, x_layout, split="replicated",
                        fields=(("n", ln[-1]),)))
    if sp:
        st.append(Stage("sp.grads", "grad-sync", "sp_grads", "6h", REPLICATED, op="all_reduce", site="sp.grads"))
    return st


def block_flow(sequence_parallel: bool = False) -> list[Stage]:
    """One layer, forward then backward (then the SP gradient sync)."""
    return _forward(sequence_parallel) + _backward(sequence_parallel)


def collectives(sequence_parallel: bool = False) -> list[tuple[str, str, str]]:
    """``(phase, op, site)`` of every collective one layer runs, in order."""
    return [(s.phase, s.op, s.site) for s in block_flow(sequence_parallel) if s.op and s.site]


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
    check_degrees(tp=t, vocab=v)  # the course's one shape check
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
