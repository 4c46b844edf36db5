"""Lesson 6 formulas: floating-point formats, dynamic loss scaling, DDP gradient buckets.

Sources:
- IEEE 754-2008 binary16 and binary32; bfloat16 (Google Brain; Kalamkar et al., "A Study of BFLOAT16
  for Deep Learning Training", arXiv:1905.12322): 1 sign bit, 8 exponent bits, 7 mantissa bits.
- Micikevicius et al., "Mixed Precision Training", ICLR 2018 (fp32 master weights, loss scaling).
- Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433 (E4M3 max 448, E5M2 57344).
- torch.amp.GradScaler (torch/amp/grad_scaler.py, and ``_amp_update_scale_``): init_scale 2^16,
  growth_factor 2.0, backoff_factor 0.5, growth_interval 2000.
- torch.nn.parallel.DistributedDataParallel and ``torch.distributed._compute_bucket_assignment_by_size``
  (reducer.cpp): bucket_cap_mb 25 MiB, a first bucket of 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``),
  buckets filled in the order gradients become ready (roughly reverse registration order).
Pure Python.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: sign bit, ``exponent_bits``, ``mantissa_bits`` (stored fraction)."""
    name: str
    exponent_bits: int
    mantissa_bits: int
    ieee_like: bool = True  # top exponent reserved for inf/NaN
    max_override: float | None = None  # formats that reuse the top exponent (fp8 e4m3fn)

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1


FORMATS: dict[str, FloatFormat] = {
    "fp32": FloatFormat("fp32", 8, 23),
    "fp16": FloatFormat("fp16", 5, 10),
    "bf16": FloatFormat("bf16", 8, 7),
    "fp8_e5m2": FloatFormat("fp8_e5m2", 5, 2),
    "fp8_e4m3": FloatFormat("fp8_e4m3", 4, 3, ieee_like=False, max_override=448.0),
}
_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
            "e5m2": "fp8_e5m2", "e4m3": "fp8_e4m3", "e4m3fn": "fp8_e4m3"}


def float_format(fmt: str | FloatFormat) -> FloatFormat:
    """Look up a format by name (fp32, fp16, bf16, fp8_e5m2, fp8_e4m3, or torch-style aliases)."""
    if isinstance(fmt, FloatFormat):
        return fmt
    key = _ALIASES.get(str(fmt).lower(), str(fmt).lower())
    if key not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[key]


def max_value(fmt: str | FloatFormat) -> float:
    """Largest finite value: (2 − 2^−m)·2^(2^(e−1)−1) for IEEE-like formats
    (fp16 65504, bf16 ≈ 3.39e38, fp32 ≈ 3.40e38); fp8 E4M3 is 448 (Micikevicius et al. 2022)."""
    f = float_format(fmt)
    if f.max_override is not None:
        return f.max_override
    return (2 - 2.0 ** -f.mantissa_bits) * 2.0 ** f.bias


def smallest_normal(fmt: str | FloatFormat) -> float:
    """Smallest positive normal value 2^(1−bias): fp16 2^−14 ≈ 6.10e-5, bf16 and fp32 2^−126."""
    return 2.0 ** (1 - float_format(fmt).bias)


def smallest_subnormal(fmt: str | FloatFormat) -> float:
    """Smallest positive subnormal 2^(1−bias−m): fp16 2^−24 ≈ 5.96e-8, bf16 2^−133, fp32 2^−149."""
    f = float_format(fmt)
    return 2.0 ** (1 - f.bias - f.mantissa_bits)


def machine_epsilon(fmt: str) -> float:
    """Gap between 1 and the next representable number, 2^−m: fp16 2^−10, bf16 2^−7, fp32 2^−23."""
    return 2.0 ** -float_format(fmt).mantissa_bits


def spacing(x: float, fmt: str | FloatFormat) -> float:
    """The gap between adjacent representable numbers of ``fmt`` around |x| (the ulp of x's binade):
    2^(⌊log2|x|⌋ − m) for normal x, the smallest subnormal below the normal range. Equals
    numpy.spacing(|x|) for fp16 and fp32 values, except at the largest value (numpy gives inf)."""
    f = float_format(fmt)
    ax = abs(float(x))
    if math.isnan(ax) or math.isinf(ax):
        raise ValueError("spacing is defined for finite values")
    if ax < smallest_normal(f):
        return smallest_subnormal(f)
    exp = math.frexp(ax)[1] - 1  # ax = mant * 2**exp with 1 <= mant < 2
    return 2.0 ** (exp - f.mantissa_bits)


def round_to_format(x: float, fmt: str) -> float:
    """Round ``x`` to the nearest value of ``fmt`` (ties to even), overflowing to ±inf as IEEE does
    beyond max + half an ulp (fp8 E4M3 has no inf: values above 448 are returned as NaN here)."""
    f = float_format(fmt)
    x = float(x)
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    q = spacing(x, f)
    r = round(x / q) * q  # x/q and the product are exact in binary64; round() ties to even
    big = max_value(f)
    if abs(r) > big:
        limit = big + spacing(big, f) / 2
        if abs(x) >= limit or not f.ieee_like:
            return math.copysign(math.inf, x) if f.ieee_like else math.nan
        return math.copysign(big, x)
    return r


