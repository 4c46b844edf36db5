"""``distai calc ...``: the lessons' formulas as calculators.

Each command calls the same function the lesson text, the quiz and the tests use
(``distai.lessons.lessonN.formulas``). ``--json`` prints one JSON object with stable keys: sizes in
bytes, times in seconds, fractions in [0, 1]. Numeric options accept units (``7.5B``, ``175e9``,
``64MiB``, ``2GB``, ``5us``, ``1.5ms``, ``100GB/s``) and a decimal comma (``16,6 GB``). Bad or
out-of-range values give a one-line error and exit code 2.

Imports only typer at module level: ``distai --help`` loads this module.
"""
from __future__ import annotations

import json
import math

import typer

from .cli import CliError, calc_app

# ------------------------------------------------------------------------------------ helpers


def _units():
    from ..lessons import units

    return units


def _parse(kind: str, text: str | None, option: str, *, minimum: float | None = None,
           strict_min: bool = False, integer: bool = False, maximum: float | None = None):
    """Parse one option's text with units; one-line errors naming the option."""
    if text is None:
        return None
    u = _units()
    parser = {"count": u.parse_count, "bytes": u.parse_bytes, "time": u.parse_time,
              "bandwidth": u.parse_bandwidth}[kind]
    try:
        value = parser(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}") from None
    if integer:
        if value != math.floor(value):
            raise CliError(f"{option}: must be a whole number, got {text!r}")
        value = int(value)
    if minimum is not None:
        if strict_min and not value > minimum:
            raise CliError(f"{option}: must be greater than {minimum:g}, got {text!r}")
        if not strict_min and value < minimum:
            raise CliError(f"{option}: must be at least {minimum:g}, got {text!r}")
    if maximum is not None and value > maximum:
        raise CliError(f"{option}: must be at most {maximum:g}, got {text!r}")
    return value


def _int(text, option, minimum=1, maximum=None):
    return _parse("count", text, option, minimum=minimum, integer=True, maximum=maximum)


def _choice(value: str, choices, option: str) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise CliError(f"{option}: unknown value {value!r}; choose one of {', '.join(choices)}")
    return v


