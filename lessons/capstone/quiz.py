"""Capstone quiz: the device mesh, its groups and what each dimension costs. Answers from
:mod:`.formulas` and the lessons' formulas it reuses (lesson 5's bubble)."""
from __future__ import annotations

from ..lesson5.formulas import bubble_fraction
from ..quiz import choice, fmt_bytes, fmt_count, fmt_int, fmt_pct, numeric, t
from . import formulas as f

L = "capstone"
DEGREES = [1, 2, 4, 8]
# (name, params, layers, hidden) of published models (GPT-3 175B, Llama 2/3 70B, Llama 3 405B)
MODELS = [("GPT-3 175B", 175e9, 96, 12288), ("Llama 3 70B", 70e9, 80, 8192), ("Llama 3 405B", 405e9, 126, 16384)]


def _mesh(rng):
    return rng.choice([2, 4, 8, 16]), rng.choice(DEGREES[1:]), rng.choice(DEGREES[1:])


def _dim_name(dim: str, lang: str) -> str:
    return {"pp": t(lang, "pipeline stage", "etapa del pipeline"),
            "dp": t(lang, "data-parallel replica", "réplica de datos"),
            "tp": t(lang, "tensor-parallel shard", "trozo tensorial")}[dim]


def world(rng, lang):
    pp, dp, tp = _mesh(rng)
    ans = f.world_size(pp, dp, tp)
    q = t(lang, f"A device mesh of shape (pp, dp, tp) = ({pp}, {dp}, {tp}): how many GPUs does the run need?",
          f"Una malla de forma (pp, dp, tp) = ({pp}, {dp}, {tp}): ¿cuántas GPUs necesita la ejecución?")
    e = t(lang, f"One rank per mesh point: pp·dp·tp = {pp}·{dp}·{tp} = {fmt_int(ans, lang)}.",
          f"Un rango por punto de la malla: pp·dp·tp = {pp}·{dp}·{tp} = {fmt_int(ans, lang)}.")
    return numeric(L, "world-size", lang, q, e, ans, "number", "", {"pp": pp, "dp": dp, "tp": tp}, integer=True)


def coordinate(rng, lang):
    pp, dp, tp = _mesh(rng)
    rank = rng.randrange(pp * dp * tp)
    dim = rng.choice(["pp", "dp", "tp"])
    ans = f.mesh_coords(rank, pp, dp, tp)[dim]
    rule = {"tp": f"r mod t = {rank} mod {tp}", "dp": f"(r div t) mod d = ({rank} div {tp}) mod {dp}",
            "pp": f"r div (d·t) = {rank} div {dp * tp}"}[dim]
    q = t(lang, f"Mesh (pp, dp, tp) = ({pp}, {dp}, {tp}), ranks laid out row-major as init_device_mesh does: which "
                f"{_dim_name(dim, lang)} (counting from 0) is global rank {rank} in?",
          f"Malla (pp, dp, tp) = ({pp}, {dp}, {tp}), rangos colocados por filas como hace init_device_mesh: ¿en qué "
          f"{_dim_name(dim, lang)} (contando desde 0) está el rango global {rank}?")
    e = t(lang, f"{rule} = {ans}.", f"{rule} = {ans}.")
    return numeric(L, "coordinate", lang, q, e, ans, "number", "",
                   {"pp": pp, "dp": dp, "tp": tp, "rank": rank, "dim": dim}, integer=True)


def group_count(rng, lang):
    pp, dp, tp = _mesh(rng)
    dim = rng.choice(["pp", "dp", "tp"])
    ans = f.group_count(dim, pp, dp, tp)
    size = {"pp": pp, "dp": dp, "tp": tp}[dim]
    q = t(lang, f"Mesh (pp, dp, tp) = ({pp}, {dp}, {tp}): how many separate {dim.upper()} process groups exist?",
          f"Malla (pp, dp, tp) = ({pp}, {dp}, {tp}): ¿cuántos grupos de procesos {dim.upper()} distintos hay?")
    e = t(lang, f"Every rank is in exactly one {dim.upper()} group of {size}: {pp * dp * tp}/{size} = {ans}.",
          f"Cada rango está en exactamente un grupo {dim.upper()} de {size}: {pp * dp * tp}/{size} = {ans}.")
    return numeric(L, "group-count", lang, q, e, ans, "number", "", {"pp": pp, "dp": dp, "tp": tp, "dim": dim},
                   integer=True)


