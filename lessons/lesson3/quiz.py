"""Lesson 3 quiz: failures, checkpoint intervals, exact resumption. Answers from :mod:`.formulas`."""
from __future__ import annotations

from ..quiz import choice, fmt_int, fmt_num, fmt_pct, fmt_time, numeric, t
from . import formulas as f

L = "lesson3"
GPU_MTBF_H = [20_000, 50_000, 100_000]
GPUS = [1024, 2048, 4096, 8192, 16384]
COSTS = [10, 30, 60, 120, 300]
MTBFS = [1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400]


def job_mtbf(rng, lang):
    g_h, g = rng.choice(GPU_MTBF_H), rng.choice(GPUS)
    ans = f.job_mtbf(g_h * 3600.0, g)
    p = t(lang, f"Each GPU fails on average once every {fmt_int(g_h, lang)} hours. What is the mean time between "
                f"failures of a job on {fmt_int(g, lang)} GPUs (in hours)?",
          f"Cada GPU falla de media una vez cada {fmt_int(g_h, lang)} horas. ¿Cuál es el tiempo medio entre fallos de "
          f"un trabajo en {fmt_int(g, lang)} GPUs (en horas)?")
    e = t(lang, f"Any GPU stops the job: M = M_gpu / G = {fmt_int(g_h, lang)} h / {fmt_int(g, lang)} = {fmt_time(ans, lang)}.",
          f"Cualquier GPU detiene el trabajo: M = M_gpu / G = {fmt_int(g_h, lang)} h / {fmt_int(g, lang)} = {fmt_time(ans, lang)}.")
    return numeric(L, "job-mtbf", lang, p, e, ans, "seconds", "h", {"gpu_mtbf": g_h * 3600.0, "n_gpus": g})


def young(rng, lang):
    M, d = rng.choice(MTBFS), rng.choice(COSTS)
    ans = f.young_interval(M, d)
    p = t(lang, f"Job MTBF M = {fmt_time(M, lang)}, a checkpoint takes δ = {fmt_time(d, lang)}. What interval between "
                f"checkpoints does Young's formula give (in minutes)?",
          f"MTBF del trabajo M = {fmt_time(M, lang)}, un checkpoint tarda δ = {fmt_time(d, lang)}. ¿Qué intervalo entre "
          f"checkpoints da la fórmula de Young (en minutos)?")
    e = t(lang, f"τ = √(2·δ·M) = √(2·{fmt_int(d, lang)} s·{fmt_int(M, lang)} s) = {fmt_time(ans, lang)}.",
          f"τ = √(2·δ·M) = √(2·{fmt_int(d, lang)} s·{fmt_int(M, lang)} s) = {fmt_time(ans, lang)}.")
    return numeric(L, "young", lang, p, e, ans, "seconds", "min", {"mtbf": M, "cost": d})


def daly(rng, lang):
    M, d = rng.choice(MTBFS), rng.choice(COSTS)
    ans = f.daly_interval(M, d)
    x = d / (2 * M)
    p = t(lang, f"Job MTBF M = {fmt_time(M, lang)}, checkpoint cost δ = {fmt_time(d, lang)}. What interval does Daly's "
                f"higher-order formula give (in minutes, ±1%)?",
          f"MTBF del trabajo M = {fmt_time(M, lang)}, coste del checkpoint δ = {fmt_time(d, lang)}. ¿Qué intervalo da la "
          f"fórmula de orden superior de Daly (en minutos, ±1 %)?")
    e = t(lang, f"τ = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ with δ/2M = {fmt_num(x, lang)}: "
                f"{fmt_time(f.young_interval(M, d), lang)}·{fmt_num(1 + x ** 0.5 / 3 + x / 9, lang, 5)} − {fmt_time(d, lang)} = "
                f"{fmt_time(ans, lang)}.",
          f"τ = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ con δ/2M = {fmt_num(x, lang)}: "
          f"{fmt_time(f.young_interval(M, d), lang)}·{fmt_num(1 + x ** 0.5 / 3 + x / 9, lang, 5)} − {fmt_time(d, lang)} = "
          f"{fmt_time(ans, lang)}.")
    return numeric(L, "daly", lang, p, e, ans, "seconds", "min", {"mtbf": M, "cost": d}, tolerance=0.01)


