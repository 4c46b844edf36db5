"""The capstone's mesh visualizer: the phases of a step, a run folded from its events, the widget."""
import asyncio

from distai.lessons.capstone import formulas as f
from distai.lessons.capstone.mesh_run import Layout, MeshRun, step_phases
from distai.lessons.strings import strings
from distai.visualizers.mesh import SHAPES, MeshVisualizer


def test_step_phases_walk_the_pipeline_and_end_with_dp():
    phases = step_phases(2, 2, 2)
    assert [(p.dim, p.stages, p.what) for p in phases] == [
        ("tp", (0,), "forward"), ("pp", (0, 1), "send"), ("tp", (1,), "forward"),
        ("tp", (1,), "backward"), ("pp", (1, 0), "send-grad"), ("tp", (0,), "backward"),
        ("dp", (0, 1), "reduce"), ("", (0, 1), "update")]
    for m in SHAPES:
        phases = step_phases(m.pp, m.dp, m.tp, m.cp, m.ep, m.moe)
        inside = 1 + (m.cp > 1) + (m.moe and m.ep > 1)  # a block: TP, then CP's ring, EP's all-to-alls
        experts = m.moe and m.dp * m.cp // m.ep > 1  # the experts' own reduction
        # pp forwards and backwards (each with its ring and all-to-alls), 2(pp−1) sends, reduce, update
        assert len(phases) == 2 * m.pp * inside + 2 * (m.pp - 1) + 2 + experts
        assert {p.dim for p in phases} - {""} == set(m.groups()) - {"moe"}  # every group that talks, once a step



def _events(pp=2, dp=2, tp=2, m=2):
    """A step in the format ``distai.engine.experiments.capstone`` emits (its module docstring): every
    rank reports its stage's blocks; 1F1B order on 2 stages."""
    world = pp * dp * tp
    ranks = [[r, *(f.mesh_coords(r, pp, dp, tp)[d] for d in ("pp", "dp", "tp"))] for r in range(world)]
    yield {"kind": "mesh_config", "pp": pp, "dp": dp, "tp": tp, "schedule": "1f1b", "v": 1, "m": m,
           "microbatch_size": 1, "zero": 0, "ranks": ranks}
    order = [(0, "F", 0, 0.0), (0, "F", 1, 1.0), (1, "F", 0, 1.0), (1, "B", 0, 2.0), (1, "F", 1, 4.0),
             (0, "B", 0, 4.5), (1, "B", 1, 5.0), (0, "B", 1, 7.0)]
    for r, p, _d, _t in ranks:
        for stage, op, mb, t0 in order:
            if stage == p:
                yield {"kind": "pp_op", "schedule": "1f1b", "step": 0, "op": op, "mb": mb, "chunk": 0,
                       "stage": stage, "t0": 100 + t0 + 0.01 * r, "t1": 100 + t0 + (1 if op == "F" else 2)}
    yield {"kind": "step", "step": 0, "of": 1, "loss": 4.5, "ref_loss": 4.5, "loss_rel_diff": 1e-15,
           "param_rel_diff": 2e-15, "step_time_s": 9.0}
    acct = {"tp": {"calls": 8, "bytes": 4096}, "pp": {"calls": 4, "bytes": 1024}, "dp": {"calls": 1, "bytes": 512}}
    yield {"kind": "mesh_comm", "step": 0, "ranks": [
        {"rank": r, "pp": p, "dp": d, "tp": t, "measured": acct, "expected": acct,
         "match": {"tp": True, "pp": True, "dp": True}} for r, p, d, t in ranks]}


