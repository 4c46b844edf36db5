"""``distai quiz``: piped answers, EOF, progress recorded, spaced review (Leitner boxes)."""
import io
import os
import subprocess
import sys

import pytest

from distai.lessons import quiz
from distai.tutor import review
from distai.tutor.cli import main
from distai.tutor.progress import ProgressStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    return tmp_path


def run_quiz(monkeypatch, capsys, stdin_text, *argv):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin_text))
    code = main(["quiz", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def right_answers(lesson, count, seed, lang="en"):
    return [str(q.answer + 1) if q.is_choice else q.answer_text()
            for q in quiz.build_quiz(lesson, count, seed, lang)]


def test_all_right_answers_score_and_save(home, monkeypatch, capsys):
    answers = right_answers("2", 6, 4)
    code, out, err = run_quiz(monkeypatch, capsys, "\n".join(answers) + "\n", "2", "--seed", "4", "--count", "6")
    assert code == 0, err
    assert out.count("✓ Right.") == 6 and "Score: 6/6 (100%)." in out and "Saved" in out
    store = ProgressStore()
    assert store.best_quiz_score("lesson2") == 1.0
    assert len(store.quiz_answers("lesson2")) == 6


def test_answers_written_on_windows_are_read(home, monkeypatch, capsys):
    """A file of answers from a Windows editor: CRLF line ends, and a byte-order mark before the first answer
    ("\ufeff20" could not be read as a number)."""
    answers = right_answers("2", 3, 4)
    code, out, err = run_quiz(monkeypatch, capsys, "\ufeff" + "\r\n".join(answers) + "\r\n", "2", "--seed", "4",
                              "--count", "3")
    assert code == 0 and out.count("✓ Right.") == 3 and "could not read" not in out, out


def test_wrong_answers_explain_and_same_seed_same_quiz(home, monkeypatch, capsys):
    code, out1, _ = run_quiz(monkeypatch, capsys, "1\n1\n1\n", "5", "--seed", "9", "--count", "3", "--lang", "es")
    code2, out2, _ = run_quiz(monkeypatch, capsys, "1\n1\n1\n", "5", "--seed", "9", "--count", "3", "--lang", "es")
    assert code == code2 == 0
    assert out1 == out2
    assert "Por qué:" in out1 and "Puntuación:" in out1
    qs = quiz.build_quiz("5", 3, 9, "es")
    flat = " ".join(out1.split())  # long lines wrap to the terminal
    for q in qs:
        assert " ".join(q.prompt.split()) in flat and " ".join(q.explanation.split()) in flat


def test_eof_ends_gracefully_and_keeps_answers(home, monkeypatch, capsys):
    answers = right_answers("1", 5, 3)
    code, out, err = run_quiz(monkeypatch, capsys, answers[0] + "\n" + answers[1] + "\n", "1", "--seed", "3")
    assert code == 0 and "Traceback" not in err
    assert "Input ended after 2 of 5 questions" in out
    store = ProgressStore()
    assert store.best_quiz_score("lesson1") is None  # unfinished: no score
    assert [a["correct"] for a in store.quiz_answers("lesson1")] == [True, True]


def test_unreadable_answer_is_asked_again_then_counted_wrong(home, monkeypatch, capsys):
    q = quiz.build_quiz("3", 1, 2)[0]
    right = str(q.answer + 1) if q.is_choice else q.answer_text()
    code, out, _ = run_quiz(monkeypatch, capsys, f"what?\n{right}\n", "3", "--seed", "2", "--count", "1")
    assert "try again" in out and "Score: 1/1" in out
    code, out, _ = run_quiz(monkeypatch, capsys, "x\ny\nz\n", "3", "--seed", "2", "--count", "1")
    assert "No readable answer (could not read 'z'" in out and "Score: 0/1" in out  # the last try's why too
    code, out, _ = run_quiz(monkeypatch, capsys, "", "3", "--seed", "2", "--count", "2")
    assert out.rstrip().endswith("Input ended before the first answer: nothing saved.")  # not "after 0 of 2"


def test_real_pipe(home):
    env = dict(os.environ, DISTAI_HOME=str(home))
    proc = subprocess.run([sys.executable, "-m", "distai.tutor.cli", "quiz", "1", "--seed", "3"],
                          input="1\n2\n", capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Q1/5" in proc.stdout and "Input ended after 2 of 5" in proc.stdout


@pytest.mark.parametrize("argv", [["99"], [], ["1", "--count", "0"], ["1", "--count", "x"], ["1", "--seed", "abc"],
                                  ["1", "--lang", "fr"]])
def test_bad_arguments_one_line_error(home, monkeypatch, capsys, argv):
    code, out, err = run_quiz(monkeypatch, capsys, "", *argv)
    assert code == 2 and err.startswith("distai: error:") and err.count("\n") == 1


def test_review_asks_what_was_missed(home, monkeypatch, capsys):
    code, out, _ = run_quiz(monkeypatch, capsys, "", "--review")
    assert "Nothing is due" in out and "Take a quiz first" in out
    # Miss every question of a lesson-6 quiz: each kind lands in box 1, due at once.
    qs = quiz.build_quiz("6", 4, 1)
    wrong = []
    for q in qs:
        wrong.append(str((q.answer + 1) % len(q.choices) + 1) if q.is_choice else repr(q.answer * 3 + 1))
    run_quiz(monkeypatch, capsys, "\n".join(wrong) + "\n", "6", "--seed", "1", "--count", "4")
    code, out, _ = run_quiz(monkeypatch, capsys, "", "--review", "--count", "10")
    assert "4 due questions" in out
    # Answer the review right: nothing is due any more, the next review is in a day.
    store = ProgressStore()
    due = review.review_questions(store, 10, "en", seed=5)
    assert sorted(q.kind for q in due) == sorted({q.kind for q in qs})
    answers = [str(q.answer + 1) if q.is_choice else q.answer_text() for q in due]
    code, out, _ = run_quiz(monkeypatch, capsys, "\n".join(answers) + "\n", "--review", "--seed", "5", "--count", "10")
    assert out.count("✓ Right.") == len(due)
    code, out, _ = run_quiz(monkeypatch, capsys, "", "--review")
    assert "Nothing is due" in out and "Next review due in" in out


def test_leitner_boxes():
    day = review.DAY
    a = lambda kind, ok, t: {"lesson_id": "lesson1", "question_kind": kind, "correct": ok, "at": t}  # noqa: E731
    s = review.leitner_states([a("x", True, 0)])
    assert s[("lesson1", "x")].box == 2 and s[("lesson1", "x")].due_at == day
    # Early repeats do not promote; answering when due does: 2 -> 3 -> 4 -> 5, capped.
    hist = [a("x", True, 0), a("x", True, 10), a("x", True, day), a("x", True, 4 * day), a("x", True, 11 * day),
            a("x", True, 40 * day)]
    assert [review.leitner_states(hist[:k])[("lesson1", "x")].box for k in range(1, 7)] == [2, 2, 3, 4, 5, 5]
    # A wrong answer drops to box 1, due at once.
    s = review.leitner_states(hist + [a("x", False, 41 * day)])[("lesson1", "x")]
    assert s.box == 1 and s.due_at == 41 * day and s.answered == 7 and s.correct == 6


def test_quiz_session_records_and_saves(tmp_path):
    store = ProgressStore(tmp_path / "p.db")
    qs = quiz.build_quiz("7", 3, 8)
    session = review.QuizSession(qs, store, "lesson7")
    assert not session.answer("").final  # empty: ask again
    session.skip()
    for q in qs[1:]:
        out = session.answer(str(q.answer + 1) if q.is_choice else q.answer_text())
        assert out.final and out.correct
    assert session.finished and session.saved
    assert store.best_quiz_score("lesson7") == pytest.approx(2 / 3)
    assert review.mastery(store, "lesson7", len(quiz.generators("lesson7"))) == 0.0


@pytest.mark.parametrize("lang", ["en", "es"])
def test_questions_wrap_at_the_terminals_width_under_their_mark(home, monkeypatch, capsys, lang):
    """At 80 columns a question's prompt (176 characters), its choices and its explanation wrapped
    wherever the terminal cut them; they wrap between words, each under the text after its mark."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_quiz(monkeypatch, capsys, "1\n" * 10, "8", "--seed", "5", "--count", "10", "--lang", lang)
    assert code == 0
    lines = out.splitlines()
    assert max(map(len, lines)) <= 79, max(lines, key=len)
    for q in quiz.build_quiz("8", 10, 5, lang):  # every word of every prompt and explanation, in order
        assert " ".join(q.prompt.split()) in " ".join(out.split())
        assert " ".join(q.explanation.split()) in " ".join(out.split())
    marks = [i for i, line in enumerate(lines) if line.startswith(("Q1/10", "P1/10"))]
    assert marks and lines[marks[0] + 1].startswith(" " * 7) and lines[marks[0] + 1][7] != " ", lines[marks[0]:marks[0] + 3]
