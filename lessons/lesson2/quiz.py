"""Lesson 2 quiz: ZeRO/FSDP memory per GPU, communication volume, activations. Answers from :mod:`.formulas`."""
from __future__ import annotations

from ..quiz import choice, fmt_bytes, fmt_count, fmt_int, fmt_num, numeric, t
from . import formulas as f

L = "lesson2"
PARAMS = [1.3e9, 3e9, 7e9, 7.5e9, 13e9, 30e9, 70e9, 175e9]
DPS = [4, 8, 16, 32, 64, 128, 256]
STRATEGY_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
FORMULA = {"ddp": "(2 + 2 + K)·Ψ", "zero1": "2Ψ + 2Ψ + K·Ψ/N", "zero2": "2Ψ + (2 + K)·Ψ/N",
           "zero3": "(2 + 2 + K)·Ψ/N"}


def zero_total(rng, lang):
    psi, n = rng.choice(PARAMS), rng.choice(DPS)
    strategy = rng.choice(["zero1", "zero2", "zero3"])
    r = f.model_state_bytes(psi, n, strategy)
    ans = r["total_bytes"]
    name = STRATEGY_NAMES[strategy]
    p = t(lang, f"A {fmt_count(psi, lang)}-parameter model is trained with mixed-precision Adam (K = 12) and {name} "
                f"over N = {n} GPUs. How much memory do the model states take per GPU (in GB)?",
          f"Un modelo de {fmt_count(psi, lang)} parámetros se entrena con Adam en precisión mixta (K = 12) y {name} "
          f"sobre N = {n} GPUs. ¿Cuánta memoria ocupan los estados del modelo por GPU (en GB)?")
    e = t(lang, f"{name}: {FORMULA[strategy]} = {fmt_bytes(r['params_bytes'], lang)} (params) + "
                f"{fmt_bytes(r['grads_bytes'], lang)} (grads) + {fmt_bytes(r['optimizer_bytes'], lang)} (optimizer) = "
                f"{fmt_bytes(ans, lang)}.",
          f"{name}: {FORMULA[strategy]} = {fmt_bytes(r['params_bytes'], lang)} (parámetros) + "
          f"{fmt_bytes(r['grads_bytes'], lang)} (gradientes) + {fmt_bytes(r['optimizer_bytes'], lang)} (optimizador) = "
          f"{fmt_bytes(ans, lang)}.")
    return numeric(L, "zero-total", lang, p, e, ans, "bytes", "GB", {"params": psi, "dp": n, "strategy": strategy})


def ddp_total(rng, lang):
    psi = rng.choice(PARAMS)
    opt, prec = rng.choice([("adam", "mixed"), ("adam", "fp32"), ("sgd", "mixed"), ("sgd", "fp32")])
    r = f.model_state_bytes(psi, 1, "ddp", opt, prec)
    per = f.bytes_per_param(opt, prec)
    ans = r["total_bytes"]
    opt_name = {"adam": "Adam", "sgd": t(lang, "SGD with momentum", "SGD con momento")}[opt]
    prec_name = {"mixed": t(lang, "mixed precision", "precisión mixta"), "fp32": "fp32"}[prec]
    p = t(lang, f"Plain data parallelism (DDP), {fmt_count(psi, lang)} parameters, {opt_name} in {prec_name}: how many "
                f"bytes of model states does every GPU hold (in GB)?",
          f"Paralelismo de datos simple (DDP), {fmt_count(psi, lang)} parámetros, {opt_name} en {prec_name}: ¿cuántos "
          f"bytes de estados del modelo guarda cada GPU (en GB)?")
    e = t(lang, f"Per parameter: {per['params']} (weights) + {per['grads']} (gradients) + {per['optimizer']} (optimizer) = "
                f"{sum(per.values())} bytes; × {fmt_count(psi, lang)} = {fmt_bytes(ans, lang)}, replicated on every GPU.",
          f"Por parámetro: {per['params']} (pesos) + {per['grads']} (gradientes) + {per['optimizer']} (optimizador) = "
          f"{sum(per.values())} bytes; × {fmt_count(psi, lang)} = {fmt_bytes(ans, lang)}, replicado en cada GPU.")
    return numeric(L, "ddp-total", lang, p, e, ans, "bytes", "GB",
                   {"params": psi, "optimizer": opt, "precision": prec})


