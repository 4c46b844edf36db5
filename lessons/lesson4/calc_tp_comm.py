"""``distai calc tp-comm``: tensor-parallel collectives and bytes per transformer layer."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, bytes_text, labels, table
from ..lesson7.formulas import dtype_bytes
from . import formulas as f


def compute(v: dict) -> dict:
    if (v["alpha"] is None) != (v["beta"] is None):
        raise CalcError("--alpha and --beta go together")
    r = f.tp_comm_per_layer(v["hidden"], v["seq"], v["micro_batch"], v["tp"], v["sequence_parallel"],
                            dtype_bytes(v["dtype"]), v["alpha"], v["beta"])
    return dict(r, hidden=v["hidden"], seq=v["seq"], micro_batch=v["micro_batch"], tp=v["tp"],
                sequence_parallel=v["sequence_parallel"], dtype=v["dtype"])


def text(r: dict, lang: str = "en") -> list[str]:
    say = labels("tp-comm", lang)
    ops = units.number_separator(lang).join(f"{c} {op.replace('_', '-')}" for op, c in r["forward"].items())
    rows = [(say("forward"), bytes_text(r["forward_bytes_per_rank"], lang)),
            (say("backward"), bytes_text(r["backward_bytes_per_rank"], lang))]
    if "total_time_s" in r:
        rows.append((say("time"), units.format_time(r["total_time_s"], lang=lang)))
    return [say("head", tp=r["tp"], sp=say("sp") if r["sequence_parallel"] else "", ops=ops,
                size=units.format_bytes(r["tensor_bytes"], lang=lang)), *table(rows)]


CALCULATOR = Calculator(
    name="tp-comm",
    help="""Tensor-parallel collectives and bytes per transformer layer.

    Megatron-LM (Shoeybi et al. 2019); sequence parallelism after Korthikanti et al. 2022.

    JSON keys: tensor_bytes (s·b·h·bytes), forward and backward ({collective: count}),
    forward_bytes_per_rank, backward_bytes_per_rank, total_bytes_per_rank (ring), and with --alpha and
    --beta forward_time_s, backward_time_s, total_time_s; plus the inputs.
    """,
    options=(
        Option("--hidden", "whole", "Hidden size h."),
        Option("--seq", "whole", "Sequence length s."),
        Option("--micro-batch", "whole", "Micro-batch size b.", default="1"),
        Option("--tp", "whole", "Tensor-parallel degree t."),
        Option("--sequence-parallel", "flag", "Megatron sequence parallelism.", default=False),
        Option("--dtype", "choice", "Activation dtype: fp32, fp16, bf16, fp8.", default="bf16",
               choices=("fp32", "fp16", "bf16", "fp8")),
        Option("--alpha", "time", "Latency per message α, to estimate time.", default=None, minimum=0),
        Option("--beta", "per-byte", "s/B or a bandwidth (100GB/s), to estimate time.", default=None, minimum=0),
    ),
    compute=compute,
    text=text,
)
