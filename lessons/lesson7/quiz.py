"""Lesson 7 quiz: KV cache, decode rooflines, parallel inference. Answers from :mod:`.formulas`;
texts in ``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build
from . import formulas as f
from . import published as pub
from .planner import Hardware

MODEL = ("name", "layers", "heads", "kv_heads", "head_dim", "params")
MODELS = [
    ("Llama-2-7B", 32, 32, 32, 128, 6.7e9),
    ("Llama-2-13B", 40, 40, 40, 128, 13e9),
    ("Llama-2-70B", 80, 64, 8, 128, 69e9),
    ("Llama-3-8B", 32, 32, 8, 128, 8e9),
    ("Mistral-7B", 32, 32, 8, 128, 7.2e9),
]
#: each model's context length as released (Llama 2: 4096; Llama 3: 8192; Mistral 7B v0.2: 32768): a question
#: caches no longer sequences than the model reads
MAX_CONTEXT = {"Llama-2-7B": 4096, "Llama-2-13B": 4096, "Llama-2-70B": 4096, "Llama-3-8B": 8192, "Mistral-7B": 32768}
DTYPES = [("fp16", 2), ("bf16", 2), ("fp8", 1)]
GPU = ("gpu", "bandwidth", "peak_flops", "gpu_memory")
#: datasheet HBM bandwidth, dense bf16 peak and memory; the A100's as the published runs' table states them
GPUS = [("A100 80GB", pub.A100["bandwidth"], pub.A100["flops"], pub.A100["gpu_memory"]),
        ("H100 SXM", 3.35e12, 989e12, 80e9), ("H200", 4.8e12, 989e12, 141e9)]


#: the published batch-1 decode steps (lesson 7's published.py) on A100s, as the question names its GPUs
PUBLISHED_DECODES = [(r.source, r.model_name, r.model.params, r.weights, r.tp, r.hardware["bandwidth"], r.measured_s)
                     for r in pub.PUBLISHED.values() if r.metric == "tpot" and r.hardware is pub.A100]


def _weights_read_share(params: float, tp: int, bandwidth: float, measured: float) -> float:
    """The share of a GPU's HBM bandwidth a decode step used reading that GPU's weights once (2 bytes each)."""
    return 2 * params / tp / bandwidth / measured


def _per_token(layers: int, kv_heads: int, head_dim: int) -> float:
    return f.kv_cache_bytes_per_token(layers, kv_heads, head_dim, 2)


def _fits(gpu_memory: float, weight_bytes: float, batch: int = 0, kv_bytes_per_seq: float = 0.0) -> bool:
    """Whether one GPU holds the weights and the batch's KV cache in the share of its memory the serving
    planner gives them (vLLM's ``gpu_memory_utilization``, 0.9): no question decodes on a GPU that could
    not hold the model (Llama-2-70B's 138 GB on one 80 GB GPU)."""
    return weight_bytes + batch * kv_bytes_per_seq <= gpu_memory * Hardware.memory_util


def _decode_terms(params: float, batch: int, peak_flops: float, weight_bytes: float, kv_bytes_per_seq: float,
                  bandwidth: float) -> dict:
    return {"compute": 2 * params * batch / peak_flops,
            "memory": (weight_bytes + batch * kv_bytes_per_seq) / bandwidth}


def _bound(**p) -> str:
    terms = _decode_terms(**{k: p[k] for k in ("params", "batch", "peak_flops", "weight_bytes", "kv_bytes_per_seq",
                                              "bandwidth")})
    return "memory" if terms["memory"] >= terms["compute"] else "compute"


def _worked(bandwidth: float = 1.0, peak_flops: float = 1.0, layers: int = 1, pp: int = 1, kv_heads: int = 1,
            tp: int = 1, head_dim: int = 1, dtype_bytes: int = 2) -> dict:
    return {"tb": bandwidth / 1e12, "tflops": peak_flops / 1e12, "layers_gpu": layers // pp,
            "kv_heads_gpu": max(1, kv_heads // tp), "kib": f.kv_cache_bytes_per_token(layers, kv_heads, head_dim,
                                                                                       dtype_bytes) / 1024}


GENERATORS = build("lesson7", __package__, values=_worked, kinds=[
    Numeric("kv-per-token", draw={MODEL: MODELS, ("dtype", "dtype_bytes"): DTYPES},
            answer=f.kv_cache_bytes_per_token, quantity="bytes", unit="KiB"),
    Numeric("kv-total", draw={MODEL: MODELS, "batch": [1, 8, 16, 32, 64], "ctx": [2048, 4096, 8192, 32768],
                              "tokens": lambda batch, ctx: batch * ctx, "dtype_bytes": 2},
            where=lambda name, ctx: ctx <= MAX_CONTEXT[name],
            answer=lambda **p: f.kv_cache_total(p["layers"], p["kv_heads"], p["head_dim"], 2, p["tokens"])["total_bytes"],
            quantity="bytes", unit="GB", values=lambda layers, kv_heads, head_dim: {"per": _per_token(layers, kv_heads, head_dim)}),
    Numeric("kv-per-gpu", draw={MODEL: [m for m in MODELS if m[3] == 8],
                                ("tp", "pp"): [(2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 4)],
                                "tokens": [16384, 65536, 131072], "dtype_bytes": 2},
            answer=lambda **p: f.kv_cache_total(p["layers"], p["kv_heads"], p["head_dim"], 2, p["tokens"], p["tp"],
                                                p["pp"])["per_gpu_bytes"],
            quantity="bytes", unit="GB",
            wrong={"not split by TP": lambda **p: f.kv_cache_total(p["layers"], p["kv_heads"], p["head_dim"], 2,
                                                                   p["tokens"], 1, p["pp"])["per_gpu_bytes"]}),
    Numeric("decode-bound", draw={MODEL: MODELS, GPU: GPUS, "bytes_per_token_read": lambda params: 2 * params},
            where=lambda gpu_memory, bytes_per_token_read: _fits(gpu_memory, bytes_per_token_read),
            answer=lambda bandwidth, bytes_per_token_read: f.decode_tokens_per_s_upper_bound(bandwidth,
                                                                                           bytes_per_token_read)),
    Numeric("max-tokens", draw={MODEL: MODELS, "free_bytes": [10e9, 20e9, 40e9], "bytes_per_token": _per_token},
            answer=f.max_kv_tokens, quantity="count"),
    Numeric("gqa-ratio", draw={"heads": [32, 64, 96], "kv_heads": [1, 4, 8], "layers": [32, 80],
                               "attention": lambda kv_heads: "mqa" if kv_heads == 1 else "gqa"},
            variant="attention",
            answer=lambda heads, kv_heads, layers: _per_token(layers, heads, 128) / _per_token(layers, kv_heads, 128),
            values=lambda heads, kv_heads, layers: {"mha": _per_token(layers, heads, 128),
                                                    "gqa": _per_token(layers, kv_heads, 128)}),
    Numeric("decode-time", draw={MODEL: MODELS, GPU: GPUS, "batch": [1, 8, 32], "ctx": [1024, 4096],
                                 "weight_bytes": lambda params: 2 * params,
                                 "kv_bytes_per_seq": lambda layers, kv_heads, head_dim, ctx:
                                     _per_token(layers, kv_heads, head_dim) * ctx,
                                 "bound": _bound},
            where=_fits, variant="bound", answer=lambda params, weight_bytes, kv_bytes_per_seq, peak_flops, bandwidth, batch:
                f.decode_time_per_token(params, weight_bytes, kv_bytes_per_seq, peak_flops, bandwidth, batch),
            quantity="seconds", unit="ms", values=_decode_terms),
    Numeric("ridge", draw={GPU: GPUS}, answer=f.ridge_point),
    Numeric("published-bandwidth-share",
            draw={("source", "name", "params", "dtype", "tp", "bandwidth", "measured"): PUBLISHED_DECODES},
            answer=_weights_read_share, quantity="fraction", unit="%",
            values=lambda params, tp, bandwidth: {"weights": 2 * params / tp,
                                                  "roofline": 2 * params / tp / bandwidth}),
    Choice("decode-memory-bound"),
    Choice("paged"),
    Choice("tp-decode"),
])
