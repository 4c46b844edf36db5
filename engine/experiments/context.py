"""Lesson 9 experiment: the course's GPT trained with context parallelism, checked against one process.

Run on cp·dp ranks (``--cp`` divides the world; the rest is data parallelism)::

    python -m torch.distributed.run --nproc-per-node 4 -m distai.engine.experiments.context
    distai run context --cpu 4 [--cp C] [--seq S] [--layout zigzag|contiguous] [--variant ring|allgather]

1. ``--steps`` SGD steps of the GPT (rotary positions, grouped-query attention, float64) with ring
   attention installed in every block (:func:`~distai.engine.context_parallel.apply_cp`) on this
   rank's sequence shard, and of the same model on one process over every replica's batch: the loss
   and the largest relative gradient difference;
2. every ring step of every layer, streamed (``cp_step``): the tiles and causal scores the rank
   computed, its compute and wait times, the messages and bytes it sent, beside the schedule's
   scores and the formula's messages and bytes; the communication meter's totals per layer
   against :func:`~distai.lessons.context.formulas.cp_comm_per_layer`;
3. the activations each block saves for backward (float32), at three sequence lengths, with CP and
   on one process, against :func:`~distai.lessons.context.formulas.model_activation_bytes_per_layer`.

Events (besides ``phase``, ``progress`` and the final ``summary``): ``cp_config``, ``step``,
``cp_step`` (replica 0's ranks, see above), ``comm_check`` and ``memory``, declared in
``lessons/context/events.py``. Rank 0 prints the summary from the string catalog
(``lessons/catalog/ring_attention.toml``).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import equal_to_one_process
from ...lessons.context import formulas as F
from ...lessons.context import ring_schedule as plan
from ...lessons.context.cp_run import idle_share_of, work_seconds
from ...lessons.context.events import COMM_CHECK, CP_CONFIG, CP_STEP, MEMORY, STEP
from ...lessons.events import PHASE
from ...lessons.model_size import ModelSize, add_model_options
from ...lessons.strings import LANGUAGES, detect_language, strings
from ...lessons.units import format_bytes, format_integer, format_number, format_percent
from ..context_parallel import CPGroup, LayoutError, apply_cp, cp_loss, shard_sequence, sync_cp_grads
from ..experiment import Progress, UsageError, exit_with, max_over_ranks, run_experiment
from ..metering import CommMeter, SavedActivationMeter
from ..model import GPT, GPTConfig, ModelConfigError, make_batch

# rotary positions (each rank rotates its tokens by their absolute positions) and grouped-query attention
DEFAULT_MODEL = ModelSize(vocab=128, hidden=64, heads=8, kv_heads=2, layers=2, seq=256, rope_theta=10000.0)
MEMORY_TOLERANCE = 0.10  # the measured activations stay within 10% of the formula


def build_parser() -> argparse.ArgumentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run context")
    p.add_argument("--cp", type=int, default=None)
    p.add_argument("--layout", choices=plan.LAYOUTS, default="zigzag")
    p.add_argument("--variant", choices=plan.VARIANTS, default="ring")
    add_model_options(p, DEFAULT_MODEL, ("hidden", "heads", "kv_heads", "layers", "vocab", "seq"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-seqs", default=None)
    p.add_argument("--lang", choices=LANGUAGES, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_experiment("distai run context", build_parser().parse_args, run, argv,
                          usage_errors=(UsageError, ModelConfigError, LayoutError), check=_check_before_launch)


def _check_before_launch(args: argparse.Namespace) -> None:
    """Bad sizes end the run before any rank joins the group (one line, exit 2)."""
    args.lang = detect_language(args.lang)
    check_arguments(args, int(os.environ.get("WORLD_SIZE", "1")))


# ----------------------------------------------------------------------------------------------
# The groups and the checks of the arguments
# ----------------------------------------------------------------------------------------------

def _flag_refused(flag: str, exc: LayoutError) -> UsageError:
    """The shape check's refusal of ``flag``'s value, in every language."""
    return UsageError(texts={lang: f"{flag}: {exc.text(lang)}" for lang in LANGUAGES})


def check_arguments(args: argparse.Namespace, world: int) -> tuple[int, list[int]]:
    """The CP size and the memory curve's sequence lengths; UsageError (one line) when they do not split."""
    cp = args.cp or world
    if cp < 1 or world % cp:
        raise UsageError.keyed("cp_divides", cp=cp, world=world)
    try:
        plan.check_layout(args.seq, cp, args.layout)
    except LayoutError as exc:
        raise _flag_refused("--seq", exc) from None
    if args.memory_seqs:
        try:
            seqs = [int(x) for x in args.memory_seqs.split(",") if x.strip()]
        except ValueError:
            raise UsageError.keyed("memory_seqs", value=repr(args.memory_seqs)) from None
        for s in seqs:
            try:
                plan.check_layout(s, cp, args.layout)
            except LayoutError as exc:
                raise _flag_refused("--memory-seqs", exc) from None
    else:  # s/4, s/2 and s, those that split
        seqs = [s for s in (args.seq // 4, args.seq // 2, args.seq)
                if s > 0 and s % plan.num_chunks(cp, args.layout) == 0]
    if args.steps < 1 or args.batch < 1:
        raise UsageError.keyed("steps_batch")
    return cp, seqs


def cp_groups(cp: int) -> tuple[object, int]:
    """This rank's context-parallel group (consecutive ranks) and its data-parallel index."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = None
    for first in range(0, world, cp):
        group = dist.new_group(list(range(first, first + cp))) if cp < world else None
        if first <= rank < first + cp:
            mine = group
    return mine, rank // cp


# ----------------------------------------------------------------------------------------------
# 1 and 2: training against one process, every ring step measured
# ----------------------------------------------------------------------------------------------

def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "every parameter of the GPT takes part in the loss"
    return p.grad


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(ref.abs().max())
    return float((a - ref).abs().max()) / scale if scale else float((a - ref).abs().max())


def train_against_one_process(cfg: GPTConfig, cp: CPGroup, replica: int, replicas: int, batch: int, steps: int,
                              lr: float, seed: int, events=None, device=None, on_step=None) -> dict:
    """``steps`` SGD steps of the CP model and of the same model on one process (every replica's
    batch); the losses, gradient differences, the meter and the ring steps of each step
    (``on_step(step, trace)`` sees each step's as soon as it ran)."""
    model = apply_cp(GPT(cfg, seed=seed, dtype=torch.float64, device=device), cp)
    reference = GPT(cfg, seed=seed, dtype=torch.float64, device=device)
    positions = cp.positions(cfg.seq, device)
    out: dict = {"losses": [], "reference_losses": [], "max_grad_rel_diff": [], "ring": [], "meters": []}
    for step in range(steps):
        batches = [make_batch(cfg, batch, seed=seed * 1009 + r, step=step, device=device) for r in range(replicas)]
        ids, targets = batches[replica]
        cp.trace = []
        meter = CommMeter()
        model.zero_grad(set_to_none=True)
        with meter:
            local = model(shard_sequence(ids, cp), shard_sequence(targets, cp), positions=positions)
            local.backward()
        sync_cp_grads(model)
        loss = cp_loss(local)
        reference.zero_grad(set_to_none=True)
        ref_total = sum(reference(i, t) for i, t in batches) / replicas
        ref_total.backward()
        ref_loss = float(ref_total.detach())
        diff = max(_rel(_grad(p), _grad(q)) for p, q in zip(model.parameters(), reference.parameters()))
        out["losses"].append(float(loss))
        out["reference_losses"].append(ref_loss)
        out["max_grad_rel_diff"].append(max_over_ranks(diff, device))
        out["ring"].append(list(cp.trace))
        out["meters"].append(meter)
        if on_step is not None:
            on_step(step, out["ring"][-1])
        if events is not None:
            STEP.emit(events, {"step": step, "of": steps, "loss": float(loss), "reference_loss": ref_loss,
                               "max_grad_rel_diff": out["max_grad_rel_diff"][-1]})
        with torch.no_grad():
            for m in (model, reference):
                for p in m.parameters():
                    p -= lr * _grad(p)
    return out


def ring_step_checks(trace: list[dict], cfg: GPTConfig, cp: CPGroup, batch: int, elem: int) -> list[dict]:
    """Each traced ring step with the schedule's causal scores and the formula's messages and bytes."""
    work = plan.work_per_step(cfg.seq, cp.size, cp.layout)[cp.rank]
    block = F.kv_block_bytes(cfg.seq, batch, cfg.group_heads, cfg.head_dim, cp.size, elem)
    out = []
    for rec in trace:
        want = F.cp_step_traffic(cp.size, rec["step"], rec["phase"], cp.variant, block)
        # scores are per head and sequence: the engine counts one head of one sequence per tile
        out.append({**rec, "formula_scores": work[rec["step"]], "formula_messages": want["messages"],
                    "formula_bytes": want["bytes"],
                    "match": (rec["scores"], rec["messages"], rec["sent_bytes"]) ==
                             (work[rec["step"]], want["messages"], want["bytes"])})
    return out


def comm_check(meter: CommMeter, cfg: GPTConfig, cp: CPGroup, batch: int, elem: int) -> dict:
    """The meter's messages and bytes per layer and phase (the attention's exchanges) vs the formula."""
    want = F.cp_comm_per_layer(cfg.seq, batch, cfg.group_heads, cfg.head_dim, cp.size, cp.variant, elem)
    layers = {}
    for layer in range(cfg.layers):
        row = {}
        for phase, name in (("fwd", "forward"), ("bwd", "backward")):
            sent = [r for r in meter.of(layer, phase) if r.op != "recv" and r.site.startswith("cp.")]
            row[phase] = {"messages": len(sent), "bytes": sum(r.sent_bytes for r in sent),
                          "formula_messages": want[f"{name}_messages"],
                          "formula_bytes": want[f"{name}_bytes_per_rank"]}
        layers[str(layer)] = row
    match = all(c["messages"] == c["formula_messages"] and c["bytes"] == c["formula_bytes"]
                for row in layers.values() for c in row.values())
    return {"layers": layers, "match": match}


# ----------------------------------------------------------------------------------------------
# 3: activation memory as the sequence grows
# ----------------------------------------------------------------------------------------------

def measure_memory(cfg: GPTConfig, cp: CPGroup, batch: int, seed: int, device=None) -> dict:
    """Bytes each block saves for backward on this rank (float32), with CP and on one process, and
    the formula's; the peak of everything the CP model saves."""
    out: dict[str, float] = {"seq": cfg.seq, "tokens": cfg.seq // cp.size * batch}
    ids, targets = make_batch(cfg, batch, seed=seed, step=0, device=device)
    ffn, rope = cfg.ffn_size, cfg.rope_theta is not None
    for name, sharded in (("cp", True), ("one", False)):
        model = GPT(cfg, seed=seed, dtype=torch.float32, device=device)
        if sharded:
            apply_cp(model, cp)
        x_ids, x_targets = (shard_sequence(ids, cp), shard_sequence(targets, cp)) if sharded else (ids, targets)
        positions = cp.positions(cfg.seq, device) if sharded else None
        meter = SavedActivationMeter(model.parameters())
        with meter:
            x = model.embed(x_ids)
            for i, block in enumerate(model.block_list()):
                with meter.measure(i):
                    x = block(x, positions)
            loss = torch.nn.functional.cross_entropy(model.head(x).reshape(-1, cfg.vocab), x_targets.t().reshape(-1))
        peak = meter.peak
        loss.backward()
        tokens = x_ids.numel()
        out[f"{name}_measured"] = meter.per_layer["0"]
        out[f"{name}_formula"] = F.model_activation_bytes_per_layer(
            tokens, cfg.hidden, cfg.heads, cfg.group_heads, ffn, 4, rope, seq=None if sharded else cfg.seq,
            batch=batch)
        out[f"{name}_peak"] = peak
    return out


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

def run(ctx, args: argparse.Namespace) -> dict:
    ev, world, rank, device = ctx.events, ctx.world_size, ctx.rank, ctx.device
    if ctx.device.type == "cpu" and world > 1:
        torch.set_num_threads(1)
    cp_size, seqs = check_arguments(args, world)
    cfg = ModelSize.from_args(args, DEFAULT_MODEL)
    group, replica = cp_groups(cp_size)
    cp = CPGroup(group, args.layout, args.variant)
    replicas = world // cp_size
    progress = Progress(ctx, 1 + len(seqs))
    CP_CONFIG.emit(ev, {"cp": cp_size, "dp": replicas, "world": world, "backend": ctx.backend, "layout": args.layout,
                        "variant": args.variant, "seq": cfg.seq, "batch": args.batch, "hidden": cfg.hidden,
                        "heads": cfg.heads, "kv_heads": cfg.group_heads, "layers": cfg.layers, "vocab": cfg.vocab})

    PHASE.emit(ev, {"name": "training against one process"})
    elem = 8  # float64
    matched: list[bool] = []

    def stream(step: int, trace: list[dict]) -> None:
        """Every ring step of this training step, checked, to the run view (replica 0's ranks)."""
        checked = ring_step_checks(trace, cfg, cp, args.batch, elem)
        matched.extend(c["match"] for c in checked)
        if replica == 0:
            for c in checked:
                CP_STEP.emit_fields(ev, {"train_step": step, "rank": cp.rank, **c})

    tr = train_against_one_process(cfg, cp, replica, replicas, args.batch, args.steps, args.lr, args.seed,
                                   ev if rank == 0 else None, device, on_step=stream)
    steps_ok = all(matched)
    comm = comm_check(tr["meters"][0], cfg, cp, args.batch, elem)
    COMM_CHECK.emit_fields(ev, comm)
    comm_ok = all(v == 0.0 for v in [max_over_ranks(0.0 if comm["match"] and steps_ok else 1.0, device)])
    fwd0 = [c for c in tr["ring"][-1] if c["phase"] == "fwd" and c["layer"] == "0"]
    measured_idle = _measured_idle(fwd0, cp, device)
    progress("training")

    PHASE.emit(ev, {"name": "activation memory"})
    memory = []
    for s in seqs:
        m = measure_memory(replace(cfg, seq=s), cp, args.batch, args.seed, device)
        row = {"seq": s, "measured_bytes": m["cp_measured"], "formula_bytes": m["cp_formula"],
               "one_process_bytes": m["one_measured"], "one_process_formula_bytes": m["one_formula"],
               "peak_bytes": m["cp_peak"], "one_process_peak_bytes": m["one_peak"]}
        memory.append(row)
        if rank == 0:
            MEMORY.emit_fields(ev, row)
        progress(f"memory s={s}")
    memory_ok = all(abs(r["measured_bytes"] / r["formula_bytes"] - 1) <= MEMORY_TOLERANCE and
                    abs(r["one_process_bytes"] / r["one_process_formula_bytes"] - 1) <= MEMORY_TOLERANCE
                    for r in memory)

    loss, ref = tr["losses"][-1], tr["reference_losses"][-1]
    grad = max(tr["max_grad_rel_diff"])
    train_ok = equal_to_one_process("float64", abs(loss - ref) / abs(ref), grad)  # the run is float64 (GPT above)
    summary = {"cp": cp_size, "dp": replicas, "layout": args.layout, "variant": args.variant, "seq": cfg.seq,
               "losses": tr["losses"], "reference_losses": tr["reference_losses"], "max_grad_rel_diff": grad,
               "comm_match": comm_ok, "comm_layer0": comm["layers"]["0"],
               "idle_schedule": plan.idle_fraction(cfg.seq, cp_size, args.layout), "idle_measured": measured_idle,
               "memory": memory, "memory_ok": memory_ok, "train_ok": train_ok,
               # what the printed summary says of the run besides: runs show writes it again from this event
               "world": world, "backend": ctx.backend, "hidden": cfg.hidden, "heads": cfg.heads,
               "group_heads": cfg.group_heads, "layers": cfg.layers, "batch": args.batch, "steps": args.steps}
    if rank == 0:
        print(summary_from_event(summary, args.lang), flush=True)
    return summary


def _measured_idle(fwd: list[dict], cp: CPGroup, device) -> float:
    """The forward's idle share over the CP group (``cp_run.idle_share_of``), from every rank's work in each
    step: its CPU seconds computing (``cp_run.work_seconds``; 4 ranks on 2 cores timed on the wall clock
    measured the zigzag's balanced schedule about as idle as the contiguous one, 43 % against 0 %)."""
    steps = sorted(fwd, key=lambda r: r["step"])
    mine = torch.tensor([work_seconds(r) for r in steps], dtype=torch.float64, device=device)
    if cp.size > 1:
        gathered = [torch.empty_like(mine) for _ in range(cp.size)]
        dist.all_gather(gathered, mine, group=cp.group)
        times = torch.stack(gathered)
    else:
        times = mine[None]
    return idle_share_of(times.T.cpu().tolist())


def summary_from_event(s: dict, lang: str | None = None) -> str:
    """Rank 0's printed summary from its summary event alone, from the catalog in ``lang`` (else the run's)."""
    lang = detect_language(lang)
    tr = strings("ring_attention", lang)

    def b(n: float) -> str:
        return format_bytes(n, binary=True, lang=lang)

    c = s["comm_layer0"]
    lines = [tr["summary_head"].format(cp=s["cp"], dp=s["dp"], world=s["world"], backend=s["backend"], layout=tr[s["layout"]],
                                       variant=tr[s["variant"]], s=format_integer(s["seq"], lang), h=s["hidden"],
                                       a=s["heads"], g=s["group_heads"], L=s["layers"], b=s["batch"]),
             tr["summary_loss"].format(steps=s["steps"], loss=format_number(s["losses"][-1], 8, lang),
                                       ref=format_number(s["reference_losses"][-1], 8, lang),
                                       diff=format_number(abs(s["losses"][-1] / s["reference_losses"][-1] - 1), 2, lang),
                                       grad=format_number(s["max_grad_rel_diff"], 2, lang)),
             tr["summary_comm"].format(fm=c["fwd"]["messages"], fb=b(c["fwd"]["bytes"]), bm=c["bwd"]["messages"],
                                       bb=b(c["bwd"]["bytes"]), ffm=c["fwd"]["formula_messages"],
                                       ffb=b(c["fwd"]["formula_bytes"]), bfm=c["bwd"]["formula_messages"],
                                       bfb=b(c["bwd"]["formula_bytes"]),
                                       ok=tr["yes"] if s["comm_match"] else tr["no"]),
             tr["summary_work"].format(ok=tr["yes"] if s["comm_match"] else tr["no"],
                                       schedule=format_percent(s["idle_schedule"], 3, lang),
                                       measured=format_percent(s["idle_measured"], 3, lang))]
    for m in s["memory"]:
        lines.append(tr["summary_memory"].format(
            s=format_integer(m["seq"], lang), m=b(m["measured_bytes"]), f=b(m["formula_bytes"]),
            e=format_percent(abs(m["measured_bytes"] / m["formula_bytes"] - 1), 2, lang),
            m1=b(m["one_process_bytes"]), f1=b(m["one_process_formula_bytes"]),
            e1=format_percent(abs(m["one_process_bytes"] / m["one_process_formula_bytes"] - 1), 2, lang)))
    ok = s["train_ok"] and s["comm_match"] and s["memory_ok"]
    lines.append(tr["summary_verdict_ok" if ok else "summary_verdict_bad"])
    return "\n".join(lines)


if __name__ == "__main__":
    exit_with(main)
