"""The stall watchdog: a rank that stops making progress is named within minutes, and the job ends to restart.

Without it, a rank that stops (a stuck file read, a process stopped with SIGSTOP, a deadlock) holds
every other rank in a collective for DDP_UTILS_DIST_TIMEOUT (30 minutes), and the job ends in torch's
timeout errors. With it, each rank's main thread marks its progress (:meth:`StallWatchdog.progress`:
a counter and a clock reading, no lock, no I/O) and a daemon thread per rank publishes it to the
group's c10d store and judges everyone's. When a rank stalls, the rank that decided prints one line naming
it (a stalled rank that still runs, stuck in Python or a read, prints its main thread's stack first: where it
is stuck; the ranks that only waited for it print no stack), and every live rank exits with
:data:`STALL_EXIT_CODE`, so that the launcher restarts the job (torchrun ``--max-restarts``, a SLURM
requeue) and it resumes from its last save.

- **Bounds.** A rank may go without progress for ``timeout`` (:data:`DEFAULT_STALL_TIMEOUT_S`,
  DDP_UTILS_STALL_TIMEOUT) or ``factor`` times the slowest interval it has seen between two progress
  calls of the phase, whichever is longer; in the first ``startup_steps`` of a phase's first run in
  the process (cudnn autotuning, torch.compile, first allocations), for the startup bound (900 s,
  DDP_UTILS_STALL_STARTUP_TIMEOUT); in a :meth:`~StallWatchdog.phase` block, for its own bound, or
  without one. :meth:`~StallWatchdog.track` enters its phase before the first item, so a loader's
  start is bounded as a start, apart from its steady steps.
- **No clock agreement.** Reports carry durations, never times; an observer adds how long a report
  has stood unchanged on its own clock (the heartbeat, counted as :mod:`.zero_first`'s is). A process
  whose own thread stood still (the whole job stopped, a SLURM suspend) starts its clocks again.
- **Who is to blame** (the rules are in :mod:`.stall`). When rank 1 is stuck, rank 0 waits in the
  step's all-reduce and makes no progress either. Blamed is a rank whose heartbeat stopped (its threads
  are stopped too: SIGSTOP, a hang in the kernel); else the rank whose last progress is the oldest (the
  waiters went on at least to the collective it never reached), then the one behind in steps, then
  the one not inside torch.distributed. Nobody is blamed while a rank is in an unbounded phase or a
  ``phase()`` block within its bound (the others may be waiting for it); a rank that left, never.
- **The store.** Its host may be the stalled process (rank 0 under a plain env:// launch; under
  torchrun the agent), and a call to a stopped host blocks whatever the store's timeout (see
  :mod:`.store`): the thread keeps a private connection and a deadline of its own
  (``store_timeout``); losing the store ends the rank the same way, and says so.
- **Ending.** The first rank to decide stores its verdict (compare-and-set: exactly one wins), naming
  the host, local rank and pid each rank published at start; a stalled rank that still runs prints its stack;
  every live rank acknowledges, none leaving before all have; then the decider prints the blame line, the others a
  "stopping" line, each leaves it in torchrun's error file and ``os._exit`` s (see :mod:`.parting`).
- **Finishing.** A rank done with its work keeps watching until every rank is done: a rank that
  stops after the others finished (no collective left to hold them) is still named, and the job ends.
- **Elastic restarts.** Keys carry the restart count and how many watchdogs this process started.

The default bound, 120 s: detection takes the bound and a second or two; torchrun waits 30 s for a
SIGSTOPped worker before it SIGKILLs it, then the restart loads the last save: a frozen small CPU
run finishes within 5 minutes of the freeze, while a slow step or save still has two minutes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from ..log import LOGGER
from .env import dist_info
from .group import get_rank, get_world_size, is_dist_initialized
from .parting import exit_for_restart, hold_the_exit, part_after_verdict
from .stall import (
    DEFAULT_STARTUP_TIMEOUT_S,
    STALL_EXIT_CODE,
    STARTUP_ENV,
    TIMEOUT_ENV,
    Observer,
    RankView,
    blame_lines,
    env_seconds,
    find_stalled,
    is_waiting_frame,
    stall_timeout_from_env,
)
from .store import BoundedStore, StoreLostError, default_store, private_connection, store_address

_ADAPTIVE = "adaptive"  # a progress phase's bound: learnt from its intervals
_started = [0]  # watchdogs this process has started: the last part of each one's store keys
T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class _Entry:
    """One run of a phase: entries are told apart by identity."""

    name: str
    first: bool  # the first run of this phase in this process: the startup bound for its first steps
    bound: Any  # _ADAPTIVE, or a phase() block's own seconds (None: unbounded)


class Tracked(Generic[T]):
    """Items that mark progress in a phase as they arrive (:meth:`StallWatchdog.track`); the wrapped one's len()."""

    def __init__(self, watchdog: StallWatchdog, iterable: Iterable[T], phase: str) -> None:
        self.watchdog, self.iterable, self.phase = watchdog, iterable, phase

    def __iter__(self) -> Iterator[T]:
        return self.watchdog._tracked(self.iterable, self.phase)

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]


