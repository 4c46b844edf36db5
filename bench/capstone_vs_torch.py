"""Our 3D-parallel training step against the same mesh built from PyTorch's own pieces, side by
side in one run.

    python bench/capstone_vs_torch.py [--pp 2 --dp 2 --tp 2] [--hidden 64] [--seq 32] [--steps 10]

Both sides train the same GPT (same weights, same batches, SGD with momentum) on one device mesh
of shape (pp, dp, tp) over gloo processes:

* ours: :class:`distai.engine.mesh.MeshTrainer` (lesson 4's TP blocks with sequence
  parallelism, lesson 5's 1F1B runner, lesson 6's bucketed DP all-reduce; and with lesson 2's
  ZeRO-1 instead, reported beside it);
* torch's: DTensor ``parallelize_module`` for TP with sequence parallelism (the vocabulary-parallel
  embedding and LM head with ``loss_parallel``, torchtitan's plan), ``torch.distributed.pipelining``'s
  ``Schedule1F1B`` for PP, FSDP2 (``fully_shard`` on the DP mesh dimension, parameters kept
  gathered between microbatches as torchtitan does under PP) for DP; the pipelining schedule
  turns its gradient sync off for all but the last microbatch, as ours does.

Their steps take turns (ours, torch's, ours with ZeRO-1; the order rotating every step) so that
machine noise hits both alike. A step is
timed on every rank from a barrier to the end of its optimizer step; the step's time is the
slowest rank's; the first two steps of each are warm-up. The losses of both are printed side by
side (they agree to float32 rounding). Goal: ours / torch ≤ 1.15.
"""
from __future__ import annotations

import copy
import sys

from _bench import load_average, options, ratio, slowest_rank_medians, timed_rounds


