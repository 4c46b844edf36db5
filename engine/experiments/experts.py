"""The Mixture-of-Experts experiment: a GPT whose MLPs are experts, sharded over an EP group.

``distai run experts --cpu 4 [--ep E] [--experts X] [--top-k K] [--capacity-factor C | --dropless]``
(or ``--gpus N``; directly: ``python -m torch.distributed.run --nproc-per-node 4 -m
distai.engine.experiments.experts``). The N ranks form N/E EP groups of E consecutive ranks
(default E = N): each rank holds E_total/E experts of every layer, its own slice of the global
batch and a copy of everything else (attention, norms, router: data parallel). Every step:

1. trains one SGD step with :mod:`distai.engine.moe` (router, counts all-to-all, token dispatch
   and combine all-to-alls, Switch's balancing loss over the global batch) and, unless
   ``--no-check``, the same MoE on one process on the whole batch: the loss and every parameter
   are compared;
2. streams each layer's load: the routing choices per expert, what each kept (the capacity),
   the drop rate and the balancing loss.

One step is metered (:class:`~distai.engine.metering.CommMeter`): every all-to-all's calls and
bytes on every rank against the formula of the rows that rank really sent and received
(``lessons/experts/formulas.py``); the bytes of expert weights each rank holds against E/ep.

Events (besides ``phase``, ``progress`` and ``summary``): ``moe_config`` (rank 0, first),
``moe_load`` (rank 0, every step and layer), ``step``, ``moe_comm`` and ``moe_memory`` (rank 0),
declared in ``lessons/experts/events.py``.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import equal_to_one_process
from ...lessons.events import METRIC, PHASE, PROGRESS
from ...lessons.experts.events import MOE_COMM, MOE_CONFIG, MOE_LOAD, MOE_MEMORY, STEP
from ...lessons.experts.formulas import (
    RUN_CAPACITY_FACTOR,
    RUN_EXPERTS,
    RUN_TOP_K,
    all_to_all_calls_per_layer,
    count_all_to_all_bytes,
    expert_bytes_per_rank,
    token_all_to_all_bytes,
)
from ...lessons.model_size import ModelSize, add_model_options
from ...lessons.strings import detect_language, translated
from ...lessons.units import (
    format_bytes,
    format_fixed,
    format_integer,
    format_number,
    format_percent,
    format_time,
)
from ..comm_trace import traced_step
from ..data_parallel import sgd_step
from ..experiment import (
    device_sync,
    equality_verdict,
    exit_with,
    max_over_ranks,
    run_experiment,
)
from ..mesh_args import MeshConfigError
from ..metering import CommMeter, comm_scope
from ..model import GPT, ModelConfigError, lm_loss, make_batch
from ..moe import (
    MoEConfig,
    MoEConfigError,
    apply_ep,
    ep_groups,
    expert_param_bytes,
    make_moe,
    moe_aux_loss,
    moe_layers,
    sync_moe_grads,
)

#: the GPT whose MLPs become experts (its size flags default to this)
DEFAULT_MODEL = ModelSize(vocab=64, hidden=32, heads=4, layers=2, seq=16)
AREA = "experts"  # the catalog file of the lesson's strings (lessons/catalog/experts.toml)


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text}")
    return value


def build_parser() -> ExperimentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run experts")
    p.add_argument("--ep", type=int, default=None)
    p.add_argument("--experts", type=int, default=RUN_EXPERTS)
    p.add_argument("--top-k", type=int, default=RUN_TOP_K)
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--capacity-factor", type=positive_float, default=RUN_CAPACITY_FACTOR)
    limit.add_argument("--dropless", action="store_true")
    p.add_argument("--aux-alpha", type=float, default=0.01)
    p.add_argument("--shared-experts", type=int, default=0)
    p.add_argument("--bias-balance", type=float, default=0.0)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--lang", default=None)
    add_model_options(p, DEFAULT_MODEL)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.micro_batch < 1 or args.steps < 1:
        p.error("--micro-batch and --steps must be at least 1")
    try:
        args.lang = detect_language(args.lang)
    except ValueError as exc:
        p.error(str(exc))
    return args


def moe_config(args: argparse.Namespace) -> MoEConfig:
    return MoEConfig(experts=args.experts, top_k=args.top_k,
                     capacity_factor=None if args.dropless else args.capacity_factor, aux_alpha=args.aux_alpha,
                     shared_experts=args.shared_experts, bias_rate=args.bias_balance)


def train_step(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor, lr: float,
               group: Any = None, sync: bool = True) -> torch.Tensor:
    """One SGD step of ``model`` on its tokens: language-model loss + balancing loss; the
    gradients synchronised (``sync``) over the data-parallel ``group``; the bias balance nudged."""
    model.zero_grad(set_to_none=True)
    loss = lm_loss(model(ids), targets) + moe_aux_loss(model).to(ids.device)
    with comm_scope(phase="bwd"):
        loss.backward()
    if sync:
        sync_moe_grads(model, group)
    sgd_step(model.parameters(), lr)
    for layer in moe_layers(model):
        layer.update_balance_bias()
    return loss.detach()


def max_relative_diff(model: torch.nn.Module, ref: torch.nn.Module, first_expert: int) -> float:
    """The largest relative difference of this rank's parameters from the single-process ones
    (local expert i is global expert ``first_expert + i``)."""
    ref_params = dict(ref.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        if ".experts." in name:
            head, tail = name.split(".experts.")
            i, rest = tail.split(".", 1)
            name = f"{head}.experts.{first_expert + int(i)}.{rest}"
        r = ref_params[name].detach()
        worst = max(worst, ((p.detach() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
    return worst


def comm_account(meter: CommMeter, model: torch.nn.Module, moe: MoEConfig, hidden: int, elem: int,
                 ep_rank: int, ep: int) -> dict:
    """This rank's all-to-alls of the metered step, and the formula of the rows it moved."""
    a2a = [r for r in meter.records if r.op == "all_to_all"]
    layers = moe_layers(model)
    sent = sum(n for layer in layers for q, n in enumerate(layer.stats.sent_rows) if q != ep_rank)
    received = sum(n for layer in layers for q, n in enumerate(layer.stats.received_rows) if q != ep_rank)
    calls = all_to_all_calls_per_layer(dropless=moe.capacity_factor is None)
    counts_per_layer = calls["fwd"] - 2
    measured = {"calls": len(a2a),
                "token_bytes": sum(r.sent_bytes for r in a2a if r.site in ("moe.dispatch", "moe.combine")
                                   or r.phase == "bwd"),
                "count_bytes": sum(r.sent_bytes for r in a2a if r.site in ("moe.counts", "moe.kept"))}
    formula = {"calls": len(layers) * sum(calls.values()) if ep > 1 else 0,
               "token_bytes": 2 * token_all_to_all_bytes(sent, received, hidden, elem),  # forward, backward
               "count_bytes": len(layers) * counts_per_layer * count_all_to_all_bytes(ep, moe.top_k,
                                                                                       moe.experts // ep)}
    return {"measured": measured, "formula": formula, "match": measured == formula}


def print_summary(r: dict, lang: str) -> None:
    print(summary_from_event(r, lang))


def summary_from_event(r: dict, lang: str) -> str:
    """Rank 0's printed summary of the run ``r`` (its summary event) in ``lang`` (``runs show`` writes it again
    in the learner's language)."""
    c, lines = r["config"], []

    def say(key: str, **fields: Any) -> None:
        lines.append(translated(AREA, f"summary.{key}", lang, **fields))

    say("title", experts=format_integer(c["experts"], lang), ep=format_integer(c["ep"], lang),
        dp=format_integer(c["dp"], lang), top_k=format_integer(c["top_k"], lang), device=c["device"])
    if c["capacity"] is None:
        say("dropless")
    else:
        say("capacity", factor=format_fixed(c["capacity_factor"], 2, lang), capacity=format_integer(c["capacity"], lang),
            tokens=format_integer(c["tokens"], lang), n=c["capacity"])
    say("loss", first=format_fixed(r["losses"][0], 4, lang), last=format_fixed(r["losses"][-1], 4, lang))
    if r["max_param_rel_diff"] is not None:
        say("check", loss=format_number(r["max_loss_rel_diff"], 2, lang),
            params=format_number(r["max_param_rel_diff"], 2, lang),
            verdict=equality_verdict(r["max_loss_rel_diff"], r["max_param_rel_diff"], c["dtype"], lang))
    say("balance", drop=format_percent(r["drop_rates"][0], lang=lang), drop_last=format_percent(r["drop_rates"][-1], lang=lang),
        aux=format_fixed(r["aux_losses"][0], 4, lang), aux_last=format_fixed(r["aux_losses"][-1], 4, lang),
        layers=c["layers"])
    say("load", loads=" ".join(format_integer(n, lang) for n in r["last_load"]))
    say("comm", calls=format_integer(r["comm"]["measured"]["calls"], lang),
        bytes=format_bytes(r["comm"]["measured"]["token_bytes"], binary=True, lang=lang),
        verdict=translated(AREA, "summary.match" if r["comm_match"] else "summary.mismatch", lang))
    say("memory", mine=format_bytes(r["memory"]["expert_bytes"], binary=True, lang=lang),
        all=format_bytes(r["memory"]["all_experts_bytes"], binary=True, lang=lang),
        fraction=format_integer(c["experts_per_rank"], lang), experts=format_integer(c["experts"], lang),
        # each rank's expert bytes, counted from its parameters, against E/ep experts' formula
        verdict=translated(AREA, "summary.match" if r["memory_match"] else "summary.mismatch", lang))
    say("time", time=format_time(r["step_time_s"], lang=lang))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_experiment("experts", parse_args, run, argv, usage_errors=(MoEConfigError, ModelConfigError, MeshConfigError),
                          check=check_input)


def check_ep_ranks(ep: int, world: int) -> None:
    """EP must divide the ranks (``distai run`` refuses it before the launch: mesh_args.experts_launch_ranks)."""
    if ep < 1 or world % ep:
        raise MeshConfigError.keyed("ep_ranks", ep=ep, ranks=world)


def check_input(args: argparse.Namespace) -> None:
    """What can be refused before joining the group (a MoEConfigError: one line, exit 2)."""
    moe = moe_config(args)
    if args.ep is not None:
        moe.check_ep(args.ep)
    ModelSize.from_args(args, DEFAULT_MODEL)


def _run_config(moe: Any, cfg: ModelSize, ep: int, world: int, b: int, tokens: int, dtype: str,
                dev: torch.device) -> dict[str, Any]:
    """What the run is: the MoE, its EP × DP layout, the model's size and the capacity per expert."""
    return {"experts": moe.experts, "ep": ep, "dp": world // ep, "world": world, "top_k": moe.top_k,
            "capacity_factor": moe.capacity_factor, "aux_alpha": moe.aux_alpha,
            "shared_experts": moe.shared_experts, "bias_rate": moe.bias_rate, "layers": cfg.layers,
            "hidden": cfg.hidden, "heads": cfg.heads, "seq": cfg.seq, "vocab": cfg.vocab, "micro_batch": b,
            "tokens": tokens, "capacity": moe.capacity(tokens), "experts_per_rank": moe.experts // ep,
            "dtype": dtype, "device": dev.type}


def _against_reference(ref: torch.nn.Module, model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor,
                       lr: float, loss: float, dev: torch.device) -> tuple[float, float, float]:
    """One step of the single-process MoE on the whole batch: its loss, and the relative differences of
    the loss and (largest over the ranks) of the parameters."""
    ref_loss = train_step(ref, ids, targets, lr, sync=False).item()
    param_diff = max_over_ranks(max_relative_diff(model, ref, moe_layers(model)[0].first_expert), dev)
    return ref_loss, abs(loss - ref_loss) / abs(ref_loss), param_diff


def _emit_step(ev: Any, step: int, steps: int, layers: list[Any], sent: list[Any], figures: dict[str, Any]) -> None:
    """Rank 0's events of one step: each MoE layer's load (with every rank's dispatched rows), the step's
    figures, the progress."""
    for i, layer in enumerate(layers):
        s = layer.stats
        MOE_LOAD.emit(ev, {"step": step, "layer": layer.layer, "routed": s.routed, "kept": s.kept,
                           "capacity": s.capacity, "drop_rate": s.drop_rate, "aux_loss": s.aux_loss,
                           "sent": [rows[i] for rows in sent]})
    STEP.emit_fields(ev, {"step": step, "of": steps, **figures})
    PROGRESS.emit(ev, {"done": step + 1, "total": steps})


def _expert_memory(rank: int, model: torch.nn.Module, moe: Any, cfg: ModelSize, ep: int, dtype: torch.dtype) -> dict:
    """This rank's expert bytes against E/ep of the experts (the formula), and the replicated rest."""
    expert_bytes = expert_param_bytes(model)
    per_expert = sum(p.numel() for p in moe_layers(model)[0].experts[0].parameters())
    return {"rank": rank, "expert_bytes": expert_bytes,
            "formula_bytes": expert_bytes_per_rank(cfg.layers, moe.experts, ep, per_expert, dtype.itemsize),
            "replicated_bytes": sum(p.numel() * p.element_size() for p in model.parameters()) - expert_bytes,
            "all_experts_bytes": cfg.layers * moe.experts * per_expert * dtype.itemsize}


def _ranks_verdict(model: torch.nn.Module, gathered: list[Any]) -> dict[str, Any]:
    """The last step's load over all MoE layers, and whether every rank's traffic and memory met the formula."""
    return {"last_load": [sum(x) for x in zip(*(layer.stats.routed for layer in moe_layers(model)))],
            "comm_match": all(g[0]["match"] for g in gathered),
            "memory_match": all(g[1]["expert_bytes"] == g[1]["formula_bytes"] for g in gathered)}


def run(ctx: Any, args: argparse.Namespace) -> dict | None:
    ep = args.ep or ctx.world_size
    check_ep_ranks(ep, ctx.world_size)
    moe = moe_config(args)
    moe.check_ep(ep)
    cfg = ModelSize.from_args(args, DEFAULT_MODEL)
    dtype, dev, ev = getattr(torch, args.dtype), ctx.device, ctx.events
    ep_group, expert_dp = ep_groups(ep)
    ep_rank, dp = dist.get_rank(ep_group), ctx.world_size // ep
    model = apply_ep(make_moe(GPT(cfg, seed=args.seed, dtype=dtype, device=dev), moe, args.seed), ep_group,
                     expert_dp)
    ref = make_moe(GPT(cfg, seed=args.seed, dtype=dtype, device=dev), moe, args.seed) if args.check else None
    for layer in moe_layers(ref) if ref is not None else []:
        layer.capacity_groups = dp  # each EP group has its own capacity
    b, world = args.micro_batch, ctx.world_size
    tokens = b * cfg.seq * ep  # the EP group's: what the capacity is counted over
    config = _run_config(moe, cfg, ep, world, b, tokens, args.dtype, dev)
    if ctx.rank == 0:
        MOE_CONFIG.emit_fields(ev, config)
        PHASE.emit(ev, {"name": f"MoE: {moe.experts} experts over EP = {ep} (× DP = {dp})"})
    meter = CommMeter()
    metered = 1 if args.steps > 1 else 0  # the first step also pays for warm-up
    losses: list[float] = []
    ref_losses: list[float] = []
    loss_diffs: list[float] = []
    param_diffs: list[float] = []
    drops: list[float] = []
    auxes: list[float] = []
    times: list[float] = []
    for step in range(args.steps):
        ids, targets = make_batch(cfg, b * world, args.seed, step, device=dev)
        mine = slice(ctx.rank * b, (ctx.rank + 1) * b)
        device_sync(dev)
        t0 = time.perf_counter()
        with traced_step(ev, f"step {step}", collectives=step == metered, meter=meter if step == metered else None,
                         step=step):
            with meter if step == metered else contextlib.nullcontext():
                loss = train_step(model, ids[mine], targets[mine], args.lr)
        device_sync(dev)
        times.append(max_over_ranks(time.perf_counter() - t0, dev))
        total = loss.to(torch.float64).reshape(1)
        dist.all_reduce(total)
        losses.append(total.item() / world)
        layers = moe_layers(model)
        drop = sum(layer.stats.dropped for layer in layers) / max(1, sum(sum(layer.stats.routed) for layer in layers))
        aux = sum(layer.stats.aux_loss for layer in layers)
        drops.append(drop)
        auxes.append(aux)
        ref_loss = loss_diff = param_diff = None
        if ref is not None:
            ref_loss, loss_diff, param_diff = _against_reference(ref, model, ids, targets, args.lr, losses[-1], dev)
            ref_losses.append(ref_loss)
            loss_diffs.append(loss_diff)
            param_diffs.append(param_diff)
        sent: list[Any] = [None] * world  # every rank's rows to each EP rank, per layer: what the view draws
        dist.all_gather_object(sent, [layer.stats.sent_rows for layer in layers])
        if ctx.rank == 0:
            _emit_step(ev, step, args.steps, layers, sent, {
                "loss": losses[-1], "ref_loss": ref_loss, "loss_rel_diff": loss_diff, "param_rel_diff": param_diff,
                "aux_loss": aux, "drop_rate": drop, "step_time_s": times[-1]})
        if step == metered:
            account = comm_account(meter, model, moe, cfg.hidden, dtype.itemsize, ep_rank, ep)
    memory = _expert_memory(ctx.rank, model, moe, cfg, ep, dtype)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, ({"rank": ctx.rank, **account}, memory))
    if ctx.rank != 0:
        return None
    MOE_COMM.emit(ev, {"step": metered, "ranks": [g[0] for g in gathered]})
    MOE_MEMORY.emit(ev, {"ranks": [g[1] for g in gathered]})
    timed = [t for i, t in enumerate(times) if i not in (0, metered)] or times
    result: dict[str, Any] = {"config": config, "losses": losses, "ref_losses": ref_losses or None,
                              "max_loss_rel_diff": max(loss_diffs) if loss_diffs else None,
                              "max_param_rel_diff": max(param_diffs) if param_diffs else None,
                              "drop_rates": drops, "aux_losses": auxes, **_ranks_verdict(model, gathered),
                              "comm": account, "memory": memory, "step_time_s": statistics.median(timed)}
    result["equal_to_one_process"] = equal_to_one_process(config["dtype"], result["max_loss_rel_diff"],
                                                          result["max_param_rel_diff"]) if param_diffs else None
    METRIC.emit(ev, {"name": "step_time_s", "value": result["step_time_s"]})
    print_summary(result, args.lang)
    return {"lesson": "experts", **result}


if __name__ == "__main__":
    exit_with(main)
