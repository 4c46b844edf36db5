"""Lesson 5 quiz: pipeline schedules, bubbles and activation memory. Answers from :mod:`.formulas`;
texts in ``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build
from . import formulas as f

PS = [2, 4, 8, 16]
MS = [4, 8, 16, 32, 64]


def _accepted(p: int, m: int, v: int) -> bool:
    """Megatron-LM's interleaved schedule: m a multiple of p (so m ≥ p) — where the bubble is
    (p−1)/(v·m + p − 1), the formula the explanation shows. (torch also runs m < p, whose bubble
    :func:`~.formulas.bubble_fraction` computes differently: never drawn here.)"""
    try:
        f.check_schedule("interleaved", p, m, v, engine="megatron")
    except f.ScheduleError:
        return False
    return True


def _worked(p: int = 1, m: int = 0, v: int = 1, schedule: str = "1f1b", target_fraction: float = 0.5) -> dict:
    """The intermediate numbers the explanations show."""
    return {"p1": p - 1, "mp1": m + p - 1, "vmp1": v * m + p - 1, "vp1": v * p - 1,
            "name": {"gpipe": "GPipe", "1f1b": "1F1B"}.get(schedule, schedule),
            "bound": (p - 1) * (1 - target_fraction) / target_fraction}


def _share_and_ratio_differ(p: int, m: int) -> bool:
    """The bubble's share of the step and its ratio to the ideal time differ by a factor 1 + (p−1)/m:
    draw only where that is at least 10%, so the tolerance tells them apart."""
    return (p - 1) / m >= 0.1


GENERATORS = build("lesson5", __package__, values=_worked, kinds=[
    Numeric("bubble-fraction", draw={"p": PS, "m": MS}, where=_share_and_ratio_differ,
            answer=f.bubble_fraction, quantity="fraction", unit="%",
            wrong={"the bubble ratio (p−1)/m": f.bubble_ratio}),
    Numeric("bubble-ratio", draw={"p": PS, "m": MS}, where=_share_and_ratio_differ,
            answer=f.bubble_ratio, quantity="fraction", unit="%",
            wrong={"the bubble share (p−1)/(m+p−1)": f.bubble_fraction}),
    Numeric("step-time", draw={"p": PS, "m": MS}, answer=f.step_time_units, integer=True,
            wrong={"m (no fill and drain)": lambda m: m}),
    Numeric("peak-inflight", draw={"p": PS, "m": MS, "schedule": ["gpipe", "1f1b"]}, variant="schedule",
            answer=f.peak_inflight_microbatches, integer=True),
    Numeric("interleaved", draw={"p": PS[1:], "m": MS, "v": [2, 3, 4]}, where=_accepted,
            answer=f.bubble_fraction, quantity="fraction", unit="%",
            wrong={"the bubble without interleaving": lambda p, m: f.bubble_fraction(p, m)}),
    Numeric("microbatches-needed", draw={"p": [4, 8, 16, 32], "target_fraction": [0.05, 0.1, 0.2]},
            answer=f.microbatches_for_bubble, integer=True),
    Numeric("warmup", draw={"p": [4, 8, 16], "m": lambda p: [2 * p, 4 * p], "rank": lambda p: range(p)},
            answer=lambda p, m, rank: f.warmup_forwards("1f1b", p, m, rank), integer=True),
    Numeric("interleaving-messages", draw={"p": [2, 4, 8, 16], "v": [2, 3, 4]},
            answer=f.interleaved_p2p_factor, wrong={"v times more": lambda v: v}),
    Choice("same-time"),
    Choice("interleaved-cost"),
    Choice("zero-bubble"),
])
