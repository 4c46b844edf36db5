"""KV-cache block allocation and continuous batching, as a pure model.

The same bookkeeping drives the real torch paged cache (``distai.engine.paged_kv``) and the
lesson's visualizer, so what the widget draws is what the engine does.

* :class:`BlockAllocator` — PagedAttention's allocator (Kwon et al., SOSP 2023, Sec. 4.2): the KV
  cache is cut into ``num_blocks`` blocks of ``block_size`` tokens; each sequence has a **block
  table** (its logical blocks → physical block ids); a block is taken from the free list when a
  sequence's last block is full and returned when the sequence ends. Freed blocks go to the back of
  the free list (FIFO), so reuse shows up a little later, as in a real pool. Only a sequence's last
  block can be partly empty.
* :class:`ContiguousAllocator` — the pre-PagedAttention baseline: every admitted request reserves
  one contiguous region of ``max_len`` tokens (a "slot"), whatever it will really use.
* :class:`Scheduler` — iteration-level scheduling with continuous batching (Orca, Yu et al., OSDI
  2022; vLLM): every iteration the running sequences decode one token each, finished ones leave and
  free their memory, and waiting requests join as soon as a batch place and their prompt's memory
  are free. When a running sequence cannot get a block for its next token, the most recently
  admitted sequence is **preempted** (its blocks freed; it is re-queued first and its prompt plus
  the tokens it already produced are recomputed later — vLLM's recompute preemption).
* :func:`simulate` — runs the scheduler on a request mix with fixed output lengths and returns one
  :class:`Snapshot` per iteration (block owners and fill, allocated/freed blocks, waste).

KV accounting: a prefill of ``P`` prompt tokens stores ``P`` tokens and produces the first output
token; each decode iteration stores the previous token's K/V and produces the next one. A request
with ``n`` output tokens therefore holds ``P + n − 1`` tokens when it finishes.

Pure Python (no numpy, no torch).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class OutOfBlocks(RuntimeError):
    """The pool has no free block (or slot) for what was asked."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` tokens: ⌈tokens / block_size⌉."""
    if block_size < 1:
        raise ValueError("block size must be ≥ 1")
    return -(-max(0, int(tokens)) // block_size)


class BlockAllocator:
    """Fixed-size blocks, a free list, and one block table per sequence."""

    kind = "paged"

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1:
            raise ValueError("the pool needs at least one block")
        if block_size < 1:
            raise ValueError("block size must be ≥ 1")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.free_list: deque[int] = deque(range(self.num_blocks))
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}
        self.owner: list[object | None] = [None] * self.num_blocks
        self.log: list[tuple[str, object, int]] = []  # ("alloc"|"free", seq, block) since last drain

    # -- queries ---------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return len(self.free_list)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free_list)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def needed(self, seq, new_len: int) -> int:
        """Extra blocks ``seq`` needs to hold ``new_len`` tokens."""
        have = len(self.tables.get(seq, ()))
        return max(0, blocks_for(new_len, self.block_size) - have)

    def can_grow(self, seq, new_len: int) -> bool:
        return self.needed(seq, new_len) <= self.free_blocks

    def slot(self, seq, pos: int) -> tuple[int, int]:
        """(physical block, offset) where token ``pos`` of ``seq`` lives."""
        table = self.tables[seq]
        return table[pos // self.block_size], pos % self.block_size

    def block_table(self, seq) -> list[int]:
        return list(self.tables.get(seq, ()))

    def tokens_stored(self) -> int:
        return sum(self.lengths.values())

    def reserved_tokens(self) -> int:
        """Token places held by live sequences (allocated blocks × block size)."""
        return self.used_blocks * self.block_size

    def fill(self, block: int) -> int:
        """Tokens stored in physical ``block`` (0 if free)."""
        seq = self.owner[block]
        if seq is None:
            return 0
        table = self.tables[seq]
        i = table.index(block)
        return min(self.block_size, self.lengths[seq] - i * self.block_size) if i < len(table) else 0

    # -- changes ---------------------------------------------------------------------------------
    def grow(self, seq, new_len: int) -> list[int]:
        """Make room for ``new_len`` tokens of ``seq`` (allocating blocks); returns the new block ids."""
        n = self.needed(seq, new_len)
        if n > self.free_blocks:
            raise OutOfBlocks(f"{seq!r} needs {n} blocks, {self.free_blocks} free")
        table = self.tables.setdefault(seq, [])
        new = []
        for _ in range(n):
            b = self.free_list.popleft()
            self.owner[b] = seq
            table.append(b)
            new.append(b)
            self.log.append(("alloc", seq, b))
        self.lengths[seq] = max(self.lengths.get(seq, 0), int(new_len))
        return new

    def free(self, seq) -> list[int]:
        """Return all of ``seq``'s blocks to the pool; returns their ids."""
        table = self.tables.pop(seq, [])
        self.lengths.pop(seq, None)
        for b in table:
            self.owner[b] = None
            self.free_list.append(b)
            self.log.append(("free", seq, b))
        return table

    def drain_log(self) -> list[tuple[str, object, int]]:
        out, self.log = self.log, []
        return out


class ContiguousAllocator:
    """One contiguous region of ``max_len`` tokens per admitted request (the pre-paging baseline).

    The pool holds ``slots`` such regions. The same interface as :class:`BlockAllocator`, with a
    "block" being a whole slot."""

    kind = "contiguous"

    def __init__(self, slots: int, max_len: int):
        if slots < 1 or max_len < 1:
            raise ValueError("need at least one slot of at least one token")
        self.slots = int(slots)
        self.max_len = int(max_len)
        self.block_size = self.max_len
        self.num_blocks = self.slots
        self.free_list: deque[int] = deque(range(self.slots))
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}
        self.owner: list[object | None] = [None] * self.slots
        self.log: list[tuple[str, object, int]] = []

    free_blocks = BlockAllocator.free_blocks
    used_blocks = BlockAllocator.used_blocks
    capacity_tokens = BlockAllocator.capacity_tokens
    tokens_stored = BlockAllocator.tokens_stored
    reserved_tokens = BlockAllocator.reserved_tokens
    block_table = BlockAllocator.block_table
    fill = BlockAllocator.fill
    free = BlockAllocator.free
    drain_log = BlockAllocator.drain_log

    def needed(self, seq, new_len: int) -> int:
        if new_len > self.max_len:
            raise OutOfBlocks(f"{seq!r} needs {new_len} tokens, more than a slot's {self.max_len}")
        return 0 if seq in self.tables else 1

    def can_grow(self, seq, new_len: int) -> bool:
        return new_len <= self.max_len and self.needed(seq, new_len) <= self.free_blocks

    def slot(self, seq, pos: int) -> tuple[int, int]:
        return self.tables[seq][0], pos

    def grow(self, seq, new_len: int) -> list[int]:
        n = self.needed(seq, new_len)
        if n > self.free_blocks:
            raise OutOfBlocks(f"{seq!r} needs a slot, none free")
        new = []
        if n:
            s = self.free_list.popleft()
            self.owner[s] = seq
            self.tables[seq] = [s]
            new.append(s)
            self.log.append(("alloc", seq, s))
        self.lengths[seq] = max(self.lengths.get(seq, 0), int(new_len))
        return new


