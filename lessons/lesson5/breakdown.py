"""Why a measured bubble is not (p−1)/(m+p−1): one measured step decomposed (issue 28).

The formula assumes equal stages and free communication. A real step has neither, and on a
shared CPU its ranks also wait for a core. Each rank's step is cut into slots, one per block:
the block's own work (its CPU time; its wall time on a GPU), the runner's overhead before it (the
CPU time between the previous block and this one: Python, posting sends and receives), the time it
was runnable but had no core (its wall time beyond its CPU time, in the block and before it), and
its waits for a peer's message. The step is then replayed through the lesson's own simulator
(:func:`.simulator.replay`), adding one cause at a time, so the causes add up by construction and
each is measured, not assumed:

1. ``formula``: ``(p−1)/(m+p−1)`` (``(p−1)/(v·m+p−1)`` interleaved): equal stages, no communication;
2. replay with each block's work: ``unequal_stages`` = this bubble − the formula (stages of unequal
   cost: the embedding on the first, the head and loss on the last, a slow layer);
3. + the runner's overhead before each block: ``overhead``;
4. + the time without a core: ``cpu_contention`` (more ranks than cores, or other programs);
5. + each message's measured latency (from the producer's end to the end of the wait for it, when
   that wait blocked; at most the fastest of those when the message was there first) and the final
   wait for the sends: ``communication``;
6. measured: what no replay explains is the check's ``unexplained`` remainder.

Every bubble here is idle over rank-time, ``1 − Σ work / (p · step time)``, with the same work (the
blocks' own), so the steps compare. Pure: no torch.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import Check, check
from . import formulas
from . import simulator as sim

__all__ = ["Block", "Wait", "RankStep", "Slot", "slots", "StepBreakdown", "breakdown", "bubble_check", "check_name",
           "WAIT_EPSILON"]

#: a wait shorter than this did not block: its message had arrived already (its latency is unknown)
WAIT_EPSILON = 20e-6


@dataclass(frozen=True)
class Block:
    """One forward or backward as measured on its rank: wall ``t0``…``t1`` and the process's CPU
    clock then (``c0``, ``c1``: CPU seconds per intra-op thread; None on a GPU)."""
    op: sim.Op
    t0: float
    t1: float
    c0: float | None = None
    c1: float | None = None

    @property
    def work(self) -> float:
        wall = self.t1 - self.t0
        return wall if self.c0 is None or self.c1 is None else min(max(self.c1 - self.c0, 0.0), wall)


@dataclass(frozen=True)
class Wait:
    """A rank's wait for a message: the output of ``kind`` (F/B) of ``mb`` on stage ``from_stage``."""
    kind: str
    mb: int
    from_stage: int
    t0: float
    t1: float


@dataclass(frozen=True)
class RankStep:
    """One rank's step: its blocks in order, its waits, its bounds and CPU clock at them, and its
    final wait for its sends (``send_t0``…``send_t1``)."""
    blocks: Sequence[Block]
    waits: Sequence[Wait]
    t_start: float
    t_end: float
    cpu_start: float | None
    cpu_end: float | None
    send_t0: float
    send_t1: float


@dataclass(frozen=True)
class Slot:
    """A block and its rank's time around it (s), besides waits: its work; before it (from the
    previous block's end, waits excluded: posting messages, Python, overlapping the message in
    flight) the runner's CPU time and the time without a core; after its start, the time without a
    core in it (and, for the last block, the rest of the step but the wait for the sends)."""
    op: sim.Op
    work: float
    pre_overhead: float
    pre_stolen: float
    post_overhead: float = 0.0
    post_stolen: float = 0.0

    @property
    def overhead(self) -> float:
        return self.pre_overhead + self.post_overhead

    @property
    def stolen(self) -> float:
        return self.pre_stolen + self.post_stolen


def _clamp(cpu: float | None, wall: float) -> float:
    """The CPU part of ``wall`` seconds (all of it when the CPU clock is unknown: a GPU)."""
    return wall if cpu is None else min(max(cpu, 0.0), wall)


def slots(rank: RankStep, t0: float) -> list[Slot]:
    """The rank's step cut into one slot per block (see the module docstring); ``t0``: the step's
    start on the first rank (a rank that starts later was waiting for a core)."""
    out: list[Slot] = []
    waits = sorted(rank.waits, key=lambda w: w.t0)
    prev_t, prev_c, late, k = rank.t_start, rank.cpu_start, max(rank.t_start - t0, 0.0), 0
    for b in rank.blocks:
        waited = 0.0
        while k < len(waits) and waits[k].t1 <= b.t0 + 1e-9:
            waited += waits[k].t1 - waits[k].t0
            k += 1
        gap = max(b.t0 - prev_t - waited, 0.0)
        gap_cpu = _clamp(None if b.c0 is None or prev_c is None else b.c0 - prev_c, gap)
        out.append(Slot(b.op, b.work, gap_cpu, gap - gap_cpu + late, 0.0, b.t1 - b.t0 - b.work))
        prev_t, prev_c, late = b.t1, b.c1, 0.0
    if out:  # after the last block: what is not the wait for the sends joins it
        tail = max(rank.t_end - prev_t - (rank.send_t1 - rank.send_t0), 0.0)
        tail_cpu = _clamp(None if rank.cpu_end is None or prev_c is None else rank.cpu_end - prev_c, tail)
        last = out[-1]
        out[-1] = Slot(last.op, last.work, last.pre_overhead, last.pre_stolen, tail_cpu,
                       last.post_stolen + tail - tail_cpu)
    return out


