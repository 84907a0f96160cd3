"""Ctrl-C, owned by the process from its start to its end: the first press stops the run after its step, saved;
a second press (or a first one while no run listens) stops the process at once, in one line, with exit code 130.
Once the run has finished, every stop signal is owned the same way, to the process's end: it exits at once with 0.

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

The exit window: a run whose final save is on disk has finished, and a signal from then on (a scheduler's time limit
landing as the run ends, Ctrl-C at its "done" line) must not read as a run killed. From
:meth:`CtrlC.finishing` (the final save on disk) the owner also takes the stop signals a run takes (SIGTERM, the
requeue signal) and holds what comes; from :meth:`CtrlC.finished` (no rank waits on another any more) a signal held,
or any that comes after, ends the process at once with exit code 0 and one line naming the checkpoints on disk
(:meth:`CtrlC.end_finished`). Between the two, only a second Ctrl-C acts at once (with 0 too): a rank leaving
there would be named as stalled by the others' watchdogs, which wait until every rank is done.

A forked child (a data-loader worker) does not act on a signal: its parent does.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

from ..distributed.parting import flush_stdio, write_stderr

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended


class CtrlC:
    """SIGINT's owner in this process (one per process: :func:`own_ctrl_c` makes it), and every stop signal's once
    the run has finished.

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
        self._leaving = threading.Lock()  # held by the exit at once, and by the last exit handler: one of the two
        self._over = False  # the last exit handler ran: nothing is left to stop
        self._pid = os.getpid()
        self._pipe: tuple[int, int] | None = None  # (read end, write end) of the wakeup fd
        self._window: str | None = None  # None, "finishing" or "finished" (the exit window: see the module)
        self._on_disk = ""  # what the exit window's line says is on disk
        self._taken: set[int] = set()  # the stop signals other than SIGINT taken for the exit window
        self._held: int | None = None  # a signal that came while finishing
        self._presses_held = 0  # the presses while finishing

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

    def stop_at_once(self) -> None:
        """One line (with what the writes left), then exit :data:`INTERRUPTED_EXIT_CODE` at once (once the last
        exit handler ran, nothing: the process ends with its own status)."""
        words = ""
        if self._writes is not None:
            with contextlib.suppress(Exception):  # whatever the files say, the process stops
                words = self._writes()
        again = "pressed again: " if self.presses > 1 else ""
        line = f"{self.program}: interrupted by Ctrl-C ({again}stopped at once){'; ' + words if words else ''}"
        self._leave(line, INTERRUPTED_EXIT_CODE)

    # ---- the exit window ----
    def finishing(self, on_disk: str, signals: Iterable[int], heard: int | None = None) -> None:
        """The run's final save is on disk: from now on Ctrl-C and ``signals`` (SIGTERM, the requeue signal) are this
        owner's to the process's end, held until :meth:`finished`. Call it from the main thread.

        Args:
            on_disk: what the exit window's line says is on disk (empty on a rank that writes nothing).
            signals: the stop signals the run took (its :class:`~ddp_utils.run.signals.PreemptionHandler` leaves
                them to this owner when it ends).
            heard: a stop signal the run received after it last looked (during the final save), held now.
        """
        with self._lock:
            self._window, self._on_disk, self._held = "finishing", on_disk, heard
            self._presses_held = int(heard == signal.SIGINT)
        for sig in dict.fromkeys(signals):
            if sig != signal.SIGINT:
                self._taken.add(sig)
                signal.signal(sig, self._handle)

    def finished(self) -> None:
        """No rank waits on another any more: a signal held ends the process now, any later one when it comes
        (:meth:`end_finished`)."""
        with self._lock:
            if self._window is None:
                return
            self._window, held = "finished", self._held
        if held is not None:
            self.end_finished(held)

    def end_finished(self, signum: int) -> None:
        """One line (the signal, the checkpoints on disk), then exit code 0 at once: the run has finished."""
        name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        words = f"; on disk: {self._on_disk}" if self._on_disk else ""
        self._leave(f"{self.program}: {name} after training finished: exited at once, with 0 (the run is finished)"
                    f"{words}", 0)  # fmt: skip

    @property
    def held(self) -> int | None:
        """The stop signal held since :meth:`finishing`, until :meth:`finished` acts on it; None: none came."""
        return self._held

    def taken(self, signum: int) -> bool:
        """Whether ``signum`` is this owner's now (the exit window took it): a run's handler leaves it here."""
        return signum in self._taken

    # ---- inside ----
    def _leave(self, line: str, code: int) -> None:
        """``line``, then exit ``code`` at once; nothing once the last exit handler ran (the interpreter tearing
        itself down: a thread still writing then would abort it, SIGABRT, with the stream's lock held)."""
        with self._leaving:  # held to the exit: the last exit handler waits for it, or this finds that it ran
            if self._over:
                return
            flush_stdio()  # what the run logged comes first (bounded: the main thread may hold the streams)
            write_stderr(line + "\n")
            os._exit(code)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked child: its parent acts on the signal
        if self._pipe is None:  # no wakeup fd to count from: each call is a delivery (those in one step are one)
            self._delivered(signum)

    def _watch(self) -> None:
        read_end = self._pipe[0]
        while True:
            try:
                data = os.read(read_end, 512)
            except OSError:
                return
            if not data:
                return
            for signum in data:  # other signals' bytes (a run's SIGTERM while it trains): their own handlers act
                if signum == signal.SIGINT or signum in self._taken:
                    self._delivered(signum)

    def _delivered(self, signum: int) -> None:
        if signum == signal.SIGINT:
            self._press()
            return
        with self._lock:  # a stop signal the exit window took
            window = self._window
            if window == "finishing" and self._held is None:
                self._held = signum
        if window == "finished":
            self.end_finished(signum)

    def _press(self) -> None:
        with self._lock:
            self.presses += 1
            window = self._window
            if window == "finishing":  # held for finished(), but a second press still acts at once
                self._presses_held += 1
                self._held = self._held or signal.SIGINT
            listener = self._listener if self.presses == 1 else None
        if window == "finished" or (window == "finishing" and self._presses_held > 1):
            self.end_finished(signal.SIGINT)
        elif window is None and listener is not None:
            listener()
        elif window is None:
            self.stop_at_once()

    def _forked(self) -> None:
        with contextlib.suppress(ValueError):  # a fork from another thread: its child cannot set it
            signal.set_wakeup_fd(-1)  # the child's signals must not count as the parent's presses

    def _at_the_end(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._leaving:  # an exit at once under way finishes first (it ends the process)
            self._over = True
        for signum in (signal.SIGINT, *self._taken):  # every exit handler ran: nothing is left to stop
            signal.signal(signum, signal.SIG_IGN)


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
