"""Capstone experiment: one training run with data, tensor and pipeline parallelism at once.

``distai run capstone --dp 2 --tp 2 --pp 2 --cpu 8`` (or ``--gpus 8``; directly:
``python -m torch.distributed.run --nproc-per-node 8 -m distai.engine.experiments.capstone
--dp 2 --tp 2 --pp 2``). The ranks form a device mesh of shape (pp, dp, tp)
(:mod:`distai.engine.mesh`); a small GPT is trained for ``--steps`` SGD steps with lesson 4's
tensor-parallel blocks (with sequence parallelism), lesson 5's pipeline schedule (1F1B or
interleaved) and lesson 6's bucketed data-parallel gradient sync (or lesson 2's ZeRO-1 with
``--zero 1``). After every step the loss and every parameter are compared with the same model
trained on one process on the same batches (``--no-check`` skips it). One step is metered: every
collective and point-to-point message is attributed to its group and set against the formulas
(:func:`distai.engine.mesh.expected_comm`).

Events (besides ``phase``, ``log``, ``summary`` and lesson 5's ``pp_op`` from every rank):
``mesh_config`` (rank 0, first), ``progress`` and ``step`` (rank 0), ``mesh_step`` (every rank) and
``mesh_comm`` (rank 0, after the metered step), declared in ``lessons/capstone/events.py``.
"""
from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.capstone.events import MESH_COMM, MESH_CONFIG, MESH_STEP, STEP, MeshShape
from ...lessons.events import METRIC, PHASE, PROGRESS
from ...lessons.units import format_bytes
from .. import mesh as M
from ..calibrate import check_step_time
from ..comm_trace import traced_step
from ..experiment import exit_with, max_over_ranks, run_experiment
from ..mesh_args import MeshConfigError, plan_run
from ..model import GPT, ModelConfigError


def print_summary(result: dict, accounts: list[dict]) -> None:
    """The human summary, at most 71 columns wide."""
    c = result["config"]
    print(f"\nCapstone · pp={c['pp']} × dp={c['dp']} × tp={c['tp']} on {c['world']} ranks ({c['device']}), "
          f"{c['dtype']}")
    print(f"model: {c['layers']} blocks, h = {c['hidden']}, seq = {c['seq']}, vocab = {c['vocab']}; "
          f"{c['schedule']}" + (f" v = {c['v']}" if c["schedule"] == "interleaved" else ""))
    print(f"m = {c['m']} microbatches of {c['microbatch_size']} per DP rank; DP sync: "
          + ("ZeRO-1" if c["zero"] else "bucketed all-reduce"))
    print(f"\n  loss: {', '.join(f'{x:.4f}' for x in result['losses'])}")
    if result["ref_losses"] is not None:
        print(f"  one process: {', '.join(f'{x:.4f}' for x in result['ref_losses'])}")
        print(f"  largest relative difference: loss {result['max_loss_rel_diff']:.1e} · "
              f"parameters {result['max_param_rel_diff']:.1e}")
    print(f"  step time (median): {result['step_time_s'] * 1e3:.1f} ms")
    print("\n  communication per step and rank (bytes sent, ring algorithms)")
    print("  stage  group  calls measured/formula   bytes measured/formula   ok")
    seen = set()
    for a in accounts:
        key = a["pp"]
        if key in seen:
            continue
        seen.add(key)
        for dim in M.DIMS:
            got, want = a["measured"][dim], a["expected"][dim]
            print(f"  {a['pp']:>5}  {dim:>5}  {got['calls']:>8}/{want['calls']:<8}      "
                  f"{format_bytes(got['bytes'], binary=True):>10}/{format_bytes(want['bytes'], binary=True):<10}"
                  f"   {'yes' if a['match'][dim] else 'NO'}")
    print("  (every rank of a pipeline stage sends the same; all ranks: "
          + ("all match" if all(all(a["match"].values()) for a in accounts) else "MISMATCH") + ")")


def main(argv=None) -> int:
    # the plan needs the world size: the arguments are parsed inside the run
    return run_experiment("capstone", lambda a: argparse.Namespace(argv=a), run, argv,
                          usage_errors=(MeshConfigError, ModelConfigError))


