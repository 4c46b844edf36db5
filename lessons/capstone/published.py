"""Published 3D-parallel training layouts, and where the planner ranks them.

Each entry is a real run: the model, the cluster, the global batch, the (tp, pp, dp) it used and the
throughput it reported, with its source. :func:`reproduce` runs the planner (:mod:`.planner`) on the
same model and cluster, restricted to what the run's framework offered, and reports the rank of the
published layout among all layouts, its predicted MFU, and the published MFU.

Sources:
- Megatron-LM PTD-P: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC 2021, Table 1 (GPT models, sequence 2048, vocabulary 51,200, A100-80GB on
  Selene: 8 GPUs per node on NVLink/NVSwitch at 300 GB/s per direction, 8 × 200 Gb/s HDR InfiniBand per
  node = 25 GB/s per GPU). Throughputs count activation recomputation (their eq. 3); Megatron-LM then
  had no ZeRO (data parallelism kept full optimizer states).
- Llama 3 405B: Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, 2024, Table 4
  and Sec. 3.3: 126 layers, h = 16384, 128 heads, 8 KV heads, vocabulary 128,256, sequence 8192, 16M
  tokens per batch (2048 sequences); H100-80GB at 989 TFLOP/s (bf16 dense), 8 per server on NVLink,
  400 Gb/s RoCE per GPU. TP 8, CP 1, PP 16, DP 64 on 8,192 GPUs: 430 TFLOP/s per GPU, 43% BF16 MFU;
  DP 128 on 16,384 GPUs: 400 TFLOP/s, 41%.
- BLOOM-176B: BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model",
  arXiv:2211.05100, 2022, Sec. 3.4; bigscience-workshop/bigscience ``train/tr11-176B-ml`` (README and
  ``tr11-176B-ml.slurm``): 384 A100-80GB in 48 nodes, TP 4, PP 12, DP 8, micro-batch 2, global batch
  2048 of 2048 tokens, 70 layers, h = 14336, 112 heads, vocabulary 250,880, activation checkpointing,
  BF16 optimizer with its own ZeRO-1; "about 150 TFLOPs" per GPU counted with recomputation (README,
  "Throughput"); 4 NVLink links per GPU (25 GB/s per direction each) and 4 × 100 Gb/s Omni-Path per
  node (6.25 GB/s per GPU).
Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TypedDict

from . import formulas as f
from . import planner as pl

# How fast one A100 ran a transformer layer with Megatron-LM's 2021 kernels: the 1.7B run of Table 1 has
# no tensor or pipeline parallelism and overlaps its all-reduce, so its 137 TFLOP/s (counted with
# recomputation) of 312 is the kernels' own fraction of peak. The other runs are predicted from it.
A100_2021_EFFICIENCY = 137e12 / 312e12


class Hardware(TypedDict, total=False):
    """A GPU's and its network's figures, as :class:`~.planner.Cluster` keywords."""
    flops: float
    intra_bandwidth: float
    inter_bandwidth: float
    efficiency: float


A100: Hardware = dict(flops=312e12, intra_bandwidth=300e9, inter_bandwidth=25e9,  # Selene (DGX A100)
            efficiency=A100_2021_EFFICIENCY)
H100: Hardware = dict(flops=989e12, intra_bandwidth=450e9, inter_bandwidth=50e9)  # Meta's Grand Teton, 400 Gb/s RoCE


@dataclass(frozen=True)
class Published:
    name: str
    model: pl.ModelSpec
    cluster: pl.Cluster
    global_batch: int
    layout: tuple[int, int, int]  # (tp, pp, dp)
    achieved_flops: float  # per GPU, as published
    counted: str  # how the publisher counted FLOPs: "megatron" (eq. 3, with recomputation) or "mfu"
    published_mfu_value: float | None = None  # when the publisher states MFU itself
    max_zero: int = 3  # the highest ZeRO stage the run's framework offered
    microbatch: int | None = None  # as published, when the source says
    recompute: str | None = None  # as published (the search keeps to it), when the source says
    source: str = ""


def _megatron(size: str, params: float, layers: int, hidden: int, heads: int, gpus: int, batch: int,
              tp: int, pp: int, tflops: float) -> Published:
    return Published(f"megatron-{size}", pl.ModelSpec(params, layers, hidden, heads, heads, 2048, 51200),
                     pl.Cluster(gpus, 80e9, **A100), batch, (tp, pp, gpus // (tp * pp)), tflops * 1e12,
                     "megatron", max_zero=0, recompute="full", source="Narayanan et al. 2021, Table 1")


# Narayanan et al. 2021, Table 1: parameters, layers, hidden, heads, GPUs, batch, TP, PP, TFLOP/s per GPU
MEGATRON = (
    _megatron("1.7b", 1.7e9, 24, 2304, 24, 32, 512, 1, 1, 137),
    _megatron("3.6b", 3.6e9, 30, 3072, 32, 64, 512, 2, 1, 138),
    _megatron("7.5b", 7.5e9, 36, 4096, 32, 128, 512, 4, 1, 142),
    _megatron("18.4b", 18.4e9, 40, 6144, 48, 256, 1024, 8, 1, 135),
    _megatron("39.1b", 39.1e9, 48, 8192, 64, 512, 1536, 8, 2, 138),
    _megatron("76.1b", 76.1e9, 60, 10240, 80, 1024, 1792, 8, 4, 140),
    _megatron("145.6b", 145.6e9, 80, 12288, 96, 1536, 2304, 8, 8, 148),
    _megatron("310.1b", 310.1e9, 96, 16384, 128, 1920, 2160, 8, 16, 155),
    _megatron("529.6b", 529.6e9, 105, 20480, 128, 2520, 2520, 8, 35, 163),
    _megatron("1008b", 1008e9, 128, 25600, 160, 3072, 3072, 8, 64, 163),
)
LLAMA3_405B = pl.ModelSpec(405e9, 126, 16384, 128, 8, 8192, 128256)
LLAMA3 = (
    Published("llama3-405b-8k", LLAMA3_405B, pl.Cluster(8192, 80e9, **H100), 2048, (8, 16, 64), 430e12, "mfu",
              0.43, source="Llama 3 paper, Table 4"),
    Published("llama3-405b-16k", LLAMA3_405B, pl.Cluster(16384, 80e9, **H100), 2048, (8, 16, 128), 400e12, "mfu",
              0.41, source="Llama 3 paper, Table 4"),
)
BLOOM = Published("bloom-176b", pl.ModelSpec(176.2e9, 70, 14336, 112, 112, 2048, 250880),
                  pl.Cluster(384, 80e9, flops=312e12, intra_bandwidth=100e9, inter_bandwidth=6.25e9,
                             efficiency=A100_2021_EFFICIENCY), 2048,
                  (4, 12, 8), 150e12, "megatron", max_zero=1, microbatch=2, recompute="full",
                  source="BigScience tr11-176B-ml README and slurm script; BLOOM paper Sec. 3.4")
PUBLISHED = {p.name: p for p in (*MEGATRON, *LLAMA3, BLOOM)}


def _get(name: str) -> Published:
    if name not in PUBLISHED:
        raise ValueError(f"unknown published layout {name!r}; choose one of {', '.join(PUBLISHED)}")
    return PUBLISHED[name]


def published_mfu(name: str) -> float:
    """The run's MFU: stated by the publisher (Llama 3), or its throughput counted with recomputation
    (Megatron-LM's eq. 3) scaled to the model's FLOPs (:func:`~.formulas.published_mfu`)."""
    p = _get(name)
    if p.published_mfu_value is not None:
        return p.published_mfu_value
    m = p.model
    counted = f.megatron_flops_per_step(p.global_batch, m.seq, m.layers, m.hidden, m.vocab)
    return f.published_mfu(p.achieved_flops, counted, pl.model_flops_per_step(m, p.global_batch), p.cluster.flops)


@cache
def reproduce(name: str) -> dict:
    """The planner on the published model and cluster (ZeRO up to what the framework offered, the
    published recomputation when known):
    {"layout_rank" (1 = best layout), "layouts" (feasible layouts), "best" (the best configuration),
    "config" (the published layout's best configuration), "exact" (the configuration with the published
    microbatch and recompute, when both are known, or None), "predicted_mfu", "published_mfu"}."""
    p = _get(name)
    recompute = (p.recompute,) if p.recompute else pl.RECOMPUTE
    r = pl.plan(p.model, p.cluster, p.global_batch, zero=tuple(range(p.max_zero + 1)), recompute=recompute)
    rank, config = pl.layout_rank(r["configs"], *p.layout)
    exact = None
    if p.microbatch is not None and p.recompute is not None:
        exact = next((c for c in r["configs"] if c.layout == p.layout and c.microbatch == p.microbatch
                      and c.chunks == 1), None)
    return {"layout_rank": rank, "layouts": len({c.layout for c in r["configs"]}), "best": r["configs"][0],
            "config": config, "exact": exact, "predicted_mfu": config.mfu if config else None,
            "published_mfu": published_mfu(name)}


def layout_rank(name: str) -> int:
    """Where the planner ranks the published (tp, pp, dp) among all feasible layouts (1 = best)."""
    return reproduce(name)["layout_rank"]


def predicted_mfu(name: str) -> float:
    """The planner's MFU for the published layout at its best microbatch, recompute and chunks."""
    return reproduce(name)["predicted_mfu"]


def predicted_step_time(name: str) -> float:
    return reproduce(name)["config"].step_time_s


def best_step_time(name: str) -> float:
    return reproduce(name)["best"].step_time_s


# The planner step's example: the command of issue 15 (a Llama-3-70B-shaped model on 512 H100s).
EXAMPLE_MODEL = pl.ModelSpec(70e9, 80, 8192, 64, 8, 4096)
EXAMPLE_CLUSTER = pl.Cluster(512, 80e9)
EXAMPLE_BATCH = 1024


@cache
def example_plan() -> dict:
    """``distai calc plan --params 70B --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --seq 4096
    --global-batch 1024 --gpus 512 --gpu-mem 80GB`` as the planner's result."""
    return pl.plan(EXAMPLE_MODEL, EXAMPLE_CLUSTER, EXAMPLE_BATCH)


def example_config(rank: int = 1) -> dict:
    """The example's configuration at ``rank`` (1 = best) as a dict (``memory``, ``time`` inside)."""
    return example_plan()["configs"][rank - 1].as_dict()
