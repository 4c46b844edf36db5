"""The one catalog of translated strings, and its one lookup.

Every string the learner reads outside the lessons' Markdown lives in ``lessons/catalog/``: one
TOML file per area (``tutor.toml`` for the app's screens, ``quiz.toml``, ``run.toml``,
``visualizer.toml`` for what all visualizers share, and one file per visualizer, what its keys do
included), each with an ``[en]`` and an ``[es]`` table holding the same keys. A value is a ``str.format`` template or a nested
table (``reasons.memory``); a template may choose a word by a count, ``{n} {n:step|steps}`` (:class:`CatalogText`). Numbers reach a template already formatted by ``lessons/units.py``,
so each language's decimal separator is applied in one place.

``translated(area, key, lang, **fields)`` formats one string; ``strings(area, lang)`` is the whole
table of an area (a visualizer indexes it on every frame). A key missing in Spanish falls back
to English, never to a KeyError; ``tests/test_strings_catalog.py`` fails on any key, field or
nesting that differs between the languages.
"""
from __future__ import annotations

import errno
import os
import re
import string
import sys
from collections.abc import Mapping
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LANGUAGES = ("en", "es")  # every text of the course exists in these; the first is the fallback
FALLBACK = "en"
LANG_ENV = "DISTAI_LANG"  # the learner's language, set by the launcher for the ranks it starts (or by hand)


def detect_language(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``explicit`` (``--lang``), else ``DISTAI_LANG``, else the locale (``LANG=es_ES.UTF-8`` gives
    Spanish), else English. The tutor, the CLI and the experiments (the launcher sets ``DISTAI_LANG``
    to the language the run was asked in) read it alike."""
    if explicit:
        lang = explicit.strip().lower()
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {explicit!r}; choose one of {', '.join(LANGUAGES)}")
        return lang
    env = os.environ if environ is None else environ
    chosen = env.get(LANG_ENV, "").strip().lower()
    if chosen:
        return chosen if chosen in LANGUAGES else FALLBACK
    # POSIX precedence: LC_ALL overrides LC_MESSAGES, which overrides LANG.
    for var in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = env.get(var, "")
        if value:
            code = value.split(".")[0].split("_")[0].lower()
            return code if code in LANGUAGES else FALLBACK
    return FALLBACK


def areas() -> tuple[str, ...]:
    """The catalog's areas: the names of the files in ``lessons/catalog/``."""
    folder = resources.files(__package__).joinpath("catalog")
    return tuple(sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")))


@cache
def _area(area: str) -> dict[str, dict[str, Any]]:
    path = resources.files(__package__).joinpath("catalog", f"{area}.toml")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KeyError(f"no string catalog area {area!r} (lessons/catalog/{area}.toml)") from None
    return data


def _merged(primary: Mapping[str, Any], fallback: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(fallback)
    for key, value in primary.items():
        if isinstance(value, Mapping) and isinstance(fallback.get(key), Mapping):
            out[key] = _merged(value, fallback[key])
        else:
            out[key] = value
    return out


class _PluralFormatter(string.Formatter):
    """``str.format``'s rules, plus a plural choice: a field formatted ``{n:step|steps}`` gives the first word
    when ``n`` is one (the number, or the text a units formatter made of it), else the second."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if "|" in format_spec:
            one, _, other = format_spec.partition("|")
            return one if _is_one(value) else other
        return super().format_field(value, format_spec)


def _is_one(value: Any) -> bool:
    if isinstance(value, str):
        return re.fullmatch(r"\s*\+?1\s*", value) is not None
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == 1


_PLURAL = _PluralFormatter()


class CatalogText(str):
    """A catalog template: ``format`` is ``str.format`` with :class:`_PluralFormatter`'s plural choice, so
    a string fetched from a table (``tr["head"].format(n=1)``) counts as :func:`translated` does."""

    def format(self, /, *args: Any, **kwargs: Any) -> str:
        if "|" not in self:  # no plural choice: the fast built-in path
            return str.format(self, *args, **kwargs)
        return _PLURAL.vformat(self, args, kwargs)


def _texts(value: Any) -> Any:
    """``value`` read-only, its strings :class:`CatalogText`."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _texts(v) for k, v in value.items()})
    if isinstance(value, str):
        return CatalogText(value)
    if isinstance(value, list):
        return [_texts(v) for v in value]
    return value


@cache
def strings(area: str, lang: str) -> Mapping[str, Any]:
    """The whole table of ``area`` in ``lang`` (an unknown language, or a missing key, reads English)."""
    data = _area(area)
    english = data.get(FALLBACK, {})
    chosen = data.get(lang, {}) if lang in LANGUAGES else {}
    return _texts(_merged(chosen, english))


def translated(area: str, key: str, lang: str, /, **fields: Any) -> str:
    """The string ``key`` of ``area`` in ``lang``, formatted with ``fields``.

    ``key`` may be dotted to reach into a nested table (``"reasons.memory"``).
    """
    value: Any = strings(area, lang)
    for part in key.split("."):
        value = value[part]
    if not isinstance(value, str):
        raise KeyError(f"{area}.{key} is a table of strings, not a string")
    return value.format(**fields) if fields else value


def has(area: str, key: str) -> bool:
    """Whether ``area`` holds the string ``key`` (in English, the catalog's reference language)."""
    value: Any = strings(area, FALLBACK)
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return isinstance(value, str)


def translations(area: str, key: str, /, **fields: Any) -> dict[str, str]:
    """``key`` of ``area`` in every language; a field given as a function of the language (a size
    through ``units``) is called with it."""
    return {lang: translated(area, key, lang, **{k: v(lang) if callable(v) else v for k, v in fields.items()})
            for lang in LANGUAGES}


class TranslatedError(ValueError):
    """Bad input whose one-line message exists in every language: ``texts`` (``{"en": ..., "es": ...}``,
    e.g. from :meth:`keyed`); the exception's own message is the English one. Whoever shows it to the
    learner asks :meth:`text` for their language."""

    area = ""  # the catalog area of :meth:`keyed`'s keys
    prefix = ""  # and the table inside it they are in ("usage.": ``usage.<key>``)

    def __init__(self, message: str = "", texts: dict[str, str] | None = None):
        self.texts = dict(texts or {})
        super().__init__(message or self.texts.get(FALLBACK, ""))

    @classmethod
    def keyed(cls, key: str, **fields: Any) -> TranslatedError:
        """The error whose text is ``lessons/catalog/<area>.toml``'s ``<prefix><key>``, in every language
        (:func:`translations`)."""
        return cls(texts=translations(cls.area, cls.prefix + key, **fields))

    def text(self, lang: str) -> str:
        return self.texts.get(lang) or str(self)


def os_error_text(exc: OSError, lang: str) -> str:
    """Why ``exc`` happened, in ``lang`` for the usual causes (no such folder, permission denied, a full
    disk: the catalog's ``os_error``), else in the system's words."""
    name = errno.errorcode.get(exc.errno or 0, "")
    if name == "ENOENT" and exc.filename and os.path.isdir(os.path.dirname(os.path.abspath(exc.filename))):
        name = "ENOENT_in_folder"  # the folder is there and refuses the file: /proc/x said "no such folder"
    if name and has("cli", f"os_error.{name}"):
        return translated("cli", f"os_error.{name}", lang)
    return exc.strerror or str(exc)
