"""Lesson 3 formulas: failures in large jobs and the checkpoint interval.

Model (Young 1974; Daly 2006): failures of the whole job arrive as a Poisson process with mean time
between failures M (``mtbf``); the job computes for τ (``interval``) seconds, then writes a checkpoint
taking δ (``cost``) seconds; after a failure it spends R (``restart``) seconds restarting and reading
the last checkpoint, then redoes the work lost since it. Failures can also strike during a checkpoint
or a restart. Times are in seconds.

Sources:
- J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974.
- J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006 — the expected wall-clock time of
  the exponential model (Sec. 3) and the higher-order optimum interval (Sec. 4).
- Llama 3 team, "The Llama 3 Herd of Models", arXiv:2407.21783, Sec. 3.3.4 (419 unexpected
  interruptions in a 54-day snapshot on 16,384 H100 GPUs), the lesson's worked example.
Pure Python.
"""
from __future__ import annotations

import math

DAY = 86400.0
HOUR = 3600.0


def _positive(value: float, what: str) -> float:
    if not (value > 0) or math.isinf(value):
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _non_negative(value: float, what: str) -> float:
    if not (value >= 0) or math.isinf(value):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def job_mtbf(gpu_mtbf: float, n_gpus: int) -> float:
    """MTBF of a job that fails when any of its ``n_gpus`` fails: M_gpu / G.

    With independent, exponentially distributed failures the minimum of G lifetimes is exponential
    with G times the rate (the superposition of Poisson processes).
    """
    _positive(gpu_mtbf, "the per-GPU MTBF")
    if int(n_gpus) != n_gpus or n_gpus < 1:
        raise ValueError(f"the number of GPUs must be a positive integer, got {n_gpus!r}")
    return gpu_mtbf / n_gpus


def component_mtbf_from_log(n_components: int, duration_s: float, failures: int) -> float:
    """Per-component MTBF implied by a failure log: G × duration / failures
    (e.g. Llama 3, Sec. 3.3.4: 419 interruptions in 54 days on 16,384 GPUs)."""
    _positive(duration_s, "the duration")
    if failures < 1:
        raise ValueError("the log must hold at least one failure")
    return n_components * duration_s / failures


def young_interval(mtbf: float, cost: float) -> float:
    """Young's first-order optimum compute time between checkpoints: τ = √(2·δ·M) (Young 1974).

    Derived by minimising the first-order waste δ/τ + τ/(2M) (time writing checkpoints plus, on
    average, half an interval redone per failure); valid when δ ≪ M.
    """
    M = _positive(mtbf, "the MTBF")
    d = _positive(cost, "the checkpoint cost")
    return math.sqrt(2 * d) * math.sqrt(M)  # not √(2δM): the product can overflow


def daly_interval(mtbf: float, cost: float, restart: float = 0.0) -> float:
    """Daly's higher-order optimum compute time between checkpoints (Daly 2006, Sec. 4):

        τ = √(2δM)·[1 + ⅓·√(δ/(2M)) + (1/9)·(δ/(2M))] − δ    for δ < 2M,
        τ = M                                                for δ ≥ 2M.

    It approximates the minimum of :func:`expected_waste_fraction`. The restart time R drops out of
    the optimum in Daly's model (it scales the total time by e^{R/M} whatever τ is); the argument is
    accepted so callers can pass the full model and is only validated.
    """
    M = _positive(mtbf, "the MTBF")
    d = _positive(cost, "the checkpoint cost")
    _non_negative(restart, "the restart time")
    if d >= 2 * M:
        return M
    x = d / (2 * M)
    return young_interval(M, d) * (1 + math.sqrt(x) / 3 + x / 9) - d


