"""Checkpoints that resume a data-parallel run exactly, written so that no kill can corrupt them.

What an exact resume needs (:class:`TrainingState`): the model, the optimizer (Adam's moments
and step counts), the learning-rate scheduler, a loss scaler's state when there is one, the step,
each rank's own random number generators — torch (CPU and the current CUDA device), numpy and
Python's ``random`` (:func:`capture_rng` / :func:`restore_rng`) — and the data sampler's position
(:class:`ResumableSampler`: ``DistributedSampler``'s order for ``(seed, epoch)`` plus how many
samples this rank has consumed).

How a checkpoint is written (:class:`Checkpointer`), in a folder of checkpoints::

    .tmp-step_00000020/     while it is being written (never loaded; removed on the next start)
    step_00000020/          complete: the files below plus manifest.json, written last
        shared.pt           model, optimizer, scheduler, scaler, step, extra  (rank 0, "file" form)
        rank0.pt rank1.pt   each rank's RNG states and sampler position       ("file" form)
        .metadata __0_0.distcp __1_0.distcp …                                 ("dcp" form)
        manifest.json       step, form, world size, and every file's size and SHA-256

1. every rank writes its files into the temporary folder; each single file is written
   atomically (:func:`write_atomic`: temporary file, ``fsync``, ``rename``, ``fsync`` of the
   folder) and framed with its own SHA-256 (:func:`frame`);
2. the ranks send rank 0 the size and SHA-256 of what they wrote;
3. rank 0 writes ``manifest.json`` (atomically, with a checksum of its own), ``fsync``s the
   folder and renames it to ``step_…`` — the one atomic step that makes the checkpoint exist —
   and ``fsync``s the parent. Then older checkpoints beyond ``keep`` are removed, and a barrier
   lets every rank return once the checkpoint exists.

A kill at any moment leaves either the previous checkpoints untouched plus a stray ``.tmp-``
folder, or the new checkpoint complete. On resume, rank 0 takes the newest ``step_…`` whose
manifest and every file verify (sizes and SHA-256); a torn or corrupt one (flipped bytes,
truncated file, missing manifest) is renamed ``…corrupt`` — kept for inspection, never loaded —
and the previous good one is used. Rank 0 broadcasts its choice so every rank loads the same one.

:meth:`Checkpointer.save_async` writes the "dcp" form with ``torch.distributed.checkpoint.async_save``:
the state is staged (copied) before the call returns and written by a background thread, which
publishes it in the same way once every rank's files are written — until then it is a ``.tmp-``
folder, so a kill while the save is in flight falls back to the previous good checkpoint.

The "dcp" form writes the same state with ``torch.distributed.checkpoint`` (every rank writes
its own shard files in parallel; the model and optimizer go through
``torch.distributed.checkpoint.state_dict.get_state_dict``/``set_state_dict``). Two pitfalls it
avoids, both checked in ``tests/test_lesson3_checkpoint.py``:

* a tensor (or object) saved under the same key on every rank is taken as replicated and only
  one rank's copy is kept, so per-rank state lives under per-rank keys (``rank0``, ``rank1``, …);
* loading into a fresh optimizer's ``state_dict()`` restores nothing (a new Adam has no state
  entries to load into); ``get_state_dict`` builds the full structure first.

The byte-level layer (framing, atomic writes, manifests, finding the newest good checkpoint) does
not import torch, so a process that only writes bytes starts in a fraction of a second (the
kill-at-any-moment test starts one dozens of times).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .durable import TMP_PREFIX, fsync_dir, write_atomic

MAGIC = b"DISTAICK"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHQ32s")  # magic, version, payload length, SHA-256 of the payload
MANIFEST = "manifest.json"
STEP_PREFIX = "step_"
TRASH_PREFIX = ".trash-"
CORRUPT_SUFFIX = ".corrupt"
FORMS = ("file", "dcp")


class CorruptCheckpoint(Exception):
    """A checkpoint file or folder that fails verification (torn, truncated, flipped bytes)."""


# ------------------------------------------------------------------------------------ bytes on disk
def frame(payload: bytes) -> bytes:
    """``payload`` behind a header holding its length and SHA-256."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def unframe(data: bytes, what: str = "checkpoint file") -> bytes:
    """The payload of a framed file, or :class:`CorruptCheckpoint` saying what is wrong."""
    if len(data) < _HEADER.size:
        raise CorruptCheckpoint(f"{what}: truncated ({len(data)} bytes, shorter than its header)")
    magic, version, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptCheckpoint(f"{what}: not a distai checkpoint file (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptCheckpoint(f"{what}: format version {version}, expected {FORMAT_VERSION}")
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise CorruptCheckpoint(f"{what}: truncated or extended ({len(payload)} bytes, header says {length})")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"{what}: checksum mismatch (the bytes changed after writing)")
    return payload


