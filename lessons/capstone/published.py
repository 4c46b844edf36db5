"""Published parallel training layouts, where the planner ranks them, and how far its prediction is.

Each entry is a real run: the model, the cluster, the global batch, the (tp, pp, dp, cp, ep) it used
and the throughput it reported, with its source, and what its framework offered (ZeRO stages, ZeRO
with a pipeline, sequence parallelism, recomputation, FlashAttention). :func:`reproduce` runs the
planner (:mod:`.planner`) on the same model and cluster, restricted to that, and reports the rank of
the published layout among all layouts, its predicted MFU and the published MFU.

Each run's pipeline schedules are its framework's (``Axes.engine``, lesson 5's
:func:`~distai.lessons.lesson5.formulas.check_schedule`): Megatron-LM's (interleaving needs the
microbatches to be a multiple of the stages) for Megatron-LM and Korthikanti et al.; DeepSpeed's 1F1B on
any number of microbatches for MT-NLG and BLOOM; for Llama 3 Meta's interleaved schedule, which "can run
an arbitrary number of micro-batches", fewer than the stages included (Sec. 3.3.2), as
torch.distributed.pipelining's ScheduleInterleaved1F1B does (lesson 5's "torch" rule); DeepSeek-V3's
DualPipe (``Axes.dualpipe``: its own bubble, two stages per GPU). With fewer microbatches than stages an interleaved pipeline never fills: its step takes
p + (m−1)/v slots, not m + (p−1)/v.

The planner's GPU model (:func:`~.formulas.layer_forward_seconds`) has fitted constants, E per GPU kind
(the best fraction of peak a GEMM reaches) and one shared w½ (the size at which it reaches E/2): FIT
lists the runs they were fitted on (Megatron-LM's Table 1 for the A100, Llama 3's 8,192-GPU run for the
H100), :func:`fit_gpu_model` is the fit and the planner's constants are its optimum (a test re-runs it);
every other run is held out, and :func:`error_table` reports both.

What each framework did that the planner counts: Megatron-LM (2021-2022) and DeepSpeed's pipeline engine
reduce the gradients after the last backward, hiding none of it (``Axes.dp_overlap``; Megatron-LM's
``train_step`` all-reduces after ``forward_backward_func``, DeepSpeed's ReduceGrads ends its schedule; NVIDIA's
script for Table 1 ran its pp = 1 runs on PyTorch's DDP, which overlaps, a fact the planner leaves out because
the fit it brings takes the shape out of the GPU model, w½ = 0: :func:`what_if_run` "torch-ddp");
Megatron-LM's 2021 runs trained in fp16, their gradients held and all-reduced in fp16 (2 bytes; fp32 only
with bf16, ``accumulate_allreduce_grads_in_fp32``); its interleaved schedule needed more than 2 stages
(lesson 5's rule for blocking sends) and takes any number of chunks v whose layers divide a stage's (``megatron/arguments.py``
sets v = layers per stage // ``--num-layers-per-virtual-pipeline-stage``; NVIDIA's script for Table 1,
``examples/sc21/run_table_1.sh``, runs the 76.1B model with v = 3 and the 529.6B one with v = 3), searched
here up to 8. DeepSpeed's pipeline engine (MT-NLG, BLOOM) sends each TP rank's 1/t share of a stage's
output and input gradient and all-gathers it over the TP group on arrival (``is_pipe_partitioned`` =
``is_grad_partitioned`` = ``is_model_parallel`` in ``deepspeed/runtime/pipe/engine.py``, September 2020 to
November 2023). The output layer runs on the last stage only. How each microbatch's gradients reach the
buffer the reduction sends (``Axes.grad_accumulation``, :data:`~.planner.GRAD_ACCUMULATION`): Megatron-LM of
2021 left it to autograd (no ``--use-contiguous-buffers-in-ddp`` in ``examples/sc21``: ``param.grad`` added to
in place, 6 bytes a parameter in fp16, every microbatch after the first: "add"); Megatron-LM of 2022
(Korthikanti et al.) fuses it into the weight-gradient GEMM (``--gradient-accumulation-fusion``, on by default
since February 2022 with fp32 main gradients, i.e. bf16: "fused"); DeepSpeed's pipeline engine in bf16 (MT-NLG,
BLOOM) calls ``BF16_Optimizer.update_hp_grads`` after every microbatch's backward, ``hp_grad.add_(lp.grad.to(
float32))``: 18 bytes a parameter ("cast-add"; BLOOM ran that code; MT-NLG's bf16 pipeline predates it, an
assumption). OPT runs one microbatch a step (nothing to add); Llama 3 (Sec. 3.3.2) and DeepSeek-V3 (Sec. 3.3.3)
accumulate in fp32 without saying how: counted as fused, nothing more.

Sources (A100-80GB: 312 TFLOP/s bf16 dense, HBM 2.039 TB/s; H100 SXM: 989 TFLOP/s, 3.35 TB/s):
- Megatron-LM PTD-P: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC 2021, Table 1 (GPT models, sequence 2048, vocabulary 51,200, A100-80GB on
  Selene: 8 GPUs per node on NVLink/NVSwitch at 300 GB/s per direction, 8 × 200 Gb/s HDR InfiniBand per
  node = 25 GB/s per GPU). Throughputs count activation recomputation (their eq. 3); Megatron-LM then
  had no ZeRO and no sequence parallelism (data parallelism kept full optimizer states).
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023
  (arXiv:2205.05198), Table 3 (22B: 48 layers, h 6144, 64 heads, 8 GPUs, batch 4, TP 8; 175B: 96,
  12288, 96, 64 GPUs, batch 64, TP 8 × PP 8; 530B: 105, 20480, 128, 280 GPUs, batch 280, TP 8 × PP 35;
  1T: 128, 25600, 160, 512 GPUs, batch 512, TP 8 × PP 64; sequence 2048) and Table 5 (MFU with
  sequence parallelism and selective recomputation: 41.5, 51.4, 56.0, 56.3%). Selene, as above.
- MT-NLG 530B: Smith et al., "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B",
  arXiv:2201.11990, 2022, Sec. 2.3: 105 layers, h 20480, 128 heads, sequence 2048, batch 1920, TP 8,
  PP 35 on 280, 350 and 420 DGX A100 nodes (DP 8, 10, 12): 60.1, 50.2 and 44.4 s per iteration;
  DeepSpeed's pipeline engine (ZeRO-1), activation checkpointing, no sequence parallelism; bf16 (Sec. 2.3),
  which DeepSpeed's released pipeline engine gained only in April 2022 (its PR #1801), so the exact code
  MT-NLG ran is not public; no micro-batch size stated. Checked against DeepSpeed v0.5.4 (October 2021) and
  Megatron-DeepSpeed of September 2021, and counted or negligible: the bf16 pipeline's reduction, as
  DeepSpeed's BF16_Optimizer runs it (``_bf16_reduce_grads``: the fp32 gradients all-reduced whole, then its
  own ZeRO-1 all-gathers the updated bf16 weights; ``Axes.zero1_reduction`` "all-reduce"; 0.53 s on DP 8,
  where the planner's best is without that ZeRO-1: the memory fits); the tied word embedding's gradient
  all-reduce between the first and last stages (``PipelineModule.allreduce_tied_weight_gradients``: 51200/8 ×
  20480 × 2 B = 262 MB on 2 ranks, 10.5 ms); TrainSchedule takes 1F1B's m + p − 1 slots (its commands
  simulated with blocking sends); the attention mask is kept in ``args``, never sent; the bf16 gradients
  added into fp32 after each microbatch (``update_hp_grads``, 34 GB of HBM traffic a microbatch on each GPU,
  17 ms). Not counted, not timed by any source: a host synchronisation or two per microbatch
  (``ThroughputTimer.start``, ``PartitionedTensor.from_meta``'s ``tolist``). The prediction stays high by 8
  to 12%, more with more nodes (a data-parallel cost the model lacks?); micro-batches of 2 would double the
  bubble (:func:`microbatch_error`), but no source says MT-NLG ran them.
- OPT-175B: Zhang et al., "OPT: Open Pre-trained Transformer Language Models", arXiv:2205.01068, 2022,
  Sec. 2.4 and Table 1: 992 A100-80GB, FSDP with Megatron-LM tensor parallelism (TP 8, so 124-way
  FSDP), 96 layers, h 12288, 96 heads, batch 2M tokens of 2048, "up to 147 TFLOP/s per GPU".
  2M tokens are 1024 sequences, which 124 data ranks cannot split: metaseq's launcher
  (``metaseq/launcher/opt_baselines.py``) gives each data rank (2,097,152 // 124) // 2048 = 8 sequences,
  992 in all (2.03M tokens), in one microbatch (``--update-freq 1``). The 147 TFLOP/s are counted the
  Megatron-LM way (eq. 3, with the recomputed forward): metaseq's ``projects/OPT/chronicles/final_update.md``
  puts 300B tokens at "~4.30E+23 FLOPs", 1.43e12 per token, eq. 3's count for this shape (1.434e12), and at
  "~33 days ... on 1024 80GB A100s", which is 147 TFLOP/s per GPU.
- Llama 3 405B: Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, 2024, Table 4
  and Sec. 3.3: 126 layers, h = 16384, 128 heads, 8 KV heads, vocabulary 128,256, 16M tokens per batch;
  H100-80GB, 8 per server on NVLink, 400 Gb/s RoCE per GPU; FSDP with pipeline parallelism (Sec.
  3.3.2). Sequence 8192: TP 8, PP 16, DP 64 on 8,192 GPUs, 430 TFLOP/s per GPU, 43% BF16 MFU; DP 128 on
  16,384, 400 TFLOP/s, 41%. Sequence 131,072: TP 8, CP 16, PP 16, DP 8 on 16,384 GPUs, 380 TFLOP/s, 38%.
  The DP column is what the rest of each row fixes: GPUs / (TP·CP·PP) = 64, 128 and 8, and 16M tokens a batch
  = DP × sequences per replica × sequence (64 × 32 × 8192, 128 × 16 × 8192, 8 × 16 × 131,072). P. Balaji's
  SC'24 talk ("Herding Llamas") shows the same GPUs, TP, CP, PP, 16M tokens and TFLOP/s per GPU.
  Assumption: those TFLOP/s count the causal half of the attention scores (6Ψ + 6·L·h·s per token, as
  FlashAttention computes a causal mask); the planner's MFU counts PaLM's 6Ψ + 12·L·h·s. The two differ
  by 4% at 8K and by 40% at 128K, where the scores are most of the work.
- BLOOM-176B: BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model",
  arXiv:2211.05100, 2022, Sec. 3.4; bigscience-workshop/bigscience ``train/tr11-176B-ml`` (README and
  ``tr11-176B-ml.slurm``): 384 A100-80GB in 48 nodes, TP 4, PP 12, DP 8, micro-batch 2, global batch
  2048 of 2048 tokens, 70 layers, h = 14336, 112 heads, vocabulary 250,880, activation checkpointing,
  BF16 optimizer with its own ZeRO-1; "about 150 TFLOPs" per GPU counted with recomputation (README,
  "Throughput"); 4 NVLink links per GPU (25 GB/s per direction each) and 4 × 100 Gb/s Omni-Path per
  node (6.25 GB/s per GPU).
- GPT-NeoX-20B: Black et al., "GPT-NeoX-20B: An Open-Source Autoregressive Language Model", BigScience
  Workshop at ACL 2022 (arXiv:2204.06745), Secs. 2-3, and EleutherAI/gpt-neox ``configs/20B.yml``: 44 layers, h
  6144, 64 heads, vocabulary 50,432 (padded), untied embeddings, 20,556,201,984 parameters (the model card),
  sequence 2048; 96 A100-SXM4-40GB in 12 nodes (HBM 1.555 TB/s; NVSwitch; four 200 Gb/s HDR HCAs a node,
  12.5 GB/s per GPU); TP 2, PP 4, DP 12 on DeepSpeed's pipeline engine with its fp16 ZeRO-1, micro-batch 4,
  32 a step (1,536 sequences; the paper writes 1,538), full recomputation; "117 teraFLOPS per GPU",
  taken as gpt-neox's ``get_flops`` logged it then (6Ψ + 60·s·h·l a token, :func:`~.formulas.neox_flops_per_token`:
  the paper does not say). Left out: its attention and MLP in parallel, summed with one all-reduce (the
  paper credits them with 15% more throughput), rotary embeddings, dropout 0, synchronize-each-layer.
- DeepSeek-V3: DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024: 61 layers (the first
  3 dense, their MLP 18,432 wide = 9 × 2048: the same active FLOPs as an MoE layer), h 7168, 128 heads of
  Multi-head Latent Attention (q·k 192 = 128 + 64 of RoPE, v 128 per head; its projections ~187M
  parameters a layer), 1 shared and 256 routed experts of width 2048 per MoE layer, top-8, each token's
  experts on at most 4 nodes, vocabulary 129,280, 671B parameters (37B active) plus the 14B
  multi-token-prediction module, sequence 4096, batch 15,360; 2,048 H800 (989 TFLOP/s bf16 dense, 1,979
  FP8; NVLink 160 GB/s and 50 GB/s InfiniBand per GPU, Sec. 3.2.2), PP 16, EP 64, ZeRO-1 data parallelism,
  no TP (Sec. 3.2); FP8 GEMMs for every linear layer's forward and both backward products (Fprop, Dgrad,
  Wgrad, Sec. 3.3.1), with 1×128 and 128×128 scaling tiles and promotion to CUDA cores every 128 elements;
  embedding, output head, gating, norms and the attention core in bf16 (Sec. 3.3.1); 20 of the 132 SMs run
  the all-to-all (Sec. 3.2.2, 3.5.1; the profile's GEMMs run on grids of 112 blocks); 2.664M GPU hours of
  pre-training for 14.8T tokens, "180K H800 GPU hours per trillion tokens" (Sec. 1, Table 1): 1,543
  tokens/s per GPU. The MFU compared is that throughput times the model's FLOPs per token (6 × active
  parameters + 12·L·s·a·(192 + 128)/2, MLA's attention core counted; documents packed without cross-sample
  masking, Sec. 4.1, so the whole 4K causal core runs) over the bf16 dense peak, 989 TFLOP/s; the planner's
  MFU counts the same FLOPs, so the error is the step time's.
  How fast its GPUs ran, from DeepSeek's own publications, not fitted (no FP8 run is in FIT):
  the FP8 GEMMs at DeepGEMM's README TFLOP/s for the layer's shapes (its first version, 2025-02-25, H800,
  M = 4096) over DeepGEMM's speedup on DeepSeek's CUTLASS-based kernels, which the training profile
  shows it ran (:data:`DEEPSEEK_V3_LINEARS`, :func:`deepseek_fp8_gemm_fraction`: 51.6% of the FP8 peak
  FLOP-weighted); the FP8 casts through HBM as Sec. 3.5.2 describes them (:func:`deepseek_fp8_cast_bytes_per_token`);
  the attention core's forward and backward kernels as deepseek-ai/profile-data's train.json times them
  (:func:`deepseek_attention_profile`); DualPipe's bubble (PP/2 − 1)(F&B + B − 3W), two copies of the
  parameters and PP + 1 microbatches of activations per GPU (Sec. 3.2.1, Table 2; deepseek-ai/DualPipe),
  the all-to-all and the PP sends hidden behind the paired chunk (Fig. 4), each token's experts on at most
  4 nodes, the dispatch in FP8 (Sec. 3.3.3).
  Approximations: the multi-token-prediction module as a 62nd layer (its 2h×h projection in the
  parameters, and the output head counted twice: the module runs it again); the dense layers inside the
  average layer (exact in FLOPs) and at the MoE layer's GEMM rates; the backward's FP8 GEMMs at the
  forward's measured rate (DeepGEMM published forward shapes only); W, DualPipe's weight-gradient chunk,
  as one forward's GEMMs; the planner's activation count, which knows no FP8 caching, fits the published
  layout only with full recomputation, where DeepSeek recomputed only the RMSNorms, MLA's up-projections
  and SwiGLU (with those, memory not checked, the prediction is 37% high: ``python bench/planner_fit.py``
  prints it; one layer takes 25.3 ms in the model against 29.5 ms of kernels on the profile's compute
  stream, the rest MoE token permutation, norms, RoPE and casts the byte count misses). The published
  figure is also an average over the whole pre-training (the batch ramp from 3,072, checkpoints), not one
  step. AdamW's moments are in BF16 as DeepSeek kept them (Sec. 3.3.3; ``Axes.moments`` "bf16": lesson 2's 8
  bytes a parameter with the fp32 master copy, in the memory and in the optimizer step's bytes alike). The
  prediction is 16.7% high: a named miss.
Pure Python.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import TypedDict

from . import formulas as f
from . import planner as pl


class Hardware(TypedDict, total=False):
    """A GPU's and its network's figures, as :class:`~.planner.Cluster` keywords."""
    flops: float
    intra_bandwidth: float
    inter_bandwidth: float
    hbm_bandwidth: float
    gemm_peak_fraction: float
    flash_attention: bool
    linear_flops: float
    linear_efficiency: float
    quantize_bytes_per_token: float
    attention_efficiency: float
    attention_backward: float
    compute_share: float
    expert_a2a_overlap: bool
    expert_dispatch_bytes: float
    expert_node_limit: int


# E, the best fraction of peak a GEMM reaches, per GPU kind, and w½ (planner.GEMM_HALF_WIDTH): fitted by
# bench/planner_fit.py on FIT (least squares of log(predicted / published MFU)), kept in the planner.
A100_GEMM = pl.A100_GEMM
H100_GEMM = pl.H100_GEMM
A100: Hardware = dict(flops=312e12, intra_bandwidth=300e9, inter_bandwidth=25e9,  # Selene (DGX A100)
                      hbm_bandwidth=2.039e12, gemm_peak_fraction=A100_GEMM, flash_attention=False)
H100: Hardware = dict(flops=989e12, intra_bandwidth=450e9, inter_bandwidth=50e9,  # Meta's Grand Teton, 400 Gb/s RoCE
                      hbm_bandwidth=3.35e12, gemm_peak_fraction=H100_GEMM, flash_attention=True)
H800: Hardware = {**H100, "intra_bandwidth": 160e9}  # H100 with NVLink cut: 160 GB/s (DeepSeek-V3 report, Sec. 3.2.2)
BLOOM_A100: Hardware = {**A100, "intra_bandwidth": 100e9, "inter_bandwidth": 6.25e9}  # Jean Zay (see above)


@dataclass(frozen=True)
class Published:
    name: str
    model: pl.ModelSpec
    cluster: pl.Cluster
    global_batch: int
    layout: tuple[int, int, int, int, int]  # (tp, pp, dp, cp, ep)
    measure: str  # what was published: "megatron" (TFLOP/s counted with recomputation, eq. 3), "causal"
    #               (TFLOP/s counting the causal half of the attention scores), "neox" (TFLOP/s counted as
    #               GPT-NeoX did, formulas.neox_flops_per_token), "mfu", "step" (seconds per
    #               step) or "tokens" (tokens/s per GPU)
    value: float  # that figure: FLOP/s per GPU, an MFU, seconds or tokens/s
    axes: pl.Axes = field(default_factory=pl.Axes)  # what the run's framework offered
    microbatch: int | None = None  # as published, when the source says
    source: str = ""


def _axes(layout: tuple[int, ...], **kw) -> pl.Axes:
    """The framework's options; cp and ep fixed as published (the other degrees free)."""
    return pl.Axes(cp=layout[3], ep=layout[4], **kw)


