"""Where this process stands in a job, read from the launcher's environment.

This module is the only place in ddp_utils that reads launcher variables (torchrun's
RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_*, srun's SLURM_*), and it reads them when
asked, never at import. torchrun's variables win; SLURM's serve when torchrun's are
absent; else this is a single process, with rank and local_rank -1 as in YOLOv5.

Other launchers fit one of these shapes: Kubeflow's PyTorchJob starts ``python train.py``
once per pod with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (no LOCAL_RANK: one process
per pod, so local rank 0 of a local world of 1), or ``torchrun`` under its elastic policy.

It imports nothing else from ddp_utils, so that the logger can ask it for the rank.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..log import set_rank_source


class DistEnvError(RuntimeError):
    """The environment describes a distributed job that cannot be started as written."""


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job.

    Attributes:
        rank: global rank, -1 for a single process.
        local_rank: rank within this node, -1 for a single process.
        world_size: number of processes in the job (1 for a single process).
        local_world_size: number of processes on this node.
        node_rank: index of this node (torchrun's GROUP_RANK, SLURM_NODEID).
        master_addr: address of the rendezvous store, or None.
        master_port: port of the rendezvous store, or None.
        restart_count: how often this job was restarted: by torchrun's elastic agent
            (TORCHELASTIC_RESTART_COUNT), by SLURM's requeue (SLURM_RESTART_COUNT), or both.
            Above 0, train.py resumes the run this job started.
        source: "torchrun", "slurm" or "single": which environment described the job.
    """

    rank: int = -1
    local_rank: int = -1
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    restart_count: int = 0
    source: str = "single"

    @property
    def distributed(self) -> bool:
        """True when a launcher started this process as one rank of a job."""
        return self.rank != -1

    @property
    def is_main(self) -> bool:
        """True on global rank 0, and for a single process."""
        return self.rank in (-1, 0)

    @property
    def is_local_main(self) -> bool:
        """True on the first process of each node, and for a single process."""
        return self.local_rank in (-1, 0)


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DistEnvError(f"environment variable {name}={value!r} is not an integer") from None


def _require(env: Mapping[str, str], name: str, why: str) -> int:
    value = _env_int(env, name)
    if value is None:
        raise DistEnvError(f"environment variable {name} is missing: {why}")
    return value


