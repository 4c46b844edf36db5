"""`distai run experts` refuses before launching what every rank would refuse: one line, exit 2."""
from __future__ import annotations

import pytest

from distai.engine.mesh_args import experts_launch_ranks
from distai.lessons.registry import resolve_lesson


@pytest.mark.parametrize("argv, ranks, message", [
    (["--experts", "3", "--ep", "2"], 2, "does not divide the 3 experts"),
    (["--top-k", "9"], 4, "--top-k 9 must be between 1 and the number of experts (8)"),
    (["--ep", "3"], 4, "--ep 3 does not divide the 4 ranks"),
    (["--capacity-factor", "0"], 4, "--capacity-factor must be a finite positive number"),
    (["--experts", "0"], 4, "--experts must be at least 1, got 0"),
])
def test_bad_moe_options_are_refused_before_launch(argv, ranks, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        experts_launch_ranks(argv, ranks, 4, False)


def test_good_options_keep_the_ranks_and_the_lesson_declares_the_plan():
    assert experts_launch_ranks(["--ep", "2", "--experts", "4", "--top-k", "1"], None, 4, False) == 4
    assert resolve_lesson("experts").launch_plan_function() is experts_launch_ranks
