"""The progress store: transactions survive SIGKILL, corruption is moved aside with a message."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distai.lessons.registry import all_lessons, resolve_lesson
from distai.tutor.progress import SCHEMA_VERSION, ProgressError, ProgressStore


@pytest.fixture
def store(tmp_path):
    s = ProgressStore(tmp_path / "progress.db")
    yield s
    s.close()


def test_default_path_follows_distai_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path / "home"))
    with ProgressStore() as s:
        assert s.path == tmp_path / "home" / "progress.db"
        assert s.path.exists()
        assert s.recovered_from is None


def test_pragmas_and_schema_version(store):
    with store.connection() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_steps_quiz_runs_and_summary(store):
    store.mark_step_seen("lesson1", "replicate")
    store.mark_step_seen("lesson1", "replicate")
    store.mark_step_seen("lesson1", "averaging")
    store.mark_step_seen("lesson1", "a-step-that-was-removed")
    assert store.steps_seen("lesson1") == {"replicate", "averaging", "a-step-that-was-removed"}
    assert store.steps_seen("lesson2") == set()
    assert store.last_step_seen("lesson1") == "a-step-that-was-removed"

    assert store.best_quiz_score("lesson1") is None
    store.record_quiz_session("lesson1", 3, 5)
    store.record_quiz_session("lesson1", 4, 5)
    store.record_quiz_session("lesson1", 1, 4)
    assert store.best_quiz_score("lesson1") == pytest.approx(0.8)
    with pytest.raises(ValueError):
        store.record_quiz_session("lesson1", 6, 5)
    with pytest.raises(ValueError):
        store.record_quiz_session("lesson1", 0, 0)

    store.record_quiz_answer("lesson1", "ring-time", True, at=100.0)
    store.record_quiz_answer("lesson1", "busbw", False)
    answers = store.quiz_answers("lesson1")
    assert [(a["question_kind"], a["correct"]) for a in answers] == [("ring-time", True), ("busbw", False)]
    assert answers[0]["at"] == 100.0

    store.record_run("r1", "lesson1", "running", "/tmp/r1")
    store.record_run("r1", "lesson1", "done", "/tmp/r1")
    store.record_run("r2", "lesson2", "failed", "/tmp/r2")
    assert [r["status"] for r in store.runs("lesson1")] == ["done"]
    assert {r["run_id"] for r in store.runs()} == {"r1", "r2"}

    summary = store.summary()
    assert list(summary) == [lesson.id for lesson in all_lessons()]
    l1 = summary["lesson1"]
    assert l1 == {"steps_done": 2, "steps_total": len(resolve_lesson(1).steps),
                  "best_quiz": pytest.approx(0.8), "runs": 1}
    assert summary["lesson3"] == {"steps_done": 0, "steps_total": len(resolve_lesson(3).steps),
                                  "best_quiz": None, "runs": 0}


def test_a_run_whose_launcher_was_killed_reads_killed_not_running(store, tmp_path):
    """`distai run` notes "running" here and its end when it ends; a SIGKILL leaves "running" behind, so the
    status comes from the run's own record, which knows its launcher is gone."""
    from distai.engine.runs import create_run, pid_alive

    live = create_run(tmp_path / "runs", "lesson1", "m")  # this process is its launcher: still running
    dead = create_run(tmp_path / "runs", "lesson1", "m")
    dead.launcher_pid, dead.launcher_start = next(p for p in range(2 ** 22, 1, -1) if not pid_alive(p)), None
    dead.save()
    store.record_run(live.id, "lesson1", "running", live.path)
    store.record_run(dead.id, "lesson1", "running", dead.path)
    store.record_run("gone", "lesson1", "running", tmp_path / "no-such-run")  # no folder: as noted
    status = {r["run_id"]: r["status"] for r in store.runs("lesson1")}
    assert status == {live.id: "running", dead.id: "killed", "gone": "running"}


