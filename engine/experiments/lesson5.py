"""Lesson 5 experiment: pipeline schedules run for real, ours beside torch.distributed.pipelining.

``python -m torch.distributed.run --nproc-per-node 4 -m distai.engine.experiments.lesson5``
(or ``distai run lesson5 --cpu 4`` / ``--gpus 4``). Every rank is one pipeline stage (p = world
size). For each schedule (GPipe, 1F1B, interleaved 1F1B with v chunks per rank) the same small
transformer, from the same initial weights, on the same batches, is trained for ``--steps`` SGD
steps twice:

* by :class:`distai.engine.pipeline.PipelineRunner`, which executes the lesson simulator's own
  order of forwards and backwards and sends activations and gradients with point-to-point ops;
* (alternating step by step, so that machine noise hits both alike) by
  ``torch.distributed.pipelining``'s ``ScheduleGPipe`` / ``Schedule1F1B`` /
  ``ScheduleInterleaved1F1B`` on the same stage modules.

It reports, per schedule: the loss of each step for both; the largest gradient difference after the
first step between ours, torch's and the unsplit model on the whole batch; the median step time of
both; the bubble measured (idle over rank-time, ``1 − Σ work / (p · step time)``, a block's work
being its CPU time on a CPU) against the formula, as a ``check`` event whose causes
(``lessons/lesson5/breakdown.py``: the step replayed through the simulator with the measured
blocks, then with the runner's overhead, the time without a core and each message's latency) add
up to the measurement; and the peak activation memory each stage held (bytes autograd saved for
backward, measured for ours and for torch's) in microbatches, against the formula.
``--slow-stage K --slow-ms X`` gives rank K's forwards X ms more CPU work each: a negative control
the check must blame on unequal stages.

Events (besides ``phase``, ``step``, ``metric``, ``log``, ``summary``): ``pp_config`` (rank 0,
first), ``progress`` over all schedules and both implementations, ``pp_op`` (our runner's blocks,
``distai.engine.pipeline``), ``pp_step`` per rank and step, ``pp_stage`` (rank 0, per schedule and
rank), declared in ``lessons/lesson5/events.py``; ``check`` (rank 0, per schedule: ``bubble_<schedule>``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser, by_machine
from ...lessons.events import CHECK, METRIC, PHASE
from ...lessons.lesson5 import breakdown as bd
from ...lessons.lesson5 import formulas, run_options
from ...lessons.lesson5 import simulator as sim
from ...lessons.lesson5.events import PP_CONFIG, PP_STAGE, PP_STEP, STEP
from ...lessons.model_size import ModelSize, add_model_options
from .. import pipeline as pl
from ..experiment import Progress, device_sync, exit_with, run_experiment, run_language, summary_lines
from ..metering import SavedActivationMeter
from ..model import ModelConfigError


def build_parser() -> argparse.ArgumentParser:
    ap = ExperimentParser(allow_abbrev=False, prog="distai run lesson5")
    run_options.add_options(ap)
    ap.add_argument("--microbatch-size", type=int, default=None)
    # default: MODEL_CPU or MODEL_GPU, with the fewest layers >= 8 that split evenly for v = 1 and v
    add_model_options(ap, None)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.help_fields = {**by_machine(MODEL_CPU, MODEL_GPU, ("hidden", "heads", "vocab", "seq")),
                      "layers": {"least": pl.MIN_DEFAULT_LAYERS},
                      "microbatch_size": {"cpu": MICROBATCH_CPU, "gpu": MICROBATCH_GPU}}
    return ap


#: the GPT the pipeline splits, untied (its ends are on different ranks); bigger on GPUs. On a CPU,
#: blocks of a few ms, so that compute dominates gloo's latency and the schedule's bubble shows
MODEL_CPU = ModelSize(vocab=64, hidden=128, heads=4, seq=64, tie_embeddings=False)
MODEL_GPU = ModelSize(vocab=1024, hidden=1024, heads=16, seq=256, tie_embeddings=False)
MICROBATCH_CPU, MICROBATCH_GPU = 4, 8  # sequences per microbatch by default


def check_args(args, p: int) -> tuple[list[str], int, int]:
    """Schedules, m, v, or PipelineConfigError with a message that says what to change
    (``lessons/lesson5/run_options.check``, which ``distai run`` also applies before launching)."""
    try:
        return run_options.check(args, p)
    except sim.ScheduleError as exc:
        raise pl.PipelineConfigError(exc.text(run_language())) from None


def _batches(cfg, m: int, mb: int, steps: int, device):
    return [pl.make_batch(cfg, m * mb, seed=1000 + i, device=device) for i in range(steps)]


def _grads(modules) -> list[torch.Tensor]:
    return [q.grad.detach().clone() for mod in modules for q in mod.parameters()]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((float((x - y).abs().max()) for x, y in zip(a, b)), default=0.0)


def slow_down(chunks, rank: int, slow: tuple[int | None, float]) -> None:
    """The negative control: on rank ``--slow-stage``, every forward first does ``--slow-ms`` of CPU
    work (shared among its chunks), as a stage with more layers would; elsewhere nothing."""
    if slow[0] != rank or slow[1] <= 0:
        return
    extra = slow[1] / 1e3 / len(chunks)

    def spin(_module, _inputs) -> None:
        end = time.thread_time() + extra  # the runner measures work as this thread's CPU time
        while time.thread_time() < end:
            pass

    for mod in chunks.values():
        mod.register_forward_pre_hook(spin)


def run_ours(ctx, schedule: str, cfg, p: int, m: int, v: int, mb: int, batches, lr: float, seed: int,
             out: dict, events=None, progress=None, slow: tuple[int | None, float] = (None, 0.0)):
    """Train with our runner, one step per ``next()``; figures accumulate in ``out``."""
    rank = ctx.rank
    chunks = pl.build_rank_chunks(cfg, p, v, rank, seed=seed, device=ctx.device)
    slow_down(chunks, rank, slow)
    runner = pl.PipelineRunner(chunks, rank=rank, p=p, m=m, schedule=schedule, v=v, microbatch_size=mb,
                               device=ctx.device, events=events)
    runner.validate()
    params = list(runner.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    out.update({"losses": [], "times": [], "steps": [], "peak_bytes": 0, "grads0": None, "chunks": chunks})
    for i, (ids, tg) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        res = runner.step(pl.microbatches(ids, m) if 0 in chunks else None,
                          pl.microbatches(tg, m) if p * v - 1 in chunks else None)
        if i == 0:
            out["grads0"] = _grads(chunks[s] for s in sorted(chunks))
        opt.step()
        out["losses"].append(res.loss)
        out["times"].append(res.t_end - res.t_start)
        out["steps"].append(res)
        out["peak_bytes"] = max(out["peak_bytes"], res.peak_activation_bytes)
        if events is not None:
            PP_STEP.emit(events, {"schedule": schedule, "impl": "ours", "step": i, "t_start": res.t_start,
                                  "t_end": res.t_end, "loss": res.loss})
            if res.loss is not None:
                STEP.emit(events, {"step": i, "of": len(batches), "loss": res.loss, "schedule": schedule})
        if progress is not None:
            progress()
        yield


def run_torch(ctx, schedule: str, cfg, p: int, m: int, v: int, batches, lr: float, seed: int, out: dict,
              events=None, progress=None, slow: tuple[int | None, float] = (None, 0.0)):
    """Train with torch.distributed.pipelining, one step per ``next()``; figures go to ``out``."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    rank = ctx.rank
    chunks = pl.build_rank_chunks(cfg, p, v, rank, seed=seed, device=ctx.device)
    slow_down(chunks, rank, slow)
    stages: list[Any] = [PipelineStage(chunks[c * p + rank], c * p + rank, p * v, ctx.device) for c in range(v)]
    sched: ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B
    if schedule == "gpipe":
        sched = ScheduleGPipe(stages[0], m, loss_fn=pl.loss_fn)
    elif schedule == "1f1b":
        sched = Schedule1F1B(stages[0], m, loss_fn=pl.loss_fn)
    else:
        sched = ScheduleInterleaved1F1B(stages, m, loss_fn=pl.loss_fn)
    params = [q for s in sorted(chunks) for q in chunks[s].parameters()]
    meter = SavedActivationMeter(params)
    opt = torch.optim.SGD(params, lr=lr)
    first, last = 0 in chunks, p * v - 1 in chunks
    out.update({"losses": [], "times": [], "peak_bytes": 0, "kept_bytes": 0, "grads0": None})
    for i, (ids, tg) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        losses: list = []
        dist.barrier()
        device_sync(ctx.device)
        t0 = time.time()
        meter.reset_peak()
        with meter:
            args = (ids,) if first else ()
            kwargs = {"target": tg, "losses": losses} if last else {}
            sched.step(*args, **kwargs)
        device_sync(ctx.device)
        t1 = time.time()
        # Saved activations still alive once every backward has run. torch's first stage keeps the graph
        # of the real forward PipelineStage runs on its first step to infer shapes (its metadata
        # inference), never backwarded; it is inside torch's peak from that step on.
        out["kept_bytes"] = max(out["kept_bytes"], meter.live)
        loss = float(sum(x.detach() for x in losses) / m) if last else None
        if i == 0:
            out["grads0"] = _grads(chunks[s] for s in sorted(chunks))
        opt.step()
        out["losses"].append(loss)
        out["times"].append(t1 - t0)
        out["peak_bytes"] = max(out["peak_bytes"], meter.peak)
        if events is not None:
            PP_STEP.emit(events, {"schedule": schedule, "impl": "torch", "step": i, "t_start": t0, "t_end": t1,
                                  "loss": loss})
        if progress is not None:
            progress()
        yield


