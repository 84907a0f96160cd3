"""SLURM for real: the examples/slurm recipes on a two-node cluster on this host, on the CPU.

``tests/slurm_cluster.py`` starts munged, slurmctld and two slurmds (one CPU each) as root; the
recipes are submitted with ``sbatch`` as a user would, with CPU options on the command line and
a tiny synthetic data set, and SLURM itself signals, requeues and restarts them. Where no cluster
can be started (no slurm-wlm, not root) those tests skip and say why, or fail where ``$REQUIRE_SLURM``
is set, as ``.ci/run`` sets it.

What a real cluster cannot be made to do here is tested with a stand-in ``scontrol`` that records
its arguments and the environment srun would set: a failing or missing ``scontrol``, a requeue onto
other nodes (this host is every node), torchrun inside a requeued job.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from ddp_utils.distributed import dist_info, launch_key
from ddp_utils.run import PreemptionHandler, TrainState, load_checkpoint
from ddp_utils.run.signals import requeue_job, requeue_signal

from .multiproc import REPO_ROOT, free_port, launcher_env
from .slurm_cluster import SlurmCluster, SlurmUnavailable, skip_or_fail, start_cluster
from .test_train import results, tiny_data_yaml, train_args

JOB_ID = "4242"


def stand_in_scontrol(directory: Path, log: Path, exit_code: int = 0) -> Path:
    """A ``scontrol`` that appends its arguments to ``log`` and exits with ``exit_code``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexit {exit_code}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def srun_env(task: int, ntasks: int, port: int, bin_dir: Path) -> dict[str, str]:
    """What srun sets for one task of a one-node job (the variables dist_info reads), CPU only."""
    env = launcher_env()
    env.update(
        SLURM_JOB_ID=JOB_ID,
        SLURM_PROCID=str(task),
        SLURM_LOCALID=str(task),
        SLURM_NODEID="0",
        SLURM_NTASKS=str(ntasks),
        SLURM_NNODES="1",
        SLURM_NTASKS_PER_NODE=str(ntasks),
        SLURM_TASKS_PER_NODE=str(ntasks),
        SLURM_NODELIST="localhost",
        SLURM_JOB_NODELIST="localhost",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
    )
    return env


@pytest.mark.timeout(60)
def test_a_failing_or_missing_scontrol_is_one_line_not_a_crash(tmp_path, caplog):
    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log, exit_code=1)
    env = srun_env(0, 2, free_port(), tmp_path / "bin")
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert requeue_job(environ=env) is False
    assert caplog.messages == [f"could not requeue SLURM job {JOB_ID}: scontrol exited 1"]
    assert log.read_text().split() == ["requeue", JOB_ID]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert requeue_job(environ=env | {"PATH": str(tmp_path / "empty")}) is False
    assert len(caplog.messages) == 1 and "no scontrol on PATH" in caplog.messages[0]


@pytest.mark.timeout(60)
def test_only_rank_0_requeues(tmp_path):
    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log)
    assert requeue_job(environ=srun_env(1, 2, free_port(), tmp_path / "bin")) is False and not log.exists()
    assert requeue_job(environ=srun_env(0, 2, free_port(), tmp_path / "bin")) is True
    assert log.read_text().split() == ["requeue", JOB_ID]


def test_the_launch_key_survives_a_requeue_onto_other_nodes():
    first = srun_env(1, 2, 29500, Path("/nonexistent")) | {"SLURM_NODELIST": "gpu[01-02]"}
    requeued = first | {"SLURM_NODELIST": "gpu[07-08]", "SLURM_RESTART_COUNT": "1", "MASTER_PORT": "29611"}
    requeued.pop("MASTER_ADDR")
    assert launch_key(environ=first) == launch_key(environ=requeued) == f"slurm/{JOB_ID}"
    assert dist_info(requeued).restart_count == 1 and dist_info(first).restart_count == 0
    assert launch_key(environ=first | {"SLURM_JOB_ID": "4243"}) != launch_key(environ=first)


