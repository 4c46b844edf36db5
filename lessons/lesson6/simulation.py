"""Lesson 6 models: a loss scaler on a synthetic training run, gradient-exponent histograms
against fp16's limits, and a timeline of bucketed all-reduce overlapping backward.

Pure Python and numpy (no torch): the tutor's view draws these when no live run is attached,
and the sliders change their parameters. The formulas they rest on live in
:mod:`distai.lessons.lesson6.formulas` (fp16 limits, GradScaler's update rule, DDP's bucket
assignment) and :mod:`distai.lessons.lesson1.formulas` (ring all-reduce time).

*Histogram.* A gradient value ``g`` falls in exponent bin ``e = floor(log2|g|)``: the bin holds
``[2^e, 2^(e+1))``. Multiplying by a scale ``S = 2^s`` moves every value ``s`` bins up. In fp16
a bin is (by its middle, ``e + 1/2``):

- *zero* below 2^-25 (half the smallest subnormal 2^-24: rounding to nearest gives 0);
- *subnormal* below 2^-14 (the smallest normal): kept with fewer significant bits;
- *overflow* from 2^16 on (fp16's largest value is 65504 ≈ 2^15.9993): becomes inf;
- *normal* otherwise.

*Scaler dynamics.* A model of how gradients behave in training: at each step the exponents of
the gradient values are normally distributed, ``log2|g| ~ N(mu, sigma)``, with ``mu`` drifting
from ``mu_start`` to ``mu_end`` as updates are applied (gradients shrink as the loss falls), and
the largest of ``n_values`` values is about ``mu + sigma * sqrt(2 ln n)`` binades up. Now and
then a spike (``spike_prob``) lifts the largest value by a few binades. A step overflows when the
largest scaled value rounds to inf in fp16, or when it is in ``forced_overflows``; then the update
is skipped and the loss does not progress. The scale follows GradScaler's rule.

*Overlap.* Backward computes the layers from last to first; a layer's gradients are ready when
its backward ends. Buckets follow DDP's rule (reverse layer order, first bucket small); one
all-reduce runs at a time (they share the link), each costing the ring all-reduce time of its
bytes; with overlap a bucket starts as soon as it is full and the link is free, without
overlap all start after backward. The step ends when backward and the last all-reduce are done.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..lesson1.formulas import ring_allreduce_time
from . import formulas as F

HIST_LO = -64   # lowest exponent bin (everything below is counted there)
HIST_HI = 24    # highest exponent bin (everything above is counted there)

REGIONS = ("zero", "subnormal", "normal", "overflow")


def fp16_limits_log2() -> dict[str, float]:
    """log2 of fp16's limits: zero below -25, smallest subnormal -24, smallest normal -14, max."""
    return {
        "zero_below": math.log2(F.smallest_subnormal("fp16") / 2),
        "subnormal": math.log2(F.smallest_subnormal("fp16")),
        "normal": math.log2(F.smallest_normal("fp16")),
        "max": math.log2(F.max_value("fp16")),
    }


def region_of_bin(e: float, fmt: str = "fp16") -> str:
    """Which part of ``fmt``'s range the bin ``[2^e, 2^(e+1))`` falls in (judged by its middle)."""
    mid = e + 0.5
    if mid < math.log2(F.smallest_subnormal(fmt) / 2):
        return "zero"
    if mid < math.log2(F.smallest_normal(fmt)):
        return "subnormal"
    if mid >= math.log2(F.max_value(fmt)):
        return "overflow"
    return "normal"


@dataclass
class ExponentHistogram:
    """``counts[k]`` values with floor(log2|g|) = lo + k; exact zeros counted apart."""

    lo: int
    counts: list[float]
    zeros: int = 0

    @property
    def hi(self) -> int:
        return self.lo + len(self.counts) - 1

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    def exponents(self) -> list[int]:
        return list(range(self.lo, self.lo + len(self.counts)))

    def region_shares(self, log2_scale: float = 0.0, fmt: str = "fp16") -> dict[str, float]:
        """Share of the non-zero values in each region of ``fmt`` after scaling by 2^log2_scale."""
        shares = dict.fromkeys(REGIONS, 0.0)
        total = self.total
        if total <= 0:
            return shares
        for e, c in zip(self.exponents(), self.counts):
            shares[region_of_bin(e + log2_scale, fmt)] += c / total
        return shares

    def to_dict(self) -> dict:
        return {"lo": self.lo, "counts": list(self.counts), "zeros": self.zeros}

    @classmethod
    def from_dict(cls, d: Mapping) -> ExponentHistogram:
        return cls(int(d["lo"]), [float(c) for c in d["counts"]], int(d.get("zeros", 0)))


