"""Capstone experiment: one training run with data, tensor, pipeline, context and expert parallelism.

``distai run capstone --dp 2 --tp 2 --pp 2 --cpu 8`` (or ``--gpus 8``; directly:
``python -m torch.distributed.run --nproc-per-node 8 -m distai.engine.experiments.capstone
--dp 2 --tp 2 --pp 2``); five axes: ``--dp 2 --tp 2 --pp 1 --cp 2 --ep 2 --moe --experts 4
--top-k 2``. The ranks form a device mesh of shape (pp, dp, cp, tp), EP inside dp·cp
(:mod:`distai.engine.mesh`); a small GPT is trained for ``--steps`` SGD steps with lesson 4's
tensor-parallel blocks (with sequence parallelism), lesson 5's pipeline schedule (1F1B or
interleaved), ring attention over the CP ranks, the experts lesson's all-to-all dispatch over the EP
ranks and lesson 6's bucketed data-parallel gradient sync over dp·cp (or lesson 2's ZeRO-1 with
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
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.capstone.events import MESH_COMM, MESH_CONFIG, MESH_STEP, STEP, MeshShape
from ...lessons.checks import equal_to_one_process
from ...lessons.events import METRIC, PHASE, PROGRESS, SPAN
from ...lessons.units import format_bytes
from .. import mesh as M
from ..calibrate import call_seconds, check_step_time, cpu_clock
from ..comm_trace import traced_step
from ..experiment import (
    equality_verdict,
    exit_with,
    max_over_ranks,
    run_experiment,
    run_language,
    share_cores_among_local_ranks,
    summary_lines,
)
from ..mesh_args import MeshConfigError, build_parser, plan_run
from ..model import GPT, ModelConfigError
from ..moe import MoEConfig, make_moe

__all__ = ["build_parser", "main", "summary_from_event", "summary_text"]  # build_parser: its options, as every experiment's


def summary_from_event(summary: dict, lang: str | None = None) -> str:
    """The printed summary from rank 0's summary event (the run's result and every rank's account of
    its groups' calls), in ``lang`` (else the run's): ``distai runs show`` writes it again from it."""
    return "\n".join(summary_text(summary, summary["accounts"], lang))


def summary_text(result: dict, accounts: list[dict], lang: str | None = None) -> list[str]:
    """The human summary, at most 71 columns wide, in the learner's language (``lang``, else the run's)."""
    from ...lessons.units import format_fixed, format_number, number_separator

    lang = lang or run_language()
    say = summary_lines("capstone", lang)
    c = result["config"]
    losses = lambda xs: number_separator(lang).join(format_fixed(x, 4, lang) for x in xs)  # noqa: E731
    b = lambda n: format_bytes(n, binary=True, lang=lang)  # noqa: E731
    cp, moe = c.get("cp", 1), bool(c.get("experts"))
    sync = say("zero1" if c["zero"] else "experts_sync" if moe else "bucketed")
    out = ["", say("head", pp=c["pp"], dp=c["dp"], tp=c["tp"], cp=f" × cp={cp}" if cp > 1 else "",
                   world=c["world"], device=c["device"], dtype=c["dtype"])]
    if moe:
        out.append(say("experts", experts=c["experts"], top_k=c["top_k"], ep=c["ep"]))
    out += [say("model", layers=c["layers"], hidden=c["hidden"], seq=c["seq"], vocab=c["vocab"], schedule=c["schedule"],
                v=f" v = {c['v']}" if c["schedule"] == "interleaved" else ""),
            say("microbatches_cp" if cp > 1 else "microbatches", m=c["m"], size=c["microbatch_size"], sync=sync,
                ranks=c["dp"] * cp),
            "", say("loss", losses=losses(result["losses"]))]
    if result["ref_losses"] is not None:
        out += [say("one_process", losses=losses(result["ref_losses"])),
                say("rel_diff", loss=format_number(result["max_loss_rel_diff"], 2, lang),
                    params=format_number(result["max_param_rel_diff"], 2, lang),
                    verdict=equality_verdict(result["max_loss_rel_diff"], result["max_param_rel_diff"], c["dtype"],
                                             lang))]
    # the median says what a step takes; the step-time check compares the mean (the prediction's); with
    # experts the calibration predicts nothing (the all-to-alls' routing is not in its model)
    mean = result.get("step_time_mean_s")
    ms = format_fixed(result["step_time_s"] * 1e3, 1, lang)
    step = say("step_moe", ms=ms) if moe else say("step_median", ms=ms) if mean is None else \
        say("step", ms=ms, mean=format_fixed(mean * 1e3, 1, lang))
    # two header lines over the rows' own columns: what is counted, then measured/formula under each
    out += [step, "", say("comm"),
            f"  {'':>5}  {'':>5}  {say('calls'):^17}      {say('bytes'):^21}".rstrip(),
            f"  {say('stage'):>5}  {say('group'):>5}  {say('measured'):>8}/{say('formula'):<8}      "
            f"{say('measured'):>10}/{say('formula'):<10}   {say('ok')}"]
    seen = set()
    for a in accounts:
        key = a["pp"]
        if key in seen:
            continue
        seen.add(key)
        for dim in a["expected"]:
            got, want = a["measured"][dim], a["expected"][dim]
            out.append(f"  {a['pp']:>5}  {dim:>5}  {got['calls']:>8}/{want['calls']:<8}      "
                       f"{b(got['bytes']):>10}/{b(want['bytes']):<10}   {say('yes' if a['match'][dim] else 'no')}")
    out.append(say("same_per_ep" if moe else "same_per_stage",
                   verdict=say("all_match" if all(all(a["match"].values()) for a in accounts) else "mismatch")))
    if moe:
        out.append(say("moe_row"))
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, read as the parser reads them (``--help`` prints it and exits, a mistake is one line), kept
    raw: the plan needs the world size, so the run reads them again inside (:func:`plan_run`)."""
    build_parser().parse_args(argv)
    return argparse.Namespace(argv=argv)


