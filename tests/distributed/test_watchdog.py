"""The stall watchdog: its verdict rules in-process (fast), then real gloo groups on the CPU whose ranks
stall on purpose (slow: each starts 2-3 processes and waits out a bound by design).

The workers (tests/workers/watchdog_scenarios.py) report every 0.25 s and take their bound from
DDP_UTILS_STALL_TIMEOUT, 3 or 4 s here (120 by default; 4 s where a false alarm is what is tested, a
margin for a loaded host); the group's own timeout is 5 minutes, so only the watchdog can end a stall
within these tests' deadlines.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from ddp_utils.distributed import STALL_EXIT_CODE, DistEnvError, StallWatchdog, stall_timeout_from_env
from ddp_utils.distributed.parting import part_in_order
from ddp_utils.distributed.stall import Observer, RankView, blame_lines, find_stalled
from ddp_utils.distributed.store import BoundedStore, private_connection

from ..multiproc import REPO_ROOT, collect, describe, free_port, launch, launcher_env

SCENARIOS = "tests.workers.watchdog_scenarios"
BLAME = re.compile(
    r"^rank (\d+) stalled: no progress for (\d+) s in phase '(\w+)' \(step (\d+)\)"
    r" on host (\S+) \(local rank (\d+), pid (\d+)\); (.*)$",
    re.M,
)
RULES = dict(tie=1.0, dead_after=120.0, stale=10.0)


def stall_env(seconds: float) -> dict[str, str]:
    return {"DDP_UTILS_STALL_TIMEOUT": str(seconds)}


def blames(workers) -> list[tuple[int, int, str, int, str]]:
    """Every blame line any rank printed: (rank, seconds, phase, step, what its heartbeat says)."""
    found = []
    for w in workers:
        for m in BLAME.finditer(w.stderr):
            found.append((int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4)), m.group(8)))
    return found


def printed_stack(worker) -> str:
    """The stack the watchdog printed for this worker's main thread (its lines, prefixed by its rank)."""
    prefix = f"[rank {worker.rank}] "
    return "\n".join(line[len(prefix) :] for line in worker.stderr.splitlines() if line.startswith(prefix))


def no_stack(worker) -> bool:
    """Whether this worker printed no stack: a rank that only waited for the stalled one has nothing to add."""
    return "main thread is at" not in worker.stderr and '  File "' not in worker.stderr


def where_blamed(workers) -> list[tuple[str, int, int]]:
    """The (host, local rank, pid) of every blame line any rank printed."""
    return [(m.group(5), int(m.group(6)), int(m.group(7))) for w in workers for m in BLAME.finditer(w.stderr)]


def finished(workers) -> list[int]:
    return sorted(json.loads(line)["rank"] for w in workers for line in w.stdout.splitlines() if '"finished"' in line)


# --- the verdict rules, in-process ------------------------------------------------------------------


def test_the_rank_behind_is_blamed_not_the_one_waiting_for_it():
    stuck = RankView(1, "train", step=36, idle=130.0, bound=120.0, heartbeat_age=0.5)
    waiting = RankView(0, "train", step=37, idle=129.7, bound=120.0, heartbeat_age=0.5, waiting=True)
    assert find_stalled([waiting, stuck], **RULES) == [stuck]


def test_a_waiting_rank_whose_bound_runs_out_first_is_not_blamed_while_the_laggard_is_within_its_own():
    laggard = RankView(1, "train", step=36, idle=200.0, bound=300.0, heartbeat_age=0.5)  # slow steps seen before
    waiting = RankView(0, "train", step=37, idle=199.0, bound=120.0, heartbeat_age=0.5)
    assert find_stalled([waiting, laggard], **RULES) == []


def test_a_stopped_heartbeat_is_blamed_even_in_a_long_bound_and_the_waiting_are_not():
    frozen = RankView(1, "train", step=1, idle=125.0, bound=900.0, heartbeat_age=124.0)  # frozen in its first step
    waiting = RankView(0, "train", step=1, idle=125.0, bound=900.0, heartbeat_age=0.3)
    assert find_stalled([waiting, frozen], **RULES) == [frozen]
    assert "its heartbeat stopped 124 s ago: stopped (SIGSTOP) or hung in the kernel?" in blame_lines([frozen], 10.0)[0]


