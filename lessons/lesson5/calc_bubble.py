"""``distai calc bubble``: pipeline bubble and memory of GPipe, 1F1B and interleaved 1F1B."""
from __future__ import annotations

from .. import units
from ..calculator import Calculator, Option, labels, table
from . import formulas as f


def compute(v: dict) -> dict:
    p, m, schedule, engine = v["stages"], v["microbatches"], v["schedule"], v["engine"]
    chunks = v["chunks"] if v["chunks"] is not None else (2 if schedule == "interleaved" else 1)
    return dict(f.pipeline_bubble(p, m, schedule, chunks, engine), stages=p, microbatches=m, schedule=schedule,
                chunks=chunks, engine=engine)


def text(r: dict, lang: str = "en") -> list[str]:
    p, m, v = r["stages"], r["microbatches"], r["chunks"]
    say = labels("bubble", lang)
    return [
        say("head", schedule=r["schedule"], p=p, m=m, chunks=say("chunks", v=v) if v > 1 else "",
            engine=f.ENGINE_NAMES[r["engine"]]),
        *table([
            (say("fraction"), units.format_percent(r["bubble_fraction"], lang=lang)),
            (say("ratio"), units.format_percent(r["bubble_ratio"], lang=lang)),
            (say("peak"), say("microbatches", n=units.format_number(r["peak_inflight_microbatches"], lang=lang))),
            (say("step"), f"{units.format_number(r['step_time_units'], lang=lang)} × (t_f + t_b)"),
        ]),
    ]


CALCULATOR = Calculator(
    name="bubble",
    help="""Pipeline bubble and memory of GPipe, 1F1B and interleaved 1F1B.

    GPipe (Huang et al. 2019), 1F1B and interleaved (Narayanan et al. 2021); equal stage costs,
    free communication.

    What each engine accepts (--engine): torch.distributed.pipelining (torch) runs GPipe on any m,
    1F1B on m >= p, and interleaved 1F1B in max(1, m // p) equal rounds: any m < p (p = 4, m = 3),
    or m a multiple of m // p (m = 10 on p = 4; not m = 9). Megatron-LM (megatron) has no GPipe,
    runs 1F1B on any m and interleaved on m a multiple of p. distai's own pipeline (distai, the
    default) runs GPipe and 1F1B on any m and interleaved on torch's rule.

    JSON keys: bubble_fraction ((p-1)/(v·m+p-1), share of the step), bubble_ratio ((p-1)/(v·m),
    relative to the ideal time), peak_inflight_microbatches (microbatches of activations the first
    stage holds at once), step_time_units (step time in units of one microbatch's forward+backward on
    one stage), and the inputs stages, microbatches, schedule, chunks, engine.
    """,
    options=(
        Option("--stages", "whole", "Pipeline stages p.", short="-p"),
        Option("--microbatches", "whole", "Microbatches per step m.", short="-m"),
        Option("--schedule", "choice", "gpipe, 1f1b or interleaved.", default="1f1b", choices=f.SCHEDULES),
        Option("--chunks", "whole", "Model chunks per stage v (interleaved only; default 2).", default=None,
               short="-v"),
        Option("--engine", "choice", "Whose rule decides which m a schedule accepts: distai, torch or megatron.",
               default="distai", choices=f.ENGINES),
    ),
    compute=compute,
    text=text,
)
