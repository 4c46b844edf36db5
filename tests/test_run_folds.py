"""The pure run-event folds of the lessons (lessons/lessonN/...), without any widget."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from distai.lessons.lesson1 import ring_model
from distai.lessons.lesson1.ring_run import RingRun
from distai.lessons.lesson2.sharding_run import ShardingRun
from distai.lessons.lesson4 import flow
from distai.lessons.lesson4.tp_run import TPRun
from distai.lessons.lesson5 import simulator as sim
from distai.lessons.lesson5.run_timeline import PipelineRun
from distai.lessons.lesson6.mixed_precision_run import MixedPrecisionRun
from distai.lessons.lesson7.serving_run import ServingRun


def _ring_step(call, n, step, rank, **extra):
    return {"kind": "ring_step", "call": call, "n": n, "step": step, "rank": rank, "size": 1024,
            "chunk": ring_model.send_chunk(rank, step, n), "to": ring_model.right(rank, n), **extra}


def test_ring_run_files_steps_by_call_and_starts_afresh_on_a_new_run():
    run = RingRun()
    assert run.feed({"kind": "run_start", "run_id": "a"}) and run.run_id == "a"
    for step in range(ring_model.num_steps(4)):
        for rank in range(4):
            assert run.feed(_ring_step(3, 4, step, rank))
    assert not run.feed({"kind": "ring_step", "call": 3, "n": "four"})  # malformed: ignored
    assert not run.feed({"kind": "log", "msg": "x"})
    rec = run.calls[3]
    assert (rec.n, rec.size, rec.total, len(rec.events)) == (4, 1024, 6, 24)
    assert run.feed({**_ring_step(3, 4, 0, 0), "step": 99}) and len(rec.events) == 24  # out of range: not filed
    run.feed({"kind": "fit", "impl": "ring", "alpha_s": 5e-6, "beta_s_per_byte": 4e-11})
    run.feed({"kind": "fit", "impl": "all_reduce", "alpha_s": 5e-6, "beta_s_per_byte": 0})
    assert run.fit_params("ring") == (5e-6, 4e-11) and run.fit_params("all_reduce") is None
    run.feed({"kind": "sweep", "size": 1024, "ring_busbw": 1e9})
    run.feed({"kind": "step", "step": 7})
    assert len(run.sweep) == 1 and run.train_steps == [7]
    run.feed({"kind": "run_start", "run_id": "b"})
    assert (run.run_id, run.calls, run.sweep, run.fits) == ("b", {}, [], {})


def test_pipeline_run_keeps_blocks_until_a_step_is_complete():
    p, m = 2, 2
    run = PipelineRun()
    assert not run.feed({"kind": "pp_op", "schedule": "gpipe", "op": "F", "mb": 0, "stage": 0,
                         "t0": 0, "t1": 1})  # before pp_config: no p to file it under
    assert run.feed({"kind": "pp_config", "p": p, "m": m, "v": 1})
    tl = sim.simulate("gpipe", p, m)
    t = 10.0
    for rank in range(p):
        for start, end, op in tl.blocks(rank):
            run.feed({"kind": "pp_op", "schedule": "gpipe", "step": 1, "rank": rank, "op": op.kind,
                      "mb": op.mb, "chunk": op.chunk, "stage": op.stage, "t0": t + start, "t1": t + end})
    done = run.latest_complete("gpipe")
    assert done is not None and done.step == 1 and run.latest_schedule() == "gpipe"
    # measured in units of the mean forward block: the simulated makespan in forward units
    assert abs(done.makespan - tl.makespan / tl.t_f) < 1e-9
    assert done.seconds == tl.makespan
    run.feed({"kind": "run_start"})
    assert run.p == 0 and run.ops == {}


# ---- lessons 2, 4, 6 and 7: streams recorded from `distai run lessonN --cpu 2 --json`, trimmed to
# the event kinds each fold reads (tests/recorded_runs/)
RECORDED = Path(__file__).parent / "recorded_runs"


def _recorded(lesson: str) -> list[dict]:
    with open(RECORDED / f"{lesson}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _fold(fold, events):
    for event in events:
        fold.feed(event)
    return fold


def test_sharding_run_keeps_rank_0s_bytes_per_strategy():
    events = _recorded("lesson2")
    run = _fold(ShardingRun(), events)
    assert run.run_id == events[0]["run_id"]
    assert run.setup == {"world_size": 2, "num_params": 232576, "precision": "fp32", "optimizer": "adam"}
    assert list(run.memory) == ["ddp", "zero1", "zero2", "zero3", "fsdp2"]
    rank0 = {e["strategy"]: e for e in events if e["kind"] == "memory" and e["rank"] == 0}
    assert run.memory == rank0
    held = [run.memory[s]["total"] for s in ("ddp", "zero1", "zero2", "zero3")]
    assert held == sorted(held, reverse=True)  # each stage shards one more state
    assert run.sent_bytes("zero3") / run.sent_bytes("zero1") == pytest.approx(1.5)  # 3Ψ against 2Ψ
    assert not run.feed({"kind": "step", "step": 0, "loss": 1.0})
    assert run.feed({"kind": "run_start", "run_id": "next"}) and run.empty and run.setup == {}
    # a replay that starts after the setup phase still knows the run's size
    run.feed(rank0["zero3"])
    assert run.setup["world_size"] == 2 and run.sent_bytes("zero3") is None


def test_tp_run_keeps_the_layer_shape_and_the_collectives_counted():
    run = _fold(TPRun(), _recorded("lesson4"))
    assert run.t == 2 and run.shape == {"hidden": 128, "seq": 64, "micro_batch": 4, "bytes": 8}
    for mode, sp in (("tp", False), ("tp+sp", True)):
        counts = run.layer_counts(mode)
        assert counts["match"]
        # what the ranks counted is what the lesson's flow draws (the engine counts SP's re-gathers apart)
        stages = [st for st in flow.block_flow(sp) if not st.key.endswith(".regather")]
        for phase in ("fwd", "bwd"):
            ran = {op: n for op, n in counts[phase].items() if n}
            assert ran == flow.count_collectives(stages, phase), (mode, phase)
    assert run.layer_counts("tp", layer=7) is None
    assert not run.feed({"kind": "config", "T": 2})  # not a layer's shape
    run.feed({"kind": "run_start"})
    assert (run.t, run.shape, run.checks) == (None, None, {})


def test_mixed_precision_run_keeps_one_ranks_timelines_rebased_to_backward():
    events = _recorded("lesson6")
    run = _fold(MixedPrecisionRun(), events)
    assert run.rank == 0 and len(run.scale) == len(run.loss) == len(run.overflow) == 2 and len(run.hists) == 1
    assert run.bucket_sizes() == [0.25, 1.0, 4.0, 25.0]
    assert len(run.timelines) == 4 * 3  # rank 1's copies left out
    assert run.best_bucket() == run.summary["overlap"]["best_bucket_mb"]
    assert run.sweep[(4.0, "ddp")] == next(e["step_ms"] for e in events
                                          if e["kind"] == "bucket_sweep" and e["bucket_mb"] == 4 and e["mode"] == "ddp")
    raw = run.timelines[(0.25, "overlap")]
    tl = run.timeline(0.25, "overlap")
    t0 = raw["marks"]["backward"]
    assert tl["layers"][0][1] == 0 and tl["layers"][-1][2] == pytest.approx(raw["layers"][-1][2] - t0)
    assert tl["backward_end"] == max(b for *_, b in tl["layers"])
    assert tl["end"] == pytest.approx(max([tl["backward_end"]] + [b for *_, b in tl["buckets"]]))
    assert run.timeline(3.0, "overlap") is None
    run.feed({"kind": "run_start"})
    assert run.empty and run.rank is None


def test_serving_run_rebuilds_the_runs_pools_and_keeps_its_shards():
    events = _recorded("lesson7")
    run = ServingRun()
    ignored = [e for e in events if not run.feed(e)]
    assert {e.get("cache") for e in ignored} == {"no-sharing"}  # the unshared twin: figures in prefix_compare
    assert run.world_size == 2 and run.dtype_bytes() == 4
    assert set(run.shards) == {("tp", 0), ("tp", 1), ("pp", 0), ("pp", 1)}
    assert run.mesh(run.shards[("tp", 1)]) == (2, 1) and run.mesh(run.shards[("pp", 0)]) == (1, 2)
    assert (run.mode_of(2, 1), run.mode_of(1, 2), run.mode_of(4, 1)) == ("tp", "pp", None)
    steps = {cache: [e for e in events if e["kind"] == "kv_step" and e["cache"] == cache]
             for cache in ("paged", "contiguous", "prefix")}
    for snaps, cache in ((run.paged, "paged"), (run.contiguous, "contiguous"), (run.prefix, "prefix")):
        assert len(snaps) == len(steps[cache])
        for snap, e in zip(snaps, steps[cache]):
            assert snap.step == e["step"] and sum(o is not None for o in snap.owners) == e["used_blocks"]
            held = [b for t in e["tables"].values() for b in t]
            assert snap.refs == [held.count(b) for b in range(e["num_blocks"])]
            if not e["cached"]:
                assert sum(snap.fills) == e["tokens_stored"]
    assert run.paged_pool == (steps["paged"][0]["num_blocks"], steps["paged"][0]["block_size"])
    assert run.contiguous_len == steps["contiguous"][0]["block_size"]  # one slot of max_len tokens
    assert run.kv_compare["kind"] == "kv_compare" and run.prefix_compare["system_prompt"] == 100
    run.feed({"kind": "run_start"})
    assert (run.config, run.shards, run.paged, run.prefix) == (None, {}, [], [])
