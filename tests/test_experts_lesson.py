"""The Mixture-of-Experts lesson's calculator against published model sizes, and its run fold."""
from __future__ import annotations

import json

import pytest

from distai.tutor.cli import main

MIXTRAL = ["--layers", "32", "--hidden", "4096", "--ffn", "14336", "--experts", "8", "--top-k", "2",
           "--vocab", "32000", "--heads", "32", "--kv-heads", "8"]


def test_calc_moe_reproduces_mixtral_8x7b(capsys):
    """Mistral AI's announcement: 46.7B parameters in total, 12.9B used per token."""
    assert main(["calc", "moe", *MIXTRAL, "--ep", "8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert round(r["total_params"] / 1e9, 1) == 46.7
    assert round(r["active_params"] / 1e9, 1) == 12.9
    assert r["experts_per_gpu"] == 1
    # one expert per layer per GPU: 32 SwiGLU experts of 3·4096·14336 parameters in bf16
    assert r["expert_bytes_per_gpu"] == 32 * 3 * 4096 * 14336 * 2


def test_calc_moe_counts_the_capacity_per_ep_group_and_per_rank(capsys):
    """GShard (and distai's run) count C over the EP group's tokens; Megatron-Core's router over each rank's
    own, before the all-to-all. 4096 tokens per GPU, EP 8, c = 1: 8192 of 32,768 against 1024 of 4096."""
    assert main(["calc", "moe", *MIXTRAL, "--ep", "8", "--capacity-factor", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["capacity"], r["capacity_per_rank"]) == (8192, 1024)
    assert r["expected_drop_rate"] == pytest.approx(0.003817, abs=1e-6)
    assert r["expected_drop_rate_per_rank"] == pytest.approx(0.010796, abs=1e-6)
    assert main(["calc", "moe", *MIXTRAL, "--ep", "8", "--capacity-factor", "1", "--lang", "en"]) == 0
    shown = capsys.readouterr().out
    assert "capacity counted per rank (Megatron-Core)  1024" in shown and "counted per rank            1.08%" in shown
    assert main(["calc", "moe", *MIXTRAL, "--lang", "en"]) == 0  # EP 1: one T, one line
    assert "per rank" not in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [(["--top-k", "9"], "--top-k 9 is more than the 8 experts"),
                                            (["--ep", "3"], "distai: error: ep = 3 does not divide the 8 experts\n")])
def test_calc_moe_refuses_impossible_layouts(extra, message, capsys):
    argv = list(MIXTRAL)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(["calc", "moe", *argv]) == 2
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# The quiz: published shapes under their own names, and explanations in words the learner has read

# the announced sizes (Mistral AI, Dec. 2023 and Apr. 2024; Databricks, Mar. 2024): total, active, in B
PUBLISHED = {"Mixtral 8x7B": (46.7, 12.9), "Mixtral 8x22B": (141, 39), "DBRX": (132, 36)}


def _questions(kind: str, lang: str, seeds: int = 60):
    from distai.lessons import quiz

    return [quiz.make_question("experts", kind, seed, lang) for seed in range(seeds)]


def test_the_quiz_names_only_published_models_with_their_own_experts_and_top_k():
    """A shape named after a model has that model's experts and top-k, and the lesson's formula gives
    the announced totals; the prompt says 'output layer not tied to the embedding' in plain words."""
    from distai.lessons.experts import formulas as f
    from distai.lessons.experts import quiz as moe_quiz

    seen = set()
    for name, layers, hidden, ffn, vocab, heads, kv_heads, experts, top_k in moe_quiz.SHAPES:
        p = f.moe_model_params(layers, hidden, ffn, experts, top_k, vocab, heads, kv_heads)
        total, active = PUBLISHED[name]
        assert p["total_params"] / 1e9 == pytest.approx(total, rel=0.01), name
        assert p["active_params"] / 1e9 == pytest.approx(active, rel=0.02), name
    for kind, key in (("total-params", "total_params"), ("active-params", "active_params")):
        for lang in ("en", "es"):
            for q in _questions(kind, lang):
                shape = next(s for s in moe_quiz.SHAPES if s[0] == q.params["name"])
                assert (q.params["experts"], q.params["top_k"]) == shape[-2:]
                assert q.answer == f.moe_model_params(*shape[1:4], shape[7], shape[8], *shape[4:7])[key]
                assert f"{shape[7]} " in q.prompt and f"top-{shape[8]}" in q.prompt
                assert "-like" not in q.prompt and "untied" not in q.prompt and "sin atar" not in q.prompt
                seen.add(q.params["name"])
                if lang == "es":
                    assert "capa de salida no compartida con el embedding" in q.prompt
                    assert "la capa de salida" in q.explanation
    assert seen == set(PUBLISHED)


def test_the_balancing_loss_explanation_shows_every_number_it_uses():
    """No undefined 'hot' or 'cal': the favoured expert's f = P and the others' share are numbers."""
    from distai.lessons.experts import formulas as f
    from distai.lessons.units import format_number

    for lang in ("en", "es"):
        for q in _questions("aux-loss", lang, 20):
            hot, experts = q.params["hot"], q.params["experts"]
            rest = (1 - hot) / (experts - 1)
            assert not any(w in q.explanation for w in ("hot", "cal)", "f_cal", "f_hot"))
            assert format_number(rest, 3, lang) in q.explanation and format_number(hot, 3, lang) in q.explanation
            shares = [hot] + [rest] * (experts - 1)
            assert q.answer == pytest.approx(f.switch_aux_loss(shares, shares, q.params["alpha"]))


def test_the_quiz_and_the_lesson_count_the_same_all_to_alls():
    """The lesson counts 3 all-to-alls forward (the counts, dispatch, combine) and 2 backward; the
    quiz's 'two forward and two backward' are the token ones, dispatch and combine, as it says."""
    from distai.lessons.experts import formulas as f
    from distai.lessons.registry import resolve_lesson

    calls = f.all_to_all_calls_per_layer(dropless=True)
    token_fwd = calls["fwd"] - 1  # less the exchange of counts
    assert token_fwd == calls["bwd"] == 2
    lesson = resolve_lesson("experts")
    words = {"en": ("two all-to-alls forward and two backward", "out and back", "counts"),
             "es": ("dos all-to-all en el forward y dos en el backward", "envía sus tokens y los recoge",
                    "recuentos")}
    for lang, (count, tokens, counts) in words.items():
        q = _questions("where-ep", lang, 1)[0]
        right = q.choices[int(q.answer)]
        assert count in right and tokens in right and counts in q.explanation
        text = lesson.step_text("all-to-all", lang)
        assert f"{calls['fwd']} all-to-all" in text and f"{calls['bwd']}" in text and counts in text


def test_the_expected_drop_rate_is_that_of_k_different_experts_per_token():
    """Every routing of 3 tokens, each to 2 of 3 experts (a top-2 router picks two different ones),
    enumerated: the formula's drop rate is their mean. It counted Binomial(T·k, 1/E), which lets a token
    pick one expert twice (quiz 8 expected 9.28% for a case whose answer is 8.59%)."""
    import itertools

    from distai.lessons.experts import formulas as f

    tokens, experts, top_k = 3, 3, 2
    pairs = list(itertools.combinations(range(experts), top_k))
    for factor in (0.5, 0.75, 1.0):
        cap = f.capacity(tokens, experts, top_k, factor)
        dropped = 0
        for routing in itertools.product(pairs, repeat=tokens):
            loads = [sum(e in choice for choice in routing) for e in range(experts)]
            dropped += sum(max(0, load - cap) for load in loads)
        exact = dropped / (len(pairs) ** tokens * tokens * top_k)
        assert f.expected_drop_rate(tokens, experts, top_k, factor) == pytest.approx(exact, rel=1e-12), factor
    assert f.expected_drop_rate(64, 8, 2, 1.0) == pytest.approx(0.0859, abs=5e-5)
