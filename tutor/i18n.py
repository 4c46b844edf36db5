"""Language choice: ``--lang``, else the locale (``LANG=es_ES.UTF-8`` gives Spanish), else English."""
from __future__ import annotations

import os

from ..lessons.registry import LANGUAGES


def detect_language(explicit: str | None = None, environ: dict[str, str] | None = None) -> str:
    if explicit:
        lang = explicit.strip().lower()
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {explicit!r}; choose one of {', '.join(LANGUAGES)}")
        return lang
    env = os.environ if environ is None else environ
    # POSIX precedence: LC_ALL overrides LC_MESSAGES, which overrides LANG.
    for var in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = env.get(var, "")
        if value:
            code = value.split(".")[0].split("_")[0].lower()
            return code if code in LANGUAGES else "en"
    return "en"
