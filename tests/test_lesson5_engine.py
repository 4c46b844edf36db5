"""Lesson 5 engine: a real pipeline over gloo processes (p = 2 and p = 4, one group each running
every check) executes the simulator's schedules with gradients equal to the unsplit model and to
torch.distributed.pipelining, holds the activations the formulas say, and fails clearly (not by
hanging) on microbatches in unequal rounds or shapes that do not chain. The p = 4 group ends by running the
lesson's experiment itself."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from distai.engine import pipeline as pl
from distai.engine.model import GPT, GPTConfig
from distai.engine.testing import run_in_group
from distai.lessons.lesson5 import formulas
from distai.lessons.lesson5 import simulator as sim

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))
MB = 2  # sequences per microbatch


def _error_of(fn):
    try:
        fn()
    except pl.PipelineConfigError as exc:
        return str(exc)
    return None


FEW = "interleaved, m = p - 1"  # issue 27.8: torch's ScheduleInterleaved1F1B runs m < p in one round


def _pipeline_checks(rank: int, p: int, events_dir: str | None) -> dict:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=64, hidden=32, heads=2, seq=16, layers=pl.default_layers(p, 2), tie_embeddings=False)
    out: dict = {}
    for key, schedule, v, m in [(s, s, v, 2 * p) for s, v in SCHEDULES] + [(FEW, "interleaved", 2, p - 1)]:
        ids, tg = pl.make_batch(cfg, m * MB)
        ref_loss, ref_model = pl.reference_grads(cfg, ids, tg)
        out.setdefault("ref_loss", ref_loss)
        out[f"ref_loss {key}"] = ref_loss
        ref_stages = pl.split_stages(ref_model, p * v)
        chunks = pl.build_rank_chunks(cfg, p, v, rank)
        runner = pl.PipelineRunner(chunks, rank=rank, p=p, m=m, schedule=schedule, v=v, microbatch_size=MB)
        res = runner.step(pl.microbatches(ids, m) if 0 in chunks else None,
                          pl.microbatches(tg, m) if p * v - 1 in chunks else None)
        ours = [q.grad.clone() for s in sorted(chunks) for q in chunks[s].parameters()]
        ref = [q.grad for s in sorted(chunks) for q in ref_stages[s].parameters()]
        # what each chunk's forward saved, and the peak the order implies with those sizes
        saved: dict[int, int] = {}
        for rec in res.records:
            if rec.op.kind == "F":
                saved[rec.op.chunk] = rec.saved_bytes
        held = expected = 0
        for op in runner.order:
            held += saved[op.chunk] if op.kind == "F" else -saved[op.chunk]
            expected = max(expected, held)
        entry = {
            "loss": res.loss,
            "max_diff_ref": max(float((a - b).abs().max()) for a, b in zip(ours, ref)),
            "allclose_ref": all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(ours, ref)),
            "order": [(r.op.kind, r.op.mb, r.op.stage) for r in res.records],
            "peak_bytes": res.peak_activation_bytes,
            "expected_peak_bytes": expected,
            "saved_per_chunk": saved,
            "timestamps_ordered": all(r.t0 <= r.t1 for r in res.records)
            and all(a.t1 <= b.t0 for a, b in zip(res.records, res.records[1:])),
        }
        if p == 4:  # the same stages under torch.distributed.pipelining
            from torch.distributed.pipelining import (
                PipelineStage,
                Schedule1F1B,
                ScheduleGPipe,
                ScheduleInterleaved1F1B,
            )
            tchunks = pl.build_rank_chunks(cfg, p, v, rank)
            stages = [PipelineStage(tchunks[c * p + rank], c * p + rank, p * v, torch.device("cpu"))
                      for c in range(v)]
            cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(schedule)
            sched = cls(stages[0], m, loss_fn=pl.loss_fn) if cls else ScheduleInterleaved1F1B(stages, m, loss_fn=pl.loss_fn)
            losses: list = []
            args = (ids,) if 0 in tchunks else ()
            kwargs = {"target": tg, "losses": losses} if p * v - 1 in tchunks else {}
            sched.step(*args, **kwargs)
            theirs = [q.grad for s in sorted(tchunks) for q in tchunks[s].parameters()]
            entry["max_diff_torch"] = max(float((a - b).abs().max()) for a, b in zip(ours, theirs))
            entry["torch_loss"] = float(sum(x.detach() for x in losses) / m) if losses else None
        out[key] = entry

    # errors that must stop every rank at once instead of hanging
    two = pl.build_rank_chunks(cfg, p, 2, rank)
    out["unequal_rounds"] = _error_of(lambda: pl.PipelineRunner(
        two, rank=rank, p=p, m=2 * p + 1, schedule="interleaved", v=2, microbatch_size=MB))
    chunks = pl.build_rank_chunks(cfg, p, 1, rank)
    if rank == 1:  # stage 1 built for a narrower model than stage 0 sends
        narrow = GPTConfig(vocab=64, hidden=24, heads=2, seq=16, layers=pl.default_layers(p, 2),
                           tie_embeddings=False)
        chunks = {1: pl.split_stages(GPT(narrow), p)[1]}
    runner = pl.PipelineRunner(chunks, rank=rank, p=p, m=m, schedule="1f1b", microbatch_size=MB)
    out["shape_mismatch"] = _error_of(runner.validate)
    dist.barrier()  # the group still works after the error: nobody is stuck in a receive

    if events_dir is not None:  # the lesson's experiment end to end, in this group
        from distai.engine.experiments import lesson5

        os.environ["DISTAI_EVENTS_DIR"] = events_dir
        out["experiment_rc"] = lesson5.main(["--steps", "2", "--hidden", "32", "--heads", "2", "--seq", "16",
                                             "--microbatch-size", "2"])
    return out


@pytest.fixture(scope="module")
def p2():
    return run_in_group(_pipeline_checks, 2, None, timeout_s=90)


@pytest.fixture(scope="module")
def p4(tmp_path_factory):
    events = tmp_path_factory.mktemp("lesson5_events")
    results = run_in_group(_pipeline_checks, 4, str(events), timeout_s=120)
    return results, events


def _all(results):
    return results[0] if isinstance(results, list) else results[0]


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_gradients_equal_the_unsplit_model(p2, p4, schedule, v):
    for results in (p2, p4[0]):
        for r in results:
            assert r[schedule]["allclose_ref"], r[schedule]["max_diff_ref"]
        last = results[-1]
        assert last[schedule]["loss"] == pytest.approx(last["ref_loss"], rel=1e-5)
        assert all(r[schedule]["loss"] is None for r in results[:-1])


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_gradients_equal_torch_pipelining(p4, schedule, v):
    results, _ = p4
    for r in results:
        assert r[schedule]["max_diff_torch"] < 1e-6
    assert results[-1][schedule]["torch_loss"] == pytest.approx(results[-1][schedule]["loss"], rel=1e-6)


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_ranks_run_the_simulators_order(p2, p4, schedule, v):
    for results, p in ((p2, 2), (p4[0], 4)):
        order = sim.schedule_order(schedule, p, 2 * p, v)
        for rank, r in enumerate(results):
            assert r[schedule]["order"] == [(op.kind, op.mb, op.stage) for op in order[rank]]
            assert r[schedule]["timestamps_ordered"]


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_activation_peak_matches_schedule_and_formula(p2, p4, schedule, v):
    for results, p in ((p2, 2), (p4[0], 4)):
        m = 2 * p
        for rank, r in enumerate(results):
            e = r[schedule]
            assert e["peak_bytes"] == pytest.approx(e["expected_peak_bytes"], rel=0.01)
            if rank < p - 1 and (schedule != "interleaved" or rank > 0):
                # middle stages save the same bytes per chunk: measured microbatches = the formula
                per_mb = sum(e["saved_per_chunk"].values())
                held = e["peak_bytes"] / per_mb
                if schedule == "gpipe":
                    assert held == pytest.approx(m, rel=0.01)
                elif schedule == "1f1b":
                    assert held == pytest.approx(min(p - rank, m), rel=0.01)
                else:
                    want = min(formulas.warmup_forwards("interleaved", p, m, rank, v) + 1, v * m) / v
                    assert held == pytest.approx(want, rel=0.01)
        gpipe0 = results[0]["gpipe"]["peak_bytes"]
        assert results[0]["1f1b"]["peak_bytes"] == pytest.approx(gpipe0 * p / m, rel=0.02)


def test_interleaved_runs_fewer_microbatches_than_stages_as_torch_does(p2, p4):
    """distai refused m < p for the interleaved schedule, saying torch did; torch runs it. With m = p − 1
    (p = 2 and p = 4, v = 2) the ranks run the simulator's order, and the gradients equal the unsplit
    model's and torch.distributed.pipelining's ScheduleInterleaved1F1B's."""
    for results, p in ((p2, 2), (p4[0], 4)):
        order = sim.schedule_order("interleaved", p, p - 1, 2, engine="torch")
        for rank, r in enumerate(results):
            assert r[FEW]["allclose_ref"], r[FEW]["max_diff_ref"]
            assert r[FEW]["order"] == [(op.kind, op.mb, op.stage) for op in order[rank]]
        assert results[-1][FEW]["loss"] == pytest.approx(results[-1][f"ref_loss {FEW}"], rel=1e-5)
    for r in p4[0]:
        assert r[FEW]["max_diff_torch"] < 1e-6


