"""Run folders: every launch keeps its events, exact command, config, per-rank logs and outcome.

Layout of one run (``<root>/<run id>/``)::

    run.json            id, lesson, module, created, command (argv list), config, status,
                        exit_code, duration_s, error, failed_rank, summary
    command.txt         the exact torchrun command, shell-quoted
    events/rank{R}.jsonl  the ranks' structured events (``distai.engine.events``)
    logs/rank{R}.log    each rank's output (stdout and stderr, in arrival order)
    logs/torchrun.log   everything torchrun printed, rank lines included

A run made with ``--run-dir`` lives where the learner put it; its folder's path is appended to
``<root>/elsewhere.txt`` (one path a line), so ``runs list`` and ``runs show last`` find it too.

``exit_code`` is torchrun's exit status (a run stopped by Ctrl-C records what torchrun returned once
stopped, 1 or a signal's; ``distai run`` itself then exits 130, as a shell does for SIGINT).

``status`` is ``running`` while the launcher lives, then ``ok``, ``failed`` or ``stopped``;
a ``running`` run whose launcher process is gone (SIGKILLed, or the machine went down) is
reported as ``killed``, with the last step its events show, and :func:`settle_killed` writes that
into its ``run.json``.
Nothing here imports torch or the tutor: the caller passes the root folder.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..lessons.events import SHARED, STEP, fields_readable, lesson_events
from ..lessons.strings import TranslatedError, strings, translated
from .durable import write_atomic
from .events import read_events, time_span

RUN_FILE = "run.json"
ELSEWHERE_FILE = "elsewhere.txt"  # the folders of the runs made outside the root (--run-dir), one a line
REMOVING_PREFIX = ".removing-"  # a run folder a prune renamed to delete it (engine/prune.py): no longer a run
STATUSES = ("running", "ok", "failed", "stopped", "killed")


class RunNotFound(TranslatedError, LookupError):
    """No run (or more than one) matches the given id (one line in every language: ``text(lang)``)."""

    area = "cli"


@dataclass
class RunRecord:
    id: str
    lesson: str
    module: str
    created: float
    path: str
    command: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    status: str = "running"
    exit_code: int | None = None
    duration_s: float | None = None
    error: str | None = None
    failed_rank: int | None = None
    error_tail: list[str] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    launcher_pid: int | None = None
    # the launcher's start in the kernel's clock ticks since boot (/proc/PID/stat): a pid reused by another
    # process later is not the launcher (None: not known, as on a system without /proc)
    launcher_start: int | None = None
    last_step: int | None = None  # steps done when the launcher was killed or the run stopped (1-based), if any
    host: str = field(default_factory=lambda: _this_host())
    # the longest Ctrl-Z suspension and the shortest wait of its ranks for one another, seconds (None: never
    # suspended): a failure after a suspension that long is explained (the ranks' deadlines ran on meanwhile)
    suspended_s: float | None = None
    ranks_wait_s: float | None = None

    # -- folders -------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.path)

    @property
    def events_dir(self) -> Path:
        return self.dir / "events"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def nodes(self) -> int:
        """The nodes the run spanned (this folder holds one node's part of it)."""
        n = self.config.get("nnodes")
        return n if isinstance(n, int) and n > 0 else 1

    def event_ranks(self) -> set[int]:
        """The ranks that wrote events into this folder (``events/rank{R}.jsonl``): a node's own, in a multi-node run."""
        return {int(p.stem[4:]) for p in self.events_dir.glob("rank*.jsonl") if p.stem[4:].isdigit()}

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / f"rank{rank}.log"

    # -- persistence ---------------------------------------------------------------------------
    def save(self) -> None:
        """Write ``run.json`` atomically and durably (a reader never sees half a file, a power cut leaves the
        old record or the new one: :func:`~.durable.write_atomic`)."""
        write_atomic(self.dir / RUN_FILE, json.dumps(asdict(self), indent=2, ensure_ascii=False).encode("utf-8"))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> RunRecord:
        data = json.loads((Path(directory) / RUN_FILE).read_text(encoding="utf-8"))
        if not isinstance(data, dict):  # null, a list: JSON, but no record
            raise TypeError(f"{RUN_FILE} holds {type(data).__name__}, not a record")
        known = {f for f in cls.__dataclass_fields__}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record._check_fields()
        record.path = str(Path(directory))
        record.id = Path(directory).name  # the folder names the run: a copied folder is a run of its own
        return record

    def _check_fields(self) -> None:
        """TypeError unless every field has its kind of value (a record edited by hand: ``"config": "x"``,
        ``"created": 1e30``), so that every reader can trust them."""
        kinds: dict[str, tuple[type, ...]] = {
            "lesson": (str,), "module": (str,), "created": (int, float), "command": (list,), "argv": (list,),
            "config": (dict,), "status": (str,), "exit_code": (int, type(None)),
            "duration_s": (int, float, type(None)), "error": (str, type(None)), "failed_rank": (int, type(None)),
            "error_tail": (list,), "summary": (dict, type(None)), "launcher_pid": (int, type(None)),
            "launcher_start": (int, type(None)),
            "last_step": (int, type(None)), "host": (str,)}
        for name, allowed in kinds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise TypeError(f"{RUN_FILE}: {name} is {value!r}")
        if not 0 <= self.created < 1e11:  # time.localtime's range: a start a date can show (NaN fails it too)
            raise TypeError(f"{RUN_FILE}: created is {self.created!r}")
        if self.duration_s is not None and not 0 <= self.duration_s < 1e11:  # "Infinity" printed "inf s"
            raise TypeError(f"{RUN_FILE}: duration_s is {self.duration_s!r}")
        if self.launcher_pid is not None and not 0 < self.launcher_pid <= PID_MAX_LIMIT:  # -1 would mean "any process"
            raise TypeError(f"{RUN_FILE}: launcher_pid is {self.launcher_pid!r}")
        if not all(isinstance(x, str) for x in (*self.command, *self.argv, *self.error_tail)):
            raise TypeError(f"{RUN_FILE}: a list holds something other than text")

    def claim_launcher(self) -> None:
        """Make this process the run's launcher: the one whose death means the run was killed."""
        self.launcher_pid, self.launcher_start = os.getpid(), process_start(os.getpid())

    # -- derived -------------------------------------------------------------------------------
    @property
    def effective_status(self) -> str:
        """``killed`` for a run still marked running whose launcher (on this host) is gone."""
        if self.status == "running" and self.host == _this_host() and not launcher_alive(self.launcher_pid,
                                                                                            self.launcher_start):
            return "killed"
        return self.status

    def steps_reached(self) -> tuple[int | None, int | None]:
        """The last training step the ranks reported (counted from 1) and of how many."""
        last = of = None
        for e in self.events():
            if e.get("kind") == STEP.name and isinstance(e.get("step"), int):
                if last is None or e["step"] + 1 >= last:
                    last, of = e["step"] + 1, e.get("of", of)
        return last, of

    @property
    def started(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))

    def events(self) -> list[dict]:
        """Every rank's events, merged in time order (for replays), those whose declared fields do not hold
        their types (a damaged file's ``"step": Infinity``) left out as a torn line is."""
        try:
            kinds = lesson_events(self.lesson) if re.fullmatch(r"\w+", self.lesson) else {k.name: k for k in SHARED}
        except ImportError:  # a lesson this version does not have: its shared kinds are still known
            kinds = {k.name: k for k in SHARED}
        return [e for e in merged_events(self.events_dir) if fields_readable(e, kinds)]

    def log_tail(self, rank: int, lines: int = 15) -> list[str]:
        return tail_lines(self.rank_log(rank), lines)


