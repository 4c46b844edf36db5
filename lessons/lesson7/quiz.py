"""Lesson 7 quiz: KV cache, decode rooflines, parallel inference. Answers from :mod:`.formulas`."""
from __future__ import annotations

from ..quiz import choice, fmt_bytes, fmt_count, fmt_int, fmt_num, fmt_time, numeric, t
from . import formulas as f

L = "lesson7"
# (name, layers, query heads, kv heads, head dim, parameters)
MODELS = [
    ("Llama-2-7B", 32, 32, 32, 128, 6.7e9),
    ("Llama-2-13B", 40, 40, 40, 128, 13e9),
    ("Llama-2-70B", 80, 64, 8, 128, 69e9),
    ("Llama-3-8B", 32, 32, 8, 128, 8e9),
    ("Mistral-7B", 32, 32, 8, 128, 7.2e9),
]
DTYPES = [("fp16", 2), ("bf16", 2), ("fp8", 1)]
GPUS = [("A100 80GB", 2.0e12, 312e12), ("H100 SXM", 3.35e12, 989e12), ("H200", 4.8e12, 989e12)]


def _model(rng):
    return rng.choice(MODELS)


def kv_per_token(rng, lang):
    name, layers, _, kvh, d, _ = _model(rng)
    dt, nb = rng.choice(DTYPES)
    ans = f.kv_cache_bytes_per_token(layers, kvh, d, nb)
    q = t(lang, f"{name}: {layers} layers, {kvh} KV heads of dimension {d}, KV cache in {dt}. How many bytes of KV cache "
                f"does each token need (in KiB)?",
          f"{name}: {layers} capas, {kvh} cabezas KV de dimensión {d}, KV cache en {dt}. ¿Cuántos bytes de KV cache "
          f"necesita cada token (en KiB)?")
    e = t(lang, f"2 (K and V) · L · H_kv · d · bytes = 2·{layers}·{kvh}·{d}·{nb} = {fmt_int(ans, lang)} B = {ans / 1024:g} KiB.",
          f"2 (K y V) · L · H_kv · d · bytes = 2·{layers}·{kvh}·{d}·{nb} = {fmt_int(ans, lang)} B = "
          f"{fmt_num(ans / 1024, lang, 6)} KiB.")
    return numeric(L, "kv-per-token", lang, q, e, ans, "bytes", "KiB",
                   {"layers": layers, "kv_heads": kvh, "head_dim": d, "dtype_bytes": nb})


def kv_total(rng, lang):
    name, layers, _, kvh, d, _ = _model(rng)
    batch, ctx = rng.choice([1, 8, 16, 32, 64]), rng.choice([2048, 4096, 8192, 32768])
    tokens = batch * ctx
    r = f.kv_cache_total(layers, kvh, d, 2, tokens)
    ans = r["total_bytes"]
    q = t(lang, f"{name} ({layers} layers, {kvh} KV heads, d = {d}), fp16 KV cache, {batch} sequences of {fmt_int(ctx, lang)} "
                f"tokens: how big is the KV cache (in GB)?",
          f"{name} ({layers} capas, {kvh} cabezas KV, d = {d}), KV cache en fp16, {batch} secuencias de {fmt_int(ctx, lang)} "
          f"tokens: ¿cuánto ocupa la KV cache (en GB)?")
    e = t(lang, f"{fmt_int(r['bytes_per_token'], lang)} B/token × {fmt_int(tokens, lang)} tokens = {fmt_bytes(ans, lang)}.",
          f"{fmt_int(r['bytes_per_token'], lang)} B/token × {fmt_int(tokens, lang)} tokens = {fmt_bytes(ans, lang)}.")
    return numeric(L, "kv-total", lang, q, e, ans, "bytes", "GB",
                   {"layers": layers, "kv_heads": kvh, "head_dim": d, "dtype_bytes": 2, "tokens": tokens})


