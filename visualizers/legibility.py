"""Colours that stay legible on whatever theme the learner picks.

The visualizers draw with fixed hues (a rank's colour, a GPU's, a mesh group's) so that a legend and
its drawing match. Chosen on a dark background, some of them fade on a light theme (yellow, orange,
white marks on light grey), on a dark one (slate on near-black) or under ``NO_COLOR``, where Textual
turns every colour into its grey. :func:`legible_strip` moves a character's colour toward black or
white, as little as it takes, until it stands at :data:`MIN_CONTRAST` against the cell's background
(both as colours and, under ``NO_COLOR``, as the greys Textual will show). The same colour on the same
background always becomes the same colour; shapes (bars, swatches, markers) keep theirs, so a legend's swatch
still matches the cells it stands for; the terminal's own colours (the ``ansi-*`` themes) are left to it.
No torch, no I/O.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import groupby

from rich.color import Color as RichColor
from rich.color import ColorType
from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.strip import Strip

# WCAG 2's minimum contrast for large text and for the parts of a drawing that carry meaning (1.4.11)
MIN_CONTRAST = 3.0
RGB = tuple[int, int, int]


def relative_luminance(rgb: RGB) -> float:
    """WCAG 2's relative luminance of an sRGB colour (0 black, 1 white)."""
    def linear(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: RGB, b: RGB) -> float:
    """WCAG 2's contrast ratio, 1 (the same) to 21 (black on white)."""
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def grey_of(rgb: RGB) -> RGB:
    """The grey Textual shows for a colour under NO_COLOR: its own ``Color.monochrome``."""
    grey = Color(*rgb).monochrome
    return grey.r, grey.g, grey.b


@lru_cache(maxsize=4096)
def legible(fg: RGB, bg: RGB, grey: bool = False) -> RGB:
    """``fg``, or the nearest colour toward black (on a light ``bg``) or white (on a dark one) that stands
    at MIN_CONTRAST against ``bg``; ``grey``: measured as the greys NO_COLOR shows."""
    seen = grey_of if grey else (lambda c: c)
    if contrast(seen(fg), seen(bg)) >= MIN_CONTRAST:
        return fg
    target = (0, 0, 0) if relative_luminance(seen(bg)) > 0.18 else (255, 255, 255)  # 0.18: mid-grey's luminance
    mixed = fg
    for step in range(1, 21):
        t = step / 20
        mixed = tuple(round(f + (g - f) * t) for f, g in zip(fg, target))  # type: ignore[assignment]
        if contrast(seen(mixed), seen(bg)) >= MIN_CONTRAST:
            break
    return mixed


def _own_colour(colour: RichColor | None) -> bool:
    """A colour the tutor chose (truecolor, or 256-colour past the 16 the terminal's own palette sets): the
    terminal's default and ANSI colours are the learner's terminal theme (``ansi-dark``, ``ansi-light``), whose
    real values nobody here knows, and are left to it."""
    if colour is None or colour.type == ColorType.TRUECOLOR:
        return colour is not None
    return colour.type == ColorType.EIGHT_BIT and (colour.number or 0) >= 16


# characters that are shapes, not letters: a bar, a swatch, a marker. A legend shows their colour as the cells
# of its drawing show it (often as the cell's background, which no pass moves), so they keep it
SHAPES = frozenset(chr(c) for c in range(0x2580, 0x2600))


@lru_cache(maxsize=4096)
def legible_style(style: Style, grey: bool = False) -> Style:
    """``style`` with its colour made legible against its own background (a style without both of the tutor's
    own colours is kept)."""
    if not (_own_colour(style.color) and _own_colour(style.bgcolor)):
        return style
    assert style.color is not None and style.bgcolor is not None
    fg, bg = style.color.get_truecolor(), style.bgcolor.get_truecolor()
    moved = legible(tuple(fg), tuple(bg), grey)  # type: ignore[arg-type]
    return style if moved == tuple(fg) else style + Style(color=RichColor.from_rgb(*moved))


def legible_strip(strip: Strip, grey: bool = False) -> Strip:
    """A rendered line whose letters and digits all stand out from their cells (blank cells and shapes, whose
    colour a legend repeats, are left as they are)."""
    segments: list[Segment] = []
    for seg in strip:
        if seg.style is None or seg.control or not set(seg.text) - SHAPES - {" "}:
            segments.append(seg)
            continue
        moved = legible_style(seg.style, grey)
        if moved == seg.style:
            segments.append(seg)
            continue
        for shapes, run in groupby(seg.text, key=SHAPES.__contains__):  # "■ GPU 1": the swatch keeps its colour
            segments.append(Segment("".join(run), seg.style if shapes else moved))
    return Strip(segments, strip.cell_length)
