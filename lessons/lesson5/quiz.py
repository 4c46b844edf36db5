"""Lesson 5 quiz: pipeline schedules, bubbles and activation memory. Answers from :mod:`.formulas`."""
from __future__ import annotations

from ..quiz import choice, fmt_num, fmt_pct, numeric, t
from . import formulas as f

L = "lesson5"
PS = [2, 4, 8, 16]
MS = [4, 8, 16, 32, 64]


def bubble_fraction(rng, lang):
    p, m = rng.choice(PS), rng.choice(MS)
    ans = f.bubble_fraction(p, m)
    q = t(lang, f"1F1B pipeline with p = {p} stages and m = {m} microbatches: what share of the step is bubble (in %)?",
          f"Pipeline 1F1B con p = {p} etapas y m = {m} microbatches: ¿qué parte del paso es burbuja (en %)?")
    e = t(lang, f"(p−1)/(m+p−1) = {p - 1}/{m + p - 1} = {fmt_pct(ans, lang)}.",
          f"(p−1)/(m+p−1) = {p - 1}/{m + p - 1} = {fmt_pct(ans, lang)}.")
    return numeric(L, "bubble-fraction", lang, q, e, ans, "fraction", "%", {"p": p, "m": m})


def bubble_ratio(rng, lang):
    p, m = rng.choice(PS), rng.choice(MS)
    ans = f.bubble_ratio(p, m)
    q = t(lang, f"GPipe with p = {p} and m = {m}: how long is the bubble relative to the ideal (bubble-free) time, in %?",
          f"GPipe con p = {p} y m = {m}: ¿cuánto dura la burbuja respecto al tiempo ideal (sin burbuja), en %?")
    e = t(lang, f"(p−1)/m = {p - 1}/{m} = {fmt_pct(ans, lang)} (Narayanan et al. 2021).",
          f"(p−1)/m = {p - 1}/{m} = {fmt_pct(ans, lang)} (Narayanan et al. 2021).")
    return numeric(L, "bubble-ratio", lang, q, e, ans, "fraction", "%", {"p": p, "m": m})


def step_time(rng, lang):
    p, m = rng.choice(PS), rng.choice(MS)
    ans = f.step_time_units(p, m)
    q = t(lang, f"p = {p} equal stages, m = {m} microbatches, one microbatch's forward+backward on one stage takes 1 unit. "
                f"How many units does a GPipe or 1F1B step take?",
          f"p = {p} etapas iguales, m = {m} microbatches, el forward+backward de un microbatch en una etapa dura 1 unidad. "
          f"¿Cuántas unidades dura un paso GPipe o 1F1B?")
    e = t(lang, f"m useful units plus p−1 to fill and drain: {m} + {p - 1} = {fmt_num(ans, lang)}.",
          f"m unidades útiles más p−1 de llenado y vaciado: {m} + {p - 1} = {fmt_num(ans, lang)}.")
    return numeric(L, "step-time", lang, q, e, ans, "number", "", {"p": p, "m": m}, integer=True)


def peak_inflight(rng, lang):
    p, m = rng.choice(PS), rng.choice(MS)
    sched = rng.choice(["gpipe", "1f1b"])
    ans = f.peak_inflight_microbatches(p, m, sched)
    name = {"gpipe": "GPipe", "1f1b": "1F1B"}[sched]
    q = t(lang, f"{name}, p = {p}, m = {m}: at most how many microbatches' activations does the first stage hold at once?",
          f"{name}, p = {p}, m = {m}: ¿cuántos microbatches de activaciones guarda como máximo a la vez la primera etapa?")
    e = {"gpipe": t(lang, f"GPipe runs all m = {m} forwards before any backward: {m}.",
                    f"GPipe hace los m = {m} forwards antes de cualquier backward: {m}."),
         "1f1b": t(lang, f"1F1B: p−1 warm-up forwards, then one forward per backward: min(p, m) = {int(ans)}.",
                   f"1F1B: p−1 forwards de calentamiento y luego uno por cada backward: min(p, m) = {int(ans)}.")}[sched]
    return numeric(L, "peak-inflight", lang, q, e, ans, "number", "", {"p": p, "m": m, "schedule": sched}, integer=True)


def interleaved(rng, lang):
    p, m, v = rng.choice(PS[1:]), rng.choice(MS), rng.choice([2, 3, 4])
    ans = f.bubble_fraction(p, m, v)
    q = t(lang, f"Interleaved 1F1B, p = {p}, m = {m}, v = {v} model chunks per GPU: what share of the step is bubble (in %)?",
          f"1F1B intercalado, p = {p}, m = {m}, v = {v} trozos del modelo por GPU: ¿qué parte del paso es burbuja (en %)?")
    e = t(lang, f"The fill and drain shrink to (p−1)/v units: (p−1)/(v·m + p − 1) = {p - 1}/{v * m + p - 1} = {fmt_pct(ans, lang)}.",
          f"El llenado y vaciado se reducen a (p−1)/v unidades: (p−1)/(v·m + p − 1) = {p - 1}/{v * m + p - 1} = {fmt_pct(ans, lang)}.")
    return numeric(L, "interleaved", lang, q, e, ans, "fraction", "%", {"p": p, "m": m, "v": v})


