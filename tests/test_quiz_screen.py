"""The tutor's QuizScreen driven with Pilot: answers checked, explanations shown, progress saved."""
from __future__ import annotations

import asyncio

from textual.widgets import Input, OptionList, Static

from distai.lessons import quiz
from distai.lessons.registry import resolve_lesson
from distai.tutor.app import DistaiApp
from distai.tutor.quiz_screen import QuizScreen
from distai.tutor.screens.lesson import LessonScreen


def plain(widget: Static) -> str:
    content = widget.content
    return content.plain if hasattr(content, "plain") else str(content)


def test_quiz_screen_full_round():
    async def main():
        lesson = resolve_lesson("2")
        questions = quiz.build_quiz("lesson2", 3, 21, "es")
        app = DistaiApp("es")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("enter")  # open lesson 1 (highlighted on home), then push lesson 2's quiz
            await pilot.pause()
            assert isinstance(app.screen, LessonScreen)
            app.push_screen(QuizScreen(lesson, "es", count=3, seed=21))
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, QuizScreen)
            assert any(q.is_choice for q in questions) and not questions[0].is_choice
            for i, q in enumerate(questions):
                assert plain(screen.query_one("#quiz-prompt", Static)).startswith(q.prompt)
                if i == 0:
                    # An unreadable answer asks again; then the right one.
                    screen.query_one(Input).value = "¿?"
                    await pilot.press("enter")
                    await pilot.pause()
                    assert "inténtalo de nuevo" in plain(screen.query_one("#quiz-feedback", Static))
                if q.is_choice:
                    # Pick the option with the keyboard in the option list (the wrong one for the last).
                    ol = screen.query_one(OptionList)
                    ol.focus()
                    ol.highlighted = q.answer if i < 2 else (q.answer + 1) % len(q.choices)
                    await pilot.press("enter")
                else:
                    right = str(q.answer + 1) if q.is_choice else q.answer_text()
                    wrong = str((q.answer + 1) % len(q.choices) + 1) if q.is_choice else "0"
                    screen.query_one(Input).value = right if i < 2 else wrong
                    await pilot.press("enter")
                await pilot.pause()
                feedback = plain(screen.query_one("#quiz-feedback", Static))
                assert q.explanation in feedback
                assert ("✓" in feedback) == (i < 2)
                # after an answer picked in the list too, Enter goes on: the focus is back in the box
                assert app.focused is screen.query_one(Input)
                await pilot.press("enter")  # next
                await pilot.pause()
            assert "Puntuación: 2/3" in plain(screen.query_one("#quiz-prompt", Static))
            assert plain(screen.query_one("#quiz-counter", Static)) == ""  # no "pregunta 3 de 3" over the score
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, LessonScreen)
            assert app.store.best_quiz_score("lesson2") == 2 / 3
            assert len(app.store.quiz_answers("lesson2")) == 3
            summary = app.progress_summary()
            assert summary["lesson2"]["best_quiz"] == 2 / 3
            assert summary["lesson2"]["mastery"] == 0.0

    asyncio.run(main())


def test_lesson_screen_t_opens_the_quiz():
    async def main():
        app = DistaiApp("en")
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("enter", "t")
            await pilot.pause()
            assert isinstance(app.screen, QuizScreen)
            assert app.screen.lesson.id == "lesson1" and app.screen.lang == "en"
            assert plain(app.screen.query_one("#quiz-prompt", Static))

    asyncio.run(main())
