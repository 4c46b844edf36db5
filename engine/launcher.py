"""Launch an experiment through PyTorch's own launcher (torchrun) and stream its events live.

``Launch(spec, record, consumer).run()`` starts ``python -m torch.distributed.run … -m
<experiment> <args>`` as a subprocess in a session of its own, tails the ranks'
``events/rank*.jsonl`` and torchrun's output, and hands every event to ``consumer(event)`` in
the calling thread within about 0.1 s of its emission. Besides the ranks' events the consumer
sees ``run_start`` (the command, ranks and device), ``output`` (a line a rank, or torchrun with
``rank`` None, printed) and ``run_end`` (status, exit code, the error and the failed rank's last
lines), declared in ``lessons/events.py``.

Stopping (``stop()``, Ctrl-C in the caller, a rank dying): torchrun's whole process group gets
SIGTERM — torchrun then stops its workers, which run in sessions of their own — and whatever
is left of the run after a grace period gets SIGKILL. "What is left" is found by scanning
``/proc`` for processes carrying this run's ``DISTAI_RUN_ID`` in their environment, so no
worker outlives its run even if torchrun itself was killed first. When the launcher itself is
SIGKILLed, nothing of it runs: the kernel kills torchrun (its parent-death signal) and
each rank kills itself when torchrun or the launcher is gone (:mod:`distai.engine.lifeline`).

Nothing here imports torch (``visible_cuda_devices`` does, lazily, when a GPU may exist) or the
tutor; the caller chooses the runs folder.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..lessons.events import ERROR, OUTPUT, PHASE, RUN_END, RUN_START, SUMMARY, Error
from ..lessons.strings import FALLBACK, LANG_ENV, TranslatedError, os_error_text, translated
from .events import JOIN_FAILED_EXIT, backend_for, is_number, parse_event
from .lifeline import LAUNCHER_PID_ENV, parent_death_signal
from .profiling import PROFILE_DIR_ENV, is_profiler_trace_line
from .runs import RunRecord, process_state, set_command, tail_lines

MAX_PROCS = 1024
MAX_CPU_PROCS = 256
DEFAULT_CPU_PROCS = 4
RUN_ID_ENV = "DISTAI_RUN_ID"
POLL_S = 0.05

Consumer = Callable[[dict], None]


#: the oldest torch every experiment runs on: lesson 5's pipelining schedules need 2.8 (2.6 and 2.7 hang two
#: minutes in torch's own schedule), lessons 2 and 3's FSDP2 and asynchronous checkpoints 2.7, lesson 4's and the
#: capstone's DTensor and DeviceMesh 2.5 (an audit ran every lesson on torch 2.4 to 2.15)
MIN_TORCH = (2, 8)


class TorchTooOld(TranslatedError):
    """This Python's torch predates what the experiments use: one line, in the learner's language."""

    area, prefix = "run", "torch."


def check_torch_version() -> None:
    """Raise :class:`TorchTooOld` when the installed torch is older than :data:`MIN_TORCH`; read from the
    package's metadata, without importing torch (the CLI and the tutor start without it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("torch")
    except PackageNotFoundError:
        return  # torchrun itself then says it is missing
    numbers = tuple(int(n) for n in re.findall(r"\d+", found.split("+")[0])[:2])
    if numbers < MIN_TORCH:
        raise TorchTooOld.keyed("too_old", need=".".join(map(str, MIN_TORCH)), found=found)


