"""ddp_utils.distributed: environment parsing in-process, the rest in real gloo process groups."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ddp_utils as du
from ddp_utils.distributed import (
    DistEnvError,
    any_rank,
    de_parallel,
    default_backend,
    default_device,
    first_slurm_host,
    is_parallel,
    launch_key,
)

from ..multiproc import REPO_ROOT, collect, describe, free_port, launch, launcher_env, records


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


def _torchrun_env(rank: int, attempt: int, agent_dir: str = "/tmp/torchelastic_ab12") -> dict[str, str]:
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_ERROR_FILE": f"{agent_dir}/none_x/attempt_{attempt}/{rank}/error.json",
    }  # fmt: skip


def test_launch_key_same_on_a_nodes_ranks_and_across_restarts_new_for_a_new_launch():
    keys = {launch_key(environ=_torchrun_env(rank, attempt)) for rank in (0, 1) for attempt in (0, 1, 2)}
    assert keys == {"none/127.0.0.1:29500//tmp/torchelastic_ab12/none_x"}
    assert launch_key(environ=_torchrun_env(0, 0, agent_dir="/tmp/torchelastic_cd34")) not in keys


def test_launch_key_of_an_elastic_job_is_its_rdzv_id_on_every_node_and_after_it_re_forms():
    # two agents (nodes), their own agent directories; after a node is lost the group re-forms with
    # another rank 0 and another master port: still the same job
    first = _torchrun_env(0, 0, agent_dir="/tmp/torchelastic_node_a") | {"TORCHELASTIC_RUN_ID": "job42"}
    other_node = _torchrun_env(1, 0, agent_dir="/tmp/torchelastic_node_b") | {"TORCHELASTIC_RUN_ID": "job42"}
    re_formed = first | {"MASTER_PORT": "41234", "TORCHELASTIC_RESTART_COUNT": "1", "WORLD_SIZE": "1"}
    keys = {launch_key(environ=env) for env in (first, other_node, re_formed)}
    assert keys == {"torchrun/job42"}
    assert launch_key(environ=first | {"TORCHELASTIC_RUN_ID": "job43"}) != "torchrun/job42"


def test_launch_key_slurm_and_single_process():
    slurm = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77",
             "SLURM_NODELIST": "gpu[1-2]"}  # fmt: skip
    assert launch_key(environ=slurm) == "slurm/77"  # a requeued job keeps it, on whichever nodes it lands
    assert launch_key(environ={**slurm, "SLURM_JOB_ID": "78"}) == "slurm/78"  # another job
    assert launch_key(environ={}) == f"single/pid={os.getpid()}"


def test_launch_key_takes_the_info_it_is_given():
    info = du.dist_info(_torchrun_env(1, 0))
    assert launch_key(info, environ={}) == "/127.0.0.1:29500/"


LAUNCHER_VARIABLE = re.compile(
    r"""["'](RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|SLURM_\w*|TORCHELASTIC_\w*)["']"""
)


