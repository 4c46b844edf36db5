"""Lesson 4's visualizer: one tensor-parallel Transformer block as a flow, stepped through.

Each row is a stage of :func:`distai.lessons.lesson4.flow.block_flow`: the weight split (columns /
rows / replicated), the tensor this rank holds afterwards and how it sits across the T ranks
(replicated, by heads, by hidden, by sequence, partial sums), and the collectives (f, g, and their
sequence-parallel versions) highlighted. The forward pass steps down, then the backward pass back
up. ``s`` toggles sequence parallelism, ``c`` switches to the vocabulary-parallel cross-entropy
walk-through, ``x`` changes T. Live runs (``feed_event``) add the collectives the ranks really
counted. No torch, no I/O.
"""
from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Static

from ..lessons.lesson4 import flow as F
from ..lessons.lesson4.events import CONFIG
from ..lessons.lesson4.tp_run import TPRun
from ..lessons.strings import strings
from ..lessons.units import format_bytes, format_fixed, number_separator
from .base import Control, LessonVisualizer, wrap_words

LAYOUT_STYLE = {
    F.REPLICATED: ("REPL", "bold white on dark_blue"),
    F.HEADS: ("HEADS", "bold white on dark_magenta"),
    F.HIDDEN: ("HID", "bold black on green"),
    F.SEQUENCE: ("SEQ", "bold black on yellow"),
    F.PARTIAL: ("PART", "bold white on dark_red"),
}
OP_STYLE = {"all_reduce": "bold red", "all_gather": "bold cyan", "reduce_scatter": "bold magenta"}
OP_NAME = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}
T_CHOICES = (2, 4, 8)
# A realistic layer for the byte figures until a run says otherwise (GPT-3 175B-like, bf16).
DEFAULT_SHAPE = {"hidden": 12288, "seq": 2048, "micro_batch": 1, "bytes": 2}

LABEL_CELLS = 21
REPL_COLOR = "dodger_blue1"


def _pad(text: str, cells: int) -> str:
    """Pad or cut to a width in terminal cells (a combining mark takes none; the labels write f-bar as f¯,
    a spacing macron: drawn through Textual, f̄ lost the row's right border in tmux)."""
    if cell_len(text) > cells:
        while cell_len(text) > cells - 1:
            text = text[:-1]
        return text + "…"
    return text + " " * (cells - cell_len(text))


def _fmt_bytes(n: float, lang: str = "en") -> str:
    return format_bytes(n, binary=True, lang=lang)


def _ops_text(counts: dict[str, int], lang: str) -> str:
    if not counts:
        return strings("tp_block", lang)["none"]
    return ", ".join(f"{c} {OP_NAME[op]}" for op, c in counts.items() if c)


