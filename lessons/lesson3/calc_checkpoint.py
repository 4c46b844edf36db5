"""``distai calc checkpoint``: checkpoint interval (Young, Daly) and the expected waste."""
from __future__ import annotations

import math

from .. import units
from ..calculator import Calculator, Option, labels, table
from . import formulas as f


def compute(v: dict) -> dict:
    M, d, R = v["mtbf"], v["cost"], v["restart"]
    if v["gpus"] is not None:
        M = f.job_mtbf(M, v["gpus"])
    young = f.young_interval(M, d)
    daly = f.daly_interval(M, d, R)
    tau = daly if v["interval"] is None else v["interval"]
    return {
        "young_interval_s": young,
        "daly_interval_s": daly,
        "expected_waste_fraction": f.expected_waste_fraction(tau, M, d, R),
        "waste_at_young_fraction": f.expected_waste_fraction(young, M, d, R),
        "interval_s": tau,
        "job_mtbf_s": M, "cost_s": d, "restart_s": R,
    }


def text(r: dict, lang: str = "en") -> list[str]:
    say = labels("checkpoint", lang)
    t = lambda s: units.format_time(s, lang=lang)  # noqa: E731
    pct = lambda x: units.format_percent(x, lang=lang)  # noqa: E731
    return [
        say("head", mtbf=t(r["job_mtbf_s"]), cost=t(r["cost_s"]), restart=t(r["restart_s"])),
        *table([
            ("Young √(2δM)", t(r["young_interval_s"])),
            (say("daly"), t(r["daly_interval_s"])),
            (say("waste_at", interval=t(r["interval_s"])), pct(r["expected_waste_fraction"])),
            (say("waste_at_young"), pct(r["waste_at_young_fraction"])),
        ]),
        *([say("all_wasted")] if r["expected_waste_fraction"] > 0.999 else []),
    ]


CALCULATOR = Calculator(
    name="checkpoint",
    options=(
        Option("--mtbf", "time",
               minimum=0, strict_min=True),
        Option("--cost", "time", minimum=0, strict_min=True),
        Option("--restart", "time", default="0", minimum=0),
        Option("--gpus", "whole", default=None, maximum=math.inf),  # the waste saturates: any count reads
        Option("--interval", "time", default=None,
               minimum=0, strict_min=True),
    ),
    compute=compute,
    text=text,
)