def test_failed_transaction_rolls_back_and_other_modules_can_add_tables(store):
    with store.transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS review (kind TEXT PRIMARY KEY, due REAL)")
    with pytest.raises(RuntimeError):
        with store.transaction() as conn:
            conn.execute("INSERT INTO review VALUES ('a', 1.0)")
            store.mark_step_seen("lesson1", "replicate")  # nested: joins the outer transaction
            raise RuntimeError("boom")
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM review").fetchone()[0] == 0
    assert store.steps_seen("lesson1") == set()


def test_progress_persists_across_reopen(tmp_path):
    path = tmp_path / "progress.db"
    with ProgressStore(path) as s:
        s.mark_step_seen("lesson2", "memory")
        s.record_quiz_session("lesson2", 2, 2)
    with ProgressStore(path) as s:
        assert s.steps_seen("lesson2") == {"memory"}
        assert s.best_quiz_score("lesson2") == 1.0
        assert s.recovered_from is None


WRITER = textwrap.dedent("""
    import sys
    from distai.tutor.progress import ProgressStore
    store = ProgressStore(sys.argv[1])
    i = 0
    while True:
        with store.transaction() as conn:
            # a transaction with several statements: all of it or nothing survives
            conn.execute("CREATE TABLE IF NOT EXISTS pairs (i INTEGER PRIMARY KEY, twice INTEGER)")
            conn.execute("INSERT INTO pairs VALUES (?, ?)", (i, 2 * i))
            store.mark_step_seen("lesson1", f"step-{i}")
        print(i, flush=True)  # printed only once the transaction committed
        i += 1
""")


def test_sigkill_mid_write_loses_nothing_committed(tmp_path):
    path = tmp_path / "progress.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    committed = []
    try:
        deadline = time.monotonic() + 60
        while len(committed) < 40 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            committed.append(int(line))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) >= 40, "the writer did not get going"

    with ProgressStore(path) as s:
        assert s.recovered_from is None
        with s.connection() as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            pairs = dict(conn.execute("SELECT i, twice FROM pairs").fetchall())
        seen = s.steps_seen("lesson1")
    for i in committed:
        assert pairs[i] == 2 * i
        assert f"step-{i}" in seen
    # nothing half-written: every pair row has its step row and the other way round
    assert {f"step-{i}" for i in pairs} == seen


def _assert_moved_aside(tmp_path, path, original_bytes, reasons: tuple[str, str]):
    """``reasons``: why, in English and in Spanish (SQLite's own words are English: "file is not a database")."""
    with ProgressStore(path) as s:
        assert s.recovered_from is not None
        assert "\n" not in s.recovered_from
        assert "was moved to" in s.recovered_from and str(s.moved_to) in s.recovered_from
        assert "se movió a" in s.recovered_text("es") and str(s.moved_to) in s.recovered_text("es")
        assert f"unreadable ({reasons[0]})" in s.recovered_from
        assert f"no se podía leer ({reasons[1]})" in s.recovered_text("es")
        assert s.moved_to.name.startswith("progress.db.corrupt-")
        assert s.moved_to.read_bytes() == original_bytes  # never wiped
        s.mark_step_seen("lesson1", "replicate")  # a fresh, working database
        assert s.steps_seen("lesson1") == {"replicate"}
    with ProgressStore(path) as s:  # and the fresh one is fine next time
        assert s.recovered_from is None


def test_not_sqlite_file_is_moved_aside(tmp_path):
    path = tmp_path / "progress.db"
    junk = b"this is not a database at all\n" * 200
    path.write_bytes(junk)
    _assert_moved_aside(tmp_path, path, junk, ("it is not a SQLite database", "no es una base de datos SQLite"))


def test_damaged_sqlite_file_is_moved_aside(tmp_path):
    path = tmp_path / "progress.db"
    with ProgressStore(path) as s:
        for i in range(300):
            s.mark_step_seen("lesson1", f"k{i:04d}-" + "x" * 100)
        with s.connection() as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    assert len(data) > 4096 * 3
    # scribble over the second page onward, keeping the valid SQLite header
    data[4096:4096 * 3] = b"\xff" * (4096 * 2)
    path.write_bytes(bytes(data))
    _assert_moved_aside(tmp_path, path, bytes(data), ("it is damaged", "está dañada"))


