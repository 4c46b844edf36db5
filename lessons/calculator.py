"""A calculator: one of a lesson's formulas offered as ``distai calc NAME``, declared as data.

A lesson owns a calculator by holding ``calc_<name>.py`` in its folder (``tp-comm`` ->
``calc_tp_comm.py``) with ``CALCULATOR = Calculator(...)``: its options (what each one parses,
its default and bounds; their help, and the calculator's, in ``lessons/catalog/calc_help.toml``), ``compute`` (the parsed options -> the JSON object, sizes in bytes,
times in seconds, fractions in [0, 1]) and ``text`` (that object -> the lines printed, numbers via
``lessons/units.py``). ``distai.lessons.registry`` discovers them; the tutor builds the Typer
command from the declaration (``distai.tutor.cli_calc``).

Numeric options accept units (``7.5B``, ``175e9``, ``64MiB``, ``2GB``, ``5us``, ``1.5ms``,
``100GB/s``) and a decimal comma (``16,6 GB``). A bad value raises :class:`CalcError` (a
``ValueError``) with one line naming the option. Imports nothing heavy: ``distai --help`` loads
every declaration.
"""
from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from . import units
from .model_size import ShapeError, param_bounds
from .strings import TranslatedError, detect_language, has, strings, translated, translations

REQUIRED = ...  # an option the learner must give (Typer's spelling of "no default")

# what an option's text is parsed as
KINDS = (
    "whole",     # a whole count with units (128k, 7.5B): at least 1 unless ``minimum`` says otherwise
    "length",    # a whole number of tokens, K = 1024 (128k = 131072, as model cards count context)
    "count",     # a count, not necessarily whole (70B parameters)
    "bytes",     # 1GB, 64MiB, 4e8: whole bytes; a lone B (70B: bytes or billions?) is refused
    "capacity",  # a GPU's memory (80GB): as bytes, and a bare number below 1 MB asks "did you mean 80GB?"
    "time",      # 5us, 1.5ms, 3h
    "bandwidth",  # 100GB/s
    "per-byte",  # time per byte β: s/B (1e-11), or a bandwidth (100GB/s = 1e-11 s/B)
    "flops",     # peak compute: 989e12, 989T, 989 TFLOP/s
    "number",    # a plain number (0.9)
    "choice",    # one of ``choices`` (case-insensitive)
    "flag",      # a switch (--sequence-parallel)
)
_WHOLE_KINDS = ("whole", "length")  # whole numbers, at least 1 unless ``minimum`` says otherwise


class CalcError(TranslatedError):
    """Bad input to a calculator: a one-line message for the learner (``keyed``: a ``calc.toml`` key)."""

    area = "calc"


def check_params_fit_shape(params: float, layers: int, hidden: int, heads: int | None = None,
                           kv_heads: int | None = None) -> None:
    """:class:`CalcError` (one line) when ``--params`` is fewer than ``layers`` blocks of width ``hidden``
    hold (:func:`~distai.lessons.model_size.param_bounds`). Only that end: a mixture of experts holds
    far more than any dense shape, and these calculators take its whole count."""
    low = param_bounds(layers, hidden, heads, kv_heads)[0]
    if params < low:
        raise CalcError.keyed("errors.params_below_shape", params=lambda lang: units.format_count(params, lang=lang),
                              layers=layers, hidden=hidden, low=lambda lang: units.format_count(low, lang=lang))


