"""What the quiz's texts say agrees with what it checks: the explanation's formula is the answer's, an
example never gives the answer away, counts read well at 1, the explanation ends in the unit the
question asks for, a group's definition follows only the group it defines, and a tolerance on an
answer in % says that it is relative."""
import random
import re

import pytest

from distai.lessons import quiz
from distai.lessons.quiz import question_texts
from distai.lessons.registry import all_lessons

SEEDS = range(40)


def _kinds():
    for lesson in all_lessons():
        for name, gen in quiz.generators(lesson.id).items():
            yield lesson.id, name, gen


KINDS = list(_kinds())


def _questions(lesson_id, name, langs=("en", "es"), seeds=SEEDS):
    gen = quiz.generators(lesson_id)[name]
    for lang in langs:
        for seed in seeds:
            yield gen(random.Random(seed), lang)


def _kind(lesson_id, name):
    return quiz.generators(lesson_id)[name].kind


# ------------------------------------------------------------------ 1. interleaved 1F1B


def test_interleaved_explanation_states_the_answer():
    """Lesson 5 (seed 3, Q13): p = 16, m = 8, v = 2 expected 59% under "15/31 = 59%" (15/31 is 48.4%): the
    m < p variant. Only Megatron-LM's m, multiples of p, are drawn, where (p−1)/(v·m+p−1) is the answer."""
    kind = _kind("lesson5", "interleaved")
    space = list(kind.space())
    assert space and all(p["m"] % p["p"] == 0 and p["m"] >= p["p"] for p in space)
    for q in _questions("lesson5", "interleaved"):
        num, den = map(int, re.search(r"= (\d+)/(\d+) = ", q.explanation).groups())
        assert num / den == pytest.approx(q.answer, rel=1e-12), q.explanation
        p, m, v = q.params["p"], q.params["m"], q.params["v"]
        assert (num, den) == (p - 1, v * m + p - 1)


# ------------------------------------------------------------------ 2. examples


_EXAMPLE = re.compile(r"(?:e\.g\.|p\. ej\.) ([^()]+?)\)")


def _examples(q):
    """Every "e.g. …" a numeric question shows: in its prompt, and in what an unreadable answer or one in a
    foreign unit is told."""
    texts = [q.prompt, quiz.check_answer(q, "zz").message, quiz.check_answer(q, "12 furlongs").message]
    return [m.group(1) for t in texts for m in _EXAMPLE.finditer(t)]


@pytest.mark.parametrize("lesson_id,name", [(k[0], k[1]) for k in KINDS], ids=[f"{k[0]}-{k[1]}" for k in KINDS])
def test_no_example_gives_the_answer_away(lesson_id, name):
    """Lesson 6: "(e.g. 6.1e-5)" on fp16's smallest normal number (6.104e-5), "(e.g. 0.0078)" on a spacing
    of 2^-7. An example is read as an answer: it must be wrong, and 3× or more away from the answer."""
    for q in _questions(lesson_id, name):
        if q.is_choice:
            continue
        examples = _examples(q)
        assert examples, (q.kind, q.lang)
        for text in examples:
            check = quiz.check_answer(q, text)
            assert check.valid and not check.correct, (q.kind, q.lang, q.params, text, q.answer_text())
            if q.answer:
                ratio = abs(check.value / q.answer)
                assert ratio >= 3 or ratio <= 1 / 3, (q.kind, q.lang, q.params, text, q.answer_text())


def test_an_example_moves_away_from_the_answer_by_powers_of_ten():
    assert quiz.example_value(1.0, 12.5) == 12.5
    assert quiz.example_value(6.104e-5, 6.1e-5) == pytest.approx(6.1e-6)
    assert quiz.example_value(0.0078125, 0.0078) == pytest.approx(0.00078)
    for answer in (4.2, 10.0, 12.5, 20.0, 37.4):
        value = quiz.example_value(answer, 12.5)
        assert max(value / answer, answer / value) >= 3


