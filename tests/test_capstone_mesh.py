"""Capstone: 3D parallelism (pp × dp × tp on one device mesh) equals one process, step by step.

One 8-rank gloo group; every mesh shape is built inside it with ``init_device_mesh``. For each
shape a tiny GPT is trained for two steps by :class:`distai.engine.mesh.MeshTrainer` and by the
same dense model on one process on the same batches: the loss and every parameter must agree
(float64: 1e-12 relative, float32: 1e-5), and the communication each group carried, measured
by intercepting every c10d call, must equal the lessons' formulas.
"""
from __future__ import annotations

import itertools
import os

import pytest

pytestmark = pytest.mark.timed  # its checks time the run: README's command runs these alone, last

torch = pytest.importorskip("torch")

from distai.engine import mesh as M  # noqa: E402
from distai.engine.mesh_args import check_plan, plan_run  # noqa: E402
from distai.engine.model import GPT, GPTConfig  # noqa: E402
from distai.engine.testing import run_in_group  # noqa: E402
from distai.lessons.checks import EQUAL_TO_ONE_PROCESS  # noqa: E402
from distai.lessons.model_size import ShapeError  # noqa: E402

CFG = dict(hidden=16, heads=4, vocab=32, layers=4, seq=8)
# (pp, dp, tp) — the mesh's own order; the (dp, tp, pp) = (2,2,2), (1,2,4), (4,1,2), (2,4,1)
# are the first four — schedule, chunks, zero, dtype, microbatches
CONFIGS = [
    ((2, 2, 2), "1f1b", 1, 0, "float64", 2),
    ((1, 2, 4), "1f1b", 1, 0, "float64", 2),
    ((4, 1, 2), "1f1b", 1, 0, "float64", 4),
    ((2, 4, 1), "1f1b", 1, 1, "float64", 2),
    ((2, 2, 2), "interleaved", 2, 1, "float32", 2),
]
TOLERANCE = EQUAL_TO_ONE_PROCESS  # the bound the run itself prints its verdict by


def _name(c) -> str:
    (pp, dp, tp), schedule, _v, zero, dtype, _m = c
    return f"dp{dp}-tp{tp}-pp{pp}-{schedule}-zero{zero}-{dtype}"


STEPS = 2


def train_all_shapes(rank: int, world: int) -> list[dict]:
    cfg = GPTConfig(**CFG, tie_embeddings=False)
    results = []
    for dims, schedule, chunks, zero, dtype_name, m in CONFIGS:
        dtype = getattr(torch, dtype_name)
        shape = M.MeshShape(*dims)
        mesh = M.build_mesh(shape)
        trainer = M.MeshTrainer(GPT(cfg, seed=3, dtype=dtype), mesh, microbatches=m, microbatch_size=1,
                                schedule=schedule, chunks=chunks, zero=zero, lr=0.1)
        dense = GPT(cfg, seed=3, dtype=dtype)
        opt = torch.optim.SGD(dense.parameters(), lr=0.1, momentum=0.9)
        meter = M.MeshCommMeter(mesh.groups)
        steps = []
        for step in range(STEPS):
            ids, tg = M.global_batch(cfg, shape, m, 1, step, seed=5)
            meter.reset()
            with meter:
                out = trainer.step(M.dp_share(ids, mesh.dp_rank, shape.dp), M.dp_share(tg, mesh.dp_rank, shape.dp))
            loss = trainer.global_loss(out)
            ref = M.dense_step(dense, opt, ids, tg)
            steps.append({"loss": loss, "ref": ref, "loss_rel": abs(loss - ref) / abs(ref),
                          "param_rel": M.max_relative_diff(trainer, dense), "account": meter.account()})
        expected = M.expected_comm(cfg, shape, mesh.pp_rank, microbatches=m, microbatch_size=1, schedule=schedule,
                                   chunks=chunks, zero=zero, elem_size=dtype.itemsize, backend="gloo")
        groups = {d: torch.distributed.get_process_group_ranks(mesh.groups[d]) for d in M.DIMS}
        results.append({"coords": dict(mesh.coords), "groups": groups, "steps": steps, "expected": expected,
                        "n_params": sum(p.numel() for p in trainer.named_parameters().values())})
    return results