def formula_peak(schedule: str, p: int, m: int, v: int, rank: int) -> float:
    """Microbatches of activations rank ``rank`` holds at its peak, from the lesson's formulas."""
    return formulas.peak_inflight_microbatches(p, m, schedule, v, rank)


def measure(ours: dict, p: int, m: int, v: int, schedule: str, rank: int, gathered_steps) -> dict:
    """This rank's measured bubble and activation figures from its timestamps (warm-up step
    skipped when there is more than one step)."""
    steps = ours["steps"]
    first = 1 if len(steps) > 1 else 0
    bubbles, fwd, bwd = [], [], []
    for i in range(first, len(steps)):
        span = max(t1 for _t0, t1 in gathered_steps[i]) - min(t0 for t0, _t1 in gathered_steps[i])
        busy = sum(r.compute for r in steps[i].records)  # the blocks' own work (CPU time on a CPU)
        bubbles.append(1.0 - busy / span if span > 0 else 0.0)
        fwd += [r.t1 - r.t0 for r in steps[i].records if r.op.kind == "F"]
        bwd += [r.t1 - r.t0 for r in steps[i].records if r.op.kind == "B"]
    saved: dict[int, list[int]] = {}
    for r in steps[0].records:
        if r.op.kind == "F":
            saved.setdefault(r.op.chunk, []).append(r.saved_bytes)
    chunk_bytes = {c: statistics.mean(x) for c, x in saved.items()}
    per_mb = sum(chunk_bytes.values())
    # the same order, weighted by what each chunk's forward really saved: the exact expected peak
    held = expected = 0.0
    for op in sim.schedule_order(schedule, p, m, v)[rank]:
        held += chunk_bytes[op.chunk] if op.kind == "F" else -chunk_bytes[op.chunk]
        expected = max(expected, held)
    return {
        "rank": rank,
        "bubble": statistics.mean(bubbles),
        "t_f": statistics.mean(fwd) * v,  # per microbatch through the rank's whole share
        "t_b": statistics.mean(bwd) * v,
        "peak_bytes": ours["peak_bytes"],
        "bytes_per_microbatch": per_mb,
        "peak_microbatches": ours["peak_bytes"] / per_mb if per_mb else 0.0,
        "peak_expected_bytes": expected,
        "peak_formula": formula_peak(schedule, p, m, v, rank),
    }