class LaunchError(Exception):
    """A launch request that cannot be honoured; one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# -- where the ranks run -------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    device: str  # "cuda" or "cpu"
    nproc: int  # processes on this node
    note: str | None = None  # one line to show the learner (e.g. the CPU fallback)


def visible_cuda_devices() -> int:
    """CUDA devices this process can use (cheap when there is clearly no NVIDIA driver)."""
    if sys.platform == "darwin":
        return 0
    if sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*") \
            and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_count(flag: str, value: int, limit: int, lang: str = "en") -> None:
    if value <= 0:
        raise LaunchError(translated("run", "placement.at_least_one", lang, flag=flag, value=value))
    if value > limit:
        raise LaunchError(translated("run", "placement.too_many", lang, flag=flag, value=value, limit=limit))


def choose_placement(gpus: int | None = None, cpu: int | None = None,
                     cuda_count: int | None = None, default_nproc: int = DEFAULT_CPU_PROCS,
                     lang: str = "en") -> Placement:
    """``--gpus N`` / ``--cpu N`` (or neither) → where and how many processes to run; its note and
    its one-line refusals in ``lang``.

    Neither: ``default_nproc`` (the lesson's ``ranks``) GPUs when at least two are visible
    (fewer if fewer are), else that many CPU processes."""
    say = lambda key, **f: translated("run", f"placement.{key}", lang, **f)  # noqa: E731
    if gpus is not None and cpu is not None:
        raise LaunchError(say("not_both"))
    if cpu is not None:
        _check_count("--cpu", cpu, MAX_CPU_PROCS, lang)
        return Placement("cpu", cpu)
    if gpus is not None:
        _check_count("--gpus", gpus, MAX_PROCS, lang)
    count = visible_cuda_devices() if cuda_count is None else cuda_count
    if gpus is None:
        if count >= 2:
            return Placement("cuda", min(count, default_nproc))
        return Placement("cpu", default_nproc, None if count == 0 else say("one_gpu", n=default_nproc))
    if count == 0:
        return Placement("cpu", gpus, say("no_cuda", n=gpus))
    if count < gpus:
        raise LaunchError(say("too_few_gpus" if count != 1 else "one_gpu_visible", gpus=gpus, count=count))
    return Placement("cuda", gpus)


# -- the torchrun command ------------------------------------------------------------------------
@dataclass
class LaunchSpec:
    module: str  # the experiment, run as ``-m module``
    placement: Placement
    args: list[str] = field(default_factory=list)  # passed to the experiment unchanged
    nnodes: int = 1
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # "static": --node-rank/--master-addr/--master-port as given; "c10d": torchrun's dynamic
    # rendezvous at master-addr:master-port (node ranks assigned as agents arrive).
    rdzv_backend: str = "static"
    rdzv_id: str | None = None
    join_timeout: int | None = None  # seconds the nodes wait for each other (torchrun's rendezvous; None: its own)
    debug: bool = False  # TORCH_DISTRIBUTED_DEBUG=DETAIL (slower collectives, more checks)
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0  # torchrun's in-place restarts of the whole group (engine.supervisor relaunches)
    profile: bool = False  # torch.profiler around each rank's work, traces in <run>/profile (engine.profiling)
    lang: str | None = None  # the learner's language: the ranks print their summary in it (DISTAI_LANG)

    @property
    def multinode(self) -> bool:
        return self.nnodes > 1 or self.master_addr is not None

    def global_rank(self, local_rank: int) -> int:
        return (self.node_rank or 0) * self.placement.nproc + local_rank


def validate_text(flag: str, value: str | None, lang: str = "en") -> None:
    """A value that goes into torchrun's command line: printable, no whitespace or NUL."""
    if value is not None and (not value or any(not c.isprintable() or c.isspace() for c in value)):
        raise LaunchError(translated("run", "nodes.text", lang, flag=flag, value=repr(value)))


def validate_args(args: list[str], lang: str = "en") -> None:
    """Options passed through to the experiment: anything a command line can carry (no NUL)."""
    for arg in args:
        if "\0" in arg:
            raise LaunchError(translated("run", "nodes.nul", lang, value=repr(arg)))


def validate_nodes(nnodes: int, node_rank: int | None, master_addr: str | None, master_port: int | None,
                   rdzv_backend: str = "static", rdzv_id: str | None = None, lang: str = "en",
                   join_timeout: int | None = None) -> None:
    """The multi-node flags, or a one-line LaunchError in ``lang``."""
    say = lambda key, **f: translated("run", f"nodes.{key}", lang, **f)  # noqa: E731
    validate_text("--master-addr", master_addr, lang)
    validate_text("--rdzv-id", rdzv_id, lang)
    if rdzv_backend not in ("static", "c10d"):
        raise LaunchError(say("rdzv_backend", value=repr(rdzv_backend)))
    if rdzv_backend == "c10d" and not master_addr:
        raise LaunchError(say("c10d_addr"))
    if nnodes < 1 or nnodes > MAX_PROCS:
        raise LaunchError(say("nnodes", limit=MAX_PROCS, value=nnodes))
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise LaunchError(say("node_rank", last=nnodes - 1, value=node_rank))
    if master_port is not None and not 1 <= master_port <= 65535:
        raise LaunchError(say("master_port", value=master_port))
    if nnodes > 1 and not master_addr:
        raise LaunchError(say("master_addr"))
    if nnodes > 1 and node_rank is None and rdzv_backend == "static":
        raise LaunchError(say("needs_node_rank"))
    if join_timeout is not None and nnodes < 2:
        raise LaunchError(say("join_timeout_one_node"))
    if join_timeout is not None and not 1 <= join_timeout <= 86400:
        raise LaunchError(say("join_timeout", value=join_timeout))


def route_towards(address: str | None) -> tuple[str, str] | None:
    """The network interface and local address this machine reaches ``address`` through (Linux), or None where
    it is this machine's loopback, cannot be resolved, or has no route. A UDP socket's connect sends nothing: the
    kernel only chooses the route."""
    import fcntl
    import socket
    import struct

    if not address:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))
            local = probe.getsockname()[0]
            if local.startswith("127."):  # node 0 is this machine's loopback: nothing to choose
                return None
            for _index, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
                if socket.inet_ntoa(packed[20:24]) == local:
                    return name, local
    except OSError:
        return None
    return None


