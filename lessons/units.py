"""Parsing and formatting of counts, sizes, times and bandwidths, in English and Spanish.

Accepted inputs (case of the unit letters matters only for ``b``/``B`` in bandwidths):
- counts (parameters, tokens): ``7.5B``, ``175e9``, ``70b``, ``1.3M``, ``13k``, ``1T`` (Spanish: ``7,5B``);
- sizes in bytes: ``64MiB``, ``2GB``, ``16.6 GB``, ``1.66e10``, ``512`` (bytes), ``320 KiB``;
  decimal prefixes are powers of 1000 (kB, MB, GB, TB, PB), binary ones of 1024 (KiB, MiB, GiB, TiB);
- times: ``5us``, ``5µs``, ``1.5ms``, ``10s``, ``30min``, ``2h``, ``1d``, ``1 week``; a bare number is seconds;
- bandwidths in bytes/s: ``100GB/s``, ``900 GB/s``, ``400Gb/s`` or ``400Gbps`` (bits), a bare number is B/s.
Numbers may use a decimal comma (``16,6 GB``): a single comma is a decimal separator unless it is
followed by exactly three digits in English (``1,000`` = one thousand); with both ``.`` and ``,`` the
last one is the decimal separator (``1.234,5`` = ``1,234.5``); a single dot is always a decimal
point; ``_`` and spaces between digit groups are ignored. Errors raise :class:`UnitError` (a ValueError) with a one-line message.
"""
from __future__ import annotations

import decimal
import math
import re

from .strings import TranslatedError, translated

# the largest count an option or formula takes unless it says otherwise: past it a count is no model's shape,
# and products of a few overflow a float
LARGEST_COUNT = 2 ** 53

__all__ = [
    "UnitError", "parse_number", "parse_count", "parse_bytes", "parse_size", "parse_time", "parse_bandwidth",
    "parse_quantity", "format_number", "format_bytes", "format_count", "format_time",
    "format_bandwidth", "format_percent", "format_fixed_percent", "number_separator", "BYTE_UNITS", "TIME_UNITS",
    "bind_units", "bind_units_aligned", "GLUE", "format_bytes_apart",
]


class UnitError(TranslatedError):
    """A value or unit that cannot be understood: one line in every language
    (``lessons/catalog/units.toml``), the exception's own message the English one."""

    area = "units"


BYTE_UNITS = {
    "b": 1, "byte": 1, "bytes": 1, "octet": 1, "octets": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50,
    "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
    # the words, in both languages' spelling
    "kilobyte": 1e3, "kilobytes": 1e3, "megabyte": 1e6, "megabytes": 1e6, "gigabyte": 1e9, "gigabytes": 1e9,
    "terabyte": 1e12, "terabytes": 1e12, "kibibyte": 1 << 10, "kibibytes": 1 << 10, "mebibyte": 1 << 20,
    "mebibytes": 1 << 20, "gibibyte": 1 << 30, "gibibytes": 1 << 30,
}
COUNT_UNITS = {
    "": 1, "k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6, "millions": 1e6, "mill": 1e6,
    "b": 1e9, "bn": 1e9, "billion": 1e9, "billions": 1e9, "g": 1e9, "t": 1e12, "trillion": 1e12,
    # Spanish: "mil" = 10^3, "mil M" / "mil millones" = 10^9, "billón" = 10^12 (long scale).
    "mil": 1e3, "millón": 1e6, "millon": 1e6, "millones": 1e6, "mil m": 1e9, "mil millones": 1e9,
    "billón": 1e12, "billon": 1e12, "billones": 1e12,
}
TIME_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3,
    "nsec": 1e-9, "nanosecond": 1e-9, "nanoseconds": 1e-9, "nanosegundo": 1e-9, "nanosegundos": 1e-9,
    "usec": 1e-6, "microsecond": 1e-6, "microseconds": 1e-6, "microsegundo": 1e-6, "microsegundos": 1e-6,
    "msec": 1e-3, "msecs": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3, "milisegundo": 1e-3,
    "milisegundos": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0, "seg": 1.0, "segundo": 1.0,
    "segundos": 1.0,
    "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0, "minuto": 60.0, "minutos": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0, "hora": 3600.0,
    "horas": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0, "dia": 86400.0, "día": 86400.0, "dias": 86400.0,
    "días": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0, "semana": 604800.0, "semanas": 604800.0,
    "y": 365 * 86400.0, "year": 365 * 86400.0, "years": 365 * 86400.0, "año": 365 * 86400.0,
    "años": 365 * 86400.0,
}

