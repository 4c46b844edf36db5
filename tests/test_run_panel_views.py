"""What the run panel shows fits where it is shown: lesson 3's run timeline at the width it is given,
the experts view's capacity per layer and its latest step, rank 0's tables whole in the log, and the
check table's headers laid out as its rows are (issue: display defects at 80x24 and 120x40)."""
from __future__ import annotations

import asyncio

import pytest
from rich.console import Console
from textual.app import App
from textual.widgets import RichLog

from distai.lessons.checks import check
from distai.lessons.events import CHECK
from distai.lessons.lesson3.run_timeline import RunTimeline
from distai.lessons.registry import resolve_lesson
from distai.tutor.check_table import check_table
from distai.tutor.run_panel import RunPanelScreen, table_like
from distai.visualizers.experts import ExpertsVisualizer
from distai.visualizers.run_timeline import timeline_lines
from pilot_harness import scripted_launch

STEPS, EVERY, KILLED = 40, 5, 23  # the run lesson 3's text describes: rank 1 killed during step 23


def lesson3_events() -> list[dict]:
    """A 40-step lesson-3 run: a checkpoint every 5 steps, rank 1 killed in step 23, resumed from 20."""
    ev = [{"kind": "run_start", "run_id": "r3", "nproc": 2, "device": "cpu", "t": 0.0},
          {"kind": "phase", "name": "start", "n": 2, "attempt": 0, "rank": 0},
          {"kind": "phase", "name": "train", "steps": STEPS, "attempt": 0, "rank": 0}]
    for attempt, steps in ((0, range(KILLED - 1)), (1, range(4 * EVERY, STEPS))):
        if attempt:
            ev += [{"kind": "failure", "rank": 1, "step": KILLED, "phase": "step", "cause": "--kill-rank",
                    "attempt": 0},
                   {"kind": "phase", "name": "start", "n": 2, "attempt": 1, "rank": 0},
                   {"kind": "restart", "attempt": 1, "from_step": 4 * EVERY, "checkpoint": "step_00000020",
                    "skipped": [], "failed_rank": 1, "failed_step": KILLED, "lost_steps": 2, "restart_count": 1,
                    "load_s": 0.19}]
        for i in steps:
            ev.append({"kind": "step", "step": i, "of": STEPS, "loss": 4.0 - i / 40, "attempt": attempt,
                       "redo": attempt == 1 and i < KILLED - 1, "rank": 0})
            if (i + 1) % EVERY == 0:
                ev.append({"kind": "checkpoint", "step": i + 1, "bytes": 1_320_000, "seconds": 0.023,
                           "attempt": attempt})
    return ev


def timeline() -> RunTimeline:
    tl = RunTimeline()
    for e in lesson3_events():
        tl.feed(e)
    return tl


# ---- 1. lesson 3's run timeline scales to its width -------------------------------------------------------

@pytest.mark.parametrize("lang", ["en", "es"])
@pytest.mark.parametrize("width", [20, 30, 36, 40, 44, 56, 74, 80, 120])
def test_the_timeline_fits_the_width_it_is_given(width, lang):
    """At 120x40 the panel gave the timeline 40 columns for 40 steps: "try 1" alone on a line, its bars
    from column 0, "40" and the legend wrapped. Every line now fits; each row is its label and its bars."""
    lines = [line.plain for line in timeline_lines(timeline(), width, lang)]
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    label = "try" if lang == "en" else "int."
    rows = [line for line in lines if line.startswith(label)]
    assert [row.split()[1] for row in rows] == ["0", "1"]
    assert "✕" in rows[0] and "↻" in rows[1] and "◆" in rows[1]
    axis = lines[lines.index(rows[-1]) + 1]
    assert axis.split()[0] == "1" and axis.index("1") == len(label) + 3  # under the first cell


