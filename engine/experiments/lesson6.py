"""Lesson 6 experiment: dynamic loss scaling in fp16, and bucketed all-reduce overlapping backward.

Run by torchrun (``distai run lesson6 --cpu 2`` or
``python -m torch.distributed.run --nproc-per-node 2 -m distai.engine.experiments.lesson6``).

Part 1, loss scaling. A small GPT (:mod:`distai.engine.model`; ``--hidden --layers --heads
--vocab --seq`` size it) learns next-token prediction on batches from ``make_batch``, data
parallel over the ranks with :class:`~distai.engine.bucketing.BucketedDataParallel`, computing
in fp16 under ``torch.autocast`` (bf16 with ``--dtype bf16``). Its parameters stay fp32: they are the fp32
master weights the optimizer updates (``--weights explicit`` keeps the model itself in fp16 and
the fp32 copies in :class:`~distai.engine.loss_scaling.MasterWeightOptimizer`). The loss is
scaled by :class:`~distai.engine.loss_scaling.DynamicLossScaler`. At the steps in
``--inject-overflow`` rank 0's gradient (of the final norm's weight, the first one ready) receives
an inf before the all-reduce (what a bad batch
does): the all-reduce spreads it, every rank finds it and skips the same step. With a short
``--growth-interval`` the scale also grows until real fp16 overflows occur.
Every ``--hist-every`` steps rank 0 measures, on the same batch, the gradient in fp32 (for the
exponent histogram), in fp16 without scaling and in fp16 with the current scale, and counts the
gradient values that came out zero in fp16 although they are not zero in fp32.

Part 2, overlap. For each bucket size in ``--bucket-mb`` and each of three ways of doing data
parallelism — ours with overlap, ours with all buckets all-reduced after backward, torch DDP with
the same ``bucket_cap_mb`` — the step time (forward, backward, gradient all-reduce, SGD step) of
a larger fp32 GPT (``--dp-hidden --dp-layers --dp-batch``) is measured on all ranks (the slowest rank counts), in rotating order over
``--rounds`` rounds; the figure is the median over all timed steps. One extra step per configuration records the timeline.

Events (rank 0 unless noted): ``phase`` (``loss-scaling``, ``overlap``), ``progress`` and ``step``,
``scale`` (the scale S that multiplied the step's loss and S' after the update), ``grad_hist``,
``bucket_sweep``, ``timeline`` (every rank) and the ``summary``, declared in
``lessons/lesson6/events.py``; and a ``check`` (issue 28): the best bucket size's ``--check-steps``
recorded overlapped steps, the communication exposed after backward against the overlap model on this
rank's launches at the group's α-β, its causes waiting for a peer (the last rank's launches) and
collectives slower than α-β (each bucket's all-reduce timed alone after the step).
``--slow-rank R --slow-backward-ms X`` (rank R sleeps X ms in every backward of part 2) is its
negative control. With the scaler on, part 1 also trains a twin through ``torch.amp.GradScaler`` and a second
``check``, ``steps_as_gradscaler``, counts the steps after which its scale and weights equal ours on every rank.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import Check, check
from ...lessons.events import CHECK, SPAN
from ...lessons.lesson1.formulas import ring_allreduce_time
from ...lessons.lesson6 import formulas as FM
from ...lessons.lesson6.events import BUCKET_SWEEP, GRAD_HIST, PHASE, SCALE, STEP, TIMELINE
from ...lessons.lesson6.simulation import exponent_histogram, exposed_comm_causes
from ...lessons.model_size import ModelSize, add_model_options
from ..bucketing import StepTimeline, ddp_timed_allreduce_hook
from ..comm_trace import trace_causes
from ..doctor import group_alpha_beta
from ..experiment import (
    Progress,
    UsageError,
    device_sync,
    exit_with,
    launch_world_size,
    run_experiment,
    run_language,
    summary_lines,
)
from ..loss_scaling import DynamicLossScaler, MasterWeightOptimizer
from ..model import GPT, ModelConfigError, lm_loss, make_batch
from ..parallelize import apply_dp
from ..time_causes import collective_alone

#: the GPT the run trains (its size flags default to this)
DEFAULT_MODEL = ModelSize(vocab=256, hidden=64, heads=4, layers=2, seq=16)
MODES = ("overlap", "no-overlap", "ddp")


def build_parser() -> ExperimentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run lesson6")
    g = p.add_argument_group("loss_scaling")
    g.add_argument("--steps", type=int, default=100)
    g.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    g.add_argument("--weights", choices=("autocast", "explicit"), default="autocast")
    g.add_argument("--no-scaling", action="store_true")
    g.add_argument("--init-scale", type=float, default=FM.GRADSCALER_DEFAULTS["init_scale"])
    g.add_argument("--growth-factor", type=float, default=FM.GRADSCALER_DEFAULTS["growth_factor"])
    g.add_argument("--backoff-factor", type=float, default=FM.GRADSCALER_DEFAULTS["backoff_factor"])
    g.add_argument("--growth-interval", type=int, default=5)
    g.add_argument("--inject-overflow", default="20,21,60")
    g.add_argument("--hist-every", type=int, default=10)
    # the loss-scaling GPT (--heads, --vocab and --seq serve the overlap part too)
    add_model_options(p, DEFAULT_MODEL)
    for old, new in (("--width", "hidden"), ("--depth", "layers"), ("--outputs", "vocab")):  # the MLP's names
        p.add_argument(old, dest=new, type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--lr", type=float, default=1e-3)
    g = p.add_argument_group("overlap")
    g.add_argument("--bucket-mb", default="0.25,1,4,25")
    g.add_argument("--dp-hidden", "--dp-width", dest="dp_hidden", type=int, default=256)
    g.add_argument("--dp-layers", "--dp-depth", dest="dp_layers", type=int, default=2)
    g.add_argument("--dp-batch", type=int, default=2)
    g.add_argument("--timed-steps", type=int, default=5)
    g.add_argument("--rounds", type=int, default=3)
    g.add_argument("--check-steps", type=int, default=8)
    g.add_argument("--slow-rank", type=int, default=None)
    g.add_argument("--slow-backward-ms", type=float, default=0.0)
    g.add_argument("--skip-scaling", action="store_true")
    g.add_argument("--skip-overlap", action="store_true")
    p.add_argument("--seed", type=int, default=0)  # both parts
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.inject = sorted({int(s) for s in args.inject_overflow.split(",") if s.strip()})
        args.caps = [float(s) for s in args.bucket_mb.split(",") if s.strip()]
    except ValueError as exc:
        p.error(f"bad list: {exc}")
    for name in ("steps", "hist_every", "batch", "dp_batch", "timed_steps", "rounds", "growth_interval",
                 "check_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.model = ModelSize.from_args(args, DEFAULT_MODEL)
        args.dp_model = ModelSize.from_args(args, DEFAULT_MODEL, hidden=args.dp_hidden, layers=args.dp_layers)
    except ModelConfigError as exc:
        p.error(str(exc))
    if args.slow_backward_ms < 0:
        p.error("--slow-backward-ms must be >= 0")
    if not args.caps or any(c <= 0 for c in args.caps):
        p.error("--bucket-mb needs positive sizes")
    if not args.init_scale > 0 or not args.growth_factor > 1 or not 0 < args.backoff_factor < 1:
        p.error("need --init-scale > 0, --growth-factor > 1, 0 < --backoff-factor < 1")
    return args


# ---- part 1: loss scaling ----------------------------------------------------------------
def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])


def measure_underflow(probe: torch.nn.Module, ids, targets, device, dtype, scale: float) -> dict:
    """Gradients of one batch in fp32, in low precision unscaled, and scaled by ``scale``."""
    def grads(low: bool, s: float) -> torch.Tensor:
        probe.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=low):
            logits = probe(ids)
        loss = lm_loss(logits.float(), targets)
        (loss * s).backward()
        return _flat_grads(probe) / s

    ref = grads(False, 1.0)
    plain = grads(True, 1.0)
    scaled = grads(True, scale)
    nonzero = ref != 0
    n = max(int(nonzero.sum()), 1)
    tiny = FM.smallest_normal("fp16")
    finite = bool(torch.isfinite(scaled).all())
    hist = exponent_histogram(ref.cpu().numpy())
    rel = lambda g: float(((g - ref).abs()[nonzero] / ref.abs()[nonzero]).median())  # noqa: E731
    return {
        "lo": hist.lo, "counts": hist.counts, "zeros": hist.zeros,
        "zero_unscaled": float(((plain == 0) & nonzero).sum()) / n,
        "zero_scaled": float(((scaled == 0) & nonzero).sum()) / n if finite else None,
        "subnormal_unscaled": float(((ref.abs() < tiny) & nonzero).sum()) / n,
        "subnormal_scaled": float(((ref.abs() * scale < tiny) & nonzero).sum()) / n,
        "overflow_scaled": not finite,
        "relerr_unscaled": rel(plain),
        "relerr_scaled": rel(scaled) if finite else None,
    }


def _student(args, device, rank: int, dtype) -> tuple[GPT, torch.nn.Module, list[bool]]:
    """The trained GPT, in bucketed data parallelism, and the switch that puts an inf into rank
    0's gradient of the final norm (the first one backward reaches) before its all-reduce."""
    student = GPT(args.model, seed=args.seed, dtype=dtype if args.weights == "explicit" else torch.float32,
                  device=device)
    target = dict(student.named_parameters())["head.norm.weight"]
    inject_now = [False]

    def poison(p):  # rank 0's gradient gets an inf before the all-reduce
        if inject_now[0] and rank == 0:
            p.grad.view(-1)[0] = float("inf")

    target.register_post_accumulate_grad_hook(poison)  # runs before the bucket hook
    return student, apply_dp(student), inject_now


