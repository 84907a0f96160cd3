"""When a collective hangs or ranks disagree, make PyTorch say which rank and which op.

:func:`enable_debug` (``train.py --dist-debug``) turns on what PyTorch already has, before
the process group forms:

- ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: every gloo or NCCL group is wrapped so each collective
  is first checked against the other ranks (op, tensor shapes, dtypes); a mismatch raises
  at once, naming the ranks and the ops, instead of hanging or reducing garbage. Costs one
  small gloo exchange per collective: for debugging, not for production runs.
- NCCL: asynchronous error handling (a failed or timed-out collective aborts the process
  instead of hanging), and the flight recorder (``TORCH_FR_BUFFER_SIZE``, before torch 2.11
  ``TORCH_NCCL_TRACE_BUFFER_SIZE``): the last ``trace_buffer_size`` collectives of each rank,
  dumped on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``,
  which shows which rank stopped at which collective.

Variables the user set already are kept: the user's word wins.

One caveat, measured on torch 2.14: DistributedDataParallel on a gloo group that torch wrapped
for DETAIL crashes (SIGSEGV in ``c10d::Logger::set_env_variables``, which takes the wrapper for
the gloo backend). :func:`ddp_process_group` gives DDP a second gloo group of the same ranks,
unwrapped: its gradient all-reduces go unchecked, every other collective stays checked.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..log import LOGGER

TRACE_BUFFER_SIZE = 2000


def trace_buffer_variable(version: str = torch.__version__) -> str:
    """The variable that sizes the flight recorder: TORCH_FR_BUFFER_SIZE from torch 2.11, before it the NCCL name.

    torch 2.11 and later warn about the old name on every rank, so only one of the two is set.

    Examples:
        >>> trace_buffer_variable("2.14.1+cu130"), trace_buffer_variable("2.5.0")
        ('TORCH_FR_BUFFER_SIZE', 'TORCH_NCCL_TRACE_BUFFER_SIZE')
    """
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return "TORCH_FR_BUFFER_SIZE" if (major, minor) >= (2, 11) else "TORCH_NCCL_TRACE_BUFFER_SIZE"


_ddp_groups: dict[int, Any] = {}  # id of the default group -> DDP's unwrapped gloo group


@dataclass(frozen=True)
class DistDebug:
    """The debugging settings :func:`enable_debug` applied.

    Attributes:
        env: each variable and the value it has now (set here or kept from the user).
        dump_prefix: where NCCL's flight recorder writes on a timeout (one file per rank).
    """

    env: dict[str, str] = field(default_factory=dict)
    dump_prefix: str = ""


def debug_env(dump_dir: str | Path | None = None, trace_buffer_size: int = TRACE_BUFFER_SIZE) -> dict[str, str]:
    """The variables :func:`enable_debug` sets, with their values.

    Args:
        dump_dir: directory for the flight recorder's dumps; default the temporary directory.
        trace_buffer_size: collectives each rank's flight recorder keeps.

    Examples:
        >>> debug_env("/tmp/run")["TORCH_DISTRIBUTED_DEBUG"]
        'DETAIL'
        >>> debug_env("/tmp/run")["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
        '/tmp/run/nccl_trace_rank_'
    """
    directory = Path(dump_dir) if dump_dir is not None else Path(tempfile.gettempdir())
    return {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        trace_buffer_variable(): str(trace_buffer_size),
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(directory / "nccl_trace_rank_"),
    }


def enable_debug(dump_dir: str | Path | None = None, trace_buffer_size: int = TRACE_BUFFER_SIZE) -> DistDebug:
    """Turn on PyTorch's collective checks and NCCL's flight recorder; call before ``init_distributed``.

    Args:
        dump_dir: directory for NCCL's flight-recorder dumps (made if missing); default the
            temporary directory.
        trace_buffer_size: collectives each rank's flight recorder keeps.

    Returns:
        A :class:`DistDebug` with the values in force.

    Examples:
        >>> settings = enable_debug()  # doctest: +SKIP
        >>> settings.env["TORCH_DISTRIBUTED_DEBUG"]  # doctest: +SKIP
        'DETAIL'
    """
    if dist.is_available() and dist.is_initialized():
        LOGGER.warning("enable_debug: the process group exists already; its collectives stay unchecked")
    wanted = debug_env(dump_dir, trace_buffer_size)
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    in_force = {name: os.environ[name] for name in wanted}
    dump_prefix = in_force["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    Path(dump_prefix).parent.mkdir(parents=True, exist_ok=True)
    if dist.is_available():
        # torch reads TORCH_DISTRIBUTED_DEBUG once, when torch.distributed is imported
        dist.set_debug_level_from_env()
    LOGGER.info(
        f"distributed debugging on: TORCH_DISTRIBUTED_DEBUG={in_force['TORCH_DISTRIBUTED_DEBUG']} checks every "
        f"collective across ranks; NCCL flight recorder of {in_force[trace_buffer_variable()]} collectives "
        f"dumps to {dump_prefix}<rank> on a timeout"
    )
    return DistDebug(env=in_force, dump_prefix=dump_prefix)


def ddp_process_group() -> Any | None:
    """The process group to give ``DistributedDataParallel(process_group=...)``; every rank must call it.

    None (DDP's default: the default group) except under :func:`enable_debug` on gloo, where
    it is a second gloo group of all ranks formed without torch's debug wrapper, since DDP
    crashes on the wrapped one (see the module's notes). Formed once per default group.

    Examples:
        >>> ddp_process_group() is None  # no process group
        True
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_debug_level() != dist.DebugLevel.DETAIL or dist.get_backend() != "gloo":
        return None
    key = id(dist.group.WORLD)
    if key not in _ddp_groups:
        _ddp_groups.clear()  # a group of an earlier default group is gone with it
        dist.set_debug_level(dist.DebugLevel.OFF)  # torch wraps new groups only at DETAIL
        try:
            _ddp_groups[key] = dist.new_group(backend="gloo")
        finally:
            dist.set_debug_level(dist.DebugLevel.DETAIL)
    return _ddp_groups[key]