def _rank_figures(ours: dict, theirs: dict | None, ref_grads: list, ref_loss: float) -> dict:
    """What this rank sends rank 0 about one schedule: gradient differences, losses, step times,
    and every block, wait and step bound of our runner's steps (for the bubble check)."""
    ours_cpu = [g.cpu() for g in ours["grads0"]]
    rel = max(float(g.abs().max()) for g in ref_grads)
    return {
        "diff_ours_ref": _max_diff(ours_cpu, ref_grads),
        "diff_torch_ref": _max_diff([g.cpu() for g in theirs["grads0"]], ref_grads) if theirs else None,
        "diff_ours_torch": _max_diff(ours_cpu, [g.cpu() for g in theirs["grads0"]]) if theirs else None,
        "grad_scale": rel,
        "ref_loss": ref_loss,
        "losses": ours["losses"],
        "torch_losses": theirs["losses"] if theirs else None,
        "times": ours["times"],
        "torch_times": theirs["times"] if theirs else None,
        "torch_peak_bytes": theirs["peak_bytes"] if theirs else None,
        "torch_kept_bytes": theirs["kept_bytes"] if theirs else None,
        "step_bounds": [(s.t_start, s.t_end) for s in ours["steps"]],
        "blocks": [[(*r.op, r.t0, r.t1, r.c0, r.c1) for r in s.records] for s in ours["steps"]],
        "waits": [[(msg.kind, msg.mb, msg.from_stage, t0, t1) for msg, t0, t1 in s.waits] for s in ours["steps"]],
        "rank_steps": [(s.t_start, s.t_end, s.cpu_start, s.cpu_end, *s.send_wait) for s in ours["steps"]],
        "sends": [[(msg.kind, msg.mb, msg.from_stage, t) for msg, t in s.sends] for s in ours["steps"]],
    }