def test_newer_schema_is_refused_not_wiped(tmp_path):
    path = tmp_path / "progress.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(ProgressError, match="newer distai"):
        ProgressStore(path)
    assert path.exists()


def test_cli_lessons_shows_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    with ProgressStore() as s:
        s.mark_step_seen("lesson1", "replicate")
        s.mark_step_seen("lesson1", "averaging")
        s.record_quiz_session("lesson1", 3, 4)
    env = dict(os.environ, DISTAI_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "distai.tutor.cli", "lessons", "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [lesson.id for lesson in all_lessons()]
    l1 = rows[0]
    assert l1["steps_done"] == 2 and l1["steps_total"] == len(resolve_lesson(1).steps)
    assert l1["best_quiz"] == 0.75
    assert l1["mastery"] is None  # no question answered yet
    assert rows[1]["steps_done"] == 0 and rows[1]["best_quiz"] is None

    text = subprocess.run([sys.executable, "-m", "distai.tutor.cli", "lessons", "--lang", "en"],
                          capture_output=True, text=True, env=env, check=True).stdout
    assert "2/" in text and "75%" in text, text


def test_cli_reports_recovered_database(tmp_path):
    (tmp_path / "progress.db").write_bytes(b"garbage" * 1000)
    env = dict(os.environ, DISTAI_HOME=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "distai.tutor.cli", "lessons", "--json"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0
    assert "was moved to" in res.stderr and "corrupt-" in res.stderr
    json.loads(res.stdout)  # stdout stays machine-readable
    assert list(Path(tmp_path).glob("progress.db.corrupt-*"))


def test_the_capstone_renamed_keeps_progress_saved_under_its_old_slug(tmp_path):
    """The capstone's slug went from 3d-parallelism to 5d-parallelism: the old name still resolves, and
    a progress file holding rows under it (steps, answers, a session, a run, the position), beside rows
    under the id, opens with all of them the capstone's."""
    capstone = resolve_lesson("capstone")
    assert capstone.slug == "5d-parallelism" and resolve_lesson("3d-parallelism") is capstone
    first, second = capstone.steps[0].key, capstone.steps[1].key
    path = tmp_path / "progress.db"
    with ProgressStore(path) as s:  # the file as an older tutor could leave it
        s.mark_step_seen("capstone", first)
        s.set_position("capstone", first)
        with s.transaction() as conn:
            for table, row in (("steps_seen", (first, 1.0, 1.0)), ("steps_seen", (second, 2.0, 2.0)),
                               ("positions", (second, 3.0))):
                marks = ", ".join("?" * (len(row) + 1))
                conn.execute(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", ("3d-parallelism", *row))
            conn.execute("INSERT INTO quiz_answers (lesson_id, question_kind, correct, at) "
                         "VALUES ('3d-parallelism', 'world-size', 1, 4.0)")
            conn.execute("INSERT INTO quiz_sessions (lesson_id, correct, total, at) VALUES ('3d-parallelism', 4, 5, 5.0)")
            conn.execute("INSERT INTO runs VALUES ('r1', '3d-parallelism', 'ok', '/tmp/r1', 6.0, 6.0)")
    with ProgressStore(path) as s:
        assert s.steps_seen("capstone") == {first, second}
        assert s.best_quiz_score("capstone") == pytest.approx(0.8)
        assert [a["question_kind"] for a in s.quiz_answers("capstone")] == ["world-size"]
        assert [r["run_id"] for r in s.runs("capstone")] == ["r1"]
        assert s.last_step_seen("capstone") in (first, second)
        assert s.summary()["capstone"]["steps_done"] == 2 and s.summary()["capstone"]["runs"] == 1
        with s.connection() as conn:
            for table in ("steps_seen", "quiz_answers", "quiz_sessions", "runs", "positions"):
                left = conn.execute(f"SELECT count(*) FROM {table} WHERE lesson_id = '3d-parallelism'").fetchone()[0]
                assert left == 0, table


def test_opening_takes_no_write_lock_so_a_writer_holding_it_does_not_block_a_reader(tmp_path):
    # a suspended tutor (Ctrl-Z) or another distai in the middle of a write holds the database's write lock;
    # `distai lessons` and the tutor only read at open, and waited 10 s for the lock, then died with a traceback
    path = tmp_path / "progress.db"
    ProgressStore(path).close()  # created and migrated
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        store = ProgressStore(path)
        assert store.summary() is not None and time.monotonic() - started < 5
        store.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_run_that_finds_the_database_unreadable_says_so_in_the_learners_language(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from distai.tutor.cli_run import record_in_progress_store

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    from distai.tutor.paths import progress_db_path

    progress_db_path().parent.mkdir(parents=True, exist_ok=True)
    progress_db_path().write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    run = SimpleNamespace(id="20261207-000000-lesson1-abcd", lesson="lesson1", effective_status="ok", path="/x")
    record_in_progress_store(run, "es")
    err = capsys.readouterr().err
    assert err.startswith("distai: aviso: la base de datos de progreso no se podía leer") and err.count("\n") == 1


@pytest.mark.parametrize("code,words", [("SQLITE_BUSY", "held by another distai"),
                                        ("SQLITE_READONLY", "cannot open"), ("SQLITE_CANTOPEN", "cannot open")])
def test_a_database_that_is_only_busy_or_read_only_is_never_moved_aside(tmp_path, monkeypatch, code, words):
    # "database is locked" is an sqlite3.DatabaseError too: it was taken for corruption, the file moved aside
    # and a fresh one started, so the learner's progress vanished while another distai held it
    path = tmp_path / "progress.db"
    ProgressStore(path).close()
    saved = path.read_bytes()

    def refuses(conn):
        exc = sqlite3.OperationalError("database is locked" if code == "SQLITE_BUSY" else "attempt to write")
        exc.sqlite_errorname = code
        raise exc

    monkeypatch.setattr(ProgressStore, "_configure", staticmethod(refuses))
    with pytest.raises(ProgressError) as caught:
        ProgressStore(path)
    assert words in caught.value.text("en") and "base de datos de progreso" in caught.value.text("es")
    assert path.read_bytes() == saved and not list(tmp_path.glob("*.corrupt-*"))


def test_a_distai_home_that_cannot_be_a_folder_is_one_line_in_the_learners_language(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    env = dict(os.environ, DISTAI_HOME=str(blocker))
    for command in (["lessons"], ["runs"], ["run", "lesson1", "--cpu", "2", "--steps", "1"]):
        res = subprocess.run([sys.executable, "-m", "distai.tutor.cli", *command, "--lang", "es"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.startswith(f"distai: error: no se puede usar {blocker}") and res.stderr.count("\n") == 1
    assert blocker.read_text() == "not a folder"


def test_a_write_that_waits_past_another_writers_lock_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    # opening takes no write lock now, but the first write (a quiz answer) still waited for the other
    # process's lock and died with sqlite3.OperationalError's traceback
    from distai.tutor import progress

    monkeypatch.setattr(progress, "LOCK_WAIT_S", 0.2)
    path = tmp_path / "progress.db"
    ProgressStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        store = ProgressStore(path)
        with pytest.raises(ProgressError) as caught:
            with store.transaction() as conn:
                conn.execute("SELECT 1")
        assert "held by another distai" in caught.value.text("en") and "ocupada" in caught.value.text("es")
        store.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_quiz_whose_answers_cannot_be_saved_goes_on_and_says_so_once(capsys):
    # another process holds the database past the wait: each answer's write failed with a traceback (the CLI)
    # or ended the tutor; the quiz now goes on and the learner is told once that its answers were not saved
    from distai.lessons.registry import resolve_lesson
    from distai.tutor.cli_quiz import run_quiz

    class HeldStore:
        def __init__(self):
            self.tries = 0

        def record_quiz_answer(self, *args):
            self.tries += 1
            raise ProgressError(texts={"en": "the progress database x is held by another distai",
                                       "es": "la base de datos de progreso x la tiene ocupada otro distai"})

        record_quiz_session = record_quiz_answer

    from distai.lessons.quiz import build_quiz

    questions = build_quiz(resolve_lesson("lesson1").id, 3, 7, "es")
    store = HeldStore()
    import io

    sys_stdin = sys.stdin
    sys.stdin = io.StringIO("\n".join(["0"] * 6) + "\n")
    try:
        assert run_quiz(questions, store, "lesson1", "es", "quiz") == 0
    finally:
        sys.stdin = sys_stdin
    err = capsys.readouterr().err
    assert store.tries >= 3 and err.count("la tiene ocupada otro distai") == 1 and "Traceback" not in err, err


def test_resume_position_runs_order_and_a_revisited_step(store, monkeypatch):
    """The newest of the position and the last step done is where a lesson resumes; a run keeps its start
    time when its status changes (newest first is by start); a step seen again moves to the front."""
    import itertools

    import distai.tutor.progress as progress

    clock = itertools.count(1000.0)
    monkeypatch.setattr(progress.time, "time", lambda: float(next(clock)))
    store.set_position("lesson1", "replicate")
    store.mark_step_seen("lesson1", "replicate")
    store.set_position("lesson1", "averaging")  # moved on after finishing replicate: resume at averaging
    assert store.last_step_seen("lesson1") == "averaging"
    store.mark_step_seen("lesson1", "averaging")
    assert store.last_step_seen("lesson1") == "averaging"

    # an older database with no position row: the step seen last, a revisit included
    for key in ("a", "b", "a"):
        store.mark_step_seen("lesson2", key)
    assert store.last_step_seen("lesson2") == "a"

    store.record_run("r1", "lesson1", "running", "/tmp/r1")
    store.record_run("r2", "lesson1", "running", "/tmp/r2")
    started = {r["run_id"]: r["started_at"] for r in store.runs()}
    store.record_run("r1", "lesson1", "ok", "/tmp/r1")  # r1's end is the newest write; r2 is still newer
    assert [r["run_id"] for r in store.runs()] == ["r2", "r1"]
    assert {r["run_id"]: r["started_at"] for r in store.runs()} == started


def test_a_home_the_learner_cannot_write_says_so_with_the_way_out(tmp_path, monkeypatch):
    """A read-only DISTAI_HOME without a progress database yet: SQLite cannot create it, and the error said only
    "the file cannot be opened". It now says what the runs folder says of such a home, with DISTAI_HOME as the
    way out. (Faked with os.access: as root, which CI may be, every folder is writable.)"""
    import distai.tutor.progress as progress_module

    real_access = os.access
    monkeypatch.setattr(progress_module.os, "access",
                        lambda p, mode: False if Path(p) == tmp_path and mode & os.W_OK else real_access(p, mode))
    refused = sqlite3.OperationalError("unable to open database file")
    refused.sqlite_errorname = "SQLITE_CANTOPEN"
    error = progress_module._unusable(refused, tmp_path / "progress.db")
    assert error.text("en") == (f"cannot use {tmp_path} for distai's saved state: permission denied (set DISTAI_HOME "
                                "to a folder you can write)")
    assert error.text("es").startswith(f"no se puede usar {tmp_path} para lo que distai guarda: permiso denegado")
    (tmp_path / "progress.db").write_bytes(b"")  # there, but not to be opened: SQLite's reason, as before
    assert progress_module._unusable(refused, tmp_path / "progress.db").text("en").endswith(
        "progress.db: the file cannot be opened")
