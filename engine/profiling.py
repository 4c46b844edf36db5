"""``distai run LESSON --profile``: PyTorch's own profiler around a rank's work, saved beside the run.

The launcher sets ``DISTAI_PROFILE_DIR`` (``<run>/profile``); :func:`start_profiler`, called by
:func:`~distai.engine.runtime.init_distributed` once the process group is up, starts
``torch.profiler.profile`` with CPU activities (and CUDA where the rank runs on a GPU), and
:func:`stop_profiler`, called by :func:`~distai.engine.runtime.shutdown`, writes
``rank{R}.pt.trace.json`` there (``rank{R}.attempt{N}.pt.trace.json`` for torchrun's N-th restart, so a
restarted run keeps every attempt's): a Chrome trace of every operator and collective the rank ran
(Perfetto, chrome://tracing, or TensorBoard's profiler plugin open it). A profiled rank stopped by SIGTERM
(the learner's Ctrl-C or `s`, torchrun's stop after a peer failed) writes its trace, then ends by that signal:
the one signal handler a rank has, and only with ``--profile``. It runs once the main thread is between
Python steps: a rank blocked inside a collective writes nothing and ends by the SIGKILL that follows (the
launcher's, after its grace period), as every rank without it does; the CLI then says no trace was written.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILE_DIR_ENV = "DISTAI_PROFILE_DIR"
#: Kineto's trace-point lines at every profiler start and stop ("USDT:2026-12-06 09:08:14 4087:4087
#: SyncActivityProfilerHandler.cpp:59] profiler_stop"), printed at any log level short of silencing its errors
_TRACE_POINT = re.compile(r"USDT:\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \S+\.cpp:\d+\] ")


def is_profiler_trace_line(text: str) -> bool:
    """Whether a rank's output line is Kineto's trace-point log: kept in the run's logs, not shown to the
    learner under the run (live or replayed)."""
    return bool(_TRACE_POINT.match(text))


RELAUNCH_ENV = "DISTAI_RELAUNCH"  # the supervisor's relaunch (engine/supervisor.py): 0 for the first launch


def profile_file(directory: str | os.PathLike, rank: int, attempt: int = 0, relaunch: int = 0) -> Path:
    """``rank{R}.pt.trace.json``, with ``.relaunch{K}`` for the supervisor's K-th fresh torchrun and
    ``.attempt{N}`` for torchrun's N-th restart in place, so no attempt's trace overwrites another's."""
    parts = [f"rank{rank}"] + ([f"relaunch{relaunch}"] if relaunch else []) + ([f"attempt{attempt}"] if attempt else [])
    return Path(directory) / (".".join(parts) + ".pt.trace.json")


def profile_files(directory: str | os.PathLike) -> list[Path]:
    """The traces written in ``directory``, every rank's and attempt's."""
    return sorted(Path(directory).glob("rank*.pt.trace.json"))


@dataclass
class RankProfile:
    profiler: Any  # torch.profiler.profile, started
    rank: int
    saving: bool = False  # stop_profiler has begun: a SIGTERM now waits for the file, then ends the rank
    end_by: int | None = None  # that SIGTERM


def start_profiler(rank: int, cuda: bool) -> RankProfile | None:
    """The started profiler when this run was asked to profile, else None."""
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory:
        return None
    import torch.profiler as tp

    activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if cuda else [])
    prof = tp.profile(activities=activities, record_shapes=False, with_stack=False)
    prof.start()
    profile = RankProfile(prof, rank)
    _save_on_sigterm(profile)
    return profile


def _save_on_sigterm(profile: RankProfile) -> None:
    """SIGTERM writes the trace recorded so far, then ends the rank by SIGTERM itself (torchrun and the
    launcher read a rank that exited by a signal as stopped, not as one that failed on its own)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def save_and_end(signum: int, _frame: object) -> None:
        if profile.saving:  # the rank's own shutdown is writing it: ended once the file is in place
            profile.end_by = signum
            return
        try:
            stop_profiler(profile)
        except Exception:  # noqa: BLE001 - a trace that cannot be written must not keep the rank alive
            pass
        _end_by(signum)

    signal.signal(signal.SIGTERM, save_and_end)


def _end_by(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def stop_profiler(prof: RankProfile | None) -> Path | None:
    """Stop ``prof`` and write its Chrome trace (atomically: a reader never sees half a file)."""
    if prof is None or prof.saving:
        return None
    prof.saving = True
    try:
        return _write_trace(prof)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # written: a SIGTERM ends the rank at once again
        if prof.end_by is not None:
            _end_by(prof.end_by)


def _write_trace(prof: RankProfile) -> Path:
    prof.profiler.stop()
    path = profile_file(os.environ[PROFILE_DIR_ENV], prof.rank, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                        int(os.environ.get(RELAUNCH_ENV, "0")))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    prof.profiler.export_chrome_trace(str(tmp))
    _name_trace(tmp, path)
    os.replace(tmp, path)
    return path


def _name_trace(tmp: Path, path: Path) -> None:
    """Kineto writes the file's own name into the trace (``"traceName"``): the final name, not the
    temporary one it was written under (which is gone once the file is in place)."""
    text = tmp.read_text(encoding="utf-8")
    written = json.dumps(str(tmp), ensure_ascii=False)  # Kineto writes the path as it is, UTF-8
    at = text.rfind(f'"traceName": {written}')
    if at >= 0:
        text = text[:at] + f'"traceName": {json.dumps(str(path), ensure_ascii=False)}' + \
            text[at + len(f'"traceName": {written}'):]
        tmp.write_text(text, encoding="utf-8")