def run_schedule(ctx, schedule: str, cfg, p: int, m: int, v: int, args, batches, progress=None) -> dict | None:
    """Ours, torch's and the reference for one schedule; the figures on rank 0, None elsewhere."""
    ev = ctx.events
    mb = args.microbatch_size
    PHASE.emit(ev, {"name": f"{schedule}: ours" + ("" if args.no_torch else " and torch.distributed.pipelining")})
    ours: dict = {}
    theirs: dict | None = None if args.no_torch else {}
    slow = (args.slow_stage, args.slow_ms)
    runs = [run_ours(ctx, schedule, cfg, p, m, v, mb, batches, args.lr, args.seed, ours, events=ev,
                     progress=progress, slow=slow)]
    if theirs is not None:
        runs.append(run_torch(ctx, schedule, cfg, p, m, v, batches, args.lr, args.seed, theirs, events=ev,
                              progress=progress, slow=slow))
    for _ in batches:  # alternate their steps, so that machine noise hits both alike
        for run in runs:
            next(run)
    # the unsplit model on the first batch, for this rank's layers
    ref_loss, ref_model = pl.reference_grads(cfg, batches[0][0], batches[0][1], seed=args.seed)
    ref_stages = pl.split_stages(ref_model, p * v)
    ref_grads = [q.grad.cpu() for s in sorted(ours["chunks"]) for q in ref_stages[s].parameters()]
    mine = _rank_figures(ours, theirs, ref_grads, ref_loss)
    gathered: list = [None] * p
    dist.all_gather_object(gathered, mine)
    step_bounds = [[g["step_bounds"][i] for g in gathered] for i in range(len(batches))]
    stage = measure(ours, p, m, v, schedule, ctx.rank, step_bounds)
    stage.update({k: mine[k] for k in ("diff_ours_ref", "diff_torch_ref", "diff_ours_torch", "grad_scale",
                                       "torch_peak_bytes", "torch_kept_bytes")})
    stages: list = [None] * p
    dist.all_gather_object(stages, stage)
    if ctx.rank != 0:
        return None
    last = gathered[p - 1]
    skip = 1 if len(batches) > 1 else 0
    t_f = statistics.mean(s["t_f"] for s in stages)
    t_b = statistics.mean(s["t_b"] for s in stages)
    predicted = sim.simulate(schedule, p, m, v, t_f=t_f, t_b=t_b)
    step_times = [max(g["times"][i] for g in gathered) for i in range(skip, len(batches))]
    torch_times = ([max(g["torch_times"][i] for g in gathered) for i in range(skip, len(batches))]
                   if not args.no_torch else None)
    f = formulas.pipeline_bubble(p, m, schedule, v)
    bubble = measured_bubble_check(schedule, p, m, v, gathered, skip)
    CHECK.emit(ctx.events, bubble.event())
    result = {
        "schedule": schedule, "p": p, "m": m, "v": v,
        "loss": last["losses"], "torch_loss": last["torch_losses"], "ref_loss": last["ref_loss"],
        "max_grad_diff_vs_unsplit": max(s["diff_ours_ref"] for s in stages),
        "max_grad_diff_torch_vs_unsplit": (max(s["diff_torch_ref"] for s in stages)
                                           if not args.no_torch else None),
        "max_grad_diff_vs_torch": max(s["diff_ours_torch"] for s in stages) if not args.no_torch else None,
        "grad_scale": max(s["grad_scale"] for s in stages),
        "step_time_s": statistics.median(step_times),
        "torch_step_time_s": statistics.median(torch_times) if torch_times else None,
        "bubble_measured": bubble.measured,
        "bubble_check": bubble.event(),
        "bubble_formula": f["bubble_fraction"],
        "step_time_simulated_s": predicted.makespan,
        "t_f_s": t_f, "t_b_s": t_b,
        "stages": [{k: s[k] for k in ("rank", "bubble", "peak_bytes", "bytes_per_microbatch",
                                      "peak_microbatches", "peak_formula", "peak_expected_bytes",
                                      "torch_peak_bytes", "torch_kept_bytes")} for s in stages],
    }
    for s in result["stages"]:
        PP_STAGE.emit(ctx.events, {"schedule": schedule, "rank": s["rank"], "bubble": s["bubble"],
                                   "bubble_formula": f["bubble_fraction"], "peak_bytes": s["peak_bytes"],
                                   "peak_microbatches": s["peak_microbatches"], "peak_formula": s["peak_formula"],
                                   "torch_peak_bytes": s["torch_peak_bytes"],
                                   "torch_kept_bytes": s["torch_kept_bytes"]})
    METRIC.emit(ctx.events, {"name": f"{schedule}.bubble_measured", "value": result["bubble_measured"]})
    METRIC.emit(ctx.events, {"name": f"{schedule}.step_time_s", "value": result["step_time_s"]})
    return result