def waste(rng, lang):
    M, d = rng.choice(MTBFS), rng.choice(COSTS)
    R = rng.choice([0, 60, 300, 600])
    tau = rng.choice([600, 1800, 3600, 7200])
    ans = f.expected_waste_fraction(tau, M, d, R)
    p = t(lang, f"Checkpoint every τ = {fmt_time(tau, lang)} of work, δ = {fmt_time(d, lang)} per checkpoint, "
                f"restart R = {fmt_time(R, lang)}, job MTBF M = {fmt_time(M, lang)}. What share of wall-clock time is "
                f"wasted (in %, ±2% relative, Daly's exponential model)?",
          f"Checkpoint cada τ = {fmt_time(tau, lang)} de trabajo, δ = {fmt_time(d, lang)} por checkpoint, reinicio "
          f"R = {fmt_time(R, lang)}, MTBF del trabajo M = {fmt_time(M, lang)}. ¿Qué parte del tiempo real se pierde "
          f"(en %, ±2 % relativo, modelo exponencial de Daly)?")
    tw = f.expected_wall_time(1.0, tau, M, d, R)
    e = t(lang, f"T_w/T_s = M·e^(R/M)·(e^((τ+δ)/M) − 1)/τ = {fmt_num(tw, lang, 4)}; waste = 1 − T_s/T_w = "
                f"{fmt_pct(ans, lang)} (first order: δ/τ + (τ+δ)/2M + R/M ≈ "
                f"{fmt_pct(f.first_order_overhead(tau, M, d, R), lang)} of the work).",
          f"T_w/T_s = M·e^(R/M)·(e^((τ+δ)/M) − 1)/τ = {fmt_num(tw, lang, 4)}; pérdida = 1 − T_s/T_w = "
          f"{fmt_pct(ans, lang)} (primer orden: δ/τ + (τ+δ)/2M + R/M ≈ "
          f"{fmt_pct(f.first_order_overhead(tau, M, d, R), lang)} del trabajo).")
    return numeric(L, "waste", lang, p, e, ans, "fraction", "%", {"interval": tau, "mtbf": M, "cost": d, "restart": R})


def failures_per_day(rng, lang):
    g_h, g = rng.choice(GPU_MTBF_H), rng.choice(GPUS)
    M = f.job_mtbf(g_h * 3600.0, g)
    ans = f.expected_failures(86400.0, M)
    p = t(lang, f"{fmt_int(g, lang)} GPUs, each with an MTBF of {fmt_int(g_h, lang)} hours: how many failures per day "
                f"should the job expect?",
          f"{fmt_int(g, lang)} GPUs, cada una con un MTBF de {fmt_int(g_h, lang)} horas: ¿cuántos fallos al día debe "
          f"esperar el trabajo?")
    e = t(lang, f"M = {fmt_int(g_h, lang)} h / {fmt_int(g, lang)} = {fmt_time(M, lang)}; 24 h / M = {fmt_num(ans, lang)} per day.",
          f"M = {fmt_int(g_h, lang)} h / {fmt_int(g, lang)} = {fmt_time(M, lang)}; 24 h / M = {fmt_num(ans, lang)} al día.")
    return numeric(L, "failures-per-day", lang, p, e, ans, "number", "", {"gpu_mtbf": g_h * 3600.0, "n_gpus": g})


def gpu_mtbf_from_log(rng, lang):
    g = rng.choice(GPUS)
    days = rng.choice([30, 54, 60, 90])
    failures = rng.choice([50, 120, 200, 419])
    ans = f.component_mtbf_from_log(g, days * 86400.0, failures)
    p = t(lang, f"A training run on {fmt_int(g, lang)} GPUs saw {failures} interruptions in {days} days. Assuming each "
                f"GPU is equally likely to be the cause, what is the MTBF of one GPU (in hours)?",
          f"Un entrenamiento en {fmt_int(g, lang)} GPUs sufrió {failures} interrupciones en {days} días. Suponiendo que "
          f"cada GPU tiene la misma probabilidad de causarlas, ¿cuál es el MTBF de una GPU (en horas)?")
    e = t(lang, f"Job MTBF = {days}·24 h / {failures} = {fmt_time(days * 86400 / failures, lang)}; × G = "
                f"{fmt_int(g, lang)} gives {fmt_time(ans, lang)} (Llama 3: 419 in 54 days on 16,384 GPUs).",
          f"MTBF del trabajo = {days}·24 h / {failures} = {fmt_time(days * 86400 / failures, lang)}; × G = "
          f"{fmt_int(g, lang)} da {fmt_time(ans, lang)} (Llama 3: 419 en 54 días con 16.384 GPUs).")
    return numeric(L, "gpu-mtbf-from-log", lang, p, e, ans, "seconds", "h",
                   {"n_components": g, "duration_s": days * 86400.0, "failures": failures})


