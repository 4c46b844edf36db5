"""``distai run lesson5``'s pipeline options, declared and checked once: by the experiment on every
rank, and by ``distai run`` before anything is launched (``[run] launch_plan``), so that a bad value
is one line and exit 2 instead of one rank stopping while the others wait for it. Pure: argparse only.
"""
from __future__ import annotations

import argparse
from typing import NoReturn

from ..arg_errors import argparse_texts
from . import simulator as sim
from .formulas import ScheduleError

__all__ = ["add_options", "check", "launch_ranks"]


def add_options(ap: argparse.ArgumentParser) -> None:
    """The options that shape the pipeline: schedules, microbatches, chunks, steps, torch's run and
    the negative control (a slower stage)."""
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved")
    ap.add_argument("--microbatches", "-m", type=int, default=None)
    ap.add_argument("--chunks", "-v", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--slow-stage", type=int, default=None, metavar="K")
    ap.add_argument("--slow-ms", type=float, default=0.0)


def check(args: argparse.Namespace, p: int) -> tuple[list[str], int, int]:
    """Schedules, m, v for ``p`` ranks, or ScheduleError with a message that says what to change."""
    if p < 2:
        raise ScheduleError.keyed("two_processes")
    schedules = [sim.normalize_schedule(s) for s in args.schedules.split(",") if s.strip()]
    if not schedules:
        raise ScheduleError.keyed("no_schedule")
    m = args.microbatches if args.microbatches is not None else 2 * p
    v = args.chunks
    if m < 1:
        raise ScheduleError.keyed("at_least_1", flag="--microbatches", value=m)
    if "interleaved" in schedules and v < 2:
        raise ScheduleError.keyed("chunks_flag", v=v)
    for s in schedules:
        sim.validate(s, p, m, v if s == "interleaved" else 1)
    if m < p and "1f1b" in schedules and not args.no_torch:
        raise ScheduleError.keyed("fewer_microbatches", m=m, p=p)
    if args.steps < 1:
        raise ScheduleError.keyed("at_least_1", flag="--steps", value=args.steps)
    if args.slow_stage is not None and not 0 <= args.slow_stage < p:
        raise ScheduleError.keyed("slow_stage", last=p - 1, value=args.slow_stage)
    if args.slow_ms < 0:
        raise ScheduleError.keyed("slow_ms", value=args.slow_ms)
    return schedules, m, v


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ScheduleError(message, texts=argparse_texts(message))


def launch_ranks(argv: list[str], ranks: int | None, default: int, cuda: bool) -> int:
    """For ``distai run lesson5``: the options every rank would refuse, refused before the launch."""
    ap = _Parser(add_help=False, allow_abbrev=False)
    add_options(ap)
    args = ap.parse_known_args(argv)[0]
    p = default if ranks is None else ranks
    check(args, p)
    return p
