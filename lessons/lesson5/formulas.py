"""Lesson 5 formulas: pipeline bubbles and activation memory of GPipe, 1F1B and interleaved 1F1B.

Assumptions: p stages of equal cost; each microbatch's forward on one stage takes t_f and its
backward t_b; communication is free. Time unit: t_f + t_b (one microbatch's forward and backward
on one stage).

Sources:
- Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
  NeurIPS 2019, Sec. 2.3: bubble O((K−1)/(M+K−1)), negligible for M ≥ 4K.
- Narayanan et al., "PipeDream-2BW / Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021
  (PipeDream-Flush = 1F1B: same bubble as GPipe, at most p microbatches in flight).
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC 2021, Sec. 2.2: bubble time fraction (p−1)/m (relative to the ideal time), and
  (1/v)·(p−1)/m for the interleaved schedule with v model chunks per device.
- Megatron-LM ``forward_backward_pipelining_with_interleaving`` and torch.distributed.pipelining's
  ``ScheduleInterleaved1F1B`` (``_get_warmup_ops``): rank r runs (v−1)·k + 2(p−1−r) warm-up forward
  chunks, k microbatches per round (p when p divides m), capped at v·m, before its first backward.
Pure Python.
"""
from __future__ import annotations

import math

from ..strings import TranslatedError

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class ScheduleError(TranslatedError):
    """A schedule that cannot be built for these p, m, v (the message says why and what to change, in
    every language: ``lessons/catalog/schedule.toml``)."""

    area = "schedule"


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
        raise ScheduleError.keyed("positive", what=what, value=repr(value))
    return int(value)


def normalize_schedule(name: str) -> str:
    """The canonical name of a schedule (``gpipe``, ``1f1b``, ``interleaved``) from its usual spellings."""
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    aliases = {"gpipe": "gpipe", "1f1b": "1f1b", "pipedreamflush": "1f1b", "pipedream": "1f1b",
               "interleaved": "interleaved", "interleaved1f1b": "interleaved", "i1f1b": "interleaved"}
    if key not in aliases:
        raise ScheduleError.keyed("unknown_schedule", name=repr(name), choices=", ".join(SCHEDULES))
    return aliases[key]


ENGINES = ("distai", "torch", "megatron")  # whose rule decides what a schedule accepts
ENGINE_NAMES = {"distai": "distai.engine.pipeline",
                "torch": "torch.distributed.pipelining", "megatron": "Megatron-LM"}


