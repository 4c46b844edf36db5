"""The size and shape of the course's one GPT, and the one check of the degrees a shape allows, without torch: every experiment, the capstone's
pre-launch check and the engine's model (``distai.engine.model.GPTConfig`` is this class) build it
here, from a lesson's defaults, from the command-line flags (:func:`add_model_options`, then
:meth:`ModelSize.from_args`) or from a named preset (:meth:`ModelSize.preset`).

The fields are GPT-2's shape by default (LayerNorm, GeLU MLP of width 4·hidden, multi-head
attention, no positions, biases, head tied to the embedding); Llama's shape is a configuration of
the same fields (``norm="rms"``, ``mlp="swiglu"`` of width 3·hidden, ``kv_heads`` < ``heads``,
``rope_theta``, ``bias=False``, untied head): see ``PRESETS``.

:func:`refusals` is the one rule of which parallel degrees a shape allows (tensor with or without
sequence parallelism, pipeline, context, expert), each refusal a :class:`Refusal` whose sentence is
in ``lessons/catalog/shape.toml`` (English and Spanish). Every caller — the formulas, the
calculators, the planners, the engine, ``distai run``'s pre-launch check — asks it, so one input
gets one verdict. The rules:

- tp divides the attention heads, the hidden size, the MLP width and (when the head and embedding
  are split, as in training) the vocabulary: Megatron-LM (Shoeybi et al. 2019, Sec. 3) splits whole
  heads and the weight matrices by columns, then rows;
- key/value heads (grouped-query attention): tp divides them (each rank holds H_kv/tp), or tp is a
  multiple of them and each KV head is replicated on tp/H_kv ranks (vLLM's way); anything else is
  refused;
- sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2): tp·cp divides the sequence;
- context parallelism: cp divides the sequence, 2·cp in the zigzag layout (each rank holds two
  chunks, one from each end);
- pipeline: pp·v stages (v chunks per rank, 1 unless interleaved) are at most the layers; where the
  stages must be equal, as in the capstone's run, pp·v divides the layers; where the embedding and
  the output layer take a layer's slot each (the capstone's planner, after BLOOM and Llama 3), pp
  divides the layers or the layers plus two;
- experts: ep divides the experts.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from . import units
from .strings import LANGUAGES, TranslatedError, translated

__all__ = ["ModelConfigError", "ModelSize", "PRESETS", "SIZE_FLAGS", "add_model_options", "Refusal", "ShapeError",
           "refusals", "check_degrees", "explain", "STAGE_RULES", "param_bounds"]


class ModelConfigError(TranslatedError):
    """A model shape that cannot be built or split as asked (a clear one-line message, in every
    language: ``lessons/catalog/model_size.toml``; ``text(lang)``)."""

    area = "model_size"


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
                raise ModelConfigError.keyed("positive", name=name, value=repr(value))
        if self.hidden % self.heads:
            raise ModelConfigError.keyed("heads_divide_hidden", hidden=self.hidden, heads=self.heads)
        if self.heads % self.group_heads:
            raise ModelConfigError.keyed("kv_heads", heads=self.heads, kv_heads=self.kv_heads)
        if not 0.0 <= self.dropout < 1.0:
            raise ModelConfigError.keyed("dropout", value=self.dropout)
        if self.norm not in ("layer", "rms"):
            raise ModelConfigError.keyed("norm", value=repr(self.norm))
        if self.mlp not in ("gelu", "swiglu"):
            raise ModelConfigError.keyed("mlp", value=repr(self.mlp))
        if self.rope_theta is not None and self.head_dim % 2:
            raise ModelConfigError.keyed("rotary", head_dim=self.head_dim)

    # ------------------------------------------------------------------------------ builders
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelSize:
        """The named shape (``PRESETS``), with ``overrides`` replacing some fields."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ModelConfigError.keyed("unknown_model", name=repr(name), choices=", ".join(PRESETS)) from None
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

    def refusals(self, *, tp: int = 1, sequence_parallel: bool = False, split_vocab: bool = True,
                 seq: int | None = None, **degrees: Any) -> list[Refusal]:
        """:func:`refusals` for this shape: ``split_vocab=False`` where the embedding and the
        output layer are replicated (the decode path); ``seq`` another sequence length than
        ``self.seq``; ``degrees`` the others (``pp``, ``chunks``, ``stages``, ``cp``, ...)."""
        return refusals(tp=tp, sequence_parallel=sequence_parallel, heads=self.heads, kv_heads=self.group_heads,
                        hidden=self.hidden, ffn=self.ffn_size, vocab=self.vocab if split_vocab else None,
                        seq=seq if seq is not None else self.seq, layers=self.layers, **degrees)

    def check_degrees(self, **degrees: Any) -> None:
        """Raise :class:`ShapeError` (a ModelConfigError, one line) unless this shape allows the degrees."""
        found = self.refusals(**degrees)
        if found:
            raise ShapeError(found)

    def check_tp(self, t: int, sequence_parallel: bool = False, seq: int | None = None) -> None:
        """Raise ShapeError if this model cannot be split over ``t`` tensor-parallel ranks."""
        self.check_degrees(tp=t, sequence_parallel=sequence_parallel, seq=seq)

    def num_params(self) -> int:
        """Parameters of the model (a tied head adds none)."""
        h, f, L, kv = self.hidden, self.ffn_size, self.layers, self.group_heads * self.head_dim
        b = 1 if self.bias else 0
        attn = 2 * h * h + 2 * h * kv + b * (2 * h + kv)  # W_q, W_k, W_v, W_o; no key bias
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f + b * ((2 if self.mlp == "swiglu" else 1) * f + h)
        norm = h if self.norm == "rms" else 2 * h
        return self.vocab * h + L * (attn + mlp + 2 * norm) + norm + (0 if self.tie_embeddings else self.vocab * h)