def test_an_unbounded_phase_holds_off_every_verdict_and_a_bounded_one_within_its_bound_too():
    waiting = RankView(1, "train", step=10, idle=500.0, quiet=500.0, bound=120.0, heartbeat_age=0.3)
    for bound in (None, 1800.0):
        mapping = RankView(0, "metrics", idle=499.0, quiet=500.0, bound=bound, block=True, heartbeat_age=0.3)
        assert find_stalled([mapping, waiting], **RULES) == []
    overrun = RankView(0, "metrics", idle=499.0, quiet=500.0, bound=300.0, block=True, heartbeat_age=0.3)
    waiting_in_broadcast = RankView(1, "train", step=10, idle=500.0, bound=120.0, heartbeat_age=0.3, waiting=True)
    assert find_stalled([overrun, waiting_in_broadcast], **RULES) == [overrun]


def test_a_rank_that_left_is_never_blamed_and_equal_ranks_are_told_apart_by_their_stacks():
    left = RankView(2, "train", step=3, idle=900.0, bound=120.0, heartbeat_age=900.0, done=True)
    computing = RankView(1, "train", step=37, idle=130.0, bound=120.0, heartbeat_age=0.2, where="model.py:9 in f")
    waiting = RankView(0, "train", step=37, idle=130.2, bound=120.0, heartbeat_age=0.2, waiting=True)
    assert find_stalled([waiting, computing, left], **RULES) == [computing]
    assert blame_lines([computing], 10.0, left=[2])[-1].startswith("rank 2 left the stall watchdog before")
    both = [waiting, RankView(1, "train", step=37, idle=130.0, bound=120.0, heartbeat_age=0.2, waiting=True)]
    assert [v.rank for v in find_stalled(both, **RULES)] == [0, 1]
    assert "ranks 0, 1 stopped at the same point" in blame_lines(find_stalled(both, **RULES), 10.0)[-1]


def report(beat: int, idle: float, bound: float | None = 3.0, block: bool = False, phase: str = "train") -> str:
    fields = dict(beat=beat, phase=phase, step=7, idle=idle, quiet=idle, bound=bound, block=block, done=False)
    return json.dumps({**fields, "waiting": False, "where": ""})


def test_a_verdict_stands_only_when_the_next_judgement_on_a_newer_report_agrees():
    observer = Observer(startup_bound=900.0, stale=10.0, now=0.0)
    stuck = observer.see([report(1, 5.0)], now=1.0, resumed=0.0)
    assert not observer.confirmed(find_stalled(stuck, **RULES | {"dead_after": 3.0}))  # first sight
    same_report = observer.see([report(1, 5.0)], now=1.5, resumed=0.0)
    assert not observer.confirmed(find_stalled(same_report, **RULES | {"dead_after": 3.0}))  # no newer report
    newer = observer.see([report(2, 6.0)], now=2.0, resumed=0.0)
    assert observer.confirmed(find_stalled(newer, **RULES | {"dead_after": 3.0}))


def test_waiting_while_a_rank_held_the_group_does_not_count_against_the_others():
    observer = Observer(startup_bound=900.0, stale=10.0, now=0.0)
    holding_views = observer.see([report(1, 8.0, bound=16.0, block=True), report(1, 8.0)], now=8.0, resumed=0.0)
    assert holding_views[1].idle == 0.0 and find_stalled(holding_views, **RULES) == []
    released = observer.see([report(2, 0.1), report(2, 10.0)], now=10.0, resumed=0.0)  # the block ended at 8 s
    assert released[1].idle == 2.0 and find_stalled(released, **RULES) == []
    later = observer.see([report(3, 0.1), report(3, 12.0)], now=12.0, resumed=0.0)
    assert [v.rank for v in find_stalled(later, **RULES | {"dead_after": 120.0})] == [1]  # 4 s after the hold


# --- settings, and no group ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "-5", "inf"])
def test_a_bad_timeout_in_the_environment_is_one_clear_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("DDP_UTILS_STALL_TIMEOUT", value)
    with pytest.raises(DistEnvError) as info:
        StallWatchdog()
    assert str(info.value).startswith(f"DDP_UTILS_STALL_TIMEOUT={value!r} is not a number of seconds"), info.value
    assert "0/off" in str(info.value)


def test_timeout_settings(monkeypatch):
    assert stall_timeout_from_env({}) == 120.0 and stall_timeout_from_env({"DDP_UTILS_STALL_TIMEOUT": "0"}) is None
    assert StallWatchdog(timeout=0).timeout is None
    assert StallWatchdog(timeout=30, startup_timeout=10).startup_timeout == 30  # never below the steady bound
    with pytest.raises(ValueError, match="timeout=-1"):
        StallWatchdog(timeout=-1)
    monkeypatch.setenv("DDP_UTILS_STALL_STARTUP_TIMEOUT", "soon")
    with pytest.raises(DistEnvError, match="DDP_UTILS_STALL_STARTUP_TIMEOUT='soon' is not a number of seconds"):
        StallWatchdog(timeout=30)