def group_stride(rng, lang):
    pp, dp, tp = _mesh(rng)
    dim = rng.choice(["pp", "dp"])
    ans = f.group_stride(dim, pp, dp, tp)
    q = t(lang, f"Mesh (pp, dp, tp) = ({pp}, {dp}, {tp}), row-major: how far apart (in global rank) are two "
                f"consecutive members of a {dim.upper()} group?",
          f"Malla (pp, dp, tp) = ({pp}, {dp}, {tp}), por filas: ¿a qué distancia (en rango global) están dos "
          f"miembros consecutivos de un grupo {dim.upper()}?")
    e = {"dp": t(lang, f"Moving one replica skips one TP group: t = {ans}.",
                 f"Pasar a la réplica siguiente salta un grupo TP: t = {ans}."),
         "pp": t(lang, f"Moving one stage skips a whole dp × tp block: d·t = {dp}·{tp} = {ans}.",
                 f"Pasar a la etapa siguiente salta un bloque dp × tp entero: d·t = {dp}·{tp} = {ans}.")}[dim]
    return numeric(L, "group-stride", lang, q, e, ans, "number", "", {"pp": pp, "dp": dp, "tp": tp, "dim": dim},
                   integer=True)


def params_per_gpu(rng, lang):
    name, psi, _, _ = rng.choice(MODELS)
    pp, tp = rng.choice([4, 8, 16]), rng.choice([2, 4, 8])
    ans = f.params_per_gpu(psi, pp, tp)
    q = t(lang, f"{name} with TP = {tp} and PP = {pp}: how many parameters does each GPU hold (before any ZeRO "
                f"sharding across data parallelism)?",
          f"{name} con TP = {tp} y PP = {pp}: ¿cuántos parámetros guarda cada GPU (antes de repartir nada con ZeRO "
          f"entre las réplicas de datos)?")
    e = t(lang, f"Ψ/(pp·tp) = {fmt_count(psi, lang)}/{pp * tp} = {fmt_count(ans, lang)}.",
          f"Ψ/(pp·tp) = {fmt_count(psi, lang)}/{pp * tp} = {fmt_count(ans, lang)}.")
    return numeric(L, "params-per-gpu", lang, q, e, ans, "count", "", {"params": psi, "pp": pp, "tp": tp})


def microbatches(rng, lang):
    dp, mb = rng.choice([8, 16, 32, 64]), rng.choice([1, 2, 4])
    m = rng.choice([8, 16, 32])
    gb = dp * mb * m
    ans = f.microbatches_per_replica(gb, dp, mb)
    q = t(lang, f"Global batch {fmt_int(gb, lang)} sequences, DP = {dp}, microbatch size {mb}: how many microbatches "
                f"does each pipeline run per step?",
          f"Batch global de {fmt_int(gb, lang)} secuencias, DP = {dp}, microbatch de {mb}: ¿cuántos microbatches "
          f"procesa cada pipeline por paso?")
    e = t(lang, f"B/(dp·b) = {fmt_int(gb, lang)}/({dp}·{mb}) = {ans}.",
          f"B/(dp·b) = {fmt_int(gb, lang)}/({dp}·{mb}) = {ans}.")
    return numeric(L, "microbatches", lang, q, e, ans, "number", "", {"global_batch": gb, "dp": dp, "micro_batch": mb},
                   integer=True)


