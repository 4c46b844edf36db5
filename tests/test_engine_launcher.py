"""The launcher: placement rules, the torchrun command, failure analysis, run folders, and real
torchrun launches (a crashing rank, a hanging rank, Ctrl-C, a live --json run).

The real launches start together in one module fixture (they mostly wait on torch's import
and on timeouts, so running them side by side keeps this module short).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from child_processes import exit_code_within
from concurrent_jobs import outcome, run_concurrently
from distai.engine import launcher as L
from distai.engine.run_state import RunState, replay_events
from distai.engine.runs import RunNotFound, RunRecord, create_run, find_run, list_runs, reason_text

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

REPO = Path(__file__).resolve().parents[1]
DISTAI = [sys.executable, "-m", "distai.tutor.cli"]
LESSON1 = "distai.engine.experiments.lesson1"


# ---------------------------------------------------------------------------------------- units
def test_a_stop_from_a_signal_handler_while_torchrun_is_spawned_stops_the_run(tmp_path, monkeypatch):
    # `distai run`'s SIGTERM/SIGHUP handler calls stop() on the main thread, which may be inside start()'s
    # spawn of torchrun: the stop must neither wait forever for the lock start() holds nor be lost
    import io
    import threading

    signalled = []

    class SpawnedWhileSignalled:
        pid = 424242

        def __init__(self, *args, **kwargs):
            launch.stop("stopped by SIGTERM")  # the handler, run in the middle of the spawn
            self.stdout = io.BytesIO(b"")

        def poll(self):
            return None

    monkeypatch.setattr(L.subprocess, "Popen", SpawnedWhileSignalled)
    monkeypatch.setattr(L, "_signal_pid_and_group", lambda pid, sig: signalled.append((pid, sig)))
    rec = create_run(tmp_path, "lesson1", LESSON1)
    launch = L.Launch(L.LaunchSpec(LESSON1, L.Placement("cpu", 2)), rec)
    starting = threading.Thread(target=launch.start, daemon=True)
    starting.start()
    starting.join(timeout=10)
    assert not starting.is_alive(), "start() deadlocked on the stop from inside the spawn"
    assert launch.stopping and signalled == [(424242, signal.SIGTERM)]  # torchrun told to stop as it started


def test_a_ctrl_c_while_torchrun_is_spawned_ends_the_run_as_interrupted(tmp_path, monkeypatch, capsys):
    # the Ctrl-C lands inside the spawn (a few ms): the record said "killed before its first step", as if the
    # launcher had died; the run now starts stopped and says it was interrupted
    from distai.tutor.cli import main

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    real_popen, spawns = subprocess.Popen, []

    def interrupted_once(cmd, *args, **kwargs):
        if "torch.distributed.run" in " ".join(map(str, cmd)) and not spawns:
            spawns.append(cmd)
            raise KeyboardInterrupt
        return real_popen(cmd, *args, **kwargs)

    monkeypatch.setattr(L.subprocess, "Popen", interrupted_once)
    assert main(["run", "lesson1", "--cpu", "2", "--steps", "3"]) == 130
    (rec,) = list_runs(tmp_path / "runs")
    assert spawns and rec.status == "stopped" and rec.error == "interrupted (Ctrl-C)", (rec.status, rec.error)
    assert L.run_processes(rec.id) == []


def test_placement_rules():
    assert L.choose_placement(cpu=3, cuda_count=0) == L.Placement("cpu", 3)
    p = L.choose_placement(gpus=4, cuda_count=0)
    assert p.device == "cpu" and p.nproc == 4 and "CPU timings" in p.note and "no CUDA" in p.note
    assert L.choose_placement(gpus=2, cuda_count=8) == L.Placement("cuda", 2)
    assert L.choose_placement(cuda_count=8) == L.Placement("cuda", 4)
    assert L.choose_placement(cuda_count=3, default_nproc=8) == L.Placement("cuda", 3)
    assert L.choose_placement(cuda_count=0) == L.Placement("cpu", 4)
    assert L.choose_placement(cuda_count=0, default_nproc=2) == L.Placement("cpu", 2)
    with pytest.raises(L.LaunchError, match="only 2 CUDA devices are visible"):
        L.choose_placement(gpus=4, cuda_count=2)
    with pytest.raises(L.LaunchError, match="only 1 CUDA device is visible"):
        L.choose_placement(gpus=2, cuda_count=1)
    for bad in (0, -1, 1025, 10**9):
        with pytest.raises(L.LaunchError) as exc:
            L.choose_placement(gpus=bad, cuda_count=0)
        assert exc.value.code == 2 and "--gpus" in str(exc.value)
    with pytest.raises(L.LaunchError, match="--cpu"):
        L.choose_placement(cpu=0)
    with pytest.raises(L.LaunchError, match="not both"):
        L.choose_placement(gpus=1, cpu=1)


def test_node_flags_are_validated():
    L.validate_nodes(1, None, None, None)
    L.validate_nodes(2, 1, "10.0.0.1", 29500)
    for args, msg in (((2, None, "h", None), "--node-rank"), ((2, 0, None, None), "--master-addr"),
                      ((2, 2, "h", None), "--node-rank"), ((1, None, None, 70000), "--master-port"),
                      ((0, None, None, None), "--nnodes")):
        with pytest.raises(L.LaunchError, match=msg):
            L.validate_nodes(*args)


def test_torchrun_command_single_node_uses_standalone_free_port(tmp_path):
    spec = L.LaunchSpec(LESSON1, L.Placement("cpu", 3), ["--steps", "7", "--sweep-max", "1MiB"])
    cmd = L.torchrun_command(spec, tmp_path)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--master-port" not in cmd
    assert cmd[cmd.index("--nproc-per-node") + 1] == "3"
    assert cmd[-6:] == ["-m", LESSON1, "--steps", "7", "--sweep-max", "1MiB"]


def test_torchrun_command_multi_node_passes_flags_through(tmp_path):
    spec = L.LaunchSpec(LESSON1, L.Placement("cuda", 8), [], nnodes=2, node_rank=1,
                        master_addr="node0.cluster", master_port=29512)
    cmd = L.torchrun_command(spec, tmp_path)
    joined = " ".join(cmd)
    assert "--nnodes 2 --node-rank 1 --master-addr node0.cluster --master-port 29512" in joined
    assert "--standalone" not in cmd and "--local-addr" not in cmd and "--rdzv-conf" not in cmd
    # --join-timeout: the static rendezvous' timeout, c10d's join_timeout
    timed = dataclasses.replace(spec, join_timeout=30)
    assert "--rdzv-conf timeout=30" in " ".join(L.torchrun_command(timed, tmp_path))
    timed = dataclasses.replace(timed, rdzv_backend="c10d")
    assert "--rdzv-conf join_timeout=30" in " ".join(L.torchrun_command(timed, tmp_path))
    for nodes, value, why in ((1, 5, "needs --nnodes 2"), (2, 0, "between 1 and 86400")):
        with pytest.raises(L.LaunchError, match=why):
            L.validate_nodes(nodes, 0, "h", None, join_timeout=value)
    assert spec.global_rank(3) == 11
    # where this node reaches node 0 through an interface, torchrun tells the others that address, not the
    # hostname (127.0.1.1 on Debian: the other node's ranks were refused there)
    cmd = L.torchrun_command(spec, tmp_path, local=("eth1", "10.77.0.2"))
    assert cmd[cmd.index("--local-addr") + 1] == "10.77.0.2"


def test_the_route_towards_node_0_is_the_interface_the_kernel_picks():
    import socket

    assert L.route_towards("127.0.0.1") is None and L.route_towards(None) is None  # this machine: no route
    assert L.route_towards("no-such-host.invalid") is None
    names = {name for _i, name in socket.if_nameindex()}
    found = L.route_towards("192.0.2.123")  # TEST-NET-1: routed (by the default route) wherever there is one
    assert found is None or (found[0] in names and found[0] != "lo" and not found[1].startswith("127."))


def test_failure_analysis():
    # a missed barrier names the absent rank, not the one that noticed
    err = [{"rank": 0, "t": 5.0, "error": "RuntimeError: checkpoint 'after-train': [../ProcessGroupGloo.cpp:1] "
                                         "Rank 2 failed to pass monitoredBarrier in 3000 ms"}]
    f = L.analyse_failure(err, [], 1)
    assert f.rank == 2 and "did not arrive at barrier 'after-train' within 3 s" in f.message and f.reporter == 0
    # otherwise the earliest error wins (peers fail after the culprit)
    errs = [{"rank": 0, "t": 9.0, "error": "Connection closed by peer"},
            {"rank": 3, "t": 7.5, "error": "ValueError: boom"}]
    f = L.analyse_failure(errs, [], 1)
    assert f.rank == 3 and "ValueError: boom" in f.message
    # across nodes, a node whose ranks all lost a peer's connection (gloo's words, from a two-node run) did not
    # fail there: it says the failure began on another node, whose output says why; on one node, as before
    reset = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
             "[10.77.0.1]:18304: Connection reset by peer. This is typically caused by a remote worker hanging")
    lost = [{"rank": 3, "t": 9.0, "error": reset}, {"rank": 2, "t": 8.9, "error": "Connection closed by peer [10.77.0.1]:5"}]
    f = L.analyse_failure(lost, [], 1, multinode=True)
    assert (f.rank, f.reporter) == (2, 2)
    assert f.message == "a rank on another node failed first: rank 2 lost its connection to 10.77.0.1 (that node's output says why)"
    assert reason_text(f.message, "es").startswith("primero falló un rank de otro nodo: el rank 2 perdió su conexión")
    assert L.analyse_failure(lost, [], 1).message.startswith("rank 2 failed: Connection closed by peer")
    assert L.analyse_failure([*lost, {"rank": 1, "t": 9.5, "error": "ValueError: boom"}], [], 1,
                             multinode=True).message.startswith("rank 2 failed")  # one of ours failed too
    # c10d on a host whose own name resolves nowhere (torchrun's traceback, from two network namespaces)
    unresolved = ["    addr_list = socket.getaddrinfo(", "socket.gaierror: [Errno -3] Temporary failure in name resolution"]
    f = L.analyse_failure([], unresolved, 1)
    assert f.rank is None and f.message == "torchrun could not resolve a host name (this machine's own, or --master-addr)"
    assert "/etc/hosts" in reason_text(f.message, "en") and "debe resolverse" in reason_text(f.message, "es")
    # no events (a segfault, a SIGKILL): torchrun's root-cause report
    lines = ["Root Cause (first observed failure):", "[0]:", "  time      : 2025-01-01_00:00:00",
             "  host      : x", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 42)"]
    f = L.analyse_failure([], lines, 1)
    assert f.rank == 1 and "SIGKILL" in f.message
    # a rank that could not join its group in time (runtime.join_deadline's exit status) is named as such,
    # in the learner's language too
    from distai.engine.events import JOIN_FAILED_EXIT

    joined = [line.replace("-9 (pid: 42)", f"{JOIN_FAILED_EXIT} (pid: 42)") for line in lines]
    f = L.analyse_failure([], joined, 1)
    assert f.rank == 1 and f.message == "rank 1 could not join its process group in time"
    assert reason_text(f.message, "es").startswith("el rank 1 no pudo unirse a su grupo de procesos a tiempo")
    # a killed rank reports nothing, its peers report the closed connection: the killed one failed
    f = L.analyse_failure([{"rank": 0, "t": 9.0, "error": "RuntimeError: Connection closed by peer"}], lines, 1)
    assert f.rank == 1 and "SIGKILL" in f.message
    # torchrun saw the peer's error file first and names it the root cause; the killed rank is listed
    # among the failures: the killed one still failed first
    report = ["Failures:", "[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 43)",
              "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
              "  exitcode  : 1 (pid: 42)"]
    f = L.analyse_failure([{"rank": 0, "t": 9.0, "error": "RuntimeError: Connection closed by peer"}], report, 1)
    assert f.rank == 1 and "SIGKILL" in f.message
    # torchrun SIGTERMs the survivors and, its timestamps tying to the second, may name one of them
    # the root cause: the rank that reported its error failed
    stopped = ["W1207 09:32:01.242000 16545 api.py:1028] Sending process 42 closing signal SIGTERM",
               "Failures:", "[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 43)",
               "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
               "  exitcode  : -15 (pid: 42)"]
    f = L.analyse_failure([{"rank": 1, "t": 9.0, "error": "RuntimeError: injected failure"}], stopped, 1)
    assert f.rank == 1 and "injected failure" in f.message
    # a SIGTERM torchrun did not send (`kill` from outside): that rank failed, not the peer whose connection it
    # reset (the learner was pointed at the healthy rank)
    outside = ["Failures:", "[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -15 (pid: 24131)  (SIGTERM)",
               "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
               "  exitcode  : 1 (pid: 24130) "]
    reset = [{"rank": 0, "t": 9.0, "error": "RuntimeError: Read error: Connection reset by peer"}]
    f = L.analyse_failure(reset, outside, 1)
    assert f.rank == 1 and f.message == "rank 1 was killed by SIGTERM"
    # where TORCH_LOGS silenced torchrun's warnings, its own SIGTERMs leave no line: a missing one proves nothing
    # (ranks 0, 1 and 3 were its survivors; rank 2 failed)
    quiet = ["Failures:", *[line for r, pid in ((0, 40), (1, 41), (3, 43)) for line in (
             "[x]:", f"  rank      : {r} (local_rank: {r})", f"  exitcode  : -15 (pid: {pid})  (SIGTERM)")],
             "Root Cause (first observed failure):", "[0]:", "  rank      : 2 (local_rank: 2)",
             "  exitcode  : 1 (pid: 42)"]
    boom = [{"rank": 2, "t": 9.0, "error": "RuntimeError: boom"}]
    assert L.analyse_failure(boom, quiet, 1, torchrun_warns=False).message == "rank 2 failed: RuntimeError: boom"
    # a rank that would not stop (SIGSTOPped, frozen) gets torchrun's SIGTERM, then its SIGKILL: that SIGKILL is
    # torchrun's, and the rank that waited for it says what happened (it was reported as killed from outside)
    frozen = ["W1207 09:20:58.677000 26792 api.py:1028] Sending process 26799 closing signal SIGTERM",
              "W1207 09:21:28.678000 26792 api.py:1047] Unable to shutdown process 26799 via 15, forcefully exiting "
              "via 9", "Failures:", "[1]:", "  rank      : 1 (local_rank: 1)",
              "  exitcode  : -9 (pid: 26799)  (SIGKILL)", "Root Cause (first observed failure):", "[0]:",
              "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 26798) "]
    waited = [{"rank": 0, "t": 9.0, "error": "RuntimeError: Timed out waiting 120000ms for recv operation"}]
    f = L.analyse_failure(waited, frozen, 1)
    assert f.rank == 0 and "Timed out waiting 120000ms" in f.message
    # with no error from any rank, a rank that exited on its own (an argument its parser refused before
    # any event) failed, not the peer torchrun SIGTERM'd and named the root cause (`run context --cpu 3`)
    f = L.analyse_failure([], stopped, 1)
    assert f.rank == 1 and f.message == "rank 1 exited with code 1"
    # with no error and no rank exiting on its own, a SIGTERM'd rank is the one that was killed
    f = L.analyse_failure([], stopped[:3] + ["  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 43)"]
                          + stopped[5:], 1)
    assert f.rank == 1 and "SIGKILL" in f.message
    f = L.analyse_failure([], stopped[5:], 1)
    assert f.rank == 0 and "SIGTERM" in f.message
    assert L.analyse_failure([], ["junk"], 3).message == "torchrun exited with code 3"
    # torchrun itself signalled (SIGTERM to the agent: its SignalException; SIGKILL: its exit status), no rank
    agent = ["torch.distributed.elastic.multiprocessing.api.SignalException: Process 23134 got signal: 15"]
    assert L.analyse_failure([], agent, 1).message == "torchrun was stopped by SIGTERM"
    assert L.analyse_failure([], [], -9).message == "torchrun was killed by SIGKILL"
    assert reason_text("torchrun was stopped by SIGTERM", "es") == "torchrun se detuvo por SIGTERM"
    # a node that never came: node 0's store waited 15 minutes; its reason was "torchrun exited with code 1"
    waited = ["torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined."]
    assert L.analyse_failure([], waited, 1).message == "only 1 of 2 nodes joined within 901 s"
    assert reason_text("only 1 of 2 nodes joined within 901 s", "es").startswith("solo 1 de 2 nodos se unieron en 901 s")
    c10d = ["torchrun      raise RendezvousTimeoutError", "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"]
    assert L.analyse_failure([], c10d, 1).message == "the nodes did not all join the rendezvous in time"


def test_after_an_in_place_restart_the_failure_explained_is_the_last_attempts(tmp_path):
    # lesson 3: attempt 0 lost rank 1, attempt 1 lost rank 0; the relaunch's reason named the earliest error of
    # all, attempt 0's (and its rank), because the errors of every attempt were kept
    rec = create_run(tmp_path / "runs", "lesson3", "distai.engine.experiments.lesson3")
    launch = L.Launch(L.LaunchSpec("distai.engine.experiments.lesson3", L.Placement("cpu", 2), []), rec)
    for event in ({"kind": "phase", "rank": 0, "t": 0.5, "name": "start", "attempt": 0},
                  {"kind": "error", "rank": 0, "t": 4.0, "error": "RuntimeError: injected failure on rank 0",
                   "traceback": ""},  # its file read before the start of attempt 1
                  {"kind": "phase", "rank": 1, "t": 3.2, "name": "start", "attempt": 1},  # a slower rank's start
                  {"kind": "phase", "rank": 0, "t": 3.0, "name": "start", "attempt": 1},
                  {"kind": "error", "rank": 1, "t": 1.0, "error": "RuntimeError: injected failure on rank 1",
                   "traceback": ""}):  # attempt 0's, read last
        launch._dispatch(event)
    failure = L.analyse_failure(launch._last_attempts_errors(), [], 1)
    assert failure.rank == 0 and failure.message == "rank 0 failed: RuntimeError: injected failure on rank 0"


def test_a_launcher_that_died_unreaped_is_not_alive():
    # a zombie launcher (killed, its parent not yet waiting for it) kept its run "running" in `distai runs`
    from distai.engine.runs import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        child.kill()
        deadline = time.time() + 10
        while time.time() < deadline and Path(f"/proc/{child.pid}/stat").read_text().split(")")[1].split()[0] != "Z":
            time.sleep(0.02)
        assert not pid_alive(child.pid)  # dead, not reaped
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


def test_run_processes_finds_only_this_runs_processes():
    env = dict(os.environ, **{L.RUN_ID_ENV: "test-run-xyz"})
    other = dict(os.environ, **{L.RUN_ID_ENV: "test-run-xyz2"})
    mine = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    theirs = subprocess.Popen(["sleep", "30"], env=other, start_new_session=True)
    try:
        # until the child has exec'd, /proc/<pid>/environ is the parent's (a fresh-clone CI once read it then)
        deadline, found = time.monotonic() + 10, []
        while time.monotonic() < deadline and found != [mine.pid]:
            found = L.run_processes("test-run-xyz")
            time.sleep(0.02)
        assert found == [mine.pid]
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()
    assert L.run_processes("test-run-xyz") == []


def test_experiment_availability():
    assert L.experiment_available(LESSON1)
    assert not L.experiment_available("distai.engine.experiments.lesson_does_not_exist")
    assert not L.experiment_available(None)


def test_run_folders_list_find_and_killed(tmp_path):
    a = create_run(tmp_path, "lesson1", LESSON1, config={"nproc": 2})
    time.sleep(0.01)
    b = create_run(tmp_path, "lesson1", LESSON1)
    b.status, b.exit_code, b.duration_s, b.error = "failed", 1, 3.0, "rank 1 failed: boom"
    b.save()
    from distai.engine.runs import pid_alive

    a.launcher_pid = next(p for p in range(2 ** 22, 1, -1) if not pid_alive(p))  # a launcher that is gone
    a.save()
    runs = list_runs(tmp_path)
    assert [r.id for r in runs] == [b.id, a.id]
    assert runs[1].effective_status == "killed" and runs[0].effective_status == "failed"
    from distai.engine.events import EventSink
    from distai.engine.runs import settle_killed

    sink = EventSink(0, a.events_dir)
    for step in range(3):
        sink.emit("step", step=step, of=10, loss=1.0)
    sink.close()
    with open(a.events_dir / "rank0.jsonl", "ab") as f:
        f.write(b'{"kind":"step","step":3,"of"')  # the line a kill tore
    settle_killed(runs[1])
    again = RunRecord.load(a.dir)
    assert (again.status, again.last_step, again.error) == ("killed", 3, "the launcher was killed at step 3/10")
    assert settle_killed(runs[0]).status == "failed"
    assert find_run(tmp_path, "last").id == b.id
    assert find_run(tmp_path, b.id[-4:]).id == b.id
    assert find_run(tmp_path, str(b.dir)).id == b.id
    with pytest.raises(RunNotFound):
        find_run(tmp_path, "nope")
    with pytest.raises(RunNotFound, match="runs match"):
        find_run(tmp_path, "lesson1")
    with pytest.raises(FileExistsError):
        create_run(tmp_path, "lesson1", LESSON1, run_dir=a.dir)
    assert RunRecord.load(b.dir).error == "rank 1 failed: boom"
    # node 1 of two: only rank 0, on node 0, emits steps, so its record never holds one; it says where they are
    time.sleep(0.01)
    c = create_run(tmp_path, "lesson1", LESSON1)
    c.command = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "-m", LESSON1]
    c.launcher_pid = a.launcher_pid
    c.save()
    settle_killed(RunRecord.load(c.dir))
    error = RunRecord.load(c.dir).error
    assert error == "the launcher of node 1 was killed (node 0's record counts the steps)"
    assert reason_text(error, "es") == "el lanzador del nodo 1 murió (el registro del nodo 0 cuenta los pasos)"


def test_one_lessons_runs_are_listed_without_reading_the_others(tmp_path):
    """The tutor asks for one lesson's newest run on its UI thread: with 2,050 runs kept it read every run.json
    (0.6 s). Folders named for another lesson are skipped unread; runs kept elsewhere (--run-dir) still count."""
    ones = [create_run(tmp_path, "lesson1", LESSON1) for _ in range(3)]
    create_run(tmp_path, "lesson2", LESSON1)
    other = create_run(tmp_path, "lesson2", LESSON1)
    (other.dir / "run.json").write_text("{ torn")  # unread: it would be listed as damaged if it were read
    elsewhere = create_run(tmp_path, "lesson1", LESSON1, run_dir=tmp_path.parent / f"{tmp_path.name}-mine")
    listed = list_runs(tmp_path, "lesson1")
    assert {r.id for r in listed} == {r.id for r in [*ones, elsewhere]}
    assert [r.id for r in listed] == [r.id for r in list_runs(tmp_path) if r.lesson == "lesson1"]
    assert "damaged" in {r.status for r in list_runs(tmp_path)}  # read whole, the torn one shows


def test_a_run_dir_must_be_new_or_empty(tmp_path, monkeypatch):
    """An audit's `--run-dir ""` made the current folder, full of the learner's files, a run's folder; a file
    was said to "already hold a run". Each is now refused with what it is; an empty folder is taken."""
    from distai.engine.runs import RunDirError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    for run_dir, why in (("", "empty"), ("notes.txt", "file"), (".", "not_empty"), (str(tmp_path), "not_empty")):
        with pytest.raises(RunDirError) as err:
            create_run(tmp_path / "runs", "lesson1", LESSON1, run_dir=run_dir)
        assert err.value.why == why
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "run.json").exists()
    (tmp_path / "empty").mkdir()
    assert create_run(tmp_path / "runs", "lesson1", LESSON1, run_dir="empty").dir == tmp_path / "empty"
    for lang, words in (("en", "notes.txt is a file; --run-dir needs a folder, new or empty"),
                        ("es", "notes.txt es un archivo; --run-dir necesita una carpeta, nueva o vacía")):
        proc = subprocess.run([sys.executable, "-m", "distai.tutor.cli", "run", "lesson1", "--cpu", "2", "--run-dir",
                               "notes.txt", "--lang", lang], capture_output=True, text=True, cwd=tmp_path,
                              env=dict(os.environ, DISTAI_HOME=str(tmp_path / "home")), timeout=60)
        assert proc.returncode == 2 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_run_made_elsewhere_is_listed_and_is_last(tmp_path):
    """--run-dir puts a run outside the runs folder: runs list and runs show last still find it, once, and a
    line cut short by a kill (or a folder since deleted) is skipped."""
    root = tmp_path / "runs"
    first = create_run(root, "lesson1", LESSON1)
    first.created -= 10
    first.save()
    elsewhere = create_run(root, "lesson2", LESSON1, run_dir=tmp_path / "mine" / "big-run")
    assert (root / "elsewhere.txt").read_text().splitlines() == [str(elsewhere.dir)]
    with open(root / "elsewhere.txt", "a") as f:
        f.write(f"{elsewhere.dir}\n{tmp_path / 'gone'}\n/tmp/half-writ")
    inside = create_run(root, "lesson3", LESSON1, run_dir=root / "named")  # under the root: listed once, not noted
    assert (root / "elsewhere.txt").read_text().count("named") == 0
    listed = [r.path for r in list_runs(root)]
    assert sorted(listed) == sorted([first.path, elsewhere.path, inside.path])
    assert find_run(root, "last").id in ("big-run", "named") and find_run(root, "big-run").path == elsewhere.path


def test_run_state_folds_events():
    s = RunState()
    for e in [{"kind": "run_start", "run_id": "r", "nproc": 2, "device": "cpu", "t": 1.0},
              {"kind": "phase", "name": "train", "steps": 3, "t": 1.5},
              {"kind": "progress", "done": 1, "total": 4, "t": 1.6},
              {"kind": "step", "step": 0, "of": 3, "loss": 0.5, "t": 2.0},
              {"kind": "sweep", "size": 1024, "ring_busbw": 1.0, "ar_busbw": 2.0, "t": 3.0},
              {"kind": "run_end", "status": "ok", "exit_code": 0, "duration_s": 2.5, "t": 3.5}]:
        s.feed(e)
    assert s.status == "ok" and s.losses == [0.5] and len(s.sweep) == 1 and s.fraction == 1.0
    assert s.elapsed == 2.5 and s.finished


def test_the_loss_curve_is_one_ranks_latest_series_whatever_the_arrival_order():
    """Every rank's step events in arrival order mixed local losses (lesson 2 live read 6.03 → 5.91, its replay
    5.99 → 5.91): the curve is the lowest reporting rank's, the series of its latest strategy."""
    steps = [{"kind": "step", "rank": r, "strategy": strategy, "step": i, "loss": 10 * r + i + (100 if strategy == "zero1"
                                                                                            else 0)}
             for strategy in ("ddp", "zero1") for i in range(3) for r in (1, 0)]
    for order in (steps, sorted(steps, key=lambda e: e["rank"]), sorted(steps, key=lambda e: -e["rank"])):
        s = RunState()
        for e in order:
            s.feed(e)
        assert s.loss_rank == 0 and s.losses == [100, 101, 102] and s.loss_series[("ddp",)] == [0, 1, 2]
    pipeline = RunState()  # only the last stage computes the loss
    for i in range(3):
        pipeline.feed({"kind": "step", "rank": 3, "step": i, "loss": 5.0 - i})
        pipeline.feed({"kind": "step", "rank": 0, "step": i})
    assert pipeline.losses == [5.0, 4.0, 3.0]