def test_without_a_process_group_it_is_a_no_op():
    threads = threading.active_count()
    with StallWatchdog(timeout=0.2, interval=0.05) as watchdog:
        assert not watchdog.active and threading.active_count() == threads
        assert list(watchdog.track(iter("abc"), "val")) == ["a", "b", "c"]
        assert len(watchdog.track(range(5), "train")) == 5  # as train_one_epoch asks of its loader
        time.sleep(0.5)  # longer than the bound: nothing watches, nothing ends
        with watchdog.phase("metrics", None):
            watchdog.progress("train")
    with pytest.raises(ValueError, match="phase 'save': timeout=0"), watchdog.phase("save", 0):
        pass


# --- how ranks part after a verdict, in-process --------------------------------------------------


def test_no_rank_leaves_before_every_live_rank_has_acknowledged_the_verdict():
    # a rank that left closes the collective the others wait in: one that had not yet read the verdict
    # would end with that error (exit code 1) instead of the restart's (seen once in CI: rc [-6, 75, 1])
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    key, live, done, left_when_0_left = "verdict", [0, 1, 2], {}, []

    def part(rank: int) -> None:
        link = BoundedStore(lambda: private_connection(server), timeout=30.0)
        part_in_order(link, rank, key, deciding=rank == 0, live=live, grace=30.0)
        done[rank] = time.monotonic()
        if rank == 0:
            left_when_0_left.append(server.add(f"{key}/left", 0))
        link.close()

    parting = [threading.Thread(target=part, args=(rank,), daemon=True) for rank in (0, 1)]
    for thread in parting:
        thread.start()
    time.sleep(1.0)  # rank 2's watchdog has not read the verdict yet
    assert done == {} and server.add(f"{key}/left", 0) == 0  # rank 1 has not left; rank 0 waits
    late = time.monotonic()
    parting.append(threading.Thread(target=part, args=(2,), daemon=True))
    parting[-1].start()
    for thread in parting:
        thread.join(timeout=20.0)
    assert sorted(done) == [0, 1, 2] and server.add(f"{key}/left", 0) == 2
    assert max(done.values()) - late < 10.0  # they part as soon as the last one acknowledged, not at the grace's end
    # rank 0, the store's host under env://, leaves last: when it returns, the two others have left (their return
    # times, read after the fact, may come in either order on a loaded host)
    assert left_when_0_left == [2]


HOLD = """
import os, sys, threading, time
from ddp_utils.distributed.parting import hold_the_exit
ready = threading.Event()
def end_the_process():  # the watchdog's thread: holds the exit, parts from the others, exits for a restart
    hold_the_exit(75, float(sys.argv[2]))
    ready.set()
    time.sleep(float(sys.argv[1]))
    os._exit(75)
threading.Thread(target=end_the_process, daemon=True).start()
ready.wait()
raise RuntimeError("Connection closed by peer: a rank that left closed the collective")
"""


@pytest.mark.slow  # another Python (torch's import alone took 16-19 s on a loaded 2-core host: over the fast tier's 10)
@pytest.mark.timeout(90)
@pytest.mark.parametrize(("parting", "hold"), [(1.0, 30.0), (60.0, 1.0)])
def test_a_main_thread_that_fails_while_the_watchdog_ends_the_process_exits_with_the_restarts_code(parting, hold):
    # the main thread's error ends the interpreter in milliseconds; the watchdog's exit comes after its
    # parting (first case), or the hold runs out and the main thread exits with the restart's code itself
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", HOLD, str(parting), str(hold)], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert run.returncode == STALL_EXIT_CODE, run.stderr
    assert "RuntimeError: Connection closed by peer" in run.stderr  # the main thread's error is still shown
    assert time.monotonic() - started >= min(parting, hold)