def log_wall_time_ratio(interval: float, mtbf: float, cost: float, restart: float = 0.0) -> float:
    """ln(T_w/T_s), the logarithm of :func:`expected_wall_time` per second of work:
    ln M + R/M + ln(e^{(τ+δ)/M} − 1) − ln τ, computed without overflow however often failures come
    (e^{(τ+δ)/M} alone overflows a float once (τ+δ)/M passes 709)."""
    tau = _positive(interval, "the checkpoint interval")
    M = _positive(mtbf, "the MTBF")
    d = _non_negative(cost, "the checkpoint cost")
    R = _non_negative(restart, "the restart time")
    b = (tau + d) / M
    log_expm1 = math.log(math.expm1(b)) if b < 50 else b + math.log1p(-math.exp(-b))
    return math.log(M) + R / M + log_expm1 - math.log(tau)


def expected_wall_time(work: float, interval: float, mtbf: float, cost: float, restart: float = 0.0) -> float:
    """Expected wall-clock time to finish ``work`` seconds of computation (Daly 2006, Sec. 3):

        T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ

    for exponential failures with mean M that may also strike during checkpoints and restarts,
    checkpoints of cost δ every τ seconds of work, restarts of R seconds. Exact for this model when
    T_s is a whole number of intervals. Raises ValueError when the time is beyond any float (failures
    come so often, relative to τ + δ + R, that the work practically never finishes).
    """
    _non_negative(work, "the work")
    log_ratio = log_wall_time_ratio(interval, mtbf, cost, restart)
    if log_ratio > 700:
        raise ValueError(f"the expected time is about e^{log_ratio:.0f} times the work: with failures every "
                         f"{mtbf:g} s the job practically never finishes")
    return math.exp(log_ratio) * work


def expected_waste_fraction(interval: float, mtbf: float, cost: float, restart: float = 0.0) -> float:
    """Expected share of wall-clock time not spent on useful work, 1 − T_s/T_w, with T_w from
    :func:`expected_wall_time` (Daly 2006, Sec. 3): 1 − τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1)).

    It counts checkpoint writes, work redone after failures, and restarts. For τ, δ, R ≪ M it is
    close to x/(1+x) with x the first-order overhead δ/τ + (τ+δ)/(2M) + R/M (:func:`first_order_overhead`).
    It tends to 1 (everything wasted) when failures come much faster than τ + δ, and is computed in
    logarithms so that it reaches 1 instead of overflowing.
    """
    # T_w ≥ T_s in this model; rounding can put ln(T_w/T_s) a hair below 0 when M dwarfs τ + δ + R
    return max(0.0, -math.expm1(-log_wall_time_ratio(interval, mtbf, cost, restart)))


def first_order_overhead(interval: float, mtbf: float, cost: float, restart: float = 0.0) -> float:
    """First-order extra time per second of useful work, (T_w − T_s)/T_s ≈ δ/τ + (τ + δ)/(2M) + R/M
    (Young 1974's cost model plus restarts): per interval one checkpoint, and per failure (one every M)
    on average half an interval with its checkpoint redone, plus R."""
    tau = _positive(interval, "the checkpoint interval")
    M = _positive(mtbf, "the MTBF")
    d = _non_negative(cost, "the checkpoint cost")
    R = _non_negative(restart, "the restart time")
    return d / tau + (tau + d) / (2 * M) + R / M


def optimal_interval_numeric(mtbf: float, cost: float, restart: float = 0.0) -> float:
    """The τ minimising :func:`expected_waste_fraction`, by golden-section search on a log scale
    (a reference for checking Young's and Daly's approximations)."""
    M = _positive(mtbf, "the MTBF")
    d = _positive(cost, "the checkpoint cost")
    lo, hi = math.log(d * 1e-4), math.log(100 * M + 100 * d)
    f = lambda x: expected_waste_fraction(math.exp(x), M, d, restart)  # noqa: E731
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, e = b - g * (b - a), a + g * (b - a)
    fc, fe = f(c), f(e)
    for _ in range(200):
        if fc < fe:
            b, e, fe = e, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, e, fe
            e = a + g * (b - a)
            fe = f(e)
    return math.exp((a + b) / 2)


def expected_failures(duration: float, mtbf: float) -> float:
    """Expected failures in ``duration`` seconds: duration / M (Poisson process of rate 1/M)."""
    _non_negative(duration, "the duration")
    return duration / _positive(mtbf, "the MTBF")
