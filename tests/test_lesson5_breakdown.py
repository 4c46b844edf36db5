"""Lesson 5's bubble decomposition (lessons/lesson5/breakdown.py) on steps whose causes are known:
each "measured" step is a simulator timeline with one cause injected (unequal stages, blocks
without a core, a latency per hop), turned into the blocks, CPU clocks and waits a rank records;
the decomposition must find that cause, and only it, and add up to the measured bubble."""
from __future__ import annotations

import pytest

from distai.lessons.lesson5 import breakdown as bd
from distai.lessons.lesson5 import formulas
from distai.lessons.lesson5 import simulator as sim

CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("1f1b", 2, 4, 1)]


def _measured(schedule, p, m, v, work, slowdown=None, t_comm=0.0, rendezvous=0.0) -> list[bd.RankStep]:
    """What the ranks would record of a step whose blocks take ``work`` (op → s) of CPU and
    ``work × slowdown[rank]`` of wall time, with ``t_comm`` per hop; or, with ``rendezvous``, as
    gloo and NCCL move a message: only once both ends have posted it, then in ``rendezvous`` s (a
    receiver busy when the message was sent still waits that long for it, and the sender's last
    wait for its sends lasts until its peer has received them)."""
    slowdown = slowdown or [1.0] * p
    wall = {op: work[op] * slowdown[op.stage % p] for op in work}
    n = p * v
    # a message posted at its producer's end ``e`` reaches a consumer free at ``t`` at max(t, e) + rendezvous
    remote = {op: rendezvous if (op.stage > 0 if op.kind == "F" else op.stage < n - 1) else 0.0 for op in wall}
    tl = (sim.replay(schedule, p, m, v, wall, latency={(op.kind, op.mb, op.stage): rendezvous for op in wall},
                     before=remote) if rendezvous else sim.replay(schedule, p, m, v, wall, t_comm=t_comm))
    begin = {op: start for r in range(p) for start, _, op in tl.blocks(r)}
    ranks = []
    for r in range(p):
        blocks, waits, sends, clock, prev = [], [], [], 0.0, 0.0
        for start, end, op in tl.blocks(r):
            if start > prev:  # the rank waited for this block's input
                producer = op.stage - 1 if op.kind == "F" else op.stage + 1
                waits.append(bd.Wait(op.kind, op.mb, producer, prev, start))
            blocks.append(bd.Block(op, start, end, clock, clock + work[op]))
            consumer = (op.kind, op.mb, op.stage + 1 if op.kind == "F" else op.stage - 1)
            sends += [bd.Send(op.kind, op.mb, op.stage, end)] if 0 <= consumer[2] < n else []
            clock, prev = clock + work[op], end
        received = max((begin[c] for c in begin if any((c.kind, c.mb, c.stage) == (x.kind, x.mb, x.from_stage + (1 if x.kind == "F" else -1))
                                                       for x in sends)), default=prev)
        last = max(prev, received)
        ranks.append(bd.RankStep(blocks, waits, 0.0, last, 0.0, clock, prev, last, sends))
    return ranks


def _work(schedule, p, m, v, per_rank=None):
    per_rank = per_rank or [1.0] * p
    return {op: (1.0 if op.kind == "F" else 2.0) / v * per_rank[op.stage % p]
            for ops in sim.schedule_order(schedule, p, m, v) for op in ops}


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_equal_stages_and_free_communication_measure_the_formula(schedule, p, m, v):
    step = bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, _work(schedule, p, m, v)))
    assert step.measured == pytest.approx(formulas.bubble_fraction(p, m, v))
    assert all(c == pytest.approx(0.0, abs=1e-12) for c in step.causes.values())


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_a_slow_stage_is_unequal_stages(schedule, p, m, v):
    work = _work(schedule, p, m, v, [1.0] * (p - 1) + [2.5])
    step = bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, work))
    c = step.causes
    assert c["unequal_stages"] > 0.05
    assert c["unequal_stages"] == pytest.approx(step.measured - step.formula)
    assert c["cpu_contention"] == pytest.approx(0.0, abs=1e-12) and c["communication"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_blocks_that_waited_for_a_core_are_cpu_contention(schedule, p, m, v):
    work = _work(schedule, p, m, v)
    step = bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, work, slowdown=[1.0] + [2.0] * (p - 1)))
    c = step.causes
    assert c["unequal_stages"] == pytest.approx(0.0, abs=1e-12)
    assert c["cpu_contention"] > 0.05 and c["cpu_contention"] == pytest.approx(step.measured - step.formula)
    assert step.contention[1] == pytest.approx(sum(w for op, w in work.items() if op.stage % p == 1))


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_latency_per_hop_is_communication(schedule, p, m, v):
    step = bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, _work(schedule, p, m, v), t_comm=0.4))
    c = step.causes
    assert step.latency == pytest.approx(0.4)
    assert c["communication"] > 0.02
    assert step.formula + sum(c.values()) == pytest.approx(step.measured, abs=0.01)


@pytest.mark.parametrize("schedule,p,m,v", CASES)
@pytest.mark.parametrize("slow", [0, 1])
def test_a_late_receiver_is_not_charged_twice_for_its_messages(schedule, p, m, v, slow):
    """Issue 28: a message moves once both ends have posted it. A receiver busy when its message is
    sent (here: the slower stage's peer) waits only the transfer, and the sender's last wait for its
    sends lasts until the peer receives them; that busy time is the receiver's own, not latency
    (counted as latency too, GPipe's causes over-explained its bubble by up to 14 %)."""
    work = _work(schedule, p, m, v, [1.4 if r == slow else 1.0 for r in range(p)])
    step = bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, work, rendezvous=0.05))
    clean = bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, work))
    c = step.causes
    assert step.measured > clean.measured and c["communication"] > 0
    assert step.formula + sum(c.values()) == pytest.approx(step.measured, rel=1e-9)
    assert c["unequal_stages"] == pytest.approx(clean.causes["unequal_stages"])
    assert step.latency == pytest.approx(0.05)


