"""`distai doctor` and `distai slurm`: real measurements, and a script SLURM would run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distai.engine.slurm import SlurmJob, sbatch_script
from distai.lessons.registry import all_lessons

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

DISTAI = [sys.executable, "-m", "distai.tutor.cli"]


def test_doctor_json_reports_machine_bandwidth_and_advice(tmp_path):
    env = {**os.environ, "DISTAI_HOME": str(tmp_path)}
    out = subprocess.run([*DISTAI, "doctor", "--quick", "--json"], capture_output=True, text=True,
                         env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    machine = report["machine"]
    assert machine["cpus"] == os.cpu_count()
    assert machine["torch"].split("+")[0] == __import__("torch").__version__.split("+")[0]
    bw = report["bandwidth"]
    assert bw["host_memcpy_Bps"] > 1e7 and bw["loopback_tcp_Bps"] > 1e6
    ar = bw["allreduce"]
    assert ar["backend"] in ("gloo", "nccl") and ar["ranks"] >= 2
    for row in ar["results"]:
        # nccl-tests: algbw = S/t, busbw = algbw * 2(N-1)/N
        assert row["algbw"] == pytest.approx(row["bytes"] / row["time_s"])
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (ar["ranks"] - 1) / ar["ranks"])
    link = ar["link"]  # lesson 1's alpha-beta model of one link: α from tiny messages, β from the slope
    assert link["alpha_s"] == link["small_s"] > 0 and link["beta_s_per_byte"] > 0
    assert link["alpha_s"] + link["beta_s_per_byte"] * (link["large_bytes"] - link["small_bytes"]) \
        == pytest.approx(link["large_s"])
    assert [a["lesson"] for a in report["advice"]] == [l.id for l in all_lessons()]


def test_doctor_rejects_bad_ranks():
    out = subprocess.run([*DISTAI, "doctor", "--ranks", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "--ranks" in out.stderr


def test_sbatch_script_launches_every_node_through_c10d():
    script = sbatch_script(SlurmJob("lesson5", nodes=4, gpus_per_node=8, partition="gpu", time="01:00:00",
                                    extra_args=["--schedule", "1f1b"]))
    assert "#SBATCH --nodes=4" in script and "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --time=01:00:00" in script
    assert "--ntasks=4 --ntasks-per-node=1" in script
    assert "run lesson5 --gpus 8 --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID" in script
    assert "--master-addr $MASTER_ADDR --master-port $MASTER_PORT" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "NCCL_DEBUG" in script and srun.endswith("--schedule 1f1b' || status=$?")
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_an_experiment_argument_with_a_space_reaches_every_node_whole():
    # the argument's own quotes closed the single quotes around `bash -c '…'`: "--sweep-max 1", and "MiB" became
    # bash's $0, so the options after it were lost
    import shlex

    script = sbatch_script(SlurmJob("lesson1", nodes=2, gpus_per_node=1, extra_args=["--sweep-max", "1 MiB",
                                                                                      "--note", "it's", "--lang", "en"]))
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    assert words[-2:] == ["||", "status=$?"]  # the timeline's hint follows, then the job ends with srun's status
    words = words[:-2]
    assert words[-3:-1] == ["bash", "-c"]
    inner = shlex.split(words[-1])  # as bash -c reads it on each node ($SLURM_NODEID still unexpanded here)
    assert inner[-6:] == ["--sweep-max", "1 MiB", "--note", "it's", "--lang", "en"]
    assert "$SLURM_NODEID" in words[-1]


def test_sbatch_master_addr_comes_from_the_node_list(tmp_path):
    """Run the script's own preamble with a fake `scontrol` and a fake node list."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text('#!/bin/bash\n[ "$1 $2" = "show hostnames" ] || exit 1\n'
                                       'echo "$3" | tr "," "\\n"\n')
    (fake_bin / "srun").write_text('#!/bin/bash\necho "MASTER=$MASTER_ADDR:$MASTER_PORT ARGS=$*"\n')
    for f in fake_bin.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(sbatch_script(SlurmJob("lesson1", nodes=2, gpus_per_node=4)))
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-a17,gpu-a18",
           "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2"}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "MASTER=gpu-a17:24242" in out.stdout  # 20000 + 4242 % 20000
    assert "--ntasks=2" in out.stdout