# a number and the unit after it (``12.5 GB`` → "12.5", "GB")
NUMBER_AND_UNIT = re.compile(r"^\s*([+-]?(?:[0-9][0-9_ .,']*[0-9]|[0-9])?(?:[.,][0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*(.*?)\s*$")


def parse_number(text: str, lang: str = "en") -> float:
    """A plain number with optional decimal comma, thousands separators and exponent."""
    if not isinstance(text, str):
        raise UnitError.keyed("not_number", text=repr(text))
    s = text.strip().replace("\u2212", "-").replace("\u00a0", "").replace("\u202f", "")
    if not s:
        raise UnitError.keyed("empty")
    mant, exp = s, ""
    m = re.match(r"^(.*?)([eE][+-]?\d+)$", s)
    if m and re.search(r"\d", m.group(1)):
        mant, exp = m.group(1), m.group(2)
    sign = ""
    if mant[:1] in "+-":
        sign, mant = mant[0], mant[1:]
    if not mant or not re.fullmatch(r"[0-9_ .,']*", mant) or not re.search(r"\d", mant):
        raise UnitError.keyed("not_number", text=repr(text))
    mant = mant.replace("_", "").replace(" ", "").replace("'", "")
    dots, commas = mant.count("."), mant.count(",")
    if dots and commas:
        dec = "." if mant.rfind(".") > mant.rfind(",") else ","
        thou = "," if dec == "." else "."
        if mant.count(dec) > 1:
            raise UnitError.keyed("not_number", text=repr(text))
        mant = mant.replace(thou, "").replace(dec, ".")
    elif commas > 1:
        mant = _thousands(mant, ",", text)
    elif commas == 1:
        head, tail = mant.split(",")
        if len(tail) == 3 and lang != "es" and head and len(head) <= 3 and head.isdigit():
            mant = head + tail
        else:
            mant = head + "." + tail
    elif dots > 1:
        mant = _thousands(mant, ".", text)
    elif dots == 1 and lang == "es" and not exp:
        # "353.894" and "16.384" group thousands in Spanish, as format_number writes them; a number of four
        # digits is written whole (RAE: 1024, never 1.024), so "1.125" is the capacity factor 1,125 and not
        # 1125, and with an exponent ("2.039e12") the dot is the decimal point
        head, tail = mant.split(".")
        if len(tail) == 3 and 2 <= len(head) <= 3 and head.isdigit():
            mant = head + tail
    if mant in ("", "."):
        raise UnitError.keyed("not_number", text=repr(text))
    try:
        value = float(sign + mant + exp)
    except ValueError:
        raise UnitError.keyed("not_number", text=repr(text)) from None
    if not math.isfinite(value):
        raise UnitError.keyed("not_finite", text=repr(text))
    return value


def _thousands(mant: str, sep: str, text: str) -> str:
    groups = mant.split(sep)
    if not (1 <= len(groups[0]) <= 3) or any(len(g) != 3 for g in groups[1:]):
        raise UnitError.keyed("not_number", text=repr(text))
    return "".join(groups)


def _split(text: str) -> tuple[str, str]:
    if not isinstance(text, str):
        text = str(text)
    s = text.strip()
    m = re.match(r"^([+\-\u2212]?[0-9][0-9_ .,'\u00a0\u202f]*(?:[eE][+-]?[0-9]+)?)\s*([^\s0-9].*)?$", s)
    if not m:
        raise UnitError.keyed("no_unit", text=repr(text))
    num, unit = m.group(1).strip(), (m.group(2) or "").strip()
    return num, unit


