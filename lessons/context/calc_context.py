"""``distai calc context``: activation memory per GPU under context parallelism, the K/V bytes each
rank sends per layer (ring and all-gather), and whether a ring hop hides behind one step's compute."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, bytes_text, labels, table
from ..lesson7.formulas import dtype_bytes
from ..model_size import check_degrees
from . import formulas as f


def compute(v: dict) -> dict:
    s, h, a, g, cp, tp = v["seq"], v["hidden"], v["heads"], v["kv_heads"], v["cp"], v["tp"]
    if h % a or a % g:
        raise CalcError.keyed("errors.shape_divides", hidden=h, heads=a, kv_heads=g)
    # the course's one shape check: TP splits the heads and the hidden size, PP the layers, CP the sequence
    check_degrees(cp=cp, seq=s, tp=tp, heads=a, kv_heads=g, hidden=h, pp=v["pp"], layers=v["layers"])
    e, d, b = dtype_bytes(v["dtype"]), h // a, v["micro_batch"]
    try:
        memory = {flash: f.activation_bytes_per_gpu(v["layers"], s, b, h, a, cp, tp, v["pp"], flash, e)
                  for flash in (True, False)}
        without_cp = f.activation_bytes_per_gpu(v["layers"], s, b, h, a, 1, tp, v["pp"], True, e)
        comm = {variant: f.cp_comm_per_layer(s, b, g, d, cp, variant, e, tp) for variant in ("ring", "allgather")}
        overlap = f.ring_overlap(s, b, h, g, d, cp, v["flops"], v["alpha"], v["beta"], e, tp)
    except ValueError as exc:
        raise CalcError(str(exc)) from None
    return {"activation_bytes_per_gpu": memory[True], "activation_bytes_per_gpu_with_scores": memory[False],
            "activation_bytes_per_gpu_without_cp": without_cp, "tokens_per_gpu": s // cp,
            "score_bytes_per_layer": f.score_bytes(s, b, a, cp, tp, e), "kv_block_bytes": comm["ring"]["block_bytes"],
            "ring": comm["ring"], "allgather": comm["allgather"], "overlap": overlap,
            "idle_fraction_contiguous": f.idle_fraction(cp, "contiguous", s) if s % (2 * cp) == 0 else None,
            "seq": s, "hidden": h, "heads": a, "kv_heads": g, "layers": v["layers"], "cp": cp, "tp": tp,
            "pp": v["pp"], "micro_batch": b, "dtype": v["dtype"], "flops": v["flops"], "alpha": v["alpha"],
            "beta": v["beta"]}


def text(r: dict, lang: str = "en") -> list[str]:
    o, say = r["overlap"], labels("context", lang)
    b = lambda n: bytes_text(n, lang)  # noqa: E731
    rows = [(say("tokens"), units.format_integer(r["tokens_per_gpu"], lang)),
            (say("activations"), b(r["activation_bytes_per_gpu"])),
            (say("without_cp"), b(r["activation_bytes_per_gpu_without_cp"])),
            (say("with_scores"), b(r["activation_bytes_per_gpu_with_scores"])),
            (say("kv_block"), b(r["kv_block_bytes"]))]
    for variant in ("ring", "allgather"):
        c = r[variant]
        rows.append((say(f"sent_{variant}"), say("messages", bytes=b(c["total_bytes_per_rank"]),
                                                         fwd=c["forward_messages"], bwd=c["backward_messages"])))
    if r["cp"] == 1:  # one rank holds the whole sequence: no hop, nothing for the compute to hide
        rows.append((say("no_ring"), say("no_ring_value")))
    else:
        rows += [(say("compute"), units.format_time(o["compute_s"], lang=lang)),
                 (say("hop"), units.format_time(o["hop_s"], lang=lang)),
                 (say("hidden"), say("yes" if o["hidden"] else "no")),
                 (say("min_tokens"), say("n_tokens", n=units.format_integer(o["min_tokens"], lang)))]
    if r["idle_fraction_contiguous"] is not None:
        rows.append((say("idle"), units.format_percent(r["idle_fraction_contiguous"], lang=lang)))
    return [say("head", cp=r["cp"], tp=r["tp"], pp=r["pp"], seq=units.format_integer(r["seq"], lang), hidden=r["hidden"],
                heads=r["heads"], kv_heads=r["kv_heads"], layers=r["layers"], dtype=r["dtype"]),
            *table(rows)]


CALCULATOR = Calculator(
    name="context",
    options=(
        Option("--seq", "length"),
        Option("--hidden", "whole"),
        Option("--heads", "whole"),
        Option("--kv-heads", "whole"),
        Option("--layers", "whole"),
        Option("--cp", "whole"),
        Option("--tp", "whole", default="1"),
        Option("--pp", "whole", default="1"),
        Option("--micro-batch", "whole", default="1"),
        Option("--dtype", "choice", default="bf16",
               choices=("fp32", "fp16", "bf16", "fp8")),
        Option("--flops", "flops", default="380T"),
        Option("--alpha", "time", default="5us", minimum=0),
        Option("--beta", "per-byte", default="50GB/s", minimum=0),
    ),
    compute=compute,
    text=text,
)
