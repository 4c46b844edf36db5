"""``distai runs prune``: old run folders go, newest first kept per lesson; a run still running, one whose
checkpoints a run can resume from or writes to, and one in a folder the learner chose stay whatever the
counts say; a prune killed midway leaves whole runs or hidden leftovers, never a damaged run."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from distai.engine.prune import prune_plan
from distai.engine.runs import REMOVING_PREFIX, RUN_FILE, RunRecord, create_run, list_runs
from distai.tutor.cli import main
from distai.tutor.paths import runs_root

DAY = 86400.0


def _run(root: Path, lesson: str, age_days: float, status: str = "ok", argv=(), run_dir=None,
         checkpoint: bool = False, size: int = 1000) -> RunRecord:
    """A finished run of ``lesson`` made ``age_days`` ago, its folder holding ``size`` bytes of events."""
    record = create_run(root, lesson, f"distai.engine.experiments.{lesson}", argv=list(argv), run_dir=run_dir)
    record.created = time.time() - age_days * DAY
    record.status = status
    if status != "running":
        record.launcher_pid = record.launcher_start = None
    (record.events_dir / "rank0.jsonl").write_bytes(b"x" * size)
    if checkpoint:
        (record.dir / "checkpoints" / "step_3").mkdir(parents=True)
    record.save()
    return record


@pytest.fixture
def runs(tmp_path):
    root = runs_root()
    made = {
        "l1_new": _run(root, "lesson1", 0.1),
        "l1_mid": _run(root, "lesson1", 2, status="failed"),
        "l1_old": _run(root, "lesson1", 30, size=5000),
        "l1_older": _run(root, "lesson1", 40, status="stopped", size=7000),
        "l3_new": _run(root, "lesson3", 0.2),
        # stopped with its checkpoints in its folder: `distai run` prints the command that resumes it
        "l3_resumable": _run(root, "lesson3", 5, status="stopped", argv=["--steps", "9"], checkpoint=True),
        "l3_target": _run(root, "lesson3", 6, status="failed", argv=["--steps", "9"]),
        "l3_running": _run(root, "lesson3", 7, status="running"),  # this process is its launcher: alive
        "l3_elsewhere": _run(root, "lesson3", 8, run_dir=tmp_path / "mine"),
    }
    # a run that resumed into another folder's checkpoints writes there: that folder stays while it is listed
    made["l3_resumer"] = _run(root, "lesson3", 0.15, argv=["--ckpt-dir", str(made["l3_target"].dir / "checkpoints")])
    damaged = root / "20200101-000000-lesson1-dead"
    (damaged / "events").mkdir(parents=True)
    return made


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["runs", "prune", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _ids() -> set[str]:
    return {r.id for r in list_runs(runs_root())}


def test_the_plan_keeps_the_newest_of_each_lesson_and_what_a_run_still_needs(runs):
    plan = prune_plan(runs_root(), keep=1)
    assert [r.id for r in plan.remove] == [runs["l3_new"].id, runs["l1_mid"].id, runs["l1_old"].id,
                                           runs["l1_older"].id, "20200101-000000-lesson1-dead"]
    on_disk = sum(p.stat().st_size for r in plan.remove for p in r.dir.rglob("*") if p.is_file())
    assert plan.bytes == on_disk > 1000 * 3 + 5000 + 7000
    assert [r.id for r in plan.kept_checkpoints] == [runs["l3_resumable"].id, runs["l3_target"].id]
    assert [r.id for r in plan.kept_running] == [runs["l3_running"].id]
    assert [r.id for r in plan.kept_elsewhere] == [runs["l3_elsewhere"].id]
    # lesson 3's newest is the resumer (0.15 days), kept by the count: its older l3_new goes
    assert [r.id for r in prune_plan(runs_root(), keep=1, lesson="lesson3").remove] == [runs["l3_new"].id]
    # only what is older than 10 days, and only lesson 1's
    assert [r.id for r in prune_plan(runs_root(), keep=0, older_than_s=10 * DAY, lesson="lesson1").remove] == \
        [runs["l1_old"].id, runs["l1_older"].id, "20200101-000000-lesson1-dead"]


def test_a_dry_run_lists_and_removes_nothing_then_yes_removes_exactly_those(runs, capsys):
    before = _ids()
    code, out, err = _cli(capsys, "--keep", "2", "--lesson", "lesson1")
    assert code == 0 and not err
    assert out.splitlines()[:3] == [f"  {runs['l1_old'].id}  finished", f"  {runs['l1_older'].id}  stopped",
                                    "  20200101-000000-lesson1-dead  damaged"]
    assert out.splitlines()[3].startswith("would remove 3 runs (") and out.splitlines()[3].endswith(
        "run it again with --yes to remove them")
    assert _ids() == before
    code, out, err = _cli(capsys, "--keep", "2", "--lesson", "lesson1", "--yes")
    assert code == 0 and out.startswith("removed 3 runs (") and not err
    assert _ids() == before - {runs["l1_old"].id, runs["l1_older"].id, "20200101-000000-lesson1-dead"}
    assert not runs["l1_old"].dir.exists() and not any(runs_root().glob(f"{REMOVING_PREFIX}*"))
    code, out, _ = _cli(capsys, "--keep", "2", "--lesson", "lesson1", "--yes")
    assert out == "nothing to remove\n"


def test_what_is_kept_is_said_and_survives_keep_zero(runs, capsys):
    code, out, _ = _cli(capsys, "--keep", "0", "--lang", "es")
    lines = out.splitlines()
    assert len(lines) == 7 + 4 and lines[7].startswith("se borrarían 7 ejecuciones (")
    assert lines[8:] == [
        "se conserva 1 ejecución aún en curso",
        "se conservan 2 ejecuciones con checkpoints desde los que otra ejecución puede reanudarse o en los que "
        "escribe (distai runs show ID dice cómo)",
        "se conserva 1 ejecución en una carpeta elegida con --run-dir: bórrala tú"]
    code, out, _ = _cli(capsys, "--keep", "0", "--yes", "--json")
    report = json.loads(out)  # strict JSON
    assert report["removed"] is True and len(report["runs"]) == 7
    assert report["kept"] == {"running": [runs["l3_running"].id],
                              "checkpoints": [runs["l3_resumable"].id, runs["l3_target"].id],
                              "elsewhere": [runs["l3_elsewhere"].id]}
    assert _ids() == {runs[k].id for k in ("l3_running", "l3_resumable", "l3_target", "l3_elsewhere")}
    assert (runs["l3_resumable"].dir / "checkpoints" / "step_3").is_dir()
    assert (runs["l3_elsewhere"].dir / RUN_FILE).is_file()
    # the run that wrote into l3_target's folder is gone: nothing needs that folder any more
    assert [r.id for r in prune_plan(runs_root(), keep=0).remove] == [runs["l3_target"].id]


def test_a_prune_killed_midway_leaves_whole_runs_and_the_next_one_finishes(runs, capsys):
    # the state a SIGKILL between the rename and the end of the delete leaves
    victim = runs["l1_older"]
    before = _ids()
    hidden = runs_root() / f"{REMOVING_PREFIX}{victim.id}"
    os.rename(victim.dir, hidden)
    assert (hidden / RUN_FILE).is_file() and _ids() == before - {victim.id}  # no listing reads it, whole or not
    main(["runs", "--json"])
    assert {r["id"] for r in json.loads(capsys.readouterr().out)} == before - {victim.id}
    _cli(capsys, "--keep", "100", "--yes")
    assert not hidden.exists()


@pytest.mark.parametrize("argv,line", [
    (["--keep", "-1"], "distai: error: --keep must be 0 or more, got -1"),
    (["--older-than", "nan"], "distai: error: --older-than must be a finite number of days >= 0, got nan"),
    (["--older-than", "-2"], "distai: error: --older-than must be a finite number of days >= 0, got -2"),
])
def test_bad_options_are_one_line(argv, line, capsys):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and err.splitlines() == [line] and not out


def test_an_unknown_lesson_is_one_line(capsys):
    code, _, err = _cli(capsys, "--lesson", "lesson99")
    assert code == 2 and len(err.splitlines()) == 1 and "lesson99" in err


def test_a_linked_run_folder_is_never_followed(tmp_path, capsys):
    """A link in the runs folder to a run kept elsewhere: its target is the learner's, kept whole."""
    root = runs_root()
    _run(root, "lesson1", 0)
    target = _run(tmp_path / "other_root", "lesson1", 50)
    link = root / target.id
    link.symlink_to(target.dir, target_is_directory=True)
    plan = prune_plan(root, keep=0)
    assert target.id in {r.id for r in plan.kept_elsewhere} and target.id not in {r.id for r in plan.remove}
    _cli(capsys, "--keep", "0", "--yes")
    assert link.is_symlink() and (target.dir / RUN_FILE).is_file()


