"""A Monte-Carlo failure simulator: how much of a cluster's time is useful, checkpointing every τ.

The cluster: G GPUs, each failing independently with exponentially distributed lifetimes of mean
``gpu_mtbf``. The job is synchronous, so it stops whenever any GPU fails: job failures form a
Poisson process of rate G / gpu_mtbf, i.e. job MTBF M = gpu_mtbf / G
(:func:`distai.lessons.lesson3.formulas.job_mtbf`). :func:`first_failure_times` draws the first
failure of a cluster GPU by GPU, which the tests use to check that superposition.

The job: it computes for τ (``interval``) seconds, then writes a checkpoint taking C (``cost``)
seconds; an interval counts only once its checkpoint is written. A failure — during the work,
during the checkpoint or during a restart — throws away everything since the last checkpoint and
costs a restart of R (``restart``) seconds before work resumes from that checkpoint. This is the
model of Young (1974) and Daly (2006); here it is *simulated* instead of solved.

The simulation draws a long failure log — K failures, exponential gaps of mean M — and plays the
checkpointing policy against it (:func:`play_log`): after each failure the job restarts (R
seconds; a failure before the restart ends means another restart), then completes as many whole
intervals τ + C as fit before the next failure; the rest of the gap is lost. Goodput is the work
kept over the wall-clock time of the log. Every τ of a sweep is played against the *same* log
(common random numbers), so the goodput curve is smooth in τ and its maximum does not jump with
sampling noise. :func:`sweep` finds the interval with the best simulated goodput; the tests check
that it lands on Daly's interval (within a few tenths of a percent with 200,000 failures) and
that the simulated goodput matches Daly's closed form
(:func:`~distai.lessons.lesson3.formulas.expected_waste_fraction`).

:func:`simulate_timeline` plays one run for a picture: when each failure hit, which GPU failed,
which work was redone.

Pure numpy (no torch), fast enough for a widget: a 41-point sweep over 200,000 failures takes
a fraction of a second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .formulas import daly_interval, expected_waste_fraction, job_mtbf, young_interval

DEFAULT_FAILURES = 200_000


def failure_log(mtbf: float, failures: int = DEFAULT_FAILURES, seed: int = 0) -> np.ndarray:
    """Gaps between consecutive job failures (seconds): ``failures`` draws of Exp(mean ``mtbf``)."""
    if not mtbf > 0:
        raise ValueError(f"the MTBF must be > 0, got {mtbf!r}")
    if failures < 1:
        raise ValueError("the log needs at least one failure")
    return np.random.default_rng(seed).standard_exponential(int(failures)) * float(mtbf)


def play_log(gaps: np.ndarray, interval: float, cost: float, restart: float = 0.0) -> tuple[float, float]:
    """(useful work kept, wall-clock time) when checkpointing every ``interval`` seconds of work
    through the failure log ``gaps``.

    Each gap starts with a restart of ``restart`` seconds; then k = ⌊(gap − R) / (τ + C)⌋ whole
    intervals (work and checkpoint) complete before the next failure, and whatever was under way
    when it struck — work, a checkpoint, or the restart itself — is lost.
    """
    tau = float(interval)
    if not tau > 0 or cost < 0 or restart < 0:
        raise ValueError("the interval must be > 0, cost and restart >= 0")
    kept = np.floor(np.maximum(gaps - restart, 0.0) / (tau + cost))
    return float(kept.sum() * tau), float(gaps.sum())


def goodput(interval: float, mtbf: float, cost: float, restart: float = 0.0,
            failures: int = DEFAULT_FAILURES, seed: int = 0, gaps: np.ndarray | None = None) -> float:
    """Simulated share of wall-clock time spent on useful work at this interval."""
    gaps = failure_log(mtbf, failures, seed) if gaps is None else gaps
    work, wall = play_log(gaps, interval, cost, restart)
    return work / wall


@dataclass
class Sweep:
    """Goodput against the checkpoint interval, simulated, with the formulas' intervals."""

    gpus: int
    gpu_mtbf: float
    cost: float
    restart: float
    mtbf: float  # the job's, gpu_mtbf / gpus
    intervals: np.ndarray
    goodput: np.ndarray  # simulated
    expected: np.ndarray  # Daly's closed form, 1 − expected_waste_fraction
    young: float
    daly: float
    optimum: float  # the simulated optimum (refined between grid points)
    optimum_goodput: float  # simulated goodput at the best grid point
    failures: int

    @property
    def best_index(self) -> int:
        return int(np.argmax(self.goodput))

    def agreement(self) -> float:
        """Relative gap between the simulated optimum and Daly's interval."""
        return abs(self.optimum - self.daly) / self.daly


def default_grid(mtbf: float, cost: float, points: int = 41, span: float = 10.0) -> np.ndarray:
    """Log-spaced intervals around Young's, from ÷span to ×span (capped at 3·M)."""
    y = young_interval(mtbf, cost)
    lo, hi = y / span, min(y * span, 3 * mtbf)
    if hi <= lo * 1.5:
        hi = lo * 1.5
    return np.geomspace(lo, hi, points)