def bubble(rng, lang):
    pp, dp = rng.choice([4, 8, 16]), rng.choice([8, 16, 32, 64])
    mb = rng.choice([1, 2])
    gb = dp * mb * rng.choice([8, 16, 32])
    m = f.microbatches_per_replica(gb, dp, mb)
    ans = bubble_fraction(pp, m)
    q = t(lang, f"PP = {pp} stages with 1F1B, DP = {dp}, global batch {fmt_int(gb, lang)}, microbatch size {mb}: what "
                f"share of the step is pipeline bubble (in %)?",
          f"PP = {pp} etapas con 1F1B, DP = {dp}, batch global de {fmt_int(gb, lang)}, microbatch de {mb}: ¿qué parte "
          f"del paso es burbuja del pipeline (en %)?")
    e = t(lang, f"m = B/(dp·b) = {m}; (p−1)/(m+p−1) = {pp - 1}/{m + pp - 1} = {fmt_pct(ans, lang)}. More DP means fewer "
                f"microbatches per pipeline and a larger bubble.",
          f"m = B/(dp·b) = {m}; (p−1)/(m+p−1) = {pp - 1}/{m + pp - 1} = {fmt_pct(ans, lang)}. Más DP significa menos "
          f"microbatches por pipeline y más burbuja.")
    return numeric(L, "bubble", lang, q, e, ans, "fraction", "%",
                   {"pp": pp, "dp": dp, "global_batch": gb, "micro_batch": mb})


def dp_grads(rng, lang):
    name, psi, _, _ = rng.choice(MODELS)
    pp, tp = rng.choice([4, 8, 16]), rng.choice([2, 4, 8])
    ans = f.dp_grad_bytes(psi, pp, tp, 2)
    q = t(lang, f"{name}, TP = {tp}, PP = {pp}, bf16 gradients: how many bytes of gradients does each data-parallel "
                f"group average per step (the size of the all-reduce, in GB)?",
          f"{name}, TP = {tp}, PP = {pp}, gradientes bf16: ¿cuántos bytes de gradientes promedia cada grupo de datos "
          f"por paso (el tamaño del all-reduce, en GB)?")
    e = t(lang, f"Each DP group holds one shard of the model: 2·Ψ/(pp·tp) = 2·{fmt_count(psi, lang)}/{pp * tp} = "
                f"{fmt_bytes(ans, lang)}.",
          f"Cada grupo DP tiene un trozo del modelo: 2·Ψ/(pp·tp) = 2·{fmt_count(psi, lang)}/{pp * tp} = "
          f"{fmt_bytes(ans, lang)}.")
    return numeric(L, "dp-grad-bytes", lang, q, e, ans, "bytes", "GB", {"params": psi, "pp": pp, "tp": tp})


def p2p_bytes(rng, lang):
    name, _, _, h = rng.choice(MODELS)
    s, mb, tp = rng.choice([2048, 4096, 8192]), rng.choice([1, 2]), rng.choice([1, 2, 4, 8])
    ans = f.pp_p2p_bytes_per_microbatch(s, mb, h, tp, 2, scatter_gather=True)
    q = t(lang, f"{name} (h = {h}), sequence {s}, microbatch {mb}, TP = {tp}, bf16, Megatron's scatter/gather "
                f"optimisation: how many bytes does each TP rank send to the next stage per microbatch (in MB)?",
          f"{name} (h = {h}), secuencia de {s}, microbatch de {mb}, TP = {tp}, bf16, con la optimización "
          f"scatter/gather de Megatron: ¿cuántos bytes envía cada rango TP a la etapa siguiente por microbatch (en MB)?")
    e = t(lang, f"s·b·h·2/t = {s}·{mb}·{h}·2/{tp} = {fmt_bytes(ans, lang)}: each TP rank sends 1/t and the receiving "
                f"stage all-gathers over NVLink.",
          f"s·b·h·2/t = {s}·{mb}·{h}·2/{tp} = {fmt_bytes(ans, lang)}: cada rango TP envía 1/t y la etapa que recibe "
          f"hace un all-gather por NVLink.")
    return numeric(L, "p2p-bytes", lang, q, e, ans, "bytes", "MB", {"seq": s, "micro_batch": mb, "hidden": h, "tp": tp})


