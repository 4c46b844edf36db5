"""Expert parallelism equals the single-process MoE: loss, outputs, every gradient, the drops.

One gloo group of 8 ranks runs every check (``check_all``). For EP = 2, 4, 8 the ranks form
8/EP independent EP jobs (consecutive ranks, each its own global batch); every rank also runs
the single-process MoE of the same weights on its job's whole batch. Top-1 and top-2, dropless
and with a capacity limit that drops tokens, float64 and float32. Then EP = 2 × DP = 4 over all
8 ranks, shared experts and DeepSeek-V3's bias-based balancing over two steps, and the
all-to-alls' bytes and calls measured against the formula.
"""
from __future__ import annotations

import pytest

from distai.engine.testing import run_in_group
from distai.lessons.checks import EQUAL_TO_ONE_PROCESS

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

WORLD = 8
SIZES = dict(hidden=16, heads=2, layers=2, seq=8, vocab=32)
BATCH = 2  # sequences per rank
EXPERTS = 8
TOL = EQUAL_TO_ONE_PROCESS  # the bound the run itself prints its verdict by
CASES = [(ep, k, cf, dtype) for ep in (2, 4, 8) for k in (1, 2) for cf in (None, 0.75)
         for dtype in ("float64", "float32")]


def _rel(a, b) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def _step(model, ids, targets, sync=False, group=None):
    from distai.engine.metering import comm_scope
    from distai.engine.model import lm_loss
    from distai.engine.moe import moe_aux_loss, sync_moe_grads

    model.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = lm_loss(logits, targets) + moe_aux_loss(model)
    with comm_scope(phase="bwd"):
        loss.backward()
    if sync:
        sync_moe_grads(model, group)
    return logits, loss


def compare(rank: int, ep_group, dp_group, expert_dp, job_ranks: list[int], moe, dtype, steps: int = 1,
            seed: int = 5, capacity_groups: int = 1) -> dict:
    """Train the EP model (this rank's slice of the job's batch) and the single-process one (the
    whole batch) side by side; the largest relative difference of each quantity."""
    import torch.distributed as dist

    from distai.engine.data_parallel import sgd_step
    from distai.engine.model import GPT, GPTConfig, make_batch
    from distai.engine.moe import apply_ep, make_moe, moe_layers

    cfg = GPTConfig(**SIZES)
    n_job = len(job_ranks)
    me = job_ranks.index(rank)
    ref = make_moe(GPT(cfg, seed=seed, dtype=dtype), moe, seed=seed)
    model = apply_ep(make_moe(GPT(cfg, seed=seed, dtype=dtype), moe, seed=seed), ep_group, expert_dp, dp_group)
    for layer in moe_layers(ref):  # one process: each EP group's tokens have their own capacity
        layer.capacity_groups = capacity_groups
    out: dict = {"loss": 0.0, "logits": 0.0, "grads": 0.0, "n_grads": 0, "kept_equal": True, "routed": [],
                 "kept": [], "bias": 0.0}
    ep = dist.get_world_size(ep_group)
    local = EXPERTS // ep
    first = dist.get_rank(ep_group) * local
    for step in range(steps):
        ids, targets = make_batch(cfg, BATCH * n_job, seed, step)
        mine = slice(me * BATCH, (me + 1) * BATCH)
        ref_logits, ref_loss = _step(ref, ids, targets)
        logits, loss = _step(model, ids[mine], targets[mine], True, dp_group)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=dp_group)
        out["loss"] = max(out["loss"], abs(mean_loss.item() / n_job - ref_loss.item()) / abs(ref_loss.item()))
        out["logits"] = max(out["logits"], _rel(logits.detach(), ref_logits.detach()[:, mine]))
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            ref_name = name
            if ".experts." in name:  # local expert i is global expert first + i
                head, tail = name.split(".experts.")
                i, rest = tail.split(".", 1)
                ref_name = f"{head}.experts.{first + int(i)}.{rest}"
            out["grads"] = max(out["grads"], _rel(p.grad, ref_params[ref_name].grad))
            out["n_grads"] += 1
        for a, b in zip(moe_layers(model), moe_layers(ref)):
            out["kept_equal"] &= a.stats.kept == b.stats.kept and a.stats.routed == b.stats.routed
            out["aux"] = abs(a.stats.aux_loss - b.stats.aux_loss)
            out["routed"].append(b.stats.routed)
            out["kept"].append(b.stats.kept)
            a.update_balance_bias()
            b.update_balance_bias()
            out["bias"] = max(out["bias"], (a.balance_bias - b.balance_bias).abs().max().item())
        sgd_step(model.parameters(), 0.5)
        sgd_step(ref.parameters(), 0.5)
    out["expert_params"] = sum(1 for n, _ in model.named_parameters() if ".experts." in n)
    return out


