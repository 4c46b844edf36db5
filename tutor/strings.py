"""Every user-interface string of the tutor, in English and Spanish, in one place.

``tr(key, lang, **fields)`` formats one of them. Lesson content (titles, step text) lives in
the lesson folders, not here.
"""
from __future__ import annotations

STRINGS: dict[str, dict[str, str]] = {
    "app_title": {"en": "distai", "es": "distai"},
    "app_tagline": {
        "en": "a terminal tutor and live lab for distributed AI",
        "es": "tutor de terminal y laboratorio en vivo de IA distribuida",
    },
    "home_hint": {
        "en": "Choose a lesson, press Enter or click it · ? help · l español",
        "es": "Elige una lección, pulsa Enter o haz clic · ? ayuda · l english",
    },
    "lesson_n": {"en": "Lesson {n}", "es": "Lección {n}"},
    "minutes": {"en": "{m} min", "es": "{m} min"},
    "steps_done": {"en": "steps {done}/{total}", "es": "pasos {done}/{total}"},
    "best_quiz": {"en": "best quiz {score}", "es": "mejor quiz {score}"},
    "no_quiz": {"en": "quiz —", "es": "quiz —"},
    "mastery": {"en": "mastery {score}", "es": "dominio {score}"},
    "mastery_explained": {
        "en": "Mastery: the share of this lesson's question kinds you have answered right twice, a day "
              "apart; `distai quiz --review` asks the ones that are due.",
        "es": "Dominio: la parte de los tipos de pregunta de esta lección que has acertado dos veces, con "
              "un día de separación; `distai quiz --review` te pregunta las que tocan.",
    },
    "runs": {"en": "runs {n}", "es": "ejecuciones {n}"},
    "summary": {"en": "What you will learn", "es": "Qué aprenderás"},
    "references": {"en": "References", "es": "Referencias"},
    "step_counter": {"en": "Step {k} of {n}", "es": "Paso {k} de {n}"},
    "prev": {"en": "◀ Previous", "es": "◀ Anterior"},
    "next": {"en": "Next ▶", "es": "Siguiente ▶"},
    "quiz": {"en": "Quiz (t)", "es": "Quiz (t)"},
    "run": {"en": "Run experiment (r)", "es": "Ejecutar experimento (r)"},
    "back": {"en": "Back", "es": "Volver"},
    "text_missing": {
        "en": "*The text of this step is not yet written* (`{path}`).",
        "es": "*El texto de este paso aún no está escrito* (`{path}`).",
    },
    "code_title": {"en": "The code that runs: {where}", "es": "El código que se ejecuta: {where}"},
    "code_missing": {
        "en": "Source not available for `{spec}`: {reason}",
        "es": "Código fuente no disponible para `{spec}`: {reason}",
    },
    "visualizer": {"en": "visualizer", "es": "visualizador"},
    "quiz_unavailable": {"en": "The quiz is not yet available.", "es": "El quiz aún no está disponible."},
    "run_unavailable": {
        "en": "Running the experiment from the tutor is not yet available.",
        "es": "Ejecutar el experimento desde el tutor aún no está disponible.",
    },
    "no_experiment": {
        "en": "This lesson has no experiment to run.",
        "es": "Esta lección no tiene experimento que ejecutar.",
    },
    "first_step": {"en": "This is the first step.", "es": "Este es el primer paso."},
    "last_step": {
        "en": "Last step. Press t for the quiz or q to go back.",
        "es": "Último paso. Pulsa t para el quiz o q para volver.",
    },
    "resumed": {"en": "Resuming at step {k}.", "es": "Continúas en el paso {k}."},
    "language_now": {"en": "Language: English", "es": "Idioma: español"},
    "progress_unsaved": {
        "en": "Progress will not be saved: {error}",
        "es": "El progreso no se guardará: {error}",
    },
    "help_title": {"en": "Keys", "es": "Teclas"},
    "help_close": {"en": "Press Esc, q or ? to close.", "es": "Pulsa Esc, q o ? para cerrar."},
    "key_next": {"en": "next step", "es": "paso siguiente"},
    "key_prev": {"en": "previous step", "es": "paso anterior"},
    "key_back": {"en": "back / quit", "es": "volver / salir"},
    "key_help": {"en": "this help", "es": "esta ayuda"},
    "key_run": {"en": "run the lesson's experiment", "es": "ejecutar el experimento de la lección"},
    "key_quiz": {"en": "take the lesson's quiz", "es": "hacer el quiz de la lección"},
    "key_lang": {"en": "switch language English/Spanish", "es": "cambiar idioma español/inglés"},
    "key_visualizer": {"en": "show/hide the visualizer", "es": "mostrar/ocultar el visualizador"},
    "key_open": {"en": "open the selected lesson", "es": "abrir la lección seleccionada"},
    "key_move": {"en": "move the selection", "es": "mover la selección"},
    "key_palette": {"en": "command palette (open any lesson)", "es": "paleta de comandos (abrir cualquier lección)"},
    "key_mouse": {"en": "buttons and lessons are clickable", "es": "los botones y las lecciones admiten clic"},
    "mouse": {"en": "mouse", "es": "ratón"},
    "binding_next": {"en": "Next", "es": "Siguiente"},
    "binding_prev": {"en": "Previous", "es": "Anterior"},
    "binding_back": {"en": "Back", "es": "Volver"},
    "binding_quit": {"en": "Quit", "es": "Salir"},
    "binding_help": {"en": "Help", "es": "Ayuda"},
    "binding_run": {"en": "Run", "es": "Ejecutar"},
    "binding_quiz": {"en": "Quiz", "es": "Quiz"},
    "binding_lang": {"en": "Español", "es": "English"},
    "binding_open": {"en": "Open", "es": "Abrir"},
    "cmd_open": {"en": "Open lesson {n}: {title}", "es": "Abrir lección {n}: {title}"},
    "cmd_open_help": {"en": "{m} min · {slug}", "es": "{m} min · {slug}"},
    "cmd_lang": {"en": "Switch language to Spanish", "es": "Cambiar idioma a inglés"},
    "cmd_lang_help": {"en": "Re-render the tutor in Spanish", "es": "Mostrar el tutor en inglés"},
    "replay_none": {
        "en": "No {lesson} run yet: start one with r (or `distai run {lesson}`)",
        "es": "Aún no hay ejecuciones de {lesson}: lanza una con r (o `distai run {lesson}`)",
    },
    "replay_loaded": {"en": "Replaying run {run} ({status})", "es": "Reproduciendo la ejecución {run} ({status})"},
    "replay_failed": {"en": "Could not replay the run: {error}", "es": "No se pudo reproducir la ejecución: {error}"},
    "help_visualizer": {"en": "Visualizer", "es": "Visualizador"},
    "cmd_home": {"en": "Go to the lesson list", "es": "Ir a la lista de lecciones"},
    "cmd_home_help": {"en": "The seven lessons and your progress", "es": "Las siete lecciones y tu progreso"},
}


def tr(key: str, lang: str, **fields) -> str:
    """The UI string ``key`` in ``lang`` (falls back to English), formatted with ``fields``."""
    entry = STRINGS[key]
    text = entry.get(lang) or entry["en"]
    return text.format(**fields) if fields else text


def percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{round(100 * fraction)}%"