# The reasons a record keeps (English, as the launcher, the supervisor and the tutor write them) and their
# keys in lessons/catalog/run.toml's ``reasons``: what `distai runs`, the final view and the run panel show
# in the learner's language (a record written before keeps reading).
_REASONS = [(re.compile(pattern, re.S), key) for pattern, key in (
    (r"interrupted \(Ctrl-C\)", "ctrl_c"),
    (r"stopped by (?P<signal>SIG[A-Z]+)", "signal"),
    (r"stopped by the user", "user"),
    (r"stopped from the tutor", "tutor_stop"),
    (r"the run panel was closed", "panel_closed"),
    (r"the tutor was closed", "tutor_closed"),
    (r"the launcher was killed at step (?P<step>\S+)", "killed_at"),
    (r"the launcher was killed before its first step", "killed_first"),
    (r"the launcher of node (?P<node>\d+) was killed \(node 0's record counts the steps\)", "killed_node"),
    (r"the launcher was killed before the run ended", "killed_before_end"),
    (r"rank (?P<rank>\d+) failed: (?P<error>.*)", "rank_failed"),
    (r"a rank on another node failed first: rank (?P<rank>\d+) lost its connection to (?P<addr>\S+) "
     r"\(that node's output says why\)", "other_node"),
    (r"rank (?P<rank>\d+) was killed by (?P<signal>\S+)", "rank_signal"),
    (r"rank (?P<rank>\d+) exited with code (?P<code>-?\d+)", "rank_code"),
    (r"rank (?P<rank>\d+) could not join its process group in time", "join_failed"),
    (r"ranks? (?P<who>\d+(?:, \d+)*) did not arrive(?: at barrier '(?P<name>[^']*)')? within (?P<s>\S+) s "
     r"\(hung or too slow\)", "absent"),
    (r"torchrun exited with code (?P<code>-?\d+)", "torchrun_code"),
    (r"only (?P<joined>\d+) of (?P<nodes>\d+) nodes joined within (?P<s>\d+) s", "nodes_missing"),
    (r"the nodes did not all join the rendezvous in time", "rendezvous_timeout"),
    (r"torchrun was stopped by (?P<signal>.+)", "torchrun_stopped"),
    (r"torchrun was killed by (?P<signal>.+)", "torchrun_killed"),
    (r"torchrun could not resolve a host name \(this machine's own, or --master-addr\)", "unresolved_host"),
    (r"launcher error: (?P<error>.*)", "launcher_error"),
    (r"the live view failed: (?P<error>.*)", "view_failed"),
    (r"run\.json cannot be read: (?P<error>.*)", "damaged"),
    (r"run\.json is cut short or is not JSON", "damaged_json"),
    (r"run\.json is missing", "damaged_missing"),
    (r"run\.json lacks what a run's record holds", "damaged_fields"),
)]


