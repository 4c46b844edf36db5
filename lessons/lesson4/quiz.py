"""Lesson 4 quiz: tensor parallelism of a transformer block. Answers from :mod:`.formulas`;
texts in ``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build, call_with
from . import formulas as f

SHAPES = [(2048, 16), (4096, 32), (5120, 40), (8192, 64), (12288, 96)]
SHAPE = ("hidden", "heads")
SEQS = [1024, 2048, 4096]
TPS = [2, 4, 8]


def _worked(seq: int = 1, micro_batch: int = 1, hidden: int = 1, heads: int = 1, tp: int = 1) -> dict:
    """The intermediate numbers the explanations show."""
    attention = 5 * heads * seq / hidden
    return {"x": seq * micro_batch * hidden * 2, "sbh": seq * micro_batch * hidden, "ring": 2 * (tp - 1) / tp,
            "attention": attention, "attention_t": attention / tp, "mlp_t": 24 / tp,
            "without_sp": 10 + 24 / tp + attention / tp, "with_sp": (34 + attention) / tp}


def _per_layer(key: str):
    return lambda hidden, seq, micro_batch, tp=1, sequence_parallel=False, alpha=None, beta=None: \
        f.tp_comm_per_layer(hidden, seq, micro_batch, tp, sequence_parallel, 2, alpha, beta)[key]


GENERATORS = build("lesson4", __package__, values=_worked, kinds=[
    Numeric("allreduce-count", draw={"layers": [12, 24, 32, 48, 80, 96]},
            answer=lambda layers: layers * sum(f.tp_comm_per_layer(1024, 128, 1, 2)[d]["all_reduce"]
                                               for d in ("forward", "backward")),
            integer=True, wrong={"forward only": lambda layers: 2 * layers}),
    Numeric("tensor-bytes", draw={SHAPE: SHAPES, "seq": SEQS, "micro_batch": [1, 2, 4, 8]},
            answer=_per_layer("tensor_bytes"), quantity="bytes", unit="MiB"),  # the lesson's unit
    Numeric("bytes-per-rank", draw={SHAPE: SHAPES, "seq": SEQS, "micro_batch": [1, 2], "tp": TPS,
                                    "sequence_parallel": [False, True]}, variant="sequence_parallel",
            answer=_per_layer("total_bytes_per_rank"), quantity="bytes", unit="MiB"),
    Numeric("activations-tp", draw={SHAPE: SHAPES, "seq": SEQS, "micro_batch": 1, "tp": TPS,
                                    "sequence_parallel": [False, True]}, variant="sequence_parallel",
            answer=f.activation_bytes_per_layer, quantity="bytes", unit="MiB"),
    Numeric("sp-saving", draw={SHAPE: SHAPES, "seq": SEQS, "tp": TPS},
            answer=lambda seq, hidden, heads, tp: f.tp_activation_saving(seq, 1, hidden, heads, tp)),
    Numeric("comm-time", draw={SHAPE: SHAPES, "seq": SEQS, "micro_batch": 1, "tp": TPS, "alpha": 5e-6,
                               "beta": [1 / bw for bw in (100e9, 200e9, 450e9)]},
            answer=_per_layer("total_time_s"), quantity="seconds", unit="ms",
            values=lambda **p: {"one": call_with(_per_layer("total_time_s"), p) / 4, "bw": 1 / p["beta"]}),
    Choice("f-operator"),
    Choice("column-then-row"),
    Choice("inside-node"),
    Choice("layernorm-sp"),
])