def _with_unit(text, lang: str, factors: dict, key: str, error: str) -> float:
    """A number followed by a unit looked up (as ``key``, normalised by the caller) in ``factors``; a
    Python number is taken as is. ``error``: the catalog key naming the units to use when ``key`` is unknown."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _finite(float(text), text)
    num, unit = _split(text)
    if key not in factors:
        raise UnitError.keyed(error, unit=repr(unit), text=repr(text))
    factor, value = factors[key], parse_number(num, lang)
    if 0 < factor < 1:  # 5us as 5 / 10^6 = 5e-06, not 5 · 1e-6 = 4.9999999999999996e-06
        return _finite(value / round(1 / factor), text)
    return _finite(value * factor, text)


def unit_of(text) -> str:
    """The unit after the number of ``text`` ('' for a bare number or a Python number)."""
    return _split(text)[1] if isinstance(text, str) else ""


def parse_count(text, lang: str = "en") -> float:
    """A count such as a number of parameters or tokens: ``7.5B`` → 7.5e9, ``175e9``, ``13k``, ``1.3M``."""
    unit = unit_of(text)
    return _with_unit(text, lang, COUNT_UNITS, " ".join(unit.lower().rstrip(".").split()), "count_suffix")


# a length in tokens: K is 1024, as model cards count context (Llama 3.1's 128K is 131,072 tokens)
LENGTH_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2}


def parse_length(text, lang: str = "en") -> float:
    """A sequence or context length in tokens: ``4096``, ``32k`` → 32768, ``128K`` → 131072, ``1M`` → 1048576."""
    unit = unit_of(text)
    return _with_unit(text, lang, LENGTH_UNITS, unit.lower(), "length_suffix")


def parse_bytes(text, lang: str = "en") -> float:
    """A size in bytes: ``64MiB`` → 67108864, ``2GB`` → 2e9, ``16,6 GB`` → 1.66e10, ``512`` → 512."""
    unit = unit_of(text)
    return _with_unit(text, lang, {"": 1, **BYTE_UNITS}, unit.lower().replace(" ", ""), "size_unit")


def parse_size(text, lang: str = "en", *, smallest: float = 0.0, what: str = "a_size") -> float:
    """A size in bytes typed into a calculator, refusing the readings a learner does not mean, each with
    a one-line :class:`UnitError` that suggests the unit:

    - a lone ``B`` after the number (``70B``): bytes to :func:`parse_bytes`, billions to anyone who
      knows model sizes; write ``70`` or ``70 bytes``, or ``70GB``;
    - a fractional number of bytes (``1.5``): did you mean ``1.5GB``?
    - a bare number below ``smallest`` (``--gpu-memory 80``, 80 bytes): did you mean ``80GB``?
      ``what``: the catalog key (``units.toml``) naming what the size is of.
    """
    num, unit = _split(text) if isinstance(text, str) else (str(text), "")
    shown = repr(str(text).strip())
    if unit in ("B", "b"):
        raise UnitError.keyed("ambiguous_b", text=shown, num=num)
    bits = re.fullmatch(r"([kKmMgGtTpP]i?)b", unit)
    if bits:  # 1Gb: a bandwidth's gigabits (parse_bandwidth), not a size's gigabytes
        raise UnitError.keyed("bits_for_bytes", text=shown, num=num, prefix=bits.group(1).upper().replace("K", "k")
                              if "i" not in bits.group(1) else bits.group(1)[0].upper() + "i")
    value = parse_bytes(text, lang)
    if value != math.floor(value):
        if value * 1e9 < 1:  # 1e-300: no unit makes a whole number of bytes of it
            raise UnitError.keyed("not_whole_bytes", text=shown)
        raise UnitError.keyed("fractional_bytes", text=shown, num=num)
    if not unit and 0 < value < smallest:
        raise UnitError.keyed("too_small", text=shown, num=num, value=lambda lang: format_number(value, 3, lang),
                              what=lambda lang: translated("units", what, lang))
    return value


_TIME_PARTS = re.compile(r"\s*([0-9][0-9.,]*)\s*([^\W\d_]+\.?)")


def parse_time(text, lang: str = "en") -> float:
    """A duration in seconds: ``5us`` → 5e-6, ``1.5ms``, ``30min``, ``2h``, ``1d``; a bare number is seconds;
    a clock's parts add up: ``24 min 30 s``, ``1h 30min`` (each with its own unit, largest first)."""
    if isinstance(text, str):
        parts = _TIME_PARTS.findall(text)
        if len(parts) > 1 and "".join(f"{n}{u}" for n, u in parts) == re.sub(r"\s+", "", text):
            sizes = [_unit_size(u) for _, u in parts]
            if all(a > b > 0 for a, b in zip(sizes, sizes[1:])):  # h, then min, then s: a clock's order
                return _finite(sum(parse_time(f"{n} {u}", lang) for n, u in parts), text)
    return _with_unit(text, lang, {"": 1.0, **TIME_UNITS}, _time_key(unit_of(text)), "time_unit")


