"""The question builder: every declared kind has its texts in both languages, its answer is its
formula's value, and its tolerance rejects the formulas a learner might confuse it with over the
whole parameter range (issue 19.5)."""
import random

import pytest

from distai.lessons import quiz
from distai.lessons.registry import all_lessons


def _declared(lesson_id):
    return {name: gen.kind for name, gen in quiz.generators(lesson_id).items() if isinstance(gen, quiz.Generator)}


def _cases():
    for lesson in all_lessons():
        for name, kind in _declared(lesson.id).items():
            yield lesson.id, name, kind


CASES = list(_cases())


@pytest.mark.parametrize("lesson_id,name,kind", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_wrong_formulas_fall_outside_the_tolerance(lesson_id, name, kind):
    if not isinstance(kind, quiz.Numeric):
        return
    q = quiz.make_question(lesson_id, name, 0)
    for params in kind.space():
        answer = kind.value(params)
        for label, formula in kind.wrong.items():
            wrong = quiz.call_with(formula, params)
            assert not quiz._close(wrong, answer, q), f"{lesson_id} {name} {params}: {label} = {wrong} is accepted"


@pytest.mark.parametrize("lesson_id,name,kind", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_every_kind_has_its_texts_in_both_languages(lesson_id, name, kind):
    for lang in ("en", "es"):
        for seed in range(5):
            q = kind.question(lesson_id, quiz.generators(lesson_id)[name].package, random.Random(seed), lang)
            assert q.prompt and q.explanation and "{" not in q.prompt + q.explanation
            if not q.is_choice:
                assert q.answer == kind.value(q.params)


def test_the_space_is_what_sampling_draws():
    kind = quiz.Numeric("k", draw={"p": [2, 4], "rank": lambda p: range(p), "c": "x"},
                        where=lambda p, rank: rank != 1, answer=lambda p: p)
    space = list(kind.space())
    assert space == [{"p": 2, "rank": 0, "c": "x"}, {"p": 4, "rank": 0, "c": "x"}, {"p": 4, "rank": 2, "c": "x"},
                     {"p": 4, "rank": 3, "c": "x"}]
    rng = random.Random(1)
    assert all(kind.sample(rng) in space for _ in range(50))


def test_templates_write_numbers_in_the_question_language():
    fmt = quiz._Formatter("es")
    assert fmt.format("{a:bytes} {b:pct} {c:int} {d:num4} {e} {f}", a=1.66e10, b=0.273, c=32768, d=2.33333,
                      e=4, f=0.5) == "16,6 GB 27,3 % 32.768 2,333 4 0,5"
