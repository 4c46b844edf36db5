"""``distai calc plan --calibrate``: this machine's rates at the capstone run's sizes, and the planner's
step time for that run from them (lessons/capstone/calibrated.py, engine/calibrate.py)."""
import json
import math

import pytest

from distai.lessons.capstone import calibrated as cal
from distai.lessons.capstone import planner as pl
from distai.lessons.lesson1.formulas import ring_allgather_time, ring_allreduce_time
from distai.tutor.cli import main

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

RUN = cal.RunShape(dp=2, tp=2, pp=2, cp=1, ep=1, layers=4, hidden=32, heads=4, kv_heads=4, seq=16, vocab=64, ffn=128,
                   micro_batch=2, microbatches=4)
PROFILE = {"gemm_flops": 2e8, "elementwise_bytes_per_s": 1e7, "alpha_s": 1e-3, "beta_s_per_byte": 1e-9}


def test_the_gemms_timed_are_the_gemms_the_planner_counts():
    """Σ 2·m·k·n over the timed shapes is the 12·h²/t of a layer's weights; the planner's count of a
    layer's parameters adds only the biases and LayerNorms (under 4 % here)."""
    flops = sum(2 * m * k * n for m, k, n in cal.gemm_shapes(RUN))
    assert flops == 2 * RUN.tokens * 12 * RUN.hidden ** 2 / RUN.tp
    planner = 2 * RUN.tokens * cal.model_spec(RUN).active_layer_params / RUN.tp
    assert flops < planner < 1.04 * flops


def test_the_prediction_is_the_planners_own_model():
    """The planner's evaluate() on this machine as a cluster; its terms add up; a slower link or a
    slower matmul each move only their own terms."""
    p = cal.predict(RUN, PROFILE)
    assert p["step_time_s"] == pytest.approx(sum(p[k] for k in cal.TERMS), rel=1e-12)
    c = pl.evaluate(cal.model_spec(RUN), cal.cluster(RUN, PROFILE), 2 * 4 * 2,
                    pl.Config(2, 2, 2, 2, 0, "none", 1, True), optimizer="sgd")
    assert c.step_time_s == p["step_time_s"] and p["microbatches"] == 4
    slow_link = cal.predict(RUN, dict(PROFILE, alpha_s=2e-3))
    assert slow_link["compute_s"] == p["compute_s"] and slow_link["tp_comm_s"] > 1.9 * p["tp_comm_s"]
    slow_gemm = cal.predict(RUN, dict(PROFILE, gemm_flops=1e8))
    assert slow_gemm["tp_comm_s"] == p["tp_comm_s"] and slow_gemm["compute_s"] > p["compute_s"]
    # lesson 4: with sequence parallelism, 2 all-gathers and 2 reduce-scatters per layer and direction,
    # for the stage's 2 layers and the 4 microbatches
    assert cal.planner_tp_calls(RUN) == {"all_gather": 2 * 2 * 2 * 4, "reduce_scatter": 2 * 2 * 2 * 4}


def test_the_runs_interleaved_schedule_on_two_stages_is_predicted():
    """The run's own pipeline engine runs interleaved on pp = 2 (Megatron-LM refuses it): the prediction
    follows the run's rule; it failed the run after its steps had trained and checked."""
    import dataclasses

    two_chunks = cal.predict(dataclasses.replace(RUN, chunks=2), PROFILE)
    assert two_chunks["step_time_s"] > 0 and two_chunks["bubble_s"] < cal.predict(RUN, PROFILE)["bubble_s"]


def _expected(run):
    """Every pipeline rank's calls from the formulas the run's meter checks exactly, and its layers."""
    from distai.engine.calibrate import run_comm
    from distai.engine.mesh_args import plan_run

    argv = [f"--{k}={getattr(run, k)}" for k in ("dp", "tp", "pp")] + (["--cp", str(run.cp)] if run.cp > 1 else [])
    argv += ["--layers", str(run.layers), "--hidden", str(run.hidden), "--heads", str(run.heads), "--seq",
             str(run.seq), "--vocab", str(run.vocab), "--microbatches", str(run.microbatches),
             "--microbatch-size", str(run.micro_batch), "--dtype", "float32"]
    return run_comm(plan_run(argv, run.world, cuda=False))


