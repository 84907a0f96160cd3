"""Where this process stands in a distributed job, and the helpers that use it.

Everything here is a no-op, or returns the single-process answer, when no process
group is initialised, so the same code runs under ``python`` and under ``torchrun``.

The rank is never read at import: :func:`dist_info` reads the environment when asked.
torchrun's variables win; SLURM's (srun) serve when torchrun's are absent; else this
is a single process, with rank and local_rank -1 as in YOLOv5.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from .log import LOGGER

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 1800  # torch's own default for gloo; override with DDP_UTILS_DIST_TIMEOUT
_REDUCE_OPS = ("mean", "sum", "max", "min")


class DistEnvError(RuntimeError):
    """The environment describes a distributed job that cannot be started as written."""


class RankFailedError(RuntimeError):
    """Another rank failed inside a section this rank was waiting on."""


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
        restart_count: how often torchrun's elastic agent restarted the workers.
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
    why = "torchrun sets RANK, LOCAL_RANK and WORLD_SIZE together"
    rank = _require(env, "RANK", why)
    world_size = _require(env, "WORLD_SIZE", why)
    local_rank = _env_int(env, "LOCAL_RANK", rank)
    local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", world_size)
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
        restart_count=_env_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
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


def default_backend() -> str:
    """NCCL when CUDA is available, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def _timeout_from_env() -> timedelta:
    seconds = os.environ.get("DDP_UTILS_DIST_TIMEOUT", "")
    try:
        return timedelta(seconds=float(seconds)) if seconds else timedelta(seconds=DEFAULT_TIMEOUT_S)
    except ValueError:
        raise DistEnvError(f"DDP_UTILS_DIST_TIMEOUT={seconds!r} is not a number of seconds") from None


def init_distributed(
    backend: str | None = None,
    init_method: str = "env://",
    timeout: timedelta | float | None = None,
) -> DistInfo:
    """Start the process group this process was launched into, if any.

    A single process (no launcher variables) returns its :class:`DistInfo` and starts
    nothing. Under torchrun or srun, it checks the environment, binds the process to
    its local GPU (when the backend is NCCL) and joins the group.

    Args:
        backend: "nccl", "gloo", ...; None picks NCCL when CUDA is available, else gloo.
        init_method: "env://" (MASTER_ADDR/MASTER_PORT), "tcp://host:port" or
            "file:///shared/path".
        timeout: collective timeout (timedelta or seconds); None reads
            DDP_UTILS_DIST_TIMEOUT, default 30 minutes.

    Returns:
        The :class:`DistInfo` of this process.

    Raises:
        DistEnvError: the environment is incomplete or names a GPU that is not there.

    Examples:
        >>> info = init_distributed()  # python script.py: no group, rank -1
        >>> info.rank
        -1
    """
    info = dist_info()
    if not info.distributed:
        return info
    if is_dist_initialized():
        return info
    backend = backend or default_backend()
    if timeout is None:
        timeout = _timeout_from_env()
    elif not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if init_method == "env://":
        _export_env_for_env_init(info)
    elif not init_method.startswith(("tcp://", "file://")):
        raise DistEnvError(f"init_method={init_method!r}: use env://, tcp://HOST:PORT or file:///PATH")
    if backend == "nccl":
        count = torch.cuda.device_count()
        if info.local_rank >= count:
            raise DistEnvError(
                f"LOCAL_RANK={info.local_rank} but this node has {count} CUDA device(s): start at most "
                f"{count} processes per node (--nproc_per_node) or check CUDA_VISIBLE_DEVICES"
            )
        torch.cuda.set_device(info.local_rank)
    # A failed NCCL collective must abort the process rather than hang until the timeout.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    store = _attempt_store(info, timeout) if init_method == "env://" else None
    dist.init_process_group(
        backend=backend,
        init_method=None if store is not None else init_method,
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )
    LOGGER.info(
        f"process group: {backend}, world size {info.world_size}, "
        f"{info.world_size // max(info.local_world_size, 1)} node(s), via {info.source}"
    )
    return info


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


