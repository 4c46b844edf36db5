"""A lesson step's Markdown as the tutor shows it: commands and code wrapped, tables that fit.

Textual's ``Markdown`` cuts what is wider than the pane: a fence scrolls sideways with no
scrollbar (``--beta 25G`` for ``--beta 25GB/s``) and a table cell ends in ``…``. Here:

- a shell command that does not fit is wrapped at a space with a `` \\`` continuation, so what
  is shown can be typed as shown; other code wraps with a ``↪`` mark; ``text`` fences (diagrams,
  whose columns must line up) keep their lines and get a visible horizontal scrollbar;
- a table is laid out by Rich, which shrinks the widest columns first and wraps between words;
- a number never ends a line whose next line starts with its unit ("35.7" / "GB"), nor an axis its
  degree ("TP" / "8"): the space between them becomes a no-break space, which Rich's wrapping (the one
  Textual's Markdown and our tables use) is taught to respect.
"""
from __future__ import annotations

import re
from functools import lru_cache

import rich._wrap
from rich import box
from rich.table import Table
from rich.text import Text
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Markdown, Static
from textual.widgets._markdown import MarkdownBlock, MarkdownFence, MarkdownTable

from ...lessons import units

SHELL_LEXERS = frozenset({"bash", "sh", "shell", "console", "zsh"})
DIAGRAM_LEXERS = frozenset({"text", "txt"})
CONTINUATION = " \\"  # the shell's line continuation
COMMAND_INDENT = "    "
CODE_MARK = "↪ "

NO_BREAK = "\u00a0"
# keep_together's joiner in the source: Textual's Markdown turns every run of whitespace into one space
# (``re.sub(r"\s+", " ", …)`` on each text token), a no-break space included, so the source carries a
# private-use character that the blocks' content turns into NO_BREAK (_content_with_no_breaks)
GLUE = units.GLUE
# Rich wraps at any whitespace (``rich._wrap.re_word``: ``\s*\S+\s*``), no-break spaces included; a word
# here runs through them
_BREAKABLE = r"[^\S\u00a0\u202f]"
rich._wrap.re_word = re.compile(rf"{_BREAKABLE}*(?:\S|[\u00a0\u202f])+{_BREAKABLE}*")
# what is not prose: fenced blocks, inline code, HTML comments (the checks)
_NOT_PROSE = re.compile(r"```.*?```|`[^`\n]*`|<!--.*?-->", re.S)


def _bind(prose: str) -> str:
    return units.bind_units(prose, GLUE)


# A short inline formula stays on one line ("(n −" / "1)·TPOT" broke it); inline code a learner may copy (a
# command, a flag, Python) keeps its spaces: a no-break space pasted into a shell or Python breaks it.
MAX_BOUND_FORMULA = 32
_MATH = set("=·×−+/()≈≤≥√Σ")
_CODE = re.compile(r"[\"'_\[\]{}]|--|^(?:distai|python|torchrun|pip|git|srun|sbatch)\b")


def is_inline_formula(code: str) -> bool:
    """Whether an inline code span (without its backticks) is a short formula to keep on one line."""
    return (" " in code and len(code) <= MAX_BOUND_FORMULA and bool(_MATH & set(code))
            and _CODE.search(code) is None)


def keep_together(markdown: str) -> str:
    """``markdown`` with GLUE (shown as a no-break space) between a number and its unit and between an
    axis and its degree, in the prose only (code and comments untouched), and inside a short inline
    formula (:func:`is_inline_formula`)."""
    out, last = [], 0
    for block in _NOT_PROSE.finditer(markdown):
        code = block.group(0)
        if not code.startswith(("```", "<!--")) and is_inline_formula(code[1:-1]):
            code = code.replace(" ", GLUE)
        out += [_bind(markdown[last:block.start()]), code]
        last = block.end()
    out.append(_bind(markdown[last:]))
    return "".join(out)


_token_to_content = MarkdownBlock._token_to_content


