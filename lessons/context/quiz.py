"""Lesson 9 quiz: context parallelism and ring attention. Answers from :mod:`.formulas`; texts in
``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build
from . import formulas as f

# (hidden, heads, kv_heads): Llama 3 8B, 70B and 405B shapes (Llama 3 paper, Table 3)
SHAPES = [(4096, 32, 8), (8192, 64, 8), (16384, 128, 8)]
SHAPE = ("hidden", "heads", "kv_heads")
SEQS = [32768, 65536, 131072]
CPS = [2, 4, 8, 16]


def _worked(seq: int = 1, hidden: int = 1, heads: int = 1, kv_heads: int = 1, cp: int = 1, tp: int = 1,
            **_: object) -> dict:
    """The intermediate numbers the explanations show."""
    n = seq // cp
    return {"n": n, "nbh": n * hidden // tp, "d": hidden // heads, "hops": cp - 1, "grad_hops": cp,
            "block": f.kv_block_bytes(seq, 1, kv_heads, hidden // heads, cp, 2, tp) if seq % cp == 0 else 0.0}


def _merge(score_a: float, value_a: float, score_b: float, value_b: float, score_c: float, value_c: float) -> float:
    """Block 1 holds keys a and b, block 2 key c: the merged output of one query row."""
    first = f.partial_softmax([score_a, score_b], [value_a, value_b])
    second = f.partial_softmax([score_c], [value_c])
    return f.online_softmax_merge(first["m"], first["l"], first["o"], second["m"], second["l"], second["o"])["out"]


def _merge_values(score_a, value_a, score_b, value_b, score_c, value_c) -> dict:
    first = f.partial_softmax([score_a, score_b], [value_a, value_b])
    second = f.partial_softmax([score_c], [value_c])
    m = max(first["m"], second["m"])
    return {"m1": first["m"], "l1": first["l"], "o1": first["o"], "m": m}


def _comm(variant: str):
    return lambda seq, hidden, heads, kv_heads, cp, tp=1: f.cp_comm_per_layer(
        seq, 1, kv_heads, hidden // heads, cp, variant, 2, tp)["total_bytes_per_rank"]


GENERATORS = build("context", __package__, values=_worked, kinds=[
    Numeric("activations-cp", draw={SHAPE: SHAPES, "seq": SEQS, "cp": CPS, "tp": 8},
            answer=lambda seq, hidden, heads, cp, tp: f.activation_bytes_per_layer(seq, 1, hidden, heads, cp, tp,
                                                                                      flash=True),
            quantity="bytes", unit="GB",
            wrong={"without CP": lambda seq, hidden, heads, tp: f.activation_bytes_per_layer(
                seq, 1, hidden, heads, 1, tp, flash=True)}),
    Numeric("scores", draw={SHAPE: SHAPES, "seq": SEQS, "cp": CPS, "tp": 8},
            answer=lambda seq, heads, cp, tp: f.score_bytes(seq, 1, heads, cp, tp), quantity="bytes", unit="GB",
            wrong={"(s/cp)² instead of (s/cp)·s": lambda seq, heads, cp, tp: f.score_bytes(seq, 1, heads, cp, tp) / cp}),
    Numeric("kv-block", draw={SHAPE: SHAPES, "seq": SEQS, "cp": CPS, "tp": [1, 8]},
            answer=lambda seq, hidden, heads, kv_heads, cp, tp: f.kv_block_bytes(seq, 1, kv_heads, hidden // heads,
                                                                                 cp, 2, tp),
            quantity="bytes", unit="MB",
            wrong={"the query heads instead of the K/V heads": lambda seq, hidden, heads, cp, tp:
                   f.kv_block_bytes(seq, 1, heads, hidden // heads, cp, 2, tp)}),
    Numeric("ring-messages", draw={"cp": CPS}, integer=True,
            answer=lambda cp: sum(f.cp_step_traffic(cp, t, phase)["messages"] for phase in ("fwd", "bwd")
                                  for t in range(cp)),
            wrong={"forward only": lambda cp: cp - 1}),
    Numeric("ring-bytes", draw={SHAPE: SHAPES, "seq": SEQS, "cp": CPS, "tp": 8}, answer=_comm("ring"),
            quantity="bytes", unit="MB"),
    Numeric("allgather-bytes", draw={SHAPE: SHAPES, "seq": SEQS, "cp": CPS, "tp": 8}, answer=_comm("allgather"),
            quantity="bytes", unit="MB"),
    Numeric("idle", draw={"cp": CPS}, answer=lambda cp: f.idle_fraction(cp, "contiguous"), quantity="fraction",
            unit="%", wrong={"(cp−1)/cp, as if only the last rank worked": lambda cp: (cp - 1) / cp}),
    Numeric("merge", draw={"score_a": [0, 1, 2], "value_a": [1, 2, 4], "score_b": [1, 2, 3], "value_b": [0, 3],
                           "score_c": [2, 3, 4], "value_c": [1, 5]},
            answer=_merge, values=_merge_values, tolerance=0.005),
    Choice("what-travels"),
    Choice("zigzag"),
    Choice("why-allgather"),
    Choice("backward-lse"),
])
