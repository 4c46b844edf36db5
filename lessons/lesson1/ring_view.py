"""Lesson 1's visualizer, what it shows: its settings and where the animation stands
(:class:`RingState`), how the keys, the lesson's steps and a run's events move them, and the
figures drawn (:class:`RingView`), from the models (``ring_plan.py``, ``formulas.py``) and the
run's fold (``ring_run.py``). Pure: the widget (``visualizers/ring.py``) holds a state in its
reactive attributes, asks this module for the next one and draws the figures.

A frame is one step of the all-reduce (frame k: after k steps); ``progress`` is the way through
the step under way, 0 to 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..events import RUN_START
from . import formulas, ring_model
from .events import RING_STEP
from .ring_plan import ALGORITHMS, RING, Plan, model_plan, recorded_plan
from .ring_run import RecordedCall, RingRun

N_MIN, N_MAX = 2, 16
# ×4 a step, so the latency-bound small sizes give way to the bandwidth-bound ones gradually; the top two are
# the lesson's worked example (1 GB) and four times it
SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 10 ** 9, 4 * 10 ** 9)
DEFAULT_SIZE = 10 ** 9
DEFAULT_ALPHA, DEFAULT_BETA = 5e-6, 4e-11  # the lesson's link: 5 µs, 25 GB/s


@dataclass(frozen=True)
class RingState:
    """The settings and the position of the ring visualizer (every field a reactive of the widget)."""

    algorithm: str = RING
    n: int = 4
    size_bytes: float = DEFAULT_SIZE
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    frame: int = 0
    progress: float = 0.0
    stop_at: int | None = None  # the frame a step's animation stops at (the end of a phase)
    playing: bool = False
    view: str = "ring"  # or "chart"
    source: str = "sim"  # or "run": a traced call of the learner's run
    call: int | None = None
    caption_key: str | None = None
    emphasis: str | None = None  # the status line the step stresses: "bytes" or "time"
    follow_run: bool = True  # a new run's first traced call takes over the view


def restarted(state: RingState, **changes) -> RingState:
    """``state`` with ``changes``, back at the first frame, no stop set."""
    return replace(state, frame=0, progress=0.0, stop_at=None, **changes)


@dataclass(frozen=True)
class RingStatus:
    """The status lines' figures at one frame."""

    frame: int
    total: int
    finished_phase: str | None  # the phase that has just ended (✓), at a phase's boundary
    phase: str | None  # the phase under way; None once done
    waiting: tuple[int, ...]  # a live run: the ranks not heard from for this step
    sent: float  # bytes each rank has sent (the simulated ring)
    sent_range: tuple[float, float] | None  # a recorded ring: the least and most a rank has sent
    busiest: tuple[float, float] | None  # tree and naive: rank 0's link, bytes in and out
    total_bytes: float  # the algorithm's bytes per rank, all steps
    time_now: float  # α-β time of the steps done
    time_all: float
    alpha: float
    beta: float
    fitted: bool  # α and β come from the run's fit
    mismatches: int | None  # a recorded call: messages that differ from the model


@dataclass(frozen=True)
class AlgorithmCost:
    """One line of the comparison: the busiest link's bytes, the steps and the α-β time."""

    algorithm: str
    link_bytes: float
    steps: int
    time: float
    done_bytes: float | None  # the algorithm shown: bytes moved so far on its busiest link


