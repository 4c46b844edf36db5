"""Lesson 7 prefix sharing, pure model: the radix tree of KV blocks (PrefixCachingAllocator).

Cases by hand, then property tests: random admissions (prompts built from a few shared prefixes),
decode steps and exits against a shadow that stores what each physical block holds, as the engine's
K/V tensors would. After every operation: refcounts equal the live references, no block is free while
referenced, every sequence reads its own tokens back through its block table, a write never lands in
a block another sequence or the tree can read (copy-on-write), and every eviction takes an
unreferenced block, least recently released first."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distai.lessons.lesson7 import paging


def _admit(a, seq, tokens):
    """The scheduler's admission: attach the cached prefix, then make room for the rest."""
    found = a.admit(seq, tokens)
    if not a.can_grow(seq, len(tokens)):
        a.free(seq)
        return None
    a.grow(seq, len(tokens))
    a.computed(seq, tokens)
    return found


def test_shared_system_prompt_by_hand():
    a = paging.PrefixCachingAllocator(8, block_size=4)
    sys_prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # 2 full blocks + 2 tokens
    assert _admit(a, "x", sys_prompt + [20, 21]) == 0
    assert a.block_table("x") == [0, 1, 2]
    # y shares x's two full blocks; the third starts with the same 2 tokens: copied, not shared
    assert _admit(a, "y", sys_prompt + [30]) == 10
    assert a.block_table("y")[:2] == [0, 1] and a.refs[0] == a.refs[1] == 2
    assert a.block_table("y")[2] == 3 and a.take_copies() == [(2, 3, 2)]
    assert a.refs[2] == 1  # x's own partial block again
    assert a.used_blocks == 4  # 6 logical blocks in 4 physical ones
    a.free("x")
    # x's full blocks stay referenced by y; its partial block [9, 10, 20, 21] is now a cached leaf
    assert a.refs[:3] == [1, 1, 0] and a.cached_blocks() == [2]
    assert a.free_blocks == 4 + 1
    # the whole of x's prompt again: all but the last token found, the last block copied (CoW)
    assert _admit(a, "z", sys_prompt + [20, 21]) == 11
    assert a.take_copies() == [(2, 4, 3)]


def test_identical_blocks_computed_side_by_side_are_deduplicated():
    a = paging.PrefixCachingAllocator(8, block_size=2)
    # both admitted before either is computed (the same iteration): nothing to share yet
    for seq in ("x", "y"):
        assert a.admit(seq, [1, 2, 3, 4, 5]) == 0
        a.grow(seq, 5)
    assert a.used_blocks == 6
    a.computed("x", [1, 2, 3, 4, 5])
    a.computed("y", [1, 2, 3, 4, 5])  # y's two full blocks are x's: y's copies go back
    assert a.block_table("y")[:2] == a.block_table("x")[:2] and a.used_blocks == 4


def test_eviction_takes_the_least_recently_released_leaf():
    a = paging.PrefixCachingAllocator(4, block_size=2)
    _admit(a, "x", [1, 2, 3, 4, 5])  # blocks 0 (1,2), 1 (3,4), 2 (5)
    assert _admit(a, "y", [7, 8, 9, 10, 11]) is None  # 3 blocks, 1 free: refused
    assert a.block_table("y") == []
    a.free("x")  # 0 → 1 → 2 cached, released together: the deepest goes first
    assert a.eviction_order() == [2, 1, 0]
    assert _admit(a, "y", [7, 8, 9, 10, 11]) == 0  # the free block 3, then evicts 2 and 1
    assert sorted(a.cached_blocks()) == [0]  # 2 and 1 evicted, the root block kept
    assert a.lookup([1, 2, 3, 4, 5])[2] == 0  # (3, 4) is gone; (1, 2) is still found
    assert [n.block for n in a.lookup([1, 2, 3, 4, 5])[0]] == [0]


# ---------------------------------------------------------------------------------------------
# property tests
# ---------------------------------------------------------------------------------------------

