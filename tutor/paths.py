"""Where the learner's saved state lives: ``$DISTAI_HOME`` if set, else the user data dir."""
from __future__ import annotations

import os
from pathlib import Path

from ..lessons.strings import LANGUAGES, TranslatedError, os_error_text, translated


class DataHomeError(TranslatedError):
    """The folder for the learner's saved state cannot be made or used (one line, every language)."""


def data_home_texts(exc: OSError, path) -> dict[str, str]:
    """That ``path``, a folder of the learner's saved state, cannot be used, why (``exc``) and the way out
    (DISTAI_HOME), in every language: the runs folder and the progress database say it alike."""
    return {lang: translated("cli", "errors.data_home", lang, path=path, why=os_error_text(exc, lang))
            for lang in LANGUAGES}


def _folder(path: Path) -> Path:
    """``path``, made if needed; a :class:`DataHomeError` saying why it cannot be (a file in its place, no
    permission) in the learner's words."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataHomeError(texts=data_home_texts(exc, path)) from None
    return path


def run_folder_error(exc: OSError, path) -> TranslatedError:
    """A run folder that cannot be made (a full disk, no permission), in every language: `distai run` and the
    tutor's run panel say it alike."""
    return TranslatedError(texts={lang: translated("cli", "run_says.run_dir_unwritable", lang, path=path,
                                                   why=os_error_text(exc, lang)) for lang in LANGUAGES})


def data_home() -> Path:
    override = os.environ.get("DISTAI_HOME")
    if override:
        home = Path(override).expanduser()
    else:
        from platformdirs import user_data_dir

        home = Path(user_data_dir("distai", appauthor=False))
    return _folder(home)


def progress_db_path() -> Path:
    return data_home() / "progress.db"


def runs_root() -> Path:
    return _folder(data_home() / "runs")
