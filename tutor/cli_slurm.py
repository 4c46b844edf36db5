"""``distai slurm``: write an sbatch script for a lesson's experiment on a SLURM cluster."""
from __future__ import annotations

from pathlib import Path

import typer

from ..lessons.strings import os_error_text, translated
from .cli import (
    HELP,
    LESSON_HELP,
    CliError,
    app,
    lang_option,
    language_or_fail,
    lesson_or_fail,
    metavar,
    write_failure_code,
    write_named_file,
)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, help=HELP["slurm"])
def slurm(
    ctx: typer.Context,
    lesson: str = typer.Argument(..., help=LESSON_HELP, metavar=metavar("lesson")),
    nodes: int = typer.Option(..., "--nodes", metavar=metavar("int"), help=HELP["slurm_nodes"]),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", metavar=metavar("int"), help=HELP["slurm_gpus_per_node"]),
    cpu_per_node: int | None = typer.Option(None, "--cpu-per-node", metavar=metavar("int"), help=HELP["slurm_cpu_per_node"]),
    partition: str | None = typer.Option(None, "--partition", metavar=metavar("name"), help=HELP["slurm_partition"]),
    time: str | None = typer.Option(None, "--time", metavar=metavar("time"), help=HELP["slurm_time"]),
    account: str | None = typer.Option(None, "--account", metavar=metavar("name"), help=HELP["slurm_account"]),
    port: int | None = typer.Option(None, "--port", metavar=metavar("port"), help=HELP["slurm_port"]),
    output: Path | None = typer.Option(None, "--output", "-o", metavar=metavar("file"), help=HELP["slurm_output"]),
    force: bool = typer.Option(False, "--force", help=HELP["slurm_force"]),
    lang: str | None = lang_option(),
) -> None:
    # the script itself is for SLURM and stays English; what the terminal shows is in the learner's language
    language = language_or_fail(lang)
    chosen = lesson_or_fail(lesson, language)
    if not chosen.experiment:
        raise CliError(translated("cli", "slurm_says.no_experiment", language, lesson=chosen.id))
    from ..engine.slurm import SlurmError, SlurmJob, sbatch_script

    if (gpus_per_node is None) == (cpu_per_node is None):
        raise CliError(translated("cli", "slurm_says.errors.per_node", language))
    cpu = cpu_per_node is not None
    per_node = cpu_per_node if cpu_per_node is not None else gpus_per_node
    assert per_node is not None

    run_params, experiment_args = _run_options(ctx, lesson, language)
    # distai run's own checks of its values, as it makes them on the cluster (--steps -5, --max-restarts 500)
    from .cli_run import checked_restarts, steps_args

    checked_restarts(chosen, run_params.get("max_restarts"), language)
    experiment_args = steps_args(run_params.get("steps"), language) + experiment_args
    # the group's size and the options, refused here as `distai run` would refuse them on the cluster, hours
    # later: the experiment's plan (dp·tp·pp must be the ranks) and what its ranks would refuse
    from ..lessons.strings import TranslatedError
    from .cli_run import refuse_what_the_ranks_would

    plan, world = chosen.launch_plan_function(), nodes * per_node
    # the refusals are distai run's, whose advice names --cpu and --gpus: here the ranks come from the nodes
    ranks_here = translated("cli", "slurm_says.ranks_here", language, nodes=nodes, gpus=per_node, world=world,
                            flag="--cpu-per-node" if cpu else "--gpus-per-node")
    try:
        if plan is not None and nodes > 0 and per_node > 0:
            plan(experiment_args, world, chosen.ranks, not cpu)
        if world > 0:
            refuse_what_the_ranks_would(chosen, experiment_args, world, language)
    except TranslatedError as exc:
        raise CliError(_with_ranks_here(exc.text(language), ranks_here)) from None
    except CliError as exc:
        raise CliError(_with_ranks_here(str(exc), ranks_here), exc.code) from None
    except ValueError as exc:
        raise CliError(_with_ranks_here(str(exc), ranks_here)) from None
    # the language the learner reads here (--lang here or before the command, DISTAI_LANG, the locale) is the
    # one the script's ranks write their summaries in
    extra = [*ctx.args, "--lang", language]
    job = SlurmJob(chosen.id, nodes, per_node, partition=partition, time=time, account=account,
                   port=port, extra_args=extra, cpu=cpu)
    try:
        script = sbatch_script(job)
    except SlurmError as exc:
        raise CliError(exc.text(language)) from None
    if output is None:
        typer.echo(script, nl=False)
        return
    try:
        _write_script(output, script, force, language)
    except OSError as exc:
        raise CliError(translated("cli", "slurm_says.cannot_write", language, path=output,
                                  why=os_error_text(exc, language)), code=write_failure_code(exc)) from None
    typer.echo(translated("cli", "slurm_says.wrote", language, path=output), err=True)


def _write_script(output: Path, script: str, force: bool, language: str) -> None:
    """The script into ``output`` as ``runs export -o`` writes (a regular file replaced only with ``--force``),
    then made executable; a device or a pipe is never ``chmod``ed (a ``chmod 755`` of ``/dev/null`` as root
    took its write permission from every other user)."""
    exists = lambda: CliError(translated("cli", "runs.errors.exists", language, path=output))  # noqa: E731
    if write_named_file(output, script, force, exists):
        output.chmod(0o755)


#: ``distai run``'s options the script sets on every node itself (or that one node's run cannot share)
SCRIPT_SETS = ("gpus", "cpu", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_id",
               "run_dir")


def _run_options(ctx: typer.Context, lesson: str, lang: str) -> tuple[dict, list[str]]:
    """``ctx.args`` as ``distai run`` parses them (click's own parse, their types checked as ``distai run``
    checks them: ``--steps abc`` is refused here, not on the cluster): ``distai run``'s own values, and what
    reaches the experiment. What the script decides for every node is not the learner's to give (the cluster
    would refuse it: ``--cpu`` beside the script's ``--gpus``, one ``--run-dir`` for every node, an
    ``--nnodes`` that is not SLURM's): given on the command line, it is refused."""
    root = ctx.find_root()
    run = root.command.get_command(root, "run")  # type: ignore[attr-defined]
    made = run.make_context("run", [lesson, *ctx.args], parent=root)
    for param in run.params:  # by the source's name: recent Typer vendors click's enum as typer._click's
        source = made.get_parameter_source(param.name)
        if param.name in SCRIPT_SETS and source is not None and source.name == "COMMANDLINE":
            raise CliError(translated("cli", "slurm_says.errors.script_sets", lang, flag=param.opts[0]))
    return made.params, made.args


def _with_ranks_here(refusal: str, ranks_here: str) -> str:
    """A refusal whose advice is distai run's ("run with --cpu 12") also says where this script's ranks come
    from; any other refusal (--microbatch-size 0, an unknown option) is left as it is."""
    return refusal + ranks_here if "--cpu" in refusal else refusal
