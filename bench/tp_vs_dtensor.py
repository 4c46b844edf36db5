"""Our from-scratch tensor-parallel block vs PyTorch's DTensor tensor parallelism, forward+backward.

Same dense block (same weights), same ranks, same input; both timed in one run, interleaved
iteration by iteration, median over ``--iters``. Prints ours/DTensor per mode (goal: ≤ 1.1x).

    python bench/tp_vs_dtensor.py --ranks 2            # gloo on CPU
    python bench/tp_vs_dtensor.py --ranks 4 --hidden 512 --seq 256
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time


def bench(rank: int, world_size: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from distai.engine.model import GPT, GPTConfig
    from distai.engine.tensor_parallel import (
        TPBlock,
        TPGroup,
        dtensor_parallelize_block,
        reduce_sequence_parallel_grads,
    )

    torch.set_num_threads(args["threads"])
    cfg = GPTConfig(hidden=args["hidden"], heads=args["heads"], seq=args["seq"], layers=1, vocab=8 * world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for sp in (False, True):
        dense = GPT(cfg, seed=0, dtype=torch.float32).block_list()[0]
        tp = TPGroup(sequence_parallel=sp)
        ours = TPBlock(dense, tp, 0)
        theirs = dtensor_parallelize_block(copy.deepcopy(dense), mesh, sp)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(cfg.seq, args["batch"], cfg.hidden, generator=gen)
        if sp:
            x = x.chunk(world_size)[rank].contiguous()

        def step_ours():
            xi = x.clone().requires_grad_()
            ours(xi).sum().backward()
            reduce_sequence_parallel_grads(ours, tp)

        def step_theirs():
            xi = x.clone().requires_grad_()
            y = theirs(xi)
            (y.to_local() if hasattr(y, "to_local") else y).sum().backward()
            if sp:  # DTensor leaves the layer-norm grads Partial: reduce them, as ours does
                for p in theirs.parameters():
                    if p.grad is not None and any(pl.is_partial() for pl in p.grad.placements):
                        p.grad = p.grad.redistribute(placements=p.placements)

        times = {"ours": [], "dtensor": []}
        for i in range(args["warmup"] + args["iters"]):
            order = (("ours", step_ours), ("dtensor", step_theirs))
            for name, fn in (order if i % 2 == 0 else order[::-1]):
                for m in (ours, theirs):
                    m.zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                dist.barrier()
                if i >= args["warmup"]:
                    times[name].append(time.perf_counter() - t0)
        out["tp+sp" if sp else "tp"] = {k: statistics.median(v) for k, v in times.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    from distai.engine.testing import run_in_group

    res = run_in_group(bench, a.ranks, vars(a), timeout_s=600)[0]
    print(f"tensor-parallel block fwd+bwd, T={a.ranks} (gloo, CPU, float32), h={a.hidden} a={a.heads} "
          f"s={a.seq} b={a.batch}, median of {a.iters}")
    for mode, t in res.items():
        print(f"  {mode:6s} ours {t['ours'] * 1e3:8.2f} ms   DTensor {t['dtensor'] * 1e3:8.2f} ms   "
              f"ours/DTensor = {t['ours'] / t['dtensor']:.2f}x  (goal ≤ 1.1x)")


if __name__ == "__main__":
    main()
