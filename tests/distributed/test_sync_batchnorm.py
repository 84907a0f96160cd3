"""--sync-bn on any backend: 2 gloo ranks x 4 images compute what one process computes with 8."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddp_utils.distributed import GroupBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm
from tests.multiproc import describe, launch, records
from tests.workers.sync_bn_scenarios import GLOBAL_BATCH, batches, reference, small_net

TOL = 1e-5


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = want.abs().max().clamp(min=1.0)
    diff = float((got.double() - want.double()).abs().max() / scale)
    assert diff <= TOL, f"{what}: differs by {diff:.2e} (relative to max |value|), more than {TOL}"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("momentum", ["0.1", "none"])
def test_two_ranks_equal_one_process(tmp_path, momentum):
    steps = 2
    workers = launch("tests.workers.sync_bn_scenarios:synced_steps", 2, 150, (tmp_path, steps, momentum))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    want = reference(steps, None if momentum == "none" else float(momentum))
    share = GLOBAL_BATCH // 2
    for step in range(steps):
        got_out = torch.cat([r["out"][step] for r in ranks])
        assert_close(got_out, want["out"][step], f"step {step} outputs")
        got_grad = torch.cat([r["input_grad"][step] for r in ranks])
        assert_close(got_grad, want["input_grad"][step], f"step {step} input gradients")
        for i, expected in enumerate(want["param_grad"][step]):
            for rank in ranks:  # DDP's averaged gradient, the same on every rank
                assert_close(rank["param_grad"][step][i], expected, f"step {step} parameter {i} gradient")
    for rank_no, rank in enumerate(ranks):
        assert set(rank["state"]) == set(want["state"])
        for key, expected in want["state"].items():
            assert_close(rank["state"][key].double(), expected.double(), f"rank {rank_no} {key} after training")
        # eval mode normalises with the running statistics: what a plain model with this state computes
        plain = small_net().eval()
        plain.load_state_dict(rank["state"])
        mine = plain(batches(1)[0][rank_no * share : (rank_no + 1) * share])
        assert_close(rank["eval_out"][0], mine.detach(), f"rank {rank_no} eval outputs (running statistics)")
    assert int(ranks[0]["state"]["1.num_batches_tracked"]) == steps


def test_without_a_group_it_is_batchnorm2d():
    plain, synced = small_net(), convert_sync_batchnorm(small_net())
    x = torch.randn(4, 3, 9, 9) + 1
    for _ in range(2):
        assert torch.equal(plain(x), synced(x))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), synced.state_dict().values()))
    plain.eval(), synced.eval()
    assert torch.equal(plain(x), synced(x))


def test_checkpoint_of_a_synced_model_loads_into_a_plain_one(tmp_path):
    synced = convert_sync_batchnorm(small_net())
    synced(torch.randn(4, 3, 9, 9))  # running statistics move
    torch.save(synced.state_dict(), tmp_path / "synced.pt")
    plain = small_net()
    plain.load_state_dict(torch.load(tmp_path / "synced.pt", weights_only=True))  # strict: same keys
    assert torch.equal(plain[1].running_mean, synced[1].running_mean)
    assert int(plain[1].num_batches_tracked) == 1
    synced_again = convert_sync_batchnorm(small_net())
    synced_again.load_state_dict(plain.state_dict())
    assert torch.equal(synced_again[4].running_var, synced[4].running_var)


def test_convert_and_revert_share_tensors_and_keep_the_kind():
    model = nn.Sequential(nn.Conv1d(2, 4, 1), nn.BatchNorm1d(4), nn.Sequential(nn.BatchNorm3d(2)))
    weight = model[1].weight
    converted = convert_sync_batchnorm(model)
    assert isinstance(converted[1], GroupBatchNorm) and isinstance(converted[2][0], GroupBatchNorm)
    assert converted[1].weight is weight
    reverted = revert_sync_batchnorm(converted)
    assert type(reverted[1]) is nn.BatchNorm1d and type(reverted[2][0]) is nn.BatchNorm3d
    assert reverted[1].weight is weight
    torch_synced = nn.Sequential(nn.SyncBatchNorm(3))
    assert type(revert_sync_batchnorm(torch_synced)[0]) is nn.BatchNorm2d
    assert type(convert_sync_batchnorm(nn.BatchNorm2d(3))) is GroupBatchNorm  # a layer itself, converted


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_group_batchnorm_never_waits_and_torchs_syncbatchnorm_waits_in_every_forward():
    """What the README claims for --sync-bn on a GPU, counted on the CPU (tests/hostwait.py), 2 gloo ranks.

    GroupBatchNorm (ours: gloo, any device): no host wait in two training steps, forward and backward,
    with a momentum and with the cumulative mean (momentum None). torch's SyncBatchNorm (what --sync-bn
    uses on CUDA under NCCL): its forward drops the ranks with empty batches by a boolean mask over the
    gathered counts, means and inverse deviations, three host waits per BatchNorm layer per step.
    """
    workers = launch("tests.workers.sync_bn_scenarios:host_waits", 2, 150)
    assert all(w.returncode == 0 for w in workers), describe(workers)
    for record in records(workers):
        assert record["group_waits_momentum_0.1"] == [] and record["group_waits_momentum_None"] == [], record
        assert record["group_tracked_0.1"] == record["group_tracked_None"] == 2
        assert record["torch_waits"] == ["index with a boolean mask"] * 3, record
        assert record["torch_equals_ours"], record
