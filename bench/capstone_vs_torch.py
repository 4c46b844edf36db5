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

Their steps alternate (ours, torch's, ours with ZeRO-1, …) so that machine noise hits both alike. A step is
timed on every rank from a barrier to the end of its optimizer step; the step's time is the
slowest rank's; the first two steps of each are warm-up. The losses of both are printed side by
side (they agree to float32 rounding). Goal: ours / torch ≤ 1.15.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time


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

    def step_ours(trainer, ids, tg):
        dist.barrier()
        t0 = time.perf_counter()
        out = trainer.step(ids, tg)
        return time.perf_counter() - t0, out.loss

    def step_torch(ids, tg):
        torch_opt.zero_grad(set_to_none=True)
        losses: list = []
        dist.barrier()
        t0 = time.perf_counter()
        with loss_parallel():
            if first:
                sched.step(ids, **({"target": tg, "losses": losses} if last else {}))
            elif last:
                sched.step(target=tg, losses=losses)
            else:
                sched.step()
        torch_opt.step()
        elapsed = time.perf_counter() - t0
        loss = float(sum(x.detach().full_tensor() if hasattr(x, "full_tensor") else x.detach() for x in losses)
                     / m) if last else None
        return elapsed, loss

    times: dict = {"ours": [], "ours_zero1": [], "torch": []}
    losses: dict = {"ours": [], "ours_zero1": [], "torch": []}
    for step in range(steps):
        ids, tg = M.global_batch(cfg, shape, m, b, step)
        ids, tg = M.dp_share(ids, mesh.dp_rank, shape.dp), M.dp_share(tg, mesh.dp_rank, shape.dp)
        for name, run in (("ours", lambda: step_ours(ours[0], ids, tg)), ("torch", lambda: step_torch(ids, tg)),
                          ("ours_zero1", lambda: step_ours(ours[1], ids, tg))):
            t, loss = run()
            times[name].append(t)
            losses[name].append(loss)
    return {"times": times, "losses": losses}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--m", type=int, default=4, help="microbatches per step")
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)
    world = args.pp * args.dp * args.tp

    from distai.engine.testing import run_in_group

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    results = run_in_group(_bench, world, {"pp": args.pp, "dp": args.dp, "tp": args.tp, "hidden": args.hidden,
                                           "heads": args.heads, "vocab": args.vocab, "layers": args.layers,
                                           "seq": args.seq, "m": args.m, "mb": args.microbatch_size,
                                           "steps": args.steps, "lr": args.lr}, timeout_s=600)
    warm = 2 if args.steps > 3 else 0
    timed = range(warm, args.steps)
    med = {name: statistics.median(max(r["times"][name][i] for r in results) for i in timed)
           for name in ("ours", "ours_zero1", "torch")}
    last = next(r["losses"] for r in results if r["losses"]["ours"][0] is not None)  # a last-stage rank
    ours, theirs = med["ours"], med["torch"]
    print(f"3D mesh pp={args.pp} × dp={args.dp} × tp={args.tp} ({world} gloo ranks on CPU), 1F1B with m={args.m} "
          f"microbatches of {args.microbatch_size};")
    print(f"GPT: {args.layers} blocks, h={args.hidden}, seq={args.seq}, vocab={args.vocab}, float32; "
          f"{len(timed)} timed steps each (median of slowest rank)")
    for name in ("ours", "ours_zero1", "torch"):
        print(f"  loss {name:10s} " + " ".join(f"{x:.4f}" for x in last[name][:6]))
    gap = max(abs(a - b) for a, b in zip(last["ours"], last["torch"]))
    print(f"  largest loss difference ours vs torch: {gap:.1e}")
    print(f"  torch (DTensor TP+SP, pipelining Schedule1F1B, FSDP2): {theirs * 1e3:.1f} ms")
    print(f"  ours (bucketed DP all-reduce): {ours * 1e3:.1f} ms · ours/torch {ours / theirs:.2f}x")
    print(f"  ours (ZeRO-1): {med['ours_zero1'] * 1e3:.1f} ms · ours/torch {med['ours_zero1'] / theirs:.2f}x")
    print(f"goal ours/torch <= 1.15x: {'met' if ours / theirs <= 1.15 else 'NOT met'} ({ours / theirs:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
