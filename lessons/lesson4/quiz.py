"""Lesson 4 quiz: tensor parallelism of a transformer block. Answers from :mod:`.formulas`."""
from __future__ import annotations

from ..quiz import choice, fmt_bytes, fmt_int, fmt_num, fmt_time, numeric, t
from . import formulas as f

L = "lesson4"
SHAPES = [(2048, 16), (4096, 32), (5120, 40), (8192, 64), (12288, 96)]
SEQS = [1024, 2048, 4096]
TPS = [2, 4, 8]


def allreduce_count(rng, lang):
    layers = rng.choice([12, 24, 32, 48, 80, 96])
    r = f.tp_comm_per_layer(1024, 128, 1, 2, False)
    per_layer = r["forward"]["all_reduce"] + r["backward"]["all_reduce"]
    ans = layers * per_layer
    p = t(lang, f"Megatron tensor parallelism (no sequence parallelism) on a {layers}-layer transformer: how many "
                f"all-reduces run in one forward and backward pass?",
          f"Paralelismo tensorial de Megatron (sin paralelismo de secuencia) en un transformer de {layers} capas: "
          f"¿cuántos all-reduce se ejecutan en un forward y backward?")
    e = t(lang, f"Per layer: g after attention and after the MLP in forward (2), f before each in backward (2): "
                f"4 × {layers} = {ans}.",
          f"Por capa: g tras la atención y tras el MLP en el forward (2), f antes de cada uno en el backward (2): "
          f"4 × {layers} = {ans}.")
    return numeric(L, "allreduce-count", lang, p, e, ans, "number", "", {"layers": layers}, integer=True)


def tensor_bytes(rng, lang):
    h, _ = rng.choice(SHAPES)
    s, b = rng.choice(SEQS), rng.choice([1, 2, 4, 8])
    ans = f.tp_comm_per_layer(h, s, b, 2, False, 2)["tensor_bytes"]
    p = t(lang, f"h = {h}, s = {s}, micro-batch b = {b}, bf16 activations: how big is the tensor each tensor-parallel "
                f"all-reduce sums (in MB)?",
          f"h = {h}, s = {s}, micro-batch b = {b}, activaciones bf16: ¿cuánto ocupa el tensor que suma cada all-reduce "
          f"del paralelismo tensorial (en MB)?")
    e = t(lang, f"s·b·h·2 bytes = {s}·{b}·{h}·2 = {fmt_bytes(ans, lang)}.",
          f"s·b·h·2 bytes = {s}·{b}·{h}·2 = {fmt_bytes(ans, lang)}.")
    return numeric(L, "tensor-bytes", lang, p, e, ans, "bytes", "MB", {"hidden": h, "seq": s, "micro_batch": b})


def bytes_per_rank(rng, lang):
    h, _ = rng.choice(SHAPES)
    s, b, tp = rng.choice(SEQS), rng.choice([1, 2]), rng.choice(TPS)
    sp = rng.random() < 0.5
    r = f.tp_comm_per_layer(h, s, b, tp, sp, 2)
    ans = r["total_bytes_per_rank"]
    mode = t(lang, "with sequence parallelism", "con paralelismo de secuencia") if sp else \
        t(lang, "without sequence parallelism", "sin paralelismo de secuencia")
    p = t(lang, f"Tensor parallelism t = {tp} {mode}, h = {h}, s = {s}, b = {b}, bf16, ring collectives: how many "
                f"bytes does each rank send per layer, forward plus backward (in MB)?",
          f"Paralelismo tensorial t = {tp} {mode}, h = {h}, s = {s}, b = {b}, bf16, colectivas en anillo: ¿cuántos "
          f"bytes envía cada rank por capa, forward más backward (en MB)?")
    x = r["tensor_bytes"]
    e = t(lang, f"X = s·b·h·2 = {fmt_bytes(x, lang)}; 4 all-reduces (or 4 all-gather + 4 reduce-scatter with SP, the "
                f"same bytes) × 2(t−1)/t·X = 4·{fmt_num(2 * (tp - 1) / tp, lang)}·{fmt_bytes(x, lang)} = {fmt_bytes(ans, lang)}.",
          f"X = s·b·h·2 = {fmt_bytes(x, lang)}; 4 all-reduce (o 4 all-gather + 4 reduce-scatter con SP, mismos bytes) "
          f"× 2(t−1)/t·X = 4·{fmt_num(2 * (tp - 1) / tp, lang)}·{fmt_bytes(x, lang)} = {fmt_bytes(ans, lang)}.")
    return numeric(L, "bytes-per-rank", lang, p, e, ans, "bytes", "MB",
                   {"hidden": h, "seq": s, "micro_batch": b, "tp": tp, "sequence_parallel": sp})


