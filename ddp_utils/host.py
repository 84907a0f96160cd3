"""What the host has to spare and what its CPU can do: memory available to new allocations (and what limits
this process's: a cgroup, ``ulimit -v``), free disk space, CPU time it queues, the CPU's feature flags.

At the bottom of the package: the caches, the batch pool and anything else that sizes itself
to the machine ask here, so that a test can stand in for the machine in one place.
"""

from __future__ import annotations

import os
import resource
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


def memory_room(cgroup_root: str | Path = "/sys/fs/cgroup") -> tuple[int, str] | None:
    """Bytes this process can still allocate, and what bounds it: the host's available memory, the memory
    limit of its cgroup (a container's ``--memory``; what it holds in reclaimable page cache counted as free),
    or its address-space limit (``ulimit -v``, less the address space it maps already); None when none is known.

    Examples:
        >>> room = memory_room()
        >>> room is None or (room[0] >= 0 and room[1] in ROOM_LIMITS)
        True
    """
    rooms = []
    available = mem_available()
    if available is not None:
        rooms.append((available, ROOM_LIMITS[0]))
    cgroup = _cgroup_room(Path(cgroup_root))
    if cgroup is not None:
        rooms.append((cgroup, ROOM_LIMITS[1]))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _status_bytes("VmSize")
    if soft != resource.RLIM_INFINITY and mapped is not None:
        rooms.append((max(soft - mapped, 0), ROOM_LIMITS[2]))
    return min(rooms) if rooms else None


ROOM_LIMITS = ("the host's available memory", "its cgroup's memory limit", "its address-space limit, ulimit -v")


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmSize``), in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(root: Path) -> int | None:
    """The memory limit of this process's cgroup less what it uses (v2 ``memory.max``, v1 ``memory.limit_in_bytes``),
    its inactive page cache counted as free; None without a limit. A container sees its own cgroup at ``root``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    paths = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in lines if line.count(":") >= 2}
    v2 = [root, root / paths.get("", "/").lstrip("/")]
    v1 = [root / "memory", root / "memory" / paths.get("memory", "/").lstrip("/")]
    files = [(d, "memory.max", "memory.current", "inactive_file") for d in v2]
    files += [(d, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") for d in v1]
    rooms = []
    for directory, limit_name, usage_name, inactive_name in files:
        try:
            limit_text = (directory / limit_name).read_text().strip()
            usage = int((directory / usage_name).read_text())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 2**60:  # no limit (v1 writes a page-rounded 2**63 - 1)
            continue
        rooms.append(int(limit_text) - usage + _stat_field(directory / "memory.stat", inactive_name))
    return max(min(rooms), 0) if rooms else None


def _stat_field(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


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
