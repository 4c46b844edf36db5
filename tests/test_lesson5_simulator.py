"""Lesson 5 simulator: bubbles and activations equal the formulas; orders respect every dependency
and match torch.distributed.pipelining; the point-to-point plan cannot deadlock."""
from __future__ import annotations

import itertools
import math

import pytest

from distai.lessons.lesson5 import formulas
from distai.lessons.lesson5 import simulator as sim

P_VALUES = (1, 2, 3, 4, 8)
M_VALUES = (1, 2, 3, 4, 8, 12, 16)
COSTS = ((1.0, 2.0), (1.0, 1.0), (1.0, 0.5), (1.5, 3.7))


def _grid():
    for p, m in itertools.product(P_VALUES, M_VALUES):
        yield "gpipe", p, m, 1
        yield "1f1b", p, m, 1
        for v in (2, 3, 4):
            try:
                sim.validate("interleaved", p, m, v)
            except sim.ScheduleError:
                continue
            yield "interleaved", p, m, v


GRID = list(_grid())


def _check_dependencies(tl: sim.Timeline) -> None:
    """Independent of the simulator's own loop: every block respects the data flow, every stage
    runs each microbatch's forward and backward exactly once, a rank runs one block at a time."""
    p, m, v, eps = tl.p, tl.m, tl.v, 1e-9
    n_stages = p * v
    when = {}
    for r in range(p):
        prev_end = 0.0
        for s, e, op in tl.blocks(r):
            assert op.stage % p == r and op.stage == op.chunk * p + r
            assert s >= prev_end - eps, f"rank {r} overlaps itself at {op}"
            assert math.isclose(e - s, (tl.t_f if op.kind == "F" else tl.t_b) / v)
            prev_end = e
            key = (op.kind, op.stage, op.mb)
            assert key not in when, f"{key} runs twice"
            when[key] = (s, e)
    assert len(when) == 2 * n_stages * m
    hop = lambda a, b: tl.t_comm if a % p != b % p else 0.0  # noqa: E731
    for (kind, s, mb), (start, _end) in when.items():
        if kind == "F" and s > 0:
            assert start >= when[("F", s - 1, mb)][1] + hop(s - 1, s) - eps, f"F{mb} on stage {s} too early"
        if kind == "B":
            assert start >= when[("F", s, mb)][1] - eps, f"B{mb} before its own forward on stage {s}"
            if s < n_stages - 1:
                assert start >= when[("B", s + 1, mb)][1] + hop(s + 1, s) - eps, f"B{mb} on stage {s} too early"


@pytest.mark.parametrize("schedule,p,m,v", GRID)
def test_bubble_and_step_time_equal_the_formulas(schedule, p, m, v):
    for t_f, t_b in COSTS:
        tl = sim.simulate(schedule, p, m, v, t_f=t_f, t_b=t_b)
        assert tl.makespan == pytest.approx(formulas.step_time_units(p, m, v) * (t_f + t_b))
        assert tl.bubble_fraction == pytest.approx(formulas.bubble_fraction(p, m, v))
        assert tl.bubble_ratio == pytest.approx(formulas.bubble_ratio(p, m, v))
        _check_dependencies(tl)


@pytest.mark.parametrize("schedule,p,m,v", GRID)
def test_peak_inflight_equals_the_formulas(schedule, p, m, v):
    tl = sim.simulate(schedule, p, m, v)
    for r in range(p):
        assert tl.peak_inflight[r] == pytest.approx(formulas.peak_inflight_microbatches(p, m, schedule, v, r))
        if schedule == "gpipe":
            assert tl.peak_inflight[r] == m
        elif schedule == "1f1b":
            assert tl.peak_inflight[r] == min(p - r, m)
    # the series the widget draws reaches the same peak
    for r in range(p):
        assert max(c for _t, c in tl.inflight_series(r)) == tl.inflight_peak_chunks[r]


def _refusal(func, *args):
    try:
        func(*args)
    except sim.ScheduleError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("schedule", sim.SCHEDULES)
