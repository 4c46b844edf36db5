"""Our pipeline's step time over torch.distributed.pipelining's, side by side in one run; and the
lesson simulator's time for p = 64, m = 1024.

    python bench/pipeline_vs_torch.py [--p 4] [--m 8] [--steps 12] [--d-model 128] [--seq 64]

Both run on the same gloo processes, with the same stage modules (same weights), the same
microbatches and the same loss; their steps alternate (ours, torch's, ours, …) so that machine
noise hits both alike. A step's time is the slowest rank's, from a barrier to the end of its
work; the first two steps of each are warm-up. Goal: ours / torch ≤ 1.1 for 1F1B.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def _bench(rank: int, p: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    from distai.engine import pipeline as pl

    torch.set_num_threads(1)
    m, mb, steps = args["m"], args["mb"], args["steps"]
    from distai.engine.model import GPTConfig

    cfg = GPTConfig(hidden=args["d_model"], heads=4, seq=args["seq"], vocab=256,
                    layers=pl.default_layers(p, 2), tie_embeddings=False)
    ids, tg = pl.make_batch(cfg, m * mb)
    out = {}
    for schedule, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        ours_chunks = pl.build_rank_chunks(cfg, p, v, rank)
        runner = pl.PipelineRunner(ours_chunks, rank=rank, p=p, m=m, schedule=schedule, v=v, microbatch_size=mb)
        runner.validate()
        theirs = pl.build_rank_chunks(cfg, p, v, rank)
        stages = [PipelineStage(theirs[c * p + rank], c * p + rank, p * v, torch.device("cpu")) for c in range(v)]
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(schedule)
        sched = cls(stages[0], m, loss_fn=pl.loss_fn) if cls else ScheduleInterleaved1F1B(stages, m, loss_fn=pl.loss_fn)
        first, last = 0 in ours_chunks, p * v - 1 in ours_chunks
        mbs_in = pl.microbatches(ids, m) if first else None
        mbs_tg = pl.microbatches(tg, m) if last else None
        t_ours, t_torch = [], []
        for _ in range(steps):
            for mod in ours_chunks.values():
                mod.zero_grad(set_to_none=True)
            res = runner.step(mbs_in, mbs_tg)  # starts with a barrier
            t_ours.append(res.t_end - res.t_start)
            for mod in theirs.values():
                mod.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.time()
            sched.step(*((ids,) if first else ()), **({"target": tg, "losses": []} if last else {}))
            t_torch.append(time.time() - t0)
        out[schedule] = (t_ours, t_torch)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args(argv)

    import os

    from distai.lessons.lesson5 import simulator as sim

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for schedule, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        t0, c0 = time.perf_counter(), time.process_time()
        tl = sim.simulate(schedule, 64, 1024, v)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"simulator {schedule:11s} p=64 m=1024 v={v} ({sum(len(o) for o in tl.order)} blocks, order + "
              f"timeline): {wall * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU")

    from distai.engine.testing import run_in_group

    results = run_in_group(_bench, args.p, {"m": args.m, "mb": args.microbatch_size, "steps": args.steps,
                                            "d_model": args.d_model, "seq": args.seq}, timeout_s=600)
    warm = 2 if args.steps > 3 else 0
    print(f"pipeline p={args.p}, m={args.m} microbatches of {args.microbatch_size}, d={args.d_model}, "
          f"seq={args.seq}, gloo on CPU, {args.steps - warm} timed steps each (median of slowest rank):")
    ratio_1f1b = None
    for schedule in ("1f1b", "gpipe", "interleaved"):
        ours = statistics.median(max(r[schedule][0][i] for r in results) for i in range(warm, args.steps))
        theirs = statistics.median(max(r[schedule][1][i] for r in results) for i in range(warm, args.steps))
        ratio = ours / theirs
        if schedule == "1f1b":
            ratio_1f1b = ratio
        print(f"  {schedule:11s} ours {ours * 1e3:7.1f} ms · torch {theirs * 1e3:7.1f} ms · ours/torch {ratio:.2f}x")
    print(f"goal 1F1B ours/torch <= 1.1x: {'met' if ratio_1f1b <= 1.1 else 'NOT met'} ({ratio_1f1b:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