class TPBlockVisualizer(LessonVisualizer):
    """The tensor-parallel block, stage by stage; the vocab-parallel loss as a second view."""

    can_focus = True
    STEP_SETTINGS = frozenset({"sequence_parallel", "cross_entropy", "stage", "phase"})  # lessons/lesson4/lesson.toml
    CONTROLS = (
        Control("full_stop,space", "advance", "tp_block.advance", back_keys="comma", back_action="back", hint=True),
        Control("s", "toggle_sp", "tp_block.toggle_sp", hint=True),
        Control("c", "toggle_ce", "tp_block.toggle_ce", hint=True),
        Control("x", "cycle_t", "tp_block.cycle_t", hint=True),
    )
    DEFAULT_CSS = """
    TPBlockVisualizer { layout: vertical; }
    TPBlockVisualizer #tp-header { height: auto; padding: 0 1; }
    TPBlockVisualizer #tp-scroll { height: 1fr; }
    TPBlockVisualizer #tp-flow { height: auto; padding: 0 1; }
    TPBlockVisualizer #tp-detail { height: auto; padding: 0 1; border-top: solid $secondary 50%; }
    TPBlockVisualizer #tp-buttons { height: 1; padding: 0 1; }
    TPBlockVisualizer #tp-buttons Button { margin: 0 1 0 0; width: auto; min-width: 5; }
    """

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.sp = False
        self.ce = False
        self.t = 4
        self.index = 0
        self.ce_index = 0
        self.run = TPRun()

    # -- model -----------------------------------------------------------------------------------
    @property
    def stages(self) -> list[F.Stage]:
        return F.block_flow(self.sp)

    @property
    def stage(self) -> F.Stage:
        return self.stages[self.index]

    @property
    def shape(self) -> dict:
        """The layer the byte figures are for: the run's, or a realistic default."""
        return self.run.shape or DEFAULT_SHAPE

    # -- composition -----------------------------------------------------------------------------
    def compose(self):
        yield Static(id="tp-header")
        with VerticalScroll(id="tp-scroll"):
            yield Static(id="tp-flow")
        yield Static(id="tp-detail")
        with Horizontal(id="tp-buttons"):
            s = strings("tp_block", self.language)
            yield Button(s["b_prev"], id="tp-prev", compact=True)
            yield Button(s["b_next"], id="tp-next", compact=True, variant="primary")
            yield Button(s["b_sp"], id="tp-sp", compact=True)
            yield Button(s["b_ce"], id="tp-ce", compact=True)

    def on_mount(self) -> None:
        self.refresh_view()

    # -- public API (the lesson screen) -----------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        view = self.step_view(step_key)  # lessons/lesson4/lesson.toml
        if not view:
            return
        self.sp = view.get("sequence_parallel", False)
        self.ce = view.get("cross_entropy", False)
        self.ce_index = 0
        self.index = 0
        for i, st in enumerate(self.stages):
            if (st.key, st.phase) == (view.get("stage"), view.get("phase")):
                self.index = i
                break
        self.refresh_view()

    def feed_event(self, event: dict) -> None:
        if not self.run.feed(event):
            return
        if CONFIG.matches(event) and self.run.t in T_CHOICES:
            self.t = self.run.t
        self.refresh_view()

    # -- actions -----------------------------------------------------------------------------------
    def action_advance(self) -> None:
        if self.ce:
            self.ce_index = min(self.ce_index + 1, len(F.vocab_ce_walkthrough(t=self.t)) - 1)
        else:
            self.index = min(self.index + 1, len(self.stages) - 1)
        self.refresh_view()

    def action_back(self) -> None:
        if self.ce:
            self.ce_index = max(self.ce_index - 1, 0)
        else:
            self.index = max(self.index - 1, 0)
        self.refresh_view()

    def action_toggle_sp(self) -> None:
        key, phase = self.stage.key, self.stage.phase
        self.sp = not self.sp
        self.ce = False
        matches = [i for i, st in enumerate(self.stages) if st.key == key and st.phase == phase]
        self.index = matches[0] if matches else min(self.index, len(self.stages) - 1)
        self.refresh_view()

    def action_toggle_ce(self) -> None:
        self.ce = not self.ce
        self.refresh_view()

    def action_cycle_t(self) -> None:
        self.t = T_CHOICES[(T_CHOICES.index(self.t) + 1) % len(T_CHOICES)] if self.t in T_CHOICES else 4
        self.refresh_view()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        {"tp-prev": self.action_back, "tp-next": self.action_advance, "tp-sp": self.action_toggle_sp,
         "tp-ce": self.action_toggle_ce}.get(event.button.id or "", lambda: None)()

    # -- rendering ---------------------------------------------------------------------------------
    def refresh_view(self) -> None:
        if not self.is_mounted:
            return
        self.query_one("#tp-header", Static).update(self.render_header())
        self.query_one("#tp-flow", Static).update(self.render_ce() if self.ce else self.render_flow())
        self.query_one("#tp-detail", Static).update(Text() if self.ce else self.render_detail())
        self.query_one("#tp-detail", Static).display = not self.ce
        scroll = self.query_one("#tp-scroll", VerticalScroll)
        if self.ce:
            if self.ce_index == 0:
                scroll.scroll_home(animate=False)
            else:
                self.call_after_refresh(scroll.scroll_end, animate=False)
        else:  # once laid out: the detail just updated changes the list's height
            self.call_after_refresh(self._follow_current_row)

    def _follow_current_row(self) -> None:
        """Scroll the stage list so the current stage's row is in view."""
        if not self.is_mounted or self.ce:
            return
        row = getattr(self, "_row_of_index", {}).get(self.index, 0)
        scroll = self.query_one("#tp-scroll", VerticalScroll)
        height = scroll.size.height
        if row < scroll.scroll_y + 1 or row > scroll.scroll_y + height - 2:
            # three rows of context above it where the list has room for them, none in a list of one or two rows
            scroll.scroll_to(y=max(0, row - min(3, max(0, height - 2))), animate=False)

    def on_resize(self) -> None:
        # a pane made smaller (80×24, V for the visualizer alone and back) can leave the current row below it
        self.call_after_refresh(self._follow_current_row)

    def render_header(self) -> Text:
        s = strings("tp_block", self.language)
        t = Text()
        t.append(s["title"] + "\n", style="bold")
        if self.ce:
            t.append(self.controls_hint(), style="dim")
            return t
        t.append(s["ranks"].format(t=self.t), style="bold cyan")
        t.append(" · ")
        t.append(s["sp_on"] if self.sp else s["sp_off"], style="bold yellow" if self.sp else "dim")
        t.append("\n" + self.controls_hint(), style="dim")
        return t

    def stage_label(self, st: F.Stage) -> str:
        label = st.label(self.language)
        if st.split and st.phase == "fwd":
            label += " · " + strings("tp_block", self.language)["split"][st.split]
        return label

    def render_flow(self) -> Text:
        lang = self.language
        s = strings("tp_block", lang)
        stages = self.stages
        current = stages[self.index]
        # Show the pass the current stage belongs to (the grad sync goes with the backward).
        show_phase = "fwd" if current.phase == "fwd" else "bwd"
        text = Text(no_wrap=True, overflow="ellipsis")
        heading = s["fwd"] if show_phase == "fwd" else s["bwd"]
        text.append(("▼ " if show_phase == "fwd" else "▲ ") + heading + "\n", style="bold underline")
        self._row_of_index = {}
        row = 1
        for i, st in enumerate(stages):
            if (st.phase == "fwd") != (show_phase == "fwd"):
                continue
            if st.phase == "grad-sync":
                text.append(s["sync"] + "\n", style="bold underline")
                row += 1
            self._row_of_index[i] = row
            row += 1
            here = i == self.index
            past = i < self.index
            base = "reverse" if here else ("" if past else "dim")
            text.append("▶ " if here else "  ", style="bold")
            label_style = OP_STYLE.get(st.op or "", "bold" if st.split else "")
            text.append(_pad(self.stage_label(st), LABEL_CELLS), style=f"{label_style} {base}".strip())
            text.append(" " + _pad(st.shape, 8) + " ", style=base)
            if st.layout:
                name, style = LAYOUT_STYLE[st.layout]
                text.append(_pad(name, 5), style=style if (here or past) else "dim")
            text.append("\n")
        return text

    def _rank_strip(self, layout: str | None) -> Text:
        """Two ranks per line, 16 cells each: what each rank holds of the full tensor."""
        t, width = self.t, 16
        out = Text()
        seg = max(1, width // t)
        for r in range(t):
            out.append(f"r{r} ", style="bold")
            if layout in (F.REPLICATED, None):
                out.append("█" * width, style=REPL_COLOR)
            elif layout == F.PARTIAL:
                out.append("▒" * width, style="red")
            else:
                lo = r * seg
                bar = "·" * lo + "█" * seg + "·" * (width - lo - seg)
                style = {F.HEADS: "magenta", F.HIDDEN: "green", F.SEQUENCE: "yellow"}[layout]
                out.append(bar, style=style)
            out.append("  " if r % 2 == 0 and r + 1 < t else "\n")
        return out

    def render_detail(self) -> Text:
        lang = self.language
        s = strings("tp_block", lang)
        st = self.stage
        text = Text()
        text.append(self.stage_label(st), style=OP_STYLE.get(st.op or "", "bold"))
        text.append(" → " + st.shape + "\n", style="bold")
        text.append(st.note(lang) + "\n")
        if st.op:
            text.append(f"⇄ {OP_NAME[st.op]} ", style=OP_STYLE[st.op])
            text.append(f"({st.site})\n", style="dim")
        text.append_text(self._rank_strip(st.layout))
        if not text.plain.endswith("\n"):
            text.append("\n")
        done = self.stages[: self.index + 1]
        text.append(s["so_far"].format(fwd=_ops_text(F.count_collectives(done, "fwd"), lang),
                                       bwd=_ops_text(F.count_collectives(done, "bwd"), lang)) + "\n", style="cyan")
        sh = self.shape
        tensor = sh["seq"] * sh["micro_batch"] * sh["hidden"] * sh["bytes"]
        per_dir = sum(F.ring_bytes_per_rank(x.op, tensor, self.t) for x in self.stages
                      if x.op and x.phase == "fwd")
        text.append(s["per_layer"].format(h=sh["hidden"], s=sh["seq"], b=sh["micro_batch"], e=sh["bytes"],
                                          mb=_fmt_bytes(per_dir, self.language)) + "\n", style="dim")
        mode = "tp+sp" if self.sp else "tp"
        counts = self.run.layer_counts(mode)
        if counts is not None:
            text.append(s["run"].format(t=self.run.t, mode=mode, fwd=_ops_text(counts["fwd"], lang),
                                        bwd=_ops_text(counts["bwd"], lang), ok="✓" if counts["match"] else "✗"),
                        style="bold green" if counts["match"] else "bold red")
        return text

    def render_ce(self) -> Text:
        lang = self.language
        s = strings("tp_block", lang)
        steps = F.vocab_ce_walkthrough(t=self.t)  # over the block view's T ranks (x cycles 2, 4, 8)
        text = Text()
        text.append(s["ce_title"].format(t=self.t, tgt=F.EXAMPLE_TARGET) + "\n\n", style="bold")
        width = max(20, (self.query_one("#tp-flow", Static).content_size.width if self.is_mounted else 0) or 44)

        def label(words: str) -> str:  # wrapped under itself, two cells in, as the marker leaves it
            return "\n  ".join(wrap_words(words, width - 2))

        for i, step in enumerate(steps):
            here = i == self.ce_index
            if i > self.ce_index:
                text.append("  " + label(s["ce_steps"][step["key"]]) + "\n", style="dim")
                continue
            text.append("▶ " if here else "  ", style="bold")
            text.append(label(s["ce_steps"][step["key"]]) + "\n", style="reverse" if here else "")
            for r, val in enumerate(step["per_rank"]):
                shown = ("[" + number_separator(lang).join(("+" if v >= 0 else "") + format_fixed(v, 2, lang) for v in val) + "]"
                         if isinstance(val, list) else format_fixed(val, 4, lang))
                text.append(f"    r{r}: {shown}\n", style="yellow" if here else "")
            if step["collective"]:
                op, red = step["collective"]
                text.append(f"    ⇄ {OP_NAME[op]}({red.upper()}) → {format_fixed(step['value'], 4, self.language)}\n", style=OP_STYLE[op])
        if self.ce_index >= 4:
            text.append("\n" + s["ce_dense"].format(v=format_fixed(F.dense_cross_entropy(), 4, self.language)) + "\n", style="bold green")
        return text


VISUALIZER = TPBlockVisualizer