# ---------------------------------------------------------------------------------------------
# continuous batching
# ---------------------------------------------------------------------------------------------

@dataclass
class Request:
    """One generation request: ``prompt_len`` prompt tokens, exactly ``output_len`` output tokens,
    arriving at iteration ``arrival`` (continuous batching) — ``prompt`` holds token ids when a real
    model runs it."""

    rid: int
    prompt_len: int
    output_len: int
    arrival: int = 0
    prompt: list[int] | None = None

    def __post_init__(self):
        if self.prompt is not None:
            self.prompt_len = len(self.prompt)
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError("a request needs at least one prompt token and one output token")


@dataclass
class SeqState:
    req: Request
    generated: int = 0  # output tokens produced so far
    admitted_at: int | None = None
    first_token_at: int | None = None
    finished_at: int | None = None
    preemptions: int = 0
    cached: int = 0  # tokens whose K/V are in the cache now

    @property
    def rid(self) -> int:
        return self.req.rid

    @property
    def context_len(self) -> int:
        """Prompt plus generated tokens: the prefill length on (re-)admission."""
        return self.req.prompt_len + self.generated


@dataclass
class Plan:
    """What one iteration runs: ``prefill`` sequences enter (prompt — plus already generated tokens
    after a preemption — into the cache, one new token each), ``decode`` sequences store their last
    token and produce one more; ``preempted`` lost their blocks this iteration."""

    step: int
    prefill: list[SeqState] = field(default_factory=list)
    decode: list[SeqState] = field(default_factory=list)
    preempted: list[SeqState] = field(default_factory=list)