def _jsonable(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        return int(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _emit_json(obj: dict) -> None:
    typer.echo(json.dumps(_jsonable(obj), ensure_ascii=False, indent=2))


def _call(func, *args, **kwargs):
    """Run a formula; its ValueError becomes a one-line CLI error."""
    try:
        return func(*args, **kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _table(rows: list[tuple[str, str]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        typer.echo(f"  {label:<{width}}  {value}")


def _b(n) -> str:
    u = _units()
    if n is None:
        return "—"
    return f"{u.format_bytes(n)}  ({u.format_bytes(n, binary=True)}, {round(n):,} B)"


JSON_HELP = "Print one JSON object (keys listed above) instead of text."


def _reflow(doc: str) -> str:
    """A docstring with each paragraph on one line (Typer's rich help keeps hard line breaks)."""
    import inspect

    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _command(name: str):
    """Register on ``calc_app`` with the function's docstring, reflowed, as the help."""
    def register(func):
        return calc_app.command(name, help=_reflow(func.__doc__))(func)
    return register

# ------------------------------------------------------------------------------------ memory


@_command("memory")
def memory(
    params: str = typer.Option(..., "--params", help="Parameters Ψ of the model (7.5B, 175e9, 1.3M)."),
    dp: str = typer.Option("1", "--dp", help="Data-parallel degree N_d the model states are sharded over."),
    strategy: str = typer.Option("ddp", "--strategy", help="ddp, zero1, zero2, zero3 or fsdp."),
    optimizer: str = typer.Option("adam", "--optimizer",
                                  help="adam (K=12 mixed), sgd (with momentum, K=8) or sgd-nomomentum (K=4)."),
    precision: str = typer.Option("mixed", "--precision", help="mixed (fp16/bf16 + fp32 master) or fp32."),
    layers: str | None = typer.Option(None, "--layers", help="Transformer layers L (for activations)."),
    hidden: str | None = typer.Option(None, "--hidden", help="Hidden size h."),
    seq: str | None = typer.Option(None, "--seq", help="Sequence length s."),
    micro_batch: str | None = typer.Option(None, "--micro-batch", help="Micro-batch size b."),
    heads: str | None = typer.Option(None, "--heads", help="Attention heads a."),
    tp: str = typer.Option("1", "--tp", help="Tensor-parallel degree t (divides parameters and activations)."),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="Megatron sequence parallelism."),
    recompute: str = typer.Option("none", "--recompute", help="Activation recomputation: none, selective, full."),
    gpu_memory: str | None = typer.Option(None, "--gpu-memory", help="GPU memory (80GB) to check the fit."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Memory per GPU: ZeRO model states plus Korthikanti activations.

    Model states follow ZeRO (Rajbhandari et al. 2020, Fig. 1); activations per layer follow
    Korthikanti et al. 2022 (Table 2), times --layers.

    JSON keys: params_bytes, grads_bytes, optimizer_bytes, activations_bytes (null without
    --layers/--hidden/--seq/--micro-batch/--heads), total_bytes, and the inputs: params, dp, tp,
    strategy, optimizer, precision, k (optimizer bytes per parameter); with --gpu-memory also
    gpu_memory_bytes and fits (bool).
    """
    from ..lessons.lesson2 import formulas as f2

    psi = _int(params, "--params")
    n = _int(dp, "--dp")
    t = _int(tp, "--tp")
    strat = _choice(strategy, f2.STRATEGIES, "--strategy")
    opt = _choice(optimizer, f2.OPTIMIZERS + ("adamw",), "--optimizer")
    prec = _choice(precision, f2.PRECISIONS, "--precision")
    rec = _choice(recompute, f2.RECOMPUTE, "--recompute")
    shape = {"layers": _int(layers, "--layers"), "hidden": _int(hidden, "--hidden"), "seq": _int(seq, "--seq"),
             "micro_batch": _int(micro_batch, "--micro-batch"), "heads": _int(heads, "--heads")}
    given = [k for k, v in shape.items() if v is not None]
    if given and len(given) != len(shape):
        missing = ", ".join("--" + k.replace("_", "-") for k, v in shape.items() if v is None)
        raise CliError(f"activations need the whole shape; missing {missing}")
    if (sequence_parallel or rec != "none") and not given:
        raise CliError("--sequence-parallel and --recompute need the shape (--layers --hidden --seq "
                       "--micro-batch --heads)")
    mem = _call(f2.memory_per_gpu, psi, n, strat, opt, prec, tp=t, sequence_parallel=sequence_parallel,
                recompute=rec, **shape)
    k = f2.optimizer_k(opt, prec)
    out = dict(mem)
    out.update({"params": psi, "dp": n, "tp": t, "strategy": strat, "optimizer": opt, "precision": prec, "k": k})
    if gpu_memory is not None:
        cap = _parse("bytes", gpu_memory, "--gpu-memory", minimum=0, strict_min=True)
        out["gpu_memory_bytes"] = cap
        out["fits"] = mem["total_bytes"] <= cap
    if as_json:
        _emit_json(out)
        return
    u = _units()
    typer.echo(f"Memory per GPU: {strat}, Ψ = {u.format_count(psi)}, N_d = {n}"
               + (f", t = {t}" if t > 1 else "") + f", {opt}, {prec} (K = {k})")
    rows = [("parameters", _b(mem["params_bytes"])), ("gradients", _b(mem["grads_bytes"])),
            ("optimizer states", _b(mem["optimizer_bytes"]))]
    if mem["activations_bytes"] is not None:
        rows.append(("activations", _b(mem["activations_bytes"])))
    rows.append(("total", _b(mem["total_bytes"])))
    _table(rows)
    if gpu_memory is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        typer.echo(f"  → {verdict} in {u.format_bytes(out['gpu_memory_bytes'])}")


# ------------------------------------------------------------------------------------ bubble


@_command("bubble")
def bubble(
    stages: str = typer.Option(..., "--stages", "-p", help="Pipeline stages p."),
    microbatches: str = typer.Option(..., "--microbatches", "-m", help="Microbatches per step m."),
    schedule: str = typer.Option("1f1b", "--schedule", help="gpipe, 1f1b or interleaved."),
    chunks: str | None = typer.Option(None, "--chunks", "-v",
                                         help="Model chunks per stage v (interleaved only; default 2)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Pipeline bubble and memory of GPipe, 1F1B and interleaved 1F1B.

    GPipe (Huang et al. 2019), 1F1B and interleaved (Narayanan et al. 2021); equal stage costs,
    free communication.

    JSON keys: bubble_fraction ((p-1)/(v·m+p-1), share of the step), bubble_ratio ((p-1)/(v·m),
    relative to the ideal time), peak_inflight_microbatches (microbatches of activations the first
    stage holds at once), step_time_units (step time in units of one microbatch's forward+backward on
    one stage), and the inputs stages, microbatches, schedule, chunks.
    """
    from ..lessons.lesson5 import formulas as f5

    p = _int(stages, "--stages")
    m = _int(microbatches, "--microbatches")
    sched = _choice(schedule, f5.SCHEDULES, "--schedule")
    if chunks is None:
        v = 2 if sched == "interleaved" else 1
    else:
        v = _int(chunks, "--chunks")
    r = _call(f5.pipeline_bubble, p, m, sched, v)
    out = dict(r, stages=p, microbatches=m, schedule=sched, chunks=v)
    if as_json:
        _emit_json(out)
        return
    u = _units()
    typer.echo(f"Pipeline {sched}: p = {p} stages, m = {m} microbatches" + (f", v = {v} chunks" if v > 1 else ""))
    _table([
        ("bubble (share of the step)", u.format_percent(r["bubble_fraction"])),
        ("bubble / ideal time", u.format_percent(r["bubble_ratio"])),
        ("peak in flight, first stage", f"{u.format_number(r['peak_inflight_microbatches'])} microbatches"),
        ("step time", f"{u.format_number(r['step_time_units'])} × (t_f + t_b)"),
    ])


# ------------------------------------------------------------------------------------ allreduce


@_command("allreduce")
def allreduce(
    size: str = typer.Option(..., "--bytes", "-s", help="Message size S (1GB, 64MiB, 4e8)."),
    ranks: str = typer.Option(..., "--ranks", "-n", help="Ranks N."),
    alpha: str = typer.Option("5us", "--alpha", help="Latency per message α (default 5us)."),
    beta: str = typer.Option("100GB/s", "--beta",
                             help="Time per byte β in s/B (1e-11), or a link bandwidth (100GB/s = 1e-11 s/B)."),
    algorithm: str = typer.Option("ring", "--algorithm", help="ring, tree (binomial) or naive (reduce+broadcast)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """All-reduce cost in the alpha-beta model (ring, tree, naive).

    Ring: 2(N-1)α + 2(N-1)/N·S·β; binomial tree: 2⌈log2 N⌉(α + S·β); naive: 2(N-1)(α + S·β).

    JSON keys: time_s, bytes_per_rank (sent by the busiest rank), steps (serialised messages),
    busbw_factor (2(N-1)/N), algbw_bytes_per_s (S/time), busbw_bytes_per_s, and the inputs
    size_bytes, ranks, alpha_s, beta_s_per_byte, algorithm.
    """
    from ..lessons.lesson1 import formulas as f1

    S = _parse("bytes", size, "--bytes", minimum=0)
    n = _int(ranks, "--ranks")
    a = _parse("time", alpha, "--alpha", minimum=0)
    b_text = beta.strip()
    if any(tag in b_text for tag in ("/s", "bps", "Bps")):
        bw = _parse("bandwidth", b_text, "--beta", minimum=0, strict_min=True)
        b = 1.0 / bw
    else:
        b = _parse("time", b_text, "--beta", minimum=0)
    algo = _choice(algorithm, f1.ALGORITHMS, "--algorithm")
    t = _call(f1.allreduce_time, S, n, a, b, algo)
    out = {
        "time_s": t,
        "bytes_per_rank": _call(f1.allreduce_bytes_per_rank, S, n, algo),
        "steps": f1.allreduce_steps(n, algo),
        "busbw_factor": f1.busbw_factor(n),
        "algbw_bytes_per_s": f1.algbw(S, t) if t > 0 else None,
        "busbw_bytes_per_s": f1.busbw(S, t, n) if t > 0 else None,
        "size_bytes": S, "ranks": n, "alpha_s": a, "beta_s_per_byte": b, "algorithm": algo,
    }
    if as_json:
        _emit_json(out)
        return
    u = _units()
    bw_txt = u.format_bandwidth(1 / b) if b > 0 else "∞"
    typer.echo(f"All-reduce ({algo}) of {u.format_bytes(S)} on {n} ranks, α = {u.format_time(a)}, "
               f"β = 1/({bw_txt})")
    _table([
        ("time", u.format_time(t)),
        ("sent by busiest rank", _b(out["bytes_per_rank"])),
        ("steps", str(out["steps"])),
        ("busbw factor 2(N-1)/N", u.format_number(out["busbw_factor"], 4)),
        ("algbw / busbw", "—" if t == 0 else
         f"{u.format_bandwidth(out['algbw_bytes_per_s'])} / {u.format_bandwidth(out['busbw_bytes_per_s'])}"),
    ])
    others = [x for x in f1.ALGORITHMS if x != algo]
    typer.echo("  compare: " + ", ".join(f"{x} {u.format_time(f1.allreduce_time(S, n, a, b, x))}" for x in others))


# ------------------------------------------------------------------------------------ checkpoint


@_command("checkpoint")
def checkpoint(
    mtbf: str = typer.Option(..., "--mtbf", help="Mean time between failures of the job (or per GPU with --gpus): 3h, 86400."),
    cost: str = typer.Option(..., "--cost", help="Time to write one checkpoint δ (30s, 5min)."),
    restart: str = typer.Option("0", "--restart", help="Time to restart and reload R (default 0)."),
    gpus: str | None = typer.Option(None, "--gpus", help="If given, --mtbf is per GPU; job MTBF = MTBF/G."),
    interval: str | None = typer.Option(None, "--interval",
                                           help="Evaluate the waste at this interval instead of Daly's."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Checkpoint interval (Young, Daly) and the expected waste.

    Young's √(2δM) (1974), Daly's higher-order estimate (2006), and the expected waste of Daly's
    exponential-failure model.

    JSON keys: young_interval_s, daly_interval_s, expected_waste_fraction (share of wall-clock time
    lost to checkpoints, redone work and restarts, at --interval if given, else at Daly's interval),
    waste_at_young_fraction, interval_s (where the waste was evaluated), job_mtbf_s, cost_s, restart_s.
    """
    from ..lessons.lesson3 import formulas as f3

    M = _parse("time", mtbf, "--mtbf", minimum=0, strict_min=True)
    d = _parse("time", cost, "--cost", minimum=0, strict_min=True)
    R = _parse("time", restart, "--restart", minimum=0)
    if gpus is not None:
        M = _call(f3.job_mtbf, M, _int(gpus, "--gpus"))
    young = _call(f3.young_interval, M, d)
    daly = _call(f3.daly_interval, M, d, R)
    tau = daly if interval is None else _parse("time", interval, "--interval", minimum=0, strict_min=True)
    out = {
        "young_interval_s": young,
        "daly_interval_s": daly,
        "expected_waste_fraction": _call(f3.expected_waste_fraction, tau, M, d, R),
        "waste_at_young_fraction": _call(f3.expected_waste_fraction, young, M, d, R),
        "interval_s": tau,
        "job_mtbf_s": M, "cost_s": d, "restart_s": R,
    }
    if as_json:
        _emit_json(out)
        return
    u = _units()
    typer.echo(f"Checkpointing: job MTBF M = {u.format_time(M)}, checkpoint δ = {u.format_time(d)}, "
               f"restart R = {u.format_time(R)}")
    _table([
        ("Young √(2δM)", u.format_time(young)),
        ("Daly (higher order)", u.format_time(daly)),
        (f"expected waste at {u.format_time(tau)}", u.format_percent(out["expected_waste_fraction"])),
        ("expected waste at Young's", u.format_percent(out["waste_at_young_fraction"])),
    ])


# ------------------------------------------------------------------------------------ kvcache


@_command("kvcache")
def kvcache(
    layers: str = typer.Option(..., "--layers", help="Layers L."),
    kv_heads: str = typer.Option(..., "--kv-heads", help="Key/value heads H_kv (fewer than query heads with GQA)."),
    head_dim: str = typer.Option(..., "--head-dim", help="Head dimension d."),
    dtype: str = typer.Option("fp16", "--dtype", help="fp16, bf16, fp8 or fp32."),
    tokens: str = typer.Option(..., "--tokens", help="Tokens cached, all sequences together (4096, 128k)."),
    tp: str = typer.Option("1", "--tp", help="Tensor-parallel degree (shards KV heads)."),
    pp: str = typer.Option("1", "--pp", help="Pipeline-parallel degree (shards layers)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """KV cache size per token, in total and per GPU.

    2·L·H_kv·d·bytes per token (Pope et al. 2023), sharded by heads (TP) and by layers (PP).

    JSON keys: bytes_per_token, total_bytes, per_gpu_bytes (the busiest GPU), and the inputs layers,
    kv_heads, head_dim, dtype, dtype_bytes, tokens, tp, pp.
    """
    from ..lessons.lesson7 import formulas as f7

    L = _int(layers, "--layers")
    H = _int(kv_heads, "--kv-heads")
    d = _int(head_dim, "--head-dim")
    dt = _choice(dtype, ("fp16", "bf16", "fp8", "fp32"), "--dtype")
    T = _int(tokens, "--tokens")
    t = _int(tp, "--tp")
    p = _int(pp, "--pp")
    nbytes = f7.dtype_bytes(dt)
    r = _call(f7.kv_cache_total, L, H, d, nbytes, T, t, p)
    out = dict(r, layers=L, kv_heads=H, head_dim=d, dtype=dt, dtype_bytes=nbytes, tokens=T, tp=t, pp=p)
    if as_json:
        _emit_json(out)
        return
    typer.echo(f"KV cache: L = {L}, H_kv = {H}, d = {d}, {dt}, {T:,} tokens, tp = {t}, pp = {p}")
    _table([("per token", _b(r["bytes_per_token"])), ("total", _b(r["total_bytes"])),
            ("per GPU", _b(r["per_gpu_bytes"]))])


# ------------------------------------------------------------------------------------ tp-comm


@_command("tp-comm")
def tp_comm(
    hidden: str = typer.Option(..., "--hidden", help="Hidden size h."),
    seq: str = typer.Option(..., "--seq", help="Sequence length s."),
    micro_batch: str = typer.Option("1", "--micro-batch", help="Micro-batch size b."),
    tp: str = typer.Option(..., "--tp", help="Tensor-parallel degree t."),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="Megatron sequence parallelism."),
    dtype: str = typer.Option("bf16", "--dtype", help="Activation dtype: fp32, fp16, bf16, fp8."),
    alpha: str | None = typer.Option(None, "--alpha", help="Latency per message α, to estimate time."),
    beta: str | None = typer.Option(None, "--beta", help="s/B or a bandwidth (100GB/s), to estimate time."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Tensor-parallel collectives and bytes per transformer layer.

    Megatron-LM (Shoeybi et al. 2019); sequence parallelism after Korthikanti et al. 2022.

    JSON keys: tensor_bytes (s·b·h·bytes), forward and backward ({collective: count}),
    forward_bytes_per_rank, backward_bytes_per_rank, total_bytes_per_rank (ring), and with --alpha and
    --beta forward_time_s, backward_time_s, total_time_s; plus the inputs.
    """
    from ..lessons.lesson4 import formulas as f4
    from ..lessons.lesson7 import formulas as f7

    h, s, b, t = _int(hidden, "--hidden"), _int(seq, "--seq"), _int(micro_batch, "--micro-batch"), _int(tp, "--tp")
    dt = _choice(dtype, ("fp32", "fp16", "bf16", "fp8"), "--dtype")
    a = bt = None
    if (alpha is None) != (beta is None):
        raise CliError("--alpha and --beta go together")
    if alpha is not None:
        a = _parse("time", alpha, "--alpha", minimum=0)
        if any(tag in beta for tag in ("/s", "bps", "Bps")):
            bt = 1.0 / _parse("bandwidth", beta, "--beta", minimum=0, strict_min=True)
        else:
            bt = _parse("time", beta, "--beta", minimum=0)
    r = _call(f4.tp_comm_per_layer, h, s, b, t, sequence_parallel, f7.dtype_bytes(dt), a, bt)
    out = dict(r, hidden=h, seq=s, micro_batch=b, tp=t, sequence_parallel=sequence_parallel, dtype=dt)
    if as_json:
        _emit_json(out)
        return
    u = _units()
    ops = ", ".join(f"{c} {op.replace('_', '-')}" for op, c in r["forward"].items())
    typer.echo(f"Tensor parallelism t = {t}{' + sequence parallelism' if sequence_parallel else ''}: "
               f"per layer, each direction: {ops} of {u.format_bytes(r['tensor_bytes'])}")
    rows = [("sent per rank, forward", _b(r["forward_bytes_per_rank"])),
            ("sent per rank, backward", _b(r["backward_bytes_per_rank"]))]
    if "total_time_s" in r:
        rows.append(("time per layer (fwd+bwd)", u.format_time(r["total_time_s"])))
    _table(rows)


# ------------------------------------------------------------------------------------ serve


def _flops(text: str, option: str) -> float:
    """A peak compute figure: 989e12, 989T, 989 TFLOP/s, 989TFLOPS."""
    import re

    t = re.sub(r"\s*flop(s|/s)?\s*$", "", str(text).strip(), flags=re.IGNORECASE)
    return _parse("count", t, option, minimum=0, strict_min=True)


@_command("serve")
def serve(
    params: str = typer.Option(..., "--params", help="Parameters N of the model (70B, 69e9)."),
    layers: str = typer.Option(..., "--layers", help="Layers L."),
    hidden: str = typer.Option(..., "--hidden", help="Hidden size h."),
    kv_heads: str | None = typer.Option(None, "--kv-heads", help="Key/value heads H_kv (default: --heads)."),
    heads: str | None = typer.Option(None, "--heads", help="Query heads (default: hidden / head dim)."),
    head_dim: str | None = typer.Option(None, "--head-dim", help="Head dimension d (default: hidden / heads, or 128)."),
    dtype: str = typer.Option("fp16", "--dtype", help="Weights and KV cache: fp16, bf16, fp8 or fp32."),
    gpus: str = typer.Option(..., "--gpus", help="GPUs G to split into TP × PP × replicas."),
    gpu_memory: str = typer.Option(..., "--gpu-memory", help="Memory per GPU (80GB)."),
    bandwidth: str = typer.Option(..., "--bandwidth", help="Memory bandwidth per GPU (3.35TB/s)."),
    flops: str = typer.Option("989T", "--flops", help="Peak dense FLOP/s per GPU (default 989T: H100 SXM bf16)."),
    link_bandwidth: str = typer.Option("450GB/s", "--link-bandwidth",
                                       help="Tensor-parallel link inside a node, per direction (default 450GB/s)."),
    alpha: str = typer.Option("5us", "--alpha", help="Latency per all-reduce step inside a node (default 5us)."),
    internode_bandwidth: str = typer.Option("50GB/s", "--internode-bandwidth",
                                            help="Link between nodes (default 50GB/s = 400 Gb/s)."),
    internode_alpha: str = typer.Option("10us", "--internode-alpha", help="Latency between nodes (default 10us)."),
    gpus_per_node: str = typer.Option("8", "--gpus-per-node", help="GPUs per node (default 8)."),
    memory_util: float = typer.Option(0.9, "--memory-util", help="Share of GPU memory usable (default 0.9)."),
    prompt: str = typer.Option("2048", "--prompt", help="Prompt tokens per request (default 2048)."),
    output: str = typer.Option("2048", "--output", help="Output tokens per request (default 2048)."),
    ttft_slo: str = typer.Option(..., "--ttft-slo", help="Time-to-first-token target (1s, 500ms)."),
    tpot_slo: str = typer.Option(..., "--tpot-slo", help="Time-per-output-token target (50ms)."),
    max_batch: str = typer.Option("256", "--max-batch", help="Most sequences in flight per replica (default 256)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Serving planner: TP × PP × replicas ranked by throughput within the TTFT/TPOT targets.

    Enumerates every split of --gpus, rejects what does not fit (weights of the busiest stage plus
    one sequence's KV cache per GPU), estimates TTFT (prefill of one prompt) and TPOT (decode step of
    every stage in turn) with the roofline, the tensor-parallel all-reduces (2 per layer per token)
    and pipeline hops, picks the batch with the most tokens/s within the TPOT target, and ranks
    (lesson 7's planner; no queueing, ideal overlap).

    JSON keys: best (a configuration or null), accepted (configurations, best first), rejected (each
    with reason: shape, memory, ttft or tpot, and detail), inputs. A configuration has tp, pp,
    replicas, accepted, reason, detail, weights_per_gpu_bytes, usable_bytes, free_bytes,
    kv_per_seq_per_gpu_bytes (one sequence of prompt+output tokens), max_seqs (per replica, memory),
    batch (sequences in flight per replica), microbatches, microbatch_size, batch_limit (tpot, memory
    or max-batch), kv_per_gpu_bytes, ttft_s, tpot_s, tpot_at_1_s, stage_time_s, comm_per_token_s,
    hop_s, decode_bound (memory-bandwidth or compute), throughput_tokens_per_s (output tokens, all
    replicas), throughput_per_gpu, requests_per_s; values a rejection left uncomputed are null.
    """
    from ..lessons.lesson7 import formulas as f7
    from ..lessons.lesson7 import planner as pl

    N = _parse("count", params, "--params", minimum=0, strict_min=True)
    L = _int(layers, "--layers")
    h = _int(hidden, "--hidden")
    d = _int(head_dim, "--head-dim")
    a = _int(heads, "--heads")
    if a is None:
        d = d or 128
        if h % d:
            raise CliError(f"--hidden {h} is not a multiple of the head dimension {d}; give --heads")
        a = h // d
    if d is None:
        if h % a:
            raise CliError(f"--hidden {h} is not a multiple of --heads {a}; give --head-dim")
        d = h // a
    hkv = _int(kv_heads, "--kv-heads") if kv_heads is not None else a
    if a % hkv:
        raise CliError(f"--heads {a} is not a multiple of --kv-heads {hkv}")
    dt = _choice(dtype, ("fp16", "bf16", "fp8", "fp32"), "--dtype")
    if not 0 < memory_util <= 1:
        raise CliError(f"--memory-util: must be in (0, 1], got {memory_util:g}")
    model = pl.ModelSpec(params=N, layers=L, hidden=h, heads=a, kv_heads=hkv, head_dim=d,
                         dtype_bytes=f7.dtype_bytes(dt))
    hw = pl.Hardware(
        gpus=_int(gpus, "--gpus", maximum=4096),
        gpu_memory=_parse("bytes", gpu_memory, "--gpu-memory", minimum=0, strict_min=True),
        bandwidth=_parse("bandwidth", bandwidth, "--bandwidth", minimum=0, strict_min=True),
        flops=_flops(flops, "--flops"),
        link_bandwidth=_parse("bandwidth", link_bandwidth, "--link-bandwidth", minimum=0, strict_min=True),
        alpha=_parse("time", alpha, "--alpha", minimum=0),
        internode_bandwidth=_parse("bandwidth", internode_bandwidth, "--internode-bandwidth", minimum=0,
                                   strict_min=True),
        internode_alpha=_parse("time", internode_alpha, "--internode-alpha", minimum=0),
        gpus_per_node=_int(gpus_per_node, "--gpus-per-node"),
        memory_util=memory_util,
    )
    wl = pl.Workload(prompt=_int(prompt, "--prompt"), output=_int(output, "--output"),
                     ttft_slo=_parse("time", ttft_slo, "--ttft-slo", minimum=0, strict_min=True),
                     tpot_slo=_parse("time", tpot_slo, "--tpot-slo", minimum=0, strict_min=True),
                     max_batch=_int(max_batch, "--max-batch"))
    r = _call(pl.plan, model, hw, wl)
    inputs = {"params": N, "layers": L, "hidden": h, "heads": a, "kv_heads": hkv, "head_dim": d, "dtype": dt,
              "dtype_bytes": model.dtype_bytes, "gpus": hw.gpus, "gpu_memory_bytes": hw.gpu_memory,
              "bandwidth_bytes_per_s": hw.bandwidth, "flops": hw.flops,
              "link_bandwidth_bytes_per_s": hw.link_bandwidth, "alpha_s": hw.alpha,
              "internode_bandwidth_bytes_per_s": hw.internode_bandwidth, "internode_alpha_s": hw.internode_alpha,
              "gpus_per_node": hw.gpus_per_node, "memory_util": hw.memory_util, "prompt": wl.prompt,
              "output": wl.output, "ttft_slo_s": wl.ttft_slo, "tpot_slo_s": wl.tpot_slo, "max_batch": wl.max_batch}
    if as_json:
        _emit_json({"best": r["best"].as_dict() if r["best"] else None,
                    "accepted": [c.as_dict() for c in r["accepted"]],
                    "rejected": [c.as_dict() for c in r["rejected"]], "inputs": inputs})
        return
    u = _units()
    typer.echo(f"Serving {u.format_count(N)} parameters ({L} layers, h = {h}, {a} heads, {hkv} KV heads of {d}, "
               f"{dt}) on {hw.gpus} × {u.format_bytes(hw.gpu_memory)} at {u.format_bandwidth(hw.bandwidth)}")
    typer.echo(f"Requests: {wl.prompt:,} prompt + {wl.output:,} output tokens; targets TTFT ≤ "
               f"{u.format_time(wl.ttft_slo)}, TPOT ≤ {u.format_time(wl.tpot_slo)}")
    if r["accepted"]:
        typer.echo("\nWithin the targets, best first:")
        typer.echo(f"  {'#':>2}  {'TP×PP×R':<9} {'batch':>6} {'TTFT':>9} {'TPOT':>9} {'tokens/s':>10} "
                   f"{'per GPU':>8}  limited by")
        for i, c in enumerate(r["accepted"], 1):
            typer.echo(f"  {i:>2}  {f'{c.tp}×{c.pp}×{c.replicas}':<9} {c.batch:>6} {u.format_time(c.ttft_s):>9} "
                       f"{u.format_time(c.tpot_s):>9} {c.throughput_tokens_per_s:>10,.0f} "
                       f"{c.throughput_per_gpu:>8,.0f}  {c.batch_limit}")
    else:
        typer.echo("\nNo configuration meets both targets.")
    if r["rejected"]:
        typer.echo("\nRejected:")
        for c in r["rejected"]:
            typer.echo(f"  {f'{c.tp}×{c.pp}×{c.replicas}':<9} {c.reason:<6} {c.detail}")
    if r["best"]:
        b = r["best"]
        typer.echo(f"\n→ TP = {b.tp}, PP = {b.pp}, {b.replicas} replica{'s' if b.replicas > 1 else ''}: "
                   f"{b.batch} sequences in flight each, KV {u.format_bytes(b.kv_per_gpu_bytes)} + weights "
                   f"{u.format_bytes(b.weights_per_gpu_bytes)} per GPU; decode {b.decode_bound}-bound")
