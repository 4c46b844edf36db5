"""The capstone's visualizer: the ranks of a (pp, dp, tp) device mesh, and which group talks when.

Each pipeline stage is a block; inside it, rows are data-parallel replicas and columns tensor-parallel
shards, each cell a global rank (``rank = (p·dp + d)·tp + t``, :func:`~distai.lessons.capstone.formulas
.mesh_coords`). Views (``g``):

- **step**: the phases of one step played in turn (:func:`~distai.lessons.capstone.mesh_run.step_phases`):
  TP groups light up inside the stage computing, PP pairs between two stages as activations go forward
  and gradients come back, DP groups at the end;
- **groups**: one rank's three groups at once (``,`` ``.`` pick the rank);
- **nodes**: which ranks share a node (4 GPUs per node here), so TP stays on NVLink and DP/PP cross;
- **run**: a capstone run's latest complete step replayed from its events
  (:class:`~distai.lessons.capstone.mesh_run.MeshRun`), with each stage's bytes per group against the
  formulas and the loss against one process.

``m`` cycles the mesh shape (the shapes the capstone's tests run); ``space`` plays or pauses. No torch,
no I/O.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping

from rich.console import Group
from rich.text import Text

from ..lessons import units
from ..lessons.capstone import formulas as f
from ..lessons.capstone.events import MESH_CONFIG
from ..lessons.capstone.mesh_run import MeshRun, Phase, step_phases
from ..lessons.events import RUN_END, RUN_START
from ..lessons.strings import strings, translated
from .base import NEXT_VIEW, PLAY, Control
from .playback import PlaybackVisualizer
from .ring_drawing import wrap_text

SHAPES = ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1))  # (pp, dp, tp), the capstone's test meshes
GPUS_PER_NODE = 4  # small nodes, so that the 8-rank mesh spans two
COLOURS = {"tp": "black on #59a14f", "pp": "black on #b07aa1", "dp": "black on #edc948"}
NODE_COLOURS = ("black on #4e79a7", "black on #f28e2b", "black on #76b7b2", "black on #ff9da7")
DIM_STYLE = "grey42"

def phase_text(phase: Phase, tp: int, dp: int, tr: Mapping) -> str:
    s = phase.stages
    if phase.what in ("forward", "backward"):
        return tr[phase.what + ("" if tp > 1 else "1")].format(s=s[0])
    if phase.what in ("send", "send-grad"):
        return tr[phase.what].format(a=s[0], b=s[1])
    if phase.what == "reduce":
        return tr["reduce" if dp > 1 else "reduce1"]
    return tr["update"]


def rows_taken(lines: list[Text], width: int) -> int:
    """The rows ``lines`` take in ``width`` columns, each wrapped at word boundaries."""
    return sum(len(wrap_text(ln, width)) for ln in lines)


class MeshVisualizer(PlaybackVisualizer):
    """The (pp, dp, tp) mesh with the groups that talk in each phase of a step."""

    can_focus = True
    DEFAULT_CLASSES = "panel"
    VIEWS = ("step", "groups", "nodes", "run")
    STEP_SETTINGS = frozenset({"show"})
    TICK_S = 0.1
    CONTROLS = (
        NEXT_VIEW,
        Control("m", "next_mesh", "mesh.next_mesh", hint=True),
        PLAY,
        Control("full_stop", "step(1)", "mesh.phase",
                back_keys="comma", back_action="step(-1)", hint=True),
        Control("0", "restart", "visualizer.restart"),
    )
    SECONDS_PER_PHASE = 1.2

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.shape = SHAPES[0]
        self.view = "step"
        self.frame = 0
        self.rank = 5
        self.playing = True
        self.run = MeshRun()
        self._elapsed = 0.0

    # -- model ------------------------------------------------------------------------------------
    def phases(self) -> list[Phase]:
        if self.view == "run":
            return self.run.replay_phases()
        return step_phases(*self.shape)

    def current_phase(self) -> Phase | None:
        phases = self.phases()
        return phases[self.frame % len(phases)] if phases else None

    # -- Textual ----------------------------------------------------------------------------------
    # playback (visualizers/playback.py): a phase every SECONDS_PER_PHASE, looping
    def advance(self, dt: float) -> bool:
        if self.view in ("step", "run"):
            self._elapsed += dt
            if self._elapsed >= self.SECONDS_PER_PHASE:
                self._elapsed = 0.0
                self.frame += 1
                self.refresh()
        return True

    def seek(self, frames: int) -> None:
        if self.view == "groups":
            self.rank = (self.rank + frames) % f.world_size(*self.shape)
        else:
            self.frame += frames

    def rewind(self) -> None:
        self.frame = 0

    def show_step(self, step_key: str) -> None:
        """Show the view the step declares (``view = { show = "groups" }`` in lessons/capstone/lesson.toml);
        ``run`` only once a run is loaded."""
        view = self.step_view(step_key).get("show")
        if view is None:
            return
        if view == "run" and self.run.shape is None:
            view = "step"
        self.view, self.frame = view, 0
        if view == "groups":
            self.rank = min(5, f.world_size(*self.shape) - 1)
        self.refresh()

    def feed_event(self, event: dict) -> None:
        if not self.run.feed(event):
            return
        if MESH_CONFIG.matches(event) and self.run.shape:
            self.shape, self.view, self.frame = self.run.shape, "run", 0
        self.refresh()

    # -- actions ----------------------------------------------------------------------------------
    def views_available(self) -> tuple[str, ...]:
        return tuple(v for v in self.VIEWS if v != "run" or self.run.shape is not None)

    def action_view(self, view: str) -> None:
        self.frame = 0
        super().action_view(view)

    def action_next_mesh(self) -> None:
        i = SHAPES.index(self.shape) if self.shape in SHAPES else -1
        self.shape = SHAPES[(i + 1) % len(SHAPES)]
        self.rank = min(self.rank, f.world_size(*self.shape) - 1)
        if self.view == "run":
            self.view = "step"
        self.frame = 0
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------------
    def cell_styles(self) -> dict[int, str]:
        """Style of each rank's cell in the current view."""
        pp, dp, tp = self.shape
        n = f.world_size(pp, dp, tp)
        if self.view == "nodes":
            return {r: NODE_COLOURS[(r // GPUS_PER_NODE) % len(NODE_COLOURS)] for r in range(n)}
        if self.view == "groups":
            r = min(self.rank, n - 1)
            out = {}
            for dim in ("dp", "pp", "tp"):  # TP last: the rank itself shows its TP colour
                for other in f.group_ranks(r, dim, pp, dp, tp):
                    if len(f.group_ranks(r, dim, pp, dp, tp)) > 1:
                        out[other] = COLOURS[dim]
            out[r] = "bold white on #e15759"
            return out
        phase = self.current_phase()
        if phase is None or not phase.dim:
            on = set() if phase is None else {x for x in range(n) if f.mesh_coords(x, pp, dp, tp)["pp"] in phase.stages}
            return {x: "bold" for x in on}
        return {x: COLOURS[phase.dim] for x in range(n) if f.mesh_coords(x, pp, dp, tp)["pp"] in phase.stages}

    def grid_lines(self, width: int) -> list[Text]:
        pp, dp, tp = self.shape
        tr = strings("mesh", self.language)
        styles = self.cell_styles()
        cell = 5  # " r12 "
        block_w = max(tp * cell, len(tr["stage"].format(s=pp - 1))) + 2
        per_row = max(1, min(pp, (width + 1) // (block_w + 1)))
        lines: list[Text] = []
        for first in range(0, pp, per_row):
            stages = range(first, min(pp, first + per_row))
            head = Text()
            for s in stages:
                head.append(tr["stage"].format(s=s).ljust(block_w) + " ", style="bold")
            lines.append(head)
            for d in range(dp):
                row = Text()
                for s in stages:
                    row.append("│")
                    for t in range(tp):
                        r = f.rank_at(s, d, t, pp, dp, tp)
                        row.append(f" r{r:<2} ", style=styles.get(r, DIM_STYLE))
                    row.append(" " * (block_w - 2 - tp * cell) + "│ ")
                lines.append(row)
        return lines

    def caption(self, tr: Mapping) -> list[Text]:
        pp, dp, tp = self.shape
        if self.view == "groups":
            r = min(self.rank, f.world_size(pp, dp, tp) - 1)
            c = f.mesh_coords(r, pp, dp, tp)
            return [Text(tr["groups"].format(r=r, p=c["pp"], d=c["dp"], t=c["tp"]), style="bold"), self.legend(tr)]
        if self.view == "nodes":
            return [Text(tr["nodes"].format(g=GPUS_PER_NODE, dpn=f.nodes_spanned("dp", pp, dp, tp, GPUS_PER_NODE),
                                            ppn=f.nodes_spanned("pp", pp, dp, tp, GPUS_PER_NODE)))]
        phases = self.phases()
        if not phases:
            return []
        i = self.frame % len(phases)
        phase = phases[i]
        text = Text(tr["phase"].format(i=i + 1, n=len(phases)) + ": ", style="bold")
        text.append(phase_text(phase, tp, dp, tr))
        if self.view == "run":
            text.append(tr["mb"].format(mb=phase.microbatch))
            if phase.t0 is not None:
                text.append(tr["at"].format(t=units.format_time(phase.t0, lang=self.language)))
        return [text, self.group_line(phase, width=None), self.legend(tr)]

    def group_line(self, phase: Phase, width: int | None) -> Text:
        """The groups that talk in ``phase``, by their ranks: TP groups {4 5}, PP pairs 0→4, DP groups {0 2}."""
        pp, dp, tp = self.shape
        n = f.world_size(pp, dp, tp)
        if not phase.dim:
            return Text("")
        if phase.dim == "pp":
            a, b = phase.stages
            pairs = [f"{r}→{f.rank_at(b, f.mesh_coords(r, pp, dp, tp)['dp'], f.mesh_coords(r, pp, dp, tp)['tp'], pp, dp, tp)}"
                     for r in range(n) if f.mesh_coords(r, pp, dp, tp)["pp"] == a]
            body = "  ".join(pairs)
        else:
            seen: list[tuple[int, ...]] = []
            for r in range(n):
                if f.mesh_coords(r, pp, dp, tp)["pp"] in phase.stages:
                    g = tuple(f.group_ranks(r, phase.dim, pp, dp, tp))
                    if g not in seen:
                        seen.append(g)
            body = "  ".join("{" + " ".join(map(str, g)) + "}" for g in seen)
        return Text(f"{phase.dim.upper()}: {body}", style=COLOURS[phase.dim].replace("black on ", ""))

    def legend(self, tr: Mapping) -> Text:
        out = Text()
        parts = tr["legend"].split("{")
        out.append(parts[0])
        for part in parts[1:]:
            key, rest = part.split("}", 1)
            out.append("  ", style=COLOURS[key])
            out.append(rest)
        return out

    def run_lines(self, tr: Mapping, figures: bool = True) -> list[Text]:
        """The run's coordinates check, and with ``figures`` its loss against one process and each
        stage's bytes per group against the formulas."""
        run = self.run
        if run.shape is None:
            return [Text(tr["waiting"], style="italic")]
        out: list[Text] = []
        if run.latest_complete_step() is None:
            out.append(Text(tr["waiting_step"].format(shape=run.shape), style="italic"))
        ok = tr["yes"] if run.coords_match_formulas() else tr["no"]
        out.append(Text(tr["coords"].format(ok=ok)))
        if not figures:
            return out
        if run.steps:
            s = run.steps[-1]

            lang = self.language

            def loss(x):
                return "—" if x is None else units.format_fixed(x, 4, lang)

            def diff(x):
                return "—" if x is None else units.format_number(x, 2, lang)
            out.append(Text(tr["loss"].format(step=s["step"], loss=loss(s["loss"]), ref=loss(s["ref_loss"]),
                                              dl=diff(s["loss_rel_diff"]), dp=diff(s["param_rel_diff"]))))
        comm = run.comm_by_stage()
        if comm:
            out.append(Text(tr["comm_head"], style="bold"))
            for stage, dims in comm.items():
                for dim, c in dims.items():
                    bytes_ = (f"{units.format_bytes(c['bytes'], binary=True, lang=self.language)}/"
                              f"{units.format_bytes(c['expected_bytes'], binary=True, lang=self.language)}")
                    row = Text(f"{stage:>2} ")
                    row.append(f" {dim} ", style=COLOURS[dim])
                    row.append(f" {bytes_:>19} {c['calls']:>5} {'✓' if c['match'] else '✗'}")
                    out.append(row)
        return out

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        tr = strings("mesh", self.language)
        pp, dp, tp = self.shape
        head = Text(tr["title"].format(pp=pp, dp=dp, tp=tp, n=f.world_size(pp, dp, tp)), style="bold")
        head.append("  [" + tr["views"][self.view] + "]", style="cyan")
        rows_line = Text(tr["rows"], style="grey50")
        lines = [head, rows_line]
        lines += self.grid_lines(max(20, width))
        lines += self.caption(tr)
        if self.view == "run":
            lines += self.run_lines(tr)
        lines.append(Text(self.controls_hint(width), style="grey50"))
        if height is None:
            return lines
        width = max(20, width)
        if rows_taken(lines, width) > height:
            # a short pane drops the explanations first (the rows line, the colour legend, the list of
            # groups): the grid and what happens stay in view
            legend = self.legend(tr).plain
            phase = self.current_phase() if self.view in ("step", "run") else None
            group = self.group_line(phase, None).plain if phase is not None and phase.dim else None
            for drop in (rows_line.plain, legend, group):
                if rows_taken(lines, width) > height and drop:
                    lines = [ln for ln in lines if ln.plain != drop]
        return self.fit_notes(lines, width, height)

    def fit_notes(self, lines: list[Text], width: int, height: int) -> list[Text]:
        """``lines`` (the last one the keys hint) in ``height`` rows of ``width``: each note wrapped at word
        boundaries, never cut with …; a pane too short keeps the notes that fit whole and says how many
        rows it leaves out."""
        notes = [wrap_text(ln, width) for ln in lines[:-1]]
        flat = [row for note in notes for row in note]
        if height < 3 or len(flat) + 1 <= height:
            return self.fit_height(flat + lines[-1:], height)

        def mark(n: int) -> list[Text]:  # "▼ n more lines…", wrapped too
            return wrap_text(Text(translated("visualizer", "more_lines", self.language, n=n), style="dim italic"), width)

        room = max(1, height - 1 - len(mark(len(flat))))
        cut = max((end for end in itertools.accumulate(len(note) for note in notes) if end <= room), default=room)
        return flat[:cut] + mark(len(flat) - cut) + [lines[-1]]

    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 80, size.height or None))


class TerminalMesh:
    """``distai run capstone``'s text view of the run (the ``[run] terminal`` contract: ``feed(event)``,
    ``renderables(width)``): the mesh at the run's shape, the loss against one process and each
    stage's bytes per group against the formulas — the widget's run view without its animation. Once
    the run ended well, rank 0's summary says the loss and the bytes whole (``[run] summary = "output"``:
    under ``distai run``'s view and in the run panel's log), so the view keeps the mesh and does not
    repeat them."""

    def __init__(self, language: str = "en"):
        self.view = MeshVisualizer(language)
        self.view.playing = False
        self.ended_ok = False

    def feed(self, event: dict) -> None:
        if RUN_START.matches(event) or RUN_END.matches(event):
            self.ended_ok = RUN_END.matches(event) and event.get("status") == "ok"
        self.view.feed_event(event)

    def renderables(self, width: int = 100) -> list[Text]:
        v = self.view
        if v.run.shape is None:
            return []
        tr = strings("mesh", v.language)
        pp, dp, tp = v.shape
        head = Text(tr["title"].format(pp=pp, dp=dp, tp=tp, n=f.world_size(pp, dp, tp)), style="bold")
        return [head, Text(tr["rows"], style="grey50"), *v.grid_lines(max(20, min(width, 120))),
                *v.run_lines(tr, figures=not self.ended_ok)]


VISUALIZER = MeshVisualizer