class RingView:
    """The figures of a :class:`RingState` over the learner's run (the fold of its events)."""

    def __init__(self) -> None:
        self.run = RingRun()
        self._plan_cache: tuple | None = None

    # -- what is shown ---------------------------------------------------------------------------
    def recorded(self, state: RingState) -> RecordedCall | None:
        """The run's traced call on show, or None (the models)."""
        if state.source != "run" or state.call is None:
            return None
        return self.run.calls.get(state.call)

    def plan(self, state: RingState) -> Plan:
        rec = self.recorded(state)
        if rec is None:
            return model_plan(state.algorithm, state.n)
        key = (rec.call, len(rec.events), id(rec))
        if self._plan_cache is None or self._plan_cache[0] != key:
            self._plan_cache = (key, recorded_plan(rec))
        return self._plan_cache[1]

    def effective_n(self, state: RingState) -> int:
        rec = self.recorded(state)
        return rec.n if rec is not None else state.n

    def effective_size(self, state: RingState) -> float:
        rec = self.recorded(state)
        return float(rec.size) if rec is not None else float(state.size_bytes)

    def alpha_beta(self, state: RingState) -> tuple[float, float, bool]:
        """(α, β, from the run's fit?)"""
        if self.recorded(state) is not None:
            fit = self.run.fit_params("ring")
            if fit is not None:
                return fit[0], fit[1], True
        return state.alpha, state.beta, False

    def shown_frame(self, state: RingState) -> int:
        """The frame drawn: a live run's frames stop at the last step every rank has reported."""
        return min(state.frame, self.plan(state).ready)

    def status(self, state: RingState, frame: int) -> RingStatus:
        plan = self.plan(state)
        n, size = plan.n, self.effective_size(state)
        total, algo = plan.total, plan.algorithm
        boundary = frame > 0 and (frame >= total or plan.phases[frame - 1] != plan.phases[frame])
        recorded = self.recorded(state) is not None
        waiting = tuple(plan.missing[frame]) if recorded and plan.ready <= frame < total else ()
        alpha, beta, fitted = self.alpha_beta(state)
        sent, sent_range, busiest = 0.0, None, None
        if algo == RING:
            if recorded:
                sent_range = (min(plan.sent[frame]), max(plan.sent[frame]))
            else:
                sent = ring_model.bytes_sent(size, n, frame)
            msg = size / n
        else:
            busiest = (plan.recv[frame][0] * size, plan.sent[frame][0] * size)
            msg = size
        return RingStatus(
            frame=frame, total=total, finished_phase=plan.phases[frame - 1] if boundary else None,
            phase=plan.phases[frame] if frame < total else None, waiting=waiting, sent=sent,
            sent_range=sent_range, busiest=busiest, total_bytes=formulas.allreduce_bytes_per_rank(size, n, algo),
            time_now=formulas.serial_messages_time(min(frame, total), msg, alpha, beta),
            time_all=formulas.allreduce_time(size, n, alpha, beta, algo), alpha=alpha, beta=beta,
            fitted=fitted, mismatches=plan.mismatches if recorded else None)

    def comparison(self, state: RingState, frame: int) -> list[AlgorithmCost]:
        """Ring, tree and naive for the same N and S (α and β of the status)."""
        plan = self.plan(state)
        n, size = plan.n, self.effective_size(state)
        alpha, beta, _ = self.alpha_beta(state)
        out = []
        for a in ALGORITHMS:
            done = None
            if a == plan.algorithm:
                units = max(max(plan.sent[frame]), max(plan.recv[frame]))
                done = units if self.recorded(state) is not None else units * size
            out.append(AlgorithmCost(a, formulas.allreduce_bytes_per_rank(size, n, a), formulas.allreduce_steps(n, a),
                                     formulas.allreduce_time(size, n, alpha, beta, a), done))
        return out

    # -- what moves it ---------------------------------------------------------------------------
    def show_step(self, state: RingState, view: dict, caption_key: str | None) -> RingState:
        """The state a lesson step's ``view = {...}`` asks for (the keys are ``RingVisualizer.STEP_SETTINGS``)."""
        state = replace(state, caption_key=caption_key, emphasis=view.get("emphasis"))
        if not view:
            return state
        if "show" in view:
            return replace(state, view=view["show"])
        source, call = "sim", state.call
        if view.get("source") == "run" and self.run.calls:
            source = "run"
            if call not in self.run.calls:
                call = min(self.run.calls)
        alpha, beta = (view["alpha_s"], view["beta_s_per_byte"]) if "alpha_s" in view else (state.alpha, state.beta)
        state = replace(state, view="ring", source=source, call=call, algorithm=view.get("algorithm", state.algorithm),
                        n=view.get("ranks", state.n), size_bytes=view.get("size_bytes", state.size_bytes),
                        alpha=alpha, beta=beta)
        phases = self.plan(state).phases
        return replace(state, frame=phases.index(view["start_at"]) if "start_at" in view else 0,
                       stop_at=phases.index(view["stop_at"]) if "stop_at" in view else None,
                       progress=0.0, playing=bool(view.get("play")))

    def feed(self, state: RingState, event: dict) -> RingState | None:
        """Fold ``event`` into the run; the state after it, or None when the event changed nothing.
        A new run's first traced call takes over the ring; the busbw chart, where a step shows it, stays
        (the run's sweep is what it draws)."""
        if not self.run.feed(event):
            return None
        if RUN_START.matches(event):
            self._plan_cache = None
            state = replace(state, follow_run=True)
            if state.source == "run":
                state = replace(state, source="sim", call=None, frame=0, progress=0.0)
        elif RING_STEP.matches(event):
            rec = self.run.calls.get(int(event.get("call", 0)))
            if rec is not None and state.follow_run and 2 <= rec.n <= N_MAX:
                on_chart = state.view == "chart"
                state = restarted(state, follow_run=False, source="run", call=rec.call, view=state.view,
                                  playing=not on_chart)
        return state

    def advance(self, state: RingState, dt: float) -> RingState:
        """``dt`` steps on (a live run waits for its ranks' next step); playing stops at the end or the stop."""
        plan = self.plan(state)
        if state.frame >= plan.total:
            return replace(state, playing=False)
        if state.frame >= plan.ready:
            return state
        frame, progress = state.frame, state.progress + dt
        if progress < 1.0:
            return replace(state, progress=progress)
        frame += 1
        if frame >= plan.total or frame == state.stop_at:
            return replace(state, frame=frame, progress=0.0, playing=False, stop_at=None)
        return replace(state, frame=frame, progress=0.0)

    def at_end(self, state: RingState) -> bool:
        return state.frame >= self.plan(state).total

    def to_end(self, state: RingState) -> RingState:
        plan = self.plan(state)
        return replace(state, frame=min(plan.total, plan.ready), progress=0.0)

    def seek(self, state: RingState, frames: int) -> RingState:
        plan = self.plan(state)
        if frames < 0 and state.progress > 0:
            return replace(state, stop_at=None, progress=0.0)  # back to the start of the step under way
        frame = max(0, min(min(plan.total, plan.ready), state.frame + frames))
        return replace(state, stop_at=None, frame=frame, progress=0.0)

    def ranks(self, state: RingState, delta: int) -> RingState:
        state = to_model(state)
        n = max(N_MIN, min(N_MAX, state.n + delta))
        return replace(state, n=n, frame=min(state.frame, model_plan(state.algorithm, n).total),
                       progress=0.0, stop_at=None)

    def next_call(self, state: RingState) -> RingState:
        """The run's next traced call (its first, coming from the models)."""
        if not self.run.calls:
            return state
        calls = sorted(self.run.calls)
        i = calls.index(state.call) if state.call in calls else -1
        call = calls[(i + 1) % len(calls)] if state.source == "run" else calls[0]
        return restarted(state, call=call, source="run", view="ring")

    def switch_source(self, state: RingState) -> RingState | None:
        """Between the models and the run's calls; None when there is no run to switch to."""
        if state.source == "run":
            return to_model(state)
        if not self.run.calls:
            return None
        call = state.call if state.call in self.run.calls else min(self.run.calls)
        return restarted(state, source="run", view="ring", call=call)


def to_model(state: RingState) -> RingState:
    """Back to the models (from the first frame, when a run's call was on show)."""
    return replace(state, source="sim", frame=0, progress=0.0) if state.source == "run" else state


def next_size(state: RingState, delta: int) -> RingState:
    """The next (``delta`` = 1) or previous of :data:`SIZES` from the size nearest the current one."""
    state = to_model(state)
    i = min(range(len(SIZES)), key=lambda j: abs(math.log(SIZES[j]) - math.log(state.size_bytes)))
    return replace(state, size_bytes=SIZES[max(0, min(len(SIZES) - 1, i + delta))])


def next_algorithm(state: RingState) -> RingState:
    state = to_model(state)
    return restarted(state, view="ring", algorithm=ALGORITHMS[(ALGORITHMS.index(state.algorithm) + 1) % len(ALGORITHMS)])


def toggle_chart(state: RingState) -> RingState:
    return replace(state, view="ring" if state.view == "chart" else "chart")


def rewound(state: RingState) -> RingState:
    return replace(state, frame=0, progress=0.0)