@pytest.fixture(scope="module")
def runs():
    return run_in_group(train_all_shapes, 8, timeout_s=300)


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_name(c) for c in CONFIGS])
def test_every_step_equals_one_process(runs, index):
    dims, _schedule, _chunks, _zero, dtype, _m = CONFIGS[index]
    tol = TOLERANCE[dtype]
    for rank, per_rank in enumerate(runs):
        for step, s in enumerate(per_rank[index]["steps"]):
            assert s["loss_rel"] <= tol, (rank, step, s["loss"], s["ref"])
            assert s["param_rel"] <= tol, (rank, step, s["param_rel"])
    # the model really trained (the loss moved) and is really split: every rank holds a share
    losses = [s["loss"] for s in runs[0][index]["steps"]]
    assert losses[0] != losses[1]
    dense_params = sum(p.numel() for p in GPT(GPTConfig(**CFG, tie_embeddings=False)).parameters())
    assert sum(r[index]["n_params"] for r in runs) == dense_params * dims[1] + _replicated_by_tp(dims)


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_name(c) for c in CONFIGS])
def test_the_device_mesh_forms_the_lessons_groups(runs, index):
    """init_device_mesh's coordinates and groups are the capstone lesson's row-major (pp, dp, tp) model."""
    from distai.lessons.capstone.formulas import group_ranks, mesh_coords

    pp, dp, tp = CONFIGS[index][0]
    for rank, per_rank in enumerate(runs):
        run = per_rank[index]
        assert run["coords"] == mesh_coords(rank, pp, dp, tp)
        for dim in M.DIMS:
            assert run["groups"][dim] == group_ranks(rank, dim, pp, dp, tp)


def _replicated_by_tp(dims) -> int:
    """Parameters every TP rank holds whole (layer norms, row-parallel biases), counted (t−1)
    extra times per DP replica: the only duplication besides DP."""
    _pp, dp, tp = dims
    h, layers = CFG["hidden"], CFG["layers"]
    whole = layers * 6 * h + 2 * h
    return dp * (tp - 1) * whole


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_name(c) for c in CONFIGS])
def test_communication_per_group_equals_the_formulas(runs, index):
    dims = dict(zip(M.DIMS, CONFIGS[index][0]))
    for per_rank in runs:
        run = per_rank[index]
        for s in run["steps"]:
            assert M.compare_accounts(s["account"], run["expected"]) == {d: True for d in M.DIMS}, \
                (run["coords"], s["account"], run["expected"])
            for dim in M.DIMS:  # a group of one never talks; a real group always does
                assert (s["account"][dim]["calls"] > 0) == (dims[dim] > 1), (dim, s["account"][dim])
            assert s["account"]["dp"]["bytes"] == pytest.approx(run["expected"]["dp"]["bytes"], rel=1e-12)


