"""Our from-scratch ring all-reduce against ``dist.all_reduce``, side by side in one run.

    python bench/ring_vs_allreduce.py [--world 4] [--sizes-mib 16 32 64] [--iters 7] [--pieces auto]

Spawns ``--world`` processes in one process group (gloo on CPU; NCCL with ``--cuda``), and for
each message size times the two implementations in alternation (ring, all_reduce, ring, …)
so both see the same machine load, then prints the median time, algbw = S/t and
busbw = algbw·2(N-1)/N (nccl-tests' definitions) and the ratio of our busbw to theirs.
The issue's target: ratio >= 0.9 at 16 MiB and above.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _bench(rank: int, world: int, sizes: list[int], iters: int, pieces, cuda: bool) -> dict:
    import torch
    import torch.distributed as dist

    from distai.engine.ring import ring_allreduce

    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    results = {}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        impls = {"ring": lambda: ring_allreduce(x, pieces=pieces), "all_reduce": lambda: dist.all_reduce(x)}
        for fn in impls.values():  # warm up: connections, scratch buffers
            fn()
        times = {name: [] for name in impls}
        for _ in range(iters):
            for name, fn in impls.items():
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
        # the slowest rank decides a collective's time
        med = torch.tensor([statistics.median(times[n]) for n in impls], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        results[size] = dict(zip(impls, med.tolist()))
    return results


def _worker(rank, world, port, sizes, iters, pieces, cuda, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    out = _bench(rank, world, sizes, iters, pieces, cuda)
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 32, 64])
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--pieces", default="auto", help="sub-chunks per chunk (auto: ~1 MiB each)")
    parser.add_argument("--cuda", action="store_true", help="NCCL on CUDA devices instead of gloo on CPU")
    args = parser.parse_args(argv)

    import torch.multiprocessing as mp

    from distai.engine.testing import free_port
    from distai.lessons.lesson1.formulas import busbw

    sizes = [int(s * (1 << 20)) // 4 * 4 for s in args.sizes_mib]
    pieces = None if args.pieces == "auto" else int(args.pieces)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(args.world, free_port(), sizes, args.iters, pieces, args.cuda, queue),
                       nprocs=args.world, join=True, start_method="spawn")
    results = queue.get()
    n = args.world
    print(f"{'backend':8} N={n}  iters={args.iters}  pieces={args.pieces}")
    print(f"{'size':>10} {'ring ms':>9} {'ring busbw':>11} {'ar ms':>9} {'ar busbw':>10} {'ratio':>6}")
    ratios = []
    for size in sizes:
        r = results[size]
        ring_bus = busbw(size, r["ring"], n)
        ar_bus = busbw(size, r["all_reduce"], n)
        ratio = ring_bus / ar_bus
        ratios.append(ratio)
        print(f"{size / (1 << 20):8.1f}Mi {r['ring'] * 1e3:9.2f} {ring_bus / 1e9:9.3f}GB/s "
              f"{r['all_reduce'] * 1e3:9.2f} {ar_bus / 1e9:8.3f}GB/s {ratio:6.2f}")
    print(f"busbw ratio ring / dist.all_reduce at >=16 MiB: min {min(ratios):.2f}, "
          f"median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