def test_formula_and_simulator_agree_or_refuse_alike(schedule):
    """Over every (p, m, v): the calculator's figures equal the simulated step's, or both refuse
    with the same reason (issue 19.1: `calc bubble -p 8 -m 1 --schedule interleaved` used to answer)."""
    for p, m, v in itertools.product((1, 2, 3, 4, 8), range(1, 25), (1, 2, 3, 4)):
        refused = _refusal(formulas.pipeline_bubble, p, m, schedule, v)
        assert refused == _refusal(sim.simulate, schedule, p, m, v), (schedule, p, m, v)
        if refused:
            continue
        figures = formulas.pipeline_bubble(p, m, schedule, v)
        tl = sim.simulate(schedule, p, m, v, t_f=1.0, t_b=2.0)
        assert figures["step_time_units"] * 3.0 == pytest.approx(tl.makespan)
        assert figures["bubble_fraction"] == pytest.approx(tl.bubble_fraction)
        assert figures["bubble_ratio"] == pytest.approx(tl.bubble_ratio)
        assert figures["peak_inflight_microbatches"] == pytest.approx(tl.peak_inflight[0])
        # a step is never shorter than one microbatch through every stage
        assert figures["step_time_units"] >= p / v * 1 - 1e-9 and figures["step_time_units"] >= m


def test_the_audits_cases():
    # issue 19.1 refused these; issue 27.8: torch's ScheduleInterleaved1F1B runs m < p in one round,
    # Megatron-LM refuses any m that p does not divide
    for p, m, v in ((8, 1, 4), (8, 4, 2), (8, 4, 4)):
        for engine in ("distai", "torch"):
            assert formulas.pipeline_bubble(p, m, "interleaved", v, engine)["peak_inflight_microbatches"] == m
        with pytest.raises(sim.ScheduleError, match="multiple of p = 8"):
            formulas.pipeline_bubble(p, m, "interleaved", v, "megatron")
    for engine in formulas.ENGINES:
        with pytest.raises(sim.ScheduleError):
            formulas.pipeline_bubble(4, 9, "interleaved", 2, engine)
    # peak in flight as torch's ScheduleInterleaved1F1B orders the work (was 5.5 and 10.33)
    assert formulas.peak_inflight_microbatches(4, 6, "interleaved", 2) == 6.0
    assert formulas.peak_inflight_microbatches(8, 12, "interleaved", 3) == 12.0


