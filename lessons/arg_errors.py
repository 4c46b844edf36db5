"""argparse's own one-line refusals of a flag (``invalid int value``, ``expected one argument``,
``unrecognized arguments``, …) in every language of the course: an experiment's parser whose
``error`` raises a :class:`~distai.lessons.strings.TranslatedError` passes it
``texts=argparse_texts(message)``, so that ``distai run``'s check before the launch speaks the
learner's language. The English text is argparse's own (Python 3.11's); a message this module does
not know keeps it in every language.
"""
from __future__ import annotations

import re

from .strings import translations

__all__ = ["argparse_match", "argparse_texts", "unknown_option_texts"]

AREA = "run_checks"
#: argparse's messages (``argparse.py``'s templates) and their keys under ``run_checks.argparse``
PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(pattern), key) for pattern, key in (
    (r"argument (?P<flag>\S+): invalid int value: (?P<value>.*)", "invalid_int"),
    (r"argument (?P<flag>\S+): invalid float value: (?P<value>.*)", "invalid_float"),
    (r"argument (?P<flag>\S+): invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)", "invalid_choice"),
    (r"argument (?P<flag>\S+): invalid (?P<type>\w+) value: (?P<value>.*)", "invalid_value"),  # a type of ours
    (r"argument (?P<flag>\S+): not allowed with argument (?P<other>\S+)", "not_allowed"),
    (r"argument (?P<flag>\S+): expected at least one argument", "expected_at_least_one"),
    (r"the following arguments are required: (?P<args>.*)", "required"),
    (r"argument (?P<flag>\S+): expected one argument", "expected_one"),
    (r"argument (?P<flag>\S+): ignored explicit argument (?P<value>.*)", "ignored_explicit"),
    (r"ambiguous option: (?P<option>\S+) could match (?P<matches>.*)", "ambiguous"),
    (r"unrecognized arguments: (?P<args>.*)", "unrecognized"),
))


def argparse_match(message: str) -> tuple[str, dict[str, str]] | None:
    """Which of :data:`PATTERNS` ``message`` is (its key) and its fields, or None."""
    for pattern, key in PATTERNS:
        found = pattern.fullmatch(message)
        if found:
            return key, found.groupdict()
    return None


def argparse_texts(message: str) -> dict[str, str]:
    """``message`` (what argparse passes to ``ArgumentParser.error``) in every language; ``{}`` (the
    error's English message stands) when it is not one of :data:`PATTERNS`."""
    found = argparse_match(message)
    if found is None:
        return {}
    key, fields = found
    return translations(AREA, f"argparse.{key}", **fields)


def unknown_option_texts(message: str, options: list[str], lesson: str) -> dict[str, str]:
    """argparse's ``unrecognized arguments`` refusal of ``lesson``'s experiment in every language, with the
    nearest of its ``options`` (all of them when none is near): "does not take --micro 2 (its options:
    --microbatches, --microbatch-size)"; ``{}`` for any other message."""
    import difflib

    found = argparse_match(message)
    if found is None or found[0] != "unrecognized":
        return {}
    unknown = found[1]["args"]
    options = [o for o in options if o.startswith("--") and o != "--help"]
    flags = [a.split("=")[0] for a in unknown.split() if a.startswith("--")]
    # a prefix of options is the commonest slip (--micro for --microbatches): the experiments take no abbreviations
    near = sorted({m for f in flags for m in difflib.get_close_matches(f, options, n=3, cutoff=0.75)}
                  | {o for f in flags for o in options if len(f) > 2 and o.startswith(f)})
    said = translations("cli", "errors.experiment_unknown", lesson=lesson, arguments=unknown)
    listed = translations("cli", "errors.experiment_options", options=", ".join(near or options)) if options else {}
    return {lang: text + listed.get(lang, "") for lang, text in said.items()}
