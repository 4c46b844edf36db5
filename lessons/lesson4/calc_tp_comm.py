"""``distai calc tp-comm``: tensor-parallel collectives and bytes per transformer layer."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, bytes_text, labels, table
from ..lesson7.formulas import dtype_bytes
from . import formulas as f


def compute(v: dict) -> dict:
    if (v["alpha"] is None) != (v["beta"] is None):
        raise CalcError.keyed("errors.alpha_beta")
    r = f.tp_comm_per_layer(v["hidden"], v["seq"], v["micro_batch"], v["tp"], v["sequence_parallel"],
                            dtype_bytes(v["dtype"]), v["alpha"], v["beta"])
    return dict(r, hidden=v["hidden"], seq=v["seq"], micro_batch=v["micro_batch"], tp=v["tp"],
                sequence_parallel=v["sequence_parallel"], dtype=v["dtype"])


def text(r: dict, lang: str = "en") -> list[str]:
    say = labels("tp-comm", lang)
    ops = units.number_separator(lang).join(f"{c} {say(op, n=c)}" for op, c in r["forward"].items())
    rows = [(say("forward"), bytes_text(r["forward_bytes_per_rank"], lang)),
            (say("backward"), bytes_text(r["backward_bytes_per_rank"], lang))]
    regather = r.get("regather", {}).get("all_gather", 0) if r["tp"] > 1 else 0
    megatron_backward = r["backward_bytes_per_rank"] + r.get("regather_bytes_per_rank", 0.0)
    if regather:
        rows.append((say("regather", n=regather), bytes_text(megatron_backward, lang)))
    if "total_time_s" in r:
        rows.append((say("time"), units.format_time(r["total_time_s"], lang=lang)))
        if regather:
            rows.append((say("regather_time"), units.format_time(r["regather_time_s"], lang=lang)))
    head = say("head", tp=r["tp"], sp=say("sp") if r["sequence_parallel"] else "", ops=ops,
               size=units.format_bytes(r["tensor_bytes"], lang=lang))
    if not regather:
        return [head, *table(rows)]
    ratio = megatron_backward / r["forward_bytes_per_rank"]
    return [head, *table(rows), say("regather_note", ratio=units.format_number(ratio, 3, lang=lang))]


CALCULATOR = Calculator(
    name="tp-comm",
    options=(
        Option("--hidden", "whole"),
        Option("--seq", "length"),
        Option("--micro-batch", "whole", default="1"),
        Option("--tp", "whole"),
        Option("--sequence-parallel", "flag", default=False),
        Option("--dtype", "choice", default="bf16",
               choices=("fp32", "fp16", "bf16", "fp8")),
        Option("--alpha", "time", default=None, minimum=0),
        Option("--beta", "per-byte", default=None, minimum=0),
    ),
    compute=compute,
    text=text,
)