def param_bounds(layers: int, hidden: int, heads: int | None = None, kv_heads: int | None = None,
                 vocab: int | None = None, experts: int = 1, expert_ffn: int | None = None) -> tuple[float, float]:
    """The fewest and the most parameters a transformer of ``layers`` blocks of width ``hidden`` can hold,
    counted by :meth:`ModelSize.num_params`: an MLP from h (GeLU) to 8h wide (SwiGLU; ``expert_ffn`` when
    given), ``experts`` such MLPs per layer at most (routed plus shared), key/value heads from one (MQA)
    to all of them where not given, a vocabulary left out counted from 1 to 256k, the head tied at the low
    end and untied at the high; each end widened by 2× for what the count leaves out (biases, adapters,
    a different attention). Every calculator that takes ``--params`` beside a shape checks it here."""
    low_heads, high_heads = (heads, heads) if heads else (hidden, 1)  # unknown: head size 1 (MQA) or h

    def count(ffn: int, mlp: str, v: int, tied: bool, q_heads: int, kv: int | None) -> int:
        return ModelSize(vocab=v, hidden=hidden, heads=q_heads, kv_heads=kv, layers=layers, seq=1, ffn=ffn, mlp=mlp,
                         tie_embeddings=tied).num_params()

    low = count(hidden, "gelu", vocab or 1, True, low_heads, (kv_heads or 1) if heads else 1)
    high_ffn = expert_ffn or 8 * hidden
    high = count(high_ffn, "swiglu", vocab or 256_000, False, high_heads, kv_heads if heads else None)
    high += (max(1, experts) - 1) * layers * 3 * hidden * high_ffn  # every expert adds an MLP to each layer
    return low / 2, high * 2


#: the named shapes: GPT-2's (Radford et al. 2019) and Llama's (Touvron et al. 2023), both tiny
PRESETS: dict[str, ModelSize] = {
    "gpt2-tiny": ModelSize(),
    "llama-tiny": ModelSize(vocab=512, hidden=128, layers=4, heads=8, kv_heads=2, norm="rms", mlp="swiglu",
                            rope_theta=10000.0, bias=False, seq=2048, tie_embeddings=False),
}

#: the size flags (``--kv-heads`` for ``kv_heads``), as the calculators name them
SIZE_FLAGS: dict[str, type] = {"hidden": int, "heads": int, "kv_heads": int, "layers": int, "vocab": int, "seq": int,
                               "ffn": int, "norm": str, "dropout": float}
_FIELDS = {f.name for f in fields(ModelSize)}
assert set(SIZE_FLAGS) <= _FIELDS


def add_model_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, defaults: ModelSize | None,
                      flags: Sequence[str] = ("hidden", "heads", "layers", "vocab", "seq")) -> None:
    """One ``--flag`` per name in ``flags`` (the size of the GPT an experiment trains), each
    defaulting to ``defaults``' value; with ``defaults=None`` every flag defaults to None and the
    run fills it in (:meth:`ModelSize.from_args` with the defaults it chooses then). Their help is the
    ``common`` table of ``lessons/catalog/run_help.toml`` (:mod:`~distai.lessons.arg_help`)."""
    for name in flags:
        kind = SIZE_FLAGS[name]
        default = None if defaults is None else getattr(defaults, name)
        choices = ("layer", "rms") if name == "norm" else None
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=default, choices=choices)


# ---------------------------------------------------------------------------------------------
# the one shape check
# ---------------------------------------------------------------------------------------------

AREA = "shape"  # the catalog file of the refusals' sentences
#: how pipeline stages must take the layers: "any" (at least one layer each), "even" (equal
#: stages, pp·v | layers), "with-ends" (pp | layers or layers + 2: embedding and output take a slot)
STAGE_RULES = ("any", "even", "with-ends")