def write_checked(path: str | os.PathLike, payload: bytes) -> dict:
    """Frame and write atomically; returns ``{"bytes", "sha256"}`` of the file as written."""
    data = frame(payload)
    write_atomic(path, data)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_checked(path: str | os.PathLike) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CorruptCheckpoint(f"{Path(path).name}: cannot read ({exc.strerror or exc})") from None
    return unframe(data, Path(path).name)


def file_digest(path: str | os.PathLike) -> dict:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


# ------------------------------------------------------------------------------------ folders
def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def _manifest_checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Found:
    """The newest good checkpoint, and the newer ones that were skipped (with why)."""

    step: int | None = None
    path: str | None = None
    manifest: dict | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)


class CheckpointFolder:
    """The byte-level side of a folder of step checkpoints (no torch): begin, publish, find, prune."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def tmp(self, step: int) -> Path:
        return self.root / f"{TMP_PREFIX}{step_name(step)}"

    def final(self, step: int) -> Path:
        return self.root / step_name(step)

    def begin(self, step: int) -> Path:
        """A fresh temporary folder for ``step`` (a stale one from a killed writer is removed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp(step)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp

    def publish(self, step: int, files: dict[str, dict], meta: dict | None = None) -> Path:
        """Write the manifest into the temporary folder and rename it into place (atomic)."""
        tmp, final = self.tmp(step), self.final(step)
        body = {"step": int(step), "files": dict(sorted(files.items())), "created": time.time(), **(meta or {})}
        manifest = {**body, "checksum": _manifest_checksum(body)}
        write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        fsync_dir(tmp)
        if final.exists():  # a checkpoint of this step judged bad earlier: keep it, aside
            final.rename(self._aside(final, CORRUPT_SUFFIX))
        os.rename(tmp, final)
        fsync_dir(self.root)
        return final

    def _aside(self, path: Path, suffix: str) -> Path:
        target = path.with_name(path.name + suffix)
        n = 1
        while target.exists():
            n += 1
            target = path.with_name(f"{path.name}{suffix}{n}")
        return target

    def complete(self) -> list[tuple[int, Path]]:
        """Published checkpoints (named ``step_N``), newest first — not yet verified."""
        found = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                name = p.name
                if p.is_dir() and name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX):].isdigit():
                    found.append((int(name[len(STEP_PREFIX):]), p))
        return sorted(found, reverse=True)

    @staticmethod
    def read_manifest(path: str | os.PathLike) -> dict:
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{path.name}: no {MANIFEST} (the write never finished)") from None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpoint(f"{path.name}: unreadable {MANIFEST} ({exc})") from None
        if not isinstance(manifest, dict) or "checksum" not in manifest or "files" not in manifest:
            raise CorruptCheckpoint(f"{path.name}: malformed {MANIFEST}")
        body = {k: v for k, v in manifest.items() if k != "checksum"}
        if _manifest_checksum(body) != manifest["checksum"]:
            raise CorruptCheckpoint(f"{path.name}: {MANIFEST} checksum mismatch")
        return manifest

    def verify(self, path: str | os.PathLike) -> dict:
        """The manifest of a checkpoint whose every file has the recorded size and SHA-256."""
        path = Path(path)
        manifest = self.read_manifest(path)
        for name, want in manifest["files"].items():
            f = path / name
            if not f.is_file():
                raise CorruptCheckpoint(f"{path.name}/{name}: missing")
            got = file_digest(f)
            if got["bytes"] != want["bytes"]:
                raise CorruptCheckpoint(f"{path.name}/{name}: {got['bytes']} bytes, expected {want['bytes']} (truncated?)")
            if got["sha256"] != want["sha256"]:
                raise CorruptCheckpoint(f"{path.name}/{name}: checksum mismatch (corrupted)")
        return manifest

    def latest_valid(self, set_aside: bool = False) -> Found:
        """The newest checkpoint that verifies; newer bad ones are skipped (and renamed
        ``…corrupt`` when ``set_aside``, so they are never considered again)."""
        found = Found()
        for step, path in self.complete():
            try:
                manifest = self.verify(path)
            except CorruptCheckpoint as exc:
                found.skipped.append((path.name, str(exc)))
                if set_aside:
                    path.rename(self._aside(path, CORRUPT_SUFFIX))
                continue
            found.step, found.path, found.manifest = step, str(path), manifest
            return found
        return found

    def clean_stale(self) -> list[str]:
        """Remove what killed writers left behind (temporary and half-deleted folders and files)."""
        removed = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                    removed.append(p.name)
        return removed

    def prune(self, keep: int) -> list[str]:
        """Keep the newest ``keep`` checkpoints; older ones are renamed away, then deleted."""
        removed = []
        for _step, path in self.complete()[max(1, keep):]:
            trash = self.root / f"{TRASH_PREFIX}{path.name}"
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(path.name)
        return removed


