"""Expert parallelism vs every expert replicated (plain data parallelism), one training step of the
same MoE GPT on the same ranks and tokens, side by side in one run.

EP shards each layer's experts over the ranks and moves tokens with two all-to-alls per direction;
plain DP keeps all the experts on every rank, runs its own tokens locally and all-reduces every
gradient, the experts' included. Printed: the step time ratio (slowest rank, median of ``--iters``)
and the measured expert-weight bytes per rank.

    python bench/moe_ep.py --ranks 4
    python bench/moe_ep.py --ranks 4 --experts 16 --hidden 256
"""
from __future__ import annotations

from _bench import load_average, options, ratio, slowest_rank_medians, timed_rounds


def bench(rank: int, world_size: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist

    from distai.engine.data_parallel import sgd_step
    from distai.engine.model import GPT, GPTConfig, lm_loss, make_batch
    from distai.engine.moe import (
        MoEConfig,
        apply_ep,
        ep_groups,
        expert_param_bytes,
        make_moe,
        moe_aux_loss,
        sync_moe_grads,
    )

    torch.set_num_threads(args["threads"])
    cfg = GPTConfig(hidden=args["hidden"], heads=args["heads"], seq=args["seq"], layers=args["layers"],
                    vocab=args["vocab"])
    moe = MoEConfig(experts=args["experts"], top_k=args["top_k"])
    ep_group, _ = ep_groups(world_size)  # every rank one EP group: experts sharded E/N per rank
    dp_group, replicas = ep_groups(1)  # EP of one: each rank keeps every expert, replicated over the world
    models = {"ep": apply_ep(make_moe(GPT(cfg, seed=0), moe), ep_group),
              "replicated": apply_ep(make_moe(GPT(cfg, seed=0), moe), dp_group, replicas)}
    ids, targets = make_batch(cfg, args["batch"] * world_size, seed=0)
    mine = slice(rank * args["batch"], (rank + 1) * args["batch"])

    def step(model):
        def run(_round):
            model.zero_grad(set_to_none=True)
            (lm_loss(model(ids[mine]), targets[mine]) + moe_aux_loss(model)).backward()
            sync_moe_grads(model)
            sgd_step(model.parameters(), 0.01)
        return run

    times, _ = timed_rounds({name: step(m) for name, m in models.items()}, args["iters"], args["warmup"],
                            barrier=dist.barrier)
    return {"times": slowest_rank_medians(times), "bytes": {n: expert_param_bytes(m) for n, m in models.items()},
            "total": {n: sum(p.numel() * p.element_size() for p in m.parameters()) for n, m in models.items()}}


def main() -> None:
    a = options(__doc__, ranks=4, experts=8, top_k=2, hidden=128, heads=4, layers=2, seq=64, vocab=256, batch=4,
                iters=10, warmup=2, threads=1).parse_args()
    from distai.engine.testing import run_in_group

    res = run_in_group(bench, a.ranks, vars(a), timeout_s=600)[0]
    t, b, total = res["times"], res["bytes"], res["total"]
    print(f"MoE GPT step, {a.experts} experts top-{a.top_k}, {a.ranks} ranks (gloo, CPU, float32), h={a.hidden} "
          f"layers={a.layers} seq={a.seq} b={a.batch} per rank, median of {a.iters}; {load_average()}")
    print(f"  EP {t['ep'] * 1e3:8.2f} ms   replicated (DP) {t['replicated'] * 1e3:8.2f} ms   "
          + ratio("EP/DP step time", t["ep"], t["replicated"]))
    print(f"  expert weights per rank: EP {b['ep'] / 2**20:.2f} MiB, DP {b['replicated'] / 2**20:.2f} MiB   "
          + ratio("EP/DP expert memory", b["ep"], b["replicated"]))
    print(f"  all weights per rank: EP {total['ep'] / 2**20:.2f} MiB, DP {total['replicated'] / 2**20:.2f} MiB   "
          + ratio("EP/DP weight memory", total["ep"], total["replicated"]))


if __name__ == "__main__":
    main()
