"""Ctrl-C owned by the process to its end (ddp_utils/run/interrupt.py): the first press goes to the run, a second
(or one while no run listens) stops the process at once in one line with exit code 130, in a real process that
real SIGINTs reach; once the run finished (the exit window), every stop signal exits at once with 0. Each signal is
sent once the process said it took the one before: nothing depends on timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ddp_utils.run import PreemptionHandler
from ddp_utils.run.interrupt import CtrlC

from ..multiproc import REPO_ROOT, launcher_env

OWNER = """
import atexit, os, signal, sys, time
from ddp_utils.run.interrupt import own_ctrl_c
def say(line):
    print(line, file=sys.stderr, flush=True)
"""


class Script:
    """A Python process running ``body``; its stderr lines are read as they come."""

    def __init__(self, body: str) -> None:
        code = OWNER + textwrap.dedent(body)
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=launcher_env(),
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        self.lines: list[str] = []
        self.seen = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            with self.seen:
                self.lines.append(line.rstrip("\n"))
                self.seen.notify_all()

    def wait_for(self, line: str, timeout: float = 120) -> None:
        with self.seen:
            assert self.seen.wait_for(lambda: line in self.lines, timeout), (line, self.lines)

    def press(self, pid: int | None = None) -> float:
        """Ctrl-C, as a terminal sends it: SIGINT to the whole process group."""
        os.killpg(self.proc.pid, signal.SIGINT) if pid is None else os.kill(pid, signal.SIGINT)
        return time.monotonic()

    def end(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            time.sleep(0.1)  # the last lines


def test_a_run_listens_to_the_owner_only_while_it_runs(monkeypatch):
    # the run's PreemptionHandler takes the first press from the owner; once the run ended, a press stops at once
    owner, stops = CtrlC("prog"), []  # not installed: presses made by hand, this process keeps Python's Ctrl-C
    monkeypatch.setattr("ddp_utils.run.signals.ctrl_c_owner", lambda: owner)
    monkeypatch.setattr(owner, "stop_at_once", lambda: stops.append(owner.presses))
    before = signal.getsignal(signal.SIGINT)
    with PreemptionHandler(signals=(signal.SIGTERM, signal.SIGINT)) as preempt:
        assert signal.getsignal(signal.SIGINT) is before  # the owner's (here Python's), untouched
        assert signal.getsignal(signal.SIGTERM) == preempt._handle
        owner._press()
        assert preempt.received == signal.SIGINT and stops == []  # heard: finish the step, save, stop
    assert owner._listener is None  # it stopped listening with the run
    second = CtrlC("prog")
    monkeypatch.setattr("ddp_utils.run.signals.ctrl_c_owner", lambda: second)
    monkeypatch.setattr(second, "stop_at_once", lambda: stops.append(second.presses))
    with PreemptionHandler(signals=(signal.SIGINT,)):
        pass
    second._press()  # the first press, after the run: nothing listens, it stops at once
    owner._press()  # the second press
    assert stops == [1, 2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_first_press_goes_to_the_run_and_the_second_stops_at_once_saying_what_the_writes_left():
    script = Script("""
        owner = own_ctrl_c("prog")
        owner.listen(lambda: say("heard"))
        owner.describe_writes(lambda: "the save of last.pt being written is not finished")
        say("ready")
        read_end, _ = os.pipe()
        os.read(read_end, 1)  # the main thread blocked in a C call, for good
    """)
    script.wait_for("ready")
    script.press()
    script.wait_for("heard")
    pressed = script.press()
    assert script.end() == 130, script.lines
    assert time.monotonic() - pressed < 30, "not at once"
    assert script.lines == [
        "ready",
        "heard",
        "prog: interrupted by Ctrl-C (pressed again: stopped at once); the save of last.pt being written is not "
        "finished",
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_press_during_the_exit_handlers_stops_at_once_and_one_after_the_last_changes_nothing():
    # the last seconds of a stopped run: its exit handlers (workers joined, trackers closed) run before the owner's
    script = Script("""
        atexit.register(lambda: (say("the interpreter's last moments"), time.sleep(3)))  # runs after the owner's
        owner = own_ctrl_c("prog")
        owner.describe_writes(lambda: "the last.pt on disk is from epoch 1, batch 3/8")
        atexit.register(lambda: (say("exit handler"), time.sleep(60)))  # runs before the owner's
    """)
    script.wait_for("exit handler")
    script.press()
    assert script.end() == 130, script.lines
    assert script.lines == [
        "exit handler",
        "prog: interrupted by Ctrl-C (stopped at once); the last.pt on disk is from epoch 1, batch 3/8",
    ]
    script = Script("""
        atexit.register(lambda: (say("the interpreter's last moments"), time.sleep(3)))
        own_ctrl_c("prog")
    """)
    script.wait_for("the interpreter's last moments")
    script.press()  # everything is written: the process ends as it would have, no traceback, no death by SIGINT
    assert script.end() == 0, script.lines
    assert script.lines == ["the interpreter's last moments"]


def test_a_finished_runs_stop_signals_are_the_owners_held_until_the_window_opens(monkeypatch):
    # the run's handler leaves them to the owner when it ends (it put SIG_DFL back: SIGTERM at "done" killed the
    # process); what comes while the ranks still wait for each other is held, then ends the process with 0
    owner, left = CtrlC("prog"), []  # not installed: deliveries made by hand
    monkeypatch.setattr("ddp_utils.run.signals.ctrl_c_owner", lambda: owner)
    monkeypatch.setattr(owner, "_leave", lambda line, code: left.append((line, code)))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with PreemptionHandler(signals=(signal.SIGTERM, signal.SIGINT), requeue_signals=(signal.SIGUSR1,)) as run:
            owner.finishing("last.pt (the end of epoch 3)", run.signals)
        assert all(signal.getsignal(sig) == owner._handle for sig in before), "the run put its handlers back"
        owner._delivered(signal.SIGUSR1)
        owner._delivered(signal.SIGTERM)
        assert owner.held == signal.SIGUSR1 and left == []  # held: the first that came
        owner.finished()
        line = "prog: SIGUSR1 after training finished: exited at once, with 0 (the run is finished); on disk: last.pt"
        assert left == [(f"{line} (the end of epoch 3)", 0)]
        owner._press()  # in the window, a press is no second press: it ends the process with 0 as well
        assert left[1] == (left[0][0].replace("SIGUSR1", "Ctrl-C (SIGINT)"), 0)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_second_press_while_finishing_acts_at_once_and_a_run_not_finished_keeps_130(monkeypatch):
    owner, left = CtrlC("prog"), []
    monkeypatch.setattr(owner, "_leave", lambda line, code: left.append(code))
    owner.finishing("", ())
    owner._press()
    assert left == [] and owner.held == signal.SIGINT
    owner._press()
    assert left == [0]
    stopped = CtrlC("prog")  # no window: a press with no run listening stops at once, 130
    monkeypatch.setattr(stopped, "_leave", lambda line, code: left.append(code))
    stopped._press()
    assert left == [0, 130]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_signal_held_while_finishing_ends_the_process_with_0_once_the_window_opens():
    script = Script("""
        owner = own_ctrl_c("prog")
        owner.finishing("last.pt (the end of epoch 3)", [signal.SIGTERM, signal.SIGINT])
        say("finishing")
        while owner.held is None:
            time.sleep(0.01)
        say(f"held {signal.Signals(owner.held).name}")
        owner.finished()
        say("not reached")
    """)
    script.wait_for("finishing")
    os.killpg(script.proc.pid, signal.SIGTERM)
    assert script.end() == 0, script.lines
    assert script.lines == [
        "finishing",
        "held SIGTERM",
        "prog: SIGTERM after training finished: exited at once, with 0 (the run is finished); on disk: last.pt (the "
        "end of epoch 3)",
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_signal_in_a_finished_runs_exit_handlers_exits_0_and_one_after_the_last_changes_nothing():
    script = Script("""
        owner = own_ctrl_c("prog")
        owner.finishing("last.pt (the end of epoch 3)", [signal.SIGTERM])
        owner.finished()
        atexit.register(lambda: (say("exit handler"), time.sleep(60)))  # runs before the owner's
    """)
    script.wait_for("exit handler")
    os.killpg(script.proc.pid, signal.SIGTERM)
    assert script.end() == 0, script.lines
    assert script.lines[-1].startswith("prog: SIGTERM after training finished: exited at once, with 0"), script.lines
    script = Script("""
        atexit.register(lambda: (say("the interpreter's last moments"), time.sleep(3)))  # runs after the owner's
        owner = own_ctrl_c("prog")
        owner.finishing("last.pt (the end of epoch 3)", [signal.SIGTERM])
        owner.finished()
    """)
    script.wait_for("the interpreter's last moments")
    os.killpg(script.proc.pid, signal.SIGTERM)  # everything is written: it ends as it would have, 0, no death by it
    assert script.end() == 0, script.lines
    assert script.lines == ["the interpreter's last moments"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_forked_childs_presses_are_not_the_parents():
    # a data-loader worker is a forked child: a terminal's Ctrl-C reaches it too, and it must not count twice
    script = Script("""
        owner = own_ctrl_c("prog")
        owner.listen(lambda: say("heard"))
        child = os.fork()
        if child == 0:
            say(f"child {os.getpid()}")
            time.sleep(60)
            os._exit(7)
        read_end, _ = os.pipe()
        os.read(read_end, 1)
    """)
    with script.seen:
        assert script.seen.wait_for(lambda: any(line.startswith("child ") for line in script.lines), 120)
    child = int(next(line for line in script.lines if line.startswith("child ")).split()[1])
    for _ in range(3):
        script.press(child)
    time.sleep(1)  # nothing to wait for: nothing is to happen
    assert alive(child) and script.proc.poll() is None and "heard" not in script.lines, script.lines
    script.press(script.proc.pid)  # the parent's first press: heard, not a second one
    script.wait_for("heard")
    script.press(script.proc.pid)
    assert script.end() == 130, script.lines
    os.kill(child, signal.SIGKILL)
    assert script.lines[-1] == "prog: interrupted by Ctrl-C (pressed again: stopped at once)", script.lines


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
