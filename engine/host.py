"""What this machine has, read without torch (``distai doctor`` and the capstone run's check before
launching both ask here): the first value of a ``/proc`` file's key, and the memory."""
from __future__ import annotations


def read_first(path: str, key: str) -> str | None:
    """The value after ``key:`` on the first line of ``path`` that starts with it (None: no such file or key)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def host_memory_bytes() -> int | None:
    """The machine's memory (``MemTotal``), or None where ``/proc/meminfo`` does not say."""
    kib = read_first("/proc/meminfo", "MemTotal")
    return int(kib.split()[0]) * 1024 if kib else None
