"""Every quiz generator's answer equals the calculator's (the lesson formulas and `distai calc --json`),
over many seeds and both languages; quizzes are reproducible; every question is well formed."""
import itertools
import json
import math

import pytest

from distai.lessons import quiz
from distai.lessons.lesson1 import formulas as f1
from distai.lessons.lesson2 import formulas as f2
from distai.lessons.lesson3 import formulas as f3
from distai.lessons.lesson4 import formulas as f4
from distai.lessons.lesson5 import formulas as f5
from distai.lessons.lesson6 import formulas as f6
from distai.lessons.lesson7 import formulas as f7
from distai.lessons.registry import all_lessons

SEEDS = range(40)

# kind -> the answer recomputed from the question's params with the formula functions.
EXPECTED = {
    "lesson1": {
        "ring-time": lambda p: f1.ring_allreduce_time(p["size_bytes"], p["n"], p["alpha"], p["beta"]),
        "ring-bytes": lambda p: f1.allreduce_bytes_per_rank(p["size_bytes"], p["n"], "ring"),
        "ring-steps": lambda p: 2 * (p["n"] - 1),
        "tree-steps": lambda p: 2 * math.ceil(math.log2(p["n"])),
        "busbw": lambda p: f1.busbw(p["size_bytes"], p["time_s"], p["n"]),
        "algbw": lambda p: p["size_bytes"] / p["time_s"],
        "naive-ratio": lambda p: (f1.naive_allreduce_time(p["size_bytes"], p["n"], p["alpha"], p["beta"])
                                  / f1.ring_allreduce_time(p["size_bytes"], p["n"], p["alpha"], p["beta"])),
        "crossover": lambda p: p["n"] * p["alpha"] / p["beta"],
    },
    "lesson2": {
        "zero-total": lambda p: f2.model_state_bytes(p["params"], p["dp"], p["strategy"])["total_bytes"],
        "ddp-total": lambda p: f2.model_state_bytes(p["params"], 1, "ddp", p["optimizer"], p["precision"])["total_bytes"],
        "optimizer-shard": lambda p: 12 * p["params"] / p["dp"],
        "comm-volume": lambda p: f2.comm_volume_per_step(p["params"], p["strategy"])["bytes"],
        "max-fit": lambda p: f2.max_params_that_fit(p["memory_bytes"], p["dp"], p["strategy"]),
        "activations": lambda p: f2.activation_bytes_per_layer(p["seq"], p["micro_batch"], p["hidden"], p["heads"]),
        "k-value": lambda p: f2.optimizer_k(p["optimizer"], p["precision"]),
    },
    "lesson3": {
        "job-mtbf": lambda p: p["gpu_mtbf"] / p["n_gpus"],
        "young": lambda p: math.sqrt(2 * p["cost"] * p["mtbf"]),
        "daly": lambda p: f3.daly_interval(p["mtbf"], p["cost"]),
        "waste": lambda p: f3.expected_waste_fraction(p["interval"], p["mtbf"], p["cost"], p["restart"]),
        "failures-per-day": lambda p: 86400 * p["n_gpus"] / p["gpu_mtbf"],
        "gpu-mtbf-from-log": lambda p: p["n_components"] * p["duration_s"] / p["failures"],
    },
    "lesson4": {
        "allreduce-count": lambda p: 4 * p["layers"],
        "tensor-bytes": lambda p: p["seq"] * p["micro_batch"] * p["hidden"] * 2,
        "bytes-per-rank": lambda p: f4.tp_comm_per_layer(p["hidden"], p["seq"], p["micro_batch"], p["tp"],
                                                         p["sequence_parallel"])["total_bytes_per_rank"],
        "activations-tp": lambda p: f2.activation_bytes_per_layer(p["seq"], p["micro_batch"], p["hidden"], p["heads"],
                                                                  p["tp"], p["sequence_parallel"]),
        "sp-saving": lambda p: f4.tp_activation_saving(p["seq"], 1, p["hidden"], p["heads"], p["tp"]),
        "comm-time": lambda p: 4 * f1.ring_allreduce_time(p["seq"] * p["micro_batch"] * p["hidden"] * 2, p["tp"],
                                                          p["alpha"], p["beta"]),
    },
    "lesson5": {
        "bubble-fraction": lambda p: (p["p"] - 1) / (p["m"] + p["p"] - 1),
        "bubble-ratio": lambda p: (p["p"] - 1) / p["m"],
        "step-time": lambda p: p["m"] + p["p"] - 1,
        "peak-inflight": lambda p: f5.peak_inflight_microbatches(p["p"], p["m"], p["schedule"]),
        "interleaved": lambda p: f5.bubble_fraction(p["p"], p["m"], p["v"]),
        "microbatches-needed": lambda p: f5.microbatches_for_bubble(p["p"], p["target_fraction"]),
        "warmup": lambda p: p["p"] - p["rank"] - 1,
        "interleaving-messages": lambda p: (p["v"] * p["p"] - 1) / (p["p"] - 1),
    },
    "lesson6": {
        "max-value": lambda p: f6.max_value(p["fmt"]),
        "smallest": lambda p: (f6.smallest_normal if p["which"] == "normal" else f6.smallest_subnormal)(p["fmt"]),
        "spacing": lambda p: f6.spacing(p["x"], p["fmt"]),
        "scale-after": lambda p: f6.gradscaler_trajectory([True] * p["overflows_first"] + [False] * p["good_steps"])[-1]
        if p["overflows_first"] + p["good_steps"] else 2.0 ** 16,
        "bucket-count": lambda p: f6.ddp_bucket_count([p["bytes_each"]] * p["n_params"]),
        "epsilon": lambda p: f6.machine_epsilon(p["fmt"]),
    },
    "lesson7": {
        "kv-per-token": lambda p: 2 * p["layers"] * p["kv_heads"] * p["head_dim"] * p["dtype_bytes"],
        "kv-total": lambda p: f7.kv_cache_total(p["layers"], p["kv_heads"], p["head_dim"], p["dtype_bytes"],
                                                p["tokens"])["total_bytes"],
        "kv-per-gpu": lambda p: f7.kv_cache_total(p["layers"], p["kv_heads"], p["head_dim"], p["dtype_bytes"],
                                                  p["tokens"], p["tp"], p["pp"])["per_gpu_bytes"],
        "decode-bound": lambda p: p["bandwidth"] / p["bytes_per_token_read"],
        "max-tokens": lambda p: p["free_bytes"] // p["bytes_per_token"],
        "gqa-ratio": lambda p: p["heads"] / p["kv_heads"],
        "decode-time": lambda p: max(2 * p["params"] * p["batch"] / p["peak_flops"],
                                     (p["weight_bytes"] + p["batch"] * p["kv_bytes_per_seq"]) / p["bandwidth"]),
        "ridge": lambda p: p["peak_flops"] / p["bandwidth"],
        # the weights' bytes one GPU reads (fp16/bf16), at its bandwidth, over the published step (tokens/s at batch 1)
        "published-bandwidth-share": lambda p: (p["params"] * 2 / p["tp"]) / p["bandwidth"] / p["measured"],
    },
}