# Megatron-LM, 2021 and 2022 (Korthikanti et al.): its interleaved schedule asserts that the microbatches
# are a multiple of the stages (lesson 5's "megatron" rule)
MEGATRON_CHUNKS = tuple(range(1, 9))  # any v whose layers divide a stage's (the module's docstring), up to 8
# NVIDIA's script for Table 1 (examples/sc21/run_table_1.sh, 2021-08) runs micro-batches of 16 (1.7B to 7.5B), 8,
# 4, 2, 2, 1, 1 and 1: the search reaches 16 for them
MEGATRON_2021 = dict(microbatches=(*pl.MICROBATCHES, 16), zero=(0,), max_zero_pp=0, sp=(False,), recompute=("full",),
                     engine="megatron", dp_overlap=False, grad_accumulation="add",
                     chunks=MEGATRON_CHUNKS)
MEGATRON_2022 = dict(zero=(0,), max_zero_pp=0, sp=(True,), recompute=("selective",), engine="megatron",
                     dp_overlap=False, chunks=MEGATRON_CHUNKS)
# MT-NLG, BLOOM: DeepSpeed's PipelineEngine runs 1F1B only (its TrainSchedule), on any number of microbatches,
# the rule lesson 5 states for Megatron-LM's 1F1B
# DeepSpeed's PipelineEngine sends each TP rank's 1/t share of a stage's output and input gradient, blocking, and
# all-gathers it over the TP group on the other side (p2p="deepspeed", planner._deepspeed_p2p_per_microbatch);
# in bf16 its BF16_Optimizer adds each microbatch's gradients into fp32 ("cast-add") and all-reduces them whole
# before its own ZeRO-1 updates a shard and all-gathers the weights (zero1_reduction="all-reduce")
DEEPSPEED = dict(zero=(0, 1), max_zero_pp=1, sp=(False,), recompute=("full",), chunks=(1,), p2p="deepspeed",
                 engine="megatron", dp_overlap=False, grad_accumulation="cast-add", zero1_reduction="all-reduce")