def measured_bubble_check(schedule: str, p: int, m: int, v: int, gathered: list[dict], skip: int):
    """The schedule's bubble check (``lessons/lesson5/breakdown.py``) from every rank's blocks and
    waits, over the measured steps (the warm-up skipped)."""
    steps = []
    for i in range(skip, len(gathered[0]["blocks"])):
        ranks = []
        for g in gathered:
            t_start, t_end, cpu_start, cpu_end, send_t0, send_t1 = g["rank_steps"][i]
            ranks.append(bd.RankStep([bd.Block(sim.Op(k, mb, c, st), t0, t1, c0, c1)
                                      for k, mb, c, st, t0, t1, c0, c1 in g["blocks"][i]],
                                     [bd.Wait(*w) for w in g["waits"][i]], t_start, t_end, cpu_start, cpu_end,
                                     send_t0, send_t1, [bd.Send(*x) for x in g["sends"][i]]))
        steps.append(bd.breakdown(schedule, p, m, v, ranks))
    return bd.bubble_check(schedule, steps)


def _mib(x, lang: str = "en") -> str:
    from ...lessons.units import format_fixed

    return "—" if x is None else format_fixed(x / 2**20, 2, lang)


def summary_of(results: list[dict], cfg, args, p: int, m: int, v: int, device) -> dict:
    """Rank 0's summary event: the results of each schedule and what the printed summary says of the run
    (``distai runs show`` writes it again from these alone, in another language)."""
    return {"lesson": "lesson5", "p": p, "m": m, "v": v, "device": device.type,
            "schedules": {r["schedule"]: r for r in results}, "microbatch_size": args.microbatch_size,
            "layers": cfg.layers, "hidden": cfg.hidden, "seq": cfg.seq, "cores": cpu_cores()}