def test_a_run_folds_into_its_executed_order():
    run = MeshRun()
    for e in _events():
        run.feed(e)
    assert run.shape == (2, 2, 2) and run.coords_match_formulas()
    assert run.latest_complete_step() == 0
    phases = run.replay_phases()
    blocks = [(p.what, p.stages, p.microbatch) for p in phases if p.what in ("forward", "backward")]
    assert blocks == [("forward", (0,), 0), ("forward", (0,), 1), ("forward", (1,), 0), ("backward", (1,), 0),
                      ("forward", (1,), 1), ("backward", (0,), 0), ("backward", (1,), 1), ("backward", (0,), 1)]
    # after a forward on stage 0 the activation goes to stage 1; after a backward on 1 the gradient to 0
    sends = [(p.what, p.stages) for p in phases if p.dim == "pp"]
    assert sends.count(("send", (0, 1))) == 2 and sends.count(("send-grad", (1, 0))) == 2
    assert phases[-2].dim == "dp" and phases[-1].what == "update"
    assert phases[0].t0 == 0.0  # times relative to the step's first block, widest span over the ranks
    comm = run.comm_by_stage()
    assert set(comm) == {0, 1} and comm[0]["tp"] == {"bytes": 4096, "calls": 8, "expected_bytes": 4096,
                                                    "match": True}
    # a new run forgets the old one; a shape that disagrees with mesh_coords is reported
    run.feed({"kind": "mesh_config", "pp": 2, "dp": 2, "tp": 2, "m": 2, "v": 1, "ranks": [[1, 0, 1, 0]]})
    assert run.latest_complete_step() is None and not run.coords_match_formulas()


def test_widget_draws_every_view_and_replays_a_run():
    for lang in ("en", "es"):
        v = MeshVisualizer(lang)
        for view in ("step", "groups", "nodes"):
            v.view = view
            text = "\n".join(line.plain for line in v.build_lines(80, 24))
            assert "r7" in text and len(text.splitlines()) <= 24
        v.view = "step"
        v.frame = 6  # the DP phase of the (2, 2, 2) mesh
        assert "{0 2}  {1 3}  {4 6}  {5 7}" in "\n".join(line.plain for line in v.build_lines(80))
        for e in _events():
            v.feed_event(e)
        assert v.view == "run" and v.shape == Layout(2, 2, 2)
        text = "\n".join(line.plain for line in v.build_lines(120, 40))
        assert {"en": "4.5000", "es": "4,5000"}[lang] in text and ("yes" in text or "sí" in text)
        v.action_next_mesh()
        assert v.shape == SHAPES[1] and v.view == "step"


def test_terminal_view_draws_the_run():
    from distai.visualizers.mesh import TerminalMesh

    view = TerminalMesh("en")
    assert view.renderables(80) == []
    for e in _events():
        view.feed(e)
    text = "\n".join(t.plain for t in view.renderables(80))
    assert "(2, 2, 2)" in text and "r7" in text and "4 KiB/4 KiB" in text and "✓" in text


def test_widget_mounts_in_the_capstone_lesson():
    from distai.tutor.app import DistaiApp
    from pilot_harness import lesson_step

    async def main():
        app = DistaiApp("es")
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await lesson_step(app, pilot, "capstone", "groups")
            assert isinstance(screen.visualizer, MeshVisualizer) and screen.visualizer.view == "groups"

    asyncio.run(main())


# ---- issue 27.4: a real run (tests/recorded_runs/capstone.jsonl: `distai run capstone --cpu 8 --dp 2
# --tp 2 --pp 2 --json`, trimmed to the last step's pp_op events and the kinds the views read)
def _recorded(name: str = "capstone") -> list[dict]:
    import json
    from pathlib import Path

    path = Path(__file__).parent / "recorded_runs" / f"{name}.jsonl"
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _rendered(renderables, width: int) -> list[str]:
    """What Rich draws of ``renderables`` in ``width`` columns, row by row."""
    from rich.console import Console, Group

    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)
    console.print(Group(*renderables))
    return console.export_text().rstrip("\n").split("\n")