def barrier() -> None:
    """Wait for every rank; a no-op without a process group."""
    if is_dist_initialized():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def _collective_device() -> torch.device:
    if is_dist_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_tensor(tensor: torch.Tensor, op: str = "mean", dst: int | None = None) -> torch.Tensor:
    """Reduce a tensor over all ranks and return the result as a new tensor.

    Args:
        tensor: the local value; it is not modified.
        op: "mean", "sum", "max" or "min".
        dst: None all-reduces (every rank gets the result); an int reduces to that
            rank only, and the other ranks get their own value back unchanged.

    Returns:
        The reduced tensor, on the input's device and dtype.

    Examples:
        >>> import torch
        >>> reduce_tensor(torch.tensor([1.0, 3.0]), op="mean")  # single process
        tensor([1., 3.])
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"op={op!r}: choose one of {_REDUCE_OPS}")
    if not is_dist_initialized():
        return tensor.detach().clone()
    # a fresh buffer: gloo's reduce leaves partial sums in the non-destination ranks' buffers
    work = tensor.detach().to(_collective_device(), copy=True)
    if op == "mean" and not work.is_floating_point():
        work = work.double()
    red = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if dst is None:
        dist.all_reduce(work, op=red[op])
    else:
        dist.reduce(work, dst=dst, op=red[op])
        if dist.get_rank() != dst:
            return tensor.detach().clone()
    if op == "mean":
        work = work / dist.get_world_size()
    return work.to(tensor.device, tensor.dtype if tensor.is_floating_point() else work.dtype)


def reduce_dict(values: Mapping[str, Any], op: str = "mean", dst: int | None = None) -> dict[str, torch.Tensor]:
    """Reduce a dict of scalars or same-shaped tensors over all ranks, key by key.

    Every rank must pass the same keys; they are reduced in sorted order in one
    collective.

    Examples:
        >>> out = reduce_dict({"box": 0.5, "cls": 1.0})
        >>> {k: round(float(v), 2) for k, v in out.items()}
        {'box': 0.5, 'cls': 1.0}
    """
    keys = sorted(values)
    if not keys:
        return {}
    stacked = torch.stack([torch.as_tensor(values[k], dtype=torch.float64).detach().cpu() for k in keys])
    reduced = reduce_tensor(stacked, op=op, dst=dst)
    return dict(zip(keys, reduced.unbind(0)))


def broadcast_object(obj: T, src: int = 0) -> T:
    """Send a picklable object from rank ``src`` to every rank and return it.

    Examples:
        >>> broadcast_object({"stop": False})
        {'stop': False}
    """
    if not is_dist_initialized():
        return obj
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]


def all_gather_object(obj: T) -> list[T]:
    """Gather a picklable object from every rank, in rank order, on every rank.

    Examples:
        >>> all_gather_object(3)
        [3]
    """
    if not is_dist_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """Decorate a function so that it runs on global rank 0 (or a single process) only.

    Examples:
        >>> @rank_zero_only
        ... def save(): return "saved"
        >>> save()
        'saved'
    """

    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        return fn(*args, **kwargs) if is_main_process() else None

    wrapper.__name__ = getattr(fn, "__name__", "wrapper")
    wrapper.__doc__ = fn.__doc__
    return wrapper


# --- first-process-first sections -------------------------------------------------------------

_section_counter = itertools.count()


def _default_store() -> Any | None:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # a torch without it, or a group without a store
        return None


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


def _wait_for_key(store: Any, key: str, leader: int, deadline: float | None, log_every: float) -> None:
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
        if deadline is not None and now > deadline:
            raise RankFailedError(
                f"rank {get_rank()}: gave up after {now - start:.0f} s waiting for rank {leader} "
                "to finish its first-process section"
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
    is_leader: bool, leader_rank: int, followers: int, scope: str, timeout: float | None
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
    # Every process enters its sections in the same order, so a counter names them alike
    # on every rank; the restart count keeps an elastic restart from reading old keys.
    key = f"ddp_utils/first/{info.restart_count}/{scope}/{next(_section_counter)}"
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
    deadline = None if timeout is None else time.monotonic() + timeout
    _wait_for_key(store, key, leader_rank, deadline, log_every=60.0)
    status = store.get(key).decode()
    if status.startswith("error:"):
        with contextlib.suppress(Exception):
            store.add(f"{key}/ack", 1)
        raise RankFailedError(
            f"rank {leader_rank} failed in its first-process section, so rank {get_rank()} stops too: "
            f"{status[len('error:') :]}"
        )
    yield


@contextlib.contextmanager
def torch_distributed_zero_first(local_rank: int, timeout: float | None = None) -> Iterator[None]:
    """Let the first process of each node run the body first; the node's others wait.

    Use it around work each node needs once before its processes can share it: a
    dataset download to local disk, a label cache build. The waiting processes poll
    the process group's store instead of sitting in a barrier, so a body that runs
    for an hour trips no collective timeout, and when the first process raises, the
    others raise :class:`RankFailedError` within a second, naming its rank and error.

    Args:
        local_rank: this process's rank within its node (-1 for a single process).
        timeout: seconds the others wait before giving up; None waits as long as it
            takes, logging "still waiting" every minute.

    Examples:
        >>> with torch_distributed_zero_first(-1):  # single process: just runs
        ...     pass
    """
    if not is_dist_initialized() or local_rank == -1:
        yield
        return
    info = dist_info()
    leader = info.rank - info.local_rank  # global rank of this node's local rank 0
    followers = info.local_world_size - 1
    with _leader_first(local_rank == 0, leader, followers, f"node{info.node_rank}", timeout):
        yield


@contextlib.contextmanager
def torch_distributed_rank_zero_first(timeout: float | None = None) -> Iterator[None]:
    """Let global rank 0 run the body first, then every other rank of the job.

    The job-wide variant of :func:`torch_distributed_zero_first`, for work whose result
    lands on a file system all nodes share.

    Examples:
        >>> with torch_distributed_rank_zero_first():
        ...     pass
    """
    if not is_dist_initialized():
        yield
        return
    with _leader_first(get_rank() == 0, 0, get_world_size() - 1, "job", timeout):
        yield
