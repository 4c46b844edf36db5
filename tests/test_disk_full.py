"""A disk that fills up: what the learner saved stays whole, and what could not be saved is one line in their
language, never a traceback (the progress store, the tutor, the CLI's output, atomic writes, the
calibration profile). The launcher's and the run panel's cases are with their real launches
(test_engine_launcher, test_engine_run_panel)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distai.engine import durable
from distai.tutor.app import DistaiApp
from distai.tutor.progress import ProgressError, ProgressStore
from pilot_harness import async_test

REPO = Path(__file__).resolve().parents[1]


def _full(store: ProgressStore) -> None:
    """SQLite's own limit on the file's pages, at what it holds now: the next page it needs is a full disk
    (SQLITE_FULL), as ENOSPC gives it."""
    with store.connection() as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        conn.execute("PRAGMA synchronous = OFF")  # the test fills it row by row: no need to wait for the disk


def _answers(store: ProgressStore) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT count(*) FROM quiz_answers").fetchone()[0]


def test_a_write_on_a_full_disk_is_one_line_and_keeps_what_was_saved(tmp_path):
    # the write's INSERT or COMMIT failed with sqlite3.OperationalError's traceback; only BEGIN was caught
    store = ProgressStore(tmp_path / "progress.db")
    store.record_quiz_answer("lesson1", "kind", True)
    store.set_position("lesson1", "intro")
    _full(store)
    with pytest.raises(ProgressError) as caught:
        for n in range(10_000):
            store.record_quiz_answer("lesson1", "kind" * 100 + str(n), True)
    saved = _answers(store)
    assert 1 <= saved < 10_000 and store.last_step_seen("lesson1") == "intro"
    en, es = caught.value.text("en"), caught.value.text("es")
    assert en.startswith("cannot save to the progress database") and "no space left on the disk" in en, en
    assert "no queda espacio en el disco" in es and "lo guardado antes se conserva" in es, es
    with store.connection() as conn:
        assert not conn.in_transaction and conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute("PRAGMA max_page_count = 1073741823")  # room again: the store writes as before
    store.record_quiz_answer("lesson1", "kind", False)
    assert _answers(store) == saved + 1
    store.close()


def test_a_mistake_in_a_write_is_still_the_programs_error_not_a_full_disk(tmp_path):
    # only the disk's and the file's failures become "cannot save": a bad statement stays a bug, loudly
    import sqlite3

    store = ProgressStore(tmp_path / "progress.db")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        with store.transaction() as conn:
            conn.execute("INSERT INTO no_such_table VALUES (1)")
    store.record_quiz_answer("lesson1", "kind", True)
    store.close()


@async_test
async def test_the_tutor_on_a_full_disk_says_so_once_and_the_lesson_goes_on(tmp_path):
    # a step's position write on a full disk ended the tutor with a traceback (and exit code 0)
    store = ProgressStore(tmp_path / "progress.db")
    _full(store)
    for write in (store.mark_step_seen, store.set_position):  # the last free room of their tables' pages too
        for width in (100, 10, 1):
            with pytest.raises(ProgressError):
                for n in range(100_000):
                    write("x" * width + str(n), "step")
    app = DistaiApp("es", store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_lesson("lesson1")
        await pilot.pause()
        for _ in range(6):
            await pilot.press("right")
            await pilot.pause()
        assert app.screen.index >= 3 and app.is_running
        said = [n.message for n in app._notifications]
        assert sum("no queda espacio en el disco" in m for m in said) == 1, said
    store.close()


def test_the_tutor_exits_non_zero_when_it_ended_on_an_error(monkeypatch):
    # the CLI ignored the app's return code: a crashed tutor told the shell it succeeded
    from distai.tutor import cli

    def crashed(self, *args, **kwargs):
        self._return_code = 1

    monkeypatch.setattr(DistaiApp, "run", crashed)
    assert cli.main(["tutor", "--lang", "en"]) == 1
    monkeypatch.setattr(DistaiApp, "run", lambda self, *a, **k: setattr(self, "_return_code", 0))
    assert cli.main(["tutor", "--lang", "en"]) == 0


@pytest.mark.parametrize("lang,words", [("en", "cannot write the output: no space left on the disk"),
                                        ("es", "no se puede escribir la salida: no queda espacio en el disco")])
def test_output_to_a_full_disk_is_one_line(lang, words, tmp_path):
    env = dict(os.environ, DISTAI_HOME=str(tmp_path))
    for command in (["lessons", "--json"], ["runs"], ["calc", "allreduce", "--bytes", "1GB", "--ranks", "8"]):
        with open("/dev/full", "w") as full:
            res = subprocess.run([sys.executable, "-m", "distai.tutor.cli", *command, "--lang", lang], env=env,
                                 stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO)
        assert res.returncode == 1 and res.stderr == f"distai: error: {words}\n", (command, res.stderr)


def test_an_atomic_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    # a failed write left ".tmp-run.json.<pid>" beside the record: the run folder then read as holding
    # other files, and `--run-dir` refused it
    path = tmp_path / "run.json"
    durable.write_atomic(path, b'{"status": "ok"}')

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable.os, "fsync", full)
    with pytest.raises(OSError):
        durable.write_atomic(path, b'{"status": "running"}' * 1000)
    assert path.read_bytes() == b'{"status": "ok"}' and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_calibration_profile_that_cannot_be_saved_keeps_the_last_and_still_answers(tmp_path, monkeypatch):
    # the profile was written in place: a full disk left it cut short, and the measurement died with it
    from distai.engine import calibrate

    monkeypatch.setattr(calibrate, "profile_path", lambda: tmp_path / "machine_profile.json")
    last = {"measured_at": 0, "the": "last profile"}
    (tmp_path / "machine_profile.json").write_text(json.dumps(last))
    monkeypatch.setattr(calibrate, "measure", lambda run, dtype: {"measured": True})

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(calibrate, "write_atomic", full)
    assert calibrate.machine_profile(None, fresh=True) == {"measured": True}  # type: ignore[arg-type]
    assert json.loads((tmp_path / "machine_profile.json").read_text()) == last


def test_a_relaunch_removes_a_killed_attempts_half_checkpoint_before_it_writes(tmp_path, monkeypatch):
    # lesson 3's attempt counter was written before the stale checkpoint was cleaned: when that half-written
    # checkpoint had filled the disk, every relaunch died on the counter's write
    import torch.distributed as dist

    from distai.engine.experiments import lesson3

    monkeypatch.setattr(dist, "broadcast", lambda tensor, src: None)  # one rank: rank 0's count is the count
    stale = tmp_path / ".tmp-step_00000015"
    stale.mkdir()
    (stale / "shard.bin").write_bytes(b"\0" * 1024)
    written = []
    real_write = lesson3.write_checked

    def write_checked(path, data):
        written.append((path.name, stale.exists()))
        real_write(path, data)

    monkeypatch.setattr(lesson3, "write_checked", write_checked)
    assert lesson3._attempt_number(tmp_path, 0, "cpu") == 0 and lesson3._attempt_number(tmp_path, 0, "cpu") == 1
    assert written == [("attempts", False), ("attempts", False)]


@pytest.mark.multi_rank
def test_a_run_whose_output_cannot_be_written_is_an_error_not_an_interruption(tmp_path):
    # `distai run … --json > /dev/full` stopped the run (right: nobody can see it) but printed nothing and exited
    # 130, the code of a Ctrl-C
    env = dict(os.environ, DISTAI_HOME=str(tmp_path))
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "distai.tutor.cli", "run", "lesson1", "--cpu", "2", "--json",
                              "--steps", "2", "--no-sweep"], env=env, stdout=full, stderr=subprocess.PIPE, text=True,
                             timeout=240, cwd=REPO)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        "distai: error: the live view failed: no space left on the disk"], res.stderr
    from distai.engine.runs import (
        reason_text,  # the record keeps English words; a Spanish learner reads them so
    )

    assert reason_text("the live view failed: no space left on the disk", "es") == \
        "falló la vista en vivo: no queda espacio en el disco"


@pytest.mark.parametrize("error,launches", [("rank 0 failed: OSError: [Errno 28] No space left on device: '/x'", 1),
                                            ("rank 1 failed: RuntimeError: injected failure on rank 1", 4)])
def test_the_supervisor_does_not_relaunch_into_a_full_disk(error, launches, tmp_path):
    # lesson 3's supervisor relaunched a run that failed on a full disk three times, each failing the same way
    from distai.engine import launcher as L
    from distai.engine.runs import create_run
    from distai.engine.supervisor import Supervisor
    from distai.lessons.events import RUN_END

    started = []

    class FailingLaunch:
        def __init__(self, spec, record, consumer, grace_s):
            self.record, self.consumer = record, consumer
            started.append(self)

        def start(self):
            pass

        def stop(self, reason):
            pass

        def run(self):
            self.record.status, self.record.error = "failed", error
            self.consumer(RUN_END.event({"status": "failed", "error": error, "exit_code": 1, "failed_rank": 0,
                                         "tail": [], "duration_s": 1.0}))
            return self.record

    seen: list[dict] = []
    record = create_run(tmp_path / "runs", "lesson3", "distai.engine.experiments.lesson3")
    spec = L.LaunchSpec("distai.engine.experiments.lesson3", L.Placement("cpu", 2), [])
    ended = Supervisor(spec, record, consumer=seen.append, relaunches=3, launch_cls=FailingLaunch).run()
    assert len(started) == launches and ended.status == "failed" and ended.error == error
    assert sum(e["kind"] == "relaunch" for e in seen) == launches - 1