class Scheduler:
    """Iteration-level scheduler over an allocator (paged or contiguous)."""

    def __init__(self, allocator, max_batch: int = 16):
        if max_batch < 1:
            raise ValueError("max batch must be ≥ 1")
        self.alloc = allocator
        self.max_batch = int(max_batch)
        self.pending: deque[SeqState] = deque()  # not yet arrived, in arrival order
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []  # in admission order
        self.finished: list[SeqState] = []
        self.step = 0

    def add(self, requests) -> None:
        for r in sorted(requests, key=lambda r: (r.arrival, r.rid)):
            cap = getattr(self.alloc, "max_len", None)
            if cap is not None and r.prompt_len + r.output_len - 1 > cap:
                raise ValueError(f"request {r.rid} needs {r.prompt_len + r.output_len - 1} tokens, "
                                 f"more than max_len {cap}")
            if blocks_for(r.prompt_len + r.output_len - 1, self.alloc.block_size) > self.alloc.num_blocks:
                raise ValueError(f"request {r.rid} alone needs more blocks than the pool holds")
            self.pending.append(SeqState(r))

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.running)

    def plan(self) -> Plan:
        """Decide this iteration: grow running sequences by one token (preempting if the pool is
        full), then admit waiting ones while a batch place and their prompt's blocks are free."""
        k = self.step
        while self.pending and self.pending[0].req.arrival <= k:
            self.waiting.append(self.pending.popleft())
        plan = Plan(step=k)
        # 1. every running sequence stores one more token this iteration
        i = 0
        while i < len(self.running):
            s = self.running[i]
            need = s.cached + 1
            while not self.alloc.can_grow(s.rid, need):
                victim = self.running.pop()  # newest admitted
                self.alloc.free(victim.rid)
                victim.cached = 0
                victim.preemptions += 1
                plan.preempted.append(victim)
                self.waiting.appendleft(victim)
                if victim is s:
                    break
            else:
                self.alloc.grow(s.rid, need)
                plan.decode.append(s)
                i += 1
                continue
            # s itself was preempted: the list shrank, do not advance
        # 2. admissions (none in an iteration that had to preempt)
        if not plan.preempted:
            while self.waiting and len(self.running) < self.max_batch:
                s = self.waiting[0]
                if not self.alloc.can_grow(s.rid, s.context_len):
                    break
                self.waiting.popleft()
                self.alloc.grow(s.rid, s.context_len)
                s.admitted_at = k if s.admitted_at is None else s.admitted_at
                self.running.append(s)
                plan.prefill.append(s)
        return plan

    def commit(self, plan: Plan) -> list[SeqState]:
        """Record that ``plan`` ran (one token more for every sequence in it); finished sequences
        leave and free their memory. Returns them."""
        for s in plan.prefill:
            s.cached = s.context_len
            s.generated += 1
            if s.first_token_at is None:
                s.first_token_at = plan.step
        for s in plan.decode:
            s.cached += 1
            s.generated += 1
        done = [s for s in self.running if s.generated >= s.req.output_len]
        for s in done:
            s.finished_at = plan.step
            self.running.remove(s)
            self.alloc.free(s.rid)
            self.finished.append(s)
        self.step += 1
        return done