def test_only_distributed_reads_launcher_variables():
    package = Path(du.__file__).parent
    readers = [
        f"{path.relative_to(package)}: {match.group(0)}"
        for path in package.rglob("*.py")
        if "distributed" not in path.relative_to(package).parts
        for match in LAUNCHER_VARIABLE.finditer(path.read_text())
    ]
    assert readers == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_import_reads_no_launcher_variable():
    # a malformed RANK fails dist_info() when called; importing must not call it
    code = "import ddp_utils, ddp_utils.data, ddp_utils.engine, ddp_utils.yolo, ddp_utils.profiling; print('ok')"
    env = {**os.environ, "RANK": "not-a-number", "WORLD_SIZE": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# --- the device decides the backend ---------------------------------------------------------------


@pytest.fixture
def cuda_host(monkeypatch):
    """This process believes it sees two GPUs (torch.cuda's answers only; nothing distributed is faked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cpu_device_means_gloo_even_where_cuda_is(cuda_host):
    assert default_backend("cpu") == "gloo"
    assert default_backend(torch.device("cpu")) == "gloo"
    assert default_backend("mps") == "gloo"


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="this torch has no NCCL")
def test_cuda_device_means_nccl(cuda_host):
    assert default_backend("cuda:1") == "nccl"


def test_default_device_is_the_local_gpu_where_cuda_is(cuda_host, monkeypatch):
    assert default_device(du.dist_info({})) == torch.device("cuda", 0)
    assert default_device(du.dist_info(_torchrun_env(1, 0))) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device(du.dist_info(_torchrun_env(1, 0))) == torch.device("cpu")


def test_init_distributed_refuses_nccl_on_a_cpu_device(monkeypatch):
    for name, value in _torchrun_env(0, 0).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistEnvError, match="nccl.*needs a CUDA device.*cpu"):
        du.init_distributed(backend="nccl", device="cpu")
    assert not du.is_dist_initialized()


# --- unwrapping models ------------------------------------------------------------------------------


def test_de_parallel_unwraps_data_parallel_and_compile_in_any_order():
    inner = torch.nn.Linear(2, 2)
    compiled = torch.compile(inner)  # wraps at once, compiles on the first call (never made here)
    for wrapped in (inner, torch.nn.DataParallel(inner), compiled, torch.nn.DataParallel(compiled)):
        assert de_parallel(wrapped) is inner
    assert de_parallel(torch.compile(torch.nn.DataParallel(inner))) is inner
    assert is_parallel(torch.nn.DataParallel(inner)) and not is_parallel(compiled) and not is_parallel(inner)
    assert list(de_parallel(torch.nn.DataParallel(compiled)).state_dict()) == ["weight", "bias"]


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
    assert any_rank(True) is True and any_rank(False) is False and any_rank(0) is False
    ran = []
    with du.torch_distributed_zero_first(-1), du.torch_distributed_rank_zero_first():
        ran.append(1)
    assert ran == [1]
    du.cleanup()


def test_reduce_tensor_rejects_unknown_op():
    with pytest.raises(ValueError, match="median"):
        du.reduce_tensor(torch.ones(1), "median")


# --- real process groups ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_zero_first_order(tmp_path, nprocs):
    workers = launch("tests.workers.distributed_scenarios:zero_first_order", nprocs, timeout=90, args=(tmp_path,))
    assert_all_ok(workers)
    recs = records(workers)
    leader = next(r for r in recs if r["leader"])
    others = [r for r in recs if not r["leader"]]
    assert len(others) == nprocs - 1
    assert all(r["found"] == str(leader["rank"]) for r in others)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_zero_first_runs_once_per_node(tmp_path):
    # 4 processes as 2 nodes of 2: each node's local rank 0 builds its own copy first
    workers = launch("tests.workers.distributed_scenarios:zero_first_order", 4, timeout=100, args=(tmp_path,), nnodes=2)
    assert_all_ok(workers)
    recs = {r["rank"]: r for r in records(workers)}
    assert [r["leader"] for r in recs.values()] == [True, False, True, False]
    assert recs[1]["found"] == "0" and recs[3]["found"] == "2"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_rank_zero_first_is_job_wide(tmp_path):
    workers = launch(
        "tests.workers.distributed_scenarios:zero_first_order", 4, timeout=100, args=(tmp_path, "job"), nnodes=2
    )
    assert_all_ok(workers)
    recs = records(workers)
    assert [r["leader"] for r in recs] == [True, False, False, False]
    assert all(r["found"] == "0" for r in recs[1:])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_over_a_subgroup_blocking_and_async():
    workers = launch("tests.workers.distributed_scenarios:group_collectives", 3, timeout=90)
    assert_all_ok(workers)
    r0, r1, r2 = records(workers)
    for r in (r0, r2):
        assert r["mean"] == [2.0, 20.0] and r["sum_async"] == [4.0, 40.0]  # ranks 0 and 2 only: 1 + 3
        assert r["dict"] == {"a": 2.0} and r["any"] == [True, False] and r["any_async"] is True
        assert r["broadcast"] == "from 2" and r["gathered"] == [0, 20]
        assert r["host_flags"] == [1.0, 2.0]
    assert r2["max_to_2"] == [3.0, 30.0] and r0["max_to_2"] == [1.0, 10.0]  # rank 0 keeps its own value
    assert len(r1["errors"]) == 3 and all("rank 1 is not in the group" in e for e in r1["errors"]), r1
    assert r0["world_sum"] == r1["world_sum"] == r2["world_sum"] == [3.0]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_zero_first_sections_are_named_by_what_they_guard(tmp_path):
    workers = launch("tests.workers.distributed_scenarios:zero_first_keys", 3, timeout=90, args=(tmp_path,))
    assert_all_ok(workers)
    recs = records(workers)
    assert [r["leader"] for r in recs] == [True, False, False]
    # the leader's extra section shifted nothing: each follower found the leader's file in each section
    assert all(r["found"] == [True] * 4 for r in recs[1:]), recs


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_zero_first_wait_is_bounded_and_names_the_section():
    workers = launch("tests.workers.distributed_scenarios:zero_first_other_key", 2, timeout=90, args=("2",))
    assert_all_ok(workers)
    leader, follower = records(workers)
    assert leader["error"] is None
    assert "first-process section 'ddp_utils/first/0/node0/b/0'" in follower["error"], follower
    assert 2 <= follower["seconds"] < 10, follower


def test_zero_first_refuses_an_unbounded_wait():
    with pytest.raises(ValueError, match="timeout=None: give the seconds a follower may wait"):
        du.torch_distributed_zero_first(0, timeout=None)
    with pytest.raises(ValueError, match="timeout=0: give the seconds a follower may wait"):
        du.torch_distributed_rank_zero_first(timeout=0)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("nprocs", "scope"), [(2, "node"), (3, "node"), (3, "job")])
def test_zero_first_error_reaches_every_rank_promptly(nprocs, scope):
    # the group's timeout is 10 minutes: the others must not wait for it
    workers = launch("tests.workers.distributed_scenarios:zero_first_leader_raises", nprocs, timeout=60, args=(scope,))
    assert all(w.returncode != 0 for w in workers), describe(workers)
    assert "corrupt download: checksum mismatch" in workers[0].stderr
    for w in workers[1:]:
        assert "RankFailedError" in w.stderr and "rank 0 failed" in w.stderr, describe(workers)
        assert "ValueError: corrupt download: checksum mismatch" in w.stderr
        assert "unreachable" not in w.stdout
    # prompt: the followers end within seconds of the leader, not at a collective timeout
    assert max(w.seconds for w in workers) - workers[0].seconds < 10, describe(workers)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_long_first_process_body_does_not_trip_collective_timeout():
    # a 6 s body under a 3 s collective timeout: a barrier-based wait would fail
    workers = launch("tests.workers.distributed_scenarios:long_body", 2, timeout=90, args=("6", "3"))
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


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_env_init():
    _check_collectives(launch("tests.workers.distributed_scenarios:collectives", 2, timeout=90), 2)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_tcp_init():
    url = f"tcp://127.0.0.1:{free_port()}"
    _check_collectives(launch("tests.workers.distributed_scenarios:collectives", 2, timeout=90, args=(url,)), 2)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collectives_file_init(tmp_path):
    url = f"file://{tmp_path / 'rendezvous'}"
    _check_collectives(launch("tests.workers.distributed_scenarios:collectives", 3, timeout=90, args=(url,)), 3)


@pytest.mark.slow
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
        "tests.workers.distributed_scenarios",
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    (run,) = collect([proc], start, 120, "torchrun helpers demo")
    assert run.returncode == 0, describe([run])
    assert "warning" not in run.stderr.lower() and "[rank 1]" not in run.stderr, run.stderr  # a correct command
    recs = sorted(
        (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in recs] == [0, 1]
    for r in recs:
        assert r["device"] == "cpu" and r["backend"] == "gloo" and r["loss"] == 0.5 and r["n"] == 2.0
        assert r["names"] == ["circle", "square"] and r["everyone"] == [0, 1] and r["elapsed_ok"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_elastic_restart_forms_a_fresh_group():
    # torchrun keeps its store across restarts: without a prefix per attempt, the restarted
    # ranks read the dead attempt's gloo addresses and hang or fail to connect
    port = free_port()
    env = launcher_env()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(port),
        "-m", "tests.workers.distributed_scenarios", "restart",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    (run,) = collect([proc], time.monotonic(), 180, "torchrun restart after SIGKILL")
    assert run.returncode == 0, describe([run])
    recs = sorted((json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert recs == [{"rank": 0, "attempt": 1, "total": 2.0}, {"rank": 1, "attempt": 1, "total": 2.0}]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_zero_first_leader_killed_outright_is_noticed_by_its_heartbeat():
    # SIGKILL publishes no error: the followers notice the heartbeat stop (5 s here, 60 by default)
    workers = launch(
        "tests.workers.distributed_scenarios:zero_first_leader_killed", 4, timeout=90, nnodes=2,
        env={"DDP_UTILS_HEARTBEAT_TIMEOUT": "5"},
    )  # fmt: skip
    assert workers[2].returncode == -9, describe(workers)
    follower = json.loads(workers[3].stdout.strip().splitlines()[-1])
    assert workers[3].returncode == 3, describe(workers)
    assert "rank 2 stopped responding" in follower["error"] and follower["seconds"] < 30
    assert [records([w])[0]["error"] for w in workers[:2]] == [None, None]  # node 0 is unaffected


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_cpu_device_on_a_gpu_host_forms_a_gloo_group():
    # each worker believes it has one GPU; two of them on the node, so "0" must be refused by count
    workers = launch("tests.workers.distributed_scenarios:cpu_on_a_gpu_host", 2, timeout=90)
    assert_all_ok(workers)
    for r in records(workers):
        assert r["count_error"].startswith("2 processes on this node (LOCAL_WORLD_SIZE=2, this is local rank")
        assert "gives 1 GPU(s) of the 1 visible" in r["count_error"] and "--nproc_per_node 1" in r["count_error"]
        assert r["default_device"] == f"cuda:{r['rank']}"  # what init_distributed() alone would have picked
        assert (r["backend"], r["collective_device"], r["sum"]) == ("gloo", "cpu", 2.0)
        assert (r["any_one"], r["any_none"], r["any_all"]) == (True, False, True)
