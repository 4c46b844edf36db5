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
* :class:`PrefixCachingAllocator` — a :class:`BlockAllocator` whose sequences **share the KV
  blocks of a common prompt prefix**: a radix tree over block-sized token runs (SGLang's
  RadixAttention, Zheng et al. 2024; vLLM's automatic prefix caching), reference counts,
  copy-on-write of a partly matched last block, and LRU eviction of unreferenced cached blocks.
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
        return self._blocks_to_add(seq, new_len)

    def _blocks_to_add(self, seq, new_len: int) -> int:
        """Blocks ``seq``'s table grows by to hold ``new_len`` tokens."""
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
        new = self._copy_on_write(seq, new_len)
        for _ in range(self._blocks_to_add(seq, new_len)):
            b = self._take(seq)
            table.append(b)
            new.append(b)
        self.lengths[seq] = max(self.lengths.get(seq, 0), int(new_len))
        return new

    def _take(self, seq) -> int:
        """A free block, now ``seq``'s."""
        b = self.free_list.popleft()
        self.owner[b] = seq
        self.log.append(("alloc", seq, b))
        return b

    def _copy_on_write(self, seq, new_len: int) -> list[int]:
        """The blocks that replace shared ones before ``seq`` writes into them: none without sharing."""
        return []

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

    # -- prefix sharing hooks: nothing is shared here ------------------------------------------------
    def admit(self, seq, tokens) -> int:
        """Attach the cached blocks of ``tokens``' longest cached prefix to ``seq``; returns how many
        tokens were found (their K/V need not be computed). Without prefix sharing: 0."""
        return 0

    def computed(self, seq, tokens) -> None:
        """``tokens`` (all of ``seq``'s tokens whose K/V are now in its blocks) were computed."""

    def refcount(self, block: int) -> int:
        return 0 if self.owner[block] is None else 1

    def cached_blocks(self) -> list[int]:
        """Blocks no sequence references that keep K/V for later reuse (none without sharing)."""
        return []


class ContiguousAllocator(BlockAllocator):
    """One contiguous region of ``max_len`` tokens per admitted request (the pre-paging baseline).

    The pool holds ``slots`` such regions: a block allocator whose one block per request is a whole
    slot, and a request may never outgrow it."""

    kind = "contiguous"

    def __init__(self, slots: int, max_len: int):
        if slots < 1 or max_len < 1:
            raise ValueError("need at least one slot of at least one token")
        super().__init__(slots, max_len)
        self.slots = self.num_blocks
        self.max_len = self.block_size

    def _blocks_to_add(self, seq, new_len: int) -> int:
        if new_len > self.max_len:
            raise OutOfBlocks(f"{seq!r} needs {new_len} tokens, more than a slot's {self.max_len}")
        return super()._blocks_to_add(seq, new_len)

    def can_grow(self, seq, new_len: int) -> bool:
        return new_len <= self.max_len and super().can_grow(seq, new_len)


# ---------------------------------------------------------------------------------------------
# prefix sharing: a radix tree of KV blocks
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False)
class CachedBlock:
    """A node of the prefix tree: physical ``block`` holds the K/V of ``tokens`` (a full block's
    ``block_size`` tokens; fewer for the partial last block a finished sequence left behind, always
    a leaf), following the token path of its ``parent`` (None: the first block of a prompt). Its
    K/V depend on every token of that path, so the path — not the block's own tokens — is the key."""

    block: int
    tokens: tuple
    parent: CachedBlock | None
    depth: int
    children: dict = field(default_factory=dict)  # tokens -> CachedBlock
    last_use: int = 0


