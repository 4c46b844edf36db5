"""This machine's rates at the capstone run's sizes: the planner's inputs, measured instead of read
from a GPU's data sheet (``distai calc plan --calibrate``, and the capstone run's step-time check).

``world`` processes (as many as the run has ranks, so that they share the cores as the run's ranks
do) each time, at once:

- the GEMMs of one transformer layer's shard (``x @ W`` forward and backward, autograd included, the
  run's rows b·s/cp and widths h, 3h/t, 4h/t): the matmul rate in FLOP/s;
- the rest of a layer's kernels at the same sizes (two LayerNorms, the GeLU, the residual adds, the
  attention core), expressed as the bytes the planner counts for them per second;
- all-reduces inside groups of two ranks, all groups at once (the run's TP, DP and PP groups are
  pairs on the meshes it trains), of a small and a large message: α and β of lesson 1's ring.

The profile is a plain dict, saved under ``$DISTAI_HOME/machine_profile.json`` with the sizes it was
measured at, and reused while it is recent (:func:`load_profile`). The prediction from it is pure:
:mod:`distai.lessons.capstone.calibrated`.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..lessons.calculator import CalcError
from ..lessons.capstone.calibrated import (
    RunShape,
    account_s,
    gemm_shapes,
    layer_bytes,
    predict,
    predict_run,
)
from ..lessons.checks import Check, check
from ..lessons.events import CHECK
from .doctor import concurrent_pairs_alpha_beta
from .experiment import max_over_ranks

PROFILE_FILE = "machine_profile.json"
PROFILE_MAX_AGE_S = 3600.0  # a profile older than this is measured again
CPU = torch.device("cpu")
MIN_SECONDS = 0.5  # each rate timed over this long at least: many time slices of a shared core
RATES = ("gemm_flops", "elementwise_bytes_per_s", "alpha_s", "beta_s_per_byte")


def _timed(fn, repeats: int, device: torch.device, min_s: float = MIN_SECONDS) -> float:
    """Mean seconds of ``fn()`` over at least ``repeats`` calls and ``min_s`` seconds, after one
    warm-up. The mean over many of the scheduler's time slices, not the best: a loop shorter than a
    slice would run on a core of its own even where the run's ranks share them; on CUDA with the
    queued work included."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    calls, start = 0, time.perf_counter()
    while calls < repeats or time.perf_counter() - start < min_s:
        fn()
        calls += 1
        if calls % repeats == 0:
            sync()
    sync()
    return (time.perf_counter() - start) / calls


def _gemm_layer(run: RunShape, dtype: torch.dtype, device: torch.device):
    """One layer shard's GEMMs, forward and backward, as a function, and their FLOPs (3 GEMMs of
    2·m·k·n each)."""
    pairs = []
    for m, k, n in gemm_shapes(run):
        x = torch.randn(m, k, dtype=dtype, device=device, requires_grad=True)
        w = torch.randn(k, n, dtype=dtype, device=device, requires_grad=True)
        pairs.append((x, w))

    def layer() -> None:
        for x, w in pairs:
            (x @ w).sum().backward()

    return layer, sum(3 * 2 * m * k * n for m, k, n in gemm_shapes(run))


def _one_gemm_each(run: RunShape, dtype: torch.dtype, device: torch.device):
    """A layer's GEMMs one per call, in turn: the compute a run does between two of its tensor-parallel
    collectives (8 per layer and microbatch, forward and backward, around 4 GEMMs' forward and backward)."""
    pairs = [(torch.randn(m, k, dtype=dtype, device=device, requires_grad=True),
              torch.randn(k, n, dtype=dtype, device=device, requires_grad=True)) for m, k, n in gemm_shapes(run)]
    turn = [0]

    def one() -> None:
        x, w = pairs[turn[0] % len(pairs)]
        turn[0] += 1
        (x @ w).sum().backward()

    return one


def gemm_rate(run: RunShape, dtype: torch.dtype, repeats: int = 50, device: torch.device = CPU) -> float:
    """FLOP/s of one layer shard's GEMMs, forward and backward, at the run's shapes."""
    layer, flops = _gemm_layer(run, dtype, device)
    return flops / _timed(layer, repeats, device)


