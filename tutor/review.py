"""Spaced review: Leitner boxes over the learner's quiz history in the progress database.

The unit of review is a question *kind* of a lesson (``lesson2``/``zero-total``): a fresh question
of that kind is generated each time, so the learner practises the formula, not one set of numbers.

State is derived from the answers the progress store already keeps (``quiz_answers``), replayed in
time order — nothing is duplicated, so it can never disagree with the history:

- a kind starts in box 1 when first answered;
- a wrong answer puts it back in box 1;
- a right answer moves it up one box (at most :data:`MAX_BOX`) — but only when it was due (or new);
  answering it right again early, e.g. twice in the same quiz, neither promotes nor postpones it;
- a kind in box b is due ``INTERVALS[b]`` after its last answer: box 1 at once, then 1, 3, 7 and
  21 days.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .progress import ProgressError

if TYPE_CHECKING:
    from ..lessons.quiz import Check, Question

DAY = 86400.0
INTERVALS = {1: 0.0, 2: 1 * DAY, 3: 3 * DAY, 4: 7 * DAY, 5: 21 * DAY}
MAX_BOX = max(INTERVALS)


@dataclass(frozen=True)
class ReviewItem:
    lesson_id: str
    kind: str
    box: int
    last_at: float
    due_at: float
    correct: int  # right answers so far
    answered: int

    def is_due(self, now: float) -> bool:
        return self.due_at <= now


def leitner_states(answers: list[dict]) -> dict[tuple[str, str], ReviewItem]:
    """Replay answers (dicts with lesson_id, question_kind, correct, at; oldest first) into boxes."""
    state: dict[tuple[str, str], ReviewItem] = {}
    for a in sorted(answers, key=lambda r: r["at"]):
        key = (a["lesson_id"], a["question_kind"])
        at = float(a["at"])
        prev = state.get(key)
        if prev is None:
            box = 2 if a["correct"] else 1
            right, n = int(bool(a["correct"])), 1
        else:
            right, n = prev.correct + int(bool(a["correct"])), prev.answered + 1
            if not a["correct"]:
                box = 1
            elif at >= prev.due_at:
                box = min(prev.box + 1, MAX_BOX)
            else:  # right, but early: neither promoted nor postponed
                state[key] = ReviewItem(key[0], key[1], prev.box, at, prev.due_at, right, n)
                continue
        state[key] = ReviewItem(key[0], key[1], box, at, at + INTERVALS[box], right, n)
    return state


def review_items(store, lesson_id: str | None = None) -> list[ReviewItem]:
    """Every kind the learner has answered, with its box and due time (``store``: a ProgressStore)."""
    items = leitner_states(store.quiz_answers(lesson_id)).values()
    return sorted(items, key=lambda i: (i.due_at, i.box, i.lesson_id, i.kind))


def due_items(store, now: float | None = None, lesson_id: str | None = None, limit: int | None = None,
              known_kinds: dict[str, set[str]] | None = None) -> list[ReviewItem]:
    """Kinds due now, most overdue and lowest box first. ``known_kinds`` (lesson id → kinds that still
    exist) drops kinds that a newer version removed."""
    now = time.time() if now is None else now
    out = [i for i in review_items(store, lesson_id) if i.is_due(now)
           and (known_kinds is None or i.kind in known_kinds.get(i.lesson_id, set()))]
    out.sort(key=lambda i: (i.box, i.due_at))
    return out if limit is None else out[:limit]


def next_due(store, now: float | None = None, lesson_id: str | None = None) -> ReviewItem | None:
    """The item that will be due soonest after ``now`` (None when nothing was ever answered)."""
    now = time.time() if now is None else now
    future = [i for i in review_items(store, lesson_id) if not i.is_due(now)]
    return min(future, key=lambda i: i.due_at) if future else None


def mastery(store, lesson_id: str, n_kinds: int) -> float:
    """Share of a lesson's ``n_kinds`` question kinds that have reached box 3 or higher (answered right
    at least twice, a day apart): a 0-1 figure for the home screen."""
    if n_kinds <= 0:
        return 0.0
    items = [i for i in review_items(store, lesson_id) if i.box >= 3]
    return min(1.0, len(items) / n_kinds)


# ------------------------------------------------------------------------------------ sessions

MAX_INVALID = 3  # unreadable answers to one question before it counts as wrong


@dataclass
class Outcome:
    """What happened to one answer: ``final`` is True when the question is settled (right, wrong, or
    too many unreadable answers); otherwise the same question should be asked again."""
    check: Check
    final: bool
    correct: bool


class QuizSession:
    """A run through a list of questions, recording each settled answer in the progress store.

    ``session_lesson``: the lesson whose score a *completed* session is saved for (None for a mixed
    review, which records the answers only). Used by ``distai quiz`` and the tutor's QuizScreen.
    """

    def __init__(self, questions: list[Question], store=None, session_lesson: str | None = None):
        self.questions = list(questions)
        self.store = store
        self.session_lesson = session_lesson
        self.index = 0
        self.correct = 0
        self.answered = 0
        self.results: list[bool] = []
        self._invalid = 0
        self.saved = False
        #: why an answer or the score could not be saved (the database held by another process), or None:
        #: the quiz goes on, and whoever shows it says so once
        self.unsaved: ProgressError | None = None

    @property
    def current(self) -> Question | None:
        return self.questions[self.index] if self.index < len(self.questions) else None

    @property
    def finished(self) -> bool:
        return self.index >= len(self.questions)

    def answer(self, text) -> Outcome:
        from ..lessons.quiz import check_answer

        q = self.current
        if q is None:
            raise RuntimeError("the quiz is over")
        check = check_answer(q, text)
        if not str(text or "").strip():
            return Outcome(check, False, False)  # an empty submit (Enter pressed twice) uses up no try
        if not check.valid:
            self._invalid += 1
            if self._invalid < MAX_INVALID:
                return Outcome(check, False, False)
        self._settle(q, check.correct)
        return Outcome(check, True, check.correct)

    def skip(self) -> None:
        """Give up on the current question (counts as wrong)."""
        q = self.current
        if q is not None:
            self._settle(q, False)

    def _settle(self, q, correct: bool) -> None:
        self._invalid = 0
        self.answered += 1
        self.correct += int(correct)
        self.results.append(correct)
        if self.store is not None:
            try:
                self.store.record_quiz_answer(q.lesson_id, q.kind, correct)
            except ProgressError as exc:
                self.unsaved = exc
        self.index += 1
        if self.finished:
            self.finish()

    def finish(self) -> bool:
        """Save the score when every question was settled; returns whether it was saved."""
        if self.saved or not self.finished or not self.questions:
            return self.saved
        if self.store is not None and self.session_lesson is not None:
            try:
                self.store.record_quiz_session(self.session_lesson, self.correct, len(self.questions))
                self.saved = True
            except ProgressError as exc:
                self.unsaved = exc
        return self.saved


def review_questions(store, count: int, lang: str, seed: int | None = None, now: float | None = None,
                     lesson_id: str | None = None) -> list:
    """Fresh questions for the kinds due for review (at most ``count``)."""
    import random

    from ..lessons.quiz import generators, make_question, question_seed
    from ..lessons.registry import all_lessons

    known = {lesson.id: set(generators(lesson.id)) for lesson in all_lessons()}
    items = due_items(store, now, lesson_id, count, known)
    if seed is None:
        seed = random.SystemRandom().randrange(2 ** 31)
    return [make_question(i.lesson_id, i.kind, question_seed(seed, i.lesson_id, i.kind, n), lang)
            for n, i in enumerate(items)]


def lesson_mastery(store, lesson_id: str) -> float | None:
    """The home screen's mastery figure: :func:`mastery` over the lesson's question kinds, or None
    when the learner has not answered any of its questions yet."""
    from ..lessons.quiz import generators

    if not store.quiz_answers(lesson_id):
        return None
    return mastery(store, lesson_id, len(generators(lesson_id)))
