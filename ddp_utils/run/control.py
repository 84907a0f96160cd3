"""Per training step, one answer for the loop: go on, save, or stop; the same answer on every rank.

What a long run must react to arrives anywhere and at any time: a signal on one rank (a
preemption, torchrun or SLURM shutting down, Ctrl-C), the save clock on rank 0, steps that went
non-finite (:mod:`ddp_utils.engine.guard`). :class:`StepControl` owns all of it: the signal handler
(:class:`~ddp_utils.run.signals.PreemptionHandler`), the periodic-save clock, and one small
all-reduce per step that carries the flags to every rank. The all-reduce is started each step and
read at the next (it had a whole step to finish; a host tensor over gloo, so nothing waits for a
GPU), so every rank learns of a request at the same step and acts at the same optimizer step, the
end of an accumulation window.

The clock is latched: rank 0 asks for a save once when the interval has passed, and asks again
only after the save was made (:meth:`StepControl.saved`), however many steps the request takes to
travel: one save per interval. The shapes studied: torchtitan's CheckpointManager and mmengine's
CheckpointHook, which likewise own "is a save due" in one object beside the loop.

Without a process group the answers are this process's, at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..distributed import all_reduce, any_rank, is_dist_initialized, reduce_tensor
from ..engine.guard import IN_A_ROW, OVERFLOWS, SKIPPED, HostCounts
from ..engine.loop import Action
from .signals import PreemptionHandler

NONFINITE_LIMIT = 25  # optimizer steps skipped in a row that stop a run (fp16 overflows too: the scale halved 25 times)
_STOP, _SAVE, _SKIPPED, _IN_A_ROW, _OVERFLOWS = range(5)  # the flags' places in the per-step all-reduce


class StepControl:
    """The run's control: signals, the save clock and the non-finite guard's counts, agreed by every rank per step.

    Use it as a context manager around the epochs (it installs the signal handlers and puts them
    back, and finishes its last all-reduce before the group goes away); :func:`~ddp_utils.engine.train_one_epoch`
    calls :meth:`after_step` once per batch; the script calls :meth:`saved` after every save,
    :meth:`epoch_end` after the epoch's last step, :meth:`stop_requested` where a stretch without
    collectives (validation) may be cut short.

    Args:
        signals: the signals that save and stop (SIGTERM; add SIGINT for Ctrl-C).
        requeue_signals: signals that also ask for a SLURM requeue.
        save_interval: seconds between periodic saves (<= 0: none); only the rank with ``keeps_clock`` counts them.
        keeps_clock: this rank's clock decides (rank 0, unless the run saves nothing).
        nonfinite_limit: optimizer steps skipped in a row (non-finite gradients) that stop the run.
        watchdog: a :class:`~ddp_utils.distributed.StallWatchdog` told of each step, or None.
        skipped: optimizer steps the run skipped before this process (a resumed run's); counting goes on from it.
        clock: seconds, monotonic (tests pass a fake one; the default is the real clock).

    Attributes:
        reason: why the run stops: ``"signal"`` or ``"diverged"`` (None while it goes on): ``nonfinite_limit``
            steps skipped in a row, or an epoch that was not training (:attr:`diverging`).
        skipped: optimizer steps skipped so far in the run (on any rank), as far as the host knows.
        epoch_skipped: of those, the ones of the epoch that :meth:`epoch_end` ended (exact).
        overflows: of the skipped steps, the GradScaler's fp16 overflows this process has seen.
        epoch_overflows: of those, the epoch's (finite losses; its routine while it finds its
            scale).
        epoch_steps: the optimizer steps of that epoch (in this process: a resumed epoch's since the resume).
        in_a_row: of the skipped steps, the latest run of consecutive ones.

    Examples:
        >>> with StepControl(save_interval=0.0) as control:
        ...     actions = [control.after_step(None, boundary=True, last=False) for _ in range(3)]
        >>> actions == [Action.GO] * 3, control.reason
        (True, None)
    """

    def __init__(
        self,
        signals: tuple[int, ...] = (signal.SIGTERM,),
        requeue_signals: tuple[int, ...] = (),
        *,
        save_interval: float = 0.0,
        keeps_clock: bool = True,
        nonfinite_limit: int = NONFINITE_LIMIT,
        watchdog: Any = None,
        skipped: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.preemption = PreemptionHandler(signals=signals, requeue_signals=requeue_signals)
        self.interval = max(float(save_interval), 0.0) if keeps_clock else 0.0
        self.nonfinite_limit = int(nonfinite_limit)
        self.watchdog = watchdog
        self.clock = clock
        self.last_saved = clock()
        self.reason: str | None = None
        self.skipped = self._epoch_start = self._base = int(skipped)
        self.epoch_skipped = self.epoch_overflows = self.epoch_steps = 0
        self.in_a_row = 0
        self.overflows = self._epoch_overflows_start = self._steps = 0
        self._asked = False  # the clock asked for a save that has not been made yet
        self._save = False  # a save agreed by every rank, made at the next optimizer step
        self._counts: HostCounts | None = None
        self._pending: tuple[Any, np.ndarray] | None = None
        self._group: Any = None

    # ---- the context: signal handlers in, the last all-reduce finished, handlers out ----
    def __enter__(self) -> StepControl:
        self.preemption.__enter__()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            # every rank reduced as often, so the last one is matched: finish it, or tearing the group
            # down under it would abort the process ("terminate called without an active exception")
            self._settle()
        self.preemption.__exit__(exc_type, *exc)

    # ---- per step ----
    def after_step(self, step: Any, boundary: bool, last: bool) -> Action:
        """Every rank, after each batch: what to do now.

        Args:
            step: the :class:`~ddp_utils.engine.TrainStep` (its non-finite guard's counts are read), or None.
            boundary: an optimizer step just ended an accumulation window (a save or stop happens here).
            last: it was the epoch's last batch (a stop happens here too; no periodic save: the epoch's own follows).

        Returns:
            :attr:`Action.STOP` (see :attr:`reason`), :attr:`Action.SAVE` (save, then call :meth:`saved`), or
            :attr:`Action.GO`.
        """
        if self.watchdog is not None:
            self.watchdog.progress("train")
        self._steps += bool(boundary)
        counts = self._host_counts(step)
        flags = np.zeros(5, dtype=np.float32)
        flags[_STOP] = self.preemption.requested()
        flags[_SAVE] = self._clock_asks()
        if counts is not None:
            counts.refresh()
            flags[[_SKIPPED, _IN_A_ROW, _OVERFLOWS]] = counts.values[[SKIPPED, IN_A_ROW, OVERFLOWS]]
        self._absorb(self._exchange(flags))
        if self.reason is not None and (boundary or last):  # at the epoch's end the window may be open: it stays
            return Action.STOP
        if self._save and boundary and not last:
            self._save = False
            return Action.SAVE
        return Action.GO

    def saved(self) -> None:
        """Every rank, after any save (any kind): the clock starts again, a save agreed but not made is dropped."""
        self.last_saved = self.clock()
        self._asked = self._save = False

    def epoch_end(self, step: Any = None) -> bool:
        """Every rank, after the epoch's last step: settle the last all-reduce and agree (blocking) whether to stop.

        A signal that arrived during the last step is seen here, before validation, so the trained epoch is
        saved at once instead of after a validation the launcher's grace time may not cover. The skipped-step
        counts are read exactly (one wait for the device per epoch). An epoch that was not training
        (:attr:`diverging`) stops the run as diverged, before it is validated.

        Returns:
            True when the run stops (:attr:`reason` says why).
        """
        self._absorb(self._settle())
        counts = self._host_counts(step)
        values = counts.exact() if counts is not None else np.zeros(3, dtype=np.float32)
        local = torch.tensor([float(self.preemption.requested()), *map(float, values[[SKIPPED, IN_A_ROW, OVERFLOWS]])])
        agreed = (reduce_tensor(local, op="max") if is_dist_initialized() else local).tolist()
        self._absorb(np.array([agreed[0], 0.0, *agreed[1:]], dtype=np.float32))
        self.epoch_skipped, self._epoch_start = self.skipped - self._epoch_start, self.skipped
        self.epoch_overflows = self.overflows - self._epoch_overflows_start
        self._epoch_overflows_start, self.epoch_steps, self._steps = self.overflows, self._steps, 0
        if self.diverging and self.reason is None:
            self.reason = "diverged"
        return self.reason is not None

    @property
    def diverging(self) -> bool:
        """Whether the epoch :meth:`epoch_end` ended was not training: more than half of its optimizer steps were
        skipped for a non-finite loss or gradients (the GradScaler's overflows, its routine, not counted: a
        persistent one reaches ``nonfinite_limit`` in a row instead).

        Examples:
            >>> control = StepControl()
            >>> control.epoch_steps, control.epoch_skipped = 4, 3  # 3 of the epoch's 4 steps skipped
            >>> control.diverging
            True
        """
        faults = self.epoch_skipped - self.epoch_overflows
        return self.epoch_steps > 0 and 2 * faults > self.epoch_steps

    def stop_requested(self) -> bool:
        """Whether this process received a stop signal (no collective: for cutting a stretch like validation short)."""
        return self.preemption.requested()

    def stop_anywhere(self) -> bool:
        """Whether any rank received a stop signal (a blocking all-reduce: every rank calls it)."""
        self._absorb(self._settle())
        if any_rank(self.preemption.requested()):
            self.reason = self.reason or "signal"
        return self.reason is not None

    def requeue_anywhere(self) -> bool:
        """Whether any rank received a requeue signal (a collective: every rank calls it)."""
        return self.preemption.requeue_anywhere()

    # ---- inside ----
    def _clock_asks(self) -> bool:
        if self.interval <= 0 or self._asked or self.clock() - self.last_saved < self.interval:
            return False
        self._asked = True  # asked once: the request travels with the next all-reduce; the clock waits for the save
        return True

    def _host_counts(self, step: Any) -> HostCounts | None:
        guard = getattr(step, "guard", None)
        if guard is None:
            return None
        if self._counts is None or self._counts.tensor is not guard.counts:
            self._counts = HostCounts(guard.counts)
        return self._counts

    def _absorb(self, flags: np.ndarray | None) -> None:
        if flags is None:
            return
        if flags[_STOP] > 0 and self.reason is None:
            self.reason = "signal"
        self._save = self._save or bool(flags[_SAVE] > 0)
        self.skipped = max(self.skipped, self._base + int(flags[_SKIPPED]))
        self.overflows = max(self.overflows, int(flags[_OVERFLOWS]))
        self.in_a_row = int(flags[_IN_A_ROW])
        if self.in_a_row >= self.nonfinite_limit and self.reason is None:
            self.reason = "diverged"

    def _exchange(self, flags: np.ndarray) -> np.ndarray | None:
        """Start this step's max all-reduce of ``flags``; return the previous step's result (None at the first)."""
        if not is_dist_initialized():
            return flags
        earlier = self._settle()
        tensor = torch.from_numpy(flags)  # shares the array's memory: the result is read without a tensor op
        self._pending = (all_reduce(tensor, op="max", group=self._host_group(), async_op=True), flags)
        return earlier

    def _settle(self) -> np.ndarray | None:
        if self._pending is None:
            return None
        work, flags = self._pending
        self._pending = None
        work.wait()  # a host-side gloo reduction that had a whole step to finish; no GPU involved
        return flags

    def _host_group(self) -> Any:
        """A gloo group for the flags: the default one if it is gloo, else one made once (a collective)."""
        if self._group is None:
            gloo = dist.get_backend() == dist.Backend.GLOO
            self._group = dist.group.WORLD if gloo else dist.new_group(backend="gloo")
        return self._group