def test_torchrun_inside_a_requeued_slurm_job_counts_the_requeue_and_keeps_its_key():
    def worker(agent_dir: str, restart: str | None) -> dict[str, str]:
        env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
               "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": JOB_ID,
               "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_ERROR_FILE": f"{agent_dir}/attempt_0/1/error.json",
               "SLURM_JOB_ID": JOB_ID, "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}  # fmt: skip
        return env | ({"SLURM_RESTART_COUNT": restart} if restart else {})

    first, requeued = worker("/tmp/torchelastic_a1", None), worker("/tmp/torchelastic_b2", "1")
    assert dist_info(first).restart_count == 0 and dist_info(requeued).restart_count == 1
    assert dist_info(requeued).source == "torchrun" and dist_info(requeued).rank == 1
    assert launch_key(environ=first) == launch_key(environ=requeued) == f"slurm/{JOB_ID}/torchrun/{JOB_ID}"


@pytest.mark.parametrize(
    ("name", "env", "expected"),
    [
        (None, {"SLURM_JOB_ID": "7"}, signal.SIGUSR1),
        (None, {}, None),
        (None, {"SLURM_JOB_ID": "7", "DDP_UTILS_REQUEUE_SIGNAL": "usr2"}, signal.SIGUSR2),
        ("SIGUSR2", {}, signal.SIGUSR2),
        (str(int(signal.SIGUSR1)), {}, signal.SIGUSR1),
        ("none", {"SLURM_JOB_ID": "7"}, None),
    ],
)
def test_requeue_signal_from_the_option_the_environment_or_slurm(name, env, expected):
    assert requeue_signal(name, environ=env) == expected


def test_a_requeue_signal_that_is_no_signal_names_the_value():
    with pytest.raises(ValueError, match="--requeue-signal='USR9' is no signal"):
        requeue_signal("USR9", environ={})
    with pytest.raises(ValueError, match="DDP_UTILS_REQUEUE_SIGNAL='x'"):
        requeue_signal(environ={"DDP_UTILS_REQUEUE_SIGNAL": "x"})


@pytest.mark.timeout(30)
def test_a_requeue_signal_delivered_twice_stops_once_and_never_kills():
    # SLURM signals torchrun's workers directly and torchrun passes the same signal on
    with PreemptionHandler(requeue_signals=(signal.SIGUSR1,)) as handler:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # Python runs the handler between bytecodes of the main thread
        assert handler.requested() and handler.requeue and handler.requeue_anywhere()
        assert handler.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # restored


@pytest.mark.timeout(30)
def test_the_same_sigterm_from_slurm_and_from_torchrun_counts_once_and_a_later_one_stops_at_once():
    # scancel signals every process of the step; torchrun passes its own SIGTERM on to the workers
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with PreemptionHandler(repeat_window=0.5) as handler:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # Python runs the handler between bytecodes of the main thread
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert handler.received == signal.SIGTERM and calls == []  # one request, still running
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)  # past the window: someone means it
            time.sleep(0.05)
            assert calls == [signal.SIGTERM]  # the previous behaviour is back
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.timeout(30)
def test_sigterm_alone_asks_for_no_requeue():
    with PreemptionHandler(requeue_signals=(signal.SIGUSR1,)) as handler:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert handler.requested() and not handler.requeue


# ---- a real cluster: munged, slurmctld and two slurmds on this host (tests/slurm_cluster.py) ----

RECIPES = REPO_ROOT / "examples" / "slurm"
# the recipes ask for 2 nodes x 8 GPUs; on the CPU the command line wins over their #SBATCH lines
CPU_OPTIONS = ("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--gpus-per-node=0")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


@pytest.fixture(scope="module")
def cluster():
    try:
        cluster = start_cluster(nodes=2, timeout=90)
    except SlurmUnavailable as exc:
        skip_or_fail(exc)
    yield cluster
    cluster.stop()


