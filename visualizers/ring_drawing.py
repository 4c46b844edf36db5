"""Lesson 1's visualizer, the drawing: chunk colours by contributions, styles, sizes, wrapping.

A chunk's cell is coloured by how many ranks' contributions it holds (slate 1, blue 2 … orange
N−1, green N = complete); odd columns are a shade darker so neighbours stay apart. Text lines
wrap without parting a number from its unit, and turn into Textual strips once per distinct line.
"""
from __future__ import annotations

from functools import lru_cache

from rich.style import Style
from rich.text import Text
from textual.strip import Strip

from ..lessons.lesson1 import baselines, ring_model
from ..lessons.lesson1.ring_plan import NAIVE, RING, TREE
from ..lessons.units import GLUE, bind_units_aligned, format_bytes

PHASE_STYLE = {ring_model.REDUCE_SCATTER: "bold magenta", ring_model.ALL_GATHER: "bold cyan",
               baselines.REDUCE: "bold magenta", baselines.BROADCAST: "bold cyan"}
ALGO_STYLE = {RING: "bold green", TREE: "bold yellow", NAIVE: "bold red"}
RUN_COLOR = "#5fafff"
AR_COLOR = "#ff5fd7"

_OWN = (0x3a, 0x44, 0x5c)  # 1: only the rank's own contribution (slate)
_RAMP = ((0x1f, 0x6f, 0xd1), (0x9b, 0x3f, 0xc0), (0xe0, 0x7a, 0x1f))  # 2 → N−1: blue, purple, orange
_COMPLETE = (0x23, 0xa0, 0x3c)  # N: green


def count_rgb(count: int, n: int) -> tuple[int, int, int]:
    """The colour of a chunk that holds ``count`` of ``n`` contributions."""
    if count >= n:
        return _COMPLETE
    if count <= 1:
        return _OWN
    t = 0.0 if n <= 3 else (count - 2) / (n - 3)
    t = min(1.0, max(0.0, t)) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    a, b = _RAMP[i], _RAMP[i + 1]
    red, green, blue = (round(a[j] + (b[j] - a[j]) * f) for j in range(3))
    return red, green, blue


def _hex(rgb) -> str:
    r, g, b = (max(0, min(255, int(v))) for v in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _mix(a, b, f: float):
    return tuple(a[j] + (b[j] - a[j]) * f for j in range(3))


@lru_cache(maxsize=4096)
def cell_style(count: int, n: int, odd: bool = False, sending: bool = False,
               blend_to: int | None = None, blend: int = 0) -> Style:
    """Background by contributions (odd columns a shade darker, so neighbours stay apart)."""
    rgb: tuple[float, ...] = count_rgb(count, n)
    if blend_to is not None:
        rgb = _mix(rgb, count_rgb(blend_to, n), blend / 8)
    if odd:
        rgb = tuple(v * 0.8 for v in rgb)
    return Style(bgcolor=_hex(rgb), color="white", bold=sending, underline=sending)


@lru_cache(maxsize=512)
def fg_style(count: int, n: int, bold: bool = True) -> Style:
    return Style(color=_hex(count_rgb(count, n)), bold=bold)


def fmt_bytes(x: float, lang: str) -> str:
    """A size: binary units for a power of two (``64 KiB``), decimal ones otherwise (``1 GB``)."""
    return fmt_units(x, x, lang)


def fmt_units(x: float, size: float, lang: str) -> str:
    """Bytes that are a simple multiple of S, in the unit S itself is written in."""
    binary = size >= 1024 and float(size).is_integer() and (int(size) & (int(size) - 1)) == 0
    return format_bytes(x, binary=binary, lang=lang)


def styled(text: str, style: str = "") -> Text:
    """A Text whose style covers this text only (not text appended later)."""
    t = Text()
    t.append(text, style=style or None)
    return t


_CONSOLE = None


def _console():
    """A Rich console used only to turn Text into segments (it prints nothing)."""
    global _CONSOLE
    if _CONSOLE is None:
        from rich.console import Console

        _CONSOLE = Console(width=400, color_system="truecolor", force_terminal=True, legacy_windows=False)
    return _CONSOLE


def code_spans(text: str, style: str = "", code: str = "bold") -> Text:
    """A catalog line for a widget (no Markdown there): its `…` spans, commands and keys, drawn in
    ``code`` style without the backticks that Markdown would have turned into code."""
    out = Text(style=style)
    for i, part in enumerate(text.split("`")):
        out.append(part, style=code if i % 2 else "")
    return out


def wrap_text(text: Text, width: int, hanging: int = 0) -> list[Text]:
    """Word-wrap styled text where the lesson text would break, never between a number and its unit, an
    axis and its degree or a symbol and its value (lessons/units.py's bind_units, the one rule), nor
    around ``=`` or inside a ``{…}`` group of ranks (nor between it and its name). ``hanging``: the
    lines after the first start that many spaces in (a log line's text under its "rank 0" label)."""
    plain = text.plain
    width = max(1, width)  # a width of 0 (COLUMNS=0) never advanced: the loop below spun for ever
    if len(plain) <= width:
        return [text]
    hanging = hanging if width - hanging >= 10 else 0  # too narrow to indent: use the whole width
    bound = bind_units_aligned(plain, GLUE)
    breaks, depth = [], 0
    for i, ch in enumerate(bound):
        depth += (ch == "{") - (ch == "}")
        if ch != " " or i == 0 or depth > 0:
            continue
        if bound[i + 1:i + 2] in ("=", "{") or bound[i - 1] == "=":  # a group stays with its name too
            continue
        breaks.append(i)
    lines, start, room = [], 0, width
    while len(plain) - start > room:
        fit = [b for b in breaks if start < b <= start + room]
        cut = fit[-1] if fit else start + room
        lines.append(text[start:cut])
        start = cut + 1 if cut in breaks else cut
        room = width - hanging
    lines.append(text[start:])
    return [lines[0], *(Text(" " * hanging) + line for line in lines[1:])] if hanging else lines


def wrap_indented(text: Text, width: int, indent: int, hanging: int = 0) -> list[Text]:
    """:func:`wrap_text` for text drawn ``indent`` spaces in: every line starts there, the lines after
    the first ``hanging`` further (a calculator's prose line, a check's causes under its row)."""
    return [Text(" " * indent) + line for line in wrap_text(text, max(10, width - indent), hanging)]


def text_strip(line: Text, width: int, base, cache: dict) -> Strip:
    """``line`` as a Textual strip ``width`` cells wide in the widget's ``base`` style (cached:
    the lines that did not change since the last frame reuse their strip)."""
    key = (line.plain, tuple((sp.start, sp.end, str(sp.style)) for sp in line.spans), width, base)
    strip = cache.get(key)
    if strip is None:
        segments = [seg for seg in line.render(_console()) if seg.text]
        strip = cache[key] = Strip(segments, line.cell_len).crop_extend(0, width, None).apply_style(base)
    return strip