class StallWatchdog:
    """Name a rank that stops making progress (with its stack, when it still runs), end the job for a restart.

    Args:
        timeout: seconds a rank may go without progress in steady state; None reads
            DDP_UTILS_STALL_TIMEOUT (default 120; "0"/"off" turns the watchdog off), 0 turns it off.
        startup_timeout: the bound before a phase's first ``startup_steps`` progress calls; None reads
            DDP_UTILS_STALL_STARTUP_TIMEOUT (default 900). Never below ``timeout``.
        interval: seconds between two reports of this rank (and between two looks at the others', in
            groups of up to 64 ranks; larger groups look less often, at most every 10 s).
        store_timeout: seconds a store call may take before the store counts as lost; default
            ``timeout`` (at least 10).
        factor: the steady bound is at least ``factor`` times the slowest interval seen in the phase.
        startup_steps: progress calls of a phase's first run that the startup bound covers (2: the first
            step is covered whether progress is marked when a batch arrives or when the step ends).

    Raises:
        DistEnvError: DDP_UTILS_STALL_TIMEOUT or DDP_UTILS_STALL_STARTUP_TIMEOUT is not a number of seconds.
        ValueError: a negative timeout, or an interval that is not positive.

    Examples:
        >>> with StallWatchdog(timeout=60) as watchdog:  # no process group: no thread, marks only
        ...     for batch in watchdog.track(range(3), "train"):
        ...         watchdog.progress("train")
        ...     with watchdog.phase("metrics", None):
        ...         pass
        >>> watchdog.active
        False
    """

    def __init__(
        self,
        timeout: float | None = None,
        *,
        startup_timeout: float | None = None,
        interval: float = 1.0,
        store_timeout: float | None = None,
        factor: float = 3.0,
        startup_steps: int = 2,
    ) -> None:
        if timeout is None:
            timeout = stall_timeout_from_env()
        elif timeout < 0:
            raise ValueError(f"timeout={timeout!r}: give the seconds a rank may go without progress, or 0 for off")
        if startup_timeout is None:
            startup_timeout = env_seconds(os.environ, STARTUP_ENV, DEFAULT_STARTUP_TIMEOUT_S, False)
        if not interval > 0:
            raise ValueError(f"interval={interval!r}: give the seconds between two reports (> 0)")
        self.timeout = float(timeout) if timeout else None
        self.startup_timeout = max(float(startup_timeout), self.timeout or 0.0)
        self.interval = float(interval)
        self.store_timeout = float(store_timeout) if store_timeout else max(self.timeout or 0.0, 10.0)
        self.factor, self.startup_steps = float(factor), int(startup_steps)
        # the main thread's side: what it last did, read by the thread as one tuple (entry, step, time)
        self._seen: set[str] = set()
        self._blocks = 0
        created = time.monotonic()
        self._mark: tuple = (None, 0, created, created)  # (phase run, step, bound's clock, last progress)
        self._enter("start")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._finishing = threading.Event()  # this rank's work is done: it reports so and waits for the others
        self._wake = threading.Event()
        self._grace = 5.0 + 2 * self.interval  # seconds the ranks wait for each other as they part after a verdict
        self._holding: float | None = None  # once the thread ends the process: how long the main thread waits for it
        self._link: BoundedStore | None = None
        self._main = threading.get_ident()
        self._steady: dict[str, float] = {}  # phase -> its slowest interval between two progress calls
        self._entry_gaps: dict[str, float] = {}  # phase -> its slowest start (entry to first progress)
        self._views: list[RankView] = []
        self._resumed = 0.0
        self.rank, self.world_size = 0, 1

    @property
    def active(self) -> bool:
        """True while a watching thread runs (a process group, a store, and a timeout)."""
        return self._thread is not None

    # ---- the main thread's side -------------------------------------------------------------

    def progress(self, phase: str = "train") -> None:
        """Mark one unit of progress in ``phase`` (a training step, a validation batch); nearly free."""
        if phase != self._name or self._blocks:
            self._progress_elsewhere(phase)
            return
        self._step += 1
        now = time.monotonic()
        self._mark = (self._entry, self._step, now, now)

    def _progress_elsewhere(self, phase: str) -> None:
        if not self._blocks:  # inside a phase() block, progress restarts the block's clock and keeps its bound
            self._enter(phase)
        self._step += 1
        now = time.monotonic()
        self._mark = (self._entry, self._step, now, now)

    def _enter(self, name: str) -> None:
        first = name not in self._seen
        self._seen.add(name)
        self._entry, self._name, self._step = _Entry(name, first, _ADAPTIVE), name, 0
        self._restart_clock()

    def _restart_clock(self) -> None:
        """The bound's clock starts again (a phase entered or left); the time of the last progress stays."""
        self._mark = (self._entry, self._step, time.monotonic(), self._mark[3])

    @contextlib.contextmanager
    def phase(self, name: str, timeout: float | None) -> Iterator[None]:
        """A stretch with its own bound: ``timeout`` seconds without progress, None for unbounded.

        For a label-cache build, rank 0 computing mAP while the others wait in a collective, a
        checkpoint save. While a rank is in an unbounded phase, nobody is blamed. On leaving, the
        outer phase's clock starts again.
        """
        if timeout is not None and not timeout > 0:
            raise ValueError(f"phase {name!r}: timeout={timeout!r}; give seconds (> 0), or None for unbounded")
        outer = (self._entry, self._name, self._step)
        self._blocks += 1
        self._entry, self._step = _Entry(name, False, None if timeout is None else float(timeout)), 0
        self._restart_clock()
        try:
            yield
        finally:
            self._blocks -= 1
            self._entry, self._name, self._step = outer
            self._restart_clock()

    def track(self, iterable: Iterable[T], phase: str) -> Tracked[T]:
        """``iterable``'s items, marking progress in ``phase`` as each arrives; ``len()`` as ``iterable``'s.

        The phase is entered before the first item is asked for: a loader's start (its workers,
        its first batch) is bounded as a phase's start, apart from its steady steps.
        """
        return Tracked(self, iterable, phase)

    def _tracked(self, iterable: Iterable[T], phase: str) -> Iterator[T]:
        if not self._blocks:
            self._enter(phase)
        for item in iterable:
            self.progress(phase)
            yield item

    def __enter__(self) -> StallWatchdog:
        self._main = threading.get_ident()
        if self.timeout is None or not is_dist_initialized():
            return self
        store = default_store()
        if store is None:
            LOGGER.warning("stall watchdog: the process group has no store to report progress through; not watching")
            return self
        self.rank, self.world_size = get_rank(), get_world_size()
        namespace = f"ddp_utils/watchdog/{dist_info().restart_count}/{_started[0]}"
        _started[0] += 1
        self._verdict_key = f"{namespace}/verdict"
        self._states = [f"{namespace}/state/{rank}" for rank in range(self.world_size)]
        self._who = [f"{namespace}/who/{rank}" for rank in range(self.world_size)]  # host, local rank, pid
        self._address = store_address(store)
        connect = functools.partial(private_connection, store, self.store_timeout)
        self._link = BoundedStore(connect, self.store_timeout, name="ddp_utils-watchdog-store")
        self._judge_every = min(max(self.interval, self.interval * self.world_size / 64), 10.0)
        self._stale = min(self.timeout / 2, max(5 * self.interval + self._judge_every, 10.0))
        report, local_rank = self._report(self._mark, time.monotonic(), 0), dist_info().local_rank
        identity = json.dumps({"host": socket.gethostname(), "local_rank": local_rank, "pid": os.getpid()})

        def first(store: Any) -> tuple:
            store.set(self._who[self.rank], identity)  # for the verdict: which machine and process to open
            return self._exchange(store, report, judging=False)

        try:  # reported before the loop starts: a rank stopped in its first steps is seen stopping, not absent
            self._link.call(first)
        except StoreLostError as exc:
            LOGGER.warning(f"rank {self.rank}: stall watchdog: the store at {self._address} does not answer ({exc})")
            self._link.close()
            self._link = None
            return self
        self._stop.clear()
        self._finishing.clear()
        self._thread = threading.Thread(target=self._run, name="ddp_utils-stall-watchdog", daemon=True)
        self._thread.start()
        if self.rank == 0:
            LOGGER.info(
                f"stall watchdog: a rank without progress for {self.timeout:.0f} s ({self.startup_timeout:.0f} s in "
                f"its first steps) ends the job with exit code {STALL_EXIT_CODE} for a restart ({TIMEOUT_ENV})"
            )
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Done (never blamed): without an error, the thread watches on until every rank is done (see Finishing)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            if exc_type is None:
                self._finishing.set()
                self._wake.set()
                while thread.is_alive():  # it ends once every rank is done; a verdict ends the process
                    thread.join(timeout=1.0)
        finally:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=self._holding or self.interval + 5.0)

    # ---- the thread's side ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # a fault of the watchdog's own must not end training
            LOGGER.warning(f"rank {self.rank}: stall watchdog stopped ({type(exc).__name__}: {exc}); not watching")
        self._leave()

    def _watch(self) -> None:
        self._resumed = last = judge_at = time.monotonic()
        self._observer = Observer(self.startup_timeout, self._stale, self._resumed)
        previous, beat, finishing = self._mark, 0, False
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            if self._finishing.is_set() and not finishing:
                finishing, judge_at = True, now  # judged at once: the last rank to finish leaves without a wait
            if now - last > self.interval + max(10.0, 5 * self.interval):
                self._resumed = now  # this process stood still (the job stopped, a SLURM suspend): clocks restart
            last, mark, beat = now, self._mark, beat + 1
            self._learn(previous, mark)
            previous, judging = mark, now >= judge_at
            report = self._report(mark, now, beat, done=finishing)
            exchange = functools.partial(self._exchange, report=report, judging=judging)
            try:
                verdict, states = self._link.call(exchange)
            except StoreLostError as exc:
                if not self._stop.is_set():
                    self._store_lost(exc)
                return
            if self._stop.is_set():
                return
            if verdict is not None:
                self._end(verdict)
            if judging:
                judge_at = now + self._judge_every
                self._views = self._observer.see(states, now, self._resumed)
                tie = 2 * self._judge_every + self.interval
                stalled = find_stalled(self._views, tie=tie, dead_after=self.timeout, stale=self._stale)
                if self._observer.confirmed(stalled):
                    self._decide(stalled)
                if finishing and all(v.done for v in self._views):
                    return  # every rank is done: nobody is left to wait for

    def _learn(self, previous: tuple, mark: tuple) -> None:
        """Record the interval between two marks of one phase run: the adaptive bounds grow from these."""
        (entry0, step0, t0, _), (entry, step, t, _) = previous, mark
        if entry is not entry0 or step <= step0 or entry.bound is not _ADAPTIVE or t0 < self._resumed:
            return
        if entry.first and step0 < self.startup_steps:
            return  # the first steps are no measure of the rest
        table = self._entry_gaps if step0 == 0 else self._steady
        table[entry.name] = max(table.get(entry.name, 0.0), t - t0)

    def _bound(self, entry: _Entry, step: int) -> float | None:
        if entry.bound is not _ADAPTIVE:
            return entry.bound
        if entry.first and step < self.startup_steps:
            return self.startup_timeout
        slowest = (self._entry_gaps if step == 0 else self._steady).get(entry.name, 0.0)
        return max(self.timeout, self.factor * slowest)

    def _report(self, mark: tuple, now: float, beat: int, done: bool = False, left: bool = False) -> str:
        entry, step, clock, last_progress = mark
        frame = sys._current_frames().get(self._main)
        where, waiting = "", False
        if frame is not None:
            where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
            waiting = is_waiting_frame(str(frame.f_globals.get("__name__", "")))
        idle, quiet = (round(now - max(t, self._resumed), 2) for t in (clock, last_progress))
        report = {"beat": beat, "phase": entry.name, "step": step, "idle": idle, "quiet": quiet}
        report.update(bound=self._bound(entry, step), block=entry.bound is not _ADAPTIVE, done=done, left=left)
        report.update(waiting=waiting, where=where)
        return json.dumps(report, separators=(",", ":"))

    def _exchange(self, store: Any, report: str, judging: bool) -> tuple[str | None, list | None]:
        """On the store's helper thread: publish this rank's report, read the verdict and (judging) every report."""
        store.set(self._states[self.rank], report)
        verdict = store.get(self._verdict_key).decode() if store.check([self._verdict_key]) else None
        if not judging:
            return verdict, None
        if store.check(self._states):  # multi_get waits for missing keys: only once every rank has reported
            multi_get = getattr(store, "multi_get", None)
            return verdict, multi_get(self._states) if multi_get else [store.get(k) for k in self._states]
        return verdict, [store.get(k) if store.check([k]) else None for k in self._states]

    def _decide(self, stalled: list[RankView]) -> None:
        views = self._views
        live = [v.rank for v in views if not v.left and v.started and v.heartbeat_age <= self._stale]
        left, finished = [v.rank for v in views if v.left], [v.rank for v in views if v.done and not v.left]

        def decide(store: Any) -> Any:  # the first verdict stays: every rank ends with the same one
            keys = {v.rank: self._who[v.rank] for v in stalled}
            who = {rank: json.loads(store.get(key)) for rank, key in keys.items() if store.check([key])}
            lines = blame_lines(stalled, self._stale, left=left, who=who, finished=finished)
            verdict = {"by": self.rank, "stalled": [v.rank for v in stalled], "lines": lines, "live": live, "who": who}
            return store.compare_set(self._verdict_key, "", json.dumps(verdict))

        try:
            stored = self._link.call(decide)
        except StoreLostError as exc:
            self._store_lost(exc)
            return
        self._end(stored.decode() if isinstance(stored, bytes) else str(stored))

    def _end(self, raw: str) -> NoReturn:
        self._hold_the_exit()
        restart = (
            f"stall watchdog: ending every rank with exit code {STALL_EXIT_CODE} so that the launcher restarts the "
            f"job (torchrun --max-restarts, a SLURM requeue) from its last save ({TIMEOUT_ENV}={self.timeout:g})"
        )
        parting = (self._link, self._verdict_key, self._grace)
        part_after_verdict(json.loads(raw), self.rank, self._main, parting, restart)

    def _store_lost(self, exc: Exception) -> None:
        others = [v for v in self._views if v.rank != self.rank]
        if others and all(v.done for v in others):
            return  # every other rank has finished: nobody is left to wait for
        line = (
            f"[rank {self.rank}] stall watchdog: lost the rendezvous store at {self._address} ({exc}): its host "
            "stopped or died (rank 0 hosts it under a plain env:// launch, the torchrun agent under torchrun), "
            "so no rank can be told of a stall; stopping this rank"
        )
        self._hold_the_exit()  # one line: this rank only waited, its stack would say nothing of the cause
        exit_for_restart([line], line, STALL_EXIT_CODE)

    def _hold_the_exit(self) -> None:
        """From here on this thread ends the process: the main thread's exit waits for it (:func:`.hold_the_exit`)."""
        self._holding = 3 * self._grace  # the parting, two flushes and a margin
        hold_the_exit(STALL_EXIT_CODE, self._holding)

    def _leave(self) -> None:
        link, self._link = self._link, None
        if link is None:
            return
        report = self._report(self._mark, time.monotonic(), -1, done=True, left=True)
        with contextlib.suppress(StoreLostError):
            link.call(lambda store: store.set(self._states[self.rank], report), timeout=min(self.store_timeout, 5.0))
        link.close()