class PrefixCachingAllocator(BlockAllocator):
    """Paged KV blocks shared between sequences with a common prefix.

    * **Radix tree.** Every full block a sequence computed is a node keyed by its ``block_size``
      tokens under the node of the block before it, so a path from the root spells a token prefix
      block by block. A sequence admitted with tokens ``t`` walks the tree (:meth:`admit`) and
      references the nodes of its longest cached prefix instead of recomputing them; two sequences
      that computed the same block side by side keep one (:meth:`computed` deduplicates).
    * **Reference counts.** ``refs[b]`` = the number of block tables holding ``b``. A block with
      ``refs > 1``, or in the tree, is never written: it is immutable.
    * **Copy-on-write.** When the first token a sequence writes lands in an immutable block — its
      prefix matched only part of a block (the partial last block of a finished sequence, or the first
      tokens of a full one) — :meth:`grow` gives it a private copy: a new block, the matched tokens'
      K/V copied (recorded in ``copies`` for the engine), the shared one released.
    * **Eviction.** A tree block whose count falls to 0 stays cached (its K/V can still be reused)
      and counts as free; when the free list is empty the least recently used unreferenced block is
      evicted (a leaf: an unreferenced block's children are unreferenced and used no later, and ties
      go to the deeper block). Since a sequence's table is a tree path, ``refs`` of a child never
      exceed its parent's.

    At most ``len(t) − 1`` tokens are taken from the cache: the last one is always computed, since
    its logits give the next token. Sequences whose tokens are unknown (``None``) share nothing.
    """

    kind = "prefix"

    def __init__(self, num_blocks: int, block_size: int = 16):
        super().__init__(num_blocks, block_size)
        self.refs = [0] * self.num_blocks
        self.roots: dict[tuple, CachedBlock] = {}
        self.nodes: dict[int, CachedBlock] = {}  # block -> its tree node
        self.evictable: set[int] = set()  # tree blocks with refs == 0
        self.token_ids: dict[object, list] = {}
        self.copies: list[tuple[int, int, int]] = []  # (source, destination, tokens) to copy, for the engine
        self.clock = 0
        self.reused_tokens = 0  # tokens taken from the cache at admissions, in all
        self.looked_up_tokens = 0

    # -- queries ---------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Free-list blocks and unreferenced cached ones (evicted when needed)."""
        return len(self.free_list) + len(self.evictable)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def refcount(self, block: int) -> int:
        return self.refs[block]

    def cached_blocks(self) -> list[int]:
        return sorted(self.evictable)

    def immutable(self, block: int) -> bool:
        return self.refs[block] > 1 or block in self.nodes

    def fill(self, block: int) -> int:
        node = self.nodes.get(block)
        if node is not None:
            return len(node.tokens)
        return super().fill(block)

    def tokens_stored(self) -> int:
        """Tokens in referenced blocks, each physical block counted once (shared ones too)."""
        return sum(self.fill(b) for b in range(self.num_blocks) if self.refs[b])

    def logical_tokens(self) -> int:
        """Tokens the live sequences hold, a shared block counted once per sequence."""
        return sum(self.lengths.values())

    def needed(self, seq, new_len: int) -> int:
        return self._blocks_to_add(seq, new_len) + (1 if self._cow_block(seq, new_len) is not None else 0)

    def _cow_block(self, seq, new_len: int):
        """The index in ``seq``'s table of an immutable block its next write lands in, or None."""
        old = self.lengths.get(seq, 0)
        table = self.tables.get(seq, ())
        if new_len <= old or old % self.block_size == 0 or old // self.block_size >= len(table):
            return None
        i = old // self.block_size
        return i if self.immutable(table[i]) else None

    def lookup(self, tokens) -> tuple[list[CachedBlock], CachedBlock | None, int]:
        """The longest cached prefix of ``tokens[:-1]``: the full nodes matched, then the node sharing
        the most further tokens (None if none) and how many."""
        bs, limit = self.block_size, len(tokens) - 1
        path: list[CachedBlock] = []
        children = self.roots
        i = 0
        while i + bs <= limit:
            node = children.get(tuple(tokens[i:i + bs]))
            if node is None:
                break
            path.append(node)
            children = node.children
            i += bs
        best, k = None, 0
        rest = tokens[i:limit]
        for key, node in children.items():
            n = 0
            while n < min(len(key), len(rest)) and key[n] == rest[n]:
                n += 1
            if n > k:
                best, k = node, n
        return path, best, k

    # -- changes ---------------------------------------------------------------------------------
    def admit(self, seq, tokens) -> int:
        if tokens is None or self.tables.get(seq):
            return 0
        self.token_ids[seq] = list(tokens)
        path, partial, k = self.lookup(tokens)
        self.clock += 1
        table = self.tables.setdefault(seq, [])
        for node in path + ([partial] if partial is not None else []):
            node.last_use = self.clock
            self._ref(node.block, seq)
            table.append(node.block)
            self.log.append(("share", seq, node.block))
        found = len(path) * self.block_size + k
        self.lengths[seq] = found
        self.reused_tokens += found
        self.looked_up_tokens += len(tokens)
        return found

    def _copy_on_write(self, seq, new_len: int) -> list[int]:
        """Never write into a block someone else may read: the partly filled last block, when shared
        or cached, is copied into a fresh one first."""
        i = self._cow_block(seq, new_len)
        if i is None:
            return []
        table = self.tables[seq]
        src = table[i]
        dst = self._take(seq)
        self.copies.append((src, dst, self.lengths[seq] % self.block_size))
        table[i] = dst
        self.log.append(("cow", seq, dst))
        self._unref(src, seq)
        return [dst]

    def computed(self, seq, tokens) -> None:
        """Register ``seq``'s newly full blocks in the tree (in order); a block whose path is already
        cached is replaced by the cached one and returned to the pool (deduplication)."""
        if tokens is None or seq not in self.tables:
            return
        self.token_ids[seq] = list(tokens)
        table, bs = self.tables[seq], self.block_size
        parent = None
        for i in range(min(len(tokens) // bs, len(table))):
            b = table[i]
            node = self.nodes.get(b)
            if node is not None and len(node.tokens) == bs:
                parent = node
                continue
            key = tuple(tokens[i * bs:(i + 1) * bs])
            siblings = parent.children if parent is not None else self.roots
            twin = siblings.get(key)
            if twin is not None:  # computed twice side by side: keep the cached one
                table[i] = twin.block
                self._ref(twin.block, seq)
                twin.last_use = self.clock
                self._unref(b, seq)
                self.log.append(("share", seq, twin.block))
                parent = twin
            else:
                parent = self._insert(b, key, parent)

    def free(self, seq) -> list[int]:
        """``seq`` ends (or is preempted): its partial last block joins the tree as a leaf (when its
        path is cached), then every block loses one reference; unreferenced tree blocks stay cached."""
        table = self.tables.pop(seq, [])
        length = self.lengths.pop(seq, 0)
        tokens = self.token_ids.pop(seq, None)
        bs = self.block_size
        self.clock += 1
        if tokens is not None and table and length % bs and len(tokens) >= length:
            i = length // bs
            parent = self.nodes.get(table[i - 1]) if i else None
            key = tuple(tokens[i * bs:length])
            siblings = parent.children if parent is not None else self.roots
            if (i == 0 or parent is not None) and table[i] not in self.nodes and key not in siblings:
                self._insert(table[i], key, parent)
        for b in table:
            if b in self.nodes:
                self.nodes[b].last_use = self.clock
            self._unref(b, seq)
        return table

    def take_copies(self) -> list[tuple[int, int, int]]:
        out, self.copies = self.copies, []
        return out

    # -- internals -------------------------------------------------------------------------------
    def _insert(self, block: int, key: tuple, parent: CachedBlock | None) -> CachedBlock:
        node = CachedBlock(block, key, parent, 0 if parent is None else parent.depth + 1, last_use=self.clock)
        (parent.children if parent is not None else self.roots)[key] = node
        self.nodes[block] = node
        return node

    def _ref(self, block: int, seq) -> None:
        self.refs[block] += 1
        self.evictable.discard(block)
        if self.owner[block] is None:
            self.owner[block] = seq

    def _unref(self, block: int, seq) -> None:
        self.refs[block] -= 1
        if self.refs[block] < 0:
            raise AssertionError(f"block {block} released more often than referenced")
        if self.refs[block] == 0:
            self.owner[block] = None
            if block in self.nodes:
                self.evictable.add(block)
                self.log.append(("cache", seq, block))
            else:
                self.free_list.append(block)
                self.log.append(("free", seq, block))
        elif self.owner[block] == seq:
            self.owner[block] = next(q for q, t in self.tables.items() if block in t)

    def eviction_order(self) -> list[int]:
        """Unreferenced cached blocks, the next to evict first: least recently used, deeper first."""
        return sorted(self.evictable, key=lambda b: (self.nodes[b].last_use, -self.nodes[b].depth, b))

    def _take(self, seq) -> int:
        """A block for ``seq``: from the free list, else by evicting the LRU unreferenced cached block."""
        if self.free_list:
            b = self.free_list.popleft()
        else:
            b = self.eviction_order()[0]
            node = self.nodes.pop(b)
            if node.children:
                raise AssertionError(f"evicting block {b}, which has cached children")
            siblings = node.parent.children if node.parent is not None else self.roots
            del siblings[node.tokens]
            self.evictable.discard(b)
            self.log.append(("evict", None, b))
        self.refs[b] = 1
        self.owner[b] = seq
        self.log.append(("alloc", seq, b))
        return b


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
    reused: int = 0  # of those, found in the prefix cache at the last admission (not computed)
    output: list = field(default_factory=list)  # output token ids (placeholders in a pure simulation)

    @property
    def rid(self) -> int:
        return self.req.rid

    def token_ids(self) -> list | None:
        """Prompt and output token ids (None when the request has no prompt ids)."""
        return None if self.req.prompt is None else list(self.req.prompt) + self.output

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
                s.reused = self.alloc.admit(s.rid, s.token_ids())  # a cached prefix is not recomputed
                if not self.alloc.can_grow(s.rid, s.context_len):
                    self.alloc.free(s.rid)  # let go of the cached blocks admit attached
                    s.reused = 0
                    break
                self.waiting.popleft()
                self.alloc.grow(s.rid, s.context_len)
                s.admitted_at = k if s.admitted_at is None else s.admitted_at
                self.running.append(s)
                plan.prefill.append(s)
        return plan

    def commit(self, plan: Plan, new_tokens: dict | None = None) -> list[SeqState]:
        """Record that ``plan`` ran (one token more for every sequence in it: ``new_tokens[rid]``, or a
        placeholder ``-(rid + 1)`` that matches no prompt in a pure simulation); the allocator learns
        which tokens are now cached; finished sequences leave and free their memory. Returns them."""
        for s in plan.prefill:
            s.cached = s.context_len
            if s.first_token_at is None:
                s.first_token_at = plan.step
        for s in plan.decode:
            s.cached += 1
        for s in plan.prefill + plan.decode:
            s.generated += 1
            s.output.append(new_tokens[s.rid] if new_tokens is not None else -(s.rid + 1))
            ids = s.token_ids()
            if ids is not None:
                self.alloc.computed(s.rid, ids[: s.cached])
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
    # prefix sharing (a PrefixCachingAllocator; trivial otherwise)
    refs: list[int] = field(default_factory=list)  # per block: block tables holding it
    cached: list[int] = field(default_factory=list)  # unreferenced blocks kept for reuse (evictable)
    shared: list[int] = field(default_factory=list)  # blocks a sequence started sharing this iteration
    cow: list[int] = field(default_factory=list)  # private copies made this iteration (copy-on-write)
    evicted: list[int] = field(default_factory=list)
    reused_tokens: int = 0  # prompt tokens admissions found cached this iteration

    @property
    def logical_blocks(self) -> int:
        """Blocks the running sequences would hold without sharing: Σ refs."""
        return sum(self.refs)

    @property
    def physical_blocks(self) -> int:
        return sum(1 for r in self.refs if r)

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
                    reserved_tokens=a.reserved_tokens(), refs=[a.refcount(b) for b in range(a.num_blocks)],
                    cached=a.cached_blocks(), shared=[b for op, _s, b in log if op == "share"],
                    cow=[b for op, _s, b in log if op == "cow"], evicted=[b for op, _s, b in log if op == "evict"],
                    reused_tokens=sum(s.reused for s in plan.prefill))


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


def prefix_sharing_blocks(sequences: int, prefix_tokens: int, seq_tokens: int, block_size: int = 16) -> dict:
    """KV blocks of ``sequences`` sequences of ``seq_tokens`` tokens whose first ``prefix_tokens`` are
    the same, without and with prefix sharing: {"unshared", "shared", "saved_fraction"}.

    Unshared, each holds ⌈T/b⌉ blocks. Shared, the ⌊P/b⌋ blocks filled by the prefix alone are held
    once (the radix tree's shared path) and each sequence keeps the rest, ⌈T/b⌉ − ⌊P/b⌋ (a block mixing
    prefix and own tokens is its own: copied on write)."""
    if sequences < 1 or seq_tokens < 1 or not 0 <= prefix_tokens <= seq_tokens:
        raise ValueError("need ≥ 1 sequence of ≥ 1 token and 0 ≤ prefix ≤ sequence length")
    per_seq = blocks_for(seq_tokens, block_size)
    common = prefix_tokens // block_size
    unshared = sequences * per_seq
    shared = common + sequences * (per_seq - common)
    return {"unshared": unshared, "shared": shared, "saved_fraction": 1 - shared / unshared}


def sequences_that_fit(blocks: int, prefix_tokens: int, seq_tokens: int, block_size: int = 16,
                       shared: bool = True) -> int:
    """How many such sequences ``blocks`` blocks hold, with or without prefix sharing."""
    per_seq = blocks_for(seq_tokens, block_size)
    common = prefix_tokens // block_size if shared else 0
    if per_seq == common:
        raise ValueError("a sequence with no tokens of its own needs no block of its own")
    return max(0, (blocks - common) // (per_seq - common))


def poisson_requests(n: int, rate_per_step: float, prompt_range=(8, 48), output_range=(4, 64),
                     seed: int = 0, vocab: int | None = None, system_prompt: int = 0) -> list[Request]:
    """A synthetic mix: Poisson arrivals (exponential gaps, ``rate_per_step`` per iteration),
    prompt and output lengths uniform in the ranges; with ``vocab`` also random prompt token ids.
    ``system_prompt`` > 0 (needs ``vocab``): every prompt starts with the same that many tokens (a
    shared system prompt), followed by its own ``prompt_range`` tokens."""
    import random

    if system_prompt and not vocab:
        raise ValueError("a shared system prompt needs token ids (vocab)")
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_prompt)] if system_prompt and vocab else []
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate_per_step) if rate_per_step > 0 else 0.0
        p = rng.randint(*prompt_range)
        o = rng.randint(*output_range)
        prompt = system + [rng.randrange(vocab) for _ in range(p)] if vocab else None
        out.append(Request(i, p + len(system), o, int(t), prompt))
    return out
