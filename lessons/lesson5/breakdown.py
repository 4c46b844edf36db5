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
3. + the runner's overhead before each block (and after a rank's last one): ``overhead``;
4. + the time without a core: ``cpu_contention`` (more ranks than cores, or other programs);
5. + each message's measured time: from its producer's end to its post on the sender, then from
   the later of that post and the start of the receiver's wait to the end of that wait
   (:func:`messages`), and what the sends' last wait lasted beyond their arrival:
   ``communication``. A receiver busy when the message was posted was not waiting for it: that
   time is its own (its work, overhead, contention), never the message's latency too;
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

__all__ = ["Block", "Wait", "Send", "RankStep", "Slot", "slots", "tail", "Messages", "messages", "StepBreakdown",
           "breakdown", "bubble_check", "check_name"]


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
class Send:
    """A rank's post of a message: the output of ``kind`` (F/B) of ``mb`` on stage ``from_stage``,
    posted at ``t``."""
    kind: str
    mb: int
    from_stage: int
    t: float


@dataclass(frozen=True)
class RankStep:
    """One rank's step: its blocks in order, its waits, its bounds and CPU clock at them, its
    final wait for its sends (``send_t0``…``send_t1``) and when it posted each send (a send not
    listed counts as posted at its producer's end)."""
    blocks: Sequence[Block]
    waits: Sequence[Wait]
    t_start: float
    t_end: float
    cpu_start: float | None
    cpu_end: float | None
    send_t0: float
    send_t1: float
    sends: Sequence[Send] = ()


@dataclass(frozen=True)
class Slot:
    """A block and its rank's time around it (s), besides waits: its work; before it (from the
    previous block's end, waits excluded: posting messages, Python, overlapping the message in
    flight) the runner's CPU time and the time without a core; in it, the time without a core."""
    op: sim.Op
    work: float
    pre_overhead: float
    pre_stolen: float
    post_stolen: float = 0.0

    @property
    def overhead(self) -> float:
        return self.pre_overhead

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
        out.append(Slot(b.op, b.work, gap_cpu, gap - gap_cpu + late, b.t1 - b.t0 - b.work))
        prev_t, prev_c, late = b.t1, b.c1, 0.0
    return out


def tail(rank: RankStep) -> tuple[float, float]:
    """The rank's time after its last block but the wait for its sends (posting them, returning):
    (the runner's CPU time, the time without a core)."""
    if not rank.blocks:
        return 0.0, 0.0
    last = rank.blocks[-1]
    wall = max(rank.t_end - last.t1 - (rank.send_t1 - rank.send_t0), 0.0)
    cpu = _clamp(None if rank.cpu_end is None or last.c1 is None else rank.cpu_end - last.c1, wall)
    return cpu, wall - cpu


@dataclass(frozen=True)
class StepBreakdown:
    """One step: the bubble after each replay, and per rank where its time went (s)."""
    formula: float
    replay_work: float       # the schedule with the blocks' own work, nothing else
    replay_overhead: float   # + the runner's overhead
    replay_stolen: float     # + the time without a core
    replay_comm: float       # + each message's time from its post to the end of its wait, and the sends' last wait
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


Key = tuple[str, int, int]  # a message: (kind, mb, producer stage)


@dataclass(frozen=True)
class Messages:
    """Each message as measured (see :func:`messages`)."""
    latency: dict[Key, float]      # from its producer's end to its arrival, had its receiver been waiting
    transfer: dict[sim.Op, float]  # per consuming block: its input's wait once both ends had posted
    consumer: dict[Key, sim.Op]
    received: dict[Key, float]     # the end of its wait
    median: float                  # s per hop, over the messages whose receiver waited for the post


def messages(ranks: Sequence[RankStep]) -> Messages:
    """Each message's time, from its two ends' clocks: the sender posts it ``s − e`` after its
    producer's end ``e`` (Python, the batch's other messages; at ``e`` when the post was not
    recorded), then it takes ``transfer = w1 − max(w0, s)`` to arrive, ``w0``…``w1`` being the
    receiver's wait for it: from the post when the receiver was already waiting, else from the
    wait's start (gloo and NCCL move a message only once both ends have posted it, so a receiver
    that comes late still waits for the transfer; what it did before, the message in flight or
    not, is its own time, not the message's). Replayed, its consumer starts at ``max(its rank's
    own readiness, s) + transfer``: a late receiver's busy time is never charged again as latency."""
    ends = {(b.op.kind, b.op.mb, b.op.stage): b for rank in ranks for b in rank.blocks}
    posted = {(x.kind, x.mb, x.from_stage): x.t for rank in ranks for x in rank.sends}
    latency: dict[Key, float] = {}
    transfer: dict[sim.Op, float] = {}
    consumer: dict[Key, sim.Op] = {}
    received: dict[Key, float] = {}
    blocked: list[float] = []
    for rank in ranks:
        for w in rank.waits:
            key = (w.kind, w.mb, w.from_stage)
            into = (w.kind, w.mb, w.from_stage + 1 if w.kind == sim.FORWARD else w.from_stage - 1)
            if key not in ends or into not in ends:
                continue
            e = ends[key].t1
            sent = max(posted.get(key, e), e)
            moved = max(w.t1 - max(w.t0, sent), 0.0)
            latency[key], transfer[ends[into].op], consumer[key], received[key] = sent - e + moved, moved, ends[into].op, w.t1
            if w.t0 < sent:
                blocked.append(w.t1 - e)
    median = statistics.median(blocked or list(latency.values()) or [0.0])
    return Messages(latency, transfer, consumer, received, median)


