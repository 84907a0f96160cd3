"""train.py's exit window: a signal that comes once training has finished (its final save on disk: the moment a
scheduler's time limit lands as the run ends) leaves the run finished, exit 0, its last line naming the checkpoints
on disk. It killed the process (SIGTERM: rc -15), or gave 130 or SIGABRT (SIGINT).

Each signal is sent where a wrapper of train.py holds the run (the final save on disk, before or after the "done"
line, in the exit handlers) and has said so: nothing depends on timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ddp_utils.run import load_checkpoint

from .multiproc import run_watching
from .test_train import describe, tiny_data_yaml, train_args, train_env

HELD = """
import atexit, runpy, sys, time
from pathlib import Path
from ddp_utils.run import epochs, records
from ddp_utils.run.interrupt import ctrl_c_owner
moment, go, sys.argv = sys.argv[1], Path(sys.argv[2]), ["train.py", *sys.argv[3:]]

def hold(where):  # until the owner holds the signal sent (the final save on disk), or the test says go on
    print(f"holding: {where}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 600
    while not go.exists() and time.monotonic() < deadline and ctrl_c_owner().held is None:
        time.sleep(0.05)

finish_writes, finish_run = records.Records.finish_writes, epochs.finish_run

def held_writes(self, *args):
    finish_writes(self, *args)
    if moment == "final save on disk":  # the ranks' watchdogs still wait for each other here
        hold(moment)

def held_run(*args, **kwargs):
    if moment == "before done":
        hold(moment)
    finish_run(*args, **kwargs)
    if moment == "after done":
        hold(moment)

records.Records.finish_writes, epochs.finish_run = held_writes, held_run
runpy.run_path("train.py", run_name="__main__")
if moment == "exit handlers":  # registered last, run first: the other exit handlers and the owner's come after it
    atexit.register(hold, moment)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "sig, moment",
    [
        (signal.SIGTERM, "final save on disk"),
        (signal.SIGTERM, "after done"),
        (signal.SIGINT, "after done"),
        (signal.SIGINT, "exit handlers"),
        (signal.SIGUSR1, "before done"),  # the requeue signal (--requeue-signal USR1)
    ],
)
def test_a_signal_once_training_finished_exits_0_naming_the_checkpoints_on_disk(tmp_path, sig, moment):
    data, go = tiny_data_yaml(tmp_path), tmp_path / "go"
    sent: list[float] = []

    def on_line(line: str, proc: subprocess.Popen) -> None:
        if line.strip() == f"holding: {moment}" and not sent:
            os.killpg(proc.pid, sig)  # as a terminal or a scheduler sends it: the loader's workers get it too
            sent.append(time.monotonic())
            threading.Timer(60, go.touch).start()  # not acted on within a minute: the run goes on, and the test fails

    args = train_args(data, tmp_path / "runs", "--epochs", "1", "--requeue-signal", "USR1")[1:]
    command = [sys.executable, "-c", HELD, moment, str(go), *args]
    result = run_watching(command, train_env(), 280, on_line)
    output = describe([result])
    assert sent and result.returncode == 0, output
    assert time.monotonic() - sent[0] < 60, output  # at once: the hold it cut short was 600 s
    weights = tmp_path / "runs" / "run" / "weights"
    last, best = weights / "last.pt", weights / "best.pt"
    name = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else signal.Signals(sig).name
    assert result.stderr.strip().splitlines()[-1] == (
        f"train.py: {name} after training finished: exited at once, with 0 (the run is finished); on disk: {last} "
        f"(the end of epoch 1) and {best} (the end of epoch 1)"
    ), output
    done = "1 epoch done; results in " in result.stderr
    assert done == (moment in ("after done", "exit handlers")), output  # cut short before the line, or after it
    assert "Traceback" not in result.stderr and "received" not in result.stderr, output
    for path in (last, best):  # whole: the window opened with them on disk
        assert load_checkpoint(path)["model"], path
