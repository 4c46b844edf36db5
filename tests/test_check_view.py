"""The one view of a run's checks (lessons/check_view.py, tutor/check_table.py): rows translated and
formatted, the same in distai run's summary and the run panel."""
from __future__ import annotations

from rich.console import Console

from distai.engine.run_state import RunState
from distai.lessons.check_view import check_headers, check_lines, check_rows, format_value
from distai.lessons.checks import check, reconcile
from distai.lessons.events import CHECK, STEP
from distai.tutor.check_table import check_table
from pilot_harness import scripted_launch


def _event(c, rank=0):
    return {**CHECK.event(c.event()), "rank": rank, "t": 1.0}


def _bubble():  # formula 20 %, measured 36 %: 9 points of unequal stages, 6 of communication
    return check("bubble_gpipe", 0.20, 0.36, "fraction", causes={"unequal_stages": 0.09, "communication": 0.06})


def test_a_missed_prediction_shows_its_causes_and_what_they_leave_unexplained():
    (row,) = check_rows([_event(_bubble()), STEP.event({"step": 0, "of": 1})], "en")
    assert row.cells() == ("bubble, GPipe", "20%", "36%", "+16.0 pts", "explained")
    assert row.causes == "unequal stages +9.0 pts + communication +6.0 pts"
    assert row.explanation == "= 20% + unequal stages +9.0 pts + communication +6.0 pts = 35%; unexplained +1.0 pts"
    assert not row.ok and row.explained  # 0.20 + 0.15 = 0.35, within 10 % of 0.36


def test_a_missed_decomposition_is_broken_down_not_explained():
    """Causes that are the measurement's own parts (lesson 1's ring: on a core, waiting for one, asleep) add
    up to it by construction: a miss reads "broken down" into them, never "explained", which they could not
    fail to be; a decomposition whose parts do not add up (a clamped part) reads as any other check."""
    parts = check("allreduce_large", 0.010, 0.025, "s", causes={"reduction": 0.004, "cpu_contention": 0.011},
                  decomposition=True)
    (row,) = check_rows([_event(parts)], "en")
    assert row.verdict == "broken down" and not row.ok and row.explained
    assert row.explanation == ("= 10 ms + reduction arithmetic +4 ms + CPU contention +11 ms = 25 ms "
                               "(the measurement's own parts, timed together)")
    (es,) = check_rows([_event(parts)], "es")
    assert es.verdict == "desglosado" and es.explanation.endswith("(las partes de la propia medida, cronometradas juntas)")
    assert reconcile(_event(parts)).decomposition  # carried by the event
    short = check("allreduce_large", 0.010, 0.025, "s", causes={"reduction": 0.004}, decomposition=True)
    (row,) = check_rows([_event(short)], "en")
    assert row.verdict == "NOT explained" and "unexplained +11 ms" in row.explanation
    assert check_rows([_event(check("allreduce_large", 0.010, 0.0105, "s", decomposition=True))], "en")[0].verdict == "ok"


def test_spanish_rows_use_the_decimal_comma_and_the_catalog():
    c = check("bubble_1f1b", 0.273, 0.5, "fraction", causes={"cpu_contention": 0.05})
    (row,) = check_rows([_event(c)], "es")
    assert row.label == "burbuja, 1F1B" and row.predicted == "27,3 %"
    assert row.causes == "CPU compartida +5,0 p. p." and row.verdict == "SIN explicar"
    assert row.explanation.endswith("= 32,3 %; sin explicar +17,7 p. p.")
    assert check_headers("es")[0] == "comprobación"


def test_units_are_formatted_by_lessons_units():
    assert format_value(0.0015, "s", "en") == "1.5 ms"
    assert format_value(3e6, "B", "es") == "3 MB"  # decimal, as lesson 2's formulas and calculator
    assert format_value(-0.0005, "s", "en", signed=True) == "-500 µs"
    assert format_value(1.5, "ratio", "es") == "1,50×"


