"""The run events' declarations (distai/lessons/events.py, lessons/<lesson>/events.py) against what
is emitted: the recorded runs, every emit in the engine, and the run-time check the suite turns on."""
from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from distai.lessons import events as shared
from distai.lessons.events import EventKind, lesson_events, problems
from distai.lessons.registry import all_lessons

ROOT = Path(__file__).resolve().parents[1]
RECORDED = Path(__file__).parent / "recorded_runs"
LESSONS = ROOT / "lessons"


def _declaring_lessons() -> list[str]:
    return sorted(p.parent.name for p in LESSONS.glob("*/events.py"))


def _kinds_of(module_name: str) -> dict[str, EventKind]:
    """The EventKinds a module defines or imports, by their names in it."""
    module = importlib.import_module(module_name)
    return {name: value for name, value in vars(module).items() if isinstance(value, EventKind)}


@pytest.mark.parametrize("path", sorted(RECORDED.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_recorded_event_matches_its_lessons_declaration(path):
    kinds = lesson_events(path.stem.partition(".")[0])  # capstone.5d.jsonl: another recording of capstone
    seen = set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            event = json.loads(line)
            seen.add(event["kind"])
            assert not problems(event, kinds), f"{path.name}:{number} {event['kind']}: {problems(event, kinds)}"
    assert seen - {"run_start"}, "a recording with no event of the lesson's own"


def test_each_lessons_declarations_are_listed_once_in_its_events():
    for lesson in _declaring_lessons():
        module = f"distai.lessons.{lesson}.events"
        listed = importlib.import_module(module).EVENTS
        names = [k.name for k in listed]
        assert len(names) == len(set(names)), (lesson, names)
        # a kind the module declares but leaves out of EVENTS would be refused in its runs
        for name, kind in _kinds_of(module).items():
            if name.isupper():
                assert kind in listed or kind in shared.SHARED, (lesson, name)
        assert set(lesson_events(lesson).values()) >= set(listed)


def test_a_lessons_kind_narrows_a_shared_one_without_dropping_its_fields():
    for lesson in _declaring_lessons():
        for kind in importlib.import_module(f"distai.lessons.{lesson}.events").EVENTS:
            base = next((k for k in shared.SHARED if k.name == kind.name), None)
            if base is not None:
                assert set(base.fields.__annotations__) <= set(kind.fields.__annotations__), (lesson, kind)
                assert base.fields.__required_keys__ <= kind.fields.__required_keys__, (lesson, kind)


def _engine_sources():
    for path in sorted((ROOT / "engine").rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_the_engine_emits_every_kind_through_its_declaration():
    """No ``sink.emit("kind", ...)`` with a bare name and no ``{"kind": ...}`` literal outside the
    sink itself: every event the engine writes goes through an EventKind, which a lesson lists."""
    bare = []
    for path, tree in _engine_sources():
        rel = path.relative_to(ROOT)
        if rel == Path("engine/events.py"):  # the sink, which writes what the kinds hand it
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit" \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                bare.append(f"{rel}:{node.lineno} emit({node.args[0].value!r}, ...)")
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "kind" for k in node.keys):
                bare.append(f"{rel}:{node.lineno} a {{'kind': ...}} literal")
    assert not bare, "declare the kind in lessons/<lesson>/events.py and emit through it:\n" + "\n".join(bare)


def _emitted_kinds(module_name: str, tree: ast.AST) -> dict[str, EventKind]:
    """The EventKinds a module emits (``KIND.emit(...)``, ``KIND.emit_fields(...)``, ``KIND.event(...)``)."""
    kinds = _kinds_of(module_name)
    used = {node.func.value.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("emit", "emit_fields", "event") and isinstance(node.func.value, ast.Name)
            and node.func.value.id in kinds}
    return {name: kinds[name] for name in used}


def test_every_kind_an_experiment_emits_is_declared_for_its_lesson():
    experiments = {lesson.experiment: lesson.id for lesson in all_lessons() if lesson.experiment}
    checked = 0
    for module_name, lesson_id in experiments.items():
        path = ROOT / (module_name.removeprefix("distai.").replace(".", "/") + ".py")
        declared = lesson_events(lesson_id)
        emitted = _emitted_kinds(module_name, ast.parse(path.read_text(encoding="utf-8")))
        assert emitted, module_name
        for name, kind in emitted.items():
            assert declared.get(kind.name) is kind, f"{module_name} emits {name} ({kind.name!r}), not {lesson_id}'s"
            checked += 1
    assert checked > 40


def test_every_kind_the_rest_of_the_engine_emits_is_declared_by_some_lesson():
    declared = {id(k) for lesson in _declaring_lessons() for k in lesson_events(lesson).values()}
    for path, tree in _engine_sources():
        if "experiments" in path.parts:
            continue
        module_name = "distai." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module_name.endswith("__init__"):
            continue
        for name, kind in _emitted_kinds(module_name, tree).items():
            assert id(kind) in declared, f"{module_name} emits {name}, which no lesson lists"


# ---- the run-time check (DISTAI_CHECK_EVENTS=1, set in conftest.py)
class _Sink:
    def __init__(self, check_events: bool):
        self.check_events, self.events = check_events, []

    def emit(self, kind, **fields):
        self.events.append({"kind": kind, **fields})


def test_a_checking_sink_refuses_an_event_its_declaration_does_not_allow():
    from distai.lessons.lesson5.events import PP_STAGE

    good = {"schedule": "1f1b", "rank": 1, "bubble": 0.25, "bubble_formula": 0.25, "peak_bytes": 4096,
            "peak_microbatches": 2, "peak_formula": 2.0, "torch_peak_bytes": None}
    sink = _Sink(check_events=True)
    PP_STAGE.emit(sink, good)  # an int where a float is declared is a float; None where it may be
    assert sink.events == [{"kind": "pp_stage", **good}]
    for bad, why in [({**good, "bubble": "a quarter"}, "'bubble' = 'a quarter' is not float"),
                     ({**good, "peak_bytes": True}, "'peak_bytes' = True is not int"),
                     ({**good, "stage": 3}, "undeclared 'stage'"),
                     ({k: v for k, v in good.items() if k != "schedule"}, "missing 'schedule'")]:
        with pytest.raises(ValueError, match=why):
            PP_STAGE.emit_fields(sink, bad)
    assert len(sink.events) == 1
    unchecked = _Sink(check_events=False)
    PP_STAGE.emit_fields(unchecked, {**good, "stage": 3})  # a run outside the suite writes what it gets
    assert unchecked.events[0]["stage"] == 3


def test_the_checker_reads_nested_and_keyword_named_fields():
    from distai.lessons.lesson1.events import RING_STEP
    from distai.lessons.lesson3.events import CKPT_COST

    step = {"kind": "ring_step", "t": 1.0, "rank": 0, "call": 0, "phase": "reduce-scatter", "step": 0, "of": 6,
            "n": 4, "chunk": 0, "to": 1, "recv_chunk": 3, "from": 3, "bytes": 256, "size": 1024, "t0": 0.5}
    assert RING_STEP.problems(step) == []
    assert RING_STEP.problems({k: v for k, v in step.items() if k != "from"}) == ["missing 'from'"]
    mode = {"step_s": 0.01, "blocked_s": 0.0}
    cost = {"kind": "ckpt_cost", "attempt": 0, "steps": 6, "every": 2, "write_s": 0.1, "none": mode,
            "sync": {**mode, "per_checkpoint_s": 0.002}, "async": {**mode, "per_checkpoint_s": 0.001}}
    assert CKPT_COST.problems(cost) == []
    assert CKPT_COST.problems({**cost, "async": {"step_s": "fast"}}) != []


def test_the_summary_is_open_and_an_unknown_kind_is_refused():
    kinds = lesson_events("lesson5")
    assert problems({"kind": "summary", "rank": 0, "anything": {"a": 1}}, kinds) == []
    assert problems({"kind": "pp_gossip"}, kinds) == ["undeclared kind 'pp_gossip'"]
    assert "pp_op" in lesson_events("capstone") and "pp_op" not in lesson_events("lesson4")