def test_a_cpu_job_runs_gloo_ranks_asks_no_gpu_and_names_the_merged_timeline(tmp_path):
    """--cpu-per-node: a CPU partition's job (or a first multi-node try without GPUs): distai run --cpu N on each
    node, a core per rank, no GPU asked; whatever srun's status, the job says how to export every node's timeline
    as one, and ends with that status."""
    script = sbatch_script(SlurmJob("lesson1", nodes=2, gpus_per_node=4, cpu=True))
    assert "--gpus-per-node" not in script and "NCCL" not in script and "#SBATCH --cpus-per-task=4" in script
    assert "run lesson1 --cpu 4 --nnodes $SLURM_NNODES" in script
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text('#!/bin/bash\necho "$3" | tr "," "\\n"\n')
    (fake_bin / "srun").write_text("#!/bin/bash\nexit 3\n")  # a node's run failed
    for f in fake_bin.iterdir():
        f.chmod(0o755)
    (tmp_path / "job.sh").write_text(script)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "cpu-1,cpu-2",
           "SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "RUN_DIR": "/scratch/r7"}
    out = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 3
    assert "timeline of every node: python3 -m distai.tutor.cli runs export /scratch/r7/node*" in out.stdout
    for extra, words in (([], "one of them"), (["--cpu-per-node", "2", "--gpus-per-node", "2"], "one of them"),
                         (["--cpu-per-node", "0"], "--cpu-per-node must be between 1 and 256")):
        done = subprocess.run([*DISTAI, "slurm", "1", "--nodes", "2", *extra], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


@pytest.mark.parametrize("bad", [dict(nodes=0), dict(gpus_per_node=0), dict(time="soon"), dict(partition="a b")])
def test_slurm_job_rejects_bad_values(bad):
    job = SlurmJob("lesson1", **{"nodes": 2, "gpus_per_node": 4, **bad})
    with pytest.raises(ValueError):
        sbatch_script(job)


def test_slurm_cli_one_line_errors(tmp_path):
    out = subprocess.run([*DISTAI, "slurm", "lesson11", "--nodes", "2", "--gpus-per-node", "4"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "valid lessons" in out.stderr
    target = tmp_path / "job.sbatch"
    out = subprocess.run([*DISTAI, "slurm", "pipeline", "--nodes", "2", "--gpus-per-node", "4", "-o", str(target)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and target.read_text().startswith("#!/bin/bash")
    # an option the experiment does not take is refused here, as `distai run` refuses it, not on the cluster;
    # `distai run`'s own options (--steps 5, --debug) and the experiment's (--iters 3) go into the script
    out = subprocess.run([*DISTAI, "slurm", "1", "--nodes", "2", "--gpus-per-node", "8", "--bogus"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--bogus" in out.stderr and out.stderr.count("\n") == 1 and not out.stdout
    out = subprocess.run([*DISTAI, "slurm", "1", "--nodes", "2", "--gpus-per-node", "8", "--steps", "5", "--debug",
                          "--iters", "3"], capture_output=True, text=True, timeout=120)
    # the options reach the script's `distai run`, and the language the command spoke (an audit found the
    # global `distai --lang es slurm` left it out)
    assert out.returncode == 0 and "--steps 5 --debug --iters 3 --lang " in out.stdout
    # the group's size the experiment's plan or shape refuses, refused here as `distai run` refuses it
    for argv, message in ((["capstone", "--nodes", "2", "--gpus-per-node", "4", "--dp", "3"],
                           "dp·tp·pp = 3·2·2 = 12 does not match the 8 ranks"),
                          (["lesson4", "--nodes", "1", "--gpus-per-node", "3"], "tp = 3 does not divide the 8 attention")):
        out = subprocess.run([*DISTAI, "slurm", *argv], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1 and not out.stdout
        # distai run's advice names --cpu and --gpus; here it also says where this script's ranks come from
        assert ("the ranks are --nodes × --gpus-per-node = " in out.stderr) == ("--cpu" in out.stderr), out.stderr
    # what the script sets on every node itself, and a value distai run would refuse on the cluster (the
    # script was written, exit 0, and failed hours later)
    for extra, message in ((["--cpu", "2"], "--cpu is for distai run on one machine"),
                           (["--nnodes=3"], "--nnodes is for distai run"), (["--run-dir", "/x"], "--run-dir is for"),
                           (["--steps", "abc"], "a whole number is needed, not 'abc'"),
                           (["--steps", "-5"], "--steps must be >= 0, got -5"),
                           (["--max-restarts", "500"], "--max-restarts must be between 0 and 100, got 500"),
                           (["--steps", "2000000"], "--steps must be at most 1,000,000")):
        out = subprocess.run([*DISTAI, "slurm", "1", "--nodes", "2", "--gpus-per-node", "4", *extra],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1 and not out.stdout, out


def test_sbatch_script_runs_a_real_two_node_job_on_this_machine(tmp_path):
    """The sbatch script itself, with fake `scontrol`/`srun` that start each "node" here: two
    torchrun agents (nnodes=2) meeting through c10d rendezvous on localhost, 2 CPU ranks each."""
    from distai.engine.testing import free_port

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text('#!/bin/bash\necho "$3" | tr "," "\\n"\n')
    # srun: one task per node, SLURM_NODEID set as SLURM would; fails if any task fails.
    (fake_bin / "srun").write_text(
        '#!/bin/bash\nntasks=1; for a in "$@"; do case $a in --ntasks=*) ntasks=${a#--ntasks=};; esac; done\n'
        'cmd="${@: -1}"; pids=()\n'
        'for ((i=0; i<ntasks; i++)); do SLURM_NODEID=$i bash -c "$cmd" > "node$i.log" 2>&1 & pids+=($!); done\n'
        'rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done; exit $rc\n')
    for f in fake_bin.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(SlurmJob("lesson1", nodes=2, gpus_per_node=2,
                                             extra_args=["--steps", "3", "--no-sweep", "--trace", "none"])))
    path = f"{fake_bin}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_JOB_ID": "77",
           "SLURM_NNODES": "2", "MASTER_PORT": str(free_port()), "RUN_DIR": str(tmp_path / "runs"),
           "DISTAI_HOME": str(tmp_path / "home"), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    logs = "\n".join((tmp_path / f"node{i}.log").read_text() for i in range(2) if (tmp_path / f"node{i}.log").exists())
    assert out.returncode == 0, out.stdout + out.stderr + logs
    summaries = []
    for node in range(2):
        record = json.loads((tmp_path / "runs" / f"node{node}" / "run.json").read_text())
        assert record["status"] == "ok", record
        assert "--rdzv-backend" in record["command"] and "c10d" in record["command"]
        for events in (tmp_path / "runs" / f"node{node}" / "events").glob("rank*.jsonl"):
            summaries += [json.loads(l) for l in events.read_text().splitlines() if '"summary"' in l]
    # One group of 2 nodes x 2 ranks: world size 4, one summary from global rank 0.
    assert [s["n"] for s in summaries] == [4]


def test_slurm_o_replaces_a_file_only_with_force_and_never_chmods_a_device(tmp_path, capsys):
    """`-o FILE` overwrote any file and `chmod 755`ed whatever it named: a private 600 file became 755, and
    `-o /dev/null` as root took the device's write permission from every other user."""
    import stat as st

    from distai.tutor.cli import main

    notes = tmp_path / "notes.sh"
    notes.write_text("my notes\n")
    notes.chmod(0o600)
    argv = ["slurm", "lesson1", "--nodes", "2", "--cpu-per-node", "2", "-o", str(notes)]
    assert main(argv) == 2 and notes.read_text() == "my notes\n" and st.S_IMODE(notes.stat().st_mode) == 0o600
    assert capsys.readouterr().err.startswith(f"distai: error: {notes} already exists; pass --force")
    assert main([*argv, "--force"]) == 0 and notes.read_text().startswith("#!/bin/bash")
    assert st.S_IMODE(notes.stat().st_mode) == 0o755
    assert main(["slurm", "lesson1", "--nodes", "2", "--cpu-per-node", "2", "-o", "/dev/full"]) == 1  # not usage
    capsys.readouterr()
    # a folder is a wrong path (2), as `runs export -o FOLDER` says; it exited 1, as for a full disk
    assert main(["slurm", "lesson1", "--nodes", "2", "--cpu-per-node", "2", "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"distai: error: cannot write {tmp_path}: it is a folder\n"
    if os.geteuid() == 0:  # a device node of our own, as /dev/null is
        device = tmp_path / "null"
        os.mknod(device, 0o666 | st.S_IFCHR, os.makedev(1, 3))
        device.chmod(0o666)
        assert main(["slurm", "lesson1", "--nodes", "2", "--cpu-per-node", "2", "-o", str(device)]) == 0
        assert st.S_ISCHR(device.stat().st_mode) and st.S_IMODE(device.stat().st_mode) == 0o666
