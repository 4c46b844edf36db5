"""Lesson 9's visualizer: ring attention on the s × s causal attention matrix, step by step.

The matrix is drawn as tiles of (query chunk, key chunk), coloured by the rank whose queries they
are (:mod:`distai.lessons.context.ring_schedule`): at each ring step the tiles that rank computes
with the K/V block it holds light up, earlier steps' stay shaded, future-key tiles are skipped
(``··``) and the diagonal ones are cut by the mask. Under it: which K/V block each rank holds (they
move one hop to the right a step; with the all-gather variant every rank holds them all), each
rank's work in the step (the causal scores it computes, or a replayed run's measured compute and
wait), the idle share of the layout, and the running maximum ``m`` and sum ``l`` of one query row
(the last token's) merged step by step with the online softmax. ``z`` switches the layout, ``a`` the
variant, ``[``/``]`` the CP size, ``b`` forward/backward, ``o`` replays the latest run (its cp,
layout and variant, with the ranks' measured times). Both layouts cut the same sequence (``2·cp``
chunks of 8 tokens, or ``cp`` of 16): ``z`` changes the chunks, which the axes line says, not the
example. The idle share counts the exact causal pairs of those short chunks (a diagonal tile a
little over half full) and names the long-chunk value the lesson's text quotes. Lines are wrapped to
the pane's width before being fitted to its height, so a short pane says how many it hides.
Rendered as Rich ``Text``; no torch, no I/O.
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.text import Text

from ..lessons.context import formulas as f
from ..lessons.context import ring_schedule as plan
from ..lessons.context.cp_run import CPRun
from ..lessons.context.events import CP_CONFIG
from ..lessons.strings import strings
from ..lessons.units import (
    GLUE,
    format_bytes,
    format_fixed,
    format_integer,
    format_number,
    format_percent,
    format_time,
)
from .base import PLAYBACK_CONTROLS, Control, wrap_words
from .playback import PlaybackVisualizer

RANK_COLOURS = ("dodger_blue1", "orange1", "green3", "magenta", "yellow1", "cyan", "red1", "purple")
CP_CHOICES = (1, 2, 4, 8)
TOKENS_PER_CHUNK = 8  # the schedule's matrix: s = 2·cp × 8 tokens in both layouts (zigzag's chunks)
FRAME_S = 1.2  # seconds a ring step stays on screen while playing
PHASES = ("fwd", "bwd")


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


class RingAttentionVisualizer(PlaybackVisualizer):
    """The tiles of ring attention, step by step (see the module docstring)."""

    can_focus = True
    DEFAULT_CLASSES = "panel"
    STEP_SETTINGS = frozenset({"cp", "layout", "variant", "step", "phase"})  # lessons/context/lesson.toml
    CONTROLS = PLAYBACK_CONTROLS + (
        Control("z", "layout", "ring_attention.layout", hint=True),
        Control("a", "variant", "ring_attention.variant", hint=True),
        Control("right_square_bracket", "cp(1)", "ring_attention.cp", back_keys="left_square_bracket",
                back_action="cp(-1)", hint=True),
        Control("b", "phase", "ring_attention.phase"),
        Control("o", "source", "ring_attention.source"),
    )

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.cp, self.seq_layout, self.variant = 4, "zigzag", "ring"
        self.phase, self.step, self.progress = "fwd", 0, 0.0
        self.source = "model"
        self.run = CPRun()

    # -- the state drawn ---------------------------------------------------------------------------
    @property
    def seq(self) -> int:
        """The matrix's sequence: the run's, or ``2·cp`` chunks of 8 tokens whatever the layout (the
        contiguous one cuts it into ``cp`` chunks of 16), so ``z`` compares the same sequence."""
        if self.source == "run" and self.run.config:
            return int(self.run.config["seq"])
        return plan.num_chunks(self.cp, "zigzag") * TOKENS_PER_CHUNK

    @property
    def chunk_tokens(self) -> int:
        """Tokens in one chunk (one row or column of the matrix) of the layout shown."""
        return self.seq // plan.num_chunks(self.cp, self.seq_layout)

    def tr(self) -> Mapping[str, Any]:
        return strings("ring_attention", self.language)

    # -- playback -----------------------------------------------------------------------------------
    def _frame(self) -> int:
        return PHASES.index(self.phase) * self.cp + self.step

    def _set_frame(self, frame: int) -> None:
        frame = max(0, min(2 * self.cp - 1, frame))
        self.phase, self.step = PHASES[frame // self.cp], frame % self.cp

    def advance(self, dt: float) -> bool:
        self.progress += dt
        if self.progress < FRAME_S:
            return True
        self.progress = 0.0
        if self._frame() >= 2 * self.cp - 1:
            return False
        self._set_frame(self._frame() + 1)
        self.refresh()
        return True

    def seek(self, frames: int) -> None:
        self.progress = 0.0
        self._set_frame(self._frame() + frames)

    def rewind(self) -> None:
        self._set_frame(0)

    def to_end(self) -> None:
        self._set_frame(2 * self.cp - 1)

    def at_end(self) -> bool:
        return self._frame() >= 2 * self.cp - 1

    # -- the lesson screen ---------------------------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        view = self.step_view(step_key)  # lessons/context/lesson.toml
        if not view:
            return
        self.source = "model"
        self.cp = int(view.get("cp", self.cp))
        self.seq_layout = view.get("layout", self.seq_layout)
        self.variant = view.get("variant", "ring")
        self.phase = view.get("phase", "fwd")
        self.step = min(int(view.get("step", 0)), self.cp - 1)
        self.playing = False
        self.refresh()

    def feed_event(self, event: dict) -> None:
        if not self.run.feed(event):
            return
        if CP_CONFIG.matches(event):
            self.source = "run"
            self.cp, self.seq_layout = int(event["cp"]), str(event["layout"])
            self.variant, self.phase, self.step = str(event["variant"]), "fwd", 0
        self.refresh()

    # -- actions ---------------------------------------------------------------------------------
    def _to_model(self) -> None:
        self.source = "model"

    def action_layout(self) -> None:
        self._to_model()
        self.seq_layout = "contiguous" if self.seq_layout == "zigzag" else "zigzag"
        self.refresh()

    def action_variant(self) -> None:
        self._to_model()
        self.variant = "allgather" if self.variant == "ring" else "ring"
        self.refresh()

    def action_cp(self, delta: int) -> None:
        self._to_model()
        i = CP_CHOICES.index(self.cp) if self.cp in CP_CHOICES else 2
        self.cp = CP_CHOICES[max(0, min(len(CP_CHOICES) - 1, i + delta))]
        self.step = min(self.step, self.cp - 1)
        self.refresh()

    def action_phase(self) -> None:
        self.phase = "bwd" if self.phase == "fwd" else "fwd"
        self.refresh()

    def action_source(self) -> None:
        if self.source == "run":
            self._to_model()
        elif self.run.config:
            self.feed_event({"kind": "cp_config", **self.run.config})
        else:
            self.post_message(self.ReplayRequested(self))
        self.refresh()

    # -- drawing -----------------------------------------------------------------------------------
    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 80, size.height or None))

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        width = max(40, width)
        tr, lang = self.tr(), self.language
        src = tr["src_run"] if self.source == "run" else tr["src_model"]
        fields = dict(s=format_integer(self.seq, lang), cp=self.cp, layout=tr[self.seq_layout], variant=tr[self.variant],
                      phase=tr[self.phase], k=self.step + 1, n=self.cp, src=src)
        out = [Text(tr["title" if width >= 90 else "title_short"].format(**fields), style="bold")]
        out += self._matrix_lines(width)
        out += [Text(line, style="grey50") for line in _wrap(tr["legend"], width)]
        out += self._ring_lines(width)
        out += self._work_lines(width)
        out += self._row_lines()
        out += [Text(line, style="grey50") for line in wrap_words(self.controls_hint(width), width)]
        return self.fit_height(_rows(out, width), height)

    def _matrix_lines(self, width: int) -> list[Text]:
        chunks, cp, layout = plan.num_chunks(self.cp, self.seq_layout), self.cp, self.seq_layout
        holder = {c: r for r in range(cp) for c in plan.rank_chunks(r, cp, layout)}
        cell = 2 if chunks * 2 + 6 <= width else 1
        axes = self.tr()["axes"].format(n=chunks, c=format_integer(self.chunk_tokens, self.language))
        lines = [Text(line, style="grey50") for line in _wrap(axes, width)]
        for q in range(chunks):
            line = Text(f"q{q:<3}" if chunks < 100 else "")
            rank = holder[q]
            for k in range(chunks):
                kind = plan.tile_kind(q, k)
                if kind == plan.SKIP:
                    line.append("·" * cell, style="grey30")
                    continue
                at = (rank - holder[k]) % cp  # the ring step at which this rank meets chunk k's K/V
                if at == self.step:
                    glyph = "◣" if kind == plan.DIAGONAL else "█"
                    line.append(glyph * cell, style=f"bold {_colour(rank)}")
                elif at < self.step:
                    line.append("▓" * cell, style=f"{_colour(rank)} dim")
                else:
                    line.append("░" * cell, style="grey35")
            line.append(f"  R{rank}", style=_colour(rank))
            lines.append(line)
        return lines

    def _ring_lines(self, width: int) -> list[Text]:
        tr, cp = self.tr(), self.cp
        if self.variant == "allgather":
            return [Text(line, style="cyan") for line in wrap_words(tr["gathered"], width)]
        line = Text(tr["ring_line"] + " ", style="bold")
        for r in range(cp):
            line.append(tr["holds"].format(r=r, o=plan.owner(r, self.step, cp)), style=_colour(r))
            line.append(" → " if r < cp - 1 else " ↺", style="grey50")
        return [line]

    def _work_lines(self, width: int) -> list[Text]:
        tr, lang, cp = self.tr(), self.language, self.cp
        work = plan.work_per_step(self.seq, cp, self.seq_layout)
        most = max(max(row) for row in work) or 1
        bar_w = max(4, min(24, width - 40))
        measured = self.run.step_records(self.phase, self.step) if self.source == "run" else {}
        out = [Text(tr["work_title"], style="bold")]
        slowest = max((r["compute_s"] + r["wait_s"] for r in measured.values()), default=0.0) or 1.0
        for r in range(cp):
            rec = measured.get(r)
            if rec is not None:
                busy = round(bar_w * rec["compute_s"] / slowest)
                line = Text(f"R{r} ", style=_colour(r))
                line.append("█" * busy, style=_colour(r))
                line.append("░" * max(0, round(bar_w * rec["wait_s"] / slowest)), style="grey35")
                line.append(" " + tr["measured_row"].split("} ", 2)[-1].format(
                    c=format_time(rec["compute_s"], lang=lang), w=format_time(rec["wait_s"], lang=lang)))
                out.append(line)
                continue
            scores = work[r][self.step]
            bar = "█" * max(1 if scores else 0, round(bar_w * scores / most))
            line = Text(f"R{r} ", style=_colour(r))
            line.append(bar or "·", style=_colour(r) if scores else "grey35")
            line.append(" " + (format_integer(scores, lang) if scores else tr["idle"]))
            out.append(line)
        measured_share = self.run.idle_share(self.phase) if self.source == "run" else None
        tail = (tr["idle_measured"].format(share=format_percent(measured_share, 3, lang))
                if measured_share is not None else tr["idle_unmeasured"])
        idle = idle_share_line(tr, lang, self.seq, cp, self.seq_layout, tail)
        out += [Text(row, style="grey62") for row in _wrap(idle, width)]
        return out

    def _row_lines(self) -> list[Text]:
        tr, lang = self.tr(), self.language
        trace = f.row_trace(self.seq, self.cp, self.seq_layout)
        out = [Text(tr["row_title"].format(q=format_integer(self.seq - 1, lang), r=trace[0]["rank"]), style="bold")]
        last = self.step if self.phase == "fwd" else self.cp - 1
        for t, row in enumerate(trace):
            if t > last:
                out.append(Text(tr["row_pending"].format(k=t + 1), style="grey35"))
                continue
            out.append(Text(tr["row_line"].format(k=t + 1, keys=row["keys"], m=format_fixed(row["m"], 2, lang),
                                                  l=format_fixed(row["l"], 2, lang),
                                                  o=format_fixed(row["out"], 4, lang)),
                            style="bold" if t == last else ""))
        if last == self.cp - 1:
            out.append(Text(tr["row_done"].format(n=format_integer(self.seq, lang),
                                                  o=format_fixed(trace[-1]["direct"], 4, lang)), style="green"))
        return out


def idle_share_line(tr: Mapping[str, Any], lang: str, seq: int, cp: int, layout: str, measured: str) -> str:
    """The idle share of ``seq`` tokens, what it counts (the exact causal pairs of its chunks) and,
    when it differs once shown, the long-chunk share the lesson's text quotes (a diagonal tile as
    half a tile: ``(cp−1)/(2cp−1)`` for the contiguous layout)."""
    share = format_percent(plan.idle_fraction(seq, cp, layout), 3, lang)
    long = format_percent(f.idle_fraction(cp, layout), 3, lang)
    return tr["idle_share"].format(share=share, c=format_integer(seq // plan.num_chunks(cp, layout), lang),
                                   long=tr["idle_long"].format(share=long) if long != share else "",
                                   measured=measured)


def _wrap(text: str, width: int) -> list[str]:
    """:func:`wrap_words` that keeps each " · " separator at the end of its line, with the item before it."""
    return wrap_words(text.replace(" · ", f"{GLUE}· "), width)


def _rows(lines: list[Text], width: int) -> list[Text]:
    """Every line cut into the rows the pane shows at ``width`` (styles kept), so that
    :meth:`fit_height` counts rows, not lines that wrap."""
    console = Console(width=width, file=io.StringIO(), color_system=None)
    return [row for line in lines for row in line.wrap(console, width)]


class RingAttentionRunView:
    """``distai run context``'s terminal view (``[run] terminal`` in lessons/context/lesson.toml): each
    rank's compute and wait per ring step of the latest training step, the loss against one process,
    the memory curve against the formula."""

    def __init__(self, language: str = "en"):
        self.language = language
        self.run = CPRun()

    def feed(self, event: dict) -> None:
        self.run.feed(event)

    def renderables(self, width: int = 100) -> list[Text]:
        run, lang = self.run, self.language
        tr = strings("ring_attention", lang)
        if not run.config:
            return []
        c = run.config
        out = [Text(tr["run_title"].format(cp=c["cp"], dp=c.get("dp", 1), world=c.get("world", c["cp"]),
                                           backend=c.get("backend", ""), layout=tr[str(c["layout"])],
                                           variant=tr[str(c["variant"])], s=format_integer(c["seq"], lang)),
                    style="bold magenta")]
        if run.ring:
            out.append(Text(tr["run_steps"], style="bold"))
            for r in range(run.cp):
                line = Text(f"R{r} ", style=_colour(r))
                for t in range(run.cp):
                    rec = run.step_records("fwd", t).get(r)
                    cell = "—" if rec is None else (f"{format_fixed(1e3 * rec['compute_s'], 2, lang)}/"
                                                      f"{format_fixed(1e3 * rec['wait_s'], 2, lang)}")
                    line.append(cell.rjust(12), style="" if rec is None or rec["scores"] else "grey50")
                out.append(line)
            share = run.idle_share("fwd")
            if share is not None:
                out.append(Text(idle_share_line(tr, lang, int(c["seq"]), run.cp, str(c["layout"]),
                                                tr["idle_measured"].format(share=format_percent(share, 3, lang)))))
        if run.steps:
            s = run.steps[-1]
            out.append(Text(tr["run_loss"].format(loss=format_number(s["loss"], 6, lang),
                                                  ref=format_number(s["reference_loss"], 6, lang),
                                                  grad=format_number(s["max_grad_rel_diff"], 2, lang))))
        if run.memory:
            out.append(Text(tr["run_memory_head"], style="bold"))
            for m in run.memory:
                out.append(Text(tr["run_memory_row"].format(
                    s=format_integer(m["seq"], lang), m=format_bytes(m["measured_bytes"], True, lang=lang),
                    f=format_bytes(m["formula_bytes"], True, lang=lang),
                    m1=format_bytes(m["one_process_bytes"], True, lang=lang),
                    f1=format_bytes(m["one_process_formula_bytes"], True, lang=lang))))
        if run.summary and "comm_match" in run.summary:
            out.append(Text(tr["run_comm"].format(ok=tr["yes"] if run.summary["comm_match"] else tr["no"])))
        return out


VISUALIZER = RingAttentionVisualizer
