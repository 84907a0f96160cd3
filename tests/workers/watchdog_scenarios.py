"""Functions that tests/distributed/test_watchdog.py runs in real worker processes (see tests/multiproc.py).

Each joins a gloo group and runs a small lock-step loop under a StallWatchdog (one all-reduce per
step, as DDP's backward does), then breaks something on purpose: a rank stops itself with SIGSTOP,
sleeps in its data source, takes long over a first step or an unbounded phase, or leaves early.
The watchdog's bound comes from DDP_UTILS_STALL_TIMEOUT, set by the test. A rank that gets through
prints one JSON line; one that the watchdog ends prints nothing more (os._exit).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ddp_utils as du
from ddp_utils.distributed import StallWatchdog, default_store
from ddp_utils.run.control import StepControl

INTERVAL = 0.25  # seconds between reports: quick tests


def emit(record: dict) -> None:
    """One write per record, so ranks sharing a pipe do not interleave."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def join_group() -> du.DistInfo:
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=300)  # far beyond any test: only the watchdog ends a stall
    du.barrier()  # everybody is up: what follows measures the loop, not the start
    return info


def step(seconds: float = 0.02) -> None:
    """A training step's collective: every rank must reach it."""
    dist.all_reduce(torch.ones(1))
    time.sleep(seconds)


def finish(info: du.DistInfo, **record) -> None:
    emit({"rank": info.rank, "finished": True, **record})
    du.cleanup()


def frozen_rank(stop_rank: str = "1", at_step: str = "40", steps: str = "400") -> None:
    """``stop_rank`` stops itself with SIGSTOP inside step ``at_step``: its heartbeat stops with it."""
    info = join_group()
    with StallWatchdog(interval=INTERVAL) as watchdog:
        for index in watchdog.track(range(int(steps)), "train"):
            if info.rank == int(stop_rank) and index == int(at_step):
                emit({"rank": info.rank, "stopped_at": time.time()})
                os.kill(os.getpid(), signal.SIGSTOP)
            step()
    finish(info)


def read_from_a_hung_mount(seconds: float) -> bytes:
    """What a read from a hung network file system looks like from Python: a call that does not return."""
    time.sleep(seconds)
    return b""


def batches(rank: int, stuck_rank: int, at_step: int, seconds: float, steps: int):
    for index in range(steps):
        if rank == stuck_rank and index == at_step:
            read_from_a_hung_mount(seconds)
        yield index


def stuck_read(stuck_rank: str = "1", at_step: str = "5", seconds: str = "60", steps: str = "400") -> None:
    """``stuck_rank``'s data source blocks for ``seconds`` at step ``at_step``: alive, silent, no progress."""
    info = join_group()
    source = batches(info.rank, int(stuck_rank), int(at_step), float(seconds), int(steps))
    with StallWatchdog(interval=INTERVAL) as watchdog:
        for _ in watchdog.track(source, "train"):
            step()
    finish(info)


def stuck_after_control(stuck_rank: str = "1", at_step: str = "8", seconds: str = "60", steps: str = "400") -> None:
    """As train.py's loop, each step ends in StepControl.after_step (its per-step all-reduce, waited on a step later).
    ``stuck_rank`` hangs in a read at ``at_step``; first, while the others wait for it in StepControl's wait, it
    prints their watchdog reports as the store holds them (the key: restart 0, this process's first watchdog)."""
    info = join_group()
    with StallWatchdog(interval=INTERVAL) as watchdog, StepControl(watchdog=watchdog) as control:
        for index in watchdog.track(range(int(steps)), "train"):
            if info.rank == int(stuck_rank) and index == int(at_step):
                time.sleep(3.0)  # the others reach their next step's wait and report from there
                keys = [f"ddp_utils/watchdog/0/0/state/{rank}" for rank in range(info.world_size)]
                reports = {rank: json.loads(default_store().get(key)) for rank, key in enumerate(keys)}
                emit({"rank": info.rank, "pid": os.getpid(), "reports": reports})
                read_from_a_hung_mount(float(seconds))
            time.sleep(0.02)
            control.after_step(None, boundary=True, last=False)
    finish(info)


