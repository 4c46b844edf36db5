"""Pipeline schedules, simulated: the exact order of forward and backward work on every stage.

Three schedules, for ``p`` ranks (pipeline stages), ``m`` microbatches and, for the interleaved
one, ``v`` model chunks per rank:

* ``gpipe`` (Huang et al., 2019): every rank runs all ``m`` forwards, then all ``m`` backwards.
* ``1f1b`` (PipeDream-flush, Narayanan et al., 2021): rank ``r`` runs ``min(m, p - r - 1)``
  warm-up forwards, then alternates one forward and one backward (the steady state), then drains
  the remaining backwards (the cool-down).
* ``interleaved`` (Megatron-LM, Narayanan et al., SC 2021): rank ``r`` holds the ``v`` chunks
  ``r, r + p, r + 2p, …`` of a model cut into ``p·v`` virtual stages. Forwards walk the chunks in
  groups of ``p`` microbatches (depth first); warm-up is ``(v - 1)·k + 2·(p - 1 - r)`` chunk
  forwards with ``k = m // max(1, m // p)`` microbatches per round — the same order as
  ``torch.distributed.pipelining.ScheduleInterleaved1F1B``, and as Megatron-LM's where its rule allows.
  What each engine accepts (torch: any m < p, or m in equal rounds; Megatron-LM: m a multiple of p)
  is :func:`~distai.lessons.lesson5.formulas.check_schedule`'s to say.

:func:`schedule_order` gives each rank's list of work; :func:`simulate` runs those lists against
the data dependencies (a forward of virtual stage ``s`` needs the forward of ``s - 1`` for the
same microbatch; a backward of ``s`` needs the backward of ``s + 1``, or the forward of ``s``
itself on the last stage) with a forward cost, a backward cost and an optional time per hop
between ranks, and returns the :class:`Timeline`: start and end of every block, the bubble,
and the activations each rank holds over time. :func:`comm_plan` turns an order into the
point-to-point messages the real pipeline (``distai.engine.pipeline``) posts, and
:func:`check_comm_plan` proves the plan can neither deadlock nor pair the wrong messages when
every batch of sends and receives blocks until its peers have posted theirs (NCCL semantics).

Pure Python: no numpy or torch needed, so the tutor and the widget can import it freely.
A 64-stage, 1024-microbatch 1F1B simulation takes a fraction of a second.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from .formulas import (
    SCHEDULES,
    ScheduleError,
    check_schedule,
    microbatches_per_round,
    normalize_schedule,
    warmup_forwards,
)

__all__ = ["SCHEDULES", "ScheduleError", "ScheduleDeadlock", "Op", "Timeline", "replay", "validate", "normalize_schedule",
           "microbatches_per_round", "warmup_forwards", "schedule_order", "simulate", "comm_plan",
           "check_comm_plan", "exchanges", "Message", "Action"]
FORWARD, BACKWARD = "F", "B"


class ScheduleDeadlock(RuntimeError):
    """An order in which some work waits forever on work that never runs."""


class Op(NamedTuple):
    """One block of work: forward or backward of microbatch ``mb`` through local chunk ``chunk``."""

    kind: str  # "F" or "B"
    mb: int
    chunk: int  # 0..v-1, local to the rank
    stage: int  # virtual stage = chunk * p + rank

    def __str__(self) -> str:  # "F3", "B0.1" (chunk shown only when v > 1 is in play)
        return f"{self.kind}{self.mb}" if self.chunk == 0 else f"{self.kind}{self.mb}.{self.chunk}"


# What a schedule accepts and how long each rank warms up is decided once, in the formulas.
validate = check_schedule


def schedule_order(schedule: str, p: int, m: int, v: int = 1, engine: str = "distai") -> list[list[Op]]:
    """Each rank's work, in the order it runs it (once ``engine``'s rule accepts the schedule:
    :func:`~distai.lessons.lesson5.formulas.check_schedule`)."""
    schedule = validate(schedule, p, m, v, engine)
    return [_rank_order(schedule, p, m, v, r) for r in range(p)]


_new = tuple.__new__  # builds an Op without NamedTuple's argument parsing: 131k ops fast


def _rank_order(schedule: str, p: int, m: int, v: int, r: int) -> list[Op]:
    if schedule == "gpipe":
        return ([_new(Op, ("F", i, 0, r)) for i in range(m)]
                + [_new(Op, ("B", i, 0, r)) for i in range(m)])
    if schedule == "1f1b":
        w = warmup_forwards(schedule, p, m, r)
        ops = [_new(Op, ("F", i, 0, r)) for i in range(w)]
        for i in range(m - w):
            ops.append(_new(Op, ("F", w + i, 0, r)))
            ops.append(_new(Op, ("B", i, 0, r)))
        ops += [_new(Op, ("B", i, 0, r)) for i in range(m - w, m)]
        return ops
    # interleaved: the k-th forward goes to chunk (k // per_round) % v, the k-th backward to the
    # chunk counted from the top; microbatches advance per chunk in order.
    per_round = microbatches_per_round(p, m)
    total = m * v
    warm = warmup_forwards(schedule, p, m, r, v)
    fwd, bwd = [], []
    next_f = [0] * v
    next_b = [0] * v
    for k in range(total):
        c = (k // per_round) % v
        fwd.append(_new(Op, ("F", next_f[c], c, c * p + r)))
        next_f[c] += 1
        c = v - 1 - c
        bwd.append(_new(Op, ("B", next_b[c], c, c * p + r)))
        next_b[c] += 1
    ops = fwd[:warm]
    for k in range(total - warm):
        ops.append(fwd[warm + k])
        ops.append(bwd[k])
    ops += bwd[total - warm:]
    return ops


@dataclass
class Timeline:
    """What :func:`simulate` returns. Times are in the units of ``t_f``/``t_b``."""

    schedule: str
    p: int
    m: int
    v: int
    t_f: float
    t_b: float
    t_comm: float
    order: list[list[Op]]
    start: list[list[float]]
    end: list[list[float]]
    makespan: float
    busy: list[float]
    p2p_messages: int
    inflight_peak_chunks: list[int] = field(default_factory=list)

    @property
    def ideal(self) -> float:
        """Time of the step with no bubble: m microbatches through one stage, forward and backward."""
        return self.m * (self.t_f + self.t_b)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over ranks: (p-1)/(m+p-1) for GPipe and 1F1B."""
        idle = sum(self.makespan - b for b in self.busy)
        return idle / (self.p * self.makespan) if self.makespan else 0.0

    @property
    def bubble_ratio(self) -> float:
        """Idle time over useful time: (p-1)/m for GPipe and 1F1B, (p-1)/(v·m) interleaved."""
        busy = sum(self.busy)
        return sum(self.makespan - b for b in self.busy) / busy if busy else 0.0

    def rank_bubble_fraction(self, rank: int) -> float:
        return 1.0 - self.busy[rank] / self.makespan if self.makespan else 0.0

    @property
    def peak_inflight(self) -> list[float]:
        """Per rank, the most microbatches whose activations it holds at once, counted in whole
        stages: a chunk holds 1/v of a rank's layers, so chunk-microbatches are divided by v."""
        return [c / self.v for c in self.inflight_peak_chunks]

    def inflight_series(self, rank: int) -> list[tuple[float, int]]:
        """Steps of the activation count on ``rank``: (time, chunk-microbatches held from then on).
        A forward takes its activations when it starts; a backward frees them when it ends."""
        changes: list[tuple[float, int]] = []
        for op, s, e in zip(self.order[rank], self.start[rank], self.end[rank]):
            changes.append((s, +1) if op.kind == FORWARD else (e, -1))
        changes.sort(key=lambda c: (c[0], c[1]))  # frees before takes at the same instant
        series, held = [(0.0, 0)], 0
        for t, d in changes:
            held += d
            if series and series[-1][0] == t:
                series[-1] = (t, held)
            else:
                series.append((t, held))
        return series

    def held_at(self, rank: int, t: float) -> int:
        held = 0
        for when, count in self.inflight_series(rank):
            if when > t:
                break
            held = count
        return held

    def blocks(self, rank: int):
        """(start, end, op) for each block of work on ``rank``, in order."""
        return list(zip(self.start[rank], self.end[rank], self.order[rank]))


