"""How long Python's garbage collector stops the tutor, with Python's thresholds and with the tutor's own.

A learner's pace, headless at 120×40: every lesson opened in turn, its first ``--steps`` steps shown
``--seconds`` each (the visualizers animating), then home. Each configuration runs in a fresh process
of its own (the same walk, one after the other), timing every collection with ``gc.callbacks``: how many
full (generation 2) collections ran, the longest of them and of any collection (the screen is frozen
while one runs), how many took over 50 ms, the seconds spent
collecting, and the process's peak memory. The tutor sets its thresholds in ``DistaiApp.run``
(``tutor/app.py``'s ``GC_THRESHOLDS``); Pilot's ``run_test`` does not call it, so each process sets them.

Usage: python bench/tutor_gc.py [--seconds 1.0] [--steps 5]
"""
from __future__ import annotations

import json
import subprocess
import sys

from _bench import load_average, options

WALK = r"""
import asyncio, gc, json, resource, sys, time
from distai.lessons.registry import all_lessons
from distai.tutor.app import GC_THRESHOLDS, DistaiApp

if sys.argv[1] == "tutor":
    gc.set_threshold(*GC_THRESHOLDS)
seconds, steps = float(sys.argv[2]), int(sys.argv[3])
times = {"start": 0.0, "by": [0.0, 0.0, 0.0], "count": [0, 0, 0], "longest_full": 0.0, "longest": 0.0, "over_50ms": 0}

def timed(phase, info):
    if phase == "start":
        times["start"] = time.perf_counter()
        return
    g, took = info["generation"], time.perf_counter() - times["start"]
    times["by"][g] += took
    times["count"][g] += 1
    times["longest"] = max(times["longest"], took)
    times["over_50ms"] += took > 0.05  # two frames of a 25-frame/s animation
    if g == 2:
        times["longest_full"] = max(times["longest_full"], took)

async def walk():
    app = DistaiApp("en")
    async with app.run_test(size=(120, 40)) as pilot:
        gc.callbacks.append(timed)
        t0 = time.perf_counter()
        for lesson in all_lessons():
            app.open_lesson(lesson.id)
            await pilot.pause()
            for i in range(min(steps, len(lesson.steps))):
                await app.screen.show_step(i)
                await pilot.pause(seconds)
            app.go_home()
            await pilot.pause()
        wall = time.perf_counter() - t0
        gc.callbacks.remove(timed)
    return wall

wall = asyncio.run(walk())
print(json.dumps({"wall_s": wall, "thresholds": gc.get_threshold(), **times,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(which: str, seconds: float, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", WALK, which, str(seconds), str(steps)], capture_output=True,
                         text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = options(__doc__, seconds=(1.0, "seconds each step is shown"),
                   steps=(5, "steps shown of each lesson")).parse_args()
    print(f"tutor_gc: every lesson, {args.steps} steps of {args.seconds:g} s each, 120x40 headless; {load_average()}")
    rows = {name: run(name, args.seconds, args.steps) for name in ("python", "tutor")}
    print(f"{'thresholds':<22}{'walk':>8}{'full GCs':>10}{'longest':>10}{'any GC':>9}{'> 50 ms':>9}{'GC total':>10}{'peak RSS':>10}")
    for name, r in rows.items():
        label = f"{name} {tuple(r['thresholds'])}"
        print(f"{label:<22}{r['wall_s']:>7.1f}s{r['count'][2]:>10}{r['longest_full'] * 1e3:>8.0f}ms"
              f"{r['longest'] * 1e3:>7.0f}ms{r['over_50ms']:>9}"
              f"{sum(r['by']):>9.2f}s{r['peak_mb']:>8.0f}MB")
    py, tu = rows["python"], rows["tutor"]
    print(f"ratio python/tutor: GC seconds {sum(py['by']) / max(sum(tu['by']), 1e-9):.1f}x, "
          f"full collections {py['count'][2]} vs {tu['count'][2]}, longest pause "
          f"{py['longest'] / max(tu['longest'], 1e-9):.1f}x, peak memory {tu['peak_mb'] / py['peak_mb']:.2f}x")


if __name__ == "__main__":
    main()
