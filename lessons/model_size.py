"""The size and shape of the course's one GPT, without torch: every experiment, the capstone's
pre-launch check and the engine's model (``distai.engine.model.GPTConfig`` is this class) build it
here, from a lesson's defaults, from the command-line flags (:func:`add_model_options`, then
:meth:`ModelSize.from_args`) or from a named preset (:meth:`ModelSize.preset`).

The fields are GPT-2's shape by default (LayerNorm, GeLU MLP of width 4·hidden, multi-head
attention, no positions, biases, head tied to the embedding); Llama's shape is a configuration of
the same fields (``norm="rms"``, ``mlp="swiglu"`` of width 3·hidden, ``kv_heads`` < ``heads``,
``rope_theta``, ``bias=False``, untied head): see ``PRESETS``.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["ModelConfigError", "ModelSize", "PRESETS", "SIZE_FLAGS", "add_model_options"]


class ModelConfigError(ValueError):
    """A model shape that cannot be built or split as asked (a clear one-line message)."""


@dataclass(frozen=True)
class ModelSize:
    vocab: int = 128
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    seq: int = 16
    ffn: int | None = None  # MLP width; default 4·hidden (GeLU) or 3·hidden (SwiGLU)
    dropout: float = 0.0
    eps: float = 1e-5
    tie_embeddings: bool = True
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: = heads
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    mlp: str = "gelu"  # "gelu" (fc2(gelu(fc1 x))) or "swiglu" (fc2(silu(gate x) * fc1 x))
    rope_theta: float | None = None  # rotary positions with this base; None: no positions
    bias: bool = True  # biases in the linear layers (keys never have one: see the engine's Attention)

    def __post_init__(self) -> None:
        sizes = {"vocab": self.vocab, "hidden": self.hidden, "heads": self.heads, "layers": self.layers,
                 "seq": self.seq, "ffn": self.ffn_size, "kv_heads": self.group_heads}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"{name} must be a positive whole number, got {value!r}")
        if self.hidden % self.heads:
            raise ModelConfigError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.group_heads:
            raise ModelConfigError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ModelConfigError(f"dropout probability must be in [0, 1), got {self.dropout}")
        if self.norm not in ("layer", "rms"):
            raise ModelConfigError(f"norm must be 'layer' or 'rms', not {self.norm!r}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ModelConfigError(f"mlp must be 'gelu' or 'swiglu', not {self.mlp!r}")
        if self.rope_theta is not None and self.head_dim % 2:
            raise ModelConfigError(f"rotary positions need an even head dimension, not {self.head_dim}")

    # ------------------------------------------------------------------------------ builders
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelSize:
        """The named shape (``PRESETS``), with ``overrides`` replacing some fields."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ModelConfigError(f"unknown model {name!r}; choose one of {', '.join(PRESETS)}") from None
        return replace(base, **overrides)  # replace refuses a name that is no field

    @classmethod
    def from_args(cls, args: argparse.Namespace, defaults: ModelSize | None = None,
                  **overrides: Any) -> ModelSize:
        """``defaults`` (GPT-2's tiny shape if None) with each size flag :func:`add_model_options`
        added to ``args`` that holds a value (a flag left at None keeps the default), then
        ``overrides``. ModelConfigError on a shape that cannot be built."""
        given = {name: getattr(args, name) for name in SIZE_FLAGS if getattr(args, name, None) is not None}
        return replace(defaults if defaults is not None else cls(), **{**given, **overrides})

    # ------------------------------------------------------------------------------ derived sizes
    @property
    def ffn_size(self) -> int:
        return self.ffn or (3 if self.mlp == "swiglu" else 4) * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def group_heads(self) -> int:
        """Key/value heads (``kv_heads``, or ``heads`` without grouped-query attention)."""
        return self.kv_heads or self.heads

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.group_heads

    @property
    def gpt2_shape(self) -> bool:
        """LayerNorm, GeLU, multi-head, no positions, biases: what tensor-parallel training splits."""
        return (self.norm, self.mlp, self.group_heads, self.rope_theta, self.bias) == \
            ("layer", "gelu", self.heads, None, True)

    def check_tp(self, t: int, sequence_parallel: bool = False, seq: int | None = None) -> None:
        """Raise ModelConfigError if this model cannot be split over ``t`` tensor-parallel ranks."""
        for what, n in (("heads", self.heads), ("ffn", self.ffn_size), ("vocab", self.vocab)):
            if n % t:
                raise ModelConfigError(f"{what} = {n} is not divisible by the tensor-parallel size T={t}")
        s = seq if seq is not None else self.seq
        if sequence_parallel and s % t:
            raise ModelConfigError(f"sequence {s} is not divisible by T={t} (needed by sequence parallelism)")

    def num_params(self) -> int:
        """Parameters of the model (a tied head adds none)."""
        h, f, L, kv = self.hidden, self.ffn_size, self.layers, self.group_heads * self.head_dim
        b = 1 if self.bias else 0
        attn = 2 * h * h + 2 * h * kv + b * (2 * h + kv)  # W_q, W_k, W_v, W_o; no key bias
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f + b * ((2 if self.mlp == "swiglu" else 1) * f + h)
        norm = h if self.norm == "rms" else 2 * h
        return self.vocab * h + L * (attn + mlp + 2 * norm) + norm + (0 if self.tie_embeddings else self.vocab * h)


#: the named shapes: GPT-2's (Radford et al. 2019) and Llama's (Touvron et al. 2023), both tiny
PRESETS: dict[str, ModelSize] = {
    "gpt2-tiny": ModelSize(),
    "llama-tiny": ModelSize(vocab=512, hidden=128, layers=4, heads=8, kv_heads=2, norm="rms", mlp="swiglu",
                            rope_theta=10000.0, bias=False, seq=2048, tie_embeddings=False),
}

#: the size flags (``--kv-heads`` for ``kv_heads``), as the calculators name them
SIZE_FLAGS: dict[str, tuple[type, str]] = {
    "hidden": (int, "hidden size h"), "heads": (int, "attention heads"),
    "kv_heads": (int, "key/value heads (grouped-query attention)"), "layers": (int, "Transformer blocks"),
    "vocab": (int, "vocabulary size"), "seq": (int, "sequence length"), "ffn": (int, "MLP width"),
    "norm": (str, "normalisation: layer or rms"), "dropout": (float, "dropout probability"),
}
_FIELDS = {f.name for f in fields(ModelSize)}
assert set(SIZE_FLAGS) <= _FIELDS


def add_model_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, defaults: ModelSize | None,
                      flags: Sequence[str] = ("hidden", "heads", "layers", "vocab", "seq")) -> None:
    """One ``--flag`` per name in ``flags`` (the size of the GPT an experiment trains), each
    defaulting to ``defaults``' value; with ``defaults=None`` every flag defaults to None and the
    run fills it in (:meth:`ModelSize.from_args` with the defaults it chooses then)."""
    for name in flags:
        kind, what = SIZE_FLAGS[name]
        default = None if defaults is None else getattr(defaults, name)
        said = f"{what}, default {default}" if default is not None else what
        choices = ("layer", "rms") if name == "norm" else None
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=default, choices=choices,
                            help=said)