def _makespan(tl: sim.Timeline, after: Sequence[float]) -> float:
    """The replayed step's end: each rank's last block's end plus its time ``after`` it."""
    return max((e[-1] + a for e, a in zip(tl.end, after, strict=True) if e), default=0.0)


def _comm_makespan(tl: sim.Timeline, ranks: Sequence[RankStep], msgs: Messages, after: Sequence[float]) -> float:
    """The communication replay's end: a rank ends after its last block and its tail, and once its
    last message has arrived (its consumer's replayed start), plus what its wait for its sends
    lasted beyond that arrival as measured."""
    start = {op: s for order, starts in zip(tl.order, tl.start, strict=True) for op, s in zip(order, starts, strict=True)}
    out = 0.0
    for r, rank in enumerate(ranks):
        if not tl.end[r]:
            continue
        keys = [(x.kind, x.mb, x.from_stage) for x in rank.sends if (x.kind, x.mb, x.from_stage) in msgs.consumer]
        arrival = max((start[msgs.consumer[k]] for k in keys), default=0.0)
        last_real = max((msgs.received[k] for k in keys), default=rank.send_t0)
        beyond = max(rank.send_t1 - max(rank.send_t0, last_real), 0.0)
        out = max(out, max(tl.end[r][-1] + after[r], arrival) + beyond)
    return out


def breakdown(schedule: str, p: int, m: int, v: int, ranks: Sequence[RankStep]) -> StepBreakdown:
    """One measured step (every rank's) decomposed as the module docstring says."""
    t0, t1 = min(r.t_start for r in ranks), max(r.t_end for r in ranks)
    cut = [slots(r, t0) for r in ranks]
    tails = [tail(r) for r in ranks]
    flat = [s for rank in cut for s in rank]
    work = {s.op: s.work for s in flat}
    stolen = {s.op: s.work + s.post_stolen for s in flat}
    pre_over = {s.op: s.pre_overhead for s in flat}
    pre_all = {s.op: s.pre_overhead + s.pre_stolen for s in flat}
    msgs = messages(ranks)
    pre_comm = {op: t + msgs.transfer.get(op, 0.0) for op, t in pre_all.items()}
    total, span = sum(work.values()), t1 - t0
    comm = sim.replay(schedule, p, m, v, stolen, latency=msgs.latency, before=pre_comm)
    spans = [sim.replay(schedule, p, m, v, work).makespan,
             _makespan(sim.replay(schedule, p, m, v, work, before=pre_over), [c for c, _ in tails]),
             _makespan(sim.replay(schedule, p, m, v, stolen, before=pre_all), [c + s for c, s in tails]),
             _comm_makespan(comm, ranks, msgs, [c + s for c, s in tails])]
    compute = [sum(s.work for s in rank) for rank in cut]
    overhead = [sum(s.overhead for s in rank) + c for rank, (c, _) in zip(cut, tails, strict=True)]
    contention = [sum(s.stolen for s in rank) + x for rank, (_, x) in zip(cut, tails, strict=True)]
    waited = [sum(w.t1 - w.t0 for w in r.waits) + r.send_t1 - r.send_t0 for r in ranks]
    return StepBreakdown(
        formula=formulas.pipeline_bubble(p, m, schedule, v)["bubble_fraction"],
        replay_work=_bubble(total, p, spans[0]), replay_overhead=_bubble(total, p, spans[1]),
        replay_stolen=_bubble(total, p, spans[2]), replay_comm=_bubble(total, p, spans[3]),
        measured=_bubble(total, p, span), latency=msgs.median, span=span, compute=compute, overhead=overhead,
        contention=contention, wait=waited,
        idle=[span - sum(x) for x in zip(compute, overhead, contention, waited, strict=True)])


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
