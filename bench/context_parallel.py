"""Causal attention of one long sequence, forward+backward: ring attention vs the all-gather variant vs
one process, side by side.

Each rank holds s/cp tokens (zigzag layout) of the same q, k, v; the ring and the all-gather variant
run on ``--ranks`` gloo processes, the reference is PyTorch's ``scaled_dot_product_attention`` of the
whole sequence on one process (timed on rank 0 while the others wait, so it has the CPU cores it
would have alone). All interleaved round by round, a step lasting as long as its slowest rank,
medians over ``--iters``. PyTorch's own ``context_parallel`` is tried too; where it does not run
(CPU/gloo in torch 2.13 has no sharding strategy for its SDPA kernel) the reason is printed.

    python bench/context_parallel.py --ranks 4
    python bench/context_parallel.py --ranks 4 --seq 4096 --layout contiguous
"""
from __future__ import annotations

from _bench import load_average, options, ratio, slowest_rank_medians, timed_rounds


def bench(rank: int, world_size: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from distai.engine import context_parallel as C

    torch.set_num_threads(args["threads"])
    b, H, G, s, d = args["batch"], args["heads"], args["kv_heads"], args["seq"], args["head_dim"]
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(b, n, s, d, generator=gen) for n in (H, G, G, H))
    layouts = {variant: C.CPGroup(None, args["layout"], variant) for variant in ("ring", "allgather")}
    pos = layouts["ring"].positions(s)
    mine = [t[:, :, pos].contiguous() for t in (q, k, v, dout)]

    def step_cp(variant):
        def step(_round):
            ql, kl, vl = (t.clone().requires_grad_() for t in mine[:3])
            C.ring_attention(ql, kl, vl, layouts[variant]).backward(mine[3])
        return step

    def step_one(_round):
        if rank == 0:  # the others wait at the barrier: the whole sequence on one process
            ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
            C.attention_reference(ql, kl, vl).backward(dout)

    steps = {"ring": step_cp("ring"), "allgather": step_cp("allgather"), "one": step_one}
    times, _ = timed_rounds(steps, args["iters"], args["warmup"], barrier=dist.barrier)
    out = slowest_rank_medians(times)
    try:  # PyTorch's own context parallelism, where it runs
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cpu", (world_size,))
        buffers = [q.clone(), *(t.repeat_interleave(H // G, dim=1) for t in (k, v))]  # its SDPA wants MHA
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2], no_restore_buffers=set(buffers)):
            F.scaled_dot_product_attention(*buffers, is_causal=True)
        out["torch"] = "runs (not timed here)"
    except (NotImplementedError, RuntimeError) as exc:
        out["torch"] = f"does not run: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return out


def main() -> None:
    a = options(__doc__, ranks=4, seq=2048, batch=1, heads=8, kv_heads=2, head_dim=64, layout="zigzag",
                iters=10, warmup=2, threads=1).parse_args()
    from distai.engine.testing import run_in_group

    res = run_in_group(bench, a.ranks, vars(a), timeout_s=900)[0]
    print(f"causal attention fwd+bwd, s={a.seq} b={a.batch} heads {a.heads} (K/V {a.kv_heads}) d={a.head_dim}, "
          f"cp={a.ranks} ({a.layout}, gloo, CPU, float32, {a.threads} thread/rank), median of {a.iters}; "
          f"{load_average()}")
    print(f"  ring {res['ring'] * 1e3:9.2f} ms   all-gather {res['allgather'] * 1e3:9.2f} ms   "
          f"one process {res['one'] * 1e3:9.2f} ms")
    print("  " + ratio("ring/one process", res["ring"], res["one"]) + "   "
          + ratio("all-gather/one process", res["allgather"], res["one"]) + "   "
          + ratio("ring/all-gather", res["ring"], res["allgather"]))
    print(f"  torch.distributed.tensor.experimental.context_parallel: {res['torch']}")


if __name__ == "__main__":
    main()
