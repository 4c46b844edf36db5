"""``distai calc serve``: the serving planner, TP × PP × replicas ranked within TTFT/TPOT targets."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, check_params_fit_shape, labels
from . import formulas as f
from . import planner as pl
from .calc_kvcache import DTYPES
from .published import published_over_predicted  # the planner against published runs: its caveat


def _heads(hidden: int, heads: int | None, head_dim: int | None, kv_heads: int | None) -> tuple[int, int, int]:
    """(query heads, head dimension, KV heads), the missing ones derived from the hidden size."""
    if heads is None:
        head_dim = head_dim or 128
        if hidden % head_dim:
            raise CalcError.keyed("errors.hidden_head_dim", hidden=hidden, head_dim=head_dim)
        heads = hidden // head_dim
    if head_dim is None:
        if hidden % heads:
            raise CalcError.keyed("errors.hidden_heads", hidden=hidden, heads=heads)
        head_dim = hidden // heads
    kv_heads = heads if kv_heads is None else kv_heads
    if heads % kv_heads:
        raise CalcError.keyed("errors.heads_kv", heads=heads, kv_heads=kv_heads)
    return heads, head_dim, kv_heads


def compute(v: dict) -> dict:
    a, d, hkv = _heads(v["hidden"], v["heads"], v["head_dim"], v["kv_heads"])
    split = a * d == v["hidden"]  # heads that split the hidden size (not Gemma's wider attention)
    check_params_fit_shape(v["params"], v["layers"], v["hidden"], a if split else None, hkv if split else None)
    if not 0 < v["memory_util"] <= 1:
        raise CalcError.keyed("errors.fraction", flag="--memory-util",
                              value=lambda lang: units.format_plain(v["memory_util"], lang))
    model = pl.ModelSpec(params=v["params"], layers=v["layers"], hidden=v["hidden"], heads=a, kv_heads=hkv,
                         head_dim=d, dtype_bytes=f.dtype_bytes(v["dtype"]))
    hw = pl.Hardware(gpus=v["gpus"], gpu_memory=v["gpu_memory"], bandwidth=v["hbm_bandwidth"], flops=v["flops"],
                     link_bandwidth=v["link_bandwidth"], alpha=pl.MESSAGE_ALPHA if v["alpha"] is None else v["alpha"],
                     nccl_allreduce=v["alpha"] is None,
                     internode_bandwidth=v["internode_bandwidth"], internode_alpha=v["internode_alpha"],
                     gpus_per_node=v["gpus_per_node"], memory_util=v["memory_util"])
    wl = pl.Workload(prompt=v["prompt"], output=v["output"], ttft_slo=v["ttft_slo"], tpot_slo=v["tpot_slo"],
                     max_batch=v["max_batch"])
    r = pl.plan(model, hw, wl)
    inputs = {"params": model.params, "layers": model.layers, "hidden": model.hidden, "heads": a, "kv_heads": hkv,
              "head_dim": d, "dtype": v["dtype"], "dtype_bytes": model.dtype_bytes, "gpus": hw.gpus,
              "gpu_memory_bytes": hw.gpu_memory, "hbm_bandwidth_bytes_per_s": hw.bandwidth, "flops": hw.flops,
              "link_bandwidth_bytes_per_s": hw.link_bandwidth, "alpha_s": hw.alpha,
              "allreduce_model": "nccl" if hw.nccl_allreduce else "alpha-beta",
              "internode_bandwidth_bytes_per_s": hw.internode_bandwidth, "internode_alpha_s": hw.internode_alpha,
              "gpus_per_node": hw.gpus_per_node, "memory_util": hw.memory_util, "prompt": wl.prompt,
              "output": wl.output, "ttft_slo_s": wl.ttft_slo, "tpot_slo_s": wl.tpot_slo, "max_batch": wl.max_batch}
    return {"best": r["best"].as_dict() if r["best"] else None,
            "accepted": [c.as_dict() for c in r["accepted"]],
            "rejected": [c.as_dict() for c in r["rejected"]], "inputs": inputs}


def _split(c: dict) -> str:
    return f"{c['tp']}×{c['pp']}×{c['replicas']}"


def text(r: dict, lang: str = "en") -> list[str]:
    i, say = r["inputs"], labels("serve", lang)
    t = lambda s: units.format_time(s, lang=lang)  # noqa: E731
    whole = lambda n: units.format_integer(n, lang)  # noqa: E731
    lines = [
        say("head", params=units.format_count(i["params"], lang=lang), layers=i["layers"], hidden=i["hidden"],
            heads=i["heads"], kv_heads=i["kv_heads"], head_dim=i["head_dim"], dtype=i["dtype"], gpus=i["gpus"],
            memory=units.format_bytes(i["gpu_memory_bytes"], lang=lang),
            bandwidth=units.format_bandwidth(i["hbm_bandwidth_bytes_per_s"], lang=lang)),
        say("requests", prompt=whole(i["prompt"]), output=whole(i["output"]), ttft=t(i["ttft_slo_s"]),
            tpot=t(i["tpot_slo_s"])),
        say("allreduce_nccl") if i["allreduce_model"] == "nccl" else say("allreduce_ring", alpha=t(i["alpha_s"])),
    ]
    if r["accepted"]:
        lines += ["", say("accepted"),
                  f"  {'#':>2}  {'TP×PP×R':<9} {say('batch'):>6} {'TTFT':>9} {'TPOT':>9} {say('tokens_s'):>10} "
                  f"{say('per_gpu'):>8}  {say('limited_by')}"]
        for n, c in enumerate(r["accepted"], 1):
            lines.append(f"  {n:>2}  {_split(c):<9} {c['batch']:>6} {t(c['ttft_s']):>9} {t(c['tpot_s']):>9} "
                         f"{whole(c['throughput_tokens_per_s']):>10} {whole(c['throughput_per_gpu']):>8}  "
                         f"{say('limit.' + c['batch_limit'])}")
    else:
        lines += ["", say("none")]
    if r["rejected"]:
        lines += ["", say("rejected")]
        reason_width = max(len(say("reason." + c["reason"])) for c in r["rejected"])  # "memoria" is wider than "tpot"
        lines += [f"  {_split(c):<9} {say('reason.' + c['reason']):<{reason_width}}  "
                  f"{c.get('detail_text', {}).get(lang) or c['detail']}" for c in r["rejected"]]
    if r["best"]:
        b = r["best"]
        lines += ["", say("best", tp=b["tp"], pp=b["pp"], replicas=say("replicas", n=b["replicas"]), batch=b["batch"],
                          kv=units.format_bytes(b["kv_per_gpu_bytes"], lang=lang),
                          weights=units.format_bytes(b["weights_per_gpu_bytes"], lang=lang),
                          bound=say("bound." + b["decode_bound"]))]
    (tpot_lo, tpot_hi), (ttft_lo, ttft_hi) = published_over_predicted("tpot"), published_over_predicted("ttft")
    ratio = lambda x: units.format_fixed(x, 2, lang)  # noqa: E731
    lines += ["", say("published", tpot_lo=ratio(tpot_lo), tpot_hi=ratio(tpot_hi), ttft_lo=ratio(ttft_lo),
                      ttft_hi=ratio(ttft_hi))]
    return lines


def _bandwidth(flag: str, default=...) -> Option:
    return Option(flag, "bandwidth", default=default, minimum=0, strict_min=True)


CALCULATOR = Calculator(
    name="serve",
    options=(
        Option("--params", "count", minimum=0, strict_min=True),
        Option("--layers", "whole"),
        Option("--hidden", "whole"),
        Option("--kv-heads", "whole", default=None),
        Option("--heads", "whole", default=None),
        Option("--head-dim", "whole", default=None),
        Option("--dtype", "choice", default="fp16",
               choices=DTYPES),
        Option("--gpus", "whole", maximum=4096),
        Option("--gpu-memory", "capacity", minimum=0, strict_min=True),
        _bandwidth("--hbm-bandwidth"),
        Option("--flops", "flops", default="989T",
               minimum=0, strict_min=True),
        _bandwidth("--link-bandwidth",
                   default="450GB/s"),
        Option("--alpha", "time", default=None,
               minimum=0),
        _bandwidth("--internode-bandwidth", default="50GB/s"),
        Option("--internode-alpha", "time", default="10us", minimum=0),
        Option("--gpus-per-node", "whole", default="8"),
        Option("--memory-util", "number", default="0.9"),
        Option("--prompt", "length", default="2048"),
        Option("--output", "whole", default="2048"),
        Option("--ttft-slo", "time", minimum=0, strict_min=True),
        Option("--tpot-slo", "time", minimum=0, strict_min=True),
        Option("--max-batch", "whole", default="256", maximum=16384),  # the search tries every batch up to it
    ),
    compute=compute,
    text=text,
)