def _os_error_in(text: str, lang: str) -> str:
    """``text``, the catalog's English words for a system error (``os_error``), in ``lang``; other text as it is."""
    english = strings("cli", "en")["os_error"]
    key = next((k for k, words in english.items() if words == text), None)
    return translated("cli", f"os_error.{key}", lang) if key else text


def reason_text(reason: str | None, lang: str) -> str | None:
    """Why a run stopped or failed (``RunRecord.error``), in ``lang``; a reason of another shape as it is."""
    if not reason:
        return reason
    for pattern, key in _REASONS:
        m = pattern.fullmatch(reason)
        if m is None:
            continue
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        if "error" in fields:  # a system error the record keeps in English words ("no space left on the disk")
            fields["error"] = _os_error_in(fields["error"], lang)
        if key == "absent":
            name = fields.pop("name", None)
            fields["n"] = len(fields["who"].split(","))
            fields["at"] = translated("run", "reasons.absent_at", lang, name=name) if name is not None else ""
            fields["s"] = fields["s"].replace(".", ",") if lang == "es" else fields["s"]
        return translated("run", f"reasons.{key}", lang, **fields)
    return reason


_MOE_PHASE = re.compile(r"MoE: (?P<experts>\d+) experts over EP = (?P<ep>\d+) \(× DP = (?P<dp>\d+)\)")


