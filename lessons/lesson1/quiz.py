"""Lesson 1 quiz: data parallelism and the ring all-reduce. Answers from :mod:`.formulas`."""
from __future__ import annotations

import random

from ..quiz import choice, fmt_bytes, fmt_int, fmt_num, fmt_time, numeric, t
from . import formulas as f

L = "lesson1"
SIZES = [64e6, 100e6, 256e6, 500e6, 1e9, 2e9, 4e9]
BANDWIDTHS = [12.5e9, 25e9, 50e9, 100e9, 200e9]
ALPHAS = [2e-6, 5e-6, 10e-6, 20e-6]
RANKS = [2, 4, 8, 16, 32, 64]


def _setup(rng: random.Random):
    return rng.choice(SIZES), rng.choice(RANKS), rng.choice(ALPHAS), rng.choice(BANDWIDTHS)


def ring_time(rng, lang):
    S, n, a, bw = _setup(rng)
    b = 1 / bw
    ans = f.ring_allreduce_time(S, n, a, b)
    lat, band = 2 * (n - 1) * a, 2 * (n - 1) / n * S * b
    p = t(lang, f"A ring all-reduce of {fmt_bytes(S, lang)} runs on N = {n} GPUs with α = {fmt_time(a, lang)} per "
                f"message and links of {fmt_num(bw / 1e9, lang)} GB/s. How long does it take (in ms)?",
          f"Un all-reduce en anillo de {fmt_bytes(S, lang)} se ejecuta en N = {n} GPUs con α = {fmt_time(a, lang)} "
          f"por mensaje y enlaces de {fmt_num(bw / 1e9, lang)} GB/s. ¿Cuánto tarda (en ms)?")
    e = t(lang, f"T = 2(N−1)·α + 2(N−1)/N·S·β = {2 * (n - 1)}·{fmt_time(a, lang)} + {fmt_num(2 * (n - 1) / n, lang, 4)}·"
                f"{fmt_bytes(S, lang)}/({fmt_num(bw / 1e9, lang)} GB/s) = {fmt_time(lat, lang)} + "
                f"{fmt_time(band, lang)} = {fmt_time(ans, lang)}.",
          f"T = 2(N−1)·α + 2(N−1)/N·S·β = {2 * (n - 1)}·{fmt_time(a, lang)} + {fmt_num(2 * (n - 1) / n, lang, 4)}·"
          f"{fmt_bytes(S, lang)}/({fmt_num(bw / 1e9, lang)} GB/s) = {fmt_time(lat, lang)} + "
          f"{fmt_time(band, lang)} = {fmt_time(ans, lang)}.")
    return numeric(L, "ring-time", lang, p, e, ans, "seconds", "ms",
                   {"size_bytes": S, "n": n, "alpha": a, "beta": b})


def ring_bytes(rng, lang):
    S, n, _, _ = _setup(rng)
    ans = f.allreduce_bytes_per_rank(S, n, "ring")
    p = t(lang, f"In a ring all-reduce of {fmt_bytes(S, lang)} on {n} GPUs, how many bytes does each GPU send "
                f"(in MB)?",
          f"En un all-reduce en anillo de {fmt_bytes(S, lang)} con {n} GPUs, ¿cuántos bytes envía cada GPU (en MB)?")
    e = t(lang, f"2(N−1) steps of S/N bytes: 2·{n - 1}/{n}·{fmt_bytes(S, lang)} = {fmt_bytes(ans, lang)} — "
                f"less than 2S whatever N is.",
          f"2(N−1) pasos de S/N bytes: 2·{n - 1}/{n}·{fmt_bytes(S, lang)} = {fmt_bytes(ans, lang)}, "
          f"menos de 2S sea cual sea N.")
    return numeric(L, "ring-bytes", lang, p, e, ans, "bytes", "MB", {"size_bytes": S, "n": n})


def ring_steps(rng, lang):
    n = rng.choice(RANKS + [3, 5, 6, 12, 24])
    ans = f.allreduce_steps(n, "ring")
    p = t(lang, f"How many communication steps does a ring all-reduce on {n} GPUs take (reduce-scatter plus "
                f"all-gather)?",
          f"¿Cuántos pasos de comunicación hace un all-reduce en anillo con {n} GPUs (reduce-scatter más "
          f"all-gather)?")
    e = t(lang, f"N−1 = {n - 1} steps of reduce-scatter and N−1 = {n - 1} of all-gather: 2(N−1) = {ans}.",
          f"N−1 = {n - 1} pasos de reduce-scatter y N−1 = {n - 1} de all-gather: 2(N−1) = {ans}.")
    return numeric(L, "ring-steps", lang, p, e, ans, "number", "", {"n": n}, integer=True)


