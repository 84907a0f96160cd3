"""Choosing the device this process computes on, and timing work on it."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass

import torch

from .distributed import DistInfo, dist_info
from .log import LOGGER

_summary_logged = False


class DeviceError(ValueError, AssertionError):
    """A device request that is malformed or names what is not there.

    A ValueError (what a wrong value is), and an AssertionError too: YOLOv5's ``select_device`` asserts,
    so a YOLOv5 user's ``except AssertionError`` around it still catches ours.

    Examples:
        >>> try:
        ...     select_device("gpu0")
        ... except AssertionError as exc:
        ...     print(type(exc).__name__, isinstance(exc, ValueError))
        DeviceError True
    """


@dataclass(frozen=True)
class DeviceRequest:
    """A parsed ``--device`` string: ``kind`` is "cpu", "mps" or "cuda"; ``indices`` the CUDA ids."""

    kind: str
    indices: tuple[int, ...] = ()


def parse_device(device: str | int | torch.device | None) -> DeviceRequest:
    """Parse a YOLOv5-style device string.

    Accepts "", "cpu", "mps", "0", "0,1,2,3", "cuda", "cuda:1" (also ints and
    torch.device). An empty string means "the best device there is" and is resolved
    by :func:`select_device`; here it parses to kind "auto".

    Examples:
        >>> parse_device("cuda:1")
        DeviceRequest(kind='cuda', indices=(1,))
        >>> parse_device("0, 1")
        DeviceRequest(kind='cuda', indices=(0, 1))
        >>> parse_device("")
        DeviceRequest(kind='auto', indices=())
    """
    if isinstance(device, torch.device):
        device = str(device)
    text = "" if device is None else str(device).strip().lower()
    text = text.replace(" ", "")
    if text in ("", "auto"):
        return DeviceRequest("auto")
    if text in ("cpu", "mps"):
        return DeviceRequest(text)
    if text == "cuda":
        return DeviceRequest("cuda", (0,))
    text = text.replace("cuda:", "")
    parts = [p for p in text.split(",") if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise DeviceError(f"device {device!r} is not valid: use '', 'cpu', 'mps', '0', '0,1,2,3' or 'cuda:1'")
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise DeviceError(f"device {device!r} names a GPU twice")
    return DeviceRequest("cuda", indices)


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def available_devices() -> list[str]:
    """Names of the devices this process can use, e.g. ``['cpu', 'cuda:0', 'cuda:1']``."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        names.append("mps")
    return names


