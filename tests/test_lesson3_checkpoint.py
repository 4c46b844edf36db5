"""Lesson 3's checkpoints: a writer killed at random moments never leaves a partial checkpoint that
gets loaded; corrupt checkpoints are detected and the previous good one is used; and, in one
group of 2 gloo processes, DCP's two pitfalls, a DCP round trip of per-rank RNG, optimizer,
scheduler, scaler and sampler state, and exact resumption (== losses) in both forms — which fails
when a piece of the state is left out."""
from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distai.engine import checkpoint as ck
from distai.engine.testing import run_in_group

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another

REPO = Path(__file__).resolve().parents[1]
NAMES = ("shared.pt", "rank0.pt", "rank1.pt")


def payload(step: int, name: str) -> bytes:
    """What the writer writes for ``name`` at ``step``: 50-180 KB that identify both."""
    return hashlib.sha256(f"{step}/{name}".encode()).digest() * (1600 + 700 * (step % 7))


WRITER = r"""
import hashlib, os, sys
from distai.engine.checkpoint import CheckpointFolder, write_checked
NAMES = ("shared.pt", "rank0.pt", "rank1.pt")
def payload(step, name):
    return hashlib.sha256(f"{step}/{name}".encode()).digest() * (1600 + 700 * (step % 7))
root = sys.argv[1]
folder = CheckpointFolder(root)
stale = folder.clean_stale()
found = folder.latest_valid()
print("start", found.step or 0, len([s for s in stale if s.startswith(".tmp-step")]), flush=True)
step = (found.step or 0) + 1
while True:
    tmp = folder.begin(step)
    files = {name: write_checked(tmp / name, payload(step, name)) for name in NAMES}
    folder.publish(step, files, {"form": "file", "world_size": 2})
    folder.prune(3)
    write_checked(os.path.join(root, "latest.bin"), payload(step, "latest"))
    print("published", step, flush=True)
    step += 1
"""


def _check_folder(root: Path, published: int) -> dict:
    """After a kill: the newest good checkpoint is at least the last one reported published,
    every published folder verifies, and its bytes are exactly that step's."""
    folder = ck.CheckpointFolder(root)
    found = folder.latest_valid()
    assert found.skipped == [], found.skipped  # a kill never leaves a published checkpoint that fails
    if published:
        assert found.step is not None and found.step >= published
    for step, path in folder.complete():
        folder.verify(path)
        for name in NAMES:
            assert ck.read_checked(path / name) == payload(step, name)
    if (root / "latest.bin").exists():
        data = ck.read_checked(root / "latest.bin")  # complete: one whole version, never a mix
        assert data in {payload(s, "latest") for s in range(1, published + 2)}
    return {"step": found.step}


def test_writer_killed_at_random_moments_never_leaves_a_loadable_partial_checkpoint(tmp_path):
    rng = random.Random(3)
    root = tmp_path / "checkpoints"
    kills, stale_seen, progress = 40, 0, []
    for i in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=REPO)
        first = proc.stdout.readline().decode().split()  # "start <step> <stale tmp folders>"
        assert first and first[0] == "start", proc.stderr.read().decode()
        stale_seen += int(first[2])
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # the last piece after the final newline may be a line the kill tore: only whole lines count
        lines = proc.stdout.read().decode().split("\n")[:-1]
        steps = [int(x.split()[1]) for x in lines if x.startswith("published")]
        published = steps[-1] if steps else int(first[1])
        progress.append(_check_folder(root, published)["step"] or 0)
    assert progress[-1] > kills // 2, "the writer made almost no progress between kills"
    assert progress == sorted(progress), "a kill lost a checkpoint that had been published"
    # kills landed in the middle of writes (a stale temporary folder was found at the next start)
    assert stale_seen >= kills // 4, stale_seen


