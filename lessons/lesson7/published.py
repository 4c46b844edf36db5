"""The serving planner against published serving measurements: held out, nothing fitted on them.

The planner (:mod:`.planner`) has no constant fitted to anything: it is the roofline of each GPU's
datasheet (peak FLOP/s, HBM bandwidth) plus ring all-reduces as NCCL's own tuner prices them inside a node
(``lesson1.formulas.nccl_ring_allreduce``: constants read in NCCL's source). These are the published runs whose
whole configuration is stated — model, precision, GPU, tensor-parallel degree, one sequence at a time
(batch 1: no queueing, no batching policy), prompt and output lengths — each with its source. Every
one is predicted by the same ``planner.ttft`` / ``planner.tpot`` the lesson's calculator uses.

- ``gpt-fast`` (pytorch-labs/gpt-fast, README, tables of 2023-11-30 and 2023-12-16): Llama-2 7B and 70B
  in bf16 on A100-80GB GPUs power-limited to 330 W, batch 1, "a very small prompt length (just 5
  tokens)"; tokens/s of generation, so TPOT = 1 / rate (the 5-token prefill is within the rounding).
  The output length is not stated (the script's default is 200 new tokens). Neither is SXM or PCIe:
  taken as SXM (2.039 TB/s; PCIe's 1.935 TB/s would lengthen each prediction by 5 %).
- ``lmdeploy`` (InternLM/lmdeploy, ``docs/en/benchmark/a100_fp16.md``, v0.1.0a1, 2023-12-06): static
  inference, fixed batch 1, fp16 on A100-80G; TPOT from the throughput less the first-token latency,
  ``(output / rate − first token) / (output − 1)``.
- ``trtllm`` (NVIDIA/TensorRT-LLM, ``docs/source/performance.md`` of v0.5.0, 2023-10): "LLaMA 70B",
  4 GPUs, batch 1, first-token latency for 128 and 2048 prompt tokens; A100 SXM 80GB in fp16, H100 SXM
  80GB in FP8 (the companion ``H100vsA100.md``: "FP8 H100, FP16 A100, SXM 80GB GPUs").

Left out: runs under a request rate (their batch is unknown), NVIDIA NIM's H100 rows (the form factor,
SXM at 3.35 TB/s or PCIe at 2 TB/s, is not stated), tables given only as images.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model_spec import ModelSpec
from . import planner as pl

__all__ = ["PUBLISHED", "PublishedServing", "predicted", "published", "roofline_only", "roofline_share", "error",
           "error_table", "worst_error", "roofline_shares", "published_over_predicted"]

#: A100 SXM 80GB: 2.039 TB/s HBM2e, 312 TFLOP/s dense fp16/bf16, NVLink 3 at 300 GB/s per direction
A100 = {"gpu_memory": 80e9, "bandwidth": 2.039e12, "flops": 312e12, "link_bandwidth": 300e9}
#: H100 SXM 80GB in FP8: 3.35 TB/s HBM3, 1979 TFLOP/s dense FP8, NVLink 4 at 450 GB/s per direction
H100_FP8 = {"gpu_memory": 80e9, "bandwidth": 3.35e12, "flops": 1979e12, "link_bandwidth": 450e9}

LLAMA2_7B = ModelSpec(params=6.74e9, layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128)


@dataclass(frozen=True)
class PublishedServing:
    source: str  # who measured: gpt-fast, LMDeploy, TensorRT-LLM
    model_name: str
    weights: str  # their format: bf16, fp16, FP8
    model: ModelSpec
    hardware: dict
    tp: int
    prompt: int
    output: int
    metric: str  # "tpot" (one decode step, batch 1) or "ttft" (one prompt's prefill)
    measured_s: float


def _lmdeploy_tpot(output: int, tokens_per_s: float, first_token_s: float) -> float:
    return (output / tokens_per_s - first_token_s) / (output - 1)


PUBLISHED: dict[str, PublishedServing] = {
    "gpt-fast-7b": PublishedServing("gpt-fast", "Llama-2-7B", "bf16", LLAMA2_7B, A100, 1, 5, 200, "tpot", 1 / 104.9),
    "gpt-fast-70b-tp2": PublishedServing("gpt-fast", "Llama-2-70B", "bf16", pl.llama2_70b(), A100, 2, 5, 200, "tpot", 1 / 21.32),
    "gpt-fast-70b-tp4": PublishedServing("gpt-fast", "Llama-2-70B", "bf16", pl.llama2_70b(), A100, 4, 5, 200, "tpot", 1 / 38.01),
    "gpt-fast-70b-tp8": PublishedServing("gpt-fast", "Llama-2-70B", "bf16", pl.llama2_70b(), A100, 8, 5, 200, "tpot", 1 / 62.50),
    "lmdeploy-7b-128": PublishedServing("LMDeploy", "Llama-2-7B", "fp16", LLAMA2_7B, A100, 1, 128, 128, "tpot",
                                        _lmdeploy_tpot(128, 102.21, 0.022)),
    "lmdeploy-7b-2048": PublishedServing("LMDeploy", "Llama-2-7B", "fp16", LLAMA2_7B, A100, 1, 2048, 2048, "tpot",
                                         _lmdeploy_tpot(2048, 93.78, 0.14)),
    "lmdeploy-70b-tp4": PublishedServing("LMDeploy", "Llama-2-70B", "fp16", pl.llama2_70b(), A100, 4, 128, 2048, "tpot",
                                         _lmdeploy_tpot(2048, 32.38, 0.074)),
    "trtllm-70b-a100-128": PublishedServing("TensorRT-LLM", "Llama-2-70B", "fp16", pl.llama2_70b(), A100, 4, 128, 1, "ttft", 47e-3),
    "trtllm-70b-a100-2048": PublishedServing("TensorRT-LLM", "Llama-2-70B", "fp16", pl.llama2_70b(), A100, 4, 2048, 1, "ttft", 377e-3),
    "trtllm-70b-h100-128": PublishedServing("TensorRT-LLM", "Llama-2-70B", "FP8", pl.llama2_70b(1), H100_FP8, 4, 128, 1, "ttft", 26e-3),
    "trtllm-70b-h100-2048": PublishedServing("TensorRT-LLM", "Llama-2-70B", "FP8", pl.llama2_70b(1), H100_FP8, 4, 2048, 1, "ttft", 109e-3),
}


def _inputs(name: str) -> tuple[PublishedServing, pl.Hardware, pl.Workload]:
    run = PUBLISHED[name]
    return run, pl.Hardware(gpus=run.tp, **run.hardware), pl.Workload(prompt=run.prompt, output=run.output)


def predicted(name: str) -> float:
    """The planner's TPOT (one sequence) or TTFT (one prompt on an idle replica) for the published run."""
    run, hw, wl = _inputs(name)
    if run.metric == "tpot":
        return pl.tpot(run.model, hw, wl, run.tp, 1, 1)[0]
    return pl.ttft(run.model, hw, wl, run.tp, 1)


