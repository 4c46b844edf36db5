"""Draw a lesson-3 run's timeline (Rich text): one row per start of the worker group.

Used by the lesson's visualizer (``distai.visualizers.failures``) and by ``distai run``'s
terminal view. Rich only: no Textual, no torch, no I/O.

    try 0  ██████████████████████✕
    try 1                    ↻▒▒██◆████◆████◆████◆
           1        10        20        30        40
"""
from __future__ import annotations

import re

from rich.text import Text

from ..lessons.lesson3.run_timeline import RunTimeline, step_columns
from ..lessons.strings import strings
from ..lessons.units import format_bytes, format_number, format_range, format_time
from .ring_drawing import code_spans, wrap_text

GLYPHS = {"step": ("█", "green"), "redo": ("█", "yellow"), "checkpoint": ("◆", "bold cyan"),
          "failure": ("✕", "bold red"), "restart": ("↻", "bold magenta"), "empty": (" ", "")}

def _layout(n: int, width: int, label_w: int) -> tuple[int, int]:
    """``(cols, per)``: the row's cells and the steps each cell stands for, so that the label, the row
    and the axis under it (its last number runs past the last cell) fit in ``width``: every step the
    same whole number of cells where they fit, else every cell the same number of steps."""
    room = max(1, width - label_w - (len(str(n)) - 1))
    if room >= n:
        return n * (room // n), 1
    per = -(-n // room)
    return -(-n // per), per


def _axis(n: int, cols: int, pad: int) -> Text:
    """Step numbers under the rows: 1, then round multiples at least 6 columns apart, and the last
    step where it has room."""
    every = next((k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)
                  if k * cols / n >= 6), 20_000)
    marks = [1] + list(range(every, n + 1, every)) + ([n] if n > 1 and n % every else [])
    line = [" "] * (cols + len(str(n)))
    for k in marks:
        col = step_columns(k, n, cols)[0]
        label = str(k)
        lo, hi = max(0, col - 1), col + len(label) + 1
        if col + len(label) <= len(line) and all(c == " " for c in line[lo:hi]):
            line[col:col + len(label)] = list(label)
    return Text(" " * pad + "".join(line).rstrip(), style="grey50")


def _legend(items: list[str], width: int) -> list[Text]:
    """The legend's items packed into lines of ``width`` (an item never split), each glyph in its
    colour (the first █ is a step, the second a redone step)."""
    blocks = iter((GLYPHS["step"][1], GLYPHS["redo"][1]))
    colours = {"◆": GLYPHS["checkpoint"][1], "✕": GLYPHS["failure"][1], "↻": GLYPHS["restart"][1]}
    lines: list[Text] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1].append("  ")
        else:
            lines.append(Text(style="grey50"))
        for ch in item:
            if ch == "█":
                lines[-1].append(ch, style=next(blocks, "green"))
            elif ch in colours:
                lines[-1].append(ch, style=colours[ch])
            else:
                lines[-1].append(ch)
    return lines


def timeline_lines(tl: RunTimeline, width: int = 80, language: str = "en", details: bool = True) -> list[Text]:
    """The rows, an axis, a legend and (``details``) one line per failure, restart and check, all
    within ``width`` columns: each row on one line under its axis (a cell stands for several steps
    where the steps would not fit one a cell, and the legend says how many), the legend and the
    details wrapped between their words."""
    tr = strings("failures", language)["timeline"]
    if tl.empty:
        return [code_spans(tr["waiting"], "italic grey62")]
    n = tl.span()
    label_w = max(len(tr["try"].format(n=k)) for k in tl.attempts) + 1
    cols, per = _layout(n, width, label_w)
    lines = wrap_text(Text(tr["title"].format(n=n, w=tl.world_size or "?"), style="bold"), width)
    for number, row in tl.cells(cols):
        line = Text(tr["try"].format(n=number).ljust(label_w), style="bold")
        for what in row:
            ch, style = GLYPHS[what]
            line.append(ch, style=style)
        lines.append(line)
    lines.append(_axis(n, cols, label_w))
    items = [item for item in re.split(r"\s{2,}", tr["legend"]) if item]
    if per > 1:
        items.append(tr["per_cell"].format(k=per))
    lines.extend(_legend(items, width))
    if not details:
        return lines
    head = len(lines)
    restarts_by_attempt = {r.get("attempt"): r for r in tl.restarts}
    for number in sorted(tl.attempts):
        at = tl.attempts[number]
        r = restarts_by_attempt.get(number)
        if r is not None:
            how = tr["inplace"] if r.get("restart_count") else tr["new_run"] if r.get("new_run") else tr["relaunch"]
            if r.get("checkpoint"):
                lines.append(Text(tr["restart"].format(a=number, how=how, s=r.get("from_step", 0),
                                                       t=format_time(float(r.get("load_s") or 0), lang=language)),
                                  style="magenta"))
            else:
                lines.append(Text(tr["restart_none"].format(a=number, how=how), style="magenta"))
            for name, why in r.get("skipped") or []:
                lines.append(Text(tr["skipped"].format(name=name, why=why), style="yellow"))
            lost = int(r.get("lost_steps") or 0)
            if lost:
                lines.append(Text("  " + tr["lost"].format(n=lost, s="s" if lost != 1 else ""), style="yellow"))
        f = at.failure
        if f is not None:
            key = "failure_step" if f.get("phase", "step") == "step" else "failure_other"
            phase = f.get("phase", "step")
            lines.append(Text(tr[key].format(r=f.get("rank"), cause=f.get("cause", "SIGKILL"),
                                             s=f.get("step") if key == "failure_step" else int(f.get("step") or 1) - 1,
                                             phase=phase), style="red"))
    for k, rl in enumerate(tl.relaunches, 1):
        err = str(rl.get("error") or "failed")[:60]
        lines.append(Text(tr["relaunched"].format(err=err, k=rl.get("attempt", k), of=rl.get("of", "?")),
                          style="magenta"))
    for rd in tl.redone:
        first, last = rd.get("first"), rd.get("last")
        count = last - first + 1 if isinstance(first, int) and isinstance(last, int) else 2
        lines.append(Text(tr["redone"].format(n=count, span=format_range(first, last),
                                              same=tr["same"] if rd.get("identical") else tr["diff"]),
                          style="green" if rd.get("identical") else "bold red"))
    cks = tl.checkpoints
    if cks:
        mean_s = sum(float(c.get("seconds") or 0) for c in cks) / len(cks)
        lines.append(Text(tr["ckpts"].format(n=len(cks), size=format_bytes(cks[-1].get("bytes", 0), binary=True,
                                                                              lang=language),
                                             t=format_time(mean_s, lang=language), s=cks[-1].get("step")),
                          style="cyan"))
    c = tl.compare
    if c:
        if c.get("identical"):
            lines.append(Text(tr["compare_ok"].format(k=c.get("equal_steps"), n=c.get("steps"),
                                                      w=tr["w_same"] if c.get("weights_identical") else tr["w_diff"]),
                              style="bold green"))
        else:
            lines.append(Text(tr["compare_bad"].format(k=c.get("equal_steps"), n=c.get("steps"),
                                                       s=c.get("first_diff_step"),
                                                       d=format_number(float(c.get("max_abs_diff") or 0), 2, language)),
                              style="bold red"))
    return lines[:head] + [part for line in lines[head:] for part in wrap_text(line, width, hanging=2)]


class TerminalTimeline:
    """The timeline for ``distai run``'s terminal view (``[run] terminal`` in lessons/lesson3/lesson.toml)."""

    def __init__(self, language: str = "en"):
        self.timeline = RunTimeline()
        self.language = language

    def feed(self, event: dict) -> None:
        self.timeline.feed(event)

    def renderables(self, width: int = 100) -> list[Text]:
        if self.timeline.empty:
            return []
        return timeline_lines(self.timeline, min(width, 120), self.language)
