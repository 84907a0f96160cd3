"""Ctrl-C, owned by the process from its start to its end: the first press stops the run after its step, saved;
a second press (or a first one while no run listens) stops the process at once, in one line, with exit code 130.

Python's own Ctrl-C raises KeyboardInterrupt wherever the main thread happens to be: inside a finalizer (``Exception
ignored in: <function WeakSet...>``, and the run goes on as for one press), in a ``finally`` that waits, in the
interpreter's exit (a traceback, or a death by SIGINT). :func:`own_ctrl_c`, which ``train.py`` calls first thing,
takes SIGINT for the rest of the process instead:

- presses are counted as they arrive, by a thread reading the signal wakeup fd (:func:`signal.set_wakeup_fd`: the
  C-level handler writes a byte per delivery), so two presses during one long step count as two, and the second
  acts while the main thread is still inside a C call (a convolution, a collective, a join);
- the first press goes to the run that listens (:meth:`CtrlC.listen`: the run's
  :class:`~ddp_utils.run.signals.PreemptionHandler`), which finishes its step, saves and stops;
- a second press, or a first one while no run listens (loading the data, the last writes, the interpreter's exit),
  stops the process at once: one line that says what the writes left (:meth:`CtrlC.describe_writes`: a save still
  being written is not finished; which checkpoint is on disk and where ``--resume`` continues), then exit code
  :data:`INTERRUPTED_EXIT_CODE` through ``os._exit``: nothing more runs. What such an exit leaves is what a SIGKILL
  leaves, and is cleaned as it is: a save's temp file by the next save, an image cache's buffer by the next run;
- after the last exit handler (every file written, the interpreter tearing itself down) a press changes nothing:
  the process ends a moment later with its own exit status.

A forked child (a data-loader worker) does not act on a press: its parent does.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from ..distributed.parting import flush_stdio, write_stderr

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended


class CtrlC:
    """SIGINT's owner in this process (one per process: :func:`own_ctrl_c` makes it).

    Args:
        program: what the at-once line starts with (``"train.py"``).

    Attributes:
        presses: the presses counted so far.
    """

    def __init__(self, program: str = "train.py") -> None:
        self.program = program
        self.presses = 0
        self._listener: Callable[[], None] | None = None
        self._writes: Callable[[], str] | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._pipe: tuple[int, int] | None = None  # (read end, write end) of the wakeup fd

    def install(self) -> CtrlC:
        """Take SIGINT (from the main thread) until the process ends."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Ctrl-C can only be owned from the main thread (Python runs signal handlers there)")
        signal.signal(signal.SIGINT, self._handle)
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:
            previous = None
        if previous != -1:  # unavailable, or a library's own (an event loop): leave it; the handler counts instead
            if previous is not None:
                signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)
        else:
            self._pipe = (read_end, write_end)
            threading.Thread(target=self._watch, name="ddp_utils-ctrl-c", daemon=True).start()
        os.register_at_fork(after_in_child=self._forked)
        atexit.register(self._at_the_end)  # registered first of this program's: it runs last
        return self

    def listen(self, heard: Callable[[], None]) -> None:
        """Give the first press to ``heard`` (called in a thread of its own: set a flag, log a line)."""
        self._listener = heard

    def unlisten(self, heard: Callable[[], None]) -> None:
        """Stop giving presses to ``heard``: a press from now on stops the process at once."""
        if self._listener == heard:  # a bound method is a new object at each access: equal, not the same
            self._listener = None

    def describe_writes(self, words: Callable[[], str] | None) -> None:
        """What the at-once line says about the writes: ``words()`` (for instance "the save of last.pt being
        written is not finished; the last.pt on disk is from epoch 2, batch 3/8: ...")."""
        self._writes = words

    def stop_at_once(self) -> NoReturn:
        """One line (with what the writes left), then exit :data:`INTERRUPTED_EXIT_CODE` at once."""
        words = ""
        if self._writes is not None:
            with contextlib.suppress(Exception):  # whatever the files say, the process stops
                words = self._writes()
        again = "pressed again: " if self.presses > 1 else ""
        line = f"{self.program}: interrupted by Ctrl-C ({again}stopped at once){'; ' + words if words else ''}"
        flush_stdio()  # what the run logged comes first (bounded: the main thread may hold the streams)
        write_stderr(line + "\n")
        os._exit(INTERRUPTED_EXIT_CODE)

    # ---- inside ----
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked child: its parent acts on Ctrl-C
        if self._pipe is None:  # no wakeup fd to count from: each call is a press (presses in one step are one)
            self._press()

    def _watch(self) -> None:
        read_end = self._pipe[0]
        while True:
            try:
                data = os.read(read_end, 512)
            except OSError:
                return
            if not data:
                return
            for _ in range(data.count(signal.SIGINT)):  # other signals' bytes: their own handlers act
                self._press()

    def _press(self) -> None:
        with self._lock:
            self.presses += 1
            listener = self._listener if self.presses == 1 else None
        if listener is None:
            self.stop_at_once()
        else:
            listener()

    def _forked(self) -> None:
        with contextlib.suppress(ValueError):  # a fork from another thread: its child cannot set it
            signal.set_wakeup_fd(-1)  # the child's signals must not count as the parent's presses

    def _at_the_end(self) -> None:
        if os.getpid() == self._pid:  # every exit handler ran: nothing is left to stop
            signal.signal(signal.SIGINT, signal.SIG_IGN)


_owner: list[CtrlC] = []


def own_ctrl_c(program: str = "train.py") -> CtrlC:
    """Take SIGINT for the rest of this process (see the module); a second call returns the same owner."""
    if not _owner:
        _owner.append(CtrlC(program).install())
    return _owner[0]


def ctrl_c_owner() -> CtrlC | None:
    """The process's Ctrl-C owner, or None (Python's own Ctrl-C: a library's host program decides)."""
    return _owner[0] if _owner else None


__all__ = ["INTERRUPTED_EXIT_CODE", "CtrlC", "ctrl_c_owner", "own_ctrl_c"]