def metered_step(rank: int, ep_group, moe) -> dict:
    """One metered step of EP over the whole world: every all-to-all against the formula."""
    import torch
    import torch.distributed as dist

    from distai.engine.metering import CommMeter
    from distai.engine.model import GPT, GPTConfig, make_batch
    from distai.engine.moe import apply_ep, make_moe, moe_layers
    from distai.lessons.experts.formulas import all_to_all_calls_per_layer

    cfg = GPTConfig(**SIZES)
    model = apply_ep(make_moe(GPT(cfg, seed=2, dtype=torch.float64), moe, seed=2), ep_group)
    ids, targets = make_batch(cfg, BATCH * WORLD, 2, 0)
    ids, targets = ids[rank * BATCH:(rank + 1) * BATCH], targets[rank * BATCH:(rank + 1) * BATCH]
    meter = CommMeter()
    with meter:
        _step(model, ids, targets)
    a2a = [r for r in meter.records if r.op == "all_to_all"]
    me = dist.get_rank(ep_group)
    rows = [sum(n for q, n in enumerate(layer.stats.sent_rows + layer.stats.received_rows) if q % WORLD != me)
            for layer in moe_layers(model)]
    return {"calls": len(a2a), "formula_calls": cfg.layers * sum(all_to_all_calls_per_layer(
                dropless=moe.capacity_factor is None).values()),
            "fwd_token_bytes": sum(r.sent_bytes for r in a2a if r.site in ("moe.dispatch", "moe.combine")),
            "bwd_bytes": sum(r.sent_bytes for r in a2a if r.phase == "bwd"),
            "rows": rows, "elem": 8}


