"""Lesson 5's bubble check (issue 28): a real run's bubble decomposed (formula → replay with the
measured stage times → + CPU contention → + communication → measured) adds up within 10 % of the
measured bubble, and an injected slow stage (the negative control) is blamed on unequal stages,
not on communication. Two gloo groups of 2 run the experiment: as is, and with rank 1's
forwards doing 60 ms more work each; the same events feed the Chrome trace's wait and idle tracks."""
from __future__ import annotations

import json
import os

import pytest

from distai.engine.events import read_events
from distai.engine.testing import run_in_group
from distai.lessons.checks import reconcile
from distai.lessons.lesson5 import formulas

pytestmark = pytest.mark.timed  # its checks time the run: README's command runs these alone, last

SLOW_MS = 60.0  # large against a loaded machine's noise: 9 to 14 points of bubble on 2 cores
M = 4  # 2 microbatches per stage, p = 2
# the learner's default model (compute dominates gloo's latency), fewer steps, no torch run
ARGS = ["--steps", "3", "--no-torch"]


def _run(rank: int, p: int, events_dir: str, extra: list[str]) -> int:
    from distai.engine.experiments import lesson5

    os.environ["DISTAI_EVENTS_DIR"] = events_dir
    return lesson5.main(ARGS + extra)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A DISTAI_HOME whose runs folder holds the two runs (``distai runs show`` reads them)."""
    return tmp_path_factory.mktemp("lesson5_checks")


@pytest.fixture(scope="module")
def records(home):
    from distai.engine.runs import create_run

    made = {name: create_run(home / "runs", "lesson5", "distai.engine.experiments.lesson5") for name in ("control", "slow")}
    for name, extra in (("control", []), ("slow", ["--slow-stage", "1", "--slow-ms", str(SLOW_MS)])):
        assert run_in_group(_run, 2, str(made[name].events_dir), extra, timeout_s=240) == [0, 0]
    for r in made.values():
        r.status, r.config = "ok", {"nproc": 2, "device": "cpu"}
        r.save()
    return made


@pytest.fixture(scope="module")
def runs(records):
    return {name: [e for path in sorted(r.events_dir.glob("rank*.jsonl")) for e in read_events(path)]
            for name, r in records.items()}


def _checks(events) -> dict[str, dict]:
    return {e["name"]: e for e in events if e["kind"] == "check"}


def test_every_schedule_is_checked_with_its_causes(runs):
    for events in runs.values():
        checks = _checks(events)
        assert set(checks) == {"bubble_gpipe", "bubble_1f1b", "bubble_interleaved"}
        for name, e in checks.items():
            schedule = name.removeprefix("bubble_")
            assert e["predicted"] == pytest.approx(formulas.bubble_fraction(2, M, 2 if schedule == "interleaved" else 1))
            c = reconcile(e)
            assert e["ok"] == c.ok and (c.ok or set(e["causes"]) == {"unequal_stages", "overhead", "cpu_contention", "communication"})
            # the summary's measured bubble is the check's
            summary = next(s for s in events if s["kind"] == "summary")
            assert summary["schedules"][schedule]["bubble_measured"] == pytest.approx(e["measured"])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_the_causes_add_up_to_the_measurement(runs, schedule):
    """Issue 28: predicted + Σ causes within 10 % of the measured bubble, for every run."""
    for events in runs.values():
        c = reconcile(_checks(events)[f"bubble_{schedule}"])
        assert c.ok or abs(c.explained_value - c.measured) <= 0.10 * c.measured, c


def test_a_slow_stage_is_blamed_on_unequal_stages_not_on_communication(runs):
    control, slow = _checks(runs["control"]), _checks(runs["slow"])
    for name in ("bubble_gpipe", "bubble_1f1b"):
        d = slow[name]["detail"]
        # the blocks' measured work saw the injected work: M forwards × SLOW_MS more on rank 1
        extra = d["rank1_compute_s"] - d["rank0_compute_s"] - (control[name]["detail"]["rank1_compute_s"]
                                                               - control[name]["detail"]["rank0_compute_s"])
        assert extra == pytest.approx(M * SLOW_MS / 1e3, rel=0.3)
        causes = {k: slow[name]["causes"][k] - control[name].get("causes", {}).get(k, 0.0)
                  for k in slow[name]["causes"]}
        # at least 5 points of bubble more, blamed on unequal stages (the replay of the ranks' measured
        # work); communication did not grow to absorb them (its own noise, under a loaded machine's
        # contention, goes either way). How many points 60 ms a forward adds depends on the machine's
        # speed (the rest of each step): 14 here, 9 on CI's slower cores (it failed a bound of 10).
        # The measured bubble itself is no witness: a busy machine's contention can add as much
        assert causes["unequal_stages"] > 0.05, (control[name], slow[name])
        assert slow[name]["causes"]["unequal_stages"] > slow[name]["causes"]["communication"]
        assert causes["communication"] < causes["unequal_stages"] / 2, (control[name], slow[name])


def test_the_chrome_trace_shows_each_ranks_step_as_compute_wait_and_idle(runs):
    from distai.engine.trace_export import check_trace, chrome_trace, trace_pid

    trace = json.loads(json.dumps(chrome_trace(runs["control"])))
    assert check_trace(trace) == []
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    steps = [e for e in runs["control"] if e["kind"] == "pp_step" and e["schedule"] == "gpipe" and e["step"] == 1]
    span_us = (max(e["t_end"] for e in steps) - min(e["t_start"] for e in steps)) * 1e6
    for rank in (0, 1):
        parts = {"compute": 0.0, "wait": 0.0, "idle": 0.0}
        for e in trace["traceEvents"]:
            track = names.get((e["pid"], e.get("tid")))
            if (e["ph"] == "X" and e["pid"] == trace_pid(rank) and track in parts and e["cat"] != "pp_step"
                    and e["args"].get("schedule") == "gpipe" and e["args"].get("step") == 1):
                parts[track] += e["dur"]
        assert parts["wait"] > 0 and parts["idle"] > 0
        assert sum(parts.values()) == pytest.approx(span_us, rel=1e-3)  # the three tile the step


def test_runs_show_carries_the_checks_and_draws_their_table(records, home, monkeypatch):
    from typer.testing import CliRunner

    from distai.tutor.cli import app

    monkeypatch.setenv("DISTAI_HOME", str(home))
    run_id = records["slow"].id
    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--json"])
    assert shown.exit_code == 0, shown.output
    checks = [json.loads(line) for line in shown.stdout.splitlines() if '"kind": "check"' in line]
    assert [c["name"] for c in checks] == ["bubble_gpipe", "bubble_1f1b", "bubble_interleaved"]
    assert all("causes" in c or c["ok"] for c in checks)
    for var in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "es_ES.UTF-8")  # the learner's language
    view = CliRunner().invoke(app, ["runs", "show", run_id], env={"COLUMNS": "140"})
    assert view.exit_code == 0, view.output
    assert "predicción frente a medida" in view.stdout and "etapas desiguales" in view.stdout


@pytest.mark.parametrize("argv,error", [
    (["--slow-stage", "2"], "--slow-stage must be a rank between 0 and 1, got 2"),
    (["--slow-ms", "-1"], "--slow-ms must be >= 0"),
    (["--microbatches", "1", "--schedules", "gpipe"], None),
    (["--microbatches", "1"], "fewer microbatches than stages"),
])
def test_distai_run_refuses_bad_pipeline_options_before_launching(argv, error, tmp_path, monkeypatch, capsys):
    """One line and exit 2, where a rank used to stop alone and leave the others to a gloo error."""
    from distai.lessons.lesson5 import run_options
    from distai.lessons.lesson5.formulas import ScheduleError
    from distai.tutor.cli import main

    if error is None:
        assert run_options.launch_ranks(argv, 2, 4, False) == 2
        return
    with pytest.raises(ScheduleError, match=error):
        run_options.launch_ranks(argv, 2, 4, False)
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    assert main(["run", "lesson5", "--cpu", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert error in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing launched
