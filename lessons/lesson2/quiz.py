"""Lesson 2 quiz: ZeRO/FSDP memory per GPU, communication volume, activations. Answers from
:mod:`.formulas`; texts in ``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build
from . import formulas as f

PARAMS = [1.3e9, 3e9, 7e9, 7.5e9, 13e9, 30e9, 70e9, 175e9]
DPS = [4, 8, 16, 32, 64, 128, 256]
SETUPS = [("adam", "mixed"), ("adam", "fp32"), ("sgd", "mixed"), ("sgd", "fp32")]


def _worked(params: float = 1.0, dp: int = 1, strategy: str = "ddp", optimizer: str = "adam",
            precision: str = "mixed", seq: int = 1, micro_batch: int = 1, hidden: int = 1, heads: int = 1) -> dict:
    """The intermediate numbers the explanations show."""
    states = f.model_state_bytes(params, dp, strategy, optimizer, precision)
    per = f.bytes_per_param(optimizer, precision)
    volume = f.comm_volume_per_step(params, strategy, bytes_per_elem=2)
    return {**states, **{f"per_{k}": v for k, v in per.items()}, "per_total": sum(per.values()),
            "setup": f"{optimizer}-{precision}", "multiple": volume["elements"] // int(params),
            "sbh": seq * micro_batch * hidden, "attention": 5 * heads * seq / hidden}


GENERATORS = build("lesson2", __package__, values=_worked, kinds=[
    Numeric("zero-total", draw={"params": PARAMS, "dp": DPS, "strategy": ["zero1", "zero2", "zero3"]},
            answer=lambda params, dp, strategy: f.model_state_bytes(params, dp, strategy)["total_bytes"],
            quantity="bytes", unit="GB",
            wrong={"DDP's replicated states": lambda params: f.model_state_bytes(params, 1, "ddp")["total_bytes"]}),
    Numeric("ddp-total", draw={"params": PARAMS, ("optimizer", "precision"): SETUPS},
            answer=lambda params, optimizer, precision:
                f.model_state_bytes(params, 1, "ddp", optimizer, precision)["total_bytes"],
            quantity="bytes", unit="GB"),
    Numeric("optimizer-shard", draw={"params": PARAMS, "dp": DPS},
            answer=lambda params, dp: f.model_state_bytes(params, dp, "zero1")["optimizer_bytes"],
            quantity="bytes", unit="GB"),
    Numeric("comm-volume", draw={"params": PARAMS, "strategy": ["ddp", "zero2", "zero3"]}, variant="strategy",
            answer=lambda params, strategy: f.comm_volume_per_step(params, strategy, bytes_per_elem=2)["bytes"],
            quantity="bytes", unit="GB"),
    Numeric("max-fit", draw={"memory_bytes": [24e9, 40e9, 80e9, 141e9], "dp": DPS,
                             "strategy": ["ddp", "zero1", "zero2", "zero3"]},
            answer=f.max_params_that_fit, quantity="count", unit="B", example=7.5e9),
    Numeric("activations", draw={("hidden", "heads"): [(2048, 16), (4096, 32), (5120, 40), (8192, 64), (12288, 96)],
                                 "seq": [1024, 2048, 4096], "micro_batch": [1, 2, 4]},
            answer=f.activation_bytes_per_layer, quantity="bytes", unit="GB"),
    Numeric("k-value", draw={("optimizer", "precision"): SETUPS + [("sgd-nomomentum", "mixed")]},
            variant="setup", answer=f.optimizer_k, integer=True),
    Choice("which-stage"),
    Choice("traffic-ratio"),
    Choice("largest-state"),
])