def test_steps_done_again_after_a_restart_replace_the_lost_ones_in_the_curve():
    """Lesson 3: a failure at step 6 resumes from the checkpoint after step 4; steps 5 and 6 come again
    (``redo``). The curve has one point a step, the redone ones in place of the lost ones."""
    s = RunState()
    for i in range(6):
        s.feed({"kind": "step", "rank": 0, "step": i, "loss": 10.0 - i, "attempt": 0})
    for i in range(4, 8):
        s.feed({"kind": "step", "rank": 0, "step": i, "loss": 20.0 - i, "attempt": 1, "redo": i < 6})
    assert s.losses == [10.0, 9.0, 8.0, 7.0, 16.0, 15.0, 14.0, 13.0]
    assert s.loss_steps[()] == list(range(8))


def test_cli_lesson_without_experiment_is_not_yet_available(capsys, monkeypatch):
    """Every lesson has its experiment, so this skipped: an install that lacks one (a module not found) is
    now stood in for, and `distai run` says so in one line, exit 2, in the learner's language."""
    from distai.lessons.registry import all_lessons
    from distai.tutor.cli import main

    assert all(L.experiment_available(lesson.experiment) for lesson in all_lessons())
    assert not L.experiment_available("distai.engine.experiments.no_such_lesson")
    assert not L.experiment_available(None) and not L.experiment_available("")
    monkeypatch.setattr(L, "experiment_available", lambda module: module != all_lessons()[4].experiment)
    for lang, words in (("en", "lesson 5's experiment is not yet available"),
                        ("es", "el experimento de la lección 5 aún no está disponible")):
        assert main(["run", "lesson5", "--lang", lang]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err


def test_cli_help_does_not_import_torch():
    code = ("import sys; from distai.tutor.cli import main; rc = main(['--help']); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "NO-TORCH" in out.stdout and " run " in out.stdout and " runs " in out.stdout


@pytest.mark.parametrize("argv, message", [
    (["run", "lesson1", "--gpus", "0"], "--gpus must be at least 1"),
    (["run", "lesson1", "--gpus", "-3"], "--gpus must be at least 1"),
    (["run", "lesson1", "--gpus", "5000"], "more than this launcher allows"),
    (["run", "lesson1", "--cpu", "2", "--gpus", "2"], "not both"),
    (["run", "lesson42"], "unknown lesson"),
    (["run", "lesson1", "--nnodes", "2", "--node-rank", "0"], "--master-addr"),
    (["runs", "show", "no-such-run"], "no run matches"),
])
def test_cli_bad_requests_are_one_line_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    from distai.tutor.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["runs", "show", "no-such-run"], "ninguna ejecución coincide con 'no-such-run'"),
    (["runs", "show", "last"], "aún no hay ejecuciones"),
    (["runs", "show", "last", "--speed", "-1"], "--speed debe ser un número finito >= 0"),
    (["runs", "show", "last", "--speed", "nan"], "--speed debe ser un número finito >= 0"),
    (["runs", "--limit", "0"], "--limit debe ser al menos 1"),
    (["runs", "export", "no-such-run"], "ninguna ejecución coincide"),
    (["runs", "export", "last", "--format", "pdf"], "--format debe ser uno de chrome-trace, csv, jsonl"),
])
def test_runs_requests_are_refused_in_the_learners_language(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    monkeypatch.setenv("DISTAI_LANG", "es")
    from distai.tutor.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv, lang, message", [
    (["run", "lesson5", "--cpu", "2", "--pp", "3"], "es",
     "el experimento de lesson5 no acepta --pp 3 (sus opciones: --chunks, "),  # none near: all of them
    (["run", "lesson6", "--cpu", "2", "--bucket-mb"], "es", "argumento --bucket-mb: falta su valor"),
    (["run", "lesson6", "--cpu", "2", "--bucket"], "es",
     "el experimento de lesson6 no acepta --bucket (sus opciones: --bucket-mb)"),  # no abbreviations
    (["run", "lesson2", "--cpu", "2", "--strategies", "foo"], "en", "unknown strategies ['foo']"),
    (["run", "lesson5", "--cpu", "2", "--slowstage", "1"], "en",
     "lesson5's experiment does not take --slowstage 1 (its options: --slow-stage)"),
    # an abbreviation passed the check and the ranks read it as --schedules, then died after torchrun's banner
    (["run", "lesson5", "--cpu", "2", "--schedule", "bogus"], "en",
     "lesson5's experiment does not take --schedule bogus (its options: --schedules)"),
    # the capstone's own plan refuses it, with the nearest options as the other experiments' check does
    (["run", "capstone", "--cpu", "8", "--micro", "2"], "es",
     "el experimento de capstone no acepta --micro 2 (sus opciones: --microbatch-size, --microbatches)"),
    # no option at all, a group its shape cannot split: refused before torchrun, not after its banner
    (["run", "lesson4", "--cpu", "3"], "es", "tp = 3 no divide las 8 cabezas de atención"),
    # one rank has no ring: every bus bandwidth 0, and the sweep's ratio divided by it (a traceback after the run)
    (["run", "lesson1", "--cpu", "1"], "en", "lesson 1's ring needs at least 2 ranks, not 1: run with --cpu 2"),
    (["run", "context", "--cpu", "3"], "en", "the zigzag layout needs 2·cp = 6 to divide the sequence length 256"),
    # what no experiment can run: a non-finite number (it trained to a NaN loss and said "finished"), steps
    # without end (lesson 2 built its batches until memory ran out)
    (["run", "lesson1", "--cpu", "2", "--lr", "nan"], "en", "--lr must be a finite number, got nan"),
    (["run", "lesson2", "--cpu", "2", "--steps", "99999999999999999999999"], "es", "--steps debe ser como mucho 1.000.000"),
    # a size or count below 1: a rank's traceback ("negative dimension"), the default in its place, or a
    # refusal only after the launch
    (["run", "lesson5", "--cpu", "2", "--microbatch-size", "-1"], "es", "--microbatch-size debe ser al menos 1, no -1"),
    (["run", "lesson2", "--cpu", "2", "--hidden", "0"], "en", "--hidden must be at least 1, got 0"),
    (["run", "experts", "--cpu", "2", "--capacity-factor", "inf"], "en",
     "--capacity-factor must be a finite positive number, got inf"),
    # a wait of no time: every rank failed its first barrier with a traceback
    (["run", "lesson1", "--cpu", "2", "--barrier-timeout", "-5"], "en", "--barrier-timeout must be above 0 (seconds), got -5.0"),
    # the ranks' timeouts from the environment: a ValueError's traceback on every rank ("abc"), or no wait at all
    (["run", "lesson1", "--cpu", "2", "DISTAI_COLLECTIVE_TIMEOUT_S=abc"], "en",
     "DISTAI_COLLECTIVE_TIMEOUT_S must be a number of seconds above 0, got 'abc'"),
    (["run", "lesson3", "DISTAI_BARRIER_TIMEOUT_S=0"], "es",
     "DISTAI_BARRIER_TIMEOUT_S debe ser un número de segundos mayor que 0, no '0'"),
    # a checkpoint folder that cannot be made: every rank's PermissionError (or NotADirectoryError) traceback
    (["run", "lesson3", "--ckpt-dir", f"{sys.executable}/ckpt"], "es",
     f"--ckpt-dir {sys.executable}/ckpt: una parte de la ruta es un archivo, no una carpeta"),
])
def test_options_the_experiment_refuses_are_one_line_before_any_launch(argv, lang, message, capsys, tmp_path,
                                                                       monkeypatch):
    """What every rank would refuse (argparse's errors, the experiment's usage errors) is refused by one
    process that parses the options as a rank would, before torchrun starts: one line, exit 2, no run kept.
    An argument NAME=VALUE here is the environment's, not the command line's."""
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    monkeypatch.setenv("DISTAI_LANG", lang)
    for setting in [a for a in argv if "=" in a and a.startswith("DISTAI_")]:
        monkeypatch.setenv(*setting.split("=", 1))
        argv = [a for a in argv if a != setting]
    from distai.tutor.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.rglob("run.json"))