def innermost(rng, lang):
    return choice(
        L, "innermost", lang, rng,
        t(lang, "Why does tensor parallelism go in the innermost mesh dimension (consecutive ranks)?",
          "¿Por qué el paralelismo tensorial va en la dimensión más interna de la malla (rangos consecutivos)?"),
        t(lang, "Consecutive ranks share a node's NVLink, and TP's per-layer collectives are the largest and sit on "
                "the critical path",
          "Los rangos consecutivos comparten el NVLink de un nodo, y las colectivas por capa de TP son las mayores y "
          "están en el camino crítico"),
        [t(lang, "TP groups need the most memory", "Los grupos TP necesitan más memoria"),
         t(lang, "PyTorch only allows TP in the last dimension", "PyTorch solo permite TP en la última dimensión"),
         t(lang, "TP sends the fewest bytes, so its order does not matter",
           "TP envía menos bytes, así que su orden no importa")],
        t(lang, "4 collectives of s·b·h per layer and microbatch, forward and backward, that the next matmul waits "
                "for: over NVLink they are cheap, across nodes they dominate (Narayanan et al. 2021).",
          "4 colectivas de s·b·h por capa y microbatch, en el forward y el backward, que la siguiente multiplicación "
          "espera: por NVLink son baratas; entre nodos dominan (Narayanan et al. 2021)."))


def crosses_nodes(rng, lang):
    pp, dp = rng.choice([2, 4, 8]), rng.choice([2, 4, 8])
    tp = 8
    dims = {d: f.nodes_spanned(d, pp, dp, tp, 8) for d in ("pp", "dp", "tp")}
    return choice(
        L, "within-node", lang, rng,
        t(lang, f"Mesh (pp, dp, tp) = ({pp}, {dp}, {tp}) on nodes of 8 GPUs, ranks filling nodes in order: which "
                f"groups stay inside one node?",
          f"Malla (pp, dp, tp) = ({pp}, {dp}, {tp}) en nodos de 8 GPUs, rangos llenando los nodos en orden: ¿qué "
          f"grupos se quedan dentro de un nodo?"),
        t(lang, "Only the TP groups", "Solo los grupos TP"),
        [t(lang, "Only the DP groups", "Solo los grupos DP"), t(lang, "Only the PP groups", "Solo los grupos PP"),
         t(lang, "All three", "Los tres")],
        t(lang, f"A TP group is 8 consecutive ranks, one node; a DP group strides by t = 8 and spans {dims['dp']} nodes, "
                f"a PP group strides by d·t = {dp * tp} and spans {dims['pp']}.",
          f"Un grupo TP son 8 rangos consecutivos, un nodo; un grupo DP salta de t = 8 en 8 y ocupa {dims['dp']} "
          f"nodos; uno PP salta de d·t = {dp * tp} en {dp * tp} y ocupa {dims['pp']}."),
        {"pp": pp, "dp": dp, "tp": tp})


def pp_activations(rng, lang):
    return choice(
        L, "pp-activations", lang, rng,
        t(lang, "With 1F1B, doubling the pipeline degree pp (same model, same microbatch) does what to the first "
                "stage's activation memory?",
          "Con 1F1B, duplicar el grado de pipeline pp (mismo modelo, mismo microbatch), ¿qué le hace a la memoria de "
          "activaciones de la primera etapa?"),
        t(lang, "Nothing: half the layers, but twice the microbatches in flight",
          "Nada: la mitad de capas, pero el doble de microbatches en vuelo"),
        [t(lang, "Halves it", "La reduce a la mitad"), t(lang, "Doubles it", "La duplica"),
         t(lang, "Divides it by pp²", "La divide entre pp²")],
        t(lang, "The first stage keeps pp microbatches of L/pp layers: pp·L/pp = L layers' worth (Korthikanti et al. "
                "2022, Sec. 4.2.3). TP with sequence parallelism or recomputation shrink it; PP does not.",
          "La primera etapa guarda pp microbatches de L/pp capas: pp·L/pp = L capas (Korthikanti et al. 2022, "
          "sec. 4.2.3). TP con paralelismo de secuencia o el recómputo la reducen; PP no."))


GENERATORS = {
    "world-size": world,
    "coordinate": coordinate,
    "group-count": group_count,
    "group-stride": group_stride,
    "params-per-gpu": params_per_gpu,
    "microbatches": microbatches,
    "bubble": bubble,
    "dp-grad-bytes": dp_grads,
    "p2p-bytes": p2p_bytes,
    "innermost": innermost,
    "within-node": crosses_nodes,
    "pp-activations": pp_activations,
}