def kv_per_gpu(rng, lang):
    name, layers, _, kvh, d, _ = rng.choice([m for m in MODELS if m[3] == 8])
    tp, pp = rng.choice([(2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 4)])
    tokens = rng.choice([16384, 65536, 131072])
    r = f.kv_cache_total(layers, kvh, d, 2, tokens, tp, pp)
    ans = r["per_gpu_bytes"]
    q = t(lang, f"{name} ({layers} layers, {kvh} KV heads, d = {d}), fp16, {fmt_int(tokens, lang)} cached tokens, served with "
                f"TP = {tp} and PP = {pp}: how much KV cache does each GPU hold (in GB)?",
          f"{name} ({layers} capas, {kvh} cabezas KV, d = {d}), fp16, {fmt_int(tokens, lang)} tokens en caché, servido con "
          f"TP = {tp} y PP = {pp}: ¿cuánta KV cache guarda cada GPU (en GB)?")
    e = t(lang, f"TP splits heads ({kvh}/{tp} = {kvh // tp} per GPU), PP splits layers ({layers}/{pp} = {layers // pp}): "
                f"2·{layers // pp}·{kvh // tp}·{d}·2 B × {fmt_int(tokens, lang)} = {fmt_bytes(ans, lang)}.",
          f"TP reparte cabezas ({kvh}/{tp} = {kvh // tp} por GPU), PP reparte capas ({layers}/{pp} = {layers // pp}): "
          f"2·{layers // pp}·{kvh // tp}·{d}·2 B × {fmt_int(tokens, lang)} = {fmt_bytes(ans, lang)}.")
    return numeric(L, "kv-per-gpu", lang, q, e, ans, "bytes", "GB",
                   {"layers": layers, "kv_heads": kvh, "head_dim": d, "dtype_bytes": 2, "tokens": tokens, "tp": tp, "pp": pp})


def decode_bound(rng, lang):
    name, _, _, _, _, params = _model(rng)
    gpu, bw, _ = rng.choice(GPUS)
    w = params * 2
    ans = f.decode_tokens_per_s_upper_bound(bw, w)
    q = t(lang, f"{name} ({fmt_count(params, lang)} parameters, fp16 weights) decodes one sequence on one {gpu} "
                f"({fmt_num(bw / 1e12, lang)} TB/s). Ignoring the KV cache, at most how many tokens per second?",
          f"{name} ({fmt_count(params, lang)} parámetros, pesos fp16) decodifica una secuencia en una {gpu} "
          f"({fmt_num(bw / 1e12, lang)} TB/s). Sin contar la KV cache, ¿cuántos tokens por segundo como máximo?")
    e = t(lang, f"Each token reads all weights once: {fmt_bytes(bw, lang)}/s ÷ {fmt_bytes(w, lang)} = {fmt_num(ans, lang)} tokens/s.",
          f"Cada token lee todos los pesos una vez: {fmt_bytes(bw, lang)}/s ÷ {fmt_bytes(w, lang)} = {fmt_num(ans, lang)} tokens/s.")
    return numeric(L, "decode-bound", lang, q, e, ans, "number", "", {"bandwidth": bw, "bytes_per_token_read": w})


def max_tokens(rng, lang):
    name, layers, _, kvh, d, _ = _model(rng)
    free = rng.choice([10e9, 20e9, 40e9])
    per = f.kv_cache_bytes_per_token(layers, kvh, d, 2)
    ans = f.max_kv_tokens(free, per)
    q = t(lang, f"{name} ({layers} layers, {kvh} KV heads, d = {d}), fp16 KV cache, {fmt_bytes(free, lang)} free after the "
                f"weights: how many tokens of KV cache fit (±2%)?",
          f"{name} ({layers} capas, {kvh} cabezas KV, d = {d}), KV cache fp16, {fmt_bytes(free, lang)} libres tras los "
          f"pesos: ¿cuántos tokens de KV cache caben (±2 %)?")
    e = t(lang, f"{fmt_bytes(free, lang)} ÷ {fmt_int(per, lang)} B/token = {fmt_int(ans, lang)} tokens.",
          f"{fmt_bytes(free, lang)} ÷ {fmt_int(per, lang)} B/token = {fmt_int(ans, lang)} tokens.")
    return numeric(L, "max-tokens", lang, q, e, ans, "count", "", {"free_bytes": free, "bytes_per_token": per})


