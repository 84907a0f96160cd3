"""What runs in each DataLoader worker process as it starts (the loader's ``worker_init_fn``).

- seeding: :func:`~ddp_utils.seed.seed_worker` (Python, NumPy and torch per worker);
- memory: glibc's malloc keeps freed batch-sized blocks instead of faulting them in again;
- OpenCV: no threads of its own (the workers are the parallelism);
- signals: a SIGTERM sent to the whole process group (preemption) leaves the worker alive,
  one from its parent still ends it; Ctrl-C (SIGINT, sent to the whole group) is ignored: it is
  the training process's to act on.

Also :func:`default_workers`, how many workers a process gets when the user sets none.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading

import cv2

from ..seed import seed_worker


def init_worker(worker_id: int) -> None:
    """The loader's ``worker_init_fn``: signals, allocator, OpenCV threads, then the worker's seeds."""
    _outlive_group_sigterm()
    # A terminal's Ctrl-C reaches every process of its group. The trainer's SIGINT handler (finish the
    # step, save, stop) came along with the fork and would run here too: one "received SIGINT" line per
    # worker of every rank. The trainer ends its workers itself; an orphan still notices its parent gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGUSR1"):  # SLURM's requeue warning goes to every process of the job; the trainer acts on it
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _keep_freed_memory()
    cv2.setNumThreads(0)  # the workers are the parallelism; OpenCV threads inside each would oversubscribe
    seed_worker(worker_id)


def _keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for reuse in this process, instead of returning it.

    A worker frees a batch's worth of images every batch and allocates as many again for
    the next. By default glibc hands large blocks back to the kernel (munmap, heap trim),
    and every new one then costs a page fault per 4 KiB page: about a third of a worker's
    CPU time in a VM. Keeping blocks up to 32 MiB on the heap, and trimming only past
    256 MiB free, makes the pages stay mapped. No-op on other C libraries.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 32 * 2**20)  # the largest it accepts on 64-bit
    mallopt(m_trim_threshold, 256 * 2**20)


def _outlive_group_sigterm() -> None:
    """Let a data-loader worker ignore a SIGTERM sent to its whole process group, but not its parent's.

    Preemption (torchrun's agent, a scheduler) sends SIGTERM to the process group; the
    training process catches it to finish its step and save, so its workers must not die
    under it mid-batch. A SIGTERM from the training process itself (multiprocessing ending
    its workers at exit) must still end the worker, or that exit would wait forever. The
    sender's pid tells them apart: SIGTERM is blocked and a thread takes it with
    ``sigwaitinfo``. Where that is not available (macOS, Windows) SIGTERM keeps its default.
    """
    if not hasattr(signal, "sigwaitinfo") or threading.current_thread() is not threading.main_thread():
        return
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def take_sigterm() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent or os.getppid() != parent:
                # die of the signal itself, as an unprotected worker would: the loader reads a
                # SIGTERM death as a worker it stopped, an exit code as a crash
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=take_sigterm, name="ddp_utils-sigterm", daemon=True).start()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the CPU count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def default_workers(local_processes: int, cap: int | None = None, batch_size: int = 2, cores: int | None = None) -> int:
    """DataLoader workers for one process: its share of the node's cores.

    Each local process gets ``cores // local_processes`` cores. Without a ``cap`` one of
    them is left to the training loop and the rest run workers. With a ``cap`` (the user's
    ``workers``) the result is YOLOv5's ``min(share, cap)``. Never more workers than images
    in a batch, and none for a batch of one (YOLOv5's rule).

    Args:
        local_processes: processes on this node (torchrun's LOCAL_WORLD_SIZE; 1 for one).
        cap: most workers; None: as many as the share allows.
        batch_size: per-process batch size.
        cores: cores to share; default :func:`usable_cores`.

    Examples:
        >>> default_workers(1, cores=16, batch_size=64), default_workers(1, cap=8, cores=16, batch_size=64)
        (15, 8)
        >>> default_workers(4, cores=16, batch_size=64), default_workers(1, cores=2), default_workers(1, cap=8, cores=2)
        (3, 1, 2)
    """
    share = (usable_cores() if cores is None else cores) // max(local_processes, 1)
    n = max(share - 1, 0) if cap is None else min(share, max(cap, 0))
    return max(min(n, batch_size if batch_size > 1 else 0), 0)
