"""Our pipeline's step time over torch.distributed.pipelining's, side by side in one run; and the
lesson simulator's time for p = 64, m = 1024.

    python bench/pipeline_vs_torch.py [--p 4] [--m 8] [--steps 12] [--d-model 128] [--seq 64]

Both run on the same gloo processes, with the same stage modules (same weights), the same
microbatches and the same loss; their steps alternate (ours, torch's, ours, …) so that machine
noise hits both alike. A step's time is the slowest rank's, from a barrier to the end of its
work; the first two steps of each are warm-up. Goal: ours / torch ≤ 1.1 for 1F1B.
"""
from __future__ import annotations

import sys
import time

from _bench import load_average, options, ratio, slowest_rank_medians


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
            t0 = time.perf_counter()
            sched.step(*((ids,) if first else ()), **({"target": tg, "losses": []} if last else {}))
            t_torch.append(time.perf_counter() - t0)
        warm = args["warmup"]
        out[schedule] = slowest_rank_medians({"ours": t_ours[warm:], "torch": t_torch[warm:]})
    return out


def main(argv=None) -> int:
    args = options(__doc__, p=4, m=8, microbatch_size=4, steps=12, d_model=128, seq=64).parse_args(argv)

    from distai.lessons.lesson5 import simulator as sim

    print(load_average())
    for schedule, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        t0, c0 = time.perf_counter(), time.process_time()
        tl = sim.simulate(schedule, 64, 1024, v)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"simulator {schedule:11s} p=64 m=1024 v={v} ({sum(len(o) for o in tl.order)} blocks, order + "
              f"timeline): {wall * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU")

    from distai.engine.testing import run_in_group

    warm = 2 if args.steps > 3 else 0
    results = run_in_group(_bench, args.p, {"m": args.m, "mb": args.microbatch_size, "steps": args.steps,
                                            "warmup": warm, "d_model": args.d_model, "seq": args.seq}, timeout_s=600)
    print(f"pipeline p={args.p}, m={args.m} microbatches of {args.microbatch_size}, d={args.d_model}, "
          f"seq={args.seq}, gloo on CPU, {args.steps - warm} timed steps each (median of slowest rank):")
    for schedule in ("1f1b", "gpipe", "interleaved"):
        ours, theirs = results[0][schedule]["ours"], results[0][schedule]["torch"]
        print(f"  {schedule:11s} ours {ours * 1e3:7.1f} ms · torch {theirs * 1e3:7.1f} ms · "
              + ratio("ours/torch", ours, theirs, goal=1.1 if schedule == "1f1b" else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