def test_pipeline_messages_are_one_tp_shard_each():
    """With TP and SP, a stage boundary carries s/t·b·h numbers (Narayanan et al. 2021, Sec. 4.1)."""
    cfg = GPTConfig(**CFG, tie_embeddings=False)
    shape = M.MeshShape(2, 1, 2)
    acc = M.expected_comm(cfg, shape, 0, microbatches=3, microbatch_size=2, elem_size=4)
    sends = acc["pp"]["ops"]["send"]
    assert sends["calls"] == 3  # stage 0 sends one activation per microbatch, no gradient
    assert sends["bytes"] == 3 * (CFG["seq"] // 2) * 2 * CFG["hidden"] * 4
    assert acc["pp"]["ops"]["recv"]["calls"] == 3  # and receives one gradient per microbatch


@pytest.mark.parametrize("dims,world,layers,heads,error,message", [
    ((2, 2, 2), 4, 4, 4, M.MeshConfigError, "dp·tp·pp = 2·2·2 = 8 does not match the 4 ranks; run with --cpu 8 "
                                            "(or --gpus 8) or change the degrees"),
    ((1, 1, 8), 8, 4, 4, ShapeError, "tp = 8 does not divide the 4 attention heads"),
    ((3, 1, 1), 3, 4, 4, ShapeError, "4 layers do not split into pp = 3 equal stages; use a multiple of "
                                     "3 layers"),
])
def test_bad_meshes_are_refused_with_a_reason(dims, world, layers, heads, error, message):
    model = GPTConfig(hidden=16, heads=heads, ffn=64, vocab=48, seq=24, layers=layers, tie_embeddings=False)
    with pytest.raises(error) as refused:
        check_plan(M.MeshShape(*dims), world, model, microbatches=4, schedule="1f1b")
    assert str(refused.value) == message


def test_launch_ranks_follow_the_degrees_and_refuse_a_mismatch():
    from distai.engine.mesh_args import launch_ranks, plan_run

    assert launch_ranks(["--dp", "2", "--tp", "2", "--pp", "2"], None, 4, False) == 8
    assert launch_ranks(["--dp", "1", "--tp", "2", "--pp", "3"], 6, 8, False) == 6
    assert launch_ranks([], None, 8, False) == 8  # defaults: tp 2, pp 2, dp the rest
    assert plan_run([], 8, False).shape == M.MeshShape(pp=2, dp=2, tp=2)
    assert plan_run(["--tp", "4"], 8, False).shape == M.MeshShape(pp=2, dp=1, tp=4)
    for argv, ranks, needle in [
        (["--dp", "2", "--tp", "2", "--pp", "2"], 4, "does not match the 4 ranks"),
        (["--schedule", "zigzag"], 8, "unknown schedule"),
        (["--pp", "x"], 8, "invalid int value"),
        (["--schedule", "interleaved", "--chunks", "1"], 8, "needs --chunks >= 2"),
    ]:
        with pytest.raises(M.MeshConfigError, match=needle):
            launch_ranks(argv, ranks, 8, False)


@pytest.mark.parametrize("argv,needle", [
    (["--dp", "2", "--tp", "2", "--pp", "2", "--cpu", "4"], "dp·tp·pp = 2·2·2 = 8 does not match the 4 ranks"),
    (["--pp", "3", "--layers", "4", "--cpu", "6"], "4 layers do not split into pp = 3 equal stages"),
    (["--dp", "2", "--tp", "2", "--pp", "2", "--cp", "2", "--cpu", "8"],
     "dp·tp·pp·cp = 2·2·2·2 = 16 does not match the 8 ranks"),
    (["--dp", "2", "--tp", "1", "--pp", "2", "--cp", "2", "--ep", "3", "--moe"], "--ep 3 does not divide dp·cp"),
])
def test_distai_run_capstone_refuses_a_bad_mesh_before_launching(argv, needle, tmp_path):
    """One line, exit 2, no run folder, and torch never imported (the check runs in the CLI)."""
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom distai.tutor.cli import main\nrc = main(sys.argv[1:])\n"
            "print('RC', rc, 'TORCH', 'torch' in sys.modules)")
    env = dict(os.environ, DISTAI_HOME=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code, "run", "capstone", *argv], capture_output=True, text=True,
                         env=env, timeout=120)
    assert "RC 2 TORCH False" in res.stdout, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert not any(tmp_path.rglob("*capstone*"))


# the run `distai run capstone --cpu 8 --dp 2 --tp 2 --pp 2` makes (its CPU model's sizes), one step more
# six steps: four timed (the warm-up and the metered step left out); with two, one slow step moved the mean by 20 %
ARGV = ["--dp", "2", "--tp", "2", "--pp", "2", "--steps", "6"]


def run_experiment_main(rank: int, world: int, events_dir: str) -> int:
    import os

    os.environ["DISTAI_EVENTS_DIR"] = events_dir
    from distai.engine.experiments import capstone

    return capstone.main(ARGV)