def submit(cluster: SlurmCluster, recipe: str, tmp_path: Path, *train_options: str, **env: str) -> str:
    """``sbatch examples/slurm/<recipe> --device cpu --data tiny.yaml ...`` from the checkout, as a user types it.

    ``python`` and ``torchrun`` on the job's PATH are this interpreter's; the checkout is on its PYTHONPATH.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # scripts, not symlinks: a symlink to a virtual environment's python, found elsewhere, is not in the venv
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "torchrun").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    for script in ("python", "torchrun"):
        (bin_dir / script).chmod(0o755)
    job_env = launcher_env(env)
    job_env["PATH"] = os.pathsep.join([str(bin_dir), job_env.get("PATH", "")])
    options = (*CPU_OPTIONS, f"--output={tmp_path}/job.out")
    train_options = tuple(train_args(tiny_data_yaml(tmp_path), tmp_path / "runs", *train_options)[1:])
    return cluster.sbatch(RECIPES / recipe, *train_options, options=options, env=job_env, cwd=REPO_ROOT)


def job_output(tmp_path: Path) -> str:
    path = tmp_path / "job.out"
    return path.read_text(errors="replace") if path.exists() else "(no job output yet)"


def wait_for_epochs(cluster: SlurmCluster, job_id: str, tmp_path: Path, epochs: int, timeout: float) -> None:
    """Poll until results.csv has ``epochs`` rows and last.pt holds the last of them.

    Fails with the job's output if the job ends first or the time is up.
    """
    run_dir, deadline, seen = tmp_path / "runs" / "run", time.monotonic() + timeout, None
    last = run_dir / "weights" / "last.pt"
    while True:
        # the epoch's row comes first, then its checkpoint; read last.pt again only when it is new
        rows = len(results(run_dir)) if (run_dir / "results.csv").exists() else 0
        if rows >= epochs and last.exists() and file_id(last) != seen:
            seen = file_id(last)
            if load_checkpoint(last)["epoch"] >= epochs - 1:
                return
        state = cluster.job(job_id).get("JobState")
        if state in ENDED or time.monotonic() > deadline:
            out = job_output(tmp_path)
            raise AssertionError(f"job {job_id} ({state}): {epochs} epochs not in {timeout:.0f} s\n{out}")
        time.sleep(0.5)


def requeued_or_ended(fields: dict[str, str]) -> bool:
    return fields.get("Restarts", "0") != "0" or fields.get("JobState") in ENDED


def file_id(path: Path) -> tuple[int, int]:
    """Checkpoints are written to a temporary file and renamed: a new save is a new inode."""
    return path.stat().st_ino, path.stat().st_mtime_ns


def wait_for_line(cluster: SlurmCluster, job_id: str, tmp_path: Path, pattern: str, timeout: float) -> re.Match:
    """Poll the job's output until a line matches ``pattern``; fail with the output if the job ends first."""
    deadline = time.monotonic() + timeout
    while True:
        match = re.search(pattern, job_output(tmp_path), re.MULTILINE)
        if match:
            return match
        state = cluster.job(job_id).get("JobState")
        if state in ENDED or time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} ({state}): no {pattern!r} in {timeout:.0f} s\n{job_output(tmp_path)}")
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_train_sbatch_usr1_mid_epoch_requeues_and_the_restart_continues_from_that_batch(cluster, tmp_path):
    run_dir = tmp_path / "runs" / "run"
    last = run_dir / "weights" / "last.pt"
    progress = {"DDP_UTILS_PROGRESS": "plain", "DDP_UTILS_PROGRESS_SECONDS": "0"}  # a line per batch, in job.out
    # 8 steps of 2 x 2 images of 256 px per epoch: a few seconds, so the signal lands in the middle of one
    job = submit(cluster, "train.sbatch", tmp_path, "--epochs", "3", "--batch-size", "4", "--imgsz", "256", **progress)
    wait_for_line(cluster, job, tmp_path, r"^2/3 .* [1-9]/8 \d+%", 200)  # epoch 2 has begun
    cluster.command("scancel", "--signal=USR1", job)  # what --signal=USR1@90 sends near the time limit
    requeued = cluster.wait_job(job, requeued_or_ended, 90, "requeued")
    assert requeued["Restarts"] == "1", f"{requeued}\n{job_output(tmp_path)}"
    stopped = wait_for_line(cluster, job, tmp_path, r"stopped at (epoch 2, batch \d/8): saved", 10).group(1)
    assert TrainState.from_checkpoint(load_checkpoint(last)).where() == stopped, job_output(tmp_path)
    assert len(results(run_dir)) == 1, job_output(tmp_path)

    done = cluster.wait_job(job, lambda f: f.get("JobState") in ENDED, 200, "finished after its restart")
    out = job_output(tmp_path)
    assert (done["JobState"], done["ExitCode"], done["Restarts"]) == ("COMPLETED", "0:0", "1"), f"{done}\n{out}"
    assert f"job {job}, restart 0" in out and f"job {job}, restart 1" in out, out  # the recipe ran twice
    assert f"requeued SLURM job {job}" in out and "Traceback" not in out, out
    assert f"resuming {run_dir} at {stopped}" in out, out  # its own run, found by the job id, at that batch
    assert [int(r["epoch"]) for r in results(run_dir)] == [0, 1, 2]  # every epoch once, as uninterrupted
    assert load_checkpoint(last)["epoch"] == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_train_torchrun_sbatch_requeues_on_usr1_and_saves_when_scancel_preempts_the_restart(cluster, tmp_path):
    run_dir = tmp_path / "runs" / "run"
    last = run_dir / "weights" / "last.pt"
    progress = {"DDP_UTILS_PROGRESS": "plain", "DDP_UTILS_PROGRESS_SECONDS": "0"}
    slower = ("--batch-size", "4", "--imgsz", "256")  # 8 steps of a few tenths of a second per epoch
    # 6 epochs, so that the second stop (sent once epoch 2 is done) lands before the run's end, however loaded the host
    job = submit(cluster, "train_torchrun.sbatch", tmp_path, "--epochs", "6", *slower, PROCS_PER_NODE="1", **progress)
    wait_for_line(cluster, job, tmp_path, r"^2/6 .* [1-9]/8 \d+%", 200)  # epoch 2 has begun
    # SIGUSR1 reaches torchrun and its workers: torchrun must pass it on, not die of it
    cluster.command("scancel", "--signal=USR1", job)
    requeued = cluster.wait_job(job, requeued_or_ended, 90, "requeued")
    assert requeued["Restarts"] == "1", f"{requeued}\n{job_output(tmp_path)}"
    stopped = wait_for_line(cluster, job, tmp_path, r"stopped at (epoch 2, batch \d/8): saved", 10).group(1)
    assert TrainState.from_checkpoint(load_checkpoint(last)).where() == stopped, job_output(tmp_path)

    wait_for_epochs(cluster, job, tmp_path, 2, 200)  # the restart resumed at that batch and finished epoch 2
    assert f"resuming {run_dir} at {stopped}" in job_output(tmp_path), job_output(tmp_path)
    saved = file_id(last)
    cluster.command("scancel", job)  # a preemption: SIGTERM to every process of the job, SIGKILL 30 s later
    ended = cluster.wait_job(job, lambda f: f.get("JobState") in ENDED, 90, "cancelled")
    cluster.wait_idle(60)  # every process of the job is gone
    out = job_output(tmp_path)
    assert ended["JobState"] == "CANCELLED", f"{ended}\n{out}"
    second = re.search(r"stopped at (epoch [3-6](, batch \d/8)?): saved", out)
    assert second, out
    assert "[rank0]:" not in out and "[rank1]:" not in out, out  # no worker traceback
    state = TrainState.from_checkpoint(load_checkpoint(last))
    assert file_id(last) != saved and state.where() == second.group(1), out
    assert [int(r["epoch"]) for r in results(run_dir)] == list(range(state.epoch)), out  # each finished epoch once