def torchrun_command(spec: LaunchSpec, log_dir: str | os.PathLike,
                     local: tuple[str, str] | None = None) -> list[str]:
    """The exact command: single node → ``--standalone`` (torchrun picks a free port itself, so
    two runs at once never collide); several nodes → the flags passed through unchanged, and ``local`` (the
    interface and address that reach node 0, :func:`route_towards`) as torchrun's own address: else the other
    nodes are told this node's hostname, which Debian and Ubuntu resolve to 127.0.1.1."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.placement.nproc)]
    if spec.multinode:
        cmd += ["--nnodes", str(spec.nnodes)]
        if local is not None:
            cmd += ["--local-addr", local[1]]
        if spec.rdzv_backend == "c10d":  # node ranks come from the rendezvous, not from --node-rank
            endpoint = f"{spec.master_addr}:{spec.master_port or 29400}"
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", spec.rdzv_id or "distai"]
        if spec.join_timeout is not None:  # the static rendezvous' key, and c10d's (both torchrun's --rdzv-conf)
            key = "join_timeout" if spec.rdzv_backend == "c10d" else "timeout"
            cmd += ["--rdzv-conf", f"{key}={spec.join_timeout}"]
        if spec.rdzv_backend != "c10d":
            if spec.node_rank is not None:
                cmd += ["--node-rank", str(spec.node_rank)]
            if spec.master_addr is not None:
                cmd += ["--master-addr", spec.master_addr]
            if spec.master_port is not None:
                cmd += ["--master-port", str(spec.master_port)]
    else:
        cmd += ["--standalone"]
    cmd += ["--max-restarts", str(spec.max_restarts), "--tee", "3", "--log-dir", str(log_dir)]
    cmd += ["-m", spec.module, *spec.args]
    return cmd


# -- processes of a run ------------------------------------------------------------------------------
def run_processes(run_id: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``DISTAI_RUN_ID=run_id`` (Linux)."""
    needle = f"{RUN_ID_ENV}={run_id}\0".encode()
    found = []
    me = os.getpid()
    for env_path in glob.glob("/proc/[0-9]*/environ"):
        pid = int(env_path.split("/")[2])
        if pid == me:
            continue
        try:
            with open(env_path, "rb") as f:
                if needle not in f.read() + b"\0":
                    continue
        except OSError:
            continue
        if process_state(pid) not in (None, "Z", "X"):  # None: gone since
            found.append(pid)
    return found


def _signal_pid_and_group(pid: int, sig: int) -> None:
    for fn, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            fn(target, sig)
        except (ProcessLookupError, PermissionError, OSError):
            pass


# -- failure analysis ------------------------------------------------------------------------------
# a rank's line: its role and local rank (its global one under c10d: Launch.start); torchrun's own report numbers
# its failures "[0]:", no role
_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+?)(?P<rank>\d+)\]:(?P<text>.*)$")
_BARRIER = re.compile(r"Ranks? (?P<ranks>\d+(?:\s*,\s*\d+)*) failed to pass monitoredBarrier in (?P<ms>\d+) ms")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+)(?:\s*\(pid:\s*(?P<pid>\d+)\))?")
# torchrun's own signals to its workers (torch/distributed/elastic/multiprocessing/api.py): the SIGTERM it sends the
# survivors of a failure, and the SIGKILL that follows when one does not end within its 30 s
_TORCHRUN_TERM = re.compile(r"Sending process (?P<pid>\d+) closing signal SIGTERM")
_NODES_JOINED = re.compile(r"Timed out after (?P<s>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<nodes>\d+) "
                           r"clients joined")
_TORCHRUN_SIGNALLED = re.compile(r"SignalException: Process \d+ got signal: (?P<sig>\d+)")
_TORCHRUN_KILL = re.compile(r"Unable to shutdown process (?P<pid>\d+) via \S+, forcefully exiting via (?:9|\S*SIGKILL)")
_CHECKPOINT = re.compile(r"checkpoint '(?P<name>[^']+)'")
# gloo's words for a peer whose process went away mid-collective (pair.cc): its address, where a multi-node
# run's failure began when every rank of this node says only this
_PEER_LOST = re.compile(r"(?:Read|Write) error \[(?P<addr>[^\]]+)\]:\d+: (?:Connection reset by peer|Broken pipe)"
                        r"|Connection closed by peer \[(?P<closed>[^\]]+)\]")


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass
class Failure:
    rank: int | None
    message: str
    reporter: int | None = None  # the rank whose error revealed it (for a hang: who waited)