def test_the_experiment_streams_its_check_and_its_communication_account(tmp_path):
    from distai.engine.events import read_events
    from run_checks import assert_summary_rerenders

    assert run_in_group(run_experiment_main, 8, str(tmp_path), timeout_s=300) == [0] * 8
    events = {r: list(read_events(tmp_path / f"rank{r}.jsonl")) for r in range(8)}
    # runs show, in Spanish (the ranks' printed lines reach this test's capture only when their group started
    # in it, so they are not compared here: lesson 7's test, whose harness keeps them, compares its own)
    assert_summary_rerenders(events[0], "capstone")
    kinds = [e["kind"] for e in events[0]]
    config = next(e for e in events[0] if e["kind"] == "mesh_config")
    assert (config["pp"], config["dp"], config["tp"]) == (2, 2, 2)
    assert sorted(tuple(c[1:4]) for c in config["ranks"]) == sorted(itertools.product((0, 1), repeat=3))
    assert all(c[4:] == [0, 0] for c in config["ranks"])  # cp and ep coordinates: 3D
    steps = [e for e in events[0] if e["kind"] == "step"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4, 5]
    assert all(s["loss_rel_diff"] <= 1e-12 and s["param_rel_diff"] <= 1e-12 for s in steps)
    comm = next(e for e in events[0] if e["kind"] == "mesh_comm")
    assert len(comm["ranks"]) == 8 and all(all(a["match"].values()) for a in comm["ranks"])
    assert comm["ranks"][0]["measured"]["tp"]["calls"] > 0 and comm["ranks"][0]["measured"]["dp"]["calls"] > 0
    summary = next(e for e in events[0] if e["kind"] == "summary")
    assert summary["comm_match"] and summary["max_param_rel_diff"] <= 1e-12 and summary["equal_to_one_process"] is True
    assert kinds.index("mesh_config") < kinds.index("step") < kinds.index("summary")
    for r in range(8):  # every rank streams its pipeline blocks and its step times
        assert any(e["kind"] == "pp_op" for e in events[r]) and any(e["kind"] == "mesh_step" for e in events[r])
    # the run's Chrome trace: valid, and the communication of each group that talked on a track of its own
    from distai.engine.trace_export import check_trace, chrome_trace

    trace = chrome_trace([e for r in range(8) for e in events[r]])
    assert check_trace(trace) == []
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    on: dict[str, set] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":  # "comm tp 2" is a second lane of "comm tp"
            on.setdefault(" ".join(threads[(e["pid"], e["tid"])].split(" ")[:2]), set()).add(e["name"].split(" ")[0])
    assert on["comm tp"] and on["comm tp"] <= {"all_reduce", "all_gather", "reduce_scatter"}  # TP+SP collectives
    assert on["comm pp"] and on["comm pp"] <= {"send", "recv", "wait"}  # the pipeline's point-to-point messages
    # the metered step drawn as compute, waits (in the collectives, for the last rank of their group; on
    # the pipeline's messages), the collectives and idle time, tiling the step on every rank (issue 28)
    from run_checks import assert_trace_decomposes

    check = next(e for e in events[0] if e["kind"] == "check" and e["name"] == "capstone_step_time")
    waited = assert_trace_decomposes([e for r in range(4) for e in events[r]], check, blocks=1)
    assert set(waited) == {0, 1, 2, 3} and all(w > 0 for w in waited.values())  # every stage waits for the other
    # the step time against the planner, from the rates the run's own ranks measured (no saved profile)
    from distai.lessons.checks import reconcile

    check = next(e for e in events[0] if e["kind"] == "check" and e["name"] == "capstone_step_time")
    timed = [s["step_time_s"] for s in steps if s["step"] not in (0, 1)]  # warm-up and metered steps left out
    assert check["measured"] == pytest.approx(sum(timed) / len(timed), rel=1e-12)
    assert check["predicted"] > 0 and check["detail"]["calibrated_before_run"] == 0
    from distai.engine.calibrate import profile_from_fields, run_comm, run_shape
    from distai.engine.mesh_args import plan_run
    from distai.lessons.capstone import calibrated as cal

    d = check["detail"]
    assert check["predicted"] == pytest.approx(sum(d[k] for k in cal.RUN_TERMS), rel=1e-9)
    # the prediction is the run's own model at the profile it recorded: every call the formulas
    # count (the meter matched them above), the last stage's head and loss, lesson 5's replay of
    # 1F1B, the ranks' CPU work over the cores they got
    plan = plan_run(ARGV, 8, cuda=False)
    run, (accounts, layers) = run_shape(plan), run_comm(plan)
    measured = {a["pp"]: a["measured"] for a in comm["ranks"]}
    assert [a["tp"]["calls"] for a in accounts] == [measured[stage]["tp"]["calls"] for stage in (0, 1)]
    rates, now = profile_from_fields(d, "rate_", 2), profile_from_fields(d, "now_", 2)
    assert check["predicted"] == pytest.approx(cal.predict_run(run, rates, accounts, layers)["step_time_s"], rel=1e-9)
    assert 0 < d["rate_cores"] <= os.cpu_count() and d["rate_cpus"] == os.cpu_count()
    # the ranks' CPU over the timed steps: at most the machine's cores for the step's span
    assert 0 < d["cpu_s_per_step"] <= os.cpu_count() * check["measured"] * 1.05 and d["runqueue_s_per_step"] >= 0
    # the check's arithmetic, whatever the timings: ok as its own rule says, and when it misses, causes
    # each measured on its own, each the model again with one input measured anew: the run's own CPU
    # seconds per step instead of the calibration's, then the cores other processes left the ranks
    # during the steps (no saved profile: nothing to be slower than since a calibration). Whether
    # they explain the step within 10 % is a timing claim, which bench/capstone_calibrate.py and
    # bench/gpu_check hold: 8 ranks on CI's 2 busy cores spread the step by ±20 % from run to run
    # (local runs: −21 % to +10 % before causes; CI missed once by 11.7 %). Here only a model off by
    # a factor fails: a term counted twice, or one left out.
    c = reconcile(check)
    assert c.ok == check["ok"] and 0.5 < c.explained_value / c.measured < 2.0, check
    assert 0 < d["cores_run"] <= os.cpu_count()
    if not c.ok:
        assert set(c.causes) == {"more_cpu_work", "cores_taken_by_others"}
        spent = dict(now, cpu_step_s=[d["cpu_step_s_run_0"], d["cpu_step_s_run_1"]])
        again = [cal.predict_run(run, p, accounts, layers)["step_time_s"]
                 for p in (now, spent, dict(spent, cores=d["cores_run"]))]
        assert c.causes["more_cpu_work"] == pytest.approx(again[1] - again[0], rel=1e-9, abs=1e-12)
        assert c.causes["cores_taken_by_others"] == pytest.approx(again[2] - again[1], rel=1e-9, abs=1e-12)
    print("capstone step time:", check)


