"""PreemptionHandler: SIGTERM becomes a flag, every rank stops at the same step, handlers come back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ddp_utils.run import PreemptionHandler

from ..multiproc import REPO_ROOT, collect, describe, launch, launcher_env


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own Ctrl-C handler, as a terminal or CI starts the tests with: a job a shell put in the background
    (``nohup ... &``) inherits SIGINT ignored, and Python then leaves it so."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def single_process_env() -> dict[str, str]:
    env = launcher_env()
    return env


def test_handler_is_installed_and_restored():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionHandler(signals=(signal.SIGTERM, signal.SIGINT)) as preempt:
        assert signal.getsignal(signal.SIGTERM) == preempt._handle
        assert signal.getsignal(signal.SIGINT) == preempt._handle
        assert not preempt.requested() and not preempt.requested_anywhere()
    assert signal.getsignal(signal.SIGTERM) == before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_two_ctrl_cs_during_one_long_step_still_interrupt():
    """Two SIGINTs from outside while the main thread is inside one long C call (a step's matmul) reach Python as
    one handler call; the handler counts the deliveries on its wakeup fd and the second one interrupts."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 16-core host multiplies 3000 x 3000 in 0.4 s: one thread, grown until long enough
    try:
        for n in (3000, 4500, 6000, 8000):
            a = torch.randn(n, n)
            started = time.monotonic()
            a @ a  # noqa: B018 (the long step: a Python handler can only run once it returns)
            if time.monotonic() - started > 0.6:
                break
        assert time.monotonic() - started > 0.4, "the step is too short for two signals 0.1 s apart: make it longer"
        _interrupted_twice_inside(a)
    finally:
        torch.set_num_threads(threads)


def _interrupted_twice_inside(a) -> None:
    script = f"sleep 0.1; kill -INT {os.getpid()}; sleep 0.1; kill -INT {os.getpid()}"
    with PreemptionHandler(signals=(signal.SIGTERM, signal.SIGINT)) as preempt:
        sender = subprocess.Popen(["sh", "-c", script])
        try:
            with pytest.raises(KeyboardInterrupt):
                a @ a  # noqa: B018
                sum(range(10))  # Python code, where pending handlers run (the next line of a training loop)
        finally:
            sender.wait(timeout=10)
        assert preempt.received == signal.SIGINT


def test_sigint_sets_the_flag_then_a_second_one_interrupts():
    with PreemptionHandler(signals=(signal.SIGINT,)) as preempt:
        signal.raise_signal(signal.SIGINT)
        assert preempt.requested() and preempt.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the second one gets Python's own Ctrl-C behaviour
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.timeout(60)
def test_a_forked_child_leaves_the_signal_to_its_parent_and_says_nothing():
    # torchrun ends a worker with a SIGTERM to its process group: its data-loader workers get it too, and one caught
    # between its fork and its own handlers ran the trainer's: a second "[rank 1] received SIGTERM" line
    with PreemptionHandler(signals=(signal.SIGTERM,)) as preempt:
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # the loader worker, before worker_init_fn
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(10))  # Python code, where a handler runs
                os.write(write_end, str(preempt.received).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        said = os.read(read_end, 64)
        os.close(read_end)
        _, status = os.waitpid(child, 0)
        assert not preempt.requested()  # the parent received nothing
    assert said == b"None" and os.waitstatus_to_exitcode(status) == 0, (said, status)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_sigterm_sets_the_flag_and_the_process_exits_cleanly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.multiproc", "tests.workers.engine_scenarios:sigterm_loop", "50", "5"],
        cwd=REPO_ROOT,
        env=single_process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    (worker,) = collect([proc], time.monotonic(), 45, "sigterm_loop")
    assert worker.returncode == 0, describe([worker])
    record = last_json(worker.stdout)
    assert record == {"stopped_at": 5, "received": int(signal.SIGTERM), "restored": True}
    assert "received SIGTERM" in worker.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_ddp_ranks_stop_together_and_read_what_rank0_saved(tmp_path):
    workers = launch("tests.workers.engine_scenarios:ddp_engine", nprocs=2, timeout=100, args=(str(tmp_path),))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    rank0, rank1 = (last_json(w.stdout) for w in workers)
    # rank 1 alone got SIGTERM at step 3; both ranks left the loop at that step
    assert rank1["received"] == int(signal.SIGTERM) and rank0["received"] is None
    assert rank0["stopped_at"] == rank1["stopped_at"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # rank 0 wrote it; both read it after the barrier
    # the EMA looked through DDP: plain keys, identical on both ranks, and what was saved
    assert rank0["ema_keys"] == rank0["loaded_keys"] == ["0.bias", "0.weight", "1.bias"]
    assert rank0["ema_sum"] == rank1["ema_sum"]
    assert rank0["synced_sum"] == rank1["synced_sum"]  # running stats too, after ema.sync()
    assert rank0["ema_updates"] == rank1["ema_updates"] == 4
    # rank 0's early-stop decision reached rank 1
    assert rank0["stop"] is True and rank1["stop"] is True