def test_a_short_pane_wraps_the_run_views_notes_instead_of_cutting_them():
    """The run panel's mesh read `phase 2 of 26: PP: stage 0 sends the activation to stag…` and
    `step 5: … · largest diff…`: a note longer than the pane is wrapped at word boundaries, and a pane
    too short for every note keeps the ones that fit whole (and says how many rows are left out)."""
    from distai.lessons.strings import strings
    from distai.visualizers.mesh import phase_text

    v = MeshVisualizer("en")
    for e in _recorded():
        v.feed_event(e)
    assert v.view == "run"
    tr = strings("mesh", "en")
    full = [ln.plain for ln in v.build_lines(200)]
    loss_note = next(ln for ln in full if ln.startswith("step 6: loss"))
    for width, height in ((56, 11), (36, 12), (56, 24), (24, 30)):  # the panel's pane at 120x40, narrower
        for frame in range(len(v.phases())):
            v.frame = frame
            rows = _rendered(v.build_lines(width, height), width)
            assert len(rows) <= height, (width, height, rows)
            assert not any("…" in row for row in rows), rows
            shown = " ".join(" ".join(rows).split())
            assert phase_text(v.current_phase(), 2, 2, tr) in shown
            # the loss against one process is shown whole, or not at all
            assert (loss_note in shown) or ("largest" not in shown and "step 6: loss" not in shown), rows
        if height >= 24:
            assert loss_note in shown


def test_the_shell_shows_rank_0s_summary_whole_once_the_run_ended():
    """`distai run capstone` ended with the last six lines of rank 0's summary: its communication
    table without its header, each row as a `rank 0 …` line, under the view's own table of the same
    bytes. Live, the view shows its table and the ranks' last lines; once the run ended well, rank 0's
    summary whole, as printed, and the view no longer repeats the figures it states."""
    from distai.tutor.cli_run import TerminalView

    events = _recorded()
    summary = [e["line"] for e in events if e["kind"] == "output" and e["rank"] == 0]
    header = next(line for line in summary if "stage  group  calls" in line)
    view = TerminalView("distai run capstone", live=False, lesson="capstone", replay=True)
    for e in events[:-1]:  # all but run_end: still running
        view(e)
    live = "\n".join(_rendered([view.render()], 100))
    assert "st grp" in live and "rank 0" in live and header not in live
    view(events[-1])
    assert events[-1]["kind"] == "run_end" and events[-1]["status"] == "ok"
    rows = _rendered([view.render()], 100)
    text = "\n".join(rows)
    assert "rank 0" not in text and "st grp" not in text
    body = [line.rstrip() for line in summary if line.strip()]
    printed = [r.rstrip() for r in rows if r.strip()]
    start = printed.index(body[0])
    assert printed[start:start + len(body)] == body  # every line, in order, as rank 0 printed it
    for line in body[body.index(header.rstrip()) + 1:-1]:  # each row of the table once
        assert printed.count(line) == 1
    assert "r7" in text and "mesh_coords: yes" in text  # the mesh stays


# ---- issue 29.1: five axes. tests/recorded_runs/capstone.5d.jsonl: a real `distai run capstone --cpu 8
# --dp 2 --tp 1 --pp 2 --cp 2 --ep 2 --moe --experts 4 --top-k 2 --steps 3 --json`, trimmed as above
def test_the_layout_is_the_3d_mesh_when_cp_and_ep_are_one():
    for m in SHAPES[:4]:
        for r in range(m.world):
            c = m.coords(r)
            assert {d: c[d] for d in ("pp", "dp", "tp")} == f.mesh_coords(r, m.pp, m.dp, m.tp)
            for dim in ("pp", "dp", "tp"):
                assert m.group(r, dim) == f.group_ranks(r, dim, m.pp, m.dp, m.tp)


def test_a_five_axis_run_replays_with_its_rings_and_all_to_alls():
    run = MeshRun()
    for e in _recorded("capstone.5d"):
        run.feed(e)
    assert run.layout == Layout(2, 2, 1, cp=2, ep=2, moe=True) and run.coords_match_formulas()
    phases = run.replay_phases()
    m = run.config["m"]
    for what in ("forward", "ring", "dispatch", "backward", "ring-grad", "dispatch-grad"):
        assert sum(p.what == what for p in phases) == 2 * m  # every block of both stages
    assert [p.what for p in phases[-3:]] == ["reduce", "reduce-experts", "update"]
    comm = run.comm_by_stage()
    assert set(comm) == {0, 1} and set(comm[0]) == {"tp", "pp", "dp", "cp", "ep", "edp", "moe"}
    assert all(c["match"] and c["bytes"] == c["expected_bytes"] for dims in comm.values() for c in dims.values())