def test_every_call_the_run_makes_is_priced_at_its_ring_time():
    """account_s prices the formulas' count: an all-reduce at lesson 1's ring time for the bytes it
    sent, an all-gather likewise, a send one message α + S·β, a receive nothing (its send is priced)."""
    a, b = PROFILE["alpha_s"], PROFILE["beta_s_per_byte"]
    account = {"tp": {"ops": {"all_reduce": {"calls": 3, "bytes": 3 * 64.0},
                              "all_gather": {"calls": 2, "bytes": 2 * 512.0}}},
               "pp": {"ops": {"send": {"calls": 4, "bytes": 4 * 256.0}, "recv": {"calls": 4, "bytes": 0.0}}}}
    priced = cal.account_s(RUN, PROFILE, account)
    assert priced["tp"] == pytest.approx(3 * ring_allreduce_time(64.0, 2, a, b)
                                         + 2 * ring_allgather_time(1024.0, 2, a, b), rel=1e-12)
    assert priced["pp"] == pytest.approx(4 * (a + 256.0 * b), rel=1e-12)


def test_the_run_model_uses_the_runs_calls_and_its_unequal_stages():
    """predict_run: every TP call of the formulas (the embedding's, the head's, the loss's all-reduces:
    more than the planner counts), the last stage slower than the first by its head and loss, the
    1F1B bubble lesson 5's replay gives for these two stages (the first stage's slot: it fills the
    pipe and drains it), and its terms adding up to the step."""
    accounts, layers = _expected(RUN)
    assert layers == [2, 2] and accounts[1]["tp"]["calls"] > accounts[0]["tp"]["calls"]
    assert accounts[1]["tp"]["calls"] > sum(cal.planner_tp_calls(RUN).values())
    p = cal.predict_run(RUN, PROFILE, accounts, layers)
    assert p["step_time_s"] == pytest.approx(sum(p[k] for k in cal.TERMS), rel=1e-12)
    first, last = cal.ends_s(RUN, PROFILE)
    assert last > first > 0
    priced = [cal.account_s(RUN, PROFILE, acc) for acc in accounts]
    slot = [layers[i] * cal.layer_s(RUN, PROFILE) + (priced[i]["tp"]) / 4 for i in range(2)]
    slot[0], slot[1] = slot[0] + first, slot[1] + last
    assert p["compute_s"] + p["tp_comm_s"] == pytest.approx(4 * slot[1], rel=1e-12)
    assert p["bubble_s"] == pytest.approx(slot[0], rel=1e-9)
    assert p["tp_comm_s"] == pytest.approx(priced[1]["tp"], rel=1e-12)
    assert p["dp_comm_exposed_s"] == max(c["dp"] for c in priced) > 0
    slow_link = cal.predict_run(RUN, dict(PROFILE, alpha_s=2e-3), accounts, layers)
    assert slow_link["compute_s"] == p["compute_s"] and slow_link["tp_comm_s"] > 1.9 * p["tp_comm_s"]
    # one stage: no bubble and no sends, never a rounding's -7e-18 s (`calc plan --calibrate --pp 1` printed it)
    import dataclasses

    for dp in (1, 2, 4):
        one = dataclasses.replace(RUN, dp=dp, tp=1, pp=1)
        q = cal.predict_run(one, PROFILE, *_expected(one))
        assert q["bubble_s"] == 0.0 and q["pp_comm_s"] == 0.0


CPU = {"cpu_step_s": [0.05, 0.06], "cpu_forward_s": [0.002, 0.003], "cpu_backward_s": [0.004, 0.004], "cores": 2.0}


def test_ranks_sharing_fewer_cores_take_at_most_grahams_bound():
    """The 8 ranks' CPU seconds over the 2 cores they get, W/P = 4·(50 + 60 ms)/2, plus half the
    critical path (1 − 1/P): 1F1B of these blocks, worked by hand (stage 0: F 2, B 4 ms; stage 1:
    F 3, B 4 ms; the last B ends at 34 ms), and the most a stage spends outside its blocks
    (60 − 4·7 = 32 ms). On one core, or less, the work alone over the cores."""
    assert cal.cores_bound_s(RUN, CPU) == pytest.approx(0.22 + 0.5 * (0.034 + 0.032), rel=1e-9)
    assert cal.cores_bound_s(RUN, dict(CPU, cores=1.0)) == pytest.approx(0.44, rel=1e-9)
    assert cal.cores_bound_s(RUN, dict(CPU, cores=0.5)) == pytest.approx(0.88, rel=1e-9)
    assert cal.cores_bound_s(RUN, PROFILE) == 0.0  # a profile without CPU costs


