"""Temporary files for atomic writes that end with the permissions an ordinary ``open`` would give.

``tempfile.mkstemp`` creates its file with mode 0600 whatever the umask, so a file written to a
temporary name and renamed into place stays private: teammates on a shared file system could not
read a checkpoint that YOLOv5 (plain ``open``) would have written 0644. :func:`mkstemp_shared`
makes the temporary file as ``mkstemp`` does (unique, in the target's directory) and then gives it
``0666 & ~umask``, the mode ``open(path, "w")`` gives a new file.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux: /proc/self/status).

    Examples:
        >>> 0 <= current_umask() <= 0o777
        True
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # elsewhere: set and restore at once (threads of this module serialise on the lock)
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def mkstemp_shared(directory: str | Path, prefix: str = "", suffix: str = ".tmp") -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``directory``, then mode ``0666 & ~umask`` (what ``open`` gives a new file).

    Args:
        directory: where to make the file (the directory of the file it will be renamed to).
        prefix: the start of its name.
        suffix: the end of its name.

    Returns:
        ``(fd, name)`` as ``tempfile.mkstemp`` returns them; the caller closes and renames or removes it.

    Examples:
        >>> import tempfile
        >>> fd, name = mkstemp_shared(tempfile.mkdtemp(), prefix=".x.")
        >>> os.close(fd)
        >>> oct(os.stat(name).st_mode & 0o777) == oct(0o666 & ~current_umask())
        True
    """
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        mode = 0o666 & ~current_umask()
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        else:  # Windows
            os.chmod(name, mode)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    return fd, name