def test_the_widget_lays_out_two_axes_and_tabs_the_third():
    v = MeshVisualizer("en")
    while v.shape != Layout(1, 2, 2, cp=2, ep=2, moe=True):
        v.action_next_mesh()

    def grid() -> list[str]:
        return [ln.plain for ln in v.grid_lines(80)]

    assert "(1, 2, 2, 2) · ep 2 · 8 ranks" in v.title(strings("mesh", "en")).plain
    assert [row.split() for row in grid()[1:]] == [["│", "r0", "r1", "│"], ["│", "r4", "r5", "│"]]  # DP × TP, cp 0
    v.action_next_tab()
    assert [row.split() for row in grid()[1:]] == [["│", "r2", "r3", "│"], ["│", "r6", "r7", "│"]]  # cp 1
    v.action_next_axes()  # DP × CP, tp 0 the tab
    assert [row.split() for row in grid()[1:]] == [["│", "r0", "r2", "│"], ["│", "r4", "r6", "│"]]
    v.view = "groups"
    v.rank = 5
    text = "\n".join(ln.plain for ln in v.build_lines(100))
    assert "rank 5 = stage 0, replica 1, context 0, shard 1, expert rank 0" in text
    # EP is CP's pair here: one colour hides the other, so each group is listed by its ranks too
    assert "TP {4 5}  DP·CP {1 3 5 7}  CP {5 7}  EP {5 7}" in text
    v.view = "step"
    for frame in range(len(v.phases())):
        v.frame = frame
        text = "\n".join(ln.plain for ln in v.build_lines(100, 24))
        assert len(text.splitlines()) <= 24
        if v.current_phase().dim == "ep":  # EP groups: ep consecutive ranks of the dp·cp ones
            assert "EP: {0 2}  {1 3}  {4 6}  {5 7}" in text


def test_the_five_axis_run_draws_in_the_terminal_and_the_panel():
    from distai.visualizers.mesh import TerminalMesh

    view = TerminalMesh("es")
    for e in _recorded("capstone.5d")[:-1]:  # running
        view.feed(e)
    text = "\n".join(row for row in _rendered(view.renderables(100), 100))
    assert "(2, 2, 2, 1) · ep 2 · 8 ranks" in text and "pestaña (s)" not in text and "sí" in text
    for grp in ("cp", "ep", "edp", "moe"):
        assert f" {grp:<3} " in text


def test_the_groups_and_run_steps_show_the_lessons_run_mesh():
    """groups.md names rank 5's groups on the lesson's 8-rank run (pp = dp = cp = ep = 2, tp = 1), and
    run-it.md's first command runs it: before a run is loaded, both steps draw that mesh."""
    from distai.visualizers.mesh import LESSON_RUN

    v = MeshVisualizer()
    v.show_step("groups")
    text = "\n".join(line.plain for line in v.build_lines(100, 30))
    assert v.shape == LESSON_RUN and v.rank == 5
    assert "PP {1 5}" in text and "DP·CP {4 5 6 7}" in text and "CP {4 5}" in text and "EDP {5 7}" in text
    v.set_shape(SHAPES[0])
    v.show_step("run-it")
    assert v.shape == LESSON_RUN and v.view == "step"


def test_a_group_of_ranks_wraps_whole_with_its_name():
    """At 120x40 the groups line wrapped "EP {4" / "5}"; the one wrap rule (bind_units, as the lesson text)
    also keeps numbers with their units and symbols with their values."""
    from rich.text import Text

    from distai.visualizers.ring_drawing import wrap_text

    line = "PP {1 5}  DP·CP {4 5 6 7}  CP {4 5}  EP {4 5}  EDP {5 7}"
    for width in range(len("DP·CP {4 5 6 7}"), len(line)):  # the longest group fits
        for part in wrap_text(Text(line), width):
            shown = part.plain.strip()
            assert shown.count("{") == shown.count("}") and not shown.endswith(("PP", "CP", "EP")), (width, shown)
    assert [t.plain for t in wrap_text(Text("costs α = 5 µs plus 25 GB/s"), 14)] == ["costs α = 5 µs", "plus 25 GB/s"]