def roofline_only(name: str) -> float:
    """The prediction without its all-reduces: the datasheet's roofline alone, a floor no run can beat."""
    run, hw, wl = _inputs(name)
    if run.metric == "tpot":
        return pl.stage_decode_time(run.model, hw, wl, run.tp, 1, 1)["roofline"]
    return pl.ttft(run.model, pl.Hardware(gpus=run.tp, link_bandwidth=1e30, alpha=0.0, nccl_allreduce=False,
                                          **{k: v for k, v in run.hardware.items() if k != "link_bandwidth"}),
                   wl, run.tp, 1)


def published(name: str) -> float:
    """The published run's TPOT or TTFT, seconds."""
    return PUBLISHED[name].measured_s


def roofline_share(name: str) -> float:
    """How close the published run came to the datasheet's roofline: roofline / published (1: at the roofline)."""
    return roofline_only(name) / published(name)


def roofline_shares(metric: str) -> tuple[float, float]:
    """The least and the most :func:`roofline_share` over the runs of ``metric``."""
    shares = [roofline_share(n) for n, r in PUBLISHED.items() if r.metric == metric]
    return min(shares), max(shares)


def published_over_predicted(metric: str) -> tuple[float, float]:
    """The least and the most published / predicted over the runs of ``metric`` (``calc serve``'s caveat)."""
    ratios = [published(n) / predicted(n) for n, r in PUBLISHED.items() if r.metric == metric]
    return min(ratios), max(ratios)


def error(name: str) -> float:
    """predicted / published − 1 (negative: the planner expects the run to be faster than it was)."""
    return predicted(name) / published(name) - 1


def error_table() -> list[dict]:
    return [{"name": n, "metric": r.metric, "tp": r.tp, "predicted_s": predicted(n), "roofline_s": roofline_only(n),
             "published_s": r.measured_s, "error": error(n)} for n, r in PUBLISHED.items()]


def worst_error(metric: str) -> float:
    """The largest |error| over the runs of ``metric``."""
    return max(abs(r["error"]) for r in error_table() if r["metric"] == metric)


if __name__ == "__main__":  # python -m distai.lessons.lesson7.published: the error table
    for row in error_table():
        print(f"{row['name']:22} {row['metric']} TP {row['tp']}  planner {row['predicted_s'] * 1e3:7.2f} ms"
              f"  roofline {row['roofline_s'] * 1e3:7.2f} ms  published {row['published_s'] * 1e3:7.2f} ms"
              f"  error {row['error']:+.1%}")
    print(f"worst |error|: TPOT {worst_error('tpot'):.1%}, TTFT {worst_error('ttft'):.1%}")
