"""Draw a lesson-3 run's timeline (Rich text): one row per start of the worker group.

Used by the lesson's visualizer (``distai.visualizers.failures``) and by ``distai run``'s
terminal view. Rich only: no Textual, no torch, no I/O.

    try 0  ██████████████████████✕
    try 1                    ↻▒▒██◆████◆████◆████◆
           1        10        20        30        40
"""
from __future__ import annotations

from rich.text import Text

from ..lessons.lesson3.run_timeline import RunTimeline

GLYPHS = {"step": ("█", "green"), "redo": ("█", "yellow"), "checkpoint": ("◆", "bold cyan"),
          "failure": ("✕", "bold red"), "restart": ("↻", "bold magenta"), "empty": (" ", "")}

STRINGS = {
    "en": {
        "title": "run timeline: {n} steps on {w} ranks",
        "waiting": "no run yet: start one with `distai run lesson3 --cpu 2` (or from the tutor) to see "
                   "its steps, checkpoints, failure and restart here",
        "try": "try {n}",
        "legend": "█ step  █ redone  ◆ checkpoint  ✕ failure  ↻ restart",
        "failure_step": "✕ rank {r} killed ({cause}) during step {s}",
        "failure_other": "✕ rank {r} killed ({cause}) during the {phase} after step {s}",
        "restart": "↻ restart {a} ({how}): resumed from the checkpoint after step {s} in {ms:.0f} ms",
        "restart_none": "↻ restart {a} ({how}): no good checkpoint, started over",
        "inplace": "torchrun, in place", "relaunch": "supervisor, fresh torchrun",
        "skipped": "  skipped {name}: {why}",
        "relaunched": "↻ torchrun gave up ({err}); relaunch {k} of {of} on a fresh port",
        "redone": "  redone steps {a}–{b}: losses {same} the first time",
        "same": "identical to", "diff": "DIFFERENT from",
        "ckpts": "◆ {n} checkpoints of {size}, {ms:.0f} ms each on average (the last: after step {s})",
        "compare_ok": "= resumed vs uninterrupted (same seed): {k}/{n} losses identical (==), weights {w}",
        "compare_bad": "≠ resumed vs uninterrupted: {k}/{n} losses equal, first difference at step {s} "
                       "(max |diff| {d:.2g})",
        "w_same": "identical", "w_diff": "different",
        "lost": "work redone: {n} step{s}",
    },
    "es": {
        "title": "línea de tiempo: {n} pasos en {w} ranks",
        "waiting": "aún no hay ejecución: lanza `distai run lesson3 --cpu 2` (o desde el tutor) para ver "
                   "aquí sus pasos, checkpoints, el fallo y el reinicio",
        "try": "int. {n}",
        "legend": "█ paso  █ rehecho  ◆ checkpoint  ✕ fallo  ↻ reinicio",
        "failure_step": "✕ rank {r} eliminado ({cause}) durante el paso {s}",
        "failure_other": "✕ rank {r} eliminado ({cause}) durante el {phase} tras el paso {s}",
        "restart": "↻ reinicio {a} ({how}): reanudado desde el checkpoint tras el paso {s} en {ms:.0f} ms",
        "restart_none": "↻ reinicio {a} ({how}): ningún checkpoint válido, desde el principio",
        "inplace": "torchrun, en el sitio", "relaunch": "supervisor, torchrun nuevo",
        "skipped": "  descartado {name}: {why}",
        "relaunched": "↻ torchrun se rindió ({err}); relanzamiento {k} de {of} en un puerto nuevo",
        "redone": "  pasos rehechos {a}–{b}: pérdidas {same} la primera vez",
        "same": "idénticas a", "diff": "DISTINTAS de",
        "ckpts": "◆ {n} checkpoints de {size}, {ms:.0f} ms cada uno de media (el último: tras el paso {s})",
        "compare_ok": "= reanudada vs sin interrupción (misma semilla): {k}/{n} pérdidas idénticas (==), pesos {w}",
        "compare_bad": "≠ reanudada vs sin interrupción: {k}/{n} pérdidas iguales, primera diferencia en el paso {s} "
                       "(máx |dif| {d:.2g})",
        "w_same": "idénticos", "w_diff": "distintos",
        "lost": "trabajo rehecho: {n} paso{s}",
    },
}