def _torch_schedule_order(p, m, v, rank):
    """Rank ``rank``'s work as torch's own ScheduleInterleaved1F1B computes it (its __init__'s rounds,
    then its _calculate_single_rank_operations), without building stages or a process group."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    sched = object.__new__(schedules.ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched.rank, sched._n_microbatches = p, v, rank, m
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    try:
        ops = sched._calculate_single_rank_operations(rank)
    except AttributeError as exc:  # another torch keeps other attributes
        pytest.skip(f"this torch's ScheduleInterleaved1F1B differs: {exc}")
    return ["F" if a.computation_type.name == "FORWARD" else "B" for a in ops if a is not None]


@pytest.mark.parametrize("p,m,v", [(4, 6, 2), (8, 12, 3), (4, 8, 2), (3, 9, 2), (2, 6, 3), (4, 10, 2)])
def test_interleaved_peak_inflight_is_torchs(p, m, v):
    """Activations each rank holds at once, counted on torch's ScheduleInterleaved1F1B order
    (issue 19.1: the calculator said 5.5 for p=4, m=6, v=2 and 10.33 for p=8, m=12, v=3)."""
    for r in range(p):
        held = peak = 0
        for kind in _torch_schedule_order(p, m, v, r):
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        assert peak / v == pytest.approx(formulas.peak_inflight_microbatches(p, m, "interleaved", v, r))


def test_gpipe_holds_m_and_1f1b_holds_p_microbatches():
    p, m = 4, 32
    assert sim.simulate("gpipe", p, m).peak_inflight[0] == 32
    assert sim.simulate("1f1b", p, m).peak_inflight[0] == 4
    assert sim.simulate("gpipe", p, m).makespan == sim.simulate("1f1b", p, m).makespan


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (3, 5), (4, 2)])
def test_1f1b_warmup_count(p, m):
    for r, ops in enumerate(sim.schedule_order("1f1b", p, m)):
        first_b = next(i for i, op in enumerate(ops) if op.kind == "B")
        assert first_b == min(m, p - r)  # p - r - 1 warm-up forwards, then one steady 1F
        assert sim.warmup_forwards("1f1b", p, m, r) == formulas.warmup_forwards("1f1b", p, m, r)
        # steady state alternates F and B
        steady = ops[first_b - 1: first_b - 1 + 2 * (m - min(m, p - r - 1))]
        assert [op.kind for op in steady] == ["F", "B"] * (len(steady) // 2)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 3), (2, 6, 2), (8, 16, 2)])
def test_interleaved_warmup_count(p, m, v):
    for r, ops in enumerate(sim.schedule_order("interleaved", p, m, v)):
        first_b = next(i for i, op in enumerate(ops) if op.kind == "B")
        assert first_b == formulas.warmup_forwards("interleaved", p, m, r, v) + 1


def _torch_interleaved_order(p, m, v, rank):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not hasattr(schedules, "_get_1f1b_rank_ops"):
        pytest.skip("this torch has no _get_1f1b_rank_ops")
    k = sim.microbatches_per_round(p, m)
    warm = schedules._get_warmup_ops(rank, v, k, p, m, 2)
    ops = schedules._get_1f1b_rank_ops(v, p, warm, v * m - warm, warm, rank,
                                       lambda s: ((s // k) % v) * p + rank,
                                       lambda s: (v - 1 - ((s - warm) // k) % v) * p + rank)
    return [("F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index, a.stage_index)
            for a in ops if a is not None]


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 10, 2), (2, 6, 3), (8, 16, 2), (4, 4, 4), (3, 9, 2)])
def test_interleaved_order_is_torchs(p, m, v):
    ours = sim.schedule_order("interleaved", p, m, v)
    for r in range(p):
        assert [(op.kind, op.mb, op.stage) for op in ours[r]] == _torch_interleaved_order(p, m, v, r)


def test_interleaved_sends_more_messages_and_shrinks_the_bubble():
    p, m = 4, 8
    one = sim.simulate("1f1b", p, m)
    two = sim.simulate("interleaved", p, m, 2)
    assert one.p2p_messages == 2 * m * (p - 1)
    assert two.p2p_messages == 2 * m * (2 * p - 1)
    assert two.bubble_ratio == pytest.approx(one.bubble_ratio / 2)


def test_communication_time_per_hop():
    p, m, c = 4, 8, 0.25
    tl = sim.simulate("gpipe", p, m, t_f=1, t_b=2, t_comm=c)
    assert tl.makespan == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * c)  # fill and drain cross p-1 hops
    for schedule, v in (("1f1b", 1), ("interleaved", 2)):
        slow = sim.simulate(schedule, p, m, v, t_comm=c)
        _check_dependencies(slow)
        assert slow.makespan > sim.simulate(schedule, p, m, v).makespan


@pytest.mark.parametrize("schedule,p,m,v", [g for g in GRID if g[1] > 1 and g[2] <= 12])
def test_point_to_point_plan_cannot_deadlock(schedule, p, m, v):
    tl = sim.simulate(schedule, p, m, v)
    plan = sim.comm_plan(tl)
    sim.check_comm_plan(plan)
    # every cross-rank dependency is one message, sent once and received once
    sends = sum(a.kind == "send" for rank_plan in plan for a in rank_plan)
    recvs = sum(a.kind == "recv" for rank_plan in plan for a in rank_plan)
    assert sends == recvs == tl.p2p_messages == 2 * m * (p * v - 1)


def test_plan_checker_catches_a_bad_plan():
    tl = sim.simulate("1f1b", 2, 4)
    plan = sim.comm_plan(tl)
    # rank 1 receiving two activations in swapped order would pair them wrongly
    recv_idx = [i for i, a in enumerate(plan[1]) if a.kind == "recv"][:2]
    bad = [list(plan[0]), list(plan[1])]
    bad[1][recv_idx[0]], bad[1][recv_idx[1]] = bad[1][recv_idx[1]], bad[1][recv_idx[0]]
    with pytest.raises(sim.ScheduleDeadlock, match="different order"):
        sim.check_comm_plan(bad)
    # rank 0 posting its first send only after waiting for the first gradient: both ranks wait
    first_send = next(i for i, a in enumerate(plan[0]) if a.kind == "send")
    late = list(plan[0])
    send = late.pop(first_send)
    late.append(send)
    with pytest.raises(sim.ScheduleDeadlock):
        sim.check_comm_plan([late, list(plan[1])])


def test_an_order_that_waits_on_itself_is_reported():
    order = sim.schedule_order("1f1b", 2, 2)
    # rank 0 insists on B0 before F1, rank 1 on F1 before B0 — fine; now make rank 1 want B0 first
    order[1] = [op for op in order[1] if op.kind == "B"][:1] + [op for op in order[1] if op.kind == "F"] + \
        [op for op in order[1] if op.kind == "B"][1:]
    with pytest.raises(sim.ScheduleDeadlock):
        sim.simulate("1f1b", 2, 2, order=order)
    cyclic = sim.schedule_order("gpipe", 2, 2)
    cyclic[0] = [cyclic[0][2], cyclic[0][0], cyclic[0][1], cyclic[0][3]]  # B0 before F0 on stage 0
    with pytest.raises(sim.ScheduleDeadlock, match="waits forever|before its own forward"):
        sim.simulate("gpipe", 2, 2, order=cyclic)


def test_clear_errors():
    with pytest.raises(sim.ScheduleError, match="Schedule1F1B needs at least as many microbatches as stages"):
        sim.simulate("1f1b", 4, 3, engine="torch")
    with pytest.raises(sim.ScheduleError, match="Megatron-LM's interleaved schedule needs m to be a multiple of p"):
        sim.simulate("interleaved", 4, 3, 2, engine="megatron")
    with pytest.raises(sim.ScheduleError, match="Megatron-LM has no GPipe schedule"):
        sim.simulate("gpipe", 4, 8, engine="megatron")
    with pytest.raises(sim.ScheduleError, match="unknown engine"):
        sim.simulate("gpipe", 4, 8, engine="deepspeed")
    with pytest.raises(sim.ScheduleError, match="only applies to the interleaved"):
        sim.simulate("1f1b", 4, 8, 2)
    with pytest.raises(sim.ScheduleError, match="multiple of 2"):
        sim.simulate("interleaved", 4, 9, 2)
    with pytest.raises(sim.ScheduleError, match="unknown schedule"):
        sim.simulate("zigzag", 4, 8)
    with pytest.raises(sim.ScheduleError, match="positive integer"):
        sim.simulate("gpipe", 0, 8)
    assert sim.normalize_schedule("PipeDream-Flush") == "1f1b"


def test_large_pipeline_runs():
    tl = sim.simulate("1f1b", 64, 1024)
    assert tl.bubble_ratio == pytest.approx(63 / 1024)
    assert tl.peak_inflight[0] == 64


# ---- issue 27.8: what each engine accepts, against torch's own schedule classes

class _StandInStage:
    """What the constructors of torch's schedule classes read of a stage (its index, the pipeline's size,
    this rank and the number of stages): a schedule is built and checked here without a process group
    or a model. Anything else they read would raise AttributeError and fail the test, not pass as a
    refusal."""

    def __init__(self, index: int, p: int, n_stages: int):
        self.stage_index, self.group_size, self.group_rank, self.num_stages = index, p, 0, n_stages
        self.is_first, self.is_last = index == 0, index == n_stages - 1


def _torch_builds(schedules, schedule: str, p: int, m: int, v: int):
    """torch's own schedule object for (p, m, v), or None where its constructor refuses it."""
    try:
        if schedule == "interleaved":
            return schedules.ScheduleInterleaved1F1B([_StandInStage(c * p, p, p * v) for c in range(v)], m)
        cls = {"gpipe": schedules.ScheduleGPipe, "1f1b": schedules.Schedule1F1B}[schedule]
        return cls(_StandInStage(0, p, p), m)
    except ValueError:  # its own checks: "Number of microbatches ... must be", "requires ... rounds"
        return None