def _optimizer_step(opt, scaler: DynamicLossScaler) -> tuple[bool, bool]:
    """Step (through the scaler when it is on); whether the gradients overflowed, and whether
    the step was skipped."""
    if scaler.enabled:
        scaler.step(opt)
        rec = scaler.update()
        assert rec is not None  # an enabled scaler reports every update
        return rec.found_inf, rec.skipped
    # no scaler: nothing checks the gradients, an inf goes into the weights
    overflow = not all(bool(torch.isfinite(p.grad).all()) for g in opt.param_groups
                       for p in g["params"] if p.grad is not None)
    opt.step()
    return overflow, False


def run_loss_scaling(ctx, args, progress: Progress) -> dict:
    device, rank, ev = ctx.device, ctx.rank, ctx.events
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    trainee = _Trainee(args, device, rank, dtype)
    student, opt = trainee.student, trainee.opt
    probe = GPT(args.model, seed=args.seed, device=device)  # an fp32 copy, for the measurements
    scaler = DynamicLossScaler(args.init_scale, args.growth_factor, args.backoff_factor,
                               args.growth_interval, enabled=not args.no_scaling)
    twin = _GradScalerTwin(args, device, rank, dtype) if scaler.enabled else None
    if rank == 0:
        PHASE.emit(ev, {"name": "loss-scaling", "steps": args.steps})
    stats = {"overflows": 0, "injected": 0, "skipped": 0}
    hist: list[dict] = []
    losses = []
    for step in range(args.steps):
        started = time.time()
        ids, targets = make_batch(args.model, args.batch, seed=args.seed + 1000 + rank, step=step, device=device)
        if step % args.hist_every == 0 and rank == 0:
            probe.load_state_dict({k: v.float() for k, v in student.state_dict().items()})
            m = measure_underflow(probe, ids, targets, device, dtype, scaler.get_scale())
            GRAD_HIST.emit_fields(ev, {"step": step, "scale": scaler.get_scale(), "dtype": args.dtype, **m})
            hist.append(m)
        scale, injected = scaler.get_scale(), step in args.inject
        loss = trainee.backward(ids, targets, scaler, injected)
        overflow, skipped = _optimizer_step(opt, scaler)
        if twin is not None:
            twin.step(ids, targets, injected, scaler.get_scale(), student)
        loss_avg = loss.detach().float().reshape(1).clone()
        dist.all_reduce(loss_avg)
        losses.append(float(loss_avg) / ctx.world_size)
        stats["overflows"] += int(overflow)
        stats["injected"] += int(injected)
        stats["skipped"] += int(skipped)
        if rank == 0:
            SCALE.emit(ev, {"step": step, "scale": scale, "new_scale": scaler.get_scale(), "overflow": overflow,
                            "skipped": skipped, "injected": injected, "growth_tracker": scaler.growth_tracker,
                            "loss": losses[-1]})
            STEP.emit(ev, {"step": step, "of": args.steps, "loss": losses[-1], "t0": started, "skipped": skipped,
                           "injected": injected})
        else:  # every rank trains: its steps on the trace too
            SPAN.emit(ev, {"name": f"step {step}", "stream": "compute", "t0": started, "t1": time.time(), "step": step,
                           "skipped": skipped})
        progress.advance("loss-scaling")
    if twin is not None:
        twin.check(ctx)
    return _loss_scaling_summary(args, stats, scaler, losses, hist)


