"""What the host has to spare: memory available to new allocations, free disk space.

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


__all__ = ["disk_free", "mem_available"]