def _refine(x: np.ndarray, y: np.ndarray, i: int, half_width: int = 3) -> float:
    """The maximum of a parabola fitted (least squares, in log τ) to the points around index i."""
    lo, hi = max(0, i - half_width), min(len(x), i + half_width + 1)
    if hi - lo < 3:
        return float(x[i])
    lx = np.log(x[lo:hi])
    a, b, _c = np.polyfit(lx, y[lo:hi], 2)
    if a >= 0:
        return float(x[i])
    peak = min(max(-b / (2 * a), lx[0]), lx[-1])
    return float(math.exp(peak))


def sweep(gpus: int, gpu_mtbf: float, cost: float, restart: float = 0.0, intervals=None,
          failures: int = DEFAULT_FAILURES, seed: int = 0, points: int = 41, span: float = 10.0) -> Sweep:
    """Simulate goodput for each interval against one failure log and locate the optimum.

    The job MTBF is ``gpu_mtbf / gpus``. The optimum is the best grid point, refined by a
    parabola through its neighbours (in log τ) so it is not stuck on the grid.
    """
    if cost <= 0:
        raise ValueError(f"the checkpoint cost must be > 0, got {cost!r}")
    M = job_mtbf(gpu_mtbf, gpus)
    grid = np.asarray(default_grid(M, cost, points, span) if intervals is None else intervals, dtype=float)
    gaps = failure_log(M, failures, seed)
    good = np.array([goodput(t, M, cost, restart, gaps=gaps) for t in grid])
    expected = np.array([1.0 - expected_waste_fraction(t, M, cost, restart) for t in grid])
    i = int(np.argmax(good))
    return Sweep(int(gpus), float(gpu_mtbf), float(cost), float(restart), M, grid, good, expected,
                 young_interval(M, cost), daly_interval(M, cost, restart), _refine(grid, good, i),
                 float(good[i]), int(failures))


def simulated_optimum(mtbf: float, cost: float, restart: float = 0.0, failures: int = DEFAULT_FAILURES,
                      seed: int = 0, points: int = 25, span: float = 3.0) -> float:
    """The interval with the best simulated goodput for a job MTBF ``mtbf`` (one GPU of that MTBF):
    a log grid from Young's interval ÷``span`` to ×``span``, one failure log, parabola refinement."""
    return sweep(1, mtbf, cost, restart, failures=failures, seed=seed, points=points, span=span).optimum


def first_failure_times(gpus: int, gpu_mtbf: float, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw every GPU's lifetime and return (time of the first failure, which GPU) per sample.

    The job stops at the first failure of any of its G GPUs; its mean is gpu_mtbf / G (the
    superposition the failure log relies on). Memory grows as samples × G: for checks, small G.
    """
    rng = np.random.default_rng(seed)
    life = rng.exponential(gpu_mtbf, size=(samples, gpus))
    who = life.argmin(axis=1)
    return life[np.arange(samples), who], who


# ------------------------------------------------------------------------------------ one run, drawn
@dataclass
class Segment:
    kind: str  # "work" (kept), "checkpoint", "lost" (work or checkpoint thrown away), "restart"
    start: float
    end: float


@dataclass
class Timeline:
    segments: list[Segment] = field(default_factory=list)
    failures: list[tuple[float, int]] = field(default_factory=list)  # (time, GPU index)
    horizon: float = 0.0

    def total(self, kind: str) -> float:
        return sum(min(s.end, self.horizon) - s.start for s in self.segments if s.kind == kind and s.start < self.horizon)


def simulate_timeline(gpus: int, gpu_mtbf: float, cost: float, restart: float, interval: float,
                      horizon: float, seed: int = 0) -> Timeline:
    """One run over ``horizon`` seconds of wall clock: work, checkpoints, failures (with the GPU
    that failed, uniform among the G since all fail alike), restarts and lost work."""
    M = job_mtbf(gpu_mtbf, gpus)
    rng = np.random.default_rng(seed)
    tl = Timeline(horizon=float(horizon))
    t = 0.0
    next_fail = rng.exponential(M)
    while t < horizon:
        # work + checkpoint attempt
        if next_fail >= t + interval + cost:
            tl.segments.append(Segment("work", t, t + interval))
            tl.segments.append(Segment("checkpoint", t + interval, t + interval + cost))
            t += interval + cost
            continue
        tl.segments.append(Segment("lost", t, next_fail))
        tl.failures.append((next_fail, int(rng.integers(gpus))))
        t = next_fail
        next_fail = t + rng.exponential(M)
        # restart, which may itself be hit
        while next_fail < t + restart:
            tl.segments.append(Segment("restart", t, next_fail))
            tl.failures.append((next_fail, int(rng.integers(gpus))))
            t = next_fail
            next_fail = t + rng.exponential(M)
        tl.segments.append(Segment("restart", t, t + restart))
        t += restart
    return tl