def main(argv=None) -> int:
    return run_experiment("capstone", _parse, run, argv,
                          usage_errors=(MeshConfigError, ModelConfigError))


def run(ctx, raw: argparse.Namespace) -> dict | None:
    if ctx.device.type == "cpu":
        share_cores_among_local_ranks(ctx.world_size)
    plan = plan_run(raw.argv, ctx.world_size, ctx.is_cuda)
    args, shape, schedule, v = plan.args, plan.shape, plan.schedule, plan.chunks
    m, b, dtype = plan.microbatches, plan.microbatch_size, getattr(torch, plan.dtype)
    cfg = plan.model
    ev = ctx.events
    mesh = M.build_mesh(shape, ctx.device.type)
    moe = MoEConfig(experts=args.experts, top_k=args.top_k, aux_alpha=0.0) if shape.moe else None
    config: MeshShape = {"pp": shape.pp, "dp": shape.dp, "tp": shape.tp, "world": shape.world, "schedule": schedule,
                         "v": v, "m": m, "microbatch_size": b, "zero": args.zero, "layers": cfg.layers,
                         "hidden": cfg.hidden, "heads": cfg.heads, "seq": cfg.seq, "vocab": cfg.vocab,
                         "dtype": str(dtype).replace("torch.", ""), "device": ctx.device.type,
                         "cp": shape.cp, "ep": shape.ep, "experts": moe.experts if moe else 0,
                         "top_k": moe.top_k if moe else 0}
    _announce(ctx, mesh, config)
    dense = GPT(cfg, seed=args.seed, dtype=dtype, device=ctx.device)
    if moe is not None:
        dense = make_moe(dense, moe, seed=args.seed)
    trainer = M.MeshTrainer(dense, mesh, microbatches=m, microbatch_size=b, schedule=schedule, chunks=v,
                            zero=args.zero, lr=args.lr, device=ctx.device, events=ev)
    reference = (dense, torch.optim.SGD(dense.parameters(), lr=args.lr, momentum=0.9)) if args.check else None
    del dense  # with --check the reference keeps it
    meter = M.MeshCommMeter(mesh.groups)
    metered_step = 1 if args.steps > 1 else 0  # the first step also pays for warm-up
    steps = _train(ctx, args, cfg, mesh, trainer, (m, b), reference, meter, metered_step)
    timed_cpu = [c for i, c in enumerate(steps.cpu) if i not in (0, metered_step)] or steps.cpu
    cpu = tuple(statistics.fmean(c[i] for c in timed_cpu) for i in range(len(timed_cpu[0])))
    if ctx.rank == 0:  # the step-time check measures this machine again: seconds the bar must not sit at 100 %
        PHASE.emit(ev, {"name": "predict"})
    check_step_time(ctx, plan, steps.times, metered_step, steps.account, steps.call_s, cpu)  # calibrated here
    if ctx.rank == 0:
        PROGRESS.emit(ev, {"done": args.steps + 1, "total": args.steps + 1})
    expected = M.expected_comm(cfg, shape, mesh.pp_rank, microbatches=m, microbatch_size=b, schedule=schedule,
                               chunks=v, zero=args.zero, elem_size=dtype.itemsize, backend=ctx.backend, moe=moe,
                               routed_rows=steps.routed_rows)
    assert steps.account is not None  # the metered step ran
    row = {"rank": ctx.rank, "pp": mesh.pp_rank, "dp": mesh.dp_rank, "tp": mesh.tp_rank, "cp": mesh.cp_rank,
           "ep": mesh.ep_rank, "measured": steps.account, "expected": expected,
           "match": M.compare_accounts(steps.account, expected)}
    accounts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(accounts, row)
    if ctx.rank != 0:
        return None
    _report_comm(ev, metered_step, accounts)
    timed = timed_steps(steps.times, metered_step)
    result: dict[str, Any] = {
        "config": config, "losses": steps.losses, "ref_losses": steps.ref_losses if args.check else None,
        "max_loss_rel_diff": max(steps.loss_diffs) if args.check else None,
        "max_param_rel_diff": max(steps.param_diffs) if args.check else None,
        "step_time_s": statistics.median(timed), "comm_match": all(all(a["match"].values()) for a in accounts),
        # the measured mean step time: a predicted step time (the planner's) is checked against it here
        "step_time_mean_s": measured_step_time_s(steps.times, metered_step)}
    result["equal_to_one_process"] = equal_to_one_process(config["dtype"], result["max_loss_rel_diff"],
                                                          result["max_param_rel_diff"]) if args.check else None
    METRIC.emit(ev, {"name": "step_time_s", "value": result["step_time_s"]})
    METRIC.emit(ev, {"name": "step_time_mean_s", "value": result["step_time_mean_s"]})
    summary = {"lesson": "capstone", **result, "accounts": accounts}
    print(summary_from_event(summary))
    return summary