def gqa_ratio(rng, lang):
    heads = rng.choice([32, 64, 96])
    kvh = rng.choice([1, 4, 8])
    layers = rng.choice([32, 80])
    mha = f.kv_cache_bytes_per_token(layers, heads, 128, 2)
    gqa = f.kv_cache_bytes_per_token(layers, kvh, 128, 2)
    ans = mha / gqa
    q = t(lang, f"A model with {heads} query heads switches from multi-head attention to grouped-query attention with "
                f"{kvh} KV heads. By what factor does its KV cache shrink?",
          f"Un modelo con {heads} cabezas de consulta pasa de atención multi-cabeza a atención por grupos de consultas con "
          f"{kvh} cabezas KV. ¿En qué factor se reduce su KV cache?")
    e = t(lang, f"The cache is proportional to H_kv: {fmt_int(mha, lang)} / {fmt_int(gqa, lang)} B per token = {heads}/{kvh} = "
                f"{fmt_num(ans, lang)}×.",
          f"La caché es proporcional a H_kv: {fmt_int(mha, lang)} / {fmt_int(gqa, lang)} B por token = {heads}/{kvh} = "
          f"{fmt_num(ans, lang)}×.")
    return numeric(L, "gqa-ratio", lang, q, e, ans, "number", "", {"heads": heads, "kv_heads": kvh, "layers": layers})


def decode_time(rng, lang):
    name, layers, _, kvh, d, params = _model(rng)
    gpu, bw, peak = rng.choice(GPUS)
    batch, ctx = rng.choice([1, 8, 32]), rng.choice([1024, 4096])
    kv = f.kv_cache_bytes_per_token(layers, kvh, d, 2) * ctx
    ans = f.decode_time_per_token(params, params * 2, kv, peak, bw, batch)
    q = t(lang, f"{name} ({fmt_count(params, lang)} params, fp16) on one {gpu} ({fmt_num(bw / 1e12, lang)} TB/s, "
                f"{fmt_num(peak / 1e12, lang)} TFLOP/s), batch {batch}, each sequence with {fmt_int(ctx, lang)} tokens of KV "
                f"cache ({fmt_bytes(kv, lang)}). Roofline time of one decode step (in ms)?",
          f"{name} ({fmt_count(params, lang)} parámetros, fp16) en una {gpu} ({fmt_num(bw / 1e12, lang)} TB/s, "
          f"{fmt_num(peak / 1e12, lang)} TFLOP/s), batch {batch}, cada secuencia con {fmt_int(ctx, lang)} tokens de KV "
          f"cache ({fmt_bytes(kv, lang)}). ¿Tiempo roofline de un paso de decode (en ms)?")
    compute = 2 * params * batch / peak
    memory = (params * 2 + batch * kv) / bw
    e = t(lang, f"max(2·N·B/peak, (W + B·KV)/bandwidth) = max({fmt_time(compute, lang)}, {fmt_time(memory, lang)}) = "
                f"{fmt_time(ans, lang)} — {'memory' if memory >= compute else 'compute'}-bound.",
          f"max(2·N·B/pico, (W + B·KV)/ancho de banda) = max({fmt_time(compute, lang)}, {fmt_time(memory, lang)}) = "
          f"{fmt_time(ans, lang)}: limitado por {'memoria' if memory >= compute else 'cómputo'}.")
    return numeric(L, "decode-time", lang, q, e, ans, "seconds", "ms",
                   {"params": params, "weight_bytes": params * 2, "kv_bytes_per_seq": kv, "peak_flops": peak,
                    "bandwidth": bw, "batch": batch})


def ridge(rng, lang):
    gpu, bw, peak = rng.choice(GPUS)
    ans = f.ridge_point(peak, bw)
    q = t(lang, f"{gpu}: {fmt_num(peak / 1e12, lang)} TFLOP/s dense fp16 and {fmt_num(bw / 1e12, lang)} TB/s. Above how many "
                f"FLOPs per byte is a kernel compute-bound (the ridge point)?",
          f"{gpu}: {fmt_num(peak / 1e12, lang)} TFLOP/s densos en fp16 y {fmt_num(bw / 1e12, lang)} TB/s. ¿Por encima de "
          f"cuántos FLOPs por byte un kernel está limitado por cómputo (el punto de inflexión)?")
    e = t(lang, f"peak / bandwidth = {fmt_num(peak, lang)} / {fmt_num(bw, lang)} = {fmt_num(ans, lang)} FLOP/B. Decode at "
                f"batch 1 does ~1 FLOP per byte of weights (2 FLOPs per 2-byte parameter): far below.",
          f"pico / ancho de banda = {fmt_num(peak, lang)} / {fmt_num(bw, lang)} = {fmt_num(ans, lang)} FLOP/B. El decode "
          f"con batch 1 hace ~1 FLOP por byte de pesos (2 FLOPs por parámetro de 2 bytes): muy por debajo.")
    return numeric(L, "ridge", lang, q, e, ans, "number", "", {"peak_flops": peak, "bandwidth": bw})