def scaling(rng, lang):
    k = rng.choice([4, 9, 16])
    root = int(round(k ** 0.5))
    what = rng.choice(["cost", "mtbf"])
    subject = {"cost": t(lang, "the checkpoint cost δ", "el coste del checkpoint δ"),
               "mtbf": t(lang, "the job MTBF M", "el MTBF del trabajo M")}[what]
    right = t(lang, f"It grows {root}× (√{k})", f"Crece {root}× (√{k})")
    return choice(
        L, "scaling", lang, rng,
        t(lang, f"If {subject} grows {k}×, what happens to Young's optimal interval √(2δM)?",
          f"Si {subject} crece {k}×, ¿qué le pasa al intervalo óptimo de Young √(2δM)?"),
        right,
        [t(lang, f"It grows {k}×", f"Crece {k}×"), t(lang, "It does not change", "No cambia"),
         t(lang, f"It shrinks {root}×", f"Se reduce {root}×")],
        t(lang, f"τ ∝ √δ·√M: multiplying either by {k} multiplies τ by √{k} = {root}.",
          f"τ ∝ √δ·√M: multiplicar cualquiera por {k} multiplica τ por √{k} = {root}."),
        {"factor": k, "what": what})


def exact_state(rng, lang):
    return choice(
        L, "exact-state", lang, rng,
        t(lang, "A run resumes from a checkpoint holding the model and optimizer state only. Why is its loss curve "
                "not bit-identical to an uninterrupted run?",
          "Una ejecución se reanuda desde un checkpoint con solo el modelo y el optimizador. ¿Por qué su curva de "
          "pérdida no es idéntica bit a bit a la de una ejecución sin interrupción?"),
        t(lang, "The RNG states, LR scheduler, data sampler position and step were not saved",
          "No se guardaron los estados de los RNG, el scheduler del LR, la posición del sampler de datos ni el paso"),
        [t(lang, "Floating-point addition is random", "La suma en coma flotante es aleatoria"),
         t(lang, "The optimizer state cannot be saved exactly", "El estado del optimizador no se puede guardar exactamente"),
         t(lang, "It is bit-identical: nothing else is needed", "Sí es idéntica: no hace falta nada más")],
        t(lang, "An exact resume needs everything the next step reads: model, optimizer, LR scheduler, every rank's "
                "torch/numpy/python RNG state, the sampler's position and the step (and the loss scaler's state).",
          "Una reanudación exacta necesita todo lo que lee el siguiente paso: modelo, optimizador, scheduler del LR, "
          "el estado de los RNG torch/numpy/python de cada rank, la posición del sampler y el paso (y el del loss scaler)."))


def atomic(rng, lang):
    return choice(
        L, "atomic", lang, rng,
        t(lang, "How do you write a checkpoint so that a crash mid-write never leaves a torn file to load?",
          "¿Cómo se escribe un checkpoint para que un fallo a mitad de escritura nunca deje un fichero roto que cargar?"),
        t(lang, "Write to a temporary file, fsync it, then rename it over the final name",
          "Escribir en un fichero temporal, hacer fsync y renombrarlo al nombre final"),
        [t(lang, "Write directly to the final file, but quickly", "Escribir directamente en el fichero final, pero rápido"),
         t(lang, "Delete the old checkpoint first, then write the new one", "Borrar primero el checkpoint anterior y luego escribir el nuevo"),
         t(lang, "Compress the checkpoint", "Comprimir el checkpoint")],
        t(lang, "rename() within a file system is atomic: readers see the old file or the complete new one; fsync "
                "makes sure the data is on disk before the rename, and a checksum catches what slips through.",
          "rename() dentro de un sistema de ficheros es atómico: se ve el fichero viejo o el nuevo completo; fsync "
          "asegura que los datos están en disco antes del rename, y un checksum detecta lo que se escape."))


GENERATORS = {
    "job-mtbf": job_mtbf,
    "young": young,
    "daly": daly,
    "waste": waste,
    "failures-per-day": failures_per_day,
    "gpu-mtbf-from-log": gpu_mtbf_from_log,
    "scaling": scaling,
    "exact-state": exact_state,
    "atomic": atomic,
}