def optimizer_shard(rng, lang):
    psi, n = rng.choice(PARAMS), rng.choice(DPS)
    ans = f.model_state_bytes(psi, n, "zero1")["optimizer_bytes"]
    p = t(lang, f"ZeRO-1 with mixed-precision Adam, {fmt_count(psi, lang)} parameters, N = {n}: how many bytes of "
                f"optimizer state (fp32 master, momentum, variance) does each GPU keep (in GB)?",
          f"ZeRO-1 con Adam en precisión mixta, {fmt_count(psi, lang)} parámetros, N = {n}: ¿cuántos bytes de estado "
          f"del optimizador (copia maestra fp32, momento, varianza) guarda cada GPU (en GB)?")
    e = t(lang, f"K·Ψ/N = 12 · {fmt_count(psi, lang)} / {n} = {fmt_bytes(ans, lang)}.",
          f"K·Ψ/N = 12 · {fmt_count(psi, lang)} / {n} = {fmt_bytes(ans, lang)}.")
    return numeric(L, "optimizer-shard", lang, p, e, ans, "bytes", "GB", {"params": psi, "dp": n})


def comm_volume(rng, lang):
    psi = rng.choice(PARAMS)
    strategy = rng.choice(["ddp", "zero2", "zero3"])
    r = f.comm_volume_per_step(psi, strategy, bytes_per_elem=2)
    ans = r["bytes"]
    name = STRATEGY_NAMES[strategy]
    mult = r["elements"] // int(psi)
    p = t(lang, f"{name}, {fmt_count(psi, lang)} parameters, fp16/bf16 communication: how many bytes does each GPU "
                f"send per training step, counting each collective of Ψ elements as Ψ (in GB)?",
          f"{name}, {fmt_count(psi, lang)} parámetros, comunicación en fp16/bf16: ¿cuántos bytes envía cada GPU por "
          f"paso de entrenamiento, contando cada colectiva de Ψ elementos como Ψ (en GB)?")
    what = {"ddp": t(lang, "all-reduce of the gradients = reduce-scatter + all-gather",
                     "all-reduce de los gradientes = reduce-scatter + all-gather"),
            "zero2": t(lang, "reduce-scatter of gradients + all-gather of updated parameters",
                       "reduce-scatter de gradientes + all-gather de parámetros actualizados"),
            "zero3": t(lang, "all-gather of parameters in forward and in backward + reduce-scatter of gradients",
                       "all-gather de parámetros en el forward y en el backward + reduce-scatter de gradientes")}[strategy]
    e = t(lang, f"{what}: {mult}Ψ elements × 2 bytes = {mult}·{fmt_count(psi, lang)}·2 = {fmt_bytes(ans, lang)}.",
          f"{what}: {mult}Ψ elementos × 2 bytes = {mult}·{fmt_count(psi, lang)}·2 = {fmt_bytes(ans, lang)}.")
    return numeric(L, "comm-volume", lang, p, e, ans, "bytes", "GB", {"params": psi, "strategy": strategy})


