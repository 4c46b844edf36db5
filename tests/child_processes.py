"""Waiting for a child process the tests forked (a distai on a pseudo-terminal) without hanging the suite."""
from __future__ import annotations

import os
import signal
import time


def exit_code_within(pid: int, seconds: float) -> int | None:
    """The child's exit status as ``os.waitstatus_to_exitcode`` gives it (``-N`` for signal N) once it ends within ``seconds``;
    else None, and it is killed and reaped."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
