"""Lesson 1's experiment: data parallelism with our own ring all-reduce, and a bandwidth sweep.

Run by the launcher (``distai run lesson1 --cpu 4``) or directly::

    python -m torch.distributed.run --standalone --nproc-per-node 4 -m distai.engine.experiments.lesson1

Phases (each emits a ``phase`` event, and ranks meet at a monitored barrier between them):

1. ``check``: our ring all-reduce of an odd-sized random tensor against ``dist.all_reduce``.
2. ``train``: ``--steps`` steps of data-parallel SGD on a small GPT (:mod:`distai.engine.model`;
   ``--hidden --layers --heads --vocab --seq`` size it), gradients averaged by the ring. The first step's all-reduce is traced (``ring_step`` events) so the tutor can animate it.
3. ``sweep``: nccl-tests style, message sizes from ``--sweep-min`` to ``--sweep-max`` (×2 each),
   our ring and ``dist.all_reduce`` timed in alternation; time, algbw and busbw of each.
4. ``fit``: the alpha-beta model fitted to the measured times, and its predictions.
5. ``predict``: the lesson's prediction checked (issue 28): α and β of one link measured as
   ``distai doctor`` measures them (:func:`distai.engine.doctor.link_alpha_beta`, on this run's
   group, now), the ring formula's time for the sweep's smallest and largest message against the
   textbook ring's measured time; a miss is split into measured causes (:func:`allreduce_checks`).

Events (beyond the common ``phase``/``progress``/``summary``/``log``): ``step``, ``ring_step``
(every rank, a traced call's), ``sweep`` (the median over iterations of the slowest rank), ``fit``
and ``ring_check``, declared in ``lessons/lesson1/events.py``; the shared ``check``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import Check, check
from ...lessons.events import CHECK, LOG, SPAN
from ...lessons.lesson1 import formulas
from ...lessons.lesson1.events import FIT, PHASE, RING_CHECK, STEP, SWEEP, Phase
from ...lessons.model_size import ModelSize, add_model_options
from ...lessons.units import (
    UnitError,
    format_bandwidth,
    format_bytes,
    format_fixed,
    format_number,
    format_time,
    parse_bytes,
)
from ..experiment import (
    Progress,
    UsageError,
    checkpoint,
    exit_with,
    launch_world_size,
    run_experiment,
    run_language,
    summary_lines,
)

#: the GPT whose gradients the ring all-reduces (its size flags default to this)
DEFAULT_MODEL = ModelSize(vocab=64, hidden=64, heads=4, layers=2, seq=16)


def build_parser() -> ExperimentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run lesson1")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-per-rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.1)
    add_model_options(p, DEFAULT_MODEL)
    p.add_argument("--sweep-min", default="1KiB")
    p.add_argument("--sweep-max", default="64MiB")
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--trace", choices=("none", "first", "all"), default="first")
    p.add_argument("--pieces", type=int, default=None)
    p.add_argument("--channels", type=int, choices=(1, 2), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--barrier-timeout", type=float, default=None)
    # Fault injection, for the launcher's tests and for lesson 3's demonstrations.
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-step", type=int, default=0)
    p.add_argument("--hang-rank", type=int, default=None)
    from .. import ring

    def size(n: int):
        return lambda lang: format_bytes(n, binary=True, lang=lang)

    p.help_fields = {"iters": {"most": default_iters(0), "least": default_iters(1 << 62)},
                     "pieces": {"whole": size(ring.MIN_PIPELINED_CHUNK), "piece": size(ring.DEFAULT_PIECE_BYTES)}}
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.sweep_min_bytes = int(parse_bytes(args.sweep_min, run_language()))  # "1,5MB" is Spanish 1.5 MB
        args.sweep_max_bytes = int(parse_bytes(args.sweep_max, run_language()))
    except UnitError as exc:
        p.error(exc.text(run_language()))
    except ValueError as exc:
        p.error(str(exc))
    if not 4 <= args.sweep_min_bytes <= args.sweep_max_bytes:
        raise UsageError.keyed("sweep_range")
    if args.sweep_max_bytes > 4 << 30:
        raise UsageError.keyed("sweep_cap")
    if args.steps < 0 or args.batch_per_rank < 1:
        raise UsageError.keyed("steps_batch_per_rank")
    try:
        args.model = ModelSize.from_args(args, DEFAULT_MODEL)
    except ValueError as exc:  # ModelConfigError: a shape the GPT cannot take
        p.error(str(exc))
    if args.iters is not None and args.iters < 1:
        p.error("--iters must be >= 1")
    return args


def sweep_sizes(lo: int, hi: int) -> list[int]:
    """Powers of two from ``lo`` to ``hi`` bytes (``hi`` included), rounded to float32 elements."""
    sizes, size = [], lo
    while size < hi:
        sizes.append(size)
        size *= 2
    sizes.append(hi)
    return sorted({max(4, s // 4 * 4) for s in sizes})


def default_iters(size: int) -> int:
    if size <= 256 << 10:
        return 20
    if size <= 4 << 20:
        return 8
    if size <= 16 << 20:
        return 5
    return 3


def phase(ctx, fields: Phase) -> None:
    if ctx.rank == 0:
        PHASE.emit(ctx.events, fields)


def check_ring(ctx, seed: int) -> float:
    import torch
    import torch.distributed as dist

    from ..ring import ring_allreduce

    size = 10007  # odd, not divisible by any N > 1 used here
    g = torch.Generator().manual_seed(seed + ctx.rank)
    x = torch.randn(size, generator=g, dtype=torch.float32).to(ctx.device)
    ref = x.clone()
    dist.all_reduce(ref)
    ring_allreduce(x)
    diff = torch.tensor([(x - ref).abs().max().item()], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    scale = ref.abs().max().item()
    if not diff.item() <= 1e-5 * max(1.0, scale):
        raise RuntimeError(f"ring all-reduce differs from dist.all_reduce by {diff.item():.3g}")
    if ctx.rank == 0:
        RING_CHECK.emit(ctx.events, {"size": size * 4, "max_abs_diff": diff.item()})
    return diff.item()


def train(ctx, args, progress: Progress) -> list[float]:
    import torch

    from ..data_parallel import train_data_parallel
    from ..model import GPT, make_batch

    n = ctx.world_size
    batch = args.batch_per_rank * n
    x, y = make_batch(args.model, batch * 8, seed=args.seed + 1, device=ctx.device)  # 8 global batches
    model = GPT(args.model, seed=args.seed, device=ctx.device)
    nparams = sum(p.numel() for p in model.parameters())
    phase(ctx, {"name": "train", "steps": args.steps, "params": nparams, "global_batch": batch, "n": n})

    def ring_kwargs(step: int) -> dict:
        if step == args.fail_step and ctx.rank == args.fail_rank:
            raise RuntimeError(f"injected failure on rank {ctx.rank} at step {step} (--fail-rank)")
        traced = args.trace == "all" or (args.trace == "first" and step == 0)
        return {"trace": ctx.events, "call": step} if traced else {"pieces": args.pieces, "channels": args.channels}

    step_started = [time.time()]  # each step runs from the end of the one before: its span in the trace

    def on_step(s) -> None:
        if ctx.rank == 0:
            STEP.emit(ctx.events, {"step": s.step, "of": args.steps, "loss": s.loss, "compute_s": s.compute_s,
                                   "comm_s": s.comm_s, "grad_bytes": s.grad_bytes, "t0": step_started[0]})
        else:  # the other ranks' steps on the trace too (rank 0's step event carries the run's numbers)
            SPAN.emit(ctx.events, {"name": f"step {s.step}", "stream": "compute", "t0": step_started[0],
                                   "t1": time.time(), "step": s.step})
        progress.advance("train")
        step_started[0] = time.time()

    torch.manual_seed(args.seed)
    return train_data_parallel(model, x, y, steps=args.steps, batch_size=batch, lr=args.lr,
                               rank=ctx.rank, world_size=n, on_step=on_step,
                               ring_kwargs_for_step=ring_kwargs)


def sweep(ctx, args, progress: Progress) -> list[dict]:
    import torch
    import torch.distributed as dist

    from ..ring import ring_allreduce
    from ..runtime import timed_collective

    n = ctx.world_size
    sizes = sweep_sizes(args.sweep_min_bytes, args.sweep_max_bytes)
    phase(ctx, {"name": "sweep", "sizes": sizes, "n": n})
    rows: list[dict] = []
    for k, size in enumerate(sizes):
        started = time.time()
        x = torch.zeros(size // 4, dtype=torch.float32, device=ctx.device)
        call = 1000 + k
        trace = ctx.events if args.trace in ("first", "all") else None
        ring_allreduce(x, pieces=args.pieces, channels=None if trace else args.channels,
                       trace=trace, call=call)  # warm-up (traced: one channel, the textbook ring)
        dist.all_reduce(x)
        iters = args.iters or default_iters(size)
        times = torch.zeros(2, iters, dtype=torch.float64)  # filled on the host, reduced on the device
        for i in range(iters):
            ring = lambda x=x: ring_allreduce(x, pieces=args.pieces, channels=args.channels,  # noqa: E731
                                          trace=ctx.events if args.trace == "all" else None, call=call)
            ar = lambda x=x: dist.all_reduce(x)  # noqa: E731
            order = ((0, ring), (1, ar)) if i % 2 == 0 else ((1, ar), (0, ring))
            for which, fn in order:
                times[which, i] = timed_collective(fn, ctx.is_cuda)
        times = times.to(ctx.device)  # NCCL reduces device tensors only
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a collective takes as long as its slowest rank
        t_ring = statistics.median(times[0].tolist())
        t_ar = statistics.median(times[1].tolist())
        row = {
            "size": size, "n": n, "iters": iters,
            "ring_time_s": t_ring, "ring_algbw": formulas.algbw(size, t_ring),
            "ring_busbw": formulas.busbw(size, t_ring, n),
            "ar_time_s": t_ar, "ar_algbw": formulas.algbw(size, t_ar),
            "ar_busbw": formulas.busbw(size, t_ar, n),
        }
        rows.append(row)
        if ctx.rank == 0:
            SWEEP.emit_fields(ctx.events, row)
        # each size's measurement on the trace, every rank's (ring and dist.all_reduce, iters times each)
        SPAN.emit(ctx.events, {"name": f"sweep {format_bytes(size, binary=True)}", "stream": "comm",
                               "t0": started, "t1": time.time(), "bytes": size})
        progress.advance("sweep")
        del x
    return rows


def fit(ctx, rows: list[dict]) -> dict[str, dict]:
    """alpha-beta fits of both implementations (from the lesson's formulas)."""
    n = ctx.world_size
    out: dict[str, dict] = {}
    if len(rows) < 2 or n < 2:  # one rank sends nothing: the alpha-beta model has no terms to fit
        return out
    sizes = [r["size"] for r in rows]
    for impl, key in (("ring", "ring_time_s"), ("all_reduce", "ar_time_s")):
        a, b = formulas.alpha_beta_fit(sizes, [r[key] for r in rows])
        alpha, beta = a / (2 * (n - 1)), b / formulas.busbw_factor(n)
        predicted = [[s, a + b * s] for s in sizes]
        out[impl] = {"alpha_s": alpha, "beta_s_per_byte": beta, "a_s": a, "b_s_per_byte": b,
                     "bandwidth": (1 / beta) if beta > 0 else None}
        if ctx.rank == 0:
            FIT.emit_fields(ctx.events, {"impl": impl, "n": n, "predicted": predicted, **out[impl]})
    return out


def allreduce_checks(ctx, sizes: list[int], iters: int | None = None, progress: Progress | None = None) -> list[Check]:
    """The ring formula 2(N−1)α + 2(N−1)/N·S·β, with one link's α and β measured by the doctor's
    ping-pong on this group, against the textbook ring (one channel, no pipelining) measured on
    it, for each of ``sizes``. A miss is split into causes: the measured ring's own time, the slowest
    rank's, is on a core (its CPU seconds), waiting for one (the longest wait any rank had: its peers
    wait for it) or asleep on its messages; two parts are timed on their own, interleaved with the
    all-reduce (:func:`distai.engine.doctor.rank_timings`: each timing a few calls back to back, the
    slowest rank's), for the ring's chunk c = S/N: the same messages on one link, and the additions.
    Each is the least of its ``iters`` timings less the wait for a core in it, so that a part does
    not carry the load of the second it was timed in; the ring is measured in its timing chosen the
    same way:

    * ``size_regime``: (2(N−1) messages of c bytes on one link, one after the other, timed alone) −
      the formula's 2(N−1)α + 2(N−1)/N·S·β: a message of c bytes does not cost what the line through a
      tiny and a 4 MiB one says (and c is S/N rounded up to whole elements);
    * ``links_at_once``: the ring's time asleep on its messages − those messages on one link alone:
      every rank sending and receiving at once on shared cores and memory, and every step waiting
      for the slower neighbour, where α and β were measured with one pair alone;
    * ``reduction``: (N−1) additions of c bytes, timed alone: the arithmetic the model counts as free;
    * ``ring_schedule``: the ring's CPU seconds beyond those additions: our ring's Python bookkeeping
      of its 2(N−1) steps and posting its messages;
    * ``cpu_contention``: the ring's wait for a core in its measured timing (the kernel's
      run-queue delay: with more runnable threads than cores — other programs, or more ranks
      than cores, each with its gloo thread — a rank that is ready waits for one; its peers
      wait for it).

    Together they add up to the measured ring (a second is on a core, waiting for one, or asleep);
    what each is worth is the lesson. ``detail``: α, β, the size, and, over these timings, the process's
    CPU time per wall second
    (``cpu_per_wall``, below 1: it waited — for its peers, the network, or a core) and its threads'
    wait for a core per wall second (``run_queue_share``, the slowest rank's)."""
    import torch

    from ..comm_trace import trace_call
    from ..doctor import CoreWait, link_alpha_beta, ping_pong, rank_timings
    from ..ring import ring_allreduce

    n = ctx.world_size
    link = link_alpha_beta(ctx.device, contention_apart=True)  # timed as the parts are: least disturbed, waits apart
    alpha, beta, peer = link["alpha_s"], link["beta_s_per_byte"], int(link["peer"])  # peer: the hop a ring waits on
    out = []
    for k, size in enumerate(sizes):
        repeats, inner = max(11, iters or 11), max(1, default_iters(size) // 2)
        x = torch.zeros(size // 4, dtype=torch.float32, device=ctx.device)
        chunk = -(-x.numel() // n)  # the largest chunk: the ring's steps wait for it
        send, recv = (torch.ones(chunk, dtype=torch.float32, device=ctx.device) for _ in range(2))
        ring = lambda x=x: ring_allreduce(x, pieces=1, channels=1)  # noqa: E731
        ring()  # warm-up
        with CoreWait(ctx.device) as waited:
            t = rank_timings({"ring": ring, "pair": lambda: ping_pong(send, n - 1, 0, peer),
                              "adds": lambda: [recv.add_(send) for _ in range(n - 1)]},
                             repeats, ctx.device, inner=inner)
        trace_call(ctx.events, lambda sink, x=x: ring_allreduce(x, pieces=1, channels=1, trace=sink),
                   check="allreduce_small" if k == 0 else "allreduce_large")  # the run's trace: one call
        # each without its wait for a core: a collective's the waiting rank's, a local one's its own
        part = {name: w[3 if name == "adds" else 2].min().item() for name, w in t.items()}
        best = int(t["ring"][2].argmin())  # the least disturbed ring, chosen as the parts are
        # the measured ring itself, its slowest rank's: on a core, waiting for one (the longest any rank
        # waited: its peers wait for it), or asleep on its messages
        wall, on_cpu, waited_core = (t["ring"][row, best].item() for row in (0, 4, 1))
        asleep = wall - on_cpu - waited_core
        predicted = formulas.ring_allreduce_time(size, n, alpha, beta)
        causes = {"size_regime": part["pair"] - predicted,
                  "links_at_once": asleep - part["pair"], "reduction": part["adds"],
                  "ring_schedule": on_cpu - part["adds"], "cpu_contention": waited_core}
        out.append(check("allreduce_small" if k == 0 else "allreduce_large",
                         predicted, t["ring"][0, best].item(), "s",
                         causes=causes, decomposition=True,
                         detail={"size": size, "n": n, "alpha_s": alpha, "beta_s_per_byte": beta, "link_peer": peer,
                                 "ring_cpu_s": on_cpu, "ring_asleep_s": asleep, "pair_s": part["pair"],
                                 "cpu_per_wall": waited.cpu_per_wall, "run_queue_share": waited.run_queue_share}))
        if progress is not None:
            progress.advance("predict")
    return out


def main(argv: list[str] | None = None) -> int:
    return run_experiment("lesson1", parse_args, run, argv, check=_check_ranks)


def _check_ranks(args) -> None:
    """A ring needs a neighbour: on one rank every bus bandwidth is 0 (busbw = algbw·2(n−1)/n) and the
    sweep's ratios divide by it."""
    if launch_world_size() < 2:
        raise UsageError.keyed("ring_ranks", n=launch_world_size())


def run(ctx, args: argparse.Namespace) -> dict | None:
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    started = time.time()
    n = ctx.world_size
    sizes = [] if args.no_sweep else sweep_sizes(args.sweep_min_bytes, args.sweep_max_bytes)
    checked = sorted({sizes[0], sizes[-1]}) if n > 1 and sizes else []  # the prediction's sizes: a unit each
    progress = Progress(ctx, 1 + args.steps + len(sizes) + len(checked))
    phase(ctx, {"name": "start", "n": n, "backend": ctx.backend, "device": str(ctx.device), "steps": args.steps,
                "sweep_sizes": sizes})
    checkpoint("start", args.barrier_timeout)

    phase(ctx, {"name": "check"})
    diff = check_ring(ctx, args.seed)
    progress.advance("check")

    losses = train(ctx, args, progress)
    if ctx.rank == args.hang_rank:
        if ctx.rank == 0:
            LOG.emit(ctx.events, {"msg": "rank 0 is hanging on purpose (--hang-rank)"})
        time.sleep(10 ** 6)
    checkpoint("after-train", args.barrier_timeout)

    rows = [] if args.no_sweep else sweep(ctx, args, progress)
    fits = fit(ctx, rows)
    checks = []
    if checked:
        phase(ctx, {"name": "predict", "sizes": [sizes[0], sizes[-1]]})
        checks = allreduce_checks(ctx, checked, args.iters, progress)
        for c in checks if ctx.rank == 0 else []:
            CHECK.emit_fields(ctx.events, c.event())
    checkpoint("end", args.barrier_timeout)

    if ctx.rank == 0:
        big = [r for r in rows if r["size"] >= 16 << 20]
        ratio = statistics.median([r["ring_busbw"] / r["ar_busbw"] for r in big]) if big else None
        peak = lambda key: max((r[key] for r in rows), default=None)  # noqa: E731
        summary = {
            "n": n, "nodes": n // int(os.environ.get("LOCAL_WORLD_SIZE", n)), "backend": ctx.backend,
            "device": str(ctx.device),
            "steps": args.steps, "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None,
            "ring_vs_all_reduce_max_abs_diff": diff,
            "sweep_sizes": len(rows),
            "peak_ring_busbw": peak("ring_busbw"), "peak_ar_busbw": peak("ar_busbw"),
            "busbw_ratio_16MiB_plus": ratio,
            "fit": fits, "checks": [c.event() for c in checks], "wall_s": time.time() - started,
        }
        print(summary_from_event(summary), flush=True)
        return summary
    return None


def summary_from_event(s: dict, lang: str | None = None) -> str:
    """Rank 0's printed summary, in the learner's language (``lang``, else the run's)."""
    lang = lang or run_language()
    say = summary_lines("lesson1", lang)
    lines = [say("head", n=s["n"], backend=s["backend"], device=s["device"], wall=format_time(s["wall_s"], 2, lang))]
    lines.append(say("check", diff=format_number(s["ring_vs_all_reduce_max_abs_diff"], 2, lang)))
    if s["final_loss"] is not None:
        lines.append(say("train", first=format_fixed(s["first_loss"], 4, lang), last=format_fixed(s["final_loss"], 4, lang),
                         steps=s["steps"]))
    if s["peak_ring_busbw"] is not None:
        lines.append(say("peak", ring=format_bandwidth(s["peak_ring_busbw"], lang=lang),
                         ar=format_bandwidth(s["peak_ar_busbw"], lang=lang)))
    if s["busbw_ratio_16MiB_plus"] is not None:
        lines.append(say("ratio", ratio=format_fixed(s["busbw_ratio_16MiB_plus"], 2, lang)))
    f = s.get("fit", {}).get("ring")
    if f:
        bw = say("fit_bandwidth", bw=format_bandwidth(f["bandwidth"], lang=lang)) if f.get("bandwidth") else ""
        lines.append(say("fit", alpha=format_time(f["alpha_s"], lang=lang),
                         beta=format_number(f["beta_s_per_byte"], 3, lang), bandwidth=bw))
    if s.get("nodes", 1) > 1:  # a ring across hosts: the network's hop, and the one α and β were timed on
        lines.append(say("node_timings", nodes=s["nodes"], peer=s["n"] // s["nodes"]))
    elif s["device"] == "cpu":
        lines.append(say("cpu_timings"))
    return "\n".join(lines)


if __name__ == "__main__":
    exit_with(main)
