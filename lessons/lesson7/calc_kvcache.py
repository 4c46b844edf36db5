"""``distai calc kvcache``: KV cache size per token, in total and per GPU."""
from __future__ import annotations

from .. import units
from ..calculator import Calculator, Option, bytes_text, labels, table
from . import formulas as f

DTYPES = ("fp16", "bf16", "fp8", "fp32")


def compute(v: dict) -> dict:
    nbytes = f.dtype_bytes(v["dtype"])
    r = f.kv_cache_total(v["layers"], v["kv_heads"], v["head_dim"], nbytes, v["tokens"], v["tp"], v["pp"])
    return dict(r, layers=v["layers"], kv_heads=v["kv_heads"], head_dim=v["head_dim"], dtype=v["dtype"],
                dtype_bytes=nbytes, tokens=v["tokens"], tp=v["tp"], pp=v["pp"])


def text(r: dict, lang: str = "en") -> list[str]:
    say = labels("kvcache", lang)
    return [
        say("head", layers=r["layers"], kv_heads=r["kv_heads"], head_dim=r["head_dim"], dtype=r["dtype"],
            tokens=units.format_integer(r["tokens"], lang), tp=r["tp"], pp=r["pp"]),
        *table([(say("per_token"), bytes_text(r["bytes_per_token"], lang)), (say("total"), bytes_text(r["total_bytes"], lang)),
                (say("per_gpu"), bytes_text(r["per_gpu_bytes"], lang))]),
    ]


CALCULATOR = Calculator(
    name="kvcache",
    help="""KV cache size per token, in total and per GPU.

    2·L·H_kv·d·bytes per token (Pope et al. 2023), sharded by heads (TP) and by layers (PP).

    JSON keys: bytes_per_token, total_bytes, per_gpu_bytes (the busiest GPU), and the inputs layers,
    kv_heads, head_dim, dtype, dtype_bytes, tokens, tp, pp.
    """,
    options=(
        Option("--layers", "whole", "Layers L."),
        Option("--kv-heads", "whole", "Key/value heads H_kv (fewer than query heads with GQA)."),
        Option("--head-dim", "whole", "Head dimension d."),
        Option("--dtype", "choice", "fp16, bf16, fp8 or fp32.", default="fp16", choices=DTYPES),
        Option("--tokens", "whole", "Tokens cached, all sequences together (4096, 128k)."),
        Option("--tp", "whole", "Tensor-parallel degree (shards KV heads).", default="1"),
        Option("--pp", "whole", "Pipeline-parallel degree (shards layers).", default="1"),
    ),
    compute=compute,
    text=text,
)
