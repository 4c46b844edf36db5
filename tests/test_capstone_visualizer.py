"""The capstone's mesh visualizer: the phases of a step, a run folded from its events, the widget."""
import asyncio

from distai.lessons.capstone import formulas as f
from distai.lessons.capstone.mesh_run import MeshRun, step_phases
from distai.visualizers.mesh import SHAPES, MeshVisualizer


def test_step_phases_walk_the_pipeline_and_end_with_dp():
    phases = step_phases(2, 2, 2)
    assert [(p.dim, p.stages, p.what) for p in phases] == [
        ("tp", (0,), "forward"), ("pp", (0, 1), "send"), ("tp", (1,), "forward"),
        ("tp", (1,), "backward"), ("pp", (1, 0), "send-grad"), ("tp", (0,), "backward"),
        ("dp", (0, 1), "reduce"), ("", (0, 1), "update")]
    for pp, dp, tp in SHAPES:
        phases = step_phases(pp, dp, tp)
        assert len(phases) == 4 * pp  # pp forwards and backwards, 2(pp−1) sends, reduce, update
        assert all(p.dim != "tp" for p in phases) if tp == 1 else True
        assert all(p.dim != "dp" for p in phases) if dp == 1 else True


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
        assert v.view == "run" and v.shape == (2, 2, 2)
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

    async def main():
        app = DistaiApp("es")
        async with app.run_test(size=(80, 24)) as pilot:
            app.open_lesson("capstone")
            await pilot.pause()
            screen = app.screen
            await screen.show_step(screen.lesson.step_index("groups"))
            await pilot.pause()
            assert isinstance(screen.visualizer, MeshVisualizer) and screen.visualizer.view == "groups"

    asyncio.run(main())