def analyse_failure(error_events: Sequence[Mapping[str, Any]], torchrun_lines: list[str], exit_code: int,
                    torchrun_warns: bool = True, multinode: bool = False) -> Failure:
    """Which rank failed first, and why: a missed barrier names the absent rank; otherwise the
    earliest ``error`` event; otherwise torchrun's "root cause" report. ``torchrun_warns``: torchrun's
    warnings reach its output (``TORCH_LOGS`` can silence them), so a signal it sent is in its lines.
    ``multinode``: where every rank of this node failed only on a peer's closed connection, the failure
    began on another node (this node's first rank to see it reports it)."""
    texts = [e.get("error", "") + "\n" + e.get("traceback", "") for e in error_events] + torchrun_lines
    reporters = [e.get("rank") for e in error_events] + [None] * len(torchrun_lines)
    for text, reporter in zip(texts, reporters):
        m = _BARRIER.search(text)
        if m:
            ranks = [int(r) for r in re.split(r"\s*,\s*", m.group("ranks"))]
            where = _CHECKPOINT.search(text)
            at = f" at barrier '{where.group('name')}'" if where else ""
            who = ", ".join(str(r) for r in ranks)
            return Failure(ranks[0], f"rank{'s' if len(ranks) > 1 else ''} {who} did not arrive{at} "
                                     f"within {int(m.group('ms')) / 1000:g} s (hung or too slow)", reporter)
    rank, code = _root_cause(torchrun_lines)
    # a rank killed by a signal reports nothing; its peers' errors (a closed connection) follow it,
    # and torchrun may even name such a peer as the root cause (it saw its error file first).
    # SIGTERM is how torchrun stops the survivors once a rank has failed, and its root cause ties on
    # whole-second timestamps, so a SIGTERM'd rank is the culprit only when no rank reported an error
    # nor exited on its own (a positive code: an argument refused before any event, `context --cpu 3`).
    # torchrun names the pid of each failed rank and of each rank it signalled itself: a SIGTERM it did not send
    # came from outside (the rank is the culprit, its peers' closed connections follow), and a SIGKILL it did
    # send ended a rank that would not stop (frozen, SIGSTOPped): the culprit is then who reported the hang
    reported = {e.get("rank") for e in error_events}
    reported_with_pids = _reported_failures(torchrun_lines)
    failures = [(r, c) for r, c, _pid in reported_with_pids]
    pids = {r: pid for r, _c, pid in reported_with_pids if pid is not None}
    termed = {int(m.group("pid")) for line in torchrun_lines if (m := _TORCHRUN_TERM.search(line))}
    forced = {int(m.group("pid")) for line in torchrun_lines if (m := _TORCHRUN_KILL.search(line))}
    signals_seen = bool(termed) or torchrun_warns  # a SIGTERM torchrun sent would be in its lines
    exited_on_its_own = any(c > 0 for _r, c in failures)

    def killed_silently(r: int | None, c: int | None) -> bool:
        if r is None or c is None or c >= 0 or r in reported:
            return False
        pid = pids.get(r)
        if c == -signal.SIGKILL and pid in forced:
            return False  # torchrun's own SIGKILL, after its SIGTERM went unheeded
        if c == -signal.SIGTERM and pid is not None and pid not in termed and signals_seen:
            return True  # a SIGTERM from outside torchrun
        return not ((error_events or exited_on_its_own) and c == -signal.SIGTERM)

    silent = [(r, c) for r, c in failures if killed_silently(r, c)]
    killed_otherwise = [(r, c) for r, c in silent if c != -signal.SIGTERM]
    if silent and not killed_silently(rank, code):
        rank, code = silent[0]
    elif code == -signal.SIGTERM and killed_otherwise:  # a SIGKILL (the OOM killer) before torchrun's SIGTERMs
        rank, code = killed_otherwise[0]
    elif not error_events and code == -signal.SIGTERM and exited_on_its_own:  # torchrun's SIGTERM, not the cause
        rank, code = next((r, c) for r, c in failures if c > 0)
    if error_events and not killed_silently(rank, code):
        first = min(error_events, key=lambda e: e.get("t", 0.0))
        lost = [_PEER_LOST.search(e.get("error", "")) for e in error_events]
        peer = lost[error_events.index(first)]
        if multinode and peer is not None and all(lost) and all(r in reported for r, _c in failures):
            return Failure(first.get("rank"), f"a rank on another node failed first: rank {first.get('rank')} lost "
                                              f"its connection to {peer.group('addr') or peer.group('closed')} "
                                              f"(that node's output says why)", first.get("rank"))
        return Failure(first.get("rank"), f"rank {first.get('rank')} failed: {first.get('error', '?')}",
                       first.get("rank"))
    if rank is not None and code == JOIN_FAILED_EXIT:
        return Failure(rank, f"rank {rank} could not join its process group in time")
    if rank is not None:
        how = f"was killed by {_signal_name(code)}" if code is not None and code < 0 else f"exited with code {code}"
        return Failure(rank, f"rank {rank} {how}")
    return _torchrun_failure(torchrun_lines, exit_code)