def _gpt(params: float, layers: int, hidden: int, heads: int, vocab: int = 51200) -> pl.ModelSpec:
    return pl.ModelSpec(params, layers, hidden, heads, heads, 2048, vocab)


def _megatron(size: str, params: float, layers: int, hidden: int, heads: int, gpus: int, batch: int,
              tp: int, pp: int, tflops: float) -> Published:
    layout = (tp, pp, gpus // (tp * pp), 1, 1)
    # fp16 (Megatron-LM's examples/pretrain_gpt3_175B.sh of 2021: --fp16): gradients held and all-reduced in
    # fp16, fp32 only with bf16 (accumulate_allreduce_grads_in_fp32)
    cluster = pl.Cluster(gpus, 80e9, **A100, grad_bytes=2)
    return Published(f"megatron-{size}", _gpt(params, layers, hidden, heads), cluster,
                     batch, layout, "megatron", tflops * 1e12, _axes(layout, **MEGATRON_2021),
                     source="Narayanan et al. 2021, Table 1")


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


def _korthikanti(size: str, params: float, layers: int, hidden: int, heads: int, gpus: int, pp: int,
                 mfu: float) -> Published:
    layout = (8, pp, 1, 1, 1)  # TP 8, one pipeline, the batch = the GPUs (Table 3)
    return Published(f"korthikanti-{size}", _gpt(params, layers, hidden, heads), pl.Cluster(gpus, 80e9, **A100),
                     4 if size == "22b" else gpus, layout, "mfu", mfu, _axes(layout, **MEGATRON_2022),
                     source="Korthikanti et al. 2022, Tables 3 and 5")


KORTHIKANTI = (
    _korthikanti("22b", 22.06e9, 48, 6144, 64, 8, 1, 0.415),
    _korthikanti("175b", 174.6e9, 96, 12288, 96, 64, 8, 0.514),
    _korthikanti("530b", 529.6e9, 105, 20480, 128, 280, 35, 0.560),
    _korthikanti("1t", 1008e9, 128, 25600, 160, 512, 64, 0.563),
)
# The paper states no micro-batch size for these runs (Sec. 2.1's "1920 microbatches instead of a single micro-batch
# of size 1920" is an example of what gradient accumulation does to activation memory, not their setting): the
# planner takes the layout's best, 1 (:func:`microbatch_error` gives the others)
MTNLG = tuple(
    Published(f"mt-nlg-530b-{nodes}", _gpt(529.6e9, 105, 20480, 128), pl.Cluster(nodes * 8, 80e9, **A100), 1920,
              (8, 35, nodes * 8 // 280, 1, 1), "step", seconds, _axes((8, 35, 0, 1, 1), **DEEPSPEED),
              source="Smith et al. 2022, Sec. 2.3")
    for nodes, seconds in ((280, 60.1), (350, 50.2), (420, 44.4)))
# OPT-175B as metaseq's launcher ran it (metaseq/launcher/opt_baselines.py, opt_job_constants.py, May 2022):
# --batch-size (2M tokens // 124 data ranks) // 2048 = 8 and --update-freq 1, so one microbatch of 8 per step and
# 992 sequences in all; --memory-efficient-fp16 without --fp32-reduce-scatter: fp16 weights, gradients
# reduce-scattered in fp16 (2 bytes); --checkpoint-activations with --distribute-checkpointed-activations;
# FSDP with --no-reshard-after-forward (each layer gathered once, in the forward, and kept for the backward:
# taken here as ZeRO-3, whose gathers the compute hides either way)
OPT = Published("opt-175b", _gpt(174.6e9, 96, 12288, 96, 50272),
                pl.Cluster(992, 80e9, **A100, grad_bytes=2, distributed_checkpoints=True), 992,
                (8, 1, 124, 1, 1), "megatron", 147e12,
                _axes((8, 1, 124, 1, 1), zero=(3,), sp=(False,), recompute=("full",)), microbatch=8,
                source="Zhang et al. 2022, Sec. 2.4; metaseq's launcher (see the module's sources)")
LLAMA3_405B = pl.ModelSpec(405e9, 126, 16384, 128, 8, 8192, 128256, tied_embeddings=False)
# FSDP with pipeline parallelism and Meta's interleaved schedule with a flexible number of microbatches
# (Sec. 3.3.2: "fewer micro-batches than the number of stages" allowed), the schedule that
# torch.distributed.pipelining's ScheduleInterleaved1F1B runs: lesson 5's "torch" rule
LLAMA3_AXES = dict(max_zero_pp=3, engine="torch")
LLAMA3 = (
    Published("llama3-405b-8k", LLAMA3_405B, pl.Cluster(8192, 80e9, **H100), 2048, (8, 16, 64, 1, 1), "causal", 430e12,
              _axes((8, 16, 64, 1, 1), **LLAMA3_AXES), source="Llama 3 paper, Table 4"),
    Published("llama3-405b-16k", LLAMA3_405B, pl.Cluster(16384, 80e9, **H100), 2048, (8, 16, 128, 1, 1), "causal",
              400e12, _axes((8, 16, 128, 1, 1), **LLAMA3_AXES), source="Llama 3 paper, Table 4"),
    Published("llama3-405b-128k", replace(LLAMA3_405B, seq=131072),
              pl.Cluster(16384, 80e9, **H100), 128, (8, 16, 8, 16, 1), "causal", 380e12,
              _axes((8, 16, 8, 16, 1), microbatches=(1,), **LLAMA3_AXES), microbatch=1,
              source="Llama 3 paper, Table 4"),
)
BLOOM = Published("bloom-176b", pl.ModelSpec(176.2e9, 70, 14336, 112, 112, 2048, 250880),
                  pl.Cluster(384, 80e9, **BLOOM_A100), 2048,
                  (4, 12, 8, 1, 1), "megatron", 150e12, _axes((4, 12, 8, 1, 1), **DEEPSPEED), microbatch=2,
                  source="BigScience tr11-176B-ml README and slurm script; BLOOM paper Sec. 3.4")
# GPT-NeoX-20B as EleutherAI trained it (configs/20B.yml): DeepSpeed's pipeline engine and its fp16 ZeRO-1
# (reduce_scatter: true, so a reduce-scatter and an all-gather of the updated fp16 weights, not BF16_Optimizer's
# all-reduce), gradients added into param.grad in fp16 by autograd after the first microbatch ("add", 2 bytes);
# micro-batch 4, 32 of them a step on DP 12: 1,536 sequences (the paper's "1538" is a typo of the config's
# product); full recomputation of every layer; untied embeddings (no-weight-tying). Its cluster: 12 nodes of 8
# A100-SXM4-40GB (HBM 1.555 TB/s) on NVSwitch, four 200 Gb/s HDR HCAs a node: 12.5 GB/s per GPU.
# Approximations: its parallel attention and MLP (gpt_j_residual: one TP all-reduce in the forward where the
# planner counts two), rotary embeddings on a quarter of each head, dropout 0 (the planner counts the masks) and
# its synchronize-each-layer are left out; DeepSpeed's topology puts the pipeline outermost, as the planner does.
NEOX_A100_40GB: Hardware = {**A100, "inter_bandwidth": 12.5e9, "hbm_bandwidth": 1.555e12}
NEOX_20B = Published("gpt-neox-20b", pl.ModelSpec(20.556e9, 44, 6144, 64, 64, 2048, 50432, tied_embeddings=False),
                     pl.Cluster(96, 40e9, **NEOX_A100_40GB, grad_bytes=2), 1536, (2, 4, 12, 1, 1), "neox", 117e12,
                     _axes((2, 4, 12, 1, 1), **{**DEEPSPEED, "grad_accumulation": "add",
                                                "zero1_reduction": "reduce-scatter"}), microbatch=4,
                     source="Black et al. 2022, Sec. 3; EleutherAI/gpt-neox configs/20B.yml")
# DeepSeek-V3 as its report describes it (see the module's sources): 61 layers and the multi-token-prediction
# module (one more MLA + MoE block) as 62; with the embedding and output slots they fill PP 16's stages, 4 slots
# each. Parameters: the 671B of the main model, the MTP block and its 2h×h projection (11.6B), and the shared
# output head once more (0.93B: the MTP module runs it again, FLOPs-wise a second head). MLA's attention core:
# q·k over 192 per head (128 + 64 of RoPE), v over 128.
DEEPSEEK_V3_PARAMS = 671e9 + 11.61e9 + 129280 * 7168
DEEPSEEK_V3_MODEL = pl.ModelSpec(DEEPSEEK_V3_PARAMS, 62, 7168, 128, 128, 4096, 129280, experts=256, top_k=8,
                                 expert_ffn=2048, shared_experts=1, moe_layers=59, qk_head_dim=192, v_head_dim=128,
                                 tied_embeddings=False)

# DeepSeek-V3's FP8 linear layers, per token (Sec. 4.2's shapes: h 7168, query latent 1536, KV latent 512
# plus the 64-wide shared RoPE key, 128 heads of 128 + 64 (q·k) and 128 (v), experts 2048 wide): (name, K
# the input width, N the output width, copies per token, the DeepGEMM row), the row's measured TFLOP/s on
# H800 at M = 4096 rows, one microbatch of one 4K sequence (DeepGEMM README as first published,
# deepseek-ai/DeepGEMM commit a6d97a1, 2025-02-25: "Normal GEMMs for dense models" and, for the routed
# experts, "Grouped GEMMs for MoE models (contiguous layout)", 4 groups of 8192 rows: EP 64 puts 256 / 64 = 4
# experts on a GPU, each receiving 64 · 4096 · 8 / 256 = 8192 token copies when balanced), with the README's
# speedup over DeepSeek's "internally and carefully optimized implementation based on CUTLASS 3.6" — the
# kernels the training ran: the training profile (deepseek-ai/profile-data, train.json) shows its GEMMs as
# cutlass::device_kernel<dpsk::grouped_gemm::...>, not DeepGEMM's. (K, N, copies, TFLOP/s, speedup).
DEEPSEEK_V3_LINEARS = (
    ("MLA down-projections (q 1536, kv 512 + 64)", 7168, 2112, 1, 1058e12, 1.1),
    ("MLA query up-projection", 1536, 24576, 1, 990e12, 1.0),
    ("MLA key-value up-projection", 512, 32768, 1, 590e12, 1.0),
    ("MLA output projection", 16384, 7168, 1, 1358e12, 1.2),
    ("shared expert gate and up", 7168, 4096, 1, 1304e12, 1.1),
    ("shared expert down", 2048, 7168, 1, 1025e12, 1.1),
    ("routed experts gate and up", 7168, 4096, 8, 1297e12, 1.2),
    ("routed experts down", 2048, 7168, 8, 1099e12, 1.2),
)
FP8_PEAK = 2 * 989e12  # H800 dense FP8 Tensor Core peak


def deepseek_fp8_gemm_fraction(kernels: str = "training") -> float:
    """The fraction of the FP8 peak an MoE layer's linear GEMMs reach, FLOP-weighted over
    DEEPSEEK_V3_LINEARS (total FLOPs over total time): ``kernels`` "training" (DeepSeek's CUTLASS-based
    kernels, DeepGEMM's TFLOP/s over its speedup) or "deepgemm" (DeepGEMM's own). Measured with all 132
    SMs; the planner scales it by the SMs left to compute. Approximations: the README measures the forward
    (NT) GEMM; the backward's two GEMMs (Dgrad, Wgrad, also FP8: Sec. 3.3.1) are taken at the same rate; the
    3 dense layers' MLPs (18,432 wide) at the MoE layer's rate."""
    flops = sum(k * n * copies for _, k, n, copies, _, _ in DEEPSEEK_V3_LINEARS)
    seconds = sum(k * n * copies / (tflops / (speedup if kernels == "training" else 1.0))
                  for _, k, n, copies, tflops, speedup in DEEPSEEK_V3_LINEARS)
    return flops / seconds / FP8_PEAK


def deepseek_fp8_cast_bytes_per_token() -> float:
    """HBM bytes per token and MoE layer, per training step, of casting to FP8 outside the GEMMs, as the
    report's Sec. 3.5.2 describes the workflow: each linear layer's input read in bf16 and written in FP8
    (2 + 1 bytes per element), then, in the backward, read in FP8, transposed and written again (1 + 1:
    its Wgrad needs 128×1 tiles); its output gradient cast for Dgrad (1×128 tiles) and again for Wgrad
    (128×1), each 2 + 1. The routed experts' input is cast once, before the FP8 dispatch (Sec. 3.3.3), its
    transposes once per copy. The scales (4 bytes per 128 elements) are left out."""
    total = 0.0
    for name, k, n, copies, _, _ in DEEPSEEK_V3_LINEARS:
        forward_casts = 1 if name.startswith("routed experts gate") else copies
        total += 3 * k * forward_casts + 2 * k * copies + 2 * 3 * n * copies
    return total


# DeepSeek-V3's attention core in its training profile (deepseek-ai/profile-data, train.json: one forward and
# one backward chunk of 4 MoE layers, EP64, TP1, 4K sequence, one sequence per microbatch, on H800 beside the
# 20 communication SMs): each layer's FlashAttention kernels (head dims 192 and 128, bf16), in µs: the forward
# (flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128, ...>>), and the backward: its preprocess, main
# kernel (flash::FlashAttnBwd) and dQ conversion
PROFILE_ATTENTION_FORWARD_US = (1248, 1199, 1280, 1221)
PROFILE_ATTENTION_BACKWARD_US = ((267, 3583, 215), (269, 3863, 216), (246, 3809, 223), (243, 3860, 223))


def deepseek_attention_profile() -> tuple[float, float]:
    """(the attention core's forward as a fraction of the 112 computing SMs' bf16 peak, its backward's
    time over its forward's), from the profile: the causal core's forward FLOPs, 2·s²·a·(192 + 128)/2
    (the masked half skipped, as the planner counts FlashAttention), over the mean forward time."""
    m = DEEPSEEK_V3_MODEL
    flops = 4 * m.seq * m.seq * m.attention_width * 0.5
    forward = sum(PROFILE_ATTENTION_FORWARD_US) / len(PROFILE_ATTENTION_FORWARD_US) * 1e-6
    backward = sum(map(sum, PROFILE_ATTENTION_BACKWARD_US)) / len(PROFILE_ATTENTION_BACKWARD_US) * 1e-6
    return flops / forward / (H800["flops"] * 112 / 132), backward / forward


# H800 as DeepSeek ran it: the linear layers' GEMMs in FP8 at DeepSeek's measured rate on its own shapes
# (deepseek_fp8_gemm_fraction; the attention core, the output head and the gating in bf16, Sec. 3.3.1) and
# their FP8 casts through HBM (deepseek_fp8_cast_bytes_per_token), 112 of its 132 SMs computing (20 run the
# all-to-all, Sec. 3.2.2), the all-to-all hidden by DualPipe as far as the compute lasts, its dispatch in FP8
# (one byte per element plus one fp32 scale per 128) and each token's experts on at most 4 nodes
DEEPSEEK_H800: Hardware = {**H800, "linear_flops": FP8_PEAK, "compute_share": 112 / 132,
                           "linear_efficiency": deepseek_fp8_gemm_fraction(),
                           "quantize_bytes_per_token": deepseek_fp8_cast_bytes_per_token(),
                           "attention_efficiency": deepseek_attention_profile()[0],
                           "attention_backward": deepseek_attention_profile()[1],
                           "expert_a2a_overlap": True, "expert_dispatch_bytes": 1 + 4 / 128,
                           "expert_node_limit": 4}
DEEPSEEK_V3 = Published("deepseek-v3", DEEPSEEK_V3_MODEL, pl.Cluster(2048, 80e9, **DEEPSEEK_H800), 15360,
                        (1, 16, 128, 1, 64), "tokens", 1e12 / (180e3 * 3600),
                        _axes((1, 16, 128, 1, 64), tp=1, zero=(1,), max_zero_pp=1, sp=(False,),
                              chunks=(1,), dualpipe=True, moments="bf16"),  # DualPipe: no interleaved chunks
                        source="DeepSeek-V3 technical report, Sec. 1 and 3.2 (approximations above)")
# deepseek-ai/profile-data, train.json: the busy time of the compute stream (stream 7, kernels summed) over its
# 4 MoE layers' forward and backward chunks, in µs (the Wgrad stream beside it not added)
PROFILE_COMPUTE_STREAM_US = 118193


def deepseek_layer_seconds() -> dict:
    """One layer's forward and backward for one 4K sequence, no recomputation: {"planner" (the average
    layer on the GPU model, FP8 casts included), "profile" (DeepSeek's compute stream, per MoE layer)}."""
    seconds, _ = pl.layer_seconds(DEEPSEEK_V3_MODEL, DEEPSEEK_V3.cluster, 1, "none")
    return {"planner": seconds, "profile": PROFILE_COMPUTE_STREAM_US / 4 * 1e-6}


def deepseek_own_recompute_error() -> float:
    """The error of DeepSeek-V3's prediction with its own recomputation (RMSNorm, MLA's up-projections: the
    planner's "selective" is the nearest) in place of full, the memory not checked."""
    p = DEEPSEEK_V3
    c = pl.evaluate(p.model, replace(p.cluster, gpu_memory=1e12), p.global_batch,
                    pl.Config(1, 16, 128, 1, 1, "selective", 1, False, 1, 64), axes=p.axes)
    return c.mfu / published_mfu(p.name) - 1


PUBLISHED = {p.name: p for p in (*MEGATRON, *KORTHIKANTI, *MTNLG, OPT, *LLAMA3, BLOOM, NEOX_20B, DEEPSEEK_V3)}
# the runs E and w½ were fitted on; every other run is held out
FIT = tuple(p.name for p in MEGATRON) + ("llama3-405b-8k",)


def _get(name: str) -> Published:
    if name not in PUBLISHED:
        raise ValueError(f"unknown published layout {name!r}; choose one of {', '.join(PUBLISHED)}")
    return PUBLISHED[name]


def published_mfu(name: str) -> float:
    """The run's MFU: stated by the publisher (Korthikanti, Llama 3), its throughput counted with
    recomputation (Megatron-LM's eq. 3) scaled to the model's FLOPs (:func:`~.formulas.published_mfu`),
    its step time, or its tokens per second per GPU."""
    p = _get(name)
    m, n, peak = p.model, p.cluster.gpus, p.cluster.flops
    model_flops = pl.model_flops_per_step(m, p.global_batch)
    if p.measure == "mfu":
        return p.value
    if p.measure == "step":
        return f.mfu(model_flops, p.value, n, peak)
    if p.measure == "tokens":
        return p.value * model_flops / (p.global_batch * m.seq) / peak
    if p.measure == "neox":  # GPT-NeoX's count, 6Ψ + 60·s·h·l per token
        counted = f.neox_flops_per_token(m.params, m.seq, m.hidden, m.layers)
        return p.value * (model_flops / (p.global_batch * m.seq)) / counted / peak
    if p.measure == "causal":  # 6Ψ + 6·L·h·s per token: the masked half of the scores is not counted
        causal = 6 * m.active_params + 6 * m.layers * m.attention_width * m.seq
        return p.value * (model_flops / (p.global_batch * m.seq)) / causal / peak
    counted = f.megatron_flops_per_step(p.global_batch, m.seq, m.layers, m.hidden, m.vocab)
    return f.published_mfu(p.value, counted, model_flops, peak)


def with_gpu_model(p: Published, peak_fraction: float, half_width: float) -> Published:
    """``p`` on a cluster whose GPUs follow other constants E and w½ (what the fit tries)."""
    return replace(p, cluster=replace(p.cluster, gemm_peak_fraction=peak_fraction, gemm_half_width=half_width))


# ------------------------------------------------------------------------------ the fit
#
# E per GPU kind and one w½, chosen to minimise the sum over the FIT runs of log(predicted / published MFU)²,
# each run's prediction the planner's for its published layout (the other degrees searched as always):
# w½ on FIT_HALF_WIDTHS with the A100's E, on a grid of FIT_STEP, at its best for each w½; then the
# H100's E on the H100 runs with that w½. bench/planner_fit.py prints it; the test checks that the module's
# constants are this optimum.

FIT_STEP = 0.01  # E's grid: two decimals, as printed
FIT_HALF_WIDTHS = tuple(float(w) for w in range(0, 425, 25))  # w½ from 0 to 400


def _at_layout(p: Published) -> Published:
    """``p`` with its tp, pp and dp fixed as published: the same prediction, without the other layouts."""
    tp, pp, dp, _, _ = p.layout
    return replace(p, axes=replace(p.axes, tp=tp, pp=pp, dp=dp))


def _as_published(p: Published) -> Published:
    return p


def fit_loss(names: tuple[str, ...], peak_fraction: float, half_width: float,
             variant: Callable[[Published], Published] = _as_published) -> float:
    """Σ log(predicted / published MFU)² over ``names`` with the GPU constants E and w½ (a layout that no
    longer fits counts 10); ``variant`` changes each run before it is predicted (what-if fits)."""
    total = 0.0
    for name in names:
        r = reproduce_run(_at_layout(with_gpu_model(variant(_get(name)), peak_fraction, half_width)))
        total += math.log(r["predicted_mfu"] / r["published_mfu"]) ** 2 if r["predicted_mfu"] else 10.0
    return total


def fit_peak_fraction(names: tuple[str, ...], half_width: float, start: float,
                      variant: Callable[[Published], Published] = _as_published) -> tuple[float, float]:
    """(loss, E): the grid's E nearest the minimum of :func:`fit_loss` at ``half_width``, walking FIT_STEP
    by FIT_STEP downhill from ``start`` (the loss has one minimum in E: a faster GPU, a larger MFU)."""
    def at(e: float) -> tuple[float, float]:
        e = round(e, 4)
        return fit_loss(names, e, half_width, variant), e

    best = at(start)
    for direction in (1, -1):
        while 0 < round(best[1] + direction * FIT_STEP, 4) <= 1:  # E is a fraction of peak
            step = at(best[1] + direction * FIT_STEP)
            if step[0] >= best[0]:
                break
            best = step
    return best


def fit_set(kind: float) -> tuple[str, ...]:
    """The FIT runs on GPUs of peak ``kind`` FLOP/s."""
    return tuple(n for n in FIT if PUBLISHED[n].cluster.flops == kind)


def gpu_constants() -> dict:
    """The planner's GPU constants, as the fit left them: {"a100": E, "h100": E, "half_width": w½}."""
    return {"a100": pl.A100_GEMM, "h100": pl.H100_GEMM, "half_width": pl.GEMM_HALF_WIDTH}


def fit_gpu_model(half_widths: tuple[float, ...] = FIT_HALF_WIDTHS, start: tuple[float, float] = (0.6, 0.8),
                  variant: Callable[[Published], Published] = _as_published) -> dict:
    """The least-squares constants on FIT: {"a100": E, "h100": E, "half_width": w½, "loss": the A100 runs'
    loss, "h100_loss"}; ``start`` the (A100, H100) E each walk starts from."""
    a100, h100 = fit_set(A100["flops"]), fit_set(H100["flops"])
    loss, e_a100, w = min((*fit_peak_fraction(a100, w, start[0], variant), w) for w in half_widths)
    h100_loss, e_h100 = fit_peak_fraction(h100, w, start[1], variant)
    return {"a100": e_a100, "h100": e_h100, "half_width": w, "loss": loss, "h100_loss": h100_loss}


@cache
def reproduce(name: str) -> dict:
    """The planner on the published model and cluster, with what its framework offered:
    {"layout_rank" (1 = best layout), "layouts" (feasible layouts), "configs" (every feasible configuration,
    best first), "best" (the best configuration), "config" (the published layout's best configuration), "exact" (the configuration with the published
    microbatch, when known, or None), "predicted_mfu", "published_mfu", "error" (predicted / published − 1)}."""
    return reproduce_run(_get(name))


def reproduce_run(p: Published) -> dict:
    """:func:`reproduce` for a run given whole."""
    name = p.name
    r = pl.plan(p.model, p.cluster, p.global_batch, axes=p.axes)
    rank, config = pl.layout_rank(r["configs"], p.layout)
    exact = None
    if p.microbatch is not None:
        exact = next((c for c in r["configs"] if c.layout == p.layout and c.microbatch == p.microbatch), None)
    predicted = config.mfu if config else None
    published = published_mfu(name)
    return {"layout_rank": rank, "layouts": len({c.layout for c in r["configs"]}), "configs": r["configs"],
            "best": r["configs"][0] if r["configs"] else None, "config": config, "exact": exact,
            "predicted_mfu": predicted, "published_mfu": published,
            "error": predicted / published - 1 if predicted else None}


def layout_rank(name: str) -> int:
    """Where the planner ranks the published layout among all feasible layouts (1 = best)."""
    return reproduce(name)["layout_rank"]


def layout_place(name: str, layout: Sequence[int]) -> dict:
    """Where the planner ranks another ``layout`` (tp, pp, dp[, cp, ep]) of ``name``'s model and cluster:
    {"rank" (1 = best; 0 when it does not fit), "slower" (its step over the best's, − 1)}."""
    configs = reproduce(name)["configs"]
    rank, config = pl.layout_rank(configs, tuple(layout))
    return {"rank": rank, "slower": config.step_time_s / configs[0].step_time_s - 1 if config else math.inf}


def predicted_mfu(name: str) -> float:
    """The planner's MFU for the published layout at its best microbatch, recompute and chunks."""
    return reproduce(name)["predicted_mfu"]


def prediction_error(name: str) -> float:
    """The planner's MFU for the published layout relative to the published MFU, minus 1."""
    return reproduce(name)["error"]


def prediction_step_error(name: str) -> float:
    """The planner's step time for the published layout relative to the published step, minus 1: the
    published MFU over the predicted one (the same FLOPs counted), minus 1."""
    r = reproduce(name)
    return r["published_mfu"] / r["predicted_mfu"] - 1


def predicted_step_time(name: str) -> float:
    return reproduce(name)["config"].step_time_s


def best_step_time(name: str) -> float:
    return reproduce(name)["best"].step_time_s


def predicted_memory(name: str) -> float:
    """The busiest GPU's bytes in the published layout's best configuration (:func:`~.planner.memory_terms`)."""
    return reproduce(name)["config"].memory_bytes


def step_terms(name: str) -> dict:
    """The published layout's predicted step, term by term (seconds: ``compute_s``, ``bubble_s``,
    ``dp_comm_exposed_s``, ...; :func:`~.planner.evaluate`'s ``time``)."""
    return dict(reproduce(name)["config"].time)


def error_table() -> list[dict]:
    """One row per published run: {"name", "set" ("fitted" or "held out"), "layout", "rank", "layouts",
    "predicted_mfu", "published_mfu", "error", "step_error"}: ``error`` in MFU, ``step_error`` in step
    time (the planner's MFU and the published one count the same FLOPs, so the predicted step over the
    published one is the published MFU over the predicted, minus 1; the issue's goal takes either)."""
    rows = []
    for name, p in PUBLISHED.items():
        r = reproduce(name)
        step_error = prediction_step_error(name) if r["predicted_mfu"] else None
        rows.append({"name": name, "set": "fitted" if name in FIT else "held out", "layout": p.layout,
                     "rank": r["layout_rank"], "layouts": r["layouts"], "predicted_mfu": r["predicted_mfu"],
                     "published_mfu": r["published_mfu"], "error": r["error"], "step_error": step_error})
    return rows


def microbatch_error(name: str, micro_batch: int) -> float:
    """The planner's MFU for the published layout at ``micro_batch`` sequences per microbatch (its best ZeRO
    stage, recomputation and chunks; the memory checked) relative to the published MFU, minus 1: what a
    micro-batch size the source does not state would change (MT-NLG's)."""
    p = _at_layout(_get(name))
    configs = [c for c in pl.plan(p.model, p.cluster, p.global_batch, axes=p.axes)["configs"]
               if c.microbatch == micro_batch]
    if not configs:
        raise ValueError(f"{name}: the published layout does not fit with a micro-batch of {micro_batch}")
    return configs[0].mfu / published_mfu(name) - 1


def worst_error(which: str, key: str = "error") -> float:
    """The largest |error| (``key``: "error" in MFU, "step_error" in step time) among the ``which``
    ("fitted" or "held out") runs."""
    return max(abs(r[key]) for r in error_table() if r["set"] == which)



# ------------------------------------------------------------------------------ Megatron-LM's 18.4B and 39.1B
#
# The planner ranks their TP 8 7th and 8th, behind TP 2 and TP 4 with an interleaved pipeline. What was checked, from
# Megatron-LM's code of August 2021 (commit 6985e58, the SC21 scripts), in figures (the texts quote them):
# - the pipeline's sends: megatron/p2p_communication.py's _communicate posts them with batch_isend_irecv, waits
#   for each, then torch.cuda.synchronize(): blocking, as the planner counts them (2·v per microbatch, each
#   TP rank's 1/t over its own 25 GB/s HDR port); the all-gather that rebuilds each received tensor over the
#   TP group (gather_split_1d_tensor) the planner leaves out: counted, it is "gathers_s" a step, 0.015 and
#   0.054 s, far short of the gaps (1.05 and 1.64 s);
# - the interleaved schedule's rules (schedules.py asserts microbatches % pp == 0; arguments.py pp > 2 and the
#   layers per virtual stage dividing the stage): the best layouts obey them;
# - the data-parallel reduction: run_table_1.sh runs the pp = 1 runs (1.7B to 18.4B) with --DDP-impl torch,
#   which overlaps the last microbatch's backward (schedules.py's forward_backward_no_pipelining runs the others
#   under no_sync), and local DDP with a pipeline (training.py asserts it): Axes.dp_overlap "no-pipeline".
#   The planner keeps Megatron-LM's local DDP for every run: with torch DDP the fit's optimum moves to E 0.63
#   and w½ 0, a GPU model with no shape left (it would rank TP 8 4th and 7th: what_if_run("torch-ddp", …)).


def _torch_ddp(p: Published) -> Published:
    """A Table 1 run with PyTorch's DDP where there is no pipeline, as run_table_1.sh ran it."""
    return replace(p, axes=replace(p.axes, dp_overlap="no-pipeline")) if p in MEGATRON else p


def _nic_per_rank(p: Published) -> Published:
    """A run whose data-parallel rings use the NICs of their ranks on a node (planner.Cluster.dp_ring_nics)."""
    return replace(p, cluster=replace(p.cluster, dp_ring_nics="per-rank"))


# What-ifs the planner does not adopt, each a change to every published run, with its refit and its effect
# (bench/planner_fit.py prints them; the capstone text quotes them)
WHAT_IFS: dict[str, Callable[[Published], Published]] = {"torch-ddp": _torch_ddp, "nic-per-rank": _nic_per_rank}


@cache
def what_if_refit(what: str) -> dict:
    """:func:`fit_gpu_model`'s optimum with every run changed by ``WHAT_IFS[what]``."""
    return fit_gpu_model(variant=WHAT_IFS[what])


@cache
def what_if_run(what: str, name: str, refit: bool = False) -> dict:
    """:func:`reproduce_run` of ``name`` changed by ``WHAT_IFS[what]``, at the module's GPU constants or
    (``refit``) at :func:`what_if_refit`'s, plus "slower" (its step over the best's, − 1)."""
    p = WHAT_IFS[what](_get(name))
    if refit:
        fit = what_if_refit(what)
        p = with_gpu_model(p, fit["a100"] if p.cluster.flops == A100["flops"] else fit["h100"], fit["half_width"])
    r = reproduce_run(p)
    return {**r, "slower": r["config"].step_time_s / r["best"].step_time_s - 1}


@cache
def megatron_rank_account(name: str) -> dict:
    """The figures of ``name``'s (Megatron-LM's 18.4B or 39.1B) rank: {"step_s" (its layout's step),
    "best_step_s", "gap_s", "best_tp", "best_pp", "best_chunks", "best_pp_comm_s" (the best layout's
    pipeline sends a step), "gathers_s" (the TP all-gathers of what it receives, 2·v a microbatch, not
    counted), "tp_comm_s" (the published layout's TP all-reduces a step)}."""
    r = reproduce(name)
    best, config, p = r["best"], r["config"], _get(name)
    gathers = 0.0
    if best.tp > 1 and best.pp > 1:
        tensor = p.model.seq * best.microbatch * p.model.hidden * 2  # s·b·h in fp16
        gathers = best.microbatches * 2 * best.chunks * pl.collective_seconds(p.cluster, False, "all_gather", tensor,
                                                                             best.tp)
    return {"step_s": config.step_time_s, "best_step_s": best.step_time_s,
            "gap_s": config.step_time_s - best.step_time_s, "best_tp": best.tp, "best_pp": best.pp,
            "best_chunks": best.chunks, "best_pp_comm_s": best.time["pp_comm_s"], "gathers_s": gathers,
            "tp_comm_s": config.time["tp_comm_s"]}

# Narayanan et al. 2021, Sec. 5.4: three sweeps of one model over the splits of 64 A100s (8 DGX nodes), with
# micro-batch 1, full recomputation, no interleaving and local DDP (NVIDIA's examples/sc21/run_figure_1[345].sh).
# The figures' bars are not printed as numbers; what the paper states of them is an order:
# - Fig. 13 (Sec. 5.4.1): a 162.2B GPT (NLS=32, HS=20480, NAH=128), every TP × PP with no data parallelism, global
#   batch 32 and 128; (TP 8, PP 8) is the fastest at both (Takeaway #1: TP up to a server's 8 GPUs, then PP);
# - Fig. 14 (Sec. 5.4.2): a 5.9B GPT (NLS=32, HS=3840, NAH=32), PP 2 to 32 with DP = 64/PP and no TP, batch 32 and
#   512: "for each batch size, the throughput decreases as the pipeline-parallel size increases";
# - Fig. 15 (Sec. 5.4.3): the same 5.9B GPT, TP 2 to 32 with DP = 64/TP and no PP, batch 32, 128 and 512: the
#   throughput decreases as the tensor-parallel size grows.
# Held-out ranking checks: no constant is fitted on them.


@dataclass(frozen=True)
class Sweep:
    """One figure's sweep: a model over the (tp, pp) splits of ``gpus`` A100s at each batch, and the order the
    paper states."""
    name: str
    model: pl.ModelSpec
    splits: tuple[tuple[int, int], ...]  # (tp, pp); dp = gpus / (tp · pp)
    batches: tuple[int, ...]
    papers_order: tuple[tuple[int, int], ...]  # fastest first, as far as the paper states it
    gpus: int = 64


_GPT_5_9B = _gpt(5.9e9, 32, 3840, 32)
_PP_WITH_DP = tuple((1, pp) for pp in (2, 4, 8, 16, 32))  # Fig. 14's splits, in the paper's order
_TP_WITH_DP = tuple((tp, 1) for tp in (2, 4, 8, 16, 32))  # Fig. 15's
SWEEPS = {
    "fig13": Sweep("Fig. 13", _gpt(162.2e9, 32, 20480, 128), tuple((64 // pp, pp) for pp in (1, 2, 4, 8, 16, 32)),
                   (32, 128), ((8, 8),)),
    "fig14": Sweep("Fig. 14", _GPT_5_9B, _PP_WITH_DP, (32, 512), _PP_WITH_DP),
    "fig15": Sweep("Fig. 15", _GPT_5_9B, _TP_WITH_DP, (32, 128, 512), _TP_WITH_DP),
}


def sweep_steps(sweep: str, global_batch: int, gpus_per_node: int = 8,
                dp_ring_nics: str = "one") -> dict[tuple[int, int], float]:
    """A sweep's (tp, pp) splits and the planner's step time for each (its best microbatch count; TP may
    leave a node, as the figures' TP 16 and 32 did); ``gpus_per_node``: Selene's 8, or more for a what-if;
    ``dp_ring_nics``: the planner's network model for data-parallel rings (planner.Cluster)."""
    s = SWEEPS[sweep]
    cluster = pl.Cluster(s.gpus, 80e9, gpus_per_node=gpus_per_node, **A100, grad_bytes=2, tp_across_nodes=True,
                         dp_ring_nics=dp_ring_nics)
    axes = replace(_axes((1, 1, 1, 1, 1), **MEGATRON_2021), chunks=(1,), microbatches=(1,))  # no interleaving
    fastest: dict[tuple[int, int], float] = {}
    for c in pl.plan(s.model, cluster, global_batch, axes=axes)["configs"]:
        if (c.tp, c.pp) in s.splits:
            fastest.setdefault((c.tp, c.pp), c.step_time_s)
    return fastest


def sweep_ranking(sweep: str, global_batch: int, gpus_per_node: int = 8,
                  dp_ring_nics: str = "one") -> list[tuple[int, int]]:
    """A sweep's (tp, pp) splits, fastest first as the planner predicts them (:func:`sweep_steps`)."""
    steps = sweep_steps(sweep, global_batch, gpus_per_node, dp_ring_nics)
    return sorted(steps, key=steps.__getitem__)


def sweep_agrees(sweep: str, global_batch: int, dp_ring_nics: str = "one") -> bool:
    """Whether the planner's order starts with the paper's (every split predicted, the stated ones first
    and in the paper's order)."""
    s = SWEEPS[sweep]
    ranking = sweep_ranking(sweep, global_batch, dp_ring_nics=dp_ring_nics)
    return set(ranking) == set(s.splits) and tuple(ranking[:len(s.papers_order)]) == s.papers_order


def sweep_place(sweep: str, global_batch: int, split: Sequence[int], dp_ring_nics: str = "one") -> int:
    """Where the planner puts ``split`` (tp, pp) in a sweep at ``global_batch``, 1 = fastest."""
    return sweep_ranking(sweep, global_batch, dp_ring_nics=dp_ring_nics).index((split[0], split[1])) + 1  # a check passes a list


def sweeps_agreeing(dp_ring_nics: str = "one") -> int:
    """How many of the sweeps' (figure, batch) orders the planner gets as the paper states them (of 7)."""
    return sum(sweep_agrees(key, batch, dp_ring_nics) for key, s in SWEEPS.items() for batch in s.batches)


# The planner step's example: the command of issue 15 (a Llama-3-70B-shaped model on 512 H100s).
EXAMPLE_MODEL = pl.ModelSpec(70e9, 80, 8192, 64, 8, 4096)
EXAMPLE_CLUSTER = pl.Cluster(512, 80e9)
EXAMPLE_BATCH = 1024


@cache
def example_plan() -> dict:
    """``distai calc plan --params 70B --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --seq 4096
    --global-batch 1024 --gpus 512 --gpu-memory 80GB`` as the planner's result."""
    return pl.plan(EXAMPLE_MODEL, EXAMPLE_CLUSTER, EXAMPLE_BATCH)


def example_config(rank: int = 1) -> dict:
    """The example's configuration at ``rank`` (1 = best) as a dict (``memory``, ``time`` inside)."""
    return example_plan()["configs"][rank - 1].as_dict()
