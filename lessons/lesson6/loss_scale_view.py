"""Lesson 6's visualizer, what it shows: its settings (:class:`LossScaleState`: the view, the
scaler's and the overlap model's sliders, the histogram's step, the simulation or the run), how
keys, the lesson's steps and a run's events move them, and the series drawn
(:class:`LossScaleView`), from the lesson's models (``simulation.py``) or the run's fold
(``mixed_precision_run.py``). Pure: the widget (``visualizers/loss_scale.py``) holds a state in
its reactive attributes and draws.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..events import RUN_START
from .events import GradHist
from .mixed_precision_run import MixedPrecisionRun
from .simulation import ExponentHistogram, OverlapModel, ScalerSim, ScalerSimConfig, simulate_scaler

MODE_ORDER = ("overlap", "no-overlap", "ddp")
GROWTH_FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)
BACKOFF_FACTORS = (0.125, 0.25, 0.5, 0.75, 0.875)
GROWTH_INTERVALS = (5, 10, 20, 50, 100, 200, 500, 2000)
BUCKET_MIB = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 64, 1024)
HIST_EVERY = 25  # the simulation's histogram steps: every 25th


@dataclass(frozen=True)
class LossScaleState:
    """The settings of the loss-scale visualizer (every field a reactive of the widget)."""

    view: str = "scale"  # scale, exponents, timeline
    fmt: str = "fp16"  # or "bf16"
    config: ScalerSimConfig = field(default_factory=ScalerSimConfig)
    overlap_model: OverlapModel = field(default_factory=OverlapModel)
    hist_index: int | None = None  # None: follow the latest
    use_live: bool = False  # the run's series instead of the simulation's
    live_bucket: float | None = None  # the run's bucket size shown (None: the best one)


def _step(choices: tuple, value: float, direction: int):
    i = min(range(len(choices)), key=lambda k: abs(choices[k] - value))
    return choices[max(0, min(len(choices) - 1, i + direction))]


def show_step(state: LossScaleState, view: dict) -> LossScaleState:
    """The state a lesson step's ``view = {...}`` asks for (``show`` and ``format``)."""
    return replace(state, view=view.get("show", state.view), fmt=view.get("format", "fp16"))


def toggle_format(state: LossScaleState) -> LossScaleState:
    return replace(state, fmt="bf16" if state.fmt == "fp16" else "fp16")


def reset(state: LossScaleState) -> LossScaleState:
    """The sliders back to their defaults (the view, format and source stay)."""
    return replace(state, config=ScalerSimConfig(), overlap_model=OverlapModel(), hist_index=None)


@dataclass(frozen=True)
class Histogram:
    """The exponent histogram shown: its step, the scale it was taken at, the run's event if measured."""

    hist: ExponentHistogram
    scale: float
    step: int
    measured: GradHist | None


