"""Functions that tests run in real worker processes (see tests/multiproc.py).

Each one joins a gloo process group, checks something from the inside, prints
what the test reads back, and leaves the group. An assertion that fails exits the
process non-zero, and the test reports its output.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import ddp_utils as du
from ddp_utils.distributed import any_rank, collective_device, default_device


def emit(line: str) -> None:
    """One write per record: print() writes the newline separately, so ranks sharing a pipe interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def zero_first_order(directory: str, scope: str = "node", delay: str = "1.0") -> None:
    info = du.init_distributed(backend="gloo")
    node_dir = Path(directory) / (f"node{info.node_rank}" if scope == "node" else "job")
    node_dir.mkdir(parents=True, exist_ok=True)
    marker = node_dir / "built.txt"
    section = (
        du.torch_distributed_zero_first(info.local_rank)
        if scope == "node"
        else (du.torch_distributed_rank_zero_first())
    )
    leader = info.local_rank == 0 if scope == "node" else info.rank == 0
    with section:
        if leader:
            time.sleep(float(delay))  # the others must still be waiting when this ends
            marker.write_text(str(info.rank))
            found = None
        else:
            found = marker.read_text() if marker.exists() else None
    emit(json.dumps({"rank": info.rank, "leader": leader, "found": found, "t": time.time()}))
    du.cleanup()


def zero_first_keys(directory: str) -> None:
    """Sections named by what they guard survive a rank opening one the others do not.

    Rank 0 alone first opens a section of its own (as code behind ``if rank == 0`` would; a process-wide
    count then differs between ranks); then every rank opens a section keyed "cache" twice (two loaders
    of one cache) and a default-keyed one twice in a loop. In each, the followers must find what the
    leader wrote in that very section.
    """
    info = du.init_distributed(backend="gloo")
    leader = info.local_rank == 0
    if leader:
        with du.torch_distributed_zero_first(info.local_rank, key="only on the leader"):
            pass
    found = []
    for name in ("cache0", "cache1", "line0", "line1"):
        marker = Path(directory) / f"{name}.txt"
        section = (
            du.torch_distributed_zero_first(info.local_rank, timeout=60, key="cache")
            if name.startswith("cache")
            else du.torch_distributed_zero_first(info.local_rank, timeout=60)
        )
        with section:
            if leader:
                time.sleep(0.5)  # the others must still be waiting when this ends
                marker.write_text(name)
            else:
                found.append(marker.exists())
    emit(json.dumps({"rank": info.rank, "leader": leader, "found": found}))
    du.cleanup()


def zero_first_other_key(timeout: str = "2") -> None:
    """The leader opens a section under one name, the followers under another: they give up after ``timeout``."""
    info = du.init_distributed(backend="gloo", timeout=600)
    leader = info.local_rank == 0
    start = time.monotonic()
    try:
        with du.torch_distributed_zero_first(info.local_rank, timeout=float(timeout), key="a" if leader else "b"):
            pass
        error = None
    except du.distributed.RankFailedError as exc:
        error = str(exc)
    emit(json.dumps({"rank": info.rank, "error": error, "seconds": time.monotonic() - start}))
    du.barrier()
    du.cleanup()


def zero_first_leader_raises(scope: str = "node") -> None:
    info = du.init_distributed(backend="gloo", timeout=600)
    section = (
        du.torch_distributed_zero_first(info.local_rank)
        if scope == "node"
        else (du.torch_distributed_rank_zero_first())
    )
    with section:
        if info.rank == 0:
            time.sleep(0.5)
            raise ValueError("corrupt download: checksum mismatch")
    print("unreachable: rank passed a failed section")


