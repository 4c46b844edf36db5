"""``distai calc bubble``: pipeline bubble and memory of GPipe, 1F1B and interleaved 1F1B."""
from __future__ import annotations

from .. import units
from ..calculator import Calculator, Option, choice_name, labels, table
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
        say("head", schedule=choice_name(r["schedule"], lang), p=p, m=m, chunks=say("chunks", v=v) if v > 1 else "",
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
    options=(
        Option("--stages", "whole", short="-p"),
        Option("--microbatches", "whole", short="-m"),
        Option("--schedule", "choice", default="1f1b", choices=f.SCHEDULES),
        Option("--chunks", "whole", default=None,
               short="-v"),
        Option("--engine", "choice",
               default="distai", choices=f.ENGINES),
    ),
    compute=compute,
    text=text,
)
