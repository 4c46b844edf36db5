"""Lesson 4 experiment: a whole Transformer, tensor-parallel from scratch, checked against the dense one.

Run on T ranks (T = the world size; T divides the heads, the MLP width and the vocabulary)::

    python -m torch.distributed.run --nproc-per-node 4 -m distai.engine.experiments.lesson4
    distai run lesson4 --cpu 4

For each mode, plain tensor parallelism (``tp``) and tensor + sequence parallelism (``tp+sp``):

1. trains ``--steps`` SGD steps of the model split by :func:`~distai.engine.tensor_parallel.apply_tp` and of the same
   dense model (:class:`~distai.engine.model.GPT`) on every rank (float64, dropout with the same masks) and reports the loss of both and
   the largest gradient difference over every parameter;
2. counts each rank's collectives and bytes per layer, forward and backward (a
   :class:`~distai.engine.metering.CommMeter` around the step), against
   ``tp_comm_per_layer`` (lesson 4's formula);
3. measures the activation bytes each layer keeps for backward (bfloat16, from autograd's saved
   tensors) against ``activation_bytes_per_layer`` (Korthikanti et al. 2022);
4. shows two classic bugs being caught by the dense comparison: sequence parallelism without the
   layer-norm gradient all-reduce, and a forgotten g.

Then one block is compared with PyTorch's own DTensor tensor parallelism (``parallelize_module``
with ColwiseParallel / RowwiseParallel, and SequenceParallel) on the same weights and input.

Events (besides ``phase``, ``log`` and the final ``summary``):

- ``config``: the model shape and T;
- ``step``: ``mode``, ``step``, ``loss`` (tensor-parallel), ``dense_loss``, ``max_grad_diff``;
- ``comm``: ``mode``, ``layer``, ``phase`` (fwd/bwd/grad-sync), ``op``, ``site``, ``count``,
  ``wire_bytes`` (ring, per rank), ``payload_bytes``; and one ``comm_check`` per mode with the
  per-layer totals next to the formula's (``formula``);
- ``memory``: ``mode``, ``layer``, ``measured_bytes``, ``formula_bytes``, ``ln_stats_bytes``;
- ``vocab``: the width of the logits a rank holds and the bytes of the loss's all-reduces;
- ``pitfall``: ``name``, ``max_diff`` with the bug, ``fixed_diff`` without it;
- ``dtensor``: ``mode``, differences ours/DTensor/dense and both sides' collective counts;
- ``check`` (rank 0, one per mode, issue 28): ``--check-steps`` timed steps against their on-CPU
  compute + the α-β time of their collectives, α and β measured between the steps; causes: CPU
  contention, waiting for a peer, collectives slower than α-β (timed alone between the steps;
  ``engine/time_causes.py``).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import Check, check
from ...lessons.events import CHECK, PHASE
from ...lessons.lesson4.events import COMM, COMM_CHECK, CONFIG, DTENSOR, MEMORY, PITFALL, STEP, VOCAB
from ...lessons.lesson4.formulas import activation_bytes_per_layer, collective_time, tp_comm_per_layer
from ...lessons.model_size import ModelSize, add_model_options
from ...lessons.units import format_bytes, format_fixed, format_integer, format_number, number_separator
from ..collectives import all_gather_into, reduce_scatter_into
from ..comm_trace import trace_causes, traced_step
from ..doctor import fit_alpha_beta, group_allreduce_times
from ..experiment import (
    Progress,
    UsageError,
    device_sync,
    exit_with,
    launch_world_size,
    max_over_ranks,
    run_experiment,
    run_language,
    summary_lines,
)
from ..metering import CommMeter, CommRecord, SavedActivationMeter
from ..model import GPT, DropoutMasks, GPTConfig, ModelConfigError, make_batch
from ..tensor_parallel import (
    TPGroup,
    apply_tp,
    apply_tp_block,
    dtensor_parallelize_block,
    full_grad,
    shard_dense_state,
    sync_tp_grads,
)
from ..time_causes import Window, collective_alone, collective_causes, step_contention

#: the GPT the run splits (its size flags default to this)
DEFAULT_MODEL = ModelSize(vocab=512, hidden=128, heads=8, layers=2, seq=64, dropout=0.1)
MODES = {"tp": False, "tp+sp": True}
#: the collectives of f and g, as torch.distributed names them (and the formula)
OPS = ("all_reduce", "all_gather", "reduce_scatter")
# The f / g collectives of a layer, the ones the formula counts; the rest are reported beside them.
REGATHER_SUFFIX = ".regather"


DEVICE = torch.device("cpu")  # main() sets the run's device (cuda:N under NCCL)


#: the float64 runs' equality with the dense block and DTensor (they measure 1e-16 to 1e-14): a bug of
#: float32's size (1e-6) fails it, where 1e-5 let it pass
FLOAT64_EQUAL = 1e-10


def grad_diffs(dense: torch.nn.Module, model: torch.nn.Module, rank: int, size: int,
               cfg: GPTConfig | None = None) -> dict[str, float]:
    """|dense gradient cut like this rank's shard − this rank's gradient|, max per parameter
    (``cfg``: the model's shape, when its key/value heads differ from its query heads)."""
    heads = {"heads": cfg.heads, "kv_heads": cfg.group_heads} if cfg is not None else {}
    ref = shard_dense_state({n: full_grad(p) for n, p in dense.named_parameters()}, rank, size, **heads)
    mine = {n: full_grad(p) for n, p in model.named_parameters()}
    if ref.keys() != mine.keys():
        raise AssertionError(f"parameter names differ: {sorted(ref.keys() ^ mine.keys())}")
    return {n: (ref[n] - mine[n]).abs().max().item() for n in ref}


# ----------------------------------------------------------------------------------------------
# 1-2. training steps against the dense model, and the collectives of one step
# ----------------------------------------------------------------------------------------------

def train_against_dense(cfg: GPTConfig, batch: int, sp: bool, steps: int = 2, lr: float = 0.1,
                        seed: int = 0, dtype: torch.dtype = torch.float64, regather: bool = True,
                        events=None, mode: str = "") -> dict:
    """Train the TP model and the dense model side by side; returns losses, gradient differences,
    the first step's collectives, the SP layer-norm gradients before their all-reduce, …"""
    tp = TPGroup(sequence_parallel=sp, regather=regather)
    cfg.check_tp(tp.size, sp)
    dense = GPT(cfg, seed=seed, dtype=dtype, device=DEVICE)
    model = apply_tp(GPT(cfg, seed=seed, dtype=dtype, device=DEVICE), tp)
    masks = DropoutMasks(cfg.dropout, seed=seed)
    dense.set_masks(masks)
    model.set_masks(masks)
    out: dict = {"losses": [], "dense_losses": [], "max_grad_diff": [], "per_param_diff": None,
                 "sp_grads_unsynced_diff": None}
    meter = CommMeter()  # around the first step only: it costs Python time on every op
    for step in range(steps):
        masks.step = step  # fresh dropout masks each step, the same batch (so the loss falls)
        ids, targets = make_batch(cfg, batch, seed, 0, device=DEVICE)
        dense.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        dense_loss = dense(ids, targets)
        dense_loss.backward()
        with meter if step == 0 else contextlib.nullcontext(), \
                traced_step(events, f"{mode} step {step}", meter=meter if step == 0 else None, mode=mode, step=step):
            loss = model(ids, targets)
            loss.backward()
        if sp and tp.size > 1 and step == 0:
            # The classic bug, measured: layer-norm gradients of one sequence shard only.
            d = grad_diffs(dense, model, tp.rank, tp.size, cfg)
            out["sp_grads_unsynced_diff"] = max_over_ranks(
                max(v for n, v in d.items() if getattr(dict(model.named_parameters())[n], "sequence_parallel", False)), DEVICE)
        with meter if step == 0 else contextlib.nullcontext():
            sync_tp_grads(model, tp)
        if step == 0:
            out["max_logits_width"] = tp.max_logits_width
        diffs = grad_diffs(dense, model, tp.rank, tp.size, cfg)
        worst = max_over_ranks(max(diffs.values()), DEVICE)
        if step == 0:
            out["per_param_diff"] = {n: max_over_ranks(v, DEVICE) for n, v in sorted(diffs.items())}
        out["losses"].append(loss.item())
        out["dense_losses"].append(dense_loss.item())
        out["max_grad_diff"].append(worst)
        if events is not None:
            STEP.emit(events, {"mode": mode, "step": step, "of": steps, "loss": loss.item(),
                               "dense_loss": dense_loss.item(), "max_grad_diff": worst})
        with torch.no_grad():
            for m in (dense, model):
                for p in m.parameters():
                    if p.grad is not None:
                        p.sub_(lr * p.grad)
    out["meter"] = meter
    out["elem_size"] = torch.empty((), dtype=dtype).element_size()
    out["T"] = tp.size
    return out


def comm_check(meter: CommMeter, cfg: GPTConfig, batch: int, sp: bool, T: int, elem_size: int,
               regather: bool = True) -> dict:
    """Per transformer layer and direction: the f/g collectives counted vs ``tp_comm_per_layer``, and
    SP's backward re-gathers vs its "regather" (none with ``regather`` False: the gathered input kept);
    the layer-norm gradient sync beside them."""
    formula = tp_comm_per_layer(cfg.hidden, cfg.seq, batch, T, sp, bytes_per_elem=elem_size)
    regathers = regather and sp and T > 1
    want_regather = {"fwd": (0, 0.0), "bwd": (formula["regather"]["all_gather"], formula["regather_bytes_per_rank"])
                     if regathers else (0, 0.0)}
    layers = {}
    for layer in range(cfg.layers):
        row = {}
        for phase, key in (("fwd", "forward"), ("bwd", "backward")):
            fg = [r for r in meter.of(layer, phase) if not r.site.endswith(REGATHER_SUFFIX)]
            extra = [r for r in meter.of(layer, phase) if r.site.endswith(REGATHER_SUFFIX)]
            counts = {op: sum(1 for r in fg if r.op == op) for op in OPS}
            expected = {op: (formula[key].get(op, 0) if T > 1 else 0) for op in OPS}
            row[phase] = {
                "counts": counts, "formula_counts": expected,
                "wire_bytes": sum(r.wire_bytes for r in fg),
                "formula_wire_bytes": formula[f"{key}_bytes_per_rank"],
                "payload_bytes": sum(r.payload_bytes for r in fg),
                "regather_count": len(extra), "regather_wire_bytes": sum(r.wire_bytes for r in extra),
                "formula_regather_count": want_regather[phase][0],
                "formula_regather_wire_bytes": want_regather[phase][1],
            }
        sync = meter.of(layer, "grad-sync")
        row["grad-sync"] = {"count": len(sync), "wire_bytes": sum(r.wire_bytes for r in sync),
                            "payload_bytes": sum(r.payload_bytes for r in sync)}
        layers[str(layer)] = row
    ok = all(row[ph]["counts"] == row[ph]["formula_counts"]
             and abs(row[ph]["wire_bytes"] - row[ph]["formula_wire_bytes"]) < 1e-6
             and row[ph]["regather_count"] == row[ph]["formula_regather_count"]
             and abs(row[ph]["regather_wire_bytes"] - row[ph]["formula_regather_wire_bytes"]) < 1e-6
             for row in layers.values() for ph in ("fwd", "bwd"))
    return {"layers": layers, "formula": formula, "match": ok}


# ----------------------------------------------------------------------------------------------
# 3. activation memory per layer
# ----------------------------------------------------------------------------------------------

def measure_activations(cfg: GPTConfig, batch: int, sp: bool, seed: int = 0,
                        regather: bool = True) -> dict:
    """Bytes autograd keeps per layer on this rank (bfloat16 activations, 1-byte dropout masks)
    vs Korthikanti's formula; the layer norms' mean and 1/std (2 numbers per token each, not in
    the formula) are reported separately."""
    if cfg.dropout <= 0:
        raise ValueError("the activation formula counts dropout masks: measure with --dropout > 0")
    tp = TPGroup(sequence_parallel=sp, regather=regather)
    model = apply_tp(GPT(cfg, seed=seed, dtype=torch.bfloat16, device=DEVICE), tp)
    model.set_masks(DropoutMasks(cfg.dropout, seed=seed))
    meter = SavedActivationMeter(model.parameters())
    ids, targets = make_batch(cfg, batch, seed, 0, device=DEVICE)
    with meter.per_module({b.layer: b for b in model.block_list()}):
        model(ids, targets).backward()
    T = tp.size
    formula = activation_bytes_per_layer(cfg.seq, batch, cfg.hidden, cfg.heads, T, sp and T > 1)
    tokens = cfg.seq * batch // (T if sp else 1)
    probe = torch.ones(2, cfg.hidden, dtype=torch.bfloat16, device=DEVICE)
    stat_size = torch.native_layer_norm(probe, (cfg.hidden,), None, None, cfg.eps)[1].element_size()
    ln_stats = 2 * 2 * tokens * stat_size  # 2 layer norms × (mean, rstd) per token
    return {"per_layer": dict(meter.per_layer), "formula_bytes": formula, "ln_stats_bytes": ln_stats,
            "T": T}


# ----------------------------------------------------------------------------------------------
# 4. a forgotten g, caught by the dense comparison
# ----------------------------------------------------------------------------------------------

def forgotten_g(cfg: GPTConfig, batch: int, seed: int = 0) -> dict:
    """Loss difference vs dense when the MLP's g (its forward all-reduce) is skipped, and when not."""
    out = {}
    for name, skip in (("bug", {"mlp.g"}), ("fixed", set())):
        tp = TPGroup(skip_sites=skip)
        dense = GPT(cfg, seed=seed, dtype=torch.float64, device=DEVICE)
        model = apply_tp(GPT(cfg, seed=seed, dtype=torch.float64, device=DEVICE), tp)
        ids, targets = make_batch(cfg, batch, seed, 0, device=DEVICE)
        with torch.no_grad():
            out[name] = max_over_ranks(abs(model(ids, targets).item() - dense(ids, targets).item()), DEVICE)
    return out


# ----------------------------------------------------------------------------------------------
# DTensor: PyTorch's own tensor parallelism on the same block
# ----------------------------------------------------------------------------------------------

def _comm_counts(mode) -> dict[str, int]:
    return {str(k).split(".")[-1]: int(v) for k, v in mode.get_comm_counts().items()}


def compare_with_dtensor(cfg: GPTConfig, batch: int, sp: bool, seed: int = 0,
                         dtype: torch.dtype = torch.float64, with_dtensor: bool = True) -> dict:
    """One block, three ways on the same weights and input (dropout off: DTensor's local heads
    do not know which global heads they are): dense, ours, DTensor's ``parallelize_module``.
    ``with_dtensor=False`` compares ours with dense only (DTensor's first use costs seconds)."""
    T = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    cfg.check_tp(T, sp)
    dense = GPT(cfg, seed=seed, dtype=dtype, device=DEVICE).block_list()[0]
    dt_block = copy.deepcopy(dense)
    tp = TPGroup(sequence_parallel=sp)
    ours = apply_tp_block(copy.deepcopy(dense), tp)

    gen = torch.Generator().manual_seed(seed + 17)
    x = torch.randn(cfg.seq, batch, cfg.hidden, dtype=dtype, generator=gen).to(DEVICE)
    w = torch.randn(cfg.seq, batch, cfg.hidden, dtype=dtype, generator=gen).to(DEVICE)
    local = (lambda t: t.chunk(T)[rank]) if sp else (lambda t: t)

    xd = x.clone().requires_grad_()
    yd = dense(xd)
    (yd * w).sum().backward()

    xo = local(x).clone().requires_grad_()
    with CommMeter() as meter:
        yo = ours(xo)
        (yo * local(w)).sum().backward()
        sync_tp_grads(ours, tp)
    ours_ops = meter.counts()
    out = {
        "out_ours_vs_dense": max_over_ranks((yo - local(yd)).abs().max().item(), DEVICE),
        "input_grad_ours_vs_dense": max_over_ranks((xo.grad - local(xd.grad)).abs().max().item(), DEVICE),
        "grad_ours_vs_dense": max_over_ranks(max(grad_diffs(dense, ours, rank, T).values()), DEVICE),
        "ours_comm": ours_ops,
    }
    if not with_dtensor:
        return out

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    dtensor_parallelize_block(dt_block, init_device_mesh(DEVICE.type, (T,)), sp)
    xt = local(x).clone().requires_grad_()
    with CommDebugMode() as comm:
        yt = dt_block(xt)
        yt = yt.to_local() if hasattr(yt, "to_local") else yt
        (yt * local(w)).sum().backward()
    out.update({
        "out_dtensor_vs_dense": max_over_ranks((yt - local(yd)).abs().max().item(), DEVICE),
        "out_ours_vs_dtensor": max_over_ranks((yo - yt).abs().max().item(), DEVICE),
        "input_grad_ours_vs_dtensor": max_over_ranks((xo.grad - xt.grad).abs().max().item(), DEVICE),
        "grad_ours_vs_dtensor": max_over_ranks(max(grad_diffs(dt_block, ours, rank, T).values()), DEVICE),
        "dtensor_comm": _comm_counts(comm),
    })
    return out


# ----------------------------------------------------------------------------------------------
# 5. the step's time against compute + α-β collectives (issue 28)
# ----------------------------------------------------------------------------------------------

def sweep_sizes(records: list[CommRecord]) -> list[int]:
    """The all-reduce sizes that measure α and β for a step's collectives: the smallest and the
    largest it issues, and 8× the largest (so the fit has a slope)."""
    sizes = sorted({max(8, r.payload_bytes // 8 * 8) for r in records} | {1 << 10})
    return sorted({sizes[0], sizes[-1], 8 * sizes[-1]})


def comm_prediction(records: list[CommRecord], alpha: float, beta: float, backend: str) -> list[float]:
    """Seconds of each of a step's collectives in the α-β model: each counted collective (op,
    bytes, ranks) at ``collective_time``; gloo runs a reduce-scatter as an all-reduce of a copy."""
    return [collective_time("all_reduce" if r.op == "reduce_scatter" and backend == "gloo" else r.op,
                            r.payload_bytes, r.world, alpha, beta) for r in records]


def alone_seconds(records: list[CommRecord], dtype: torch.dtype) -> list[float]:
    """Seconds each of a step's collectives (``records``: op, bytes, ranks) takes alone, outside
    the step (:func:`~distai.engine.time_causes.collective_alone`, the same op on buffers of the
    same bytes, the threads' wait for a core apart; the median of 3 timings per distinct
    collective). Every rank calls it with the same records."""
    elem = torch.empty((), dtype=dtype).element_size()
    took: dict[tuple[str, int], float] = {}
    for r in records:
        key = (r.op, r.payload_bytes)
        if key in took:
            continue
        full = torch.zeros(max(r.world, r.payload_bytes // elem // r.world * r.world), dtype=dtype, device=DEVICE)
        part = torch.zeros(full.numel() // r.world, dtype=dtype, device=DEVICE)

        def op(r=r, full=full, part=part) -> None:
            if r.op == "all_gather":
                all_gather_into(full, part)
            elif r.op == "reduce_scatter":
                reduce_scatter_into(part, full)
            else:
                dist.all_reduce(full)
            device_sync(DEVICE)

        took[key] = collective_alone(op, repeats=3, device=DEVICE, run_queue_apart=True)
    return [took[(r.op, r.payload_bytes)] for r in records]


def time_steps(cfg: GPTConfig, batch: int, sp: bool, steps: int, records: list[CommRecord], backend: str,
               seed: int = 0, regather: bool = True, dtype: torch.dtype = torch.float64) -> dict:
    """``steps`` tensor-parallel training steps (forward, backward, gradient sync), each started at
    a barrier, against their compute + α-β collectives (``records``: the collectives of one step).
    Measured: the steps' wall time on this rank, its on-CPU time outside the collectives (compute
    and Python: the prediction's compute), its run-queue delay and in each collective the longest
    any rank's threads had (CPU contention, ``time_causes.step_contention``: gloo's threads do a
    collective's work), and at each collective the wait for the last peer. After each step,
    all-reduces of the step's sizes timed alone, their contention apart: α and β measured in the same
    minutes; and each of the step's collectives timed the same way (:func:`alone_seconds`): beyond
    α-β, the collectives' slowness, measured apart from the step."""
    tp = TPGroup(sequence_parallel=sp, regather=regather)
    model = apply_tp(GPT(cfg, seed=seed, dtype=dtype, device=DEVICE), tp)
    model.set_masks(DropoutMasks(cfg.dropout, seed=seed))
    ids, targets = make_batch(cfg, batch, seed, 0, device=DEVICE)
    window, spans, rows, alone = Window(), [], [], 0.0
    for step in range(steps + 1):  # the first one warms up
        model.zero_grad(set_to_none=True)
        tp.spans = []
        if dist.is_initialized():
            dist.barrier()
        with window if step else contextlib.nullcontext():
            model(ids, targets).backward()
            sync_tp_grads(model, tp)
            device_sync(DEVICE)
        if step:
            spans.append(tp.spans)
            rows += group_allreduce_times(sweep_sizes(records), repeats=3, device_type=DEVICE.type, contention_apart=True)
            alone += sum(alone_seconds(records, dtype))
    alpha, beta = fit_alpha_beta(rows, tp.size)
    expected = comm_prediction(records, alpha, beta, backend)
    waited, in_comm, waits, contention, slow = 0.0, 0.0, [], window.run_queue_s, 0.0
    for step_spans in spans:
        found = collective_causes(step_spans, expected)
        waited += sum(found["peer_wait"])
        slow += sum(found["slow"])  # in the step, beyond α-β, its waits for a peer and a core apart
        in_comm += sum(found["on_cpu"])  # the collectives' own CPU time is in their α-β time
        waits += found["peer_wait"]
        contention = step_contention(contention, step_spans, found["contention"])
    return {"trace": (window.blocks, [s for step_spans in spans for s in step_spans], waits),
            "wall_s": window.wall_s / steps, "cpu_s": (window.cpu_s - in_comm) / steps, "comm_s": sum(expected),
            "alpha": alpha, "beta": beta, "run_queue_s": contention / steps,
            "peer_wait_s": waited / steps, "slow_collective_s": alone / steps - sum(expected),
            "slower_in_step_s": (slow - alone) / steps + sum(expected),
            "alone_s": alone / steps, "collectives": len(expected)}


def step_time_check(mode: str, timed: dict) -> Check:
    """The step's time on the slowest rank against its compute (on-CPU time) + its collectives in
    the α-β model; the causes: CPU contention (run-queue delay), waiting for a peer, collectives
    slower than α-β (the same collectives timed alone, :func:`alone_seconds`) and slower still in
    the step than alone (their spans in the step, the waits for a peer and a core apart)."""
    everyone: list = [timed]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, timed)
    rank = max(range(len(everyone)), key=lambda r: everyone[r]["wall_s"])
    t = everyone[rank]
    return check(f"{mode.replace('+', '_')}_step_time", t["cpu_s"] + t["comm_s"], t["wall_s"], "s",
                 causes={"cpu_contention": t["run_queue_s"], "peer_wait": t["peer_wait_s"],
                         "slow_collective": t["slow_collective_s"], "slower_in_step": t["slower_in_step_s"]},
                 detail={"compute_s": t["cpu_s"], "comm_s": t["comm_s"], "alone_s": t["alone_s"], "alpha_s": t["alpha"],
                         "beta_s_per_byte": t["beta"], "collectives": t["collectives"], "rank": rank})


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

def verdict(summary: dict, lang: str | None = None) -> list[str]:
    """The run in at most six short lines (what a live view shows last), in the learner's language."""
    lang = lang or run_language()
    say, e, b = summary_lines("lesson4", lang), lambda x: format_number(x, 2, lang), lambda n: _fmt_bytes(n, lang)
    sep = number_separator(lang)
    T, rows, vocab = summary["T"], summary["modes"], summary["vocab"]
    modes = list(rows)
    ok = lambda b: "✓" if b else "✗"  # noqa: E731
    out = [say("verdict", T=T, seconds=format_fixed(summary["seconds"], 1, lang))]
    out.append(say("verdict_dense", modes=sep.join(
        say("verdict_dense_mode", mode=m, diff=e(rows[m]["max_grad_diff"]), ok=ok(rows[m]["max_grad_diff"] < FLOAT64_EQUAL))
        for m in modes)))
    out.append(say("verdict_comm", modes=sep.join(
        say("verdict_comm_mode", mode=m, size=b(rows[m]["comm_layer0"]["fwd"]["wire_bytes"]), ok=ok(rows[m]["comm_match"]),
            regather=say("verdict_regather", size=b(rows[m]["comm_layer0"]["bwd"]["regather_wire_bytes"]))
            if rows[m]["comm_layer0"]["bwd"].get("regather_count") else "")
        for m in modes)))
    out.append(say("verdict_memory", modes=sep.join(
        f"{m} {b(rows[m]['memory_measured'])} "
        f"{ok(rows[m]['memory_measured'] == rows[m]['memory_formula'] + rows[m]['memory_ln_stats'])}"
        for m in modes)))
    v = rows[modes[0]]["vocab"]
    out.append(say("verdict_vocab", width=v["logits_width"], vocab=vocab, sent=b(v["ce_wire_bytes"]),
                   instead=b(v["gather_logits_wire_bytes"])))
    extra = []
    if "forgotten_g" in summary:
        extra.append(say("verdict_forgotten_g", diff=e(summary["forgotten_g"]["bug"])))
    if "tp+sp" in rows and rows["tp+sp"].get("sp_grads_unsynced_diff") is not None:
        extra.append(say("verdict_sp_bug", diff=e(rows["tp+sp"]["sp_grads_unsynced_diff"])))
    if summary.get("dtensor"):
        worst = max(max(d["out_ours_vs_dtensor"], d["grad_ours_vs_dtensor"]) for d in summary["dtensor"].values())
        extra.append(f"= DTensor {format_number(worst, 1, lang)} {ok(worst < FLOAT64_EQUAL)}")
    if extra:
        out.append("  " + "; ".join(extra))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run lesson4")
    add_model_options(p, DEFAULT_MODEL, ("hidden", "heads", "layers", "vocab", "seq", "ffn", "dropout"))
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="tp,tp+sp")
    p.add_argument("--check-steps", type=int, default=5)
    p.add_argument("--no-regather", dest="regather", action="store_false")
    p.add_argument("--no-dtensor", dest="dtensor", action="store_false")
    return p


def _fmt_bytes(n: float, lang: str = "en") -> str:
    return format_bytes(n, binary=True, lang=lang)


def main(argv: list[str] | None = None) -> int:
    return run_experiment("lesson4", build_parser().parse_args, run, argv, usage_errors=(UsageError, ModelConfigError),
                          check=check_modes)


def check_modes(args: argparse.Namespace) -> list[str]:
    """The modes asked for, or a UsageError (before the launch, and on every rank)."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError.keyed("mode", mode=repr(bad[0]), choices=", ".join(MODES))
    if args.check_steps < 1:
        raise UsageError.keyed("check_steps")
    cfg = ModelSize.from_args(args, DEFAULT_MODEL)
    for m in modes:  # the group's size against the shape, before any rank joins it (`--cpu 3`: 8 heads)
        cfg.check_tp(launch_world_size(), MODES[m])
    return modes


def _run_mode(ev, cfg: GPTConfig, args: argparse.Namespace, mode: str, T: int, progress: Progress) -> dict:
    """One mode (tp or tp+sp): training against dense, its collectives, its activation memory and
    its vocabulary-parallel loss; emits their events, returns its row (the summary's, which the
    report's lines are written from)."""
    sp = MODES[mode]
    PHASE.emit(ev, {"name": f"{mode}: training against the dense model"})
    tr = train_against_dense(cfg, args.micro_batch, sp, args.steps, args.lr, args.seed,
                             regather=args.regather, events=ev, mode=mode)
    cc = comm_check(tr["meter"], cfg, args.micro_batch, sp, T, tr["elem_size"], args.regather)
    for r in tr["meter"].records:
        COMM.emit(ev, {"mode": mode, "layer": r.layer, "phase": r.phase, "op": r.op, "site": r.site, "count": 1,
                       "wire_bytes": r.wire_bytes, "payload_bytes": r.payload_bytes})
    COMM_CHECK.emit(ev, {"mode": mode, "layers": cc["layers"], "formula": cc["formula"], "match": cc["match"]})
    step_check = _check_step_time(ev, cfg, args, mode, tr["meter"].records)
    progress()
    PHASE.emit(ev, {"name": f"{mode}: activation memory"})
    mem = measure_activations(cfg, args.micro_batch, sp, args.seed, args.regather)
    for layer, measured in mem["per_layer"].items():
        MEMORY.emit(ev, {"mode": mode, "layer": layer, "measured_bytes": measured,
                         "formula_bytes": mem["formula_bytes"], "ln_stats_bytes": mem["ln_stats_bytes"]})
    progress()
    head = tr["meter"].of("head", "fwd", sites=("ce.max", "ce.target", "ce.sumexp"))
    vocab = {"logits_width": tr["max_logits_width"], "vocab": cfg.vocab,
             "ce_allreduce_count": len(head), "ce_wire_bytes": sum(r.wire_bytes for r in head),
             "gather_logits_wire_bytes": (T - 1) / T * cfg.seq * args.micro_batch * cfg.vocab * tr["elem_size"]}
    VOCAB.emit_fields(ev, {"mode": mode, **vocab})
    row = {"losses": tr["losses"], "dense_losses": tr["dense_losses"],
           "max_grad_diff": max(tr["max_grad_diff"]), "comm_match": cc["match"],
           "comm_layer0": cc["layers"]["0"], "formula": cc["formula"],
           "memory_measured": mem["per_layer"]["0"], "memory_formula": mem["formula_bytes"],
           "memory_ln_stats": mem["ln_stats_bytes"], "vocab": vocab, "step_check": step_check.event()}
    if sp and T > 1:
        PITFALL.emit(ev, {"name": "sp-layernorm-grads", "max_diff": tr["sp_grads_unsynced_diff"],
                          "fixed_diff": max(tr["max_grad_diff"])})
        row["sp_grads_unsynced_diff"] = tr["sp_grads_unsynced_diff"]
    return row


def _check_step_time(ev, cfg: GPTConfig, args: argparse.Namespace, mode: str, records: list[CommRecord]) -> Check:
    """Time ``--check-steps`` steps and check them against compute + α-β collectives (rank 0
    emits the ``check``)."""
    PHASE.emit(ev, {"name": f"{mode}: step time against compute + collectives"})
    backend = str(dist.get_backend()) if dist.is_initialized() else ""
    timed = time_steps(cfg, args.micro_batch, MODES[mode], args.check_steps, records, backend, args.seed,
                       args.regather)
    blocks, spans, waits = timed.pop("trace")
    found = step_time_check(mode, timed)
    trace_causes(ev, blocks, spans, waits, names=[r.op for r in records] * args.check_steps, check=found.name)
    if not dist.is_initialized() or dist.get_rank() == 0:
        CHECK.emit_fields(ev, found.event())
    return found


def _mode_lines(mode: str, T: int, steps: int, row: dict, lang: str | None = None) -> list[str]:
    """The report of one mode from its summary row (:func:`_run_mode`): losses, layer 0's collectives
    against the formula, memory, vocab."""
    lang = lang or run_language()
    say, e, b = summary_lines("lesson4", lang), lambda x: format_number(x, 2, lang), lambda n: _fmt_bytes(n, lang)
    loss = lambda x: format_fixed(x, 6, lang)  # noqa: E731
    l0, vocab = row["comm_layer0"], row["vocab"]
    lines: list[str] = []
    lines.append("\n" + say("mode_loss", mode=mode, tp=loss(row["losses"][0]), dense=loss(row["dense_losses"][0]),
                               steps=steps, tp_last=loss(row["losses"][-1]), dense_last=loss(row["dense_losses"][-1]),
                               diff=e(row["max_grad_diff"])))
    for ph in ("fwd", "bwd"):
        c = l0[ph]
        got = number_separator(lang).join(f"{v} {k}" for k, v in c["counts"].items() if v) or say("none")
        want = number_separator(lang).join(f"{v} {k}" for k, v in c["formula_counts"].items() if v) or say("none")
        extra = say("regather", n=c["regather_count"], size=b(c["regather_wire_bytes"]),
                    formula=b(c["formula_regather_wire_bytes"])) if c["regather_count"] else ""
        lines.append(say("layer0", phase=ph, got=got, size=b(c["wire_bytes"]), want=want,
                         formula=b(c["formula_wire_bytes"]), extra=extra))
    if l0["grad-sync"]["count"]:
        lines.append(say("grad_sync", n=l0["grad-sync"]["count"], size=b(l0["grad-sync"]["payload_bytes"])))
    lines.append(say("activations", measured=b(row["memory_measured"]), formula=b(row["memory_formula"]),
                     ln=b(row["memory_ln_stats"])))
    lines.append(say("vocab", width=vocab["logits_width"], V=vocab["vocab"], n=vocab["ce_allreduce_count"],
                     size=b(vocab["ce_wire_bytes"]), gather=b(vocab["gather_logits_wire_bytes"])))
    if MODES[mode] and T > 1:
        lines.append(say("sp_bug", diff=format_number(row["sp_grads_unsynced_diff"], 3, lang)))
    return lines


def summary_from_event(summary: dict, lang: str | None = None) -> str:
    """Rank 0's printed report from its summary event alone (``distai runs show`` writes it again in
    another language), in ``lang`` (else the run's): the run's shape, each mode's lines, the pitfall
    and DTensor lines, then the verdict."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(**{k: summary[k] for k in ("hidden", "heads", "seq", "layers", "vocab")})
    T = summary["T"]
    lines = [head_line(T, summary["backend"], cfg, summary["micro_batch"], lang)]
    for mode, row in summary["modes"].items():
        lines += _mode_lines(mode, T, summary["steps"], row, lang)
    if "forgotten_g" in summary:
        lines.append(forgotten_g_line(summary["forgotten_g"], lang))
    lines += [dtensor_line(mode, cmp, lang) for mode, cmp in summary.get("dtensor", {}).items()]
    return "\n".join(lines) + "\n\n" + "\n".join(verdict(summary, lang))


def head_line(T: int, backend: str, cfg, micro_batch: int, lang: str | None = None) -> str:
    return summary_lines("lesson4", lang or run_language())(
        "head", T=T, backend=backend, h=cfg.hidden, a=cfg.heads, s=cfg.seq, b=micro_batch, L=cfg.layers, V=cfg.vocab)


def forgotten_g_line(fg: dict, lang: str | None = None) -> str:
    lang = lang or run_language()
    return "\n" + summary_lines("lesson4", lang)("forgotten_g", bug=format_number(fg["bug"], 4, lang),
                                                 fixed=format_number(fg["fixed"], 2, lang))


def dtensor_line(mode: str, cmp: dict, lang: str | None = None) -> str:
    lang = lang or run_language()
    e = lambda x: format_number(x, 2, lang)  # noqa: E731
    return summary_lines("lesson4", lang)("dtensor", mode=mode, out=e(cmp["out_ours_vs_dtensor"]),
                                          grads=e(cmp["grad_ours_vs_dtensor"]), dense=e(cmp["out_ours_vs_dense"]),
                                          ours=_counts(cmp["ours_comm"], lang), theirs=_counts(cmp["dtensor_comm"], lang))


def _counts(calls: dict, lang: str) -> str:
    """``{'all_reduce': 4, 'all_gather': 2}`` as the lines above it write counts: ``4 all_reduce, 2 all_gather``."""
    return ", ".join(f"{format_integer(n, lang)} {op}" for op, n in sorted(calls.items())) or "0"


def run(ctx, args: argparse.Namespace) -> dict:
    global DEVICE
    DEVICE = ctx.device
    ev, T, rank = ctx.events, ctx.world_size, ctx.rank
    torch.set_num_threads(1) if ctx.device.type == "cpu" and T > 1 else None
    modes = check_modes(args)
    cfg = ModelSize.from_args(args, DEFAULT_MODEL)

    t0 = time.time()
    progress = Progress(ctx, 2 * len(modes) + (1 if T > 1 else 0) + (len(modes) if args.dtensor else 0))

    CONFIG.emit(ev, {"T": T, "hidden": cfg.hidden, "heads": cfg.heads, "ffn": cfg.ffn_size, "seq": cfg.seq,
                     "micro_batch": args.micro_batch, "layers": cfg.layers, "vocab": cfg.vocab, "dropout": cfg.dropout,
                     "modes": modes, "regather": args.regather, "backend": ctx.backend})
    # what the printed report says of the run besides its modes: runs show writes it again from this event
    summary: dict = {"T": T, "modes": {}, "backend": ctx.backend, "micro_batch": args.micro_batch, "steps": args.steps,
                     **{k: getattr(cfg, k) for k in ("hidden", "heads", "seq", "layers", "vocab")}}
    for mode in modes:
        summary["modes"][mode] = _run_mode(ev, cfg, args, mode, T, progress)
    if T > 1:
        fg = forgotten_g(cfg, args.micro_batch, args.seed)
        PITFALL.emit(ev, {"name": "forgotten-g", "max_diff": fg["bug"], "fixed_diff": fg["fixed"]})
        progress()
        summary["forgotten_g"] = fg
    if args.dtensor:
        summary["dtensor"] = {}
        for mode in modes:
            PHASE.emit(ev, {"name": f"{mode}: DTensor comparison"})
            cmp = compare_with_dtensor(cfg, args.micro_batch, MODES[mode], args.seed)
            DTENSOR.emit_fields(ev, {"mode": mode, **cmp})
            progress()
            summary["dtensor"][mode] = cmp
    summary["seconds"] = time.time() - t0
    if rank == 0:
        print(summary_from_event(summary))
    return summary


if __name__ == "__main__":
    exit_with(main)
