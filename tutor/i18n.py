"""Language choice: ``--lang``, else the locale, else English (``lessons/strings.py`` holds the rule,
which the experiments share)."""
from __future__ import annotations

from ..lessons.strings import detect_language

__all__ = ["detect_language"]