@dataclass(frozen=True)
class Option:
    flag: str                          # "--micro-batch"
    kind: str                          # one of KINDS
    default: object = REQUIRED         # text as the learner would type it, None (optional), or a bool (flag)
    short: str | None = None           # "-p"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    strict_min: bool = False           # value must be > minimum (not >=)
    maximum: float | None = None
    # numbers its help text names (lessons/catalog/calc_help.toml [<lang>.<calculator>.options])
    help_fields: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.flag}: unknown option kind {self.kind!r}")

    @property
    def name(self) -> str:
        """The key of the parsed value: ``--micro-batch`` -> ``micro_batch``."""
        return self.flag.lstrip("-").replace("-", "_")

    def parse(self, text, lang: str = "en"):
        """The value of ``text`` (None stays None); a :class:`CalcError` names the option (in ``lang``)."""
        if text is None or self.kind == "flag":
            return text

        def refused(key: str, **fields) -> CalcError:
            return CalcError(translated("calc", f"errors.{key}", lang, flag=self.flag, value=repr(text), **fields))

        if self.kind == "choice":
            choice = str(text).strip().lower()
            if choice not in self.choices:
                raise refused("unknown_choice", choices=", ".join(self.choices))
            return choice
        text = str(text)
        try:
            value: float = _PARSERS[self.kind](text, lang)
        except ValueError as exc:  # a UnitError in the learner's language
            why = exc.text(lang) if isinstance(exc, TranslatedError) else str(exc)
            raise CalcError(f"{self.flag}: {why}") from None
        minimum = 1 if self.kind in _WHOLE_KINDS and self.minimum is None else self.minimum
        # a count past 2^53 is no model's or cluster's, and a float no longer holds it exactly
        maximum = units.LARGEST_COUNT if self.kind in (*_WHOLE_KINDS, "count") and self.maximum is None else self.maximum
        if self.kind in _WHOLE_KINDS:
            if value != math.floor(value):
                raise refused("whole")
            value = int(value)
        strict_min = self.strict_min
        if self.kind in ("flops", "bandwidth") and minimum is None:
            minimum, strict_min = 0, True  # a rate of 0 divides by zero
        if minimum is not None:
            if strict_min and not value > minimum:
                raise refused("greater", minimum=units.format_plain(minimum, lang))
            if not strict_min and value < minimum:
                raise refused("at_least", minimum=units.format_plain(minimum, lang))
        if maximum is not None and value > maximum:
            shown = units.format_integer(maximum, lang) if maximum == int(maximum) else units.format_plain(maximum, lang)
            raise refused("at_most", maximum=shown)
        return value


def _per_byte(text: str, lang: str) -> float:
    """β in s/B, given as a time per byte or as a bandwidth (its inverse)."""
    if any(tag in text for tag in ("/s", "bps", "Bps")):
        bandwidth = units.parse_bandwidth(text.strip(), lang)
        if not bandwidth > 0:
            raise units.UnitError.keyed("positive_bandwidth_beta", text=repr(text))
        return 1.0 / bandwidth
    try:
        return units.parse_time(text.strip(), lang)
    except units.UnitError:
        if re.fullmatch(r"[kKmMgGtTpP]i?[bB]", units.unit_of(text)):  # 100GB: a bandwidth without its /s
            raise units.UnitError.keyed("per_second", text=repr(text)) from None
        raise


def _flops(text: str, lang: str) -> float:
    """A peak compute figure: 989e12, 989T, 989 TFLOP/s, 989TFLOPS."""
    return units.parse_count(re.sub(r"\s*flop(s|/s)?\s*$", "", text.strip(), flags=re.IGNORECASE), lang)


# each kind's parser, given the text and the learner's language: "1,500" is 1.5 in Spanish, 1500 in English
_PARSERS: dict[str, Callable[[str, str], float]] = {
    "whole": units.parse_count, "length": units.parse_length, "count": units.parse_count, "bytes": units.parse_size,
    "capacity": lambda text, lang: units.parse_size(text, lang, smallest=1e6, what="gpu_memory"),
    "time": units.parse_time, "bandwidth": units.parse_bandwidth, "per-byte": _per_byte,
    "flops": _flops, "number": units.parse_number,
}