def test_the_check_names_the_causes_and_the_ranks_time():
    schedule, p, m, v = "1f1b", 2, 4, 1
    work = _work(schedule, p, m, v, [1.0, 2.0])
    check = bd.bubble_check(schedule, [bd.breakdown(schedule, p, m, v, _measured(schedule, p, m, v, work))] * 2)
    e = check.event()
    assert e["name"] == "bubble_1f1b" and not e["ok"] and check.explained
    assert set(e["causes"]) == {"unequal_stages", "overhead", "cpu_contention", "communication"}
    d = e["detail"]
    assert d["rank1_compute_s"] == pytest.approx(2 * d["rank0_compute_s"])
    for r in range(p):  # compute, overhead, contention, waits and idle tile the step
        parts = sum(d[f"rank{r}_{k}_s"] for k in ("compute", "overhead", "contention", "wait", "idle"))
        assert parts == pytest.approx(d["step_s"])  # idle is the step's remainder: this checks the bookkeeping
        assert d[f"rank{r}_idle_s"] >= -1e-12  # and that the named parts never claim more than the step


def test_replay_with_uniform_durations_is_the_simulation():
    p, m = 4, 8
    work = _work("1f1b", p, m, 1)
    for t_comm in (0.0, 0.3):
        got = sim.replay("1f1b", p, m, 1, work, t_comm=t_comm)
        want = sim.simulate("1f1b", p, m, 1, t_f=1.0, t_b=2.0, t_comm=t_comm)
        assert got.makespan == pytest.approx(want.makespan) and got.bubble_fraction == pytest.approx(want.bubble_fraction)
    with pytest.raises(sim.ScheduleError):
        sim.replay("1f1b", p, m, 1, dict(list(work.items())[1:]))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
@pytest.mark.parametrize("slowdown", [1.0, 1.5, 3.0])
def test_one_slow_stage_formula_is_gpipes_replay_and_bounds_1f1bs(p, m, slowdown):
    want = formulas.bubble_one_slow_stage(p, m, slowdown)
    for slow in range(p):
        for schedule in ("gpipe", "1f1b"):
            per_rank = [slowdown if r == slow else 1.0 for r in range(p)]
            got = sim.replay(schedule, p, m, 1, _work(schedule, p, m, 1, per_rank)).bubble_fraction
            if schedule == "gpipe" or slow == p - 1:
                assert got == pytest.approx(want)
            else:
                assert got <= want + 1e-12
    assert formulas.bubble_one_slow_stage(p, m, 1.0) == pytest.approx(formulas.bubble_fraction(p, m))
    with pytest.raises(formulas.ScheduleError):
        formulas.bubble_one_slow_stage(p, m, 0.5)


def test_the_runs_timeline_counts_the_blocks_work_as_busy():
    """The measured timeline's bubble (the tutor's and distai run's) reads each block's work, as the
    check does: a rank whose blocks waited for a core half the time is half as busy."""
    from distai.lessons.lesson5.run_timeline import PipelineRun
    from distai.visualizers.pipeline import Lanes

    p, m = 2, 2
    tl = sim.simulate("gpipe", p, m, 1, t_f=1.0, t_b=2.0)
    run = PipelineRun()
    run.feed({"kind": "pp_config", "p": p, "m": m, "v": 1, "schedules": ["gpipe"], "microbatch_size": 1,
              "d_model": 8, "layers": 2, "seq": 4})
    for r in range(p):
        for start, end, op in tl.blocks(r):
            run.feed({"kind": "pp_op", "schedule": "gpipe", "step": 0, "op": op.kind, "mb": op.mb, "chunk": op.chunk,
                      "stage": op.stage, "t0": start, "t1": end, "compute": (end - start) / (2 if r == 1 else 1),
                      "rank": r})
    lanes = Lanes.of_step(run.latest_complete("gpipe"))
    work = sum(end - start for r in range(p) for start, end, _ in tl.blocks(r)) - tl.busy[1] / 2
    assert lanes.bubble() == pytest.approx(1 - work / (p * tl.makespan))
    assert lanes.bubble() > tl.bubble_fraction


def test_on_a_gpu_wall_time_is_work_and_nothing_is_contention():
    """GPU blocks carry no CPU clock: their (synchronized) wall time is their work."""
    schedule, p, m, v = "1f1b", 4, 8, 1
    work = _work(schedule, p, m, v, [1.0, 1.0, 1.0, 1.6])
    cpu = _measured(schedule, p, m, v, work, t_comm=0.2)
    gpu = [bd.RankStep([bd.Block(b.op, b.t0, b.t1) for b in r.blocks], r.waits, r.t_start, r.t_end, None, None,
                       r.send_t0, r.send_t1) for r in cpu]
    a, b = bd.breakdown(schedule, p, m, v, cpu), bd.breakdown(schedule, p, m, v, gpu)
    assert b.causes == pytest.approx(a.causes) and b.measured == pytest.approx(a.measured)
    assert b.causes["cpu_contention"] == 0.0 and b.causes["unequal_stages"] > 0.05