def _three_checkpoints(root: Path) -> ck.CheckpointFolder:
    folder = ck.CheckpointFolder(root)
    for step in (5, 10, 15):
        tmp = folder.begin(step)
        files = {name: ck.write_checked(tmp / name, payload(step, name)) for name in NAMES}
        folder.publish(step, files, {"form": "file", "world_size": 2})
    return folder


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,reason", [
    (lambda p: _flip(p / "rank1.pt", 5000), "checksum mismatch"),
    (lambda p: _flip(p / "shared.pt", 3), "checksum mismatch"),
    (lambda p: (p / "rank0.pt").write_bytes((p / "rank0.pt").read_bytes()[:-100]), "truncated"),
    (lambda p: (p / "rank0.pt").unlink(), "missing"),
    (lambda p: (p / ck.MANIFEST).unlink(), "no manifest.json"),
    (lambda p: (p / ck.MANIFEST).write_text((p / ck.MANIFEST).read_text().replace('"step": 15', '"step": 16')),
     "manifest.json checksum mismatch"),
    (lambda p: (p / ck.MANIFEST).write_text("{not json"), "unreadable manifest.json"),
])
def test_a_corrupt_checkpoint_is_detected_and_the_previous_good_one_used(tmp_path, damage, reason):
    folder = _three_checkpoints(tmp_path)
    newest = folder.final(15)
    damage(newest)
    found = folder.latest_valid(set_aside=True)
    assert found.step == 10
    assert found.skipped and found.skipped[0][0] == "step_00000015" and reason in found.skipped[0][1]
    assert not newest.exists() and newest.with_name(newest.name + ck.CORRUPT_SUFFIX).is_dir()  # kept aside
    assert folder.latest_valid().step == 10  # and never considered again
    # a new checkpoint of the same step can still be published
    tmp = folder.begin(15)
    files = {name: ck.write_checked(tmp / name, payload(15, name)) for name in NAMES}
    folder.publish(15, files)
    assert folder.latest_valid().step == 15


def test_framing_detects_every_kind_of_damage():
    data = ck.frame(b"x" * 1000)
    assert ck.unframe(data) == b"x" * 1000
    for bad, reason in [(data[:20], "truncated"), (data[:-1], "truncated"), (data + b"!", "extended"),
                        (b"NOTDISTA" + data[8:], "bad magic"),
                        (data[:60] + bytes([data[60] ^ 1]) + data[61:], "checksum mismatch")]:
        with pytest.raises(ck.CorruptCheckpoint, match=reason):
            ck.unframe(bad)


def test_pruning_and_stale_cleanup(tmp_path):
    folder = _three_checkpoints(tmp_path)
    (tmp_path / ".tmp-step_00000020").mkdir()
    (tmp_path / ".trash-step_00000001").mkdir()
    assert sorted(folder.clean_stale()) == [".tmp-step_00000020", ".trash-step_00000001"]
    assert folder.prune(2) == ["step_00000005"]
    assert [s for s, _ in folder.complete()] == [15, 10]


# ------------------------------------------------------------------------------------ in a group
def _trainer_args(**over):
    from distai.engine.experiments.lesson3 import parse_args

    argv = ["--steps", "12", "--hidden", "32", "--layers", "1", "--seq", "8", "--samples", "512", "--batch", "8",
            "--warmup", "3"]
    for k, v in over.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parse_args(argv)


def _run(rank, world, args, root=None, stop_at=None, resume_skip=None, form="file"):
    """Train ``args.steps`` steps; with ``root`` and ``stop_at``, checkpoint at ``stop_at``, throw
    everything away (fresh objects, scrambled generators) and resume from the checkpoint."""
    import numpy as np
    import torch

    from distai.engine.experiments.lesson3 import Trainer, build, make_data

    cpu = torch.device("cpu")
    state = build(args, rank, world, cpu)
    trainer = Trainer(args, state, make_data(args), rank, world, cpu)
    losses = []
    while state.step < args.steps:
        losses.append(trainer.step())
        if root is not None and state.step == stop_at:
            if form == "dcp-async":  # async_save: training goes on while it is written, and must not leak into it
                saver = ck.Checkpointer(root, rank, world, form="dcp")
                saver.save_async(state)
                for _ in range(3):
                    trainer.step()
                assert saver.wait().step == stop_at
            else:
                ck.Checkpointer(root, rank, world, form=form).save(state)
            state = build(args, rank, world, cpu)  # a new process would start like this...
            torch.manual_seed(999 + rank)  # ...with its generators wherever they happen to be
            np.random.seed(999 + rank)
            random.seed(999 + rank)
            info = ck.Checkpointer(root, rank, world, form=form.removesuffix("-async")).resume(
                state, skip=resume_skip or ())
            assert info.step == stop_at
            trainer = Trainer(args, state, make_data(args), rank, world, cpu)
    return losses


