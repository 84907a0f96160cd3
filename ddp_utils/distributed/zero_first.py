"""First-process-first sections: the store-and-heartbeat protocol behind ``torch_distributed_zero_first``.

The leader (a node's local rank 0, or global rank 0) runs the body while the others
poll a key in the group's c10d store instead of sitting in a barrier: a long body trips
no collective timeout, the leader's error reaches every follower within a second, and a
leader killed outright is noticed when its heartbeat stops.

A section is named by what it guards (``key=``: a dataset directory, a cache file), else by the
line of code that opens it, and by how many times this process opened a section of that name:
never by a process-wide count, which drifts as soon as one rank opens a section the others do not,
leaving them waiting on a key nobody writes. Every wait is bounded (:data:`SECTION_TIMEOUT_S` by
default), so a drift that remains fails, naming the section, instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from ..log import LOGGER
from .env import DistEnvError, dist_info
from .group import barrier, get_rank, get_world_size, is_dist_initialized
from .store import default_store as _default_store


class RankFailedError(RuntimeError):
    """Another rank failed inside a section this rank was waiting on.

    Args:
        message: what happened, naming the rank.
        leader_error: the leader's own error as a traceback's last line gives it (``"module.Type: message"``),
            when it raised one (not when it died or went silent).

    Examples:
        >>> exc = RankFailedError("rank 0 failed", "FileNotFoundError: no x.yaml")
        >>> exc.leader_raised(OSError), exc.leader_raised(ValueError), exc.leader_message
        (True, False, 'no x.yaml')
    """

    def __init__(self, message: str, leader_error: str | None = None) -> None:
        super().__init__(message)
        self.leader_error = leader_error

    @property
    def leader_message(self) -> str:
        """The leader's error message, without its type."""
        return (self.leader_error or "").partition(":")[2].strip()

    def leader_raised(self, *types: type[BaseException]) -> bool:
        """Whether the leader's error was one of ``types`` (or a subclass): a follower may then end as it did.

        Only classes of modules this process has imported are recognised; nothing is imported here.
        """
        if not self.leader_error:
            return False
        module, _, qualname = self.leader_error.partition(":")[0].strip().rpartition(".")
        found = getattr(sys.modules.get(module or "builtins"), qualname, None)
        return isinstance(found, type) and issubclass(found, types)


SECTION_TIMEOUT_S = 3 * 3600.0  # the longest a follower waits by default: a full COCO download on a slow link
_openings: dict[tuple[str, str], int] = {}  # (scope, key): sections of that name this process has opened


def _caller_key(depth: int) -> str:
    """``module:line`` of the code ``depth`` frames up: the same on every rank (not a file path, which
    may differ between nodes' installs)."""
    frame = sys._getframe(depth + 1)
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}"


def _section_name(scope: str, key: str) -> str:
    """The store key of this process's next section named ``key`` in ``scope``; a section opened again
    (the same cache in another loader, a loop) gets the next number, on every rank alike."""
    n = _openings.get((scope, key), 0)
    _openings[(scope, key)] = n + 1
    return f"{scope}/{key}/{n}"


def _check_timeout(timeout: float | None) -> float:
    if timeout is None or not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: give the seconds a follower may wait (> 0); no wait is unbounded")
    return float(timeout)


HEARTBEAT_S = 2.0  # the leader's heartbeat period in a first-process section


def _heartbeat_timeout() -> float:
    value = os.environ.get("DDP_UTILS_HEARTBEAT_TIMEOUT", "")
    try:
        return float(value) if value else 60.0
    except ValueError:
        raise DistEnvError(f"DDP_UTILS_HEARTBEAT_TIMEOUT={value!r} is not a number of seconds") from None