@dataclass(frozen=True)
class Refusal:
    """One degree a shape does not allow: which degree, the rule it breaks (the key of its sentence
    in ``lessons/catalog/shape.toml``) and the numbers that sentence names."""
    degree: str  # "tp", "pp", "cp" or "ep"
    rule: str
    numbers: tuple[tuple[str, int], ...]

    def text(self, lang: str = "en") -> str:
        """The reason as one sentence in ``lang``, its numbers through ``lessons/units.py``."""
        return translated(AREA, self.rule, lang, **{k: units.format_integer(v, lang) for k, v in self.numbers})

    def __str__(self) -> str:
        return self.text()


def explain(found: Sequence[Refusal], lang: str = "en") -> str:
    """Every reason, on one line."""
    return "; ".join(r.text(lang) for r in found)


def explain_texts(found: Sequence[Refusal]) -> dict[str, str]:
    """:func:`explain` in every language (a translated error's ``texts``)."""
    return {lang: explain(found, lang) for lang in LANGUAGES}


class ShapeError(ModelConfigError):
    """Degrees a model shape does not allow; ``refusals`` says why (``text(lang)`` in either language)."""

    def __init__(self, found: Sequence[Refusal]):
        self.refusals = tuple(found)
        super().__init__(explain(self.refusals), texts=explain_texts(self.refusals))


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError.keyed("positive", name=what, value=repr(value))
    return value


def refusals(*, tp: int = 1, sequence_parallel: bool = False, pp: int = 1, chunks: int = 1, stages: str = "any",
             cp: int = 1, zigzag: bool = False, ep: int = 1, heads: int | None = None, kv_heads: int | None = None,
             hidden: int | None = None, ffn: int | None = None, vocab: int | None = None, seq: int | None = None,
             layers: int | None = None, experts: int | None = None) -> list[Refusal]:
    """Why the degrees do not fit the shape, one :class:`Refusal` per broken rule (empty: they fit).
    A size left out (None) is not checked; ``chunks`` is v (pipeline chunks per rank), ``stages``
    one of ``STAGE_RULES``, ``zigzag`` the layout of context parallelism. A degree or size that is
    no positive whole number is a ModelConfigError."""
    t, p, v, c, e = (_whole(x, name) for x, name in ((tp, "tp"), (pp, "pp"), (chunks, "v"), (cp, "cp"), (ep, "ep")))
    if stages not in STAGE_RULES:
        raise ModelConfigError.keyed("stages", choices=", ".join(STAGE_RULES), value=repr(stages))
    shape = {name: _whole(x, name) for name, x in (("heads", heads), ("kv_heads", kv_heads), ("hidden", hidden),
                                                    ("ffn", ffn), ("vocab", vocab), ("seq", seq),
                                                    ("layers", layers), ("experts", experts)) if x is not None}
    out: list[Refusal] = []

    def refuse(degree: str, rule: str, **numbers: int) -> None:
        out.append(Refusal(degree, rule, tuple(numbers.items())))

    for name in ("heads", "hidden", "ffn", "vocab"):
        if name in shape and shape[name] % t:
            refuse("tp", name, tp=t, size=shape[name])
    kv = shape.get("kv_heads")
    if kv is not None and kv % t and t % kv:  # split (kv % t == 0) or replicate (t % kv == 0), else refuse
        refuse("tp", "kv_heads", tp=t, size=kv)
    s = shape.get("seq")
    if s is not None:
        if c > 1 and s % ((2 if zigzag else 1) * c):
            refuse("cp", "seq_cp_zigzag" if zigzag else "seq_cp", cp=c, n=(2 if zigzag else 1) * c, size=s)
        if sequence_parallel and s % (t * c):
            refuse("tp", "seq_sp" if c == 1 else "seq_sp_cp", tp=t, cp=c, n=t * c, size=s)
    L = shape.get("layers")
    if L is not None:
        one = "" if v > 1 else "_one_chunk"  # no interleaving: no v to name ("pp·v = 81·1")
        if p * v > L:
            refuse("pp", "stages" + one, pp=p, v=v, n=p * v, size=L)
        elif stages == "even" and L % (p * v):
            refuse("pp", "even_stages" + one, pp=p, v=v, n=p * v, size=L)
        elif stages == "with-ends" and L % p and (L + 2) % p:
            refuse("pp", "stages_with_ends", pp=p, size=L, ends=L + 2)
    if "experts" in shape and shape["experts"] % e:
        refuse("ep", "experts", ep=e, size=shape["experts"])
    return out


def check_degrees(**shape_and_degrees: Any) -> None:
    """Raise :class:`ShapeError` unless :func:`refusals` finds none."""
    found = refusals(**shape_and_degrees)
    if found:
        raise ShapeError(found)