def _content_with_no_breaks(self: MarkdownBlock, token) -> Content:
    """A block's inline content, GLUE shown as the no-break space it stands for (same length: the
    styles' spans stay where they were)."""
    content = _token_to_content(self, token)
    if GLUE not in content.plain:
        return content
    return Content(content.plain.replace(GLUE, NO_BREAK), spans=list(content.spans))


MarkdownBlock._token_to_content = _content_with_no_breaks  # type: ignore[method-assign]


def breakable_words(text: str) -> list[str]:
    """``text``'s words as the wrapping sees them (a no-break space joins)."""
    return [word for word in re.split(rf"{_BREAKABLE}+", text) if word]


def is_command_block(lexer: str, code: str) -> bool:
    """A shell block: labelled as one, or unlabelled with every line a command (``distai …``)."""
    if lexer in SHELL_LEXERS:
        return True
    lines = [line for line in code.splitlines() if line.strip()]
    return not lexer and bool(lines) and all(
        line.lstrip().startswith(("distai ", "python ", "torchrun ", "pip ", "$ ")) for line in lines)


@lru_cache(maxsize=512)
def wrap_command(line: str, width: int) -> tuple[str, ...]:
    """One shell line as lines of at most ``width`` cells that the shell reads as the same command.

    Breaks go at spaces, before an option when one fits (`` \\`` ends the line, the next is
    indented); a word longer than a line is split with a bare ``\\`` and its rest starts the next
    line unindented, since the shell joins a backslash-newline inside a word without a space.
    """
    width = max(width, len(COMMAND_INDENT) + len(CONTINUATION) + 8)
    out: list[str] = []
    rest, prefix = line, ""
    while len(prefix) + len(rest) > width:
        room = width - len(prefix) - len(CONTINUATION)
        cut = rest.rfind(" -", 1, room + 1)  # keep an option next to its value
        if cut <= 0:
            cut = rest.rfind(" ", 1, room + 1)
        if cut > 0:
            out.append(prefix + rest[:cut].rstrip() + CONTINUATION)
            rest, prefix = rest[cut:].lstrip(" "), COMMAND_INDENT
        else:
            out.append(prefix + rest[:room + 1] + "\\")
            rest, prefix = rest[room + 1:], ""
    out.append(prefix + rest)
    return tuple(out)