def test_steps_get_equal_cells_or_cells_equal_steps():
    """Between two checkpoints the steps got 3, 3, 4, 3 cells; now one cell count for every step, or,
    where 40 steps do not fit, one step count per cell, which the legend says."""
    wide = [line.plain for line in timeline_lines(timeline(), 80, "en")]
    row = wide[1][len("try 0 "):]
    gaps = [b - a for a, b in zip([i for i, ch in enumerate(row) if ch == "◆"],
                                  [i for i, ch in enumerate(row) if ch == "◆"][1:])]
    assert gaps and len(set(gaps)) == 1, row
    assert wide[3].split() == ["1", "10", "20", "30", "40"]
    narrow = [line.plain for line in timeline_lines(timeline(), 40, "en")]
    assert any("a cell: 2 steps" in line for line in narrow)
    assert narrow[3].split()[-1] == "40"
    assert not any("a cell" in line for line in wide)
    assert "✕ failure" in "\n".join(narrow)  # never "✕" at a line's end, "failure" on the next


def test_the_run_panels_side_panel_gives_the_timeline_its_forty_columns():
    """The finished run's panel at 120x40: the visualizer is at least 40 columns inside, and the
    timeline it draws there is one line per row."""

    async def scenario():
        app = PanelApp(lambda: RunPanelScreen(resolve_lesson("lesson3"), "en", launch_factory=scripted_launch(lesson3_events())))
        async with app.run_test(size=(120, 40)) as pilot:
            await finished(pilot, app)
            v = app.screen.visualizer
            return v.content_size.width, [line.plain for line in v.build_lines(v.content_size.width, 60)]

    width, lines = asyncio.run(scenario())
    assert width >= 40
    assert all(len(line) <= width for line in lines)
    rows = [line for line in lines if line.startswith("try ")]
    assert len(rows) == 2 and "↻" in rows[1] and "◆" in rows[1]


# ---- 2. the experts view: capacity per layer, the latest step ---------------------------------------------

def experts_events(steps: int = 3, layers: int = 2) -> list[dict]:
    ev = [{"kind": "run_start", "run_id": "e"},
          {"kind": "moe_config", "experts": 8, "ep": 4, "top_k": 2, "capacity": 80, "rank": 0}]
    for s in range(steps):
        for layer in range(layers):
            routed = [60 + 10 * s + layer] + [64] * 6 + [64 - 10 * s - layer]
            kept = [min(r, 80) for r in routed]
            ev.append({"kind": "moe_load", "step": s, "layer": layer, "routed": routed, "kept": kept,
                       "capacity": 80, "sent": [[40 + s, 30, 30, 30]] * 4, "rank": 0})
    return ev


def test_the_experts_view_gives_the_capacity_of_one_layer():
    """"capacity 160 per expert" while the log says "at most 80 choices per expert": 80 per layer, the
    histogram's line at 2 × 80 where the 2 layers' bars add up."""
    v = ExpertsVisualizer("en")
    for e in experts_events():
        v.feed_event(e)
    text = "\n".join(line.plain for line in v.build_lines(100))
    assert "capacity 80 per expert and layer" in text and "160" not in text
    v.seek(1)
    text = "\n".join(line.plain for line in v.build_lines(100))
    assert "all 2 layers summed: │ at 2 × 80 = 160" in text
    es = ExpertsVisualizer("es")
    for e in experts_events():
        es.feed_event(e)
    assert "capacidad 80 por experto y capa" in es.build_lines(100)[0].plain
    one = ExpertsVisualizer("en")
    for e in experts_events(layers=1):
        one.feed_event(e)
    assert "capacity 80 per expert ·" in one.build_lines(100)[0].plain


def test_the_experts_view_follows_the_runs_latest_step_unless_stepped_back():
    """After the run it still showed "step 1/12" and step 1's drops while the log gave the last step's."""
    v = ExpertsVisualizer("en")
    events = experts_events(steps=3)
    for e in events:
        v.feed_event(e)
    assert "(run, step 3/3, all layers)" in v.build_lines(100)[0].plain
    last = v.run.loads[-1]
    drops = sum(last.routed) - sum(last.kept)
    assert f"dropped: {drops} choices" in "\n".join(line.plain for line in v.build_lines(100))
    v.rewind()  # the learner steps back to the first step: a new step does not pull them away
    v.feed_event({**events[-1], "step": 3, "layer": 0})
    assert "(run, step 1/4, all layers)" in v.build_lines(100)[0].plain
    v.to_end()
    v.feed_event({**events[-1], "step": 4, "layer": 0})
    assert "step 5/5" in v.build_lines(100)[0].plain


