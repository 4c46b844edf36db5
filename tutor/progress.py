"""The learner's progress: steps seen, quiz results and runs, in one SQLite database.

Durability: the database runs in WAL mode with ``synchronous=FULL`` and every write is one
transaction, so killing the process mid-write loses nothing that was already committed.

Corruption: a file that is not SQLite, or that fails ``PRAGMA quick_check``, is never wiped.
It is moved aside to ``progress.db.corrupt-<timestamp>`` (with its ``-wal``/``-shm`` files), a
fresh database starts in its place, and :attr:`ProgressStore.recovered_from` holds a one-line
message that the CLI and the tutor show.

Schema: versioned with ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`); migrations run in
order inside one transaction. Other modules (spaced review, …) may keep their own tables in the
same database: use :meth:`ProgressStore.transaction` and ``CREATE TABLE IF NOT EXISTS``.

Progress is keyed on the stable lesson ids and step keys, so it survives content updates:
``summary()`` counts only the steps that the lesson still has.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TypeGuard

from ..lessons.strings import TranslatedError, os_error_text, translated, translations

SCHEMA_VERSION = 2

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE IF NOT EXISTS steps_seen (
        lesson_id  TEXT NOT NULL,
        step_key   TEXT NOT NULL,
        first_seen REAL NOT NULL,
        last_seen  REAL NOT NULL,
        PRIMARY KEY (lesson_id, step_key)
    );
    CREATE TABLE IF NOT EXISTS quiz_answers (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        lesson_id     TEXT NOT NULL,
        question_kind TEXT NOT NULL,
        correct       INTEGER NOT NULL CHECK (correct IN (0, 1)),
        at            REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS quiz_answers_lesson ON quiz_answers (lesson_id, question_kind);
    CREATE TABLE IF NOT EXISTS quiz_sessions (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        lesson_id TEXT NOT NULL,
        correct   INTEGER NOT NULL CHECK (correct >= 0),
        total     INTEGER NOT NULL CHECK (total > 0 AND correct <= total),
        at        REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS quiz_sessions_lesson ON quiz_sessions (lesson_id);
    CREATE TABLE IF NOT EXISTS runs (
        run_id     TEXT PRIMARY KEY,
        lesson_id  TEXT NOT NULL,
        status     TEXT NOT NULL,
        path       TEXT NOT NULL,
        started_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS runs_lesson ON runs (lesson_id);
    """,
    # where the learner is in each lesson (to resume there), apart from the steps done
    2: """
    CREATE TABLE IF NOT EXISTS positions (
        lesson_id TEXT PRIMARY KEY,
        step_key  TEXT NOT NULL,
        at        REAL NOT NULL
    );
    """,
}


