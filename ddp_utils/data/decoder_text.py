"""A decoder's own words (C code's stderr, PIL's Python warnings), caught around the call, said by the caller.

OpenCV's codecs write their warnings and errors to the process's stderr from C: libpng through its default
handler (``libpng warning: iCCP: known incorrect sRGB profile``), libjpeg for a JPEG that reaches OpenCV,
and OpenCV's own log for libtiff, WebP, AVIF and ``imread``'s errors (``[ WARN:0@0.011] global ...``).
Python sees none of it as an exception or a warning. :func:`caught_stderr` points file descriptor 2 at a
scratch file of this process for the length of the call and reads back what landed there. PIL (the label
scan's decoder for what the headers do not settle) warns through Python's ``warnings`` instead
(``Possibly corrupt EXIF data``, a decompression bomb's size): :func:`caught_warnings`. Either way the
caller says it in one line naming the file (:func:`decoder_summary` makes the line's words), once.

One window at a time per process (a lock): two threads swapping descriptor 2 or the warnings' hooks at
once could leave them swapped. A fork waits for an open stderr window to close, so a loader worker never
starts with its stderr captured. What another thread writes to stderr during a decode (milliseconds) is
caught with the decoder's text; another thread's Python warnings are shown as usual.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator

_STDERR_LOCK = threading.Lock()
_WARNINGS_LOCK = threading.Lock()
_SCRATCH: dict[int, int] = {}  # pid -> this process's scratch file (a forked child makes its own)
_OPENCV_LOG = re.compile(r"^\[\s*[A-Z]+\s*:[^\]]*\]\s+(?:global\s+)?\S+:\d+\s+")  # "[ WARN:0@0.011] global a.cpp:9 "


class Caught:
    """What a decoder said in a :func:`caught_stderr` or :func:`caught_warnings` window ("" when nothing)."""

    def __init__(self) -> None:
        self.text = ""


def _scratch() -> int:
    fd = _SCRATCH.get(os.getpid())
    if fd is None:
        try:  # in memory, no file to clean up (Linux)
            fd = os.memfd_create("ddp_utils-decoder-stderr", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        _SCRATCH[os.getpid()] = fd
    return fd


def _new_lock_after_fork() -> None:
    global _STDERR_LOCK
    _STDERR_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # a fork waits for an open window to close; the child gets a new lock
    os.register_at_fork(
        before=lambda: _STDERR_LOCK.acquire(),
        after_in_parent=lambda: _STDERR_LOCK.release(),
        after_in_child=_new_lock_after_fork,
    )


@contextlib.contextmanager
def caught_stderr() -> Iterator[Caught]:
    """Inside, file descriptor 2 writes to a scratch file; on exit it is put back and ``.text`` holds what came.

    Meant for one C call (a decode): Python's own buffered stderr is flushed first, and a process without
    a descriptor 2 runs the body as it is.

    Examples:
        >>> import ctypes
        >>> with caught_stderr() as caught:
        ...     _ = ctypes.CDLL(None).write(2, b"libpng warning: iCCP: too short\\n", 32)
        >>> caught.text
        'libpng warning: iCCP: too short\\n'
    """
    caught = Caught()
    with _STDERR_LOCK:
        scratch = _scratch()
        with contextlib.suppress(Exception):  # a replaced sys.stderr that cannot flush: nothing of ours to keep
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all: nothing can be printed
            yield caught
            return
        os.dup2(scratch, 2)
        try:
            yield caught
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            size = os.lseek(scratch, 0, os.SEEK_CUR)  # descriptor 2 shared the scratch file's offset
            if size:
                caught.text = os.pread(scratch, size, 0).decode(errors="replace")
                os.ftruncate(scratch, 0)
                os.lseek(scratch, 0, os.SEEK_SET)


@contextlib.contextmanager
def caught_warnings(source: str) -> Iterator[Caught]:
    """Inside, the Python warnings that the code under the folder ``source`` gives are kept, every one; on exit
    ``.text`` holds them, a line each. Warnings from elsewhere (another thread's, meanwhile) are shown as usual.

    Examples:
        >>> import os, warnings
        >>> with caught_warnings(os.path.dirname(warnings.__file__)) as caught:
        ...     warnings.warn_explicit("Possibly corrupt EXIF data", UserWarning, warnings.__file__, 1)
        >>> caught.text
        'Possibly corrupt EXIF data'
    """
    caught, source = Caught(), os.path.join(os.path.abspath(source), "")
    with _WARNINGS_LOCK, warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")  # every file's warning, not only a place's first
        try:
            yield caught
        finally:
            ours = [r for r in records if os.path.abspath(r.filename).startswith(source)]
            caught.text = "\n".join(str(r.message) for r in ours)
    for r in records:
        if not os.path.abspath(r.filename).startswith(source):
            warnings.showwarning(r.message, r.category, r.filename, r.lineno)


def decoder_summary(text: str, limit: int = 300) -> str:
    """A decoder's words as one line: its lines joined by "; ", OpenCV's log preamble dropped, at most ``limit``.

    Examples:
        >>> decoder_summary("libpng warning: iCCP: CRC error\\nlibpng warning: iCCP: too short\\n")
        'libpng warning: iCCP: CRC error; libpng warning: iCCP: too short'
        >>> decoder_summary("[ERROR:0@0.012] global grfmt_tiff.cpp:117 TIFF_Error TIFFReadDirectory: Failed\\n")
        'TIFF_Error TIFFReadDirectory: Failed'
    """
    lines = [_OPENCV_LOG.sub("", line.strip()) for line in text.splitlines()]
    summary = "; ".join(dict.fromkeys(line for line in lines if line))  # a repeated line once
    return summary if len(summary) <= limit else summary[: limit - 3] + "..."


__all__ = ["Caught", "caught_stderr", "caught_warnings", "decoder_summary"]