def _accepts(schedule, p, m, v, engine) -> bool:
    try:
        formulas.check_schedule(schedule, p, m, v, engine)
    except sim.ScheduleError:
        return False
    return True


def test_the_torch_engine_accepts_exactly_what_torchs_schedules_accept():
    """torch 2.13's ScheduleInterleaved1F1B runs m < p (its docstring's p = 4, m = 3) that distai
    refused, saying torch did: over p ≤ 8, m ≤ 24, v ≤ 4, distai's torch rule accepts what torch's own
    constructors accept, and where torch builds an interleaved schedule distai's order is its order."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    below_p = 0
    for p, m in itertools.product(range(1, 9), range(1, 25)):
        for schedule, v in [("gpipe", 1), ("1f1b", 1)] + [("interleaved", v) for v in (2, 3, 4)]:
            built = _torch_builds(schedules, schedule, p, m, v)
            assert _accepts(schedule, p, m, v, "torch") == (built is not None), (schedule, p, m, v)
            if built is None or schedule != "interleaved":
                continue
            below_p += m < p
            assert _accepts(schedule, p, m, v, "distai")  # distai runs torch's interleaved order
            ours = sim.schedule_order(schedule, p, m, v, engine="torch")
            for r in range(p):
                theirs = [("F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index, a.stage_index)
                          for a in built.pipeline_order[r] if a is not None]
                assert [(op.kind, op.mb, op.stage) for op in ours[r]] == theirs, (p, m, v, r)
    assert below_p == 3 * sum(range(1, 8))  # every m < p on p = 2..8, for v = 2, 3, 4
    assert _accepts("interleaved", 4, 3, 2, "torch") and not _accepts("1f1b", 4, 3, 1, "torch")


class _RecordingStage(_StandInStage):
    """A stand-in stage on which torch's single-stage schedules run their own step: it records each forward and
    backward they call, and has no messages to send or receive."""

    def __init__(self, index: int, p: int):
        super().__init__(index, p, p)
        self.ran: list[tuple[str, int, int]] = []

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.ran.append(("F", mb, self.stage_index))

    def backward_one_chunk(self, mb, *args, **kwargs):
        self.ran.append(("B", mb, self.stage_index))

    def get_fwd_recv_ops(self, mb): return []
    def get_fwd_send_ops(self, mb): return []
    def get_bwd_recv_ops(self, mb): return []
    def get_bwd_send_ops(self, mb): return []
    def perform_reduce_grad(self, *args): pass
    def release_fwd_send_outputs(self, *args, **kwargs): pass  # torch 2.15's schedules call it after a forward's sends


def test_gpipe_and_1f1b_run_in_the_order_torch_executes():
    """The audit: 1F1B's order was never checked against torch's. Each rank runs torch's own
    ScheduleGPipe / Schedule1F1B step (``_step_microbatches``) on a stage that records what it is asked to
    compute, and distai's order for that rank is the same forwards and backwards in the same sequence, over
    p <= 8, m <= 24. (torch's ``pipeline_order`` for Schedule1F1B, a description it does not execute,
    numbers the last rank's forwards from 1: it is not the reference.)"""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    compared = 0
    for p, m in itertools.product(range(1, 9), range(1, 25)):
        for schedule, cls in (("gpipe", schedules.ScheduleGPipe), ("1f1b", schedules.Schedule1F1B)):
            if _torch_builds(schedules, schedule, p, m, 1) is None:
                continue
            ours = sim.schedule_order(schedule, p, m, engine="torch")
            for r in range(p):
                stage = _RecordingStage(r, p)
                sched = cls(stage, m)
                for step_part in ("_initialize_stage", "_maybe_compute_loss", "_maybe_get_loss", "_update_losses"):
                    setattr(sched, step_part, lambda *args, **kwargs: None)  # the loss and the model are not in play
                sched._step_microbatches(arg_mbs=[()] * m, kwarg_mbs=[{}] * m)
                assert [(op.kind, op.mb, op.stage) for op in ours[r]] == stage.ran, (schedule, p, m, r)
                compared += 1
    assert compared == 2 * sum(p * (25 - p) for p in range(1, 9)) + sum(p * (p - 1) for p in range(1, 9))


def test_megatron_accepts_m_a_multiple_of_p_and_distai_every_engines_cases():
    """Megatron-LM (megatron/core/pipeline_parallel/schedules.py, default microbatch group p): the
    interleaved schedule raises unless p divides m, and, where its point-to-point sends block (before 2024,
    or --no-overlap-p2p-communication), on p <= 2 (validate_args); 1F1B takes any m; it has no GPipe.
    distai's own engine runs the union of what the two accept, and its plan for each cannot deadlock."""
    for p, m, v in itertools.product(range(1, 9), range(1, 25), (2, 3, 4)):
        assert _accepts("interleaved", p, m, v, "megatron") == (p > 1 and m % p == 0), (p, m, v)
        try:
            formulas.check_schedule("interleaved", p, m, v, "megatron", p2p_overlap=False)
            blocking = True
        except sim.ScheduleError:
            blocking = False
        assert blocking == (p > 2 and m % p == 0), (p, m, v)
    with pytest.raises(sim.ScheduleError, match="blocking point-to-point sends .* needs more than 2 stages"):
        formulas.check_schedule("interleaved", 2, 4, 2, "megatron", p2p_overlap=False)
        assert _accepts("1f1b", p, m, 1, "megatron") and not _accepts("gpipe", p, m, 1, "megatron")
        for schedule, w in (("gpipe", 1), ("1f1b", 1), ("interleaved", v)):
            if any(_accepts(schedule, p, m, w, e) for e in ("torch", "megatron")):
                assert _accepts(schedule, p, m, w, "distai"), (schedule, p, m, w)
    for p, m, v in ((4, 3, 2), (8, 5, 3), (3, 2, 4)):  # m < p: only torch's rule, and distai's, take them
        sim.check_comm_plan(sim.comm_plan(sim.simulate("interleaved", p, m, v)))
