"""``distai run LESSON --profile``: PyTorch's own profiler around a rank's work, saved beside the run.

The launcher sets ``DISTAI_PROFILE_DIR`` (``<run>/profile``); :func:`start_profiler`, called by
:func:`~distai.engine.runtime.init_distributed` once the process group is up, starts
``torch.profiler.profile`` with CPU activities (and CUDA where the rank runs on a GPU), and
:func:`stop_profiler`, called by :func:`~distai.engine.runtime.shutdown`, writes
``rank{R}.pt.trace.json`` there: a Chrome trace of every operator and collective the rank ran
(Perfetto, chrome://tracing, or TensorBoard's profiler plugin open it).
"""
from __future__ import annotations

import os
import re
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


def profile_file(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.pt.trace.json"


@dataclass
class RankProfile:
    profiler: Any  # torch.profiler.profile, started
    rank: int


def start_profiler(rank: int, cuda: bool) -> RankProfile | None:
    """The started profiler when this run was asked to profile, else None."""
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory:
        return None
    import torch.profiler as tp

    activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if cuda else [])
    prof = tp.profile(activities=activities, record_shapes=False, with_stack=False)
    prof.start()
    return RankProfile(prof, rank)


def stop_profiler(prof: RankProfile | None) -> Path | None:
    """Stop ``prof`` and write its Chrome trace (atomically: a reader never sees half a file)."""
    if prof is None:
        return None
    prof.profiler.stop()
    path = profile_file(os.environ[PROFILE_DIR_ENV], prof.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    prof.profiler.export_chrome_trace(str(tmp))
    os.replace(tmp, path)
    return path