@contextlib.contextmanager
def _heartbeat(store: Any, key: str) -> Iterator[None]:
    """Count up ``key`` every HEARTBEAT_S seconds while the body runs, from a daemon thread."""
    stop = threading.Event()
    store.add(key, 1)  # the first beat says the leader is in: before it, it may only be late

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # the store going away is the followers' news
                store.add(key, 1)

    thread = threading.Thread(target=beat, name="ddp_utils-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _wait_for_key(store: Any, key: str, leader: int, deadline: float, log_every: float) -> None:
    """Poll for ``key``; fail when the deadline passes or the leader's heartbeat stops.

    A leader that raises publishes its error, but one killed outright (SIGKILL, the OOM
    killer) publishes nothing: its heartbeat (``key/beat``, counted up every few seconds)
    then stops moving, and after DDP_UTILS_HEARTBEAT_TIMEOUT seconds (default 60) the
    followers give up instead of waiting for a launcher to end them. Counting changes
    on the follower's own clock needs no clock agreement between nodes.
    """
    start = time.monotonic()
    next_log = start + log_every
    stale_after = _heartbeat_timeout()
    last_beat, beat_seen_at = -1, start
    pause = 0.005
    while True:
        try:
            if store.check([key]):
                return
            beat = store.add(f"{key}/beat", 0)
        except Exception as exc:  # the store's host (rank 0 under env://) is gone
            raise RankFailedError(
                f"rank {get_rank()}: lost the rendezvous store while waiting for rank {leader} "
                f"to finish its first-process section ({type(exc).__name__}: {exc})"
            ) from exc
        now = time.monotonic()
        if beat != last_beat:
            last_beat, beat_seen_at = beat, now
        elif beat > 0 and now - beat_seen_at > stale_after:
            raise RankFailedError(
                f"rank {get_rank()}: rank {leader} stopped responding in its first-process section "
                f"(no heartbeat for {now - beat_seen_at:.0f} s): it was probably killed (OOM killer?); "
                "see its log"
            )
        if now > deadline:
            raise RankFailedError(
                f"rank {get_rank()}: gave up after {now - start:.0f} s waiting for rank {leader} "
                f"to finish its first-process section {key!r} (did it open the section under another name?)"
            )
        if now >= next_log:
            LOGGER.warning(f"rank {get_rank()}: still waiting for rank {leader} ({now - start:.0f} s)")
            next_log = now + log_every
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def _await_acks(store: Any, key: str, expected: int, seconds: float) -> None:
    # A failing leader stays until its followers have read the error: when it hosts
    # the store, leaving at once would leave them a "connection closed" instead.
    deadline = time.monotonic() + seconds
    with contextlib.suppress(Exception):
        while store.add(key, 0) < expected and time.monotonic() < deadline:
            time.sleep(0.02)


@contextlib.contextmanager
def _leader_first(
    is_leader: bool, leader_rank: int, followers: int, scope: str, key: str, timeout: float
) -> Iterator[None]:
    if not is_dist_initialized():
        yield
        return
    store = _default_store()
    if store is None:  # no store to talk through: fall back to the classic two barriers
        if not is_leader:
            barrier()
        yield
        if is_leader:
            barrier()
        return
    info = dist_info()
    # named by what it guards, on every rank alike; the restart count keeps an elastic restart from reading old keys
    key = f"ddp_utils/first/{info.restart_count}/{_section_name(scope, key)}"
    if is_leader:
        try:
            with _heartbeat(store, f"{key}/beat"):
                yield
        except BaseException as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            store.set(key, f"error:{detail}")
            _await_acks(store, f"{key}/ack", followers, seconds=10.0)
            raise
        store.set(key, "ok")
        return
    deadline = time.monotonic() + timeout
    _wait_for_key(store, key, leader_rank, deadline, log_every=60.0)
    status = store.get(key).decode()
    if status.startswith("error:"):
        with contextlib.suppress(Exception):
            store.add(f"{key}/ack", 1)
        leader_error = status[len("error:") :]
        raise RankFailedError(
            f"rank {leader_rank} failed in its first-process section, so rank {get_rank()} stops too: {leader_error}",
            leader_error,
        )
    yield


def torch_distributed_zero_first(
    local_rank: int, timeout: float = SECTION_TIMEOUT_S, key: str | None = None
) -> contextlib.AbstractContextManager[None]:
    """Let the first process of each node run the body first; the node's others wait.

    Use it around work each node needs once before its processes can share it: a
    dataset download to local disk, a label cache build. The waiting processes poll
    the process group's store instead of sitting in a barrier, so a body that runs
    for an hour trips no collective timeout, and when the first process raises, the
    others raise :class:`RankFailedError` within a second, naming its rank and error.

    Args:
        local_rank: this process's rank within its node (-1 for a single process). YOLOv5's call,
            ``torch_distributed_zero_first(local_rank)``, is all it needs.
        timeout: seconds the others wait before they give up with :class:`RankFailedError`
            (logging "still waiting" every minute); every wait is bounded.
        key: what the section guards (a dataset directory, a cache file), the same on every rank of
            the node; default: the module and line that open the section.

    Raises:
        ValueError: a timeout that is None or not positive.

    Examples:
        >>> with torch_distributed_zero_first(-1):  # single process: just runs
        ...     pass
        >>> with torch_distributed_zero_first(-1, key="datasets/coco128"):
        ...     pass
    """
    return _zero_first(local_rank, _check_timeout(timeout), key if key is not None else _caller_key(1))


@contextlib.contextmanager
def _zero_first(local_rank: int, timeout: float, key: str) -> Iterator[None]:
    if not is_dist_initialized() or local_rank == -1:
        yield
        return
    info = dist_info()
    leader = info.rank - info.local_rank  # global rank of this node's local rank 0
    followers = info.local_world_size - 1
    with _leader_first(local_rank == 0, leader, followers, f"node{info.node_rank}", key, timeout):
        yield


def torch_distributed_rank_zero_first(
    timeout: float = SECTION_TIMEOUT_S, key: str | None = None
) -> contextlib.AbstractContextManager[None]:
    """Let global rank 0 run the body first, then every other rank of the job.

    The job-wide variant of :func:`torch_distributed_zero_first`, for work whose result
    lands on a file system all nodes share; ``timeout`` and ``key`` as there.

    Examples:
        >>> with torch_distributed_rank_zero_first():
        ...     pass
    """
    return _rank_zero_first(_check_timeout(timeout), key if key is not None else _caller_key(1))


@contextlib.contextmanager
def _rank_zero_first(timeout: float, key: str) -> Iterator[None]:
    if not is_dist_initialized():
        yield
        return
    with _leader_first(get_rank() == 0, 0, get_world_size() - 1, "job", key, timeout):
        yield
