"""How ranks part once the stall watchdog ends the job: a stalled rank that still runs prints where its main thread
is, they acknowledge the verdict and leave in order, and each exits with the restart's code, whatever its main
thread does meanwhile.

All of it runs on the watchdog's thread (:mod:`.watchdog`), never on the main thread, which may be stuck in a
read, in a collective, or inside a write that holds sys.stderr's lock: output goes straight to file descriptor
2, a flush gives up after a while, and every wait on the store is bounded.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

from .errors import record_error_for_launcher
from .stall import STALL_EXIT_CODE, identity_words
from .store import BoundedStore, StoreLostError


def write_stderr(text: str) -> None:
    """Straight to file descriptor 2: a main thread stuck inside a write holds sys.stderr's lock."""
    data = text.encode("utf-8", "replace")
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(2, data) :]


def flush_stdio(timeout: float = 2.0) -> None:
    """Flush sys.stdout and sys.stderr, giving up after ``timeout`` (a main thread may hold their locks)."""

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()

    thread = threading.Thread(target=flush, name="ddp_utils-flush", daemon=True)
    thread.start()
    thread.join(timeout)


def thread_stack(ident: int, header: str, prefix: str = "") -> str:
    """``header`` and the stack of the thread ``ident``, every line after ``prefix``.

    Examples:
        >>> import threading
        >>> print(thread_stack(threading.get_ident(), "here:", prefix="[rank 0] ").splitlines()[0])
        [rank 0] here:
    """
    frame = sys._current_frames().get(ident)
    body = traceback.format_stack(frame) if frame is not None else ["  (the thread has ended)\n"]
    lines = [line for chunk in body for line in chunk.rstrip("\n").split("\n")]
    return "".join(f"{prefix}{line}\n" for line in [header, *lines])


def show_main_thread(main: int, header: str, rank: int) -> None:
    """Print ``header`` and the stack of the main thread ``main``, after what the rank printed before."""
    flush_stdio()
    write_stderr(thread_stack(main, header, prefix=f"[rank {rank}] "))


def part_in_order(
    link: BoundedStore, rank: int, verdict_key: str, deciding: bool, live: list[int], grace: float
) -> None:
    """Acknowledge a verdict over ``link``, and leave in order.

    No rank leaves before every live rank has acknowledged: a rank that leaves closes the collective
    the others wait in, and a rank whose watchdog had not yet read the verdict would end with that
    error (exit code 1) instead of the restart's. So the decider has the stalled rank's stack before it
    says why. Rank 0 (the store's host under env://) leaves last, so that no rank's last call meets a
    closed store. Waits at most ``grace`` seconds; a lost store ends the waiting.
    """
    deadline = time.monotonic() + grace
    acks, left = f"{verdict_key}/acks", f"{verdict_key}/left"

    def wait_for(key: str, count: int) -> None:
        while link.call(lambda store: store.add(key, 0), timeout=grace) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    with contextlib.suppress(StoreLostError):
        link.call(lambda store: store.add(acks, 1), timeout=grace)
        wait_for(acks, len(live))
        if rank != 0:
            link.call(lambda store: store.add(left, 1), timeout=grace)
        else:
            wait_for(left, len([other for other in live if other != 0]))


def part_after_verdict(verdict: dict[str, Any], rank: int, main: int, parting: tuple, restart: str) -> NoReturn:
    """Every live rank, once a ``verdict`` is stored: a stalled rank prints its main thread's stack (where it is
    stuck; a rank that only waited for it has nothing to add), then all part in order and exit for a restart.

    Args:
        verdict: the stored verdict: ``by`` (the decider), ``stalled``, ``lines``, ``live`` and ``who`` (each
            stalled rank's host, local rank and pid).
        rank: this rank.
        main: the main thread's ident.
        parting: ``(link, verdict_key, grace)`` for :func:`part_in_order`.
        restart: the decider's last line, saying how the job goes on.
    """
    stalled, code = verdict["stalled"], STALL_EXIT_CODE
    who = {int(other): where for other, where in verdict.get("who", {}).items()}
    named = ", ".join(f"{other}{identity_words(who.get(other))}" for other in stalled)
    named = f"rank{'s' if len(stalled) > 1 else ''} {named}"
    if rank in stalled:
        show_main_thread(main, "stall watchdog: this rank is the one stalled; this rank's main thread is at:", rank)
    link, verdict_key, grace = parting
    deciding = verdict["by"] == rank
    part_in_order(link, rank, verdict_key, deciding, verdict["live"], grace)
    if deciding:
        exit_for_restart([*verdict["lines"], restart], " | ".join(verdict["lines"]), code)
    line = f"[rank {rank}] stall watchdog: stopping: {named} stalled (rank {verdict['by']} says why)"
    exit_for_restart([line], line, code)


def hold_the_exit(code: int, seconds: float) -> None:
    """From a thread that is ending the process with ``code``: the interpreter must not end first.

    Ranks parting after a verdict make the main thread fail (a rank that left closes the collective
    it waits in). Were the main thread then to end the interpreter, the process would exit with the
    main thread's code (1), or abort (-6) as finalization stops a thread inside a store call, where
    every rank must exit with ``code`` for a restart. Registered at exit (the interpreter still whole,
    other threads still running), this makes the main thread, once out of its code, wait up to
    ``seconds`` for the caller's ``os._exit``, and then exit with ``code`` itself.
    """

    def hold() -> None:
        time.sleep(seconds)
        flush_stdio()
        os._exit(code)

    atexit.register(hold)


def exit_for_restart(lines: list[str], for_launcher: str, code: int) -> NoReturn:
    """Print ``lines``, leave ``for_launcher`` in torchrun's error file, flush stdio, and exit with ``code`` at once."""
    write_stderr("".join(f"{line}\n" for line in lines))
    record_error_for_launcher(for_launcher)
    flush_stdio()
    os._exit(code)
