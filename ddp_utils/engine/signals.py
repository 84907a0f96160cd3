"""Turn SIGTERM (a preemption, a scheduler's time limit, torchrun shutting down) into a flag.

Killed in the middle of a step, a run loses everything since its last checkpoint. With
:class:`PreemptionHandler` the signal only sets a flag; the train loop checks it once a
step, every rank agrees on it with :meth:`PreemptionHandler.requested_anywhere` (a blocking
all-reduce) or, inside a GPU loop that must not wait, :meth:`PreemptionHandler.poll` (the
all-reduce of one step read at the next), rank 0 saves ``last.pt`` and all ranks leave the
loop together and exit cleanly.

A second delivery of the same signal gives it back its previous behaviour (for SIGTERM
and SIGINT by default: terminate), so a second Ctrl-C still stops a stuck run.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from ..dist import any_rank, collective_device, is_dist_initialized
from ..log import LOGGER


class PreemptionHandler:
    """A context manager that records termination signals instead of dying on them.

    Args:
        signals: the signals to catch; SIGTERM by default (add ``signal.SIGINT`` to catch Ctrl-C).

    Examples:
        >>> with PreemptionHandler() as preempt:
        ...     for step in range(3):
        ...         if preempt.requested_anywhere():  # every rank calls it at the same step
        ...             break
        >>> preempt.requested()
        False
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self.signals = tuple(signals)
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, torch.Tensor] | None = None

    def __enter__(self) -> PreemptionHandler:
        if threading.current_thread() is not threading.main_thread():
            # Python delivers signals to the main thread only; a handler cannot be set from here
            LOGGER.warning("PreemptionHandler: not in the main thread, so signals keep their default behaviour")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the previous handlers back (done on exit of the ``with`` block)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
            LOGGER.warning(
                f"received {signal.Signals(signum).name}: finishing this step, then saving and stopping "
                "(send it again to stop at once)"
            )
            return
        previous = self._previous.pop(signum, signal.SIG_DFL)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signum)

    def requested(self) -> bool:
        """True when this process received one of the signals."""
        return self.received is not None

    def requested_anywhere(self) -> bool:
        """True when any rank received one of the signals (a max all-reduce: every rank must call it).

        Without a process group this is :meth:`requested`. A :meth:`poll` still in flight is
        settled first, so the collectives stay in the same order on every rank.
        """
        earlier = self._settle()
        return any_rank(self.requested()) or earlier

    def poll(self) -> bool:
        """Whether any rank had received a signal at the previous call; every rank must call it at each step.

        Each call starts a non-blocking max all-reduce of this process's flag and returns the
        result of the one the previous call started, which has had a whole step to finish.
        So the step never waits on the network, every rank sees a signal at the same call
        (one step after the first rank noticed it), and a SIGTERM stops the loop within two
        steps. On CUDA (NCCL) reading the result waits for the GPU to finish the previous
        step only, while this step's kernels are already queued. Without a process group
        this is :meth:`requested`, at once.

        Examples:
            >>> with PreemptionHandler() as preempt:
            ...     stopped = [step for step in range(3) if preempt.poll()]
            >>> stopped
            []
        """
        if not is_dist_initialized():
            return self.requested()
        earlier = self._settle()
        flag = torch.full((1,), 1.0 if self.requested() else 0.0, device=collective_device())
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return earlier

    def _settle(self) -> bool:
        """Finish the all-reduce that :meth:`poll` started, if any, and return its answer."""
        if self._pending is None:
            return False
        work, flag = self._pending
        self._pending = None
        work.wait()
        return bool(flag.item() > 0)  # CPU-GPU sync point (NCCL): the previous step's result
