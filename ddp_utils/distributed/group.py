"""Forming and ending the process group, and asking where this process stands in it.

:func:`init_distributed` is the one place a process is bound to its device: the device
the caller chose (``select_device``) decides the backend, NCCL for CUDA and gloo for the
CPU, whatever else the host has. Everything else here is a no-op, or returns the
single-process answer, when no process group exists.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..log import LOGGER
from .env import DistEnvError, DistInfo, dist_info

DEFAULT_TIMEOUT_S = 1800  # torch's own default for gloo; override with DDP_UTILS_DIST_TIMEOUT


def is_dist_initialized() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank in the process group, 0 without one."""
    return dist.get_rank() if is_dist_initialized() else 0


def get_world_size() -> int:
    """Processes in the process group, 1 without one."""
    return dist.get_world_size() if is_dist_initialized() else 1


def is_main_process() -> bool:
    """True on global rank 0 and in a single process.

    Examples:
        >>> is_main_process()
        True
    """
    if is_dist_initialized():
        return dist.get_rank() == 0
    return dist_info().is_main


def default_device(info: DistInfo | None = None) -> torch.device:
    """The device ``select_device("")`` gives this process: its local GPU when CUDA is there, else the CPU.

    Examples:
        >>> default_device().type in ("cpu", "cuda")
        True
    """
    info = dist_info() if info is None else info
    if torch.cuda.is_available():
        return torch.device("cuda", max(info.local_rank, 0))
    return torch.device("cpu")


def default_backend(device: torch.device | str | None = None) -> str:
    """The backend for collectives on ``device``: NCCL for CUDA, gloo for anything else.

    Args:
        device: the device this process computes on; None means :func:`default_device`.

    Examples:
        >>> default_backend("cpu")
        'gloo'
    """
    device = default_device() if device is None else torch.device(device)
    return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"


def _timeout_from_env() -> timedelta:
    seconds = os.environ.get("DDP_UTILS_DIST_TIMEOUT", "")
    try:
        return timedelta(seconds=float(seconds)) if seconds else timedelta(seconds=DEFAULT_TIMEOUT_S)
    except ValueError:
        raise DistEnvError(f"DDP_UTILS_DIST_TIMEOUT={seconds!r} is not a number of seconds") from None


def _bind_device(device: torch.device, backend: str, info: DistInfo) -> None:
    """Make ``device`` this process's current CUDA device; check NCCL has one."""
    if device.type != "cuda":
        if backend == "nccl":
            raise DistEnvError(f"backend 'nccl' needs a CUDA device, but this process computes on {device}")
        return
    index = max(info.local_rank, 0) if device.index is None else device.index
    count = torch.cuda.device_count()
    if index >= count:
        raise DistEnvError(
            f"LOCAL_RANK={info.local_rank} asks for cuda:{index} but this node has {count} CUDA device(s): start "
            f"at most {count} processes per node (--nproc_per_node) or check CUDA_VISIBLE_DEVICES"
        )
    torch.cuda.set_device(index)


def init_distributed(
    backend: str | None = None,
    init_method: str = "env://",
    timeout: timedelta | float | None = None,
    device: torch.device | str | None = None,
) -> DistInfo:
    """Bind this process to its device and start the process group it was launched into, if any.

    A single process (no launcher variables) is bound to ``device`` when one is given and
    it is a GPU, and starts no group. Under torchrun or srun, it checks the environment, binds the process
    to its GPU and joins the group. Call :func:`~ddp_utils.device.select_device` first: it
    validates the request before any rendezvous, and its device decides the backend.

    Args:
        backend: "nccl", "gloo", ...; None lets the device decide: NCCL for CUDA, gloo otherwise.
        init_method: "env://" (MASTER_ADDR/MASTER_PORT), "tcp://host:port" or
            "file:///shared/path".
        timeout: collective timeout (timedelta or seconds); None reads
            DDP_UTILS_DIST_TIMEOUT, default 30 minutes.
        device: the device this process computes on; None picks what ``select_device("")``
            would (the local GPU when CUDA is there, else the CPU), or the local GPU when
            ``backend`` is "nccl", or the CPU when ``backend`` is any other.

    Returns:
        The :class:`DistInfo` of this process.

    Raises:
        DistEnvError: the environment is incomplete, names a GPU that is not there, or
            asks for NCCL on a CPU device.

    Examples:
        >>> info = init_distributed(device="cpu")  # python script.py: no group, rank -1
        >>> info.rank
        -1
    """
    info = dist_info()
    if not info.distributed or is_dist_initialized():
        if device is not None and not is_dist_initialized():
            _bind_device(torch.device(device), backend or default_backend(device), info)
        return info
    device = _resolve_device(device, backend, info)
    backend = backend or default_backend(device)
    timeout = _as_timeout(timeout)
    if init_method == "env://":
        _export_env_for_env_init(info)
    elif not init_method.startswith(("tcp://", "file://")):
        raise DistEnvError(f"init_method={init_method!r}: use env://, tcp://HOST:PORT or file:///PATH")
    _bind_device(device, backend, info)
    # A failed NCCL collective must abort the process rather than hang until the timeout.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    _join_group(backend, init_method, timeout, info)
    LOGGER.info(
        f"process group: {backend} on {device.type}, world size {info.world_size}, "
        f"{info.world_size // max(info.local_world_size, 1)} node(s), via {info.source}"
    )
    return info


