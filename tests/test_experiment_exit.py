"""How a rank process ends (``distai.engine.experiment.exit_with``): with its status, cleanly, even
when native threads are still running at that moment.

Issue 27 item 9: ``distai run lesson7 --cpu 2`` once failed after rank 1 had done all its work
("terminate called without an active exception", SIGABRT at exit), and lesson 3's supervisor test
once relaunched twice where one failure was injected. After ``destroy_process_group`` gloo's
threads were measured still running at exit in both lessons (a c10d op through a
``TorchDispatchMode`` such as ``CommMeter`` keeps the group alive in torch 2.13), and the ranks
ended through the interpreter's teardown: a native thread that meets a finalizing interpreter
aborts the process. Which thread is busy at that moment is chance (1 run in ~45 under load).
Here it is not: the experiment below leaves a daemon thread inside torch (a matmul loop, the GIL
released) when it returns, so every exit meets a busy native thread — before the fix every such
rank aborted with exactly that message (exit status 134, -6 under torchrun).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distai.engine import launcher as L
from distai.engine.runs import create_run
from distai.engine.supervisor import Supervisor

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

#: an experiment that meters a collective (lesson 7's CommMeter), then returns while a daemon
#: thread is still inside a torch op
PROBE = textwrap.dedent('''
    import argparse
    import threading

    import torch
    import torch.distributed as dist

    from distai.engine.experiment import exit_with, run_experiment
    from distai.engine.metering import CommMeter


    def body(ctx, args):
        t = torch.full((4,), float(ctx.rank + 1))
        with CommMeter() as meter:
            dist.all_reduce(t)
        a = torch.randn(400, 400)
        busy = threading.Event()

        def spin():
            busy.set()
            while True:
                a @ a  # native code, GIL released: still running when the process ends

        threading.Thread(target=spin, daemon=True).start()
        busy.wait()
        return {"lesson": "exit_probe", "sum": float(t[0]), "all_reduces": meter.calls["allreduce"]}


    def main(argv=None):
        return run_experiment("exit_probe", argparse.ArgumentParser().parse_args, body, argv)


    if __name__ == "__main__":
        exit_with(main)
''')


def _probe(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exit_probe.py").write_text(PROBE, encoding="utf-8")
    return folder


def _with_path(folder: Path) -> str:
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_with_a_busy_native_thread_exits_with_its_status_not_an_abort(tmp_path):
    folder = _probe(tmp_path / "mod")
    events = tmp_path / "events"
    env = dict(os.environ, PYTHONPATH=_with_path(folder), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), DISTAI_DEVICE="cpu",
               DISTAI_EVENTS_DIR=str(events))
    env.pop("DISTAI_LAUNCHER_PID", None)
    proc = subprocess.run([sys.executable, "-m", "exit_probe"], env=env, capture_output=True, timeout=120)
    err = proc.stderr.decode(errors="replace")
    assert "terminate called" not in err
    assert proc.returncode == 0, err[-2000:]
    lines = [json.loads(x) for x in (events / "rank0.jsonl").read_text().splitlines() if x.strip()]
    (summary,) = [e for e in lines if e.get("kind") == "summary"]
    assert summary["sum"] == 1.0 and summary["all_reduces"] == 1  # the body ran, metered, to its end


def test_supervised_two_rank_run_ends_ok_without_a_relaunch_when_ranks_exit_busy(tmp_path):
    """The supervisor test's symptom: a run whose ranks finished is not a failure to relaunch."""
    folder = _probe(tmp_path / "mod")
    rec = create_run(tmp_path / "runs", "exit_probe", "exit_probe")
    seen: list[dict] = []
    spec = L.LaunchSpec("exit_probe", L.Placement("cpu", 2), env={"PYTHONPATH": _with_path(folder)})
    record = Supervisor(spec, rec, consumer=seen.append, relaunches=2, grace_s=3).run()
    logs = "".join(p.read_text(errors="replace") for p in Path(record.path, "logs").glob("*.log"))
    assert "terminate called" not in logs
    assert record.status == "ok" and record.exit_code == 0, (record.error, record.error_tail)
    assert not [e for e in seen if e.get("kind") == "relaunch"]
    (summary,) = [e for e in seen if e.get("kind") == "summary"]
    assert summary["sum"] == 3.0 and summary["all_reduces"] == 1  # 1 + 2 over both ranks


#: an experiment whose ``before_init`` blocks, as lesson 3's rendezvous does when torchrun is gone
BLOCKED = textwrap.dedent('''
    import argparse
    import sys
    import time

    from distai.engine.experiment import exit_with, run_experiment


    def wait_forever(args):
        open(sys.argv[1], "w").close()
        time.sleep(600)


    def main(argv=None):
        return run_experiment("blocked", argparse.ArgumentParser().parse_args, lambda ctx, a: None, [],
                              before_init=wait_forever)


    if __name__ == "__main__":
        exit_with(main)
''')


def test_a_rank_blocked_before_joining_its_group_dies_with_the_launcher(tmp_path):
    """SIGKILL of ``distai run`` while a rank waits in ``before_init`` (lesson 3's per-attempt TCPStore,
    before ``init_distributed``): the rank left with it, where it waited 4-5 minutes for its store's
    timeout and then wrote into a run already marked killed."""
    import time

    (tmp_path / "blocked.py").write_text(BLOCKED, encoding="utf-8")
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    marker = tmp_path / "waiting"
    env = dict(os.environ, PYTHONPATH=_with_path(tmp_path), DISTAI_LAUNCHER_PID=str(launcher.pid))
    rank = subprocess.Popen([sys.executable, "-m", "blocked", str(marker)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            assert rank.poll() is None
            time.sleep(0.05)
        assert marker.exists()
        launcher.kill()
        launcher.wait()
        assert rank.wait(timeout=10) != 0  # its lifeline killed it within a check or two (0.5 s each)
    finally:
        for p in (launcher, rank):
            if p.poll() is None:
                p.kill()
