"""Turn SIGTERM (a preemption, a scheduler's time limit, torchrun shutting down) into a flag.

Killed in the middle of a step, a run loses everything since its last checkpoint. With
:class:`PreemptionHandler` the signal only sets a flag; every rank agrees on it with
:meth:`PreemptionHandler.requested_anywhere` (a blocking all-reduce) or, in the training loop,
through :class:`~ddp_utils.run.control.StepControl`'s per-step all-reduce (read one step later,
so the step never waits), rank 0 saves ``last.pt`` and all ranks leave the loop together and exit cleanly.

A second delivery of the same signal gives it back its previous behaviour (for SIGTERM: terminate).
Ctrl-C is the process's, where it has an owner (:func:`~ddp_utils.run.interrupt.own_ctrl_c`: train.py): the
handler then listens to the owner, whose second press stops the process at once, in one line, with exit code
130; once the run has finished (its final save on disk), the owner takes the other stop signals too, and this
handler leaves them to it when it ends (the exit window: :mod:`~ddp_utils.run.interrupt`). Without an owner (a
library's host program) a second Ctrl-C gets Python's own behaviour back, even when
both arrive during one long step: Python runs a handler once for deliveries that come before it gets to run,
so the handler counts them from a wakeup file descriptor, which receives a byte per delivery
(:func:`signal.set_wakeup_fd`). A repeat within :attr:`PreemptionHandler.repeat_window` seconds (SIGINT
excepted) is the same request sent twice: SLURM signals every process of a job step and torchrun passes the
signal on to its workers, so under ``train_torchrun.sbatch`` a ``scancel`` reaches each worker twice within
milliseconds, and the second one would kill it before last.pt is saved. A forked child (a data-loader worker
between its fork and its own handlers) that receives the signal leaves it to its parent, and says nothing.

Requeue signals (SLURM's ``#SBATCH --signal=USR1@90``, see :func:`requeue_signal`) stop the
loop the same way and also ask for the job to be requeued: after rank 0 saved ``last.pt``,
it calls :func:`requeue_job` (``scontrol requeue JOBID``, as Lightning's
``SLURMEnvironment(auto_requeue=True)`` does). SLURM may deliver such a signal to a process
twice (directly and through torchrun's agent), so repeats are ignored.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from ..distributed import any_rank, dist_info, slurm_job_id
from ..log import LOGGER
from .interrupt import ctrl_c_owner


class PreemptionHandler:
    """A context manager that records termination signals instead of dying on them.

    Args:
        signals: the signals to catch; SIGTERM by default (add ``signal.SIGINT`` to catch Ctrl-C).
        requeue_signals: signals that also ask for a requeue (:attr:`requeue`); repeats are ignored.
        repeat_window: seconds after the first signal in which the same one again (other than
            SIGINT, a person's second Ctrl-C) counts as the same delivery.

    Examples:
        >>> with PreemptionHandler() as preempt:
        ...     for step in range(3):
        ...         if preempt.requested_anywhere():  # every rank calls it at the same step
        ...             break
        >>> preempt.requested()
        False
    """

    def __init__(
        self,
        signals: tuple[int, ...] = (signal.SIGTERM,),
        requeue_signals: tuple[int, ...] = (),
        repeat_window: float = 2.0,
    ) -> None:
        self.requeue_signals = tuple(requeue_signals)
        self.signals = tuple(dict.fromkeys([*signals, *self.requeue_signals]))
        self.repeat_window = repeat_window
        self.received: int | None = None
        self._received_at = 0.0
        self.requeue = False
        self._previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int, int] | None = None  # (read end, write end, the previous wakeup fd)
        self._pid = os.getpid()  # the process that installed it: a forked child's deliveries are its parent's
        self._owner: Any = None  # the process's Ctrl-C owner, while listening to it

    def __enter__(self) -> PreemptionHandler:
        if threading.current_thread() is not threading.main_thread():
            # Python delivers signals to the main thread only; a handler cannot be set from here
            LOGGER.warning("PreemptionHandler: not in the main thread, so signals keep their default behaviour")
            return self
        self._pid, owner = os.getpid(), ctrl_c_owner()
        for sig in self.signals:
            if sig == signal.SIGINT and owner is not None:  # Ctrl-C is the process's: listen to its owner
                self._owner = owner
                owner.listen(self._ctrl_c)
                continue
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        if signal.SIGINT in self._previous:
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
            try:
                previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            except ValueError:  # another wakeup fd in use by a library that needs it: count as Python does
                os.close(read_end)
                os.close(write_end)
            else:
                self._wakeup = (read_end, write_end, previous_fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the previous handlers back (done on exit of the ``with`` block), but for those the process's Ctrl-C
        owner took once the run finished (:meth:`~ddp_utils.run.interrupt.CtrlC.finishing`)."""
        if self._owner is not None:
            self._owner.unlisten(self._ctrl_c)  # a press from now on stops the process at once
            self._owner = None
        owner = ctrl_c_owner()
        for sig, previous in self._previous.items():
            if owner is not None and owner.taken(sig):  # the run finished: the owner holds it to the process's end
                continue
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._wakeup is not None:
            read_end, write_end, previous_fd = self._wakeup
            signal.set_wakeup_fd(previous_fd)
            os.close(read_end)
            os.close(write_end)
            self._wakeup = None

    def _deliveries(self, signum: int) -> int:
        """How many times ``signum`` arrived since the last call (at least 1: the one being handled)."""
        if self._wakeup is None:
            return 1
        seen = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._wakeup[0], 512):
                seen += chunk
        return max(seen.count(bytes([signum])), 1)

    def _ctrl_c(self) -> None:
        """The owner's first press (in its thread): stop after this step, as for SIGTERM."""
        if self.received is None:
            self.received, self._received_at = signal.SIGINT, time.monotonic()
        LOGGER.warning(
            "received SIGINT: finishing this step, then saving and stopping (press Ctrl-C again to stop at once)"
        )

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked child (a loader worker before its own handlers): the signal is its parent's to act on
        if signum in self.requeue_signals:
            if not self.requeue:
                self.requeue = True
                if self.received is None:
                    self.received = signum
                LOGGER.warning(
                    f"received {signal.Signals(signum).name}: finishing this step, then saving and requeueing the job"
                )
            return
        deliveries = self._deliveries(signum)
        if self.received is None:
            self.received, self._received_at = signum, time.monotonic()
            LOGGER.warning(
                f"received {signal.Signals(signum).name}: finishing this step, then saving and stopping "
                "(send it again to stop at once)"
            )
            if deliveries < 2 or signum != signal.SIGINT:
                return
            # two Ctrl-Cs before Python ran the handler once (a long step): the second one stops at once
        if signum == self.received != signal.SIGINT and time.monotonic() - self._received_at < self.repeat_window:
            return  # the same request from a second sender (SLURM and torchrun)
        previous = self._previous.pop(signum, signal.SIG_DFL)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signum)

    def requested(self) -> bool:
        """True when this process received one of the signals."""
        return self.received is not None

    def requeue_anywhere(self) -> bool:
        """True when any rank received a requeue signal (a max all-reduce: every rank must call it)."""
        return any_rank(self.requeue)

    def requested_anywhere(self) -> bool:
        """True when any rank received one of the signals (a max all-reduce: every rank must call it).

        Without a process group this is :meth:`requested`.
        """
        return any_rank(self.requested())