def run(ctx, raw: argparse.Namespace) -> dict | None:
    if ctx.device.type == "cpu":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    plan = plan_run(raw.argv, ctx.world_size, ctx.is_cuda)
    args, shape, schedule, v = plan.args, plan.shape, plan.schedule, plan.chunks
    m, b, dtype = plan.microbatches, plan.microbatch_size, getattr(torch, plan.dtype)
    cfg = plan.model
    ev = ctx.events
    mesh = M.build_mesh(shape, ctx.device.type)
    config: MeshShape = {"pp": shape.pp, "dp": shape.dp, "tp": shape.tp, "world": shape.world, "schedule": schedule,
                         "v": v, "m": m, "microbatch_size": b, "zero": args.zero, "layers": cfg.layers,
                         "hidden": cfg.hidden, "heads": cfg.heads, "seq": cfg.seq, "vocab": cfg.vocab,
                         "dtype": str(dtype).replace("torch.", ""), "device": ctx.device.type}
    _announce(ctx, mesh, config)
    dense = GPT(cfg, seed=args.seed, dtype=dtype, device=ctx.device)
    trainer = M.MeshTrainer(dense, mesh, microbatches=m, microbatch_size=b, schedule=schedule, chunks=v,
                            zero=args.zero, lr=args.lr, device=ctx.device, events=ev)
    reference = (dense, torch.optim.SGD(dense.parameters(), lr=args.lr, momentum=0.9)) if args.check else None
    del dense  # with --check the reference keeps it
    meter = M.MeshCommMeter(mesh.groups)
    metered_step = 1 if args.steps > 1 else 0  # the first step also pays for warm-up
    steps = _train(ctx, args, cfg, mesh, trainer, (m, b), reference, meter, metered_step)
    check_step_time(ctx, plan, steps.times, metered_step, steps.account)  # vs the planner, calibrated here
    expected = M.expected_comm(cfg, shape, mesh.pp_rank, microbatches=m, microbatch_size=b, schedule=schedule,
                               chunks=v, zero=args.zero, elem_size=dtype.itemsize, backend=ctx.backend)
    assert steps.account is not None  # the metered step ran
    row = {"rank": ctx.rank, "pp": mesh.pp_rank, "dp": mesh.dp_rank, "tp": mesh.tp_rank,
           "measured": steps.account, "expected": expected, "match": M.compare_accounts(steps.account, expected)}
    accounts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(accounts, row)
    if ctx.rank != 0:
        return None
    _report_comm(ev, metered_step, accounts)
    # the first step pays for warm-up and the metered one for the meter: timed from the others
    timed = [t for i, t in enumerate(steps.times) if i not in (0, metered_step)] or steps.times
    result: dict[str, Any] = {
        "config": config, "losses": steps.losses, "ref_losses": steps.ref_losses if args.check else None,
        "max_loss_rel_diff": max(steps.loss_diffs) if args.check else None,
        "max_param_rel_diff": max(steps.param_diffs) if args.check else None,
        "step_time_s": statistics.median(timed), "comm_match": all(all(a["match"].values()) for a in accounts)}
    METRIC.emit(ev, {"name": "step_time_s", "value": result["step_time_s"]})
    print_summary(result, accounts)
    return {"lesson": "capstone", **result}


def _announce(ctx, mesh, config: MeshShape) -> None:
    """Rank 0's ``mesh_config``, with every rank's coordinates on the mesh, and the run's phase."""
    coords: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(coords, [ctx.rank, mesh.pp_rank, mesh.dp_rank, mesh.tp_rank])
    if ctx.rank == 0:
        MESH_CONFIG.emit(ctx.events, {**config, "ranks": coords})
        PHASE.emit(ctx.events, {"name": f"3D run: {mesh.shape}, {config['schedule']}"})


@dataclass
class _Steps:
    """What the training steps measured (the ``ref_`` and ``_diffs`` lists: with ``--check``)."""
    losses: list[float] = field(default_factory=list)
    ref_losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    loss_diffs: list[float] = field(default_factory=list)
    param_diffs: list[float] = field(default_factory=list)
    account: Any = None  # the metered step's communication


def _train(ctx, args, cfg, mesh, trainer, microbatches: tuple[int, int], reference, meter,
           metered_step: int) -> _Steps:
    """``--steps`` steps on the mesh (``microbatches``: how many per DP rank, of how many
    sequences), each checked against one process's (``reference``: its model and optimizer), step
    ``metered_step`` with its communication metered."""
    ev, shape = ctx.events, mesh.shape
    out = _Steps()
    for step in range(args.steps):
        ids, tg = M.global_batch(cfg, shape, *microbatches, step, seed=args.seed, device=ctx.device)
        mine = (M.dp_share(ids, mesh.dp_rank, shape.dp), M.dp_share(tg, mesh.dp_rank, shape.dp))
        # the run's trace: every step's span; the metered step's collectives on a track per group
        # (the others are timed, so they run without the meter)
        if step == metered_step:
            meter.reset()
        with traced_step(ev, f"step {step}", groups=mesh.groups, collectives=step == metered_step, meter=meter,
                         step=step):
            if step == metered_step:
                with meter:
                    result = trainer.step(*mine)
                out.account = meter.account()
            else:
                result = trainer.step(*mine)
        MESH_STEP.emit(ev, {"step": step, "pp": mesh.pp_rank, "dp": mesh.dp_rank, "tp": mesh.tp_rank,
                            "t_start": result.t_start, "t_pipeline_end": result.pipeline.t_end,
                            "t_end": result.t_end})
        loss = trainer.global_loss(result)
        span = max_over_ranks(result.t_end) - (-max_over_ranks(-result.t_start))
        out.losses.append(loss)
        out.times.append(span)
        ref_loss = loss_diff = param_diff = None
        if reference is not None:
            dense, ref_opt = reference
            ref_loss = M.dense_step(dense, ref_opt, ids, tg)
            loss_diff = abs(loss - ref_loss) / abs(ref_loss)
            param_diff = max_over_ranks(M.max_relative_diff(trainer, dense))
            out.ref_losses.append(ref_loss)
            out.loss_diffs.append(loss_diff)
            out.param_diffs.append(param_diff)
        if ctx.rank == 0:
            STEP.emit(ev, {"step": step, "of": args.steps, "loss": loss, "ref_loss": ref_loss,
                           "loss_rel_diff": loss_diff, "param_rel_diff": param_diff, "step_time_s": span})
            PROGRESS.emit(ev, {"done": step + 1, "total": args.steps})
    return out


def _report_comm(ev, metered_step: int, accounts: list[dict]) -> None:
    """Every rank's communication in the metered step, and each group's bytes as metrics."""
    MESH_COMM.emit(ev, {"step": metered_step, "ranks": accounts})
    for a in accounts:
        for dim in M.DIMS:
            METRIC.emit(ev, {"name": f"comm.{dim}.bytes.rank{a['rank']}", "value": a["measured"][dim]["bytes"]})


if __name__ == "__main__":
    exit_with(main)