class _Trainee:
    """A student of part 1 (:func:`_student`), its optimizer (the fp32 masters of an fp16 model with
    ``--weights explicit``) and its step's forward and backward: the run's own and its GradScaler twin's are
    built and stepped by this one code, so that what differs between them is the scaler alone."""

    def __init__(self, args, device, rank: int, dtype) -> None:
        self.explicit = args.weights == "explicit"
        self.device, self.dtype = device, dtype
        self.student, self.model, self.inject_now = _student(args, device, rank, dtype)
        self.opt: MasterWeightOptimizer | torch.optim.Adam
        if self.explicit:
            self.opt = MasterWeightOptimizer(self.student.parameters(), lambda ps: torch.optim.Adam(ps, lr=args.lr))
        else:
            self.opt = torch.optim.Adam(self.student.parameters(), lr=args.lr)

    def backward(self, ids, targets, scaler, inject: bool) -> torch.Tensor:
        """One step's forward and backward, the loss scaled by ``scaler`` (ours or torch's GradScaler) and, with
        ``inject``, rank 0's inf put in; the gradients left where the optimizer reads them. Returns the loss."""
        self.opt.zero_grad(set_to_none=True)
        self.inject_now[0] = inject
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=not self.explicit):
            logits = self.model(ids)
        loss = lm_loss(logits.float(), targets)
        scaler.scale(loss).backward()
        self.inject_now[0] = False
        if isinstance(self.opt, MasterWeightOptimizer):
            self.opt.grads_to_master()
        return loss


