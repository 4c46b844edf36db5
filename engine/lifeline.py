"""A run never outlives its owner: the launcher's processes die with it, even when it is SIGKILLed.

Two links, both Linux-first:

* :func:`parent_death_signal` is the ``preexec_fn`` the launcher gives torchrun: in the child,
  between ``fork`` and ``exec``, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` asks the kernel to kill
  torchrun the moment the launcher's thread that started it ends (man 2 prctl). SIGKILL, not
  SIGTERM: torchrun's orderly shutdown took 3 s on a loaded 2-core machine, and with nobody
  left to report to there is nothing for it to save; its workers follow through their own link.
* :func:`watch_launcher`, called by every rank as it starts, sets the rank's own parent-death
  signal (SIGKILL when torchrun, its parent, dies) and starts a daemon thread
  that checks twice a second that its parent is unchanged and that the launcher
  (``DISTAI_LAUNCHER_PID``) is alive — the check that also works where ``prctl`` does not exist,
  and that closes the window between the rank's start and its ``prctl`` call.

No torch, no signal handlers (torchrun's SIGTERM must still end a rank blocked in a collective).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

from .runs import pid_alive

LAUNCHER_PID_ENV = "DISTAI_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
CHECK_EVERY_S = 0.5

_watching = False


def _load_libc():
    # loaded at import, in the launcher: a preexec_fn must not dlopen between fork and exec
    if not sys.platform.startswith("linux"):
        return None
    for name in ("libc.so.6", None):  # glibc's soname; else ask (runs ldconfig: slower)
        try:
            return ctypes.CDLL(name or ctypes.util.find_library("c"), use_errno=True)
        except (OSError, TypeError):
            continue
    return None


_libc = _load_libc()


def _prctl_pdeathsig(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on Linux; False where it is not available."""
    if _libc is None:
        return False
    try:
        return _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except AttributeError:
        return False


def parent_death_signal() -> None:
    """``preexec_fn`` for torchrun: SIGKILL when the launcher goes (one foreign call between
    fork and exec, on a libc handle loaded before the fork)."""
    _prctl_pdeathsig(signal.SIGKILL)


def watch_launcher(env: dict | None = None) -> bool:
    """In a rank started by ``distai run``: die with torchrun (SIGKILL), and with the launcher
    (checked every ``CHECK_EVERY_S``). Outside a launch (no ``DISTAI_LAUNCHER_PID``): nothing.
    Returns whether a watch was set up."""
    global _watching
    env = dict(os.environ) if env is None else env
    try:
        launcher = int(env.get(LAUNCHER_PID_ENV, ""))
    except ValueError:
        return False
    if _watching:
        return True
    parent = os.getppid()
    _prctl_pdeathsig(signal.SIGKILL)

    def orphaned() -> bool:
        return os.getppid() != parent or not pid_alive(launcher)

    if orphaned():  # the parent went before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        while True:
            time.sleep(CHECK_EVERY_S)
            if orphaned():
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="distai-lifeline", daemon=True).start()
    _watching = True
    return True