# --- real groups ------------------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_rank_stuck_in_a_read_is_blamed_with_its_own_stack_and_every_rank_exits_for_a_restart():
    workers = launch(f"{SCENARIOS}:stuck_read", 3, timeout=75, args=(1, 5, 60), env=stall_env(3))
    output = describe(workers)
    assert [w.returncode for w in workers] == [STALL_EXIT_CODE] * 3, output
    (blame,) = blames(workers)
    rank, seconds, phase, step, heartbeat = blame
    assert (rank, phase, step) == (1, "train", 5), output  # the 5th item arrived; the 6th never did
    assert 3 <= seconds <= 8 and heartbeat.startswith("its heartbeat is alive: stuck in Python/IO"), output
    stuck = printed_stack(workers[1])
    assert "stall watchdog: this rank is the one stalled" in stuck, output
    assert "in read_from_a_hung_mount" in stuck and "time.sleep(seconds)" in stuck, output
    for w in (workers[0], workers[2]):  # waiting in the step's collective: no stack of theirs, one line
        assert no_stack(w), output
    assert sum("stall watchdog: ending every rank with exit code 75" in w.stderr for w in workers) == 1, output
    assert finished(workers) == [], output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_rank_waiting_in_step_controls_wait_is_classed_waiting_and_the_blame_names_host_local_rank_and_pid():
    # train.py's steps end in StepControl.after_step: its all-reduce is started in one step and waited on in the
    # next (StepControl._settle), not in a plain dist.all_reduce as the other scenarios wait
    workers = launch(f"{SCENARIOS}:stuck_after_control", 3, timeout=75, args=(1, 8, 60), env=stall_env(4))
    output = describe(workers)
    assert [w.returncode for w in workers] == [STALL_EXIT_CODE] * 3, output
    record = next(json.loads(line) for line in workers[1].stdout.splitlines() if '"reports"' in line)
    for rank in ("0", "2"):
        seen = record["reports"][rank]
        # StepControl._settle waits on the collective's handle: Pending.wait, in ddp_utils' collectives module
        assert seen["where"].startswith("collectives.py:") and seen["where"].endswith(" in wait"), (seen, output)
        assert seen["waiting"] is True, (seen, output)
    assert record["reports"]["1"]["waiting"] is False, output
    ((rank, _, phase, step, heartbeat),) = blames(workers)
    assert (rank, phase) == (1, "train") and heartbeat.startswith("its heartbeat is alive"), output
    assert where_blamed(workers) == [(socket.gethostname(), 1, record["pid"])], output
    assert no_stack(workers[0]) and no_stack(workers[2]), output  # waiting: their reports said where, enough


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sigstopped_rank_is_named_by_its_stopped_heartbeat_and_the_others_exit_within_the_bound():
    started = time.time()
    workers = launch(f"{SCENARIOS}:frozen_rank", 3, timeout=90, args=(1, 40), env=stall_env(4), stopped=(1,))
    output = describe(workers)
    assert workers[1].returncode == -9, output  # stopped until the test killed it
    assert [workers[0].returncode, workers[2].returncode] == [STALL_EXIT_CODE] * 2, output
    (blame,) = blames(workers)
    rank, seconds, phase, step, heartbeat = blame
    assert (rank, phase) == (1, "train") and step <= 41 and 4 <= seconds <= 9, output  # its last report's step
    assert re.match(r"its heartbeat stopped \d+ s ago: stopped \(SIGSTOP\) or hung in the kernel\?", heartbeat)
    for w in (workers[0], workers[2]):  # the stall in one clear message: no stack (it printed 30 lines, waiting)
        assert no_stack(w), output
    stopped_at = json.loads(workers[1].stdout.splitlines()[0])["stopped_at"]
    ended_at = started + workers[0].seconds
    print(f"SIGSTOP to exit: {ended_at - stopped_at:.1f} s with a bound of 4 s (blame line: {seconds} s)")
    assert ended_at - stopped_at < 4 + 8, output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_store_host_stopped_ends_every_other_rank_saying_the_store_is_lost():
    # rank 0 hosts the TCPStore under env://: the others' store calls get no answer
    workers = launch(f"{SCENARIOS}:frozen_rank", 3, timeout=90, args=(0, 40), env=stall_env(4), stopped=(0,))
    output = describe(workers)
    assert [w.returncode for w in workers[1:]] == [STALL_EXIT_CODE] * 2, output
    for w in workers[1:]:
        assert re.search(rf"\[rank {w.rank}\] stall watchdog: lost the rendezvous store at 127\.0\.0\.1:\d+", w.stderr)
        assert no_stack(w), output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_slow_first_step_inside_the_startup_bound_is_no_stall():
    # the first step takes 9 s, over twice the steady bound, while the others wait in its all-reduce
    workers = launch(f"{SCENARIOS}:slow_first_step", 2, timeout=75, args=(1, 9), env=stall_env(4))
    assert [w.returncode for w in workers] == [0, 0] and finished(workers) == [0, 1], describe(workers)
    assert "stalled" not in "".join(w.stderr for w in workers), describe(workers)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["unbounded", "bounded"])