@dataclass(frozen=True)
class Calculator:
    name: str                                  # the command: distai calc NAME
    options: tuple[Option, ...]
    compute: Callable[[dict], dict]            # parsed options -> the JSON object
    text: Callable[[dict, str], list[str]]     # the JSON object, the language -> the lines printed
    # a flag option that measures this machine first: (its name, "module:function" in distai.engine,
    # given the parsed options, returning what ``compute`` then finds as that option's value). The
    # CLI calls it (torch allowed there); the declaration and ``compute`` stay pure.
    measure: tuple[str, ...] = ()

    def help(self, lang: str) -> str:
        """Its help in ``lang``: summary line, blank line, sources and JSON keys
        (``lessons/catalog/calc_help.toml`` ``[<lang>.<name>] help``)."""
        return str(strings("calc_help", lang)[self.name]["help"])

    def option_help(self, option: Option, lang: str) -> str:
        """``option``'s help in ``lang`` (``[<lang>.<name>.options]``, keyed by the option's name)."""
        text = str(strings("calc_help", lang)[self.name]["options"][option.name])
        return text.format(**{k: units.format_plain(v, lang) for k, v in option.help_fields}) if option.help_fields else text

    def parse(self, given: dict, lang: str = "en") -> dict:
        """Each option's value from its text in ``given`` (keyed by option name), in declared order."""
        return {o.name: o.parse(given.get(o.name, None if o.default is REQUIRED else o.default), lang)
                for o in self.options}

    def run(self, given: dict, lang: str | None = None) -> dict:
        """Parse, then compute; a formula's ValueError is the learner's bad input (one line), and a
        shape the degrees do not fit says why in the learner's language (``lang``, else the locale's)."""
        lang = lang or detect_language()
        values = self.parse(given, lang)
        try:
            result = self.compute(values)
        except (TranslatedError, ShapeError) as exc:
            raise CalcError(exc.text(lang)) from None
        except (ZeroDivisionError, OverflowError):  # a number past what a float holds, or a zero rate
            raise CalcError.keyed("errors.out_of_range") from None
        except ValueError as exc:  # a formula's own guard (English): said in the learner's language when not English
            raise CalcError(texts={**translations("calc", "errors.formula_refused"), "en": str(exc)}) from None
        check_finite(result)
        return result


def check_finite(value, where: str = "result") -> None:
    """CalcError when a number of a calculator's result is not finite (``--json`` stays strict JSON, and
    no text shows "inf s"): the key that holds it named, as the key it has in ``--json``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError.keyed("errors.not_finite_key", where=where, value=value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        raise CalcError.keyed("errors.not_finite_key", where=where, value="> 10³⁰⁸")  # a count past any float
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, key)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_finite(item, where)


# ------------------------------------------------------------------------------------ text helpers
def table(rows: list[tuple[str, str]]) -> list[str]:
    """Label/value rows, labels padded to one width."""
    width = max(len(label) for label, _ in rows)
    return [f"  {label:<{width}}  {value}" for label, value in rows]


def labels(name: str, lang: str) -> Callable[..., str]:
    """``say(key, **fields)``: calculator ``name``'s string ``key`` (``lessons/catalog/calc.toml``) in ``lang``."""
    def say(key: str, /, **fields) -> str:
        return translated("calc", f"{name}.{key}", lang, **fields)
    return say


def choice_name(choice: str, lang: str) -> str:
    """A choice option's value (``ring``, ``interleaved``, ``mixed``) as the learner reads it in ``lang``
    (``lessons/catalog/calc.toml`` ``[<lang>.names]``), the value itself where the catalog has none."""
    return translated("calc", f"names.{choice}", lang) if has("calc", f"names.{choice}") else choice


def bytes_text(n, lang: str = "en") -> str:
    """``16.6 GB  (15.5 GiB, 16,640,625,000 B)``; a dash for None; past a petabyte-million just ``1e30 B``
    (a 31-digit byte count is no help)."""
    if n is None:
        return "—"
    if abs(n) >= 1e21:
        return units.format_bytes(n, lang=lang)
    return (f"{units.format_bytes(n, lang=lang)}  ({units.format_bytes(n, binary=True, lang=lang)}"
            f"{units.number_separator(lang)}{units.format_integer(n, lang)} B)")
