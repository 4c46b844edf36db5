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