class _GradScalerTwin:
    """torch.amp.GradScaler beside our scaler: a second :class:`_Trainee` from the same seed, on the same batches
    and injected infs, stepped through GradScaler. After every step the two scales and the two models' weights
    are compared (bit for bit); :meth:`check` reports, as a ``check`` on rank 0, on how many of the run's steps
    every rank agreed (tests/test_lesson6_scaler.py checks the same on one process)."""

    def __init__(self, args, device, rank: int, dtype) -> None:
        self.trainee = _Trainee(args, device, rank, dtype)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=args.init_scale, growth_factor=args.growth_factor,
                                           backoff_factor=args.backoff_factor, growth_interval=args.growth_interval)
        self.same: list[bool] = []

    def step(self, ids, targets, inject: bool, our_scale: float, ours: GPT) -> None:
        self.trainee.backward(ids, targets, self.scaler, inject)
        self.scaler.step(self.trainee.opt)  # type: ignore[arg-type]  # it reads param_groups and calls step(): duck-typed
        self.scaler.update()
        self.same.append(self.scaler.get_scale() == our_scale
                         and all(torch.equal(a, b) for a, b in zip(ours.parameters(), self.trainee.student.parameters())))

    def check(self, ctx) -> None:
        agreed = torch.tensor([float(x) for x in self.same], device=self.trainee.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # a step counts where every rank agreed
        if ctx.rank == 0:
            CHECK.emit_fields(ctx.events, check("steps_as_gradscaler", float(len(self.same)), float(agreed.sum()),
                                                "count", tolerance=0.0).event())


def _loss_scaling_summary(args, stats: dict, scaler: DynamicLossScaler, losses: list[float], hist: list[dict]) -> dict:
    def mean(key: str) -> float | None:
        return statistics.fmean(h[key] for h in hist) if hist else None

    def of_finite(key: str, average) -> float | None:  # a scaled measurement that overflowed is None
        values = [h[key] for h in hist if h[key] is not None]
        return average(values) if values else None

    return {
        **stats,
        "dtype": args.dtype,
        "weights": args.weights,
        "scaler": scaler.enabled,
        "natural_overflows": max(0, stats["overflows"] - stats["injected"]),
        "final_scale": scaler.get_scale(),
        "first_loss": losses[0], "final_loss": losses[-1],
        "zero_unscaled": mean("zero_unscaled"),
        "zero_scaled": of_finite("zero_scaled", statistics.fmean),
        "subnormal_unscaled": mean("subnormal_unscaled"),
        "relerr_unscaled": statistics.median(h["relerr_unscaled"] for h in hist) if hist else None,
        "relerr_scaled": of_finite("relerr_scaled", statistics.median),
    }


# ---- part 2: overlap ---------------------------------------------------------------------
def build(mode: str, cap: float, args, device, rank: int = 0) -> torch.nn.Module:
    net = GPT(args.dp_model, seed=args.seed, device=device)
    if rank == args.slow_rank and args.slow_backward_ms > 0:
        # the straggler: its backward stops at the first gradient (the final norm's), before any
        # bucket of it is launched; its peers' buckets wait for it
        delay = args.slow_backward_ms / 1e3
        dict(net.named_parameters())["head.norm.weight"].register_post_accumulate_grad_hook(
            lambda _p: time.sleep(delay))
    if mode == "ddp":
        return apply_dp(net, impl="ddp", bucket_cap_mb=cap)
    return apply_dp(net, bucket_cap_mb=cap, overlap=(mode == "overlap"))


def train_step(model, opt, ids, targets, timeline: StepTimeline | None = None) -> None:
    opt.zero_grad(set_to_none=True)
    if timeline is not None:
        timeline.begin()
    loss = model(ids, targets)
    if timeline is not None:
        timeline.mark("backward")
    loss.backward()
    if timeline is not None:
        timeline.mark("backward_done")
    opt.step()
    if timeline is not None:
        timeline.mark("step_done")


def time_steps(model, opt, x, y, n: int, device) -> list[float]:
    """Milliseconds of each of ``n`` steps, on the slowest rank (ranks start each step together)."""
    times = []
    for _ in range(n):
        device_sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        device_sync(device)
        times.append((time.perf_counter() - t0) * 1000.0)
    elapsed = torch.tensor(times)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.tolist()


def record_timeline(mode, model, opt, x, y, thread_waits: bool = False) -> StepTimeline:
    tl = StepTimeline(thread_waits=thread_waits)
    if mode == "ddp":
        tl.attach(model.module)
        model.register_comm_hook(tl, ddp_timed_allreduce_hook)
    else:
        model.timeline = tl
    dist.barrier()  # the ranks start the recorded step together
    train_step(model, opt, x, y, timeline=tl)
    tl.detach()
    return tl


def _exposed_sample(tl: StepTimeline, device) -> dict[str, Any]:
    """One recorded overlapped step on this rank, then each of its buckets' all-reduces timed
    alone (:func:`~distai.engine.time_causes.collective_alone`: the same bytes, outside the step,
    less its threads' waits for a core), and each bucket's longest wait for a core of gloo's threads
    in the step (``StepTimeline.waited``)."""
    order = sorted(tl.launch)
    alone = []
    for i in order:
        buf = torch.zeros(max(1, tl.nbytes[i] // 4), dtype=torch.float32, device=device)

        def reduce(buf=buf) -> None:
            dist.all_reduce(buf)
            device_sync(device)

        # without its threads' waits for a core: the step's are counted on their own (bucket_done)
        alone.append(collective_alone(reduce, device=device, run_queue_apart=True))
    return {"wall0": tl.wall0, "launch": [tl.launch[i] for i in order], "alone": alone,
            "waited": [tl.waited.get(i, 0.0) for i in order], "done": [tl.done[i] for i in order],
            "seen_wait": tl.seen_wait,
            "bytes": [tl.nbytes[i] for i in order], "backward_end": max(tl.ready.values()),
            "comm_done": tl.marks["comm_done"], "step_done": tl.marks["step_done"]}


def exposed_check(model, opt, x, y, ab: tuple[float, float], world: int, cap: float, device,
                  steps: int) -> tuple[Check, tuple[list, list, list]]:
    """Communication exposed after backward in ``steps`` recorded overlapped steps against the
    overlap model (:func:`~distai.lessons.lesson6.simulation.exposed_comm_causes`), on average: every
    rank's bucket launches gathered (one host's wall clock), after each step its buckets' all-reduces
    timed alone, and each bucket's longest wait for a core of gloo's threads in the step, the most of
    any rank's (the all-reduce ends when every rank's part has run), and each bucket's end in the step
    (what it took there beyond alone is ``slower_in_step``) and the step's own wait for a core
    before it saw the last one end; the rank with the most exposed
    time reported. Also this rank's steps for the trace
    (``comm_trace.trace_causes``' blocks, collectives, waits: each step's exposed communication as
    one collective, its peer wait first)."""
    alpha, beta = ab
    samples = [_exposed_sample(record_timeline("overlap", model, opt, x, y, thread_waits=True), device)
               for _ in range(steps)]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, samples)
    totals = [dict.fromkeys(("measured", "predicted", "peer_wait", "slow_collective", "cpu_contention",
                             "slower_in_step", "alone", "wait_drawn"), 0.0)
              for _ in range(world)]
    own_waits: list[float] = []
    for k in range(steps):
        for r in range(world):
            own, peers = everyone[r][k], [everyone[o][k] for o in range(world)]
            last = [max(o["wall0"] + o["launch"][b] for o in peers) - own["wall0"] for b in range(len(own["launch"]))]
            waited = [max(o["waited"][b] for o in peers) for b in range(len(own["launch"]))]
            parts = exposed_comm_causes(own["launch"], last, own["alone"],
                                        [ring_allreduce_time(n, world, alpha, beta) for n in own["bytes"]],
                                        own["backward_end"], waited, own["done"],
                                        (own["comm_done"], own["seen_wait"]))
            parts.update(measured=own["comm_done"] - own["backward_end"], alone=sum(own["alone"]))
            # the trace draws a step's wait inside its exposed time, never below 0: cut to that
            parts["wait_drawn"] = max(0.0, min(parts["peer_wait"], parts["measured"]))
            for key, v in parts.items():
                totals[r][key] += v / steps
            if r == dist.get_rank():
                own_waits.append(parts["peer_wait"])
    rank = max(range(world), key=lambda i: totals[i]["measured"])
    t = totals[rank]
    traced = ([(o["wall0"], o["wall0"] + o["step_done"]) for o in samples],
              [(o["wall0"] + o["backward_end"], o["wall0"] + o["comm_done"]) for o in samples], own_waits)
    return check("exposed_comm", t["predicted"], t["measured"], "s",
                 causes={"peer_wait": t["peer_wait"], "slow_collective": t["slow_collective"],
                         "cpu_contention": t["cpu_contention"], "slower_in_step": t["slower_in_step"]},
                 detail={"rank": rank, "bucket_mb": cap, "buckets": len(samples[0]["launch"]), "steps": steps,
                         "alpha_s": alpha, "beta_s_per_byte": beta, "alone_s": t["alone"],
                         "peer_wait_drawn_s": t["wait_drawn"]}), traced


def measure_alpha_beta(args, device) -> tuple[float, float]:
    """α and β of the group at the sizes of the overlap part's buckets (``doctor.group_alpha_beta``)."""
    grad = args.dp_model.num_params() * 4
    sizes = sorted({64 << 10, min(grad, 1 << 20), min(grad, 4 << 20)})
    return group_alpha_beta(sizes, repeats=3, device_type=device.type)


def run_overlap(ctx, args, progress: Progress) -> dict:
    device, rank, ev = ctx.device, ctx.rank, ctx.events
    if rank == 0:
        PHASE.emit(ev, {"name": "overlap", "bucket_mb": args.caps})
    x, y = make_batch(args.dp_model, args.dp_batch, seed=args.seed + 2000 + rank, device=device)
    times: dict[tuple[float, str], list[float]] = {}
    nbuckets: dict[tuple[float, str], int] = {}
    checks: dict[float, Check] = {}
    traced: dict[float, tuple[list, list, list]] = {}
    alpha, beta = measure_alpha_beta(args, device)
    for r in range(args.rounds):
        for ci, cap in enumerate(args.caps):
            shift = (r + ci) % len(MODES)
            for mode in MODES[shift:] + MODES[:shift]:
                model = build(mode, cap, args, device, rank)
                opt = torch.optim.SGD(model.parameters(), lr=1e-3)
                for _ in range(2):  # warm-up; both ours and DDP rebuild buckets after the first
                    train_step(model, opt, x, y)
                times.setdefault((cap, mode), []).extend(
                    time_steps(model, opt, x, y, args.timed_steps, device))
                if r == args.rounds - 1:
                    tl = record_timeline(mode, model, opt, x, y)
                    nbuckets[(cap, mode)] = len(tl.launch)
                    TIMELINE.emit_fields(ev, tl.to_event(bucket_mb=cap, mode=mode,
                                                         step_ms=round(tl.marks["step_done"] * 1000, 3)))
                    if mode == "overlap":
                        checks[cap], traced[cap] = exposed_check(model, opt, x, y, (alpha, beta), ctx.world_size,
                                                                 cap, device, args.check_steps)
                del model, opt
                progress.advance("overlap")
    median = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        for (cap, mode), v in times.items():
            BUCKET_SWEEP.emit(ev, {"bucket_mb": cap, "mode": mode, "step_ms": round(median[(cap, mode)], 3),
                                   "n_buckets": nbuckets.get((cap, mode)), "samples_ms": [round(t, 3) for t in v]})
    best = min(args.caps, key=lambda c: median[(c, "overlap")])
    blocks, spans, waits = traced[best]
    trace_causes(ev, blocks, spans, waits, names="bucket all-reduces", check="exposed_comm")
    if rank == 0:
        CHECK.emit_fields(ev, checks[best].event())
    n_params = args.dp_model.num_params()
    return {
        "best_bucket_mb": best,
        "step_ms": {f"{c:g}": {m: round(median[(c, m)], 3) for m in MODES} for c in args.caps},
        "overlap_speedup": median[(best, "no-overlap")] / median[(best, "overlap")],
        "ours_over_ddp": median[(best, "overlap")] / median[(best, "ddp")],
        "n_buckets_best": nbuckets.get((best, "overlap")),
        "grad_mib": n_params * 4 / 2 ** 20,
        "exposed_check": checks[best].event(),
    }


def main(argv=None) -> int:
    return run_experiment("lesson6", parse_args, run, argv, check=check_slow_rank)


def check_slow_rank(args: argparse.Namespace) -> None:
    world = launch_world_size()
    if args.slow_rank is not None and not 0 <= args.slow_rank < world:
        raise UsageError.keyed("slow_rank", last=world - 1, rank=args.slow_rank)


def run(ctx, args: argparse.Namespace) -> dict | None:
    summary: dict = {"world_size": ctx.world_size, "device": str(ctx.device), "backend": ctx.backend}
    total = (0 if args.skip_scaling else args.steps) + \
        (0 if args.skip_overlap else args.rounds * len(args.caps) * len(MODES))
    progress = Progress(ctx, total)
    if not args.skip_scaling:
        summary["scaling"] = run_loss_scaling(ctx, args, progress)
    if not args.skip_overlap:
        summary["overlap"] = run_overlap(ctx, args, progress)
    if ctx.rank != 0:
        return None
    print(summary_from_event(summary), flush=True)
    return summary


def _pct(x, lang: str) -> str:
    """Two significant digits: the underflow shares are often a few thousandths of a percent."""
    from ...lessons.units import format_percent

    return "n/a" if x is None else format_percent(x, 2, lang)


def summary_from_event(s: dict, lang: str | None = None) -> str:
    """At most 6 lines of at most 71 columns: the launcher shows the last 6 lines of the output,
    each after a 9-column rank label, in 80 columns. In the learner's language (``lang``, else the run's)."""
    from ...lessons.units import format_fixed, format_number, format_plain

    lang = lang or run_language()
    say = summary_lines("lesson6", lang)
    lines = []
    sc = s.get("scaling")
    if sc and not sc.get("scaler", True):
        lines.append(say("no_scaler", dtype=sc["dtype"], n=sc["overflows"],
                         loss=format_number(sc["final_loss"], 4, lang)))
    elif sc:
        lines.append(say("scaler", dtype=sc["dtype"], n=sc["skipped"], injected=sc["injected"],
                         exp=f"{math.log2(sc['final_scale']):.0f}", before=_pct(sc["zero_unscaled"], lang),
                         after=_pct(sc["zero_scaled"], lang)))
    ov = s.get("overlap")
    if ov:
        caps = list(ov["step_ms"])
        best = f"{ov['best_bucket_mb']:g}"
        # each column: a value 7 wide and the best's "*" after it; the header over the value, not the mark
        lines.append((f"{say('head'):<20}" + "".join(f"{format_plain(float(c), lang):>7} " for c in caps)).rstrip())
        for mode in ("overlap", "no-overlap", "ddp"):
            row = "".join(f"{format_fixed(ov['step_ms'][c][mode], 1, lang):>7}"
                          + ("*" if c == best and mode == "overlap" else " ") for c in caps)
            lines.append(f"{say('modes.' + mode):<20}{row}".rstrip())
        lines.append(say("best", best=format_plain(ov["best_bucket_mb"], lang),
                         speedup=format_fixed(ov["overlap_speedup"], 2, lang),
                         ddp=format_fixed(ov["ours_over_ddp"], 2, lang)))
    return "\n".join(lines)


if __name__ == "__main__":
    exit_with(main)
