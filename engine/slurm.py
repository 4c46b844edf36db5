"""``distai slurm``: an sbatch script that runs a lesson's experiment on K nodes × G GPUs (NCCL), or K nodes ×
N CPU processes (gloo: a cluster's CPU partition, or a first try of the multi-node path without GPUs).

One ``srun`` task per node starts ``distai run`` there with the multi-node flags, which
``distai run`` passes unchanged to torchrun: every node's agent meets the others through
torchrun's c10d rendezvous at ``MASTER_ADDR:MASTER_PORT`` (the first host of the allocation),
the rendezvous id being the job id so that two jobs never join each other.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ..lessons.strings import TranslatedError

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")


class SlurmError(TranslatedError):
    """A job SLURM would refuse (a ValueError): one line in every language (``text(lang)``,
    ``lessons/catalog/cli.toml``'s ``slurm_says.errors``)."""

    area = "cli"


@dataclass
class SlurmJob:
    lesson_id: str
    nodes: int
    gpus_per_node: int
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    port: int | None = None  # default: derived from the job id (see below)
    python: str = "python3"
    extra_args: list[str] = field(default_factory=list)
    cpu: bool = False  # gpus_per_node counts CPU processes (gloo), and the job asks for no GPU

    def validate(self) -> None:
        """Raises :class:`SlurmError` (a ValueError) for a value SLURM or torchrun would refuse."""
        if not 1 <= self.nodes <= 4096:
            raise SlurmError.keyed("slurm_says.errors.nodes", value=self.nodes)
        if self.cpu and not 1 <= self.gpus_per_node <= 256:
            raise SlurmError.keyed("slurm_says.errors.cpu_per_node", value=self.gpus_per_node)
        if not self.cpu and not 1 <= self.gpus_per_node <= 64:
            raise SlurmError.keyed("slurm_says.errors.gpus_per_node", value=self.gpus_per_node)
        if self.time is not None and not _TIME.match(self.time):
            raise SlurmError.keyed("slurm_says.errors.time", value=repr(self.time))
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise SlurmError.keyed("slurm_says.errors.port", value=self.port)
        for name, value in (("partition", self.partition), ("account", self.account)):
            if value is not None and not re.fullmatch(r"[\w.,-]+", value):
                raise SlurmError.keyed("slurm_says.errors.characters", name=name, value=repr(value))


def sbatch_script(job: SlurmJob) -> str:
    job.validate()
    ranks = "CPU processes (gloo)" if job.cpu else "GPU ranks"
    directives = [
        f"#SBATCH --job-name=distai-{job.lesson_id}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node=1            # one torchrun agent per node; it starts the {ranks}",
        *([] if job.cpu else [f"#SBATCH --gpus-per-node={job.gpus_per_node}"]),
        # a CPU rank computes with its own core (distai run splits a node's cores among its ranks)
        f"#SBATCH --cpus-per-task={job.cpus_per_task or (job.gpus_per_node if job.cpu else max(4, 8 * job.gpus_per_node))}",
        "#SBATCH --output=distai-%x-%j.out",
    ]
    if job.partition:
        directives.append(f"#SBATCH --partition={job.partition}")
    if job.time:
        directives.append(f"#SBATCH --time={job.time}")
    if job.account:
        directives.append(f"#SBATCH --account={job.account}")
    port = str(job.port) if job.port else "$((20000 + SLURM_JOB_ID % 20000))"
    extra = " ".join(shlex.quote(a) for a in job.extra_args)
    run_cmd = (f"{job.python} -m distai.tutor.cli run {job.lesson_id} --{'cpu' if job.cpu else 'gpus'} {job.gpus_per_node} "
               f"--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID "
               f"--master-addr $MASTER_ADDR --master-port $MASTER_PORT "
               f"--rdzv-backend c10d --rdzv-id $SLURM_JOB_ID --run-dir \"$RUN_DIR/node$SLURM_NODEID\"" + (f" {extra}" if extra else ""))
    return "\n".join([
        "#!/bin/bash",
        *directives,
        "#",
        f"# Written by `distai slurm {job.lesson_id}`. Submit with: sbatch <this file>",
        "set -euo pipefail",
        "",
        "# The first host of the allocation hosts torchrun's c10d rendezvous.",
        'nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )',
        'export MASTER_ADDR="${nodes[0]}"',
        f'export MASTER_PORT="${{MASTER_PORT:-{port}}}"   # from the job id: two jobs never collide',
        'export RUN_DIR="${RUN_DIR:-$PWD/distai-runs/$SLURM_JOB_ID}"',
        "",
        *(["# Debugging aids: collectives checked, and errors instead of hangs."] if job.cpu else [
            "# Debugging aids: NCCL's init and network choices, and errors instead of hangs.",
            "export NCCL_DEBUG=${NCCL_DEBUG:-INFO}",
            "export NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}",
            "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1"]),
        "export TORCH_DISTRIBUTED_DEBUG=${TORCH_DISTRIBUTED_DEBUG:-INFO}",
        "export PYTHONUNBUFFERED=1",
        "",
        'echo "distai: ${#nodes[@]} nodes (${nodes[*]}), rendezvous at $MASTER_ADDR:$MASTER_PORT"',
        "",
        "# One task per node; SLURM_NODEID is expanded on each node, hence the single quotes.",
        # shlex.quote of the whole command: an experiment argument's own quotes ('1 MiB') survive inside it
        f"srun --kill-on-bad-exit=1 --ntasks={job.nodes} --ntasks-per-node=1 bash -c {shlex.quote(run_cmd)} "
        "|| status=$?",
        "",
        "# Every node's run has its folder, a failed one's too; one timeline of them all, for Perfetto:",
        f'echo "distai: timeline of every node: {job.python} -m distai.tutor.cli runs export $RUN_DIR/node*"',
        'exit "${status:-0}"',
        "",
    ])