def _torchrun_failure(torchrun_lines: list[str], exit_code: int) -> Failure:
    """No rank to name: why torchrun itself ended (the nodes that never met, a signal, a name that does not
    resolve), from its lines and exit status."""
    joined = next((m for line in torchrun_lines if (m := _NODES_JOINED.search(line))), None)
    if joined is not None:  # static rendezvous: node 0's store waited for the other nodes' agents
        return Failure(None, f"only {joined.group('joined')} of {joined.group('nodes')} nodes joined within "
                             f"{joined.group('s')} s")
    if any("RendezvousTimeoutError" in line for line in torchrun_lines):  # c10d's
        return Failure(None, "the nodes did not all join the rendezvous in time")
    stopped = next((m for line in torchrun_lines if (m := _TORCHRUN_SIGNALLED.search(line))), None)
    if stopped is not None:  # torchrun itself was sent a signal (its traceback says which), not one of its ranks
        return Failure(None, f"torchrun was stopped by {_signal_name(-int(stopped.group('sig')))}")
    if exit_code < 0:
        return Failure(None, f"torchrun was killed by {_signal_name(exit_code)}")
    if any("socket.gaierror" in line for line in torchrun_lines):  # c10d resolves this machine's own hostname too
        return Failure(None, "torchrun could not resolve a host name (this machine's own, or --master-addr)")
    return Failure(None, f"torchrun exited with code {exit_code}")


def _root_cause(torchrun_lines: list[str]) -> tuple[int | None, int | None]:
    """The rank and exit code of torchrun's "Root Cause (first observed failure)" report (torchrun
    lists every failed rank, the ones it stopped included, and then the root cause: prefer it)."""
    roots = [i for i, line in enumerate(torchrun_lines) if "Root Cause" in line]
    failures = _reported_failures(torchrun_lines[roots[-1]:] if roots else torchrun_lines)
    return failures[0][:2] if failures else (None, None)


def _reported_failures(torchrun_lines: list[str]) -> list[tuple[int, int, int | None]]:
    """Every (rank, exit code, pid) of torchrun's failure report, in the order it lists them."""
    out: list[tuple[int, int, int | None]] = []
    rank = None
    for line in torchrun_lines:
        m = _ROOT_RANK.match(line)
        if m:
            rank = int(m.group("rank"))
            continue
        m = _ROOT_EXIT.match(line)
        if m and rank is not None:
            out.append((rank, int(m.group("code")), int(m.group("pid")) if m.group("pid") else None))
            rank = None
    return out


def _trim(lines: list[str]) -> list[str]:
    """Drop blank lines at both ends, and Kineto's trace-point lines (``--profile``): a rank's last words,
    not the profiler's."""
    lines = [line for line in lines if not is_profiler_trace_line(line)]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


# -- the launch ------------------------------------------------------------------------------------
class Stoppable:
    """A run the user can stop (:class:`Launch`, and the Supervisor that relaunches it): once a
    stop is asked for, with its reason, the run is ``stopping`` until it ends."""

    _stop_reason: str | None = None
    record: RunRecord

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    def signal_processes(self, sig: int) -> None:
        """Send ``sig`` to every live process of the run, torchrun and its ranks whatever their process group
        (Ctrl-Z's SIGSTOP, then the SIGCONT of ``fg`` or ``bg``)."""
        for pid in run_processes(self.record.id):
            try:
                os.kill(pid, sig)
            except OSError:  # ended since
                pass


