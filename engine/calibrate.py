"""This machine's rates at the capstone run's sizes: the planner's inputs, measured instead of read
from a GPU's data sheet (``distai calc plan --calibrate``, and the capstone run's step-time check).

``world`` processes (as many as the run has ranks, so that they share the cores as the run's ranks
do) each time, at once:

- the GEMMs of one transformer layer's shard (``x @ W`` forward and backward, autograd included, the
  run's rows b·s/cp and widths h, 3h/t, 4h/t): the matmul rate in FLOP/s;
- the rest of a layer's kernels at the same sizes (two LayerNorms, the GeLU, the residual adds, the
  attention core), expressed as the bytes the planner counts for them per second;
- all-gathers inside groups of two ranks, all groups at once (the run's TP, DP and PP groups are
  pairs on the meshes it trains), of a small and a large message: α and β of lesson 1's ring, the
  median of :data:`ALPHA_FITS` fits (one fit swings by 2× as the scheduler's load drifts);
- the run's own modules (:func:`model_pieces`: a layer, the embedding, the head and loss, every
  module's overheads included) at the run's sizes, without their collectives;
- each rank's CPU seconds (all its threads) in the run's own step (:func:`step_cpu`: the course's
  GPT on the run's mesh) and the cores the ranks get in it (``cores``: the machine's less what
  other processes take, :func:`cores_left`): with more ranks than cores the step is set by what they
  ask of the cores (:func:`~distai.lessons.capstone.calibrated.cores_bound_s`), not by the α-β path.

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
    cores_bound_s,
    gemm_shapes,
    layer_bytes,
    predict,
    predict_run,
)
from ..lessons.checks import Check, check
from ..lessons.events import CHECK
from ..lessons.strings import LANGUAGES, TranslatedError, os_error_text, translated
from .doctor import concurrent_pairs_alpha_beta
from .durable import write_atomic
from .experiment import max_over_ranks, share_cores_among_local_ranks

PROFILE_FILE = "machine_profile.json"
PROFILE_MAX_AGE_S = 3600.0  # a profile older than this is measured again
CPU = torch.device("cpu")
ALPHA_FITS = 3  # α and β: the median of this many fits, each over every rank at once
MIN_SECONDS = 0.5  # each rate timed over this long at least: many time slices of a shared core
RATES = ("gemm_flops", "elementwise_bytes_per_s", "alpha_s", "beta_s_per_byte", "layer_s", "first_s", "last_s")
STAGE_CPU = ("cpu_step_s", "cpu_forward_s", "cpu_backward_s")  # per pipeline stage (step_cpu)
CPU_KEYS = (*STAGE_CPU, "cores")


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


def _tp_local(module: torch.nn.Module, columns: tuple[str, ...], rows: tuple[str, ...], t: int) -> None:
    """``module``'s projections as one of ``t`` tensor-parallel ranks holds them, as plain linears
    (its collectives are priced apart): the column-parallel ones 1/t as wide, the row-parallel 1/t as deep."""
    for name, split in [(n, "out") for n in columns] + [(n, "in") for n in rows]:
        lin = getattr(module, name, None)
        if isinstance(lin, torch.nn.Linear):
            i, o = (lin.in_features, lin.out_features // t) if split == "out" else (lin.in_features // t, lin.out_features)
            setattr(module, name, torch.nn.Linear(i, o, bias=lin.bias is not None))


def model_pieces(run: RunShape, dtype: torch.dtype, device: torch.device):
    """The run's own modules as one rank computes them, without their collectives (priced apart,
    :func:`~distai.lessons.capstone.calibrated.account_s`), each a function doing one microbatch's
    forward and backward: a layer (the course's ``Block``, its projections tensor-parallel-local,
    on b·s/cp tokens; under context parallelism its attention core run once per ring hop, cp
    times), the first stage's embedding and the last stage's head and loss (V/t of the vocabulary).
    What the planner's kernel rates leave out is in them: every module's Python, autograd and
    small-tensor overheads, the bulk of a small run's computing."""
    from .model import Block, Embedding, Head, attend, lm_loss

    cfg, t, cp = run.model_size(), run.tp, run.cp
    block, head, embed = Block(cfg), Head(cfg), Embedding(run.vocab, run.hidden)
    if t > 1:
        _tp_local(block.attn, ("wq", "wk", "wv"), ("wo",), t)
        _tp_local(block.mlp, ("fc1", "gate"), ("fc2",), t)
        head.weight = torch.nn.Parameter(torch.empty(run.vocab // t, run.hidden))
    if cp > 1:
        def hops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: Any) -> torch.Tensor:
            out = attend(q, k, v)
            for _hop in range(cp - 1):
                out = out + attend(q, k, v)
            return out

        block.attn.core = hops
    for m in (block, head, embed):
        m.to(device=device, dtype=dtype)
    for m in (block, head):
        for w in m.parameters():
            torch.nn.init.normal_(w, std=0.02)
    rows = run.seq // cp
    x = torch.randn(rows, run.micro_batch, run.hidden, dtype=dtype, device=device, requires_grad=True)
    ids = torch.randint(0, run.vocab, (run.micro_batch, rows), device=device)
    targets = torch.randint(0, run.vocab // t, (run.micro_batch, rows), device=device)
    return {"layer_s": lambda: block(x).sum().backward(),
            "first_s": lambda: embed(ids).sum().backward(),
            "last_s": lambda: lm_loss(head(x), targets).backward()}


def step_cpu(run: RunShape, dtype: torch.dtype, device: torch.device, steps: int = 9) -> dict[str, float]:
    """On every rank of the running group (the run's world), all at once: the CPU seconds this rank
    spends (all its threads) in one of the run's own steps — the course's GPT on the run's mesh,
    :class:`~distai.engine.mesh.MeshTrainer`, the median over ``steps`` less the first (warm-up; the
    mean of 3 gave the (1, 2, 2, 2) mesh 94-138 ms where its run spent 80-96: one slow step of 8
    ranks on 2 cores moved it) — and
    per forward and per backward block (this thread's): what each rank asks of the cores, whatever
    their sharing; ``stage``: its pipeline rank. The steps' wall time only as the window over which
    the cores the ranks had are counted (``window_*``: its seconds, this rank's CPU seconds and the
    machine's busy ones, :func:`cores_left`), as the run counts them over its own steps."""
    from . import mesh as M
    from .mesh_args import choose_shape
    from .model import GPT

    shape = choose_shape(run.tp, run.pp, run.dp, run.world, run.cp, run.ep)
    mesh, cfg = M.build_mesh(shape, device.type), run.model_size()
    trainer = M.MeshTrainer(GPT(cfg, seed=0, dtype=dtype, device=device), mesh, microbatches=run.microbatches,
                            microbatch_size=run.micro_batch, schedule="1f1b" if run.chunks == 1 else "interleaved",
                            chunks=run.chunks, zero=run.zero, lr=0.01, device=device)
    cpu: list[float] = []
    blocks: dict[str, list[float]] = {"F": [], "B": []}
    window = [0.0, 0.0]
    for step in range(steps):
        ids, tg = M.global_batch(cfg, shape, run.microbatches, run.micro_batch, step, seed=0, device=device)
        dist.barrier()
        start, clock = time.perf_counter(), cpu_clock()
        out = trainer.step(M.dp_share(ids, mesh.dp_rank, shape.dp), M.dp_share(tg, mesh.dp_rank, shape.dp))
        end = cpu_clock()
        if step:
            cpu.append(end[0] - clock[0])
            window = [window[0] + time.perf_counter() - start, window[1] + end[2] - clock[2]]
            for r in out.pipeline.records:
                blocks[r.op.kind].append(r.compute)
    return {"stage": mesh.pp_rank, "cpu_step_s": statistics.median(cpu), "cpu_forward_s": statistics.fmean(blocks["F"]),
            "cpu_backward_s": statistics.fmean(blocks["B"]), "window_s": window[0], "window_cpu_s": sum(cpu),
            "window_busy_s": window[1]}


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
    pieces = {}
    for key, fn in model_pieces(shape, dtype, device).items():
        dist.barrier()
        pieces[key] = _timed(fn, repeats, device)
    dist.barrier()
    between = _one_gemm_each(shape, dtype, device)
    fits = [concurrent_pairs_alpha_beta(repeats=max(5, repeats // 5), device_type=device.type, between=between)
            for _ in range(ALPHA_FITS)]  # each one fit: the median of several, as the load drifts between them
    alpha, beta = statistics.median(a for a, _ in fits), statistics.median(b for _, b in fits)
    dist.barrier()
    return {"gemm_flops": gemm, "elementwise_bytes_per_s": other, "alpha_s": alpha, "beta_s_per_byte": beta,
            **pieces, **step_cpu(shape, dtype, device)}


#: the seconds a calibration may take before its ranks are stopped
MEASURE_TIMEOUT_S = 300


def _measure_in_torchrun(run: RunShape, dtype: str, timeout_s: float = MEASURE_TIMEOUT_S) -> list[dict[str, Any]]:
    """:func:`_measure_rank` on ``run.world`` ranks started as a run's are: by torchrun, one fresh
    interpreter each, ``OMP_NUM_THREADS=1`` as the launcher sets it. How the ranks start changes the
    step's CPU: (2, 2, 2) mesh, 8 ranks, medians of 71.5-73.5 ms per step under torchrun against
    57-64.5 ms in processes spawned by multiprocessing, and the (2, 1, 2, 2) mesh the other way
    (35-41 against 38-56 ms). torchrun dies with this thread (``lifeline.parent_death_signal``), the
    ranks with torchrun or this process (``lifeline.watch_launcher``), and all of them at
    ``timeout_s`` or on an interrupt: nothing outlives the command."""
    import signal
    import subprocess
    import tempfile

    from .launcher import LaunchSpec, Placement, torchrun_command
    from .lifeline import LAUNCHER_PID_ENV, parent_death_signal

    with tempfile.TemporaryDirectory() as out_dir:
        spec = LaunchSpec(__name__, Placement("cpu", run.world), [out_dir, json.dumps(run.as_dict()), dtype])
        cmd = torchrun_command(spec, Path(out_dir) / "torchrun")
        # the ranks watch this process as a run's watch its launcher (lifeline.watch_launcher)
        env = {**os.environ, "OMP_NUM_THREADS": "1", LAUNCHER_PID_ENV: str(os.getpid())}
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=parent_death_signal)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except BaseException:  # a timeout or ^C: the ranks go with it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        found = [Path(out_dir) / f"{rank}.json" for rank in range(run.world)]
        if proc.returncode or not all(f.exists() for f in found):
            from .launcher import analyse_failure
            from .runs import reason_text

            # torchrun's report names the rank and how it ended (the OOM killer's SIGKILL); its last
            # line is a rule of "=" signs
            lines = (err or "").splitlines()
            failure = analyse_failure([], lines, proc.returncode) if any(line.strip() for line in lines) else None
            why = failure.message if failure is not None and failure.rank is not None else f"exit {proc.returncode}"
            raise CalcError.keyed("plan.errors.calibration", why=lambda lang: reason_text(why, lang) or why)
        return [json.loads(f.read_text()) for f in found]


def _rank_main(out_dir: str, run_json: str, dtype: str) -> None:
    """One rank of :func:`_measure_in_torchrun` (torchrun's environment): its rates, as JSON."""
    from .lifeline import watch_launcher

    watch_launcher()  # die with torchrun and with the command that started it
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        share_cores_among_local_ranks(world)  # as the capstone run does
        mine = _measure_rank(rank, world, json.loads(run_json), dtype)
        (Path(out_dir) / f"{rank}.json").write_text(json.dumps(mine))
    finally:
        dist.destroy_process_group()


def measure(run: RunShape, dtype: str = "float64") -> dict[str, Any]:
    """The machine profile for ``run`` (its ranks, sizes and dtype): each rate the median over the
    ranks, measured with all of them at once on this machine's cores, in ranks torchrun started
    (:func:`_measure_in_torchrun`)."""
    ranks = _measure_in_torchrun(run, dtype)
    out = _median_profile(ranks, run.pp)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    out.update(run=run.as_dict(), dtype=dtype, cpus=os.cpu_count() or 1, load=load, measured_at=time.time())
    return out


def _median_profile(ranks: list[dict[str, float]], pp: int) -> dict[str, Any]:
    """Each rate the median over the ranks; each CPU cost of :func:`step_cpu` a list, per pipeline
    stage the median over its ranks; ``cores``: the cores the ranks had in the run's own steps
    (:func:`cores_left`: the machine's, less what other processes took meanwhile)."""
    window = ("window_s", "window_cpu_s", "window_busy_s")
    out: dict[str, Any] = {key: statistics.median(r[key] for r in ranks) for key in ranks[0]
                           if key not in ("stage", *window, *STAGE_CPU)}
    clocks = [{"cpu": r["window_cpu_s"], "busy": r["window_busy_s"]} for r in ranks]
    out.update(cpus=os.cpu_count() or 1, cores=cores_left(clocks, ranks[0]["window_s"], float(os.cpu_count() or 1)))
    for key in STAGE_CPU:
        out[key] = [statistics.median(r[key] for r in ranks if r["stage"] == i) for i in range(pp)]
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
    complete = all(key in saved for key in RATES + CPU_KEYS)  # one measured before a rate was added is stale
    return saved if fresh and complete and saved.get("run") == run.as_dict() and saved.get("dtype") == dtype else None


def machine_profile(run: RunShape, dtype: str = "float64", fresh: bool = False) -> dict[str, Any]:
    """A recent saved profile for ``run``, or a new measurement (saved for the next call)."""
    saved = None if fresh else load_profile(run, dtype)
    if saved is not None:
        return saved
    profile = measure(run, dtype)
    path = profile_path()
    try:  # whole or not at all: a full disk keeps the last profile and only costs the next call a measurement
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(profile, indent=2).encode("utf-8"))
    except OSError:
        pass
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
    return _median_profile(everyone, run.pp)


def cpu_clock() -> tuple[float, float, float]:
    """This process's CPU seconds (all its threads), its main thread's seconds spent runnable on a
    run queue with no core free (``/proc/self/schedstat``'s second field; 0 where there is none)
    and the whole machine's busy CPU seconds, every process's (``/proc/stat``: all but idle and
    I/O wait; 0 where there is none): read before and after a step, how much of it the rank
    computed, how long it waited for a core, and (less every rank's CPU) what other processes took."""
    try:
        wait = int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        wait = 0.0
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        busy = 0.0
    return time.process_time(), wait, busy


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
                    seconds: dict[str, float] | None = None, cpu: tuple[float, ...] = (0.0, 0.0, 0.0)) -> Check | None:
    """On every rank, after the capstone's steps: the ``check`` event ``capstone_step_time`` (rank 0
    emits it and returns it; the others return None). Measured: the mean step time of the timed
    steps (each the slowest rank's span; the first and the metered step left out). Predicted: the
    run's own model (:func:`distai.lessons.capstone.calibrated.predict_run`: every call the formulas
    count, which the metered step matches exactly, at the measured α-β; unequal stages; lesson 5's
    replay of the schedule; at least the ranks' CPU work over the cores they get) from the profile
    ``distai calc plan --calibrate`` saved for this run, else from the one the run's ranks measure
    now. Causes, each measured on its own, each the same model again with one input replaced by a
    newer measurement: ``slower_since_calibration``, the profile measured again by the run's ranks
    right after its steps (all at once; the machine got busier, or quieter) instead of the saved
    one; ``more_cpu_work``, then each stage's CPU seconds per step as the run's ranks spent them in
    their timed steps (``cpu``: this rank's CPU seconds, run-queue wait and the machine's busy
    seconds per timed step, :func:`cpu_clock`) instead of the calibration's;
    ``cores_taken_by_others``, then the cores the ranks had during those steps (:func:`cores_left`:
    the machine's less what other processes took) instead of the ones they got when measured. The detail holds the planner's prediction
    (``planner_step_time_s``), the ranks' CPU per step (``cpu_s_per_step``, all ranks), the longest
    run-queue wait (``runqueue_s_per_step``) and, with ``seconds`` (each group's seconds of the
    metered step's calls, :func:`call_seconds`), ``slow_collective_s``: how much longer they lasted
    than priced (waits for peers included: information, not a cause). Runs with experts are not
    predicted (None)."""
    if getattr(plan.shape, "moe", False):
        return None
    run = run_shape(plan)
    box: list[Any] = [load_profile(run, plan.dtype) if ctx.rank == 0 else None]
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    saved, now = box[0], _rates_now(ctx, run, plan.dtype)
    slow = max_over_ranks(_slow_collectives(run, now, account, seconds)) if seconds is not None else None
    clocks: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(clocks, {"cpu": cpu[0], "wait": cpu[1], "busy": cpu[2],
                                    "stage": plan.shape.coords(ctx.rank)["pp"]})
    if ctx.rank != 0:
        return None
    accounts, layers = run_comm(plan)
    timed = [t for i, t in enumerate(times) if i not in (0, metered_step)] or times
    measured = statistics.fmean(timed)
    spent = dict(now, cpu_step_s=[statistics.median(c["cpu"] for c in clocks if c["stage"] == i) for i in range(run.pp)])
    cores_run = cores_left(clocks, measured, now["cores"])
    shared = dict(spent, cores=cores_run)
    steps = [predict_run(run, p, accounts, layers) for p in (saved or now, now, spent, shared)]
    causes = {"more_cpu_work": steps[2]["step_time_s"] - steps[1]["step_time_s"],
              "cores_taken_by_others": steps[3]["step_time_s"] - steps[2]["step_time_s"]}
    if saved is not None:
        causes["slower_since_calibration"] = steps[1]["step_time_s"] - steps[0]["step_time_s"]
    detail = _check_detail(run, steps[0], saved, now, clocks)
    if slow is not None:
        detail["slow_collective_s"] = slow
    detail["cores_run"] = cores_run
    result = check("capstone_step_time", steps[0]["step_time_s"], measured, "s",
                   causes=causes, detail=detail)
    CHECK.emit_fields(ctx.events, result.event())  # distai run draws it in the run's check table
    return result


def cores_left(clocks: list[dict], step_s: float, calibrated: float) -> float:
    """The cores the ranks had over a stretch of ``step_s`` seconds: the machine's, less the CPU
    seconds per second other processes took meanwhile (rank 0's count of the machine's busy seconds,
    ``clocks[0]["busy"]``, less every rank's own ``cpu``); ``calibrated`` where the machine does not
    count them."""
    busy = clocks[0]["busy"]
    if busy <= 0 or step_s <= 0:
        return calibrated
    others = max(0.0, busy - sum(c["cpu"] for c in clocks)) / step_s
    return max(0.25, (os.cpu_count() or 1) - others)


def profile_fields(profile: dict, prefix: str) -> dict[str, float]:
    """A profile as a check's detail (floats only): ``{prefix}{rate}`` for each rate, the cores and CPUs,
    ``{prefix}{cost}_{stage}`` for each per-stage CPU cost."""
    out = {f"{prefix}{k}": float(profile[k]) for k in (*RATES, "cores", "cpus")}
    for key in STAGE_CPU:
        out.update({f"{prefix}{key}_{i}": float(v) for i, v in enumerate(profile[key])})
    return out


def profile_from_fields(detail: dict, prefix: str, pp: int) -> dict[str, Any]:
    """The profile :func:`profile_fields` wrote into a check's detail."""
    out: dict[str, Any] = {k: detail[f"{prefix}{k}"] for k in (*RATES, "cores", "cpus")}
    out.update({key: [detail[f"{prefix}{key}_{i}"] for i in range(pp)] for key in STAGE_CPU})
    return out


def _check_detail(run: RunShape, predicted: dict, saved: dict | None, now: dict, clocks: list) -> dict[str, float]:
    """The step-time check's detail: the prediction's terms, the planner's step, the ranks' CPU and
    run-queue wait per timed step, the profiles used (``rate_``: the prediction's, ``now_``: measured
    after the steps)."""
    detail = {k: float(v) for k, v in predicted.items()}
    detail["planner_step_time_s"] = predict(run, saved or now)["step_time_s"]
    detail["cores_bound_s"] = cores_bound_s(run, saved or now)
    detail.update(cpu_s_per_step=sum(c["cpu"] for c in clocks), runqueue_s_per_step=max(c["wait"] for c in clocks),
                  calibrated_before_run=float(saved is not None), load=os.getloadavg()[0],
                  **profile_fields(saved or now, "rate_"), **profile_fields(now, "now_"))
    for i in range(run.pp):
        detail[f"cpu_step_s_run_{i}"] = statistics.median(c["cpu"] for c in clocks if c["stage"] == i)
    return detail


def capstone_argv(values: dict) -> tuple[list[str], dict[str, int]]:
    """The ``distai run capstone`` options that ``calc plan --calibrate``'s ``values`` describe (the
    degrees, default (dp, tp, pp, cp, ep) = (2, 2, 2, 1, 1), cp and ep only when above 1, and the size
    flags given), and the degrees."""
    degrees = {k: values.get(k) or d for k, d in (("dp", 2), ("tp", 2), ("pp", 2), ("cp", 1), ("ep", 1))}
    argv = [f"--{k}={v}" for k, v in degrees.items() if k in ("dp", "tp", "pp") or v > 1]
    for flag, key in (("layers", "layers"), ("hidden", "hidden"), ("heads", "heads"), ("seq", "seq"),
                      ("vocab", "vocab"), ("microbatch-size", "micro_batch")):
        if values.get(key) is not None:
            argv.append(f"--{flag}={values[key]}")
    return argv, degrees


def run_command(argv: list[str], world: int) -> str:
    """The command that runs the calibrated run itself on ``world`` CPU ranks, to check the prediction."""
    return " ".join(["distai run capstone", f"--cpu {world}", *(a.replace("=", " ", 1) for a in argv)])


#: calc plan's options that describe a cluster or a model other than the capstone run --calibrate measures
#: and predicts (those with no default: a given one would be dropped without a word)
NOT_THE_RUNS = ("params", "gpus", "gpu_memory", "experts", "top_k", "ffn", "efficiency", "alpha")


def plan_profile(values: dict) -> dict:
    """For ``distai calc plan --calibrate``: the capstone run its options describe (the degrees,
    default (dp, tp, pp, cp, ep) = (2, 2, 2, 1, 1), and the size flags, default the run's own, as
    ``distai run capstone --cpu`` plans it) and this machine's profile for it: {"run", "profile"}.
    A run the capstone refuses is a CalcError (one line)."""
    from .mesh_args import plan_run

    ignored = [f"--{k.replace('_', '-')}" for k in NOT_THE_RUNS if values.get(k) is not None]
    if ignored:  # a cluster's or another model's figures: the calibrated prediction is of this machine's run
        raise CalcError.keyed("plan.errors.calibrate_ignores", flags=", ".join(ignored))
    try:  # where the profile will be saved, before a measurement it could not keep
        profile_path().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = {lang: os_error_text(exc, lang) for lang in LANGUAGES}
        raise CalcError.keyed("plan.errors.profile_folder", path=profile_path().parent, why=why.__getitem__) from None
    argv, degrees = capstone_argv(values)
    world = degrees["dp"] * degrees["tp"] * degrees["pp"] * degrees["cp"]
    try:
        plan = plan_run(argv, world, cuda=False)
        if values.get("global_batch") is not None:  # m microbatches of b per DP rank
            b = plan.microbatch_size
            if values["global_batch"] % (degrees["dp"] * b):
                raise CalcError.keyed("plan.errors.capstone_batch", batch=values["global_batch"], dp=degrees["dp"], b=b)
            argv.append(f"--microbatches={values['global_batch'] // (degrees['dp'] * b)}")
            plan = plan_run(argv, world, cuda=False)
    except ValueError as exc:  # MeshConfigError, the shape check's ShapeError: each in every language
        why = {lang: exc.text(lang) if isinstance(exc, TranslatedError) else str(exc) for lang in LANGUAGES}
        raise CalcError(texts={lang: translated("calc", "plan.errors.capstone", lang, reason=why[lang])
                               for lang in LANGUAGES}) from None
    if values.get("kv_heads") not in (None, plan.model.heads):  # the run's attention has no K/V groups
        raise CalcError.keyed("plan.errors.capstone_kv_heads", kv_heads=values["kv_heads"], heads=plan.model.heads)
    run = run_shape(plan)
    accounts, layers = run_comm(plan)
    return {"run": run.as_dict(), "profile": machine_profile(run, plan.dtype), "accounts": accounts, "layers": layers,
            "command": run_command(argv, world)}


if __name__ == "__main__":  # a rank of _measure_in_torchrun
    import sys

    _rank_main(*sys.argv[1:4])