@pytest.mark.parametrize("width", [40, 56, 80])
def test_the_dispatch_rows_fit_the_width(width):
    """At 120x40 each rank's row wrapped its "182 leave" onto a line of its own."""
    v = ExpertsVisualizer("en")
    for e in experts_events():
        v.feed_event(e)
    rows = [line.plain for line in v.build_lines(width) if line.plain.startswith("R")]
    assert len(rows) == 4 and all(len(row.rstrip()) <= width for row in rows), rows


# ---- 3. rank 0's tables whole in the log ------------------------------------------------------------------

LESSON2 = ["lección 2: 232.576 parámetros, 4 ranks, fp32, adam, 4 pasos",
           "         estados del modelo    bytes enviados por paso",
           "         medido    calc. rel.    medido    calc. rel.     paso  max|Δw|",
           "ddp     3,72 MB  3,72 MB 1,00    1,4 MB   1,4 MB 1,00     57ms  6,9e-6",
           "fsdp2    931 kB   930 kB 1,00   2,79 MB  2,09 MB 1,33    158ms  6,9e-6",
           "max|Δw|: mayor diferencia con un solo proceso sobre el batch entero",
           "paso: la mediana de los pasos del rank 0; las comprobaciones del tiempo de paso miden el paso menos "
           "perturbado del rank más lento"]
LESSON7 = ["  prefill 128 tok 12,5 ms, 148 tok 13,9 ms; paso de decode b=1 3,2 ms, b=16 7,8 ms",
           "  política           TTFT p50/p99 ms TPOT p50/p99 ms tokens/s acier.",
           "  round-robin              21,3/79,8       10,5/21,1    3.057  46 %",
           "  prefix-aware             14,6/37,1        6,3/13,3    3.104  83 %"]


def test_table_rows_are_told_from_prose():
    assert [table_like(line) for line in LESSON2] == [False, True, True, True, True, False, False]
    assert [table_like(line) for line in LESSON7] == [False, True, True, True]
    assert not table_like("  sync:  42.3 ms/step, a save blocks 69.2 ms, +96.6 ms per checkpoint")
    assert table_like("  a  b", after_table=True) and table_like("│ x │ y │")


def test_the_logs_tables_are_not_wrapped_mid_row_and_its_prose_is():
    """At 80x24 lesson 2's max|Δw| column fell under each row and lesson 7's "acier." column was cut:
    a table's rows are written whole (the log scrolls sideways), its prose still wraps at 76 columns."""
    lines = LESSON2 + LESSON7
    events = [{"kind": "run_start", "run_id": "r", "nproc": 2, "device": "cpu", "t": 0.0}]
    events += [{"kind": "output", "rank": 0, "line": line, "t": 0.1} for line in lines]

    async def scenario():
        app = PanelApp(lambda: RunPanelScreen(resolve_lesson("lesson2"), "es", launch_factory=scripted_launch(events)))
        async with app.run_test(size=(80, 24)) as pilot:
            await finished(pilot, app)
            log = app.screen.query_one("#run-log", RichLog)
            return log.scrollable_content_region.width, [strip.text.rstrip() for strip in log.lines]

    width, drawn = asyncio.run(scenario())
    for line in lines:
        if table_like(line):
            assert any(text.endswith(line.rstrip()) for text in drawn), line  # one line, whole
    assert any(len(text) > width for text in drawn)  # wider than the log: it scrolls
    prose = [text for text in drawn if "perturbado" in text or "mediana" in text]
    assert prose and all(len(text) <= width for text in prose)
    assert not any(text.strip() in ("max|Δw|", "acier.", "6,9e-6") for text in drawn)


# ---- 4. the check table's headers follow its rows' layout -------------------------------------------------

def _exposed(rank: int) -> dict:
    c = check("exposed_comm", 0.004, 0.012, "s", causes={"peer_wait": 0.003, "cpu_contention": 0.004})
    return {**CHECK.event(c.event()), "rank": rank, "t": 1.0}