@dataclass
class Snapshot:
    """The pool after one iteration."""

    step: int
    owners: list  # per block (or slot): request id or None
    fills: list[int]  # tokens stored per block
    allocated: list[int]  # block ids taken this iteration
    freed: list[int]  # block ids returned this iteration
    running: list[int]
    waiting: list[int]
    admitted: list[int]
    finished: list[int]
    preempted: list[int]
    tokens_stored: int
    reserved_tokens: int

    @property
    def waste_fraction(self) -> float:
        """Reserved but unused share of the reserved KV memory (0 when nothing is reserved)."""
        return 1 - self.tokens_stored / self.reserved_tokens if self.reserved_tokens else 0.0


def snapshot(sched: Scheduler, plan: Plan, finished: list[SeqState]) -> Snapshot:
    a = sched.alloc
    log = a.drain_log()
    return Snapshot(step=plan.step, owners=list(a.owner), fills=[a.fill(b) for b in range(a.num_blocks)],
                    allocated=[b for op, _s, b in log if op == "alloc"],
                    freed=[b for op, _s, b in log if op == "free"],
                    running=[s.rid for s in sched.running], waiting=[s.rid for s in sched.waiting],
                    admitted=[s.rid for s in plan.prefill], finished=[s.rid for s in finished],
                    preempted=[s.rid for s in plan.preempted], tokens_stored=a.tokens_stored(),
                    reserved_tokens=a.reserved_tokens())


def simulate(requests, allocator, max_batch: int = 16, max_steps: int = 100_000) -> list[Snapshot]:
    """Run continuous batching on ``requests`` (fixed output lengths) until all finish; one snapshot
    per iteration. An idle iteration (nothing arrived yet) is recorded too."""
    sched = Scheduler(allocator, max_batch)
    sched.add(requests)
    snaps = []
    while not sched.done:
        if sched.step >= max_steps:
            raise RuntimeError("simulation did not finish (pool too small for the batch?)")
        plan = sched.plan()
        fin = sched.commit(plan)
        snaps.append(snapshot(sched, plan, fin))
    return snaps


def waste_summary(snaps: list[Snapshot]) -> dict:
    """Over the iterations where anything was reserved: mean waste (reserved − stored)/reserved
    weighted by reserved tokens, peak reserved and stored tokens, iterations."""
    busy = [s for s in snaps if s.reserved_tokens]
    reserved = sum(s.reserved_tokens for s in busy)
    stored = sum(s.tokens_stored for s in busy)
    return {
        "waste_fraction": 1 - stored / reserved if reserved else 0.0,
        "peak_reserved_tokens": max((s.reserved_tokens for s in snaps), default=0),
        "peak_stored_tokens": max((s.tokens_stored for s in snaps), default=0),
        "iterations": len(snaps),
        "mean_batch": (sum(len(s.running) + len(s.finished) for s in busy) / len(busy)) if busy else 0.0,
    }


def poisson_requests(n: int, rate_per_step: float, prompt_range=(8, 48), output_range=(4, 64),
                     seed: int = 0, vocab: int | None = None) -> list[Request]:
    """A synthetic mix: Poisson arrivals (exponential gaps, ``rate_per_step`` per iteration),
    prompt and output lengths uniform in the ranges; with ``vocab`` also random prompt token ids."""
    import random

    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate_per_step) if rate_per_step > 0 else 0.0
        p = rng.randint(*prompt_range)
        o = rng.randint(*output_range)
        prompt = [rng.randrange(vocab) for _ in range(p)] if vocab else None
        out.append(Request(i, p, o, int(t), prompt))
    return out
