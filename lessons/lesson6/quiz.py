"""Lesson 6 quiz: number formats, loss scaling, DDP buckets. Answers from :mod:`.formulas`."""
from __future__ import annotations

import math

from ..quiz import choice, fmt_int, fmt_num, numeric, t, yes_no
from . import formulas as f

L = "lesson6"
NAMES = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


def max_value(rng, lang):
    fmt = rng.choice(["fp16", "bf16", "fp8_e5m2", "fp8_e4m3"])
    ans = f.max_value(fmt)
    ff = f.float_format(fmt)
    q = t(lang, f"What is the largest finite number {fmt} can hold ({ff.exponent_bits} exponent bits, "
                f"{ff.mantissa_bits} mantissa bits)?",
          f"¿Cuál es el mayor número finito que cabe en {fmt} ({ff.exponent_bits} bits de exponente, "
          f"{ff.mantissa_bits} de mantisa)?")
    if ff.max_override is None:
        e = t(lang, f"(2 − 2^−{ff.mantissa_bits})·2^{ff.bias} = {fmt_num(ans, lang, 5)}.",
              f"(2 − 2^−{ff.mantissa_bits})·2^{ff.bias} = {fmt_num(ans, lang, 5)}.")
    else:
        e = t(lang, f"E4M3 keeps no infinities and reuses the top exponent: 1.75·2^8 = {fmt_num(ans, lang)}.",
              f"E4M3 no tiene infinitos y reutiliza el exponente más alto: 1,75·2^8 = {fmt_num(ans, lang)}.")
    return numeric(L, "max-value", lang, q, e, ans, "number", "", {"fmt": fmt}, tolerance=0.005)


def smallest(rng, lang):
    fmt = rng.choice(["fp16", "bf16"])
    which = rng.choice(["normal", "subnormal"])
    ans = f.smallest_normal(fmt) if which == "normal" else f.smallest_subnormal(fmt)
    ff = f.float_format(fmt)
    word = {"normal": t(lang, "normal", "normal"), "subnormal": t(lang, "subnormal", "subnormal")}[which]
    q = t(lang, f"What is the smallest positive {word} number in {fmt}? (e.g. 6.1e-5)",
          f"¿Cuál es el menor número positivo {word} de {fmt}? (p. ej. 6,1e-5)")
    if which == "normal":
        e = f"2^(1−bias) = 2^{1 - ff.bias} = {fmt_num(ans, lang)}."
    else:
        e = f"2^(1−bias−m) = 2^{1 - ff.bias - ff.mantissa_bits} = {fmt_num(ans, lang)}."
    return numeric(L, "smallest", lang, q, e, ans, "number", "", {"fmt": fmt, "which": which}, tolerance=0.01)


def spacing_q(rng, lang):
    fmt = rng.choice(["fp16", "bf16"])
    x = rng.choice([1.0, 2.0, 10.0, 100.0, 1000.0, 0.5])
    ans = f.spacing(x, fmt)
    ff = f.float_format(fmt)
    exp = math.frexp(x)[1] - 1
    q = t(lang, f"What is the spacing between adjacent {fmt} numbers around {fmt_num(x, lang)} (e.g. 0.0078)?",
          f"¿Cuál es la separación entre números {fmt} consecutivos alrededor de {fmt_num(x, lang)} (p. ej. 0,0078)?")
    e = t(lang, f"{fmt_num(x, lang)} lies in [2^{exp}, 2^{exp + 1}); with {ff.mantissa_bits} mantissa bits the step is "
                f"2^({exp}−{ff.mantissa_bits}) = {fmt_num(ans, lang)}.",
          f"{fmt_num(x, lang)} está en [2^{exp}, 2^{exp + 1}); con {ff.mantissa_bits} bits de mantisa el paso es "
          f"2^({exp}−{ff.mantissa_bits}) = {fmt_num(ans, lang)}.")
    return numeric(L, "spacing", lang, q, e, ans, "number", "", {"x": x, "fmt": fmt}, tolerance=0.01)


