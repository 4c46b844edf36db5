"""The pure run-event folds of lessons 1 and 5 (lessons/lessonN/...), without any widget."""
from __future__ import annotations

from distai.lessons.lesson1 import ring_model
from distai.lessons.lesson1.ring_run import RingRun
from distai.lessons.lesson5 import simulator as sim
from distai.lessons.lesson5.run_timeline import PipelineRun


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
