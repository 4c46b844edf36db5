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
    options=(
        Option("--layers", "whole"),
        Option("--kv-heads", "whole"),
        Option("--head-dim", "whole"),
        Option("--dtype", "choice", default="fp16", choices=DTYPES),
        Option("--tokens", "length"),
        Option("--tp", "whole", default="1"),
        Option("--pp", "whole", default="1"),
    ),
    compute=compute,
    text=text,
)