def tree_steps(rng, lang):
    n = rng.choice([4, 8, 16, 32, 64, 128, 256, 1000, 1024])
    ans = f.allreduce_steps(n, "tree")
    p = t(lang, f"A binomial-tree all-reduce (reduce to one rank, then broadcast) on {n} GPUs: how many "
                f"message steps are on the critical path?",
          f"Un all-reduce en árbol binomial (reducir a un rank y luego difundir) con {n} GPUs: ¿cuántos pasos "
          f"de mensajes hay en el camino crítico?")
    e = t(lang, f"⌈log2 {n}⌉ = {f.tree_depth(n)} rounds up and {f.tree_depth(n)} down: 2⌈log2 N⌉ = {ans} steps, "
                f"each moving the whole buffer (the ring needs {2 * (n - 1)} smaller ones).",
          f"⌈log2 {n}⌉ = {f.tree_depth(n)} rondas de subida y {f.tree_depth(n)} de bajada: 2⌈log2 N⌉ = {ans} pasos, "
          f"cada uno con todo el buffer (el anillo necesita {2 * (n - 1)} más pequeños).")
    return numeric(L, "tree-steps", lang, p, e, ans, "number", "", {"n": n}, integer=True)


def busbw_q(rng, lang):
    S = rng.choice(SIZES)
    n = rng.choice(RANKS)
    time_s = rng.choice([2e-3, 5e-3, 8e-3, 10e-3, 20e-3, 40e-3, 80e-3])
    ans = f.busbw(S, time_s, n)
    alg = f.algbw(S, time_s)
    p = t(lang, f"nccl-tests reports an all-reduce of {fmt_bytes(S, lang)} on {n} GPUs taking "
                f"{fmt_time(time_s, lang)}. What is the bus bandwidth busbw (in GB/s)?",
          f"nccl-tests mide un all-reduce de {fmt_bytes(S, lang)} con {n} GPUs en {fmt_time(time_s, lang)}. "
          f"¿Cuál es el ancho de banda de bus busbw (en GB/s)?")
    e = t(lang, f"algbw = S/t = {fmt_num(alg / 1e9, lang)} GB/s; busbw = algbw·2(N−1)/N = "
                f"{fmt_num(alg / 1e9, lang)}·{fmt_num(f.busbw_factor(n), lang, 4)} = {fmt_num(ans / 1e9, lang)} GB/s.",
          f"algbw = S/t = {fmt_num(alg / 1e9, lang)} GB/s; busbw = algbw·2(N−1)/N = "
          f"{fmt_num(alg / 1e9, lang)}·{fmt_num(f.busbw_factor(n), lang, 4)} = {fmt_num(ans / 1e9, lang)} GB/s.")
    return numeric(L, "busbw", lang, p, e, ans, "bandwidth", "GB/s", {"size_bytes": S, "time_s": time_s, "n": n})


def algbw_q(rng, lang):
    S = rng.choice(SIZES)
    time_s = rng.choice([2e-3, 5e-3, 8e-3, 10e-3, 20e-3, 40e-3])
    ans = f.algbw(S, time_s)
    p = t(lang, f"An all-reduce of {fmt_bytes(S, lang)} takes {fmt_time(time_s, lang)}. What is its algorithm "
                f"bandwidth algbw (in GB/s)?",
          f"Un all-reduce de {fmt_bytes(S, lang)} tarda {fmt_time(time_s, lang)}. ¿Cuál es su ancho de banda de "
          f"algoritmo algbw (en GB/s)?")
    e = t(lang, f"algbw = S/t = {fmt_bytes(S, lang)} / {fmt_time(time_s, lang)} = {fmt_num(ans / 1e9, lang)} GB/s.",
          f"algbw = S/t = {fmt_bytes(S, lang)} / {fmt_time(time_s, lang)} = {fmt_num(ans / 1e9, lang)} GB/s.")
    return numeric(L, "algbw", lang, p, e, ans, "bandwidth", "GB/s", {"size_bytes": S, "time_s": time_s})