@pytest.mark.parametrize("lesson,option", [
    ("lesson5", "--schedules"),  # parsed by the experiment's own parser, in one process
    ("capstone", "--microbatch-size"),  # read inside the run (its plan needs the world size), parsed up front too
    ("experts", "--capacity-factor"),  # a launch plan that sizes the group but does not parse --help
])
def test_run_lesson_dash_dash_help_lists_the_experiments_options_without_launching(lesson, option, capsys, tmp_path,
                                                                                   monkeypatch):
    """`distai run LESSON -- --help` (README, `run --help`) prints the experiment's own options and exits 0;
    an audit found it launching a whole group whose ranks printed the help into the run (lesson 3's and 5's
    never reached the screen)."""
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    from distai.tutor.cli import main

    assert main(["run", lesson, "--", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: distai run {lesson}") and option in out
    assert not list(tmp_path.rglob("run.json"))


# ---------------------------------------------------------------------------- real launches
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except OSError:
        return False


def _profiled_then_stopped(home: Path) -> dict:
    """A profiled run stopped at its third step, as `s` or Ctrl-C stops one (the launcher's SIGTERM)."""
    rec = create_run(home / "runs", "lesson1", LESSON1)
    seen: list[dict] = []
    launch: list[L.Launch] = []

    def consume(event: dict) -> None:
        seen.append(event)
        if event.get("kind") == "step" and event.get("step", 0) >= 3:
            launch[0].stop()

    spec = L.LaunchSpec(LESSON1, L.Placement("cpu", 2), ["--steps", "200000", "--no-sweep", "--trace", "none"],
                        profile=True)
    launch.append(L.Launch(spec, rec, consumer=consume, grace_s=20))
    started = time.monotonic()
    record = launch[0].run()
    return {"record": record, "events": seen, "took": time.monotonic() - started, "left": L.run_processes(record.id)}


def _launch(home: Path, args: list[str], profile: bool = False) -> dict:
    rec = create_run(home / "runs", "lesson1", LESSON1)
    seen: list[dict] = []
    launch = L.Launch(L.LaunchSpec(LESSON1, L.Placement("cpu", 2), args, profile=profile), rec,
                      consumer=seen.append, grace_s=3)
    record = launch.run()
    return {"record": record, "events": seen, "ended": time.time(), "left": L.run_processes(record.id)}


class _FillingLog:
    """A log file on a disk that fills after ``room`` lines (ENOSPC from then on)."""

    def __init__(self, room: int):
        self.room, self.lines = room, 0

    def write(self, text: str) -> int:
        if self.lines >= self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.lines += 1
        return len(text)

    def close(self) -> None:
        pass


def _disk_fills(home: Path) -> dict:
    """The disk fills mid-run: the logs' writes and the record's last save fail with ENOSPC. The reader of
    torchrun's output must go on (a dead one leaves the pipe unread), the run end as it ended, and the learner
    be told what was not kept."""
    rec = create_run(home / "runs", "lesson1", LESSON1)
    seen: list[dict] = []
    launch = L.Launch(L.LaunchSpec(LESSON1, L.Placement("cpu", 2), ["--steps", "3", "--no-sweep"], lang="es"), rec,
                      consumer=seen.append, grace_s=3)
    log = _FillingLog(room=3)
    launch._log = lambda rank: log  # type: ignore[method-assign]
    save = rec.save

    def save_until_the_end() -> None:
        if launch.proc is not None and launch.proc.poll() is not None:  # the run has ended: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(rec.dir / "run.json"))
        save()

    rec.save = save_until_the_end  # type: ignore[method-assign]
    record = launch.run()
    return {"record": record, "events": seen, "left": L.run_processes(record.id),
            "on_disk": RunRecord.load(rec.dir)}


def _training_run(home: Path, *flags: str, stderr=subprocess.PIPE, ignore_hup: bool = False, job: bool = False,
                  env: dict[str, str] | None = None):
    """`distai run lesson1` for ever, once its ranks are training: (process, run folder, the run's pids);
    ``ignore_hup``: started as `nohup` starts it, SIGHUP ignored; ``job``: in a process group of its own in
    this session, as a shell starts a job (a new session's group is orphaned: the kernel drops its SIGTSTP);
    ``env``: more environment variables."""
    env = dict(os.environ, DISTAI_HOME=str(home), **(env or {}))
    hup = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if ignore_hup else None
    proc = subprocess.Popen([*DISTAI, "run", "lesson1", "--cpu", "2", "--steps", "1000000", "--no-sweep", *flags],
                            env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=not job, cwd=REPO,
                            preexec_fn=os.setpgrp if job else hup)
    runs = home / "runs"
    deadline = time.time() + 240
    while time.time() < deadline:
        dirs = list(runs.glob("*/events/rank0.jsonl")) if runs.is_dir() else []
        if dirs and dirs[0].stat().st_size > 4000:  # rank 0 has emitted a dozen step events
            return proc, dirs[0].parents[1], L.run_processes(dirs[0].parents[1].name)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    return proc, None, []


def test_ctrl_z_stops_the_ranks_with_the_command_and_fg_goes_on(tmp_path):
    """Ctrl-Z (SIGTSTP) stopped only `distai run`: its ranks, in a session of their own, trained on into a pipe
    nobody read. Now every process of the run stops with it, and SIGCONT (fg, bg) lets them all go on.
    A suspension longer than the ranks wait for one another ends the run when it resumes (their deadlines ran
    on): the command then says why, in one line, where it had only the ranks' "Timed out waiting" traces."""
    from distai.engine.runs import process_state

    wait_s = 10  # the collectives' timeout: a short Ctrl-Z stays under it, a long one not (the checkpoints' 60 s
    # stays: the first barrier, under CI's load, must not wait on a slow start as if a rank were dead)
    proc, run_dir, pids = _training_run(tmp_path, job=True, env={"DISTAI_COLLECTIVE_TIMEOUT_S": str(wait_s)})
    try:
        assert run_dir is not None and len(pids) >= 3, proc.stderr.read().decode()[-2000:]
        steps = lambda: (run_dir / "events" / "rank0.jsonl").read_bytes().count(b'"kind":"step"')  # noqa: E731

        def suspend() -> None:
            proc.send_signal(signal.SIGTSTP)
            deadline = time.time() + 20
            while time.time() < deadline and not all(process_state(p) == "T" for p in [proc.pid, *pids]):
                time.sleep(0.1)
            assert {p: process_state(p) for p in [proc.pid, *pids]} == dict.fromkeys([proc.pid, *pids], "T")

        suspend()
        before = steps()
        time.sleep(1.0)
        assert steps() == before  # no step while stopped
        proc.send_signal(signal.SIGCONT)
        deadline = time.time() + 30
        while time.time() < deadline and steps() < before + 5:
            time.sleep(0.1)
        assert steps() >= before + 5 and all(process_state(p) not in ("T", None) for p in [proc.pid, *pids])
        os.kill(pids[-1], signal.SIGSTOP)  # a rank first, so that its peer surely waits in a collective, as it
        time.sleep(0.5)                     # mostly does (stopped between two, a run may outlive a long Ctrl-Z)
        suspend()
        time.sleep(wait_s + 2)
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=60) == 1
        record = RunRecord.load(run_dir)
        assert record.status == "failed" and record.suspended_s >= wait_s + 2 and record.ranks_wait_s == wait_s
        last = proc.stderr.read().decode().strip().splitlines()[-1]
        assert last.startswith("distai: the run had been suspended (Ctrl-Z) for 1"), last  # 12 s or a little more
        assert f"({wait_s} s): on resuming they gave up" in last, last
        # the run's replay says it again, from its record
        shown = subprocess.run([*DISTAI, "runs", "show", run_dir.name], env=dict(os.environ, DISTAI_HOME=str(tmp_path)),
                               capture_output=True, text=True, timeout=60, cwd=REPO)
        assert shown.returncode == 0 and shown.stderr.strip().splitlines()[-1] == last, shown.stderr
        listed = subprocess.run([*DISTAI, "runs"], env=dict(os.environ, DISTAI_HOME=str(tmp_path), COLUMNS="400"),
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert "└ it failed on resuming from a Ctrl-Z of 1" in listed.stdout, listed.stdout  # not gloo's timeout
        assert f"longer than its ranks wait for one another ({wait_s} s)" in listed.stdout, listed.stdout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _ctrl_c(home: Path, sig: signal.Signals = signal.SIGINT) -> dict:
    proc, run_dir, pids = _training_run(home)
    t0 = time.time()
    proc.send_signal(sig)
    if sig == signal.SIGINT:
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # a nervous double Ctrl-C: the second must not cut the record short
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = None
    took = time.time() - t0
    time.sleep(0.3)
    return {"rc": rc, "took": took, "pids": pids, "run_dir": run_dir,
            "alive": [p for p in pids if _alive(p)], "stderr": proc.stderr.read().decode()}


def _nohup(home: Path) -> dict:
    """`nohup distai run …` and the terminal closes (SIGHUP): the run goes on; SIGTERM then stops it."""
    proc, run_dir, pids = _training_run(home, ignore_hup=True)
    proc.send_signal(signal.SIGHUP)
    time.sleep(3)
    went_on = proc.poll() is None and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = None
    time.sleep(0.3)
    return {"went_on": went_on, "pids": pids, "rc": rc, "run_dir": run_dir, "alive": [p for p in pids if _alive(p)]}


def _sigkill_launcher(home: Path) -> dict:
    """SIGKILL `distai run` itself mid-run: nothing of it may survive (torchrun's parent-death
    signal, the ranks' watch on their parent and on the launcher)."""
    proc, run_dir, pids = _training_run(home, "--json", stderr=subprocess.DEVNULL)
    t0 = time.time()
    os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, as the OOM killer or `kill -9` would
    proc.wait()
    left = L.run_processes(run_dir.name) if run_dir else []
    while left and time.time() - t0 < 20:
        time.sleep(0.05)
        left = L.run_processes(run_dir.name)
    return {"run_dir": run_dir, "pids": pids, "clean_after": time.time() - t0, "left": left,
            "listed": subprocess.run([*DISTAI, "runs", "--json"], env=dict(os.environ, DISTAI_HOME=str(home)),
                                     capture_output=True, text=True, timeout=60, cwd=REPO)}


def _terminal_closed(home: Path) -> dict:
    """`distai run` in a terminal (its live view on a pseudo-terminal) that closes mid-run: the kernel sends
    SIGHUP, and the view's last writes fail (EIO). The run must stop, its record say so, and distai exit as
    the shell counts SIGHUP (129), with no traceback."""
    import pty

    env = dict(os.environ, DISTAI_HOME=str(home), COLUMNS="100", LINES="40", TERM="xterm")
    err = home / "stderr.txt"
    pid, fd = pty.fork()
    if pid == 0:  # the child: distai on the terminal, its stderr to a file the test reads
        os.chdir(REPO)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.execve(sys.executable, [*DISTAI, "run", "lesson1", "--cpu", "2", "--steps", "1000000", "--no-sweep"], env)
    run_dir, deadline = None, time.time() + 240
    while time.time() < deadline and run_dir is None:
        try:
            os.read(fd, 65536)  # what the terminal shows, unread by anyone
        except OSError:
            break
        found = list((home / "runs").glob("*/events/rank0.jsonl")) if (home / "runs").is_dir() else []
        if found and found[0].stat().st_size > 4000:
            run_dir = found[0].parents[1]
    os.close(fd)  # the terminal closes
    rc = exit_code_within(pid, 30)
    time.sleep(0.3)
    return {"rc": rc, "run_dir": run_dir, "stderr": err.read_text() if err.exists() else "",
            "left": L.run_processes(run_dir.name) if run_dir else []}


def _json_run(home: Path) -> dict:
    env = dict(os.environ, DISTAI_HOME=str(home))
    proc = subprocess.Popen([*DISTAI, "run", "lesson1", "--cpu", "2", "--json", "--steps", "60", "--no-sweep"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    events, latencies = [], []
    for line in proc.stdout:
        now = time.time()
        event = json.loads(line)
        events.append(event)
        if event.get("rank") is not None and event.get("kind") != "output":
            latencies.append(now - event["t"])
    rc = proc.wait(timeout=60)
    return {"rc": rc, "events": events, "latencies": latencies, "stderr": proc.stderr.read().decode()}


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    jobs = {
        "crash": lambda: _launch(home, ["--steps", "50", "--no-sweep", "--fail-rank", "1", "--fail-step", "2"]),
        "hang": lambda: _launch(home, ["--steps", "2", "--no-sweep", "--hang-rank", "1", "--barrier-timeout", "2"]),
        "ctrl_c": lambda: _ctrl_c(tmp_path_factory.mktemp("home_ctrl_c")),
        "sigterm": lambda: _ctrl_c(tmp_path_factory.mktemp("home_sigterm"), signal.SIGTERM),
        "json": lambda: _json_run(home),
        "profile": lambda: _launch(home, ["--steps", "3", "--no-sweep", "--trace", "none"], profile=True),
        "sigkill": lambda: _sigkill_launcher(tmp_path_factory.mktemp("home_sigkill")),
        "terminal_closed": lambda: _terminal_closed(tmp_path_factory.mktemp("home_hup")),
        "disk_fills": lambda: _disk_fills(tmp_path_factory.mktemp("home_full")),
        "nohup": lambda: _nohup(tmp_path_factory.mktemp("home_nohup")),
    }
    return {**run_concurrently(jobs, timeout_s=300), "home": home}


def test_a_disk_that_fills_mid_run_stops_the_logs_not_the_run_and_the_learner_is_told(launches):
    # the launcher's reader of torchrun's output died on the first log write the disk refused, and the run
    # ended in a traceback from closing the logs, its record left "running"
    r = outcome(launches, "disk_fills")
    lines = [e["line"] for e in r["events"] if e.get("kind") == "output"]
    cut = next(i for i, line in enumerate(lines) if line.startswith("distai: los registros de la ejecución acaban"))
    assert "no queda espacio en el disco" in lines[cut]
    assert any(e.get("rank") == 0 for e in r["events"][r["events"].index(next(
        e for e in r["events"] if e.get("line") == lines[cut])):] if e.get("kind") == "output"), \
        "rank 0's output after the cut never reached the learner"
    assert sum(line.startswith("distai: los registros") for line in lines) == 1
    assert any(line.startswith("distai: no se pudo guardar el registro de la ejecución: no queda espacio")
               for line in lines)
    end = r["events"][-1]
    assert end["kind"] == "run_end" and end["status"] == "ok" and r["record"].status == "ok"
    assert r["on_disk"].status == "running"  # the old record stands whole: `distai runs` was told it could not know
    assert r["left"] == []


def test_a_run_started_under_nohup_outlives_the_terminal_as_asked(launches):
    # the launcher's own SIGHUP handler replaced the ignore nohup had set: closing the terminal stopped the run
    r = outcome(launches, "nohup")
    assert r["pids"] and r["went_on"], r
    assert r["rc"] == 128 + signal.SIGTERM and r["alive"] == []
    assert RunRecord.load(r["run_dir"]).error == "stopped by SIGTERM"


def test_crashing_rank_is_named_with_its_last_lines_and_stops_the_others(launches):
    r = outcome(launches, "crash")
    rec = r["record"]
    assert rec.status == "failed" and rec.exit_code != 0
    assert rec.failed_rank == 1
    assert "injected failure on rank 1 at step 2" in rec.error
    assert any("RuntimeError: injected failure" in line for line in rec.error_tail)
    crash_t = min(e["t"] for e in r["events"] if e.get("kind") == "error")
    assert r["ended"] - crash_t < 15, "the other ranks were not stopped within seconds"
    assert r["left"] == []
    assert RunRecord.load(rec.dir).failed_rank == 1
    assert r["events"][-1]["kind"] == "run_end" and r["events"][-1]["failed_rank"] == 1


def test_hanging_rank_is_named(launches):
    rec = outcome(launches, "hang")["record"]
    assert rec.status == "failed" and rec.failed_rank == 1
    assert "rank 1 did not arrive at barrier 'after-train'" in rec.error
    assert rec.error_tail  # the reporter's lines when the hung rank printed nothing
    assert outcome(launches, "hang")["left"] == []


def test_ctrl_c_stops_every_rank_and_leaves_no_orphans(launches):
    r = outcome(launches, "ctrl_c")
    assert r["run_dir"] is not None, r["stderr"][-2000:]
    assert len(r["pids"]) >= 3  # torchrun and its two workers were running
    assert r["rc"] == 130, r["stderr"][-2000:]
    assert r["took"] < 20
    assert r["alive"] == [] and L.run_processes(r["run_dir"].name) == []
    rec = RunRecord.load(r["run_dir"])
    assert rec.status == "stopped" and "Ctrl-C" in rec.error and rec.duration_s is not None


def test_closing_the_terminal_stops_the_run_without_a_traceback(launches):
    r = outcome(launches, "terminal_closed")
    assert r["run_dir"] is not None, r["stderr"][-2000:]
    assert r["rc"] == 129 and "Traceback" not in r["stderr"], r["stderr"][-2000:]
    assert r["left"] == []
    rec = RunRecord.load(r["run_dir"])
    assert rec.status == "stopped" and "SIGHUP" in rec.error and rec.duration_s is not None


def test_sigterm_stops_every_rank_and_exits_as_the_shell_counts_it(launches):
    """`kill` (SIGTERM) stops the run as Ctrl-C does, and exits 128 + 15 (it said 130, SIGINT's)."""
    r = outcome(launches, "sigterm")
    assert r["run_dir"] is not None, r["stderr"][-2000:]
    assert r["rc"] == 143, r["stderr"][-2000:]
    assert r["alive"] == [] and L.run_processes(r["run_dir"].name) == []
    rec = RunRecord.load(r["run_dir"])
    assert rec.status == "stopped" and "SIGTERM" in rec.error
    # where it stopped, which `distai runs` says ("stopped by SIGTERM, at step 13")
    assert rec.last_step == rec.steps_reached()[0] >= 10
    listed = subprocess.run([*DISTAI, "runs"], capture_output=True, text=True, timeout=60, cwd=REPO,
                            env=dict(os.environ, DISTAI_HOME=str(r["run_dir"].parents[1]), COLUMNS="200"))
    assert f"stopped by SIGTERM, at step {rec.last_step}" in listed.stdout, listed.stdout


def test_sigkilled_launcher_leaves_no_process_and_a_killed_run(launches):
    r = outcome(launches, "sigkill")
    assert r["run_dir"] is not None and len(r["pids"]) >= 3  # torchrun and its two workers were running
    print(f"kill-to-clean: {r['clean_after']:.2f} s")
    assert r["left"] == [] and r["clean_after"] < 5, r
    (listed,) = json.loads(r["listed"].stdout)
    assert listed["status"] == "killed" and listed["last_step"] >= 10
    assert listed["error"].startswith(f"the launcher was killed at step {listed['last_step']}/1000000")
    rec = RunRecord.load(r["run_dir"])  # the folder says so too, and every event line that is whole reads
    assert rec.status == "killed" and rec.last_step == listed["last_step"]
    # its length until its last event, the same in `distai runs` (it showed "—") and in `runs show`
    last_t = max(e["t"] for e in rec.events() if isinstance(e.get("t"), (int, float)))
    assert listed["duration_s"] == rec.duration_s == pytest.approx(last_t - rec.created)
    steps = [e["step"] for e in rec.events() if e["kind"] == "step"]
    assert steps == list(range(len(steps))) and len(steps) == rec.last_step
    assert not list(rec.dir.glob(".tmp-*"))  # no temporary record left behind


def test_profiled_run_saves_torch_profiler_traces_that_runs_show_points_to(launches):
    rec = outcome(launches, "profile")["record"]
    assert rec.status == "ok", rec.error
    profile_dir = Path(rec.config["profile_dir"])
    assert profile_dir == rec.dir / "profile"
    for rank in (0, 1):
        trace = json.loads((profile_dir / f"rank{rank}.pt.trace.json").read_text())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert any(n.startswith("aten::") for n in names)  # the rank's operators, as torch.profiler saw them
        assert any("gloo" in n or "c10d" in n or "send" in n for n in names)  # and its communication
        assert trace["traceName"] == str(profile_dir / f"rank{rank}.pt.trace.json")  # its own name, not the temporary one
    shown = subprocess.run([*DISTAI, "runs", "show", rec.id], capture_output=True, text=True, timeout=60, cwd=REPO,
                           env=dict(os.environ, DISTAI_HOME=str(launches["home"])))
    assert f"torch.profiler traces: {profile_dir} (2 files" in shown.stderr, shown.stderr
    # Kineto's trace-point lines ("USDT:… profiler_stop") stay in the logs, out of what the learner reads
    logged = (rec.dir / "logs" / "rank0.log").read_text()
    assert "profiler_stop" in logged and "profiler_stop" not in shown.stdout + shown.stderr


def test_a_profiled_run_stopped_midway_still_writes_every_ranks_trace(tmp_path):
    # no rank wrote its trace when stopped: a run profiled for minutes and stopped with `s` or Ctrl-C had none
    # (launched alone, not beside the module's concurrent launches: it would load the cores their timings read)
    r = _profiled_then_stopped(tmp_path)
    rec = r["record"]
    assert rec.status == "stopped" and rec.error == "stopped by the user", (rec.status, rec.error, rec.error_tail)
    assert r["left"] == [] and r["took"] < 120
    for rank in (0, 1):
        trace = json.loads((rec.dir / "profile" / f"rank{rank}.pt.trace.json").read_text())
        assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert not list((rec.dir / "profile").glob(".*.tmp"))  # each written whole, under its own name


def test_json_run_streams_events_live(launches):
    r = outcome(launches, "json")
    assert r["rc"] == 0, r["stderr"][-3000:]
    kinds = [e["kind"] for e in r["events"]]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and r["events"][-1]["status"] == "ok"
    # the backend the launcher announces is the one the ranks joined (the run header names it)
    assert r["events"][0]["backend"] == "gloo"
    assert {e["backend"] for e in r["events"] if "backend" in e} == {"gloo"} and len(
        [e for e in r["events"] if "backend" in e]) > 1
    steps = [e for e in r["events"] if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(60))
    assert "summary" in kinds and any(e["kind"] == "output" for e in r["events"])
    lat = sorted(r["latencies"])
    assert len(lat) > 60
    # handed over within 0.2 s of emission (through the launcher, the view and a pipe)
    assert lat[len(lat) // 2] < 0.2 and lat[int(0.95 * len(lat))] < 0.2, lat[-10:]


def test_runs_are_listed_and_replayed(launches):
    outcome(launches, "json")
    home = launches["home"]
    env = dict(os.environ, DISTAI_HOME=str(home))
    listed = json.loads(subprocess.run([*DISTAI, "runs", "--json"], env=env, capture_output=True,
                                       text=True, timeout=60, cwd=REPO).stdout)
    statuses = sorted(r["status"] for r in listed)
    assert statuses.count("failed") >= 2 and "ok" in statuses
    assert all(r["error"] for r in listed if r["status"] == "failed")
    ok = next(r for r in listed if r["status"] == "ok")
    shown = subprocess.run([*DISTAI, "runs", "show", ok["id"], "--json"], env=env, capture_output=True,
                           text=True, timeout=60, cwd=REPO)
    replayed = [json.loads(line) for line in shown.stdout.splitlines()]
    live = [e for e in outcome(launches, "json")["events"] if e.get("rank") is not None and e["kind"] != "output"]
    key = lambda e: (e["rank"], e["kind"], e["t"])  # noqa: E731
    assert sorted(map(key, live)) == sorted(key(e) for e in replayed if e["kind"] not in ("output", "run_start", "run_end")
                                            and e.get("rank") is not None)
    assert replayed[-1]["kind"] == "run_end" and replayed[-1]["status"] == "ok"
    table = subprocess.run([*DISTAI, "runs"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO).stdout
    assert ok["id"] in table and "did not arrive" in table and "injected failure" in table
    record = find_run(home / "runs", ok["id"])
    assert (record.dir / "command.txt").read_text().startswith(sys.executable)
    assert record.rank_log(0).exists() and record.rank_log(1).exists()
    assert replay_events(record)[0]["kind"] == "run_start"


def test_a_file_that_cannot_be_written_says_why_in_the_learners_language(tmp_path):
    import errno as errno_codes

    from distai.lessons.strings import os_error_text

    missing = OSError(errno_codes.ENOENT, "No such file or directory")
    assert os_error_text(missing, "es") == "no existe la carpeta" and os_error_text(missing, "en") == "no such folder"
    # the folder exists and refuses the file (/proc/x): not "no such folder"
    refused = OSError(errno_codes.ENOENT, "No such file or directory", str(tmp_path / "x.json"))
    assert os_error_text(refused, "en") == "that folder does not let anything be created in it"
    gone = OSError(errno_codes.ENOENT, "No such file or directory", str(tmp_path / "no-such-folder" / "x.json"))
    assert os_error_text(gone, "en") == "no such folder"
    too_long = OSError(errno_codes.ENAMETOOLONG, "File name too long")  # the system's words were English
    assert os_error_text(too_long, "es") == "el nombre es demasiado largo"
    odd = OSError(errno_codes.EOVERFLOW, "Value too large for defined data type")
    assert os_error_text(odd, "es") == "Value too large for defined data type"  # no catalog entry: the system's words


def test_a_stopped_runs_final_view_leaves_torchruns_signal_traceback_out():
    """torchrun answers a stop with its SignalException traceback: the final view of a stopped run shows the
    ranks' last lines, not that noise (it stays in logs/torchrun.log); a failed run keeps torchrun's report."""
    from distai.tutor.cli_run import output_lines

    state = RunState()
    for e in [{"kind": "output", "rank": 0, "line": "step 86/100"},
              {"kind": "output", "rank": None, "line": "torchrun    File \".../api.py\", line 86"},
              {"kind": "output", "rank": None, "line": "SignalException: Process 1 got signal: 15"},
              {"kind": "run_end", "status": "stopped", "error": "interrupted (Ctrl-C)"}]:
        state.feed(e)
    shown = output_lines(state, summary=False).plain
    assert "step 86/100" in shown and "SignalException" not in shown
    state.status = "failed"
    assert "SignalException" in output_lines(state, summary=False).plain


def test_a_ranks_long_line_goes_on_under_its_own_text():
    """The final view's tail: a rank's line too long for the terminal wraps under its text, not flush left
    under "rank 0" (lesson 3's head line went on at column 0)."""
    from distai.tutor.cli_run import output_lines

    state = RunState()
    long = ("40 steps on 2 ranks, 2 attempts: 1 failure, 1 restart, 2 steps redone; 8 checkpoints (file) of "
            "1.26 MiB, 17.8 ms each on average")
    for e in [{"kind": "output", "rank": 0, "line": long}, {"kind": "output", "rank": 1, "line": "done"},
              {"kind": "run_end", "status": "stopped"}]:
        state.feed(e)
    lines = output_lines(state, summary=False, width=80).plain.splitlines()
    assert lines[0].startswith("rank 0") and all(len(line) <= 80 for line in lines)
    assert lines[1].startswith(" " * 9) and "8 checkpoints" in lines[1] and lines[2].startswith("rank 1")
    assert " ".join(part.strip() for part in lines[:2]).endswith(long.split("redone; ")[1])


def test_a_run_whose_record_cannot_be_read_is_listed_as_damaged(tmp_path):
    """A run.json cut short hid its run from `distai runs`; it is listed, damaged, with why, and found by id."""
    from distai.engine.runs import find_run, list_runs, reason_text

    good = create_run(tmp_path, "lesson1", "distai.engine.experiments.lesson1")
    bad = create_run(tmp_path, "lesson6", "distai.engine.experiments.lesson6")
    (bad.dir / "run.json").write_text('{"id": "cut sho', encoding="utf-8")
    runs = {r.id: r for r in list_runs(tmp_path)}
    assert runs[good.id].status == "running" and runs[bad.id].status == "damaged" and runs[bad.id].lesson == "lesson6"
    assert find_run(tmp_path, bad.id).status == "damaged"
    assert reason_text(runs[bad.id].error, "es") == \
        "run.json está cortado o no es JSON (sus eventos se reproducen igual)"  # not "JSONDecodeError"
    # its replay ends as damaged, timed by its events (not from the folder's mtime, nor counting on)
    from distai.engine.run_state import RunState, replay_events
    from distai.lessons.events import STEP

    (bad.dir / "events").mkdir(exist_ok=True)
    (bad.dir / "events" / "rank0.jsonl").write_text(
        "\n".join(json.dumps(STEP.event({"step": k, "loss": 1.0, "t": 1000.0 + k, "rank": 0})) for k in range(3)) + "\n")
    state = RunState()
    for event in replay_events(find_run(tmp_path, bad.id)):
        state.feed(event)
    assert state.finished and state.status == "damaged" and state.clock(now=5e9) == 2.0


def test_records_and_events_damaged_in_any_way_are_damaged_runs_and_left_out_events(tmp_path, capsys, monkeypatch):
    """JSON that is no record (``null``, a list), fields of the wrong kind, a start no date can show, events
    that are not UTF-8 or not objects, a step that is not a number: each was a traceback of ``distai runs``
    or ``runs show``; the run is listed as damaged, started when its folder's name says, and such events
    are left out as a torn line is."""
    import time

    from distai.engine.events import read_events
    from distai.engine.runs import find_run, list_runs
    from distai.lessons.events import STEP
    from distai.tutor.cli import main

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    runs_dir = tmp_path / "runs"
    rec = create_run(runs_dir, "lesson3", "distai.engine.experiments.lesson3")
    named = time.mktime(time.strptime(rec.id[:15], "%Y%m%d-%H%M%S"))
    saved = json.loads((rec.dir / "run.json").read_text())
    for damage in ("null", "[1, 2]", json.dumps(dict(saved, config="str")), json.dumps(dict(saved, created=1e30)),
                   json.dumps(dict(saved, exit_code="0")), json.dumps(dict(saved, error_tail=[1])),
                   json.dumps(dict(saved, duration_s=float("inf"))),
                   json.dumps(dict(saved, launcher_pid=2 ** 40)), json.dumps(dict(saved, launcher_pid=-1))):
        (rec.dir / "run.json").write_text(damage, encoding="utf-8")
        os.utime(rec.dir, (named + 3600, named + 3600))  # damaged an hour later
        (listed,) = list_runs(runs_dir)
        assert listed.status == "damaged" and listed.created == named, damage
        assert find_run(runs_dir, str(rec.dir)).status == "damaged"  # by its folder's path too
        assert main(["runs"]) == 0 and main(["runs", "show", rec.id]) == 0
    events = rec.dir / "events" / "rank0.jsonl"
    events.parent.mkdir(exist_ok=True)
    good = [STEP.event({"step": k, "of": 3, "loss": 1.0, "t": 1000.0 + k, "rank": 0}) for k in range(3)]
    with open(events, "wb") as f:
        f.write((json.dumps(good[0]) + "\n").encode())
        f.write(bytes(range(128, 256)) + b"\n" + b"5\nnull\n[1, 2]\n")
        f.write((json.dumps(dict(good[1], t="y")) + "\n").encode())
        f.write((json.dumps(dict(good[1], t=float("nan"))) + "\n").encode())
        f.write((json.dumps(good[2]) + "\n").encode())
        f.write(b'{"kind": "progress", "t": 1001.5, "rank": 0, "done": 1e999, "total": 3}\n')  # no run writes these
        f.write(b'{"kind": "step", "t": 1001.6, "rank": 0, "step": Infinity, "of": 3, "loss": 1.0}\n')
        f.write(b'{"kind": "progress", "t": 1001.7, "rank": 0, "done": 100000000000000000000000, "total": 3}\n')
        f.write((json.dumps(dict(good[1], step="x", t=2000.0)) + "\n").encode())  # the last step: the one drawn
    assert [e.get("step") for e in read_events(events) if e["kind"] == "step"] == [0, 2, math.inf, "x"]  # not "y", NaN
    assert len(list(read_events(events))) == 5  # 1e999 and Infinity read as a run's own NaN loss would be; 10²³ not
    # what the run's readers get: the events whose declared fields hold their types ("step": "x" and
    # Infinity, "done": 1e999 are no counts: each was a traceback of runs show or runs export)
    assert [(e["kind"], e.get("step")) for e in find_run(runs_dir, rec.id).events()] == [("step", 0), ("step", 2)]
    capsys.readouterr()
    assert main(["runs", "show", rec.id]) == 0 and main(["runs", "export", rec.id, "-f", "csv", "-o", "-"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    # a record still "running" whose launcher's pid now belongs to another process (pid reuse) was killed
    from distai.engine.runs import process_start

    (rec.dir / "run.json").write_text(json.dumps(dict(saved, status="running", launcher_pid=os.getpid(),
                                                      launcher_start=process_start(os.getpid()) + 1)))
    assert find_run(runs_dir, rec.id).effective_status == "killed"
    (rec.dir / "run.json").write_text(json.dumps(dict(saved, status="running", launcher_pid=os.getpid(),
                                                      launcher_start=process_start(os.getpid()))))
    assert find_run(runs_dir, rec.id).effective_status == "running"


def test_a_copied_run_folder_is_a_run_of_its_own_and_one_without_its_record_is_damaged(tmp_path, capsys,
                                                                                         monkeypatch):
    """A copy was listed under the original's id (twice), a folder without run.json vanished, and a run
    without its events exported 'it ended before its first step'."""
    import shutil

    from distai.engine.runs import find_run, list_runs, reason_text
    from distai.tutor.cli import main

    original = create_run(tmp_path, "lesson1", "distai.engine.experiments.lesson1")
    (original.dir / "events").mkdir(exist_ok=True)
    copy = tmp_path / f"{original.id}-copy"
    shutil.copytree(original.dir, copy)
    orphan = tmp_path / "20261206-000000-lesson5-abcd"
    (orphan / "events").mkdir(parents=True)
    (tmp_path / "notes").mkdir()  # not a run: no record, no events, no logs
    runs = {r.id: r for r in list_runs(tmp_path)}
    assert set(runs) == {original.id, copy.name, orphan.name}
    assert find_run(tmp_path, copy.name).path == str(copy)
    assert runs[orphan.name].status == "damaged" and runs[orphan.name].lesson == "lesson5"
    assert reason_text(runs[orphan.name].error, "es") == "falta run.json (sus eventos se reproducen igual)"
    shutil.rmtree(copy / "events")
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path.parent))
    monkeypatch.setattr("distai.tutor.paths.runs_root", lambda: tmp_path)
    assert main(["runs", "export", str(copy), "--lang", "en"]) == 1
    assert "has no events folder" in capsys.readouterr().err


def test_the_run_view_wraps_between_its_fields_not_inside_them():
    """At 80 columns lesson 1's view read "step" / "40/40", "finished ·" / "6.7 s"."""
    from rich.console import Console

    from distai.engine.run_state import RunState
    from distai.tutor.cli_run import render_state

    state = RunState()
    events = [{"kind": "run_start", "run_id": "20261206-015447-lesson1-b529", "nproc": 2, "device": "cpu",
               "backend": "gloo", "t": 0.0},
              *({"kind": "step", "rank": 0, "step": k, "of": 40, "loss": 4.7 - k / 100, "comm_s": 0.00167,
                 "compute_s": 0.00739, "t": 0.1 * k} for k in range(40)),
              {"kind": "run_end", "status": "ok", "duration_s": 6.5, "t": 6.5}]
    for e in events:
        state.feed(e)
    for width in (60, 80, 100, 140):
        console = Console(width=width, record=True, file=open(os.devnull, "w"))
        console.print(render_state(state, "distai run lesson1"))
        lines = console.export_text().splitlines()
        assert all(len(line) <= width for line in lines)
        for field in ("finished", "· 6.5 s", "step 40/40", "comm 1.67 ms", "2 × cpu (gloo)"):
            assert any(field in line for line in lines), (width, field, lines)  # whole, on one line


def test_the_run_views_labelled_lines_wrap_under_their_text_without_trailing_spaces():
    """At 80 columns lesson 1's "fit    ring: … (1/β" / "= 1.32 GB/s)" broke inside its bracket, flush left, and
    the ring line ended in "(32 MiB); " with its trailing space."""
    from rich.console import Console

    from distai.engine.run_state import RunState
    from distai.tutor.cli_run import render_state

    state = RunState()
    for e in [{"kind": "run_start", "run_id": "20261206-060526-lesson1-9e39", "nproc": 2, "device": "cpu",
               "backend": "gloo", "t": 0.0},
              {"kind": "ring_step", "rank": 1, "call": 1016, "step": 1, "of": 2, "phase": "all-gather", "chunk": 0,
               "to": 0, "bytes": 32 * 2**20, "t": 1.0},
              {"kind": "fit", "impl": "ring", "alpha_s": 1.44e-3, "beta_s_per_byte": 7.59e-10, "bandwidth": 1.32e9,
               "t": 2.0}]:
        state.feed(e)
    assert state.fits and state.last_ring_step
    for lang, labels in (("en", ("fit    ", "ring   ")), ("es", ("ajuste ", "anillo "))):
        console = Console(width=80, record=True, file=open(os.devnull, "w"))
        console.print(render_state(state, "distai run lesson1", width=80, lang=lang))
        lines = console.export_text().splitlines()
        for label in labels:
            at = next(i for i, line in enumerate(lines) if line.startswith(label))
            assert len(lines[at]) <= 80 and lines[at] == lines[at].rstrip(), lines[at]
            assert lines[at + 1].startswith(" " * 7) and not lines[at + 1].startswith(" " * 8), lines[at:at + 2]
        assert any("(1/β = 1" in line for line in lines)  # the bracket stays whole


def test_rank_zeros_summary_wraps_under_its_own_indent_at_the_views_width():
    """Lesson 4's verdict at 80 columns wrapped flush left with a trailing space ("…tp+sp dif. máx. " /
    "9,7e-17 ✓"); each line now continues two spaces under its own indent, a table's row stays whole."""
    from distai.tutor.cli_run import output_lines

    printed = ["veredicto, T=2 (8,6 s):",
               "  pérdida y cada gradiente = denso: tp dif. máx. 9,7e-17 ✓; tp+sp dif. máx. 9,7e-17 ✓",
               "  size  time  busbw  ratio  (a table's row, columns two spaces apart, longer than the width)"]
    state = RunState()
    for line in printed:
        state.feed({"kind": "output", "rank": 0, "line": line})
    state.feed({"kind": "run_end", "status": "ok"})
    assert output_lines(state, summary=True).plain.strip().splitlines() == printed  # no width: as printed
    shown = output_lines(state, summary=True, width=60).plain.strip().splitlines()
    assert shown[:3] == ["veredicto, T=2 (8,6 s):",
                         "  pérdida y cada gradiente = denso: tp dif. máx. 9,7e-17 ✓;",
                         "    tp+sp dif. máx. 9,7e-17 ✓"]
    assert shown[3] == printed[2]


def test_a_run_that_reports_only_its_phases_shows_no_progress_stuck_at_zero():
    """Lessons 4 and 7 emit phases, not progress: the bar read 0% through the whole run, then 100%."""
    from rich.console import Console

    from distai.engine.run_state import RunState
    from distai.tutor.cli_run import render_state

    state = RunState()
    for e in [{"kind": "run_start", "run_id": "20261206-073000-lesson7-0001", "nproc": 2, "device": "cpu", "t": 0.0},
              {"kind": "phase", "name": "prefix sharing", "t": 5.0}]:
        state.feed(e)
    assert not state.progress_known
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(render_state(state, "distai run lesson7", width=80))
    text = console.export_text()
    assert "0%" not in text and "━" in text  # a pulse, not a bar at 0 %
    state.feed({"kind": "progress", "done": 1, "total": 4})
    assert state.progress_known and state.fraction == 0.25
    state.feed({"kind": "run_end", "status": "ok", "t": 9.0})
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(render_state(RunState(), "x", width=80))  # nothing yet: no bar, no 0 %
    assert "0%" not in console.export_text()


@pytest.mark.parametrize("summary", [True, False])
def test_the_launchers_own_notices_stay_in_a_finished_runs_view(summary):
    # "the run's logs stop here" and "the run's record could not be saved" reached the live view, but the view of
    # a run that ended ok showed rank 0's words alone: the learner never read them at the end
    from distai.tutor.cli_run import output_lines

    state = RunState()
    for rank, line in ((0, "result: ok"), (None, "W1207 torchrun noise"), (0, ""), (0, "verdict: all checks pass"),
                       (None, "distai: the run's record could not be saved: no space left on the disk; distai runs "
                              "will not know how it ended")):
        state.feed({"kind": "output", "rank": rank, "line": line})
    state.feed({"kind": "run_end", "status": "ok"})
    shown = output_lines(state, summary=summary).plain
    assert "distai: the run's record could not be saved" in shown and "torchrun noise" not in shown
    assert "verdict: all checks pass" in shown


def test_a_failed_ranks_heading_keeps_the_line_that_says_whose_lines_follow():
    # the rank that failed printed nothing (it was on another node): the launcher's "(rank 1 printed nothing;
    # rank 0 reported:)" led 14 of rank 0's lines, and the view's last 12 dropped it under "last lines of rank 1"
    from distai.tutor.cli_run import render_state

    state = RunState()
    state.feed({"kind": "run_end", "status": "failed", "error": "rank 1 was killed by SIGKILL", "failed_rank": 1,
                "tail": ["(rank 1 printed nothing; rank 0 reported:)", *[f"line {i}" for i in range(14)]]})
    from rich.console import Console

    console = Console(width=100, record=True, file=open("/dev/null", "w"))
    console.print(render_state(state))
    shown = console.export_text()
    assert "(rank 1 printed nothing; rank 0 reported:)" in shown and "line 13" in shown and "line 2\n" not in shown


def test_a_terminal_in_latin_1_gets_question_marks_not_a_traceback(tmp_path):
    """Under PYTHONIOENCODING=latin-1 (a Latin-1 terminal), `calc memory` ended in a UnicodeEncodeError on its Ψ
    and `distai run` on its "→", in the launcher's view and in the ranks' own output. A character the terminal
    lacks is now a "?", the Spanish letters it has stay, and the ranks write UTF-8 to the launcher that reads it."""
    env = dict(os.environ, DISTAI_HOME=str(tmp_path), PYTHONIOENCODING="latin-1")
    calc = subprocess.run([*DISTAI, "calc", "memory", "--params", "7B", "--dp", "8", "--strategy", "zero3"], env=env,
                          capture_output=True, timeout=60, cwd=REPO)
    assert calc.returncode == 0 and b"ZeRO-3, ? = 7B" in calc.stdout, calc.stderr.decode("latin-1")[-800:]
    run = subprocess.run([*DISTAI, "run", "lesson1", "--cpu", "2", "--steps", "3", "--lang", "es", "--", "--no-sweep"],
                         env=env, capture_output=True, timeout=180, cwd=REPO)
    out, err = run.stdout.decode("latin-1"), run.stderr.decode("latin-1")
    assert run.returncode == 0, (out + err)[-2000:]
    assert "pérdida 4,6909 ? " in out and "terminada tras" in out, out[-1500:]  # the ranks' summary, relayed
    assert err.startswith("carpeta de la ejecución: "), err


def test_a_run_started_in_a_deleted_folder_runs(tmp_path):
    """`distai run` from a folder deleted meanwhile (a temporary project removed under the shell): torchrun,
    started there, died at once ("Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"). It now starts in
    the run's folder, where the learner's is gone."""
    gone = tmp_path / "gone"
    gone.mkdir()
    command = " ".join([*DISTAI, "run", "lesson1", "--cpu", "2", "--steps", "3", "--", "--no-sweep"])
    run = subprocess.run(["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec {command}'], capture_output=True,
                         text=True, timeout=180, env=dict(os.environ, DISTAI_HOME=str(tmp_path / "home")))
    assert run.returncode == 0, (run.stdout + run.stderr)[-2000:]
    assert "finished after" in run.stdout


def test_an_export_its_run_folder_refuses_names_the_way_out(tmp_path, monkeypatch, capsys):
    """Another user's run, or one on a read-only disk: `runs export` into the run's own folder was refused
    with no word of -o, which writes it anywhere else."""
    import distai.tutor.cli_runs as cli_runs
    from distai.lessons.events import STEP
    from distai.tutor.cli import main

    rec = create_run(tmp_path, "lesson1", "distai.engine.experiments.lesson1")
    (rec.dir / "events").mkdir(exist_ok=True)
    steps = [STEP.event({"step": k, "of": 2, "loss": 1.0, "t": 1000.0 + k, "rank": 0}) for k in range(2)]
    (rec.dir / "events" / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in steps))
    monkeypatch.setattr("distai.tutor.paths.runs_root", lambda: tmp_path)

    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(cli_runs, "write_export", refused)
    assert main(["runs", "export", rec.id, "-f", "csv", "--lang", "es"]) == 1
    assert capsys.readouterr().err.strip() == (f"distai: error: no se puede escribir {rec.dir / 'metrics.csv'}: permiso "
                                               "denegado; escríbelo en otro sitio con -o ARCHIVO")
    assert main(["runs", "export", rec.id, "-f", "csv", "-o", str(tmp_path / "m.csv")]) == 1  # -o's own: no hint
    assert capsys.readouterr().err.strip().endswith("m.csv: permission denied")
