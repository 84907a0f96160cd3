"""What a data-loader worker does as it starts (ddp_utils.data.workers.init_worker), in real worker processes."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from ddp_utils.data.workers import init_worker


class _WorkerState(Dataset):
    """Each item: the worker's pid and whether its SIGINT is ignored."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.tensor([os.getpid(), int(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)])


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.timeout(60)
def test_ctrl_c_is_the_trainers_a_worker_neither_runs_its_handler_nor_dies(capfd) -> None:
    def trainer_handler(signum, frame) -> None:  # as PreemptionHandler: one line, then finish the step
        print(f"received SIGINT in pid {os.getpid()}", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, trainer_handler)  # installed before the workers fork, as in train.py
    try:
        loader = DataLoader(_WorkerState(), batch_size=2, num_workers=1, worker_init_fn=init_worker)
        batches = iter(loader)
        pid, ignored = next(batches)[0].tolist()
        assert pid != os.getpid()
        os.kill(pid, signal.SIGINT)  # what a terminal's Ctrl-C sends every process of its group
        time.sleep(0.5)
        later = [next(batches)[0].tolist() for _ in range(5)]
        assert [p for p, _ in later] == [pid] * 5  # the same worker, still serving
        del batches  # the loader ends its worker, as at the end of an epoch
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "received SIGINT" not in capfd.readouterr().err  # the trainer's handler did not run in the worker
    assert ignored == 1