def naive_ratio(rng, lang):
    S, n, a, bw = _setup(rng)
    b = 1 / bw
    naive = f.naive_allreduce_time(S, n, a, b)
    ring = f.ring_allreduce_time(S, n, a, b)
    ans = naive / ring
    p = t(lang, f"{fmt_bytes(S, lang)} on {n} GPUs, α = {fmt_time(a, lang)}, {fmt_num(bw / 1e9, lang)} GB/s links: "
                f"how many times slower is the naive all-reduce (reduce to rank 0, then broadcast) than the ring?",
          f"{fmt_bytes(S, lang)} en {n} GPUs, α = {fmt_time(a, lang)}, enlaces de {fmt_num(bw / 1e9, lang)} GB/s: "
          f"¿cuántas veces más lento es el all-reduce ingenuo (reducir en el rank 0 y difundir) que el anillo?")
    e = t(lang, f"Naive: 2(N−1)(α + S·β) = {fmt_time(naive, lang)}; ring: {fmt_time(ring, lang)}; ratio "
                f"{fmt_num(ans, lang)}× — close to N = {n} for large messages.",
          f"Ingenuo: 2(N−1)(α + S·β) = {fmt_time(naive, lang)}; anillo: {fmt_time(ring, lang)}; cociente "
          f"{fmt_num(ans, lang)}×, cerca de N = {n} para mensajes grandes.")
    return numeric(L, "naive-ratio", lang, p, e, ans, "number", "", {"size_bytes": S, "n": n, "alpha": a, "beta": b})


def crossover(rng, lang):
    n = rng.choice(RANKS)
    a = rng.choice(ALPHAS)
    bw = rng.choice(BANDWIDTHS)
    ans = f.ring_crossover_bytes(n, a, 1 / bw)
    p = t(lang, f"Ring all-reduce on {n} GPUs with α = {fmt_time(a, lang)} and {fmt_num(bw / 1e9, lang)} GB/s links: "
                f"below what message size (in MB) does latency dominate (latency term = bandwidth term)?",
          f"All-reduce en anillo con {n} GPUs, α = {fmt_time(a, lang)} y enlaces de {fmt_num(bw / 1e9, lang)} GB/s: "
          f"¿por debajo de qué tamaño de mensaje (en MB) domina la latencia (término de latencia = de ancho de banda)?")
    e = t(lang, f"2(N−1)α = 2(N−1)/N·S·β ⇒ S = N·α/β = {n}·{fmt_time(a, lang)}·{fmt_num(bw / 1e9, lang)} GB/s = "
                f"{fmt_bytes(ans, lang)}.",
          f"2(N−1)α = 2(N−1)/N·S·β ⇒ S = N·α/β = {n}·{fmt_time(a, lang)}·{fmt_num(bw / 1e9, lang)} GB/s = "
          f"{fmt_bytes(ans, lang)}.")
    return numeric(L, "crossover", lang, p, e, ans, "bytes", "MB", {"n": n, "alpha": a, "beta": 1 / bw})


def why_ring(rng, lang):
    n = rng.choice(RANKS[2:])
    return choice(
        L, "why-ring", lang, rng,
        t(lang, f"Why is the ring all-reduce called bandwidth-optimal on {n} GPUs?",
          f"¿Por qué se dice que el all-reduce en anillo es óptimo en ancho de banda con {n} GPUs?"),
        t(lang, "Each GPU sends 2(N−1)/N·S bytes, the minimum any all-reduce needs, on every link equally",
          "Cada GPU envía 2(N−1)/N·S bytes, el mínimo que necesita cualquier all-reduce, repartido por igual en los enlaces"),
        [t(lang, "It needs only log2 N steps", "Solo necesita log2 N pasos"),
         t(lang, "Rank 0 does all the additions, so the others stay idle", "El rank 0 hace todas las sumas y los demás esperan"),
         t(lang, "It sends each gradient only once, S/N bytes in total", "Envía cada gradiente una sola vez, S/N bytes en total")],
        t(lang, f"Each GPU sends 2(N−1) chunks of S/N bytes = {fmt_num(f.busbw_factor(n), lang, 4)}·S for N = {n}, "
                f"which is the lower bound (Patarasuk & Yuan 2009); the cost is 2(N−1) latency steps, not log2 N.",
          f"Cada GPU envía 2(N−1) trozos de S/N bytes = {fmt_num(f.busbw_factor(n), lang, 4)}·S para N = {n}, "
          f"que es la cota inferior (Patarasuk y Yuan 2009); el precio son 2(N−1) pasos de latencia, no log2 N."),
        {"n": n})


