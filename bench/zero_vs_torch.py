"""Step time of our ZeRO against torch's own, side by side in one run.

Same model, same ranks, same data: DDP, our ZeRO-1/2/3 and torch's FSDP2 are built once each
and timed in interleaved rounds (one step of each strategy per round, so drift in machine load
hits all of them alike); the median step time of each is compared:

* our ZeRO-3 / FSDP2   (goal <= 1.3x: prefetching the next unit's all-gather hides it)
* our ZeRO-1 / DDP and ZeRO-2 / DDP   (goal <= 1.1x)

Run (4 CPU ranks, gloo)::

    python bench/zero_vs_torch.py --nproc 4
    python -m torch.distributed.run --nproc-per-node 4 bench/zero_vs_torch.py   # same, via torchrun

``--d-model/--layers/--vocab/--seq-len/--batch`` size the model, ``--rounds`` the timed steps.
"""
from __future__ import annotations

import os
from dataclasses import replace

from _bench import options, ratio, slowest_rank_medians, timed_rounds

GOALS = {("zero3", "fsdp2"): 1.3, ("zero1", "ddp"): 1.1, ("zero2", "ddp"): 1.1}


def parse_args(argv=None):
    p = options(__doc__, nproc=(4, "ranks to spawn when not under torchrun"), rounds=12, warmup=3, d_model=256,
                layers=4, heads=4, vocab=1024, seq_len=64, batch=(16, "global batch"))
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--no-prefetch", action="store_true", help="turn off ZeRO-3's prefetch (to see it matter)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    return p.parse_args(argv)


def bench(rank: int, world_size: int, args) -> dict:
    import torch
    import torch.distributed as dist

    from distai.engine.experiments.lesson2 import DEFAULT_MODEL, count_params, make_batches, make_trainer

    threads = args.threads or max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    cfg = replace(DEFAULT_MODEL, vocab=args.vocab, hidden=args.d_model, layers=args.layers, heads=args.heads,
                  seq=args.seq_len)
    names = ["ddp", "zero1", "zero2", "fsdp2", "zero3"]
    trainers = {n: make_trainer(n, cfg, rank, world_size, device, "adam", args.precision,
                                prefetch=not args.no_prefetch) for n in names}
    batches = make_batches(cfg, 4, args.batch)

    def barrier():  # a GPU's queued work ends before the clock starts
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(name, r):
        trainers[name].step(batches[r % len(batches)])
        if device.type == "cuda":
            torch.cuda.synchronize()

    times, _ = timed_rounds({n: lambda r, n=n: step(n, r) for n in names}, args.rounds, args.warmup, barrier=barrier)
    return {"median": slowest_rank_medians(times), "params": count_params(cfg), "threads": threads,
            "device": str(device)}


def report(res: dict, world_size: int, args) -> bool:
    med = res["median"]
    print(f"{res['params']:,} parameters, {world_size} ranks on {res['device']} "
          f"({res['threads']} threads each), {args.precision}, median of {args.rounds} interleaved steps")
    for n, t in med.items():
        print(f"  {n:<6} {t * 1e3:8.1f} ms/step")
    for (ours, theirs), goal in GOALS.items():
        print("  " + ratio(f"{ours}/{theirs}:", med[ours], med[theirs], goal=goal))
    return all(med[ours] / med[theirs] <= goal for (ours, theirs), goal in GOALS.items())


def _torchrun_main(args) -> int:
    from distai.engine.runtime import init_distributed, shutdown

    ctx = init_distributed()
    res = bench(ctx.rank, ctx.world_size, args)
    if ctx.rank == 0:
        report(res, ctx.world_size, args)
    shutdown(ctx)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _torchrun_main(args)
    from distai.engine.testing import run_in_group

    res = run_in_group(bench, args.nproc, args, timeout_s=600)[0]
    report(res, args.nproc, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
