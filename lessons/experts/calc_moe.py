"""``distai calc moe``: a Mixture-of-Experts model's total and active parameters, its memory per GPU
under expert parallelism, the all-to-all bytes per layer and the expected drops."""
from __future__ import annotations

from .. import units
from ..calculator import CalcError, Calculator, Option, bytes_text, labels, table
from ..lesson7.formulas import dtype_bytes
from ..model_size import check_degrees
from . import formulas as f


def compute(v: dict) -> dict:
    if v["top_k"] > v["experts"]:
        raise CalcError.keyed("errors.top_k", top_k=v["top_k"], experts=v["experts"])
    check_degrees(ep=v["ep"], experts=v["experts"])  # the course's one shape check
    if v["hidden"] % v["heads"] or v["heads"] % v["kv_heads"]:
        raise CalcError.keyed("errors.shape_divides", hidden=v["hidden"], heads=v["heads"], kv_heads=v["kv_heads"])
    p = f.moe_model_params(v["layers"], v["hidden"], v["ffn"], v["experts"], v["top_k"], v["vocab"], v["heads"],
                           v["kv_heads"], v["shared_experts"])
    elem = dtype_bytes(v["dtype"])
    expert_bytes = f.expert_bytes_per_rank(v["layers"], v["experts"], v["ep"], f.expert_params(v["hidden"], v["ffn"]),
                                           elem)
    replicated_bytes = (p["total_params"] - p["expert_params"]) * elem
    per_direction = f.dispatch_bytes_per_layer(v["tokens"], v["hidden"], v["top_k"], v["ep"], elem)
    group_tokens = v["tokens"] * v["ep"]
    return {**v, **p, "active_fraction": p["active_params"] / p["total_params"],
            "experts_per_gpu": v["experts"] // v["ep"], "expert_bytes_per_gpu": expert_bytes,
            "replicated_bytes_per_gpu": replicated_bytes, "weight_bytes_per_gpu": expert_bytes + replicated_bytes,
            "all_to_all_forward_bytes_per_layer": per_direction, "all_to_all_backward_bytes_per_layer": per_direction,
            "all_to_all_calls_per_layer": f.all_to_all_calls_per_layer(dropless=False),
            "capacity": f.capacity(group_tokens, v["experts"], v["top_k"], v["capacity_factor"]),
            "expected_drop_rate": f.expected_drop_rate(group_tokens, v["experts"], v["top_k"], v["capacity_factor"]),
            # Megatron-Core's router caps each rank's own tokens before the all-to-all: T is one GPU's
            "capacity_per_rank": f.capacity(v["tokens"], v["experts"], v["top_k"], v["capacity_factor"]),
            "expected_drop_rate_per_rank": f.expected_drop_rate(v["tokens"], v["experts"], v["top_k"],
                                                                v["capacity_factor"])}


def text(r: dict, lang: str = "en") -> list[str]:
    say = labels("moe", lang)
    b = lambda n: bytes_text(n, lang)  # noqa: E731
    rows = [(say("total"), units.format_count(r["total_params"], lang=lang)),
            (say("active"), f"{units.format_count(r['active_params'], lang=lang)} "
                            f"({units.format_percent(r['active_fraction'], lang=lang)})"),
            (say("per_gpu", ep=r["ep"]), str(r["experts_per_gpu"])),
            (say("expert_weights", dtype=r["dtype"]), b(r["expert_bytes_per_gpu"])),
            (say("other_weights"), b(r["replicated_bytes_per_gpu"])),
            (say("a2a_fwd"), b(r["all_to_all_forward_bytes_per_layer"])),
            (say("a2a_bwd"), b(r["all_to_all_backward_bytes_per_layer"])),
            (say("capacity", c=units.format_plain(r["capacity_factor"], lang)), units.format_integer(r["capacity"], lang)),
            (say("drops"), units.format_fixed_percent(r["expected_drop_rate"], 2, lang))]
    if r["ep"] > 1:  # the same T otherwise
        rows += [(say("capacity_per_rank"), units.format_integer(r["capacity_per_rank"], lang)),
                 (say("drops_per_rank"), units.format_fixed_percent(r["expected_drop_rate_per_rank"], 2, lang))]
    return [say("head", layers=r["layers"], experts=r["experts"], top_k=r["top_k"],
                shared=say("shared", n=r["shared_experts"]) if r["shared_experts"] else "",
                tokens=units.format_integer(r["tokens"], lang), n=r["tokens"]), *table(rows)]


CALCULATOR = Calculator(
    name="moe",
    options=(
        Option("--layers", "whole"),
        Option("--hidden", "whole"),
        Option("--ffn", "whole"),
        Option("--experts", "whole"),
        Option("--top-k", "whole"),
        Option("--vocab", "whole"),
        Option("--heads", "whole"),
        Option("--kv-heads", "whole"),
        Option("--shared-experts", "whole", default="0", minimum=0),
        Option("--ep", "whole", default="1"),
        Option("--tokens", "length", default="4096"),
        Option("--capacity-factor", "number", default="1.25",
               minimum=0, strict_min=True),
        Option("--dtype", "choice", default="bf16",
               choices=("fp32", "fp16", "bf16", "fp8")),
    ),
    compute=compute,
    text=text,
)
