"""Lesson 3 quiz: failures, checkpoint intervals, exact resumption. Answers from :mod:`.formulas`;
texts in ``quiz.toml``."""
from __future__ import annotations

import math

from ..quiz import Choice, Numeric, build
from . import formulas as f

GPU_MTBFS = [h * f.HOUR for h in (20_000, 50_000, 100_000)]
GPUS = [1024, 2048, 4096, 8192, 16384]
COSTS = [10, 30, 60, 120, 300]
MTBFS = [1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400]


def _young_is_not_daly(mtbf: float, cost: float) -> bool:
    """Young's first-order interval falls short of Daly's by about ⅔·√(δ/2M): draw only where that is
    over 2%, twice the question's ±1%, so that Young's value is not accepted for Daly's."""
    return abs(f.young_interval(mtbf, cost) / f.daly_interval(mtbf, cost) - 1) > 0.02


def _daly_terms(mtbf: float, cost: float) -> dict:
    x = cost / (2 * mtbf)
    young = f.young_interval(mtbf, cost)
    return {"x": x, "young": young, "young_min": young / 60, "cost_min": cost / 60,
            "factor": 1 + math.sqrt(x) / 3 + x / 9}


def _waste_terms(interval: float, mtbf: float, cost: float, restart: float) -> dict:
    return {"tw": f.expected_wall_time(1.0, interval, mtbf, cost, restart),
            "first_order": f.first_order_overhead(interval, mtbf, cost, restart)}


GENERATORS = build("lesson3", __package__, [
    Numeric("job-mtbf", draw={"gpu_mtbf": GPU_MTBFS, "n_gpus": GPUS}, answer=f.job_mtbf,
            quantity="seconds", unit="h", values=lambda gpu_mtbf: {"gpu_h": gpu_mtbf / f.HOUR}),
    Numeric("young", draw={"mtbf": MTBFS, "cost": COSTS}, answer=f.young_interval, quantity="seconds", unit="min"),
    Numeric("daly", draw={"mtbf": MTBFS, "cost": COSTS}, where=_young_is_not_daly, answer=f.daly_interval,
            quantity="seconds", unit="min", tolerance=0.01, values=_daly_terms,
            wrong={"Young's first order √(2δM)": f.young_interval}),
    Numeric("waste", draw={"mtbf": MTBFS, "cost": COSTS, "restart": [0, 60, 300, 600],
                           "interval": [600, 1800, 3600, 7200]},
            answer=f.expected_waste_fraction, quantity="fraction", unit="%", values=_waste_terms),
    Numeric("failures-per-day", draw={"gpu_mtbf": GPU_MTBFS, "n_gpus": GPUS},
            answer=lambda gpu_mtbf, n_gpus: f.expected_failures(f.DAY, f.job_mtbf(gpu_mtbf, n_gpus)),
            values=lambda gpu_mtbf, n_gpus: {"gpu_h": gpu_mtbf / f.HOUR, "job": f.job_mtbf(gpu_mtbf, n_gpus),
                                             "job_h": f.job_mtbf(gpu_mtbf, n_gpus) / f.HOUR}),
    Numeric("gpu-mtbf-from-log", draw={"n_components": GPUS, "duration_s": [d * f.DAY for d in (30, 54, 60, 90)],
                                       "failures": [50, 120, 200, 419]},
            answer=f.component_mtbf_from_log, quantity="seconds", unit="h",
            values=lambda duration_s, failures: {"days": round(duration_s / f.DAY), "job": duration_s / failures,
                                                "job_h": duration_s / failures / f.HOUR}),
    Choice("scaling", draw={"factor": [4, 9, 16], "what": ["cost", "mtbf"]}, variant="what",
           values=lambda factor: {"root": round(math.sqrt(factor))}),
    Choice("exact-state"),
    Choice("atomic"),
])
