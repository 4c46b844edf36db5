"""The experts visualizer: dispatch rows, the load histogram with its capacity line and drops, and a
run replayed step by step with its real loads."""
from __future__ import annotations

from distai.lessons.experts.dispatch import simulate
from distai.visualizers.experts import ExpertsVisualizer
from pilot_harness import async_test, drawn_text, mounted


def test_model_dispatch_keeps_the_capacity_and_sends_what_it_keeps():
    d = simulate(ep=4, experts=8, top_k=2, tokens=16, capacity_factor=1.0, skew=1.5)
    assert d.capacity == 16 and all(k <= min(r, d.capacity) for r, k in zip(d.routed, d.kept))
    assert sum(map(sum, d.sent)) == sum(d.kept) < sum(d.routed) == 4 * 16 * 2
    # every expert's kept choices arrive at its owner
    local = d.experts // d.ep
    assert [sum(row[q] for row in d.sent) for q in range(d.ep)] == \
        [sum(d.kept[q * local:(q + 1) * local]) for q in range(d.ep)]
    dropless = simulate(ep=4, experts=8, top_k=2, tokens=16, capacity_factor=None, skew=1.5)
    assert dropless.kept == dropless.routed == d.routed


@async_test
async def test_histogram_marks_the_capacity_and_the_drops():
    async with mounted(ExpertsVisualizer) as (pilot, vis):
        vis.show_step("capacity")  # capacity factor 1.0, the experts' phase
        text = drawn_text(vis, 100)
        d = vis.dispatch()
        assert "capacity 16 per expert" in text and "│" in text
        assert f"{sum(d.dropped)} choices" in text and "✗" in text
        vis.action_dropless()
        assert "dropless" in drawn_text(vis, 100) and "dropped: 0 choices" in drawn_text(vis, 100)
        await pilot.press("space")  # plays: dispatch → experts → combine
        vis.seek(-2)
        assert "dispatch: token rows" in drawn_text(vis, 100)


@async_test
async def test_replays_a_runs_loads_step_by_step():
    events = [{"kind": "moe_config", "experts": 4, "ep": 2, "top_k": 1, "capacity": 3},
              {"kind": "moe_load", "step": 0, "layer": 0, "routed": [5, 1, 1, 1], "kept": [3, 1, 1, 1], "capacity": 3,
               "sent": [[2, 1], [1, 2]]},
              {"kind": "moe_load", "step": 1, "layer": 0, "routed": [2, 2, 2, 2], "kept": [2, 2, 2, 2], "capacity": 3,
               "sent": [[2, 2], [2, 2]]}]
    async with mounted(ExpertsVisualizer, language="es") as (pilot, vis):
        for e in events:
            vis.feed_event(e)
        assert "(ejecución, paso 2/2, todas las capas)" in drawn_text(vis, 100)  # the latest step, as the log
        vis.rewind()  # then step by step from the first
        assert "(ejecución, paso 1/2, todas las capas)" in drawn_text(vis, 100)
        vis.seek(1)  # the experts' phase of step 1
        assert "2 descartadas" in drawn_text(vis, 100)
        vis.seek(3)
        text = drawn_text(vis, 100)
        assert "paso 2/2" in text and "descartadas: 0 elecciones" in text


def test_each_step_starts_from_its_own_view_not_the_keys_pressed_before():
    """Step 6 (expert-parallel) showed step 4's skew of 1.5 after the learner walked on from it: every step
    starts from the defaults its view leaves unsaid."""
    v = ExpertsVisualizer("en")
    v.show_step("balance")
    assert v.skew == 1.5
    v.top_k = 1  # a key pressed on step 4
    v.show_step("expert-parallel")
    assert (v.skew, v.top_k, v.capacity_factor) == (ExpertsVisualizer.DEFAULT_VIEW["skew"], 2, 1.25)
    v.show_step("shared")  # a step without a view: the defaults too
    assert v.skew == ExpertsVisualizer.DEFAULT_VIEW["skew"]