def test_spanish_count_examples_are_in_words_and_read_back():
    """Lesson 2 in Spanish: "(p. ej. 12,5 B)" reads as a billón (10^12); the example is "12,5 mil millones",
    and an answer written so is read as 1.25e10 (and accepted when it is the answer)."""
    q = quiz.make_question("lesson2", "max-fit", 0, "es")
    message = quiz.check_answer(q, "zz").message
    assert "mil millones" in message and not any(re.search(r"\dB\b|\d B\b", e) for e in _examples(q))
    assert quiz.check_answer(q, "12,5 mil millones").value == pytest.approx(12.5e9)
    same = quiz.numeric("lesson2", "max-fit", "es", "p", "e", 12.5e9, "count", unit="B")
    assert quiz.check_answer(same, "12,5 mil millones").correct
    for q in _questions("lesson2", "max-fit", langs=("es",)):
        assert "millones" in _examples(q)[0], q.prompt
        assert quiz.check_answer(q, q.answer_text()).correct


# ------------------------------------------------------------------ 3, 5. counts and plurals


def test_gradscaler_counts_are_at_least_one():
    """Lesson 6 (seed 2, Q7): "The first 0 steps overflow, then 0 steps are fine": the answer was the
    starting scale the question states."""
    kind = _kind("lesson6", "scale-after")
    assert all(p["overflows_first"] >= 1 and p["good_steps"] >= 1 for p in kind.space())
    q = quiz.build_quiz("6", 30, 2)[6]
    assert q.kind == "scale-after" and " 0 steps" not in q.prompt


def test_templates_choose_the_word_by_the_count():
    fmt = quiz._Formatter("es")
    assert fmt.format("{n} {n:paso|pasos}, {m} {m:paso|pasos}", n=1, m=3) == "1 paso, 3 pasos"
    assert quiz._Formatter("en").format("{n:int} {n:step is|steps are}", n=20000) == "20,000 steps are"


def test_a_bare_int_is_written_as_int_writes_it():
    """The audit: "1,024-byte … 1024 GPUs" wrote one count two ways in one prompt (the bytes with a
    separator, the bare {n} as Python does). Every integer now follows format_number's one rule: four digits
    stay whole (RAE's rule too), longer ones are grouped; and a bare int reads as {x:int}."""
    prompt = question_texts("distai.lessons.lesson1")["small-messages"]
    assert quiz._Formatter("en").format(prompt["en"]["prompt"], size_bytes=1024, n=1024).startswith(
        "A 1024-byte all-reduce on 1024 GPUs")
    assert quiz._Formatter("es").format(prompt["es"]["prompt"], size_bytes=1024, n=1024).startswith(
        "Un all-reduce de 1024 bytes en 1024 GPUs")
    assert quiz._Formatter("es").format("{n} GPUs, {m:int}", n=16384, m=2048) == "16.384 GPUs, 2048"
    assert quiz._Formatter("en").format("{n} GPUs", n=16384) == "16,384 GPUs"
    assert quiz._Formatter("en").format("{flag}", flag=True) == "True"  # a bool is not a count


def test_an_explanation_writes_the_answer_as_the_answer_line_does():
    """The audit: "the answer is 3.995", then "ratio 4×" in its explanation (the answer at 3 significant digits,
    the line at 4). An explanation writes the answer as {answer_text}, never re-rounded with {answer:num}."""
    for package in (f"distai.lessons.{lesson.id}" for lesson in all_lessons()):
        for name, texts in question_texts(package).items():
            for lang, fields in texts.items():
                explains = fields.get("explain", "")
                for text in explains.values() if isinstance(explains, dict) else [explains]:
                    assert "{answer:num}" not in text and "{answer}" not in text, (package, name, lang, text)
    for q in _questions("lesson1", "naive-ratio", langs=("en",)):
        assert f"ratio {q.answer_text()}×" in q.explanation


# plural nouns the quiz puts after a drawn count
_PLURALS = r"steps|hops|sequences|tokens|GPUs|ranks|layers|stages|microbatches|experts|pasos|saltos|secuencias|" \
           r"capas|etapas|microlotes|expertos"


@pytest.mark.parametrize("lesson_id,name", [(k[0], k[1]) for k in KINDS], ids=[f"{k[0]}-{k[1]}" for k in KINDS])
def test_one_is_never_followed_by_a_plural(lesson_id, name):
    """Lesson 7 (seed 1, Q13): "1 sequences of 8,192 tokens" / "1 secuencias"; lesson 1's "N−1 = 1 steps",
    the context lesson's "1 hops", lesson 6's "1 steps overflow"."""
    bad = re.compile(rf"(?<![\d.,−+·/^-])\b1 ({_PLURALS})\b")
    for q in _questions(lesson_id, name, seeds=range(60)):
        for text in (q.prompt, q.explanation, *q.choices):
            assert not bad.search(text), (q.kind, q.lang, text)


