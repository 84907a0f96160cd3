"""SLURM on one host, on the CPU: two ``python train.py`` tasks started as srun would, a requeue cycle.

srun starts one process per task with SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, ... set;
``#SBATCH --signal=USR1@90`` sends SIGUSR1 to every process of the job step near its time
limit. A stand-in ``scontrol`` on PATH records its arguments, so the requeue call is seen
without a cluster; the "requeued" job is the same environment with SLURM_RESTART_COUNT=1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_utils.distributed import dist_info, launch_key
from ddp_utils.engine import PreemptionHandler, load_checkpoint
from ddp_utils.engine.signals import requeue_signal

from .multiproc import REPO_ROOT, collect, descendants, describe, free_port, launcher_env
from .test_train import results, tiny_data_yaml, train_args, wait_for_file

JOB_ID = "4242"


def stand_in_scontrol(directory: Path, log: Path, exit_code: int = 0) -> Path:
    """A ``scontrol`` that appends its arguments to ``log`` and exits with ``exit_code``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexit {exit_code}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def srun_env(task: int, ntasks: int, port: int, bin_dir: Path, restart_count: int | None = None) -> dict[str, str]:
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
    if restart_count is not None:
        env["SLURM_RESTART_COUNT"] = str(restart_count)
    return env


def srun(args: list[str], ntasks: int, bin_dir: Path, restart_count: int | None = None) -> list[subprocess.Popen]:
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO_ROOT,
            env=srun_env(task, ntasks, port, bin_dir, restart_count),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for task in range(ntasks)
    ]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_usr1_saves_requeues_and_the_requeued_job_resumes_to_the_full_epoch_count(tmp_path):
    data = tiny_data_yaml(tmp_path)
    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log)
    args = train_args(data, tmp_path / "runs", "--epochs", "3")
    run_dir = tmp_path / "runs" / "run"
    last = run_dir / "weights" / "last.pt"

    tasks = srun(args, 2, tmp_path / "bin")
    wait_for_file(last, tasks[0], 300)
    # --signal=USR1@90 reaches every process of the step, data-loader workers included
    for pid in [p.pid for p in tasks] + [d for p in tasks for d in descendants(p.pid)]:
        with contextlib.suppress(ProcessLookupError):  # a worker that ended meanwhile
            os.kill(pid, signal.SIGUSR1)
    signalled = time.monotonic()
    first = collect(tasks, signalled, 120, "srun tasks after SIGUSR1")
    assert time.monotonic() - signalled < 90, describe(first)
    assert [w.returncode for w in first] == [0, 0], describe(first)  # exit 0: SLURM requeues, not fails
    assert "stopped by a signal during epoch" in first[0].stderr, describe(first)
    assert "Traceback" not in first[0].stderr + first[1].stderr, describe(first)
    assert log.read_text().split() == ["requeue", JOB_ID]  # rank 0 only, once
    saved = load_checkpoint(last)["epoch"]
    assert saved < 2 and len(results(run_dir)) == saved + 1  # stopped mid-run

    second = collect(srun(args, 2, tmp_path / "bin", restart_count=1), time.monotonic(), 400, "requeued job")
    assert [w.returncode for w in second] == [0, 0], describe(second)
    assert "resuming" in second[0].stderr, describe(second)  # found its own run by the job id, no --resume
    assert [int(r["epoch"]) for r in results(run_dir)] == [0, 1, 2]  # as many epochs as an uninterrupted run
    assert load_checkpoint(last)["epoch"] == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run"]
    assert log.read_text().split() == ["requeue", JOB_ID]  # the finished job asked for nothing more


def _requeue_in_subprocess(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "from ddp_utils.engine.signals import requeue_job; print(requeue_job())"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.timeout(120)
def test_a_failing_or_missing_scontrol_is_one_line_not_a_crash(tmp_path):
    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log, exit_code=1)
    env = srun_env(0, 2, free_port(), tmp_path / "bin")
    result = _requeue_in_subprocess(env)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr
    assert f"could not requeue SLURM job {JOB_ID}: scontrol exited 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert log.read_text().split() == ["requeue", JOB_ID]

    env["PATH"] = str(tmp_path / "empty")
    result = _requeue_in_subprocess(env)
    assert result.stdout.strip() == "False" and "no scontrol on PATH" in result.stderr, result.stderr


@pytest.mark.timeout(120)
def test_only_rank_0_requeues(tmp_path):
    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log)
    result = _requeue_in_subprocess(srun_env(1, 2, free_port(), tmp_path / "bin"))
    assert result.stdout.strip() == "False" and not log.exists(), result.stderr
    result = _requeue_in_subprocess(srun_env(0, 2, free_port(), tmp_path / "bin"))
    assert result.stdout.strip() == "True" and log.read_text().split() == ["requeue", JOB_ID], result.stderr


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
def test_sigterm_alone_asks_for_no_requeue():
    with PreemptionHandler(requeue_signals=(signal.SIGUSR1,)) as handler:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert handler.requested() and not handler.requeue


def torchrun_task(args: list[str], bin_dir: Path, port: int, restart_count: int | None = None) -> subprocess.Popen:
    """What train_torchrun.sbatch's srun starts on one node: torchrun, passing SIGUSR1 on to its workers."""
    env = srun_env(0, 1, port, bin_dir, restart_count)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(name)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", JOB_ID,
        "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout", "80", *args,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_torchrun_per_node_passes_usr1_on_and_the_requeued_job_resumes(tmp_path):
    data = tiny_data_yaml(tmp_path)
    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log)
    args = train_args(data, tmp_path / "runs", "--epochs", "3")
    run_dir = tmp_path / "runs" / "run"
    last = run_dir / "weights" / "last.pt"

    agent = torchrun_task(args, tmp_path / "bin", free_port())
    wait_for_file(last, agent, 300)
    workers = descendants(agent.pid)
    os.kill(agent.pid, signal.SIGUSR1)  # the task only: torchrun must pass it on
    signalled = time.monotonic()
    (first,) = collect([agent], signalled, 120, "torchrun after SIGUSR1")
    assert time.monotonic() - signalled < 90, describe([first])
    assert "stopped by a signal during epoch" in first.stderr, describe([first])
    assert "[rank0]:" not in first.stderr and "[rank1]:" not in first.stderr, describe([first])  # no traceback
    assert log.read_text().split() == ["requeue", JOB_ID]
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], "processes outlived the job"
    assert load_checkpoint(last)["epoch"] < 2

    (second,) = collect([torchrun_task(args, tmp_path / "bin", free_port(), 1)], time.monotonic(), 400, "requeued")
    assert second.returncode == 0 and "resuming" in second.stderr, describe([second])
    assert [int(r["epoch"]) for r in results(run_dir)] == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run"]
