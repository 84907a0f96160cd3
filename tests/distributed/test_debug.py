"""``enable_debug`` / ``train.py --dist-debug``: a collective that differs across ranks names the ranks and ops.

Real gloo groups on the CPU, two processes, bounded by a timeout: without the check these
ranks would hang (op) or fail with a message naming no rank (shape).
"""

from __future__ import annotations

import sys

import pytest

from ddp_utils.distributed import debug_env
from ddp_utils.distributed.debug import trace_buffer_variable

from ..multiproc import REPO_ROOT, describe, launch, records


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_mismatched_ops_name_the_ranks_and_the_ops(tmp_path):
    workers = launch("tests.workers.distributed_debug_scenarios:mismatched_collective", 2, 120, (str(tmp_path), "op"))
    assert [w.returncode for w in workers] == [0, 0], describe(workers)
    errors = {r["rank"]: r["error"] for r in records(workers)}
    for rank, (mine, theirs) in {0: ("ALLREDUCE", "BROADCAST"), 1: ("BROADCAST", "ALLREDUCE")}.items():
        message = errors[rank]
        assert message and "mismatch between collectives" in message, describe(workers)
        assert f"Rank {rank} is running collective" in message and f"OpType={mine}" in message, message
        assert f"Rank {1 - rank} is running collective" in message and f"OpType={theirs}" in message, message


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_mismatched_shapes_name_the_ranks_and_the_shapes(tmp_path):
    workers = launch(
        "tests.workers.distributed_debug_scenarios:mismatched_collective", 2, 120, (str(tmp_path), "shape")
    )
    assert [w.returncode for w in workers] == [0, 0], describe(workers)
    for record in records(workers):
        message, rank = record["error"], record["rank"]
        assert message and "Tensor shapes" in message, describe(workers)
        assert f"Rank {rank} is running collective" in message and f"TensorShape=[{3 + rank}]" in message
        assert f"Rank {1 - rank} is running collective" in message and f"TensorShape=[{4 - rank}]" in message
        assert record["env"]["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl_trace_rank_")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_ddp_trains_on_its_own_group_while_the_default_group_stays_checked(tmp_path):
    # torch 2.14: DDP on the gloo group wrapped for DETAIL dies of SIGSEGV; ddp_process_group avoids it
    workers = launch("tests.workers.distributed_debug_scenarios:ddp_then_mismatch", 2, 120, (str(tmp_path),))
    assert [w.returncode for w in workers] == [0, 0], describe(workers)
    for record in records(workers):
        grads = record["grads"]
        assert grads[0] == pytest.approx(grads[1])  # DDP averaged the gradients
        assert record["error"] and f"Rank {1 - record['rank']} is running collective" in record["error"]


def test_debug_env_turns_on_the_checks_and_the_flight_recorder(tmp_path):
    env = debug_env(tmp_path, trace_buffer_size=500)
    assert env == {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        trace_buffer_variable(): "500",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl_trace_rank_"),
    }


def test_train_py_takes_dist_debug_and_requeue_signal():
    sys.path.insert(0, str(REPO_ROOT))
    try:
        import train
    finally:
        sys.path.pop(0)
    opt = train.parse_opt(["--dist-debug", "--requeue-signal", "USR2"])
    assert opt.dist_debug and opt.requeue_signal == "USR2"
    assert not train.parse_opt([]).dist_debug and train.parse_opt([]).requeue_signal is None


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_train_py_dist_debug_trains_under_torchrun_on_gloo(tmp_path):
    from ..test_train import run, tiny_data_yaml, torchrun, train_args, train_env

    data = tiny_data_yaml(tmp_path)
    result = run(torchrun(2, *train_args(data, tmp_path / "runs", "--epochs", "1", "--noplots", "--dist-debug")),
                 train_env(), 240)  # fmt: skip
    assert result.returncode == 0, describe([result])
    assert "distributed debugging on: TORCH_DISTRIBUTED_DEBUG=DETAIL" in result.stderr
    assert (tmp_path / "runs" / "run" / "weights" / "last.pt").is_file()
