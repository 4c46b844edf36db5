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
from distai.lessons.checks import EQUAL_TO_ONE_PROCESS
from distai.lessons.context import formulas as F
from distai.lessons.context import ring_schedule as plan

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

WORLD = 8
CP_SIZES = (1, 2, 4, 8)
TOLERANCE = EQUAL_TO_ONE_PROCESS  # relative to the reference's largest entry
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
            "work": [(t["phase"], t["step"], t["scores"]) for t in cp.trace],
            "steps": [(t["phase"], t["step"], t["messages"], t["sent_bytes"]) for t in cp.trace]}


def _torch_context_parallel() -> dict:
    """PyTorch's own context parallelism against ours, on the whole group and the same shards, in both layouts:
    the ring kernel its public ``context_parallel`` runs, ``_templated_ring_attention``, called with the CPU's
    flash-attention op (the public API needs CUDA's kernels: on CPU it has no sharding strategy for that op),
    its load balancer off for the contiguous layout and on for the zigzag one (its head-tail chunks are
    zigzag's). None if this torch lacks that kernel (it is private), with why."""
    import torch
    import torch.distributed as dist

    from distai.engine import context_parallel as C

    try:
        from torch.distributed.tensor.experimental._attention import _cp_options, _templated_ring_attention
    except ImportError as exc:
        return {"ran": False, "why": f"ImportError: {exc}"}
    import inspect

    taken = list(inspect.signature(_templated_ring_attention).parameters)[:2]
    if taken != ["group", "seq_dim"]:  # a private kernel: its arguments moved between releases (a mesh before)
        return {"ran": False, "why": f"its arguments start {taken}, not (group, seq_dim)"}
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 32, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    reference = C.attention_reference(q, k, v)
    saved = (_cp_options.enable_load_balance, _cp_options.convert_to_f32)
    out = {"ran": True}
    try:
        for layout in ("contiguous", "zigzag"):
            cp = C.CPGroup(None, layout, "ring")
            pos = cp.positions(32)
            mine = [t[:, :, pos] for t in (q, k, v)]
            _cp_options.enable_load_balance, _cp_options.convert_to_f32 = layout == "zigzag", False
            theirs = _templated_ring_attention(dist.group.WORLD, 2,
                                               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
                                               *mine, is_causal=True)[0]
            ours = C.ring_attention(*mine, cp)
            out[layout] = {"torch_vs_one_process": float((theirs - reference[:, :, pos]).abs().max()),
                           "ours_vs_torch": float((ours - theirs).abs().max())}
    finally:
        _cp_options.enable_load_balance, _cp_options.convert_to_f32 = saved
    return out


MODEL = dict(vocab=64, hidden=32, heads=4, kv_heads=2, layers=2, seq=32, rope_theta=10000.0)


def _model_check(cp_group, layout: str, variant: str, dtype_name: str) -> dict:
    """The course's GPT with ring attention in every block, on this rank's tokens (with their
    positions, for the rotary embeddings): the loss and every parameter's gradient, averaged over
    the CP group, against the same model on one process."""
    import torch

    from distai.engine import context_parallel as C
    from distai.engine.model import GPT, GPTConfig, make_batch

    cfg, dtype = GPTConfig(**MODEL), getattr(torch, dtype_name)
    reference = GPT(cfg, seed=5, dtype=dtype)
    cp = C.CPGroup(cp_group, layout, variant)
    model = C.apply_cp(GPT(cfg, seed=5, dtype=dtype), cp)
    ids, targets = make_batch(cfg, 2, seed=9)
    full = reference(ids, targets)
    full.backward()
    local = model(C.shard_sequence(ids, cp), C.shard_sequence(targets, cp), positions=cp.positions(cfg.seq))
    local.backward()
    C.sync_cp_grads(model, cp_group)
    loss = C.cp_loss(local, cp_group)
    grads = {name: float((p.grad - q.grad).abs().max() / q.grad.abs().max())
             for (name, p), q in zip(model.named_parameters(), reference.parameters())}
    return {"loss": abs(float(loss) / float(full) - 1), "grads": grads,
            "params": len([p for p in reference.parameters() if p.grad is not None])}