def requeue_signal(name: str | None = None, environ: Mapping[str, str] | None = None) -> signal.Signals | None:
    """The signal that asks this job to save and requeue itself, or None for none.

    Args:
        name: "USR1", "SIGUSR2", "12", or "none"; when None, the environment's
            ``DDP_UTILS_REQUEUE_SIGNAL``, else USR1 inside a SLURM job (``#SBATCH --signal=USR1@90``),
            else none.
        environ: the environment to read; ``os.environ`` when None.

    Raises:
        ValueError: ``name`` is no signal; the message names it.

    Examples:
        >>> requeue_signal("USR2", environ={}).name, requeue_signal("SIGUSR1", environ={}).name
        ('SIGUSR2', 'SIGUSR1')
        >>> requeue_signal(environ={}) is None, requeue_signal("none", environ={}) is None  # not a SLURM job
        (True, True)
    """
    env = os.environ if environ is None else environ
    where = "--requeue-signal"
    if name is None:
        name, where = env.get("DDP_UTILS_REQUEUE_SIGNAL"), "DDP_UTILS_REQUEUE_SIGNAL"
    if name is None:
        return signal.SIGUSR1 if slurm_job_id(env) else None
    text = name.strip().upper()
    if text in ("", "NONE", "OFF", "0"):
        return None
    try:
        return (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        )
    except (KeyError, ValueError):
        raise ValueError(
            f"{where}={name!r} is no signal: use USR1, USR2, another name from 'kill -l', or none"
        ) from None


def requeue_job(
    environ: Mapping[str, str] | None = None, timeout: float = 60.0, restarts_from: str = "the saved last.pt"
) -> bool:
    """Ask SLURM to requeue this job: ``scontrol requeue JOBID`` (rank 0 only; a no-op elsewhere).

    The job keeps its id and SLURM_RESTART_COUNT grows by one, which makes the restarted
    ``train.py`` resume this run. A failure (no ``scontrol`` on PATH, a refusal, a timeout)
    is one warning line, never an exception: the checkpoint is saved either way.

    Args:
        environ: the environment to read; ``os.environ`` when None.
        timeout: seconds to wait for ``scontrol``.
        restarts_from: what the restarted job resumes, for the log line (the caller saved it: call this only then).

    Returns:
        True when ``scontrol`` accepted the request.

    Examples:
        >>> requeue_job(environ={})  # not a SLURM job: nothing to requeue
        False
    """
    env = os.environ if environ is None else environ
    job_id = slurm_job_id(env)
    if job_id is None or not dist_info(env).is_main:
        return False
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol is None:
        LOGGER.warning(f"could not requeue SLURM job {job_id}: no scontrol on PATH; resubmit the job to resume")
        return False
    try:
        result = subprocess.run(
            [scontrol, "requeue", job_id], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        LOGGER.warning(f"could not requeue SLURM job {job_id}: {scontrol} requeue {job_id}: {exc}")
        return False
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip().splitlines()
        LOGGER.warning(
            f"could not requeue SLURM job {job_id}: scontrol exited {result.returncode}"
            + (f": {reason[-1]}" if reason else "")
        )
        return False
    LOGGER.info(f"requeued SLURM job {job_id}: it restarts from {restarts_from}")
    return True