def test_a_step_view_shows_the_same_mesh_however_the_learner_comes_to_it():
    """Step 1 drew (2, 2, 2) on the way in and the groups step's 5D mesh after n, p."""
    v = MeshVisualizer()
    v.show_step("mesh")
    first = v.shape
    v.show_step("groups")
    v.show_step("mesh")
    assert v.shape == first == SHAPES[0] and v.view == "step"


def test_the_order_step_draws_a_mesh_with_tensor_parallelism():
    """The order step ('why TP is innermost') drew the lesson run's mesh, whose TP is 1: nothing to see."""
    v = MeshVisualizer("en")
    v.show_step("order")
    assert v.view == "nodes" and v.shape.tp == 2 and v.shape.world == 8


def test_the_run_it_step_replays_the_latest_run(tmp_path, monkeypatch):
    """run-it.md says the mesh visualizer replays the run; the lesson screen's visualizer never got the
    run panel's events, so the step drew the planned mesh and `g` never reached the run view. The step now
    asks for the latest capstone run (the lesson screen replays it from its folder), on entering the step
    and on coming back from the run panel."""
    import time

    from distai.tutor.app import DistaiApp
    from pilot_harness import lesson_step, saved_run

    def timed(events):  # the recordings' trimmed outputs carry no time; a run's files always do
        return [dict(e, t=e.get("t") or 1.0) for e in events]

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    saved_run(tmp_path / "runs", "capstone", timed(_recorded()), config={"nproc": 8, "device": "cpu"}, duration_s=12.0)

    async def main():
        app = DistaiApp("en")
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await lesson_step(app, pilot, "capstone", "run-it")
            v = screen.visualizer
            assert isinstance(v, MeshVisualizer) and v.view == "run" and v.run.shape == (2, 2, 2)
            assert not app._notifications  # asked by the step: quiet
            # a second run ends in the run panel, stopped midway: back in the lesson, the step shows that one
            # (it kept the first; and `o`'s preference for a run that ended ok must not bring the first back)
            time.sleep(1.1)  # run folders are named to the second
            saved_run(tmp_path / "runs", "capstone", timed(_recorded("capstone.5d")),
                      config={"nproc": 8, "device": "cpu"}, duration_s=20.0, status="stopped")
            screen._run_panel_opened = True
            screen.on_screen_resume()
            await pilot.pause()
            assert v.run.layout is not None and v.run.layout.cp == 2 and v.view == "run"

    asyncio.run(main())


def test_the_legend_names_edp_with_experts_and_a_waiting_run_names_its_four_axes():
    """The MoE mesh's reductions include EDP's, which the legend did not name; a run waiting for its first
    complete step was named by (pp, dp, tp) alone ("run (2, 2, 1)" for a cp = 2 mesh)."""
    from distai.lessons.capstone.mesh_run import Layout
    from distai.lessons.strings import strings

    v = MeshVisualizer("en")
    tr = strings("mesh", "en")
    v.set_shape(Layout(2, 2, 1, 2, 2, True))
    assert "EDP" in v.legend(tr).plain
    v.set_shape(Layout(2, 2, 1, 2, 1, False))
    assert "EDP" not in v.legend(tr).plain and "CP" in v.legend(tr).plain
    config = next(e for e in _recorded("capstone.5d") if e["kind"] == "mesh_config")
    v.feed_event(config)
    text = " ".join(t.plain for t in v.run_lines(tr))
    assert "run (pp, dp, cp, tp) = (2, 2, 2, 1) · ep 2: waiting for a complete step" in text


def test_the_communication_step_shows_every_group_talking():
    """communication.md says the step view lights up the TP collectives, the CP ring, the EP all-to-alls, the
    PP sends and the DP·CP and EDP reductions; it drew the 3D mesh, whose phases are TP, PP and DP alone."""
    from distai.visualizers.mesh import LESSON_RUN

    v = MeshVisualizer()
    v.show_step("communication")
    assert v.view == "step" and v.shape == LESSON_RUN
    assert {"pp", "cp", "ep", "dp", "edp"} <= {p.dim for p in v.phases()}
    v.show_step("mesh")
    assert v.shape == SHAPES[0]