def exponent_histogram(values, lo: int = HIST_LO, hi: int = HIST_HI) -> ExponentHistogram:
    """Bin the non-zero finite ``values`` by floor(log2|v|), clamped to [lo, hi]."""
    v = np.abs(np.asarray(values, dtype=np.float64).ravel())
    v = v[np.isfinite(v)]
    zeros = int(np.count_nonzero(v == 0))
    v = v[v > 0]
    # frexp: v = m * 2**x with 0.5 <= m < 1, so floor(log2 v) = x - 1 exactly (no log rounding).
    e = np.frexp(v)[1].astype(np.int64) - 1
    e = np.clip(e, lo, hi) - lo
    counts = np.bincount(e, minlength=hi - lo + 1)
    return ExponentHistogram(lo, [int(c) for c in counts], zeros)


def normal_histogram(mu: float, sigma: float, n: float = 1.0, lo: int = HIST_LO,
                     hi: int = HIST_HI) -> ExponentHistogram:
    """Expected histogram of ``n`` values with log2|g| ~ N(mu, sigma)."""
    cdf = lambda z: 0.5 * (1 + math.erf((z - mu) / (sigma * math.sqrt(2))))  # noqa: E731
    counts = []
    for e in range(lo, hi + 1):
        a = -math.inf if e == lo else e
        b = math.inf if e == hi else e + 1
        counts.append(n * ((cdf(b) if b != math.inf else 1.0) - (cdf(a) if a != -math.inf else 0.0)))
    return ExponentHistogram(lo, counts, 0)


# ---- loss-scale dynamics -----------------------------------------------------------------
@dataclass
class ScalerSimConfig:
    steps: int = 400
    init_scale: float = F.GRADSCALER_DEFAULTS["init_scale"]
    growth_factor: float = F.GRADSCALER_DEFAULTS["growth_factor"]
    backoff_factor: float = F.GRADSCALER_DEFAULTS["backoff_factor"]
    growth_interval: int = 50
    forced_overflows: tuple[int, ...] = ()
    mu_start: float = -16.0
    mu_end: float = -24.0
    sigma: float = 3.0
    n_values: float = 1e6
    spike_prob: float = 0.01
    spike_binades: tuple[float, float] = (2.0, 6.0)
    tau: float = 150.0          # updates over which mu and the loss settle
    loss_start: float = 2.0
    loss_end: float = 0.1
    seed: int = 0

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if not (self.init_scale > 0 and math.isfinite(self.init_scale)):
            raise ValueError("init_scale must be positive")
        if not self.growth_factor > 1 or not 0 < self.backoff_factor < 1:
            raise ValueError("need growth_factor > 1 and 0 < backoff_factor < 1")
        if int(self.growth_interval) != self.growth_interval or self.growth_interval < 1:
            raise ValueError("growth_interval must be a positive integer")
        if self.sigma <= 0 or self.tau <= 0 or self.n_values < 1:
            raise ValueError("sigma, tau must be > 0 and n_values >= 1")


@dataclass
class ScalerSim:
    config: ScalerSimConfig
    scale: list[float] = field(default_factory=list)       # scale used at each step
    overflow: list[bool] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    mu: list[float] = field(default_factory=list)          # mean log2|g| of the step
    max_log2: list[float] = field(default_factory=list)    # log2 of the step's largest |g|
    zero_unscaled: list[float] = field(default_factory=list)
    zero_scaled: list[float] = field(default_factory=list)
    subnormal_unscaled: list[float] = field(default_factory=list)
    subnormal_scaled: list[float] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return sum(self.overflow)

    def histogram(self, step: int) -> ExponentHistogram:
        """The expected exponent histogram (of 10^6 values) at ``step``."""
        return normal_histogram(self.mu[step], self.config.sigma, 1e6)


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def simulate_scaler(config: ScalerSimConfig | None = None, **overrides) -> ScalerSim:
    """Run the synthetic training of the module docstring for ``config.steps`` steps."""
    cfg = config or ScalerSimConfig()
    if overrides:
        cfg = ScalerSimConfig(**{**cfg.__dict__, **overrides})
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    lim = fp16_limits_log2()
    out = ScalerSim(cfg)
    scale, good, updates = float(cfg.init_scale), 0, 0
    forced = set(cfg.forced_overflows)
    z_max = math.sqrt(2 * math.log(cfg.n_values)) if cfg.n_values > 1 else 0.0
    for step in range(cfg.steps):
        progress = 1 - math.exp(-updates / cfg.tau)
        mu = cfg.mu_start + (cfg.mu_end - cfg.mu_start) * progress
        spike = rng.uniform(*cfg.spike_binades) if rng.random() < cfg.spike_prob else 0.0
        noise = rng.normal(0.0, 0.02)
        top = mu + cfg.sigma * z_max + spike
        s = math.log2(scale)
        natural = math.isinf(F.round_to_format(2.0 ** min(top + s, 1000.0), "fp16"))
        overflow = natural or step in forced
        out.scale.append(scale)
        out.overflow.append(overflow)
        out.forced.append(step in forced)
        out.mu.append(mu)
        out.max_log2.append(top)
        out.loss.append((cfg.loss_end + (cfg.loss_start - cfg.loss_end) * math.exp(-updates / cfg.tau))
                        * (1 + noise))
        out.zero_unscaled.append(_phi((lim["zero_below"] - mu) / cfg.sigma))
        out.zero_scaled.append(_phi((lim["zero_below"] - s - mu) / cfg.sigma))
        out.subnormal_unscaled.append(_phi((lim["normal"] - mu) / cfg.sigma) - out.zero_unscaled[-1])
        out.subnormal_scaled.append(_phi((lim["normal"] - s - mu) / cfg.sigma) - out.zero_scaled[-1])
        if not overflow:
            updates += 1
        scale, good = F.gradscaler_update(scale, good, overflow, cfg.growth_factor,
                                          cfg.backoff_factor, cfg.growth_interval)
    return out