class LossScaleView:
    """The series of a :class:`LossScaleState`: the simulated scaler and overlap, or the learner's run."""

    def __init__(self) -> None:
        self.run = MixedPrecisionRun()
        self._sim: tuple[ScalerSimConfig, ScalerSim] | None = None

    def live(self, state: LossScaleState) -> bool:
        """Whether the run is shown (one was asked for and has said something)."""
        return state.use_live and not self.run.empty

    def sim(self, state: LossScaleState) -> ScalerSim:
        """The simulated scaler with the state's settings (kept while they stay)."""
        if self._sim is None or self._sim[0] != state.config:
            self._sim = (state.config, simulate_scaler(state.config))
        return self._sim[1]

    def hist_steps(self, state: LossScaleState) -> list[int]:
        if state.use_live and self.run.hists:
            return [h["step"] for h in self.run.hists]
        return list(range(0, state.config.steps, HIST_EVERY))

    def live_bucket(self, state: LossScaleState) -> float:
        """The run's bucket size shown: the chosen one, else the fastest, else the smallest."""
        sizes = self.run.bucket_sizes()
        if state.live_bucket is not None and state.live_bucket in sizes:
            return state.live_bucket
        best = self.run.best_bucket()
        return best if best is not None else sizes[0]

    # -- the series drawn --------------------------------------------------------------------------
    def scale_series(self, state: LossScaleState) -> tuple[list[float], list[bool], list[bool], list[float]] | None:
        """(scale, overflow, injected overflow, loss) per step; None when the run has none yet."""
        if self.live(state):
            run = self.run
            return (run.scale, run.overflow, run.forced, run.loss) if run.scale else None
        s = self.sim(state)
        return s.scale, s.overflow, s.forced, s.loss

    def histogram(self, state: LossScaleState) -> Histogram | None:
        """The histogram at the chosen step (the latest when none is); None when the run has none yet."""
        steps = self.hist_steps(state)
        idx = len(steps) - 1 if state.hist_index is None else min(state.hist_index, len(steps) - 1)
        if self.live(state):
            if not self.run.hists:
                return None
            ev = self.run.hists[idx]
            return Histogram(ExponentHistogram.from_dict(ev), float(ev["scale"]), ev["step"], ev)
        sim = self.sim(state)
        return Histogram(sim.histogram(steps[idx]), sim.scale[steps[idx]], steps[idx], None)

    def timelines(self, state: LossScaleState) -> tuple[dict[str, dict], float] | None:
        """Per mode, one step's timeline in ms (``MixedPrecisionRun.timeline``'s shape), and the bucket
        size (MiB); None when the run has none yet."""
        if self.live(state):
            if not self.run.timelines:
                return None
            bucket = self.live_bucket(state)
            tls = {m: self.run.timeline(bucket, m) for m in MODE_ORDER if (bucket, m) in self.run.timelines}
            return {m: tl for m, tl in tls.items() if tl is not None}, bucket
        m = state.overlap_model
        return {"overlap": _timeline_ms(m.run(True)), "no-overlap": _timeline_ms(m.run(False))}, m.bucket_mib

    # -- what moves it -----------------------------------------------------------------------------
    def feed(self, state: LossScaleState, event: dict) -> LossScaleState | None:
        """Fold ``event`` into the run; the state after it (the run shown), None when it changed nothing."""
        if not self.run.feed(event):
            return None
        if RUN_START.matches(event):  # a new run replaces the previous one's data
            return replace(state, live_bucket=None, hist_index=None)
        return replace(state, use_live=True)

    def slide(self, state: LossScaleState, what: str, direction: int) -> LossScaleState:
        """One notch of a slider: a scaler setting, or the bucket size (the run's, when it is shown)."""
        c = state.config
        if what == "growth_interval":
            return replace(state, config=replace(c, growth_interval=_step(GROWTH_INTERVALS, c.growth_interval,
                                                                          direction)))
        if what == "growth_factor":
            return replace(state, config=replace(c, growth_factor=_step(GROWTH_FACTORS, c.growth_factor, direction)))
        if what == "backoff_factor":
            return replace(state, config=replace(c, backoff_factor=_step(BACKOFF_FACTORS, c.backoff_factor,
                                                                         direction)))
        if what == "init_scale":
            e = max(0, min(40, round(math.log2(c.init_scale)) + 2 * direction))
            return replace(state, config=replace(c, init_scale=2.0 ** e))
        if what == "bucket":
            if state.use_live and self.run.timelines:
                sizes = self.run.bucket_sizes()
                i = sizes.index(self.live_bucket(state)) + direction
                return replace(state, live_bucket=sizes[max(0, min(len(sizes) - 1, i))])
            m = state.overlap_model
            return replace(state, overlap_model=replace(m, bucket_mib=_step(BUCKET_MIB, m.bucket_mib, direction)))
        raise ValueError(f"no slider {what!r}")

    def hist_step(self, state: LossScaleState, direction: int) -> LossScaleState:
        n = len(self.hist_steps(state))
        if not n:
            return state
        cur = n - 1 if state.hist_index is None else state.hist_index
        step = cur + direction
        # one step past an end goes round (the view opens at the last step, where "." did nothing); a jump stops
        step = step % n if abs(direction) == 1 else max(0, min(n - 1, step))
        return replace(state, hist_index=step)

    def toggle_source(self, state: LossScaleState) -> LossScaleState:
        return replace(state, use_live=not state.use_live and not self.run.empty)


def _timeline_ms(tl) -> dict:
    """A simulated :class:`~distai.lessons.lesson6.simulation.Timeline` (s) in the run's shape (ms)."""
    ms = 1000.0
    return {"layers": [[n, a * ms, b * ms] for n, a, b in tl.layers],
            "buckets": [[i, nb, a * ms, b * ms] for i, nb, a, b in tl.buckets],
            "backward_end": tl.backward_end * ms, "end": tl.end * ms}
