"""Lesson 6 quiz: number formats, loss scaling, DDP buckets. Answers from :mod:`.formulas`;
texts in ``quiz.toml``."""
from __future__ import annotations

import math

from ..quiz import Choice, Numeric, build
from . import formulas as f


def _worked(fmt: str = "fp32", x: float = 1.0, weight: float = 1.0, good_steps: int = 0, overflows_first: int = 0,
            n_params: int = 1, bytes_each: int = f.MiB) -> dict:
    """The intermediate numbers the explanations show."""
    ff = f.float_format(fmt)
    exp = math.frexp(x)[1] - 1
    each_mib = bytes_each / f.MiB
    return {"e": ff.exponent_bits, "m": ff.mantissa_bits, "bias": ff.bias, "normal_exp": 1 - ff.bias,
            "subnormal_exp": 1 - ff.bias - ff.mantissa_bits, "exp": exp, "exp1": exp + 1,
            "format_kind": "ieee" if ff.max_override is None else "reused-top",
            "gap": f.spacing(weight, fmt), "half_gap": f.spacing(weight, fmt) / 2,
            "power": 16 - overflows_first + good_steps // 2000, "doublings": good_steps // 2000,
            "each_mib": round(each_mib), "per_bucket": math.ceil(25 / each_mib), "rest": n_params - 1}


GENERATORS = build("lesson6", __package__, values=_worked, kinds=[
    Numeric("max-value", draw={"fmt": ["fp16", "bf16", "fp8_e5m2", "fp8_e4m3"]}, variant="format_kind",
            answer=f.max_value, tolerance=0.005),
    Numeric("smallest", draw={"fmt": ["fp16", "bf16"], "which": ["normal", "subnormal"]}, variant="which",
            answer=lambda fmt, which: (f.smallest_normal if which == "normal" else f.smallest_subnormal)(fmt),
            tolerance=0.01, example=2.5e-7),  # a form to copy, never fp16's smallest normal (6.1e-5), a wrong answer
    Numeric("spacing", draw={"x": [1.0, 2.0, 10.0, 100.0, 1000.0, 0.5], "fmt": ["fp16", "bf16"]},
            answer=f.spacing, tolerance=0.01, example=0.0078),
    Choice("update-lost", draw={"fmt": ["fp16", "bf16", "fp32"], "weight": [1.0, 4.0, 0.25, 16.0],
                                "update": [1e-5, 1e-4, 1e-3, 1e-2], "lost": f.update_is_lost},
           variant="lost", answer=lambda lost: 0 if lost else 1),
    Numeric("scale-after", draw={"overflows_first": [1, 2, 3, 5], "good_steps": [1, 1999, 2000, 4000, 5000, 6500]},
            answer=f.gradscaler_scale_after, integer=True),
    Numeric("bucket-count", draw={"n_params": [24, 50, 100, 200], "bytes_each": [m * f.MiB for m in (1, 2, 4, 8)]},
            answer=f.ddp_uniform_bucket_count, integer=True),
    Numeric("epsilon", draw={"fmt": ["fp16", "bf16", "fp32"]}, answer=f.machine_epsilon, tolerance=0.01,
            wrong={"the smallest normal number": f.smallest_normal}),
    Choice("underflow", draw={"value": [1e-9, 2e-8, 5e-8, 1e-7, 1e-6],
                              "underflows": lambda value: f.underflows(value, "fp16")},
           variant="underflows", answer=lambda underflows: 0 if underflows else 1),
    Choice("bf16-scaling"),
    Choice("bucket-order"),
])
