"""``distai slurm``: write an sbatch script for a lesson's experiment on a SLURM cluster."""
from __future__ import annotations

from pathlib import Path

import typer

from .cli import LESSON_HELP, CliError, app, lesson_or_fail


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def slurm(
    ctx: typer.Context,
    lesson: str = typer.Argument(..., help=LESSON_HELP),
    nodes: int = typer.Option(..., "--nodes", help="Number of nodes (K)."),
    gpus_per_node: int = typer.Option(..., "--gpus-per-node", help="GPUs per node (G): one rank each."),
    partition: str | None = typer.Option(None, "--partition", help="SLURM partition."),
    time: str | None = typer.Option(None, "--time", help="Time limit (e.g. 00:30:00)."),
    account: str | None = typer.Option(None, "--account", help="SLURM account."),
    port: int | None = typer.Option(None, "--port", help="Rendezvous port (default: from the job id)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the script here (default: stdout)."),
) -> None:
    """Write an sbatch script that runs LESSON's experiment with torchrun on every node.

    Extra arguments after the options go to the experiment unchanged.
    """
    chosen = lesson_or_fail(lesson)
    if not chosen.experiment:
        raise CliError(f"{chosen.id} has no experiment to run")
    from ..engine.slurm import SlurmJob, sbatch_script

    job = SlurmJob(chosen.id, nodes, gpus_per_node, partition=partition, time=time, account=account,
                   port=port, extra_args=list(ctx.args))
    try:
        script = sbatch_script(job)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if output is None:
        typer.echo(script, nl=False)
        return
    output.write_text(script)
    output.chmod(0o755)
    typer.echo(f"wrote {output}; submit it with: sbatch {output}", err=True)
