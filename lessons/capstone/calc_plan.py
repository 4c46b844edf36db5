"""``distai calc plan``: the parallelism planner, every (tp, cp, pp, dp, ep, SP, microbatch, ZeRO,
recompute, chunks) ranked by predicted step time (the capstone's :mod:`.planner`)."""
from __future__ import annotations

import math

from .. import units
from ..calculator import CalcError, Calculator, Option, labels
from ..lesson5.formulas import ENGINE_NAMES, ENGINES
from . import calibrated
from . import planner as pl

RECOMPUTE_CHOICES = ("any",) + pl.RECOMPUTE


def _kind(reason: str) -> str:
    """A short label for a rejection, to group them in the text."""
    for key, label in (("Schedule1F1B", "schedule"), ("attention heads", "heads"), ("KV heads", "kv-heads"), ("hidden size", "hidden"),
                       ("vocabulary", "vocab"), ("sequence length", "seq"), ("node", "node"),
                       ("layers", "layers"), ("global batch", "batch"), ("ZeRO", "zero"), ("chunks", "chunks"),
                       ("interleaved", "chunks"), ("per GPU, more than the usable", "memory")):
        if key in reason:
            return label
    return "other"


def _finite(value, where: str = "result") -> None:
    """CalcError when a number of the result is not finite: ``--json`` stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError(f"the {where} came out as {value} (inputs out of range: check --flops, the bandwidths "
                        "and the sizes)")
    if isinstance(value, dict):
        for key, item in value.items():
            _finite(item, key)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _finite(item, where)


def _axes(v: dict) -> pl.Axes:
    recompute = pl.RECOMPUTE if v["recompute"] == "any" else (v["recompute"],)
    sp = {"any": pl.SEQUENCE_PARALLEL, "on": (True,), "off": (False,)}[v["sp"]]
    cp = v["cp"] if v["cp"] is not None else (None if v["max_cp"] > 1 else 1)
    ep = v["ep"] if v["ep"] is not None else (None if v["experts"] else 1)
    max_cp = 0 if v["cp"] is not None else v["max_cp"]  # a fixed --cp is not capped by --max-cp's default 1
    return pl.Axes(tp=v["tp"], pp=v["pp"], dp=v["dp"], cp=cp, ep=ep, max_cp=max_cp,
                   microbatches=(v["microbatch"],) if v["microbatch"] else pl.MICROBATCHES,
                   zero=tuple(range(v["max_zero"] + 1)), max_zero_pp=min(v["max_zero_pp"], v["max_zero"]),
                   recompute=recompute, chunks=tuple(c for c in pl.CHUNKS if c <= v["max_chunks"]), sp=sp,
                   engine=v["engine"])


#: what the planner needs unless --calibrate predicts the capstone run (whose sizes have defaults)
NEEDED = ("params", "layers", "hidden", "heads", "seq", "global_batch", "gpus", "gpu_mem")


def compute(v: dict) -> dict:
    if v["calibrate"]:  # the profile distai.engine.calibrate measured: the capstone run on this machine
        return calibrated.compute(v["calibrate"])
    missing = [f"--{k.replace('_', '-')}" for k in NEEDED if v[k] is None]
    if missing:
        raise CalcError(f"{', '.join(missing)} needed (or --calibrate: the capstone run on this machine)")
    kv_heads = v["kv_heads"] or v["heads"]
    if v["heads"] % kv_heads:
        raise CalcError(f"--heads {v['heads']} is not a multiple of --kv-heads {kv_heads}")
    if v["hidden"] % v["heads"]:
        raise CalcError(f"--hidden {v['hidden']} is not a multiple of --heads {v['heads']}")
    if v["efficiency"] is not None and not 0 < v["efficiency"] <= 1:
        raise CalcError(f"--efficiency: must be in (0, 1], got {v['efficiency']:g}")
    if not 0 < v["gemm_efficiency"] <= 1:
        raise CalcError(f"--gemm-efficiency: must be in (0, 1], got {v['gemm_efficiency']:g}")
    if not 0 < v["memory_util"] <= 1:
        raise CalcError(f"--memory-util: must be in (0, 1], got {v['memory_util']:g}")
    if bool(v["experts"]) != bool(v["top_k"]) or bool(v["experts"]) != bool(v["ffn"]):
        raise CalcError("a mixture of experts needs --experts, --top-k and --ffn (one expert's width) together")
    if v["experts"] and v["top_k"] > v["experts"]:
        raise CalcError(f"--top-k {v['top_k']} is more than the {v['experts']} experts")
    model = pl.ModelSpec(params=v["params"], layers=v["layers"], hidden=v["hidden"], heads=v["heads"],
                         kv_heads=kv_heads, seq=v["seq"], vocab=v["vocab"] or 0, experts=v["experts"] or 0,
                         top_k=v["top_k"] or 0, expert_ffn=v["ffn"] or 0, shared_experts=v["shared_experts"])
    cluster = pl.Cluster(gpus=v["gpus"], gpu_memory=v["gpu_mem"], gpus_per_node=v["gpus_per_node"],
                         flops=v["flops"], intra_bandwidth=v["intra_bw"], inter_bandwidth=v["inter_bw"],
                         alpha=v["alpha"], inter_alpha=v["inter_alpha"], efficiency=v["efficiency"],
                         memory_util=v["memory_util"], tp_across_nodes=bool(v["tp_across_nodes"]),
                         hbm_bandwidth=v["hbm_bw"], gemm_peak_fraction=v["gemm_efficiency"],
                         flash_attention=v["flash_attention"] == "on")
    try:
        r = pl.plan(model, cluster, v["global_batch"], axes=_axes(v))
    except ValueError as exc:
        raise CalcError(str(exc)) from None
    if not r["configs"]:
        raise CalcError(r["obstacle"])
    configs = [c.as_dict() for c in r["configs"]]
    rejected = [dict(c.rejected_dict(), kind=_kind(c.reason), memory_bytes=c.memory_bytes or None)
                for c in r["rejected"]]
    inputs = {"params": model.params, "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
              "kv_heads": model.kv_heads, "seq": model.seq, "vocab": model.vocab, "global_batch": v["global_batch"],
              "experts": model.experts, "top_k": model.top_k, "expert_ffn": model.expert_ffn,
              "shared_experts": model.shared_experts, "active_params": model.active_params,
              "gpus": cluster.gpus, "gpu_memory_bytes": cluster.gpu_memory, "gpus_per_node": cluster.gpus_per_node,
              "flops": cluster.flops, "intra_bandwidth_bytes_per_s": cluster.intra_bandwidth,
              "inter_bandwidth_bytes_per_s": cluster.inter_bandwidth, "alpha_s": cluster.alpha,
              "inter_alpha_s": cluster.inter_alpha, "efficiency": cluster.efficiency,
              "hbm_bandwidth_bytes_per_s": cluster.hbm_bandwidth, "gemm_efficiency": cluster.gemm_peak_fraction,
              "gemm_half_width": cluster.gemm_half_width, "flash_attention": cluster.flash_attention,
              "memory_util": cluster.memory_util, "tp_across_nodes": cluster.tp_across_nodes,
              "max_zero": v["max_zero"], "max_zero_pp": v["max_zero_pp"], "recompute": v["recompute"],
              "sp": v["sp"], "engine": v["engine"], "top": v["top"]}
    out = {"best": configs[0], "configs": configs, "rejected": rejected, "inputs": inputs}
    _finite(out)
    return out


def _memory_line(m: dict, say, lang: str) -> str:
    b = lambda n: units.format_bytes(n, lang=lang)  # noqa: E731
    return say("memory_terms", params=b(m["params_bytes"]), grads=b(m["grad_buffer_bytes"]),
               optimizer=b(m["optimizer_bytes"]), activations=b(m["activations_bytes"]), logits=b(m["logits_bytes"]),
               comm=b(m["comm_buffers_bytes"]), allocator=b(m["allocator_bytes"]))


def text(r: dict, lang: str = "en") -> list[str]:
    if "calibrated" in r:
        return calibrated.text(r, lang)
    i, say = r["inputs"], labels("plan", lang)
    pct = lambda x: units.format_percent(x, lang=lang)  # noqa: E731
    t = lambda s: units.format_time(s, lang=lang)  # noqa: E731
    by = lambda n: units.format_bytes(n, lang=lang)  # noqa: E731
    whole = lambda n: units.format_integer(n, lang)  # noqa: E731
    recompute = lambda name: say(f"recompute_{name}")  # noqa: E731
    node = say("tp_across") if i["tp_across_nodes"] else say("tp_inside", n=i["gpus_per_node"])
    speed = (say("fixed_efficiency", efficiency=units.format_number(i["efficiency"], lang=lang))
             if i["efficiency"] is not None else
             say("gemm_speed", gemm=pct(i["gemm_efficiency"]), hbm=units.format_bandwidth(i["hbm_bandwidth_bytes_per_s"], lang=lang))
             + (say("flash") if i["flash_attention"] else ""))
    moe = (say("moe", experts=i["experts"], top_k=i["top_k"], active=units.format_count(i["active_params"], lang=lang))
           if i["experts"] else "")
    cols = [say(f"columns.{c}") for c in ("recompute", "memory", "step", "bubble")]
    lines = [
        say("head", params=units.format_count(i["params"], lang=lang), layers=i["layers"], hidden=i["hidden"],
            heads=i["heads"], kv_heads=i["kv_heads"], moe=moe),
        say("shape", seq=whole(i["seq"]), batch=whole(i["global_batch"]), gpus=whole(i["gpus"]),
            memory=by(i["gpu_memory_bytes"])),
        say("hardware", flops=units.format_count(i["flops"], lang=lang), speed=speed,
            nvlink=units.format_bandwidth(i["intra_bandwidth_bytes_per_s"], lang=lang),
            between=units.format_bandwidth(i["inter_bandwidth_bytes_per_s"], lang=lang)),
        node + say("engine", engine=ENGINE_NAMES[i["engine"]]),
        "",
        f"  {'#':>3}  {'TP':>3} {'CP':>3} {'PP':>3} {'DP':>5} {'EP':>3} {'SP':>2} {'mb':>3} {'ZeRO':>4} "
        f"{cols[0]:<9} {'v':>2} {cols[1]:>9} {cols[2]:>9} {'MFU':>6} {cols[3]:>6}",
    ]
    for n, c in enumerate(r["configs"][:i["top"]], 1):
        lines.append(f"  {n:>3}  {c['tp']:>3} {c['cp']:>3} {c['pp']:>3} {c['dp']:>5} {c['ep']:>3} "
                     f"{say('sp_on') if c['sp'] else '-':>2} {c['microbatch']:>3} {c['zero']:>4} "
                     f"{recompute(c['recompute']):<9} {c['chunks']:>2} {by(c['memory_bytes']):>9} "
                     f"{t(c['step_time_s']):>9} {pct(c['mfu']):>6} {pct(c['bubble_fraction']):>6}")
    more = len(r["configs"]) - i["top"]
    if more > 0:
        lines.append(say("more", n=whole(more)))
    b, bt = r["best"], r["best"]["time"]
    lines += ["", say("best", tp=b["tp"], cp=b["cp"], pp=b["pp"], dp=b["dp"], ep=b["ep"], mb=b["microbatch"],
                      m=b["microbatches"]),
              say("best_zero", zero=b["zero"], recompute=recompute(b["recompute"]),
                  sp=say("sp") if b["sp"] else "", chunks=say("chunks", n=b["chunks"]) if b["chunks"] > 1 else ""),
              say("best_step", step=t(b["step_time_s"]), compute=t(bt["compute_s"]), gemm=pct(bt["gemm_efficiency"]),
                  tp=t(bt["tp_comm_s"]), cp=t(bt["cp_comm_s"]), pp=t(bt["pp_comm_s"]), bubble=t(bt["bubble_s"]),
                  dp=t(bt["dp_comm_exposed_s"])),
              _memory_line(b["memory"], say, lang),
              say("memory_total", memory=by(b["memory_bytes"]), usable=by(b["memory"]["usable_bytes"]))]
    if r["rejected"]:
        groups: dict[str, list[dict]] = {}
        for c in r["rejected"]:
            groups.setdefault(c["kind"], []).append(c)
        lines += ["", say("rejected", n=whole(len(r["rejected"])))]
        for kind, items in groups.items():
            # the nearest miss for memory, else the first of its kind
            example = min(items, key=lambda c: c["memory_bytes"]) if kind == "memory" else items[0]
            lines.append(f"  {len(items):>5} × {example['reason']}" + (" …" if len(items) > 1 else ""))
    return lines


def _bandwidth(flag: str, help: str, default) -> Option:
    return Option(flag, "bandwidth", help, default=default, minimum=0, strict_min=True)


CALCULATOR = Calculator(
    name="plan",
    help="""Parallelism planner over five axes: every (tp, cp, pp, dp, ep, sequence parallelism, microbatch, ZeRO stage, recompute, chunks) ranked by predicted step time.

    Memory per GPU, term by term: bf16 parameters, the fp32 gradient buffer, the optimizer (each sharded
    by ZeRO over dp·cp), lesson 2's Korthikanti activations times lesson 5's microbatches in flight, the
    last stage's fp32 logits, communication buffers, and an allocator allowance (2 GB of CUDA context and
    NCCL, plus 5%). Step time: each layer on one GPU from its GEMMs (at E / (1 + w½·(t/h + cp/(b·s))) of
    peak), its attention core and its memory-bound kernels (HBM bandwidth), + lesson 4's TP collectives,
    CP's K/V all-gathers and PP sends, stretched by lesson 5's bubble, + the data-parallel reduction the
    backward does not hide (lesson 1's α-β ring). E and w½ were fitted on Megatron-LM's Table 1 (A100)
    and Llama 3's 8,192-GPU run (H100), and checked on held-out runs (the capstone lesson). TP stays inside
    a node unless --tp-across-nodes. The pipeline schedules are those --engine runs (lesson 5's rule:
    Megatron-LM's interleaved schedule needs m a multiple of PP; torch.distributed.pipelining's also runs
    m < PP, whose step takes PP + (m-1)/v microbatch slots). Impossible shapes and non-finite results are a
    one-line error.

    JSON keys: best (the first configuration), configs (feasible, best first), rejected (each with tp,
    pp, dp, cp, ep, sp, microbatch, zero, recompute, chunks, reason, kind, memory_bytes; values a rejection
    left undecided are null), inputs. A configuration has tp, pp, dp, cp, ep, sp, microbatch, zero,
    recompute, chunks (interleaved model chunks per stage), microbatches (per pipeline and step),
    memory_bytes (the busiest GPU), memory (params_bytes, grad_buffer_bytes, optimizer_bytes,
    model_states_bytes, activations_bytes, logits_bytes, comm_buffers_bytes, allocator_bytes,
    first_stage_bytes, last_stage_bytes, microbatches_in_flight, usable_bytes), step_time_s, time
    (compute_s, tp_comm_s, cp_comm_s, pp_comm_s, bubble_s, dp_comm_exposed_s, gemm_efficiency,
    tp/cp/pp/dp_over_nodes), bubble_fraction, mfu (model FLOPs 6Ψ + 12·L·h·s per token over peak, Ψ the
    active parameters), tokens_per_s, reason (empty).
    """,
    options=(
        Option("--params", "count", "Parameters Ψ of the model (70B).", minimum=0, strict_min=True, default=None),
        Option("--layers", "whole", "Transformer layers L.", default=None),
        Option("--hidden", "whole", "Hidden size h.", default=None),
        Option("--heads", "whole", "Attention heads a.", default=None),
        Option("--kv-heads", "whole", "Key/value heads (GQA; default: --heads).", default=None),
        Option("--seq", "whole", "Sequence length s in tokens.", default=None),
        Option("--global-batch", "whole", "Sequences per optimizer step.", default=None),
        Option("--gpus", "whole", "GPUs to split into TP × PP × DP.", maximum=1 << 20, default=None),
        Option("--gpu-mem", "bytes", "Memory per GPU (80GB).", minimum=0, strict_min=True, default=None),
        Option("--gpus-per-node", "whole", "GPUs per node sharing NVLink (default 8).", default="8"),
        Option("--flops", "flops", "Peak dense bf16 FLOP/s per GPU (default 989e12: H100 SXM).", default="989e12",
               minimum=0, strict_min=True),
        _bandwidth("--intra-bw", "NVLink bandwidth per GPU and direction (default 450e9 B/s: H100).", "450e9"),
        _bandwidth("--inter-bw", "Network bandwidth per GPU between nodes (default 50e9 B/s = 400 Gb/s).", "50e9"),
        Option("--alpha", "time", "Latency per message inside a node (default 5us).", default="5us", minimum=0),
        Option("--inter-alpha", "time", "Latency per message between nodes (default 10us).", default="10us",
               minimum=0),
        Option("--hbm-bw", "bandwidth", "GPU memory bandwidth (default 3.35e12 B/s: H100 SXM).", default="3.35e12",
               minimum=0, strict_min=True),
        Option("--gemm-efficiency", "number", f"E: the best fraction of peak a GEMM reaches (default {pl.H100_GEMM:g}, "
               f"fitted on Llama 3's H100 run; A100: {pl.A100_GEMM:g}).", default=f"{pl.H100_GEMM:g}"),
        Option("--flash-attention", "choice", "on or off (default on).", default="on", choices=("on", "off")),
        Option("--efficiency", "number", "A fixed fraction of peak for every layer instead of the shape-aware "
               "model (default: the model).", default=None),
        Option("--memory-util", "number", "Share of GPU memory the job may use (default 1: the allowances "
               "are counted).", default="1"),
        Option("--vocab", "whole", "Vocabulary size: adds the last stage's fp32 logits (default: left out).",
               default=None),
        Option("--tp", "whole", "Fix the tensor-parallel degree.", default=None),
        Option("--pp", "whole", "Fix the pipeline-parallel degree.", default=None),
        Option("--dp", "whole", "Fix the data-parallel degree.", default=None),
        Option("--cp", "whole", "Fix the context-parallel degree (default: 1, or searched up to --max-cp).",
               default=None),
        Option("--max-cp", "whole", "Search context parallelism up to this degree (default 1: off).", default="1"),
        Option("--ep", "whole", "Fix the expert-parallel degree (divides DP and --experts).", default=None),
        Option("--experts", "whole", "Routed experts per layer (a mixture of experts, as calc moe).", default=None),
        Option("--top-k", "whole", "Experts per token.", default=None),
        Option("--ffn", "whole", "Width of one expert's MLP (with --experts).", default=None),
        Option("--shared-experts", "whole", "Shared experts every token uses.", default="0", minimum=0),
        Option("--sp", "choice", "Sequence parallelism: any, on or off (default any).", default="any",
               choices=("any", "on", "off")),
        Option("--microbatch", "whole", "Fix the microbatch size (default: try 1, 2, 4, 8).", default=None),
        Option("--max-zero", "whole", "Highest ZeRO stage the framework offers (default 3).", default="3",
               minimum=0, maximum=3),
        Option("--max-zero-pp", "whole", "Highest ZeRO stage with a pipeline (default 3: FSDP with PP, as "
               "torchtitan and Llama 3; DeepSpeed's pipeline: 1).", default="3", minimum=0, maximum=3),
        Option("--recompute", "choice", "any, none, selective or full (default any).", default="any",
               choices=RECOMPUTE_CHOICES),
        Option("--max-chunks", "whole", "Most interleaved chunks per stage to try (default 8; 1 = plain 1F1B).",
               default="8"),
        Option("--engine", "choice", "Whose pipeline schedules decide which microbatch counts m run (lesson 5): "
               "megatron (default: interleaved needs m a multiple of PP), torch (interleaved also on any "
               "m < PP, 1F1B needs m >= PP) or distai.", default="megatron", choices=ENGINES),
        Option("--tp-across-nodes", "flag", "Allow TP groups that leave a node.", default=False),
        Option("--top", "whole", "Configurations to print (default 10).", default="10"),
        Option("--calibrate", "flag", "Measure this machine (matmul rate and other kernels at the capstone "
               "run's sizes, α and β of the loopback, with as many processes as the run has ranks; a profile "
               "under $DISTAI_HOME less than an hour old is reused) and predict the capstone run's step "
               "time: --dp --tp --pp --cp --ep (default 2, 2, 2, 1, 1), --layers --hidden --heads --kv-heads "
               "--seq --vocab --microbatch --global-batch (default: the run's).", default=False),
    ),
    compute=compute,
    text=text,
    measure=("calibrate", "..engine.calibrate:plan_profile"),
)
