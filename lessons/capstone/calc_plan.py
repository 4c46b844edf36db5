"""``distai calc plan``: the parallelism planner, every (tp, cp, pp, dp, ep, SP, microbatch, ZeRO,
recompute, chunks) ranked by predicted step time (the capstone's :mod:`.planner`)."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, labels
from ..lesson2.formulas import MOMENT_BYTES
from ..lesson5.formulas import ENGINE_NAMES, ENGINES
from ..strings import TranslatedError
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


def _axes(v: dict) -> pl.Axes:
    recompute = pl.RECOMPUTE if v["recompute"] == "any" else (v["recompute"],)
    sp = {"any": pl.SEQUENCE_PARALLEL, "on": (True,), "off": (False,)}[v["sp"]]
    cp = v["cp"] if v["cp"] is not None else (None if v["max_cp"] > 1 else 1)
    ep = v["ep"] if v["ep"] is not None else (None if v["experts"] else 1)
    max_cp = 0 if v["cp"] is not None else v["max_cp"]  # a fixed --cp is not capped by --max-cp's default 1
    return pl.Axes(tp=v["tp"], pp=v["pp"], dp=v["dp"], cp=cp, ep=ep, max_cp=max_cp,
                   microbatches=(v["micro_batch"],) if v["micro_batch"] else pl.MICROBATCHES,
                   zero=tuple(range(v["max_zero"] + 1)), max_zero_pp=min(v["max_zero_pp"], v["max_zero"]),
                   recompute=recompute, chunks=tuple(c for c in pl.CHUNKS if c <= v["max_chunks"]), sp=sp,
                   engine=v["engine"], grad_accumulation=v["grad_accumulation"], moments=v["moments"])


#: what the planner needs unless --calibrate predicts the capstone run (whose sizes have defaults)
NEEDED = ("params", "layers", "hidden", "heads", "seq", "global_batch", "gpus", "gpu_memory")


def compute(v: dict) -> dict:
    if v["calibrate"]:  # the profile distai.engine.calibrate measured: the capstone run on this machine
        return calibrated.compute(v["calibrate"])
    missing = [f"--{k.replace('_', '-')}" for k in NEEDED if v[k] is None]
    if missing:
        raise CalcError.keyed("plan.errors.missing", flags=", ".join(missing))
    kv_heads = v["kv_heads"] or v["heads"]
    if v["heads"] % kv_heads:
        raise CalcError.keyed("plan.errors.heads_kv", heads=v["heads"], kv_heads=kv_heads)
    if v["hidden"] % v["heads"]:
        raise CalcError.keyed("plan.errors.hidden_heads", hidden=v["hidden"], heads=v["heads"])
    for key in ("efficiency", "gemm_efficiency", "memory_util"):  # fractions of a peak (--efficiency may be unset)
        fraction = v[key]
        if fraction is not None and not 0 < fraction <= 1:
            raise CalcError.keyed("plan.errors.fraction", flag="--" + key.replace("_", "-"),
                                  value=lambda lang, x=fraction: units.format_plain(x, lang))
    if bool(v["experts"]) != bool(v["top_k"]) or bool(v["experts"]) != bool(v["ffn"]) \
            or (v["shared_experts"] and not v["experts"]):
        raise CalcError.keyed("plan.errors.moe_flags")
    if v["experts"] and v["top_k"] > v["experts"]:
        raise CalcError.keyed("plan.errors.top_k", top_k=v["top_k"], experts=v["experts"])
    model = pl.ModelSpec(params=v["params"], layers=v["layers"], hidden=v["hidden"], heads=v["heads"],
                         kv_heads=kv_heads, seq=v["seq"], vocab=v["vocab"] or 0, experts=v["experts"] or 0,
                         top_k=v["top_k"] or 0, expert_ffn=v["ffn"] or 0, shared_experts=v["shared_experts"],
                         tied_embeddings=v["head"] == "tied")
    cluster = pl.Cluster(gpus=v["gpus"], gpu_memory=v["gpu_memory"], gpus_per_node=v["gpus_per_node"],
                         flops=v["flops"], intra_bandwidth=v["link_bandwidth"], inter_bandwidth=v["internode_bandwidth"],
                         alpha=pl.Cluster.alpha if v["alpha"] is None else v["alpha"],
                         nccl_collectives=v["alpha"] is None, inter_alpha=v["internode_alpha"], efficiency=v["efficiency"],
                         memory_util=v["memory_util"], tp_across_nodes=bool(v["tp_across_nodes"]),
                         hbm_bandwidth=v["hbm_bandwidth"], gemm_peak_fraction=v["gemm_efficiency"],
                         flash_attention=v["flash_attention"] == "on", dp_ring_nics=v["dp_ring_nics"])
    try:
        r = pl.plan(model, cluster, v["global_batch"], axes=_axes(v))
    except TranslatedError as exc:  # the planner's input errors and the shape check's refusals
        raise CalcError(texts=exc.texts) from None
    except ValueError as exc:
        raise CalcError(str(exc)) from None
    if not r["configs"]:
        raise CalcError(texts=r["obstacle_text"])
    configs = [c.as_dict() for c in r["configs"]]
    rejected = [dict(c.rejected_dict(), kind=_kind(c.reason), memory_bytes=c.memory_bytes or None)
                for c in r["rejected"]]
    inputs = {"params": model.params, "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
              "kv_heads": model.kv_heads, "seq": model.seq, "vocab": model.vocab, "head": v["head"],
              "global_batch": v["global_batch"],
              "experts": model.experts, "top_k": model.top_k, "expert_ffn": model.expert_ffn,
              "shared_experts": model.shared_experts, "active_params": model.active_params,
              "gpus": cluster.gpus, "gpu_memory_bytes": cluster.gpu_memory, "gpus_per_node": cluster.gpus_per_node,
              "flops": cluster.flops, "link_bandwidth_bytes_per_s": cluster.intra_bandwidth,
              "internode_bandwidth_bytes_per_s": cluster.inter_bandwidth, "alpha_s": cluster.alpha,
              "collective_model": "nccl" if cluster.nccl_collectives else "alpha-beta",
              "internode_alpha_s": cluster.inter_alpha, "efficiency": cluster.efficiency,
              "hbm_bandwidth_bytes_per_s": cluster.hbm_bandwidth, "gemm_efficiency": cluster.gemm_peak_fraction,
              "gemm_half_width": cluster.gemm_half_width, "flash_attention": cluster.flash_attention,
              "memory_util": cluster.memory_util, "tp_across_nodes": cluster.tp_across_nodes,
              "dp_ring_nics": cluster.dp_ring_nics,
              "max_zero": v["max_zero"], "max_zero_pp": v["max_zero_pp"], "recompute": v["recompute"],
              "sp": v["sp"], "engine": v["engine"], "grad_accumulation": v["grad_accumulation"], "moments": v["moments"],
              "top": v["top"]}
    return {"best": configs[0], "configs": configs, "rejected": rejected, "inputs": inputs}


def _aligned(table: list[list[str]], left: set[int]) -> list[str]:
    """The table's rows, each column as wide as its widest cell, one space apart, two columns ahead of
    the rows (80 columns hold the plan's 15 in both languages); columns in ``left`` align left."""
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    return ["  " + " ".join(cell.ljust(w) if k in left else cell.rjust(w)
                            for k, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in table]


def _memory_line(m: dict, say, lang: str, moments: str) -> str:
    b = lambda n: units.format_bytes(n, lang=lang)  # noqa: E731
    return say("memory_terms", params=b(m["params_bytes"]), grads=b(m["grad_buffer_bytes"]),
               optimizer=b(m["optimizer_bytes"]), moments=say("moments_bf16") if moments == "bf16" else "",
               activations=b(m["activations_bytes"]), logits=b(m["logits_bytes"]),
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
            nvlink=units.format_bandwidth(i["link_bandwidth_bytes_per_s"], lang=lang),
            between=units.format_bandwidth(i["internode_bandwidth_bytes_per_s"], lang=lang))
        + (say("ring_nics_per_rank") if i["dp_ring_nics"] == "per-rank" else ""),
        node + say("engine", engine=ENGINE_NAMES[i["engine"]]),
        say("collectives_nccl") if i["collective_model"] == "nccl" else say("collectives_ring", alpha=t(i["alpha_s"])),
        "",
    ]
    head = ["#", "TP", "CP", "PP", "DP", "EP", "SP", "mb", "ZeRO", cols[0], "v", cols[1], cols[2], "MFU", cols[3]]
    rows = [[str(n), str(c["tp"]), str(c["cp"]), str(c["pp"]), str(c["dp"]), str(c["ep"]),
             say("sp_on") if c["sp"] else "-", str(c["microbatch"]), str(c["zero"]), recompute(c["recompute"]),
             str(c["chunks"]), by(c["memory_bytes"]), t(c["step_time_s"]), pct(c["mfu"]), pct(c["bubble_fraction"])]
            for n, c in enumerate(r["configs"][:i["top"]], 1)]
    lines += _aligned([head, *rows], left={head.index(cols[0])})
    more = len(r["configs"]) - i["top"]
    if more > 0:
        lines.append(say("more", n=whole(more)))
    b, bt = r["best"], r["best"]["time"]
    lines += ["", say("best", tp=b["tp"], cp=b["cp"], pp=b["pp"], dp=b["dp"], ep=b["ep"], mb=b["microbatch"],
                      m=b["microbatches"]),
              say("best_zero", zero=b["zero"], recompute=recompute(b["recompute"]),
                  sp=say("sp") if b["sp"] else "", chunks=say("chunks", n=b["chunks"]) if b["chunks"] > 1 else ""),
              say("best_step", step=t(b["step_time_s"]), compute=t(bt["compute_s"]), gemm=pct(bt["gemm_efficiency"]),
                  tp=t(bt["tp_comm_s"]), cp=t(bt["cp_comm_s"]), pp=t(bt["pp_comm_s"]), ep=t(bt["ep_comm_s"]),
                  bubble=t(bt["bubble_s"]), dp=t(bt["dp_comm_exposed_s"]),
                  optimizer=t(bt["optimizer_s"])),
              *([say("best_accumulation", seconds=t(bt["grad_accumulation_s"]), how=i["grad_accumulation"])]
                if bt["grad_accumulation_s"] else []),
              _memory_line(b["memory"], say, lang, i["moments"]),
              say("memory_total", memory=by(b["memory_bytes"]), usable=by(b["memory"]["usable_bytes"]))]
    if r["rejected"]:
        groups: dict[str, list[dict]] = {}
        for c in r["rejected"]:
            groups.setdefault(c["kind"], []).append(c)
        lines += ["", say("rejected", n=whole(len(r["rejected"])))]
        for kind, items in groups.items():
            # the nearest miss for memory, else the first of its kind
            example = min(items, key=lambda c: c["memory_bytes"]) if kind == "memory" else items[0]
            reason = example.get("reason_text", {}).get(lang) or example["reason"]
            if kind == "memory" and len(items) > 1:  # not "1450 × needs 80.1 GB": the nearest of many
                usable_bytes = r["inputs"]["gpu_memory_bytes"] * r["inputs"]["memory_util"]
                need, usable = units.format_bytes_apart(example["memory_bytes"], usable_bytes, lang)
                reason = say("memory_group", memory=need, usable=usable)
            lines.append(f"  {whole(len(items)):>6} × {reason}" + (" …" if len(items) > 1 else ""))
    return lines


def _bandwidth(flag: str, default) -> Option:
    return Option(flag, "bandwidth", default=default, minimum=0, strict_min=True)


CALCULATOR = Calculator(
    name="plan",
    options=(
        Option("--params", "count", minimum=0, strict_min=True, default=None),
        Option("--layers", "whole", default=None),
        Option("--hidden", "whole", default=None),
        Option("--heads", "whole", default=None),
        Option("--kv-heads", "whole", default=None),
        Option("--seq", "length", default=None),
        Option("--global-batch", "whole", default=None),
        Option("--gpus", "whole", maximum=1 << 20, default=None),
        Option("--gpu-memory", "capacity", minimum=0, strict_min=True, default=None),
        Option("--gpus-per-node", "whole", default="8"),
        Option("--flops", "flops", default="989T",
               minimum=0, strict_min=True),
        _bandwidth("--link-bandwidth", "450GB/s"),
        _bandwidth("--internode-bandwidth", "50GB/s"),
        Option("--alpha", "time", default=None, minimum=0),
        Option("--internode-alpha", "time", default="10us",
               minimum=0),
        Option("--hbm-bandwidth", "bandwidth", default="3.35TB/s",
               minimum=0, strict_min=True),
        Option("--gemm-efficiency", "number", default=f"{pl.H100_GEMM:g}",
               help_fields=(("h100_gemm", pl.H100_GEMM), ("a100_gemm", pl.A100_GEMM))),
        Option("--flash-attention", "choice", default="on", choices=("on", "off")),
        Option("--efficiency", "number", default=None),
        Option("--memory-util", "number", default="1"),
        Option("--vocab", "whole",
               default=None),
        Option("--head", "choice", default="tied", choices=("tied", "untied")),
        Option("--tp", "whole", default=None),
        Option("--pp", "whole", default=None),
        Option("--dp", "whole", default=None),
        Option("--cp", "whole",
               default=None),
        Option("--max-cp", "whole", default="1"),
        Option("--ep", "whole", default=None),
        Option("--experts", "whole", default=None),
        Option("--top-k", "whole", default=None),
        Option("--ffn", "whole", default=None),
        Option("--shared-experts", "whole", default="0", minimum=0),
        Option("--sp", "choice", default="any",
               choices=("any", "on", "off")),
        Option("--micro-batch", "whole", default=None),
        Option("--max-zero", "whole", default="3",
               minimum=0, maximum=3),
        Option("--max-zero-pp", "whole", default="3", minimum=0, maximum=3),
        Option("--recompute", "choice", default="any",
               choices=RECOMPUTE_CHOICES),
        Option("--max-chunks", "whole",
               default="8"),
        Option("--engine", "choice", default="megatron", choices=ENGINES),
        Option("--grad-accumulation", "choice", default="fused", choices=pl.GRAD_ACCUMULATION),
        Option("--moments", "choice", default="fp32", choices=tuple(MOMENT_BYTES)),
        Option("--dp-ring-nics", "choice", default="one", choices=pl.DP_RING_NICS),
        Option("--tp-across-nodes", "flag", default=False),
        Option("--top", "whole", default="10"),
        Option("--calibrate", "flag", default=False),
    ),
    compute=compute,
    text=text,
    measure=("calibrate", "..engine.calibrate:plan_profile"),
)