def act_tp(rng, lang):
    h, a = rng.choice(SHAPES)
    s, tp = rng.choice(SEQS), rng.choice(TPS)
    sp = rng.random() < 0.5
    ans = f.activation_bytes_per_layer(s, 1, h, a, tp, sp)
    sbh = s * h
    if sp:
        formula = f"s·b·h/t·(34 + 5as/h) = {fmt_int(sbh, lang)}/{tp}·(34 + {fmt_num(5 * a * s / h, lang)})"
    else:
        formula = (f"s·b·h·(10 + 24/t + 5as/(ht)) = {fmt_int(sbh, lang)}·(10 + {fmt_num(24 / tp, lang)} + "
                   f"{fmt_num(5 * a * s / (h * tp), lang)})")
    mode = t(lang, "with sequence parallelism", "con paralelismo de secuencia") if sp else \
        t(lang, "without sequence parallelism", "sin paralelismo de secuencia")
    p = t(lang, f"Activation memory of one layer per GPU, tensor parallel t = {tp} {mode}: s = {s}, b = 1, h = {h}, "
                f"a = {a} (in MB, Korthikanti et al.)?",
          f"Memoria de activaciones de una capa por GPU, paralelismo tensorial t = {tp} {mode}: s = {s}, b = 1, h = {h}, "
          f"a = {a} (en MB, Korthikanti et al.)?")
    e = f"{formula} = {fmt_bytes(ans, lang)}."
    return numeric(L, "activations-tp", lang, p, e, ans, "bytes", "MB",
                   {"seq": s, "micro_batch": 1, "hidden": h, "heads": a, "tp": tp, "sequence_parallel": sp})


def sp_saving(rng, lang):
    h, a = rng.choice(SHAPES)
    s, tp = rng.choice(SEQS), rng.choice(TPS)
    ans = f.tp_activation_saving(s, 1, h, a, tp)
    q = 5 * a * s / h
    p = t(lang, f"h = {h}, a = {a}, s = {s}, t = {tp}: by what factor does sequence parallelism cut a layer's activation "
                f"memory per GPU (without SP divided by with SP)?",
          f"h = {h}, a = {a}, s = {s}, t = {tp}: ¿en qué factor reduce el paralelismo de secuencia la memoria de "
          f"activaciones de una capa por GPU (sin SP entre con SP)?")
    e = (f"(10 + 24/t + 5as/(ht)) / ((34 + 5as/h)/t) = ({fmt_num(10 + 24 / tp + q / tp, lang)}) / "
         f"({fmt_num((34 + q) / tp, lang)}) = {fmt_num(ans, lang)}×.")
    return numeric(L, "sp-saving", lang, p, e, ans, "number", "", {"seq": s, "hidden": h, "heads": a, "tp": tp})


def comm_time(rng, lang):
    h, _ = rng.choice(SHAPES)
    s, tp = rng.choice(SEQS), rng.choice(TPS)
    bw = rng.choice([100e9, 200e9, 450e9])
    a = 5e-6
    r = f.tp_comm_per_layer(h, s, 1, tp, False, 2, a, 1 / bw)
    ans = r["total_time_s"]
    p = t(lang, f"TP t = {tp}, h = {h}, s = {s}, b = 1, bf16, ring all-reduces with α = 5 µs on {fmt_num(bw / 1e9, lang)} "
                f"GB/s links: how long do one layer's 4 all-reduces take (in ms)?",
          f"TP t = {tp}, h = {h}, s = {s}, b = 1, bf16, all-reduce en anillo con α = 5 µs y enlaces de "
          f"{fmt_num(bw / 1e9, lang)} GB/s: ¿cuánto tardan los 4 all-reduce de una capa (en ms)?")
    x = r["tensor_bytes"]
    one = ans / 4
    e = t(lang, f"One: 2(t−1)α + 2(t−1)/t·X·β with X = {fmt_bytes(x, lang)}: {fmt_time(one, lang)}; × 4 = {fmt_time(ans, lang)}.",
          f"Uno: 2(t−1)α + 2(t−1)/t·X·β con X = {fmt_bytes(x, lang)}: {fmt_time(one, lang)}; × 4 = {fmt_time(ans, lang)}.")
    return numeric(L, "comm-time", lang, p, e, ans, "seconds", "ms",
                   {"hidden": h, "seq": s, "micro_batch": 1, "tp": tp, "alpha": a, "beta": 1 / bw})