def test_runs_it_could_not_remove_are_said_and_the_command_fails(runs, capsys, monkeypatch):
    """A runs folder it may not change: it printed "nothing to remove" and exited 0 after a dry run listing 4."""
    import distai.engine.prune as prune

    def refused(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(prune.os, "rename", refused)
    before = _ids()
    code, out, err = _cli(capsys, "--keep", "2", "--lesson", "lesson1", "--yes")
    assert code == 1 and "nothing to remove" not in out and _ids() == before
    assert err.splitlines() == [f"distai: error: could not remove run {runs[k].id}: permission denied"
                                for k in ("l1_old", "l1_older")] + [
        "distai: error: could not remove run 20200101-000000-lesson1-dead: permission denied"]


def test_a_run_shown_by_its_folder_is_exported_by_its_folder(tmp_path, capsys):
    """`runs show FOLDER` of a run outside the listing ended with `distai runs export ID`, which then said
    "no run matches" (a report-only audit)."""
    import shutil

    listed = _run(runs_root(), "lesson1", 1)
    copy = tmp_path / "kept by hand" / listed.id
    shutil.copytree(listed.dir, copy)
    shutil.rmtree(listed.dir)
    assert main(["runs", "show", str(copy), "--lang", "en"]) == 0
    hint = [line for line in capsys.readouterr().err.splitlines() if line.startswith("export: ")]
    assert hint == [f"export: distai runs export '{copy}' --format chrome-trace|csv|jsonl"]
    assert main(["runs", "export", str(copy), "-f", "csv", "-o", str(tmp_path / "m.csv")]) == 0
    other = _run(runs_root(), "lesson1", 1)  # one the listing has: its id, as before
    capsys.readouterr()
    assert main(["runs", "show", other.id, "--lang", "en"]) == 0
    assert f"export: distai runs export {other.id} --format" in capsys.readouterr().err