def max_fit(rng, lang):
    mem = rng.choice([24e9, 40e9, 80e9, 141e9])
    n = rng.choice(DPS)
    strategy = rng.choice(["ddp", "zero1", "zero2", "zero3"])
    ans = f.max_params_that_fit(mem, n, strategy)
    name = STRATEGY_NAMES[strategy]
    p = t(lang, f"GPUs with {fmt_bytes(mem, lang)}, {name} over N = {n}, mixed-precision Adam, activations ignored: "
                f"what is the largest model (parameters, e.g. 7.5B) whose model states fit?",
          f"GPUs de {fmt_bytes(mem, lang)}, {name} sobre N = {n}, Adam en precisión mixta, sin contar activaciones: "
          f"¿cuál es el modelo más grande (parámetros, p. ej. 7,5B) cuyos estados caben?")
    e = t(lang, f"Solve {FORMULA[strategy]} ≤ {fmt_bytes(mem, lang)} for Ψ with K = 12, N = {n}: Ψ ≈ {fmt_count(ans, lang)}.",
          f"Despejar Ψ en {FORMULA[strategy]} ≤ {fmt_bytes(mem, lang)} con K = 12, N = {n}: Ψ ≈ {fmt_count(ans, lang)}.")
    return numeric(L, "max-fit", lang, p, e, ans, "count", "B", {"memory_bytes": mem, "dp": n, "strategy": strategy})


def activations(rng, lang):
    h, a = rng.choice([(2048, 16), (4096, 32), (5120, 40), (8192, 64), (12288, 96)])
    s, b = rng.choice([1024, 2048, 4096]), rng.choice([1, 2, 4])
    ans = f.activation_bytes_per_layer(s, b, h, a)
    p = t(lang, f"One transformer layer, s = {s}, b = {b}, h = {h}, a = {a} heads, 16-bit activations, no "
                f"parallelism or recomputation: how many bytes of activations does it store (in GB, Korthikanti et al.)?",
          f"Una capa transformer, s = {s}, b = {b}, h = {h}, a = {a} cabezas, activaciones de 16 bits, sin "
          f"paralelismo ni recomputación: ¿cuántos bytes de activaciones guarda (en GB, Korthikanti et al.)?")
    e = t(lang, f"s·b·h·(34 + 5·a·s/h) = {fmt_int(s * b * h, lang)}·(34 + {fmt_num(5 * a * s / h, lang)}) = "
                f"{fmt_bytes(ans, lang)}.",
          f"s·b·h·(34 + 5·a·s/h) = {fmt_int(s * b * h, lang)}·(34 + {fmt_num(5 * a * s / h, lang)}) = "
          f"{fmt_bytes(ans, lang)}.")
    return numeric(L, "activations", lang, p, e, ans, "bytes", "GB", {"seq": s, "micro_batch": b, "hidden": h, "heads": a})


def k_value(rng, lang):
    opt, prec = rng.choice([("adam", "mixed"), ("sgd", "mixed"), ("sgd-nomomentum", "mixed"), ("adam", "fp32"),
                            ("sgd", "fp32")])
    ans = f.optimizer_k(opt, prec)
    opt_name = {"adam": "Adam", "sgd": t(lang, "SGD with momentum", "SGD con momento"),
                "sgd-nomomentum": t(lang, "SGD without momentum", "SGD sin momento")}[opt]
    prec_name = {"mixed": t(lang, "mixed precision (fp16 weights, fp32 master)", "precisión mixta (pesos fp16, maestra fp32)"),
                 "fp32": t(lang, "pure fp32", "fp32 puro")}[prec]
    p = t(lang, f"{opt_name} in {prec_name}: how many bytes of optimizer state per parameter (ZeRO's K)?",
          f"{opt_name} en {prec_name}: ¿cuántos bytes de estado del optimizador por parámetro (la K de ZeRO)?")
    parts = {("adam", "mixed"): "4 (master) + 4 (m) + 4 (v)", ("sgd", "mixed"): "4 (master) + 4 (momentum)",
             ("sgd-nomomentum", "mixed"): "4 (master)", ("adam", "fp32"): "4 (m) + 4 (v)",
             ("sgd", "fp32"): "4 (momentum)"}[(opt, prec)]
    e = t(lang, f"K = {parts} = {ans}" + (" — fp32 weights need no separate master copy." if prec == "fp32" else "."),
          f"K = {parts} = {ans}" + (": con pesos fp32 no hace falta copia maestra aparte." if prec == "fp32" else "."))
    return numeric(L, "k-value", lang, p, e, ans, "number", "", {"optimizer": opt, "precision": prec}, integer=True)