def test_a_single_sequence_reads_well():
    kind = _kind("lesson7", "kv-total")
    params = next(p for p in kind.space() if p["batch"] == 1)
    fields = kind.fields(params)
    gen = quiz.generators("lesson7")["kv-total"]
    assert "1 sequence of" in kind.text(gen.package, "en", "prompt", fields)
    assert "1 secuencia de" in kind.text(gen.package, "es", "prompt", fields)


# ------------------------------------------------------------------ 4. lesson 3's units


@pytest.mark.parametrize("name", ["job-mtbf", "young", "daly", "gpu-mtbf-from-log"])
def test_lesson3_explanations_end_in_the_unit_asked_for(name):
    """"24.4 h" explained as "= 1.02 d", "75.9 min" as "= 1.26 h", "53,084 h" as "gives 2212 d"."""
    kind = _kind("lesson3", name)
    for q in _questions("lesson3", name, seeds=range(80)):
        assert q.unit in ("h", "min")
        assert q.answer_text() in q.explanation, (q.answer_text(), q.explanation)
        assert not re.search(r"\d d\b", q.explanation), q.explanation
    assert kind.unit in ("h", "min")


# ------------------------------------------------------------------ 6. the capstone's groups


@pytest.mark.parametrize("name", ["group-count", "group-stride"])
def test_a_group_definition_follows_only_its_group(name):
    """Capstone (seed 1, Q2 and Q4; seed 3, Q27): "(DP: …; EDP: …)" after questions on TP, CP, EP or PP
    groups; (seed 2, Q11) "a EP group"."""
    for q in _questions("capstone", name):
        dim = q.params["dim"]
        assert ("(DP:" in q.prompt) == (dim == "dp"), (dim, q.prompt)
        assert ("(EDP:" in q.prompt) == (dim == "edp"), (dim, q.prompt)
        if q.lang == "en":
            assert not re.search(r"\ba E", q.prompt), q.prompt
            if name == "group-stride" and dim in ("ep", "edp"):
                assert f"an {dim.upper()} group" in q.prompt


@pytest.mark.parametrize("lesson_id,name", [(k[0], k[1]) for k in KINDS], ids=[f"{k[0]}-{k[1]}" for k in KINDS])
def test_spanish_millions_take_de_before_a_noun(lesson_id, name):
    """Capstone (seed 1, es): "1,61 mil millones parámetros densos" → "1,61 mil millones de parámetros"."""
    bad = re.compile(r"(?:millones|millón|billones|billón) (?!de\b|en\b|cada\b|y\b|o\b)([^\W\d_]+)")
    for q in _questions(lesson_id, name, langs=("es",), seeds=range(20)):
        for text in (q.prompt, q.explanation, *q.choices):
            assert not bad.search(text), (q.kind, text)


# ------------------------------------------------------------------ 7. tolerance wording


def test_a_tolerance_on_an_answer_in_percent_says_relative():
    """"(tolerance ±2%)" on an answer of 59% reads as ±2 points; the check is relative (59% ± 1.18 points)."""
    for lang, word in (("en", "relative"), ("es", "relativo")):
        q = quiz.make_question("lesson5", "bubble-fraction", 0, lang)
        assert q.quantity == "fraction" and q.tolerance_text().endswith(word)
        points = q.answer + 1.5 * q.tolerance * q.answer  # beyond the relative tolerance
        assert not quiz.check_answer(q, f"{100 * points:.6f}%").correct
        other = quiz.make_question("lesson2", "zero-total", 0, lang)
        assert word not in other.tolerance_text()
    q = quiz.make_question("lesson5", "bubble-fraction", 0, "es")
    assert q.tolerance_text() == "±2 % relativo"
    assert quiz.make_question("lesson5", "bubble-fraction", 0, "en").tolerance_text() == "±2% relative"


def test_lesson7_caches_no_longer_sequences_than_the_model_reads():
    """The audit: the quiz cached 32,768-token sequences of Llama-2 models, released with a 4096-token context."""
    from distai.lessons.lesson7.quiz import MAX_CONTEXT

    space = list(_kind("lesson7", "kv-total").space())
    assert space and all(p["ctx"] <= MAX_CONTEXT[p["name"]] for p in space)
    assert {p["name"] for p in space if p["ctx"] == 32768} == {"Mistral-7B"}
