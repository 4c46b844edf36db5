"""``distai doctor``: this machine's hardware, versions and bandwidth, with advice per lesson."""
from __future__ import annotations

import json

import typer

from .cli import CliError, app


def _gb_s(bps: float) -> str:
    return f"{bps / 1e9:.2f} GB/s"


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


@app.command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (sizes in bytes, bandwidths in bytes/s)."),
    quick: bool = typer.Option(False, "--quick", help="Smaller buffers: a few seconds instead of ~20."),
    ranks: int = typer.Option(None, "--ranks", help="Processes (or GPUs) for the all-reduce test (default: all GPUs, else 2)."),
) -> None:
    """What this machine has (CPUs, GPUs, interconnect, torch/NCCL/gloo) and how fast it moves bytes."""
    if ranks is not None and not 2 <= ranks <= 64:
        raise CliError(f"--ranks must be between 2 and 64, got {ranks}")
    from ..engine.doctor import diagnose

    report = diagnose(quick=quick, ranks=ranks)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    m = report["machine"]
    typer.echo(f"machine   {m['hostname']}  {m['platform']}")
    mem = f"{m['memory_bytes'] / (1 << 30):.1f} GiB" if m["memory_bytes"] else "?"
    typer.echo(f"cpus      {m['cpus_usable']} usable of {m['cpus']}  ({m['cpu_model'] or '?'}), memory {mem}")
    typer.echo(f"torch     {m['torch']}  cuda {m['cuda'] or '-'}  nccl {m['nccl'] or '-'}  "
               f"gloo {'yes' if m['gloo'] else 'no'}  python {m['python']}")
    if m["gpus"]:
        for g in m["gpus"]:
            typer.echo(f"gpu {g['index']}     {g['name']}  {g['memory_bytes'] / (1 << 30):.1f} GiB  sm_{g['capability']}")
        if m["topology"]:
            typer.echo("topology  (nvidia-smi topo -m: NV# = NVLink, PIX/PXB/PHB/SYS = PCIe paths)")
            for line in m["topology"].splitlines():
                typer.echo(f"          {line}")
    else:
        typer.echo("gpus      none (CUDA not available): experiments run as CPU processes with gloo")
    bw = report["bandwidth"]
    typer.echo(f"memcpy    {_gb_s(bw['host_memcpy_Bps'])}  (host to host)")
    typer.echo(f"loopback  {_gb_s(bw['loopback_tcp_Bps'])}  (TCP on 127.0.0.1, what gloo uses on one host)")
    ar = bw["allreduce"]
    typer.echo(f"allreduce {ar['backend']}, {ar['ranks']} ranks   (busbw = algbw · 2(N-1)/N, nccl-tests)")
    for r in ar["results"]:
        typer.echo(f"          {_size(r['bytes']):>8}  time {r['time_s'] * 1e3:8.2f} ms  "
                   f"algbw {_gb_s(r['algbw']):>11}  busbw {_gb_s(r['busbw']):>11}")
    link = ar["link"]
    typer.echo(f"link      alpha {link['alpha_s'] * 1e6:.1f} us, beta {link['beta_s_per_byte']:.3g} s/B "
               f"(= {_gb_s(1 / link['beta_s_per_byte']) if link['beta_s_per_byte'] else '-'})  "
               "(ping-pong between ranks 0 and 1; lesson 1's alpha-beta model)")
    typer.echo("advice")
    for a in report["advice"]:
        typer.echo(f"  {a['lesson']}: {a['command']}")