def test_the_check_tables_name_header_stays_when_names_go_on_their_own_line():
    """Lesson 6 at 80x24: "  previsto   medido  diferencia  veredicto" without "comprobación" once each
    name went on its own line: the header is laid out as the rows are, the name's title above."""
    events = [_exposed(0), _exposed(1), {**_exposed(2), "measured": 0.02}]
    console = Console(width=76, record=True, file=open("/dev/null", "w"))
    console.print(check_table(events, "es"))
    lines = console.export_text().rstrip("\n").split("\n")
    assert lines[0] == "predicción frente a medida"
    assert lines[1] == "comprobación"
    assert lines[2].split() == ["previsto", "medido", "diferencia", "veredicto"]
    assert lines[3].startswith("comunicación expuesta tras el backward")
    assert all(len(line) <= 76 for line in lines)
    wide = Console(width=140, record=True, file=open("/dev/null", "w"))
    wide.print(check_table(events, "es"))
    head = wide.export_text().split("\n")[1]
    assert head.split()[0] == "comprobación" and head.split()[-1] == "veredicto"  # one line when rows are


# ---- the panel, scripted -----------------------------------------------------------------------------------

class PanelApp(App):
    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def on_mount(self):
        self.push_screen(self.factory())


async def finished(pilot, app) -> None:
    for _ in range(100):
        await pilot.pause(0.05)
        if app.screen.state.finished:
            break
    await pilot.pause(0.3)



# ---- 5. v: the visualizer first ------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
def test_v_puts_the_visualizer_first_once_a_summary_took_the_screen(size):
    """The capstone's summary (30 lines of rank 0's output) grew the log until the visualizer kept 4 rows at
    120x40 ("25 more lines: a taller terminal shows them"), and at 80x24 it is hidden: v gives it the screen
    and leaves the log a few rows; v again gives the summary its room back."""
    lines = [f"  line {i}: summary" for i in range(40)]
    events = [{"kind": "run_start", "run_id": "r", "nproc": 8, "device": "cpu", "t": 0.0}]
    events += [{"kind": "output", "rank": 0, "line": line, "t": 0.1} for line in lines]

    async def scenario():
        app = PanelApp(lambda: RunPanelScreen(resolve_lesson("capstone"), "en",
                                              launch_factory=scripted_launch(events)))
        async with app.run_test(size=size) as pilot:
            await finished(pilot, app)
            screen = app.screen
            visual, log = screen.query_one("#run-visual"), screen.query_one("#run-log", RichLog)
            before = (visual.display and visual.outer_size.height, log.outer_size.height)
            await pilot.press("v")
            await pilot.pause(0.3)
            first = (visual.display, visual.outer_size.height, log.outer_size.height)
            await pilot.press("v")
            await pilot.pause(0.3)
            return before, first, log.outer_size.height

    (visual_before, log_before), (shown, visual_first, log_first), log_back = asyncio.run(scenario())
    height = size[1]
    assert log_before > height // 2  # the summary took the screen
    assert shown and visual_first >= height - 7 - 6 and log_first == 7  # title, status, footer and the log
    assert log_back == log_before and (visual_before or 0) < visual_first


def test_the_visualizers_keys_work_in_the_run_panel_and_the_panels_stay_its_own():
    """The run panel's visualizer drew "g next view · m next mesh shape" but the log had the focus and the
    keys went nowhere: keys nothing else takes go to the visualizer (as on the lesson screen), s stays Stop
    (the mesh's s, next tab, is left to it), and ? lists the visualizer's keys too."""
    from distai.tutor.screens.help import HelpScreen

    events = [{"kind": "run_start", "run_id": "r", "nproc": 8, "device": "cpu", "t": 0.0}]

    async def scenario():
        app = PanelApp(lambda: RunPanelScreen(resolve_lesson("capstone"), "en",
                                              launch_factory=scripted_launch(events)))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            screen = app.screen
            mesh = screen.visualizer
            seen = [mesh.view]
            await pilot.press("g")
            await pilot.pause(0.1)
            seen.append(mesh.view)
            tab = mesh.tab
            await pilot.press("s")
            await pilot.pause(0.1)
            await pilot.press("question_mark")
            await pilot.pause(0.2)
            help_text = " ".join(str(row) for row in app.screen.visualizer_keys) \
                if isinstance(app.screen, HelpScreen) else ""
            return seen, tab, mesh.tab, help_text

    seen, tab_before, tab_after, help_text = asyncio.run(scenario())
    assert seen == ["step", "groups"] and tab_after == tab_before
    assert "next mesh shape" in help_text
    # the mesh's s (next tab) and a (next axes) are the panel's Stop and Run again here: not listed as its keys
    assert "next slice" not in help_text and "two axes" not in help_text
