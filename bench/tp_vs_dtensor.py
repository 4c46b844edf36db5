"""Our from-scratch tensor-parallel block vs PyTorch's DTensor tensor parallelism, forward+backward.

Same dense block (same weights), same ranks, same input; both timed in one run, interleaved
iteration by iteration (a step lasts as long as its slowest rank), median over ``--iters``.
Prints ours/DTensor per mode (goal: ≤ 1.1x).

    python bench/tp_vs_dtensor.py --ranks 2            # gloo on CPU
    python bench/tp_vs_dtensor.py --ranks 4 --hidden 512 --seq 256
"""
from __future__ import annotations

import copy

from _bench import options, ratio, slowest_rank_medians, timed_rounds


def bench(rank: int, world_size: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from distai.engine.model import GPT, GPTConfig
    from distai.engine.tensor_parallel import (
        TPGroup,
        apply_tp_block,
        dtensor_parallelize_block,
        sync_tp_grads,
    )

    torch.set_num_threads(args["threads"])
    cfg = GPTConfig(hidden=args["hidden"], heads=args["heads"], seq=args["seq"], layers=1, vocab=8 * world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for sp in (False, True):
        dense = GPT(cfg, seed=0, dtype=torch.float32).block_list()[0]
        tp = TPGroup(sequence_parallel=sp)
        ours = apply_tp_block(copy.deepcopy(dense), tp)
        theirs = dtensor_parallelize_block(copy.deepcopy(dense), mesh, sp)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(cfg.seq, args["batch"], cfg.hidden, generator=gen)
        if sp:
            x = x.chunk(world_size)[rank].contiguous()

        def step_ours(_round):
            ours.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            ours(xi).sum().backward()
            sync_tp_grads(ours, tp)

        def step_theirs(_round):
            theirs.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            y = theirs(xi)
            (y.to_local() if hasattr(y, "to_local") else y).sum().backward()
            if sp:  # DTensor leaves the layer-norm grads Partial: reduce them, as ours does
                for p in theirs.parameters():
                    if p.grad is not None and any(pl.is_partial() for pl in p.grad.placements):
                        p.grad = p.grad.redistribute(placements=p.placements)

        times, _ = timed_rounds({"ours": step_ours, "dtensor": step_theirs}, args["iters"], args["warmup"],
                                barrier=dist.barrier)
        out["tp+sp" if sp else "tp"] = slowest_rank_medians(times)
    return out


def main() -> None:
    a = options(__doc__, ranks=2, hidden=256, heads=8, seq=128, batch=4, iters=20, warmup=3, threads=1).parse_args()
    from distai.engine.testing import run_in_group

    res = run_in_group(bench, a.ranks, vars(a), timeout_s=600)[0]
    print(f"tensor-parallel block fwd+bwd, T={a.ranks} (gloo, CPU, float32), h={a.hidden} a={a.heads} "
          f"s={a.seq} b={a.batch}, median of {a.iters}")
    for mode, t in res.items():
        print(f"  {mode:6s} ours {t['ours'] * 1e3:8.2f} ms   DTensor {t['dtensor'] * 1e3:8.2f} ms   "
              + ratio("ours/DTensor", t["ours"], t["dtensor"], goal=1.1))


if __name__ == "__main__":
    main()
