"""Hard failures under torchrun: a SIGKILLed worker, a lost node. Real torchrun agents on the CPU (gloo).

With ``--save-interval`` a run also saves last.pt in the middle of an epoch, so a failure that leaves no
time to save costs at most that interval: the restarted workers (``--max-restarts``) find their run
by the launch key and continue at the batch of its latest save, at whatever size the job re-formed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddp_utils.run import CheckpointError, TrainState, load_checkpoint
from tests.multiproc import REPO_ROOT, describe, free_port, kill_tree, run_watching
from tests.test_train import _worker_pids, results, torchrun, train_env
from tests.test_train_resume import args, data  # noqa: F401 (the module's dataset fixture)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

SAVED = re.compile(r"saved (\S+) at epoch (\d+), batch (\d+)/(\d+)")
RESUMED = re.compile(r"resuming \S+ at epoch (\d+), batch (\d+)/(\d+)")
INTERVAL = ("--save-interval", "0.002")  # minutes: a save every few steps of this tiny run


class SecondSaveInEpoch:
    """An ``on_line`` that calls ``act`` once, when rank 0 logs its second mid-epoch save of ``epoch``."""

    def __init__(self, epoch: int, act) -> None:
        self.epoch, self.act, self.saves, self.done = epoch, act, [], threading.Event()

    def __call__(self, line: str, proc=None) -> None:
        match = SAVED.search(line)
        if match and int(match.group(2)) == self.epoch and not self.done.is_set():
            self.saves.append(int(match.group(3)))
            if len(self.saves) == 2:  # the first one is on disk by now (each waits for the one before)
                self.done.set()
                self.act()


def wait_for_save(last: Path, epoch: int, batch: int, seconds: float = 60) -> None:
    """Poll ``last`` (written atomically: whole when there) until it holds the save at ``epoch`` (from 1), ``batch``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, CheckpointError):
            state = TrainState.from_checkpoint(load_checkpoint(last))
            if (state.epoch + 1, state.batch) >= (epoch, batch):
                return
        time.sleep(0.005)
    raise AssertionError(f"{last} did not reach epoch {epoch}, batch {batch} within {seconds} s")


def saves_before(log: str, end: int, epoch: int) -> list[int]:
    """The batches of ``epoch``'s (from 1) saves that rank 0 logged in ``log[:end]``, in order."""
    return [int(m.group(3)) for m in SAVED.finditer(log[:end]) if int(m.group(2)) == epoch]


@pytest.mark.timeout(500)
def test_a_sigkilled_worker_costs_at_most_the_save_interval(data, tmp_path):  # noqa: F811
    cmd = torchrun(2, *args(data, tmp_path, "run", "--epochs", "3", "--workers", "0", *INTERVAL),
                   extra=("--max-restarts", "1"))  # fmt: skip
    holder: dict[str, subprocess.Popen] = {}
    weights, in_flight, on_disk = tmp_path / "run" / "weights", [], []

    def kill_rank0() -> None:  # the writer itself, once the epoch's second save is on disk
        pid = _worker_pids(holder["proc"].pid)[0]
        wait_for_save(weights / "last.pt", 2, watch.saves[1])
        os.kill(pid, signal.SIGSTOP)  # frozen: what is on disk now is what the restart finds
        in_flight.append(bool(list(weights.glob(f".last.pt.{pid}.*.tmp"))))  # a newer save cut mid-write
        state = TrainState.from_checkpoint(load_checkpoint(weights / "last.pt"))  # whole: written by rename
        on_disk.append((state.epoch + 1, state.batch))
        os.kill(pid, signal.SIGKILL)

    watch = SecondSaveInEpoch(2, kill_rank0)

    def on_line(line: str, proc: subprocess.Popen) -> None:
        holder["proc"] = proc
        watch(line)

    result = run_watching(cmd, train_env(), 450, on_line)
    assert result.returncode == 0 and watch.done.is_set(), describe([result])
    resumed = RESUMED.search(result.stderr)
    assert resumed, describe([result])  # the restarted workers found their run and its mid-epoch last.pt
    # the restart continues from the last.pt on disk at the kill; what the kill cost: the steps since the last
    # save logged before it or, when the kill cut that save's background write, since the one before it (whole:
    # each save waits for the one before). A save whose write had begun but whose line was not out yet leaves the
    # last logged one on disk, a write in flight beside it.
    logged = saves_before(result.stderr, resumed.start(), 2)
    print(f"epoch 2's saves logged before the kill: batches {logged}; a write cut: {in_flight[0]}; on disk {on_disk}")
    assert (int(resumed.group(1)), int(resumed.group(2))) == on_disk[0], (logged, in_flight, resumed.group(0))
    assert on_disk[0] == (2, logged[-1]) or (in_flight[0] and on_disk[0] == (2, logged[-2])), (logged, in_flight)
    assert on_disk[0][1] >= watch.saves[1]  # the second save of the epoch, on disk before the kill, is never lost
    assert [r["epoch"] for r in results(tmp_path / "run")] == [0.0, 1.0, 2.0]  # each epoch once
    assert TrainState.from_checkpoint(load_checkpoint(tmp_path / "run" / "weights" / "last.pt")).epoch == 3


def agent(endpoint: str, rest: list[str]) -> subprocess.Popen:
    """One torchrun agent (a node) of an elastic job of 1 to 2 nodes, one process each."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "elastic-test", "--max-restarts", "2",
        *rest,
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


@pytest.mark.timeout(500)
def test_an_elastic_job_that_loses_a_node_re_forms_as_one_and_finishes_the_run(data, tmp_path):  # noqa: F811
    endpoint = f"127.0.0.1:{free_port()}"
    rest = args(data, tmp_path, "run", "--epochs", "3", "--workers", "0", *INTERVAL)
    first = agent(endpoint, rest)  # it hosts the rendezvous store; the second node is the one lost
    time.sleep(1.0)
    second = agent(endpoint, rest)
    watch = SecondSaveInEpoch(2, lambda: kill_tree(second.pid))  # the node and its worker, gone at once
    logs: dict[str, list[str]] = {"first": [], "second": []}

    def pump(proc: subprocess.Popen, name: str) -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            logs[name].append(line)
            watch(line)

    pumps = [threading.Thread(target=pump, args=(p, n)) for p, n in ((first, "first"), (second, "second"))]
    for thread in pumps:
        thread.start()
    try:
        first.wait(timeout=420)
    except subprocess.TimeoutExpired:
        kill_tree(first.pid)
        kill_tree(second.pid)
        pytest.fail("the job did not finish:\n" + "".join(logs["first"][-80:]))
    finally:
        for thread in pumps:
            thread.join(timeout=30)
    log = "".join(logs["first"])
    assert watch.done.is_set() and first.returncode == 0, log[-6000:] + "".join(logs["second"][-40:])
    assert "world size 2, 2 node(s)" in log + "".join(logs["second"]) and "world size 1, 1 node(s)" in log
    resumed = RESUMED.search(log)
    assert resumed and int(resumed.group(1)) == 2 and int(resumed.group(2)) >= watch.saves[0], log[-6000:]
    assert "saved by 2 process(es) x 4 images, now 1 x 8" in log
    assert [r["epoch"] for r in results(tmp_path / "run")] == [0.0, 1.0, 2.0]  # every epoch once
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["run"]