def timed_steps(times: list[float], metered_step: int) -> list[float]:
    """The step times that measure the run: the first step pays for warm-up and the metered one for
    the meter, so both are left out (unless nothing else is left)."""
    return [t for i, t in enumerate(times) if i not in (0, metered_step)] or times


def measured_step_time_s(times: list[float], metered_step: int) -> float:
    """The measured mean step time (seconds) over :func:`timed_steps`: what a predicted step time
    (the planner's) is checked against."""
    return statistics.fmean(timed_steps(times, metered_step))


def _announce(ctx, mesh, config: MeshShape) -> None:
    """Rank 0's ``mesh_config``, with every rank's coordinates ``[rank, pp, dp, tp, cp, ep]``, and the
    run's phase."""
    coords: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(coords, [ctx.rank, mesh.pp_rank, mesh.dp_rank, mesh.tp_rank, mesh.cp_rank, mesh.ep_rank])
    if ctx.rank == 0:
        MESH_CONFIG.emit(ctx.events, {**config, "ranks": coords})
        PHASE.emit(ctx.events, {"name": f"mesh run: {mesh.shape}, {config['schedule']}"})


@dataclass
class _Steps:
    """What the training steps measured (the ``ref_`` and ``_diffs`` lists: with ``--check``)."""
    losses: list[float] = field(default_factory=list)
    ref_losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    loss_diffs: list[float] = field(default_factory=list)
    param_diffs: list[float] = field(default_factory=list)
    account: Any = None  # the metered step's communication
    call_s: dict[str, float] = field(default_factory=dict)  # … and its calls' seconds per group
    cpu: list[tuple[float, ...]] = field(default_factory=list)  # each step's CPU, run-queue and machine seconds
    routed_rows: list[tuple[int, int]] = field(default_factory=list)  # … and the token rows its experts moved


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
        clock = cpu_clock()
        with traced_step(ev, f"step {step}", groups=mesh.groups, collectives=step == metered_step, meter=meter,
                         check="capstone_step_time" if step == metered_step else None, step=step) as p2p:
            if step == metered_step:
                if trainer.cp is not None:
                    trainer.cp.trace = []  # the ring's hops, for the trace's CP track
                with meter:
                    result = trainer.step(*mine)
                if trainer.cp is not None:
                    _emit_cp_hops(ev, trainer.cp.trace, step)
                    trainer.cp.trace = None
                p2p += [(t0, t1) for _msg, t0, t1 in result.pipeline.waits] + [result.pipeline.send_wait]
                out.account, out.routed_rows = meter.account(), list(trainer.routed_rows)
                out.call_s = call_seconds(meter)
            else:
                result = trainer.step(*mine)
        after = cpu_clock()
        out.cpu.append(tuple(a - b for a, b in zip(after, clock)))
        MESH_STEP.emit(ev, {"step": step, "pp": mesh.pp_rank, "dp": mesh.dp_rank, "tp": mesh.tp_rank,
                            "cp": mesh.cp_rank, "ep": mesh.ep_rank, "t_start": result.t_start, "t_pipeline_end": result.pipeline.t_end,
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
            PROGRESS.emit(ev, {"done": step + 1, "total": args.steps + 1})  # the last unit: the step-time check
    return out


def _emit_cp_hops(ev, trace: list[dict], step: int) -> None:
    """The metered step's ring-attention hops as spans of the trace's ``comm cp`` track: each ring step's
    K/V block (and, in the backward, its gradient) in flight from its post, before the step's tiles, to
    the end of its wait. Point-to-point, so no collective's span draws them; each starts where the last
    ended at the earliest (two clocks' readings a microsecond apart must not overlap on a track)."""
    end = 0.0
    for rec in trace:
        if not rec["messages"]:
            continue
        t0 = max(rec["t0"], end)
        end = max(t0, rec["t0"] + rec["compute_s"] + rec["wait_s"])
        name = (f"cp {rec['phase']} L{rec['layer']} ring step {rec['step']}: "
                f"{format_bytes(rec['sent_bytes'], binary=True)} to the next rank")
        SPAN.emit(ev, {"name": name, "stream": "comm cp", "t0": t0, "t1": end, "bytes": rec["sent_bytes"],
                       "step": step})


def _report_comm(ev, metered_step: int, accounts: list[dict]) -> None:
    """Every rank's communication in the metered step, and each group's bytes as metrics."""
    MESH_COMM.emit(ev, {"step": metered_step, "ranks": accounts})
    for a in accounts:
        for dim in a["measured"]:
            METRIC.emit(ev, {"name": f"comm.{dim}.bytes.rank{a['rank']}", "value": a["measured"][dim]["bytes"]})


if __name__ == "__main__":
    exit_with(main)
