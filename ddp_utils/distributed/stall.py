"""Who stalled: the stall watchdog's verdict from every rank's last progress report, and how it is told.

Pure functions over :class:`RankView` (one rank as an observer sees it, on the observer's own
clock), so the rules can be read, and tested, apart from threads and stores. The rules:

1. Nobody is blamed while any rank that has not left is in an unbounded phase: it may be
   rank 0 computing mAP while the others wait in a collective, and those must not be blamed.
2. A rank is *overdue* when it has not made progress for longer than its bound, or its
   heartbeat has not moved for longer than ``dead_after`` (the steady-state bound: a stopped
   process is not slow work, whatever its phase allows). Nothing overdue: no stall.
3. Overdue ranks whose heartbeat stopped are blamed: their whole process stands still.
4. A rank that overran a ``phase()`` block's own bound (a save, mAP) is blamed: the others wait
   for it. While a rank is inside a block within its bound, nobody is blamed.
5. Else the rank that stopped first is blamed: in lock-step training, the ranks waiting for it
   went on at least to the collective it never reached, so its last progress call is the oldest
   (blocks entered or left since do not count as progress). Ranks within ``tie`` seconds of the
   oldest are suspects; while one of them is still inside its own bound, nobody is blamed yet
   (a waiter's bound may run out before the laggard's).
   Suspects in the same phase at different steps: the ones behind. Still several: the ones whose
   main thread is not inside torch.distributed or autograd (the others are probably waiting). Still
   several: all of them, and the words say one holds up the others.

The observer (:mod:`.watchdog`) adds two guards of its own: time spent waiting while a rank held
the group (rules 1 and 4) does not count against the others' bounds, and a verdict stands only
when the next judgement, on newer reports, finds the same ranks stalled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .env import DistEnvError

STALL_EXIT_CODE = 75  # EX_TEMPFAIL in sysexits.h: a temporary failure, run it again (0, 1, 2 = usage are taken)
DEFAULT_STALL_TIMEOUT_S = 120.0
DEFAULT_STARTUP_TIMEOUT_S = 900.0
TIMEOUT_ENV = "DDP_UTILS_STALL_TIMEOUT"
STARTUP_ENV = "DDP_UTILS_STALL_STARTUP_TIMEOUT"
_OFF = ("0", "off", "false", "no", "none")
WAITING_MODULES = (  # a main thread whose innermost frame is here is probably waiting for the others
    "torch.distributed",
    "torch.autograd",
    "torch.nn.parallel",
    "ddp_utils.distributed.collectives",
    "ddp_utils.distributed.group",
)


def env_seconds(environ: Mapping[str, str], name: str, default: float, may_disable: bool) -> float | None:
    """Seconds from the variable ``name``: ``default`` when unset; None for "0"/"off" where ``may_disable``."""
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = 0.0 if value.lower() in _OFF else float(value)
    except ValueError:
        seconds = math.nan
    if may_disable and seconds == 0:
        return None
    if not 0 < seconds < math.inf:
        off = ", or 0/off to turn the stall watchdog off" if may_disable else ""
        raise DistEnvError(f"{name}={value!r} is not a number of seconds: give seconds, e.g. {default:.0f}{off}")
    return seconds


def stall_timeout_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """DDP_UTILS_STALL_TIMEOUT in seconds: the default when unset, None when "0" or "off".

    Raises:
        DistEnvError: a value that is not a positive number of seconds, naming the variable.

    Examples:
        >>> [stall_timeout_from_env(env) for env in ({}, {TIMEOUT_ENV: "300"}, {TIMEOUT_ENV: "off"})]
        [120.0, 300.0, None]
    """
    return env_seconds(os.environ if environ is None else environ, TIMEOUT_ENV, DEFAULT_STALL_TIMEOUT_S, True)


@dataclass(frozen=True)
class RankView:
    """One rank's last report, as an observer sees it.

    Attributes:
        rank: its global rank.
        phase: the phase it reported ("start" before its first progress).
        step: its progress calls in that phase since it entered it.
        idle: seconds on its bound's clock: since its last progress, or since it entered or left a
            :meth:`~ddp_utils.distributed.StallWatchdog.phase` block (its report's figure plus the report's age).
        bound: seconds ``idle`` may reach; None: unbounded.
        quiet: seconds since its last progress call, whatever phases it entered or left since.
        block: it is inside a ``phase()`` block: a bound of its own, for slow work the others may wait for.
        heartbeat_age: seconds since its reports last changed, on the observer's clock.
        done: it finished its work (left its watchdog without an error): never blamed.
        left: its watchdog's thread has ended (after an error, or once every rank was done): it reads no verdict.
        started: it has reported at all (a rank that never did is bounded by the startup bound).
        waiting: its main thread is inside torch.distributed or autograd.
        where: its main thread's innermost frame, ``file:line in function``.
    """

    rank: int
    phase: str = "start"
    step: int = 0
    idle: float = 0.0
    bound: float | None = None
    quiet: float | None = None
    block: bool = False
    heartbeat_age: float = 0.0
    done: bool = False
    left: bool = False
    started: bool = True
    waiting: bool = False
    where: str = ""


def find_stalled(views: list[RankView], tie: float, dead_after: float, stale: float) -> list[RankView]:
    """The ranks to blame for a stall, by the rules above; empty: no stall (yet).

    Args:
        views: every rank of the group.
        tie: seconds within which two ranks' idle times cannot be told apart.
        dead_after: seconds after which a stopped heartbeat alone makes a rank overdue.
        stale: seconds after which a heartbeat counts as stopped.

    Examples:
        >>> stuck = RankView(1, "train", step=36, idle=125.0, bound=120.0, heartbeat_age=0.5)
        >>> waiting = RankView(0, "train", step=37, idle=124.8, bound=120.0, heartbeat_age=0.5)
        >>> [v.rank for v in find_stalled([waiting, stuck], tie=2.0, dead_after=120.0, stale=10.0)]
        [1]
        >>> mapping = RankView(0, "metrics", idle=600.0, bound=None)  # rank 0 unbounded: the others wait
        >>> find_stalled([mapping, stuck], tie=2.0, dead_after=120.0, stale=10.0)
        []
    """
    active = [v for v in views if not v.done]
    if not active or any(v.bound is None for v in active if v.started):
        return []

    def overdue(v: RankView) -> bool:
        if not v.started:
            return v.idle > (v.bound or 0.0)
        return v.idle > (v.bound or 0.0) or v.heartbeat_age > dead_after

    late = [v for v in active if overdue(v)]
    if not late:
        return []
    dead = [v for v in late if v.started and v.heartbeat_age > stale]
    if dead:
        return dead
    overran = [v for v in late if v.block]
    if overran or holding(active):
        return overran  # slow work past its own bound, or still within it: the others are waiting for it

    def quiet(v: RankView) -> float:
        return v.idle if v.quiet is None else v.quiet

    longest = max(quiet(v) for v in active)
    suspects = [v for v in active if quiet(v) >= longest - tie]
    if not all(overdue(v) for v in suspects):
        return []  # the one that stopped first is still inside its bound: wait for it
    phases = {v.phase for v in suspects}
    if len(phases) == 1:
        lowest = min(v.step for v in suspects)
        suspects = [v for v in suspects if v.step == lowest]
    working = [v for v in suspects if not v.waiting]
    return working if working else suspects


def holding(views: list[RankView]) -> bool:
    """Whether a rank holds the others with known slow work: an unbounded phase, or a block within its bound.

    Examples:
        >>> holding([RankView(0, "metrics", idle=50.0, bound=None, block=True), RankView(1, "train", bound=120.0)])
        True
    """
    return any(v.started and not v.done and (v.bound is None or (v.block and v.idle <= v.bound)) for v in views)


class Observer:
    """One rank's view of every rank's reports, on its own clock.

    It turns reports into :class:`RankView` s (a report's age: how long its heartbeat has stood still
    here), keeps the last time some rank held the group with known slow work (:func:`holding`: time
    spent waiting for it does not count against the others' bounds), and confirms verdicts: one
    stands when the judgement before found the same ranks stalled, on older reports (or dead ones),
    so that no verdict rests on a report that a rank released a moment ago had no time to renew.

    Args:
        startup_bound: the bound of a rank that has not reported yet.
        stale: seconds after which a heartbeat counts as stopped.
        now: the observer's clock when it starts watching.
    """

    def __init__(self, startup_bound: float, stale: float, now: float) -> None:
        self.startup_bound, self.stale, self.started_at = startup_bound, stale, now
        self.heartbeats: dict[int, tuple[int, float]] = {}  # rank -> (its heartbeat, when it was seen to change)
        self.suspects: dict[int, int | None] = {}  # rank -> its heartbeat when the last judgement found it stalled
        self.held_at: float | None = None

    def see(self, reports: list[bytes | str | None], now: float, resumed: float) -> list[RankView]:
        """Views of every rank's report (None: none yet); ``resumed``: when this process last stood still."""
        views = []
        for rank, raw in enumerate(reports):
            if raw is None:  # not reporting yet: bounded as a start
                views.append(
                    RankView(rank, started=False, idle=now - max(self.started_at, resumed), bound=self.startup_bound)
                )
                continue
            report = json.loads(raw)
            beat, seen_at = self.heartbeats.get(rank, (None, now))
            if beat != report["beat"]:
                self.heartbeats[rank], seen_at = (report["beat"], now), now
            age = now - max(seen_at, resumed)
            fields = {k: report[k] for k in ("phase", "step", "bound", "block", "done", "waiting", "where")}
            fields["left"] = report.get("left", False)
            idle, quiet = report["idle"] + age, report["quiet"] + age
            views.append(RankView(rank, idle=idle, quiet=quiet, heartbeat_age=age, **fields))
        if holding(views):
            self.held_at = now
        if self.held_at is None:
            return views
        held = now - self.held_at
        return [v if v.block else dataclasses.replace(v, idle=min(v.idle, held)) for v in views]

    def confirmed(self, stalled: list[RankView]) -> bool:
        """Whether ``stalled`` (this judgement's verdict) stands: see the class."""
        previous = self.suspects
        self.suspects = {v.rank: self.heartbeats.get(v.rank, (None, 0.0))[0] for v in stalled}
        return bool(stalled) and all(
            v.rank in previous and (previous[v.rank] != self.suspects[v.rank] or v.heartbeat_age > self.stale)
            for v in stalled
        )


def blame_lines(
    stalled: list[RankView],
    stale: float,
    left: list[int] | tuple[int, ...] = (),
    who: Mapping[int, Mapping[str, object]] | None = None,
    finished: list[int] | tuple[int, ...] = (),
) -> list[str]:
    """One line per stalled rank, naming it, where it runs (``who``: its host, local rank and pid, as it published
    them) and what its heartbeat says; one more when they tie, one naming the ranks that ``left`` their watchdog
    (failed, or an older ddp_utils) while these wait, and one naming the ranks that ``finished`` and wait for them.

    Examples:
        >>> frozen = RankView(1, "train", step=37, idle=121.2, bound=120.0, heartbeat_age=118.0)
        >>> who = {1: {"host": "node-3", "local_rank": 1, "pid": 4242}}
        >>> for part in blame_lines([frozen], stale=10.0, who=who)[0].split("; "):
        ...     print(part)
        rank 1 stalled: no progress for 121 s in phase 'train' (step 37) on host node-3 (local rank 1, pid 4242)
        its heartbeat stopped 118 s ago: stopped (SIGSTOP) or hung in the kernel?
    """
    who = who or {}
    lines = []
    for v in stalled:
        at = identity_words(who.get(v.rank))
        if not v.started:
            lines.append(
                f"rank {v.rank} stalled{at}: it never reported to its stall watchdog ({v.idle:.0f} s since this rank "
                "started watching): it has not got that far (see its log and stack), or it runs without the watchdog"
            )
            continue
        silent = v.idle if v.quiet is None else max(v.idle, v.quiet)
        head = f"rank {v.rank} stalled: no progress for {silent:.0f} s in phase '{v.phase}' (step {v.step}){at}"
        if v.heartbeat_age > stale:
            stopped = f"its heartbeat stopped {v.heartbeat_age:.0f} s ago: stopped (SIGSTOP) or hung in the kernel?"
            lines.append(f"{head}; {stopped}")
        else:
            where = f" (at {v.where})" if v.where else ""
            lines.append(f"{head}; its heartbeat is alive: stuck in Python/IO{where}, see its stack above")
    alive = [v for v in stalled if v.started and v.heartbeat_age <= stale]
    if len(alive) > 1:
        ranks = ", ".join(str(v.rank) for v in alive)
        lines.append(
            f"ranks {ranks} stopped at the same point: one of them holds up the others in a collective; "
            "compare their stacks above"
        )
    if left:
        lines.append(
            f"{_ranks(left)} left the stall watchdog before (failed, see the log); a collective waiting for a rank "
            "that left never ends"
        )
    if finished:
        lines.append(f"{_ranks(finished)} finished and waited for {_ranks([v.rank for v in stalled])} to finish")
    return lines


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def is_waiting_frame(module: str) -> bool:
    """Whether a frame of ``module`` is probably waiting for other ranks.

    Examples:
        >>> is_waiting_frame("torch.distributed.distributed_c10d"), is_waiting_frame("my_project.data")
        (True, False)
    """
    return module.startswith(WAITING_MODULES)


def identity_words(identity: Mapping[str, object] | None) -> str:
    """Where a rank runs, in words: " on host H (local rank L, pid P)"; empty when unknown.

    Examples:
        >>> identity_words({"host": "node-3", "local_rank": 1, "pid": 4242})
        ' on host node-3 (local rank 1, pid 4242)'
        >>> identity_words(None)
        ''
    """
    if not identity:
        return ""
    return f" on host {identity.get('host')} (local rank {identity.get('local_rank')}, pid {identity.get('pid')})"
