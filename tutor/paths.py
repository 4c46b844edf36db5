"""Where the learner's saved state lives: ``$DISTAI_HOME`` if set, else the user data dir."""
from __future__ import annotations

import os
from pathlib import Path


def data_home() -> Path:
    override = os.environ.get("DISTAI_HOME")
    if override:
        home = Path(override).expanduser()
    else:
        from platformdirs import user_data_dir

        home = Path(user_data_dir("distai", appauthor=False))
    home.mkdir(parents=True, exist_ok=True)
    return home


def progress_db_path() -> Path:
    return data_home() / "progress.db"


def runs_root() -> Path:
    path = data_home() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path
