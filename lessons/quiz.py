"""Quiz machinery shared by the lessons: a declarative question builder, answer checking, reproducible quizzes.

Writing a lesson's quiz
-----------------------
A lesson's ``quiz.py`` declares its question kinds and builds ``GENERATORS`` (an ordered dict
``kind -> generator``; a generator takes a ``random.Random`` and a language and returns a
:class:`Question`); the texts, in English and Spanish, live beside it in ``quiz.toml``::

    from ..quiz import Choice, Numeric, build
    from . import formulas as f

    GENERATORS = build("lesson5", __package__, values=worked_numbers, kinds=[
        Numeric("bubble-ratio", draw={"p": [2, 4, 8], "m": [4, 8, 16]}, answer=f.bubble_ratio,
                quantity="fraction", unit="%", where=lambda p, m: (p - 1) / m >= 0.1,
                wrong={"the bubble share (p−1)/(m+p−1)": f.bubble_fraction}),
        Numeric("warmup", draw={"p": [4, 8], "m": lambda p: [2 * p, 4 * p], "rank": lambda p: range(p)},
                answer=lambda p, m, rank: f.warmup_forwards("1f1b", p, m, rank), integer=True),
        Choice("same-time"),
    ])

``quiz.toml`` has one table per kind and language::

    [bubble-ratio.en]
    prompt = "GPipe with p = {p} and m = {m}: how long is the bubble relative to the ideal time, in %?"
    explain = "(p−1)/m = {p1}/{m} = {answer:pct}."
    [same-time.en]
    prompt = "..."
    right = "..."                  # multiple choice: the right option ...
    wrong = ["...", "...", "..."]  # ... and the wrong ones (shown shuffled)

What a kind declares (:class:`Kind`, keyword arguments after the name):

- ``draw``: the parameters, in order: ``name -> a list or range`` to draw from, a constant, or a
  function of the earlier parameters returning either (``lambda p: range(p)``); a tuple of names
  unpacks a drawn tuple (``("layers", "heads"): MODELS``). ``where``: a predicate the parameters
  must satisfy (redrawn until it holds). :meth:`Kind.space` enumerates every combination, so tests
  can check a kind over its whole range.
- ``values``: a function of the parameters returning more numbers for the texts (``build``'s
  ``values`` adds one for every kind of the lesson). ``variant``: a parameter whose value picks a
  sub-table of a text field (``explain.gpipe = ...``, ``explain.1f1b = ...``).
- :class:`Numeric`: ``answer`` (the lesson's formula, called with the parameters its signature
  names, in base units: bytes, seconds, bytes/s, a fraction, a count), ``quantity`` (one of
  ``QUANTITIES``), ``unit`` the prompt asks in (``GB``, ``ms``, ``%``), ``tolerance`` (relative, 2%
  by default), ``integer`` (a whole number, matched exactly), and ``wrong``: the formulas a learner
  might confuse it with, named; the tolerance must reject each of them over the whole ``space()``
  (tests/test_quiz_builder.py checks every lesson's kinds). ``example``: a value in base units the prompt
  may show as ``{example}`` ("e.g. 6.1e-5"), moved by powers of ten until it is at least
  ``EXAMPLE_FACTOR`` (3×) away from the answer, so that a hint of the form never gives the value away
  (the answers' messages pick their "e.g." the same way: :func:`answer_example`).
- :class:`Choice`: texts ``right`` + ``wrong`` (shuffled), or ``options`` in a fixed order with
  ``answer`` a function of the parameters giving the right option's index.

Templates are ``str.format`` strings over the parameters, the ``values`` and, for numeric kinds,
``answer`` and ``answer_text`` (the answer as the question shows it). After a colon, a spec picks
how a number is written in the question's language: ``bytes`` (16.6 GB), ``time`` (1.5 ms),
``bw`` (100 GB/s), ``count`` (7.5B / 7,5 mil millones), ``pct`` (27.3% / 27,3 %), ``int``
(thousands separators), ``num`` / ``numN`` (3 or N significant digits), ``term`` (the value's
name in the language, from the file's ``[terms.en]`` / ``[terms.es]`` tables: ``{optimizer:term}``
→ "SGD con momento"), ``one|other`` (a word chosen by a count: ``{n} {n:step|steps}``); any other
spec is Python's.

Answers
-------
Numeric answers may carry units (``16.6 GB``, ``1.66e10``, ``16,6 GB``, ``1.5 ms``, ``27.3%``); a
bare number is read in the unit the question asks for *and* in base units (bytes, seconds), so both
``16.6`` (asked in GB) and ``1.66e10`` are right. An answer is correct when it is within the
question's relative tolerance (2% unless stated, and said "relative" for answers in %, where "±2%"
could read as points; exact for whole-number answers). Multiple choice:
the option's number (``2``), letter (``b``) or its full text. Nothing here raises on any input
string: :func:`check_answer` always returns a :class:`Check`.
"""
from __future__ import annotations