@dataclass(frozen=True)
class StepBreakdown:
    """One step: the bubble after each replay, and per rank where its time went (s)."""
    formula: float
    replay_work: float       # the schedule with the blocks' own work, nothing else
    replay_overhead: float   # + the runner's overhead
    replay_stolen: float     # + the time without a core
    replay_comm: float       # + the latency per hop and the final wait for the sends
    measured: float
    latency: float           # s per hop
    span: float              # the step's wall time, s
    compute: list[float]     # per rank: the blocks' own work
    overhead: list[float]    # per rank: the runner's CPU time between blocks
    contention: list[float]  # per rank: runnable without a core
    wait: list[float]        # per rank: waiting for a peer (messages, the final sends)
    idle: list[float]        # per rank: the rest of the step (the schedule's own idle besides waits)

    @property
    def causes(self) -> dict[str, float]:
        return {"unequal_stages": self.replay_work - self.formula,
                "overhead": self.replay_overhead - self.replay_work,
                "cpu_contention": self.replay_stolen - self.replay_overhead,
                "communication": self.replay_comm - self.replay_stolen}


def _bubble(work: float, p: int, span: float) -> float:
    return 1.0 - work / (p * span) if span > 0 else 0.0


def _latencies(ranks: Sequence[RankStep]) -> tuple[dict[tuple[str, int, int], float], float]:
    """Each message's latency (``(kind, mb, producer stage)`` → s) and their median over the waits
    that blocked: from the producer's end to the end of the wait. A message that was there before
    its wait began took at most that long: it gets the fastest latency measured, or less."""
    ends = {(b.op.kind, b.op.mb, b.op.stage): b.t1 for rank in ranks for b in rank.blocks}
    waits = [(w, (w.kind, w.mb, w.from_stage)) for rank in ranks for w in rank.waits]
    waits = [(w, key) for w, key in waits if key in ends]
    blocked = {key: max(w.t1 - ends[key], 0.0) for w, key in waits if w.t1 - w.t0 > WAIT_EPSILON}
    median = statistics.median(blocked.values()) if blocked else 0.0
    fastest = min(blocked.values(), default=0.0)
    early = {key: min(fastest, max(w.t0 - ends[key], 0.0)) for w, key in waits if key not in blocked}
    return {**early, **blocked}, median


def breakdown(schedule: str, p: int, m: int, v: int, ranks: Sequence[RankStep]) -> StepBreakdown:
    """One measured step (every rank's) decomposed as the module docstring says."""
    t0, t1 = min(r.t_start for r in ranks), max(r.t_end for r in ranks)
    cut = [slots(r, t0) for r in ranks]
    flat = [s for rank in cut for s in rank]
    work = {s.op: s.work for s in flat}
    over = ({s.op: s.work + s.post_overhead for s in flat}, {s.op: s.pre_overhead for s in flat})
    slot = ({s.op: s.work + s.post_overhead + s.post_stolen for s in flat},
            {s.op: s.pre_overhead + s.pre_stolen for s in flat})
    sent = dict(slot[0])
    for r, rank in zip(ranks, cut, strict=True):
        if rank:
            sent[rank[-1].op] += r.send_t1 - r.send_t0
    latency, median = _latencies(ranks)
    total, span = sum(work.values()), t1 - t0
    spans = [sim.replay(schedule, p, m, v, work).makespan,
             sim.replay(schedule, p, m, v, over[0], before=over[1]).makespan,
             sim.replay(schedule, p, m, v, slot[0], before=slot[1]).makespan,
             sim.replay(schedule, p, m, v, sent, latency=latency, before=slot[1]).makespan]
    compute = [sum(s.work for s in rank) for rank in cut]
    overhead = [sum(s.overhead for s in rank) for rank in cut]
    stolen = [sum(s.stolen for s in rank) for rank in cut]
    waited = [sum(w.t1 - w.t0 for w in r.waits) + r.send_t1 - r.send_t0 for r in ranks]
    return StepBreakdown(
        formula=formulas.pipeline_bubble(p, m, schedule, v)["bubble_fraction"],
        replay_work=_bubble(total, p, spans[0]), replay_overhead=_bubble(total, p, spans[1]),
        replay_stolen=_bubble(total, p, spans[2]), replay_comm=_bubble(total, p, spans[3]),
        measured=_bubble(total, p, span), latency=median, span=span, compute=compute, overhead=overhead,
        contention=stolen, wait=waited,
        idle=[span - sum(x) for x in zip(compute, overhead, stolen, waited, strict=True)])


def check_name(schedule: str) -> str:
    """The check's catalog name (``lessons/catalog/checks.toml``): ``bubble_gpipe``, …"""
    return f"bubble_{schedule}"


def bubble_check(schedule: str, steps: Sequence[StepBreakdown]) -> Check:
    """The schedule's bubble check over its measured steps (their means): formula → measured,
    with the four causes; ``detail``: the replays, the latency and where each rank's time went."""
    mean = statistics.fmean
    causes = {k: mean([s.causes[k] for s in steps]) for k in steps[0].causes}
    p = len(steps[0].compute)
    detail = {key: mean([getattr(s, key) for s in steps])
              for key in ("formula", "replay_work", "replay_overhead", "replay_stolen", "replay_comm")}
    detail.update(latency_s=mean([s.latency for s in steps]), step_s=mean([s.span for s in steps]))
    for r in range(p):
        for part in ("compute", "overhead", "contention", "wait", "idle"):
            detail[f"rank{r}_{part}_s"] = mean([getattr(s, part)[r] for s in steps])
    return check(check_name(schedule), detail["formula"], mean([s.measured for s in steps]), "fraction",
                 causes=causes, detail=detail)
