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
  ``ScheduleInterleaved1F1B`` (``_get_warmup_ops``): rank r runs (v−1)·p + 2(p−1−r) warm-up forward
  chunks, capped at v·m, before its first backward.
Pure Python.
"""
from __future__ import annotations

import math

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of the step the pipeline is idle: (p−1)/(v·m + p − 1).

    GPipe and 1F1B (v = 1): (p−1)/(m+p−1) — the step takes (m + p − 1) units, m of them useful
    (GPipe Sec. 2.3). Interleaved with v chunks: the fill and drain shrink to (p−1)/v units
    (Narayanan et al. 2021, Sec. 2.2.2), so (p−1)/v / (m + (p−1)/v).
    """
    p = _positive_int(p, "the number of stages")
    m = _positive_int(m, "the number of microbatches")
    v = _positive_int(v, "the number of chunks")
    return (p - 1) / (v * m + p - 1)


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal time: (p−1)/m, and (p−1)/(v·m) interleaved (Narayanan et al. 2021, Sec. 2.2)."""
    p = _positive_int(p, "the number of stages")
    m = _positive_int(m, "the number of microbatches")
    v = _positive_int(v, "the number of chunks")
    return (p - 1) / (v * m)


def step_time_units(p: int, m: int, v: int = 1) -> float:
    """Step time in units of t_f + t_b: m + (p−1)/v (m useful units plus the fill and drain)."""
    p = _positive_int(p, "the number of stages")
    m = _positive_int(m, "the number of microbatches")
    v = _positive_int(v, "the number of chunks")
    return m + (p - 1) / v


def interleaved_warmup_chunks(p: int, m: int, v: int, rank: int = 0) -> int:
    """Warm-up forward chunks of ``rank`` in interleaved 1F1B: min((v−1)·p + 2(p−1−rank), v·m)
    (Megatron-LM; torch.distributed.pipelining ``_get_warmup_ops`` with microbatches_per_round = p)."""
    p = _positive_int(p, "the number of stages")
    m = _positive_int(m, "the number of microbatches")
    v = _positive_int(v, "the number of chunks")
    if not 0 <= rank < p:
        raise ValueError(f"rank must be in 0..{p - 1}, got {rank!r}")
    return min((v - 1) * p + 2 * (p - 1 - rank), v * m)


def onef1b_warmup_forwards(p: int, m: int, rank: int = 0) -> int:
    """Warm-up forwards of ``rank`` in 1F1B before its first backward: min(p − rank − 1, m)
    (PipeDream-Flush; Megatron-LM ``forward_backward_pipelining_without_interleaving``)."""
    p = _positive_int(p, "the number of stages")
    m = _positive_int(m, "the number of microbatches")
    if not 0 <= rank < p:
        raise ValueError(f"rank must be in 0..{p - 1}, got {rank!r}")
    return min(p - rank - 1, m)


def peak_inflight_microbatches(p: int, m: int, schedule: str, v: int = 1) -> float:
    """Most microbatches whose activations the first stage holds at once, in units of one microbatch's
    activations for the whole stage:

    - gpipe: m (all forwards run before any backward; GPipe Sec. 2.3);
    - 1f1b: min(p, m) (p−1 warm-up forwards, then one more forward before each backward);
    - interleaved: min((v−1)·p + 2(p−1) + 1, v·m) chunk-activations, each 1/v of the stage's
      layers, so min(v·p + p − 1, v·m)/v = p + (p−1)/v when m ≥ p + (p−1)/v — slightly more than 1F1B
      (Narayanan et al. 2021 Sec. 2.2.2 notes the extra memory; warm-up count from Megatron-LM).
    """
    p = _positive_int(p, "the number of stages")
    m = _positive_int(m, "the number of microbatches")
    v = _positive_int(v, "the number of chunks")
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p, m))
    if schedule == "interleaved":
        chunks = min(interleaved_warmup_chunks(p, m, v, 0) + 1, v * m)
        return chunks / v
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def pipeline_bubble(p: int, m: int, schedule: str = "1f1b", v: int = 1) -> dict:
    """All of the above for one schedule: {"bubble_fraction", "bubble_ratio",
    "peak_inflight_microbatches", "step_time_units"}. GPipe and 1F1B ignore ``v`` (it must be 1);
    interleaved needs v ≥ 2 chunks."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    v = _positive_int(v, "the number of chunks")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"{schedule} has one chunk per stage; --chunks is for the interleaved schedule")
    if schedule == "interleaved" and v < 2:
        raise ValueError("the interleaved schedule needs at least 2 chunks per stage")
    return {
        "bubble_fraction": bubble_fraction(p, m, v),
        "bubble_ratio": bubble_ratio(p, m, v),
        "peak_inflight_microbatches": peak_inflight_microbatches(p, m, schedule, v),
        "step_time_units": step_time_units(p, m, v),
    }


def microbatches_for_bubble(p: int, target_fraction: float, v: int = 1) -> int:
    """Fewest microbatches m with bubble_fraction(p, m, v) ≤ target: m ≥ (p−1)(1−f)/(f·v)."""
    p = _positive_int(p, "the number of stages")
    if not 0 < target_fraction < 1:
        raise ValueError("the target bubble fraction must be between 0 and 1")
    m = max(1, math.ceil((p - 1) * (1 - target_fraction) / (target_fraction * v) - 1e-12))
    while bubble_fraction(p, m, v) > target_fraction:
        m += 1
    return m