def which_stage(rng, lang):
    return choice(
        L, "which-stage", lang, rng,
        t(lang, "Which ZeRO stage is the first to shard the parameters themselves (what FSDP's FULL_SHARD does)?",
          "¿Qué etapa de ZeRO es la primera que reparte los propios parámetros (lo que hace FULL_SHARD de FSDP)?"),
        "ZeRO-3", ["ZeRO-1", "ZeRO-2", t(lang, "None: parameters are always replicated", "Ninguna: los parámetros siempre se replican")],
        t(lang, "ZeRO-1 shards optimizer states (P_os), ZeRO-2 also gradients (P_os+g), ZeRO-3 also parameters "
                "(P_os+g+p) — memory (2+2+K)Ψ/N, paid for with all-gathers before each layer.",
          "ZeRO-1 reparte los estados del optimizador (P_os), ZeRO-2 también los gradientes (P_os+g), ZeRO-3 también "
          "los parámetros (P_os+g+p): memoria (2+2+K)Ψ/N, a cambio de all-gathers antes de cada capa."))


def traffic_ratio(rng, lang):
    return choice(
        L, "traffic-ratio", lang, rng,
        t(lang, "How does ZeRO-3's communication volume per step compare with DDP's?",
          "¿Cómo es el volumen de comunicación por paso de ZeRO-3 frente al de DDP?"),
        t(lang, "1.5× (3Ψ versus 2Ψ)", "1,5× (3Ψ frente a 2Ψ)"),
        [t(lang, "The same (2Ψ)", "El mismo (2Ψ)"), t(lang, "N times more", "N veces más"),
         t(lang, "Half (Ψ versus 2Ψ)", "La mitad (Ψ frente a 2Ψ)")],
        t(lang, "DDP: all-reduce = reduce-scatter + all-gather = 2Ψ. ZeRO-3: all-gather in forward, again in backward, "
                "reduce-scatter of gradients = 3Ψ. ZeRO-1/2 stay at 2Ψ.",
          "DDP: all-reduce = reduce-scatter + all-gather = 2Ψ. ZeRO-3: all-gather en el forward, otra vez en el "
          "backward y reduce-scatter de gradientes = 3Ψ. ZeRO-1/2 se quedan en 2Ψ."))


def largest_state(rng, lang):
    return choice(
        L, "largest-state", lang, rng,
        t(lang, "In mixed-precision Adam training with DDP, which model state takes the most memory?",
          "Entrenando con Adam en precisión mixta y DDP, ¿qué estado del modelo ocupa más memoria?"),
        t(lang, "The optimizer states (12 bytes per parameter)", "Los estados del optimizador (12 bytes por parámetro)"),
        [t(lang, "The fp16 parameters (2 bytes per parameter)", "Los parámetros fp16 (2 bytes por parámetro)"),
         t(lang, "The fp16 gradients (2 bytes per parameter)", "Los gradientes fp16 (2 bytes por parámetro)"),
         t(lang, "All three take the same", "Los tres ocupan lo mismo")],
        t(lang, "Of (2 + 2 + 12)Ψ, 12Ψ (75%) is the fp32 master copy, momentum and variance: that is why ZeRO-1 shards "
                "them first.",
          "De (2 + 2 + 12)Ψ, 12Ψ (75 %) son la copia maestra fp32, el momento y la varianza: por eso ZeRO-1 los reparte "
          "primero."))


GENERATORS = {
    "zero-total": zero_total,
    "ddp-total": ddp_total,
    "optimizer-shard": optimizer_shard,
    "comm-volume": comm_volume,
    "max-fit": max_fit,
    "activations": activations,
    "k-value": k_value,
    "which-stage": which_stage,
    "traffic-ratio": traffic_ratio,
    "largest-state": largest_state,
}