def update_lost(rng, lang):
    fmt = rng.choice(["fp16", "bf16", "fp32"])
    w = rng.choice([1.0, 4.0, 0.25, 16.0])
    u = rng.choice([1e-5, 1e-4, 1e-3, 1e-2])
    lost = f.update_is_lost(w, u, fmt)
    yes, no = t(lang, "Yes: w + Δ rounds back to w", "Sí: w + Δ se redondea de vuelta a w"), \
        t(lang, "No: the weight changes", "No: el peso cambia")
    sp = f.spacing(w, fmt)
    return yes_no(
        L, "update-lost", lang,
        t(lang, f"A weight w = {fmt_num(w, lang)} stored in {fmt} gets an update Δ = {fmt_num(u, lang)}. Is the update lost?",
          f"Un peso w = {fmt_num(w, lang)} guardado en {fmt} recibe una actualización Δ = {fmt_num(u, lang)}. ¿Se pierde?"),
        yes, no, lost,
        t(lang, f"The spacing of {fmt} at {fmt_num(w, lang)} is {fmt_num(sp, lang)}; an update below half of it "
                f"({fmt_num(sp / 2, lang)}) is rounded away. Here Δ = {fmt_num(u, lang)}: "
                f"{'lost' if lost else 'kept'}. That is why optimizers keep fp32 master weights.",
          f"La separación de {fmt} en {fmt_num(w, lang)} es {fmt_num(sp, lang)}; una actualización menor que la mitad "
          f"({fmt_num(sp / 2, lang)}) desaparece al redondear. Aquí Δ = {fmt_num(u, lang)}: "
          f"{'se pierde' if lost else 'se conserva'}. Por eso los optimizadores guardan pesos maestros en fp32."),
        {"weight": w, "update": u, "fmt": fmt, "lost": lost})


def scale_after(rng, lang):
    k = rng.choice([0, 1, 2, 3, 5])
    good = rng.choice([0, 1999, 2000, 4000, 5000, 6500])
    ans = f.gradscaler_scale_after(good, k)
    q = t(lang, f"torch.amp.GradScaler with its defaults (init 2^16, ×2 every 2000 good steps, ×0.5 on overflow). "
                f"The first {k} steps overflow, then {fmt_int(good, lang)} steps are fine. What is the scale now?",
          f"torch.amp.GradScaler con sus valores por defecto (inicial 2^16, ×2 cada 2000 pasos buenos, ×0,5 si hay "
          f"desbordamiento). Los primeros {k} pasos desbordan y luego {fmt_int(good, lang)} pasos van bien. ¿Cuál es la escala?")
    e = t(lang, f"2^16 · 0.5^{k} · 2^⌊{good}/2000⌋ = 2^{16 - k + good // 2000} = {fmt_int(ans, lang)}.",
          f"2^16 · 0,5^{k} · 2^⌊{good}/2000⌋ = 2^{16 - k + good // 2000} = {fmt_int(ans, lang)}.")
    return numeric(L, "scale-after", lang, q, e, ans, "number", "", {"good_steps": good, "overflows_first": k},
                   integer=True)


def bucket_count(rng, lang):
    n = rng.choice([24, 50, 100, 200])
    each_mib = rng.choice([1, 2, 4, 8])
    ans = f.ddp_uniform_bucket_count(n, each_mib * f.MiB)
    q = t(lang, f"A model has {n} gradient tensors of {each_mib} MiB each. With DDP's defaults (first bucket 1 MiB, then "
                f"25 MiB; a bucket closes once it reaches its cap), how many all-reduces run per backward?",
          f"Un modelo tiene {n} tensores de gradiente de {each_mib} MiB cada uno. Con los valores por defecto de DDP "
          f"(primer bucket de 1 MiB, luego 25 MiB; un bucket se cierra al alcanzar su tope), ¿cuántos all-reduce se "
          f"lanzan por backward?")
    per = math.ceil(25 / each_mib)
    e = t(lang, f"The first tensor alone fills the 1 MiB bucket; the other {n - 1} go {per} per 25 MiB bucket: "
                f"1 + ⌈{n - 1}/{per}⌉ = {ans}.",
          f"El primer tensor llena solo el bucket de 1 MiB; los otros {n - 1} van de {per} en {per} por bucket de 25 MiB: "
          f"1 + ⌈{n - 1}/{per}⌉ = {ans}.")
    return numeric(L, "bucket-count", lang, q, e, ans, "number", "", {"n_params": n, "bytes_each": each_mib * f.MiB},
                   integer=True)


def epsilon(rng, lang):
    fmt = rng.choice(["fp16", "bf16", "fp32"])
    ans = f.machine_epsilon(fmt)
    m = f.float_format(fmt).mantissa_bits
    q = t(lang, f"What is the machine epsilon of {fmt} (the gap between 1 and the next number)?",
          f"¿Cuál es el épsilon de máquina de {fmt} (la distancia entre 1 y el siguiente número)?")
    e = f"2^−{m} = {fmt_num(ans, lang)}."
    return numeric(L, "epsilon", lang, q, e, ans, "number", "", {"fmt": fmt}, tolerance=0.01)