def _axis(n: int, cols: int, pad: int) -> Text:
    """Step numbers under the rows: 1, then round multiples at least 6 columns apart."""
    every = next((k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)
                  if k * cols / n >= 6), 20_000)
    marks = [1] + list(range(every, n + 1, every))
    line = [" "] * (cols + 8)
    for k in marks:
        col = min(cols - 1, int((k - 1) * cols / n))
        label = str(k)
        lo, hi = max(0, col - 1), col + len(label) + 1
        if hi <= len(line) and all(c == " " for c in line[lo:hi]):
            line[col:col + len(label)] = list(label)
    return Text(" " * pad + "".join(line).rstrip(), style="grey50")


def _legend(text: str) -> Text:
    """The legend with each glyph in its colour (the first █ is a step, the second a redone step)."""
    out = Text(style="grey50")
    blocks = iter((GLYPHS["step"][1], GLYPHS["redo"][1]))
    colours = {"◆": GLYPHS["checkpoint"][1], "✕": GLYPHS["failure"][1], "↻": GLYPHS["restart"][1]}
    for ch in text:
        if ch == "█":
            out.append(ch, style=next(blocks, "green"))
        elif ch in colours:
            out.append(ch, style=colours[ch])
        else:
            out.append(ch)
    return out


def timeline_lines(tl: RunTimeline, width: int = 80, language: str = "en", details: bool = True) -> list[Text]:
    """The rows, an axis, a legend and (``details``) one line per failure, restart and check."""
    tr = STRINGS.get(language, STRINGS["en"])
    if tl.empty:
        return [Text(tr["waiting"], style="italic grey62")]
    n = tl.span()
    label_w = max(len(tr["try"].format(n=k)) for k in tl.attempts) + 1
    cols = max(10, min(width - label_w - 1, n * max(1, (width - label_w - 1) // n)))
    lines = [Text(tr["title"].format(n=n, w=tl.world_size or "?"), style="bold")]
    for number, row in tl.cells(cols):
        line = Text(tr["try"].format(n=number).ljust(label_w), style="bold")
        for what in row:
            ch, style = GLYPHS[what]
            line.append(ch, style=style)
        lines.append(line)
    lines.append(_axis(n, cols, label_w))
    lines.append(_legend(tr["legend"]))
    if not details:
        return lines
    restarts_by_attempt = {r.get("attempt"): r for r in tl.restarts}
    for number in sorted(tl.attempts):
        at = tl.attempts[number]
        r = restarts_by_attempt.get(number)
        if r is not None:
            how = tr["inplace"] if r.get("restart_count") else tr["relaunch"]
            if r.get("checkpoint"):
                lines.append(Text(tr["restart"].format(a=number, how=how, s=r.get("from_step", 0),
                                                       ms=1e3 * float(r.get("load_s") or 0)), style="magenta"))
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
        lines.append(Text(tr["redone"].format(a=rd.get("first"), b=rd.get("last"),
                                              same=tr["same"] if rd.get("identical") else tr["diff"]),
                          style="green" if rd.get("identical") else "bold red"))
    cks = tl.checkpoints
    if cks:
        from ..lessons.units import format_bytes

        mean_ms = 1e3 * sum(float(c.get("seconds") or 0) for c in cks) / len(cks)
        lines.append(Text(tr["ckpts"].format(n=len(cks), size=format_bytes(cks[-1].get("bytes", 0), binary=True,
                                                                              lang=language),
                                             ms=mean_ms, s=cks[-1].get("step")), style="cyan"))
    c = tl.compare
    if c:
        if c.get("identical"):
            lines.append(Text(tr["compare_ok"].format(k=c.get("equal_steps"), n=c.get("steps"),
                                                      w=tr["w_same"] if c.get("weights_identical") else tr["w_diff"]),
                              style="bold green"))
        else:
            lines.append(Text(tr["compare_bad"].format(k=c.get("equal_steps"), n=c.get("steps"),
                                                       s=c.get("first_diff_step"), d=float(c.get("max_abs_diff") or 0)),
                              style="bold red"))
    return lines


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