def _check_all(rank: int, world: int, tmp: str) -> dict:
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.utils.data import DistributedSampler

    from distai.engine.experiments.lesson3 import build
    from distai.engine.model import make_batch

    out: dict = {}
    tmp = Path(tmp)
    # -- pitfall 1: a per-rank tensor under one key keeps one rank's copy
    mine = torch.full((4,), float(rank + 1))
    dcp.save({"rng": mine.clone()}, checkpoint_id=str(tmp / "naive"))
    back = {"rng": torch.zeros(4)}
    dcp.load(back, checkpoint_id=str(tmp / "naive"))
    out["naive_saved"], out["naive_loaded"] = mine.tolist(), back["rng"].tolist()
    # -- pitfall 2: loading into a fresh optimizer's own state_dict() restores nothing
    args = _trainer_args()
    st = build(args, rank, world, torch.device("cpu"))
    st.model(*make_batch(args.model, 8)).backward()
    st.optimizer.step()
    dcp.save({"optim": st.optimizer.state_dict()}, checkpoint_id=str(tmp / "optim"))
    fresh = build(args, rank, world, torch.device("cpu"))
    target = {"optim": fresh.optimizer.state_dict()}
    dcp.load(target, checkpoint_id=str(tmp / "optim"))
    fresh.optimizer.load_state_dict(target["optim"])
    out["fresh_optimizer_entries"] = len(fresh.optimizer.state)
    out["trained_optimizer_entries"] = len(st.optimizer.state)

    # -- the Checkpointer's DCP form: per-rank RNG, optimizer, scheduler, scaler, sampler
    args = _trainer_args(amp="off")
    st = build(args, rank, world, torch.device("cpu"))
    st.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    from distai.engine.experiments.lesson3 import Trainer, make_data

    tr = Trainer(args, st, make_data(args), rank, world, torch.device("cpu"))
    for _ in range(5):
        tr.step()
    torch.rand(3), np.random.rand(3), random.random()  # generators somewhere mid-stream
    saved = {"torch": torch.random.get_rng_state().clone(), "numpy": np.random.get_state()[1].copy(),
             "python": random.getstate(), "exp_avg": [st.optimizer.state[p]["exp_avg"].clone()
                                                      for p in st.model.parameters()],
             "opt_step": [float(st.optimizer.state[p]["step"]) for p in st.model.parameters()],
             "sched": st.scheduler.last_epoch, "lr": st.scheduler.get_last_lr(), "scale": st.scaler.get_scale(),
             "sampler": st.sampler.state_dict(), "weights": [p.detach().clone() for p in st.model.parameters()]}
    info = ck.Checkpointer(tmp / "dcp", rank, world, form="dcp").save(st)
    out["dcp_files"] = sorted(os.listdir(info.path))
    new = build(args, rank, world, torch.device("cpu"))
    new.scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(12345), np.random.seed(12345), random.seed(12345)
    res = ck.Checkpointer(tmp / "dcp", rank, world, form="dcp").resume(new)
    out["dcp_resumed_step"], out["dcp_form"] = res.step, res.form
    out["dcp_rng_torch"] = torch.equal(torch.random.get_rng_state(), saved["torch"])
    out["dcp_rng_numpy"] = bool(np.array_equal(np.random.get_state()[1], saved["numpy"]))
    out["dcp_rng_python"] = random.getstate() == saved["python"]
    out["rng_digest"] = hashlib.sha256(saved["torch"].numpy().tobytes()).hexdigest()
    out["dcp_exp_avg"] = all(torch.equal(new.optimizer.state[p]["exp_avg"], e)
                             for p, e in zip(new.model.parameters(), saved["exp_avg"]))
    out["dcp_opt_step"] = [float(new.optimizer.state[p]["step"]) for p in new.model.parameters()] == saved["opt_step"]
    out["dcp_weights"] = all(torch.equal(p, w) for p, w in zip(new.model.parameters(), saved["weights"]))
    out["dcp_sched"] = (new.scheduler.last_epoch, new.scheduler.get_last_lr()) == (saved["sched"], saved["lr"])
    out["dcp_scale"] = (new.scaler.get_scale(), saved["scale"])
    out["dcp_sampler"] = new.sampler.state_dict() == saved["sampler"]

    # -- the sampler's order is DistributedSampler's
    s = ck.ResumableSampler(100, world, rank, seed=7)
    ds = DistributedSampler(range(100), num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=True)
    ds.set_epoch(1)
    batches = [s.next_batch(10) for _ in range(10)]  # 50 per rank per epoch: epochs 0, then 1
    out["sampler_epoch1"] = sum(batches[5:], []) == list(iter(ds))

    # -- exact resume, both forms; and what forgetting each piece does
    args = _trainer_args()
    ref = _run(rank, world, args)
    out["reference"] = ref
    out["file_resume"] = _run(rank, world, args, tmp / "ck_file", stop_at=5)
    out["dcp_resume"] = _run(rank, world, args, tmp / "ck_dcp", stop_at=5, form="dcp")
    out["dcp-async_resume"] = _run(rank, world, args, tmp / "ck_dcp_async", stop_at=5, form="dcp-async")
    for part in ("rng.torch", "rng.numpy", "rng.python", "sampler", "optimizer", "scheduler"):
        out[f"forget_{part}"] = _run(rank, world, args, tmp / f"ck_forget_{part}", stop_at=5, resume_skip=[part])
    return out


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("group")
    return run_in_group(_check_all, 2, str(tmp), timeout_s=300)