def test_with_more_ranks_than_cores_the_cores_set_the_step():
    """8 ranks on 2 CPUs: the step is the cores' bound, the α-β critical path's terms plus cores_s
    (what the bound adds to them, of either sign); with a core per rank the critical path alone."""
    accounts, layers = _expected(RUN)
    critical = cal.predict_run(RUN, PROFILE, accounts, layers)
    assert critical["cores_s"] == 0.0
    for cores in (0.5, 2.0):
        p = cal.predict_run(RUN, dict(PROFILE, cpus=2, **dict(CPU, cores=cores)), accounts, layers)
        bound = cal.cores_bound_s(RUN, dict(CPU, cores=cores))
        assert p["step_time_s"] == pytest.approx(bound, rel=1e-12)
        assert p["step_time_s"] == pytest.approx(sum(p[k] for k in cal.RUN_TERMS), rel=1e-12)
        assert p["cores_s"] == pytest.approx(bound - critical["step_time_s"], rel=1e-9)
        assert p["compute_s"] == critical["compute_s"] and p["tp_comm_s"] == critical["tp_comm_s"]
    whole = cal.predict_run(RUN, dict(PROFILE, cpus=8, **CPU), accounts, layers)
    assert whole["step_time_s"] == critical["step_time_s"] and whole["cores_s"] == 0.0


def test_ring_attention_is_priced_by_its_hops():
    """With cp 2 the CP group's calls are the ring's K/V hops (the context lesson's count), each one
    message at α + S·β."""
    run = cal.RunShape(**dict(RUN.as_dict(), dp=1, cp=2))
    accounts, layers = _expected(run)
    sends = accounts[0]["cp"]["ops"]["send"]
    p = cal.predict_run(run, PROFILE, accounts, layers)
    one = PROFILE["alpha_s"] + sends["bytes"] / sends["calls"] * PROFILE["beta_s_per_byte"]
    assert p["cp_comm_s"] == pytest.approx(sends["calls"] * one, rel=1e-12) and sends["calls"] > 0


