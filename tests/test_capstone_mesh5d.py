"""Capstone on five axes: pp × dp × cp × tp with EP inside dp·cp equals one process, step by step.

One 8-rank gloo group; every mesh is built inside it (``init_device_mesh`` over (pp, dp, cp, tp),
the experts' (pp, edp, ep, tp) view over the same ranks). For each configuration the one GPT
(its MLPs made experts for the MoE ones) is trained for two steps by
:class:`distai.engine.mesh.MeshTrainer` and on one process on the same batches: the loss and every
parameter agree after every step (float64: 1e-12 relative, float32: 1e-5), and every group's
calls and bytes, measured by intercepting every c10d call, equal the lessons' formulas exactly.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

torch = pytest.importorskip("torch")

from distai.engine import mesh as M  # noqa: E402
from distai.engine.model import GPT, GPTConfig  # noqa: E402
from distai.engine.moe import MoEConfig, make_moe  # noqa: E402
from distai.engine.testing import run_in_group  # noqa: E402
from distai.lessons.checks import EQUAL_TO_ONE_PROCESS  # noqa: E402

CFG = dict(hidden=16, heads=4, vocab=32, layers=4, seq=8)
MOE = MoEConfig(experts=4, top_k=2, aux_alpha=0.0)
# (dp, tp, pp, cp, ep), experts: the five on 8 ranks
FIVE = [((2, 2, 2, 1, 1), False), ((1, 2, 2, 2, 1), False), ((2, 1, 2, 2, 1), False), ((4, 1, 2, 1, 4), True),
        ((2, 2, 1, 2, 2), True)]
# … each in float64 and in float32; ZeRO-1 (dense only) on two of them
ZERO = {((2, 1, 2, 2, 1), "float32"), ((2, 2, 2, 1, 1), "float64")}
CONFIGS = [(dims, moe, int((dims, dtype) in ZERO), dtype) for dtype in ("float64", "float32") for dims, moe in FIVE]
TOLERANCE = EQUAL_TO_ONE_PROCESS  # the bound the run itself prints its verdict by
STEPS, M_MICRO = 2, 2


def _name(c) -> str:
    (dp, tp, pp, cp, ep), moe, zero, dtype = c
    return f"dp{dp}-tp{tp}-pp{pp}-cp{cp}-ep{ep}" + ("-moe" if moe else "") + f"-zero{zero}-{dtype}"


def _shape(c) -> M.MeshShape:
    (dp, tp, pp, cp, ep), moe, _zero, _dtype = c
    return M.MeshShape(pp, dp, tp, cp, ep, moe)


def _model(moe: bool, dtype):
    model = GPT(GPTConfig(**CFG, tie_embeddings=False), seed=3, dtype=dtype)
    return make_moe(model, MOE, seed=3) if moe else model


def train_all_meshes(rank: int, world: int) -> list[dict]:
    results = []
    for c in CONFIGS:
        _dims, moe, zero, dtype_name = c
        dtype, shape = getattr(torch, dtype_name), _shape(c)
        mesh = M.build_mesh(shape)
        trainer = M.MeshTrainer(_model(moe, dtype), mesh, microbatches=M_MICRO, microbatch_size=1, zero=zero, lr=0.1)
        dense = _model(moe, dtype)
        opt = torch.optim.SGD(dense.parameters(), lr=0.1, momentum=0.9)
        meter = M.MeshCommMeter(mesh.groups)
        steps = []
        for step in range(STEPS):
            ids, tg = M.global_batch(dense.cfg, shape, M_MICRO, 1, step, seed=5)
            meter.reset()
            with meter:
                out = trainer.step(M.dp_share(ids, mesh.dp_rank, shape.dp), M.dp_share(tg, mesh.dp_rank, shape.dp))
            loss = trainer.global_loss(out)
            ref = M.dense_step(dense, opt, ids, tg)
            expected = M.expected_comm(dense.cfg, shape, mesh.pp_rank, microbatches=M_MICRO, microbatch_size=1,
                                       zero=zero, elem_size=dtype.itemsize, backend="gloo",
                                       moe=MOE if moe else None, routed_rows=trainer.routed_rows)
            steps.append({"loss": loss, "ref": ref, "loss_rel": abs(loss - ref) / abs(ref),
                          "param_rel": M.max_relative_diff(trainer, dense), "account": meter.account(),
                          "expected": expected})
        groups = {d: torch.distributed.get_process_group_ranks(g) for d, g in mesh.groups.items()}
        results.append({"coords": dict(mesh.coords), "groups": groups, "steps": steps,
                        "names": sorted(trainer.named_parameters())})
    return results


@pytest.fixture(scope="module")
def runs():
    return run_in_group(train_all_meshes, 8, timeout_s=600)


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_name(c) for c in CONFIGS])
def test_every_step_equals_one_process(runs, index):
    tol = TOLERANCE[CONFIGS[index][3]]
    for rank, per_rank in enumerate(runs):
        for step, s in enumerate(per_rank[index]["steps"]):
            assert s["loss_rel"] <= tol, (rank, step, s["loss"], s["ref"])
            assert s["param_rel"] <= tol, (rank, step, s["param_rel"])
    losses = [s["loss"] for s in runs[0][index]["steps"]]
    assert losses[0] != losses[1]  # it trained
    # every parameter of the one model is held by some rank (experts: each by exactly its EP rank)
    dense = {n for n, _ in _model(CONFIGS[index][1], torch.float64).named_parameters()}
    assert set().union(*(set(r[index]["names"]) for r in runs)) == dense


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_name(c) for c in CONFIGS])
def test_communication_per_group_equals_the_formulas(runs, index):
    shape = _shape(CONFIGS[index])
    sizes = {"pp": shape.pp, "dp": shape.replicas, "tp": shape.tp, "cp": shape.cp, "ep": shape.ep,
             "edp": shape.replicas // shape.ep, "moe": shape.replicas * shape.tp}
    for per_rank in runs:
        run = per_rank[index]
        for s in run["steps"]:
            assert M.compare_accounts(s["account"], s["expected"]) == {d: True for d in shape.groups(every=True)}, \
                (run["coords"], s["account"], s["expected"])
            for dim in shape.groups(every=True):  # a group of one never talks; a real group always does
                assert (s["account"][dim]["calls"] > 0) == (sizes[dim] > 1), (dim, s["account"][dim])
                assert s["account"][dim]["bytes"] == pytest.approx(s["expected"][dim]["bytes"], rel=1e-12)
            assert s["account"].get("other", {"calls": 0})["calls"] == 0


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_name(c) for c in CONFIGS])
def test_groups_are_the_five_axes_with_ep_inside_dp_cp(runs, index):
    """The device mesh's coordinates and groups are the lesson's Layout (what the visualizer draws):
    rank = ((p·dp + d)·cp + c)·tp + t; the gradient group every (d, c) of a (p, t); an EP group ep
    consecutive ones of those in (d, c) order; edp the same place in each EP group."""
    from distai.lessons.capstone.mesh_run import Layout

    shape = _shape(CONFIGS[index])
    layout = Layout(shape.pp, shape.dp, shape.tp, shape.cp, shape.ep, shape.moe)
    for rank, per_rank in enumerate(runs):
        run = per_rank[index]
        want = layout.coords(rank)
        assert run["coords"] == {d: want[d] for d in run["coords"]}
        assert set(run["groups"]) == set(shape.groups(every=True))
        for dim, ranks in run["groups"].items():
            assert ranks == layout.group(rank, dim), dim
        if shape.moe:
            assert run["groups"]["ep"] == run["groups"]["dp"][want["edp"] * shape.ep:][:shape.ep]


@pytest.mark.parametrize("argv,ranks,needle", [
    (["--dp", "2", "--tp", "2", "--pp", "2", "--cp", "2"], 8, "dp·tp·pp·cp = 2·2·2·2 = 16 does not match the 8 ranks"),
    (["--dp", "2", "--tp", "1", "--pp", "2", "--cp", "2", "--ep", "2"], 8, "--ep 2 shards experts: add --moe"),
    (["--dp", "2", "--tp", "1", "--pp", "2", "--cp", "2", "--ep", "3", "--moe"], 8,
     "--ep 3 does not divide dp·cp = 2·2 = 4"),
    (["--dp", "2", "--pp", "2", "--cp", "2", "--ep", "4", "--moe", "--experts", "6"], 8,
     "ep = 4 does not divide the 6 experts"),
    (["--dp", "2", "--pp", "2", "--cp", "2", "--tp", "1", "--seq", "10"], 8, "2·cp = 4 to divide the sequence length 10"),
    (["--dp", "2", "--pp", "2", "--cp", "2", "--tp", "1", "--moe", "--zero", "1"], 8, "with --moe use --zero 0"),
])
def test_bad_five_dimensional_meshes_are_refused_in_one_line(argv, ranks, needle):
    from distai.engine.mesh_args import launch_ranks
    from distai.lessons.model_size import ShapeError

    with pytest.raises((M.MeshConfigError, ShapeError)) as refused:
        launch_ranks(argv, ranks, 8, False)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_launch_ranks_count_the_context_parallel_axis():
    from distai.engine.mesh_args import launch_ranks, plan_run

    argv = ["--dp", "2", "--tp", "2", "--pp", "1", "--cp", "2", "--ep", "2", "--moe"]
    assert launch_ranks(argv, None, 4, False) == 8
    assert plan_run(argv, 8, False).shape == M.MeshShape(pp=1, dp=2, tp=2, cp=2, ep=2, moe=True)


def run_five_axes_experiment(rank: int, world: int, events_dir: str) -> int:
    import os

    os.environ["DISTAI_EVENTS_DIR"] = events_dir
    from distai.engine.experiments import capstone

    return capstone.main(["--dp", "2", "--tp", "2", "--pp", "1", "--cp", "2", "--ep", "2", "--moe", "--experts", "4",
                          "--top-k", "2", "--steps", "2", "--layers", "2", "--seq", "8", "--hidden", "16",
                          "--vocab", "32", "--microbatches", "1", "--microbatch-size", "1"])


def test_distai_run_capstone_trains_on_five_axes(tmp_path):
    """The experiment itself (what `distai run capstone --cpu 8 --dp 2 --tp 2 --pp 1 --cp 2 --ep 2 --moe`
    launches): rank 0 streams the mesh with every rank's five coordinates, each step against one
    process, and every group's account against the formulas."""
    from distai.engine.events import read_events

    assert run_in_group(run_five_axes_experiment, 8, str(tmp_path), timeout_s=300) == [0] * 8
    events = list(read_events(tmp_path / "rank0.jsonl"))
    config = next(e for e in events if e["kind"] == "mesh_config")
    assert (config["cp"], config["ep"], config["experts"], config["top_k"]) == (2, 2, 4, 2)
    assert sorted(tuple(c[1:]) for c in config["ranks"]) == sorted(
        (0, d, t, c, (d * 2 + c) % 2) for d in range(2) for c in range(2) for t in range(2))
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 2 and all(s["loss_rel_diff"] <= 1e-12 and s["param_rel_diff"] <= 1e-12 for s in steps)
    comm = next(e for e in events if e["kind"] == "mesh_comm")
    assert all(all(a["match"].values()) and set(a["match"]) == {"pp", "dp", "tp", "cp", "ep", "edp", "moe"}
               for a in comm["ranks"])
    summary = next(e for e in events if e["kind"] == "summary")
    assert summary["comm_match"] and summary["config"]["cp"] == 2 and summary["equal_to_one_process"] is True
    # the trace: the ring's hops of the metered step on a CP track of their own (they are point-to-point: no
    # collective's span drew them), one per ring step that sends, in a trace the viewers take
    from distai.engine.trace_export import check_trace, chrome_trace, trace_pid

    every = [e for r in range(8) for e in read_events(tmp_path / f"rank{r}.jsonl")]
    trace = chrome_trace(every)
    assert check_trace(trace) == []
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    hops = [e for e in trace["traceEvents"] if e["ph"] == "X" and threads[(e["pid"], e["tid"])] == "comm cp"]
    assert {e["pid"] for e in hops} == {trace_pid(r) for r in range(8)} and all(e["name"].startswith("cp ") for e in hops)
    cp_bytes = {a["rank"]: a["measured"]["cp"]["bytes"] for a in comm["ranks"]}
    for rank in range(8):  # what the hops carried is what the meter counted on the CP group
        assert sum(e["args"]["bytes"] for e in hops if e["pid"] == trace_pid(rank)) == cp_bytes[rank]