def _time_key(unit: str) -> str:
    """A time unit as :data:`TIME_UNITS` spells it: ``MIN.`` → ``min``."""
    return unit.lower().rstrip(".")


def _unit_size(unit: str) -> float:
    return TIME_UNITS.get(_time_key(unit), 0.0)


def parse_bandwidth(text, lang: str = "en") -> float:
    """A bandwidth in bytes/s: ``100GB/s`` → 1e11, ``400Gb/s``/``400Gbps`` → 5e10 (bits), a bare number is B/s."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _finite(float(text), text)
    num, unit = _split(text)
    u = unit.replace(" ", "")
    value = parse_number(num, lang)
    if u == "":
        return _finite(value, text)
    # B or byte(s): bytes; b or bit(s): bits; per second as /s, /S, ps or /sec ("Gbit/s", "GB/S")
    m = re.fullmatch(r"([kKmMgGtTpP]?i?)([bB]its?|[bB]ytes?|[bB])((?i:/s|ps|/sec))?", u)
    if not m:
        raise UnitError.keyed("bandwidth_unit", unit=repr(unit), text=repr(text))
    prefix, b = m.group(1), m.group(2)
    if not m.group(3):
        raise UnitError.keyed("per_second", text=repr(text))
    factor = BYTE_UNITS[(prefix + "b").lower()] if prefix else 1
    if b == "b" or b.lower().startswith("bit"):
        factor /= 8  # bits
    return _finite(value * factor, text)


def parse_quantity(text, quantity: str, lang: str = "en") -> float:
    """Dispatch on ``quantity``: bytes, seconds, count, bandwidth, fraction (``27.3%`` or ``0.273``), number."""
    if quantity == "bytes":
        return parse_bytes(text, lang)
    if quantity == "seconds":
        return parse_time(text, lang)
    if quantity == "count":
        return parse_count(text, lang)
    if quantity == "bandwidth":
        return parse_bandwidth(text, lang)
    if quantity == "fraction":
        s = str(text).strip()
        if s.endswith("%"):
            return parse_number(s[:-1], lang) / 100
        return parse_number(s, lang)
    if quantity == "number":
        return parse_count(text, lang)
    raise ValueError(f"unknown quantity {quantity!r}")


def _finite(value: float, text) -> float:
    if not math.isfinite(value):
        raise UnitError.keyed("not_finite", text=repr(text))
    return value


# ----------------------------------------------------------------------------------- formatting


def _round_half_up(x: float, decimals: int) -> str:
    """``x`` to ``decimals`` places as a reader rounds the decimal it reads: a half rounds up (41.25 GB →
    41.3 GB; Python's format rounds the binary value half to even, 41.2)."""
    quantum = decimal.Decimal(1).scaleb(-decimals)
    return str(decimal.Decimal(repr(float(x))).quantize(quantum, rounding=decimal.ROUND_HALF_UP))


#: the course's one rule for grouping thousands: a number of up to four digits stays whole (2048, as RAE
#: writes it too), a longer one is grouped (20,255; 20.255 in Spanish)
WHOLE_DIGITS = 4


def format_number(x: float, digits: int = 3, lang: str = "en") -> str:
    """``x`` with ``digits`` significant digits (no exponent between 1e-4 and 1e15), a half rounded up, the
    thousands grouped beyond four digits (``20,255``), and in Spanish the decimal comma (``20.255``, ``41,3``)."""
    if x is None:
        return "—"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 1e15 or ax < 1e-4:
        mantissa, exponent = f"{x:.{max(digits - 1, 0)}e}".split("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        s = f"{mantissa}e{int(exponent)}"  # 1e30, 5.96e-8: no "+" nor leading zeros
    else:
        decimals = max(digits - 1 - math.floor(math.log10(ax)), 0)
        s = _round_half_up(x, decimals)
        if "." in s:
            s = s.rstrip("0").rstrip(".")
        whole, dot, fraction = s.partition(".")
        if len(whole.lstrip("-")) > WHOLE_DIGITS:  # 20,255 d (20.255 in Spanish); 2048 tokens stays whole
            s = f"{int(whole):,}" + dot + fraction
    if lang == "es":
        s = s.replace(".", "\0").replace(",", ".").replace("\0", ",")
    return s


def _scaled(x: float, steps: list[tuple[float, str]], digits: int, lang: str, sep: str = " ") -> str:
    ax = abs(x)
    if ax >= steps[0][0] * 1e6:  # beyond the largest prefix: 1e30 B, not 1e15 PB
        base = next(name for factor, name in steps if factor == 1)
        return f"{format_number(x, digits, lang)}{sep}{base}"
    i = next((i for i, (factor, _) in enumerate(steps) if ax >= factor), len(steps) - 1)
    factor, name = steps[i]
    shown = _rounded(x / factor, digits)
    if i > 0 and abs(shown) >= steps[i - 1][0] / factor * (1 - 1e-12):  # 999.96 ms shows as 1000 ms: say 1 s
        factor, name = steps[i - 1]
        return f"{format_number(shown * steps[i][0] / factor, digits, lang)}{sep}{name}"
    return f"{format_number(x / factor, digits, lang)}{sep}{name}"


def _rounded(x: float, digits: int) -> float:
    """``x`` rounded as :func:`format_number` shows it."""
    return float(format_number(x, digits, "en").replace(",", ""))


def format_bytes(n: float, binary: bool = False, digits: int = 3, lang: str = "en") -> str:
    """``16640625000`` → ``16.6 GB`` (``16,6 GB`` in Spanish); ``binary=True`` → ``15.5 GiB``."""
    if n is None:
        return "—"
    steps: list[tuple[float, str]]
    if binary:
        steps = [(1 << 50, "PiB"), (1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")]
    else:
        steps = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")]
    if abs(n) < 1:
        return f"{format_number(n, digits, lang)} B"
    return _scaled(n, steps, digits, lang)


def format_bytes_apart(more: float, less: float, lang: str = "en") -> tuple[str, str]:
    """``more`` and ``less`` (``more`` > ``less``) as format_bytes shows them, with as many digits as it
    takes (up to 6) for the larger to read larger: ``80.002 GB`` against ``80 GB``, not ``80 GB`` and ``80 GB``."""
    for digits in range(3, 7):
        shown = format_bytes(more, digits=digits, lang=lang), format_bytes(less, digits=digits, lang=lang)
        if shown[0] != shown[1]:
            return shown
    return shown


def format_bytes_together(values: list[float], digits: int = 3, lang: str = "en") -> list[str]:
    """Terms of a sum and its total (``values``) in one unit, the largest's, and at one precision,
    the finest any of them needs at ``digits`` significant digits, so that the terms shown add up
    to the total shown: ``140 GB + 17.5 GB + 105 GB = 262.5 GB``, not ``= 262 GB``."""
    steps = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")]
    return _together(values, steps, digits, lang)


def format_time_together(values: list[float], digits: int = 3, lang: str = "en") -> list[str]:
    """:func:`format_bytes_together` for durations: ``0.04 ms + 10.21 ms = 10.25 ms``, not ``40 µs +
    10.2 ms = 10.3 ms`` (whose terms add up to 10.24)."""
    steps = [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")]
    return _together(values, steps, digits, lang)


def _together(values: list[float], steps: list[tuple[float, str]], digits: int, lang: str) -> list[str]:
    largest = max((abs(v) for v in values), default=0.0)
    factor, name = next(((f, n) for f, n in steps if largest >= f), steps[-1])
    scaled = [v / factor for v in values]
    decimals = min(3, max((max(digits - 1 - math.floor(math.log10(abs(x))), 0) for x in scaled if x), default=0))
    out = []
    for x in scaled:
        text = _round_half_up(x, decimals)
        text = text.rstrip("0").rstrip(".") if "." in text else text
        out.append(f"{text.replace('.', ',') if lang == 'es' else text} {name}")
    return out


def format_count(n: float, digits: int = 3, lang: str = "en") -> str:
    """``7.5e9`` → ``7.5B`` (English short scale); Spanish ``7,5 mil millones``, ``billones`` for 10^12
    (long scale), the one notation for billions in every Spanish text and answer."""
    if lang == "es":
        steps = [(1e12, "billones"), (1e9, "mil millones"), (1e6, "millones"), (1e3, "mil"), (1, "")]
        out = _scaled(n, steps, digits, lang, sep=" ")
        # one of them is singular: "1 millón", "1 billón" ("1 mil millones" stays: mil is the count)
        out = re.sub(r"^([+\-−]?1) (mill|bill)ones$", lambda m: f"{m.group(1)} {m.group(2)}ón", out)
    else:
        steps = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"), (1, "")]
        out = _scaled(n, steps, digits, lang, sep="")
    return out.strip()


def format_time(seconds: float, digits: int = 3, lang: str = "en") -> str:
    """``5e-6`` → ``5 µs``, ``0.0015`` → ``1.5 ms``, ``7200`` → ``2 h``, ``90`` → ``1.5 min``."""
    if seconds is None:
        return "—"
    ax = abs(seconds)
    if ax == 0:
        return "0 s"
    day = "d"
    steps = [(86400.0, day), (3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")]
    return _scaled(seconds, steps, digits, lang)  # below 1 ns in ns (0.776 ns), beside the µs of its neighbours


def format_bandwidth(bps: float, digits: int = 3, lang: str = "en") -> str:
    """Bytes/s with decimal prefixes: ``1e11`` → ``100 GB/s``."""
    return format_bytes(bps, False, digits, lang) + "/s"


def format_percent(fraction: float, digits: int = 3, lang: str = "en") -> str:
    """``0.2727`` → ``27.3%`` (``27,3 %`` in Spanish)."""
    return _with_percent_sign(format_number(100 * fraction, digits, lang), lang)


def format_fixed_percent(fraction: float, decimals: int = 1, lang: str = "en") -> str:
    """A share with exactly ``decimals`` decimals (a column of shares): ``0.1`` → ``10.0%`` (``10,0 %``)."""
    return _with_percent_sign(format_fixed(100 * fraction, decimals, lang), lang)


def number_separator(lang: str = "en") -> str:
    """Between the numbers of a list: ``, `` (``; `` in Spanish, whose comma is the decimal separator)."""
    return "; " if lang == "es" else ", "


def _with_percent_sign(number: str, lang: str) -> str:
    return f"{number} %" if lang == "es" else f"{number}%"


def format_score(fraction: float | None, lang: str = "en") -> str:
    """A score as a whole percentage: ``0.8`` → ``80%`` (``80 %`` in Spanish); None → ``—``."""
    return "—" if fraction is None else format_percent(round(fraction, 2), 3, lang)


def format_fixed(x: float, decimals: int = 1, lang: str = "en") -> str:
    """``x`` with exactly ``decimals`` decimals (a table column, a ratio): ``1.50`` / ``1,50``."""
    s = f"{x:.{decimals}f}"
    return s.replace(".", ",") if lang == "es" else s


def format_range(first: object, last: object) -> str:
    """A span of steps, heads, sizes… written ``first–last`` (an en dash), or ``first`` alone when it is one
    ("redone step 141", not "141–141")."""
    return f"{first}" if first == last else f"{first}–{last}"


def format_integer(n: float, lang: str = "en") -> str:
    """A whole number with thousands grouped beyond four digits, as :func:`format_number` groups them:
    ``262,144`` (``262.144`` in Spanish), ``2048`` (one rule: a prompt said "1,024-byte … 1024 GPUs")."""
    whole = round(n)
    if len(str(abs(whole))) <= WHOLE_DIGITS:
        return str(whole)
    s = f"{whole:,}"
    return s.replace(",", ".") if lang == "es" else s


def format_plain(x: float, lang: str = "en") -> str:
    """Python's ``{x:g}`` (shortest form: ``0.5``, ``2``, ``1e-05``) with the decimal comma in Spanish."""
    s = f"{x:g}"
    return s.replace(".", ",") if lang == "es" else s


# ------------------------------------------------------------------------------ where a line may not break
#
# A number never ends a line whose next line starts with its unit ("35.7" / "GB"), nor an axis its degree
# ("TP" / "8"): the lesson text (tutor/screens/step_text.py), the run panel's log, and the visualizers' plain and
# styled lines (visualizers/base.py's wrap_words, ring_drawing.wrap_text) all bind them with bind_units.
GLUE = "\ue000"  # bind_units' joiner where a wrap then reads it: a private-use character no text holds
# what a number's unit can be in the lessons' prose (this module's formats, and the counts the texts use)
_UNIT = (r"(?:%|[kKMGTP]i?B(?:/s)?|B|bytes?|[mµμn]?s|min|h|Gb/s|(?:[GTP]?FLOP)(?:/s|s)?|GPUs?|ranks?|nodes?|"
         r"tokens?|layers?|steps?|stages?|chunks?|microbatch(?:es)?|mil|millones|billones|millón|billón|"
         r"etapas?|capas?|pasos?|nodos?|trozos?|partición|particiones|microlotes?|terms?|términos?|contributions?|"
         r"contribuciones?|x|×|"
         r"p\.(?= ?p\.))")  # Spanish percentage points, "3,7 p. p."
_SPACE = r"(?: |\n[ \t]*)"  # a space, or a line break inside a paragraph (the source's lines are cut anywhere)
_NUMBER_UNIT = re.compile(rf"(?<=\d){_SPACE}(?={_UNIT}(?![\w/]))")
_AXIS_DEGREE = re.compile(
    rf"(?<![\w])(TP|PP|DP|CP|EP|SP|E|w½|Fig\.|Figs\.|Sec\.|sec\.|fig\.|figs\.|Table|tabla|ZeRO-\d){_SPACE}(?=\d)")
# a symbol and its value: "N = 8", "α = 5 µs", "s = 2048"
_SYMBOL_VALUE = re.compile(r"(?<![\w])([A-Za-zαβΨ]) = (?=[\d−-])")


def bind_units_aligned(prose: str, joiner: str) -> str:
    """:func:`bind_units` where it puts one character for one (a styled text's spans then stay where they
    were), else ``prose`` as it is: what the run panel's log, the quiz and the visualizers' styled lines bind."""
    bound = bind_units(prose, joiner)
    return bound if len(bound) == len(prose) else prose


def bind_units(prose: str, joiner: str) -> str:
    """``prose`` with ``joiner`` in place of the space between a number and its unit, between an axis and
    its degree, around the "=" of a symbol and its value ("α = 5"), and inside Spanish "mil millones" and
    "etapas virtuales"."""
    bound = _NUMBER_UNIT.sub(joiner, prose)
    bound = re.sub(rf"(?<=\d{re.escape(joiner)}mil){_SPACE}(?=mill)", joiner, bound)
    bound = re.sub(rf"(?<=\d{re.escape(joiner)}p\.){_SPACE}(?=p\.)", joiner, bound)  # "p. p." stays whole
    # the two-word unit "etapas virtuales" stays whole after its number, as "mil millones" does
    bound = re.sub(rf"(?<=\d{re.escape(joiner)}etapa){_SPACE}(?=virtual\b)|"
                   rf"(?<=\d{re.escape(joiner)}etapas){_SPACE}(?=virtuales\b)", joiner, bound)
    bound = _SYMBOL_VALUE.sub(lambda m: m.group(1) + joiner + "=" + joiner, bound)
    return _AXIS_DEGREE.sub(lambda m: m.group(1) + joiner, bound)