import importlib
import inspect
import math
import random
import re
import string
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from . import units
from .strings import translated

DEFAULT_TOLERANCE = 0.02
QUANTITIES = ("bytes", "seconds", "count", "fraction", "number", "bandwidth", "choice")
LETTERS = "abcdefgh"

# Units a question may ask in, with their factor to the base unit.
_HINT_FACTORS: dict[str, dict[str, float]] = {
    "bytes": {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
              "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40},
    "seconds": {"s": 1, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "min": 60, "h": 3600, "d": 86400},
    "bandwidth": {"B/s": 1, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12},
    "count": {"": 1, "k": 1e3, "M": 1e6, "B": 1e9, "T": 1e12},
    "fraction": {"": 1, "%": 0.01},
    "number": {"": 1},
}

_ALIASES = {"us", "KB"}  # read, never suggested: µs and kB are the units shown


@dataclass
class Question:
    """One question. ``answer`` is in base units (bytes, seconds, bytes/s, a fraction, a count) for
    numeric questions, or the index of the right option for multiple choice."""
    lesson_id: str
    kind: str
    lang: str
    prompt: str
    explanation: str
    answer: float
    quantity: str
    choices: tuple[str, ...] = ()
    tolerance: float = DEFAULT_TOLERANCE
    unit: str = ""          # the unit the prompt asks in (GB, ms, %, …)
    integer: bool = False   # whole-number answer: must match exactly after rounding
    params: dict = field(default_factory=dict)
    seed: int | None = None

    @property
    def is_choice(self) -> bool:
        return self.quantity == "choice"

    def answer_text(self) -> str:
        """The right answer, formatted in the question's language."""
        if self.is_choice:
            return f"{self.answer + 1}. {self.choices[int(self.answer)]}"
        return format_value(self.answer, self.quantity, self.unit, self.lang, integer=self.integer)

    def tolerance_text(self) -> str:
        if self.is_choice:
            return ""
        if self.integer:
            return translated("quiz", "exact_whole_number", self.lang)
        tol = "±" + units.format_percent(self.tolerance, 2, self.lang)
        # An answer in % with "±2%" reads as ±2 points; the check is relative (``_close``): say so.
        return translated("quiz", "relative_tolerance", self.lang, tol=tol) if self.quantity == "fraction" else tol


@dataclass
class Check:
    """The verdict on one answer. ``valid`` is False when the text could not be read at all
    (the quiz may ask again); ``value`` is what was understood (base units or option index)."""
    correct: bool
    valid: bool
    value: float | int | None
    message: str


def format_value(value: float, quantity: str, unit: str, lang: str, integer: bool = False) -> str:
    """``value`` (base units) shown in ``unit`` when given, else in a natural unit."""
    if integer:
        return units.format_integer(value, lang)
    if quantity == "fraction":
        return units.format_percent(value, 3, lang)
    factors = _HINT_FACTORS.get(quantity, {})
    if quantity == "count" and lang == "es":
        return units.format_count(value, lang=lang)  # 7,5 mil millones, never 7,5B
    if unit and unit in factors:
        num = units.format_number(value / factors[unit], 3, lang)
        sep = "" if quantity == "count" else " "
        return f"{num}{sep}{unit}".strip()
    if quantity == "bytes":
        return units.format_bytes(value, lang=lang)
    if quantity == "seconds":
        return units.format_time(value, lang=lang)
    if quantity == "bandwidth":
        return units.format_bandwidth(value, lang=lang)
    if quantity == "count":
        return units.format_count(value, lang=lang)
    return units.format_number(value, 4, lang)


# the unit an answer's example is written in where the question names none (a fraction's, "%", only in the
# example itself: an unreadable answer to a fraction gets no "e.g.")
_EXAMPLE_UNITS = {"bytes": "GB", "seconds": "s", "bandwidth": "GB/s"}

# An example of how to write an answer (a hint in a prompt, in a message) is never within this factor of
# the answer: an example must show the form, not give the value away.
EXAMPLE_FACTOR = 3.0


def example_value(answer: float, example: float) -> float:
    """``example`` (base units) moved by powers of ten until it is at least :data:`EXAMPLE_FACTOR` away from
    ``answer``: it shows how to write a number, never the number."""
    if not answer or not example or not math.isfinite(answer):
        return example
    for k in (0, -1, 1, -2, 2, -3, 3):
        value = example * 10.0 ** k
        ratio = abs(value / answer)
        if ratio >= EXAMPLE_FACTOR or ratio <= 1 / EXAMPLE_FACTOR:
            return value
    return example  # unreachable: a shift by 10 always gets a factor 10/3 away


def answer_example(q: Question) -> str:
    """How an answer to ``q`` may be written, in its language and unit (``12.5 GB``, ``12,5 mil millones``),
    with a value far from the answer (:func:`example_value`); "" for multiple choice."""
    if q.is_choice:
        return ""
    hint = q.unit or {**_EXAMPLE_UNITS, "fraction": "%"}.get(q.quantity, "")
    value = example_value(q.answer, 12.5 * _HINT_FACTORS.get(q.quantity, {}).get(hint, 1.0))
    if q.quantity in ("number", "count") and not hint:
        return units.format_number(value, 3, q.lang)
    return format_value(value, q.quantity, hint, q.lang)  # Spanish counts in words: 12,5 mil millones


def _candidates(text: str, q: Question) -> list[float]:
    """Every plausible reading of ``text`` as a value of the question's quantity, in base units: in the
    question's language, or where that reads nothing, in the other one ("1,5 GB" in English is read; "1,500B"
    is 1500B there, never 1.5B as in Spanish)."""
    out = _readings(text, q, q.lang)
    return out or _readings(text, q, "es" if q.lang == "en" else "en")


_BITS = re.compile(r"([kKmMgGtTpP]i?)b")  # 1Gb: gigabits, as a bandwidth's Gb/s


def _readings(text: str, q: Question, lang: str) -> list[float]:
    out: list[float] = []
    parse_kind = {"number": "count"}.get(q.quantity, q.quantity)
    stripped = text.strip()
    split = units.NUMBER_AND_UNIT.match(stripped)
    number, unit = split.groups() if split else ("", "")
    if parse_kind == "bytes" and unit and _BITS.fullmatch(unit.strip()):
        texts = [f"{number} {unit.strip()[:-1]}B"]  # a size in bits: read in bytes, then divided by 8
        scale = 1 / 8
    else:
        texts, scale = [text], 1.0
        # Spanish also groups thousands with a dot ("1.500 millones", "32.768"): read it both ways there
        if lang == "es" and number and re.fullmatch(r"[+-]?\d{1,3}(\.\d{3})+", number):
            texts.append(number.replace(".", "") + stripped[len(number):])
    for reading in texts:
        try:
            out.append(units.parse_quantity(reading, parse_kind, lang) * scale)
        except (ValueError, TypeError, OverflowError):
            pass
    try:
        bare = units.parse_number(text, lang)
    except (ValueError, TypeError, OverflowError):
        return [v for v in out if math.isfinite(v)]
    # A bare number is first read in the unit the question asks for ("16.6" asked in GB).
    for value in [bare] + [float(t) for t in texts[1:] if re.fullmatch(r"[+-]?\d+", t.strip())]:
        factor = _HINT_FACTORS.get(q.quantity, {}).get(q.unit)
        if factor is not None:
            out.insert(0, value * factor)
        if q.quantity == "fraction" and 1 < abs(value) <= 100:
            out.insert(0, value / 100)  # "27.3" meaning percent
    return [v for v in out if math.isfinite(v)]


def _foreign_unit(text: str, lang: str) -> str:
    """The unit of ``text`` when it is a readable number followed by one (``12 GB``), else ""."""
    match = units.NUMBER_AND_UNIT.match(text)
    if not match or not match.group(1) or not match.group(2):
        return ""
    for reading in (lang, "en", "es"):
        try:
            units.parse_number(match.group(1), reading)
            return match.group(2)
        except (ValueError, TypeError, OverflowError):
            continue
    return ""


# "57x" or "57 ×" for a ratio; "62 steps" or "62 pasos" for a count: the number, once the word is no unit
_RATIO_SIGN = re.compile(r"^(?:[x×]\s*(.+?)|(.+?)\s*(?:[x×]|times|veces))$", re.IGNORECASE)  # 16x, x16, 16 times
_NOUN = re.compile(r"[^\W\d_]{3,}")  # a word of three letters or more


def _is_unit(word: str) -> bool:
    """Whether ``word`` is a unit of any quantity, in either language ("GB", "ms", "millones")."""
    for kind in ("bytes", "seconds", "bandwidth", "count"):
        for lang in ("en", "es"):
            try:
                units.parse_quantity(f"1 {word}", kind, lang)
                return True
            except (ValueError, TypeError, OverflowError):
                continue
    return False


def _without_noun(text: str, q: Question) -> str:
    """``text`` without what a plain-number answer may carry after its number: a ratio's "x" or "×", or a
    word of the question that names what it counts ("steps"); anything else is returned as it was."""
    if q.quantity not in ("number", "count"):
        return text
    ratio = _RATIO_SIGN.match(text)
    if ratio and q.quantity == "number":
        return ratio.group(1) or ratio.group(2)
    # the words after the number, each one of what the question counts ("20 message steps" for "how many
    # message steps"; "6 pasos de mensajes"), joined by small words; "6 GPUs" is not steps
    asked = _asked_clause(q.prompt)
    words = text.split()
    kept = len(words)
    while kept > 1:
        word = words[kept - 1].rstrip(".")
        if word.lower() in _JOINING_WORDS and kept < len(words):
            kept -= 1
        elif _NOUN.fullmatch(word) and not _is_unit(word) and _names_what_is_asked(word, asked):
            kept -= 1
        else:
            break
    while kept < len(words) and words[kept].lower() in _JOINING_WORDS:  # never end on "de": "6 de"
        kept += 1
    return " ".join(words[:kept]) if kept < len(words) else text


#: the small words inside a noun phrase a count may carry ("pasos de mensajes", "steps of the ring")
_JOINING_WORDS = frozenset({"de", "del", "en", "el", "la", "los", "las", "of", "the", "in", "on"})
_HOW_MANY = re.compile(r"(?:how many|cuántos|cuántas|cuantos|cuantas)\s+([^?¿]*)", re.IGNORECASE)


#: where the noun phrase after "how many" ends: its verb, or what qualifies it ("how many communication steps
#: | does a ring all-reduce on 8 GPUs take": "14 GPUs" is not steps)
_PHRASE_ENDS = frozenset({
    "does", "do", "did", "is", "are", "can", "could", "should", "would", "will", "must", "run", "fit", "exist",
    "take", "per", "hace", "hacen", "hay", "es", "son", "tarda", "provoca", "dura", "caben", "cabe", "acepta",
    "usa", "tiene", "guarda", "procesa", "envía", "debe", "se", "necesita", "por", "como"})


def _asked_clause(prompt: str) -> str:
    """What a question counts: its words after "how many" / "cuántos" up to the phrase's verb (the whole
    prompt where it asks otherwise)."""
    found = _HOW_MANY.search(prompt)
    if not found:
        return prompt
    words = re.split(r"\s+|(?=[(,;:])", found.group(1))
    end = next((i for i, w in enumerate(words) if w.lower() in _PHRASE_ENDS or w[:1] in "(,;:"), len(words))
    return " ".join(words[:end])


def _names_what_is_asked(word: str, prompt: str) -> bool:
    """Whether ``word`` is a word of the question ("steps" in "how many communication steps"), singular
    or plural: "12 furlongs" stays a foreign unit."""
    words = {w.lower() for w in re.findall(r"[^\W\d_]+", prompt)}
    stem = word.lower()
    return stem in words or stem + "s" in words or stem + "es" in words or stem.rstrip("s") in words


def _close(value: float, answer: float, q: Question) -> bool:
    if q.integer:
        return round(value) == round(answer) and abs(value - round(value)) < 1e-6 * max(1.0, abs(value))
    if answer == 0:
        return abs(value) <= 1e-12
    return abs(value - answer) <= q.tolerance * abs(answer) * (1 + 1e-12)


def check_answer(q: Question, text) -> Check:
    """Judge ``text`` against ``q``. Never raises."""
    try:
        return _check(q, text)
    except Exception as exc:  # noqa: BLE001 — a quiz never crashes on input
        return Check(False, False, None, f"could not read the answer ({type(exc).__name__})")


def _check(q: Question, text) -> Check:
    if text is None:
        text = ""
    if not isinstance(text, str):
        text = str(text)
    s = text.strip()
    if not s:
        return Check(False, False, None, translated("quiz", "no_answer", q.lang))
    if q.is_choice:
        n = len(q.choices)
        idx = None
        low = s.lower().strip().rstrip(".").strip("()")  # "2", "b", "b)", "(b)"
        if low.isdigit() and 1 <= int(low) <= n:
            idx = int(low) - 1
        elif len(low) == 1 and low in LETTERS[:n]:
            idx = LETTERS.index(low)
        else:
            for i, c in enumerate(q.choices):  # the option's text, its final full stop optional
                if c.strip().lower().rstrip(".") == s.lower().rstrip("."):
                    idx = i
        if idx is None:
            return Check(False, False, None,
                         translated("quiz", "choose_option", q.lang, n=n, last=LETTERS[n - 1]))
        return Check(idx == q.answer, True, idx, "")
    values = _candidates(s, q) or _candidates(_without_noun(s, q), q)
    if not values:
        hint = q.unit or _EXAMPLE_UNITS.get(q.quantity, "")
        example = answer_example(q)
        unit = _foreign_unit(s, q.lang)
        if unit:
            taken = ([translated("quiz", "count_units", q.lang)] if q.quantity == "count" else
                     [u for u in _HINT_FACTORS.get(q.quantity, {}) if u and u not in _ALIASES])
            return Check(False, False, None,
                         translated("quiz", "wrong_unit" if taken else "no_unit", q.lang, unit=repr(unit),
                                    units=", ".join(taken), example=example))
        return Check(False, False, None,
                     translated("quiz", "unreadable_with_unit" if hint else "unreadable", q.lang, text=repr(s[:40]),
                                example=example))
    for v in values:
        if _close(v, q.answer, q):
            return Check(True, True, v, "")
    return Check(False, True, values[0], "")


# ------------------------------------------------------------------------------ building questions


def numeric(lesson_id: str, kind: str, lang: str, prompt: str, explanation: str, answer: float,
            quantity: str, unit: str = "", params: dict | None = None, tolerance: float = DEFAULT_TOLERANCE,
            integer: bool = False) -> Question:
    if quantity not in QUANTITIES or quantity == "choice":
        raise ValueError(f"bad quantity {quantity!r}")
    if unit and unit not in _HINT_FACTORS.get(quantity, {}):
        raise ValueError(f"unit {unit!r} is not a unit of {quantity}")
    return Question(lesson_id, kind, lang, prompt, explanation, answer, quantity, (), tolerance, unit,
                    integer, dict(params or {}))


def choice(lesson_id: str, kind: str, lang: str, rng: random.Random, prompt: str, right: str,
           wrong: list[str], explanation: str, params: dict | None = None, shuffle: bool = True) -> Question:
    """A multiple-choice question; options shuffled with ``rng`` (``shuffle=False`` keeps the order)."""
    options = [right] + list(wrong)
    if len(set(options)) != len(options):
        raise ValueError("options must differ")
    order = list(range(len(options)))
    if shuffle:
        rng.shuffle(order)
    choices = tuple(options[i] for i in order)
    return Question(lesson_id, kind, lang, prompt, explanation, order.index(0), "choice", choices,
                    0.0, "", False, dict(params or {}))


def yes_no(lesson_id: str, kind: str, lang: str, prompt: str, yes: str, no: str, truth: bool, explanation: str,
           params: dict | None = None) -> Question:
    """A two-option question in fixed order (``yes`` first); the right option follows ``truth``."""
    return Question(lesson_id, kind, lang, prompt, explanation, 0 if truth else 1, "choice", (yes, no),
                    0.0, "", False, dict(params or {}))


# ------------------------------------------------------------------------------ the question builder

# The text formats a template may name after a field's colon: ``{size:bytes}``, ``{alpha:time}``.
_FORMATS: dict[str, Callable[[Any, str], str]] = {
    "bytes": lambda v, lang: units.format_bytes(v, lang=lang),
    "ibytes": lambda v, lang: units.format_bytes(v, binary=True, lang=lang),  # KiB, MiB: where the lesson counts so
    "time": lambda v, lang: units.format_time(v, lang=lang),
    "bw": lambda v, lang: units.format_bandwidth(v, lang=lang),
    "count": lambda v, lang: units.format_count(v, lang=lang),
    "pct": lambda v, lang: units.format_percent(v, 3, lang),
    "int": lambda v, lang: units.format_integer(v, lang),
}


@dataclass(frozen=True)
class _Shown:
    """A field already formatted with the others of its template (``sum-bytes``, ``sum-time``)."""
    text: str


class _Formatter(string.Formatter):
    """``str.format`` with the question's language: ``{x:bytes}`` (``{x:ibytes}`` in KiB, MiB), ``{x:time}``, ``{x:bw}``,
    ``{x:count}``, ``{x:pct}``, ``{x:int}`` (thousands separators), ``{x:num}``/``{x:numN}`` (3 or N
    significant digits, decimal comma in Spanish), ``{x:term}`` (x's name in the lesson's ``[terms.LANG]``
    table), ``{n:one|other}`` (the first word when n is 1), ``{x:sum-bytes}`` (every such field of a
    template in one unit and precision: the terms of a sum and its total, which then add up; ``{x:sum-time}``
    the same for durations); any other spec is Python's. A bare ``{x}`` shows an
    int as ``{x:int}`` does (so one count is written one way in a prompt: "1024-byte … 1024 GPUs", not
    "1,024-byte … 1024 GPUs") and a float with 3 significant digits."""

    def __init__(self, lang: str, terms: Mapping[str, str] | None = None):
        super().__init__()
        self.lang = lang
        self.terms = terms or {}
        self.together: dict[str, str] = {}

    def vformat(self, format_string, args, kwargs):
        self.together = {}
        for spec, together in (("sum-bytes", units.format_bytes_together), ("sum-time", units.format_time_together)):
            names = [name for _, name, field_spec, _ in self.parse(format_string) if field_spec == spec and name]
            self.together.update(zip(names, together([kwargs[name] for name in names], lang=self.lang)))
        return super().vformat(format_string, args, kwargs)

    def get_value(self, key, args, kwargs):
        return _Shown(self.together[key]) if key in self.together else super().get_value(key, args, kwargs)

    def format_field(self, value, format_spec):
        if isinstance(value, _Shown):
            return value.text
        if "|" in format_spec:  # a word chosen by a count: {n:step|steps}
            one, _, other = format_spec.partition("|")
            return one if not isinstance(value, bool) and value == 1 else other
        if format_spec == "term":
            return self.terms.get(str(value), str(value))
        if format_spec in _FORMATS:
            return _FORMATS[format_spec](value, self.lang)
        digits = re.fullmatch(r"num(\d*)", format_spec)
        if digits:
            return units.format_number(value, int(digits.group(1) or 3), self.lang)
        if not format_spec and isinstance(value, float):
            return units.format_number(value, 3, self.lang)
        if not format_spec and isinstance(value, int) and not isinstance(value, bool):
            return units.format_integer(value, self.lang)
        return super().format_field(value, format_spec)


def call_with(func: Callable, params: Mapping[str, Any]):
    """``func`` called with the parameters its signature names (all of them if it takes ``**kwargs``)."""
    sig = inspect.signature(func)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return func(**params)
    return func(**{k: params[k] for k in sig.parameters if k in params})


def _options(spec, params: Mapping[str, Any]) -> list:
    if callable(spec):
        spec = call_with(spec, params)
    if isinstance(spec, (str, bytes)) or not isinstance(spec, (Sequence, range)):
        return [spec]
    return list(spec)


def _assign(params: dict, key, value) -> None:
    if isinstance(key, tuple):
        params.update(zip(key, value))
    else:
        params[key] = value


@cache
def question_texts(package: str) -> dict:
    """The ``quiz.toml`` of a lesson package: ``{kind: {lang: {field: template}}}``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads(resources.files(package).joinpath("quiz.toml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Kind:
    """What every question kind declares: its name, how its parameters are drawn, and the numbers
    its texts show. Subclasses: :class:`Numeric` and :class:`Choice`."""

    name: str
    _: KW_ONLY
    # name (or tuple of names, unpacked) -> a sequence to draw from, a constant, or a function of
    # the earlier parameters returning either. Drawn in order with the question's Random.
    draw: Mapping[Any, Any] = field(default_factory=dict)
    where: Callable[..., bool] | None = None      # keep only parameters where this is true
    values: Callable[..., Mapping[str, Any]] | None = None  # more numbers for the texts
    variant: str | None = None  # a parameter whose value picks a sub-table of a text field

    def sample(self, rng: random.Random) -> dict:
        """One draw of the parameters (redrawn until ``where`` holds)."""
        for _ in range(10_000):
            params: dict = {}
            for key, spec in self.draw.items():
                _assign(params, key, rng.choice(_options(spec, params)))
            if self.where is None or call_with(self.where, params):
                return params
        raise RuntimeError(f"question kind {self.name!r}: no parameters satisfy its condition")

    def space(self) -> Iterator[dict]:
        """Every combination of parameters the kind can draw (where ``where`` holds)."""
        def walk(items, params):
            if not items:
                if self.where is None or call_with(self.where, params):
                    yield dict(params)
                return
            (key, spec), rest = items[0], items[1:]
            for value in _options(spec, params):
                inner = dict(params)
                _assign(inner, key, value)
                yield from walk(rest, inner)
        yield from walk(list(self.draw.items()), {})

    def fields(self, params: Mapping[str, Any]) -> dict:
        out = dict(params)
        if self.values is not None:
            out.update(call_with(self.values, params))
        return out

    def text(self, package: str, lang: str, key: str, fields: Mapping[str, Any]):
        """A text field of this kind in ``lang``, its template filled with ``fields`` (a list stays a list)."""
        try:
            template = question_texts(package)[self.name][lang][key]
        except KeyError:
            raise KeyError(f"{package}/quiz.toml has no [{self.name}.{lang}] {key}") from None
        if isinstance(template, dict):
            if self.variant is None:
                raise KeyError(f"{package}/quiz.toml [{self.name}.{lang}] {key} is a table by variant, "
                               f"and kind {self.name!r} names no variant")
            template = template[str(fields[self.variant])]
        fmt = _Formatter(lang, question_texts(package).get("terms", {}).get(lang))
        if isinstance(template, list):
            return [fmt.format(x, **fields) for x in template]
        return fmt.format(template, **fields)

    def question(self, lesson_id: str, package: str, rng: random.Random, lang: str) -> Question:
        raise NotImplementedError


@dataclass(frozen=True)
class Numeric(Kind):
    """A question answered with a number: ``answer`` (a formula of the lesson, called with the
    parameters it names) in base units; ``wrong`` names the formulas a learner might confuse it
    with, which the tolerance must reject over the whole parameter space (tested)."""

    answer: Callable[..., float] = field(kw_only=True)
    quantity: str = "number"
    unit: str = ""
    tolerance: float = DEFAULT_TOLERANCE
    integer: bool = False
    wrong: Mapping[str, Callable[..., float]] = field(default_factory=dict)
    example: float | None = None  # base units: the prompt's ``{example}``, moved away from the answer

    def value(self, params: Mapping[str, Any]) -> float:
        return call_with(self.answer, params)

    def question(self, lesson_id: str, package: str, rng: random.Random, lang: str) -> Question:
        params = self.sample(rng)
        answer = self.value(params)
        fields = self.fields(params)
        fields["answer"] = answer
        fields["answer_text"] = format_value(answer, self.quantity, self.unit, lang, integer=self.integer)
        if self.example is not None:
            fields["example"] = example_value(answer, self.example)
        return numeric(lesson_id, self.name, lang, self.text(package, lang, "prompt", fields),
                       self.text(package, lang, "explain", fields), answer, self.quantity, self.unit,
                       params, self.tolerance, self.integer)


@dataclass(frozen=True)
class Choice(Kind):
    """A multiple-choice question. Its texts give either ``right`` and ``wrong`` (a list; shown
    shuffled) or ``options`` in a fixed order with ``answer`` (called with the parameters) the
    index of the right one."""

    answer: Callable[..., int] | None = None

    def question(self, lesson_id: str, package: str, rng: random.Random, lang: str) -> Question:
        params = self.sample(rng)
        fields = self.fields(params)
        prompt = self.text(package, lang, "prompt", fields)
        explanation = self.text(package, lang, "explain", fields)
        if self.answer is not None:
            options = tuple(self.text(package, lang, "options", fields))
            return Question(lesson_id, self.name, lang, prompt, explanation, call_with(self.answer, params),
                            "choice", options, 0.0, "", False, params)
        return choice(lesson_id, self.name, lang, rng, prompt, self.text(package, lang, "right", fields),
                      self.text(package, lang, "wrong", fields), explanation, params)


@dataclass(frozen=True)
class Generator:
    """What a lesson's ``GENERATORS`` maps a kind's name to: called with a Random and a language."""

    kind: Kind
    lesson_id: str
    package: str

    def __call__(self, rng: random.Random, lang: str) -> Question:
        return self.kind.question(self.lesson_id, self.package, rng, lang)


def build(lesson_id: str, package: str, kinds: Sequence[Kind],
          values: Callable[..., Mapping[str, Any]] | None = None) -> dict[str, Generator]:
    """A lesson's ``GENERATORS`` from its declared kinds (texts in ``package``'s ``quiz.toml``);
    ``values``, if given, adds numbers for every kind's texts (a kind's own ``values`` win)."""
    names = [k.name for k in kinds]
    if len(set(names)) != len(names):
        raise ValueError(f"{lesson_id}: duplicate question kinds")
    if values is not None:
        kinds = [replace(k, values=_merged(values, k.values)) for k in kinds]
    return {k.name: Generator(k, lesson_id, package) for k in kinds}


def _merged(shared: Callable[..., Mapping[str, Any]], own: Callable[..., Mapping[str, Any]] | None):
    def values(**params):
        out = dict(call_with(shared, params))
        if own is not None:
            out.update(call_with(own, params))
        return out
    return values


# ------------------------------------------------------------------------------ quizzes


def generators(lesson_id: str) -> dict[str, Callable]:
    """The ordered ``kind -> generator`` mapping of a lesson (``lesson3`` or its number/slug)."""
    from .registry import resolve_lesson

    lesson = resolve_lesson(lesson_id)
    module = importlib.import_module(f"{lesson.package}.quiz")
    return module.GENERATORS


def question_seed(seed: int, lesson_id: str, kind: str, index: int) -> int:
    """A stable per-question seed (no Python hash randomisation)."""
    key = f"{seed}:{lesson_id}:{kind}:{index}".encode()
    h = 1469598103934665603
    for byte in key:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h >> 1


def make_question(lesson_id: str, kind: str, seed: int, lang: str = "en") -> Question:
    """Regenerate exactly one question: same (lesson, kind, seed, lang) → same question."""
    from .registry import resolve_lesson

    lesson = resolve_lesson(lesson_id)
    gens = generators(lesson.id)
    if kind not in gens:
        raise KeyError(f"lesson {lesson.id} has no question kind {kind!r}")
    q = gens[kind](random.Random(seed), lang)
    q.lesson_id, q.kind, q.seed = lesson.id, kind, seed
    return q


def build_quiz(lesson_id: str, count: int = 5, seed: int | None = None, lang: str = "en",
               kinds: list[str] | None = None) -> list[Question]:
    """``count`` questions of a lesson, reproducible with ``seed``: kinds are dealt from a shuffled deck
    so that every kind appears once before any repeats."""
    from .registry import resolve_lesson

    lesson = resolve_lesson(lesson_id)
    if count < 1:
        raise ValueError("count must be at least 1")
    if seed is None:
        seed = random.SystemRandom().randrange(2 ** 31)
    rng = random.Random(seed)
    pool = list(kinds) if kinds else list(generators(lesson.id))
    out: list[Question] = []
    deck: list[str] = []
    for i in range(count):
        if not deck:
            deck = pool[:]
            rng.shuffle(deck)
        kind = deck.pop()
        out.append(make_question(lesson.id, kind, question_seed(seed, lesson.id, kind, i), lang))
    return out
