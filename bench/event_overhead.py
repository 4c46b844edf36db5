"""What emitting events costs, against what a training step costs (target: under 2% of a step).

    python bench/event_overhead.py [--world 4] [--steps 60] [--emits 20000]

1. The cost of one ``EventSink.emit`` of a lesson-1 ``step`` event, writing to a real file
   (median over ``--emits`` calls, in batches).
2. Lesson 1's data-parallel training loop on ``--world`` gloo processes, run twice in the same
   process group, side by side: once emitting its events (rank 0: ``step`` + ``progress`` per
   step, as the experiment does) and once with events off; the median step time of each.
3. The figure: events per step × cost per event ÷ step time, and the measured A/B difference.
Also the cost of tracing one ring all-reduce (one ``ring_step`` event per step per rank).
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

from _bench import options


def emit_cost(n: int) -> float:
    from distai.engine.events import EventSink

    with tempfile.TemporaryDirectory() as d:
        sink = EventSink(0, d)
        batches = []
        per = 500
        for b in range(max(1, n // per)):
            t0 = time.perf_counter()
            for i in range(per):
                sink.emit("step", step=i, of=1000, loss=0.123456789, compute_s=0.00123, comm_s=0.00456,
                          grad_bytes=4612)
            batches.append((time.perf_counter() - t0) / per)
        sink.close()
    return statistics.median(batches)


def _train(rank, world, steps, events_dir):
    import torch

    from distai.engine.data_parallel import train_data_parallel
    from distai.engine.events import EventSink
    from distai.engine.experiments import lesson1
    from distai.engine.model import GPT, make_batch
    from distai.engine.ring import ring_allreduce

    torch.set_num_threads(1)
    batch = 16 * world
    cfg = lesson1.parse_args([]).model  # lesson 1's default GPT
    x, y = make_batch(cfg, batch * 8, seed=1)
    results = {}
    for round_ in range(3):  # alternate on/off, three rounds each
        for mode in ("on", "off"):
            sink = EventSink(rank, events_dir if mode == "on" else None)
            times = []
            last = [time.perf_counter()]

            def on_step(s):
                if rank == 0:
                    sink.emit("step", step=s.step, of=steps, loss=s.loss, compute_s=s.compute_s,
                              comm_s=s.comm_s, grad_bytes=s.grad_bytes)
                    sink.emit("progress", done=s.step + 1, total=steps, label="train")
                now = time.perf_counter()
                times.append(now - last[0])
                last[0] = now

            train_data_parallel(GPT(cfg, seed=0), x, y, steps=steps, batch_size=batch, lr=0.1,
                                rank=rank, world_size=world, on_step=on_step)
            results.setdefault(mode, []).extend(times[1:])
            sink.close()
    # tracing one small ring all-reduce: traced vs not
    t = torch.ones(256)
    sink = EventSink(rank, events_dir)
    traced, plain = [], []
    for i in range(40):
        for lst, tr in ((traced, sink), (plain, None)):
            t0 = time.perf_counter()
            ring_allreduce(t, trace=tr)
            lst.append(time.perf_counter() - t0)
    sink.close()
    return {"on": statistics.median(results["on"]), "off": statistics.median(results["off"]),
            "traced": statistics.median(traced), "plain": statistics.median(plain)}


def main(argv=None) -> int:
    args = options(__doc__, world=4, steps=60, emits=20000).parse_args(argv)

    from distai.engine.testing import run_in_group

    cost = emit_cost(args.emits)
    with tempfile.TemporaryDirectory() as d:
        res = run_in_group(_train, args.world, args.steps, d)[0]
    per_step_events = 2  # rank 0's step + progress
    overhead = per_step_events * cost / res["off"]
    print(f"one emit (lesson-1 step event, to a file): {cost * 1e6:.1f} us")
    print(f"DP training step on {args.world} gloo ranks: median {res['off'] * 1e3:.2f} ms without events, "
          f"{res['on'] * 1e3:.2f} ms with events (A/B difference {100 * (res['on'] / res['off'] - 1):+.1f}%, "
          f"machine noise included)")
    print(f"event overhead: {per_step_events} events x {cost * 1e6:.1f} us / {res['off'] * 1e3:.2f} ms = "
          f"{100 * overhead:.3f}% of a step (target < 2%)")
    n = args.world
    print(f"tracing a 1 KiB ring all-reduce ({2 * (n - 1)} ring_step events per rank): "
          f"{res['traced'] * 1e3:.2f} ms traced vs {res['plain'] * 1e3:.2f} ms plain "
          f"(emits alone: {100 * 2 * (n - 1) * cost / res['plain']:.2f}% of the call)")
    return 0 if overhead < 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