# ---- overlap timeline --------------------------------------------------------------------
@dataclass
class Timeline:
    """Times in seconds from the start of backward."""

    mode: str
    layers: list[tuple[str, float, float]]            # (name, start, end), in backward order
    buckets: list[tuple[int, int, float, float]]      # (index, bytes, start, end)
    backward_end: float
    end: float

    @property
    def exposed_comm(self) -> float:
        """Communication time not hidden behind backward."""
        return self.end - self.backward_end


def simulate_overlap(tensor_bytes: Sequence[int], tensor_backward_s: Sequence[float], world_size: int,
                     alpha: float, beta: float, bucket_cap_bytes: int, first_bucket_bytes: int | None = None,
                     overlap: bool = True, layer_of: Sequence[str] | None = None) -> Timeline:
    """Backward and bucketed all-reduce of one step.

    Parameter tensors are given in forward order with the backward time that produces each
    gradient; ``layer_of[i]`` names tensor i's layer (consecutive tensors of one layer are drawn
    as one compute segment).
    """
    if len(tensor_bytes) != len(tensor_backward_s) or not tensor_bytes:
        raise ValueError("need one size and one backward time per tensor")
    if any(t < 0 for t in tensor_backward_s) or any(b < 0 for b in tensor_bytes):
        raise ValueError("sizes and times must be >= 0")
    first = bucket_cap_bytes if first_bucket_bytes is None else first_bucket_bytes
    order = list(reversed(range(len(tensor_bytes))))
    layer_of = list(layer_of) if layer_of is not None else [f"t{i}" for i in range(len(tensor_bytes))]
    t = 0.0
    layers: list[tuple[str, float, float]] = []
    ready = {}
    for i in order:
        start, t = t, t + tensor_backward_s[i]
        ready[i] = t
        if layers and layers[-1][0] == layer_of[i]:
            layers[-1] = (layer_of[i], layers[-1][1], t)
        else:
            layers.append((layer_of[i], start, t))
    backward_end = t
    groups = F.ddp_buckets([tensor_bytes[i] for i in order], bucket_cap_bytes, first)
    sizes = [sum(tensor_bytes[order[k]] for k in members) for members in groups]
    full = [max(ready[order[k]] for k in members) if overlap else backward_end for members in groups]
    spans = bucket_chain(full, [ring_allreduce_time(n, world_size, alpha, beta) for n in sizes])
    buckets = [(b, n, a, e) for b, (n, (a, e)) in enumerate(zip(sizes, spans))]
    return Timeline("overlap" if overlap else "no-overlap", layers, buckets, backward_end,
                    max([backward_end] + [e for _a, e in spans]))


def bucket_chain(ready: Sequence[float], durations: Sequence[float]) -> list[tuple[float, float]]:
    """(start, end) of each bucket's all-reduce when they run one at a time, in order: bucket k
    starts once it is ready and bucket k−1 is done, and lasts ``durations[k]``."""
    spans, free = [], float("-inf")
    for r, d in zip(ready, durations, strict=True):
        start = max(r, free)
        free = start + d
        spans.append((start, free))
    return spans


def exposed_after(ready: Sequence[float], durations: Sequence[float], backward_end: float) -> float:
    """Communication left after backward ends: the chain's end minus ``backward_end`` (≥ 0)."""
    spans = bucket_chain(ready, durations)
    return max(0.0, (spans[-1][1] if spans else backward_end) - backward_end)