def test_a_run_its_cpu_ranks_cannot_hold_is_refused_before_launching():
    """Every rank builds the whole model (and keeps it with gradients and momentum for the check): a shape
    whose copies exceed the machine's memory is one line at once, not ranks the kernel kills minutes later."""
    from distai.engine.mesh_args import MeshConfigError, check_host_memory

    plan = plan_run(["--layers", "8", "--hidden", "512", "--heads", "8"], 8, cuda=False)
    per_rank = plan.model.num_params() * 8 * 3  # float64: weights, gradients, momentum
    check_host_memory(plan, 8, have=8 * per_rank)  # just fits
    with pytest.raises(MeshConfigError) as refused:
        check_host_memory(plan, 8, have=8 * per_rank - 1)
    assert "each of the 8 ranks builds the whole model" in refused.value.text("en")
    assert "cada uno de los 8 ranks construye el modelo entero" in refused.value.text("es")
    unchecked = plan_run(["--layers", "8", "--hidden", "512", "--heads", "8", "--no-check"], 8, cuda=False)
    check_host_memory(unchecked, 8, have=8 * per_rank // 3)  # weights only without the check
    plan_run(["--layers", "80", "--hidden", "8192", "--heads", "64"], 8, cuda=True)  # a GPU's memory is not the host's
