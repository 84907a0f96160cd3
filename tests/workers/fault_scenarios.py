"""Functions that tests/test_faults.py runs in real worker processes (see tests/multiproc.py).

Each one joins a gloo process group and then breaks something on purpose: a rank raises
while its peers sit in a collective, a node's first process rebuilds a label cache many
times over, ... Every process prints one JSON line about what it saw, so the test can
check each rank's view.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import ddp_utils as du
from ddp_utils.data.labels import LabelSet, load_labels

COLLECTIVES = {
    "reduce_tensor": lambda rank: du.reduce_tensor(torch.tensor([float(rank)]), op="sum"),
    "reduce_dict": lambda rank: du.reduce_dict({"loss": float(rank)}),
    "all_gather_object": lambda rank: du.all_gather_object({"rank": rank}),
    "broadcast_object": lambda rank: du.broadcast_object({"names": ["a"]} if rank == 0 else None),
    "barrier": lambda rank: du.barrier(),
}


def emit(record: dict) -> None:
    """One write per record, so ranks sharing a pipe do not interleave."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def rank_raises_before_collective(
    collective: str, failing_rank: str = "1", delay: str = "0.5", catch: str = "yes"
) -> None:
    """``failing_rank`` raises (and exits) while every other rank enters ``collective``.

    The group's timeout is 10 minutes: a peer that notices the failure only at the
    timeout makes the test's deadline fail. Peers print the error they saw, then exit 3.
    """
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=600)
    du.barrier()  # everybody is up: what follows measures the failure, not the start
    if info.rank == int(failing_rank):
        time.sleep(float(delay))  # the others are inside the collective by now
        raise ValueError(f"rank {info.rank}: injected failure before {collective}")
    start = time.monotonic()
    if catch != "yes":  # what a training script does: nothing, the error ends the process
        emit({"rank": info.rank, "entering": collective, "t": time.time()})
        COLLECTIVES[collective](info.rank)
        emit({"rank": info.rank, "error": None, "seconds": time.monotonic() - start})
        return
    try:
        COLLECTIVES[collective](info.rank)
    except Exception as exc:
        emit({"rank": info.rank, "error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start})
        os._exit(3)  # a peer is gone: do not try to leave the group together
    emit({"rank": info.rank, "error": None, "seconds": time.monotonic() - start})
    du.cleanup()


def zero_first_cache_rounds(root: str, rounds: str = "50") -> None:
    """Rebuild a node's label cache ``rounds`` times inside torch_distributed_zero_first.

    Each node works on its own copy of the dataset (``root/node<N>``). In every round the
    node's first process deletes the cache and builds it inside the section; the others
    read it after. Each rank prints, per round, whether it wrote the cache and a digest
    of the LabelSet it got.
    """
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):  # oversubscribed on any machine: all ranks share two cores
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    info = du.init_distributed(backend="gloo", timeout=120)
    images = sorted(str(p) for p in (Path(root) / f"node{info.node_rank}" / "images" / "train").glob("*.jpg"))
    cache = Path(root) / f"node{info.node_rank}" / "labels" / "train.cache"
    rows = []
    for round_index in range(int(rounds)):
        with du.torch_distributed_zero_first(info.local_rank, timeout=60):
            if info.local_rank == 0:
                cache.unlink(missing_ok=True)
            labels = load_labels(images, cache_path=cache, workers=1)
        rows.append([round_index, labels.cache_written, labels.cache_loaded, labelset_digest(labels)])
        # every rank of the node must be done reading before the leader deletes the file again
        du.barrier()
    emit({"rank": info.rank, "node": info.node_rank, "local_rank": info.local_rank, "rows": rows})
    du.cleanup()


def labelset_digest(labels: LabelSet) -> str:
    """A digest of what a LabelSet holds, with file names relative to their node's copy."""
    h = hashlib.sha256()
    for name in labels.im_files:
        h.update(Path(name).name.encode())
    for lb in labels.labels:
        h.update(lb.tobytes())
    h.update(labels.shapes.tobytes())
    h.update(json.dumps(labels.counts, sort_keys=True).encode())
    return h.hexdigest()[:16]


def rank_stalls_in_barrier(stall_seconds: str = "300") -> None:
    """Rank 1 stays alive but never reaches the barrier the others wait in.

    No connection closes, so only the collective timeout can end the wait: the group is
    started with ``init_distributed()`` and no timeout, so DDP_UTILS_DIST_TIMEOUT sets it.
    """
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    du.barrier()
    if info.rank == 1:
        time.sleep(float(stall_seconds))  # a deadlocked rank: alive, silent
        os._exit(0)
    start = time.monotonic()
    try:
        du.barrier()
    except Exception as exc:
        emit({"rank": info.rank, "error": f"{type(exc).__name__}: {exc}"[:500], "seconds": time.monotonic() - start})
        os._exit(3)
    emit({"rank": info.rank, "error": None, "seconds": time.monotonic() - start})


def loader_worker_killed(image_dir: str) -> None:
    """SIGKILL one data loader worker in the second epoch (as the OOM killer would) and report.

    Runs in its own process: torch's SIGCHLD handler, once a worker has died, raises in
    whatever the main thread does next, which must not be pytest's own machinery.
    """
    import signal

    from ddp_utils.data.loader import create_dataloader
    from tests.multiproc import descendants

    torch.set_num_threads(1)
    loader, _ = create_dataloader(image_dir, 64, 2, 32, workers=2)
    killed = []
    start = time.monotonic()
    try:
        for epoch in range(3):  # the workers are reused across epochs: kill one in the second
            loader.set_epoch(epoch)
            for i, _batch in enumerate(loader):
                if epoch == 1 and i == 1:
                    worker = descendants(os.getpid())[0]
                    killed.append(worker)
                    start = time.monotonic()
                    os.kill(worker, signal.SIGKILL)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start
    loader.set_epoch(3)  # the loader recovers: the next epoch starts fresh workers
    batches = sum(1 for _ in loader)
    emit({"rank": 0, "killed": killed, "error": error, "seconds": seconds, "next_epoch": batches, "len": len(loader)})
    os._exit(0)
