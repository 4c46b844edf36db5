"""Lesson 7 pure models: the block allocator and continuous-batching scheduler, and the router
simulation (exact cases by hand, then the policies compared)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distai.lessons.lesson7 import formulas as f
from distai.lessons.lesson7 import paging
from distai.lessons.lesson7 import routing as rt

# ---------------------------------------------------------------------------------------------
# paging
# ---------------------------------------------------------------------------------------------


def test_block_allocator_tables_and_reuse():
    a = paging.BlockAllocator(4, block_size=4)
    assert a.grow("x", 5) == [0, 1]  # 5 tokens: 2 blocks
    assert a.grow("x", 8) == []  # still 2 blocks
    assert a.grow("y", 1) == [2]
    assert a.slot("x", 5) == (1, 1)
    assert a.fill(1) == 4 and a.fill(2) == 1
    with pytest.raises(paging.OutOfBlocks):
        a.grow("y", 9)  # needs 2 more, 1 free
    assert a.free("x") == [0, 1]
    assert a.grow("y", 9) == [3, 0]  # FIFO free list: block 3, then the freed 0
    assert a.block_table("y") == [2, 3, 0]
    assert a.reserved_tokens() == 12 and a.tokens_stored() == 9


def test_contiguous_allocator_reserves_max_len():
    a = paging.ContiguousAllocator(2, max_len=10)
    a.grow("x", 3)
    assert a.reserved_tokens() == 10 and a.tokens_stored() == 3
    assert a.slot("x", 7) == (0, 7)
    assert not a.can_grow("y", 11)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(0, 20)), min_size=1, max_size=12),
       st.integers(1, 8), st.integers(6, 40), st.integers(1, 6))
def test_scheduler_invariants(spec, block_size, num_blocks, max_batch):
    reqs = [paging.Request(i, p, o, a) for i, (p, o, a) in enumerate(spec)]
    if any(paging.blocks_for(r.prompt_len + r.output_len - 1, block_size) > num_blocks for r in reqs):
        return
    snaps = paging.simulate(reqs, paging.BlockAllocator(num_blocks, block_size), max_batch)
    finished = [rid for s in snaps for rid in s.finished]
    assert sorted(finished) == [r.rid for r in reqs]  # everyone finishes exactly once
    for s in snaps:
        assert len(s.running) <= max_batch
        assert s.tokens_stored <= s.reserved_tokens <= num_blocks * block_size
        used = {o for o in s.owners if o is not None}
        assert used == set(s.running)  # blocks belong exactly to the running requests
        # only the last block of a sequence can be partly filled
        for rid in used:
            fills = [s.fills[b] for b, o in enumerate(s.owners) if o == rid]
            assert sum(1 for x in fills if x < block_size) <= 1
    assert all(o is None for o in snaps[-1].owners)
    by = {r.rid: r for r in reqs}
    for s in snaps:  # a request admitted no earlier than it arrived
        for rid in s.admitted:
            assert s.step >= by[rid].arrival


def test_scheduler_kv_accounting_by_hand():
    # one request, prompt 5, 3 output tokens: prefill stores 5, then 2 decode steps store 1 each
    snaps = paging.simulate([paging.Request(0, 5, 3)], paging.BlockAllocator(4, 4), 4)
    assert [s.tokens_stored for s in snaps] == [5, 6, 0]  # freed when the 3rd token is out
    assert snaps[0].allocated == [0, 1] and snaps[-1].freed == [0, 1]
    assert [s.admitted for s in snaps] == [[0], [], []] and snaps[-1].finished == [0]


def test_preemption_when_the_pool_is_full():
    reqs = [paging.Request(0, 4, 8), paging.Request(1, 4, 8)]
    snaps = paging.simulate(reqs, paging.BlockAllocator(3, 4), 4)
    assert any(s.preempted for s in snaps)
    assert sorted(r for s in snaps for r in s.finished) == [0, 1]


def test_paged_waste_bounded_contiguous_not():
    reqs = paging.poisson_requests(30, 0.7, seed=2)
    max_len = max(r.prompt_len + r.output_len - 1 for r in reqs)
    pag = paging.simulate(reqs, paging.BlockAllocator(64, 8), 16)
    con = paging.simulate(reqs, paging.ContiguousAllocator(64 * 8 // max_len, max_len), 16)
    for s in pag:
        assert s.reserved_tokens - s.tokens_stored <= 7 * len(s.running)
    assert paging.waste_summary(pag)["waste_fraction"] < 0.2 < paging.waste_summary(con)["waste_fraction"]


# ---------------------------------------------------------------------------------------------
# routing
# ---------------------------------------------------------------------------------------------

COST = rt.CostModel(prefill_fixed=0.002, prefill_per_token=0.001, decode_fixed=0.01, decode_per_seq=0.001)


def test_percentile_is_numpys():
    xs = [3.0, 1.0, 7.5, 2.0, 9.0, 4.0, 4.0]
    for q in (0, 25, 50, 90, 99, 100):
        assert rt.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_linear_fit_and_roofline_cost():
    c = rt.CostModel.fit([(8, 0.002 + 8e-4), (32, 0.002 + 32e-4), (64, 0.002 + 64e-4)],
                         [(1, 0.011), (4, 0.014), (16, 0.026)])
    assert c.prefill_fixed == pytest.approx(0.002) and c.prefill_per_token == pytest.approx(1e-4)
    assert c.decode_fixed == pytest.approx(0.01) and c.decode_per_seq == pytest.approx(0.001)
    kv = f.kv_cache_total(80, 8, 128, 2, 4096, tp=4)["per_gpu_bytes"]
    r = rt.CostModel.roofline(69e9 / 4, 2 * 69e9 / 4, kv, 989e12, 3.35e12)
    assert r.source == "roofline"
    assert r.decode(16) == f.decode_time_per_token(69e9 / 4, 2 * 69e9 / 4, kv, 989e12, 3.35e12, 16)
    assert r.prefill(2000) == f.prefill_time(69e9 / 4, 2000, 2 * 69e9 / 4, 989e12, 3.35e12)


def _req(rid, t, prefix=0, plen=10, slen=5, out=4):
    return rt.SimRequest(rid, t, prefix, plen, slen, out)


def test_one_request_ttft_and_tpot_exact():
    res = rt.simulate([_req(0, 1.0)], "round-robin", 1, COST)
    row = res["requests"][0]
    assert row["ttft_s"] == pytest.approx(COST.prefill(15))
    assert row["tpot_s"] == pytest.approx(COST.decode(1))
    assert res["metrics"]["throughput_tokens_per_s"] == pytest.approx(4 / (COST.prefill(15) + 3 * COST.decode(1)))


def test_queueing_and_prefix_hit_by_hand():
    # max_batch 1: the second request waits for the first to finish; same prefix → only its suffix
    res = rt.simulate([_req(0, 0.0), _req(1, 0.0)], "round-robin", 1, COST, max_batch=1)
    a, b = res["requests"]
    first_done = COST.prefill(15) + 3 * COST.decode(1)
    assert a["finish"] == pytest.approx(first_done)
    assert b["ttft_s"] == pytest.approx(first_done + COST.prefill(5))
    assert (a["prefix_hit"], b["prefix_hit"]) == (False, True)
    # continuous batching: the second arrives while the first is prefilled, so it joins the next
    # iteration, which prefills it and decodes the first together; then both decode as a batch of 2
    res = rt.simulate([_req(0, 0.0), _req(1, 0.0, prefix=1)], "round-robin", 1, COST, max_batch=4)
    a, b = res["requests"]
    assert a["ttft_s"] == pytest.approx(COST.prefill(15))
    assert b["ttft_s"] == pytest.approx(COST.prefill(15) + COST.prefill(15) + COST.decode(1))
    assert b["tpot_s"] == pytest.approx((2 * COST.decode(2) + COST.decode(1)) / 3)


def test_router_choices():
    reqs = [_req(i, i * 1e-6, prefix=i % 3, out=50) for i in range(9)]
    rr = rt.simulate(reqs, "round-robin", 3, COST)
    assert [r["replica"] for r in rr["requests"]] == [i % 3 for i in range(9)]
    lor = rt.simulate(reqs, "least-outstanding", 3, COST)
    assert lor["metrics"]["per_replica"] == [3, 3, 3]
    pa = rt.simulate(reqs, "prefix-aware", 3, COST)
    home = {}
    for r in pa["requests"]:
        home.setdefault(r["prefix_id"], r["replica"])
        assert r["replica"] == home[r["prefix_id"]]  # same prefix → same replica while balanced
    assert pa["metrics"]["prefix_hit_rate"] == pytest.approx(6 / 9)


def test_prefix_aware_falls_back_when_overloaded():
    reqs = [_req(i, i * 1e-6, prefix=0, out=200) for i in range(30)]
    pa = rt.simulate(reqs, "prefix-aware", 3, COST, balance_abs=4, balance_rel=1.5)
    assert min(pa["metrics"]["per_replica"]) > 0  # one hot prefix does not pile onto one replica


@pytest.fixture(scope="module")
def compared():
    shape = dict(prefixes=16, prefix_len=48, suffix_range=(4, 16), mean_output=16, max_output=64)
    out = {}
    for rate in (60.0, 150.0):
        reqs = rt.poisson_workload(600, rate, seed=11, **shape)
        out[rate] = rt.compare(reqs, 4, rt.CostModel(0.004, 0.00025, 0.0045, 0.0006), max_batch=16)
    return out


def test_every_request_served_once(compared):
    for res in compared.values():
        for r in res.values():
            assert [q["rid"] for q in r["requests"]] == list(range(600))
            assert all(q["finish"] >= q["first_token"] >= q["arrival"] for q in r["requests"])
            assert sum(r["metrics"]["per_replica"]) == 600


def test_prefix_aware_hits_more_and_cuts_ttft(compared):
    for res in compared.values():
        pa, rr = res["prefix-aware"]["metrics"], res["round-robin"]["metrics"]
        assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.2
        assert pa["ttft_p50_s"] < rr["ttft_p50_s"]


def test_under_load_least_outstanding_cuts_the_tail(compared):
    res = compared[150.0]
    lor, rr = res["least-outstanding"]["metrics"], res["round-robin"]["metrics"]
    assert lor["ttft_p99_s"] < rr["ttft_p99_s"]
    # the median barely moves, the tail does
    assert abs(lor["ttft_p50_s"] - rr["ttft_p50_s"]) / rr["ttft_p50_s"] < \
        (rr["ttft_p99_s"] - lor["ttft_p99_s"]) / rr["ttft_p99_s"]