#: the tables whose rows belong to a lesson (by its id)
_KEYED_TABLES = ("steps_seen", "quiz_answers", "quiz_sessions", "runs", "positions")


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite found the file damaged (moved aside then) rather than busy, locked, read-only or
    unopenable (left alone: it may hold the learner's progress intact)."""
    name = getattr(exc, "sqlite_errorname", None)
    if name is None:  # an error SQLite raised without a code: only its words say what it is
        return any(w in str(exc) for w in ("malformed", "not a database", "corrupt"))
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


#: SQLite's error names whose reason the learner reads in their language (lessons/catalog/cli.toml's sqlite_error)
_SQLITE_REASONS = (("SQLITE_NOTADB", "notadb"), ("SQLITE_CORRUPT", "corrupt"), ("SQLITE_CANTOPEN", "cantopen"),
                   ("SQLITE_READONLY", "readonly"), ("SQLITE_IOERR", "ioerr"), ("SQLITE_FULL", "full"),
                   ("SQLITE_PERM", "perm"))


def _sqlite_reason(exc: sqlite3.DatabaseError | None) -> Callable[[str], str] | str:
    """Why SQLite refused the database, as a function of the language for the causes it names (not a database,
    damaged, cannot be opened, read-only, a disk error or a full disk), else SQLite's own words; ``exc`` None:
    ``PRAGMA quick_check`` found damage (its report, SQLite's own English, is not the learner's)."""
    name = "SQLITE_CORRUPT" if exc is None else getattr(exc, "sqlite_errorname", None) or ""
    if exc is not None and not name and "not a database" in str(exc):  # raised without a code
        name = "SQLITE_NOTADB"
    key = next((key for prefix, key in _SQLITE_REASONS if name.startswith(prefix)), None)
    if key is None:
        return str(exc)
    return lambda lang: translated("cli", f"sqlite_error.{key}", lang)


LOCK_WAIT_S = 10.0  # how long a write waits for another process's lock before it says so


def _unusable(exc: sqlite3.DatabaseError, path: Path, *, saving: bool = False) -> ProgressError:
    """The one-line error for a database that is fine but cannot be used now: held by another process
    (SQLite's BUSY or LOCKED), or read-only, full, unopenable (its own words, then; a full disk in the
    learner's); ``saving``: a write that failed once begun."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith("SQLITE_CANTOPEN") and not path.exists():
        # a folder the learner cannot write (a read-only home): said as the runs folder says it, with the way out;
        # whether it can be written is the rule every folder option is checked by
        from ..engine.experiment import folder_refusal
        from .paths import data_home_texts

        if (refused := folder_refusal(path.parent)) is not None:
            return ProgressError(texts=data_home_texts(refused, path.parent))
    key = "busy" if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) else "cannot_save" if saving else "cannot_open"
    return ProgressError(texts=translations("cli", "progress." + key, path=path, problem=_sqlite_reason(exc)))


def _cannot_write(exc: BaseException) -> TypeGuard[sqlite3.OperationalError]:
    """Whether a write failed for the disk or the file (full, I/O error, read-only, held), not for the SQL:
    the learner's database is intact and the write is rolled back."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    return isinstance(exc, sqlite3.OperationalError) and name.startswith(
        ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN"))


class ProgressError(TranslatedError):
    """The progress database cannot be used (and was not touched): one line in every language
    (``lessons/catalog/cli.toml``'s ``progress.*``)."""

    area, prefix = "cli", "progress."


def _timestamp(at) -> float:
    if at is None:
        return time.time()
    if isinstance(at, datetime):
        return at.timestamp()
    return float(at)


class ProgressStore:
    """The progress database. ``ProgressStore()`` opens ``progress_db_path()``."""

    def __init__(self, path: str | os.PathLike | None = None):
        if path is None:
            from .paths import progress_db_path

            path = progress_db_path()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        #: that a corrupt database was moved aside, in each language (empty if it was not): :meth:`recovered_text`
        self.recovered_texts: dict[str, str] = {}
        #: Where the corrupt database went, or None.
        self.moved_to: Path | None = None
        self._lock = threading.RLock()
        self._depth = 0
        self._conn = self._open_checked()
        try:
            self._migrate()
            self._rekey_former_names()
        except sqlite3.OperationalError as exc:  # locked past the timeout, read-only, a full disk …
            self._conn.close()
            raise _unusable(exc, self.path) from None

    # -- opening -----------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; we BEGIN/COMMIT ourselves.
        conn = sqlite3.connect(str(self.path), timeout=LOCK_WAIT_S, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        return conn

    def _open_checked(self) -> sqlite3.Connection:
        existed = self.path.exists() and self.path.stat().st_size > 0
        conn = None
        try:
            conn = self._connect()
            problem: Callable[[str], str] | str | None = None
            if existed and [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()] != ["ok"]:
                problem = _sqlite_reason(None)
            self._configure(conn)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if problem is None:
                return conn
        except sqlite3.DatabaseError as exc:
            if not _is_corruption(exc):  # locked by another process, read-only, cannot be opened: the file is
                if conn is not None:     # the learner's progress all the same, and stays where it is
                    conn.close()
                raise _unusable(exc, self.path) from None
            problem = _sqlite_reason(exc)
        if conn is not None:
            conn.close()
        if not existed:
            raise ProgressError.keyed("cannot_open", path=self.path, problem=problem)
        self._move_aside(problem)
        conn = self._connect()
        self._configure(conn)
        return conn

    @staticmethod
    def _configure(conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # e.g. a file system without shared memory
            conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")

    def _move_aside(self, problem: Callable[[str], str] | str) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            os.replace(self.path, target)
            for suffix in ("-wal", "-shm", "-journal"):
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    os.replace(side, target.with_name(target.name + suffix))
        except OSError as exc:
            refused = exc  # the except clause unbinds exc; the texts are made at once all the same
            raise ProgressError.keyed("cannot_move", path=self.path, problem=problem,
                                      error=lambda lang: os_error_text(refused, lang)) from None
        self.moved_to = target
        self.recovered_texts = translations("cli", "progress.recovered", problem=problem, target=target)

    @property
    def recovered_from(self) -> str | None:
        """One line saying that a corrupt database was moved aside (English), or None."""
        return self.recovered_texts.get("en")

    def recovered_text(self, lang: str) -> str | None:
        """That a corrupt database was moved aside and a fresh one started, in ``lang``; None if not."""
        return self.recovered_texts.get(lang)

    def _migrate(self) -> None:
        with self.connection() as conn:  # most opens find it current: no write lock taken (a WAL read waits for none)
            if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return
        with self.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ProgressError.keyed("newer", path=self.path, version=version, schema=SCHEMA_VERSION)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {int(target)}")

    def _rekey_former_names(self) -> None:
        """Rows saved under a lesson's slug or a former slug (the capstone's ``3d-parallelism``) become
        its id's, so a renamed lesson keeps every step, answer, session, run and position saved for it;
        where the id already has the same step or a position, that row stays and the other goes."""
        from ..lessons.registry import all_lessons

        renames = [(name, lesson.id) for lesson in all_lessons() for name in lesson.names if name != lesson.id]
        marks = ", ".join("?" * len(renames))
        with self.connection() as conn:  # most opens find none: no write lock taken
            found = renames and any(conn.execute(f"SELECT 1 FROM {table} WHERE lesson_id IN ({marks}) LIMIT 1",
                                                 [old for old, _ in renames]).fetchone() for table in _KEYED_TABLES)
        if not found:
            return
        with self.transaction() as conn:
            for table in _KEYED_TABLES:
                for old, new in renames:
                    conn.execute(f"UPDATE OR IGNORE {table} SET lesson_id = ? WHERE lesson_id = ?", (new, old))
                    conn.execute(f"DELETE FROM {table} WHERE lesson_id = ?", (old,))

    # -- plumbing for other modules ------------------------------------------------------------
    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The raw connection (autocommit: wrap writes in :meth:`transaction`)."""
        with self._lock:
            yield self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back on error).

        Nested calls join the outer transaction.
        """
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # another process held the write lock past the timeout
                raise _unusable(exc, self.path) from None
            self._depth = 1
            try:
                yield self._conn
                self._depth = 0
                self._conn.execute("COMMIT")  # a full disk may fail here, after every statement went through
            except BaseException as exc:
                self._depth = 0
                if self._conn.in_transaction:  # SQLite rolls some failures back itself (a full disk at COMMIT)
                    with contextlib.suppress(sqlite3.Error):  # the failure to say is the one that brought us here
                        self._conn.execute("ROLLBACK")
                if _cannot_write(exc):
                    raise _unusable(exc, self.path, saving=True) from None
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ProgressStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- steps ---------------------------------------------------------------------------------
    def mark_step_seen(self, lesson_id: str, step_key: str) -> None:
        now = time.time()
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO steps_seen (lesson_id, step_key, first_seen, last_seen) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (lesson_id, step_key) "
                "DO UPDATE SET last_seen = excluded.last_seen",
                (lesson_id, step_key, now, now))

    def steps_seen(self, lesson_id: str) -> set[str]:
        with self.connection() as conn:
            rows = conn.execute("SELECT step_key FROM steps_seen WHERE lesson_id = ?",
                                (lesson_id,)).fetchall()
        return {r[0] for r in rows}

    def set_position(self, lesson_id: str, step_key: str) -> None:
        """The step the learner is on (shown, not yet done: see ``mark_step_seen``)."""
        with self.transaction() as conn:
            conn.execute("INSERT INTO positions (lesson_id, step_key, at) VALUES (?, ?, ?) "
                         "ON CONFLICT (lesson_id) DO UPDATE SET step_key = excluded.step_key, at = excluded.at",
                         (lesson_id, step_key, time.time()))

    def last_step_seen(self, lesson_id: str) -> str | None:
        """The step the learner was on most recently in this lesson (to resume there)."""
        with self.connection() as conn:
            row = conn.execute("SELECT step_key, at FROM positions WHERE lesson_id = ?", (lesson_id,)).fetchone()
            done = conn.execute("SELECT step_key, last_seen FROM steps_seen WHERE lesson_id = ? "
                                "ORDER BY last_seen DESC LIMIT 1", (lesson_id,)).fetchone()
        latest = max((r for r in (row, done) if r), key=lambda r: r[1], default=None)
        return latest[0] if latest else None

    # -- quizzes -------------------------------------------------------------------------------
    def record_quiz_answer(self, lesson_id: str, question_kind: str, correct: bool, *,
                           at=None) -> None:
        """One answered question; ``at`` is a datetime or epoch seconds (default: now)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO quiz_answers (lesson_id, question_kind, correct, at) VALUES (?,?,?,?)",
                (lesson_id, question_kind, 1 if correct else 0, _timestamp(at)))

    def quiz_answers(self, lesson_id: str | None = None) -> list[dict]:
        """Answered questions, oldest first: dicts with lesson_id, question_kind, correct, at."""
        rows = self._select("SELECT lesson_id, question_kind, correct, at FROM quiz_answers", lesson_id,
                            "at, id")
        return [{"lesson_id": r[0], "question_kind": r[1], "correct": bool(r[2]), "at": r[3]}
                for r in rows]

    def record_quiz_session(self, lesson_id: str, correct: int, total: int, *, at=None) -> None:
        """A finished quiz: ``correct`` right answers out of ``total`` questions."""
        correct, total = int(correct), int(total)
        if total <= 0 or not 0 <= correct <= total:
            raise ValueError(f"a quiz score needs 0 <= correct <= total and total > 0, "
                             f"got {correct}/{total}")
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO quiz_sessions (lesson_id, correct, total, at) VALUES (?,?,?,?)",
                (lesson_id, correct, total, _timestamp(at)))

    def best_quiz_score(self, lesson_id: str) -> float | None:
        """The best finished quiz as a fraction in [0, 1], or None if none was taken."""
        with self.connection() as conn:
            row = conn.execute(
                "SELECT max(CAST(correct AS REAL) / total) FROM quiz_sessions WHERE lesson_id = ?",
                (lesson_id,)).fetchone()
        return None if row[0] is None else float(row[0])

    # -- runs ----------------------------------------------------------------------------------
    def record_run(self, run_id: str, lesson_id: str, status: str, path) -> None:
        """Insert a run or update its status/path (the start time is kept)."""
        now = time.time()
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, lesson_id, status, path, started_at, updated_at) "
                "VALUES (?,?,?,?,?,?) ON CONFLICT (run_id) DO UPDATE SET "
                "lesson_id = excluded.lesson_id, status = excluded.status, "
                "path = excluded.path, updated_at = excluded.updated_at",
                (run_id, lesson_id, status, str(path), now, now))

    def runs(self, lesson_id: str | None = None) -> list[dict]:
        """Recorded runs, newest first. The status is the run's own record's where its folder still holds
        one: a launcher killed by SIGKILL never came back to write its end here, and its record says killed."""
        from ..engine.runs import RunRecord  # the run folder's record, not torch

        rows = [dict(r) for r in self._select(
            "SELECT run_id, lesson_id, status, path, started_at, updated_at FROM runs", lesson_id,
            "started_at DESC, rowid DESC")]
        for row in rows:
            if row["status"] == "running":
                with contextlib.suppress(OSError, ValueError, TypeError):  # gone or damaged: as stored
                    row["status"] = RunRecord.load(row["path"]).effective_status
        return rows

    # -- the tutor's settings (the theme): a table of its own, made by the first one saved, so that opening
    # takes no write lock and an older distai reads this database as before
    def setting(self, name: str) -> str | None:
        with self.connection() as conn:
            try:
                row = conn.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # nothing saved yet
                    return None
                raise
        return row[0] if row else None

    def set_setting(self, name: str, value: str) -> None:
        with self.transaction() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("INSERT INTO settings (name, value) VALUES (?, ?) "
                         "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))

    def _select(self, sql: str, lesson_id: str | None, order: str) -> list:
        """The rows of ``sql``, of one lesson when ``lesson_id`` is given, in ``order``."""
        args: tuple = ()
        if lesson_id is not None:
            sql += " WHERE lesson_id = ?"
            args = (lesson_id,)
        with self.connection() as conn:
            return conn.execute(f"{sql} ORDER BY {order}", args).fetchall()

    # -- overview ------------------------------------------------------------------------------
    def summary(self) -> dict[str, dict]:
        """Per lesson id: steps_done, steps_total, best_quiz (fraction or None), runs (count).

        Only steps the lesson still has count, so renamed or removed steps do not inflate it.
        """
        from ..lessons.registry import all_lessons

        with self.connection() as conn:
            seen: dict[str, set[str]] = {}
            for lesson_id, key in conn.execute("SELECT lesson_id, step_key FROM steps_seen"):
                seen.setdefault(lesson_id, set()).add(key)
            best = {r[0]: float(r[1]) for r in conn.execute(
                "SELECT lesson_id, max(CAST(correct AS REAL) / total) FROM quiz_sessions "
                "GROUP BY lesson_id")}
            runs = {r[0]: int(r[1]) for r in conn.execute(
                "SELECT lesson_id, count(*) FROM runs GROUP BY lesson_id")}
        out = {}
        for lesson in all_lessons():
            keys = {s.key for s in lesson.steps}
            out[lesson.id] = {
                "steps_done": len(keys & seen.get(lesson.id, set())),
                "steps_total": len(keys),
                "best_quiz": best.get(lesson.id),
                "runs": runs.get(lesson.id, 0),
            }
        return out


def _optional_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def lesson_mastery(store, lesson_id: str) -> float | None:
    """Spaced-review mastery of a lesson (``distai.tutor.review.mastery``: the share of its question
    kinds in Leitner box 3 or higher), or None before the learner answered any of its questions."""
    review = _optional_module("distai.tutor.review")
    quiz = _optional_module("distai.lessons.quiz")
    if store is None or review is None or quiz is None:
        return None
    if not review.review_items(store, lesson_id):
        return None
    from ..lessons.registry import resolve_lesson

    lesson = resolve_lesson(lesson_id)
    if _optional_module(f"{lesson.package}.quiz") is None:
        return None
    return review.mastery(store, lesson_id, len(quiz.generators(lesson_id)))