def _stage_rank(stage: int, p: int) -> int:
    return stage % p


def simulate(schedule: str, p: int, m: int, v: int = 1, t_f: float = 1.0, t_b: float = 2.0,
             t_comm: float = 0.0, order: list[list[Op]] | None = None, engine: str = "distai",
             durations: Mapping[Op, float] | None = None,
             latency: Mapping[tuple[str, int, int], float] | None = None,
             before: Mapping[Op, float] | None = None) -> Timeline:
    """Run each rank's order against the dependencies; every block starts as soon as its rank is
    free and its input has arrived (``t_comm`` after the producer finished, when that producer sits on
    another rank). ``t_f`` and ``t_b`` are the forward and backward times of one microbatch through one
    whole stage (a rank's share of the model); each of the v chunks takes 1/v of that.
    ``durations`` (every op of the order → its time) replaces them block by block, and ``latency``
    (a message's ``(kind, mb, producer stage)`` → its time) ``t_comm`` message by message, and
    ``before`` (op → time) is what its rank does before it waits for the block's input (posting
    messages, its own overhead: time that overlaps the message in flight): a replay of a measured
    step (:func:`replay`).

    Raises :class:`ScheduleError` if ``engine`` (``distai``, ``torch`` or ``megatron``) does not accept the
    schedule, :class:`ScheduleDeadlock` if the order waits on work that never runs.
    """
    schedule = validate(schedule, p, m, v, engine)
    if min(t_f, t_b) <= 0 or t_comm < 0:
        raise ScheduleError("t_f and t_b must be > 0 and t_comm >= 0")
    if durations is not None and min(durations.values(), default=0.0) < 0:
        raise ScheduleError("durations must be >= 0")
    order = order if order is not None else schedule_order(schedule, p, m, v)
    n_stages = p * v
    cf, cb = t_f / v, t_b / v
    none = -1.0
    f_end = [none] * (n_stages * m)
    b_end = [none] * (n_stages * m)
    starts: list[list[float]] = [[] for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    ptr = [0] * p
    free = [0.0] * p
    size = n_stages * m
    waiting = [-1] * (2 * size)  # awaited op (F: idx, B: size + idx) -> the rank waiting on it
    last = n_stages - 1
    messages = 0
    stack = list(range(p - 1, -1, -1))
    # plain tuples are faster to walk than dataclass attributes in the hot loop
    while stack:
        r = stack.pop()
        ops = order[r]
        i, t, n = ptr[r], free[r], len(ops)
        st, en = starts[r], ends[r]
        while i < n:
            kind, mb, _, s = ops[i]
            if kind == "F":
                if s == 0:
                    ready = 0.0
                else:
                    key = (s - 1) * m + mb
                    ready = f_end[key]
                    if ready == none:
                        waiting[key] = r
                        break
                    if (s - 1) % p != r:
                        ready += t_comm if latency is None else latency.get(("F", mb, s - 1), t_comm)
                        messages += 1
                prep = t if before is None else t + before[ops[i]]
                begin = prep if prep > ready else ready
                t = begin + (cf if durations is None else durations[ops[i]])
                key = s * m + mb
                f_end[key] = t
                w = waiting[key]
                if w >= 0:
                    waiting[key] = -1
            else:
                if s == last:
                    ready = f_end[s * m + mb]
                    if ready == none:
                        raise ScheduleDeadlock(f"rank {r}: backward of microbatch {mb} on stage {s} "
                                               f"comes before its own forward")
                else:
                    key = (s + 1) * m + mb
                    ready = b_end[key]
                    if ready == none:
                        waiting[size + key] = r
                        break
                    if (s + 1) % p != r:
                        ready += t_comm if latency is None else latency.get(("B", mb, s + 1), t_comm)
                        messages += 1
                if f_end[s * m + mb] == none:
                    raise ScheduleDeadlock(f"rank {r}: backward of microbatch {mb} on stage {s} "
                                           f"comes before its own forward")
                prep = t if before is None else t + before[ops[i]]
                begin = prep if prep > ready else ready
                t = begin + (cb if durations is None else durations[ops[i]])
                key = s * m + mb
                b_end[key] = t
                w = waiting[size + key]
                if w >= 0:
                    waiting[size + key] = -1
            st.append(begin)
            en.append(t)
            i += 1
            if w >= 0:
                stack.append(w)
        ptr[r], free[r] = i, t
    stuck = [r for r in range(p) if ptr[r] < len(order[r])]
    if stuck:
        r = stuck[0]
        raise ScheduleDeadlock(f"{schedule} order deadlocks: rank {r} waits forever before "
                               f"{order[r][ptr[r]]} (stage {order[r][ptr[r]].stage})")
    busy = [sum(e) - sum(s) for s, e in zip(starts, ends)]
    makespan = max((e[-1] for e in ends if e), default=0.0)
    peaks = []
    for ops in order:
        held = peak = 0
        for op in ops:
            if op[0] == "F":
                held += 1
                if held > peak:
                    peak = held
            else:
                held -= 1
        peaks.append(peak)
    return Timeline(schedule, p, m, v, t_f, t_b, t_comm, order, starts, ends, makespan, busy,
                    messages, peaks)


def replay(schedule: str, p: int, m: int, v: int, durations: Mapping[Op, float], t_comm: float = 0.0,
           latency: Mapping[tuple[str, int, int], float] | None = None,
           before: Mapping[Op, float] | None = None) -> Timeline:
    """A measured step replayed: the schedule's order with each block's measured time
    (``durations``: every op → seconds) and ``t_comm`` per hop between ranks (or each message's
    own, ``latency``: ``(kind, mb, producer stage)`` → seconds; ``before``: each block's rank's own
    time before it waits for the block's input). Its bubble is the one this
    schedule has with these stage times (unequal stages, an embedding on the first, a head on the
    last, a slow forward) and that communication cost, nothing else."""
    order = schedule_order(schedule, p, m, v)
    missing = [op for ops in order for op in ops if op not in durations]
    if missing:
        raise ScheduleError(f"no measured time for {len(missing)} blocks (first: {missing[0]})")
    mean = sum(durations.values()) / len(durations) or 1.0
    return simulate(schedule, p, m, v, t_f=mean * v, t_b=mean * v, t_comm=t_comm, order=order,
                    durations=durations, latency=latency, before=before)


# --------------------------------------------------------------------------------------------
# Point-to-point plan: what the real pipeline sends and receives around each block of work.

@dataclass(frozen=True)
class Message:
    """One tensor between two ranks: the activation (``F``) or gradient (``B``) of ``mb`` leaving
    virtual stage ``from_stage``."""

    kind: str
    mb: int
    from_stage: int
    src: int
    dst: int


def _input_message(op: Op, p: int, n_stages: int) -> Message | None:
    if op.kind == FORWARD and op.stage > 0:
        src = _stage_rank(op.stage - 1, p)
        return Message(FORWARD, op.mb, op.stage - 1, src, _stage_rank(op.stage, p))
    if op.kind == BACKWARD and op.stage < n_stages - 1:
        src = _stage_rank(op.stage + 1, p)
        return Message(BACKWARD, op.mb, op.stage + 1, src, _stage_rank(op.stage, p))
    return None


def _output_message(op: Op, p: int, n_stages: int) -> Message | None:
    if op.kind == FORWARD and op.stage < n_stages - 1:
        return Message(FORWARD, op.mb, op.stage, _stage_rank(op.stage, p), _stage_rank(op.stage + 1, p))
    if op.kind == BACKWARD and op.stage > 0:
        return Message(BACKWARD, op.mb, op.stage, _stage_rank(op.stage, p), _stage_rank(op.stage - 1, p))
    return None


@dataclass(frozen=True)
class Action:
    """One entry of a rank's plan: post a receive, run a block of work, or post a send."""

    kind: str  # "recv", "compute" or "send"
    op: Op | None = None
    message: Message | None = None


# a rank's plan as check_comm_plan walks it: a block of work, or a batch of messages posted together
PlanStep = tuple[Literal["compute"], Op] | tuple[Literal["batch"], list[Message]]


def comm_plan(timeline: Timeline) -> list[list[Action]]:
    """Each rank's compute blocks interleaved with the sends and receives it posts.

    Every message gets one place in a global order: the simulated time its producer finishes
    (ties broken the same way on every rank). The sender posts it right after the producing
    block; the receiver posts the receive at that same place among its own blocks, so before the
    block that consumes it. Because every rank posts its messages in one global order, the two
    ends of each pair see the same sequence — which NCCL, without tags, needs — and the plan
    cannot deadlock even if every posted operation blocks its rank until matched (the earliest
    unmatched message always has both ends at the head of their queues; :func:`check_comm_plan`
    verifies it). A receive is waited on only right before the block that needs it.
    """
    p, v = timeline.p, timeline.v
    n_stages = p * v
    entries: list[list[tuple]] = [[] for _ in range(p)]
    for r in range(p):
        for op, s, e in zip(timeline.order[r], timeline.start[r], timeline.end[r]):
            entries[r].append((s, 1, (), Action("compute", op=op)))
            out = _output_message(op, p, n_stages) if p > 1 else None
            if out is not None:
                key = (e, 0, (out.src, out.dst, out.kind, out.from_stage, out.mb))
                entries[r].append(key + (Action("send", message=out),))
                entries[out.dst].append(key + (Action("recv", message=out),))
    # at equal times, sends and receives (0) go before blocks that start then (1)
    return [[entry[-1] for entry in sorted(rank_entries, key=lambda x: x[:3])] for rank_entries in entries]


def exchanges(plan_for_rank: list[Action]) -> list[list[Action]]:
    """Consecutive sends and receives of a rank's plan, posted together as one batch."""
    groups: list[list[Action]] = []
    current: list[Action] = []
    for action in plan_for_rank:
        if action.kind == "compute":
            if current:
                groups.append(current)
                current = []
        else:
            current.append(action)
    if current:
        groups.append(current)
    return groups


def check_comm_plan(plan: list[list[Action]]) -> None:
    """Prove a plan safe under the harshest semantics: each rank posts one batch of sends and
    receives at a time and blocks until every message in it is matched by a peer's currently
    posted batch; a block of work waits for the receive of its input; messages between a pair of
    ranks match in posting order (NCCL has no tags). Raises ScheduleDeadlock if a pair disagrees on
    order, if a block runs before its input was received, or if every rank ends up waiting."""
    p = len(plan)
    sends: dict[tuple[int, int], list[Message]] = {}
    recvs: dict[tuple[int, int], list[Message]] = {}
    for r, rank_plan in enumerate(plan):
        for a in rank_plan:
            if a.message is None:  # a block of work
                continue
            if a.kind == "send":
                sends.setdefault((r, a.message.dst), []).append(a.message)
            elif a.kind == "recv":
                recvs.setdefault((a.message.src, r), []).append(a.message)
    for pair in set(sends) | set(recvs):
        if sends.get(pair, []) != recvs.get(pair, []):
            src, dst = pair
            raise ScheduleDeadlock(f"rank {src} sends to rank {dst} in a different order than rank {dst} "
                                   f"receives: messages would be paired wrongly")
    # a rank's plan as alternating compute blocks and batches
    steps: list[list[PlanStep]] = []
    for r, rank_plan in enumerate(plan):
        seq: list[PlanStep] = []
        batch: list[Message] = []
        for a in rank_plan:
            if a.op is not None:
                if batch:
                    seq.append(("batch", batch))
                    batch = []
                seq.append(("compute", a.op))
            elif a.message is not None:
                batch.append(a.message)
        if batch:
            seq.append(("batch", batch))
        steps.append(seq)
    n_stages = max((a.op.stage for rank_plan in plan for a in rank_plan if a.op is not None), default=0) + 1
    pos = [0] * p
    matched: list[set[Message]] = [set() for _ in range(p)]  # messages of the current batch already matched
    received: list[set[Message]] = [set() for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(steps[r]):
                step = steps[r][pos[r]]
                if step[0] == "compute":
                    op = step[1]
                    need = _input_message(op, p, n_stages) if p > 1 else None
                    if need is not None and need not in received[r]:
                        raise ScheduleDeadlock(f"rank {r} runs {op} before receiving its input")
                    pos[r] += 1
                    progress = True
                    continue
                item = step[1]
                for msg in item:
                    if msg in matched[r]:
                        continue
                    q = msg.dst if msg.src == r else msg.src
                    if pos[q] < len(steps[q]) and steps[q][pos[q]][0] == "batch" and msg in steps[q][pos[q]][1]:
                        matched[r].add(msg)
                        matched[q].add(msg)
                if all(msg in matched[r] for msg in item):
                    received[r].update(msg for msg in item if msg.dst == r)
                    matched[r] = set()
                    pos[r] += 1
                    progress = True
                else:
                    break
    stuck = [r for r in range(p) if pos[r] < len(steps[r])]
    if stuck:
        raise ScheduleDeadlock("the point-to-point plan deadlocks: " + "; ".join(
            f"rank {r} waits at step {pos[r]}" for r in stuck))