def microbatches_needed(rng, lang):
    p = rng.choice([4, 8, 16, 32])
    target = rng.choice([0.05, 0.1, 0.2])
    ans = f.microbatches_for_bubble(p, target)
    q = t(lang, f"p = {p} stages, 1F1B: what is the smallest number of microbatches m that keeps the bubble at or below "
                f"{fmt_pct(target, lang)} of the step?",
          f"p = {p} etapas, 1F1B: ¿cuál es el menor número de microbatches m que deja la burbuja en {fmt_pct(target, lang)} "
          f"del paso o menos?")
    e = t(lang, f"(p−1)/(m+p−1) ≤ f ⇔ m ≥ (p−1)(1−f)/f = {fmt_num((p - 1) * (1 - target) / target, lang)} → m = {ans}.",
          f"(p−1)/(m+p−1) ≤ f ⇔ m ≥ (p−1)(1−f)/f = {fmt_num((p - 1) * (1 - target) / target, lang)} → m = {ans}.")
    return numeric(L, "microbatches-needed", lang, q, e, ans, "number", "", {"p": p, "target": target}, integer=True)


def warmup(rng, lang):
    p = rng.choice([4, 8, 16])
    m = rng.choice([2 * p, 4 * p])
    rank = rng.randrange(p)
    ans = f.onef1b_warmup_forwards(p, m, rank)
    q = t(lang, f"1F1B with p = {p} stages and m = {m} microbatches: how many warm-up forwards does stage {rank} (0 is the "
                f"first) run before its first backward?",
          f"1F1B con p = {p} etapas y m = {m} microbatches: ¿cuántos forwards de calentamiento hace la etapa {rank} (0 es "
          f"la primera) antes de su primer backward?")
    e = t(lang, f"p − rank − 1 = {p} − {rank} − 1 = {ans}: the last stage starts its backward right away.",
          f"p − rank − 1 = {p} − {rank} − 1 = {ans}: la última etapa empieza su backward enseguida.")
    return numeric(L, "warmup", lang, q, e, ans, "number", "", {"p": p, "m": m, "rank": rank}, integer=True)


def same_time(rng, lang):
    return choice(
        L, "same-time", lang, rng,
        t(lang, "Compared with GPipe on the same p and m, what does 1F1B change?",
          "Comparado con GPipe con los mismos p y m, ¿qué cambia 1F1B?"),
        t(lang, "Same step time and bubble, but at most p microbatches of activations instead of m",
          "Mismo tiempo de paso y burbuja, pero como mucho p microbatches de activaciones en vez de m"),
        [t(lang, "It removes the bubble entirely", "Elimina la burbuja por completo"),
         t(lang, "It halves the step time", "Reduce el tiempo del paso a la mitad"),
         t(lang, "It needs more activation memory than GPipe", "Necesita más memoria de activaciones que GPipe")],
        t(lang, "Both fill and drain the pipeline once per step: (p−1)/(m+p−1) bubble. 1F1B starts backwards early, so a "
                "stage never holds more than p microbatches in flight.",
          "Ambos llenan y vacían el pipeline una vez por paso: burbuja (p−1)/(m+p−1). 1F1B empieza los backward pronto, "
          "así que una etapa nunca tiene más de p microbatches en vuelo."))


def interleaved_cost(rng, lang):
    return choice(
        L, "interleaved-cost", lang, rng,
        t(lang, "Interleaving v model chunks per GPU divides the bubble by v. What does it cost?",
          "Intercalar v trozos del modelo por GPU divide la burbuja entre v. ¿Qué cuesta?"),
        t(lang, "v times more point-to-point communication between stages",
          "v veces más comunicación punto a punto entre etapas"),
        [t(lang, "v times more parameters per GPU", "v veces más parámetros por GPU"),
         t(lang, "v times more compute", "v veces más cómputo"), t(lang, "Nothing", "Nada")],
        t(lang, "Each microbatch now crosses every GPU v times, so activations are sent v times as often (Narayanan et "
                "al. 2021); memory also rises slightly.",
          "Cada microbatch atraviesa cada GPU v veces, así que las activaciones se envían v veces más (Narayanan et al. "
          "2021); la memoria también sube un poco."))


def zero_bubble(rng, lang):
    return choice(
        L, "zero-bubble", lang, rng,
        t(lang, "What idea lets zero-bubble schedules fill the pipeline bubble?",
          "¿Qué idea permite a las planificaciones zero-bubble rellenar la burbuja?"),
        t(lang, "Split the backward into input-gradient and weight-gradient parts and schedule the weight part into the gaps",
          "Partir el backward en gradiente de la entrada y gradiente de los pesos y colocar la parte de pesos en los huecos"),
        [t(lang, "Use more microbatches than stages", "Usar más microbatches que etapas"),
         t(lang, "Skip the backward of the first stage", "Saltarse el backward de la primera etapa"),
         t(lang, "Run the optimizer step asynchronously", "Ejecutar el paso del optimizador de forma asíncrona")],
        t(lang, "Only the input gradient (B) is on the critical path to the previous stage; the weight gradient (W) can "
                "wait, so it fills idle slots (Qi et al. 2023). DualPipe builds on the same split.",
          "Solo el gradiente de la entrada (B) está en el camino crítico hacia la etapa anterior; el de los pesos (W) "
          "puede esperar y rellena los huecos (Qi et al. 2023). DualPipe parte de la misma división."))


GENERATORS = {
    "bubble-fraction": bubble_fraction,
    "bubble-ratio": bubble_ratio,
    "step-time": step_time,
    "peak-inflight": peak_inflight,
    "interleaved": interleaved,
    "microbatches-needed": microbatches_needed,
    "warmup": warmup,
    "same-time": same_time,
    "interleaved-cost": interleaved_cost,
    "zero-bubble": zero_bubble,
}