def first_slurm_host(nodelist: str) -> str:
    """Return the first host of a SLURM node list such as ``"gpu[03-05,09],cpu1"``.

    Examples:
        >>> first_slurm_host("gpu[03-05,09],cpu1")
        'gpu03'
        >>> first_slurm_host("node7")
        'node7'
    """
    nodelist = nodelist.strip()
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist)
    if not match or not match.group(1):
        raise DistEnvError(f"SLURM_NODELIST={nodelist!r} names no host")
    prefix, ranges = match.group(1), match.group(3)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _slurm_tasks_on_node(env: Mapping[str, str], world_size: int) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2),3": counts per node, first is ours only
    # when uniform, so prefer the count divided by the node count.
    nnodes = _env_int(env, "SLURM_NNODES") or _env_int(env, "SLURM_JOB_NUM_NODES")
    if nnodes:
        return max(world_size // nnodes, 1)
    per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    match = re.match(r"(\d+)", per_node)
    return int(match.group(1)) if match else world_size


def dist_info(environ: Mapping[str, str] | None = None) -> DistInfo:
    """Read this process's place in the job from the environment.

    Args:
        environ: the environment to read; ``os.environ`` when None.

    Returns:
        A :class:`DistInfo`. Single process: rank -1, local_rank -1, world_size 1.

    Raises:
        DistEnvError: a variable is malformed or the set is inconsistent; the message
            names the variable.

    Examples:
        >>> info = dist_info({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
        ...                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
        >>> info.rank, info.world_size, info.source
        (1, 2, 'torchrun')
        >>> dist_info({}).rank
        -1
    """
    env = os.environ if environ is None else environ
    if "RANK" in env or "LOCAL_RANK" in env:
        info = _torchrun_info(env)
    elif "SLURM_PROCID" in env and _env_int(env, "SLURM_NTASKS", 1) > 1:
        info = _slurm_info(env)
    else:
        return DistInfo()
    if not 0 <= info.rank < info.world_size:
        raise DistEnvError(f"rank {info.rank} is outside WORLD_SIZE={info.world_size} ({info.source})")
    if not 0 <= info.local_rank < info.local_world_size:
        raise DistEnvError(
            f"local rank {info.local_rank} is outside LOCAL_WORLD_SIZE={info.local_world_size} ({info.source})"
        )
    return info


def _torchrun_info(env: Mapping[str, str]) -> DistInfo:
    if "RANK" not in env:
        # torch.distributed.launch without --use_env sets only LOCAL_RANK
        raise DistEnvError(
            "environment variable RANK is missing while LOCAL_RANK is set: launch with torchrun "
            "(or python -m torch.distributed.run), which sets RANK, WORLD_SIZE and LOCAL_RANK"
        )
    why = "torchrun sets RANK, LOCAL_RANK and WORLD_SIZE together (a PyTorchJob sets RANK and WORLD_SIZE)"
    rank = _require(env, "RANK", why)
    world_size = _require(env, "WORLD_SIZE", why)
    if "LOCAL_RANK" in env:
        local_rank = _require(env, "LOCAL_RANK", why)
        local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", world_size)
    else:  # a PyTorchJob's pod (or any launcher of one process per machine): alone on its node
        local_rank = 0
        local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", 1)
    node_rank = _env_int(env, "GROUP_RANK")
    if node_rank is None:
        node_rank = _env_int(env, "NODE_RANK", rank // max(local_world_size, 1))
    return DistInfo(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_env_int(env, "MASTER_PORT"),
        # torchrun run by srun (one agent per node): a requeued job restarts torchrun at count 0
        restart_count=_env_int(env, "TORCHELASTIC_RESTART_COUNT", 0) + _env_int(env, "SLURM_RESTART_COUNT", 0),
        source="torchrun",
    )


def _slurm_info(env: Mapping[str, str]) -> DistInfo:
    why = "srun sets SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS for every task"
    world_size = _require(env, "SLURM_NTASKS", why)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
    job_id = _env_int(env, "SLURM_JOB_ID", 0)
    return DistInfo(
        rank=_require(env, "SLURM_PROCID", why),
        local_rank=_require(env, "SLURM_LOCALID", why),
        world_size=world_size,
        local_world_size=_slurm_tasks_on_node(env, world_size),
        node_rank=_env_int(env, "SLURM_NODEID", 0),
        master_addr=env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else None),
        # a port derived from the job id lets two jobs share a node without clashing
        master_port=_env_int(env, "MASTER_PORT", 20000 + job_id % 20000),
        restart_count=_env_int(env, "SLURM_RESTART_COUNT", 0),
        source="slurm",
    )


def slurm_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The id to requeue this SLURM job by, None outside SLURM.

    A task of a job array has a job id of its own, but ``scontrol`` also knows it as
    ``ARRAYJOB_TASK``; that name is what SLURM prints, so it is the one used here.

    Examples:
        >>> slurm_job_id({"SLURM_JOB_ID": "4242"})
        '4242'
        >>> slurm_job_id({"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "3"})
        '4240_3'
        >>> slurm_job_id({}) is None
        True
    """
    env = os.environ if environ is None else environ
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or None


def launch_key(info: DistInfo | None = None, environ: Mapping[str, str] | None = None) -> str:
    """A name for this launch: the same on a node's processes, across elastic restarts and SLURM requeues.

    Two launches sharing a node get different keys, so it names per-launch state (the
    node's shared image cache, the run a restart resumes). Under torchrun it is
    the rendezvous id (``--rdzv_id``, or the fresh one of ``--standalone``), the same on every node
    and across elastic restarts that re-form the group with other nodes; without one (a static
    ``--master_addr/--master_port`` launch) the address plus the directory torchrun's agent keeps for
    this launch (TORCHELASTIC_ERROR_FILE = <dir>/attempt_N/<rank>/error.json), which a restart keeps and
    a new launch does not; under srun, the job id alone, since a requeued job keeps its id but
    may run on other nodes; under torchrun inside a SLURM job, the job id and the rendezvous id
    (torchrun's agent directory is new after a requeue); a single process, its pid.

    Args:
        info: this process's place in the job; read from ``environ`` when None.
        environ: the environment to read; ``os.environ`` when None.

    Returns:
        The key, a string.

    Examples:
        >>> launch_key(DistInfo(rank=0, world_size=2, local_rank=0, local_world_size=2,
        ...            master_addr="10.0.0.1", master_port=29500, source="torchrun"), environ={})
        '/10.0.0.1:29500/'
    """
    env = os.environ if environ is None else environ
    info = dist_info(env) if info is None else info
    if not info.distributed:
        return f"single/pid={os.getpid()}"
    if info.source == "slurm":
        return f"slurm/{env.get('SLURM_JOB_ID', '')}"
    if env.get("SLURM_JOB_ID") and env.get("TORCHELASTIC_RUN_ID"):
        return f"slurm/{env['SLURM_JOB_ID']}/torchrun/{env['TORCHELASTIC_RUN_ID']}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id not in ("", "none"):
        # --rdzv_id (or --standalone's fresh id) names the job on every node: an elastic restart that
        # re-forms with other nodes, another rank 0 and another master port is still this launch
        return f"torchrun/{run_id}"
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    agent_dir = str(Path(error_file).parents[2]) if error_file and len(Path(error_file).parents) > 2 else ""
    return f"{env.get('TORCHELASTIC_RUN_ID', '')}/{info.master_addr}:{info.master_port}/{agent_dir}"


def env_rank(environ: Mapping[str, str] | None = None) -> int:
    """The global rank the launcher gave this process, -1 for a single process or a malformed environment.

    Unlike :func:`dist_info` it never raises: the logger asks it for every line, and a
    bad environment is reported once, by whoever starts the job.

    Examples:
        >>> env_rank({"RANK": "3", "WORLD_SIZE": "4"}), env_rank({})
        (3, -1)
    """
    try:
        return dist_info(environ).rank
    except DistEnvError:
        return -1


set_rank_source(env_rank)  # the logger's ranks before set_logging: read here, the one reader of launcher variables