def _torch_stage(dense, layers, first: bool, last: bool, tp_mesh):
    """One pipeline stage of ``dense`` parallelised by DTensor over ``tp_mesh`` (torchtitan's plan
    with the sequence in dimension 0)."""
    import torch.nn as nn
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from distai.engine.tensor_parallel import dtensor_parallelize_block

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = copy.deepcopy(dense.embed) if first else None  # ids [b, s] -> [s, b, h]
            blocks = dense.block_list()
            self.blocks = nn.ModuleList(copy.deepcopy(blocks[i]) for i in layers)
            self.ln_f = copy.deepcopy(dense.head.norm) if last else None
            self.head = None
            if last:  # an nn.Linear, what ColwiseParallel splits
                self.head = nn.Linear(dense.cfg.hidden, dense.cfg.vocab, bias=False)
                self.head.weight = nn.Parameter(dense.head.lm_weight.detach().clone())

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            if self.head is not None:
                x = self.head(self.ln_f(x))
            return x

    stage = Stage()
    for block in stage.blocks:
        dtensor_parallelize_block(block, tp_mesh, sequence_parallel=True)
    plan = {}
    if first:
        plan["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    if last:
        plan["ln_f"] = SequenceParallel(sequence_dim=0)
        plan["head"] = ColwiseParallel(input_layouts=Shard(0), output_layouts=Shard(-1), use_local_output=False)
    if plan:
        parallelize_module(stage, tp_mesh, plan)
    return stage


def _bench(rank: int, world: int, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import loss_parallel

    from distai.engine import mesh as M
    from distai.engine.model import GPT, GPTConfig

    torch.set_num_threads(1)
    shape = M.MeshShape(args["pp"], args["dp"], args["tp"])
    cfg = GPTConfig(hidden=args["hidden"], heads=args["heads"], vocab=args["vocab"], layers=args["layers"],
                    seq=args["seq"], tie_embeddings=False)
    m, b, steps = args["m"], args["mb"], args["steps"]
    mesh = M.build_mesh(shape)
    dense = GPT(cfg, seed=0)
    ours = {zero: M.MeshTrainer(dense, mesh, microbatches=m, microbatch_size=b, schedule="1f1b", zero=zero,
                                lr=args["lr"]) for zero in (0, 1)}

    p, r = shape.pp, mesh.pp_rank
    first, last = r == 0, r == p - 1
    module = _torch_stage(dense, M.stage_layers(cfg, p, r), first, last, mesh.mesh["tp"])
    if shape.dp > 1:  # torchtitan's FSDP2 with PP: keep the parameters gathered between microbatches
        for block in module.blocks:
            fully_shard(block, mesh=mesh.mesh["dp"], reshard_after_forward=False)
        fully_shard(module, mesh=mesh.mesh["dp"], reshard_after_forward=False)
    torch_opt = torch.optim.SGD(module.parameters(), lr=args["lr"], momentum=0.9)
    stage = PipelineStage(module, r, p, torch.device("cpu"), group=mesh.groups["pp"])

    def loss_fn(logits, targets):  # targets as [b, s] (see the embedding)
        return F.cross_entropy(logits.flatten(0, 1), targets.t().flatten())

    sched = Schedule1F1B(stage, m, loss_fn=loss_fn)
    batches = [tuple(M.dp_share(t, mesh.dp_rank, shape.dp) for t in M.global_batch(cfg, shape, m, b, step))
               for step in range(steps)]

    def step_torch(step):  # the microbatches' losses (on the last stage), summed after the timing
        ids, tg = batches[step]
        torch_opt.zero_grad(set_to_none=True)
        losses: list = []
        with loss_parallel():
            if first:
                sched.step(ids, **({"target": tg, "losses": losses} if last else {}))
            elif last:
                sched.step(target=tg, losses=losses)
            else:
                sched.step()
        torch_opt.step()
        return losses

    warm = 2 if steps > 3 else 0
    times, values = timed_rounds({"ours": lambda step: ours[0].step(*batches[step]).loss, "torch": step_torch,
                                  "ours_zero1": lambda step: ours[1].step(*batches[step]).loss},
                                 steps - warm, warm, barrier=dist.barrier)
    values["torch"] = [float(sum(x.detach().full_tensor() if hasattr(x, "full_tensor") else x.detach()
                                 for x in losses) / m) if last else None for losses in values["torch"]]
    return {"median": slowest_rank_medians(times), "losses": values}


def main(argv=None) -> int:
    args = options(__doc__, pp=2, dp=2, tp=2, hidden=64, heads=4, vocab=256, layers=4, seq=32,
                   m=(4, "microbatches per step"), microbatch_size=2, steps=10, lr=0.05).parse_args(argv)
    world = args.pp * args.dp * args.tp

    from distai.engine.testing import run_in_group

    print(load_average())
    results = run_in_group(_bench, world, {"pp": args.pp, "dp": args.dp, "tp": args.tp, "hidden": args.hidden,
                                           "heads": args.heads, "vocab": args.vocab, "layers": args.layers,
                                           "seq": args.seq, "m": args.m, "mb": args.microbatch_size,
                                           "steps": args.steps, "lr": args.lr}, timeout_s=600)
    med = results[0]["median"]
    last = next(r["losses"] for r in results if r["losses"]["ours"][0] is not None)  # a last-stage rank
    ours, theirs = med["ours"], med["torch"]
    print(f"3D mesh pp={args.pp} × dp={args.dp} × tp={args.tp} ({world} gloo ranks on CPU), 1F1B with m={args.m} "
          f"microbatches of {args.microbatch_size};")
    print(f"GPT: {args.layers} blocks, h={args.hidden}, seq={args.seq}, vocab={args.vocab}, float32; "
          f"{len(last['ours'])} timed steps each (median of slowest rank)")
    for name in ("ours", "ours_zero1", "torch"):
        print(f"  loss {name:10s} " + " ".join(f"{x:.4f}" for x in last[name][:6]))
    gap = max(abs(a - b) for a, b in zip(last["ours"], last["torch"]))
    print(f"  largest loss difference ours vs torch: {gap:.1e}")
    print(f"  torch (DTensor TP+SP, pipelining Schedule1F1B, FSDP2): {theirs * 1e3:.1f} ms")
    print(f"  ours (bucketed DP all-reduce): {ours * 1e3:.1f} ms · " + ratio("ours/torch", ours, theirs, goal=1.15))
    print(f"  ours (ZeRO-1): {med['ours_zero1'] * 1e3:.1f} ms · " + ratio("ours/torch", med["ours_zero1"], theirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