PREFIXES = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9], [5, 5, 5, 5, 5, 5], []]
op = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, len(PREFIXES) - 1), st.lists(st.integers(0, 3), max_size=6)),
    st.tuples(st.just("decode"), st.integers(0, 50), st.integers(0, 3)),
    st.tuples(st.just("free"), st.integers(0, 50), st.just(0)),
)


class Shadow:
    """What the engine's K/V tensors would hold: per physical block, the token at each offset."""

    def __init__(self, a: paging.PrefixCachingAllocator):
        self.a = a
        self.content: list[list] = [[None] * a.block_size for _ in range(a.num_blocks)]
        self.tokens: dict[int, list] = {}
        self.released_at: dict[int, int] = {}
        self.clock = 0

    def write(self, seq, start: int, stop: int) -> None:
        a, bs = self.a, self.a.block_size
        for src, dst, n in a.take_copies():  # copies first, as KVStore.address does
            assert a.refs[dst] == 1 and dst not in a.nodes
            self.content[dst][:n] = self.content[src][:n]
        for p in range(start, stop):
            b = a.tables[seq][p // bs]
            # copy-on-write: a write never lands in a block another table or the tree can read
            assert a.refs[b] == 1 and b not in a.nodes, (seq, p, b)
            self.content[b][p % bs] = self.tokens[seq][p]

    def step(self, kind, x, extra) -> None:
        a = self.a
        live = sorted(self.tokens)
        a.drain_log()
        refs0 = list(a.refs)
        found = a.admit(self.clock, PREFIXES[x] + extra) if kind == "admit" and PREFIXES[x] + extra else 0
        # evictions can only happen after this point (admit takes references, it never allocates)
        before = {"order": a.eviction_order(), "released": dict(self.released_at), "refs": list(a.refs)}
        if kind == "admit":
            seq = self.clock
            toks = PREFIXES[x] + extra
            if not toks:
                return
            assert found < len(toks)
            if not a.can_grow(seq, len(toks)):
                a.free(seq)
            else:
                self.tokens[seq] = list(toks)
                a.grow(seq, len(toks))
                self.write(seq, found, len(toks))
                a.computed(seq, toks)
        elif live:
            seq = live[x % len(live)]
            if kind == "decode":
                n = len(self.tokens[seq])
                if a.can_grow(seq, n + 1):
                    self.tokens[seq].append(extra)
                    a.grow(seq, n + 1)
                    self.write(seq, n, n + 1)
                    a.computed(seq, self.tokens[seq])
            else:
                a.free(seq)
                del self.tokens[seq]
        log = a.drain_log()
        evicted = [b for o, _s, b in log if o == "evict"]
        # eviction only of unreferenced blocks, least recently released first (ties: deeper first)
        assert evicted == before["order"][: len(evicted)]
        candidates = set(before["order"])
        for b in evicted:
            assert before["refs"][b] == 0
            assert before["released"][b] == min(before["released"][c] for c in candidates)
            candidates.remove(b)
            self.released_at.pop(b)
        used = {b for o, _s, b in log if o == "share"} | {b for b in range(a.num_blocks) if refs0[b] or before["refs"][b]}
        for b in range(a.num_blocks):
            if a.refs[b] == 0 and b in used and b in a.nodes:  # referenced during this step, released now
                self.released_at[b] = self.clock
            if a.refs[b] > 0:
                self.released_at.pop(b, None)
        self.clock += 1
        self.check()

    def check(self) -> None:
        a, bs = self.a, self.a.block_size
        # refcounts equal the live references
        held = [0] * a.num_blocks
        for t in a.tables.values():
            for b in t:
                held[b] += 1
        assert a.refs == held
        # no block free while referenced; every block in exactly one place
        free, cached = set(a.free_list), set(a.evictable)
        assert len(free) == len(a.free_list) and not free & cached
        assert {b for b in range(a.num_blocks) if held[b]} == set(range(a.num_blocks)) - free - cached
        assert cached == {b for b in a.nodes if held[b] == 0}
        # each sequence reads its own tokens back through its table
        for seq, toks in self.tokens.items():
            assert a.lengths[seq] == len(toks)
            got = [self.content[a.tables[seq][p // bs]][p % bs] for p in range(len(toks))]
            assert got == toks
        # the tree: each node's block holds its tokens; a child is referenced no more than its parent
        for b, node in a.nodes.items():
            assert self.content[b][: len(node.tokens)] == list(node.tokens)
            if node.parent is not None:
                assert node.parent.children[node.tokens] is node and held[b] <= held[node.parent.block]
                assert len(node.parent.tokens) == bs
            else:
                assert a.roots[node.tokens] is node


@settings(max_examples=80, deadline=None)
@given(st.lists(op, min_size=1, max_size=40), st.integers(1, 4), st.integers(3, 12))
def test_radix_tree_invariants(ops, block_size, num_blocks):
    a = paging.PrefixCachingAllocator(num_blocks, block_size)
    shadow = Shadow(a)
    for kind, x, extra in ops:
        shadow.step(kind, x, extra)
    for seq in list(shadow.tokens):  # everyone leaves: nothing referenced, everything reusable
        a.free(seq)
        del shadow.tokens[seq]
        shadow.check()
    assert a.free_blocks == num_blocks and not any(a.refs)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.integers(6, 30))
def test_scheduler_with_prefix_sharing_serves_everyone(seed, block_size, num_blocks):
    reqs = paging.poisson_requests(10, 1.0, prompt_range=(1, 6), output_range=(1, 8), seed=seed, vocab=4,
                                   system_prompt=seed % 12)
    if any(paging.blocks_for(r.prompt_len + r.output_len - 1, block_size) > num_blocks for r in reqs):
        return
    snaps = paging.simulate(reqs, paging.PrefixCachingAllocator(num_blocks, block_size), 4)
    assert sorted(rid for s in snaps for rid in s.finished) == [r.rid for r in reqs]
    for s in snaps:
        assert s.physical_blocks <= num_blocks and s.physical_blocks <= s.logical_blocks
        assert s.tokens_stored <= s.reserved_tokens
    assert not any(snaps[-1].refs)


@pytest.mark.parametrize("n,prefix,total,bs", [(4, 10, 20, 4), (3, 8, 13, 4), (5, 0, 7, 2), (2, 16, 40, 16),
                                               (6, 33, 34, 8)])
def test_prefix_sharing_blocks_is_what_the_allocator_holds(n, prefix, total, bs):
    """The lesson's worked formula against the allocator: n sequences sharing a prefix, one after another."""
    want = paging.prefix_sharing_blocks(n, prefix, total, bs)
    shared, plain = paging.PrefixCachingAllocator(1000, bs), paging.BlockAllocator(1000, bs)
    for i in range(n):
        toks = list(range(prefix)) + [1000 + 100 * i + j for j in range(total - prefix)]
        _admit(shared, i, toks)
        _admit(plain, i, toks)
    assert (shared.used_blocks, plain.used_blocks) == (want["shared"], want["unshared"])
    # as many sequences as fit in the unshared footprint, shared
    fit = paging.sequences_that_fit(want["unshared"], prefix, total, bs)
    pool = paging.PrefixCachingAllocator(want["unshared"], bs)
    admitted = 0
    while _admit(pool, admitted, list(range(prefix)) + [1000 + 100 * admitted + j for j in range(total - prefix)]) \
            is not None:
        admitted += 1
    assert admitted == fit >= n


def test_distai_run_lesson7_sizes_its_group_from_tp_and_pp():
    """`distai run lesson7 --tp 2 --pp 2` launches tp·pp ranks; a group the degrees do not fit is refused."""
    import pytest

    from distai.engine.mesh_args import decode_launch_ranks

    assert decode_launch_ranks(["--tp", "2", "--pp", "2"], None, 2, False) == 4
    assert decode_launch_ranks(["--tp", "2"], None, 2, False) == 2      # pp = 2 / 2
    assert decode_launch_ranks([], None, 2, False) == 2                 # no mesh: the lesson's default
    assert decode_launch_ranks(["--pp", "4"], 4, 2, False) == 4
    for argv, ranks in ((["--tp", "2", "--pp", "2"], 2), (["--tp", "x"], None), (["--pp", "0"], None)):
        with pytest.raises(ValueError):
            decode_launch_ranks(argv, ranks, 2, False)