def check_all(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from distai.engine.moe import MoEConfig, ep_groups

    out: dict = {}
    groups = {ep: ep_groups(ep) for ep in (2, 4, 8)}
    for ep, k, cf, dtype in CASES:
        ep_group, _ = groups[ep]
        job = [r for r in range(world) if r // ep == rank // ep]
        moe = MoEConfig(experts=EXPERTS, top_k=k, capacity_factor=cf)
        out[(ep, k, cf, dtype)] = compare(rank, ep_group, ep_group, None, job, moe, getattr(torch, dtype))
    # EP = 2 inside DP = 4: experts replicated over the four EP groups, the global batch the world's
    ep_group, expert_dp = groups[2]
    moe = MoEConfig(experts=EXPERTS, top_k=2, shared_experts=1, bias_rate=1e-3)
    out["ep2xdp4"] = compare(rank, ep_group, None, expert_dp, list(range(world)), moe, torch.float64, steps=2)
    moe = MoEConfig(experts=EXPERTS, top_k=2, capacity_factor=0.75)
    out["ep2xdp4-cf"] = compare(rank, ep_group, None, expert_dp, list(range(world)), moe, torch.float64,
                                capacity_groups=world // 2)
    out["metered"] = {cf: metered_step(rank, groups[8][0], MoEConfig(experts=EXPERTS, top_k=2, capacity_factor=cf))
                      for cf in (None, 1.0)}
    dist.barrier()
    out["main"] = run_main(rank)  # last: the experiment's own entry point ends the process group
    return out


def run_main(rank: int) -> dict:
    """``distai run experts --ep 4`` on the 8 ranks (EP = 4 × DP = 2), in Spanish."""
    import contextlib
    import io
    import os
    import tempfile
    from pathlib import Path

    from distai.engine.events import read_events
    from distai.engine.experiments import experts

    events_dir = tempfile.mkdtemp()
    os.environ["DISTAI_EVENTS_DIR"] = events_dir
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = experts.main(["--ep", "4", "--steps", "3", "--micro-batch", "2", "--hidden", "16", "--heads", "2",
                           "--seq", "8", "--vocab", "32", "--capacity-factor", "1.0", "--lang", "es"])
    events = list(read_events(Path(events_dir) / f"rank{rank}.jsonl"))
    return {"rc": rc, "printed": printed.getvalue(), "events": [e for e in events if e["kind"] != "span"]}


@pytest.fixture(scope="module")
def results():
    return run_in_group(check_all, WORLD, timeout_s=300)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"ep{c[0]}-top{c[1]}-{'dropless' if c[2] is None else f'cf{c[2]}'}-{c[3]}")
def test_ep_equals_single_process(results, case):
    ep, k, cf, dtype = case
    tol = TOL[dtype]
    for r in results:
        got = r[case]
        assert got["loss"] <= tol and got["logits"] <= tol and got["grads"] <= tol, got
        assert got["kept_equal"], got
        assert got["expert_params"] == SIZES["layers"] * (EXPERTS // ep) * 4  # fc1, fc2: weight and bias
    routed, kept = results[0][case]["routed"], results[0][case]["kept"]
    if cf is None:
        assert routed == kept
    else:  # the limit really drops tokens, the same ones as the single process drops
        assert sum(map(sum, kept)) < sum(map(sum, routed))


@pytest.mark.parametrize("case", ["ep2xdp4", "ep2xdp4-cf"])
def test_ep_inside_data_parallel(results, case):
    """Shared experts and the bias balance over two steps (dropless); a capacity per EP group."""
    for r in results:
        got = r[case]
        assert got["loss"] <= 1e-12 and got["logits"] <= 1e-12 and got["grads"] <= 1e-12, got
        assert got["kept_equal"] and got["bias"] == 0.0
    if case.endswith("cf"):
        assert sum(map(sum, results[0][case]["kept"])) < sum(map(sum, results[0][case]["routed"]))


@pytest.mark.parametrize("cf", [None, 1.0], ids=["dropless", "cf1.0"])
def test_all_to_all_bytes_and_calls_match_formula(results, cf):
    h = SIZES["hidden"]
    for r in results:
        m = r["metered"][cf]
        assert m["calls"] == m["formula_calls"]
        # dispatch sends the rows bound for other ranks, combine returns those that came from them;
        # backward runs the same two in reverse
        assert m["fwd_token_bytes"] == m["bwd_bytes"] == sum(m["rows"]) * h * m["elem"] > 0


def test_experiment_streams_loads_and_checks_everything(results):
    main = results[0]["main"]
    assert main["rc"] == 0
    kinds = {e["kind"] for e in main["events"]}
    assert {"moe_config", "moe_load", "step", "moe_comm", "moe_memory", "progress", "summary"} <= kinds
    config = next(e for e in main["events"] if e["kind"] == "moe_config")
    assert (config["ep"], config["dp"], config["experts_per_rank"]) == (4, 2, 2)
    loads = [e for e in main["events"] if e["kind"] == "moe_load"]
    assert len(loads) == 3 * SIZES["layers"]
    for e in loads:  # the capacity holds, the drops are what it cut
        assert all(k <= min(r, e["capacity"]) for r, k in zip(e["routed"], e["kept"]))
        assert e["drop_rate"] == pytest.approx(1 - sum(e["kept"]) / sum(e["routed"]))
    comm = next(e for e in main["events"] if e["kind"] == "moe_comm")
    assert len(comm["ranks"]) == WORLD and all(r["match"] and r["measured"]["calls"] > 0 for r in comm["ranks"])
    memory = next(e for e in main["events"] if e["kind"] == "moe_memory")
    for r in memory["ranks"]:
        assert r["expert_bytes"] == r["formula_bytes"] == r["all_experts_bytes"] // 4
    summary = next(e for e in main["events"] if e["kind"] == "summary")
    assert summary["max_param_rel_diff"] <= 1e-5 and summary["comm_match"] and summary["memory_match"]
    assert summary["equal_to_one_process"] is True
    assert "Mezcla de expertos · 8 expertos sobre EP = 4 (× DP = 2)" in main["printed"]
    # the comparison's verdict, by the bound of the run's dtype (it printed the differences alone)
    assert "parámetros " in main["printed"] and ": iguales (≤ 1e-5 en float32)" in main["printed"]
    # the memory check's verdict is printed beside the traffic's (it was computed, then shown nowhere)
    memory_line = next(line for line in main["printed"].splitlines() if "pesos de expertos por rank" in line)
    assert "todos los ranks cuadran con la fórmula" in memory_line, memory_line
    assert all(r["main"]["printed"] == "" for r in results[1:])  # rank 0 alone prints the summary


@pytest.mark.parametrize("argv, message", [
    (["--experts", "6", "--ep", "4"], "ep = 4 does not divide the 6 experts"),
    (["--experts", "4", "--top-k", "5"], "top-k must be between 1 and the number of experts (4), got 5"),
    (["--capacity-factor", "0"], "--capacity-factor: must be a finite positive number, got 0"),
    (["--capacity-factor", "1", "--dropless"], "not allowed with argument"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    from distai.engine.experiments import experts

    try:
        rc = experts.main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and message in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("k, cf", [(1, None), (2, None), (1, 1.0), (2, 0.5)])
def test_single_process_moe_equals_gshard_dense_combine(k, cf):
    """The sort-based layer against GShard's formulation: every expert on every token, weighted
    by a combine matrix that is zero for unchosen and dropped (expert, token) pairs."""
    import torch

    from distai.engine.model import GPT, GPTConfig
    from distai.engine.moe import MoEConfig, make_moe, moe_layers

    moe = MoEConfig(experts=4, top_k=k, capacity_factor=cf)
    layer = moe_layers(make_moe(GPT(GPTConfig(**SIZES), seed=1, dtype=torch.float64), moe, seed=1))[0]
    x = torch.randn(8, 3, SIZES["hidden"], dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    y = layer(x)
    t = x.transpose(0, 1).reshape(-1, SIZES["hidden"])
    p = layer.router(t).softmax(-1)
    ref, fill = _dense_combine(layer, t, p, p.topk(k, -1).indices, moe)
    assert _rel(y.transpose(0, 1).reshape(-1, SIZES["hidden"]), ref) < 1e-14
    assert layer.stats.kept == fill and (cf is None or sum(fill) < t.shape[0] * k)


def _dense_combine(layer, t, probs, chosen, moe):
    """GShard's formulation of a routed layer's output: every expert on every token, weighted by a combine
    matrix that holds each chosen (token, expert)'s gate (the router's probability, renormalized over the
    top-k) and zero for unchosen and dropped pairs; and how many tokens each expert kept."""
    import torch

    k, experts = chosen.shape[1], len(layer.experts)
    g = probs.gather(1, chosen)
    g = g / g.sum(-1, keepdim=True) if k > 1 else g
    n, C = t.shape[0], moe.capacity(t.shape[0])
    combine, fill = torch.zeros(n, experts, dtype=torch.float64), [0] * experts
    for j in range(k):  # first choices first, then in token order
        for i in range(n):
            e = int(chosen[i, j])
            if C is None or fill[e] < C:
                fill[e] += 1
                combine[i, e] += g[i, j]
    return sum(combine[:, e:e + 1] * layer.experts[e](t) for e in range(experts)), fill


def test_run_fold_keeps_each_steps_loads_and_the_checks(results):
    from distai.lessons.experts.experts_run import ExpertsRun

    run = ExpertsRun()
    events = results[0]["main"]["events"]
    for e in events:
        run.feed(e)
    assert run.config["experts"] == EXPERTS and len(run.loads) == 3 == len(run.drop_rates)
    for load, rate in zip(run.loads, run.drop_rates):
        assert load.layers == SIZES["layers"] and sum(load.dropped) == pytest.approx(rate * sum(load.routed))
    assert run.comm_match is True and run.memory is not None


@pytest.mark.parametrize("cf", [None, 0.5])
def test_switch_loss_and_the_bias_step_by_their_definitions(cf):
    """The audit: the balancing loss and the bias update were only compared between EP and one process, which
    share the code. Here each is computed from its paper's definition. Switch (Fedus et al. 2022, eq. 4):
    α·E·Σᵢ fᵢ·Pᵢ, fᵢ the share of the k·T routing choices that go to expert i (before any drop), Pᵢ its mean
    router probability. DeepSeek-V3 (Sec. 2.1.2): an overloaded expert's bias falls by γ, an underloaded one's
    rises by γ, and the bias only steers the choice, not the gate."""
    import torch

    from distai.engine.model import GPT, GPTConfig
    from distai.engine.moe import MoEConfig, make_moe, moe_layers

    E, k, alpha, gamma = 4, 2, 0.01, 1e-3
    moe = MoEConfig(experts=E, top_k=k, capacity_factor=cf, aux_alpha=alpha, bias_rate=gamma)
    layer = moe_layers(make_moe(GPT(GPTConfig(**SIZES), seed=2, dtype=torch.float64), moe, seed=2))[0]
    x = torch.randn(8, 3, SIZES["hidden"], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    t = x.transpose(0, 1).reshape(-1, SIZES["hidden"])
    layer.balance_bias += torch.tensor([0.3, 0.0, -0.3, 0.0], dtype=torch.float64)  # a bias that changes choices
    y = layer(x)
    p = layer.router(t).softmax(-1)
    chosen = (p + layer.balance_bias).topk(k, -1).indices
    assert not torch.equal(chosen, p.topk(k, -1).indices)  # the bias did steer some choices
    # ... and only the choices: each chosen expert's gate is its unbiased probability, renormalized over the k
    ref, fill = _dense_combine(layer, t, p, chosen, moe)
    assert _rel(y.transpose(0, 1).reshape(-1, SIZES["hidden"]), ref) < 1e-14 and layer.stats.kept == fill
    counts = torch.bincount(chosen.reshape(-1), minlength=E).to(torch.float64)
    f = counts / (t.shape[0] * k)
    assert layer.stats.routed == counts.tolist()
    assert float(layer.aux_loss.detach()) == pytest.approx(float(alpha * E * (f * p.mean(0).detach()).sum()), rel=1e-12)
    before = layer.balance_bias.clone()
    layer.update_balance_bias()
    expected = before + gamma * torch.sign(counts.mean() - counts)
    assert torch.equal(layer.balance_bias, expected)
    step = torch.sign(layer.balance_bias - before)
    assert step[counts.argmax()] == -1 and step[counts.argmin()] == 1  # the busiest expert falls, the idlest rises
