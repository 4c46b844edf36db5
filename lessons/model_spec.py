"""A transformer's shape as the planners and calculators see it (no weights, no torch).

One dataclass for lesson 7's serving planner and the capstone's training planner: both size a
model by its parameters, layers, hidden width and (query and key/value) heads; training adds the
sequence length and the vocabulary (activations, logits), serving the head dimension and the
bytes per weight (weights and KV cache in memory).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    seq: int = 0  # training sequence length (the capstone's planner needs it)
    vocab: int = 0  # 0: leave the logits out of the memory
    head_dim: int | None = None  # default hidden / heads
    dtype_bytes: float = 2  # bytes per weight (bf16)
    # a mixture of experts (the flags of ``distai calc moe``): routed experts per MoE layer (0: dense),
    # experts per token, one expert's MLP width (SwiGLU: three h × ffn matrices), shared experts every
    # token uses, and how many of the layers are MoE layers (None: all)
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    moe_layers: int | None = None
    # an attention core wider than the heads' share of h (DeepSeek's Multi-head Latent Attention: q·k over
    # 192 per head, v 128): each head's query-key and value widths (0: the head size)
    qk_head_dim: int = 0
    v_head_dim: int = 0
    # the output layer shares the embedding's V·h table (GPT-2, Megatron's GPT, BLOOM, OPT) or has its own
    # (Llama, Mixtral, DeepSeek-V3): ``params`` then holds two tables, neither of them a layer's
    tied_embeddings: bool = True

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def attention_width(self) -> float:
        """The attention core's width: heads · (q·k width + v width) / 2 — h for plain attention, whose
        scores and weighted sum cost 2·s·h FLOPs each per token."""
        qk, v = self.qk_head_dim or self.d, self.v_head_dim or self.d
        return self.heads * (qk + v) / 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def activation_bytes(self) -> float:
        """Bytes of one activation value that tensor-parallel all-reduces and pipeline hops carry: the
        weights' width, but never below 16 bits. FP8 serving keeps its weights and KV cache in 8 bits;
        its GEMMs write bf16, which the all-reduces sum (vLLM's and TensorRT-LLM's FP8 W8A8)."""
        return max(self.dtype_bytes, 2)

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): KV heads × head size."""
        return self.kv_heads * self.d

    @property
    def expert_params(self) -> float:
        """Parameters of the routed experts (what expert parallelism splits): MoE layers · E · 3·h·ffn."""
        if not self.experts:
            return 0.0
        layers = self.layers if self.moe_layers is None else self.moe_layers
        return float(layers * self.experts * 3 * self.hidden * self.expert_ffn)

    @property
    def active_params(self) -> float:
        """Parameters one token uses: all but the routed experts, plus its top-k of them."""
        if not self.experts:
            return float(self.params)
        return self.params - self.expert_params * (1 - self.top_k / self.experts)

    @property
    def vocab_params(self) -> float:
        """Parameters of the embedding and the output layer: one V·h table when tied, two when not."""
        return float(self.vocab * self.hidden * (1 if self.tied_embeddings else 2))

    @property
    def layer_params(self) -> float:
        """Parameters of one transformer layer on average (the embedding and output tables left out)."""
        return (self.params - self.vocab_params) / self.layers

    @property
    def active_layer_params(self) -> float:
        """Parameters one token uses in one layer on average: the GEMMs' FLOPs are 2× this per token."""
        return (self.active_params - self.vocab_params) / self.layers
