"""The one ModelSize: built from a preset, from a lesson's defaults and from the size flags, and the
engine's GPT built from it has exactly the parameters it counts."""
from __future__ import annotations

import argparse
import importlib

import pytest

from distai.lessons.model_size import PRESETS, SIZE_FLAGS, ModelConfigError, ModelSize, add_model_options

EXPERIMENTS = ("lesson1", "lesson2", "lesson3", "lesson4", "lesson6", "lesson7", "experts")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_builds_the_gpt_it_counts(name):
    torch = pytest.importorskip("torch")
    from distai.engine.model import GPT, GPTConfig

    cfg = GPTConfig.preset(name, seq=32)
    assert GPTConfig is ModelSize and cfg.seq == 32
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    assert model(torch.zeros(2, 8, dtype=torch.long)).shape == (8, 2, cfg.vocab)


def test_llama_preset_is_the_llama_shape_and_gpt2_the_default():
    llama = ModelSize.preset("llama-tiny")
    assert (llama.norm, llama.mlp, llama.bias, llama.tie_embeddings) == ("rms", "swiglu", False, False)
    assert llama.group_heads < llama.heads and llama.rope_theta and llama.ffn_size == 3 * llama.hidden
    assert ModelSize.preset("gpt2-tiny") == ModelSize() and ModelSize().gpt2_shape
    with pytest.raises(ModelConfigError, match="unknown model 'gpt5'; choose one of gpt2-tiny, llama-tiny"):
        ModelSize.preset("gpt5")


def test_flags_override_the_defaults_and_none_keeps_them():
    defaults = ModelSize.preset("llama-tiny", kv_heads=4)
    ap = argparse.ArgumentParser()
    add_model_options(ap, defaults, ("hidden", "heads", "kv_heads", "norm"))
    assert ModelSize.from_args(ap.parse_args([]), defaults) == defaults
    got = ModelSize.from_args(ap.parse_args(["--kv-heads", "2", "--norm", "layer", "--hidden", "96"]), defaults)
    assert (got.kv_heads, got.norm, got.hidden, got.vocab) == (2, "layer", 96, defaults.vocab)

    ap = argparse.ArgumentParser()
    add_model_options(ap, None)  # the run chooses the defaults after parsing
    args = ap.parse_args(["--seq", "64"])
    assert args.hidden is None
    assert ModelSize.from_args(args, defaults, layers=6) == ModelSize.preset("llama-tiny", kv_heads=4, seq=64,
                                                                              layers=6)


@pytest.mark.parametrize("argv,needle", [
    (["--hidden", "30", "--heads", "4"], "hidden 30 is not divisible by heads 4"),
    (["--heads", "4", "--kv-heads", "3"], "heads 4 is not a multiple of kv_heads 3"),
    (["--layers", "0"], "layers must be a positive whole number, got 0"),
])
def test_a_shape_that_cannot_be_built_is_one_line(argv, needle):
    ap = argparse.ArgumentParser()
    add_model_options(ap, ModelSize(), ("hidden", "heads", "kv_heads", "layers"))
    with pytest.raises(ModelConfigError, match=needle):
        ModelSize.from_args(ap.parse_args(argv), ModelSize())


@pytest.mark.parametrize("lesson", EXPERIMENTS)
def test_every_experiment_builds_its_model_from_the_flags(lesson):
    pytest.importorskip("torch")
    mod = importlib.import_module(f"distai.engine.experiments.{lesson}")
    parse = getattr(mod, "build_parser", None)
    args = parse().parse_args([]) if parse else mod.parse_args([])
    assert ModelSize.from_args(args, mod.DEFAULT_MODEL) == mod.DEFAULT_MODEL
    flags = [name for name in SIZE_FLAGS if hasattr(args, name)]
    assert {"hidden", "heads", "layers", "vocab"} <= set(flags)
    wider = 2 * mod.DEFAULT_MODEL.hidden
    args = (parse().parse_args if parse else mod.parse_args)(["--hidden", str(wider)])
    assert ModelSize.from_args(args, mod.DEFAULT_MODEL).hidden == wider