# ------------------------------------------------------------------------------------ RNG and data position
def capture_rng() -> dict:
    """This process's generator states: torch CPU (and the current CUDA device), numpy, Python."""
    import numpy as np
    import torch

    np_state: Any = np.random.get_state()  # the legacy tuple (the stubs also allow a dict)
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.random.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": int(py_version), "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def restore_rng(state: dict) -> None:
    import numpy as np
    import torch

    torch.random.set_rng_state(state["torch"].to(torch.uint8).cpu())
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].cpu().numpy().astype(np.uint32), int(n["pos"]),
                         int(n["has_gauss"]), float(n["cached_gaussian"])))
    p = state["python"]
    random.setstate((int(p["version"]), tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8).cpu(), torch.cuda.current_device())


class ResumableSampler:
    """This rank's share of a data set, epoch after epoch, resumable mid-epoch.

    The order of an epoch is ``torch.utils.data.DistributedSampler``'s (shuffled from
    ``seed + epoch``, tail dropped so every rank gets as many samples, rank r takes every
    world_size-th index from r). The state is ``(epoch, position)``: the samples this rank has
    consumed in the epoch, so a resume continues with exactly the next batch.
    """

    def __init__(self, size: int, world_size: int, rank: int, seed: int = 0):
        if size < world_size:
            raise ValueError(f"a data set of {size} samples cannot be shared by {world_size} ranks")
        self.size, self.world_size, self.rank, self.seed = size, world_size, rank, seed
        self.epoch = 0
        self.position = 0
        self._order: list[int] | None = None

    def order(self, epoch: int) -> list[int]:
        from torch.utils.data import DistributedSampler

        indices: Any = range(self.size)  # any sized sequence works (the stubs ask for a Dataset)
        sampler: DistributedSampler[int] = DistributedSampler(indices, num_replicas=self.world_size, rank=self.rank,
                                                              shuffle=True, seed=self.seed, drop_last=True)
        sampler.set_epoch(epoch)
        return list(iter(sampler))

    def next_batch(self, batch_size: int) -> list[int]:
        """The next ``batch_size`` indices (a batch never straddles two epochs)."""
        if self._order is None:
            self._order = self.order(self.epoch)
        if batch_size > len(self._order):
            raise ValueError(f"a batch of {batch_size} per rank is larger than an epoch ({len(self._order)})")
        if self.position + batch_size > len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self.order(self.epoch)
        batch = self._order[self.position:self.position + batch_size]
        self.position += batch_size
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "size": self.size, "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state: dict) -> None:
        if (state["size"], state["world_size"]) != (self.size, self.world_size):
            raise ValueError(f"sampler state for {state['size']} samples on {state['world_size']} ranks, "
                             f"not {self.size} on {self.world_size}")
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        self._order = None