def summary_from_event(summary: dict, lang: str | None = None) -> str:
    """The printed summary from the summary event (:func:`summary_of`), in ``lang`` (else the run's)."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(layers=summary["layers"], hidden=summary["hidden"], seq=summary["seq"])
    return "\n".join(summary_text(list(summary["schedules"].values()), cfg,
                                  SimpleNamespace(microbatch_size=summary["microbatch_size"]), summary["p"],
                                  summary["m"], summary["v"], summary["device"], lang, summary["cores"]))


def summary_text(results: list[dict], cfg, args, p: int, m: int, v: int, device_type: str,
                 lang: str | None = None, cores: int | None = None) -> list[str]:
    """The human summary, 71 columns wide (80 in the launcher's view, after its "rank 0   "), in the
    learner's language (``lang``, else the run's)."""
    from ...lessons.units import (
        format_fixed,
        format_fixed_percent,
        format_number,
        format_plain,
        number_separator,
    )

    lang = lang or run_language()
    say = summary_lines("lesson5", lang)
    cores = cpu_cores() if cores is None else cores
    losses = lambda xs: number_separator(lang).join(format_fixed(x, 4, lang) for x in xs)  # noqa: E731
    e = lambda x: format_number(x, 2, lang)  # noqa: E731
    ms = lambda x: format_fixed(x * 1e3, 1, lang)  # noqa: E731
    pct = lambda x: format_fixed_percent(x, 1, lang)  # noqa: E731
    out = ["", say("head", p=p, device=device_type, m=m, size=args.microbatch_size),
           say("model", layers=cfg.layers, d=cfg.hidden, seq=cfg.seq, v=v)]
    for r in results:
        out += ["", say("schedules." + r["schedule"]), say("loss_ours", losses=losses(r["loss"]))]
        if r["torch_loss"] is not None:
            out.append(say("loss_torch", losses=losses(r["torch_loss"])))
        out.append(say("unsplit", loss=format_fixed(r["ref_loss"], 4, lang)))
        vs_torch = say("vs_torch", diff=e(r["max_grad_diff_vs_torch"])) if r["max_grad_diff_vs_torch"] is not None else ""
        out += [say("grad_diff", diff=e(r["max_grad_diff_vs_unsplit"]), vs_torch=vs_torch),
                say("grad_scale", scale=e(r["grad_scale"]))]
        torch_step = (say("torch_step", ms=ms(r["torch_step_time_s"]),
                          ratio=format_fixed(r["step_time_s"] / r["torch_step_time_s"], 2, lang))
                      if r["torch_step_time_s"] else "")
        out += [say("step", ms=ms(r["step_time_s"]), torch=torch_step),
                say("bubble", measured=pct(r["bubble_measured"]), formula=pct(r["bubble_formula"]),
                    replayed=pct(r["bubble_check"]["detail"]["replay_work"])),
                say("simulated", f=format_fixed(r["t_f_s"] * 1e3, 2, lang), b=format_fixed(r["t_b_s"] * 1e3, 2, lang))]
        head = [say(f"columns.{c}") for c in ("rank", "bubble", "peak", "predicted", "microbatches", "formula", "torch")]
        widths = [max(w, len(h)) for w, h in zip((4, 6, 8, 9, 12, 7, 5), head)]
        out.append("  " + "  ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
        for st in r["stages"]:
            cells = (str(st["rank"]), pct(st["bubble"]), _mib(st["peak_bytes"], lang), _mib(st["peak_expected_bytes"], lang),
                     format_fixed(st["peak_microbatches"], 2, lang), format_plain(st["peak_formula"], lang),
                     _mib(st["torch_peak_bytes"], lang))
            out.append("  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
        out += say("peak_legend").splitlines()
        for st in r["stages"]:
            kept = st.get("torch_kept_bytes") or 0
            if kept:  # torch's first stage: its shape inference's graph (run_torch)
                out += say("torch_kept", rank=st["rank"], kept=_mib(kept, lang),
                           rest=_mib(st["torch_peak_bytes"] - kept, lang), ours=_mib(st["peak_bytes"], lang)).splitlines()
    if device_type == "cpu" and cores < p:
        out += [""] + say("cpu_note", p=p, cores=cores).splitlines()
    return out


def cpu_cores() -> int:
    """The cores this process may run on (its affinity: ``taskset``, a batch job's share)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def main(argv=None) -> int:
    return run_experiment("lesson5", build_parser().parse_args, run, argv,
                          usage_errors=(pl.PipelineConfigError, ModelConfigError))


def run(ctx, args: argparse.Namespace) -> dict | None:
    p = ctx.world_size
    if ctx.device.type == "cpu":  # one core per stage: a block's CPU time is its work, exactly
        torch.set_num_threads(1)
    schedules, m, v = check_args(args, p)
    layers = args.layers if args.layers is not None else pl.default_layers(p, v)  # p·v equal stages
    cfg = ModelSize.from_args(args, MODEL_GPU if ctx.is_cuda else MODEL_CPU, layers=layers)
    if args.microbatch_size is None:
        args.microbatch_size = MICROBATCH_GPU if ctx.is_cuda else MICROBATCH_CPU
    batches = _batches(cfg, m, args.microbatch_size, args.steps, ctx.device)
    if ctx.rank == 0:
        PP_CONFIG.emit(ctx.events, {"p": p, "m": m, "v": v, "schedules": schedules,
                                    "microbatch_size": args.microbatch_size, "d_model": cfg.hidden,
                                    "layers": cfg.layers, "seq": cfg.seq})
    progress = Progress(ctx, len(schedules) * args.steps * (1 if args.no_torch else 2))
    results = []
    for schedule in schedules:
        res = run_schedule(ctx, schedule, cfg, p, m, v if schedule == "interleaved" else 1, args, batches,
                           progress)
        if res is not None:
            results.append(res)
    if ctx.rank != 0:
        return None
    summary = summary_of(results, cfg, args, p, m, v, ctx.device)
    print(summary_from_event(summary))
    return summary


if __name__ == "__main__":
    exit_with(main)