def _calc(capsys, *argv):
    code = main(["calc", "plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_calc_plan_calibrate_measures_saves_and_reuses_the_profile(capsys, tmp_path, monkeypatch):
    """A real measurement on 2 processes (tp 2): positive rates, saved under $DISTAI_HOME, the
    prediction from them; a second call within the hour reuses the profile instead of measuring."""
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    code, out, err = _calc(capsys, "--calibrate", "--dp", "1", "--tp", "2", "--pp", "1", "--json")
    assert code == 0, err
    r = json.loads(out)
    saved = json.loads((tmp_path / "machine_profile.json").read_text())
    assert saved["run"] == r["run"] and (r["run"]["tp"], r["run"]["pp"], r["run"]["dp"]) == (2, 1, 1)
    for key in ("gemm_flops", "elementwise_bytes_per_s", "alpha_s", "layer_s", "first_s", "last_s"):
        assert math.isfinite(saved[key]) and saved[key] > 0, key
    # one stage: its ranks' CPU per step of the run's own step, more than its blocks'; the cores they got
    assert len(saved["cpu_step_s"]) == 1 and saved["cpu_step_s"][0] > 4 * saved["cpu_forward_s"][0] > 0
    assert 0 < saved["cores"] <= saved["cpus"]
    assert r["planner"] == pytest.approx(cal.predict(cal.RunShape(**r["run"]), saved), rel=1e-12)
    p = r["prediction"]
    assert p["step_time_s"] == pytest.approx(sum(p[k] for k in cal.TERMS), rel=1e-12) and p["tp_comm_s"] > 0
    code, out, err = _calc(capsys, "--calibrate", "--dp", "1", "--tp", "2", "--pp", "1")
    assert code == 0, err
    assert json.loads((tmp_path / "machine_profile.json").read_text())["measured_at"] == saved["measured_at"]
    assert "predicted step time" in out and "distai run capstone --cpu 2 --dp 1 --tp 2 --pp 1" in out


def test_calc_plan_calibrate_failing_ranks_are_one_line(capsys, tmp_path, monkeypatch):
    """The calibration's ranks (torchrun's) failing: one line naming it, exit 2, nothing saved."""
    import sys

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "executable", "/bin/false")  # torchrun cannot start: exit 1, no rank reports
    code, out, err = _calc(capsys, "--calibrate", "--dp", "1", "--tp", "2", "--pp", "1")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "the calibration's ranks failed: exit 1" in lines[0], err
    assert not (tmp_path / "machine_profile.json").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--calibrate", "--tp", "3"], "the capstone run cannot take this"),
    (["--gpus", "8"], "--params, --layers, --hidden, --heads, --seq, --global-batch, --gpu-memory needed"),
    # the help listed --kv-heads, which the run (one K/V head per query head) refused as an unknown option
    (["--calibrate", "--heads", "4", "--kv-heads", "2"], "the capstone run has one K/V head per query head (4)"),
    # a 70B shape ran its ranks 85 s into the kernel's OOM killer, then said "ranks failed: ====="
    (["--calibrate", "--layers", "80", "--hidden", "8192", "--heads", "64"], "more than this machine's"),
    # a cluster's figures beside --calibrate were dropped without a word (it predicts this machine's run)
    (["--calibrate", "--params", "7B", "--gpus", "64", "--gpu-memory", "80GB"],
     "--params, --gpus, --gpu-memory: --calibrate predicts the capstone run on this machine"),
])
def test_calc_plan_refusals_are_one_line(capsys, argv, needle):
    """A run the capstone refuses (before measuring anything), or a plan without its sizes: one line, exit 2."""
    code, out, err = _calc(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err


def test_the_run_updates_its_parameters_at_the_memory_bound_rate():
    """The run's SGD with momentum (MeshTrainer, no clipping, no master copy: its 8-byte parameters are
    their own) reads the gradient, reads and writes the momentum and the parameter: 5 elements of 8 bytes
    per parameter of the pipeline rank that holds the most (the last: its layers and the untied head,
    V·h/t); ZeRO-1 updates a 1/(dp·cp) shard. The critical path ends with it."""
    accounts, layers = _expected(RUN)
    spec = cal.model_spec(RUN)
    last = layers[-1] * spec.layer_params / RUN.tp + RUN.vocab * RUN.hidden / RUN.tp
    first = layers[0] * spec.layer_params / RUN.tp + RUN.vocab * RUN.hidden / RUN.tp
    most = max(first, last)
    p = cal.predict_run(RUN, PROFILE, accounts, layers)
    assert p["optimizer_s"] == pytest.approx(most * 5 * 8 / PROFILE["elementwise_bytes_per_s"], rel=1e-12)
    sharded = cal.RunShape(**dict(RUN.as_dict(), zero=1))
    assert cal.optimizer_s(sharded, PROFILE, layers) == pytest.approx(p["optimizer_s"] / RUN.dp, rel=1e-12)
    assert p["step_time_s"] == pytest.approx(sum(p[k] for k in cal.RUN_TERMS), rel=1e-12)


@pytest.mark.parametrize("values", [
    {"dp": 2, "tp": 1, "pp": 2, "cp": 2},  # an audit ran this: the line it printed left out --cp 2 and failed
    {"dp": 1, "tp": 2, "pp": 2, "cp": 2, "layers": 2, "seq": 32, "micro_batch": 1},
    {},  # the default run, (2, 2, 2, 1, 1)
])
def test_the_command_it_prints_runs_the_run_it_predicted(values):
    """``calc plan --calibrate`` ends with the command that checks its prediction: that command's options,
    as ``distai run capstone`` reads them on its ranks, plan the very run the calibration measured."""
    import shlex

    from distai.engine.calibrate import capstone_argv, run_command
    from distai.engine.mesh_args import plan_run

    argv, degrees = capstone_argv(values)
    world = degrees["dp"] * degrees["tp"] * degrees["pp"] * degrees["cp"]
    words = shlex.split(run_command(argv, world))
    assert words[:5] == ["distai", "run", "capstone", "--cpu", str(world)]
    ran, measured = plan_run(words[5:], world, cuda=False), plan_run(argv, world, cuda=False)
    assert ran.shape == measured.shape and ran.model == measured.model
    assert (ran.microbatches, ran.microbatch_size) == (measured.microbatches, measured.microbatch_size)
    assert ("--cp" in words) == (degrees["cp"] > 1)
