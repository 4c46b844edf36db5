"""The capstone's visualizer: the ranks of a (pp, dp, cp, tp) device mesh with experts inside dp·cp,
and which group talks when.

Each pipeline stage is a block; inside it two of the other axes are laid out, rows and columns (``a``
picks which: DP × TP, DP × CP or CP × TP), and the third is a tab (``s`` steps through its slices);
each cell is a global rank (``rank = ((p·dp + d)·cp + c)·tp + t``, :class:`~distai.lessons.capstone
.mesh_run.Layout`). Every group is a colour: TP, PP, DP (the dp·cp ranks that reduce gradients), CP,
EP (inside dp·cp) and EDP. Views (``g``):

- **step**: the phases of one step played in turn (:func:`~distai.lessons.capstone.mesh_run.step_phases`):
  TP groups light up inside the stage computing, CP rings and EP all-to-alls inside it, PP pairs between
  two stages as activations go forward and gradients come back, DP groups at the end;
- **groups**: one rank's groups at once (``,`` ``.`` pick the rank);
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
from ..lessons.capstone.events import MESH_CONFIG
from ..lessons.capstone.mesh_run import Layout, MeshRun, Phase, step_phases
from ..lessons.events import RUN_END, RUN_START
from ..lessons.strings import strings
from .base import NEXT_VIEW, PLAY, Control
from .playback import PlaybackVisualizer
from .ring_drawing import wrap_text

#: the lesson's 8-rank CPU run (run-it's first command, the groups step's rank 5): pp = dp = cp = ep = 2, tp = 1
LESSON_RUN = Layout(2, 2, 1, cp=2, ep=2, moe=True)
#: the capstone's test meshes: the 3D ones (pp, dp, tp), then five axes (pp, dp, tp, cp, ep, experts)
SHAPES = (Layout(2, 2, 2), Layout(1, 2, 4), Layout(4, 1, 2), Layout(2, 4, 1), Layout(2, 1, 2, cp=2),
          LESSON_RUN, Layout(2, 4, 1, ep=4, moe=True), Layout(1, 2, 2, cp=2, ep=2, moe=True))
#: the pairs of axes a stage's block can lay out as rows × columns (the third is a tab)
AXIS_PAIRS = (("dp", "tp"), ("dp", "cp"), ("cp", "tp"))
ORDER_SHAPE = Layout(2, 2, 2)  # the order step's mesh: TP (and DP) inside a node of 4, PP across the two
GPUS_PER_NODE = 4  # small nodes, so that the 8-rank mesh spans two
COLOURS = {"tp": "black on #59a14f", "pp": "black on #b07aa1", "dp": "black on #edc948", "cp": "black on #76b7b2",
           "ep": "black on #ff9da7", "edp": "black on #9c755f", "moe": "black on #bab0ac"}
NODE_COLOURS = ("black on #4e79a7", "black on #f28e2b", "black on #76b7b2", "black on #ff9da7")
DIM_STYLE = "grey42"


def phase_text(phase: Phase, tp: int, dp: int, tr: Mapping, cp: int = 1) -> str:
    s = phase.stages
    if phase.what in ("forward", "backward"):
        return tr[phase.what + ("" if tp > 1 else "1")].format(s=s[0])
    if phase.what in ("send", "send-grad"):
        return tr[phase.what].format(a=s[0], b=s[1])
    if phase.what in ("ring", "ring-grad", "dispatch", "dispatch-grad"):
        return tr[phase.what].format(s=s[0])
    if phase.what == "reduce":
        return tr["reduce" if dp * cp > 1 and cp == 1 else "reduce_cp" if dp * cp > 1 else "reduce1"]
    return tr[phase.what if phase.what == "reduce-experts" else "update"]


def default_axes(layout: Layout) -> int:
    """The pair of axes laid out first: the two that leave a tab of one slice, if any do."""
    sizes = {"dp": layout.dp, "cp": layout.cp, "tp": layout.tp}
    for i, pair in enumerate(AXIS_PAIRS):
        if all(sizes[a] == 1 for a in sizes if a not in pair):
            return i
    return 0


def rows_taken(lines: list[Text], width: int) -> int:
    """The rows ``lines`` take in ``width`` columns, each wrapped at word boundaries."""
    return sum(len(wrap_text(ln, width)) for ln in lines)


class MeshVisualizer(PlaybackVisualizer):
    """The mesh with the groups that talk in each phase of a step."""

    can_focus = True
    DEFAULT_CLASSES = "panel"
    VIEWS = ("step", "groups", "nodes", "run")
    STEP_SETTINGS = frozenset({"show", "mesh"})
    TICK_S = 0.1
    CONTROLS = (
        NEXT_VIEW,
        Control("m", "next_mesh", "mesh.next_mesh", hint=True),
        Control("a", "next_axes", "mesh.axes"),
        Control("s", "next_tab", "mesh.tab"),
        PLAY,
        Control("full_stop", "step(1)", "mesh.phase",
                back_keys="comma", back_action="step(-1)", hint=True),
        Control("0", "restart", "visualizer.restart"),
    )
    SECONDS_PER_PHASE = 1.2

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.shape: Layout = SHAPES[0]
        self.axes = default_axes(self.shape)  # index into AXIS_PAIRS
        self.tab = 0  # the slice shown of the axis not laid out
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
        m = self.shape
        return step_phases(m.pp, m.dp, m.tp, m.cp, m.ep, m.moe)

    def current_phase(self) -> Phase | None:
        phases = self.phases()
        return phases[self.frame % len(phases)] if phases else None

    def tab_axis(self) -> str:
        rows, cols = AXIS_PAIRS[self.axes]
        return next(a for a in ("dp", "cp", "tp") if a not in (rows, cols))

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
            self.rank = (self.rank + frames) % self.shape.world
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
            self.set_shape(LESSON_RUN)  # the mesh the step's command runs
            self.ask_for_the_latest_run()  # the latest run, if there is one
        self.view, self.frame = view, 0
        if view == "groups":
            self.set_shape(LESSON_RUN)  # the text's rank 5 is the lesson run's
            self.rank = min(5, self.shape.world - 1)
        elif view == "nodes":
            self.set_shape(ORDER_SHAPE)
        elif self.step_view(step_key).get("show") == "step":  # the same mesh however one came here: the first
            # that m cycles from, or (mesh = "lesson") the lesson's five-axis run, whose every group talks
            self.set_shape(LESSON_RUN if self.step_view(step_key).get("mesh") == "lesson" else SHAPES[0])
        self.refresh()

    def feed_event(self, event: dict) -> None:
        if not self.run.feed(event):
            return
        if MESH_CONFIG.matches(event) and self.run.layout:
            self.set_shape(self.run.layout)
            self.view = "run"
        self.refresh()

    def set_shape(self, layout: Layout) -> None:
        self.shape, self.axes, self.tab, self.frame = layout, default_axes(layout), 0, 0
        self.rank = min(self.rank, layout.world - 1)

    # -- actions ----------------------------------------------------------------------------------
    def views_available(self) -> tuple[str, ...]:
        return tuple(v for v in self.VIEWS if v != "run" or self.run.shape is not None)

    def action_view(self, view: str) -> None:
        self.frame = 0
        super().action_view(view)

    def action_next_mesh(self) -> None:
        i = SHAPES.index(self.shape) if self.shape in SHAPES else -1
        self.set_shape(SHAPES[(i + 1) % len(SHAPES)])
        if self.view == "run":
            self.view = "step"
        self.refresh()

    def action_next_axes(self) -> None:
        """Lay out the next pair of axes; the one left becomes the tab."""
        self.axes, self.tab = (self.axes + 1) % len(AXIS_PAIRS), 0
        self.refresh()

    def action_next_tab(self) -> None:
        size = getattr(self.shape, self.tab_axis())
        self.tab = (self.tab + 1) % size
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------------
    def cell_styles(self) -> dict[int, str]:
        """Style of each rank's cell in the current view."""
        m = self.shape
        n = m.world
        if self.view == "nodes":
            return {r: NODE_COLOURS[(r // GPUS_PER_NODE) % len(NODE_COLOURS)] for r in range(n)}
        if self.view == "groups":
            r = min(self.rank, n - 1)
            out = {}
            for dim in ("dp", "pp", "cp", "ep", "tp"):  # TP last: the rank itself shows its TP colour
                if m.size(dim) > 1:
                    out.update({other: COLOURS[dim] for other in m.group(r, dim)})
            out[r] = "bold white on #e15759"
            return out
        phase = self.current_phase()
        on = set() if phase is None else {x for x in range(n) if m.coords(x)["pp"] in phase.stages}
        if phase is None or not phase.dim:
            return {x: "bold" for x in on}
        return {x: COLOURS[phase.dim] for x in on}

    def grid_lines(self, width: int) -> list[Text]:
        m = self.shape
        tr = strings("mesh", self.language)
        styles = self.cell_styles()
        rows, cols = AXIS_PAIRS[self.axes]
        n_rows, n_cols, tab = getattr(m, rows), getattr(m, cols), self.tab_axis()
        cell = 5  # " r12 "
        block_w = max(n_cols * cell, len(tr["stage"].format(s=m.pp - 1))) + 2
        per_row = max(1, min(m.pp, (width + 1) // (block_w + 1)))
        lines: list[Text] = []
        for first in range(0, m.pp, per_row):
            stages = range(first, min(m.pp, first + per_row))
            head = Text()
            for s in stages:
                head.append(tr["stage"].format(s=s).ljust(block_w) + " ", style="bold")
            lines.append(head)
            for i in range(n_rows):
                row = Text()
                for s in stages:
                    row.append("│")
                    for j in range(n_cols):
                        r = m.rank_at(**{"pp": s, rows: i, cols: j, tab: min(self.tab, getattr(m, tab) - 1)})
                        row.append(f" r{r:<2} ", style=styles.get(r, DIM_STYLE))
                    row.append(" " * (block_w - 2 - n_cols * cell) + "│ ")
                lines.append(row)
        return lines

    def axes_lines(self, tr: Mapping) -> list[Text]:
        """What the rows and columns are, and the tab (the slice shown of the third axis)."""
        rows, cols = AXIS_PAIRS[self.axes]
        tab = self.tab_axis()
        size = getattr(self.shape, tab)
        if (rows, cols) == ("dp", "tp") and size == 1:
            return [Text(tr["rows"], style="grey50")]
        out = [Text(tr["rows_axes"].format(rows=tr["axes"][rows], cols=tr["axes"][cols]), style="grey50")]
        if size > 1:
            line = Text(tr["tab"].format(axis=tr["axes"][tab]) + " ", style="grey50")
            for i in range(size):
                line.append(f" {i} ", style="reverse" if i == self.tab else "")
            out.append(line)
        return out

    def caption(self, tr: Mapping) -> list[Text]:
        m = self.shape
        if self.view == "groups":
            r = min(self.rank, m.world - 1)
            c = m.coords(r)
            key = "groups5" if m.five_d else "groups"
            out = [Text(tr[key].format(r=r, p=c["pp"], d=c["dp"], t=c["tp"], c=c["cp"], e=c["ep"]), style="bold")]
            if m.five_d:  # groups may cover the same ranks (EP = CP here): each by its ranks
                line = Text()
                for dim in ("tp", "pp", "dp", "cp", "ep", "edp"):
                    if m.size(dim) > 1:
                        label = "DP·CP" if dim == "dp" and m.cp > 1 else dim.upper()
                        line.append(f"{label} ", style=COLOURS[dim].replace("black on ", ""))
                        line.append("{" + " ".join(map(str, m.group(r, dim))) + "}  ")
                out.append(line)
            return out + [self.legend(tr)]
        if self.view == "nodes":
            def spans(dim: str) -> int:
                return len({x // GPUS_PER_NODE for x in m.group(0, dim)})
            return [Text(tr["nodes"].format(g=GPUS_PER_NODE, dpn=spans("dp"), ppn=spans("pp")))]
        phases = self.phases()
        if not phases:
            return []
        i = self.frame % len(phases)
        phase = phases[i]
        text = Text(tr["phase"].format(i=i + 1, n=len(phases)) + ": ", style="bold")
        text.append(phase_text(phase, m.tp, m.dp, tr, m.cp))
        if self.view == "run":
            text.append(tr["mb"].format(mb=phase.microbatch))
            if phase.t0 is not None:
                text.append(tr["at"].format(t=units.format_time(phase.t0, lang=self.language)))
        return [text, self.group_line(phase, width=None), self.legend(tr)]

    def group_line(self, phase: Phase, width: int | None) -> Text:
        """The groups that talk in ``phase``, by their ranks: TP groups {4 5}, PP pairs 0→4, DP groups {0 2}."""
        m = self.shape
        if not phase.dim:
            return Text("")
        on = [r for r in range(m.world) if m.coords(r)["pp"] in phase.stages]
        if phase.dim == "pp":
            a, b = phase.stages
            body = "  ".join(f"{r}→{m.group(r, 'pp')[b]}" for r in on if m.coords(r)["pp"] == a)
        else:
            seen: list[tuple[int, ...]] = []
            for r in on:
                g = tuple(m.group(r, phase.dim))
                if g not in seen:
                    seen.append(g)
            body = "  ".join("{" + " ".join(map(str, g)) + "}" for g in seen)
        return Text(f"{phase.dim.upper()}: {body}", style=COLOURS[phase.dim].replace("black on ", ""))

    def legend(self, tr: Mapping) -> Text:
        out = Text()
        key = ("legend5_experts" if self.shape.moe else "legend5") if self.shape.five_d else "legend"
        parts = tr[key].split("{")
        out.append(parts[0])
        for part in parts[1:]:
            key, rest = part.split("}", 1)
            out.append("  ", style=COLOURS[key])
            out.append(rest)
        return out

    def title(self, tr: Mapping) -> Text:
        m = self.shape
        if m.five_d:
            return Text(tr["title5"].format(pp=m.pp, dp=m.dp, cp=m.cp, tp=m.tp, ep=m.ep, n=m.world), style="bold")
        return Text(tr["title"].format(pp=m.pp, dp=m.dp, tp=m.tp, n=m.world), style="bold")

    def run_lines(self, tr: Mapping, figures: bool = True) -> list[Text]:
        """The run's coordinates check, and with ``figures`` its loss against one process and each
        stage's bytes per group against the formulas."""
        run = self.run
        if run.shape is None:
            return [Text(tr["waiting"], style="italic")]
        out: list[Text] = []
        if run.latest_complete_step() is None:
            lay = run.layout or Layout(*run.shape)  # a shape alone: (pp, dp, tp), cp 1
            shape = f"({lay.pp}, {lay.dp}, {lay.cp}, {lay.tp})" + (f" · ep {lay.ep}" if lay.ep > 1 else "")
            out.append(Text(tr["waiting_step"].format(shape=shape), style="italic"))
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
            out.append(Text(tr["loss"].format(step=s["step"] + 1, loss=loss(s["loss"]), ref=loss(s["ref_loss"]),
                                              dl=diff(s["loss_rel_diff"]), dp=diff(s["param_rel_diff"]))))
        comm = run.comm_by_stage()
        if comm:
            out.append(Text(tr["comm_head"], style="bold"))
            for stage, dims in comm.items():
                for dim, c in dims.items():
                    bytes_ = (f"{units.format_bytes(c['bytes'], binary=True, lang=self.language)}/"
                              f"{units.format_bytes(c['expected_bytes'], binary=True, lang=self.language)}")
                    row = Text(f"{stage:>2} ")
                    row.append(f" {dim:<3}", style=COLOURS[dim])
                    row.append(f" {bytes_:>19} {c['calls']:>5} {'✓' if c['match'] else '✗'}")
                    out.append(row)
        return out

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        tr = strings("mesh", self.language)
        head = self.title(tr)
        head.append("  [" + tr["views"][self.view] + "]", style="cyan")
        axes = self.axes_lines(tr)
        lines = [head, *axes]
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
            for drop in (axes[0].plain, legend, group):
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
            return wrap_text(self.more_lines_mark(n), width)

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
        return [v.title(tr), *v.axes_lines(tr), *v.grid_lines(max(20, min(width, 120))),
                *v.run_lines(tr, figures=not self.ended_ok)]


VISUALIZER = MeshVisualizer