def _as_timeout(timeout: timedelta | float | None) -> timedelta:
    """init_distributed's ``timeout`` as torch wants it: a timedelta, from seconds or DDP_UTILS_DIST_TIMEOUT."""
    if timeout is None:
        return _timeout_from_env()
    if not isinstance(timeout, timedelta):
        return timedelta(seconds=float(timeout))
    return timeout


def _join_group(backend: str, init_method: str, timeout: timedelta, info: DistInfo) -> None:
    """The rendezvous itself: torchrun's agent store when there is one (see _attempt_store), else ``init_method``."""
    store = _attempt_store(info, timeout) if init_method == "env://" else None
    dist.init_process_group(
        backend=backend,
        init_method=None if store is not None else init_method,
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )


def _resolve_device(device: torch.device | str | None, backend: str | None, info: DistInfo) -> torch.device:
    if device is not None:
        return torch.device(device)
    if backend is None:
        return default_device(info)
    # an explicit backend without a device keeps its old meaning: NCCL on the local GPU, else the CPU
    return torch.device("cuda", max(info.local_rank, 0)) if backend == "nccl" else torch.device("cpu")


def _export_env_for_env_init(info: DistInfo) -> None:
    if info.master_addr is None:
        raise DistEnvError(
            f"environment variable MASTER_ADDR is missing: WORLD_SIZE={info.world_size} asks for a "
            "distributed job, and init_method='env://' needs MASTER_ADDR and MASTER_PORT "
            "(torchrun sets both; under SLURM set MASTER_ADDR or SLURM_NODELIST)"
        )
    if info.master_port is None:
        raise DistEnvError("environment variable MASTER_PORT is missing: init_method='env://' needs it")
    # srun sets only SLURM_* variables; env:// reads these four.
    os.environ.setdefault("MASTER_ADDR", info.master_addr)
    os.environ.setdefault("MASTER_PORT", str(info.master_port))
    os.environ.setdefault("RANK", str(info.rank))
    os.environ.setdefault("WORLD_SIZE", str(info.world_size))
    os.environ.setdefault("LOCAL_RANK", str(info.local_rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(info.local_world_size))


def _attempt_store(info: DistInfo, timeout: timedelta) -> Any | None:
    """Under torchrun, the agent's store seen through a prefix of its own per restart.

    With a static rendezvous (``--master_port``) the agent keeps one store across elastic
    restarts, so a restarted rank can read the last attempt's gloo addresses and connect to
    a dead peer: a hang or a refused connection. A prefix per restart count gives every
    attempt fresh keys. Elsewhere (no agent store) env:// is left to torch.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or info.master_port is None:
        return None
    agent_store = dist.TCPStore(info.master_addr, info.master_port, info.world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"ddp_utils/attempt{info.restart_count}", agent_store)


def cleanup(wait: bool = True) -> None:
    """Leave the process group (together, by default) and destroy it; safe to call twice.

    Args:
        wait: meet the other ranks in a barrier first, which keeps rank 0 (the host of the
            rendezvous store under env://) from leaving while another rank still reads from
            it. Pass False when leaving on an error: the others may be inside another
            collective, and a barrier would hang both sides until the timeout; leaving at
            once makes their collective fail promptly instead.

    Examples:
        >>> cleanup()  # no process group: nothing to do
    """
    if is_dist_initialized():
        if wait:
            with contextlib.suppress(Exception):  # a peer already gone: destroy anyway
                barrier()
        dist.destroy_process_group()


def barrier(group: Any = None, async_op: bool = False) -> Any:
    """Wait for every rank of ``group`` (None: the default group); a no-op without a process group.

    Args:
        group: the process group; None for the default one.
        async_op: return at once with torch's work handle (``wait()`` blocks until every rank arrived);
            None when there is no group.

    Examples:
        >>> barrier() is None, barrier(async_op=True) is None  # single process
        (True, True)
    """
    if not is_dist_initialized():
        return None
    if dist.get_backend(group) == "nccl":
        return dist.barrier(group, async_op=async_op, device_ids=[torch.cuda.current_device()])
    return dist.barrier(group, async_op=async_op)


def collective_device(group: Any = None) -> torch.device:
    """Where tensors for ``group``'s collectives live (None: the default group): the bound GPU under NCCL, else the CPU.

    Examples:
        >>> collective_device()  # no group
        device(type='cpu')
    """
    if is_dist_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