class Launch(Stoppable):
    """One run of an experiment. ``run()`` blocks, feeding ``consumer`` in the calling thread."""

    def __init__(self, spec: LaunchSpec, record: RunRecord, consumer: Consumer | None = None,
                 grace_s: float = 5.0):
        self.spec = spec
        self.record = record
        self.consumer = consumer
        self.grace_s = grace_s
        self.proc: subprocess.Popen | None = None
        self._queue: queue.Queue = queue.Queue()
        # re-entrant: a stop() from a signal handler may land while start() holds it (around Popen)
        self._lock = threading.RLock()
        self._stop_reason: str | None = None
        self._kill_at: float | None = None
        self._done_tailing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._torchrun_lines: list[str] = []
        self._errors: list[Error] = []
        self._started = 0.0
        self._log_files: dict[int | None, IO[str]] = {}
        self._logs_cut = False  # a log write the disk refused (full): the logs stop there, the run goes on
        self._torchrun_warns = True  # its warnings reach its output (start() reads the environment it gets)
        self._attempt_starts: dict[int, float] = {}  # lesson 3's in-place restarts: when each attempt started
        self._event_offsets: dict[Path, int] = {}

    # ---- control ----
    def start(self) -> None:
        rec = self.record
        route = route_towards(self.spec.master_addr) if self.spec.multinode else None
        cmd = torchrun_command(self.spec, rec.dir / "torchrun", local=route)
        set_command(rec, cmd)
        env = dict(os.environ)
        env.update({
            "DISTAI_DEVICE": self.spec.placement.device,
            "DISTAI_EVENTS_DIR": str(rec.events_dir),
            RUN_ID_ENV: rec.id,
            LAUNCHER_PID_ENV: str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        })
        if self._c10d:  # each line prefixed with its global rank: under c10d a node learns its ranks only at the
            # rendezvous (torchrun's own prefix, the local rank, labelled node 1's ranks 2, 3 as ranks 0, 1); not
            # elsewhere, where the ranks are known: torchrun then tails its files, about 0.8 s more a launch
            env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[${role_name}${rank}]:"
        env.setdefault("OMP_NUM_THREADS", "1")
        # the ranks' and torchrun's output is read here as UTF-8 (_read_output), whatever the learner's terminal takes:
        # under PYTHONIOENCODING=latin-1 a rank printing "→" or "Ψ" ended with a UnicodeEncodeError
        env["PYTHONIOENCODING"] = "utf-8"
        if self.spec.debug:
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        if self.spec.lang:
            env[LANG_ENV] = self.spec.lang
        if self.spec.profile:
            env[PROFILE_DIR_ENV] = str(rec.dir / "profile")
            rec.config["profile_dir"] = env[PROFILE_DIR_ENV]
        env.update(self.spec.env)
        if route is not None:  # gloo binds where this node's hostname resolves (127.0.1.1 on Debian) unless told
            env.setdefault("GLOO_SOCKET_IFNAME", route[0])
            self._say("multinode_route", master=self.spec.master_addr, interface=env["GLOO_SOCKET_IFNAME"],
                      address=route[1], nnodes=self.spec.nnodes)
        self._torchrun_warns = "TORCH_LOGS" not in env  # TORCH_LOGS can silence the signals torchrun says it sent
        rec.config.update({"nproc": self.spec.placement.nproc, "device": self.spec.placement.device,
                           "nnodes": self.spec.nnodes, "node_rank": self.spec.node_rank,
                           "master_addr": self.spec.master_addr, "master_port": self.spec.master_port,
                           "args": list(self.spec.args), "note": self.spec.placement.note,
                           "debug": self.spec.debug, "lang": self.spec.lang})  # what its ranks write in
        rec.status = "running"
        rec.claim_launcher()
        rec.save()
        # a relaunch into the same run folder (engine.supervisor) streams only the new events
        self._event_offsets = {p: p.stat().st_size for p in rec.events_dir.glob("rank*.jsonl")}
        if not self._c10d:  # c10d: ranks known once met
            for local in range(self.spec.placement.nproc):  # every rank has a log, even a silent one
                self._log(self.spec.global_rank(local))
        self._started = time.time()
        try:  # the ranks start where the learner is (a relative --ckpt-dir is theirs), unless that folder is gone:
            os.getcwd()  # torchrun then died at once ("Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so")
            cwd = None
        except FileNotFoundError:
            cwd = str(rec.dir)
        with self._lock:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=parent_death_signal, cwd=cwd)
            stop_early = self._stop_reason is not None
        if stop_early:  # stop() came before the processes existed
            _signal_pid_and_group(self.proc.pid, signal.SIGTERM)
        self._put(RUN_START.event({"run_id": rec.id, "command": cmd, "nnodes": self.spec.nnodes,
                                   "nproc": self.spec.placement.nproc * self.spec.nnodes,
                                   "device": self.spec.placement.device, "note": self.spec.placement.note,
                                   "backend": backend_for(self.spec.placement.device), "lesson": rec.lesson}))
        for target in (self._read_output, self._tail_events):
            t = threading.Thread(target=target, daemon=True, name=f"distai-{target.__name__}")
            t.start()
            self._threads.append(t)

    @property
    def _c10d(self) -> bool:
        """Nodes that meet through c10d: which ranks this node runs is known only once they have met."""
        return self.spec.multinode and self.spec.rdzv_backend == "c10d"

    def stop(self, reason: str = "stopped by the user") -> None:
        """Ask every rank to stop (thread-safe, idempotent); SIGKILL follows after the grace period."""
        with self._lock:
            if self._stop_reason is not None:
                return
            self._stop_reason = reason
            self._kill_at = time.monotonic() + self.grace_s
            proc = self.proc
        if proc is not None and proc.poll() is None:
            _signal_pid_and_group(proc.pid, signal.SIGTERM)

    def run(self) -> RunRecord:
        """Start (if needed) and wait; Ctrl-C in the caller stops the run and is re-raised after."""
        if self.proc is None:
            self.start()
        assert self.proc is not None
        interrupted = False
        while True:
            try:
                self._pump(POLL_S)
                if self._kill_at is not None and time.monotonic() > self._kill_at:
                    self._kill_everything()
                    self._kill_at = time.monotonic() + 1.0
                if self.proc.poll() is not None:
                    break
            except KeyboardInterrupt:
                interrupted = True
                try:
                    self.stop("interrupted (Ctrl-C)")
                except KeyboardInterrupt:  # a second Ctrl-C inside stop(): the stop is already under way
                    pass
        record = self._finish_uninterrupted()
        if interrupted:
            raise KeyboardInterrupt
        return record

    def _finish_uninterrupted(self) -> RunRecord:
        """:meth:`_finish` with Ctrl-C held off (the ranks have exited by now): a Ctrl-C pressed again while
        the record is written must not leave it half-done ("killed", no duration, no final view)."""
        if threading.current_thread() is not threading.main_thread():
            return self._finish()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return self._finish()
        finally:
            signal.signal(signal.SIGINT, previous)

    # ---- internals ----
    def _put(self, event: dict) -> None:
        event.setdefault("t", time.time())
        self._queue.put(event)

    def _pump(self, timeout: float) -> None:
        try:
            event = self._queue.get(timeout=timeout)
        except queue.Empty:
            return
        self._dispatch(event)
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                return
            self._dispatch(event)

    def _dispatch(self, event: dict) -> None:
        if ERROR.matches(event):
            self._errors.append(event)
        elif PHASE.matches(event) and event.get("name") == "start" and is_number(attempt := dict(event).get("attempt")):
            # lesson 3's start phase numbers its attempt: the earliest of its ranks' starts is the attempt's
            t = float(event.get("t") or 0.0)
            self._attempt_starts[int(attempt)] = min(t, self._attempt_starts.get(int(attempt), t))
        elif SUMMARY.matches(event):
            self.record.summary = {k: v for k, v in event.items() if k not in ("kind", "t", "rank")}
        if self.consumer is not None:
            try:
                self.consumer(event)
            except Exception as exc:  # noqa: BLE001 - a broken view must not orphan the ranks
                self.consumer = None
                why = os_error_text(exc, FALLBACK) if isinstance(exc, OSError) else exc  # "no space left on the disk"
                self.stop(f"the live view failed: {why}")

    def _log(self, rank: int | None):
        f = self._log_files.get(rank)
        if f is None:
            name = "torchrun.log" if rank is None else f"rank{rank}.log"
            f = open(self.record.logs_dir / name, "a", encoding="utf-8", buffering=1)
            self._log_files[rank] = f
        return f

    def _last_attempts_errors(self) -> list[Error]:
        """The errors to explain: after torchrun's in-place restarts (lesson 3), the last attempt's, not an earlier
        attempt's (the ranks' files arrive in any order: told apart by time, not by arrival)."""
        if not self._attempt_starts:
            return self._errors
        started = self._attempt_starts[max(self._attempt_starts)]
        return [e for e in self._errors if float(e.get("t") or 0.0) >= started]

    def _say(self, key: str, error: OSError | None = None, **fields) -> None:
        """A line of the launcher's own (the catalog's ``run.<key>``) under the run's output, in the run's
        language; ``error``: the system error it names, in the same words."""
        lang = self.spec.lang or FALLBACK
        if error is not None:
            fields["why"] = os_error_text(error, lang)
        self._put(OUTPUT.event({"rank": None, "line": translated("run", key, lang, **fields)}))

    def _cut_logs(self, error: OSError) -> None:
        """The logs stop at the first write the disk refused (full), said once; the run goes on."""
        if not self._logs_cut:
            self._logs_cut = True
            self._say("logs_cut", error)

    def _write_log(self, rank: int | None, text: str) -> None:
        """One line into a log; a disk that refuses it (full) stops the logs, never the reading of the pipe:
        a reader that died would leave torchrun's output unread, and the ranks blocked once the pipe fills."""
        if self._logs_cut:
            return
        try:
            self._log(rank).write(text + "\n")
        except OSError as exc:
            self._cut_logs(exc)

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self._write_log(None, line)
            m = _PREFIX.match(line)
            if m:
                rank = int(m.group("rank")) if self._c10d else self.spec.global_rank(int(m.group("rank")))
                text = m.group("text")
                self._write_log(rank, text)
            else:
                rank, text = None, line
                self._torchrun_lines.append(line)
                del self._torchrun_lines[:-400]
            if is_profiler_trace_line(text):
                continue  # kept in the logs; not the learner's output (--profile printed it under the run)
            self._put(OUTPUT.event({"rank": rank, "line": text}))

    def _tail_events(self) -> None:
        offsets: dict[Path, int] = dict(self._event_offsets)
        partial: dict[Path, bytes] = {}
        directory = self.record.events_dir
        while True:
            finishing = self._done_tailing.is_set()
            for path in sorted(directory.glob("rank*.jsonl")):
                try:
                    with open(path, "rb") as f:
                        f.seek(offsets.get(path, 0))
                        data = f.read()
                except OSError:
                    continue
                if not data:
                    continue
                offsets[path] = offsets.get(path, 0) + len(data)
                data = partial.pop(path, b"") + data
                lines = data.split(b"\n")
                if lines[-1]:
                    partial[path] = lines[-1]
                for line in lines[:-1]:
                    event = parse_event(line) if line.strip() else None
                    if event is not None:
                        self._queue.put(event)
            if finishing:
                return
            self._done_tailing.wait(POLL_S)

    def _kill_everything(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _signal_pid_and_group(self.proc.pid, signal.SIGKILL)
        for pid in run_processes(self.record.id):
            _signal_pid_and_group(pid, signal.SIGKILL)

    def _reap_leftovers(self) -> None:
        """torchrun is gone; make sure no worker of this run survives it."""
        left = run_processes(self.record.id)
        if not left:
            return
        for pid in left:
            _signal_pid_and_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + min(self.grace_s, 2.0)
        while time.monotonic() < deadline and run_processes(self.record.id):
            time.sleep(0.05)
        for pid in run_processes(self.record.id):
            _signal_pid_and_group(pid, signal.SIGKILL)

    def _finish(self) -> RunRecord:
        assert self.proc is not None
        code = self.proc.wait()
        self._reap_leftovers()
        for t in self._threads:
            if t.name.endswith("_read_output"):
                t.join(timeout=5)
        self._done_tailing.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._c10d and not self._logs_cut:  # a silent rank's empty log: c10d's ranks are known from their events
            try:
                for rank in self.record.event_ranks():
                    self._log(rank)
            except OSError as exc:
                self._cut_logs(exc)
        for f in self._log_files.values():
            try:
                f.close()
            except OSError as exc:  # the last buffered line met a full disk
                self._cut_logs(exc)
        if self.proc.stdout is not None:  # read to its end: the tutor would hold it open until its next run
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
        self._pump(0)
        rec = self.record
        rec.exit_code = code
        rec.duration_s = time.time() - self._started
        if self._stop_reason is not None:
            rec.status, rec.error = "stopped", self._stop_reason
            rec.last_step = rec.steps_reached()[0]  # where it stopped, for `distai runs`
        elif code == 0:
            rec.status = "ok"
        else:
            rec.status = "failed"
            failure = analyse_failure(self._last_attempts_errors(), self._torchrun_lines, code,
                                      torchrun_warns=self._torchrun_warns, multinode=self.spec.multinode)
            rec.failed_rank, rec.error = failure.rank, failure.message
            tail = _trim(tail_lines(rec.rank_log(failure.rank), 15)) if failure.rank is not None else []
            if not tail and failure.reporter is not None and failure.reporter != failure.rank:
                tail = [f"(rank {failure.rank} printed nothing; rank {failure.reporter} reported:)"] + \
                    _trim(tail_lines(rec.rank_log(failure.reporter), 14))
            rec.error_tail = tail or _trim(self._torchrun_lines[-15:])
        try:
            rec.save()
        except OSError as exc:  # a full disk: the old run.json stands (written whole or not at all)
            self._say("record_unsaved", exc)
            self._pump(0)
        self._dispatch(RUN_END.event({"t": time.time(), "run_id": rec.id, "status": rec.status, "exit_code": code,
                                      "error": rec.error, "failed_rank": rec.failed_rank, "tail": rec.error_tail,
                                      "duration_s": rec.duration_s}))
        return rec


def experiment_argument_error(module: str, args: list[str], world: int, lang: str,
                              timeout_s: float = 120.0) -> dict | None:
    """What the experiment's ranks would refuse in ``args`` (``{"error", "texts", "options"}``: see
    :func:`~.experiment._check_arguments`), asked of one process that parses them as a rank of a
    ``world``-rank group would and exits without joining one; None when they would run. It
    imports torch (a second or two), so ``distai run`` asks only when options go to the experiment."""
    done = _as_one_rank(module, args, world, lang, timeout_s)
    if done is None:
        return None  # timed out: the launch itself will say what is wrong
    if done.returncode != 2:
        return None
    for line in reversed(done.stdout.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "error" in found:
            return found
    return None


def experiment_help(module: str, lang: str, timeout_s: float = 120.0) -> str:
    """The experiment's own options (its argparse ``--help``), from one process that parses ``--help`` as
    a rank would and exits without joining a group ("" if it timed out)."""
    done = _as_one_rank(module, ["--help"], 1, lang, timeout_s)
    return done.stdout if done is not None else ""


def _as_one_rank(module: str, args: list[str], world: int, lang: str,
                 timeout_s: float) -> subprocess.CompletedProcess | None:
    """The experiment run as rank 0 of a ``world``-rank group that only parses and checks ``args`` and
    exits without joining one (:data:`~.experiment.CHECK_ARGS_ENV`); None if it timed out."""
    from .experiment import CHECK_ARGS_ENV

    env = dict(os.environ, **{CHECK_ARGS_ENV: "1", "WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0",
                              "DISTAI_LANG": lang})
    try:  # run() kills the child on a timeout or ^C, the kernel when the command dies: it never outlives it
        return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, preexec_fn=parent_death_signal)
    except subprocess.TimeoutExpired:
        return None


def experiment_available(module: str | None) -> bool:
    """Whether the experiment module exists (without importing it, nor torch)."""
    if not module:
        return False
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