def f_operator(rng, lang):
    return choice(
        L, "f-operator", lang, rng,
        t(lang, "Megatron's f operator sits before a column-parallel linear. What does it do?",
          "El operador f de Megatron va antes de una lineal paralela por columnas. ¿Qué hace?"),
        t(lang, "Identity in forward, all-reduce of the input gradient in backward",
          "Identidad en el forward, all-reduce del gradiente de la entrada en el backward"),
        [t(lang, "All-reduce in forward, identity in backward", "All-reduce en el forward, identidad en el backward"),
         t(lang, "All-reduce in both directions", "All-reduce en ambas direcciones"),
         t(lang, "Nothing: it is only a marker", "Nada: es solo una marca")],
        t(lang, "Every rank needs the whole input X (replicated: identity), and X's gradient is the sum of each rank's "
                "partial X-gradient (all-reduce). g, after the row-parallel linear, is the mirror image.",
          "Cada rank necesita toda la entrada X (replicada: identidad), y el gradiente de X es la suma de los "
          "gradientes parciales de cada rank (all-reduce). g, tras la lineal por filas, es la imagen especular."))


def column_then_row(rng, lang):
    return choice(
        L, "column-then-row", lang, rng,
        t(lang, "Why does the MLP split its first linear by columns and the second by rows?",
          "¿Por qué el MLP parte la primera lineal por columnas y la segunda por filas?"),
        t(lang, "The GeLU applies to each column shard independently, so no communication is needed between them",
          "La GeLU se aplica a cada trozo de columnas por separado, así que no hace falta comunicar entre ellas"),
        [t(lang, "Row splits are faster on GPUs", "Partir por filas es más rápido en GPU"),
         t(lang, "It halves the parameter count", "Reduce los parámetros a la mitad"),
         t(lang, "It avoids the all-reduce after the MLP", "Evita el all-reduce tras el MLP")],
        t(lang, "Y = GeLU(X·A) with A split by columns gives each rank its own slice of Y; multiplying by B split by rows "
                "yields partial sums that one all-reduce (g) adds: one collective per MLP in forward.",
          "Y = GeLU(X·A) con A partida por columnas da a cada rank su trozo de Y; multiplicar por B partida por filas "
          "da sumas parciales que un all-reduce (g) suma: una colectiva por MLP en el forward."))


def inside_node(rng, lang):
    return choice(
        L, "inside-node", lang, rng,
        t(lang, "Why is tensor parallelism usually kept inside one node (e.g. t ≤ 8)?",
          "¿Por qué el paralelismo tensorial suele quedarse dentro de un nodo (p. ej. t ≤ 8)?"),
        t(lang, "It all-reduces activations 4 times per layer, on the critical path: it needs NVLink-class bandwidth",
          "Hace 4 all-reduce de activaciones por capa, en el camino crítico: necesita ancho de banda tipo NVLink"),
        [t(lang, "PyTorch does not allow process groups across nodes", "PyTorch no permite grupos de procesos entre nodos"),
         t(lang, "The weights would not fit otherwise", "Si no, los pesos no cabrían"),
         t(lang, "Gradients cannot be all-reduced across nodes", "Los gradientes no se pueden reducir entre nodos")],
        t(lang, "Per layer and micro-batch TP moves ~4·2(t−1)/t·s·b·h·2 bytes that compute waits for; inter-node links are "
                "~10× slower than NVLink, so TP spans GPUs of one node and pipeline/data parallelism span nodes.",
          "Por capa y micro-batch TP mueve ~4·2(t−1)/t·s·b·h·2 bytes que el cómputo espera; los enlaces entre nodos son "
          "~10× más lentos que NVLink, así que TP abarca las GPUs de un nodo y pipeline/datos abarcan nodos."))


def layernorm_sp(rng, lang):
    return choice(
        L, "layernorm-sp", lang, rng,
        t(lang, "With sequence parallelism, what extra step do the layer-norm weights need?",
          "Con paralelismo de secuencia, ¿qué paso extra necesitan los pesos de layer norm?"),
        t(lang, "Their gradients must be all-reduced across the tensor-parallel ranks",
          "Sus gradientes deben sumarse con all-reduce entre los ranks del paralelismo tensorial"),
        [t(lang, "Nothing: they are replicated, so gradients agree", "Nada: están replicados, así que los gradientes coinciden"),
         t(lang, "They must be split by columns", "Hay que partirlos por columnas"),
         t(lang, "They must be recomputed in backward", "Hay que recomputarlos en el backward")],
        t(lang, "Each rank normalises a different slice of the sequence, so each sees a partial gradient of the shared "
                "weights; without the all-reduce the replicas drift apart (a classic bug).",
          "Cada rank normaliza un trozo distinto de la secuencia y ve un gradiente parcial de los pesos compartidos; "
          "sin el all-reduce las réplicas divergen (un error clásico)."))


GENERATORS = {
    "allreduce-count": allreduce_count,
    "tensor-bytes": tensor_bytes,
    "bytes-per-rank": bytes_per_rank,
    "activations-tp": act_tp,
    "sp-saving": sp_saving,
    "comm-time": comm_time,
    "f-operator": f_operator,
    "column-then-row": column_then_row,
    "inside-node": inside_node,
    "layernorm-sp": layernorm_sp,
}