def code_pieces(line: str, width: int) -> tuple[tuple[int, int], ...]:
    """Where ``wrap_code`` cuts ``line``: the (start, end) of each piece, breaks at spaces."""
    width = max(width, len(CODE_MARK) + 8)
    if len(line) <= width:
        return ((0, len(line)),)
    indent = min(len(line) - len(line.lstrip(" ")), width // 2)
    pieces, start, prefix = [], 0, 0
    while prefix + len(line) - start > width:
        room = width - prefix
        cut = line.rfind(" ", start + 1, start + room + 1)
        cut = cut if cut > start else start + room
        pieces.append((start, len(line[:cut].rstrip())))
        start = len(line) - len(line[cut:].lstrip(" "))
        prefix = indent + len(CODE_MARK)
    pieces.append((start, len(line)))
    return tuple(pieces)


def continuation_prefix(line: str, width: int) -> str:
    """What starts a continuation of ``line``: its indent (at most half the width) and ``↪``."""
    return " " * min(len(line) - len(line.lstrip(" ")), max(width, len(CODE_MARK) + 8) // 2) + CODE_MARK


@lru_cache(maxsize=512)
def wrap_code(line: str, width: int) -> tuple[str, ...]:
    """A code line as lines of at most ``width`` cells; continuations start with ``↪``."""
    prefix = continuation_prefix(line, width)
    return tuple(("" if i == 0 else prefix) + line[start:end]
                 for i, (start, end) in enumerate(code_pieces(line, width)))


class CodeListing:
    """A Rich renderable: source lines highlighted, numbered in a gutter and wrapped to the width
    it is given (continuations as ``wrap_code``'s, under an empty gutter), so no line is cut."""

    #: Pygments styles by the app theme's darkness: monokai's plain names are near-white, unreadable on a light
    #: theme; "default" leaves them in the theme's own text colour
    THEMES = {True: "monokai", False: "default"}

    def __init__(self, source: str, start_line: int, lexer: str = "python", dark: bool = True):
        self.source, self.start_line, self.lexer, self.dark = source.rstrip("\n"), start_line, lexer, dark

    def gutter_width(self) -> int:
        return len(str(self.start_line + self.source.count("\n"))) + 2

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        longest = max((len(line) for line in self.source.split("\n")), default=0)
        return Measurement(self.gutter_width() + len(CODE_MARK) + 8, self.gutter_width() + longest)

    def lines(self, width: int) -> list[Text]:
        from rich.syntax import Syntax

        gutter = self.gutter_width()
        room = max(1, width - gutter)
        highlighted = Syntax(self.source, self.lexer, theme=self.THEMES[self.dark], background_color="default")
        out: list[Text] = []
        for number, line in enumerate(highlighted.highlight(self.source).split("\n"), self.start_line):
            plain = line.plain.rstrip("\n")
            prefix = continuation_prefix(plain, room)
            for i, (start, end) in enumerate(code_pieces(plain, room)):
                row = Text(f"{number:>{gutter - 1}} " if i == 0 else " " * gutter, style="dim")
                if i:
                    row.append(prefix[:-len(CODE_MARK)])
                    row.append(CODE_MARK, style="dim")
                row.append_text(line[start:end])
                out.append(row)
        return out

    def __rich_console__(self, console, options):
        yield from self.lines(options.max_width)


def unwrap_command(lines: list[str]) -> list[str]:
    """The commands that ``wrap_command``'s lines stand for (the shell's reading of them)."""
    out: list[str] = []
    pending, joined_word = "", False
    for line in lines:
        if pending and not joined_word and line.startswith(COMMAND_INDENT):
            line = line[len(COMMAND_INDENT):]
        if line.endswith(CONTINUATION):
            pending, joined_word = pending + line[:-len(CONTINUATION)] + " ", False
        elif line.endswith("\\"):
            pending, joined_word = pending + line[:-1], True
        else:
            out.append(pending + line)
            pending, joined_word = "", False
    if pending:
        out.append(pending)
    return out


class WrappedCode(Widget):
    """A fence's code wrapped to the widget's width (its height follows)."""

    DEFAULT_CSS = """
    WrappedCode { width: 1fr; height: auto; padding: 1 2; }
    MarkdownFence:ansi WrappedCode { padding: 1 0; }
    """

    def __init__(self, code: str, lexer: str, command: bool):
        super().__init__()
        self.code = code.rstrip("\n")
        self.lexer = lexer
        self.command = command

    def wrapped_lines(self, width: int) -> list[str]:
        wrap = wrap_command if self.command else wrap_code
        return [part for line in self.code.split("\n") for part in wrap(line, width)]

    def get_content_width(self, container, viewport) -> int:
        return container.width

    def get_content_height(self, container, viewport, width: int) -> int:
        return max(1, len(self.wrapped_lines(width)))

    def render(self):
        text = "\n".join(self.wrapped_lines(self.content_size.width or 80))
        return MarkdownFence.highlight(text, self.lexer or "", ansi=self.app.native_ansi_color,
                                       dark=self.app.current_theme.dark)


class WrappingFence(MarkdownFence):
    """A fence that is never cut: commands and code wrap, diagrams scroll with a scrollbar."""

    DEFAULT_CSS = """
    WrappingFence { overflow: hidden hidden; }
    WrappingFence.-diagram { overflow: auto hidden; scrollbar-size-horizontal: 1; }
    """

    def compose(self):
        if (self.lexer or "") in DIAGRAM_LEXERS:
            self.add_class("-diagram")
            yield from super().compose()
        else:
            yield WrappedCode(self.code, self.lexer or "",
                              command=is_command_block(self.lexer or "", self.code))

    async def _update_from_block(self, block) -> None:
        await self.recompose() if isinstance(block, MarkdownFence) else await super()._update_from_block(block)


# the inline styles Textual's Markdown gives a cell (component classes), as Rich styles
INLINE_STYLES = {".strong": "bold", ".em": "italic", ".s": "strike", ".code_inline": "bold cyan"}


def _rich_text(content) -> Text:
    """A Markdown cell's Textual ``Content`` as a Rich ``Text`` that wraps between words."""
    text = Text(content.plain, overflow="fold")
    for span in content.spans:
        style = INLINE_STYLES.get(span.style) if isinstance(span.style, str) else None
        if style:
            text.stylize(style, span.start, span.end)
    return text


def column_widths(mins: list[int], body: list[int], maxs: list[int], room: int) -> list[int]:
    """Widths for columns in ``room`` cells: all they want (``maxs``, their longest cell) if it
    fits; else each its longest word (``mins``), then what is left shared evenly toward whole
    body cells on one line (``body``: rows wrap worse than headers), then toward whole headers."""
    if sum(maxs) <= room:
        return list(maxs)
    widths = list(mins)
    spare = room - sum(widths)
    for target in (body, maxs):
        # shared evenly among the columns that want more (capped at what each wants): one wide
        # column must not leave another at its longest word, one word a line
        while spare > 0:
            wanting = [i for i in range(len(widths)) if widths[i] < target[i]]
            if not wanting:
                break
            share = max(1, spare // len(wanting))
            for i in sorted(wanting, key=lambda j: target[j] - widths[j]):
                grant = min(share, target[i] - widths[i], spare)
                widths[i] += grant
                spare -= grant
    return widths


class FitTable:
    """A Rich renderable: the table laid out for the width it is given (see ``column_widths``)."""

    GAP = 2  # cells between columns

    def __init__(self, headers: list[Text], rows: list[list[Text]]):
        self.headers, self.rows = headers, rows

    def _columns(self) -> list[list[Text]]:
        return [[self.headers[i]] + [row[i] for row in self.rows if i < len(row)]
                for i in range(len(self.headers))]

    def _bounds(self) -> tuple[list[int], list[int], list[int]]:
        """Per column: its longest word, its longest body cell, its longest cell."""
        columns = self._columns()
        mins = [max((len(word) for cell in col for word in breakable_words(cell.plain)), default=1)
                for col in columns]
        body = [max([mins[i]] + [cell.cell_len for cell in col[1:]]) for i, col in enumerate(columns)]
        maxs = [max(cell.cell_len for cell in col) for col in columns]
        return mins, body, maxs

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        mins, _, maxs = self._bounds()
        gaps = self.GAP * max(0, len(mins) - 1)
        return Measurement(sum(mins) + gaps, sum(maxs) + gaps)

    def __rich_console__(self, console, options):
        mins, body, maxs = self._bounds()
        widths = column_widths(mins, body, maxs, options.max_width - self.GAP * max(0, len(mins) - 1))
        table = Table(box=box.SIMPLE_HEAD, padding=(0, self.GAP - 1, 0, 0), pad_edge=False, show_edge=False,
                      header_style="bold", border_style="dim", expand=False, collapse_padding=True)
        for header, width in zip(self.headers, widths):
            table.add_column(header, width=width, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        yield table


class FittingTable(MarkdownTable):
    """A table laid out for the pane: columns never narrower than their longest word while the
    words fit, cells wrapped between words (Textual's own cuts cells with ``…``)."""

    DEFAULT_CSS = "FittingTable { width: 1fr; height: auto; margin-bottom: 1; }"

    def compose(self):
        headers, rows = self._get_headers_and_rows()
        self._headers, self._rows = headers, rows
        yield Static(FitTable([_rich_text(h) for h in headers],
                              [[_rich_text(c) for c in row] for row in rows]), classes="table-body")

    async def _update_from_block(self, block) -> None:
        await self.recompose()


class StepText(Markdown):
    """The Markdown widget of a lesson step (see the module docstring)."""

    BLOCKS = {**Markdown.BLOCKS, "fence": WrappingFence, "code_block": WrappingFence,
              "table_open": FittingTable}

    def update(self, markdown: str):
        return super().update(keep_together(markdown))