def test_one_row_per_name_and_rank_the_latest_event_wins():
    ok = check("bubble_gpipe", 0.2, 0.21, "fraction")
    rows = check_rows([_event(_bubble(), 0), _event(ok, 0), _event(_bubble(), 1)], "en")
    assert [r.label for r in rows] == ["bubble, GPipe (rank 0)", "bubble, GPipe (rank 1)"]
    assert rows[0].ok and rows[0].causes == "—" and rows[0].verdict == "ok"
    lines = check_lines([_event(ok), _event(_bubble(), 1)], "en")
    assert lines[0] == "prediction vs measurement" and lines[1].split()[0] == "check"
    assert len({len(line) for line in lines[1:4]}) == 1  # aligned columns
    assert lines[4].startswith("  = 20% + unequal stages") and len(lines) == 5


def test_ranks_whose_rows_read_alike_share_one_row():
    """Lesson 2 on 4 ranks listed 40 rows: each strategy's memory and step time once per rank, alike."""
    ok, close = check("bubble_gpipe", 0.2, 0.21, "fraction"), check("bubble_gpipe", 0.2, 0.2101, "fraction")
    other = check("bubble_gpipe", 0.2, 0.25, "fraction")
    rows = check_rows([_event(ok, 0), _event(close, 1), _event(ok, 2), _event(ok, 3), _event(other, 4)], "en")
    assert [r.label for r in rows] == ["bubble, GPipe (ranks 0–3)", "bubble, GPipe (rank 4)"]  # 21.01 % shows as 21 %
    rows = check_rows([_event(ok, 0), _event(other, 1), _event(ok, 2)], "es")
    assert [r.label for r in rows] == ["burbuja, GPipe (ranks 0, 2)", "burbuja, GPipe (rank 1)"]
    assert [r.label for r in check_rows([_event(ok, 0)], "en")] == ["bubble, GPipe"]  # one rank: no label


def test_a_table_wider_than_its_column_puts_each_name_on_a_line_of_its_own():
    """The run panel's check table sits in half the screen: at 100 columns its rows wrapped mid-row."""
    ok = check("bubble_gpipe", 0.2, 0.21, "fraction")
    events = [_event(ok, 0), _event(_bubble(), 1)]
    wide = check_lines(events, "es")
    assert check_lines(events, "es", width=max(map(len, wide))) == wide
    narrow = check_lines(events, "es", width=44)
    labels = [r.label for r in check_rows(events, "es")]
    assert narrow[2] == labels[0] and narrow[4] == labels[1] and narrow[6].startswith("  = 20 %")
    assert all(len(line) <= 44 for line in narrow[:6]), narrow
    assert narrow[3].split() == ["20", "%", "21", "%", "+1,0", "p.", "p.", "ok"]
    assert len({len(line) for line in narrow[1:6:2]}) == 1  # numbers under their headers
    console = Console(width=44, record=True, file=open("/dev/null", "w"))
    console.print(check_table(events, "es"))
    # the table the run panel draws: the names' header on its own line too, above the numbers' headers
    assert console.export_text().rstrip("\n").split("\n")[:7] == [narrow[0], "comprobación", *narrow[1:6]]


def test_a_missed_checks_causes_wrap_under_their_own_indent():
    long = check("bubble_gpipe", 0.2, 0.9, "fraction", causes={f"cause_{i}": 0.05 for i in range(8)})
    console = Console(width=60, record=True, file=open("/dev/null", "w"))
    console.print(check_table([_event(long)], "en"))
    lines = console.export_text().rstrip("\n").split("\n")
    explanation = lines[3:]
    assert len(explanation) > 1 and all(line.startswith("  ") for line in explanation), lines
    assert " ".join(line.strip() for line in explanation) == check_rows([_event(long)], "en")[0].explanation


