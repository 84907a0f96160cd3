"""What the host has to spare and what its CPU can do: memory available to new allocations, free disk space,
CPU time it queues, the CPU's feature flags.

At the bottom of the package: the caches, the batch pool and anything else that sizes itself
to the machine ask here, so that a test can stand in for the machine in one place.
"""

from __future__ import annotations

import os
from pathlib import Path


def mem_available() -> int | None:
    """Bytes of memory available to new allocations (Linux's MemAvailable), None when unknown.

    Examples:
        >>> available = mem_available()
        >>> available is None or available > 0
        True
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def disk_free(directory: str | Path) -> int:
    """Bytes free for an unprivileged user in the file system holding ``directory``.

    Examples:
        >>> disk_free(".") >= 0
        True
    """
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def runqueue_seconds() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux's schedstat; 0.0 elsewhere).

    Examples:
        >>> runqueue_seconds() >= 0.0
        True
    """
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (x86's ``flags``, Arm's ``Features``), lower case; empty elsewhere.

    The flags say what the cores execute, whatever torch was built for: ``avx512_bf16`` and ``amx_bf16``
    mean the CPU computes bf16 natively (:func:`ddp_utils.engine.amp.train_mode` decides from them).

    Args:
        cpuinfo: the file to read (a test passes its own).

    Examples:
        >>> flags = cpu_flags()
        >>> isinstance(flags, frozenset) and all(flag == flag.lower() for flag in flags)
        True
    """
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):  # every core lists the same: the first will do
                    return frozenset(value.lower().split())
    except OSError:
        pass
    return frozenset()


__all__ = ["cpu_flags", "disk_free", "mem_available", "runqueue_seconds"]