def test_dcp_pitfall_same_key_on_every_rank_keeps_one_copy(group):
    saved = [r["naive_saved"] for r in group]
    loaded = [r["naive_loaded"] for r in group]
    assert saved[0] != saved[1]
    assert loaded[0] == loaded[1] and loaded[0] in saved  # both ranks got the same rank's copy


def test_dcp_pitfall_fresh_optimizer_state_dict_restores_nothing(group):
    for r in group:
        assert r["trained_optimizer_entries"] > 0
        assert r["fresh_optimizer_entries"] == 0


def test_dcp_round_trip_restores_per_rank_rng_optimizer_scheduler_scaler_sampler(group):
    for r in group:
        assert r["dcp_resumed_step"] == 5 and r["dcp_form"] == "dcp"
        assert r["dcp_rng_torch"] and r["dcp_rng_numpy"] and r["dcp_rng_python"]
        assert r["dcp_exp_avg"] and r["dcp_opt_step"] and r["dcp_weights"]
        assert r["dcp_sched"] and r["dcp_sampler"]
        assert r["dcp_scale"][0] == r["dcp_scale"][1] and r["dcp_scale"][1] != 2.0 ** 16
        assert ".metadata" in r["dcp_files"] and ck.MANIFEST in r["dcp_files"]
        assert {"__0_0.distcp", "__1_0.distcp"} <= set(r["dcp_files"])
    assert group[0]["rng_digest"] != group[1]["rng_digest"]  # each rank got its own generator back


def test_sampler_follows_distributed_sampler(group):
    assert all(r["sampler_epoch1"] for r in group)


@pytest.mark.parametrize("form", ["file", "dcp", "dcp-async"])
def test_resume_is_exact(group, form):
    for r in group:
        assert len(r["reference"]) == 12
        assert r[f"{form}_resume"] == r["reference"]  # ==, every loss, bit for bit


@pytest.mark.parametrize("part", ["rng.torch", "rng.numpy", "rng.python", "sampler", "optimizer", "scheduler"])
def test_forgetting_any_piece_of_state_breaks_exactness(group, part):
    r = group[0]
    assert r[f"forget_{part}"][:5] == r["reference"][:5]
    assert r[f"forget_{part}"][5:] != r["reference"][5:]