def phase_text(name: str | None, lang: str) -> str | None:
    """A phase an experiment announced (its English name, which the code matches), in ``lang``: the name
    itself, or "<x>: <phase>" ("gpipe: ours and torch.distributed.pipelining") or "<phase>: <x>" ("mesh
    run: pp=2 × dp=2 × tp=2, 1f1b"); a name of another shape as it is."""
    if not name:
        return name
    phases = strings("run", lang)["phases"]
    if name in phases:
        return phases[name]
    m = _MOE_PHASE.fullmatch(name)
    if m:
        return phases["moe"].format(**m.groupdict())
    head, sep, rest = name.partition(": ")
    if sep and rest in phases:
        return f"{head}: {phases[rest]}"
    if sep and head in phases:
        return f"{phases[head]}: {rest}"
    return name


def _this_host() -> str:
    return os.uname().nodename if hasattr(os, "uname") else ""


def _node_rank(command: list[str]) -> int | None:
    """The ``--node-rank`` of a multi-node run's torchrun command, or None (one node, or c10d's, assigned later)."""
    try:
        return int(command[command.index("--node-rank") + 1])
    except (ValueError, IndexError):
        return None


def settle_killed(record: RunRecord) -> RunRecord:
    """A run whose launcher was killed, written down as such (``status: killed``, the last step
    reached) so that its folder says what happened; any other run is returned unchanged."""
    if record.effective_status != "killed" or record.status == "killed":
        return record
    last, of = record.steps_reached()
    record.status, record.last_step = "killed", last
    if record.duration_s is None:  # until its last event: what `runs show` counts, and now `distai runs` too
        span = time_span(record.events())
        record.duration_s = max(0.0, span[1] - record.created) if span else None
    node = _node_rank(record.command)
    if last is None and node:  # only rank 0, on node 0, emits steps: this node's record cannot know how far it got
        record.error = f"the launcher of node {node} was killed (node 0's record counts the steps)"
    else:
        reached = "before its first step" if last is None else f"at step {last}" + (f"/{of}" if of else "")
        record.error = f"the launcher was killed {reached}"
    try:
        record.save()
    except OSError:  # a read-only folder: still reported as killed
        pass
    return record


PID_MAX_LIMIT = 1 << 22  # Linux's largest pid_max (64-bit); no process has a larger id


def _stat_field(pid: int, field: int) -> str | None:
    """Field ``field`` (1-based, as proc(5) numbers them, from 3 on) of ``/proc/PID/stat``, or None where it
    cannot be read (gone, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[field - 3]  # after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """The state of process ``pid`` (``R``, ``S``, ``Z`` for a zombie …: field 3), or None where unreadable."""
    return _stat_field(pid, 3)


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists on this machine and has not ended (one we may not signal counts; a zombie,
    dead but not yet reaped by its parent, does not: its run ended with it)."""
    if not isinstance(pid, int) or not 0 < pid <= PID_MAX_LIMIT:  # 0 and -1 address groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's (its /proc entry may be hidden too)
        return True
    return process_state(pid) not in ("Z", "X")


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of ``/proc/PID/stat``), or None."""
    started = _stat_field(pid, 22)
    return int(started) if started is not None and started.isdigit() else None


def launcher_alive(pid: int | None, started: int | None) -> bool:
    """Whether the launcher ``pid`` (started at ``started``, if known) still runs: the pid exists and is not
    a later process that reused it."""
    if not pid_alive(pid):
        return False
    now = process_start(pid) if started is not None and pid is not None else None
    return now is None or now == started


def new_run_id(lesson: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{lesson}-{secrets.token_hex(2)}"


class RunDirError(ValueError):
    """A ``--run-dir`` that cannot take a run: ``why`` is "empty" (the name), "file" (not a folder) or
    "not_empty" (a folder that holds something else)."""

    def __init__(self, why: str, path: str):
        super().__init__(f"--run-dir {path!r}: {why}")
        self.why, self.path = why, path


def create_run(root: str | os.PathLike, lesson: str, module: str, *, run_dir: str | os.PathLike | None = None,
               argv: Iterable[str] = (), config: dict | None = None) -> RunRecord:
    """Make the run's folder (under ``root``, or exactly ``run_dir``) and its ``run.json``."""
    now = time.time()
    if run_dir is not None:
        if "\0" in str(run_dir):
            raise ValueError(f"a folder name cannot contain a NUL character: {str(run_dir)!r}")
        if not str(run_dir).strip():  # "" would be the current folder, whatever it holds
            raise RunDirError("empty", str(run_dir))
        directory = Path(run_dir).expanduser().resolve()
        if (directory / RUN_FILE).exists():
            raise FileExistsError(f"{directory} already holds a run; choose an empty folder")
        if directory.exists() and not directory.is_dir():
            raise RunDirError("file", str(run_dir))
        if directory.is_dir() and any(directory.iterdir()):  # a run's files never land among the learner's
            raise RunDirError("not_empty", str(run_dir))
        run_id = directory.name
    else:
        run_id = new_run_id(lesson, now)
        directory = Path(root) / run_id
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "events").mkdir(exist_ok=True)
    (directory / "logs").mkdir(exist_ok=True)
    record = RunRecord(id=run_id, lesson=lesson, module=module, created=now, path=str(directory),
                       argv=list(argv), config=dict(config or {}))
    record.claim_launcher()
    record.save()
    if run_dir is not None:
        _note_elsewhere(Path(root), directory)
    return record