def zero_first_leader_killed() -> None:
    """2 nodes of 2: node 1's first process (rank 2) dies by SIGKILL inside its section."""
    import os
    import signal

    from ddp_utils.distributed.zero_first import _default_store

    info = du.init_distributed(backend="gloo", timeout=600)
    store = _default_store()
    start = time.monotonic()
    try:
        with du.torch_distributed_zero_first(info.local_rank):
            if info.rank == 2:
                time.sleep(3)  # a few heartbeats first: the followers must notice them stop
                os.kill(os.getpid(), signal.SIGKILL)
    except du.RankFailedError as exc:
        emit(json.dumps({"rank": info.rank, "error": str(exc), "seconds": time.monotonic() - start}))
        store.add("test/reported", 1)
        os._exit(3)
    if info.rank == 0:  # it hosts the store: stay until rank 3 has reported (bounded)
        deadline = time.monotonic() + 60
        while store.add("test/reported", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    emit(json.dumps({"rank": info.rank, "error": None}))
    os._exit(0)  # the group lost a member: leave without the cleanup barrier


def long_body(body_seconds: str, timeout_seconds: str) -> None:
    info = du.init_distributed(backend="gloo", timeout=float(timeout_seconds))
    with du.torch_distributed_zero_first(info.local_rank):
        if info.local_rank == 0:
            time.sleep(float(body_seconds))
    du.barrier()
    total = du.reduce_tensor(torch.tensor([1.0]), op="sum")
    emit(json.dumps({"rank": info.rank, "total": total.item()}))
    du.cleanup()


def collectives(init_method: str = "env://") -> None:
    info = du.init_distributed(backend="gloo", init_method=init_method)
    rank, world = info.rank, info.world_size
    assert du.is_dist_initialized() and du.get_world_size() == world
    assert du.is_main_process() == (rank == 0)
    local = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    out = {
        "mean": du.reduce_tensor(local, "mean").tolist(),
        "sum": du.reduce_tensor(local, "sum").tolist(),
        "max": du.reduce_tensor(local, "max").tolist(),
        "min": du.reduce_tensor(local, "min").tolist(),
        "sum_to_1": du.reduce_tensor(local, "sum", dst=1).tolist(),
        "int_mean": du.reduce_tensor(torch.tensor([rank * 2]), "mean").tolist(),
        "dict": {k: float(v) for k, v in du.reduce_dict({"box": rank + 1.0, "obj": 2.0 * rank}).items()},
        "broadcast": du.broadcast_object({"from": rank, "names": ["a", "b"]}, src=1),
        "gathered": du.all_gather_object({"rank": rank}),
        "local_unchanged": local.tolist(),
    }
    du.barrier()

    @du.rank_zero_only
    def only_on_zero() -> str:
        return "ran"

    out["rank_zero_only"] = only_on_zero()
    emit(json.dumps({"rank": rank, **out}))
    du.cleanup()


def group_collectives() -> None:
    """3 gloo ranks; every collective over the subgroup {0, 2} (rank 1 stays out), blocking and async."""
    import numpy as np
    import torch.distributed as dist

    from ddp_utils.distributed import all_reduce

    info = du.init_distributed(backend="gloo")
    rank = info.rank
    sub = dist.new_group([0, 2], backend="gloo")  # every rank makes it; only its members use it
    out: dict = {"rank": rank}
    if rank in (0, 2):
        local = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        started = du.reduce_tensor(local, "sum", group=sub, async_op=True)  # read after the others
        out["mean"] = du.reduce_tensor(local, "mean", group=sub).tolist()
        out["max_to_2"] = du.reduce_tensor(local, "max", dst=2, group=sub).tolist()
        out["dict"] = {k: float(v) for k, v in du.reduce_dict({"a": float(rank)}, "sum", group=sub).items()}
        out["any"] = [du.any_rank(rank == 2, group=sub), du.any_rank(False, group=sub)]
        out["any_async"] = du.any_rank(rank == 0, group=sub, async_op=True).wait()
        out["broadcast"] = du.broadcast_object(f"from {rank}", src=2, group=sub)
        out["gathered"] = du.all_gather_object(rank * 10, group=sub)
        host = np.array([float(rank == 2), float(rank)], dtype=np.float32)
        pending = all_reduce(torch.from_numpy(host), op="max", group=sub, async_op=True)
        pending.wait()
        out["host_flags"] = host.tolist()  # read from the NumPy array the tensor shares
        out["sum_async"] = started.wait().tolist()
        du.barrier(group=sub)
        du.barrier(group=sub, async_op=True).wait()
    else:
        errors = []
        for call in (
            lambda: du.reduce_tensor(torch.ones(1), group=sub),
            lambda: du.any_rank(True, group=sub),
            lambda: du.all_gather_object(1, group=sub),
        ):
            try:
                call()
            except ValueError as exc:
                errors.append(str(exc))
        out["errors"] = errors
    out["world_sum"] = du.reduce_tensor(torch.tensor([1.0]), "sum").tolist()  # the default group after
    emit(json.dumps(out))
    du.cleanup()


def helpers_demo() -> None:
    """What a detection project does with the helpers, run by torchrun in the tests."""
    du.set_logging()
    device = du.select_device("cpu", batch_size=4)  # before the group: it decides the backend
    info = du.init_distributed(device=device)
    du.init_seeds(du.rank_seed(0, info.rank))
    with du.torch_distributed_zero_first(info.local_rank):
        pass
    t0 = du.time_synchronized()
    loss = du.reduce_tensor(torch.tensor(float(info.rank)), op="mean")
    stats = du.reduce_dict({"loss": loss, "n": 1.0}, op="sum")
    names = du.broadcast_object(["circle", "square"] if du.is_main_process() else None)
    everyone = du.all_gather_object(info.local_rank)
    du.barrier()
    elapsed = du.time_synchronized() - t0
    emit(
        json.dumps(
            {
                "rank": info.rank,
                "device": str(device),
                "backend": torch.distributed.get_backend(),
                "loss": loss.item(),
                "n": float(stats["n"]),
                "names": names,
                "everyone": everyone,
                "elapsed_ok": elapsed >= 0,
            }
        )
    )
    du.cleanup()


def cpu_on_a_gpu_host() -> None:
    """``--device cpu`` where CUDA looks available: gloo and CPU collectives, not NCCL.

    torch.cuda's answers are replaced in this process only (torch.distributed is real), so a
    CPU-only host plays a node with one GPU: before the group forms, asking for that GPU with
    two local processes must be the clear count error.
    """
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    try:
        du.select_device("0")
        count_error = None
    except ValueError as exc:
        count_error = str(exc)
    device = du.select_device("cpu")
    info = du.init_distributed(device=device)
    out = {
        "rank": info.rank,
        "count_error": count_error,
        "default_device": str(default_device(info)),
        "backend": torch.distributed.get_backend(),
        "collective_device": str(collective_device()),
        "sum": du.reduce_tensor(torch.ones(1), op="sum").item(),
        "any_one": any_rank(info.rank == 1),
        "any_none": any_rank(False),
        "any_all": any_rank(True),
    }
    emit(json.dumps(out))
    du.cleanup()


def restart_after_kill() -> None:
    """Under torchrun --max-restarts 1: rank 1 dies by SIGKILL on the first attempt while rank 0
    lingers (it catches the agent's SIGTERM, as a training script saving a checkpoint does)."""
    import os
    import signal

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    signal.signal(signal.SIGTERM, lambda *_: None)
    info = du.init_distributed(backend="gloo")
    with du.torch_distributed_zero_first(info.local_rank):
        pass
    du.barrier()
    if attempt == 0 and info.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(2)
    total = du.reduce_tensor(torch.ones(1), op="sum").item()
    emit(json.dumps({"rank": info.rank, "attempt": attempt, "total": total}))
    du.cleanup()


if __name__ == "__main__":
    {"restart": restart_after_kill}.get(sys.argv[1] if len(sys.argv) > 1 else "", helpers_demo)()
