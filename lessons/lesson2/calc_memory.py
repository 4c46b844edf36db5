"""``distai calc memory``: memory per GPU, ZeRO model states plus Korthikanti activations."""
from __future__ import annotations

import math

from .. import units
from ..calculator import (
    CalcError,
    Calculator,
    Option,
    bytes_text,
    check_params_fit_shape,
    choice_name,
    labels,
    table,
)
from ..strings import translated
from . import formulas as f

SHAPE = ("layers", "hidden", "seq", "micro_batch", "heads")


def compute(v: dict) -> dict:
    shape = {k: v[k] for k in SHAPE}
    given = [k for k, x in shape.items() if x is not None]
    if given and len(given) != len(shape):
        absent = ["--" + k.replace("_", "-") for k, x in shape.items() if x is None]
        raise CalcError.keyed("errors.shape_missing", missing=", ".join(absent), n=len(absent))
    wanting = [flag for flag, on in (("--sequence-parallel", v["sequence_parallel"]),
                                     ("--recompute", v["recompute"] != "none")) if on]
    if wanting and not given:
        raise CalcError.keyed("errors.shape_needed", n=len(wanting),
                              flags=lambda lang: translated("calc", "errors.both", lang, a=wanting[0], b=wanting[-1])
                              if len(wanting) > 1 else wanting[0])
    if given and shape["hidden"] % shape["heads"]:  # the head size h/a is a whole number (calc plan, moe, context)
        raise CalcError.keyed("errors.hidden_not_heads", hidden=shape["hidden"], heads=shape["heads"])
    if given:
        check_params_fit_shape(v["params"], shape["layers"], shape["hidden"], shape["heads"])
    mem = f.memory_per_gpu(v["params"], v["dp"], v["strategy"], v["optimizer"], v["precision"], tp=v["tp"],
                           sequence_parallel=v["sequence_parallel"], recompute=v["recompute"],
                           moments=v["moments"], **shape)
    out = dict(mem)
    out.update({"params": v["params"], "dp": v["dp"], "tp": v["tp"], "strategy": v["strategy"],
                "optimizer": v["optimizer"], "precision": v["precision"], "moments": v["moments"],
                "k": f.optimizer_k(v["optimizer"], v["precision"], v["moments"])})
    if v["gpu_memory"] is not None:
        out["gpu_memory_bytes"] = v["gpu_memory"]
        out["fits"] = mem["total_bytes"] <= v["gpu_memory"]
    return out


def text(r: dict, lang: str = "en") -> list[str]:
    t, say = r["tp"], labels("memory", lang)
    lines = [say("head", strategy=choice_name(r["strategy"], lang), params=units.format_count(r["params"], lang=lang), dp=r["dp"],
                 tp=f", t = {t}" if t > 1 else "", optimizer=choice_name(r["optimizer"], lang), precision=choice_name(r["precision"], lang), k=r["k"],
                 moments=say("moments_bf16") if r["moments"] == "bf16" else "")]
    rows = [(say("params"), bytes_text(r["params_bytes"], lang)), (say("grads"), bytes_text(r["grads_bytes"], lang)),
            (say("optimizer"), bytes_text(r["optimizer_bytes"], lang))]
    if r["activations_bytes"] is not None:
        rows.append((say("activations"), bytes_text(r["activations_bytes"], lang)))
    rows.append((say("total"), bytes_text(r["total_bytes"], lang)))
    lines += table(rows)
    if "fits" in r:
        lines.append(say("fits" if r["fits"] else "does_not_fit",
                         memory=units.format_bytes(r["gpu_memory_bytes"], lang=lang)))
    return lines


CALCULATOR = Calculator(
    name="memory",
    options=(
        Option("--params", "whole", maximum=math.inf),  # any size prints sanely (1e30 B): no 2^53 bound
        Option("--dp", "whole", default="1"),
        Option("--strategy", "choice", default="ddp", choices=f.STRATEGIES),
        Option("--optimizer", "choice",
               default="adam", choices=f.OPTIMIZERS + ("adamw",)),
        Option("--precision", "choice", default="mixed",
               choices=f.PRECISIONS),
        Option("--moments", "choice", default="fp32", choices=tuple(f.MOMENT_BYTES)),
        Option("--layers", "whole", default=None),
        Option("--hidden", "whole", default=None),
        Option("--seq", "length", default=None),
        Option("--micro-batch", "whole", default=None),
        Option("--heads", "whole", default=None),
        Option("--tp", "whole", default="1"),
        Option("--sequence-parallel", "flag", default=False),
        Option("--recompute", "choice", default="none",
               choices=f.RECOMPUTE),
        Option("--gpu-memory", "capacity", default=None, minimum=0,
               strict_min=True),
    ),
    compute=compute,
    text=text,
)