def _note_elsewhere(root: Path, directory: Path) -> None:
    """Remember a run folder made outside ``root``. One short appended line: a kill mid-write leaves at most
    a partial last line, which :func:`_elsewhere` skips, never a damaged earlier one. The run does not
    depend on it: a root that cannot be written only keeps the run out of ``runs list``."""
    try:
        if directory.parent == root.expanduser().resolve():
            return  # list_runs finds it already
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ELSEWHERE_FILE, "a", encoding="utf-8") as f:
            f.write(f"{directory}\n")
    except (OSError, ValueError):
        pass


def _elsewhere(root: Path) -> list[Path]:
    """The run folders :func:`_note_elsewhere` remembered that still hold a run and are not ``root``'s own
    (those :func:`list_runs` finds in it), each once."""
    try:
        lines = (root / ELSEWHERE_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    home = root.expanduser().resolve()
    folders = dict.fromkeys(Path(line) for line in lines if line.strip())
    return [folder for folder in folders
            if folder.is_absolute() and folder.parent != home and (folder / RUN_FILE).is_file()]


def set_command(record: RunRecord, command: list[str]) -> None:
    record.command = list(command)
    write_atomic(record.dir / "command.txt", (shlex.join(command) + "\n").encode("utf-8"))
    record.save()


_RUN_ID = re.compile(r"\d{8}-\d{6}-(?P<lesson>.+)-[0-9a-f]{4}")  # new_run_id's names


def list_runs(root: str | os.PathLike, lesson: str | None = None) -> list[RunRecord]:
    """Every run folder under ``root``, and every run made elsewhere with ``--run-dir``, newest first: a
    folder with events or logs but no readable ``run.json`` is listed as damaged (other folders are not runs).
    ``lesson``: that lesson's runs only, the folders named for another lesson not even read (the tutor asks on
    its UI thread: 2,050 runs kept took 0.6 s to read whole)."""
    root = Path(root)
    if not root.is_dir():
        return []
    runs = []
    for child in root.iterdir():
        if child.name.startswith(REMOVING_PREFIX):
            continue
        named = _RUN_ID.fullmatch(child.name) if lesson is not None else None
        if named is not None and named.group("lesson") != lesson:
            continue
        if (child / RUN_FILE).is_file():
            runs.append(load_or_damaged(child))
        elif (child / "events").is_dir() or (child / "logs").is_dir():
            runs.append(_damaged(child, FileNotFoundError()))
    runs.extend(load_or_damaged(folder) for folder in _elsewhere(root))
    if lesson is not None:
        runs = [r for r in runs if r.lesson == lesson]
    return sorted(runs, key=lambda r: r.created, reverse=True)


def load_or_damaged(directory: Path) -> RunRecord:
    """The run in ``directory``, or its damaged record (listed, not hidden: its events may replay)."""
    try:
        return RunRecord.load(directory)
    except (OSError, ValueError, TypeError) as exc:
        return _damaged(directory, exc)


def _created_from_name(name: str) -> float | None:
    """When a run folder named ``<date>-<time>-…`` (``create_run``'s, local time) was made; None for another
    name. A damaged record's folder was touched when it was damaged: its name says when the run started."""
    try:
        return time.mktime(time.strptime(name[:15], "%Y%m%d-%H%M%S"))
    except (ValueError, OverflowError):
        return None


def _damaged(directory: Path, exc: Exception) -> RunRecord:
    """A run folder whose ``run.json`` cannot be read (cut short, edited by hand): what its name and its
    folder still say (``<date>-<time>-<lesson>-<tag>``), status ``damaged``, and why."""
    parts = directory.name.split("-")
    lesson = "-".join(parts[2:-1]) if len(parts) >= 4 else "?"
    created = _created_from_name(directory.name)
    if created is None:
        try:
            created = directory.stat().st_mtime
        except OSError:
            created = 0.0
    if isinstance(exc, FileNotFoundError):
        why = f"{RUN_FILE} is missing"
    elif isinstance(exc, OSError):
        why = f"{RUN_FILE} cannot be read: {exc.strerror or exc}"
    elif isinstance(exc, ValueError):  # json's JSONDecodeError among them
        why = f"{RUN_FILE} is cut short or is not JSON"
    else:
        why = f"{RUN_FILE} lacks what a run's record holds"
    return RunRecord(id=directory.name, lesson=lesson, module="", created=created, path=str(directory),
                     status="damaged", error=why)


def find_run(root: str | os.PathLike, ident: str) -> RunRecord:
    """A run by id, unique id prefix, folder path, or ``last``."""
    path = Path(ident).expanduser()
    if (path / RUN_FILE).is_file():
        return load_or_damaged(path)
    runs = list_runs(root)
    if ident in ("last", "latest"):
        if not runs:
            raise RunNotFound.keyed("runs.errors.none_yet")
        return runs[0]
    exact = [r for r in runs if r.id == ident]
    if exact:
        return exact[0]
    matches = [r for r in runs if r.id.startswith(ident) or ident in r.id]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunNotFound.keyed("runs.errors.no_match", ident=repr(ident))
    raise RunNotFound.keyed("runs.errors.ambiguous", n=len(matches), ident=repr(ident))


def resumable_checkpoints(record: RunRecord) -> Path | None:
    """The checkpoints a new run can go on from: those lesson 3 left in the folder of a run that did not
    finish and kept its own checkpoints there (no ``--ckpt-dir``); None for any other run."""
    checkpoints = record.dir / "checkpoints"
    if record.status in ("ok", "running") or not record.argv or "--ckpt-dir" in record.argv or \
            not any(checkpoints.glob("step_*")):
        return None
    return checkpoints


def merged_events(events_dir: str | os.PathLike) -> list[dict]:
    events: list[dict] = []
    directory = Path(events_dir)
    if directory.is_dir():
        for path in sorted(directory.glob("rank*.jsonl")):
            events.extend(read_events(path))
    events.sort(key=lambda e: e.get("t") or 0.0)
    return events


def tail_lines(path: str | os.PathLike, lines: int = 15) -> list[str]:
    """The last ``lines`` lines of a text file (empty list if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in data.splitlines()[-lines:]]


_RANK_FILE = re.compile(r"rank(\d+)\.(?:jsonl|log)$")


def ranks_in(record: RunRecord) -> list[int]:
    found = set()
    for directory in (record.events_dir, record.logs_dir):
        if directory.is_dir():
            for p in directory.iterdir():
                m = _RANK_FILE.search(p.name)
                if m:
                    found.add(int(m.group(1)))
    return sorted(found)
