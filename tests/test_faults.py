"""Faults injected into real processes: a rank that dies or stalls, a first-process section
hammered on oversubscribed cores, a data loader worker that meets a corrupt file, a full disk.

A rank raising inside torch_distributed_zero_first is tested in tests/test_dist.py, an
interrupted checkpoint save in tests/run/test_checkpoint.py; these are the other cases.
Every wait is bounded: a hang fails the test at its deadline instead of stalling CI.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

from ddp_utils.data import load_labels, make_shapes_dataset
from ddp_utils.run.checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint
from tests.multiproc import describe, launch
from tests.workers.fault_scenarios import labelset_digest

SCENARIOS = "tests.workers.fault_scenarios"
PEER_GONE = r"Connection (closed|reset) by peer|Broken pipe"


def records(workers) -> dict[int, dict]:
    """The JSON line each rank printed, by rank (ranks that printed none are absent)."""
    out = {}
    for w in workers:
        for line in w.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                out.setdefault(record["rank"], {}).update(record)
    return out


# --- a rank dies while its peers are in a collective -------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("collective", "failing_rank"),
    [
        ("reduce_tensor", 1),
        ("all_gather_object", 2),
        ("broadcast_object", 0),  # rank 0 hosts the store and is the broadcast's source
    ],
)
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rank_raising_before_a_collective_ends_every_process_promptly(collective, failing_rank):
    # the group's timeout is 10 minutes: a peer that noticed only at the timeout would blow the deadline
    workers = launch(f"{SCENARIOS}:rank_raises_before_collective", 3, timeout=120, args=(collective, failing_rank))
    output = describe(workers)
    assert all(w.returncode != 0 for w in workers), output
    failing = workers[failing_rank]
    assert f"ValueError: rank {failing_rank}: injected failure before {collective}" in failing.stderr, output
    seen = records(workers)
    for rank in {0, 1, 2} - {failing_rank}:
        assert workers[rank].returncode == 3, output  # it left the collective with an exception
        # gloo names the cause: the peer's connection closed (or was reset, when data was in flight)
        assert re.search(PEER_GONE, seen[rank]["error"]), output
        assert seen[rank]["seconds"] < 30, output


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_uncaught_error_while_others_wait_in_barrier_exits_every_rank_nonzero():
    # as a training script would: nobody catches, and the traceback names the rank and error;
    # rank 0 raising also takes the rendezvous store down with it
    workers = launch(f"{SCENARIOS}:rank_raises_before_collective", 3, timeout=120, args=("barrier", 0, 0.5, "no"))
    output = describe(workers)
    assert [w.returncode for w in workers] == [1, 1, 1], output
    assert "[rank0]: ValueError: rank 0: injected failure before barrier" in workers[0].stderr, output
    for w in workers[1:]:
        assert f"[rank{w.rank}]: RuntimeError" in w.stderr and re.search(PEER_GONE, w.stderr), output
    assert max(w.seconds for w in workers) < 60, output


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_stalled_rank_is_bounded_by_ddp_utils_dist_timeout():
    # rank 1 stays alive and silent: no connection closes, only the collective timeout ends the wait
    workers = launch(
        f"{SCENARIOS}:rank_stalls_in_barrier", 3, timeout=120, args=(8,), env={"DDP_UTILS_DIST_TIMEOUT": "3"}
    )
    output = describe(workers)
    seen = records(workers)
    for rank in (0, 2):
        assert workers[rank].returncode == 3, output
        assert "Timed out waiting 3000ms" in seen[rank]["error"], output
        assert 2.5 < seen[rank]["seconds"] < 30, output


# --- first-process sections under load ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_label_cache_rebuilt_50_times_by_two_nodes_is_written_once_per_round_and_never_torn(tmp_path):
    rounds = 50
    make_shapes_dataset(tmp_path / "node0", n_train=6, n_val=1, size=(64, 96))
    shutil.copytree(tmp_path / "node0", tmp_path / "node1")  # each node has its own local disk
    shutil.copytree(tmp_path / "node0", tmp_path / "reference")
    expected = labelset_digest(load_labels(sorted(map(str, (tmp_path / "reference/images/train").glob("*.jpg")))))

    # 4 processes, 2 nodes of 2, on a machine with 2 cores (shared with other tests)
    workers = launch(f"{SCENARIOS}:zero_first_cache_rounds", 4, timeout=120, args=(tmp_path, rounds), nnodes=2)
    output = describe(workers)
    assert [w.returncode for w in workers] == [0, 0, 0, 0], output
    seen = records(workers)
    assert sorted(seen) == [0, 1, 2, 3], output
    for node in (0, 1):
        ranks = [r for r in seen.values() if r["node"] == node]
        for round_index in range(rounds):
            rows = [r["rows"][round_index] for r in ranks]
            writers = [r["local_rank"] for r, row in zip(ranks, rows) if row[1]]
            assert writers == [0], f"node {node} round {round_index}: written by local ranks {writers}"
            assert all(row[2] for r, row in zip(ranks, rows) if r["local_rank"] != 0), "a follower rescanned"
            assert {row[3] for row in rows} == {expected}, f"node {node} round {round_index}: torn or stale"
        leftovers = list((tmp_path / f"node{node}" / "labels").glob(".*.tmp"))
        assert leftovers == [], leftovers
    assert max(w.seconds for w in workers) < 60, output


# --- a data loader worker meets a corrupt file ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_loader_worker_on_a_corrupt_image_names_the_file(tmp_path):
    loader_module = pytest.importorskip("ddp_utils.data.loader", reason="needs the data loader (branch data-b)")
    root = make_shapes_dataset(tmp_path / "shapes", n_train=8, n_val=1, size=(64, 96))
    train = root / "images" / "train"
    # the label cache is built and verified first; the file breaks afterwards, behind its back
    first, _ = loader_module.create_dataloader(str(train), 64, 4, 32, workers=2)
    assert len(first.dataset) == 8
    victim = sorted(train.glob("*.jpg"))[3]
    # same size and mtime: the cache's file hash cannot tell, so the image is not verified again
    st = victim.stat()
    victim.write_bytes((b"\x00garbage, not a JPEG\xff" * (st.st_size // 21 + 1))[: st.st_size])
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    loader, dataset = loader_module.create_dataloader(str(train), 64, 4, 32, workers=2)
    assert dataset.im_files == first.dataset.im_files  # the corrupt image slipped past verification
    with pytest.raises(Exception) as info:
        for _ in loader:
            pass
    assert str(victim) in str(info.value), f"the error does not name {victim}: {info.value!r}"
    # the failed iterator lives on in the traceback's frames: shut its workers down here (about 10 s:
    # torch joins each for 5 s), not in whichever later test the garbage collector happens to run in
    del info
    gc.collect()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_loader_worker_killed_mid_epoch_is_an_error_not_a_hang_and_the_next_epoch_runs(tmp_path):
    # what the kernel's OOM killer does to a worker that grew too large
    pytest.importorskip("ddp_utils.data.loader", reason="needs the data loader (branch data-b)")
    root = make_shapes_dataset(tmp_path / "shapes", n_train=16, n_val=1, size=(64, 96))
    workers = launch(f"{SCENARIOS}:loader_worker_killed", 1, timeout=90, args=(root / "images" / "train",))
    output = describe(workers)
    seen = records(workers)[0]
    assert seen["killed"] and seen["error"], output
    # torch says "is killed by signal" or "exited unexpectedly", depending on which notices first;
    # when it reads the dead worker's truncated message first, the loader names the worker itself
    worker_died = (
        r"RuntimeError: DataLoader worker "
        r"(\(pid(\(s\))? [\d, ]+\) (is killed by signal|exited unexpectedly)|died while sending a batch: pid \d+)"
    )
    assert re.search(worker_died, seen["error"]) and str(seen["killed"][0]) in seen["error"], output
    assert seen["seconds"] < 60, output
    assert seen["next_epoch"] == seen["len"] == 8, output


# --- a disk that fills up during a checkpoint save ------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a 1 MB tmpfs to fill up: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MB tmpfs to fill up (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_checkpoint_save_on_a_full_disk_keeps_the_previous_file(tiny_tmpfs):
    target = tiny_tmpfs / "weights" / "last.pt"
    save_checkpoint({"epoch": 1, "model": {"w": torch.full((50_000,), 1.0)}}, target)  # 200 KB of 1 MB
    before = target.read_bytes()
    with pytest.raises(CheckpointWriteError) as info:  # 2 MB cannot fit beside it
        save_checkpoint({"epoch": 2, "model": {"w": torch.full((500_000,), 2.0)}}, target)
    message = str(info.value)
    assert str(target) in message and "No space left on device" in message and "intact" in message, message
    assert target.read_bytes() == before
    assert load_checkpoint(target)["epoch"] == 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.pt"], "the failed save left a temp file"
    # the space comes back: a later save that fits goes through
    save_checkpoint({"epoch": 3, "model": {"w": torch.full((50_000,), 3.0)}}, target)
    assert load_checkpoint(target)["epoch"] == 3