# ------------------------------------------------------------------------------------ the training state
@dataclass
class TrainingState:
    """Everything a resume needs. ``extra`` holds small replicated values (e.g. the loss curve so
    far); it must be the same on every rank."""

    model: Any
    optimizer: Any
    scheduler: Any = None
    scaler: Any = None  # torch.amp.GradScaler (or anything with state_dict/load_state_dict)
    sampler: ResumableSampler | None = None
    step: int = 0
    extra: dict = field(default_factory=dict)

    def shared(self) -> dict:
        """The replicated part (the same on every rank of a data-parallel run)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "step": int(self.step), "extra": self.extra}

    def per_rank(self) -> dict:
        """What differs between ranks: the generators and the data position."""
        return {"rng": capture_rng(), "sampler": self.sampler.state_dict() if self.sampler is not None else None}

    def load_shared(self, shared: dict, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        if "model" not in skip:
            self.model.load_state_dict(shared["model"])
        if "optimizer" not in skip:
            self.optimizer.load_state_dict(shared["optimizer"])
        if self.scheduler is not None and shared.get("scheduler") is not None and "scheduler" not in skip:
            self.scheduler.load_state_dict(shared["scheduler"])
        if self.scaler is not None and shared.get("scaler") is not None and "scaler" not in skip:
            self.scaler.load_state_dict(shared["scaler"])
        self.step = int(shared["step"])
        self.extra = dict(shared.get("extra") or {})

    def load_per_rank(self, mine: dict, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        rng = dict(mine["rng"])
        if "rng" not in skip:
            for part in ("torch", "numpy", "python", "cuda"):
                if f"rng.{part}" in skip:
                    rng.pop(part, None)
            _restore_some(rng)
        if self.sampler is not None and mine.get("sampler") is not None and "sampler" not in skip:
            self.sampler.load_state_dict(mine["sampler"])


def _restore_some(rng: dict) -> None:
    """restore_rng for the parts present (the others keep their current state)."""
    current = capture_rng()
    current.update(rng)
    restore_rng(current)


def to_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------------------ collectives (or none)
def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def _broadcast(obj: Any, src: int = 0) -> Any:
    dist = _dist()
    if dist is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def _gather(obj: Any, group=None) -> list:
    dist = _dist()
    if dist is None:
        return [obj]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


# ------------------------------------------------------------------------------------ the checkpointer
@dataclass
class SaveInfo:
    step: int
    path: str
    bytes: int
    seconds: float  # the time the caller was blocked
    form: str
    pruned: list[str] = field(default_factory=list)
    written_s: float | None = None  # asynchronous saves: from the call until published
    published_t: float | None = None  # and the wall-clock time they were published


@dataclass
class ResumeInfo:
    step: int | None  # None: no good checkpoint, a fresh start
    path: str | None
    skipped: list[tuple[str, str]]
    seconds: float = 0.0
    form: str | None = None


class Checkpointer:
    """Save and resume a :class:`TrainingState` in ``root`` (collective: every rank calls)."""

    def __init__(self, root: str | os.PathLike, rank: int = 0, world_size: int = 1, form: str = "file",
                 keep: int = 3):
        if form not in FORMS:
            raise ValueError(f"unknown checkpoint form {form!r}; choose one of {', '.join(FORMS)}")
        if keep < 1:
            raise ValueError("keep at least one checkpoint")
        self.folder = CheckpointFolder(root)
        self.rank, self.world_size, self.form, self.keep = rank, world_size, form, keep
        self._pending: threading.Thread | None = None  # the asynchronous save in flight
        self._pending_info: SaveInfo | None = None
        self._async_error: BaseException | None = None
        self._group = None  # the background saves' own gloo group, made on the first one

    # -- save ----------------------------------------------------------------------------------
    def save(self, state: TrainingState) -> SaveInfo:
        t0 = time.perf_counter()
        step = int(state.step)
        if self.rank == 0:
            self.folder.begin(step)
        _barrier()
        tmp = self.folder.tmp(step)
        if self.form == "file":
            mine = {f"rank{self.rank}.pt": write_checked(tmp / f"rank{self.rank}.pt", to_bytes(state.per_rank()))}
            if self.rank == 0:
                mine["shared.pt"] = write_checked(tmp / "shared.pt", to_bytes(state.shared()))
        else:
            mine = self._dcp_save(state, tmp)
        info = SaveInfo(step, str(self.folder.final(step)), 0, 0.0, self.form)
        self._publish(info, mine, {"form": self.form, "world_size": self.world_size})
        _barrier()  # every rank returns once the checkpoint exists
        info.seconds = time.perf_counter() - t0
        return info

    # -- asynchronous save (torch.distributed.checkpoint.async_save) ---------------------------
    def save_async(self, state: TrainingState, on_written=None) -> SaveInfo:
        """Start a "dcp" checkpoint of ``state`` and return as soon as it is staged.

        ``async_save`` copies the state into CPU memory of its own (staging) before it returns,
        so training may change the weights at once; a background thread writes the shard files
        (the plan's collectives run on a gloo group of the checkpointer's own, never interleaved
        with the training's collectives), then gathers every rank's file digests on that group,
        and rank 0 publishes the manifest and renames the folder into place, as :meth:`save`
        does. Until then the checkpoint is a ``.tmp-`` folder that is never loaded: a kill while
        a save is in flight leaves the previous good checkpoint the newest. One save at a time:
        starting one first waits for the previous (that wait counts in the returned ``seconds``,
        the time the training was blocked). ``on_written(step)`` runs in the background thread
        once this rank's files are written, before they are published (fault injection).
        """
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        self.wait()
        step = int(state.step)
        if self.rank == 0:
            self.folder.begin(step)
        _barrier()
        tmp = self.folder.tmp(step)
        sd = self._dcp_state(state)
        group = self._async_group()
        kwargs = {"process_group": group} if group is not None else {}
        future = dcp.async_save(sd, checkpoint_id=str(tmp), **kwargs)
        info = SaveInfo(step, str(self.folder.final(step)), 0, 0.0, "dcp")

        def publish() -> None:
            try:
                future.result()  # type: ignore[union-attr]  # torch stubs: async_save returns a Future here
                if on_written is not None:
                    on_written(step)
                self._publish(info, self._dcp_digests(tmp),
                              {"form": "dcp", "mode": "async", "world_size": self.world_size}, group)
                info.written_s, info.published_t = time.perf_counter() - t0, time.time()
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait() in the training thread
                self._async_error = exc

        self._async_error = None
        self._pending = threading.Thread(target=publish, name=f"distai-ckpt-{step}", daemon=True)
        self._pending.start()
        self._pending_info = info
        info.seconds = time.perf_counter() - t0
        return info

    def wait(self) -> SaveInfo | None:
        """Block until the asynchronous save in flight (if any) is published; its info."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        pending.join()
        if self._async_error is not None:
            raise RuntimeError(f"asynchronous checkpoint failed: {self._async_error}") from self._async_error
        return self._pending_info

    def _async_group(self):
        """A gloo group of the checkpointer's own for the background thread's collectives."""
        dist = _dist()
        if dist is None:
            return None
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _publish(self, info: SaveInfo, mine: dict[str, dict], meta: dict, group=None) -> None:
        """Gather every rank's file digests; rank 0 writes the manifest, renames the folder into
        place and prunes old checkpoints. Fills ``info.bytes`` (and ``info.pruned`` on rank 0)."""
        files: dict[str, dict] = {}
        for part in _gather(mine, group):
            files.update(part)
        info.bytes = sum(f["bytes"] for f in files.values())
        if self.rank == 0:
            self.folder.publish(info.step, files, meta)
            info.pruned = self.folder.prune(self.keep)

    def _dcp_save(self, state: TrainingState, tmp: Path) -> dict[str, dict]:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._dcp_state(state), checkpoint_id=str(tmp))
        return self._dcp_digests(tmp)

    def _dcp_digests(self, tmp: Path) -> dict[str, dict]:
        """This rank's shard files of a DCP checkpoint (and rank 0's ``.metadata``), by digest."""
        mine = {p.name: file_digest(p) for p in sorted(tmp.glob(f"__{self.rank}_*.distcp"))}
        if self.rank == 0 and (tmp / ".metadata").is_file():
            mine[".metadata"] = file_digest(tmp / ".metadata")
        return mine

    def _dcp_state(self, state: TrainingState) -> dict:
        """The state as DCP saves and loads it. ``get_state_dict`` gives the full structure (with
        the optimizer's state entries) to load into; a fresh optimizer's own ``state_dict()`` has
        none, and DCP would restore nothing."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
        # per-rank state under a per-rank key: under one shared key DCP would keep one rank's copy
        return {"model": model_sd, "optim": optim_sd,
                "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
                "scaler": state.scaler.state_dict() if state.scaler is not None else None,
                # one opaque object: DCP loads only the keys the template already has
                "train": {"step": int(state.step), "extra": json.dumps(state.extra)},
                f"rank{self.rank}": state.per_rank()}

    # -- resume --------------------------------------------------------------------------------
    def find(self) -> Found:
        """Rank 0's view: the newest good checkpoint (bad newer ones are set aside), agreed by all."""
        found = None
        if self.rank == 0:
            self.folder.clean_stale()
            found = self.folder.latest_valid(set_aside=True)
        return _broadcast(found)

    def resume(self, state: TrainingState, skip: Iterable[str] = ()) -> ResumeInfo:
        """Load the newest good checkpoint into ``state`` (nothing if there is none).

        ``skip`` leaves parts out on purpose (``rng``, ``rng.numpy``, ``sampler``, ``optimizer``,
        ``scheduler``, …) — to see a resume go wrong when a piece of state is forgotten.
        """
        t0 = time.perf_counter()
        found = self.find()
        if found.path is None:
            return ResumeInfo(None, None, found.skipped)
        manifest = found.manifest or {}
        form = manifest.get("form", "file")
        if int(manifest.get("world_size", self.world_size)) != self.world_size:
            raise ValueError(f"{Path(found.path).name} was written by {manifest.get('world_size')} ranks; "
                                    f"this run has {self.world_size} (per-rank RNG and data position do not map)")
        if form == "file":
            shared = from_bytes(read_checked(Path(found.path) / "shared.pt"))
            mine = from_bytes(read_checked(Path(found.path) / f"rank{self.rank}.pt"))
            state.load_shared(shared, skip)
            state.load_per_rank(mine, skip)
        else:
            self._dcp_load(state, found.path, skip)
        return ResumeInfo(found.step, found.path, found.skipped, time.perf_counter() - t0, form)

    def _dcp_load(self, state: TrainingState, path: str, skip: Iterable[str]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        sd = self._dcp_state(state)
        dcp.load(sd, checkpoint_id=path)
        skip = set(skip)
        if "model" not in skip:
            set_model_state_dict(state.model, sd["model"])
        if "optimizer" not in skip:
            set_optimizer_state_dict(state.model, state.optimizer, sd["optim"])
        if state.scheduler is not None and sd["scheduler"] is not None and "scheduler" not in skip:
            state.scheduler.load_state_dict(sd["scheduler"])
        if state.scaler is not None and sd["scaler"] is not None and "scaler" not in skip:
            state.scaler.load_state_dict(sd["scaler"])
        state.step = int(sd["train"]["step"])
        state.extra = dict(json.loads(sd["train"]["extra"]) or {})
        state.load_per_rank(sd[f"rank{self.rank}"], skip)