def test_a_long_phase_on_rank_0_is_no_stall_for_it_nor_for_the_ranks_waiting_for_it(kind):
    workers = launch(f"{SCENARIOS}:long_phase", 3, timeout=90, args=(kind, 10), env=stall_env(4))
    assert [w.returncode for w in workers] == [0, 0, 0] and finished(workers) == [0, 1, 2], describe(workers)
    assert "stalled" not in "".join(w.stderr for w in workers), describe(workers)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_phase_that_overruns_its_own_bound_is_blamed():
    workers = launch(f"{SCENARIOS}:long_phase", 2, timeout=90, args=("overrun", 30), env=stall_env(3))
    output = describe(workers)
    assert [w.returncode for w in workers] == [STALL_EXIT_CODE] * 2, output
    ((rank, seconds, phase, step, heartbeat),) = blames(workers)
    assert (rank, phase, step) == (0, "metrics", 0) and 7 <= seconds <= 14, output  # its own bound: 7.5 s
    assert "time.sleep(float(seconds))" in printed_stack(workers[0]), output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("leaving_rank", [1, 0])  # rank 0 hosts the store: it stays up in the barrier
def test_a_rank_that_leaves_early_is_never_blamed(leaving_rank):
    workers = launch(f"{SCENARIOS}:leaves_early", 3, timeout=90, args=(leaving_rank, 10), env=stall_env(4))
    assert [w.returncode for w in workers] == [0, 0, 0] and finished(workers) == [0, 1, 2], describe(workers)
    assert "stalled" not in "".join(w.stderr for w in workers), describe(workers)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_off_when_ddp_utils_stall_timeout_is_0():
    # the same stuck read as above, 6 s: twice the bound that ends it when the watchdog is on
    workers = launch(f"{SCENARIOS}:stuck_read", 2, timeout=75, args=(1, 5, 6, 30), env=stall_env(0))
    assert [w.returncode for w in workers] == [0, 0] and finished(workers) == [0, 1], describe(workers)
    assert "stall watchdog" not in "".join(w.stderr for w in workers), describe(workers)


def torchrun_scenario(name: str) -> subprocess.Popen:
    """A scenario of tests/workers/watchdog_scenarios.py on 2 ranks under torchrun (one restart allowed), with
    a 4 s stall timeout; its own session, so a test can end the whole job."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        "-m", "tests.workers.watchdog_scenarios", name,
    ]  # fmt: skip
    env = launcher_env(stall_env(4))
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_restarts_a_job_the_watchdog_ended_and_the_second_attempt_finishes():
    # attempt 0: rank 1 SIGSTOPs itself; the watchdog ends rank 0 with 75; torchrun SIGTERMs rank 1, which
    # stays stopped until SIGKILL 30 s later; attempt 1 must not read attempt 0's verdict from the agent's store
    proc = torchrun_scenario("restart")
    started = time.time()
    (run,) = collect([proc], time.monotonic(), 200, "torchrun restart after a stall")
    output = describe([run])
    assert run.returncode == 0, output
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    stopped_at = next(r["stopped_at"] for r in records if "stopped_at" in r)
    done = sorted((r["rank"], r["attempt"], r["total"]) for r in records if r.get("finished"))
    assert done == [(0, 1, 2.0), (1, 1, 2.0)], output
    assert [b[0] for b in blames([run])] == [1] and f"exitcode: {STALL_EXIT_CODE}" in run.stderr, output
    print(f"SIGSTOP to the restarted job's end: {started + run.seconds - stopped_at:.1f} s (bound 4 s)")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_rank_frozen_after_the_others_finished_is_named_and_the_job_ends():
    # attempt 0: rank 1 SIGSTOPs itself after the last collective of the watched work: rank 0 has no collective
    # left to wait in, and without a wait at the end it would leave and hang in its next collective for ever
    proc = torchrun_scenario("frozen_after_the_end")
    started = time.time()
    (run,) = collect([proc], time.monotonic(), 150, "torchrun, a rank frozen after the others finished")
    output = describe([run])
    assert run.returncode == 0, output
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    frozen = next(r for r in records if "stopped_at" in r)
    assert not any(r["attempt"] == 0 and "left_watchdog_at" in r for r in records), output  # rank 0 waited for it
    done = sorted((r["rank"], r["attempt"], r["total"]) for r in records if r.get("finished"))
    assert done == [(0, 1, 2.0), (1, 1, 2.0)], output
    ((rank, _, phase, _, heartbeat),) = blames([run])
    assert (rank, phase) == (1, "train") and heartbeat.startswith("its heartbeat stopped"), output
    assert where_blamed([run]) == [(socket.gethostname(), 1, frozen["pid"])], output
    assert "rank 0 finished and waited for rank 1 to finish" in run.stderr, output
    assert f"exitcode: {STALL_EXIT_CODE}" in run.stderr, output
    print(f"SIGSTOP to the restarted job's end: {started + run.seconds - frozen['stopped_at']:.1f} s (bound 4 s)")
