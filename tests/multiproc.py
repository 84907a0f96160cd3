"""Start real worker processes the way torchrun does, bounded by a deadline.

``launch("tests.workers.distributed_scenarios:collectives", nprocs=2, timeout=60)`` starts
two Python processes with RANK, LOCAL_RANK, WORLD_SIZE, ... and MASTER_ADDR/PORT set,
each running the named function with the given string arguments, and returns their
exit codes and output. A process still running at the deadline is killed with all
its peers and the test fails with everything they printed: a hang fails, it never
stalls CI.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Worker:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def worker_env(rank: int, nprocs: int, port: int, nnodes: int = 1, extra: dict | None = None) -> dict[str, str]:
    local_world = nprocs // nnodes
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank % local_world),
        WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(local_world),
        GROUP_RANK=str(rank // local_world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    env.update(extra or {})
    return env


LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def launcher_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a command that is no rank itself: torchrun, or a plain ``python`` run."""
    env = worker_env(0, 1, 0, extra=extra)
    for name in LAUNCH_VARS:
        env.pop(name)
    return env


def launch(
    target: str,
    nprocs: int,
    timeout: float,
    args: tuple[str, ...] = (),
    nnodes: int = 1,
    env: dict[str, str] | None = None,
    stopped: tuple[int, ...] = (),
) -> list[Worker]:
    """Run ``module:function`` in ``nprocs`` processes; fail the test if any outlives ``timeout``.

    ``stopped``: ranks that stop themselves on purpose (SIGSTOP) and so never exit; each is SIGKILLed
    once every other rank has exited (its return code is then -9)."""
    port = free_port()
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.multiproc", target, *map(str, args)],
            cwd=REPO_ROOT,
            env=worker_env(rank, nprocs, port, nnodes, env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(nprocs)
    ]
    return collect(procs, start, timeout, target, stopped)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc): torchrun starts its workers in their own sessions."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    for victim in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def collect(
    procs: list[subprocess.Popen], start: float, timeout: float, what: str, stopped: tuple[int, ...] = ()
) -> list[Worker]:
    """Wait for processes until a shared deadline; kill them all and fail past it. The ``stopped`` ranks
    are waited for last, and SIGKILLed first: they stopped themselves and will not exit."""
    deadline = start + timeout
    results: list[Worker | None] = [None] * len(procs)
    timed_out = False
    for rank in [r for r in range(len(procs)) if r not in stopped] + list(stopped):
        proc = procs[rank]
        if rank in stopped:
            kill_tree(proc.pid)
        try:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
        results[rank] = Worker(rank, proc.returncode, out, err, time.monotonic() - start)
    if timed_out:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
        report = []
        for rank, proc in enumerate(procs):
            out, err = proc.communicate()
            report.append(f"--- rank {rank} (rc {proc.returncode})\n{out}\n{err}")
        raise AssertionError(f"{what}: still running after {timeout:.0f} s; killed\n" + "\n".join(report))
    return results  # type: ignore[return-value]


def run_watching(
    cmd: list[str],
    env: dict[str, str],
    timeout: float,
    on_line: Callable[[str, subprocess.Popen], None],
    cwd: Path = REPO_ROOT,
) -> Worker:
    """Run ``cmd``, calling ``on_line(line, proc)`` on each line of its stderr as it comes (to signal it at a
    point of its progress); kill it and fail past ``timeout``."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    err: list[str] = []
    out: list[str] = []

    def pump_err() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            err.append(line)
            on_line(line, proc)

    threads = [threading.Thread(target=pump_err), threading.Thread(target=lambda: out.extend(proc.stdout))]
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
        for thread in threads:
            thread.join(timeout=10)
        raise AssertionError(
            f"{' '.join(cmd[:6])}: still running after {timeout:.0f} s; killed\n{''.join(err)}"
        ) from None
    for thread in threads:
        thread.join(timeout=30)
    return Worker(0, proc.returncode, "".join(out), "".join(err), time.monotonic() - start)


def records(workers: list[Worker]) -> list[dict]:
    """The JSON record each worker printed last on stdout."""
    return [json.loads(w.stdout.strip().splitlines()[-1]) for w in workers]


def describe(workers: list[Worker]) -> str:
    return "\n".join(f"--- rank {w.rank} rc={w.returncode} {w.seconds:.1f}s\n{w.stdout}\n{w.stderr}" for w in workers)


def main() -> None:
    module_name, func_name = sys.argv[1].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    func(*sys.argv[2:])


if __name__ == "__main__":
    main()