def update_is_lost(weight: float, update: float, fmt: str) -> bool:
    """True when weight + update rounds back to weight in ``fmt`` — the update is smaller than half the
    spacing at the weight (Micikevicius et al. 2018, Sec. 3.1: why fp32 master weights)."""
    w = round_to_format(weight, fmt)
    return round_to_format(w + update, fmt) == w


def underflows(x: float, fmt: str) -> bool:
    """True when a non-zero ``x`` rounds to zero in ``fmt`` (|x| below half the smallest subnormal)."""
    return x != 0 and round_to_format(x, fmt) == 0


GRADSCALER_DEFAULTS = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5,
                       "growth_interval": 2000}


def gradscaler_trajectory(overflows, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                          backoff_factor: float = 0.5, growth_interval: int = 2000) -> list[float]:
    """The loss scale after each step of torch.amp.GradScaler, given which steps overflowed.

    Rule of ``_amp_update_scale_``: on a step with inf/NaN gradients the step is skipped, the scale is
    multiplied by ``backoff_factor`` and the count of good steps reset; otherwise the count grows, and
    when it reaches ``growth_interval`` the scale is multiplied by ``growth_factor`` (if the result is
    finite in fp32) and the count reset. Returns the scale in effect after each step.
    """
    scale = float(init_scale)
    good = 0
    out = []
    fp32_max = max_value("fp32")
    for overflow in overflows:
        if overflow:
            scale *= backoff_factor
            good = 0
        else:
            good += 1
            if good == growth_interval:
                new = scale * growth_factor
                if new <= fp32_max:
                    scale = new
                good = 0
        out.append(scale)
    return out


def gradscaler_update(scale: float, good_steps: int, overflow: bool, growth_factor: float = 2.0,
                      backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """One step of :func:`gradscaler_trajectory`'s rule: ``(scale, good_steps)`` after a step that
    did (``overflow``) or did not overflow. Overflow: scale·backoff, count 0. Otherwise the count
    grows; at ``growth_interval`` the scale is multiplied by ``growth_factor`` (if finite in fp32)
    and the count restarts (``_amp_update_scale_`` in torch/amp)."""
    if overflow:
        return scale * backoff_factor, 0
    good_steps += 1
    if good_steps == growth_interval:
        new = scale * growth_factor
        return (new if new <= max_value("fp32") else scale), 0
    return scale, good_steps


def gradscaler_scale_after(good_steps: int, overflows_first: int = 0, init_scale: float = 2.0 ** 16,
                           growth_factor: float = 2.0, backoff_factor: float = 0.5,
                           growth_interval: int = 2000) -> float:
    """Scale after ``overflows_first`` overflowing steps followed by ``good_steps`` good ones:
    init·backoff^k·growth^⌊good/interval⌋ (the closed form of :func:`gradscaler_trajectory`)."""
    if good_steps < 0 or overflows_first < 0:
        raise ValueError("step counts must be >= 0")
    return (init_scale * backoff_factor ** overflows_first
            * growth_factor ** (good_steps // growth_interval))


DDP_BUCKET_CAP_MB = 25                 # DistributedDataParallel's default bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 1 * MiB       # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (first bucket
                                       # when bucket_cap_mb is left at its default)


def ddp_buckets(param_bytes, bucket_cap_bytes: int = 25 * MiB, first_bucket_bytes: int = 1 * MiB) -> list[list[int]]:
    """DDP's bucket assignment: indices of ``param_bytes`` (in the order their gradients become ready,
    i.e. usually reverse registration order) grouped into buckets. A bucket is closed as soon as its
    size reaches its limit (so it may overshoot by one tensor); the first bucket's limit is
    ``first_bucket_bytes`` (1 MiB by default), the others ``bucket_cap_bytes`` (25 MiB).
    Same rule as ``torch.distributed._compute_bucket_assignment_by_size`` for one dtype and device.
    """
    sizes = list(param_bytes)
    if any(s < 0 for s in sizes):
        raise ValueError("parameter sizes must be >= 0")
    if bucket_cap_bytes <= 0 or first_bucket_bytes <= 0:
        raise ValueError("bucket limits must be > 0")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    limit = first_bucket_bytes
    for i, s in enumerate(sizes):
        current.append(i)
        size += s
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
            limit = bucket_cap_bytes
    if current:
        buckets.append(current)
    return buckets


def ddp_bucket_count(param_bytes, bucket_cap_bytes: int = 25 * MiB, first_bucket_bytes: int = 1 * MiB) -> int:
    """Number of all-reduces DDP launches per backward: len(:func:`ddp_buckets`)."""
    return len(ddp_buckets(param_bytes, bucket_cap_bytes, first_bucket_bytes))


def ddp_uniform_bucket_count(n_params: int, bytes_each: int, bucket_cap_bytes: int = 25 * MiB,
                             first_bucket_bytes: int = 1 * MiB) -> int:
    """:func:`ddp_bucket_count` for ``n_params`` tensors of ``bytes_each`` bytes each."""
    return ddp_bucket_count([bytes_each] * n_params, bucket_cap_bytes, first_bucket_bytes)