def slow_first_step(slow_rank: str = "1", seconds: str = "6", steps: str = "40") -> None:
    """``slow_rank``'s first step takes ``seconds`` (compiling, autotuning) while the others wait in its all-reduce."""
    info = join_group()
    with StallWatchdog(interval=INTERVAL, startup_timeout=float(seconds) * 3) as watchdog:
        for index in watchdog.track(range(int(steps)), "train"):
            if index == 0 and info.rank == int(slow_rank):
                time.sleep(float(seconds))
            step()
    finish(info)


def long_phase(kind: str = "unbounded", seconds: str = "8", steps: str = "20") -> None:
    """Rank 0 spends ``seconds`` in a phase (mAP, a save) while the others wait for it in a broadcast.

    ``kind``: "unbounded" (``phase(..., None)``), "bounded" (a bound of twice ``seconds``), or
    "overrun" (a bound of a quarter of ``seconds``: rank 0 is to blame).
    """
    info = join_group()
    bound = {"unbounded": None, "bounded": 2 * float(seconds), "overrun": float(seconds) / 4}[kind]
    with StallWatchdog(interval=INTERVAL) as watchdog:
        for index in watchdog.track(range(int(steps)), "train"):
            step()
            if index == int(steps) // 2:
                if info.rank == 0:
                    with watchdog.phase("metrics", bound):
                        time.sleep(float(seconds))
                dist.broadcast(torch.zeros(1), src=0)  # the others wait here, without progress
    finish(info)


def leaves_early(leaving_rank: str = "1", seconds: str = "8", steps: str = "10") -> None:
    """``leaving_rank`` leaves its watchdog after the lock-step loop and waits in the final barrier while the
    others go on working (with progress) for ``seconds``, longer than the bound: it is not to blame."""
    info = join_group()
    with StallWatchdog(interval=INTERVAL) as watchdog:
        for _ in watchdog.track(range(int(steps)), "train"):
            step()
        if info.rank != int(leaving_rank):
            end = time.monotonic() + float(seconds)
            while time.monotonic() < end:
                watchdog.progress("train")
                time.sleep(0.05)
    finish(info)


def restart_after_freeze(steps: str = "60") -> None:
    """Under torchrun --max-restarts 1: rank 1 stops itself (SIGSTOP) in the first attempt; the watchdog ends
    rank 0, torchrun kills rank 1 and starts both again; the second attempt runs to the end."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    info = join_group()
    with StallWatchdog(interval=INTERVAL) as watchdog:
        for index in watchdog.track(range(int(steps)), "train"):
            if attempt == 0 and info.rank == 1 and index == 20:
                emit({"rank": info.rank, "attempt": attempt, "stopped_at": time.time()})
                os.kill(os.getpid(), signal.SIGSTOP)
            step()
    total = du.reduce_tensor(torch.ones(1), op="sum").item()
    emit({"rank": info.rank, "attempt": attempt, "total": total, "finished": True})
    du.cleanup()


def frozen_after_the_end(steps: str = "30") -> None:
    """Under torchrun --max-restarts 1: in the first attempt rank 1 stops itself (SIGSTOP) after the last collective
    of the watched work, so rank 0 has nothing left to wait in; rank 0's watchdog waits for it at the end, names it
    and ends the job; the second attempt runs to the end."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    info = join_group()
    with StallWatchdog(interval=INTERVAL) as watchdog:
        for _ in watchdog.track(range(int(steps)), "train"):
            step()
        if attempt == 0 and info.rank == 1:
            emit({"rank": info.rank, "attempt": attempt, "pid": os.getpid(), "stopped_at": time.time()})
            os.kill(os.getpid(), signal.SIGSTOP)
    emit({"rank": info.rank, "attempt": attempt, "left_watchdog_at": time.time()})
    total = du.reduce_tensor(torch.ones(1), op="sum").item()
    emit({"rank": info.rank, "attempt": attempt, "total": total, "finished": True})
    du.cleanup()


if __name__ == "__main__":
    {"restart": restart_after_freeze, "frozen_after_the_end": frozen_after_the_end}[sys.argv[1]]()