def check_schedule(schedule: str, p: int, m: int, v: int = 1, engine: str = "distai", *,
                   p2p_overlap: bool = True) -> str:
    """The one place that decides what a schedule accepts; returns its canonical name or raises
    :class:`ScheduleError` saying why. The calculator, the quiz, the simulator and the engine all ask it.

    Every engine: GPipe and 1F1B run one chunk per stage; the interleaved schedule needs v ≥ 2 chunks.
    Then each engine's own rule (``engine``):

    - ``torch`` (torch.distributed.pipelining 2.13): ``ScheduleGPipe`` takes any m; ``Schedule1F1B``
      needs m ≥ p; ``ScheduleInterleaved1F1B`` runs max(1, m // p) rounds and needs m to split into them
      evenly — so any m < p (one round: its docstring's p = 4, m = 3), and m ≥ p a multiple of m // p
      (m = 10 on p = 4: two rounds of 5; m = 9 is refused).
    - ``megatron`` (Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``): no GPipe schedule;
      ``forward_backward_pipelining_without_interleaving`` (1F1B) takes any m;
      ``forward_backward_pipelining_with_interleaving`` needs m to be a multiple of p (with its default
      ``microbatch_group_size_per_vp_stage`` = p) and p ≥ 2; p = 2 only where its point-to-point sends
      overlap the compute (``p2p_overlap``: ``overlap_p2p_comm``, the default since October 2023, accepted
      at p = 2 since May 2024 by ``validate_args`` in ``megatron/training/arguments.py``); without it
      (``--no-overlap-p2p-communication``, or Megatron-LM of 2021-2023, whose sends block) virtual stages
      need p > 2: "pipeline-model-parallel size should be greater than 2".
    - ``distai`` (``distai.engine.pipeline``, the default): GPipe and 1F1B on any m (1F1B's warm-up is
      cut at m when m < p), and interleaved on torch's rule, whose order it runs.
    """
    schedule = normalize_schedule(schedule)
    if engine not in ENGINES:
        raise ScheduleError.keyed("unknown_engine", engine=repr(engine), choices=", ".join(ENGINES))
    p = _positive_int(p, "p (stages)")
    m = _positive_int(m, "m (microbatches)")
    v = _positive_int(v, "v (chunks per stage)")
    if schedule != "interleaved" and v != 1:
        raise ScheduleError.keyed("chunks_only_interleaved", v=v, schedule=schedule)
    if schedule == "interleaved" and v < 2:
        raise ScheduleError.keyed("interleaved_v")
    name = ENGINE_NAMES[engine]
    if engine == "megatron":
        if schedule == "gpipe":
            raise ScheduleError.keyed("megatron_gpipe", name=name)
        if schedule == "interleaved" and p < 2:
            raise ScheduleError.keyed("one_stage", name=name)
        if schedule == "interleaved" and p < 3 and not p2p_overlap:
            raise ScheduleError.keyed("megatron_two_stages", name=name, p=p)
        if schedule == "interleaved" and m % p:
            raise ScheduleError.keyed("megatron_multiple", name=name, p=p, m=m, suggest=p * max(1, m // p))
    if engine == "torch" and schedule == "1f1b" and m < p:
        raise ScheduleError.keyed("torch_1f1b", name=name, m=m, p=p)
    if engine != "megatron" and schedule == "interleaved" and m % (rounds := max(1, m // p)):
        def splits(k: int) -> bool:  # k microbatches in k // p equal rounds (any k < p is one round)
            return k < p or k % (k // p) == 0
        below = next(k for k in range(m - 1, 0, -1) if splits(k))
        above = next(k for k in range(m + 1, m + p + 1) if splits(k))  # the next multiple of p splits
        raise ScheduleError.keyed("rounds", m=m, rounds=rounds, name=name, below=below, above=above, p=p)
    return schedule


def microbatches_per_round(p: int, m: int) -> int:
    """Interleaved 1F1B walks the chunks in rounds of this many microbatches: m // max(1, m // p), which is
    p when p divides m and m itself when m < p (torch.distributed.pipelining
    ``ScheduleInterleaved1F1B.microbatches_per_round``; Megatron-LM's ``microbatch_group_size_per_vp_stage``,
    p by default)."""
    return m // max(1, m // p)


def warmup_forwards(schedule: str, p: int, m: int, rank: int = 0, v: int = 1) -> int:
    """Forwards (chunk forwards when interleaved) ``rank`` runs before its first backward, not counting
    the steady state's first forward:

    - gpipe: m (every forward comes first);
    - 1f1b: min(p − rank − 1, m) (PipeDream-Flush; Megatron-LM
      ``forward_backward_pipelining_without_interleaving``);
    - interleaved: min((v−1)·k + 2(p−1−rank), v·m) with k = ``microbatches_per_round(p, m)``
      (Megatron-LM; torch.distributed.pipelining ``_get_warmup_ops``).
    """
    schedule = check_schedule(schedule, p, m, v)
    if not isinstance(rank, int) or not 0 <= rank < p:
        raise ScheduleError(f"rank must be in 0..{p - 1}, got {rank!r}")
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - rank - 1, m)
    k = microbatches_per_round(p, m)
    return min((v - 1) * k + 2 * (p - 1 - rank), v * m)


def bubble_units(p: int, m: int, v: int = 1) -> float:
    """Idle time of each rank in one step, in units of t_f + t_b: (p−1)/v, the fill and drain.

    GPipe and 1F1B (v = 1): p − 1 (GPipe Sec. 2.3). Interleaved with v chunks: the fill and drain shrink
    to (p−1)/v (Narayanan et al. 2021, Sec. 2.2.2) — while m ≥ p. With fewer microbatches than stages
    (which torch.distributed.pipelining's ScheduleInterleaved1F1B accepts), the pipeline never fills:
    one microbatch's trip through the v·p chunks takes p units and the other m − 1 follow 1/v apart, so
    the step takes p + (m−1)/v and each rank idles p − m + (m−1)/v. v ≥ 2 must be a valid interleaved
    schedule (:func:`check_schedule`).
    """
    check_schedule("interleaved" if v != 1 else "1f1b", p, m, v)
    if m >= p or v == 1:
        return (p - 1) / v
    return p - m + (m - 1) / v


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of the step the pipeline is idle: (p−1)/(v·m + p − 1) when m ≥ p or v = 1 (GPipe, 1F1B:
    (p−1)/(m+p−1), the step takes m + p − 1 units, m of them useful); in general
    :func:`bubble_units` over the step, m of whose units are useful."""
    idle = bubble_units(p, m, v)
    return (p - 1) / (v * m + p - 1) if m >= p or v == 1 else idle / (m + idle)


def bubble_one_slow_stage(p: int, m: int, slowdown: float) -> float:
    """GPipe's bubble when one of the p stages takes ``slowdown`` times the others' time (forward
    and backward alike): the first microbatch crosses every stage, the m − 1 behind it are paced by
    the slowest, so the step is Σt + (m − 1)·t_max for m·Σt of work per rank-sum. With t = 1 and
    one stage at ``slowdown``: 1 − m·(p − 1 + s) / (p·(p − 1 + s + (m − 1)·s)); s = 1 gives
    (p−1)/(m+p−1). 1F1B's bubble is the same when the slow stage is the last, smaller otherwise
    (the simulator replays both: ``simulator.replay``)."""
    check_schedule("gpipe", p, m)
    if slowdown < 1:
        raise ScheduleError(f"slowdown must be >= 1 (one stage slower than the others), got {slowdown}")
    total = p - 1 + slowdown
    return 1 - m * total / (p * (total + (m - 1) * slowdown))


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal time: (p−1)/m, and (p−1)/(v·m) interleaved (Narayanan et al. 2021, Sec. 2.2),
    when m ≥ p; in general :func:`bubble_units` over m."""
    idle = bubble_units(p, m, v)
    return (p - 1) / (v * m) if m >= p or v == 1 else idle / m


def step_time_units(p: int, m: int, v: int = 1) -> float:
    """Step time in units of t_f + t_b: m + (p−1)/v (m useful units plus the fill and drain); with fewer
    microbatches than stages, interleaved, p + (m−1)/v (:func:`bubble_units`)."""
    return m + bubble_units(p, m, v)


def peak_inflight_microbatches(p: int, m: int, schedule: str, v: int = 1, rank: int = 0) -> float:
    """Most microbatches whose activations ``rank`` (the first stage by default, which holds the most)
    has at once, in units of one microbatch's activations for the whole stage: its warm-up forwards
    plus the steady state's first, capped at all of them, each chunk holding 1/v of the stage:
    min(warm-up + 1, v·m)/v.

    - gpipe: m (all forwards run before any backward; GPipe Sec. 2.3);
    - 1f1b: min(p − rank, m);
    - interleaved: min((v−1)·k + 2(p−1) + 1, v·m)/v, = p + (p−1)/v when p divides m — slightly more than
      1F1B (Korthikanti et al. 2022, Sec. 4.2.3: the first stage of the interleaved schedule holds
      p·(1 + (p−1)/(p·v)) microbatches' activations).
    """
    schedule = check_schedule(schedule, p, m, v)
    return min(warmup_forwards(schedule, p, m, rank, v) + 1, v * m) / v


def interleaved_p2p_factor(p: int, v: int) -> float:
    """How many times more point-to-point messages interleaving sends: a microbatch crosses v·p − 1
    chunk boundaries instead of p − 1 (the hop from the last rank back to the first is one of them):
    (v·p − 1)/(p − 1)."""
    p = _positive_int(p, "p (stages)")
    v = _positive_int(v, "v (chunks per stage)")
    if p < 2:
        raise ScheduleError("one stage sends no point-to-point messages (p must be at least 2)")
    return (v * p - 1) / (p - 1)


def pipeline_bubble(p: int, m: int, schedule: str = "1f1b", v: int = 1, engine: str = "distai") -> dict:
    """All of the above for one schedule: {"bubble_fraction", "bubble_ratio",
    "peak_inflight_microbatches", "step_time_units"}, after :func:`check_schedule` accepted it on ``engine``."""
    schedule = check_schedule(schedule, p, m, v, engine)
    return {
        "bubble_fraction": bubble_fraction(p, m, v),
        "bubble_ratio": bubble_ratio(p, m, v),
        "peak_inflight_microbatches": peak_inflight_microbatches(p, m, schedule, v),
        "step_time_units": step_time_units(p, m, v),
    }


def microbatches_for_bubble(p: int, target_fraction: float, v: int = 1) -> int:
    """Fewest microbatches m with bubble_fraction(p, m, v) ≤ target: m ≥ (p−1)(1−f)/(f·v)."""
    p = _positive_int(p, "p (stages)")
    if not 0 < target_fraction < 1:
        raise ValueError("the target bubble fraction must be between 0 and 1")
    m = max(1, math.ceil((p - 1) * (1 - target_fraction) / (target_fraction * v) - 1e-12))
    while True:  # interleaved (v ≥ 2) skips the m the schedule refuses
        try:
            if bubble_fraction(p, m, v) <= target_fraction:
                return m
        except ScheduleError:
            pass
        m += 1