def exposed_comm_causes(own_launch: Sequence[float], last_launch: Sequence[float], alone_s: Sequence[float],
                        alpha_beta_s: Sequence[float], backward_end: float,
                        thread_waits: Sequence[float] | None = None,
                        in_step_end: Sequence[float] | None = None,
                        seen: tuple[float, float] | None = None) -> dict[str, float]:
    """One rank's exposed communication, predicted and decomposed (issue 28), times on its clock.

    ``predicted``: the buckets launched when this rank launched them, each lasting its α-β time
    (``alpha_beta_s``), as :func:`simulate_overlap` does. ``peer_wait``: how much later the chain
    ends when each bucket starts only once the *last* rank launched it (``last_launch``, measured
    on every rank). ``slow_collective``: how much later still when each bucket lasts what the same
    all-reduce was measured to take *alone*, outside the step (``alone_s``) — bandwidth or latency
    worse than α-β. ``cpu_contention`` (with ``thread_waits``): how much later still when each bucket
    also waits what the backend's threads waited for a core while it ran in the step (on a CPU,
    backward computes on the cores gloo needs). ``slower_in_step`` (with ``in_step_end``, each
    bucket's measured end in the step): the rest of what the all-reduces took in the step beyond
    alone, their chain ending at the latest end (gloo's two threads may finish them out of order) or
    the last launch; ``cpu_contention`` is then at most that whole slowdown, the
    share the threads' waits account for. ``seen`` (with ``in_step_end``): when the step saw the
    last end and how long its thread waited for a core since that end: that wait, up to the time
    between the two, is CPU contention too. Without ``in_step_end`` the causes are measured apart
    from the step: what the step's exposed time adds to them stays unexplained; with it, what stays
    unexplained is the rest of the time from the last all-reduce's end to the step seeing it."""
    predicted = exposed_after(own_launch, alpha_beta_s, backward_end)
    waited = exposed_after(last_launch, alpha_beta_s, backward_end)
    slow = exposed_after(last_launch, alone_s, backward_end)
    out = {"predicted": predicted, "peer_wait": waited - predicted, "slow_collective": slow - waited}
    if thread_waits is not None:
        starved = exposed_after(last_launch, [a + w for a, w in zip(alone_s, thread_waits, strict=True)], backward_end)
        out["cpu_contention"] = starved - slow
    if in_step_end is not None:
        ran = max(0.0, max(*last_launch, *in_step_end) - backward_end)
        slower = ran - slow
        share = min(out.get("cpu_contention", 0.0), max(0.0, slower))
        if thread_waits is not None:
            out["cpu_contention"] = share
        out["slower_in_step"] = slower - share
        if seen is not None:
            seen_at, caller_wait = seen
            late = max(0.0, seen_at - (backward_end + ran))  # after the chain's end, or backward's
            out["cpu_contention"] = out.get("cpu_contention", 0.0) + min(caller_wait, late)
    return out


@dataclass
class OverlapModel:
    """The default model the timeline view simulates: a stack of equal layers, each with
    ``tensors_per_layer`` equal parameter tensors (weights, biases, norms)."""

    n_layers: int = 12
    layer_mib: float = 4.0
    tensors_per_layer: int = 8
    layer_backward_ms: float = 2.0
    world_size: int = 8
    alpha_us: float = 30.0
    bandwidth_gbps: float = 10.0     # GB/s of each rank's link
    bucket_mib: float = 8.0
    first_bucket_mib: float | None = None

    def run(self, overlap: bool = True) -> Timeline:
        k = self.tensors_per_layer
        nbytes = int(self.layer_mib * F.MiB / k)
        n = self.n_layers * k
        return simulate_overlap([nbytes] * n, [self.layer_backward_ms / 1e3 / k] * n,
                                self.world_size, self.alpha_us * 1e-6, 1 / (self.bandwidth_gbps * 1e9),
                                int(self.bucket_mib * F.MiB),
                                None if self.first_bucket_mib is None else int(self.first_bucket_mib * F.MiB),
                                overlap=overlap, layer_of=[f"L{i // k}" for i in range(n)])

    def sweep(self, sizes_mib: Sequence[float]) -> dict[float, float]:
        """Step time (backward + exposed communication, s) for each bucket size."""
        out = {}
        for size in sizes_mib:
            m = OverlapModel(**{**self.__dict__, "bucket_mib": size, "first_bucket_mib": None})
            out[size] = m.run(True).end
        return out


def overlap_step_time(bucket_mib: float, overlap: bool = True, n_layers: int = 12, layer_mib: float = 4.0,
                      tensors_per_layer: int = 8, layer_backward_ms: float = 2.0, world_size: int = 8,
                      alpha_us: float = 30.0, bandwidth_gbps: float = 10.0) -> float:
    """Seconds of backward plus exposed communication of :class:`OverlapModel` (a number the
    lesson text can check)."""
    return OverlapModel(n_layers, layer_mib, tensors_per_layer, layer_backward_ms, world_size,
                        alpha_us, bandwidth_gbps, bucket_mib).run(overlap).end
