"""``distai calc allreduce``: all-reduce cost in the alpha-beta model (ring, tree, naive)."""
from __future__ import annotations

import math

from .. import units
from ..calculator import CalcError, Calculator, Option, bytes_text, choice_name, labels, table
from . import formulas as f


def compute(v: dict) -> dict:
    S, n, a, b, algo = v["bytes"], v["ranks"], v["alpha"], v["beta"], v["algorithm"]
    t = f.allreduce_time(S, n, a, b, algo)
    if not math.isfinite(t):  # past a float's range: said in words, not as the JSON key that holds it
        raise CalcError.keyed("errors.allreduce_inf")
    return {
        "time_s": t,
        "bytes_per_rank": f.allreduce_bytes_per_rank(S, n, algo),
        "steps": f.allreduce_steps(n, algo),
        "busbw_factor": f.busbw_factor(n),
        "algbw_bytes_per_s": f.algbw(S, t) if t > 0 else None,
        "busbw_bytes_per_s": f.busbw(S, t, n) if t > 0 else None,
        "size_bytes": S, "ranks": n, "alpha_s": a, "beta_s_per_byte": b, "algorithm": algo,
        # what NCCL's own tuner predicts for this ring inside an NVLink node at bus bandwidth 1/β (its
        # three protocols, the fastest taken); None without a bandwidth or on one rank
        "nccl": f.nccl_ring_allreduce(S, n, 1 / b) if b > 0 and math.isfinite(1 / b) and n > 1 else None,
    }


def text(r: dict, lang: str = "en") -> list[str]:
    S, n, a, b, algo, t = r["size_bytes"], r["ranks"], r["alpha_s"], r["beta_s_per_byte"], r["algorithm"], r["time_s"]
    say = labels("allreduce", lang)
    beta = say("beta_rate", bw=units.format_bandwidth(1 / b, lang=lang)) if b > 0 else say("beta_zero")
    others = [x for x in f.ALGORITHMS if x != algo]
    return [
        say("head", algo=choice_name(algo, lang), size=units.format_bytes(S, lang=lang), n=n, alpha=units.format_time(a, lang=lang),
            beta=beta),
        *table([
            (say("time"), units.format_time(t, lang=lang)),
            (say("sent"), bytes_text(r["bytes_per_rank"], lang)),
            (say("steps"), str(r["steps"])),
            (say("factor"), units.format_number(r["busbw_factor"], 4, lang)),
            ("algbw / busbw", "—" if t == 0 else
             f"{units.format_bandwidth(r['algbw_bytes_per_s'], lang=lang)} / "
             f"{units.format_bandwidth(r['busbw_bytes_per_s'], lang=lang)}"),
        ]),
        say("compare", others=units.number_separator(lang).join(
            f"{choice_name(x, lang)} {units.format_time(f.allreduce_time(S, n, a, b, x), lang=lang)}" for x in others)),
        *([say("nccl", bw=units.format_bandwidth(1 / b, lang=lang), times=units.number_separator(lang).join(
            f"{p} {units.format_time(r['nccl']['times_s'][p], lang=lang)}" for p in f.NCCL_PROTOCOLS),
            best=r["nccl"]["protocol"])] if r["nccl"] else []),
    ]


CALCULATOR = Calculator(
    name="allreduce",
    options=(
        Option("--bytes", "bytes", short="-s", minimum=0),
        Option("--ranks", "whole", short="-n"),
        Option("--alpha", "time", default="5us", minimum=0),
        Option("--beta", "per-byte",
               default="100GB/s", minimum=0),
        Option("--algorithm", "choice", default="ring",
               choices=f.ALGORITHMS),
    ),
    compute=compute,
    text=text,
)
