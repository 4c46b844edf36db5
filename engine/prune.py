"""Removing old run folders (``distai runs prune``): which runs go, which stay and why, and a removal that
a kill cannot leave half done.

A run goes when it is not among the ``keep`` newest runs of its lesson and, where asked, is older than
``older_than_s``. Whatever the counts say, a run stays when
- it is still running (its launcher lives, or it runs on another node this machine cannot see),
- a new run can resume from its checkpoints (lesson 3's folder of a run that did not finish), or another
  run's ``--ckpt-dir`` points into its folder (that run's checkpoints live there),
- its folder is one the learner chose with ``--run-dir``, outside the runs folder.

A folder is renamed to ``.removing-<id>`` before it is deleted: the rename is atomic, so a prune killed
midway leaves either the whole run or a hidden folder that no listing reads (the next prune deletes it),
never a half-deleted run listed as damaged. Nothing here imports torch or the tutor.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .runs import REMOVING_PREFIX, RunRecord, list_runs, resumable_checkpoints, settle_killed


@dataclass
class PrunePlan:
    """What a prune removes (``remove``, oldest last as listed) and what it keeps that the counts would take."""
    remove: list[RunRecord] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # run id -> the bytes its folder holds
    kept_running: list[RunRecord] = field(default_factory=list)
    kept_checkpoints: list[RunRecord] = field(default_factory=list)
    kept_elsewhere: list[RunRecord] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """What the folders of the runs in ``remove`` hold on disk."""
        return sum(self.sizes.get(run.id, 0) for run in self.remove)


def folder_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (links not followed; a file gone meanwhile counts 0)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _checkpoint_folders_in_use(runs: list[RunRecord]) -> list[Path]:
    """The ``--ckpt-dir`` folders the runs' own commands name (a resumed run writes its checkpoints there)."""
    used = []
    for run in runs:
        argv = run.argv
        for i, arg in enumerate(argv):
            value = argv[i + 1] if arg == "--ckpt-dir" and i + 1 < len(argv) else \
                arg.split("=", 1)[1] if arg.startswith("--ckpt-dir=") else None
            if value:
                used.append(Path(value).expanduser().resolve())
    return used


def prune_plan(root: str | os.PathLike, keep: int, older_than_s: float | None = None,
               lesson: str | None = None, now: float | None = None) -> PrunePlan:
    """Which runs of ``root`` (of ``lesson`` only, if given) a prune keeping the ``keep`` newest of each
    lesson, and only those older than ``older_than_s`` seconds if given, removes; see the module's rules."""
    root = Path(root).expanduser().resolve()
    every = list_runs(root)  # newest first; every lesson's, for the --ckpt-dir folders they use
    runs = [settle_killed(r) for r in (every if lesson is None else list_runs(root, lesson))]  # as `runs --lesson`
    in_use = _checkpoint_folders_in_use(every) if runs else []
    now = time.time() if now is None else float(now)
    plan = PrunePlan()
    seen: dict[str, int] = defaultdict(int)
    for run in runs:
        seen[run.lesson] += 1
        if seen[run.lesson] <= keep or (older_than_s is not None and now - run.created < older_than_s):
            continue
        folder = run.dir.expanduser().resolve()
        if run.effective_status == "running":
            plan.kept_running.append(run)
        elif folder.parent != root:
            plan.kept_elsewhere.append(run)
        elif resumable_checkpoints(run) is not None or any(used.is_relative_to(folder) for used in in_use):
            plan.kept_checkpoints.append(run)
        else:
            plan.remove.append(run)
            plan.sizes[run.id] = folder_bytes(folder)
    return plan


def finish_removals(root: str | os.PathLike) -> None:
    """Delete what an earlier prune renamed and was killed before deleting (what still cannot go waits again)."""
    root = Path(root)
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(REMOVING_PREFIX) and (child.is_symlink() or child.is_dir()):
                _delete_renamed(child, [])


def _delete_renamed(hidden: Path, errors: list[OSError]) -> None:
    """Delete a run folder a prune renamed, going on past a file it cannot delete and keeping each error in
    ``errors``; a link (list_runs' elsewhere, not a folder of ours) is unlinked, never followed."""
    if hidden.is_symlink():
        hidden.unlink(missing_ok=True)
        return

    def keep(error: BaseException) -> None:
        errors.append(error if isinstance(error, OSError) else OSError(str(error)))

    if sys.version_info >= (3, 12):
        shutil.rmtree(hidden, onexc=lambda _fn, _path, exc: keep(exc))
    else:  # onexc is new in 3.12; onerror, its older form, is deprecated there
        shutil.rmtree(hidden, onerror=lambda _fn, _path, info: keep(info[1]))


def remove_runs(root: str | os.PathLike, runs: list[RunRecord]) -> tuple[list[RunRecord], list[tuple[RunRecord, OSError]]]:
    """Remove the runs' folders (each renamed first, then deleted): the runs removed, and those that could not
    be, each with its error. A folder that cannot be renamed (not ours to change) stays a run; one renamed but
    not deleted whole is listed no more, and the next prune deletes the rest."""
    root = Path(root)
    removed, failed = [], []
    for run in runs:
        hidden = root / f"{REMOVING_PREFIX}{run.id}"
        errors: list[OSError] = []
        try:
            os.rename(run.dir, hidden)
            _delete_renamed(hidden, errors)
        except OSError as exc:
            errors.append(exc)
        if errors:
            failed.append((run, errors[0]))
        else:
            removed.append(run)
    return removed, failed
