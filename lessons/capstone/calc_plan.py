"""``distai calc plan``: the 3D-parallelism planner, every (tp, pp, dp, microbatch, ZeRO, recompute)
ranked by predicted step time (the capstone's :mod:`.planner`)."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, labels
from . import planner as pl

RECOMPUTE_CHOICES = ("any",) + pl.RECOMPUTE


def _kind(reason: str) -> str:
    """A short label for a rejection, to group them in the text."""
    for key, label in (("attention heads", "heads"), ("KV heads", "kv-heads"), ("hidden size", "hidden"),
                       ("vocabulary", "vocab"), ("sequence length", "seq"), ("node", "node"),
                       ("layers", "layers"), ("global batch", "batch"), ("ZeRO", "zero"), ("chunks", "chunks"),
                       ("interleaved", "chunks"), ("per GPU, more than the usable", "memory")):
        if key in reason:
            return label
    return "other"


def compute(v: dict) -> dict:
    kv_heads = v["kv_heads"] or v["heads"]
    if v["heads"] % kv_heads:
        raise CalcError(f"--heads {v['heads']} is not a multiple of --kv-heads {kv_heads}")
    if v["hidden"] % v["heads"]:
        raise CalcError(f"--hidden {v['hidden']} is not a multiple of --heads {v['heads']}")
    if not 0 < v["efficiency"] <= 1:
        raise CalcError(f"--efficiency: must be in (0, 1], got {v['efficiency']:g}")
    if not 0 < v["memory_util"] <= 1:
        raise CalcError(f"--memory-util: must be in (0, 1], got {v['memory_util']:g}")
    model = pl.ModelSpec(params=v["params"], layers=v["layers"], hidden=v["hidden"], heads=v["heads"],
                         kv_heads=kv_heads, seq=v["seq"], vocab=v["vocab"] or 0)
    cluster = pl.Cluster(gpus=v["gpus"], gpu_memory=v["gpu_mem"], gpus_per_node=v["gpus_per_node"],
                         flops=v["flops"], intra_bandwidth=v["intra_bw"], inter_bandwidth=v["inter_bw"],
                         alpha=v["alpha"], inter_alpha=v["inter_alpha"], efficiency=v["efficiency"],
                         memory_util=v["memory_util"], tp_across_nodes=bool(v["tp_across_nodes"]))
    recompute = pl.RECOMPUTE if v["recompute"] == "any" else (v["recompute"],)
    microbatches = (v["microbatch"],) if v["microbatch"] else pl.MICROBATCHES
    chunks = tuple(c for c in pl.CHUNKS if c <= v["max_chunks"])
    try:
        r = pl.plan(model, cluster, v["global_batch"], tp=v["tp"], pp=v["pp"], dp=v["dp"],
                    microbatches=microbatches, zero=tuple(range(v["max_zero"] + 1)), recompute=recompute,
                    chunks=chunks)
    except ValueError as exc:
        raise CalcError(str(exc)) from None
    if not r["configs"]:
        memory = [c for c in r["rejected"] if c.memory_bytes]
        if memory:
            least = min(memory, key=lambda c: c.memory_bytes)
            raise CalcError(f"no configuration fits: the smallest needs {units.format_bytes(least.memory_bytes)} "
                            f"per GPU (tp {least.tp}, pp {least.pp}, dp {least.dp}, microbatch {least.microbatch}, "
                            f"ZeRO-{least.zero}, {least.recompute} recompute), more than the usable "
                            f"{units.format_bytes(cluster.gpu_memory * cluster.memory_util)}")
        first = r["rejected"][0].reason if r["rejected"] else "no split of the GPUs"
        raise CalcError(f"no configuration is possible: {first}")
    configs = [c.as_dict() for c in r["configs"]]
    rejected = [dict(c.rejected_dict(), kind=_kind(c.reason), memory_bytes=c.memory_bytes or None)
                for c in r["rejected"]]
    inputs = {"params": model.params, "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
              "kv_heads": model.kv_heads, "seq": model.seq, "vocab": model.vocab, "global_batch": v["global_batch"],
              "gpus": cluster.gpus, "gpu_memory_bytes": cluster.gpu_memory, "gpus_per_node": cluster.gpus_per_node,
              "flops": cluster.flops, "intra_bandwidth_bytes_per_s": cluster.intra_bandwidth,
              "inter_bandwidth_bytes_per_s": cluster.inter_bandwidth, "alpha_s": cluster.alpha,
              "inter_alpha_s": cluster.inter_alpha, "efficiency": cluster.efficiency,
              "memory_util": cluster.memory_util, "tp_across_nodes": cluster.tp_across_nodes,
              "max_zero": v["max_zero"], "recompute": v["recompute"], "top": v["top"]}
    return {"best": configs[0], "configs": configs, "rejected": rejected, "inputs": inputs}


def text(r: dict, lang: str = "en") -> list[str]:
    i, say = r["inputs"], labels("plan", lang)
    pct = lambda x: units.format_percent(x, lang=lang)  # noqa: E731
    t = lambda s: units.format_time(s, lang=lang)  # noqa: E731
    b_ = lambda n: units.format_bytes(n, lang=lang)  # noqa: E731
    whole = lambda n: units.format_integer(n, lang)  # noqa: E731
    node = say("tp_across") if i["tp_across_nodes"] else say("tp_inside", n=i["gpus_per_node"])
    lines = [
        say("head", params=units.format_count(i["params"], lang=lang), layers=i["layers"], hidden=i["hidden"],
            heads=i["heads"], kv_heads=i["kv_heads"]),
        say("shape", seq=whole(i["seq"]), batch=whole(i["global_batch"]), gpus=whole(i["gpus"]),
            memory=b_(i["gpu_memory_bytes"])),
        say("hardware", flops=units.format_count(i["flops"], lang=lang),
            efficiency=units.format_number(i["efficiency"], lang=lang),
            nvlink=units.format_bandwidth(i["intra_bandwidth_bytes_per_s"], lang=lang),
            between=units.format_bandwidth(i["inter_bandwidth_bytes_per_s"], lang=lang)),
        node + ".",
        "",
        f"  {'#':>3}  {'TP':>3} {'PP':>3} {'DP':>5} {'mb':>3} {'ZeRO':>4} {say('recompute'):<9} {'v':>2} "
        f"{say('memory'):>9} {say('step'):>9} {'MFU':>6} {say('bubble'):>6}",
    ]
    for n, c in enumerate(r["configs"][:i["top"]], 1):
        lines.append(f"  {n:>3}  {c['tp']:>3} {c['pp']:>3} {c['dp']:>5} {c['microbatch']:>3} {c['zero']:>4} "
                     f"{say('recompute_' + c['recompute']):<9} {c['chunks']:>2} {b_(c['memory_bytes']):>9} "
                     f"{t(c['step_time_s']):>9} {pct(c['mfu']):>6} {pct(c['bubble_fraction']):>6}")
    more = len(r["configs"]) - i["top"]
    if more > 0:
        lines.append(say("more", n=whole(more)))
    b, bt = r["best"], r["best"]["time"]
    lines += ["", say("best", tp=b["tp"], pp=b["pp"], dp=b["dp"], mb=b["microbatch"], m=b["microbatches"]),
              say("best_zero", zero=b["zero"], recompute=say("recompute_" + b["recompute"]),
                  chunks=say("chunks", n=b["chunks"]) if b["chunks"] > 1 else ""),
              say("best_step", step=t(b["step_time_s"]), compute=t(bt["compute_s"]), tp=t(bt["tp_comm_s"]),
                  pp=t(bt["pp_comm_s"]), bubble=t(bt["bubble_s"]), dp=t(bt["dp_comm_exposed_s"])),
              say("best_memory", memory=b_(b["memory_bytes"]), states=b_(b["memory"]["model_states_bytes"]),
                  activations=b_(b["memory"]["activations_bytes"]))]
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
    help="""3D-parallelism planner: every (tp, pp, dp, microbatch, ZeRO stage, recompute) ranked by predicted step time.

    Memory per GPU from lesson 2 (model states sharded by ZeRO over dp, Korthikanti activations with
    sequence parallelism) times lesson 5's microbatches in flight; step time = compute at
    efficiency × peak + lesson 4's TP collectives + point-to-point sends, stretched by lesson 5's
    bubble, + the data-parallel gradient reduction that the last backward does not hide (lesson 1's
    α-β ring). TP stays inside a node unless --tp-across-nodes. Checked against Megatron-LM (Narayanan
    et al. 2021, Table 1), Llama 3 405B and BLOOM-176B (the capstone lesson).

    JSON keys: best (the first configuration), configs (feasible, best first), rejected (each with tp,
    pp, dp, microbatch, zero, recompute, chunks, reason, kind, memory_bytes; values a rejection left
    undecided are null), inputs. A configuration has tp, pp, dp, microbatch, zero, recompute, chunks
    (interleaved model chunks per stage), microbatches (per pipeline and step), memory_bytes (the
    busiest GPU), memory (model_states_bytes, activations_bytes, logits_bytes, first_stage_bytes,
    last_stage_bytes, microbatches_in_flight, usable_bytes), step_time_s, time (compute_s, tp_comm_s,
    pp_comm_s, bubble_s, dp_comm_exposed_s, tp/pp/dp_over_nodes), bubble_fraction, mfu (model FLOPs
    6Ψ + 12·L·h·s per token over peak), tokens_per_s, reason (empty).
    """,
    options=(
        Option("--params", "count", "Parameters Ψ of the model (70B).", minimum=0, strict_min=True),
        Option("--layers", "whole", "Transformer layers L."),
        Option("--hidden", "whole", "Hidden size h."),
        Option("--heads", "whole", "Attention heads a."),
        Option("--kv-heads", "whole", "Key/value heads (GQA; default: --heads).", default=None),
        Option("--seq", "whole", "Sequence length s in tokens."),
        Option("--global-batch", "whole", "Sequences per optimizer step."),
        Option("--gpus", "whole", "GPUs to split into TP × PP × DP.", maximum=1 << 20),
        Option("--gpu-mem", "bytes", "Memory per GPU (80GB).", minimum=0, strict_min=True),
        Option("--gpus-per-node", "whole", "GPUs per node sharing NVLink (default 8).", default="8"),
        Option("--flops", "flops", "Peak dense bf16 FLOP/s per GPU (default 989e12: H100 SXM).", default="989e12",
               minimum=0, strict_min=True),
        _bandwidth("--intra-bw", "NVLink bandwidth per GPU and direction (default 450e9 B/s: H100).", "450e9"),
        _bandwidth("--inter-bw", "Network bandwidth per GPU between nodes (default 50e9 B/s = 400 Gb/s).", "50e9"),
        Option("--alpha", "time", "Latency per message inside a node (default 5us).", default="5us", minimum=0),
        Option("--inter-alpha", "time", "Latency per message between nodes (default 10us).", default="10us",
               minimum=0),
        Option("--efficiency", "number", "Fraction of peak a layer's kernels sustain on one GPU (default 0.75).",
               default="0.75"),
        Option("--memory-util", "number", "Share of GPU memory usable (default 0.9).", default="0.9"),
        Option("--vocab", "whole", "Vocabulary size: adds the last stage's fp32 logits (default: left out).",
               default=None),
        Option("--tp", "whole", "Fix the tensor-parallel degree.", default=None),
        Option("--pp", "whole", "Fix the pipeline-parallel degree.", default=None),
        Option("--dp", "whole", "Fix the data-parallel degree.", default=None),
        Option("--microbatch", "whole", "Fix the microbatch size (default: try 1, 2, 4, 8).", default=None),
        Option("--max-zero", "whole", "Highest ZeRO stage the framework offers (default 3).", default="3",
               minimum=0, maximum=3),
        Option("--recompute", "choice", "any, none, selective or full (default any).", default="any",
               choices=RECOMPUTE_CHOICES),
        Option("--max-chunks", "whole", "Most interleaved chunks per stage to try (default 8; 1 = plain 1F1B).",
               default="8"),
        Option("--tp-across-nodes", "flag", "Allow TP groups that leave a node.", default=False),
        Option("--top", "whole", "Configurations to print (default 10).", default="10"),
    ),
    compute=compute,
    text=text,
)
