"""Our bucketed, overlapped data parallelism vs torch DDP and vs our all-reduce-after-backward.

Same model (lesson 6's overlap GPT from engine/model.py, fp32), same weights, same ranks, same bucket size, same data; the three are
built side by side and timed step by step in rotating order (each step: forward, backward with
the gradient all-reduce, SGD update; the slowest rank counts), median over ``--steps``.
Prints ours/DDP (goal ≤ 1.15x) and ours/no-overlap.

    python bench/bucketing_vs_ddp.py                       # 2 gloo ranks on CPU
    python bench/bucketing_vs_ddp.py --ranks 4 --bucket-mb 4 --hidden 512 --layers 4
"""
from __future__ import annotations

from _bench import options, ratio, slowest_rank_medians, timed_rounds

MODES = ("overlap", "no-overlap", "ddp")


def bench(rank: int, world_size: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distai.engine.bucketing import BucketedDataParallel
    from distai.engine.model import GPT, GPTConfig, make_batch

    torch.set_num_threads(args["threads"])
    cfg = GPTConfig(vocab=args["vocab"], hidden=args["hidden"], heads=args["heads"], layers=args["layers"],
                    seq=args["seq"])

    def net():
        return GPT(cfg, seed=0)

    cap = args["bucket_mb"]
    models = {
        "overlap": BucketedDataParallel(net(), bucket_cap_mb=cap, overlap=True),
        "no-overlap": BucketedDataParallel(net(), bucket_cap_mb=cap, overlap=False),
        "ddp": DDP(net(), bucket_cap_mb=cap),
    }
    opts = {m: torch.optim.SGD(models[m].parameters(), lr=1e-4) for m in MODES}
    ids, targets = make_batch(cfg, args["batch"], seed=rank)

    def step(mode):
        opts[mode].zero_grad(set_to_none=True)
        models[mode](ids, targets).backward()
        opts[mode].step()

    steps = {mode: lambda _round, mode=mode: step(mode) for mode in MODES}
    times, _ = timed_rounds(steps, args["steps"], args["warmup"], barrier=dist.barrier)
    out: dict = slowest_rank_medians(times)
    same = all(torch.equal(a, b) for a, b in zip(models["overlap"].parameters(), models["ddp"].parameters()))
    out["same_params"] = same
    out["n_buckets"] = len(models["overlap"].buckets)
    out["grad_mib"] = cfg.num_params() * 4 / 2 ** 20
    return out


def main() -> int:
    # lesson 6's overlap model by default (engine/experiments/lesson6.py: --dp-hidden, --dp-layers, --dp-batch)
    a = options(__doc__, ranks=2, hidden=256, layers=2, heads=4, vocab=256, seq=16, batch=(2, "sequences per rank"),
                bucket_mb=4.0, steps=30, warmup=3, threads=1).parse_args()
    from distai.engine.testing import run_in_group

    r = run_in_group(bench, a.ranks, vars(a), timeout_s=600)[0]
    ms = {m: r[m] * 1000 for m in MODES}
    print(f"{a.ranks} gloo ranks, GPT {a.layers}x{a.hidden} ({r['grad_mib']:.1f} MiB of gradients), "
          f"batch {a.batch}x{a.seq} tokens, bucket {a.bucket_mb:g} MiB ({r['n_buckets']} buckets), "
          f"median of {a.steps} steps each")
    print(f"  ours, overlapped       {ms['overlap']:8.2f} ms/step")
    print(f"  ours, after backward   {ms['no-overlap']:8.2f} ms/step")
    print(f"  torch DDP              {ms['ddp']:8.2f} ms/step")
    print(ratio("ours/DDP", ms["overlap"], ms["ddp"], goal=1.15))
    print(ratio("ours/no-overlap", ms["overlap"], ms["no-overlap"])
          + f" (overlap speed-up {ms['no-overlap'] / ms['overlap']:.2f}x)")
    print(f"parameters identical to DDP's after training: {r['same_params']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