def device_summary(devices: list[torch.device]) -> str:
    """One line per device: torch version, then each device's name and memory."""
    lines = [f"ddp_utils: Python {platform.python_version()}, torch {torch.__version__}"]
    for device in devices:
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            lines.append(f"  {device}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
        elif device.type == "mps":
            lines.append("  mps: Apple Metal Performance Shaders")
        else:
            lines.append(f"  cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    return "\n".join(lines)


def _make_visible(indices: tuple[int, ...]) -> tuple[int, ...]:
    """Make the requested GPUs the visible ones when that still works; return the ids to use.

    CUDA_VISIBLE_DEVICES is read once, when CUDA starts in this process. Set earlier, it
    renumbers the chosen GPUs 0..n-1 so that ``cuda:LOCAL_RANK`` picks them under DDP;
    set later it would do nothing, so then the physical ids are used as given and a
    warning says so. Binding the process to one of them is left to ``init_distributed``.
    """
    wanted = ",".join(str(i) for i in indices)
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current is not None and current.replace(" ", "") == wanted:
        return tuple(range(len(indices)))
    if torch.cuda.is_initialized():
        LOGGER.warning(
            f"select_device: CUDA is already initialised, so CUDA_VISIBLE_DEVICES={wanted} would have no "
            f"effect; not setting it and using cuda:{wanted} by their current numbers"
        )
        return indices
    os.environ["CUDA_VISIBLE_DEVICES"] = wanted
    if torch.cuda.device_count() == len(indices):
        return tuple(range(len(indices)))
    # torch counted the devices before we set the variable: it no longer applies
    if current is None:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = current
    LOGGER.warning(
        f"select_device: CUDA devices were already counted, so CUDA_VISIBLE_DEVICES={wanted} would have "
        "no effect; using the GPUs by their current numbers"
    )
    return indices


def _check_gpus_per_node(device: str | int | torch.device | None, n_gpu: int, info: DistInfo) -> None:
    """One GPU per local process: say so before any process group forms, on every rank alike."""
    if info.local_world_size > n_gpu:
        raise DeviceError(
            f"{info.local_world_size} processes on this node (LOCAL_WORLD_SIZE={info.local_world_size}, this is "
            f"local rank {info.local_rank}) but device {device!r} gives {n_gpu} GPU(s) of the "
            f"{torch.cuda.device_count()} visible: start at most {n_gpu} processes per node "
            f"(torchrun --nproc_per_node {n_gpu}), name more GPUs, or use --device cpu"
        )


def _cuda_devices(
    device: str | int | torch.device | None,
    indices: tuple[int, ...],
    batch_size: int | None,
    info: DistInfo,
    there: str,
) -> list[torch.device]:
    """The CUDA devices of a request, checked: a GPU request has the most ways to be wrong, each with its message."""
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device {device!r} requested but CUDA is not available (torch {torch.__version__}, "
            f"{torch.cuda.device_count()} CUDA devices); devices here: {there}. Use --device cpu"
        )
    count = torch.cuda.device_count()
    missing = [i for i in indices if i >= count]
    if missing:
        raise DeviceError(f"device {device!r} requested but cuda:{missing[0]} is not there; devices here: {there}")
    n_gpu = len(indices)
    if info.distributed:
        _check_gpus_per_node(device, n_gpu, info)
    if batch_size is not None and n_gpu > 1 and batch_size % n_gpu:
        raise DeviceError(
            f"batch size {batch_size} does not divide by the {n_gpu} GPUs requested ({device!r}): "
            f"use a multiple of {n_gpu}"
        )
    chosen = [torch.device("cuda", i) for i in _make_visible(indices)]
    if info.distributed:
        chosen = [chosen[info.local_rank]]
    return chosen


def select_device(
    device: str | int | torch.device | None = "", batch_size: int | None = None, newline: bool = True
) -> torch.device:
    """Pick this process's device from a YOLOv5-style request, checking it is there.

    As in YOLOv5, a GPU list becomes CUDA_VISIBLE_DEVICES (while CUDA has not started),
    and a single process gets the first GPU of the list, ``cuda:0``. Under DDP (torchrun
    or srun) each process gets the GPU of its local rank among the requested ones. Call it
    before :func:`~ddp_utils.distributed.init_distributed` and pass it the result: this checks the
    request (one GPU per local process) before any rendezvous, and the device it returns
    decides the backend (gloo for the CPU, NCCL for CUDA) and is bound there. With several
    GPUs, ``batch_size`` (the total over all GPUs) must divide by their number. A short
    summary of the devices is logged once, on rank 0.

    Args:
        device: "", "cpu", "mps", "0", "0,1,2,3" or "cuda:1". "" picks CUDA if there is
            any (all GPUs), then MPS, then the CPU.
        batch_size: the total batch size to check, or None (0 too, as in YOLOv5).
        newline: accepted for YOLOv5's call form; the summary is a log line either way.

    Returns:
        The torch.device this process should use.

    Raises:
        DeviceError: (a ValueError and, as YOLOv5's, an AssertionError) the device string is
            malformed, names a device that is not there (the message lists what is), gives this
            node fewer GPUs than it has processes (the message names both counts), or batch_size
            does not divide by the GPU count.

    Examples:
        >>> select_device("cpu")
        device(type='cpu')
    """
    global _summary_logged
    request = parse_device(device)
    info = dist_info()
    there = ", ".join(available_devices())
    if request.kind == "auto":
        if torch.cuda.is_available():
            request = DeviceRequest("cuda", tuple(range(torch.cuda.device_count())))
        elif _mps_available() and not info.distributed:
            request = DeviceRequest("mps")
        else:
            request = DeviceRequest("cpu")

    if request.kind == "cpu":
        chosen = [torch.device("cpu")]
    elif request.kind == "mps":
        if not _mps_available():
            raise DeviceError(f"device 'mps' requested but MPS is not available; devices here: {there}")
        chosen = [torch.device("mps")]
    else:
        chosen = _cuda_devices(device, request.indices, batch_size, info, there)

    if info.is_main and not _summary_logged:
        LOGGER.info(device_summary(chosen))
        _summary_logged = True
    return chosen[0]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until the accelerator has finished its queued work (CUDA, MPS; nothing on the CPU)."""
    kind = torch.device(device).type if device is not None else None
    if kind in (None, "cuda") and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(device if kind == "cuda" else None)
    elif kind in (None, "mps") and _mps_available():
        torch.mps.synchronize()


def time_synchronized(device: torch.device | str | None = None) -> float:
    """Wait for the accelerator, then read a monotonic high-resolution clock (seconds).

    Examples:
        >>> t0 = time_synchronized(); t1 = time_synchronized()
        >>> t1 >= t0
        True
    """
    synchronize(device)
    return time.perf_counter()


time_sync = time_synchronized  # YOLOv5's name since v6
