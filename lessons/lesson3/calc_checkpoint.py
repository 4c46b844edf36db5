"""``distai calc checkpoint``: checkpoint interval (Young, Daly) and the expected waste."""
from __future__ import annotations

from .. import units
from ..calculator import Calculator, Option, table
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


def text(r: dict) -> list[str]:
    t = units.format_time
    return [
        f"Checkpointing: job MTBF M = {t(r['job_mtbf_s'])}, checkpoint δ = {t(r['cost_s'])}, "
        f"restart R = {t(r['restart_s'])}",
        *table([
            ("Young √(2δM)", t(r["young_interval_s"])),
            ("Daly (higher order)", t(r["daly_interval_s"])),
            (f"expected waste at {t(r['interval_s'])}", units.format_percent(r["expected_waste_fraction"])),
            ("expected waste at Young's", units.format_percent(r["waste_at_young_fraction"])),
        ]),
        *(["  note: failures come about as fast as intervals, checkpoints and restarts take: practically "
           "all time is wasted (the waste tends to 100%)"] if r["expected_waste_fraction"] > 0.999 else []),
    ]


CALCULATOR = Calculator(
    name="checkpoint",
    help="""Checkpoint interval (Young, Daly) and the expected waste.

    Young's √(2δM) (1974), Daly's higher-order estimate (2006), and the expected waste of Daly's
    exponential-failure model.

    JSON keys: young_interval_s, daly_interval_s, expected_waste_fraction (share of wall-clock time
    lost to checkpoints, redone work and restarts, at --interval if given, else at Daly's interval),
    waste_at_young_fraction, interval_s (where the waste was evaluated), job_mtbf_s, cost_s, restart_s.
    """,
    options=(
        Option("--mtbf", "time", "Mean time between failures of the job (or per GPU with --gpus): 3h, 86400.",
               minimum=0, strict_min=True),
        Option("--cost", "time", "Time to write one checkpoint δ (30s, 5min).", minimum=0, strict_min=True),
        Option("--restart", "time", "Time to restart and reload R (default 0).", default="0", minimum=0),
        Option("--gpus", "whole", "If given, --mtbf is per GPU; job MTBF = MTBF/G.", default=None),
        Option("--interval", "time", "Evaluate the waste at this interval instead of Daly's.", default=None,
               minimum=0, strict_min=True),
    ),
    compute=compute,
    text=text,
)