def decode_bound_why(rng, lang):
    return choice(
        L, "decode-memory-bound", lang, rng,
        t(lang, "Why is decoding at small batch memory-bandwidth bound while prefill is compute-bound?",
          "¿Por qué el decode con batch pequeño está limitado por el ancho de banda de memoria y el prefill por el cómputo?"),
        t(lang, "Each decode step reads all weights to produce one token per sequence; prefill reuses them across the whole prompt",
          "Cada paso de decode lee todos los pesos para producir un token por secuencia; el prefill los reutiliza en todo el prompt"),
        [t(lang, "Decode uses fp32 while prefill uses fp16", "El decode usa fp32 y el prefill fp16"),
         t(lang, "The KV cache is recomputed at every decode step", "La KV cache se recalcula en cada paso de decode"),
         t(lang, "Prefill skips attention", "El prefill se salta la atención")],
        t(lang, "Arithmetic intensity: decode does ~2 FLOPs per parameter read (≈1 FLOP/byte in fp16), far below a GPU's "
                "ridge point (~300 FLOP/B); prefill does 2·s FLOPs per parameter read.",
          "Intensidad aritmética: el decode hace ~2 FLOPs por parámetro leído (≈1 FLOP/byte en fp16), muy por debajo del "
          "punto de inflexión de una GPU (~300 FLOP/B); el prefill hace 2·s FLOPs por parámetro leído."))


def paged(rng, lang):
    return choice(
        L, "paged", lang, rng,
        t(lang, "What does PagedAttention's block table fix?",
          "¿Qué resuelve la tabla de bloques de PagedAttention?"),
        t(lang, "Memory fragmentation: KV cache is allocated in small fixed blocks as tokens arrive, not reserved for the maximum length",
          "La fragmentación de memoria: la KV cache se asigna en bloques pequeños fijos según llegan tokens, sin reservar la longitud máxima"),
        [t(lang, "The compute cost of attention", "El coste de cómputo de la atención"),
         t(lang, "The need for a KV cache", "La necesidad de una KV cache"),
         t(lang, "Communication between tensor-parallel ranks", "La comunicación entre ranks de paralelismo tensorial")],
        t(lang, "A contiguous cache reserves max-length space per request and wastes what is unused; paged blocks waste at "
                "most one partly filled block per sequence and can be shared (Kwon et al. 2023).",
          "Una caché contigua reserva la longitud máxima por petición y desperdicia lo que no usa; los bloques paginados "
          "desperdician como mucho un bloque a medias por secuencia y se pueden compartir (Kwon et al. 2023)."))


def tp_decode(rng, lang):
    return choice(
        L, "tp-decode", lang, rng,
        t(lang, "With tensor parallelism, how many all-reduces does each transformer layer need per decoded token?",
          "Con paralelismo tensorial, ¿cuántos all-reduce necesita cada capa transformer por token decodificado?"),
        t(lang, "2 (after attention and after the MLP), each of b·h elements", "2 (tras la atención y tras el MLP), cada uno de b·h elementos"),
        [t(lang, "4, like training", "4, como en el entrenamiento"), t(lang, "None", "Ninguno"),
         t(lang, "1 per attention head", "1 por cabeza de atención")],
        t(lang, "Inference has no backward pass, so only the forward's two g all-reduces remain; they are small (b·h) and "
                "latency-bound, which is why TP decode wants NVLink.",
          "En inferencia no hay backward, así que solo quedan los dos all-reduce g del forward; son pequeños (b·h) y "
          "limitados por latencia, por eso el decode con TP quiere NVLink."))


GENERATORS = {
    "kv-per-token": kv_per_token,
    "kv-total": kv_total,
    "kv-per-gpu": kv_per_gpu,
    "decode-bound": decode_bound,
    "max-tokens": max_tokens,
    "gqa-ratio": gqa_ratio,
    "decode-time": decode_time,
    "ridge": ridge,
    "decode-memory-bound": decode_bound_why,
    "paged": paged,
    "tp-decode": tp_decode,
}