def underflow(rng, lang):
    g = rng.choice([1e-9, 2e-8, 5e-8, 1e-7, 1e-6])
    under = f.underflows(g, "fp16")
    yes = t(lang, "It becomes 0 in fp16", "Se convierte en 0 en fp16")
    no = t(lang, "It survives (as a normal or subnormal number)", "Sobrevive (como número normal o subnormal)")
    return yes_no(
        L, "underflow", lang,
        t(lang, f"A gradient value of {fmt_num(g, lang)} is cast to fp16 without loss scaling. What happens?",
          f"Un valor de gradiente de {fmt_num(g, lang)} se convierte a fp16 sin escalar la pérdida. ¿Qué pasa?"),
        yes, no, under,
        t(lang, f"fp16's smallest subnormal is 2^−24 ≈ 5.96e-8; values below half of it (≈ 2.98e-8) round to 0. "
                f"{fmt_num(g, lang)} → {'0' if under else 'kept'}. Multiplying the loss by 2^16 shifts such values up.",
          f"El menor subnormal de fp16 es 2^−24 ≈ 5,96e-8; los valores menores que su mitad (≈ 2,98e-8) se redondean a 0. "
          f"{fmt_num(g, lang)} → {'0' if under else 'se conserva'}. Multiplicar la pérdida por 2^16 sube esos valores."),
        {"value": g, "underflows": under})


def bf16_scaling(rng, lang):
    return choice(
        L, "bf16-scaling", lang, rng,
        t(lang, "Why does bf16 training usually not need loss scaling?",
          "¿Por qué entrenar en bf16 no suele necesitar escalado de la pérdida?"),
        t(lang, "bf16 has fp32's 8 exponent bits, hence fp32's range: small gradients do not underflow",
          "bf16 tiene los 8 bits de exponente de fp32 y por tanto su rango: los gradientes pequeños no se hacen cero"),
        [t(lang, "bf16 has more mantissa bits than fp16", "bf16 tiene más bits de mantisa que fp16"),
         t(lang, "bf16 gradients are computed in fp32 anyway", "Los gradientes en bf16 se calculan de todos modos en fp32"),
         t(lang, "GradScaler does not support bf16", "GradScaler no admite bf16")],
        t(lang, "bf16: 8 exponent bits (smallest normal 2^−126, like fp32) but only 7 mantissa bits; fp16: 5 exponent bits "
                "(smallest normal 2^−14) and 10 mantissa bits. The range, not the precision, is what loss scaling fixes.",
          "bf16: 8 bits de exponente (menor normal 2^−126, como fp32) pero solo 7 de mantisa; fp16: 5 de exponente "
          "(menor normal 2^−14) y 10 de mantisa. El escalado de la pérdida arregla el rango, no la precisión."))


def bucket_order(rng, lang):
    return choice(
        L, "bucket-order", lang, rng,
        t(lang, "Why does DDP fill its gradient buckets in reverse order of the model's parameters?",
          "¿Por qué DDP llena sus buckets de gradientes en orden inverso a los parámetros del modelo?"),
        t(lang, "Backward produces the last layers' gradients first, so their all-reduce can start while earlier layers compute",
          "El backward produce primero los gradientes de las últimas capas, así su all-reduce empieza mientras se calculan las anteriores"),
        [t(lang, "Reverse order uses less memory", "El orden inverso usa menos memoria"),
         t(lang, "NCCL requires it", "NCCL lo exige"),
         t(lang, "So that the optimizer updates the last layer first", "Para que el optimizador actualice primero la última capa")],
        t(lang, "Overlap needs a bucket to be complete early: gradients arrive output-to-input, so buckets in that order "
                "fill — and launch their all-reduce — while backward continues.",
          "Solapar exige que un bucket se complete pronto: los gradientes llegan de la salida a la entrada, así que los "
          "buckets en ese orden se llenan, y lanzan su all-reduce, mientras sigue el backward."))


GENERATORS = {
    "max-value": max_value,
    "smallest": smallest,
    "spacing": spacing_q,
    "update-lost": update_lost,
    "scale-after": scale_after,
    "bucket-count": bucket_count,
    "epsilon": epsilon,
    "underflow": underflow,
    "bf16-scaling": bf16_scaling,
    "bucket-order": bucket_order,
}
