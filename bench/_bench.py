"""What the bench scripts share: their command line, timing rivals side by side, and the ratio lines.

Each script runs as ``python bench/NAME.py`` from the repository root; Python puts ``bench/`` first
on the module path then, so ``from _bench import ...`` finds this file.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable


def options(doc: str, **defaults) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first paragraph, with one ``--name`` option per keyword, typed
    like its default (``bucket_mb=4.0`` gives ``--bucket-mb``, a float); ``(default, help)`` adds a help."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0].strip())
    for name, value in defaults.items():
        default, help_text = value if isinstance(value, tuple) else (value, None)
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=help_text)
    return parser


def load_average() -> str:
    """The machine's load beside a timing: a busy machine explains a noisy ratio."""
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def timed_rounds(steps: dict[str, Callable[[int], object]], rounds: int, warmup: int = 0,
                 barrier: Callable[[], object] | None = None) -> tuple[dict[str, list[float]], dict[str, list]]:
    """Each of ``steps`` called once a round with the round's number, in an order that rotates from
    round to round (a slow moment of the machine hits every rival alike), each timed from
    ``barrier()`` (all ranks start together) to its return. The first ``warmup`` rounds are not kept.
    Returns name -> seconds per kept round, and name -> what the step returned in those rounds."""
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    values: dict[str, list] = {name: [] for name in names}
    for r in range(warmup + rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if barrier is not None:
                barrier()
            t0 = time.perf_counter()
            value = steps[name](r)
            elapsed = time.perf_counter() - t0
            if r >= warmup:
                times[name].append(elapsed)
                values[name].append(value)
    return times, values


def slowest_rank_medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Inside a process group: each rival's median step time, a step lasting as long as its slowest
    rank (an element-wise MAX all-reduce of every rank's times, then the median)."""
    import torch
    import torch.distributed as dist

    out = {}
    for name, seconds in times.items():
        t = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[name] = statistics.median(t.tolist())
    return out


def ratio(label: str, ours: float, theirs: float, goal: float | None = None) -> str:
    """``label 1.07x``, and against a goal ``(goal <= 1.15x: met)``; below 1 ours is faster."""
    r = ours / theirs
    line = f"{label} {r:.2f}x"
    return line + (f" (goal <= {goal:g}x: {'met' if r <= goal else 'NOT met'})" if goal is not None else "")