def test_unequal_rounds_are_a_clear_error(p2, p4):
    for results in (p2, p4[0]):
        for r in results:
            assert "rounds of equal size" in r["unequal_rounds"]


def test_shape_mismatch_is_a_clear_error_on_every_rank(p2, p4):
    for results in (p2, p4[0]):
        for r in results:
            msg = r["shape_mismatch"]
            assert msg is not None
            assert "stage 0 (rank 0) sends float32[16, 2, 32] but stage 1 (rank 1) expects float32[16, 2, 24]" in msg


def test_experiment_runs_and_reports(p4):
    results, events_dir = p4
    assert [r["experiment_rc"] for r in results] == [0, 0, 0, 0]
    events = {}
    for path in sorted(Path(events_dir).glob("rank*.jsonl")):
        events[path.name] = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(events) == 4
    m, v, steps = 8, 2, 2
    for name, evs in events.items():
        ops = [e for e in evs if e["kind"] == "pp_op"]
        # every F and B of every step of every schedule, timestamped
        assert len(ops) == steps * 2 * m * (1 + 1 + v)
        assert all(e["t0"] <= e["t1"] for e in ops)
    progress = [e for e in events["rank0.jsonl"] if e["kind"] == "progress"]
    assert progress[-1]["done"] == progress[-1]["total"] == 3 * steps * 2  # schedules × steps × (ours, torch)
    losses = [e for e in events["rank3.jsonl"] if e["kind"] == "step"]
    assert [e["schedule"] for e in losses] == [s for s in ("gpipe", "1f1b", "interleaved") for _ in range(steps)]
    summary = [e for e in events["rank0.jsonl"] if e["kind"] == "summary"]
    assert len(summary) == 1
    from run_checks import assert_summary_rerenders

    assert_summary_rerenders(events["rank0.jsonl"], "lesson5")  # runs show, in Spanish
    config = [e for e in events["rank0.jsonl"] if e["kind"] == "pp_config"][0]
    assert (config["p"], config["m"], config["v"]) == (4, m, v)
    for schedule, res in summary[0]["schedules"].items():
        assert res["max_grad_diff_vs_unsplit"] < 1e-6
        assert res["max_grad_diff_vs_torch"] < 1e-6
        assert res["loss"] == pytest.approx(res["torch_loss"], rel=1e-5)
        assert res["bubble_formula"] == pytest.approx(formulas.bubble_fraction(4, m, v if schedule == "interleaved" else 1))
        # the schedule replayed with the mean measured F and B: its step (m + p − 1)(F + B) for GPipe and 1F1B
        if schedule != "interleaved":
            assert res["step_time_simulated_s"] == pytest.approx((m + 4 - 1) * (res["t_f_s"] + res["t_b_s"]))
        assert "bubble_simulated_with_measured_costs" not in res  # that was the formula again, by construction
        assert 0 < res["bubble_measured"] < 1
        for stage in res["stages"]:
            assert stage["peak_bytes"] == pytest.approx(stage["peak_expected_bytes"], rel=0.01)
            # torch.distributed.pipelining holds at its peak exactly what we hold, plus, on its first stage
            # only, the graph of the forward its PipelineStage ran to infer shapes, still alive after the step
            # (exact from the second step on: on the first, that graph and microbatch 0's share the token ids)
            assert stage["torch_peak_bytes"] - stage["torch_kept_bytes"] == stage["peak_bytes"], (schedule, stage)
            assert stage["torch_kept_bytes"] == 0 or stage["rank"] == 0, (schedule, stage)


