"""Files that survive a crash: written whole or not at all, and durable once written.

:func:`write_atomic` (temporary file in the same folder, ``fsync``, ``os.replace``, ``fsync`` of the folder)
is how a checkpoint's files and manifest (``checkpoint.py``) and a run's record (``runs.py``) reach the disk:
a reader sees the old file or the new one, never half, even after a power cut. Pure Python.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

# the errors of a write the disk has no room for: full, over the quota, or past the file size allowed
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
TMP_PREFIX = ".tmp-"  # a temporary file's or folder's name starts so: a reader skips it, a cleaner removes it


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a folder's entries (a rename, a new file) durable. A file system that cannot fsync a folder
    (some network and FUSE mounts say EINVAL) is let be, as SQLite lets it be: the rename itself stands."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes) -> int:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half:
    temporary file in the same folder, ``fsync``, ``os.replace``, ``fsync`` of the folder."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:  # a full disk: the old file stands, and no half-written temporary is left beside it
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return len(data)