def _mesh5_ranks(p):
    """Brute force: every rank's (pp, dp, cp, tp) in the order init_device_mesh numbers a row-major
    (pp, dp, cp, tp) mesh, and its place i = d·cp + c among the dp·cp ranks of its (pp, tp)."""
    out = []
    for pp_i, dp_i, cp_i, tp_i in itertools.product(range(p["pp"]), range(p["dp"]), range(p["cp"]), range(p["tp"])):
        i = dp_i * p["cp"] + cp_i
        out.append({"pp": pp_i, "dp": dp_i, "cp": cp_i, "tp": tp_i, "ep": i % p["ep"], "edp": i // p["ep"]})
    return out


# what a rank shares with the others of its group along each axis (EP: its EP group's number; EDP: its place in it)
GROUP_KEY = {"tp": ("pp", "dp", "cp"), "cp": ("pp", "dp", "tp"), "dp": ("pp", "tp"), "ep": ("pp", "tp", "edp"),
             "edp": ("pp", "tp", "ep"), "pp": ("dp", "cp", "tp")}


def mesh5_group(p, rank, dim):
    ranks = _mesh5_ranks(p)
    key = [ranks[rank][k] for k in GROUP_KEY[dim]]
    return [r for r, c in enumerate(ranks) if [c[k] for k in GROUP_KEY[dim]] == key]


def _states(p):
    from distai.lessons.capstone.quiz import MOE_MODELS

    spec = MOE_MODELS[p["model"]]
    expert, dense = spec.expert_params, spec.params - spec.expert_params
    dc = p["dp"] * p["cp"]
    return (dense / (p["tp"] * p["pp"]) * (6 + 12 / (dc if p["zero"] else 1))
            + expert / (p["tp"] * p["pp"] * p["ep"]) * (6 + 12 / (dc // p["ep"] if p["zero"] else 1)))


EXPECTED["capstone"] = {
    # the five-axis mesh, brute force: rank = ((p·dp + d)·cp + c)·tp + t
    "world-size": lambda p: p["pp"] * p["dp"] * p["cp"] * p["tp"],
    "coordinate": lambda p: _mesh5_ranks(p)[p["rank"]][p["dim"]],
    "group-count": lambda p: len({tuple(c[k] for k in GROUP_KEY[p["dim"]]) for c in _mesh5_ranks(p)}),
    "group-stride": lambda p: mesh5_group(p, 0, p["dim"])[1] - mesh5_group(p, 0, p["dim"])[0],
    "params-per-gpu": lambda p: p["params"] / (p["pp"] * p["tp"]),
    "microbatches": lambda p: p["global_batch"] // (p["dp"] * p["micro_batch"]),
    "bubble": lambda p: f5.bubble_fraction(p["pp"], p["global_batch"] // (p["dp"] * p["micro_batch"])),
    "dp-grad-bytes": lambda p: 2 * p["params"] / (p["pp"] * p["tp"]),
    # a ring all-reduce (or ZeRO-1's reduce-scatter + all-gather) over the dp·cp ranks, bf16
    "dp-bytes": lambda p: 2 * (p["dp"] * p["cp"] - 1) / (p["dp"] * p["cp"]) * p["params"] / (p["pp"] * p["tp"]) * 2,
    "tp-bytes": lambda p: 8 * (p["tp"] - 1) / p["tp"] * p["seq"] / p["cp"] * p["hidden"] * 2,
    "cp-bytes": lambda p: p["m"] * p["layers"] / p["pp"] * (3 * p["cp"] - 2) * 2 * p["seq"] / p["cp"]
    * max(1, p["kv_heads"] // p["tp"]) * p["hidden"] / p["heads"] * 2,
    "ep-bytes": lambda p: 2 * p["seq"] * p["micro_batch"] / p["cp"] * p["top_k"] * (p["ep"] - 1) / p["ep"] * p["hidden"] * 2,
    "p2p-bytes": lambda p: p["seq"] / p["cp"] * p["micro_batch"] * p["hidden"] * 2 / p["tp"],
    "model-states": _states,
}


def _kv_block(p):
    return 2 * p["seq"] / p["cp"] * max(1, p["kv_heads"] // p["tp"]) * p["hidden"] / p["heads"] * 2


def _contiguous_idle(cp, chunk=4096 * 2):
    """Chunks of ``chunk`` tokens: step 0 is the diagonal (c(c+1)/2 scores), later steps a full tile
    (c²) for the busiest rank; every rank's work summed is the causal triangle."""
    diagonal, full = chunk * (chunk + 1) / 2, chunk * chunk
    work = cp * diagonal + full * cp * (cp - 1) / 2
    return 1 - work / (cp * (diagonal + (cp - 1) * full))


EXPECTED["context"] = {
    "activations-cp": lambda p: p["seq"] / p["cp"] * p["hidden"] / p["tp"] * 34,
    "scores": lambda p: p["heads"] / p["tp"] * p["seq"] / p["cp"] * p["seq"] * 2,
    "kv-block": _kv_block,
    "ring-messages": lambda p: 3 * p["cp"] - 2,
    "ring-bytes": lambda p: (3 * p["cp"] - 2) * _kv_block(p),
    "allgather-bytes": lambda p: 3 * (p["cp"] - 1) * _kv_block(p),
    "idle": lambda p: _contiguous_idle(p["cp"]),
    "merge": lambda p: sum(math.exp(p[f"score_{x}"]) * p[f"value_{x}"] for x in "abc")
    / sum(math.exp(p[f"score_{x}"]) for x in "abc"),
}

# Choice questions whose right option depends on the numbers: recompute which one is right.
def _moe_params(p: dict, experts_used: int) -> float:
    h, kv = p["hidden"], p["kv_heads"] * p["hidden"] // p["heads"]
    per_layer = 2 * h * h + 2 * h * kv + h * p["experts"] + 2 * h + experts_used * 3 * h * p["ffn"]
    return p["layers"] * per_layer + 2 * p["vocab"] * h + h


def _binomial_overflow(n: int, q: float, c: int) -> float:
    return sum((x - c) * math.comb(n, x) * q ** x * (1 - q) ** (n - x) for x in range(c + 1, n + 1))


EXPECTED["experts"] = {
    "total-params": lambda p: _moe_params(p, p["experts"]),
    "active-params": lambda p: _moe_params(p, p["top_k"]),
    "capacity": lambda p: math.ceil(p["capacity_factor"] * p["tokens"] * p["top_k"] / p["experts"]),
    # each token picks top_k different experts: an expert's load is Binomial(T, k/E)
    "drop-rate": lambda p: p["experts"] * _binomial_overflow(
        p["tokens"], p["top_k"] / p["experts"],
        math.ceil(p["capacity_factor"] * p["tokens"] * p["top_k"] / p["experts"])) / (p["tokens"] * p["top_k"]),
    "aux-loss": lambda p: p["alpha"] * p["experts"] * (p["hot"] ** 2 + (1 - p["hot"]) ** 2 / (p["experts"] - 1)),
    "experts-per-gpu": lambda p: p["experts"] // p["ep"],
    "expert-memory": lambda p: p["layers"] * p["experts"] // p["ep"] * 3 * p["hidden"] * p["ffn"] * 2,
    "a2a-bytes": lambda p: 2 * p["tokens"] * p["top_k"] * (p["ep"] - 1) / p["ep"] * p["hidden"] * 2,
    "hot-expert": lambda p: p["hot"] * p["experts"] / 100,
}

EXPECTED_CHOICE = {
    ("lesson6", "update-lost"): lambda p: 0 if f6.round_to_format(f6.round_to_format(p["weight"], p["fmt"]) + p["update"],
                                                                  p["fmt"]) == p["weight"] else 1,
    ("lesson6", "underflow"): lambda p: 0 if p["value"] < f6.smallest_subnormal("fp16") / 2 else 1,
}


def _all_questions(lesson_id):
    for lang in ("en", "es"):
        for seed in SEEDS:
            for kind in quiz.generators(lesson_id):
                yield quiz.make_question(lesson_id, kind, seed, lang)


@pytest.mark.parametrize("lesson", [l.id for l in all_lessons()])
def test_generators_answer_with_the_formulas(lesson):
    kinds = quiz.generators(lesson)
    numeric = [k for k in kinds if not quiz.make_question(lesson, k, 0).is_choice]
    choice_kinds = [k for k in kinds if quiz.make_question(lesson, k, 0).is_choice]
    assert len(kinds) >= 8 and len(numeric) >= 5 and len(choice_kinds) >= 2
    assert set(numeric) == set(EXPECTED[lesson]), "every numeric kind has an independent expectation"
    for q in _all_questions(lesson):
        if q.is_choice:
            assert len(q.choices) == len(set(q.choices)) >= 2 and 0 <= q.answer < len(q.choices)
            if (lesson, q.kind) in EXPECTED_CHOICE:
                assert q.answer == EXPECTED_CHOICE[(lesson, q.kind)](q.params), (q.kind, q.params)
        else:
            expected = EXPECTED[lesson][q.kind](q.params)
            assert q.answer == pytest.approx(expected, rel=1e-9), (q.kind, q.params)
            assert q.tolerance <= 0.02
        assert q.prompt and q.explanation and q.lesson_id == lesson
        # The explanation works the numbers: it states the right answer as the question formats it
        # (or, for multiple choice, at least one number or formula symbol).
        if not q.is_choice and not q.integer:
            assert any(ch.isdigit() for ch in q.explanation)
        # The formatted right answer is accepted; a value 10% off is not.
        right = str(q.answer + 1) if q.is_choice else q.answer_text()
        assert quiz.check_answer(q, right).correct, (q.kind, right)
        if not q.is_choice and q.answer != 0:
            off = q.answer * 1.1 if not q.integer else q.answer + 1
            assert not quiz.check_answer(q, repr(float(off))).correct



def test_the_balancing_loss_question_never_draws_the_uniform_router():
    """A hot expert at 1/E is the uniform router: the answer would be α, read off the question."""
    for seed in SEEDS:
        q = quiz.make_question("experts", "aux-loss", seed)
        assert q.params["hot"] > 1 / q.params["experts"] and q.answer > q.params["alpha"] * 1.05, q.params


def test_no_decode_question_runs_a_model_its_gpu_cannot_hold():
    """An audit found "Llama-2-70B on one A100 80GB, batch 32": 138 GB of weights, and 43 GB of KV cache, on
    80 GB. Every draw of the decode questions now fits what the serving planner lets a GPU use (90%: Llama-2-70B
    fits none of the three, not even an H200's 141 GB), and they still draw every other model on every GPU."""
    from distai.lessons.lesson7 import quiz as q7
    from distai.lessons.lesson7.planner import Hardware

    for kind in ("decode-bound", "decode-time"):
        space = list(q7.GENERATORS[kind].kind.space())
        for p in space:
            kv = p["batch"] * p["kv_bytes_per_seq"] if kind == "decode-time" else 0.0
            assert 2 * p["params"] + kv <= p["gpu_memory"] * Hardware.memory_util, (kind, p)
        assert {(p["name"], p["gpu"]) for p in space} == {(m[0], g[0]) for m in q7.MODELS for g in q7.GPUS
                                                          if m[0] != "Llama-2-70B"}, kind


def test_languages_differ_but_answers_agree():
    for lesson in all_lessons():
        for kind in quiz.generators(lesson.id):
            en = quiz.make_question(lesson.id, kind, 7, "en")
            es = quiz.make_question(lesson.id, kind, 7, "es")
            assert en.answer == es.answer and en.params == es.params
            if not en.is_choice:
                assert en.prompt != es.prompt


def test_quiz_is_reproducible_and_covers_kinds():
    a = quiz.build_quiz("2", 20, seed=11, lang="en")
    b = quiz.build_quiz("lesson2", 20, seed=11, lang="en")
    assert [(q.kind, q.prompt, q.answer) for q in a] == [(q.kind, q.prompt, q.answer) for q in b]
    c = quiz.build_quiz("2", 20, seed=12, lang="en")
    assert [(q.kind, q.prompt) for q in a] != [(q.kind, q.prompt) for q in c]
    kinds = list(quiz.generators("lesson2"))
    first = [q.kind for q in a[:len(kinds)]]
    assert sorted(first) == sorted(kinds)  # every kind once before any repeats


def test_worked_examples_are_accepted_in_quiz_form():
    # The ZeRO paper's 7.5B / 64 GPUs in quiz form: "16.6 GB", "1.66e10", "16,6 GB" (Spanish), "16.6" (asked in GB).
    q = quiz.numeric("lesson2", "zero-total", "es", "?", "?",
                     f2.model_state_bytes(7.5e9, 64, "zero2")["total_bytes"], "bytes", "GB")
    for text in ("16.6 GB", "1.66e10", "16,6 GB", "16,6", "16.6", "15.5 GiB", "16640625000"):
        assert quiz.check_answer(q, text).correct, text
    for text in ("16.6 GiB", "166 GB", "1.66e9", "31.4 GB"):
        assert not quiz.check_answer(q, text).correct, text
    pct = quiz.numeric("lesson5", "bubble-fraction", "en", "?", "?", 3 / 11, "fraction", "%")
    for text in ("27.3%", "27.3", "0.273", "27,3 %"):
        assert quiz.check_answer(pct, text).correct, text


def test_generators_match_distai_calc_json(capsys):
    """The quiz and the CLI calculator give the same numbers for the same inputs."""
    from distai.tutor.cli import main

    def calc(*argv):
        assert main(["calc", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    for seed in range(6):
        q = quiz.make_question("lesson2", "zero-total", seed)
        p = q.params
        r = calc("memory", "--params", repr(p["params"]), "--dp", str(p["dp"]), "--strategy", p["strategy"])
        assert r["total_bytes"] == q.answer
        q = quiz.make_question("lesson5", "interleaved", seed)
        p = q.params
        r = calc("bubble", "-p", str(p["p"]), "-m", str(p["m"]), "--schedule", "interleaved", "--chunks", str(p["v"]))
        assert r["bubble_fraction"] == pytest.approx(q.answer, rel=1e-12)
        q = quiz.make_question("lesson1", "ring-time", seed)
        p = q.params
        r = calc("allreduce", "--bytes", repr(p["size_bytes"]), "--ranks", str(p["n"]), "--alpha", repr(p["alpha"]),
                 "--beta", repr(p["beta"]))
        assert r["time_s"] == pytest.approx(q.answer, rel=1e-12)
        q = quiz.make_question("lesson3", "daly", seed)
        p = q.params
        r = calc("checkpoint", "--mtbf", repr(p["mtbf"]), "--cost", repr(p["cost"]))
        assert r["daly_interval_s"] == pytest.approx(q.answer, rel=1e-12)
        q = quiz.make_question("lesson7", "kv-per-gpu", seed)
        p = q.params
        r = calc("kvcache", "--layers", str(p["layers"]), "--kv-heads", str(p["kv_heads"]), "--head-dim",
                 str(p["head_dim"]), "--tokens", str(p["tokens"]), "--tp", str(p["tp"]), "--pp", str(p["pp"]))
        assert r["per_gpu_bytes"] == q.answer


def test_an_answer_in_a_foreign_unit_is_told_the_units_it_takes():
    """Issue 27.3: '12 GB' for a count is a unit problem, not an unreadable number."""
    for lesson in all_lessons():
        for kind in quiz.generators(lesson.id):
            for lang in ("en", "es"):
                q = quiz.make_question(lesson.id, kind, 0, lang)
                if q.is_choice:
                    continue
                foreign = "12 furlongs"
                message = quiz.check_answer(q, foreign).message
                assert "'furlongs'" in message, (lesson.id, kind, lang, message)
                if q.quantity in ("bytes", "seconds", "bandwidth"):
                    shown = quiz.format_value(q.answer, q.quantity, q.unit, lang).split()[-1]
                    assert shown in message, (kind, lang, message)  # the unit of the right answer is offered
    count = quiz.numeric("lesson2", "x", "en", "p", "e", 12e9, "count", unit="B")
    message = quiz.check_answer(count, "12 GB").message
    assert "'GB'" in message and "B" in message.split(":")[1] and "could not read" not in message
    es = quiz.numeric("lesson2", "x", "es", "p", "e", 12e9, "count", unit="B")
    assert "mil millones" in quiz.check_answer(es, "12 GB").message
    plain = quiz.numeric("lesson2", "x", "en", "p", "e", 12.0, "number")
    assert "plain number" in quiz.check_answer(plain, "12 GB").message


def test_an_explained_sum_adds_up_as_shown():
    """Issue 27.3: '140 GB + 17.5 GB + 105 GB = 262 GB' showed a total rounded apart from its terms."""
    from distai.lessons import units

    sums = 0
    for seed in SEEDS:
        for lang in ("en", "es"):
            text = quiz.make_question("lesson2", "zero-total", seed, lang).explanation
            body = text.split(": ", 1)[1].split(";")[0]
            terms_text, total_text = body.split(" = ")
            terms = [units.parse_bytes(part.split(" (")[0], lang) for part in terms_text.split(" + ")]
            total = units.parse_bytes(total_text, lang)
            decimals = max(len(t.split()[0].replace(",", ".").partition(".")[2])
                           for t in terms_text.split(" + ") + [total_text])
            unit = units.parse_bytes("1 " + total_text.split()[-1], lang)
            assert abs(sum(terms) - total) <= 0.5 * len(terms) * 10 ** -decimals * unit, (seed, lang, text)
            sums += 1
    assert sums == 2 * len(SEEDS)
    # lesson 1's ring time: "40 µs + 10.2 ms = 10.3 ms" (the terms shown add up to 10.24)
    for seed in SEEDS:
        for lang in ("en", "es"):
            text = quiz.make_question("lesson1", "ring-time", seed, lang).explanation.rstrip(".")
            *_, latency, total = text.split(" = ")
            terms = [units.parse_time(t, lang) for t in latency.split(" + ")]
            shown = latency.split(" + ") + [total]
            decimals = max(len(t.split()[0].replace(",", ".").partition(".")[2]) for t in shown)
            unit = units.parse_time("1 " + total.split()[-1], lang)
            assert abs(sum(terms) - units.parse_time(total, lang)) <= 0.5 * 2 * 10 ** -decimals * unit, (seed, lang, text)


def test_capstone_mesh_groups_are_the_brute_force_over_the_quiz_meshes():
    """The quiz's five-axis questions ask the engine's Layout (its groups are the real DeviceMesh's,
    tests/test_capstone_mesh5d.py): over every mesh they draw, each rank's every group is the brute force's."""
    from distai.lessons.capstone.quiz import GENERATORS, GROUP_DIMS, _layout

    meshes = {tuple(p[k] for k in ("pp", "dp", "cp", "tp", "ep")) for p in GENERATORS["group-count"].kind.space()}
    assert len(meshes) >= 20
    for pp, dp, cp, tp, ep in meshes:
        p = {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": ep}
        layout = _layout(pp, dp, cp, tp, ep)
        for rank in range(layout.world):
            for dim in GROUP_DIMS:
                assert layout.group(rank, dim) == mesh5_group(p, rank, dim), (p, rank, dim)


def test_capstone_group_members_offer_the_rank_s_groups_and_mark_the_asked_one():
    from distai.lessons.capstone.quiz import GROUP_DIMS

    for lang in ("en", "es"):
        for seed in range(60):
            q = quiz.make_question("capstone", "group-members", seed, lang)
            p = q.params
            groups = {d: ", ".join(map(str, mesh5_group(p, p["rank"], d))) for d in GROUP_DIMS}
            assert q.choices[q.answer] == groups[p["dim"]], (p, q.choices)
            others = set(q.choices) - {groups[p["dim"]]}
            assert len(others) == 3 and others <= set(groups.values())  # real groups of the rank, none right


def test_capstone_grow_axis_picks_what_cuts_the_binding_memory_most():
    """Model states: the closed form (2 + 4 bytes per parameter, 12 of Adam sharded by ZeRO-1 over the
    ranks holding the same weights) for each change; activations: the planner's own terms for each change
    (CP shards a sequence; more DP or ZeRO leave activations alone; 1F1B makes doubling PP a wash)."""
    from distai.lessons.capstone.formulas import stage_layers
    from distai.lessons.capstone.planner import Config, memory_terms
    from distai.lessons.capstone.quiz import GPU, GROWTHS, MOE_MODELS

    seen = set()
    for seed in range(80):
        q = quiz.make_question("capstone", "grow-axis", seed)
        p = dict(q.params)
        after = []
        for change in GROWTHS:
            g = {**p, "zero": 0}
            g[change] = 1 if change == "zero" else 2 * p[change]
            if p["binds"] == "model_states_bytes":
                after.append(_states(g))
            else:
                spec = MOE_MODELS[p["model"]]
                c = Config(g["tp"], g["pp"], g["dp"], 1, g["zero"], "none", 1, True, g["cp"], g["ep"])
                after.append(memory_terms(spec, GPU, c, stage_layers(spec.layers, g["pp"]), p["m"], "adam")[p["binds"]])
        assert q.answer == after.index(min(after)), (p, after)
        seen.add((p["binds"], GROWTHS[q.answer]))
    assert ("activations_bytes", "cp") in seen and ("model_states_bytes", "pp") in seen
    assert ("model_states_bytes", "zero") in seen  # ZeRO-1 wins when the dp·cp group is large enough


def test_answers_written_as_a_learner_writes_them_are_read():
    """A review found these refused: units spelled out or capitalised, a unit in bits, the question's own
    words after a count, "times" after a ratio, a lettered option in brackets, an option's text with its
    full stop."""
    def ok(q, text):
        return quiz.check_answer(q, text).correct

    t = quiz.numeric("lesson1", "x", "en", "p", "e", 0.0205, "seconds", unit="ms")
    assert all(ok(t, a) for a in ("20.5 ms", "20.5 msec", "20.5 milliseconds", "0.0205 s"))
    assert ok(quiz.numeric("lesson1", "x", "es", "p", "e", 0.0205, "seconds", unit="ms"), "20,5 milisegundos")
    b = quiz.numeric("lesson1", "x", "en", "p", "e", 750e6, "bytes", unit="MB")
    assert ok(b, "750 megabytes") and ok(b, "0.75 GB") and not ok(b, "750 kilobytes")
    bw = quiz.numeric("lesson1", "x", "en", "p", "e", 76.8e9, "bandwidth", unit="GB/s")
    assert ok(bw, "614.4 Gbit/s") and ok(bw, "76.8 GB/S") and ok(bw, "614.4 Gbps") and not ok(bw, "76.8 Gb/s")
    assert ok(bw, "76.8 GBytes/s") and ok(bw, "614.4 GBits/s") and not ok(bw, "76.8 GBits/s")
    steps = quiz.numeric("lesson1", "x", "en", "A ring on 8 GPUs: how many message steps does it take?", "e", 20,
                         "count")
    assert ok(steps, "20 message steps") and ok(steps, "20 steps") and not quiz.check_answer(steps, "20 furlongs").correct
    assert not ok(steps, "20 GPUs") and not ok(steps, "20 rank steps")  # words of the prompt, not what it counts
    pasos = quiz.numeric("lesson1", "x", "es", "Un anillo en 8 GPUs: ¿cuántos pasos de mensajes da?", "e", 20, "count")
    assert ok(pasos, "20 pasos de mensajes") and ok(pasos, "20 pasos") and not ok(pasos, "20 GPUs")
    ratio = quiz.numeric("lesson1", "x", "en", "p", "e", 15.6, "number")
    assert ok(ratio, "15.6 times") and ok(ratio, "15.6x") and ok(ratio, "15,6 veces")
    pick = quiz.choice("lesson1", "x", "en", __import__("random").Random(0), "p", "Right one.", ["Wrong one.", "Other."], "e")
    letter = "abc"[pick.answer]
    assert all(ok(pick, a) for a in (letter, f"({letter})", f"{letter})", str(pick.answer + 1), "Right one", "right one."))