def test_experiment_exports_a_chrome_trace_in_the_schedules_order(p4):
    """The run's events as a Chrome trace keep the Trace Event format's rules, and each rank's
    forward/backward blocks appear on its compute track in the order the simulator schedules them,
    with the sends, receives and waits on its comm track."""
    from distai.engine.events import read_events
    from distai.engine.trace_export import check_trace, chrome_trace, trace_pid

    results, events_dir = p4
    events = [e for path in sorted(Path(events_dir).glob("rank*.jsonl")) for e in read_events(path)]
    trace = json.loads(json.dumps(chrome_trace(events)))  # as a viewer reads the file
    assert check_trace(trace) == []
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] in ("process_name", "thread_name")}
    assert {names[(trace_pid(r), 0)] for r in range(4)} == {f"rank {r}" for r in range(4)}
    m, v = 8, 2
    for schedule, chunks in SCHEDULES:
        order = sim.schedule_order(schedule, 4, m, v if schedule == "interleaved" else 1)
        for rank in range(4):
            ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == trace_pid(rank) and e["cat"] == "pp"
                   and e["args"]["schedule"] == schedule and e["args"]["step"] == 0]
            assert {names[(trace_pid(rank), e["tid"])] for e in ops} == {"compute"}
            got = [(e["args"]["op"], e["args"]["mb"], e["args"]["stage"]) for e in sorted(ops, key=lambda e: e["ts"])]
            assert got == [(op.kind, op.mb, op.stage) for op in order[rank]]
            comm = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == trace_pid(rank)
                    and names[(trace_pid(rank), e["tid"])].startswith("comm") and e["args"].get("schedule") == schedule
                    and e["args"].get("step") == 0]
            sends = sum(e["name"].count("send ") for e in comm)
            # every activation leaves its stage once, every gradient once, except at the ends of the pipeline
            assert sends == sum(1 for op in order[rank] if not (op.kind == "F" and op.stage == 4 * chunks - 1)
                                and not (op.kind == "B" and op.stage == 0))
            assert any(e["name"].startswith("wait recv") for e in comm)