def elementwise_rate(run: RunShape, dtype: torch.dtype, repeats: int = 50, device: torch.device = CPU) -> float:
    """The planner's per-layer bytes of memory-bound kernels and attention, forward and backward, per
    second: the time of a layer's LayerNorms, GeLU, residual adds and attention core at the run's sizes."""
    tokens, h, t = run.tokens, run.hidden, run.tp
    heads = max(1, run.heads // t)
    d = run.hidden // run.heads
    rows = tokens // t if t > 1 else tokens  # sequence parallelism: the LayerNorms and adds on s/t tokens
    x = torch.randn(rows, h, dtype=dtype, device=device, requires_grad=True)
    up = torch.randn(tokens, run.ffn // t, dtype=dtype, device=device, requires_grad=True)
    q = torch.randn(run.micro_batch, heads, run.seq // run.cp, d, dtype=dtype, device=device, requires_grad=True)
    kv = torch.randn(run.micro_batch, heads, run.seq, d, dtype=dtype, device=device, requires_grad=True)
    norm = torch.nn.LayerNorm(h).to(device=device, dtype=dtype)

    def layer() -> None:
        y = norm(x) + x
        y = norm(y) + y
        scores = torch.softmax(q @ kv.transpose(-1, -2), dim=-1)
        out = (scores @ kv).sum() + y.sum() + F.gelu(up).sum()
        out.backward()

    return layer_bytes(run) * 3 / _timed(layer, repeats, device)


def _measure_rank(rank: int, world: int, run: dict, dtype_name: str, repeats: int = 50,
                  device: torch.device = CPU) -> dict[str, float]:
    """On every rank of the running group, all at once: the rates of :func:`measure`."""
    shape = RunShape(**run)
    dtype = getattr(torch, dtype_name)
    dist.barrier()
    gemm = gemm_rate(shape, dtype, repeats, device)
    dist.barrier()
    other = elementwise_rate(shape, dtype, repeats, device)
    dist.barrier()
    alpha, beta = concurrent_pairs_alpha_beta(repeats=max(5, repeats // 5), device_type=device.type,
                                              between=_one_gemm_each(shape, dtype, device))
    return {"gemm_flops": gemm, "elementwise_bytes_per_s": other, "alpha_s": alpha, "beta_s_per_byte": beta}


def measure(run: RunShape, dtype: str = "float64") -> dict[str, Any]:
    """The machine profile for ``run`` (its ranks, sizes and dtype): each rate the median over the
    ranks, measured with all of them at once on this machine's cores."""
    from .testing import run_in_group

    ranks = run_in_group(_measure_rank, run.world, run.as_dict(), dtype, timeout_s=300)
    out: dict[str, Any] = {key: statistics.median(r[key] for r in ranks) for key in ranks[0]}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    out.update(run=run.as_dict(), dtype=dtype, cpus=os.cpu_count() or 1, load=load, measured_at=time.time())
    return out


def profile_path() -> Path:
    """``$DISTAI_HOME/machine_profile.json`` (the tutor's data folder, ``distai.tutor.paths``)."""
    home = os.environ.get("DISTAI_HOME")
    if not home:
        from platformdirs import user_data_dir

        home = user_data_dir("distai", appauthor=False)
    return Path(home).expanduser() / PROFILE_FILE


def load_profile(run: RunShape, dtype: str, max_age_s: float = PROFILE_MAX_AGE_S) -> dict[str, Any] | None:
    """A saved profile measured for these sizes and dtype less than ``max_age_s`` ago, else None."""
    try:
        saved = json.loads(profile_path().read_text())
    except (OSError, ValueError):
        return None
    fresh = time.time() - float(saved.get("measured_at", 0)) <= max_age_s
    return saved if fresh and saved.get("run") == run.as_dict() and saved.get("dtype") == dtype else None


def machine_profile(run: RunShape, dtype: str = "float64", fresh: bool = False) -> dict[str, Any]:
    """A recent saved profile for ``run``, or a new measurement (saved for the next call)."""
    saved = None if fresh else load_profile(run, dtype)
    if saved is not None:
        return saved
    profile = measure(run, dtype)
    path = profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2))
    return profile


# ------------------------------------------------------------------------------ the capstone's check

def run_shape(plan: Any) -> RunShape:
    """The capstone run of ``plan`` (:class:`~distai.engine.mesh_args.RunPlan`) as the prediction sees it."""
    s, cfg = plan.shape, plan.model
    return RunShape(dp=s.dp, tp=s.tp, pp=s.pp, cp=getattr(s, "cp", 1), ep=getattr(s, "ep", 1), layers=cfg.layers,
                    hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.group_heads, seq=cfg.seq, vocab=cfg.vocab,
                    ffn=cfg.ffn_size, micro_batch=plan.microbatch_size, microbatches=plan.microbatches,
                    chunks=plan.chunks, zero=plan.args.zero, elem_bytes=getattr(torch, plan.dtype).itemsize)


def run_comm(plan: Any) -> tuple[list[dict], list[int]]:
    """What every pipeline rank of ``plan``'s run sends per step on each group, from the formulas
    the run's communication account checks exactly (:func:`~distai.engine.mesh.expected_comm`), and
    the layers it holds: the prediction's input (:func:`~distai.lessons.capstone.calibrated.predict_run`)."""
    from . import mesh as M

    s, cfg, v = plan.shape, plan.model, plan.chunks
    n_stages = s.pp * (v if plan.schedule == "interleaved" else 1)
    accounts = [M.expected_comm(cfg, s, r, microbatches=plan.microbatches, microbatch_size=plan.microbatch_size,
                                schedule=plan.schedule, chunks=v, zero=plan.args.zero,
                                elem_size=getattr(torch, plan.dtype).itemsize) for r in range(s.pp)]
    layers = [sum(len(M.stage_layers(cfg, n_stages, st)) for st in range(r, n_stages, s.pp)) for r in range(s.pp)]
    return accounts, layers


def _rates_now(ctx: Any, run: RunShape, dtype: str) -> dict[str, float]:
    """The rates measured again by the run's own ranks, all at once, right after its steps: the
    median over the ranks (every rank gets them)."""
    mine = _measure_rank(ctx.rank, ctx.world_size, run.as_dict(), dtype, device=ctx.device)  # as calibrated
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    return {key: statistics.median(r[key] for r in everyone) for key in mine}


def cpu_clock() -> tuple[float, float]:
    """This process's CPU seconds (all its threads) and its main thread's seconds spent runnable on
    a run queue with no core free (``/proc/self/schedstat``'s second field; 0 where there is none):
    read before and after a step, how much of it the rank computed and how long it waited for a core."""
    try:
        wait = int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        wait = 0.0
    return time.process_time(), wait


def call_seconds(meter: Any) -> dict[str, float]:
    """Per group, the seconds this rank's metered calls lasted, issue to completion (the meter's
    ``t0``, ``t1``); receives left out (their wait is for the sender's work, the pipeline's bubble)."""
    out: dict[str, float] = {}
    for r in meter.records:
        if r.t1 is not None and r.op != "recv":
            dim = meter.dims.get(r.group, "other")
            out[dim] = out.get(dim, 0.0) + r.t1 - r.t0
    return out


def _slow_collectives(run: RunShape, rates: dict, account: dict | None, seconds: dict[str, float] | None) -> float:
    """How much longer this rank's metered calls lasted than the prediction prices them at
    (:func:`~distai.lessons.capstone.calibrated.account_s` of the same calls), in every group but the
    pipeline's (a send's time there waits on the other stage: the bubble)."""
    priced = account_s(run, rates, account or {})
    return sum(t - priced.get(dim, 0.0) for dim, t in (seconds or {}).items() if dim in priced and dim != "pp")


def check_step_time(ctx: Any, plan: Any, times: list[float], metered_step: int, account: dict | None,
                    seconds: dict[str, float] | None = None, cpu: tuple[float, float] = (0.0, 0.0)) -> Check | None:
    """On every rank, after the capstone's steps: the ``check`` event ``capstone_step_time`` (rank 0
    emits it and returns it; the others return None). Measured: the mean step time of the timed
    steps (each the slowest rank's span; the first and the metered step left out). Predicted: the
    run's own model (:func:`distai.lessons.capstone.calibrated.predict_run`: every call the formulas
    count, which the metered step matches exactly, at the measured α-β; unequal stages; lesson 5's
    replay of the schedule) from the profile ``distai calc plan --calibrate`` saved for this run,
    else from the rates the run's ranks measure now. Cause, measured on its own:
    ``slower_since_calibration``, the same prediction from the rates measured now (all ranks at
    once, right after the steps) minus the one from the saved profile (the machine got busier: CPU
    contention); ``slow_collective`` (with ``seconds``, each group's seconds of the metered step's
    calls on this rank, :func:`call_seconds`): how much longer they lasted than the same calls at
    the rates measured now, on the rank where that is most. The planner's own prediction (:func:`~distai.lessons.capstone.calibrated.predict`)
    is in the detail as ``planner_step_time_s``; ``cpu`` (this rank's CPU seconds and run-queue wait
    per timed step, :func:`cpu_clock`) gives the detail's ``cpu_s_per_step`` (all ranks) and
    ``runqueue_s_per_step`` (the rank that waited most). Runs with experts are not predicted (None)."""
    if getattr(plan.shape, "moe", False):
        return None
    run = run_shape(plan)
    box: list[Any] = [load_profile(run, plan.dtype) if ctx.rank == 0 else None]
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    saved, now = box[0], _rates_now(ctx, run, plan.dtype)
    slow = max_over_ranks(_slow_collectives(run, now, account, seconds)) if seconds is not None else None
    clocks: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(clocks, cpu)
    if ctx.rank != 0:
        return None
    accounts, layers = run_comm(plan)
    timed = [t for i, t in enumerate(times) if i not in (0, metered_step)] or times
    predicted = predict_run(run, saved or now, accounts, layers)
    causes = {} if slow is None else {"slow_collective": slow}
    if saved is not None:
        causes["slower_since_calibration"] = predict_run(run, now, accounts, layers)["step_time_s"] \
            - predicted["step_time_s"]
    detail = {k: float(v) for k, v in predicted.items()}
    detail["planner_step_time_s"] = predict(run, saved or now)["step_time_s"]
    # CPU oversubscription, measured over the timed steps: the ranks' CPU seconds per step (all
    # ranks; at most cores × the step) and the longest wait of a rank for a core per step
    detail.update(cpu_s_per_step=sum(c[0] for c in clocks), runqueue_s_per_step=max(c[1] for c in clocks),
                  cores=float(os.cpu_count() or 1))
    detail.update(calibrated_before_run=float(saved is not None), load=os.getloadavg()[0],
                  **{f"rate_{k}": float((saved or now)[k]) for k in RATES}, **{f"now_{k}": now[k] for k in RATES})
    result = check("capstone_step_time", predicted["step_time_s"], statistics.fmean(timed), "s",
                   causes=causes, detail=detail)
    CHECK.emit_fields(ctx.events, result.event())  # distai run draws it in the run's check table
    return result


def plan_profile(values: dict) -> dict:
    """For ``distai calc plan --calibrate``: the capstone run its options describe (the degrees,
    default (dp, tp, pp, cp, ep) = (2, 2, 2, 1, 1), and the size flags, default the run's own, as
    ``distai run capstone --cpu`` plans it) and this machine's profile for it: {"run", "profile"}.
    A run the capstone refuses is a CalcError (one line)."""
    from .mesh_args import plan_run

    degrees = {k: values.get(k) or d for k, d in (("dp", 2), ("tp", 2), ("pp", 2), ("cp", 1), ("ep", 1))}
    argv = [f"--{k}={v}" for k, v in degrees.items() if k in ("dp", "tp", "pp") or v > 1]
    for flag, key in (("layers", "layers"), ("hidden", "hidden"), ("heads", "heads"), ("kv-heads", "kv_heads"),
                      ("seq", "seq"), ("vocab", "vocab"), ("microbatch-size", "microbatch")):
        if values.get(key) is not None:
            argv.append(f"--{flag}={values[key]}")
    world = degrees["dp"] * degrees["tp"] * degrees["pp"] * degrees["cp"]
    try:
        plan = plan_run(argv, world, cuda=False)
        if values.get("global_batch") is not None:  # m microbatches of b per DP rank
            b = plan.microbatch_size
            if values["global_batch"] % (degrees["dp"] * b):
                raise ValueError(f"--global-batch {values['global_batch']} does not split into dp·microbatch = "
                                 f"{degrees['dp']}·{b}")
            plan = plan_run(argv + [f"--microbatches={values['global_batch'] // (degrees['dp'] * b)}"], world,
                            cuda=False)
    except ValueError as exc:  # MeshConfigError, the shape check's ShapeError
        raise CalcError(f"the capstone run cannot take this: {exc}") from None
    run = run_shape(plan)
    accounts, layers = run_comm(plan)
    return {"run": run.as_dict(), "profile": machine_profile(run, plan.dtype), "accounts": accounts, "layers": layers}