def _experiment(rank: int) -> dict:
    """The experiment's own entry point, last (it ends the process group): cp 4 × dp 2 on 8 ranks."""
    import os
    import tempfile
    from pathlib import Path

    from distai.engine.events import read_events
    from distai.engine.experiments import context as E

    events_dir = tempfile.mkdtemp()
    os.environ["DISTAI_EVENTS_DIR"] = events_dir
    rc = E.main(["--cp", "4", "--seq", "64", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--layers", "2",
                 "--vocab", "64", "--steps", "2", "--layout", "contiguous"])
    return {"rc": rc, "events": list(read_events(Path(events_dir) / f"rank{rank}.jsonl"))}


def check_all(rank: int, world_size: int) -> dict:
    out: dict = {}
    for cp in CP_SIZES:
        group = _subgroup(cp)
        for layout in plan.LAYOUTS:
            for variant in plan.VARIANTS:
                for dtype in TOLERANCE:
                    out[(cp, layout, variant, dtype)] = _core_check(group, layout, variant, dtype)
                    out[("model", cp, layout, variant, dtype)] = _model_check(group, layout, variant, dtype)
    out["torch"] = _torch_context_parallel()
    out["experiment"] = _experiment(rank)
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
def test_the_models_loss_and_every_gradient_equal_one_process(results, case):
    tol = TOLERANCE[case[3]]
    for r in results:
        got = r[("model", *case)]
        assert got["loss"] <= tol
        assert len(got["grads"]) == got["params"] >= 30  # every parameter: embedding, 2 blocks, final norm
        assert max(got["grads"].values()) <= tol, got["grads"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_messages_and_bytes_equal_the_formula(results, case):
    cp, _, variant, _ = case
    for r in results:
        got = r[case]
        want = F.cp_comm_per_layer(SHAPE["seq"], SHAPE["batch"], SHAPE["kv_heads"], SHAPE["head_dim"], cp, variant,
                                   got["elem"])
        assert got["messages"] == {"fwd": want["forward_messages"], "bwd": want["backward_messages"]}
        assert got["sent"] == {"fwd": want["forward_bytes_per_rank"], "bwd": want["backward_bytes_per_rank"]}
        for phase, step, messages, sent in got["steps"]:  # step by step, as the engine reports them
            expected = F.cp_step_traffic(cp, step, phase, variant, want["block_bytes"])
            assert (messages, sent) == (expected["messages"], expected["bytes"])


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
    for cp in CP_SIZES[1:]:
        assert plan.idle_fraction(SHAPE["seq"], cp, "zigzag") == 0.0
        assert plan.idle_fraction(SHAPE["seq"], cp, "contiguous") > 0.3
    assert F.idle_fraction(8, "contiguous") == pytest.approx(7 / 15, abs=1e-3)  # (cp−1)/(2cp−1), long sequences


def test_experiment_streams_every_ring_step_and_checks_itself(results):
    for rank, r in enumerate(results):
        got = r["experiment"]
        assert got["rc"] == 0
        ring = [e for e in got["events"] if e["kind"] == "cp_step"]
        if rank < 4:  # replica 0's ranks stream their steps: 2 training steps × 2 layers × fwd+bwd × 4 steps
            assert len(ring) == 2 * 2 * 2 * 4 and all(e["match"] for e in ring)
        else:
            assert not ring
    events = results[0]["experiment"]["events"]
    summary = next(e for e in events if e["kind"] == "summary")
    assert summary["cp"] == 4 and summary["dp"] == 2 and summary["train_ok"] and summary["comm_match"]
    from run_checks import assert_summary_rerenders

    assert_summary_rerenders(events, "context")  # runs show, in Spanish
    assert summary["max_grad_rel_diff"] <= 1e-12
    for m in summary["memory"]:  # measured against the count of what the GPT saves: within 10% (here exact)
        assert abs(m["measured_bytes"] / m["formula_bytes"] - 1) <= 0.10
        assert abs(m["one_process_bytes"] / m["one_process_formula_bytes"] - 1) <= 0.10
    seqs = [m["seq"] for m in summary["memory"]]
    measured = [m["measured_bytes"] for m in summary["memory"]]
    one = [m["one_process_bytes"] for m in summary["memory"]]
    assert seqs == [16, 32, 64] and measured[2] == 4 * measured[0]  # the ring's grows linearly
    assert one[2] > 4.5 * one[0]  # one process's with the square of the sequence
    assert summary["idle_schedule"] > 0.3  # the contiguous layout idles


def test_bad_input_gets_one_line_and_exit_2(capsys, monkeypatch):
    """Checked before any rank joins a group (the experiment's ``before_init``)."""
    from distai.engine.experiments import context as E

    monkeypatch.setenv("WORLD_SIZE", "4")
    for argv in (["--seq", "36"], ["--cp", "3"], ["--layout", "contiguous", "--seq", "30"],
                 ["--memory-seqs", "64,100"]):
        assert E.main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distai run context: error: "), lines


def test_ring_attention_equals_torchs_own_ring_kernel_in_both_layouts(results):
    """It skipped on every machine: the public context_parallel needs CUDA's attention kernels. Its ring
    kernel runs on CPU with the CPU's op, and ours equals it on every rank, shard for shard."""
    got = results[0]["torch"]
    if not got["ran"]:
        pytest.skip(f"this torch's _templated_ring_attention is not the one compared here: {got['why']}")
    for r in results:
        for layout in ("contiguous", "zigzag"):
            assert r["torch"][layout]["torch_vs_one_process"] <= 1e-12, (layout, r["torch"])
            assert r["torch"][layout]["ours_vs_torch"] <= 1e-12, (layout, r["torch"])


# --------------------------------------------------------------------------------------------
# The visualizer, the run view and the fold, fed the real run above


def test_online_softmax_row_merged_step_by_step_equals_one_softmax():
    for layout in plan.LAYOUTS:
        for cp in (1, 2, 4, 8):
            trace = F.row_trace(64, cp, layout)
            assert len(trace) == cp and sum(t["keys"] for t in trace) == 64  # the last token meets every key
            assert trace[-1]["out"] == pytest.approx(trace[-1]["direct"], rel=1e-12)
            ms = [t["m"] for t in trace if t["keys"]]
            assert ms == sorted(ms)  # the running maximum never falls


def test_run_fold_and_run_view_keep_the_runs_ring_steps(results):
    from distai.lessons.context.cp_run import CPRun
    from distai.visualizers.ring_attention import RingAttentionRunView

    events = [e for r in results[:4] for e in r["experiment"]["events"]]
    fold, view = CPRun(), RingAttentionRunView("es")
    for e in sorted(events, key=lambda e: e["t"]):
        fold.feed(e)
        view.feed(e)
    assert fold.cp == 4 and fold.train_step == 1  # the latest training step's ring
    for phase in ("fwd", "bwd"):
        for t in range(4):
            assert sorted(fold.step_records(phase, t)) == [0, 1, 2, 3]
    assert fold.idle_share("fwd") is not None and len(fold.memory) == 3
    # one rule: the summary's measured idle share is the fold's, from the same ring steps' CPU seconds of work
    summary = next(e for e in results[0]["experiment"]["events"] if e["kind"] == "summary")
    assert all(r["compute_cpu_s"] > 0 for t in range(4) for r in fold.step_records("fwd", t).values())
    assert fold.idle_share("fwd") == pytest.approx(summary["idle_measured"], rel=1e-9)
    text = "\n".join(line.plain for line in view.renderables(100))
    assert "cp = 4 × dp = 2" in text and "contiguo" in text
    assert "sí" in text  # every ring step as the formula


def test_visualizer_lights_the_tiles_the_engine_computed(results):
    """Replaying the run: at each ring step, the tiles lit in each rank's rows are as many as the
    tiles that rank's engine computed at that step (from its trace)."""
    import asyncio

    from distai.visualizers.ring_attention import RingAttentionVisualizer
    from pilot_harness import mounted

    events = sorted((e for r in results[:4] for e in r["experiment"]["events"]), key=lambda e: e["t"])

    async def go():
        async with mounted(RingAttentionVisualizer, "en", size=(120, 60)) as (pilot, vis):
            for e in events:
                vis.feed_event(e)
            await pilot.pause()
            assert vis.source == "run" and vis.cp == 4 and vis.seq_layout == "contiguous"
            for step in range(4):
                vis.step = step
                lines = [line.plain for line in vis.build_lines(120)]
                for r in range(4):
                    lit = sum(line.count("█") + line.count("◣") for line in lines
                              if line.startswith("q") and line.rstrip().endswith(f"R{r}"))
                    engine = vis.run.step_records("fwd", step)[r]["tiles"]
                    assert lit == 2 * len(engine), (step, r)  # two cells a tile
                    assert f"R{r}" in "\n".join(lines), (step, r)
                assert "compute" in "\n".join(lines)
            await pilot.press("z")  # back to the schedule, zigzag
            assert vis.source == "model" and vis.seq_layout == "zigzag"
            await pilot.press("right_square_bracket")
            assert vis.cp == 8

    asyncio.run(go())


def test_calculator_reproduces_the_texts_worked_numbers():
    """`distai calc context` on Llama 3 405B's long-context layout gives the numbers the lesson quotes."""
    from distai.lessons.context.calc_context import CALCULATOR

    r = CALCULATOR.run({"seq": "131072", "hidden": "16384", "heads": "128", "kv_heads": "8",
                                          "layers": "126", "cp": "16", "tp": "8", "pp": "16"})
    gib, mib = 2 ** 30, 2 ** 20
    assert r["tokens_per_gpu"] == 8192
    assert r["activation_bytes_per_gpu"] == 4.25 * gib and r["activation_bytes_per_gpu_without_cp"] == 68 * gib
    assert r["kv_block_bytes"] == 4 * mib
    assert (r["ring"]["forward_messages"], r["ring"]["backward_messages"]) == (15, 31)
    assert r["ring"]["total_bytes_per_rank"] == 184 * mib and r["allgather"]["total_bytes_per_rank"] == 180 * mib
    assert round(r["overlap"]["compute_s"] * 1e6) == 723 and round(r["overlap"]["hop_s"] * 1e7) == 889
    assert r["overlap"]["hidden"] and r["overlap"]["min_tokens"] == 1306
    # the shortest whole shard that hides the hop: 1306 does, 1305 does not (the root is 1305.36)
    from distai.lessons.context import formulas as fc
    shape = dict(micro_batch=1, hidden=16384, kv_heads=8, head_dim=128, flops=380e12, alpha=5e-6, beta=2e-11, tp=8)
    for n, hides in ((1306, True), (1305, False)):
        o = fc.ring_overlap(seq=16 * n, cp=16, **shape)
        assert o["hidden"] is hides, (n, o)
    assert round(r["idle_fraction_contiguous"], 3) == 0.484


def test_idle_fraction_counts_the_schedules_tiles_without_listing_them():
    """`calc context --cp 65536` never ended: the idle share listed all cp² tiles. It now counts them by the
    schedule's rule; here against the list itself (work_per_step), every layout, cp ≤ 24, long and short chunks."""
    import time

    for layout in plan.LAYOUTS:
        for cp in range(1, 25):
            for c in (1, 3, 64):
                seq = c * plan.num_chunks(cp, layout)
                work = plan.work_per_step(seq, cp, layout)
                busiest = sum(max(work[r][t] for r in range(cp)) for t in range(cp))
                listed = 1.0 - sum(map(sum, work)) / (cp * busiest)
                assert plan.idle_fraction(seq, cp, layout) == pytest.approx(listed, abs=1e-15), (layout, cp, c)
    started = time.perf_counter()
    assert plan.idle_fraction(131072, 65536, "contiguous") == pytest.approx(0.5, abs=1e-4)  # one half as cp grows
    assert time.perf_counter() - started < 0.1


def test_measured_idle_rule_gives_the_schedules_idle_share_on_the_schedules_work():
    """``cp_run.idle_share_of`` (the run's measured idle share, engine and fold alike) fed the schedule's own
    work per rank and step is ``ring_schedule.idle_fraction``: the measurement and the formula are one rule."""
    from distai.lessons.context.cp_run import idle_share_of, work_seconds

    for layout in plan.LAYOUTS:
        for cp in (2, 4, 8):
            work = plan.work_per_step(64, cp, layout)  # [rank][step]
            by_step = [list(col) for col in zip(*work)]
            assert idle_share_of(by_step) == pytest.approx(plan.idle_fraction(64, cp, layout), abs=1e-15)
    assert idle_share_of([[2.0, 0.0], [0.0, 2.0]]) == 0.5 and idle_share_of([]) == 0.0
    assert work_seconds({"compute_s": 0.5, "compute_cpu_s": 0.2}) == 0.2 and work_seconds({"compute_s": 0.5}) == 0.5
