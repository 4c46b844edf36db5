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

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes
