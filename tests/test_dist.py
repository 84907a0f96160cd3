"""ddp_utils.dist: environment parsing in-process, the rest in real gloo process groups."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

import ddp_utils as du
from ddp_utils.dist import DistEnvError, first_slurm_host

from .multiproc import REPO_ROOT, collect, describe, free_port, launch, launcher_env, records


def assert_all_ok(workers):
    assert all(w.returncode == 0 for w in workers), describe(workers)


# --- dist_info --------------------------------------------------------------------------------


def test_dist_info_single_process():
    info = du.dist_info({})
    assert (info.rank, info.local_rank, info.world_size) == (-1, -1, 1)
    assert info.is_main and info.is_local_main and not info.distributed


def test_dist_info_torchrun():
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    info = du.dist_info(env)
    assert info == du.DistInfo(5, 1, 8, 4, 1, "10.0.0.1", 29400, 2, "torchrun")
    assert not info.is_main and not info.is_local_main


def test_dist_info_torchrun_wins_over_slurm():
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    assert du.dist_info(env).source == "torchrun"


def test_dist_info_slurm():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    info = du.dist_info(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (5, 1, 8, 4)
    assert (info.node_rank, info.master_addr, info.source) == (1, "gpu07", "slurm")
    assert 20000 <= info.master_port < 40000


def test_dist_info_slurm_single_task_is_single_process():
    assert du.dist_info({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).rank == -1


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node1", "node1"), ("gpu[03-05,09]", "gpu03"), ("a[1,4],b2", "a1"), ("x-y[010-012]", "x-y010")],
)
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RANK": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE"),
        ({"LOCAL_RANK": "0"}, "RANK"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE=2"),
        ({"RANK": "1", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE=2"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_LOCALID"),
    ],
)
def test_dist_info_incomplete_environment_names_the_variable(env, named):
    with pytest.raises(DistEnvError, match=named):
        du.dist_info(env)


def test_init_distributed_without_master_addr_names_it(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistEnvError, match="MASTER_ADDR"):
        du.init_distributed(backend="gloo")
    assert not du.is_dist_initialized()


def test_init_distributed_nccl_local_rank_beyond_gpus(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(DistEnvError, match="LOCAL_RANK"):
        du.init_distributed(backend="nccl")


def test_init_distributed_rejects_unknown_init_method(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistEnvError, match="init_method"):
        du.init_distributed(backend="gloo", init_method="udp://x")


# --- single process: every helper is a no-op --------------------------------------------------


def test_helpers_single_process_are_noops(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert du.init_distributed().rank == -1
    assert not du.is_dist_initialized()
    assert du.is_main_process() and du.get_rank() == 0 and du.get_world_size() == 1
    du.barrier()
    t = torch.tensor([1.0, 2.0])
    for op in ("mean", "sum", "max", "min"):
        out = du.reduce_tensor(t, op)
        assert torch.equal(out, t) and out is not t
    assert {k: float(v) for k, v in du.reduce_dict({"a": 1.0}).items()} == {"a": 1.0}
    assert du.broadcast_object([1, 2]) == [1, 2]
    assert du.all_gather_object("x") == ["x"]
    ran = []
    with du.torch_distributed_zero_first(-1), du.torch_distributed_rank_zero_first():
        ran.append(1)
    assert ran == [1]
    du.cleanup()


def test_reduce_tensor_rejects_unknown_op():
    with pytest.raises(ValueError, match="median"):
        du.reduce_tensor(torch.ones(1), "median")


# --- real process groups ------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_zero_first_order(tmp_path, nprocs):
    workers = launch("tests.workers.dist_scenarios:zero_first_order", nprocs, timeout=90, args=(tmp_path,))
    assert_all_ok(workers)
    recs = records(workers)
    leader = next(r for r in recs if r["leader"])
    others = [r for r in recs if not r["leader"]]
    assert len(others) == nprocs - 1
    assert all(r["found"] == str(leader["rank"]) for r in others)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_zero_first_runs_once_per_node(tmp_path):
    # 4 processes as 2 nodes of 2: each node's local rank 0 builds its own copy first
    workers = launch("tests.workers.dist_scenarios:zero_first_order", 4, timeout=100, args=(tmp_path,), nnodes=2)
    assert_all_ok(workers)
    recs = {r["rank"]: r for r in records(workers)}
    assert [r["leader"] for r in recs.values()] == [True, False, True, False]
    assert recs[1]["found"] == "0" and recs[3]["found"] == "2"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_rank_zero_first_is_job_wide(tmp_path):
    workers = launch("tests.workers.dist_scenarios:zero_first_order", 4, timeout=100, args=(tmp_path, "job"), nnodes=2)
    assert_all_ok(workers)
    recs = records(workers)
    assert [r["leader"] for r in recs] == [True, False, False, False]
    assert all(r["found"] == "0" for r in recs[1:])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("nprocs", "scope"), [(2, "node"), (3, "node"), (3, "job")])
def test_zero_first_error_reaches_every_rank_promptly(nprocs, scope):
    # the group's timeout is 10 minutes: the others must not wait for it
    workers = launch("tests.workers.dist_scenarios:zero_first_leader_raises", nprocs, timeout=60, args=(scope,))
    assert all(w.returncode != 0 for w in workers), describe(workers)
    assert "corrupt download: checksum mismatch" in workers[0].stderr
    for w in workers[1:]:
        assert "RankFailedError" in w.stderr and "rank 0 failed" in w.stderr, describe(workers)
        assert "ValueError: corrupt download: checksum mismatch" in w.stderr
        assert "unreachable" not in w.stdout
    # prompt: the followers end within seconds of the leader, not at a collective timeout
    assert max(w.seconds for w in workers) - workers[0].seconds < 10, describe(workers)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_long_first_process_body_does_not_trip_collective_timeout():
    # a 6 s body under a 3 s collective timeout: a barrier-based wait would fail
    workers = launch("tests.workers.dist_scenarios:long_body", 2, timeout=90, args=("6", "3"))
    assert_all_ok(workers)
    assert [r["total"] for r in records(workers)] == [2.0, 2.0]


def _check_collectives(workers, world):
    assert_all_ok(workers)
    recs = records(workers)
    ranks = range(1, world + 1)
    for r in recs:
        assert r["mean"] == pytest.approx([sum(ranks) / world, 10 * sum(ranks) / world])
        assert r["sum"] == [float(sum(ranks)), 10.0 * sum(ranks)]
        assert r["max"] == [float(world), 10.0 * world]
        assert r["min"] == [1.0, 10.0]
        assert r["int_mean"] == pytest.approx([sum(2 * k for k in range(world)) / world])
        assert r["dict"] == pytest.approx({"box": sum(ranks) / world, "obj": 2.0 * sum(range(world)) / world})
        assert r["broadcast"] == {"from": 1, "names": ["a", "b"]}
        assert r["gathered"] == [{"rank": k} for k in range(world)]
        assert r["local_unchanged"] == [r["rank"] + 1.0, 10.0 * (r["rank"] + 1)]
        assert r["rank_zero_only"] == ("ran" if r["rank"] == 0 else None)
        if r["rank"] == 1:
            assert r["sum_to_1"] == [float(sum(ranks)), 10.0 * sum(ranks)]
        else:
            assert r["sum_to_1"] == r["local_unchanged"]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_env_init():
    _check_collectives(launch("tests.workers.dist_scenarios:collectives", 2, timeout=90), 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_tcp_init():
    url = f"tcp://127.0.0.1:{free_port()}"
    _check_collectives(launch("tests.workers.dist_scenarios:collectives", 2, timeout=90, args=(url,)), 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_file_init(tmp_path):
    url = f"file://{tmp_path / 'rendezvous'}"
    _check_collectives(launch("tests.workers.dist_scenarios:collectives", 3, timeout=90, args=(url,)), 3)


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_torchrun_runs_the_helpers_demo():
    port = free_port()
    env = launcher_env()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        "-m",
        "tests.workers.dist_scenarios",
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    (run,) = collect([proc], start, 120, "torchrun helpers demo")
    assert run.returncode == 0, describe([run])
    recs = sorted(
        (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in recs] == [0, 1]
    for r in recs:
        assert r["device"] == "cpu" and r["loss"] == 0.5 and r["n"] == 2.0
        assert r["names"] == ["circle", "square"] and r["everyone"] == [0, 1] and r["elapsed_ok"]


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_elastic_restart_forms_a_fresh_group():
    # torchrun keeps its store across restarts: without a prefix per attempt, the restarted
    # ranks read the dead attempt's gloo addresses and hang or fail to connect
    port = free_port()
    env = launcher_env()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "tests.workers.dist_scenarios", "restart",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    (run,) = collect([proc], time.monotonic(), 180, "torchrun restart after SIGKILL")
    assert run.returncode == 0, describe([run])
    recs = sorted((json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert recs == [{"rank": 0, "attempt": 1, "total": 2.0}, {"rank": 1, "attempt": 1, "total": 2.0}]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_zero_first_leader_killed_outright_is_noticed_by_its_heartbeat():
    # SIGKILL publishes no error: the followers notice the heartbeat stop (5 s here, 60 by default)
    workers = launch(
        "tests.workers.dist_scenarios:zero_first_leader_killed", 4, timeout=90, nnodes=2,
        env={"DDP_UTILS_HEARTBEAT_TIMEOUT": "5"},
    )  # fmt: skip
    assert workers[2].returncode == -9, describe(workers)
    follower = json.loads(workers[3].stdout.strip().splitlines()[-1])
    assert workers[3].returncode == 3, describe(workers)
    assert "rank 2 stopped responding" in follower["error"] and follower["seconds"] < 30
    assert [records([w])[0]["error"] for w in workers[:2]] == [None, None]  # node 0 is unaffected