def test_distai_run_summary_and_the_run_panel_draw_the_same_table():
    from distai.tutor.cli_run import render_state

    state = RunState()
    for e in ({"kind": "run_start", "run_id": "r", "nproc": 2, "t": 0.0}, _event(_bubble())):
        state.feed(e)
    assert check_table([], "en") is None
    console = Console(width=140, record=True)
    console.print(render_state(state))
    text = console.export_text()
    assert "prediction vs measurement" in text and "unequal stages +9.0 pts" in text and "explained" in text


def test_the_run_panel_draws_the_same_table_in_the_learners_language():
    import asyncio

    from textual.app import App
    from textual.widgets import Static

    from distai.lessons.registry import resolve_lesson
    from distai.tutor.run_panel import RunPanelScreen

    class PanelApp(App):
        def on_mount(self):
            self.push_screen(RunPanelScreen(resolve_lesson("lesson5"), "es", launch_factory=scripted_launch([
                {"kind": "run_start", "run_id": "fake", "nproc": 2, "device": "cpu", "t": 0.0}, _event(_bubble())])))

    async def scenario():
        app = PanelApp()
        async with app.run_test(size=(140, 45)) as pilot:
            for _ in range(60):
                await pilot.pause(0.05)
                if app.screen.state.finished:
                    break
            await pilot.pause(0.2)
            console = Console(width=120, record=True, file=open("/dev/null", "w"))
            console.print(app.screen.query_one("#check-table", Static).content)
            return console.export_text()

    text = asyncio.run(scenario())
    assert "predicción frente a medida" in text and "etapas desiguales +9,0 p. p." in text
    assert "\n".join(check_lines([_event(_bubble())], "es")) in "\n".join(line.rstrip() for line in text.splitlines())


def test_a_floats_rounding_residue_is_not_left_unexplained():
    """'= 3,19 ms; sin explicar +4,34e-19 s': causes that add up to the measurement leave 0 unexplained."""
    from distai.lessons.checks import Check

    c = Check("t", predicted=0.1e-3, measured=3.19e-3, unit="s", causes={"a": 1.1e-3, "b": 1.99e-3})
    assert c.measured - (c.predicted + sum(c.causes.values())) != 0  # the float residue is there
    assert c.unexplained == 0.0 and c.explained
    assert Check("t", predicted=1.0, measured=2.0, unit="s", causes={"a": 0.5}).unexplained == 0.5


def test_a_small_unexplained_part_does_not_read_as_zero():
    """Lesson 5's GPipe check: causes summing to 51.4 % against a measured 51.5 % printed
    "unexplained +0.0 pts"; a part under a tenth of a point, or a ratio under a hundredth, keeps
    the digits that show it."""
    c = check("bubble_gpipe", 0.30, 0.5146, "fraction", causes={"unequal_stages": 0.2142})
    (row,) = check_rows([_event(c)], "en")
    assert row.unexplained == "+0.04 pts" and row.explanation.endswith("unexplained +0.04 pts")
    assert format_value(-0.0003, "fraction", "es", signed=True) == "-0,03 p. p."
    assert format_value(0.004, "ratio", "en") == "0.004×" and format_value(0.25, "ratio", "en") == "0.25×"
    assert format_value(0.0, "fraction", "en", signed=True) == "0.0 pts"


def test_a_run_is_called_equal_to_one_process_only_within_its_dtypes_bound():
    """The capstone's and the experts' summaries printed their largest differences from one process with no
    verdict: the same bound the tests hold them to now says it (lessons/checks.py)."""
    from distai.engine.experiment import equality_verdict

    assert equality_verdict(2.0e-16, 6.0e-16, "float64", "en") == "equal (≤ 1e-12 in float64)"
    assert equality_verdict(2.0e-16, 3.0e-9, "float64", "en") == "NOT equal (> 1e-12 in float64)"
    assert equality_verdict(2.2e-7, 2.7e-7, "float32", "es") == "iguales (≤ 1e-5 en float32)"
    assert equality_verdict(2.0e-4, 2.7e-7, "float32", "es") == "NO iguales (> 1e-5 en float32)"
