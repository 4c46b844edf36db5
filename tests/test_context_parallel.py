"""Lesson 9: ring attention and its all-gather variant equal one process's attention, exactly.

One forked gloo group of 8 ranks runs every check (``check_all``), cut into context-parallel groups
of 2, 4 and 8: for each size, layout (zigzag, contiguous), variant (ring, all-gather) and dtype
(float64, float32), the attention output and the gradients of q, k and v equal PyTorch's
``scaled_dot_product_attention`` of the whole sequence on one process; the messages and bytes of
every step equal the formula; the work of every ring step equals the schedule's tiles.
"""
from __future__ import annotations

import pytest

from distai.engine.testing import run_in_group
from distai.lessons.lesson9 import formulas as F
from distai.lessons.lesson9 import ring_schedule as plan

WORLD = 8
CP_SIZES = (2, 4, 8)
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}  # relative to the reference's largest entry
SHAPE = dict(batch=2, heads=4, kv_heads=2, seq=64, head_dim=8)  # seq: a multiple of 2·8


def _subgroup(cp: int):
    """This rank's group of ``cp`` consecutive ranks (every rank creates every group)."""
    import torch.distributed as dist

    mine = None
    for first in range(0, WORLD, cp):
        group = dist.new_group(list(range(first, first + cp)))
        if first <= dist.get_rank() < first + cp:
            mine = group
    return mine


def _core_check(cp_group, layout: str, variant: str, dtype_name: str) -> dict:
    import torch

    from distai.engine import context_parallel as C
    from distai.engine.metering import CommMeter

    dtype = getattr(torch, dtype_name)
    b, H, G, s, d = (SHAPE[k] for k in ("batch", "heads", "kv_heads", "seq", "head_dim"))
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(b, heads, s, d, generator=gen, dtype=dtype, requires_grad=True) for heads in (H, G, G))
    dout = torch.randn(b, H, s, d, generator=gen, dtype=dtype)
    reference = C.attention_reference(q, k, v)
    reference.backward(dout)

    cp = C.CPGroup(cp_group, layout, variant)
    cp.trace = []
    pos = cp.positions(s)
    mine = [t.detach()[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
    with CommMeter() as meter:
        out = C.ring_attention(*mine, cp)
        out.backward(dout[:, :, pos])

    def rel(a, ref):
        return float((a - ref).abs().max() / ref.abs().max())

    sent = {ph: sum(r.sent_bytes for r in meter.records if r.phase == ph and r.op != "recv") for ph in ("fwd", "bwd")}
    messages = {ph: sum(1 for r in meter.records if r.phase == ph and r.op != "recv") for ph in ("fwd", "bwd")}
    return {"out": rel(out, reference[:, :, pos]), "dq": rel(mine[0].grad, q.grad[:, :, pos]),
            "dk": rel(mine[1].grad, k.grad[:, :, pos]), "dv": rel(mine[2].grad, v.grad[:, :, pos]),
            "sent": sent, "messages": messages, "elem": out.element_size(), "rank": cp.rank,
            "work": [(t["phase"], t["step"], t["scores"]) for t in cp.trace]}


def _torch_context_parallel() -> dict:
    """PyTorch's own ``context_parallel`` on the whole group, or why it does not run here."""
    import torch
    import torch.nn.functional as F_
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    from distai.engine import context_parallel as C

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 32, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    reference = C.attention_reference(q, k, v)
    mesh = init_device_mesh("cpu", (WORLD,))
    buffers = [t.clone() for t in (q, k, v)]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2], no_restore_buffers=set(buffers)):
            out = F_.scaled_dot_product_attention(*buffers, is_causal=True)
    except (NotImplementedError, RuntimeError) as exc:
        return {"ran": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    cp = C.CPGroup(None, "contiguous", "ring")
    return {"ran": True, "diff": float((out - reference[:, :, cp.positions(32)]).abs().max())}


def check_all(rank: int, world_size: int) -> dict:
    out: dict = {}
    for cp in CP_SIZES:
        group = _subgroup(cp)
        for layout in plan.LAYOUTS:
            for variant in plan.VARIANTS:
                for dtype in TOLERANCE:
                    out[(cp, layout, variant, dtype)] = _core_check(group, layout, variant, dtype)
    out["torch"] = _torch_context_parallel()
    return out


@pytest.fixture(scope="module")
def results():
    return run_in_group(check_all, WORLD, timeout_s=300)


CASES = [(cp, layout, variant, dtype) for cp in CP_SIZES for layout in plan.LAYOUTS for variant in plan.VARIANTS
         for dtype in TOLERANCE]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_output_and_gradients_equal_one_process(results, case):
    tol = TOLERANCE[case[3]]
    for r in results:
        got = r[case]
        assert max(got["out"], got["dq"], got["dk"], got["dv"]) <= tol, got


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_messages_and_bytes_equal_the_formula(results, case):
    cp, _, variant, _ = case
    for r in results:
        got = r[case]
        want = F.cp_comm_per_layer(SHAPE["seq"], SHAPE["batch"], SHAPE["kv_heads"], SHAPE["head_dim"], cp, variant,
                                   got["elem"])
        assert got["messages"] == {"fwd": want["forward_messages"], "bwd": want["backward_messages"]}
        assert got["sent"] == {"fwd": want["forward_bytes_per_rank"], "bwd": want["backward_bytes_per_rank"]}


@pytest.mark.parametrize("layout", plan.LAYOUTS)
@pytest.mark.parametrize("cp", CP_SIZES)
def test_every_step_computes_the_schedules_causal_scores(results, cp, layout):
    """The scores the engine's masks let through, step by step, are the schedule's; each tile of
    a rank's queries against one K/V chunk is computed for every query row and head."""
    for r in results:
        for variant in plan.VARIANTS:
            got = r[(cp, layout, variant, "float64")]
            want = plan.work_per_step(SHAPE["seq"], cp, layout)[got["rank"]]
            assert [w for ph, _, w in got["work"] if ph == "fwd"] == want
            assert [w for ph, _, w in got["work"] if ph == "bwd"] == want


def test_zigzag_balances_what_contiguous_leaves_idle():
    for cp in CP_SIZES:
        assert plan.idle_fraction(SHAPE["seq"], cp, "zigzag") == 0.0
        assert plan.idle_fraction(SHAPE["seq"], cp, "contiguous") > 0.3
    assert F.idle_fraction(8, "contiguous") == pytest.approx(7 / 15, abs=1e-3)  # (cp−1)/(2cp−1), long sequences


def test_torch_context_parallel_agrees_where_it_runs(results):
    got = results[0]["torch"]
    if not got["ran"]:
        pytest.skip(f"torch.distributed.tensor.experimental.context_parallel does not run on CPU/gloo in this "
                    f"torch: {got['why']}")
    for r in results:
        assert r["torch"]["diff"] <= 1e-12