def small_messages(rng, lang):
    n = rng.choice([64, 128, 256, 512, 1024])
    S = rng.choice([256, 1024, 4096])
    a, b = 5e-6, 1 / 25e9
    ring = f.ring_allreduce_time(S, n, a, b)
    tree = f.tree_allreduce_time(S, n, a, b)
    return choice(
        L, "small-messages", lang, rng,
        t(lang, f"A {fmt_int(S, lang)}-byte all-reduce on {n} GPUs (α = 5 µs, 25 GB/s): which algorithm is fastest?",
          f"Un all-reduce de {fmt_int(S, lang)} bytes en {n} GPUs (α = 5 µs, 25 GB/s): ¿qué algoritmo es más rápido?"),
        t(lang, "The tree: few latency steps matter more than bandwidth", "El árbol: pocos pasos de latencia importan más que el ancho de banda"),
        [t(lang, "The ring: it is always bandwidth-optimal", "El anillo: siempre es óptimo en ancho de banda"),
         t(lang, "The naive reduce + broadcast", "El ingenuo: reducir y difundir"),
         t(lang, "All take the same time", "Todos tardan lo mismo")],
        t(lang, f"Ring: 2(N−1)α ≈ {fmt_time(ring, lang)}; tree: 2⌈log2 N⌉(α + S·β) ≈ {fmt_time(tree, lang)}. "
                f"Tiny messages are latency-bound.",
          f"Anillo: 2(N−1)α ≈ {fmt_time(ring, lang)}; árbol: 2⌈log2 N⌉(α + S·β) ≈ {fmt_time(tree, lang)}. "
          f"Los mensajes diminutos los limita la latencia."),
        {"n": n, "size_bytes": S, "alpha": a, "beta": b})


def averaging(rng, lang):
    n = rng.choice([2, 4, 8])
    b = rng.choice([8, 16, 32])
    return choice(
        L, "averaging", lang, rng,
        t(lang, f"{n} GPUs each compute the mean-loss gradient on {b} samples and all-reduce-average them. The result "
                f"equals…",
          f"{n} GPUs calculan cada una el gradiente de la pérdida media con {b} muestras y lo promedian con "
          f"all-reduce. El resultado es igual a…"),
        t(lang, f"the gradient of one batch of {n * b} samples on one GPU",
          f"el gradiente de un batch de {n * b} muestras en una sola GPU"),
        [t(lang, f"the gradient of one batch of {b} samples", f"el gradiente de un batch de {b} muestras"),
         t(lang, f"{n} times the gradient of one batch of {n * b} samples",
           f"{n} veces el gradiente de un batch de {n * b} muestras"),
         t(lang, "an approximation that drifts from single-GPU training", "una aproximación que se aleja del entrenamiento en una GPU")],
        t(lang, f"The mean over {n * b} samples is the mean of the {n} per-GPU means of {b} samples each, and the "
                f"gradient is linear: averaging gradients = gradient of the big batch.",
          f"La media sobre {n * b} muestras es la media de las {n} medias por GPU de {b} muestras, y el gradiente es "
          f"lineal: promediar gradientes = gradiente del batch grande."),
        {"n": n, "per_gpu_batch": b})


def phases(rng, lang):
    return choice(
        L, "phases", lang, rng,
        t(lang, "After the reduce-scatter half of a ring all-reduce, what does each GPU hold?",
          "Tras la mitad reduce-scatter de un all-reduce en anillo, ¿qué tiene cada GPU?"),
        t(lang, "One chunk (1/N of the buffer) fully summed over all GPUs",
          "Un trozo (1/N del buffer) ya sumado sobre todas las GPUs"),
        [t(lang, "The whole buffer fully summed", "Todo el buffer ya sumado"),
         t(lang, "Its own gradient unchanged", "Su propio gradiente sin cambios"),
         t(lang, "Half of the buffer summed over half of the GPUs", "La mitad del buffer sumada sobre la mitad de las GPUs")],
        t(lang, "N−1 steps of send-right-and-add leave chunk i complete on one GPU; the all-gather half then "
                "circulates the finished chunks so everyone has all N.",
          "N−1 pasos de enviar a la derecha y sumar dejan el trozo i completo en una GPU; la mitad all-gather hace "
          "circular los trozos terminados para que todas tengan los N."),
        {})


GENERATORS = {
    "ring-time": ring_time,
    "ring-bytes": ring_bytes,
    "ring-steps": ring_steps,
    "tree-steps": tree_steps,
    "busbw": busbw_q,
    "algbw": algbw_q,
    "naive-ratio": naive_ratio,
    "crossover": crossover,
    "why-ring": why_ring,
    "small-messages": small_messages,
    "averaging": averaging,
    "phases": phases,
}
